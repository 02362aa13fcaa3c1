//! `make bench-agent`: the node agent with 5 000 reservations on one node.
//!
//! * the agent's disk side alone: a full resync writing 5 000 files into an empty network
//!   directory, a full resync finding nothing to change, and steady-state passes writing one
//!   and forty changed files;
//! * the released `ipkeep-operator agent` binary against the API test server: time from its start
//!   to its first full sync (list 5 000 reservations, write 5 000 files), then the time from a
//!   reservation change (the moment the status PATCH is sent, 100 changes per second as a busy
//!   controller would) to the new content being on disk (p50, p99, max), and the agent's peak RSS.
//!
//! Not a test: it prints figures; nothing is asserted about time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use ipkeep_e2e::apiserver::{ServerOptions, TestServer};
use ipkeep_operator::agent::writer::NetworkWriter;
use ipkeep_operator::agent::{desired::desired_files, view};
use ipkeep_operator::crd::{IPReservation, IPReservationSpec, IpString};
use ipkeep_plugin::reservation::{ReservationFile, Timestamp};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const RESERVATIONS: usize = 5_000;
const CHANGES: usize = 2_000;
const RATE_PER_SEC: u64 = 100;
const NODE: &str = "bench-node";
const NS: &str = "bench";
const NETWORK: &str = "cbr0";

fn agent_binary() -> PathBuf {
    match std::env::var_os("IPKEEP_OPERATOR_BIN") {
        Some(bin) => PathBuf::from(bin),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/ipkeep-operator"),
    }
}

fn ip_of(i: usize) -> String {
    format!("10.{}.{}.{}", 64 + i / 65_536, (i / 256) % 256, i % 256)
}

async fn http_get(addr: &str, path: &str) -> Option<String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.ok()?;
    Some(reply)
}

fn vm_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn pct(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ipkeep-bench-agent-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let bin = agent_binary();
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build --release -p ipkeep-operator` (make bench-agent does)",
        bin.display()
    );
    let server = TestServer::start(ServerOptions {
        crd_dirs: vec![PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../crds")],
        ..ServerOptions::default()
    })
    .await
    .expect("failed to start the API test server");
    let client = server.client();
    let work = scratch("work");
    let kubeconfig = work.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(NS.into()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            },
        )
        .await
        .unwrap();
    let api: Api<IPReservation> = Api::namespaced(client.clone(), NS);
    let started = Instant::now();
    futures::stream::iter(0..RESERVATIONS)
        .map(|i| {
            let api = api.clone();
            async move {
                let r = IPReservation::new(
                    &format!("r-{i}"),
                    IPReservationSpec {
                        ips: vec![IpString(ip_of(i))],
                        node_name: NODE.into(),
                        retain_for: Some("24h".into()),
                    },
                );
                api.create(&PostParams::default(), &r).await.unwrap();
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
    println!(
        "agent bench: {RESERVATIONS} reservations on one node, created in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // The disk side alone.
    let listed = api.list(&ListParams::default()).await.unwrap().items;
    let desired = desired_files(
        NODE,
        &view::reservations(&listed),
        Duration::from_secs(86_400),
    )
    .files;
    let disk = scratch("disk");
    let mut writer = NetworkWriter::new(&disk, NETWORK);
    let t = Instant::now();
    let report = writer.full_sync(&desired).unwrap();
    let cold = t.elapsed();
    assert_eq!(report.written.len(), RESERVATIONS);
    let t = Instant::now();
    let report = writer.full_sync(&desired).unwrap();
    let warm = t.elapsed();
    assert!(report.written.is_empty());
    println!(
        "  full resync, {RESERVATIONS} files to write:        {}",
        ms(cold)
    );
    println!("  full resync, nothing to change:           {}", ms(warm));
    // Steady-state passes: one changed reservation and a batch of 40, each among the 5 000
    // (each pass is one `apply_reservations` call: one lock, the snapshot patched).
    let mut changed = desired.clone();
    let mut pass = |n: usize, round: i64| {
        for (k, file) in changed.values_mut().take(n).enumerate() {
            file.release_time = Some(Timestamp::from_unix_secs(
                1_900_000_000 + round * 1_000 + i64::try_from(k).unwrap(),
            ));
        }
        let t = Instant::now();
        let report = writer.apply(&changed).unwrap();
        assert_eq!(report.written.len(), n);
        t.elapsed()
    };
    let mut one: Vec<Duration> = (0..5).map(|r| pass(1, r)).collect();
    let mut forty: Vec<Duration> = (5..8).map(|r| pass(40, r)).collect();
    one.sort();
    forty.sort();
    println!(
        "  steady pass, 1 change among {RESERVATIONS}:        {} (median of 5)",
        ms(one[2])
    );
    println!(
        "  steady pass, 40 changes among {RESERVATIONS}:      {} (median of 3)",
        ms(forty[1])
    );
    let _ = std::fs::remove_dir_all(&disk);

    // The agent binary.
    let data_dir = scratch("data");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let probe = format!("127.0.0.1:{port}");
    let t = Instant::now();
    let mut agent = Command::new(&bin)
        .args([
            "agent",
            "--node-name",
            NODE,
            "--network",
            NETWORK,
            "--log-level",
            "warn",
        ])
        .arg("--data-dir")
        .arg(&data_dir)
        .args(["--probe-addr", &probe])
        .env("KUBECONFIG", &kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("failed to start the agent");
    let pid = agent.id();
    loop {
        if let Some(reply) = http_get(&probe, "/readyz").await
            && reply.starts_with("HTTP/1.1 200")
        {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(300),
            "the agent never became ready"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let first_sync = t.elapsed();
    println!(
        "  agent start → first full sync done:       {}",
        ms(first_sync)
    );
    let rss_after_sync = vm_kib(pid, "VmRSS:");

    // 100 changes per second; the poller watches the pending files.
    let pending: Arc<Mutex<HashMap<usize, (Timestamp, Instant)>>> = Arc::default();
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poller = {
        let (pending, latencies, done) = (pending.clone(), latencies.clone(), done.clone());
        let ns_dir = data_dir.join(NETWORK).join("reserved").join(NS);
        std::thread::spawn(move || {
            loop {
                let snapshot: Vec<(usize, Timestamp, Instant)> = pending
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|(i, (ts, at))| (*i, *ts, *at))
                    .collect();
                if snapshot.is_empty() && done.load(std::sync::atomic::Ordering::Relaxed) {
                    return;
                }
                for (i, want, sent) in snapshot {
                    let Ok(bytes) = std::fs::read(ns_dir.join(format!("r-{i}"))) else {
                        continue;
                    };
                    if let Ok(f) = ReservationFile::from_json(&bytes)
                        && f.release_time == Some(want)
                    {
                        latencies.lock().unwrap().push(sent.elapsed());
                        pending.lock().unwrap().remove(&i);
                    }
                }
                std::thread::sleep(Duration::from_micros(500));
            }
        })
    };
    let base = 1_900_000_000i64;
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / RATE_PER_SEC));
    let t = Instant::now();
    for k in 0..CHANGES {
        tick.tick().await;
        let i = (k * 7_919) % RESERVATIONS;
        let release = base + i64::try_from(k).unwrap();
        let text = Timestamp::from_unix_secs(release).to_rfc3339();
        pending
            .lock()
            .unwrap()
            .insert(i, (Timestamp::from_unix_secs(release), Instant::now()));
        api.patch_status(
            &format!("r-{i}"),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Released", "releaseTime": text}})),
        )
        .await
        .unwrap();
    }
    let rate = CHANGES as f64 / t.elapsed().as_secs_f64();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let wait_start = Instant::now();
    while !poller.is_finished() {
        assert!(
            wait_start.elapsed() < Duration::from_secs(120),
            "changes never reached the disk"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    poller.join().unwrap();
    let mut lat = latencies.lock().unwrap().clone();
    lat.sort();
    let peak = vm_kib(pid, "VmHWM:");
    println!(
        "  change → file ({} changes at {rate:.0}/s):  p50 {}, p99 {}, max {}",
        lat.len(),
        ms(pct(&lat, 50)),
        ms(pct(&lat, 99)),
        ms(*lat.last().unwrap())
    );
    println!(
        "  agent RSS: {:.1} MiB after the first sync, peak {:.1} MiB",
        rss_after_sync as f64 / 1024.0,
        peak as f64 / 1024.0
    );
    // The agent's own view: from a change's arrival on its watch to the file (histogram buckets).
    if let Some(reply) = http_get(&probe, "/metrics").await {
        let buckets: Vec<(f64, f64)> = reply
            .lines()
            .filter_map(|l| l.strip_prefix("ipkeep_agent_change_to_file_seconds_bucket{le=\""))
            .filter_map(|l| {
                let (le, n) = l.split_once("\"} ")?;
                Some((le.parse().unwrap_or(f64::INFINITY), n.trim().parse().ok()?))
            })
            .collect();
        let total = buckets.last().map_or(0.0, |b| b.1);
        let bound = |q: f64| {
            buckets
                .iter()
                .find(|(_, n)| *n >= q * total)
                .map_or(f64::INFINITY, |b| b.0)
        };
        println!(
            "  agent's histogram (watch arrival → file, {total} observations): p50 ≤ {} s, p99 ≤ {} s",
            bound(0.5),
            bound(0.99)
        );
    }
    println!(
        "  load average after: {} (2 cores shared with other work)",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = agent.wait();
    let _ = std::fs::remove_dir_all(&data_dir);
    let _ = std::fs::remove_dir_all(&work);
}
