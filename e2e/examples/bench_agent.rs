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
//! * `--fan-out N` (`make bench-scale`, N ≥ 1 000): N agents measured rather than projected, each
//!   the agent's own code in this process ([`ipkeep_e2e::testkit::bench_agents`]) with its own
//!   client and watch, started in `--fan-out-steps` steps. At each step: the kube-apiserver's
//!   resident memory (median of one sample a second), its CPU idle and under `--rate` changes/s
//!   (spread over every agent's node), and the watches it counts; the slope per agent from a
//!   least-squares line through the steps, projected to 5 000 nodes; then the one agent's change
//!   → file latency again, under the fan-out, beside the same without it.
//!
//! Not a test: it prints figures; nothing is asserted about time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::testkit::plane::AGENT_ACCOUNT;

use ipkeep_e2e::testkit::bench;
use ipkeep_e2e::testkit::bench_agents::{Fleet, line};

use std::{
    collections::HashMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bench::{Operator, Plane, percent, percentile};
use clap::Parser;
use futures::TryStreamExt;
use ipkeep_operator::{
    agent::{view, writer::NetworkWriter},
    api::IPReservation,
    rules::desired::desired_files,
};
use ipkeep_reservation::{ReservationFile, Timestamp};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;

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
    /// Agents run in this process for the measured fan-out (`make bench-scale`: 1 000); 0 skips
    /// it.
    #[arg(long, default_value_t = 0)]
    fan_out: usize,
    /// Steps the fan-out grows in (the slope is fitted through them).
    #[arg(long, default_value_t = 4)]
    fan_out_steps: usize,
    /// Reservations per node of the fan-out.
    #[arg(long, default_value_t = 5)]
    fan_out_per_node: usize,
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
    let alone = latency(&plane, &admin, &ns, node, &args, 0).await;
    if args.agents > 0 {
        many_agents(&plane, &admin, &args).await;
    }
    if args.fan_out > 0 {
        fan_out(&plane, &admin, &ns, node, &args, alone).await;
    }
    println!(
        "  load average after: {} (2 cores shared with other work)",
        bench::load_average()
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
    let apply = PatchParams::apply(bench::BENCH_MANAGER);
    bench::run_all(range, SETUP_IN_FLIGHT, |i| {
        let (api, apply) = (api.clone(), apply.clone());
        let body =
            bench::reservation_spec(&format!("r-{i}"), &bench::test_ip(i), &node_of(i), "24h");
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
    let probe = bench::free_addr();
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
    let process = plane.operator(name, AGENT_ACCOUNT, &args).await;
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

/// Change number `k` of latency run `round`: which reservation, and the release time it gets
/// (each round's its own, so that no file already holds it).
fn change(k: usize, n: usize, round: i64) -> (String, i64) {
    // 7 919 is prime, so the first n changes touch n different reservations.
    (
        format!("r-{}", (k * 7_919) % n),
        BASE + round * 100_000_000 + i64::try_from(k).unwrap(),
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

/// Change → file of one run: p50 and p99 in seconds.
#[derive(Debug, Clone, Copy)]
struct Latency {
    p50: f64,
    p99: f64,
}

/// One agent, its node's reservations changing at `--rate`: change → file, beside change → watch.
async fn latency(
    plane: &Plane,
    admin: &Client,
    ns: &str,
    node: &str,
    args: &Args,
    round: i64,
) -> Latency {
    let agent = start_agent(plane, node, &format!("agent-latency-{round}")).await;
    let first_sync = agent.ready().await;
    println!(
        "  one agent: start → first full sync of {} reservations {}; RSS then {:.1} MiB",
        args.reservations,
        ms(first_sync.as_secs_f64()),
        bench::proc_kib(agent.process.pid(), "VmRSS:") as f64 / 1024.0
    );
    let sent: Sent = Arc::default();
    let as_agent = plane.account_client(AGENT_ACCOUNT).await;
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
        let (name, release) = change(k, args.reservations, round);
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
    Latency {
        p50: percentile(&file, 50.0),
        p99: percentile(&file, 99.0),
    }
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
    let before = bench::cpu_seconds(pid);
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
    (bench::cpu_seconds(pid) - before) / t.elapsed().as_secs_f64()
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
    let rss_before = bench::proc_kib(pid, "VmRSS:");

    let cpu0 = bench::cpu_seconds(pid);
    let t = Instant::now();
    let mut agents = Vec::new();
    for a in 0..args.agents {
        agents.push(start_agent(plane, &format!("sim-{a}"), &format!("agent-sim-{a}")).await);
    }
    for agent in &agents {
        agent.ready().await;
    }
    let start_cpu = bench::cpu_seconds(pid) - cpu0;
    let start_time = t.elapsed();
    let idle_after = cpu_window(pid, &api, &[], args.rate, window, &mut k).await;
    let churn_after = cpu_window(pid, &api, &names, args.rate, window, &mut k).await;
    let rss_after = bench::proc_kib(pid, "VmRSS:");
    let agents_rss: u64 = agents
        .iter()
        .map(|a| bench::proc_kib(a.process.pid(), "VmRSS:"))
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

/// What the API server showed with `agents` agents watching.
#[derive(Debug, Clone, Copy)]
struct Step {
    agents: usize,
    /// Median resident memory over the idle window, KiB.
    rss_kib: f64,
    /// CPU seconds per second, idle and under `--rate` changes/s.
    idle: f64,
    churn: f64,
    /// The change rate the churn window reached (the writes are sequential: under load, less
    /// than `--rate`), and its CPU per change in milliseconds.
    rate: f64,
    per_change_ms: f64,
    /// IPReservation watches the API server counts (`apiserver_longrunning_requests`).
    watches: u64,
}

/// The API server's CPU over `window` with no writes, and its resident memory's median, sampled
/// once a second meanwhile (KiB).
async fn idle_window(pid: u32, window: Duration) -> (f64, f64) {
    let before = bench::cpu_seconds(pid);
    let t = Instant::now();
    let mut rss = Vec::new();
    while t.elapsed() < window {
        tokio::time::sleep(Duration::from_secs(1)).await;
        rss.push(bench::proc_kib(pid, "VmRSS:") as f64);
    }
    let cores = (bench::cpu_seconds(pid) - before) / t.elapsed().as_secs_f64();
    rss.sort_by(f64::total_cmp);
    (cores, percentile(&rss, 50.0))
}

/// The IPReservation watches open on the API server, from its own metrics.
async fn watches_counted(admin: &Client) -> u64 {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = admin
        .request_text(request)
        .await
        .expect("the API server's metrics");
    text.lines()
        .filter(|l| {
            l.starts_with("apiserver_longrunning_requests{")
                && l.contains("resource=\"ipreservations\"")
                && l.contains("verb=\"WATCH\"")
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum::<f64>() as u64
}

async fn measure_step(
    plane: &Plane,
    admin: &Client,
    api: &Api<IPReservation>,
    names: &[String],
    agents: usize,
    args: &Args,
    k: &mut usize,
) -> Step {
    let pid = plane.apiserver_pid();
    let window = Duration::from_secs(args.window);
    let (idle, rss_kib) = idle_window(pid, window).await;
    let first = *k;
    let churn = cpu_window(pid, api, names, args.rate, window, k).await;
    let rate = (*k - first) as f64 / window.as_secs_f64();
    let step = Step {
        agents,
        rss_kib,
        idle,
        churn,
        rate,
        per_change_ms: (churn - idle) / rate * 1000.0,
        watches: watches_counted(admin).await,
    };
    println!(
        "    {:>5} agents: RSS {:>6.0} MiB, idle {:.3} cores, {:.0} changes/s {:.3} cores ({:.2} CPU ms per change above idle), {} IPReservation watches open",
        step.agents,
        step.rss_kib / 1024.0,
        step.idle,
        step.rate,
        step.churn,
        step.per_change_ms,
        step.watches
    );
    step
}

/// `--fan-out` agents in this process, in steps: what each adds to the API server, measured, and
/// the one agent's latency under them.
async fn fan_out(
    plane: &Plane,
    admin: &Client,
    latency_ns: &str,
    latency_node: &str,
    args: &Args,
    alone: Latency,
) {
    let pid = plane.apiserver_pid();
    let ns = plane.namespace("bench-fan-out").await;
    let nodes: Vec<String> = (0..args.fan_out).map(|i| format!("fan-{i}")).collect();
    let total = args.fan_out * args.fan_out_per_node;
    let made = create_reservations(admin, &ns, 0..total, |i| nodes[i % nodes.len()].clone()).await;
    println!(
        "  fan-out: {} agents in this process, each its own client and watch, {} reservations per node ({total} created in {:.1} s); kube-apiserver:",
        args.fan_out,
        args.fan_out_per_node,
        made.as_secs_f64()
    );
    let names: Vec<String> = (0..total).map(|i| format!("r-{i}")).collect();
    let api: Api<IPReservation> = Api::namespaced(admin.clone(), &ns);
    let data_root = plane.scratch("fan-out");
    let mut k = 0;
    let mut steps = vec![measure_step(plane, admin, &api, &names, 0, args, &mut k).await];
    let mut start_cpu = 0.0;
    let mut start_time = Duration::ZERO;
    let mut fleet = Fleet::default();
    let count = args.fan_out_steps.max(1);
    for step in 1..=count {
        let upto = args.fan_out * step / count;
        let cpu0 = bench::cpu_seconds(pid);
        let t = Instant::now();
        fleet
            .grow(
                &nodes[fleet.len()..upto],
                NETWORK,
                &data_root,
                || plane.account_client(AGENT_ACCOUNT),
                Duration::from_secs(600),
            )
            .await;
        start_cpu += bench::cpu_seconds(pid) - cpu0;
        start_time += t.elapsed();
        steps.push(measure_step(plane, admin, &api, &names, fleet.len(), args, &mut k).await);
    }
    let under = latency(plane, admin, latency_ns, latency_node, args, 1).await;
    fleet.check();
    fleet.stop().await;
    let _ = std::fs::remove_dir_all(&data_root);

    let n = args.fan_out as f64;
    println!(
        "    start-up (each agent lists its node's reservations and opens its watch): {start_cpu:.2} CPU s in {:.1} s, {:.4} CPU s per agent",
        start_time.as_secs_f64(),
        start_cpu / n
    );
    let fit = |y: fn(&Step) -> f64| {
        let points: Vec<(f64, f64)> = steps.iter().map(|s| (s.agents as f64, y(s))).collect();
        line(&points).unwrap_or((f64::NAN, f64::NAN))
    };
    let (rss_slope, rss0) = fit(|s| s.rss_kib);
    let (idle_slope, idle0) = fit(|s| s.idle);
    let (change_slope, change0) = fit(|s| s.per_change_ms);
    let at_5000 = change0 + change_slope * 5_000.0;
    println!(
        "    slope (least squares through the {} steps) → 5 000 nodes: memory {:+.1} KiB per agent → {:.0} MiB at 5 000 ({:+.0} MiB); idle CPU {:+.5} cores per agent → {:.2} cores at 5 000; per change {:+.5} CPU ms per agent ({:.2} ms without agents) → {:.2} ms at 5 000, {:.2} cores at {} changes/s",
        steps.len(),
        rss_slope,
        (rss0 + rss_slope * 5_000.0) / 1024.0,
        rss_slope * 5_000.0 / 1024.0,
        idle_slope,
        idle0 + idle_slope * 5_000.0,
        change_slope,
        change0,
        at_5000,
        at_5000 * args.rate as f64 / 1000.0,
        args.rate
    );
    println!(
        "    one agent's change → file under {} other agents' watches: p50 {}, p99 {}; alone p50 {}, p99 {} → {:.2}x at p50, {:.2}x at p99",
        args.fan_out,
        ms(under.p50),
        ms(under.p99),
        ms(alone.p50),
        ms(alone.p99),
        under.p50 / alone.p50,
        under.p99 / alone.p99
    );
}
