//! `make bench-controller`: the controller (the release binary, as a separate process) against the
//! API test server with 10 000 annotated running pods: time until every reservation is Bound,
//! the controller's peak RSS, and how late the expiries of 1 000 reservations due within the same
//! second fire (p50/p99/max). Not a test: it prints figures.
//!
//! Environment: `IPKEEP_OPERATOR_BIN` (the binary; default target/release/ipkeep-operator),
//! `BENCH_PODS` (10000), `BENCH_EXPIRIES` (1000).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    collections::HashMap,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use futures::{StreamExt, TryStreamExt};
use ipkeep_e2e::apiserver::{ServerOptions, TestServer};
use ipkeep_operator::crd::{IPReservation, Phase};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn create_pod(client: Client, i: usize) {
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let name = format!("bench-{i}");
    let node = format!("node-{}", i / 200);
    let ip = format!("10.{}.{}.{}", 100 + i / 65_536, (i / 256) % 256, i % 256);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": {"ipkeep.dev/retain": "true"}},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "app"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}});
    pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let pods_n = env_usize("BENCH_PODS", 10_000);
    let expiries_n = env_usize("BENCH_EXPIRIES", 1_000);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let bin = std::env::var_os("IPKEEP_OPERATOR_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/release/ipkeep-operator"));
    assert!(
        bin.is_file(),
        "no controller binary at {} (make bench-controller builds it)",
        bin.display()
    );

    let server = TestServer::start(ServerOptions {
        crd_dirs: vec![root.join("crds")],
        ..ServerOptions::default()
    })
    .await
    .unwrap();
    let client = server.client();
    let dir = std::env::temp_dir().join(format!("ipkeep-bench-controller-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();

    let started = Instant::now();
    futures::stream::iter(0..pods_n)
        .map(|i| create_pod(client.clone(), i))
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
    eprintln!(
        "bench: {pods_n} annotated running pods created in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let mut child = Command::new(&bin)
        .args([
            "controller",
            "--metrics-addr",
            "127.0.0.1:0",
            "--leader-elect=false",
            "--log-level",
            "warn",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let pid = child.id();
    let controller_start = Instant::now();
    let iprs: Api<IPReservation> = Api::namespaced(client.clone(), "default");
    let converge = loop {
        let list = iprs.list(&ListParams::default()).await.unwrap();
        let bound = list
            .items
            .iter()
            .filter(|r| r.status.as_ref().and_then(|s| s.phase) == Some(Phase::Bound))
            .count();
        if bound >= pods_n {
            break controller_start.elapsed();
        }
        assert!(
            controller_start.elapsed() < Duration::from_secs(600),
            "gave up after 600 s: {bound} of {pods_n} Bound"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!(
        "bench: all {pods_n} reservations Bound {:.1} s after the controller started",
        converge.as_secs_f64()
    );

    // Expiries: hand-made reservations created within about a second, all with the same release
    // time (creation second + 15 s). Deletions are observed through a watch.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Timestamp)>();
    let watch_api: Api<IPReservation> = Api::namespaced(client.clone(), "default");
    let watch = tokio::spawn(async move {
        let mut release: HashMap<String, Timestamp> = HashMap::new();
        let mut events = std::pin::pin!(
            watcher(watch_api, watcher::Config::default().labels("bench=expiry")).default_backoff()
        );
        while let Some(ev) = events.try_next().await.ok().flatten() {
            match ev {
                watcher::Event::Apply(r) | watcher::Event::InitApply(r) => {
                    if let Some(t) = r.status.as_ref().and_then(|s| s.release_time.as_ref()) {
                        release.insert(r.name_any(), t.0);
                    }
                }
                watcher::Event::Delete(r) => {
                    let due = r
                        .status
                        .as_ref()
                        .and_then(|s| s.release_time.as_ref())
                        .map(|t| t.0)
                        .or_else(|| release.get(&r.name_any()).copied());
                    if let Some(due) = due {
                        let _ = tx.send((r.name_any(), due));
                    }
                }
                _ => {}
            }
        }
    });
    let made = Instant::now();
    futures::stream::iter(0..expiries_n)
        .map(|i| {
            let iprs = iprs.clone();
            async move {
                let r: IPReservation = serde_json::from_value(json!({
                    "apiVersion": "ipkeep.dev/v1alpha1", "kind": "IPReservation",
                    "metadata": {"name": format!("expire-{i}"), "labels": {"bench": "expiry"}},
                    "spec": {"ips": [format!("10.200.{}.{}", i / 256, i % 256)], "nodeName": "node-x", "retainFor": "15s"},
                }))
                .unwrap();
                iprs.create(&PostParams::default(), &r).await.unwrap();
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
    eprintln!(
        "bench: {expiries_n} expiring reservations created in {:.2} s",
        made.elapsed().as_secs_f64()
    );
    let mut lateness = Vec::with_capacity(expiries_n);
    let mut due_seconds = std::collections::BTreeSet::new();
    while lateness.len() < expiries_n {
        let (_, due) = tokio::time::timeout(Duration::from_secs(120), rx.recv())
            .await
            .expect("every expiry within 120 s")
            .expect("the watch runs");
        let late = Timestamp::now().duration_since(due).as_secs_f64();
        due_seconds.insert(due.as_second());
        lateness.push(late);
    }
    watch.abort();
    lateness.sort_by(|a, b| a.total_cmp(b));
    let rss = peak_rss_kib(pid);
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = child.wait();
    println!(
        "controller bench ({pods_n} pods, {expiries_n} expiries, API test server in-process, {} distinct due seconds)",
        due_seconds.len()
    );
    println!(
        "  converge: all {pods_n} Bound {:.1} s after the controller started (target 60 s)",
        converge.as_secs_f64()
    );
    match rss {
        Some(kib) => println!(
            "  peak RSS of the controller: {:.1} MiB (target 100 MiB)",
            kib as f64 / 1024.0
        ),
        None => {
            println!("  peak RSS of the controller: unavailable (/proc/{pid}/status unreadable)")
        }
    }
    println!(
        "  expiry lateness: p50 {:.3} s, p99 {:.3} s, max {:.3} s, min {:.3} s (target: every one within 1 s)",
        percentile(&lateness, 50.0),
        percentile(&lateness, 99.0),
        lateness.last().copied().unwrap_or(f64::NAN),
        lateness.first().copied().unwrap_or(f64::NAN),
    );
    let _ = std::fs::remove_dir_all(&dir);
}
