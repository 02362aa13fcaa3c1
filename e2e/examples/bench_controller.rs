//! `make bench-controller`: the controller binary, run as the chart's controller ServiceAccount,
//! against the real kube-apiserver.
//!
//! For each size (`--sizes`, default 1000,10000): that many annotated running pods on a handful
//! of Node objects (no kubelet: the bench writes the pods' status and deletes them with grace
//! period 0) → time from the controller's start until every reservation is Bound; the controller
//! stopped, every pod deleted, a new controller started → time from its start until every
//! reservation is Released; the controller's peak RSS. Then
//! `--expiries` reservations due in the same second → how late each expiry fires (p50/p99/max).
//!
//! `--failover`: at the largest size, once every reservation is Bound by a leader (two
//! controllers with leader election on, one Lease), the leader is SIGKILLed and, at that instant,
//! `--failover-pods` pods deleted: SIGKILL → the standby's first write (the first Released, seen
//! through a watch) and → all of them Released, beside the goal: the Lease duration + the time to
//! LIST the pods as the controller. Every write the API server made to the reservations from just
//! before the SIGKILL until the standby has reconciled every key is recorded by a watch: each
//! deleted pod's reservation must be written exactly once, every other not at all (the bench
//! exits non-zero otherwise). The standby's start-up (process start → /readyz) is printed too.
//! `--plot PNG` draws the CSV it wrote with `scripts/plot_controller.py`.
//!
//! Beside each figure, its ceiling, measured in the same run: the same writes of the same
//! objects made by a plain client of the controller's identity with as many in flight as the
//! controller has workers (server-side apply of spec and status; delete), so each figure also
//! reads "the controller is at N % of what this API server allows". kube-apiserver's CPU is
//! sampled once a second through both `Bound` steps and printed per write for each tenth of the
//! step's writes, the controller's beside the ceiling's: where in the step kube-apiserver works
//! harder for the controller (its start-up falls in the first tenth). `--ceiling-watches N` holds
//! N cluster-wide IPReservation watches open beside the ceiling's writes, as the controller holds
//! one on its own. Not a test: it prints figures.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::testkit::plane::CONTROLLER_ACCOUNT;

use ipkeep_e2e::testkit::bench;

use std::time::{Duration, Instant};

use bench::{
    Ceiling, Operator, PhaseWatch, Plane, WriteAudit, Writes, percent, percentile, test_ip,
};
use clap::Parser;
use futures::TryStreamExt;
use ipkeep_operator::api::IPReservation;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;

/// How many pod writes the bench makes at once while setting a size up (admin, exempt from APF).
const SETUP_IN_FLIGHT: usize = 32;

/// The longest any single wait may take before the bench gives up.
const PATIENCE: Duration = Duration::from_secs(1_800);

#[derive(Debug, Parser)]
#[command(about = "ipkeep's controller measured against a Kubernetes API server")]
struct Args {
    /// Numbers of annotated running pods, one run each (e.g. 1000,10000,30000).
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    sizes: Vec<usize>,
    /// Reservations due in the same second, for the expiry lateness.
    #[arg(long, default_value_t = 1_000)]
    expiries: usize,
    /// Node objects the pods are spread over.
    #[arg(long, default_value_t = 5)]
    nodes: usize,
    /// Run the controller with `--normal-events=true` (one more Event write per transition).
    #[arg(long)]
    normal_events: bool,
    /// Also write each size's figures as CSV to this file (what `scripts/plot_controller.py` draws).
    #[arg(long)]
    csv: Option<std::path::PathBuf>,
    /// Then draw that CSV into this PNG (`/usr/bin/python3 scripts/plot_controller.py`; needs
    /// Debian's python3-matplotlib: `make deps`).
    #[arg(long, requires = "csv")]
    plot: Option<std::path::PathBuf>,
    /// kube-apiserver's CPU profile over seconds 3–18 of each size's ceiling Bound step and of
    /// its controller's, into this directory (`ceiling-N.pprof`, `controller-N.pprof`; read them
    /// with `go tool pprof -top FILE`), at sizes of 10 000 pods or more.
    #[arg(long)]
    profile: Option<std::path::PathBuf>,
    /// At the largest size: a standby, the leader SIGKILLed, the standby's takeover measured and
    /// its writes audited (see the module docs).
    #[arg(long)]
    failover: bool,
    /// Pods deleted at the SIGKILL: the standby's work.
    #[arg(long, default_value_t = 100)]
    failover_pods: usize,
    /// The Lease duration of the two controllers of `--failover`, in seconds (the controller's
    /// default).
    #[arg(long, default_value_t = 15)]
    lease_duration: u64,
    /// Cluster-wide IPReservation watches held open, as the controller's identity, beside each
    /// size's ceiling: 1 gives the ceiling's writes the watch the controller holds on its own
    /// writes (what that watch costs kube-apiserver, measured).
    #[arg(long, default_value_t = 0)]
    ceiling_watches: usize,
}

/// The leader election of `--failover`.
struct Election {
    lease_namespace: String,
    lease_secs: u64,
    victims: usize,
}

/// The figures of one size.
struct Row {
    pods: usize,
    /// From the controller's start to the first reservation Bound (its LISTs, filling its
    /// caches, its first writes).
    first_bound: Duration,
    bind: Duration,
    /// From a second controller's start, with every pod deleted while none ran, to every
    /// reservation Released.
    release: Duration,
    /// The bench's own pod deletes before that start (admin, 32 in flight).
    deletes: Duration,
    /// The largest peak RSS of the size's controllers (the one to Bound, a failover's leader, the
    /// one to Released).
    peak_rss_kib: u64,
    /// The controller's CPU seconds from its start until every reservation was Bound.
    bind_cpu: f64,
    /// kube-apiserver's CPU seconds over the same interval.
    bind_apiserver_cpu: f64,
    /// kube-apiserver's CPU per write in each tenth of the same interval's writes.
    bind_cpu_by_tenth: Vec<Option<f64>>,
    ceiling: Ceiling,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    let started = Instant::now();
    let plane = Plane::start().await;
    let nodes: Vec<String> = (0..args.nodes.max(1))
        .map(|i| format!("node-{i}"))
        .collect();
    plane.add_nodes(&nodes).await;
    let admin = plane.admin();
    let as_controller = plane.account_client(CONTROLLER_ACCOUNT).await;
    eprintln!("bench: measuring {}", plane.describe());

    let largest = args.sizes.iter().copied().max().unwrap_or(0);
    let election = Election {
        lease_namespace: plane.release_namespace().await.to_owned(),
        lease_secs: args.lease_duration,
        victims: args.failover_pods.min(largest),
    };
    // Each size's figures are printed as soon as they are measured: a run of hours that fails
    // late keeps what it measured.
    println!("controller bench on {}", plane.describe());
    println!(
        "  pods on {} nodes (Node objects, Ready, no kubelet), controller with its default {} workers, {}, Normal Events {}; load average at the start {}",
        nodes.len(),
        bench::CONTROLLER_WORKERS,
        if args.failover {
            "no leader election (two controllers with it at the failover's size)"
        } else {
            "no leader election"
        },
        if args.normal_events {
            "on"
        } else {
            "off (the default)"
        },
        bench::load_average()
    );
    let mut rows = Vec::new();
    let mut failover = None;
    for &pods in &args.sizes {
        let elect = (args.failover && pods == largest && failover.is_none()).then_some(&election);
        let (row, report) = one_size(
            &plane,
            &admin,
            &as_controller,
            &nodes,
            pods,
            &Knobs {
                normal_events: args.normal_events,
                ceiling_watches: args.ceiling_watches,
                profile: args.profile.as_deref(),
            },
            elect,
        )
        .await;
        print_row(&row);
        rows.push(row);
        failover = failover.or(report);
    }
    let expiry = expiries(
        &plane,
        &admin,
        &as_controller,
        args.expiries,
        args.normal_events,
    )
    .await;

    println!("  load average now {}", bench::load_average());
    print_slopes(&rows);
    if let Some(f) = &failover {
        f.print();
    }
    expiry.print();
    if let Some(path) = &args.csv {
        write_csv(path, &rows);
        if let Some(png) = &args.plot {
            plot(png, path);
        }
    }
    println!("  whole run: {:.0} s", started.elapsed().as_secs_f64());
    plane.finish();
    if failover.is_some_and(|f| !f.audit.wrong.is_empty()) {
        eprintln!(
            "bench: the failover wrote a reservation twice, or one it had no reason to (above)"
        );
        std::process::exit(1);
    }
}

/// Draws the CSV into `png` ([`bench::plot_controller`]); exits the bench if it fails.
fn plot(png: &std::path::Path, csv: &std::path::Path) {
    match bench::plot_controller(png, csv) {
        Ok(()) => println!("  plot: {}", png.display()),
        Err(e) => {
            eprintln!("bench: {e}: it needs {}", bench::PLOT_NEEDS);
            std::process::exit(1);
        }
    }
}

/// How each size is run, besides its size.
struct Knobs<'a> {
    normal_events: bool,
    /// `--ceiling-watches`.
    ceiling_watches: usize,
    /// Where kube-apiserver's CPU profiles go, if taken.
    profile: Option<&'a std::path::Path>,
}

/// Profiles are taken from this long after a step's first write...
const PROFILE_FROM: Duration = Duration::from_secs(3);
/// ...for this many seconds, at sizes whose steps last longer.
const PROFILE_SECONDS: u64 = 15;
const PROFILE_FROM_PODS: usize = 10_000;

impl Knobs<'_> {
    /// kube-apiserver's CPU profile of `step` at `pods`, when asked for and the size is large
    /// enough for the step to outlast it.
    async fn profile(&self, plane: &Plane, pods: usize, step: &str) {
        let Some(dir) = self.profile.filter(|_| pods >= PROFILE_FROM_PODS) else {
            return;
        };
        std::fs::create_dir_all(dir)
            .unwrap_or_else(|e| panic!("failed to create {}: {e}", dir.display()));
        tokio::time::sleep(PROFILE_FROM).await;
        let path = dir.join(format!("{step}-{pods}.pprof"));
        plane.apiserver_cpu_profile(PROFILE_SECONDS, &path).await;
        eprintln!(
            "bench: kube-apiserver's profile of the {step} at {pods}: {}",
            path.display()
        );
    }
}

async fn one_size(
    plane: &Plane,
    admin: &Client,
    as_controller: &Client,
    nodes: &[String],
    pods: usize,
    knobs: &Knobs<'_>,
    election: Option<&Election>,
) -> (Row, Option<Failover>) {
    let normal_events = knobs.normal_events;
    let ceiling_ns = plane.namespace("ceiling").await;
    let (ceiling, ()) = tokio::join!(
        Ceiling::measure(
            as_controller,
            &ceiling_ns,
            pods,
            plane.apiserver_pid(),
            knobs.ceiling_watches
        ),
        knobs.profile(plane, pods, "ceiling"),
    );
    eprintln!(
        "bench: ceiling for {pods}: bind {:.1} s, release {:.1} s, delete {:.1} s",
        ceiling.bind.as_secs_f64(),
        ceiling.release.as_secs_f64(),
        ceiling.delete.as_secs_f64()
    );

    let ns = plane.namespace("bench-pods").await;
    let made = bench::run_all(0..pods, SETUP_IN_FLIGHT, |i| {
        create_running_pod(admin.clone(), ns.clone(), i, nodes[i % nodes.len()].clone())
    })
    .await;
    eprintln!(
        "bench: {pods} annotated running pods created in {:.1} s",
        made.as_secs_f64()
    );
    let mut phases = PhaseWatch::start(admin.clone(), &ns, None);
    let trace = phases.trace_cpu(plane.apiserver_pid());
    let (controller, probe) = start_controller(
        plane,
        &ns,
        &format!("controller-{pods}"),
        normal_events,
        election.map(|e| (e, "leader")),
    )
    .await;
    let first_bound = phases
        .until("the first reservation Bound", PATIENCE, |c| c.bound >= 1)
        .await;
    // Profiled from its first write, as the ceiling is: past the start-up's LISTs (about
    // 30 s at 100 000 pods), which would otherwise fill the profile.
    let (all, ()) = tokio::join!(
        phases.until("every reservation Bound", PATIENCE, |c| c.bound >= pods),
        knobs.profile(plane, pods, "controller"),
    );
    let bind = first_bound + all;
    let bind_cpu = bench::cpu_seconds(controller.pid());
    let (bind_apiserver_cpu, bind_cpu_by_tenth) = trace.finish(2 * pods);
    controller.check();
    eprintln!(
        "bench: all {pods} Bound {:.1} s after the controller started",
        bind.as_secs_f64()
    );

    // With --failover, the standby takes over here and releases the rest.
    let (controller, failover, released_already) = match election {
        Some(e) => {
            let (standby, report) = failover(
                plane,
                admin,
                as_controller,
                &ns,
                pods,
                e,
                normal_events,
                &mut phases,
                (controller, probe),
            )
            .await;
            (standby, Some(report), e.victims)
        }
        None => (controller, None, 0),
    };

    // Released is measured like Bound, from a controller's start: the pods are deleted while no
    // controller runs (as across an upgrade), so the bench's own deletes, made as admin, are not
    // in the time: it is the controller's release rate against the ceiling's status applies.
    controller.check();
    let peak_rss_kib = controller
        .peak_rss_kib()
        .max(failover.as_ref().map_or(0, |f| f.leader_peak_rss_kib));
    controller.stop();
    let pod_api: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    let deletes = delete_pods(&pod_api, released_already..pods).await;
    let (controller, _) = start_controller(
        plane,
        &ns,
        &format!("controller-{pods}-release"),
        normal_events,
        None,
    )
    .await;
    let release = phases
        .until("every reservation Released", PATIENCE, |c| {
            c.released >= pods
        })
        .await;
    controller.check();
    // The larger of the two: the second holds every reservation and queues each for its expiry.
    let peak_rss_kib = peak_rss_kib.max(controller.peak_rss_kib());
    controller.stop();
    let row = Row {
        pods,
        first_bound,
        bind,
        release,
        deletes,
        peak_rss_kib,
        bind_cpu,
        bind_apiserver_cpu,
        bind_cpu_by_tenth,
        ceiling,
    };
    (row, failover)
}

/// Deletes pods `pod-<i>` for `i` in `range` (grace period 0, as a kubelet would once they stop).
async fn delete_pods(pod_api: &Api<Pod>, range: std::ops::Range<usize>) -> Duration {
    bench::run_all(range, SETUP_IN_FLIGHT, |i| {
        let pod_api = pod_api.clone();
        async move {
            pod_api
                .delete(
                    &format!("pod-{i}"),
                    &DeleteParams::default().grace_period(0),
                )
                .await
                .expect("pod delete");
        }
    })
    .await
}

/// The figures of `--failover`.
struct Failover {
    pods: usize,
    victims: usize,
    lease_secs: u64,
    /// A LIST of all the pods by the controller's identity (pages of 500), timed just before the
    /// SIGKILL.
    list: Duration,
    /// The standby's process start → its /readyz (caches filled).
    standby_ready: Duration,
    /// SIGKILL → the first reservation Released (the standby's first write).
    first_write: Duration,
    /// SIGKILL → every deleted pod's reservation Released.
    all_released: Duration,
    /// SIGKILL → the standby's reconcile count reached the number of pods.
    reconciled: Duration,
    leader_peak_rss_kib: u64,
    audit: WriteAudit,
}

/// The name of the reservation the bench writes to mark the end of the audited writes.
const MARKER: &str = "bench-marker";

/// `--failover` once every reservation is Bound by `leader`: starts the standby, SIGKILLs the
/// leader and deletes `election.victims` pods at that instant, measures the takeover, audits
/// every write. Returns the standby (now leading) and the figures.
#[allow(clippy::too_many_arguments)]
async fn failover(
    plane: &Plane,
    admin: &Client,
    as_controller: &Client,
    ns: &str,
    pods: usize,
    election: &Election,
    normal_events: bool,
    phases: &mut PhaseWatch,
    leader: (Operator, std::net::SocketAddr),
) -> (Operator, Failover) {
    let (leader, leader_probe) = leader;
    assert_eq!(
        bench::metric(leader_probe, "ipkeep_controller_leader").await,
        Some(1.0),
        "the first controller leads"
    );
    let (standby, probe) = start_controller(
        plane,
        ns,
        &format!("standby-{pods}"),
        normal_events,
        Some((election, "standby")),
    )
    .await;
    let standby_ready = standby.ready(probe).await;
    assert_eq!(
        bench::metric(probe, "ipkeep_controller_leader").await,
        Some(0.0),
        "the second controller waits for the lease"
    );
    let (listed, list) = list_pods(as_controller, ns).await;
    assert_eq!(listed, pods, "the LIST returned every pod");
    eprintln!(
        "bench: standby ready {:.1} s after its start; LIST of {pods} pods {:.2} s; SIGKILL to the leader",
        standby_ready.as_secs_f64(),
        list.as_secs_f64()
    );

    let mut writes = Writes::start(admin.clone(), ns).await;
    let leader_peak_rss_kib = leader.peak_rss_kib();
    let killed = Instant::now();
    leader.kill();
    let pod_api: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let victims = election.victims;
    let deleting = tokio::spawn(async move { delete_pods(&pod_api, 0..victims).await });
    phases
        .until("the standby's first Released", PATIENCE, |c| {
            c.released >= 1
        })
        .await;
    let first_write = killed.elapsed();
    phases
        .until("the deleted pods' reservations Released", PATIENCE, |c| {
            c.released >= victims
        })
        .await;
    let all_released = killed.elapsed();
    deleting.await.expect("the pod deletes");
    standby_reconciled(&standby, probe, pods).await;
    let reconciled = killed.elapsed();
    leader.stop();

    // The marker: once the watch shows it, it has shown every write made before it.
    let api: Api<IPReservation> = Api::namespaced(admin.clone(), ns);
    let apply = PatchParams::apply(bench::BENCH_MANAGER).force();
    let spec = bench::reservation_spec(MARKER, &test_ip(200_000), "node-0", "24h");
    api.patch(MARKER, &apply, &Patch::Apply(&spec))
        .await
        .expect("the marker");
    writes.seen(MARKER, 1, PATIENCE).await;
    let seen = writes.stop();
    api.delete(MARKER, &DeleteParams::default())
        .await
        .expect("the marker's delete");
    let released: Vec<String> = (0..victims).map(|i| format!("pod-{i}")).collect();
    let audit = WriteAudit::of(&seen, &released, MARKER);
    let report = Failover {
        pods,
        victims,
        lease_secs: election.lease_secs,
        list,
        standby_ready,
        first_write,
        all_released,
        reconciled,
        leader_peak_rss_kib,
        audit,
    };
    (standby, report)
}

/// LISTs every pod of `ns` as the controller's reflector does (pages of 500, each dropped once
/// counted); returns how many and how long it took.
async fn list_pods(as_controller: &Client, ns: &str) -> (usize, Duration) {
    let api = Api::<Pod>::namespaced(as_controller.clone(), ns);
    let t = Instant::now();
    let (mut listed, mut next) = (0, None::<String>);
    loop {
        let mut params = kube::api::ListParams::default().limit(500);
        if let Some(token) = next.take() {
            params = params.continue_token(&token);
        }
        let page = api
            .list(&params)
            .await
            .expect("a LIST of the pods as the controller");
        listed += page.items.len();
        next = page.metadata.continue_.filter(|c| !c.is_empty());
        if next.is_none() {
            return (listed, t.elapsed());
        }
    }
}

/// Waits until the standby's reconcile count (its duration histogram's) reaches `pods`: it has
/// reconciled every key at least once since it took over.
async fn standby_reconciled(standby: &Operator, probe: std::net::SocketAddr, pods: usize) {
    let t = Instant::now();
    loop {
        let count = bench::metric(probe, "ipkeep_controller_reconcile_duration_seconds_count")
            .await
            .unwrap_or(0.0);
        if count >= pods as f64 {
            return;
        }
        standby.check();
        assert!(
            t.elapsed() < PATIENCE,
            "the standby reconciled only {count} keys of {pods}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl Failover {
    fn goal(&self) -> Duration {
        Duration::from_secs(self.lease_secs) + self.list
    }

    fn print(&self) {
        println!(
            "  failover at {} pods (two controllers, leader election on, Lease duration {} s):",
            self.pods, self.lease_secs
        );
        println!(
            "    standby ready {:.1} s after its process started (caches filled, /readyz)",
            self.standby_ready.as_secs_f64()
        );
        println!(
            "    SIGKILL → standby's first write {:>6.1} s (goal: Lease {} s + LIST of {} pods {:.2} s = {:.1} s) → {:.0} % of the goal",
            self.first_write.as_secs_f64(),
            self.lease_secs,
            self.pods,
            self.list.as_secs_f64(),
            self.goal().as_secs_f64(),
            percent(self.first_write.as_secs_f64(), self.goal().as_secs_f64())
        );
        println!(
            "    SIGKILL → all {} deleted pods' reservations Released {:.1} s; → the standby reconciled {} keys {:.1} s",
            self.victims,
            self.all_released.as_secs_f64(),
            self.pods,
            self.reconciled.as_secs_f64()
        );
        println!(
            "    writes the API server saw from before the SIGKILL until then: {} of {} Released exactly once, {} other reservations written: {}",
            self.audit.once,
            self.victims,
            self.pods - self.victims,
            if self.audit.wrong.is_empty() {
                "none (no reservation written twice)".to_owned()
            } else {
                format!("WRONG {:?}", self.audit.wrong)
            }
        );
        println!(
            "    (process start → first write at each size is the \"first Bound\" line above; this size's Released is the standby's, for the other {} pods)",
            self.pods - self.victims
        );
    }
}

async fn create_running_pod(client: Client, ns: String, i: usize, node: String) {
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    let name = format!("pod-{i}");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": {"ipkeep.dev/retain": "true"}},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "app"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("pod create");
    let ip = test_ip(i);
    let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}});
    pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("pod status");
}

/// Starts a controller of `ns`'s pods with its probes at a free port; with `election`, leader
/// election on as identity `.1`, else off.
async fn start_controller(
    plane: &Plane,
    ns: &str,
    name: &str,
    normal_events: bool,
    election: Option<(&Election, &str)>,
) -> (Operator, std::net::SocketAddr) {
    let probe = bench::free_addr();
    let mut args: Vec<String> = [
        "controller",
        "--namespace",
        ns,
        "--metrics-addr",
        &probe.to_string(),
        &format!("--normal-events={normal_events}"),
        "--log-level",
        "warn",
    ]
    .map(String::from)
    .to_vec();
    match election {
        Some((e, identity)) => args.extend([
            "--leader-elect=true".to_owned(),
            format!("--lease-namespace={}", e.lease_namespace),
            format!("--lease-duration={}", e.lease_secs),
            format!("--identity={identity}"),
        ]),
        None => args.push("--leader-elect=false".to_owned()),
    }
    (plane.operator(name, CONTROLLER_ACCOUNT, &args).await, probe)
}

fn print_row(r: &Row) {
    let c = &r.ceiling;
    println!("  {} pods:", r.pods);
    println!(
        "    all Bound       {:>7.1} s after the controller started (ceiling: 2 applies each in {:>6.1} s, {:.0} writes/s) → {:.0} %",
        r.bind.as_secs_f64(),
        c.bind.as_secs_f64(),
        c.bind_writes_per_sec(),
        percent(c.bind.as_secs_f64(), r.bind.as_secs_f64())
    );
    println!(
        "    first Bound     {:>7.1} s after the controller started (LISTs, caches filled, first writes)",
        r.first_bound.as_secs_f64()
    );
    println!(
        "    all Released    {:>7.1} s after a controller started with every pod gone (ceiling: 1 status apply each in {:.1} s) → {:.0} %; the bench's deletes before it {:.1} s",
        r.release.as_secs_f64(),
        c.release.as_secs_f64(),
        percent(c.release.as_secs_f64(), r.release.as_secs_f64()),
        r.deletes.as_secs_f64()
    );
    println!(
        "    controller peak RSS {:.1} MiB ({:.2} KiB per pod)",
        r.peak_rss_kib as f64 / 1024.0,
        r.peak_rss_kib as f64 / r.pods as f64
    );
    println!(
        "    CPU until all Bound: controller {:.1} s ({:.0} % of one core), kube-apiserver {:.1} s ({:.0} %)",
        r.bind_cpu,
        100.0 * r.bind_cpu / r.bind.as_secs_f64(),
        r.bind_apiserver_cpu,
        100.0 * r.bind_apiserver_cpu / r.bind.as_secs_f64()
    );
    // Whether kube-apiserver works harder per write for the controller than for the ceiling's
    // client, or only gets less of the machine.
    let per_write = |cpu: f64| 1_000.0 * cpu / (2 * r.pods) as f64;
    println!(
        "    kube-apiserver CPU per Bound write: {:.2} ms for the controller, {:.2} ms for the ceiling's client ({:.2}x)",
        per_write(r.bind_apiserver_cpu),
        per_write(c.bind_apiserver_cpu),
        r.bind_apiserver_cpu / c.bind_apiserver_cpu
    );
    // Where in the step the difference is: the first tenth holds the controller's start-up.
    let tenths = |t: &[Option<f64>]| {
        t.iter()
            .map(|ms| ms.map_or_else(|| "-".to_owned(), |ms| format!("{ms:.2}")))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "    kube-apiserver CPU ms per write by tenth of the step's writes: controller {}; ceiling {}",
        tenths(&r.bind_cpu_by_tenth),
        tenths(&c.bind_cpu_by_tenth)
    );
}

/// The rows as CSV, one line per size: times and their ceilings in seconds, peak RSS in MiB,
/// CPU seconds until all Bound (the controller's, kube-apiserver's, and kube-apiserver's over the
/// ceiling's Bound step), and the load average when the file was written.
fn write_csv(path: &std::path::Path, rows: &[Row]) {
    let mut text = String::from(
        "pods,first_bound_s,bound_s,bound_ceiling_s,released_s,released_ceiling_s,deletes_s,peak_rss_mib,controller_cpu_s,apiserver_cpu_s,ceiling_apiserver_cpu_s,load_average\n",
    );
    for r in rows {
        text.push_str(&format!(
            "{},{:.2},{:.2},{:.2},{:.2},{:.2},{:.2},{:.2},{:.2},{:.2},{:.2},{}\n",
            r.pods,
            r.first_bound.as_secs_f64(),
            r.bind.as_secs_f64(),
            r.ceiling.bind.as_secs_f64(),
            r.release.as_secs_f64(),
            r.ceiling.release.as_secs_f64(),
            r.deletes.as_secs_f64(),
            r.peak_rss_kib as f64 / 1024.0,
            r.bind_cpu,
            r.bind_apiserver_cpu,
            r.ceiling.bind_apiserver_cpu,
            bench::load_average().replace(' ', "/")
        ));
    }
    std::fs::write(path, text)
        .unwrap_or_else(|e| panic!("failed to write {}: {e}", path.display()));
}

/// Kubernetes' published limit, where each slope is projected to.
const KUBERNETES_PODS: f64 = 150_000.0;

/// The line through the smallest and the largest size of `value`: (per pod, at zero pods).
fn slope(rows: &[Row], value: impl Fn(&Row) -> f64) -> Option<(f64, f64)> {
    let small = rows.iter().min_by_key(|r| r.pods)?;
    let large = rows.iter().max_by_key(|r| r.pods)?;
    if large.pods == small.pods {
        return None;
    }
    let per_pod = (value(large) - value(small)) / (large.pods - small.pods) as f64;
    Some((per_pod, value(small) - per_pod * small.pods as f64))
}

/// RSS per 1 000 pods, and the time until all are Bound (the controller's and its ceiling's),
/// from the smallest and largest sizes, each projected to 150 000 pods.
fn print_slopes(rows: &[Row]) {
    let Some((per_pod, base)) = slope(rows, |r| r.peak_rss_kib as f64) else {
        println!("  slopes per 1 000 pods: need two sizes (--sizes 1000,10000)");
        return;
    };
    println!(
        "  controller RSS: {:.2} MiB per 1 000 pods above a {:.1} MiB base → {:.0} MiB projected for 150 000 pods",
        per_pod * 1_000.0 / 1024.0,
        base / 1024.0,
        (base + per_pod * KUBERNETES_PODS) / 1024.0
    );
    let projected = |value: fn(&Row) -> f64| {
        slope(rows, value).map_or(f64::NAN, |(per_pod, base)| base + per_pod * KUBERNETES_PODS)
    };
    let controller = projected(|r| r.bind.as_secs_f64());
    let ceiling = projected(|r| r.ceiling.bind.as_secs_f64());
    println!(
        "  all Bound projected for 150 000 pods: controller {controller:.0} s, ceiling {ceiling:.0} s → {:.0} %",
        percent(ceiling, controller)
    );
}

/// How late the expiries fired.
struct Expiry {
    n: usize,
    lateness: Vec<f64>,
    ceiling: Ceiling,
    slack: f64,
}

impl Expiry {
    fn print(&self) {
        let l = &self.lateness;
        println!(
            "  {} expiries due in the same second: late by p50 {:.3} s, p99 {:.3} s, max {:.3} s (ceiling: {} deletes take {:.2} s at 8 in flight) → {:.0} %",
            self.n,
            percentile(l, 50.0),
            percentile(l, 99.0),
            l.last().copied().unwrap_or(f64::NAN),
            self.ceiling.n,
            self.ceiling.delete.as_secs_f64(),
            percent(
                self.ceiling.delete.as_secs_f64(),
                l.last().copied().unwrap_or(f64::NAN)
            )
        );
        if self.slack < 2.0 {
            println!(
                "    (setting them up ended only {:.1} s before they were due: the figure includes the controller's start-up)",
                self.slack
            );
        }
    }
}

/// `n` hand-made reservations, all Released with the same release time, then a controller of
/// their own: lateness of each delete (seen through a watch) after that time.
async fn expiries(
    plane: &Plane,
    admin: &Client,
    as_controller: &Client,
    n: usize,
    normal_events: bool,
) -> Expiry {
    let ceiling_ns = plane.namespace("ceiling").await;
    let ceiling = Ceiling::measure(as_controller, &ceiling_ns, n, plane.apiserver_pid(), 0).await;
    let ns = plane.namespace("bench-expiry").await;
    // Due well after the set-up and the controller's start; released 90 s before, so whatever a
    // reconcile computes, the release time is this one second.
    let retain = SignedDuration::from_secs(90);
    let due = Timestamp::from_second(Timestamp::now().as_second() + 40).unwrap();
    let released_at = due - retain;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Timestamp>();
    let watch_api: Api<IPReservation> = Api::namespaced(admin.clone(), &ns);
    let watch = tokio::spawn(async move {
        let mut events =
            std::pin::pin!(watcher(watch_api, watcher::Config::default()).default_backoff());
        while let Ok(Some(ev)) = events.try_next().await {
            if let watcher::Event::Delete(_) = ev {
                let _ = tx.send(Timestamp::now());
            }
        }
    });
    let api: Api<IPReservation> = Api::namespaced(admin.clone(), &ns);
    let apply = PatchParams::apply(bench::BENCH_MANAGER).force();
    bench::run_all(0..n, SETUP_IN_FLIGHT, |i| {
        let (api, apply) = (api.clone(), apply.clone());
        async move {
            let name = format!("expire-{i}");
            let spec = bench::reservation_spec(&name, &test_ip(100_000 + i), "node-0", "90s");
            api.patch(&name, &apply, &Patch::Apply(&spec))
                .await
                .expect("expiring reservation");
            let status = bench::reservation_status(json!({
                "phase": "Released", "releasedAt": released_at.to_string(), "releaseTime": due.to_string(),
            }));
            api.patch_status(&name, &apply, &Patch::Apply(&status))
                .await
                .expect("expiring reservation's status");
        }
    })
    .await;
    let (controller, _) =
        start_controller(plane, &ns, "controller-expiry", normal_events, None).await;
    let slack = due.duration_since(Timestamp::now()).as_secs_f64();
    eprintln!("bench: {n} reservations due at {due} ({slack:.1} s from now)");
    let mut lateness = Vec::with_capacity(n);
    while lateness.len() < n {
        let deleted = tokio::time::timeout(PATIENCE, rx.recv())
            .await
            .expect("every expiry fires")
            .expect("the watch runs");
        lateness.push(deleted.duration_since(due).as_secs_f64());
    }
    watch.abort();
    controller.check();
    controller.stop();
    lateness.sort_by(f64::total_cmp);
    Expiry {
        n,
        lateness,
        ceiling,
        slack,
    }
}
