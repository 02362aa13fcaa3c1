//! Shared by the benches (`examples/bench_controller.rs`, `bench_agent.rs`, `bench_api_cost.rs`):
//! the real control plane they measure, the operator started as a separate
//! process under the chart's ServiceAccounts, what `/proc` says about a process, the reference
//! writes that give each figure its ceiling, a phase counter fed by a watch, and the audit log
//! read back by user and verb.
//!
//! Every process a bench starts runs in its own process group with the parent-death signal set
//! (the control plane harness's `Spawner`), so none outlives the bench, however it ends.

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::cluster::{
    ControlPlane,
    process::{Component, Spawner},
};
use futures::{StreamExt, TryStreamExt};
use ipkeep_operator::api::{IPReservation, Phase};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;

use super::plane;

/// The field manager of the reference writes (the controller's is `ipkeep-controller`).
pub const BENCH_MANAGER: &str = "ipkeep-bench";

/// The controller's default number of reconcile workers (`--workers`): the reference writes use
/// as many in flight, and, like the controller, no client-side rate limit (kube-rs has none).
pub const CONTROLLER_WORKERS: usize = 8;

/// The API server under measurement, and what the benches need from it.
pub struct Plane {
    control_plane: &'static ControlPlane,
    scratch: PathBuf,
    spawner: Spawner,
}

impl Plane {
    /// Starts (or joins) the real control plane (kube-apiserver v1.34 with etcd,
    /// controller-manager and scheduler, `make cluster-bins`), with the IPReservation CRD
    /// installed and the chart's RBAC applied.
    pub async fn start() -> Plane {
        let control_plane = plane::control_plane().await;
        plane::chart_rbac(control_plane).await;
        // Inside the state directory: the control plane's watchdog removes it however the bench
        // ends.
        let scratch = control_plane.state_dir().join("bench");
        std::fs::create_dir_all(&scratch).expect("failed to create the bench's scratch directory");
        Plane {
            control_plane,
            scratch,
            spawner: Spawner::new().expect("failed to start the spawner thread"),
        }
    }

    /// One line saying what is measured.
    pub fn describe(&self) -> String {
        format!(
            "real kube-apiserver v1.34 at {} (etcd without fsync, audit log on, APF on)",
            self.control_plane.server()
        )
    }

    /// An admin client (`system:masters`, exempt from APF).
    pub fn admin(&self) -> Client {
        self.control_plane.client().expect("an admin client")
    }

    /// A client of the chart's ServiceAccount `account`.
    pub async fn account_client(&self, account: &str) -> Client {
        let ns = plane::chart_rbac(self.control_plane).await;
        self.control_plane
            .service_account_client(ns, account)
            .await
            .unwrap_or_else(|e| panic!("failed to get a client of {account}: {e}"))
    }

    /// The audit log's name for the chart's ServiceAccount `account`.
    pub async fn account_user(&self, account: &str) -> String {
        format!(
            "system:serviceaccount:{}:{account}",
            plane::chart_rbac(self.control_plane).await
        )
    }

    /// A kubeconfig of the chart's ServiceAccount `account` (a one-day token).
    pub async fn account_kubeconfig(&self, account: &str) -> PathBuf {
        let path = self.scratch.join(format!("kubeconfig-{account}"));
        plane::account_kubeconfig(self.control_plane, account, &path).await;
        path
    }

    /// A new namespace `<prefix>-<n>`, ready for pods.
    pub async fn namespace(&self, prefix: &str) -> String {
        self.control_plane
            .fresh_namespace(prefix)
            .await
            .unwrap_or_else(|e| panic!("failed to create a namespace: {e}"))
    }

    /// Writes Node objects `names` (`ControlPlane::add_node`: Ready, untainted, no kubelet behind
    /// them), so that the scheduler would bind pods to them and the pod garbage collector does
    /// not delete the pods bound to them as orphans.
    pub async fn add_nodes(&self, names: &[String]) {
        for name in names {
            self.control_plane
                .add_node(name)
                .await
                .unwrap_or_else(|e| panic!("failed to write the Node {name}: {e}"));
        }
    }

    /// The kube-apiserver's process id.
    pub fn apiserver_pid(&self) -> u32 {
        self.control_plane
            .pids()
            .get("kube-apiserver")
            .copied()
            .expect("the control plane runs kube-apiserver")
    }

    /// A CPU profile of kube-apiserver over the next `seconds` (its `/debug/pprof/profile`, read
    /// as admin), written to `path` for `go tool pprof`.
    pub async fn apiserver_cpu_profile(&self, seconds: u64, path: &Path) {
        let request = http::Request::get(format!("/debug/pprof/profile?seconds={seconds}"))
            .body(Vec::new())
            .expect("a valid request");
        let mut body = self
            .admin()
            .request_stream(request)
            .await
            .unwrap_or_else(|e| panic!("failed to profile kube-apiserver: {e}"));
        let mut profile = Vec::new();
        futures::AsyncReadExt::read_to_end(&mut body, &mut profile)
            .await
            .unwrap_or_else(|e| panic!("failed to read kube-apiserver's profile: {e}"));
        std::fs::write(path, profile)
            .unwrap_or_else(|e| panic!("failed to write {}: {e}", path.display()));
    }

    /// The audit log.
    pub fn audit_log(&self) -> PathBuf {
        self.control_plane
            .audit_log_path()
            .expect("the shared control plane keeps an audit log")
            .to_path_buf()
    }

    /// A scratch directory `name` of this run (removed with the control plane's state, or by
    /// [`Plane::finish`]).
    pub fn scratch(&self, name: &str) -> PathBuf {
        let dir = self.scratch.join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("failed to create a scratch directory");
        dir
    }

    /// Starts `ipkeep-operator <args>` as `account` (its own process group, killed if the bench
    /// dies); its output goes to `<scratch>/<name>.log`.
    pub async fn operator(&self, name: &str, account: &str, args: &[String]) -> Operator {
        let kubeconfig = self.account_kubeconfig(account).await;
        let bin = super::operator_binary();
        let mut all = vec![format!("KUBECONFIG={}", kubeconfig.display())];
        if args.first().is_some_and(|a| a == "controller") {
            all.extend(
                super::CONTROLLER_ENV
                    .iter()
                    .map(|(k, v)| format!("{k}={v}")),
            );
        }
        all.push(bin.display().to_string());
        all.extend(args.iter().cloned());
        let log = self.scratch.join(format!("{name}.log"));
        let component = Component::start(
            &self.spawner,
            name,
            Path::new("env"),
            &all,
            &log,
            &self.scratch.join("pgids"),
        )
        .unwrap_or_else(|e| panic!("failed to start {name}: {e}"));
        Operator { component }
    }

    /// The release namespace the chart's RBAC was applied in: where the controller's Lease may live.
    pub async fn release_namespace(&self) -> &'static str {
        plane::chart_rbac(self.control_plane).await
    }

    /// Removes the scratch directory (the real control plane's state goes when the bench exits).
    pub fn finish(self) {
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

/// An `ipkeep-operator` process started by [`Plane::operator`].
pub struct Operator {
    component: Component,
}

impl Operator {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.component.pid()
    }

    /// Its peak resident memory so far.
    pub fn peak_rss_kib(&self) -> u64 {
        proc_kib(self.pid(), "VmHWM:")
    }

    /// Fails the bench with its log if it has exited.
    pub fn check(&self) {
        if let Some(status) = self.component.exit_status() {
            panic!(
                "{} exited ({status}); last lines of {}:\n{}",
                self.component.name(),
                self.component.log().display(),
                crate::cluster::process::log_tail(self.component.log(), 25)
            );
        }
    }

    /// Waits until its `/readyz` at `probe` answers 200 (caches filled, first sync done);
    /// returns how long that took.
    pub async fn ready(&self, probe: SocketAddr) -> Duration {
        let t = Instant::now();
        loop {
            if let Some(reply) = http_get(probe, "/readyz").await
                && reply.starts_with("HTTP/1.1 200")
            {
                return t.elapsed();
            }
            self.check();
            assert!(
                t.elapsed() < Duration::from_secs(600),
                "{} never became ready",
                self.component.name()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// SIGKILL to its process group now (a leader dying without releasing its lease).
    pub fn kill(&self) {
        use rustix::process::{Pid, Signal, kill_process_group};
        if let Some(pid) = i32::try_from(self.pid()).ok().and_then(Pid::from_raw) {
            kill_process_group(pid, Signal::KILL)
                .unwrap_or_else(|e| panic!("failed to SIGKILL {}: {e}", self.component.name()));
        }
    }

    /// SIGTERM, then SIGKILL after 5 s.
    pub fn stop(self) {
        self.component.stop(Duration::from_secs(5));
    }
}

/// A loopback address with a port free a moment ago (for a probe server to bind).
pub fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
}

/// The whole HTTP/1.1 reply to `GET path` (plain HTTP, the probe servers), or None.
pub async fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.ok()?;
    Some(reply)
}

/// What the controller plot needs: the system's Python with Debian's python3-matplotlib.
pub const PLOT_NEEDS: &str = "/usr/bin/python3 with Debian's python3-matplotlib (make deps, or apt-get install python3-matplotlib)";

/// Draws `csv` (what `bench_controller --csv` writes) into `png` with
/// `scripts/plot_controller.py` ([`plot`]).
pub fn plot_controller(png: &Path, csv: &Path) -> Result<(), crate::command::CommandError> {
    plot("plot_controller.py", png, csv)
}

/// Draws `csv` into `png` with `/usr/bin/python3 scripts/<script>`; [`PLOT_NEEDS`] says what it
/// runs on.
pub fn plot(script: &str, png: &Path, csv: &Path) -> Result<(), crate::command::CommandError> {
    crate::command::checked(
        std::process::Command::new("/usr/bin/python3")
            .arg(super::repo_root().join("scripts").join(script))
            .arg(png)
            .arg(csv),
        None,
    )
    .map(|_| ())
}

/// The value of the unlabelled sample `name` on the `/metrics` page at `probe`, if it answers and
/// has one.
pub async fn metric(probe: SocketAddr, name: &str) -> Option<f64> {
    let reply = http_get(probe, "/metrics").await?;
    reply.lines().find_map(|l| {
        let (key, value) = l.split_once(' ')?;
        (key == name).then(|| value.trim().parse().ok()).flatten()
    })
}

/// A field of `/proc/<pid>/status` in KiB (`VmRSS:`, `VmHWM:`); 0 if unreadable.
pub fn proc_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// CPU seconds (user + system) process `pid` has used, from `/proc/<pid>/stat` (USER_HZ is 100
/// on Linux whatever the kernel's HZ).
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised name: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (ticks(11) + ticks(12)) as f64 / 100.0
}

/// The `p`th percentile (0..=100) of an ascending slice, nearest rank; NaN when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// `part` as a percentage of `whole`.
pub fn percent(part: f64, whole: f64) -> f64 {
    100.0 * part / whole
}

/// The machine's load averages, one line.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Test address number `i` (198.18.0.0/15, the benchmarking range: never routed).
pub fn test_ip(i: usize) -> String {
    format!("198.{}.{}.{}", 18 + (i >> 16) % 2, (i >> 8) % 256, i % 256)
}

/// Runs `make(i)` for every `i` in `range` with at most `in_flight` at once; returns the time.
pub async fn run_all<F, Fut>(range: std::ops::Range<usize>, in_flight: usize, make: F) -> Duration
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let t = Instant::now();
    futures::stream::iter(range)
        .map(make)
        .buffer_unordered(in_flight)
        .collect::<Vec<()>>()
        .await;
    t.elapsed()
}

/// A reservation body for server-side apply (spec only).
pub fn reservation_spec(name: &str, ip: &str, node: &str, retain_for: &str) -> serde_json::Value {
    json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "IPReservation",
        "metadata": {"name": name},
        "spec": {"ips": [ip], "nodeName": node, "retainFor": retain_for},
    })
}

/// The spec apply the controller makes for an annotated pod without a retention of its own (its
/// label, its annotations, none here, and the pod's address and node), so that the ceiling
/// writes the same objects as the controller; the statuses carry its `observedGeneration` too.
fn controllers_spec(name: &str, ip: &str) -> serde_json::Value {
    json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "IPReservation",
        "metadata": {
            "name": name,
            "labels": {
                ipkeep_operator::api::MANAGED_BY_LABEL: ipkeep_operator::api::MANAGED_BY_VALUE,
            },
            "annotations": {},
        },
        "spec": {"ips": [ip], "nodeName": "node-0"},
    })
}

/// A status body for server-side apply of the status subresource.
pub fn reservation_status(status: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "ipkeep.dev/v1alpha1", "kind": "IPReservation", "status": status})
}

/// What the API server allows for the controller's own writes, measured with a client of the
/// controller's identity (same APF priority level, same RBAC), [`CONTROLLER_WORKERS`] in flight,
/// and observed as the controller's are: each step ends when a [`PhaseWatch`] on the namespace
/// has seen every write, so the ceiling pays for the one watch the bench puts beside the
/// controller too (the controller's own watches stay its cost).
#[derive(Debug, Clone)]
pub struct Ceiling {
    /// How many reservations.
    pub n: usize,
    /// Creating each as the controller does for a new Bound one: spec apply, then status apply.
    pub bind: Duration,
    /// One status apply each (the controller's write when a pod goes away).
    pub release: Duration,
    /// One delete each (an expiry's write).
    pub delete: Duration,
    /// kube-apiserver's CPU seconds over the bind step.
    pub bind_apiserver_cpu: f64,
    /// kube-apiserver's CPU per write in each tenth of the bind step's writes.
    pub bind_cpu_by_tenth: Vec<Option<f64>>,
}

/// The longest one step of a ceiling may take before the bench gives up.
const CEILING_PATIENCE: Duration = Duration::from_secs(1_800);

impl Ceiling {
    /// Measures it with `n` reservations in namespace `ns` (left empty afterwards), and the CPU
    /// kube-apiserver (`apiserver_pid`) spends on the bind step; `watches` cluster-wide
    /// IPReservation watches of `client` stay open beside it throughout (each as the
    /// controller's own on its writes).
    pub async fn measure(
        client: &Client,
        ns: &str,
        n: usize,
        apiserver_pid: u32,
        watches: usize,
    ) -> Ceiling {
        let api: Api<IPReservation> = Api::namespaced(client.clone(), ns);
        let apply = PatchParams::apply(BENCH_MANAGER).force();
        let mut seen = PhaseWatch::start(client.clone(), ns, None);
        let _watches: Vec<Drain> = (0..watches).map(|_| Drain::all(client.clone())).collect();
        let t = Instant::now();
        let trace = seen.trace_cpu(apiserver_pid);
        run_all(0..n, CONTROLLER_WORKERS, |i| {
            let (api, apply) = (api.clone(), apply.clone());
            async move {
                let name = format!("ceiling-{i}");
                let spec = controllers_spec(&name, &test_ip(i));
                api.patch(&name, &apply, &Patch::Apply(&spec))
                    .await
                    .expect("reference spec apply");
                let status =
                    reservation_status(json!({"phase": "Bound", "podUID": format!("uid-{i}"), "observedGeneration": 1}));
                api.patch_status(&name, &apply, &Patch::Apply(&status))
                    .await
                    .expect("reference status apply");
            }
        })
        .await;
        seen.until("every ceiling reservation Bound", CEILING_PATIENCE, |c| {
            c.bound >= n
        })
        .await;
        let bind = t.elapsed();
        let (bind_apiserver_cpu, bind_cpu_by_tenth) = trace.finish(2 * n);
        let released_at = jiff::Timestamp::now().to_string();
        let release_time =
            (jiff::Timestamp::now() + jiff::SignedDuration::from_hours(24)).to_string();
        let t = Instant::now();
        run_all(0..n, CONTROLLER_WORKERS, |i| {
            let (api, apply) = (api.clone(), apply.clone());
            let (at, until) = (released_at.clone(), release_time.clone());
            async move {
                let status = reservation_status(json!({
                    "phase": "Released", "podUID": format!("uid-{i}"), "observedGeneration": 1,
                    "releasedAt": at, "releaseTime": until,
                }));
                api.patch_status(&format!("ceiling-{i}"), &apply, &Patch::Apply(&status))
                    .await
                    .expect("reference status apply");
            }
        })
        .await;
        seen.until(
            "every ceiling reservation Released",
            CEILING_PATIENCE,
            |c| c.released >= n,
        )
        .await;
        let release = t.elapsed();
        let t = Instant::now();
        run_all(0..n, CONTROLLER_WORKERS, |i| {
            let api = api.clone();
            async move {
                api.delete(&format!("ceiling-{i}"), &DeleteParams::default())
                    .await
                    .expect("reference delete");
            }
        })
        .await;
        seen.until("every ceiling reservation deleted", CEILING_PATIENCE, |c| {
            c.deleted >= n
        })
        .await;
        let delete = t.elapsed();
        Ceiling {
            n,
            bind,
            release,
            delete,
            bind_apiserver_cpu,
            bind_cpu_by_tenth,
        }
    }

    /// Writes per second of the bind step (two per reservation).
    pub fn bind_writes_per_sec(&self) -> f64 {
        2.0 * self.n as f64 / self.bind.as_secs_f64()
    }
}

/// A cluster-wide IPReservation watch whose events are read and dropped, until dropped itself.
struct Drain(tokio::task::JoinHandle<()>);

impl Drain {
    fn all(client: Client) -> Drain {
        let api: Api<IPReservation> = Api::all(client);
        Drain(tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
            while events.next().await.is_some() {}
        }))
    }
}

impl Drop for Drain {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How many reservations of a namespace are in each phase, kept by a watch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PhaseCount {
    /// Present and Bound.
    pub bound: usize,
    /// Present and Released.
    pub released: usize,
    /// Present (any phase).
    pub present: usize,
    /// Deleted since the watch started.
    pub deleted: usize,
}

impl PhaseCount {
    /// The writes that made these counts: a spec apply for each reservation present, a status
    /// apply more for each Bound.
    pub fn writes(&self) -> usize {
        self.present + self.bound
    }

    /// Adds (`by` = 1) or removes (-1) a reservation in `phase` (`None`: not present).
    fn tally(&mut self, phase: Option<Option<Phase>>, by: isize) {
        let Some(phase) = phase else { return };
        let add = |n: &mut usize| *n = n.saturating_add_signed(by);
        add(&mut self.present);
        match phase {
            Some(Phase::Bound) => add(&mut self.bound),
            Some(Phase::Released) => add(&mut self.released),
            None => {}
        }
    }
}

/// A watch on a namespace's reservations publishing a [`PhaseCount`] on every change.
pub struct PhaseWatch {
    counts: tokio::sync::watch::Receiver<PhaseCount>,
    task: tokio::task::JoinHandle<()>,
}

impl PhaseWatch {
    /// Starts watching `ns` (and, if given, only reservations labelled `selector`).
    pub fn start(client: Client, ns: &str, selector: Option<&str>) -> PhaseWatch {
        let (tx, counts) = tokio::sync::watch::channel(PhaseCount::default());
        let api: Api<IPReservation> = Api::namespaced(client, ns);
        let mut cfg = watcher::Config::default();
        if let Some(s) = selector {
            cfg = cfg.labels(s);
        }
        let task = tokio::spawn(async move {
            let mut phases: HashMap<String, Option<Phase>> = HashMap::new();
            let mut count = PhaseCount::default();
            let mut events = std::pin::pin!(watcher(api, cfg).default_backoff());
            while let Ok(Some(event)) = events.try_next().await {
                let (name, now) = match event {
                    watcher::Event::Apply(r) | watcher::Event::InitApply(r) => {
                        (r.name_any(), Some(r.status.as_ref().and_then(|s| s.phase)))
                    }
                    watcher::Event::Delete(r) => (r.name_any(), None),
                    _ => continue,
                };
                let before = match now {
                    Some(phase) => phases.insert(name, phase),
                    None => phases.remove(&name),
                };
                count.tally(before, -1);
                count.tally(now, 1);
                if before.is_some() && now.is_none() {
                    count.deleted += 1;
                }
                let _ = tx.send(count);
            }
        });
        PhaseWatch { counts, task }
    }

    /// Waits until `done` holds (failing the bench after `limit`, saying what it saw); returns
    /// the time waited.
    pub async fn until(
        &mut self,
        what: &str,
        limit: Duration,
        done: impl Fn(&PhaseCount) -> bool,
    ) -> Duration {
        let t = Instant::now();
        let waited = tokio::time::timeout(limit, self.counts.wait_for(|c| done(c)))
            .await
            .map(|r| r.is_ok());
        if waited != Ok(true) {
            panic!(
                "gave up after {} s waiting for {what}: {:?}",
                limit.as_secs(),
                *self.counts.borrow()
            );
        }
        t.elapsed()
    }

    /// The counts now.
    pub fn now(&self) -> PhaseCount {
        *self.counts.borrow()
    }

    /// Samples kube-apiserver's (`apiserver_pid`) CPU beside this watch's writes once a second,
    /// from now until [`CpuTrace::stop`].
    pub fn trace_cpu(&self, apiserver_pid: u32) -> CpuTrace {
        let counts = self.counts.clone();
        let start = cpu_seconds(apiserver_pid);
        let points = std::sync::Arc::new(std::sync::Mutex::new(vec![TracePoint {
            writes: 0,
            cpu: 0.0,
        }]));
        let task = tokio::spawn({
            let points = points.clone();
            async move {
                let mut tick = tokio::time::interval(TRACE_EVERY);
                loop {
                    tick.tick().await;
                    let point = TracePoint {
                        writes: counts.borrow().writes(),
                        cpu: cpu_seconds(apiserver_pid) - start,
                    };
                    points.lock().unwrap_or_else(|e| e.into_inner()).push(point);
                }
            }
        });
        CpuTrace {
            points,
            task,
            apiserver_pid,
            start,
        }
    }
}

/// How often a [`CpuTrace`] samples.
const TRACE_EVERY: Duration = Duration::from_secs(1);

/// kube-apiserver's CPU seconds since the trace started, when a namespace had seen `writes`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct TracePoint {
    /// Writes seen: each reservation present is one (its spec apply), each Bound one more.
    writes: usize,
    /// kube-apiserver's CPU seconds since the trace started.
    cpu: f64,
}

/// kube-apiserver's CPU beside a step's writes over time ([`PhaseWatch::trace_cpu`]): where in
/// the step its CPU per write goes.
pub struct CpuTrace {
    points: std::sync::Arc<std::sync::Mutex<Vec<TracePoint>>>,
    task: tokio::task::JoinHandle<()>,
    apiserver_pid: u32,
    /// kube-apiserver's CPU seconds when the trace started.
    start: f64,
}

impl CpuTrace {
    /// Ends it, with a last point taken now at `writes` (the step's total): kube-apiserver's CPU
    /// seconds since the trace started, and its CPU per write in each tenth of the writes.
    pub fn finish(self, writes: usize) -> (f64, Vec<Option<f64>>) {
        let points = self.stop(writes);
        let cpu = points.last().map_or(0.0, |p| p.cpu);
        (cpu, cpu_per_write_by_tenth(&points, writes))
    }

    /// Ends it, with a last point taken now at `writes`: the points, oldest first.
    fn stop(&self, writes: usize) -> Vec<TracePoint> {
        self.task.abort();
        let mut points = self
            .points
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let last_writes = points.last().map_or(0, |p| p.writes);
        points.push(TracePoint {
            writes: writes.max(last_writes),
            cpu: cpu_seconds(self.apiserver_pid) - self.start,
        });
        points
    }
}

impl Drop for CpuTrace {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// kube-apiserver's CPU milliseconds per write in each tenth of a step's `total` writes. The CPU
/// at a tenth's boundary is read where the points first reached that many writes, interpolated
/// between the two points around it, so the first tenth holds whatever came before the first
/// write (a LIST); `None` for a tenth past the last point.
fn cpu_per_write_by_tenth(points: &[TracePoint], total: usize) -> Vec<Option<f64>> {
    let cpu_at = |writes: usize| {
        let i = points.iter().position(|p| p.writes >= writes)?;
        let b = points.get(i)?;
        let Some(a) = i.checked_sub(1).and_then(|i| points.get(i)) else {
            return Some(b.cpu);
        };
        let span = (b.writes - a.writes) as f64;
        Some(a.cpu + (b.cpu - a.cpu) * (writes - a.writes) as f64 / span)
    };
    (0..10)
        .map(|k| {
            let (from, to) = (total * k / 10, total * (k + 1) / 10);
            let cpu = cpu_at(to)? - cpu_at(from)?;
            (to > from).then(|| 1_000.0 * cpu / (to - from) as f64)
        })
        .collect()
}

impl Drop for PhaseWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Where the audit log ends now: the start of what a bench step will read back.
pub fn audit_mark(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// One audited request.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Audited {
    /// `user.username`.
    pub user: String,
    /// `verb` (create, patch, update, delete, get, list, watch, ...).
    pub verb: String,
    /// Resource, with `/subresource` when there is one.
    pub resource: String,
}

/// Requests audited between the marks `from` and `to` (`None`: the end), counted by user, verb
/// and resource (each request once, whatever stages it was logged at).
pub fn audited_between(path: &Path, from: u64, to: Option<u64>) -> BTreeMap<Audited, usize> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path).expect("failed to open the audit log");
    file.seek(SeekFrom::Start(from))
        .expect("seek in the audit log");
    let mut bytes = Vec::new();
    match to {
        Some(to) => file.take(to.saturating_sub(from)).read_to_end(&mut bytes),
        None => file.read_to_end(&mut bytes),
    }
    .expect("failed to read the audit log");
    let mut seen = std::collections::HashSet::new();
    let mut counts = BTreeMap::new();
    for line in String::from_utf8_lossy(&bytes).lines() {
        let Ok(e) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let id = e["auditID"].as_str().unwrap_or_default().to_owned();
        if !seen.insert(id) {
            continue;
        }
        let r = &e["objectRef"];
        let mut resource = r["resource"].as_str().unwrap_or("-").to_owned();
        if let Some(sub) = r["subresource"].as_str() {
            resource = format!("{resource}/{sub}");
        }
        let key = Audited {
            user: e["user"]["username"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            verb: e["verb"].as_str().unwrap_or_default().to_owned(),
            resource,
        };
        *counts.entry(key).or_insert(0) += 1;
    }
    counts
}

/// Waits until `user` has made no request for a second (their last writes of a step are in the
/// audit log), then returns the mark of the log's end.
pub async fn audit_settled(path: &Path, from: u64, user: &str) -> u64 {
    let quiet = Duration::from_secs(1);
    let limit = Instant::now() + Duration::from_secs(120);
    let count = || -> usize {
        audited_between(path, from, None)
            .iter()
            .filter(|(k, _)| k.user == user)
            .map(|(_, n)| n)
            .sum()
    };
    let mut last = (count(), Instant::now());
    while last.1.elapsed() < quiet && Instant::now() < limit {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = count();
        if now != last.0 {
            last = (now, Instant::now());
        }
    }
    audit_mark(path)
}

/// Whether an audited verb changes state.
pub fn is_write(verb: &str) -> bool {
    matches!(
        verb,
        "create" | "update" | "patch" | "delete" | "deletecollection"
    )
}

/// Every write the API server made to a namespace's reservations from a point on, as a watch from
/// that resourceVersion sees them: each ADDED or MODIFIED event is one write (a new
/// resourceVersion), each DELETED one delete.
pub struct Writes {
    task: tokio::task::JoinHandle<()>,
    seen: tokio::sync::watch::Receiver<WriteCount>,
}

/// What [`Writes`] has seen so far.
#[derive(Debug, Clone, Default)]
pub struct WriteCount {
    /// Writes (ADDED or MODIFIED) by reservation name.
    pub writes: BTreeMap<String, usize>,
    /// Deletes by reservation name.
    pub deletes: BTreeMap<String, usize>,
}

impl Writes {
    /// Starts recording the writes to `ns`'s reservations made after now (a LIST gives the
    /// resourceVersion the watch starts from; a watch that ends is resumed from the last one seen).
    pub async fn start(client: Client, ns: &str) -> Writes {
        use kube::api::{ListParams, WatchEvent, WatchParams};
        let api: Api<IPReservation> = Api::namespaced(client, ns);
        let mut version = api
            .list_metadata(&ListParams::default().limit(1))
            .await
            .expect("a LIST of the reservations")
            .metadata
            .resource_version
            .expect("a LIST has a resourceVersion");
        let (tx, seen) = tokio::sync::watch::channel(WriteCount::default());
        let task = tokio::spawn(async move {
            loop {
                let mut events = std::pin::pin!(
                    api.watch(&WatchParams::default().timeout(290), &version)
                        .await
                        .expect("a watch of the reservations")
                );
                while let Some(event) = events.try_next().await.expect("the reservations' watch") {
                    let (r, deleted) = match event {
                        WatchEvent::Added(r) | WatchEvent::Modified(r) => (r, false),
                        WatchEvent::Deleted(r) => (r, true),
                        WatchEvent::Bookmark(b) => {
                            version = b.metadata.resource_version;
                            continue;
                        }
                        WatchEvent::Error(e) => panic!("the reservations' watch failed: {e:?}"),
                    };
                    version = r.resource_version().unwrap_or_default();
                    tx.send_modify(|c| {
                        let counts = if deleted {
                            &mut c.deletes
                        } else {
                            &mut c.writes
                        };
                        *counts.entry(r.name_any()).or_insert(0) += 1;
                    });
                }
            }
        });
        Writes { task, seen }
    }

    /// Waits until `n` writes to `name` have been seen (failing the bench after `limit`): the
    /// watch delivers in resourceVersion order, so every write made before them has been seen too.
    pub async fn seen(&mut self, name: &str, n: usize, limit: Duration) {
        let waited = tokio::time::timeout(
            limit,
            self.seen
                .wait_for(|c| c.writes.get(name).is_some_and(|&w| w >= n)),
        )
        .await;
        assert!(
            matches!(waited, Ok(Ok(_))),
            "the reservations' watch never showed {n} writes to {name}"
        );
    }

    /// Stops recording; what was seen.
    pub fn stop(self) -> WriteCount {
        self.seen.borrow().clone()
    }
}

/// Whether the writes a [`Writes`] saw are the ones a failover may make: each of `released`
/// written exactly once (its Release), nothing else written or deleted (`ignore`: the bench's own).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteAudit {
    /// Of `released`, how many were written exactly once.
    pub once: usize,
    /// Every other reservation written or deleted, and how often (the `released` ones written
    /// more than once or never among them): empty when the failover wrote nothing twice.
    pub wrong: BTreeMap<String, usize>,
}

impl WriteAudit {
    /// Audits `seen` against the names expected to be released once.
    pub fn of(seen: &WriteCount, released: &[String], ignore: &str) -> WriteAudit {
        let count = |map: &BTreeMap<String, usize>, name: &str| map.get(name).copied().unwrap_or(0);
        let mut audit = WriteAudit::default();
        for name in released {
            match (count(&seen.writes, name), count(&seen.deletes, name)) {
                (1, 0) => audit.once += 1,
                (w, d) => {
                    audit.wrong.insert(name.clone(), w + d);
                }
            }
        }
        for (name, n) in seen.writes.iter().chain(&seen.deletes) {
            if name != ignore && !released.contains(name) {
                *audit.wrong.entry(name.clone()).or_insert(0) += n;
            }
        }
        audit
    }
}

impl Drop for Writes {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(writes: &[(&str, usize)], deletes: &[(&str, usize)]) -> WriteCount {
        let map = |v: &[(&str, usize)]| v.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect();
        WriteCount {
            writes: map(writes),
            deletes: map(deletes),
        }
    }

    /// A case: its name, what the watch saw, how many released once, what is wrong.
    type Case<'a> = (&'a str, WriteCount, usize, &'a [(&'a str, usize)]);

    #[test]
    fn cpu_per_write_is_split_by_tenths_of_the_writes() {
        let p = |writes, cpu| TracePoint { writes, cpu };
        // 100 writes: (points, expected ms per write for each tenth).
        let cases: [(&[TracePoint], [Option<f64>; 10]); 3] = [
            // Even: 10 writes and 0.02 CPU s a second.
            (
                &[0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100].map(|w| p(w, w as f64 / 500.0)),
                [Some(2.0); 10],
            ),
            // The first tenth paid 0.1 CPU s before any write (a LIST), the rest evenly.
            (
                &[p(0, 0.0), p(0, 0.1), p(10, 0.12), p(100, 0.3)],
                [
                    Some(12.0),
                    Some(2.0),
                    Some(2.0),
                    Some(2.0),
                    Some(2.0),
                    Some(2.0),
                    Some(2.0),
                    Some(2.0),
                    Some(2.0),
                    Some(2.0),
                ],
            ),
            // Nothing seen past the start: no tenth is spanned.
            (&[p(0, 0.0), p(0, 1.0)], [None; 10]),
        ];
        for (points, want) in cases {
            let got = cpu_per_write_by_tenth(points, 100);
            assert_eq!(got.len(), 10);
            for (g, w) in got.iter().zip(want) {
                match (g, w) {
                    (Some(g), Some(w)) => assert!((g - w).abs() < 1e-9, "{got:?} != {want:?}"),
                    (g, w) => assert_eq!(*g, w, "{got:?} != {want:?}"),
                }
            }
        }
    }

    #[test]
    fn a_failover_audit_accepts_each_release_once_and_nothing_else() {
        let released = ["a".to_owned(), "b".to_owned()];
        let cases: &[Case] = &[
            (
                "each once",
                counts(&[("a", 1), ("b", 1), ("m", 2)], &[]),
                2,
                &[],
            ),
            (
                "one twice",
                counts(&[("a", 2), ("b", 1)], &[]),
                1,
                &[("a", 2)],
            ),
            ("one never", counts(&[("a", 1)], &[]), 1, &[("b", 0)]),
            (
                "another written",
                counts(&[("a", 1), ("b", 1), ("c", 1)], &[]),
                2,
                &[("c", 1)],
            ),
            (
                "another deleted",
                counts(&[("a", 1), ("b", 1)], &[("c", 1)]),
                2,
                &[("c", 1)],
            ),
            (
                "a released one deleted",
                counts(&[("a", 1), ("b", 1)], &[("a", 1)]),
                1,
                &[("a", 2)],
            ),
            (
                "the bench's own ignored",
                counts(&[("a", 1), ("b", 1)], &[("m", 1)]),
                2,
                &[],
            ),
        ];
        for (case, seen, once, wrong) in cases {
            let audit = WriteAudit::of(seen, &released, "m");
            let wrong: BTreeMap<String, usize> =
                wrong.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect();
            assert_eq!((audit.once, audit.wrong), (*once, wrong), "{case}");
        }
    }
}
