//! `make bench-agent`: the node agent against the real kube-apiserver, run as the chart's agent
//! ServiceAccount.
//!
//! * The agent's disk side alone, 5 000 reservations: a full resync into an empty directory, one
//!   finding nothing to change, and steady passes writing one and forty changed files.
//! * One agent, 5 000 reservations on its node: start → first full sync; then reservation changes
//!   at 100/s (the moment the status PATCH is sent) → the new content on disk, p50/p99/max. Its
//!   ceiling: the same changes seen by a bare watch of ours with the agent's field selector and
//!   identity — what the API server's watch alone takes.
//! * `--agents` agents (default 50), each the agent of another node name, each watching its node's
//!   reservations with a field selector: the kube-apiserver's CPU (from `/proc`) idle and under
//!   100 changes/s, and its resident memory, before and after they start — projected to 5 000
//!   nodes. Its reference: the CPU the same changes cost without any agent.
//!
//! Not a test: it prints figures; nothing is asserted about time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::testkit::plane as real;

use ipkeep_e2e::testkit::bench as support;

use std::{
    collections::HashMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use clap::Parser;
use futures::TryStreamExt;
use ipkeep_operator::{
    agent::{desired::desired_files, view, writer::NetworkWriter},
    crd::IPReservation,
};
use ipkeep_reservation::{ReservationFile, Timestamp};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;
use support::{Operator, Plane, percent, percentile};

const NETWORK: &str = "cbr0";
/// Release times written by the changes start here (2030), one second apart per change.
const BASE: i64 = 1_900_000_000;
/// How many writes the bench makes at once while setting up (admin, exempt from APF).
const SETUP_IN_FLIGHT: usize = 32;

#[derive(Debug, Parser)]
#[command(about = "ipkeep's node agent measured against a Kubernetes API server")]
struct Args {
    /// Reservations on the one node of the latency figure.
    #[arg(long, default_value_t = 5_000)]
    reservations: usize,
    /// Changes made at `--rate` for the latency figure.
    #[arg(long, default_value_t = 2_000)]
    changes: usize,
    /// Changes per second.
    #[arg(long, default_value_t = 100)]
    rate: u64,
    /// Agents (each of another node name) for the API server's cost; 0 skips it.
    #[arg(long, default_value_t = 50)]
    agents: usize,
    /// Reservations per agent's node.
    #[arg(long, default_value_t = 100)]
    per_agent: usize,
    /// Seconds of each CPU measurement window.
    #[arg(long, default_value_t = 20)]
    window: u64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    let plane = Plane::start().await;
    println!("agent bench on {}", plane.describe());
    let admin = plane.admin();
    let ns = plane.namespace("bench-agent").await;
    let node = "bench-node";
    let made = create_reservations(&admin, &ns, 0..args.reservations, |_| node.to_owned()).await;
    println!(
        "  {} reservations on one node created in {:.1} s",
        args.reservations,
        made.as_secs_f64()
    );
    disk_side(&admin, &ns, node, &plane).await;
    latency(&plane, &admin, &ns, node, &args).await;
    if args.agents > 0 {
        many_agents(&plane, &admin, &args).await;
    }
    println!(
        "  load average after: {} (2 cores shared with other work)",
        support::load_average()
    );
    plane.finish();
}

async fn create_reservations(
    admin: &Client,
    ns: &str,
    range: std::ops::Range<usize>,
    node_of: impl Fn(usize) -> String,
) -> Duration {
    let api: Api<IPReservation> = Api::namespaced(admin.clone(), ns);
    let apply = PatchParams::apply(support::BENCH_MANAGER);
    support::run_all(range, SETUP_IN_FLIGHT, |i| {
        let (api, apply) = (api.clone(), apply.clone());
        let body =
            support::reservation_spec(&format!("r-{i}"), &support::test_ip(i), &node_of(i), "24h");
        async move {
            api.patch(&format!("r-{i}"), &apply, &Patch::Apply(&body))
                .await
                .expect("reservation create");
        }
    })
    .await
}

fn ms(seconds: f64) -> String {
    format!("{:.1} ms", seconds * 1000.0)
}

/// The writer alone: what a full resync and a steady pass cost on this disk.
async fn disk_side(admin: &Client, ns: &str, node: &str, plane: &Plane) {
    let api: Api<IPReservation> = Api::namespaced(admin.clone(), ns);
    let listed = api.list(&ListParams::default()).await.unwrap().items;
    let desired = desired_files(
        node,
        &view::reservations(&listed),
        Duration::from_secs(86_400),
    )
    .files;
    let n = desired.len();
    let disk = plane.scratch("disk");
    let mut writer = NetworkWriter::new(&disk, NETWORK);
    let t = Instant::now();
    assert_eq!(writer.full_sync(&desired).unwrap().written.len(), n);
    let cold = t.elapsed();
    let t = Instant::now();
    assert!(writer.full_sync(&desired).unwrap().written.is_empty());
    let warm = t.elapsed();
    println!(
        "  disk: full resync writing {n} files {}, finding nothing to change {}",
        ms(cold.as_secs_f64()),
        ms(warm.as_secs_f64())
    );
    let mut changed = desired.clone();
    let mut pass = |count: usize, round: i64| {
        for (k, file) in changed.values_mut().take(count).enumerate() {
            let release_time = Some(Timestamp::from_unix_secs(
                BASE + round * 1_000 + i64::try_from(k).unwrap(),
            ));
            *file = ReservationFile {
                release_time,
                ..ReservationFile::clone(file)
            }
            .validate()
            .unwrap();
        }
        let t = Instant::now();
        assert_eq!(writer.apply(&changed).unwrap().written.len(), count);
        t.elapsed().as_secs_f64()
    };
    let mut one: Vec<f64> = (0..5).map(|r| pass(1, r)).collect();
    let mut forty: Vec<f64> = (5..8).map(|r| pass(40, r)).collect();
    one.sort_by(f64::total_cmp);
    forty.sort_by(f64::total_cmp);
    println!(
        "  disk: steady pass with 1 change among {n} {} (median of 5), with 40 changes {} (median of 3)",
        ms(one[2]),
        ms(forty[1])
    );
    let _ = std::fs::remove_dir_all(&disk);
}

/// An agent process and where its probes answer.
struct Agent {
    process: Operator,
    probe: SocketAddr,
    data_dir: PathBuf,
}

async fn start_agent(plane: &Plane, node: &str, name: &str) -> Agent {
    let data_dir = plane.scratch(name);
    let probe = support::free_addr();
    let args: Vec<String> = vec![
        "agent".into(),
        "--node-name".into(),
        node.into(),
        "--network".into(),
        NETWORK.into(),
        "--log-level".into(),
        "warn".into(),
        "--data-dir".into(),
        data_dir.display().to_string(),
        "--metrics-addr".into(),
        probe.to_string(),
    ];
    let process = plane.operator(name, real::AGENT_ACCOUNT, &args).await;
    Agent {
        process,
        probe,
        data_dir,
    }
}

impl Agent {
    /// Waits for `/readyz` (its first full sync done); returns how long that took.
    async fn ready(&self) -> Duration {
        self.process.ready(self.probe).await
    }
}

/// Change number `k`: which reservation, and the release time it gets.
fn change(k: usize, n: usize) -> (String, i64) {
    // 7 919 is prime, so the first n changes touch n different reservations.
    (
        format!("r-{}", (k * 7_919) % n),
        BASE + i64::try_from(k).unwrap(),
    )
}

async fn patch_change(api: &Api<IPReservation>, name: &str, release: i64) {
    let text = Timestamp::from_unix_secs(release).to_rfc3339();
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Released", "releaseTime": text}})),
    )
    .await
    .expect("status patch");
}

/// When each change was sent, by its release time.
type Sent = Arc<Mutex<HashMap<i64, Instant>>>;

/// A bare watch with the agent's field selector and identity: when each change arrives.
fn bare_watch(
    client: Client,
    node: &str,
    sent: Sent,
) -> (
    tokio::task::JoinHandle<()>,
    Arc<Mutex<Vec<f64>>>,
    tokio::sync::oneshot::Receiver<()>,
) {
    let seen: Arc<Mutex<Vec<f64>>> = Arc::default();
    let (ready_tx, ready) = tokio::sync::oneshot::channel();
    let api: Api<IPReservation> = Api::all(client);
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let out = seen.clone();
    let task = tokio::spawn(async move {
        let mut ready_tx = Some(ready_tx);
        let mut events = std::pin::pin!(watcher(api, cfg).default_backoff());
        while let Ok(Some(ev)) = events.try_next().await {
            match ev {
                watcher::Event::InitDone => {
                    if let Some(tx) = ready_tx.take() {
                        let _ = tx.send(());
                    }
                }
                watcher::Event::Apply(r) => {
                    let Some(t) = r.status.and_then(|s| s.release_time) else {
                        continue;
                    };
                    if let Some(at) = sent.lock().unwrap().remove(&t.0.as_second()) {
                        out.lock().unwrap().push(at.elapsed().as_secs_f64());
                    }
                }
                _ => {}
            }
        }
    });
    (task, seen, ready)
}

/// One agent, its node's reservations changing at `--rate`: change → file, beside change → watch.
async fn latency(plane: &Plane, admin: &Client, ns: &str, node: &str, args: &Args) {
    let agent = start_agent(plane, node, "agent-latency").await;
    let first_sync = agent.ready().await;
    println!(
        "  one agent: start → first full sync of {} reservations {}; RSS then {:.1} MiB",
        args.reservations,
        ms(first_sync.as_secs_f64()),
        support::proc_kib(agent.process.pid(), "VmRSS:") as f64 / 1024.0
    );
    let sent: Sent = Arc::default();
    let as_agent = plane.account_client(real::AGENT_ACCOUNT).await;
    let (watch, watched, watch_ready) = bare_watch(as_agent, node, sent.clone());
    let _ = tokio::time::timeout(Duration::from_secs(120), watch_ready).await;

    // The files to poll: (path, wanted release time, when sent).
    let pending: Arc<Mutex<Vec<(PathBuf, Timestamp, Instant)>>> = Arc::default();
    let on_disk: Arc<Mutex<Vec<f64>>> = Arc::default();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poller = {
        let (pending, on_disk, done) = (pending.clone(), on_disk.clone(), done.clone());
        std::thread::spawn(move || poll_files(&pending, &on_disk, &done))
    };
    let dir = agent.data_dir.join(NETWORK).join("reserved").join(ns);
    let api: Api<IPReservation> = Api::namespaced(admin.clone(), ns);
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / args.rate.max(1)));
    let n = args.changes.min(args.reservations);
    let t = Instant::now();
    for k in 0..n {
        tick.tick().await;
        let (name, release) = change(k, args.reservations);
        let now = Instant::now();
        sent.lock().unwrap().insert(release, now);
        pending
            .lock()
            .unwrap()
            .push((dir.join(&name), Timestamp::from_unix_secs(release), now));
        patch_change(&api, &name, release).await;
    }
    let rate = n as f64 / t.elapsed().as_secs_f64();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let waited = Instant::now();
    while !poller.is_finished() {
        agent.process.check();
        assert!(
            waited.elapsed() < Duration::from_secs(300),
            "changes never reached the disk"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    poller.join().unwrap();
    watch.abort();
    let mut file = on_disk.lock().unwrap().clone();
    let mut bare = watched.lock().unwrap().clone();
    file.sort_by(f64::total_cmp);
    bare.sort_by(f64::total_cmp);
    println!(
        "  one agent: change → file ({} changes at {rate:.0}/s): p50 {}, p99 {}, max {}",
        file.len(),
        ms(percentile(&file, 50.0)),
        ms(percentile(&file, 99.0)),
        ms(file.last().copied().unwrap_or(f64::NAN))
    );
    println!(
        "    ceiling, change → a bare watch of ours ({} seen): p50 {}, p99 {} → the watch is {:.0} % of the agent's p50",
        bare.len(),
        ms(percentile(&bare, 50.0)),
        ms(percentile(&bare, 99.0)),
        percent(percentile(&bare, 50.0), percentile(&file, 50.0))
    );
    println!(
        "    agent peak RSS {:.1} MiB",
        agent.process.peak_rss_kib() as f64 / 1024.0
    );
    agent.process.stop();
}

/// Polls every pending file until it holds its wanted release time; records send → on disk.
fn poll_files(
    pending: &Mutex<Vec<(PathBuf, Timestamp, Instant)>>,
    on_disk: &Mutex<Vec<f64>>,
    done: &std::sync::atomic::AtomicBool,
) {
    loop {
        let snapshot = pending.lock().unwrap().clone();
        if snapshot.is_empty() && done.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let mut arrived = Vec::new();
        for (path, want, sent) in &snapshot {
            if holds(path, *want) {
                on_disk.lock().unwrap().push(sent.elapsed().as_secs_f64());
                arrived.push(path.clone());
            }
        }
        pending
            .lock()
            .unwrap()
            .retain(|(p, _, _)| !arrived.contains(p));
        std::thread::sleep(Duration::from_micros(500));
    }
}

fn holds(path: &Path, want: Timestamp) -> bool {
    std::fs::read(path)
        .ok()
        .and_then(|b| ReservationFile::from_json(&b).ok())
        .is_some_and(|f| f.release_time == Some(want))
}

/// The API server's CPU seconds over `window`, with `--rate` changes per second spread over
/// `names` (none: idle).
async fn cpu_window(
    pid: u32,
    api: &Api<IPReservation>,
    names: &[String],
    rate: u64,
    window: Duration,
    first: &mut usize,
) -> f64 {
    let before = support::cpu_seconds(pid);
    let t = Instant::now();
    if names.is_empty() {
        tokio::time::sleep(window).await;
    } else {
        let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate.max(1)));
        while t.elapsed() < window {
            tick.tick().await;
            let k = *first;
            *first += 1;
            patch_change(
                api,
                &names[k % names.len()],
                BASE + 10_000_000 + i64::try_from(k).unwrap(),
            )
            .await;
        }
    }
    (support::cpu_seconds(pid) - before) / t.elapsed().as_secs_f64()
}

/// `--agents` agents, each of another node name: what they add to the API server.
async fn many_agents(plane: &Plane, admin: &Client, args: &Args) {
    let pid = plane.apiserver_pid();
    let ns = plane.namespace("bench-agents").await;
    let total = args.agents * args.per_agent;
    create_reservations(admin, &ns, 0..total, |i| format!("sim-{}", i % args.agents)).await;
    let names: Vec<String> = (0..total).map(|i| format!("r-{i}")).collect();
    let api: Api<IPReservation> = Api::namespaced(admin.clone(), &ns);
    let window = Duration::from_secs(args.window);
    let mut k = 0;
    let idle_before = cpu_window(pid, &api, &[], args.rate, window, &mut k).await;
    let churn_before = cpu_window(pid, &api, &names, args.rate, window, &mut k).await;
    let rss_before = support::proc_kib(pid, "VmRSS:");

    let cpu0 = support::cpu_seconds(pid);
    let t = Instant::now();
    let mut agents = Vec::new();
    for a in 0..args.agents {
        agents.push(start_agent(plane, &format!("sim-{a}"), &format!("agent-sim-{a}")).await);
    }
    for agent in &agents {
        agent.ready().await;
    }
    let start_cpu = support::cpu_seconds(pid) - cpu0;
    let start_time = t.elapsed();
    let idle_after = cpu_window(pid, &api, &[], args.rate, window, &mut k).await;
    let churn_after = cpu_window(pid, &api, &names, args.rate, window, &mut k).await;
    let rss_after = support::proc_kib(pid, "VmRSS:");
    let agents_rss: u64 = agents
        .iter()
        .map(|a| support::proc_kib(a.process.pid(), "VmRSS:"))
        .sum();
    for agent in agents {
        agent.process.check();
        agent.process.stop();
    }

    let n = args.agents as f64;
    let added_idle = idle_after - idle_before;
    let added_churn = churn_after - churn_before;
    let added_rss = rss_after as f64 - rss_before as f64;
    println!(
        "  {} agents ({} reservations each), kube-apiserver (cores = CPU seconds per second):",
        args.agents, args.per_agent
    );
    println!(
        "    start-up (each lists its node's reservations): {:.2} CPU s in {:.1} s, {:.3} CPU s per agent",
        start_cpu,
        start_time.as_secs_f64(),
        start_cpu / n
    );
    println!(
        "    idle: {:.3} cores without agents, {:.3} with → {:+.4} cores per agent, {:+.2} cores projected for 5 000 nodes (a difference under 0.01 cores is noise here)",
        idle_before,
        idle_after,
        added_idle / n,
        added_idle / n * 5_000.0
    );
    println!(
        "    {} changes/s: {:.3} cores without agents (the writes themselves: the reference), {:.3} with → the watches add {:.0} % ({:+.4} cores per agent, {:+.2} projected for 5 000 nodes at this change rate)",
        args.rate,
        churn_before,
        churn_after,
        percent(added_churn, churn_before),
        added_churn / n,
        added_churn / n * 5_000.0
    );
    println!(
        "    memory: {:.0} MiB before, {:.0} MiB after → {:+.2} MiB per agent, {:+.0} MiB projected for 5 000 nodes (Go heap: noisy); the agents themselves {:.1} MiB each",
        rss_before as f64 / 1024.0,
        rss_after as f64 / 1024.0,
        added_rss / n / 1024.0,
        added_rss / n * 5_000.0 / 1024.0,
        agents_rss as f64 / n / 1024.0
    );
}
