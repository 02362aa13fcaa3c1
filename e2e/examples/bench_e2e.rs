//! `make bench-e2e`: figures on real nodes (kubelet, containerd, runc; docs/real-nodes.md), with
//! the chart installed as the README tells a user (`make image`'s archive, `helm install
//! charts/ipkeep`, `cni.replaceHostLocal=true`).
//!
//! * `kubectl delete pod` (the pod's own grace period) of a StatefulSet pod → its successor
//!   Ready, p50/p99 over [`ROUNDS`] re-creations, for a StatefulSet that keeps its address
//!   (`ipkeep.dev/retain`, on `node-1`) and, alternating with it in the same run, for one
//!   without the annotation (host-local's allocation, which ipkeep gives unannotated pods) on
//!   `node-0`, where nothing else allocates, so round robin gives each successor the next,
//!   never-used address (on one node the retained pod's re-creation puts the round-robin
//!   cursor back on its address, and the unannotated successor then found its own freed address
//!   again); the ratio is what keeping the address costs against a fresh one, and the address
//!   each successor got is printed;
//! * the plugin's ADD as containerd runs it: the plugin logs no timing of its own and containerd
//!   copies its stderr into the log without a timestamp, so the bound is the two timestamped
//!   containerd lines around each decision line; beside it, the whole `RunPodSandbox` (network
//!   namespace, sandbox container, the conflist's bridge + IPAM + portmap) of both kinds of pod;
//! * the memory of the controller and agent pods as their pod cgroups report it
//!   (`memory.usage_in_bytes`, `total_rss` of `memory.stat`, `memory.max_usage_in_bytes`).
//!
//! Not a test: it prints figures; nothing is asserted about time. Needs root, `make cluster-bins
//! node-bins image` (the Makefile target does them). `IPKEEP_IMAGE_ARCHIVE` overrides the archive.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ipkeep_e2e::cluster::realnode::{Cluster, ClusterOptions, RealNode, WORKLOAD_IMAGE};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;

/// Re-creations per StatefulSet.
const ROUNDS: usize = 20;
/// How long anything may take to become Ready before the bench gives up.
const READY: Duration = Duration::from_secs(300);
/// The release's namespace, as in the README.
const RELEASE_NS: &str = "ipkeep-system";

fn image_archive() -> PathBuf {
    let path = std::env::var_os("IPKEEP_IMAGE_ARCHIVE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/image/ipkeep.oci.tar")
        });
    assert!(
        path.is_file(),
        "{} is missing: run `make image` (or set IPKEEP_IMAGE_ARCHIVE)",
        path.display()
    );
    path
}

fn uptime() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().take(3).collect();
            format!("load average {}", f.join(", "))
        })
        .unwrap_or_else(|e| format!("load average unknown: {e}"))
}

/// A one-replica StatefulSet of the busybox workload serving HTTP on `node`, `retained` or not.
/// Its shell exits at once on TERM, so the default-grace delete is not the grace period.
fn statefulset(name: &str, node: &str, retained: bool) -> String {
    let annotations = if retained {
        serde_json::json!({"ipkeep.dev/retain": "true", "ipkeep.dev/retain-for": "10m"})
    } else {
        serde_json::json!({})
    };
    serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "serviceName": name,
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": annotations},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{
                        "name": "web",
                        "image": WORKLOAD_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c",
                            "httpd -p 8080 -h /www; trap 'exit 0' TERM; while :; do sleep 1 & wait; done"],
                        "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                    }],
                },
            },
        },
    })
    .to_string()
}

fn pod_ip(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_default()
}

fn is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn is_running(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|c| {
            c.iter()
                .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        })
}

/// When a re-created pod got somewhere, counted from the `kubectl delete pod`.
struct Recreation {
    /// Its container running (first seen so in the API).
    running: Duration,
    /// Ready (its readiness probe answered: the node reaches it at its address).
    ready: Duration,
    /// The predecessor's address.
    before: String,
    /// The successor's address.
    after: String,
}

impl Recreation {
    fn same_address(&self) -> bool {
        self.before == self.after
    }
}

/// One re-creation: `kubectl delete pod` (default grace, kubectl waits for the deletion as a
/// user's would), then polls (every 50 ms) until the successor is Ready.
async fn recreate(c: &Cluster, pods: &Api<Pod>, ns: &str, name: &str) -> Recreation {
    let before = pods.get(name).await.unwrap();
    let uid = before.metadata.uid.clone().unwrap();
    let started = Instant::now();
    c.kubectl(&["-n", ns, "delete", "pod", name], None).unwrap();
    let mut running = None;
    loop {
        if let Ok(Some(p)) = pods.get_opt(name).await
            && p.metadata.uid.as_deref() != Some(uid.as_str())
        {
            if running.is_none() && is_running(&p) {
                running = Some(started.elapsed());
            }
            if is_ready(&p) {
                let ready = started.elapsed();
                return Recreation {
                    running: running.unwrap_or(ready),
                    ready,
                    before: pod_ip(&before),
                    after: pod_ip(&p),
                };
            }
        }
        assert!(
            started.elapsed() < READY,
            "{name} was not back within {READY:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `q` quantile (nearest rank) of sorted `v`.
fn quantile(v: &[f64], q: f64) -> f64 {
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

fn summary(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (quantile(v, 0.5), quantile(v, 0.99))
}

/// The timestamp of a containerd log line (`time="..."`).
fn log_time(line: &str) -> Option<jiff::Timestamp> {
    let rest = line.split_once("time=\"")?.1;
    rest.split_once('"')?.0.parse().ok()
}

/// Seconds between the timestamped containerd lines just before and just after each line that
/// contains `needle` (the plugin's stderr, which containerd copies without a timestamp).
fn bracket_secs(log: &[&str], needle: &str) -> Vec<f64> {
    let mut out = Vec::new();
    for (i, line) in log.iter().enumerate() {
        if !line.contains(needle) {
            continue;
        }
        let before = log[..i].iter().rev().find_map(|l| log_time(l));
        let after = log[i + 1..].iter().find_map(|l| log_time(l));
        if let (Some(b), Some(a)) = (before, after) {
            out.push(a.duration_since(b).as_secs_f64());
        }
    }
    out
}

/// Seconds of each `RunPodSandbox` of pod `ns/name`: from containerd's "RunPodSandbox for" line
/// to its "returns sandbox id" line.
fn sandbox_secs(log: &[&str], ns: &str, name: &str) -> Vec<f64> {
    let meta = format!("Name:{name},");
    let namespace = format!("Namespace:{ns},");
    let mut out = Vec::new();
    let mut start = None;
    for line in log {
        if !(line.contains("RunPodSandbox for")
            && line.contains(&meta)
            && line.contains(&namespace))
        {
            continue;
        }
        let Some(t) = log_time(line) else { continue };
        if line.contains("returns sandbox id") {
            if let Some(s) = start.take() {
                out.push(t.duration_since(s).as_secs_f64());
            }
        } else {
            start = Some(t);
        }
    }
    out
}

/// The pod cgroup of `uid` under the node's kubelet cgroup root in the memory hierarchy.
fn pod_memory_cgroup(node: &RealNode, uid: &str) -> Option<PathBuf> {
    let root = Path::new("/sys/fs/cgroup/memory").join(node.layout().pods_cgroup());
    let want = format!("pod{uid}");
    let mut stack = vec![root];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).ok()?.flatten() {
            let path = entry.path();
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if entry.file_name().to_string_lossy() == want {
                return Some(path);
            }
            stack.push(path);
        }
    }
    None
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn stat_value(dir: &Path, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.parse().ok())
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or_else(
        || "?".into(),
        |b| format!("{:.1} MiB", b as f64 / 1_048_576.0),
    )
}

async fn print_memory(c: &Cluster) {
    let pods: Api<Pod> = Api::namespaced(c.plane().client().unwrap(), RELEASE_NS);
    let list = pods.list(&ListParams::default()).await.unwrap();
    println!("memory of the release's pods (their pod cgroups, memory hierarchy):");
    for p in list.items {
        let name = p.metadata.name.clone().unwrap_or_default();
        let uid = p.metadata.uid.clone().unwrap_or_default();
        let node_name = p.spec.and_then(|s| s.node_name).unwrap_or_default();
        let Some(node) = c.node(&node_name) else {
            println!("  {name}: on no real node ({node_name:?})");
            continue;
        };
        match pod_memory_cgroup(node, &uid) {
            Some(dir) => println!(
                "  {name} ({node_name}): usage_in_bytes {}, total_rss {}, max_usage {}",
                mib(read_u64(&dir.join("memory.usage_in_bytes"))),
                mib(stat_value(&dir, "total_rss")),
                mib(read_u64(&dir.join("memory.max_usage_in_bytes"))),
            ),
            None => println!("  {name} ({node_name}): no cgroup pod{uid} found"),
        }
    }
}

fn helm_install(c: &Cluster, image: &str) {
    let (repository, tag) = image.rsplit_once(':').unwrap();
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/ipkeep");
    let out = c
        .plane()
        .helm()
        .args(["install", "ipkeep"])
        .arg(&chart)
        .args(["--namespace", RELEASE_NS, "--create-namespace"])
        .args(["--set", &format!("image.repository={repository}")])
        .args(["--set", &format!("image.tag={tag}")])
        .args(["--set", "image.pullPolicy=Never"])
        .args(["--set", "cni.replaceHostLocal=true"])
        .args(["--wait", "--timeout", "5m"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helm install failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn print_line(what: &str, v: &mut [f64]) -> f64 {
    if v.is_empty() {
        println!("  {what}: no samples");
        return f64::NAN;
    }
    let n = v.len();
    let (p50, p99) = summary(v);
    println!(
        "  {what}: p50 {:.0} ms, p99 {:.0} ms (n={n})",
        p50 * 1e3,
        p99 * 1e3
    );
    p50
}

/// A moment of a [`Recreation`].
type Stage = fn(&Recreation) -> Duration;

/// The re-creation figures: running and Ready, retained beside unannotated, and their ratios.
fn print_recreations(rounds: &[(Recreation, Recreation)]) {
    let same = |pick: fn(&(Recreation, Recreation)) -> &Recreation| {
        rounds.iter().filter(|r| pick(r).same_address()).count()
    };
    let secs = |pick: fn(&(Recreation, Recreation)) -> &Recreation, at: Stage| {
        rounds
            .iter()
            .map(|r| at(pick(r)).as_secs_f64())
            .collect::<Vec<f64>>()
    };
    let n = rounds.len();
    println!("the successors' addresses (predecessor → successor) and Ready after the delete:");
    for (i, (kept, plain)) in rounds.iter().enumerate() {
        println!(
            "  {:>2}: retained {} → {} {:.1} s; unannotated {} → {} {:.1} s",
            i + 1,
            kept.before,
            kept.after,
            kept.ready.as_secs_f64(),
            plain.before,
            plain.after,
            plain.ready.as_secs_f64()
        );
    }
    println!(
        "kubectl delete pod (default grace) → successor, {n} re-creations each, alternating \
         (same address: retained {}/{n}, unannotated {}/{n}):",
        same(|r| &r.0),
        same(|r| &r.1)
    );
    let stages: [(&str, Stage); 2] = [("container running", |r| r.running), ("Ready", |r| r.ready)];
    for (stage, at) in stages {
        let k = print_line(&format!("{stage}, retained"), &mut secs(|r| &r.0, at));
        let p = print_line(&format!("{stage}, unannotated"), &mut secs(|r| &r.1, at));
        println!("  {stage}: ratio retained/unannotated at p50 {:.2}", k / p);
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let archive = image_archive();
    println!("bench-e2e: {} at start", uptime());
    let started = Instant::now();
    let c = Cluster::start(ClusterOptions {
        nodes: 2,
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("{}", ipkeep_e2e::error_chain(&e)));
    println!(
        "two real nodes up in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let names = c
        .load_image(&archive)
        .unwrap_or_else(|e| panic!("{}", ipkeep_e2e::error_chain(&e)));
    let t = Instant::now();
    helm_install(&c, &names[0]);
    println!("helm install --wait: {:.1} s", t.elapsed().as_secs_f64());

    let ns = c.plane().fresh_namespace("bench").await.unwrap();
    // The retained pod on node-1, the unannotated one alone on node-0 (see the module's text).
    let (node, plain_node) = (&c.nodes()[1], &c.nodes()[0]);
    let pods: Api<Pod> = Api::namespaced(c.plane().client().unwrap(), &ns);
    for (set, on, retained) in [("kept", node, true), ("plain", plain_node, false)] {
        c.kubectl(
            &["-n", &ns, "apply", "-f", "-"],
            Some(&statefulset(set, &on.name(), retained)),
        )
        .unwrap();
    }
    c.wait_pod_ready(&ns, "kept-0", READY).await.unwrap();
    c.wait_pod_ready(&ns, "plain-0", READY).await.unwrap();
    // The first delete of the kept pod should find its reservation on the node.
    let reserved = node
        .host_path(&format!("/var/lib/cni/networks/cbr0/reserved/{ns}/kept-0"))
        .unwrap();
    let t = Instant::now();
    while !reserved.is_file() {
        assert!(
            t.elapsed() < READY,
            "the agent never wrote {}",
            reserved.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    println!("bench-e2e: {} before the re-creations", uptime());
    let mut rounds: Vec<(Recreation, Recreation)> = Vec::new();
    for _ in 0..ROUNDS {
        let kept = recreate(&c, &pods, &ns, "kept-0").await;
        let plain = recreate(&c, &pods, &ns, "plain-0").await;
        rounds.push((kept, plain));
    }
    println!("bench-e2e: {} after the re-creations", uptime());
    print_recreations(&rounds);

    let text = std::fs::read_to_string(node.runtime_log()).unwrap_or_default();
    let log: Vec<&str> = text.lines().collect();
    println!(
        "the plugin's ADD as containerd ran it on {} (containerd's log; the plugin logs no timing):",
        node.name()
    );
    let needle = format!("pod {ns}/kept-0: handing out its reserved address");
    print_line(
        "timestamped lines around ipkeep's decision line (an upper bound on ADD)",
        &mut bracket_secs(&log, &needle),
    );
    let removed = log
        .iter()
        .filter(|l| l.contains("ipkeep: cbr0: removed the neighbour entry"))
        .count();
    println!(
        "  stale neighbour entries ipkeep removed on {}: {removed}",
        node.name()
    );
    print_line(
        "RunPodSandbox of the retained pod",
        &mut sandbox_secs(&log, &ns, "kept-0"),
    );
    let plain_text = std::fs::read_to_string(plain_node.runtime_log()).unwrap_or_default();
    let plain_log: Vec<&str> = plain_text.lines().collect();
    print_line(
        &format!(
            "RunPodSandbox of the unannotated pod ({})",
            plain_node.name()
        ),
        &mut sandbox_secs(&plain_log, &ns, "plain-0"),
    );

    print_memory(&c).await;
    for n in c.nodes() {
        let m: Vec<String> = n
            .memory_kib()
            .into_iter()
            .map(|(what, kib)| format!("{what} {:.1} MiB", kib as f64 / 1024.0))
            .collect();
        println!("  node {}: {}", n.name(), m.join(", "));
    }
    println!("bench-e2e: {} at the end", uptime());
    let t = Instant::now();
    c.stop()
        .unwrap_or_else(|e| panic!("{}", ipkeep_e2e::error_chain(&e)));
    println!("cluster stopped in {:.1} s", t.elapsed().as_secs_f64());
}
