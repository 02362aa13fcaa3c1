//! The torture run (`ipkeep-e2e torture`, `make torture`): random faults and churn on real nodes,
//! from a seed, while an oracle checks every promise of ipkeep every second and at the end.
//!
//! Three real nodes — the first CRI-O (on the bridge conflist; containerd on flannel), the last
//! a tiny one — with the bridge conflist or real flannel, the chart installed the README's way. Every in-cluster client (ipkeep's controller
//! and agents) reaches the API server through the fault proxy: the API server keeps no
//! `kubernetes` endpoints of its own (`--endpoint-reconciler-type=none`) and the run points them
//! at the proxy. The kubelets, the control plane and the oracle talk to it directly.
//!
//! [`schedule`] draws what happens when, [`workload`] and [`nemesis`] make it happen, [`observe`]
//! reads the cluster and the nodes, [`oracle`] judges, [`report`] says it.

pub mod nemesis;
pub mod observe;
pub mod oracle;
pub mod report;
pub mod schedule;
pub mod workload;

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use jiff::{SignedDuration, Timestamp};

use crate::{
    cluster::realnode::{Cluster, ClusterOptions, NodeCni, PodNetwork, RealNodeError},
    proxy::{FaultProxy, ProxyError, ProxyOptions},
    testkit::{
        commands::kubectl,
        operator_binary,
        realnode::{
            PLAIN, RELEASE, RELEASE_NS, REPLACE_HOST_LOCAL, TINY_ADDRESSES, image_archive,
            image_values, install, set_node_budget,
        },
    },
};

use oracle::{FaultWindow, Oracle, Promise, Violation};
use report::Report;
use schedule::{FaultKind, Schedule, Step};

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The seed of the schedule.
    pub seed: u64,
    /// How long faults and churn go on (the quiet end comes after).
    pub duration: Duration,
    /// The nodes' CNI network.
    pub cni: NodeCni,
    /// The fault kinds the nemesis draws from ([`schedule::FaultKind::ALL`] but those left out).
    pub faults: Vec<schedule::FaultKind>,
}

/// Why the run could not be made (what it found is in the [`Report`], not here).
#[derive(Debug, thiserror::Error)]
pub enum TortureError {
    /// The cluster did not start.
    #[error("the real nodes did not start")]
    Cluster(#[from] RealNodeError),
    /// The fault proxy did not start.
    #[error("the fault proxy did not start")]
    Proxy(#[from] ProxyError),
    /// Pointing the `kubernetes` Service at the proxy failed.
    #[error("pointing the kubernetes Service at the fault proxy failed: {0}")]
    Endpoints(String),
    /// The API server's address is not `https://ADDRESS:PORT`.
    #[error("the API server's URL {0} names no address")]
    Server(String),

    /// The API server could not be reached.
    #[error("the API server could not be reached")]
    Kube(#[from] kube::Error),
}

/// How many nodes the run has: node-0 runs CRI-O on the bridge network ([`crio_nodes`]), the last
/// is the tiny one.
pub const NODES: usize = 3;

/// The seed and every step of `schedule`, one line each, as a run prints them before it starts.
pub fn schedule_text(schedule: &Schedule) -> String {
    use std::fmt::Write as _;
    let mut text = format!(
        "torture: seed {} for {:?}: {} steps\n",
        schedule.seed,
        schedule.duration,
        schedule.steps.len()
    );
    for (at, step) in &schedule.steps {
        let _ = writeln!(text, "  {:>8.1}s {step}", at.as_secs_f64());
    }
    text
}

/// How many nodes run CRI-O: one on the bridge network; none on flannel, whose CNI plugin the
/// harness's CRI-O nodes cannot run (it stops at cniVersion 1.0.0, and CRI-O sends GC only to
/// 1.1.0), so a flannel run's nodes all run containerd.
pub fn crio_nodes(cni: NodeCni) -> u8 {
    match cni {
        NodeCni::Bridge => 1,
        NodeCni::Flannel => 0,
    }
}

/// Whether the nodes' network sends their pods' traffic out of the pod network from the node's
/// own address: flannel does (`--ip-masq`, as kube-flannel runs it), the bridge conflist does not
/// (`"ipMasq": false`). A partition of a node's agent, which matches that address, then cuts the
/// node's pods off too.
fn masquerades(cni: NodeCni) -> bool {
    cni == NodeCni::Flannel
}

/// The tiny node's budget of Released reservations during the run: one of its five addresses,
/// so `keep-tiny` (three pods) scaled to 0 puts it over and the controller must yield.
pub const TINY_BUDGET: u32 = 1;

/// How long an instant fault (a kill, a restart, a reboot) counts as in force after it was
/// made: what it broke takes a while to come back (a new leader after its Lease expires, a
/// rebooted node's pods).
const AFTERMATH: SignedDuration = SignedDuration::from_secs(30);

/// The audit policy of the run: reservation deletions only, so an hour's log stays small.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n  verbs: [delete, deletecollection]\n  resources:\n  - group: ipkeep.dev\n    resources: [ipreservations]\n- level: None\n";

/// What the run's tasks share.
struct Shared {
    oracle: Oracle,
    report: Report,
    windows: Vec<FaultWindow>,
    skipped: usize,
}

fn lock(s: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs the torture: prints the seed and the schedule first, starts the cluster, runs, stops
/// the cluster (also when the run fails), and returns what it found.
pub async fn run(options: Options) -> Result<Report, TortureError> {
    let nodes = NODES;
    let schedule = Schedule::draw(options.seed, options.duration, nodes, &options.faults);
    // print!, so a test's harness keeps the schedule with the test's output, shown on failure.
    print!(
        "torture: on {nodes} nodes ({:?}, {} of them CRI-O)\n{}",
        options.cni,
        crio_nodes(options.cni),
        schedule_text(&schedule)
    );
    let mut plane = crate::cluster::ControlPlaneOptions {
        audit_log: true,
        audit_policy: Some(AUDIT_POLICY.to_owned()),
        ..Default::default()
    };
    plane.extra_args.insert(
        "kube-apiserver".into(),
        vec!["--endpoint-reconciler-type=none".into()],
    );
    let c = Arc::new(
        Cluster::start(ClusterOptions {
            nodes: nodes as u8,
            network: PodNetwork {
                cni: options.cni,
                tiny_nodes: 1,
                crio_nodes: crio_nodes(options.cni),
                ..PLAIN
            },
            plane,
            ..ClusterOptions::default()
        })
        .await?,
    );
    // Ctrl-C or SIGTERM is heard by a task of its own: the run blocks the thread it runs on
    // (kubectl, helm), and it runs on the caller's, not on a worker, so that what it spawns (the
    // fault proxy's connections above all) is never stuck behind a blocked worker. On a signal
    // the cluster is stopped and the process ends.
    let watcher = tokio::spawn({
        let c = Arc::clone(&c);
        async move {
            crate::demo::interrupted().await;
            eprintln!("torture: interrupted; stopping the cluster");
            if let Err(e) = c.stop() {
                eprintln!("torture: cleanup incomplete: {}", crate::error_chain(&e));
            }
            std::process::exit(130);
        }
    });
    let result = drive(Arc::clone(&c), schedule).await;
    watcher.abort();
    match c.stop() {
        Ok(done) => eprintln!("torture: cluster stopped: {}", done.join(", ")),
        Err(e) => eprintln!("torture: cleanup incomplete: {}", crate::error_chain(&e)),
    }
    result
}

/// The API server's address and port.
fn server_addr(c: &Cluster) -> Result<SocketAddr, TortureError> {
    let server = c.plane().server();
    server
        .strip_prefix("https://")
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| TortureError::Server(server.to_owned()))
}

/// Starts the fault proxy beside the API server and points the `kubernetes` Service at it.
async fn proxy_for_pods(c: &Cluster) -> Result<FaultProxy, TortureError> {
    let server = server_addr(c)?;
    let pki = c.plane().pki();
    let proxy = FaultProxy::start(ProxyOptions {
        listen: SocketAddr::new(server.ip(), 0),
        upstream: c.plane().server().to_owned(),
        upstream_ca: pki.ca_cert.clone(),
        cert: pki.serving.cert.clone(),
        key: pki.serving.key.clone(),
    })
    .await?;
    let (ip, port) = (proxy.addr().ip(), proxy.addr().port());
    let family = if ip.is_ipv4() { "IPv4" } else { "IPv6" };
    let manifest = format!(
        r#"apiVersion: v1
kind: Endpoints
metadata:
  name: kubernetes
  namespace: default
  labels: {{endpointslice.kubernetes.io/skip-mirror: "true"}}
subsets:
- addresses: [{{ip: "{ip}"}}]
  ports: [{{name: https, port: {port}, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kubernetes
  namespace: default
  labels: {{kubernetes.io/service-name: kubernetes}}
addressType: {family}
endpoints:
- addresses: ["{ip}"]
  conditions: {{ready: true}}
ports:
- {{name: https, port: {port}, protocol: TCP}}
"#
    );
    let out = kubectl(c.plane(), &["apply", "-f", "-"], Some(&manifest));
    if !out.status.success() {
        return Err(TortureError::Endpoints(
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    eprintln!(
        "torture: in-cluster clients reach the API server through the fault proxy at {ip}:{port}"
    );
    Ok(proxy)
}

/// Installs, runs the schedule with the oracle watching, quiets the cluster and judges.
async fn drive(c: Arc<Cluster>, schedule: Schedule) -> Result<Report, TortureError> {
    let proxy = Arc::new(proxy_for_pods(&c).await?);
    let names = c.load_image(&image_archive())?;
    let selector = format!("controller.namespaceSelector={}", workload::SELECTOR);
    let mut extra: Vec<&str> = REPLACE_HOST_LOCAL.to_vec();
    extra.extend(["--set", selector.as_str()]);
    install(&c, &image_values(&names[0]), &extra).await;
    let nodes = workload_nodes(&c);
    set_node_budget(&c, &nodes.tiny, TINY_BUDGET);
    for (ns, yaml) in workload::manifests(&nodes) {
        let mut args = vec!["apply", "-f", "-"];
        if !ns.is_empty() {
            args.extend(["-n", ns.as_str()]);
        }
        let out = kubectl(c.plane(), &args, Some(&yaml));
        if !out.status.success() {
            return Err(TortureError::Endpoints(format!(
                "the workload: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
    }
    let client = c
        .plane()
        .client()
        .map_err(|e| TortureError::Endpoints(crate::error_chain(&e)))?;
    let shared = Arc::new(Mutex::new(Shared {
        oracle: Oracle::default(),
        report: Report {
            seed: schedule.seed,
            seconds: schedule.duration.as_secs(),
            ..Report::default()
        },
        windows: Vec::new(),
        skipped: 0,
    }));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = tokio::spawn(sample_every_second(
        client.clone(),
        Arc::clone(&c),
        Arc::clone(&shared),
        Arc::clone(&done),
    ));
    let start = Instant::now();
    let ops = tokio::spawn(run_ops(
        Arc::clone(&c),
        nodes.clone(),
        schedule.steps.clone(),
        Arc::clone(&shared),
        start,
    ));
    let faults = run_faults(
        Arc::clone(&c),
        Arc::clone(&proxy),
        schedule.steps.clone(),
        Arc::clone(&shared),
        start,
    )
    .await;
    let _ = ops.await;
    for heal in faults {
        let _ = heal.await;
    }
    proxy.clear();
    for n in c.nodes() {
        let _ = kubectl(c.plane(), &["uncordon", &n.name()], None);
    }
    eprintln!(
        "torture: faults and churn over after {:.0}s; quieting",
        start.elapsed().as_secs_f64()
    );
    quiet_end(&c, &client, &shared).await;
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = sampler.await;
    let mut s = lock(&shared);
    let samples = (s.oracle.samples, s.skipped);
    let recreations = s.oracle.recreations;
    let limitations = std::mem::take(&mut s.oracle.limitations);
    let latencies = std::mem::take(&mut s.oracle.latencies);
    let mut report = std::mem::take(&mut s.report);
    report.samples = samples;
    report.recreations = recreations;
    report.latencies = latencies;
    report.limitations = limitations;
    Ok(report)
}

/// The node names the workload places pods by.
fn workload_nodes(c: &Cluster) -> workload::Nodes {
    let names: Vec<String> = c.nodes().iter().map(|n| n.name()).collect();
    let first = c.nodes()[0].pod_cidr();
    let (base, prefix) = first.split_once('/').unwrap_or((first.as_str(), "24"));
    workload::Nodes {
        tiny: names.last().cloned().unwrap_or_default(),
        first_cidr: (
            base.parse().unwrap_or(std::net::Ipv4Addr::UNSPECIFIED),
            prefix.parse().unwrap_or(24),
        ),
        names,
    }
}

/// Feeds the oracle a sample every second (and the Events every fifteen), printing each
/// violation as it is found.
async fn sample_every_second(
    client: kube::Client,
    c: Arc<Cluster>,
    shared: Arc<Mutex<Shared>>,
    done: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut n = 0u64;
    while !done.load(std::sync::atomic::Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        n += 1;
        if n.is_multiple_of(15)
            && let Ok(events) = observe::events(&client).await
        {
            lock(&shared).oracle.events(events);
        }
        match observe::sample(&client, &c).await {
            Ok(sample) => {
                let mut s = lock(&shared);
                let windows = s.windows.clone();
                let found = s.oracle.observe(&sample, &windows);
                record(&mut s, found);
            }
            Err(_) => lock(&shared).skipped += 1,
        }
    }
}

fn record(s: &mut Shared, found: Vec<Violation>) {
    for v in found {
        eprintln!(
            "torture: VIOLATION [{}] {} {}",
            v.promise.number(),
            v.at,
            v.what
        );
        s.report.violations.push(v);
    }
}

/// Sleeps until `offset` after `start`.
async fn until(start: Instant, offset: Duration) {
    let now = start.elapsed();
    if offset > now {
        tokio::time::sleep(offset - now).await;
    }
}

/// The workload's steps, each at its moment (an operation runs on a blocking thread: kubectl).
async fn run_ops(
    c: Arc<Cluster>,
    nodes: workload::Nodes,
    steps: Vec<(Duration, Step)>,
    shared: Arc<Mutex<Shared>>,
    start: Instant,
) {
    for (at, step) in steps {
        let Step::Op(op) = step else { continue };
        until(start, at).await;
        let kind = workload::kind(&op);
        let c = Arc::clone(&c);
        let nodes = nodes.clone();
        let result =
            tokio::task::spawn_blocking(move || workload::apply(c.plane(), &nodes, &op)).await;
        let mut s = lock(&shared);
        match result {
            Ok(Ok(())) => s.report.op(kind, true),
            Ok(Err(why)) => {
                s.report.op(kind, false);
                eprintln!("torture: {kind} failed: {why}");
            }
            Err(e) => {
                s.report.op(kind, false);
                eprintln!("torture: {kind} failed: {e}");
            }
        }
    }
}

/// The nemesis's steps, each at its moment; returns the tasks that heal the held ones.
async fn run_faults(
    c: Arc<Cluster>,
    proxy: Arc<FaultProxy>,
    steps: Vec<(Duration, Step)>,
    shared: Arc<Mutex<Shared>>,
    start: Instant,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut heals = Vec::new();
    let mut debug = false;
    let masquerading = c.nodes().first().is_some_and(|n| masquerades(n.cni()));
    for (at, step) in steps {
        let Step::Fault(fault) = step else { continue };
        until(start, at).await;
        let node = nemesis::target(&c, &fault);
        let from = Timestamp::now();
        let index = {
            let mut s = lock(&shared);
            s.windows.push(FaultWindow {
                kind: fault.kind,
                node: node.clone(),
                from,
                until: None,
                whole_node: fault.kind == FaultKind::AgentPartition && masquerading,
            });
            s.windows.len() - 1
        };
        eprintln!(
            "torture: {:.1}s fault {}{}",
            start.elapsed().as_secs_f64(),
            fault.kind,
            node.as_deref()
                .map(|n| format!(" on {n}"))
                .unwrap_or_default()
        );
        let struck = nemesis::strike(&c, &proxy, &mut debug, &fault).await;
        let mut s = lock(&shared);
        s.report.fault(fault.kind, struck.is_ok());
        match struck {
            Ok(Some(heal)) => {
                drop(s);
                let (c, proxy, shared) = (Arc::clone(&c), Arc::clone(&proxy), Arc::clone(&shared));
                let hold = fault.hold.unwrap_or_default();
                heals.push(tokio::spawn(async move {
                    tokio::time::sleep(hold).await;
                    let healed =
                        tokio::task::spawn_blocking(move || nemesis::heal(&c, &proxy, heal)).await;
                    if let Ok(Err(why)) = healed {
                        eprintln!("torture: heal failed: {why}");
                    }
                    lock(&shared).windows[index].until = Some(Timestamp::now() + AFTERMATH);
                }));
            }
            Ok(None) => s.windows[index].until = Some(Timestamp::now() + AFTERMATH),
            Err(why) => {
                s.windows[index].until = Some(Timestamp::now());
                eprintln!("torture: fault {} failed: {why}", fault.kind);
            }
        }
    }
    heals
}

/// How long the quiet end waits for the cluster to settle before it judges what is left.
const SETTLE: Duration = Duration::from_secs(300);

/// The quiet end: every pod of the workload running, then promises 2, 3 and 4 judged on what
/// is left, `ipkeep-operator check --ipam` included.
async fn quiet_end(c: &Cluster, client: &kube::Client, shared: &Mutex<Shared>) {
    let deadline = Instant::now() + SETTLE;
    let capacity = BTreeMap::from([(workload_nodes(c).tiny, TINY_ADDRESSES as usize)]);
    let mut last = Vec::new();
    let mut sample = None;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let Ok(s) = observe::sample(client, c).await else {
            continue;
        };
        let unsettled = oracle::unsettled(&s, workload::NS, &capacity);
        let deletions = c
            .plane()
            .audit_log_path()
            .map(observe::deletions)
            .unwrap_or_default();
        last = oracle::settled(&s, &deletions);
        let quiet = unsettled.is_empty() && last.is_empty();
        if !unsettled.is_empty() {
            last.push(Violation {
                promise: Promise::Settled,
                at: s.at,
                what: format!("not settled after {SETTLE:?}: {}", unsettled.join(", ")),
                faults: Vec::new(),
            });
        }
        sample = Some(s);
        if quiet {
            break;
        }
    }
    let mut found = last;
    let windows = lock(shared).windows.clone();
    if let Some(s) = &sample {
        found.extend(lock(shared).oracle.overdue(s, &windows));
    }
    if let Some(log) = c.plane().audit_log_path() {
        let deletions = observe::deletions(log);
        eprintln!(
            "torture: {} reservation deletions in the audit log",
            deletions.len()
        );
        found.extend(lock(shared).oracle.deletions(&deletions, &[], &windows));
    }
    if let Ok(events) = observe::events(client).await {
        lock(shared).oracle.events(events);
    }
    let now = Timestamp::now();
    found.extend(lock(shared).oracle.unexplained_at_end(now, &windows));
    let (passed, said) = operator_check(c);
    eprintln!("torture: ipkeep-operator check:\n{said}");
    if !passed {
        found.push(Violation {
            promise: Promise::Settled,
            at: now,
            what: format!("ipkeep-operator check failed:\n{said}"),
            faults: Vec::new(),
        });
    }
    record(&mut lock(shared), found);
}

/// `ipkeep-operator check --ipam` of the release (its own cross-check of the nodes' files beside
/// the oracle's), waiting up to 3 minutes for it to pass (a `helm upgrade` at the end of the run
/// may still be rolling): passed, and what it said.
fn operator_check(c: &Cluster) -> (bool, String) {
    let out = std::process::Command::new(operator_binary())
        .args([
            "check",
            "--ipam",
            "--wait",
            "--timeout",
            "3m",
            "--namespace",
            RELEASE_NS,
            "--release",
            RELEASE,
        ])
        .env("KUBECONFIG", c.plane().kubeconfig_path())
        .output();
    match out {
        Ok(o) => (
            o.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
        ),
        Err(e) => (false, format!("could not run ipkeep-operator: {e}")),
    }
}

/// The violations of a report, by promise, for a summary line.
pub fn by_promise(report: &Report) -> BTreeMap<u8, usize> {
    let mut m = BTreeMap::new();
    for v in &report.violations {
        *m.entry(v.promise.number()).or_default() += 1;
    }
    m
}
