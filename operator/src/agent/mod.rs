//! The node agent (`ipkeep-operator agent`, a DaemonSet): watches its node's IPReservations and
//! keeps `<dataDir>/<network>/reserved/<namespace>/<pod>` equal to them for every configured
//! network (contract 3 of the design).
//!
//! * The decision "which files should exist" is pure ([`desired`]); the disk work goes only
//!   through the plugin library's writer ([`writer`]).
//! * Built like the controller: the watch (field selector `spec.nodeName=<node>`, all
//!   namespaces) fills kube's reflector store; [`view`] turns what the store holds into the
//!   plain [`desired::Reservation`]s that planning reads. Every relist (start, and after any
//!   watch gap: a 410, a dropped connection that cannot resume) makes the next pass a full
//!   resync, which also deletes stale files and leftover temporaries; other passes touch only
//!   the files that change.
//! * It reads reservations and creates Events (through [`crate::events`], as the controller
//!   does), nothing else; it never writes status.
//! * A network directory or its `reserved/` removed or replaced on the node (a reset tool's
//!   `rm -rf`) makes the next pass a full resync at once ([`dirwatch`], inotify), not at the next
//!   periodic one; the data directory deleted under the agent's mount makes it exit, to be
//!   restarted on a fresh mount.
//! * When the agent is down the files stay as they were: the plugin keeps honouring them, and
//!   stops honouring each at its `releaseTime` by itself.

pub mod dirwatch;
pub mod hostlocal;
pub mod incharge;
pub mod metrics;
pub mod view;
pub mod writer;

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use ipkeep_reservation::{PodKey, ValidReservation};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, reflector::store::Writer};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::Notify;

use crate::api::IPReservation;
use crate::api::Key;
use crate::api::retention::{RetainFor, RetainForError};
use crate::events::{EventType, Notice, Publisher};
use crate::logging::{self, LogArgs, error_chain};
use crate::probes::{ProbeServer, Readiness};
use crate::shutdown;

use self::dirwatch::{DirWatch, Wake as DirWake};
pub use self::metrics::AgentMetrics;
use self::writer::{NetworkWriter, PassReport};
use crate::rules::desired::{Refusal, desired_files};
use crate::rules::schedule::{Pass, Schedule, Step, Wake};

/// The pause before the data directory's watch is set up again after it failed.
const WATCH_RETRY: Duration = Duration::from_secs(30);

/// The Event reporter name (`reportingController`).
pub const REPORTER: &str = "ipkeep-agent";

/// Command-line flags of `ipkeep-operator agent`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// This node's name (from the downward API: `spec.nodeName`).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// host-local's data directory on the node (the `dataDir` of the IPAM configuration).
    #[arg(long, env = "IPKEEP_DATA_DIR", default_value = "/var/lib/cni/networks")]
    pub data_dir: PathBuf,
    /// A CNI network whose reservation files the agent keeps (the network's `name`); repeat
    /// the flag or separate names with commas.
    #[arg(
        long = "network",
        env = "IPKEEP_NETWORKS",
        value_delimiter = ',',
        required = true
    )]
    pub networks: Vec<String>,
    /// Retention for reservations without `spec.retainFor` that have no release time yet
    /// (hand-made ones): the file's releaseTime is creationTimestamp + this.
    #[arg(long, env = "IPKEEP_DEFAULT_RETAIN_FOR", default_value = "24h", value_parser = retain_for_arg)]
    pub default_retain_for: Duration,
    /// How often a full resync runs even without a watch gap (catches hand edits on disk).
    /// A positive duration in jiff's friendly form (`10m`, `90s`, `1h30m`) or ISO 8601 (`PT10M`),
    /// not a retention: it has no 366-day cap.
    #[arg(long, env = "IPKEEP_RESYNC_INTERVAL", default_value = "10m", value_parser = interval_arg)]
    pub resync_interval: Duration,
    /// Where `/metrics`, `/healthz` and `/readyz` are served (the controller's flag of the same
    /// name; `--probe-addr`, its old name, is still accepted).
    #[arg(
        long,
        alias = "probe-addr",
        env = "IPKEEP_METRICS_ADDR",
        default_value = "0.0.0.0:9102"
    )]
    pub metrics_addr: SocketAddr,
    /// Keep `host-local` in this CNI bin directory ipkeep: when something writes it again (a
    /// package or k3s upgrade), install ipkeep again at once, keeping what was written as the new
    /// `host-local.ipkeep-orig` (the chart passes it with `cni.replaceHostLocal`).
    #[arg(long, env = "IPKEEP_GUARD_HOST_LOCAL", value_name = "DIR")]
    pub guard_host_local: Option<PathBuf>,
    /// The plugin binary `--guard-host-local` installs (inside the image), and what `ipkeep`
    /// and a replaced `host-local` in the CNI bin directory are compared with.
    #[arg(long, env = "IPKEEP_PLUGIN_BINARY", default_value = "/ipkeep")]
    pub plugin_binary: PathBuf,
    /// The node's CNI configuration directory as mounted here (read-only): with
    /// `--cni-bin-dir`, the evidence of whether ipkeep is in charge of each network
    /// (`agent::incharge`). Without it the agent does not check.
    #[arg(
        long,
        env = "IPKEEP_CNI_CONF_DIR",
        value_name = "DIR",
        requires = "cni_bin_dir"
    )]
    pub cni_conf_dir: Option<PathBuf>,
    /// The same directory's path on the node, for messages.
    #[arg(long, default_value = "/etc/cni/net.d")]
    pub cni_conf_dir_on_node: String,
    /// The node's CNI bin directory as mounted here.
    #[arg(long, env = "IPKEEP_CNI_BIN_DIR", value_name = "DIR")]
    pub cni_bin_dir: Option<PathBuf>,
    /// The same directory's path on the node, for messages.
    #[arg(long, default_value = "/opt/cni/bin")]
    pub cni_bin_dir_on_node: String,
    /// The agent's own pod (downward API), whose condition `ipkeep.dev/InCharge` says whether
    /// ipkeep is in charge on this node.
    #[arg(long, env = "POD_NAME", requires = "pod_namespace")]
    pub pod_name: Option<String>,
    /// The agent pod's namespace (downward API).
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
    /// Logging.
    #[command(flatten)]
    pub log: LogArgs,
}

fn retain_for_arg(text: &str) -> Result<Duration, RetainForError> {
    RetainFor::parse(text).map(RetainFor::duration)
}

/// Why an interval flag was refused.
#[derive(Debug, thiserror::Error)]
enum IntervalError {
    /// Not a duration jiff reads.
    #[error("failed to parse interval {0:?}: expected a duration such as 10m, 90s, 1h30m or 1d")]
    Syntax(String, #[source] jiff::Error),
    /// Zero or negative.
    #[error("failed to accept interval {0:?}: it must be positive")]
    NotPositive(String),
}

/// The agent's intervals (`--resync-interval`): jiff's duration grammar, positive; a day is 24
/// hours and a week 7 days (calendar units, months and years, are refused: they have no fixed length).
fn interval_arg(text: &str) -> Result<Duration, IntervalError> {
    let parsed = text
        .parse::<jiff::Span>()
        .and_then(|span| span.to_duration(jiff::SpanRelativeTo::days_are_24_hours()))
        .map_err(|e| IntervalError::Syntax(text.to_owned(), e))?;
    Duration::try_from(parsed)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| IntervalError::NotPositive(text.to_owned()))
}

/// What the agent needs to run, independent of the command line (tests build it directly).
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// This node's name.
    pub node_name: String,
    /// host-local's data directory.
    pub data_dir: PathBuf,
    /// The networks whose `reserved/` trees the agent keeps.
    pub networks: Vec<String>,
    /// Retention for reservations that have neither status nor `retainFor`.
    pub default_retain_for: Duration,
    /// Full resync period.
    pub resync_interval: Duration,
    /// Whether and how to check that ipkeep is in charge on the node (`None`: no check).
    pub in_charge: Option<incharge::report::Reporter>,
    /// Whether to watch the data directory with inotify (a removed directory is repaired at
    /// once, not at the next resync). Off only where a thousand agents share one machine (the
    /// bench's fan-out): inotify instances are a per-user limit, 128 by default.
    pub watch_data_dir: bool,
}

/// Errors of the agent as a whole (disk and watch errors are retried, not returned).
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A network name cannot be a directory name.
    #[error("failed to use network name {0:?}: it must be a single path component")]
    InvalidNetwork(String),
    /// The node name is empty.
    #[error("failed to start the agent: the node name is empty (set --node-name or NODE_NAME)")]
    NoNodeName,
    /// The plugin binary to compare the node's with cannot be read.
    #[error("failed to read the plugin binary {}", .0.display())]
    PluginBinary(PathBuf, #[source] std::io::Error),
    /// The data directory was deleted on the node while the agent held it (its mount).
    #[error(
        "failed to keep the reservation files: the data directory {} was deleted on the node and this process can no longer reach the new one (exiting, to be restarted on a fresh mount)",
        .0.display()
    )]
    DataDirOrphaned(PathBuf),
}

/// Runs the agent until shutdown: logging, the Kubernetes client, the probe server, the loop.
pub fn main(args: Args) -> anyhow::Result<()> {
    logging::init(&args.log)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let client = Client::try_default().await?;
        let registry = prometheus::Registry::new();
        let metrics = AgentMetrics::register(&registry)?;
        let readiness = Arc::new(Readiness::default());
        let probes = ProbeServer::bind(args.metrics_addr, registry, readiness.clone()).await?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut probe_stop = stop_rx.clone();
        let probe_task = tokio::spawn(probes.run(async move {
            let _ = probe_stop.wait_for(|s| *s).await;
        }));
        if let Some(dir) = args.guard_host_local.clone() {
            let guard = hostlocal::Guard {
                dir,
                plugin: args.plugin_binary.clone(),
                node: args.node_name.clone(),
            };
            let events = Publisher::new(client.clone(), REPORTER, &args.node_name);
            tokio::spawn(hostlocal::run(
                guard,
                events,
                metrics.host_local_reclaimed.clone(),
            ));
        }
        let in_charge = match (&args.cni_conf_dir, &args.cni_bin_dir) {
            (Some(conf), Some(bin)) => Some(incharge::report::Reporter {
                sources: incharge::evidence::Sources {
                    conf_dir: conf.clone(),
                    conf_dir_on_node: args.cni_conf_dir_on_node.clone(),
                    bin_dir: bin.clone(),
                    bin_dir_on_node: args.cni_bin_dir_on_node.clone(),
                    plugin: std::fs::read(&args.plugin_binary)
                        .map_err(|e| AgentError::PluginBinary(args.plugin_binary.clone(), e))?,
                },
                networks: args.networks.clone(),
                data_dir: args.data_dir.to_string_lossy().into_owned(),
                node: args.node_name.clone(),
                pod: args.pod_namespace.clone().zip(args.pod_name.clone()),
            }),
            _ => None,
        };
        let config = AgentConfig {
            in_charge,
            node_name: args.node_name,
            data_dir: args.data_dir,
            networks: args.networks,
            default_retain_for: args.default_retain_for,
            resync_interval: args.resync_interval,
            watch_data_dir: true,
        };
        let result = run(client, config, metrics, readiness, shutdown::signal()).await;
        let _ = stop_tx.send(true);
        let _ = probe_task.await;
        drop(stop_rx);
        result.map_err(anyhow::Error::from)
    })
}

/// What the watches tell the write loop; the reservations themselves are in the reflector
/// store.
#[derive(Debug)]
struct Pending {
    /// What they reported, as the write schedule keeps it.
    schedule: Schedule,
    /// The data directory was deleted under the agent's mount: the agent must stop.
    orphaned: Option<PathBuf>,
}

/// Runs the agent's watch and writer until `shutdown` completes; the pass in progress finishes
/// first, so no write is cut short by a graceful stop.
pub async fn run(
    client: Client,
    config: AgentConfig,
    metrics: AgentMetrics,
    readiness: Arc<Readiness>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    if config.node_name.is_empty() {
        return Err(AgentError::NoNodeName);
    }
    for network in &config.networks {
        if ipkeep_reservation::netdir::check_name(network).is_err() || network.is_empty() {
            return Err(AgentError::InvalidNetwork(network.clone()));
        }
    }
    let (store, writer) = reflector::store::<IPReservation>();
    let pending = Arc::new(Mutex::new(Pending {
        schedule: Schedule::new(config.resync_interval),
        orphaned: None,
    }));
    let changed = Arc::new(Notify::new());
    let watch = tokio::spawn(watch_reservations(
        client.clone(),
        config.node_name.clone(),
        writer,
        pending.clone(),
        changed.clone(),
        metrics.clone(),
    ));
    let dirs = config.watch_data_dir.then(|| {
        tokio::spawn(watch_directories(
            config.data_dir.clone(),
            config.networks.clone(),
            pending.clone(),
            changed.clone(),
            readiness.clone(),
        ))
    });
    tracing::info!(
        node = %config.node_name,
        data_dir = %config.data_dir.display(),
        networks = ?config.networks,
        "agent started"
    );
    let events = Publisher::new(client.clone(), REPORTER, &config.node_name);
    let client_for_check = client.clone();
    let in_charge = config.in_charge.clone().map(|r| {
        // Its one Normal Event (fixed: `InCharge`) is no routine transition: it is posted.
        let (events, drain) = Publisher::start(
            client,
            REPORTER,
            &config.node_name,
            crate::events::Policy { normal: true },
            None,
        );
        drain.detach();
        tokio::spawn(incharge::report::run(
            r,
            client_for_check,
            store.clone(),
            events,
            metrics.in_charge.clone(),
        ))
    });
    let state = State {
        store: &store,
        pending: &pending,
        changed: &changed,
    };
    let result = write_loop(&config, state, &metrics, &readiness, &events, shutdown).await;
    watch.abort();
    if let Some(task) = dirs {
        task.abort();
    }
    if let Some(task) = in_charge {
        task.abort();
    }
    match &result {
        Ok(()) => tracing::info!("agent stopped"),
        Err(e) => tracing::error!(error = %error_chain(e), "agent stopped"),
    }
    result
}

/// Runs the data directory's watch ([`dirwatch`]): each burst that asks for a resync makes the
/// next pass a full one, at once; once the first full sync made every directory (the agent is
/// ready), a directory found missing does too. Without inotify (or after a read error) the agent
/// goes on with its periodic resync and sets the watch up again after a pause.
async fn watch_directories(
    data_dir: PathBuf,
    networks: Vec<String>,
    pending: Arc<Mutex<Pending>>,
    changed: Arc<Notify>,
    readiness: Arc<Readiness>,
) {
    loop {
        let mut watch = match DirWatch::new(&data_dir, &networks) {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %error_chain(&e), "cannot watch the data directory; only the periodic resync repairs it; retrying");
                tokio::time::sleep(WATCH_RETRY).await;
                continue;
            }
        };
        loop {
            match watch.next(|| readiness.is_ready()).await {
                Ok(DirWake::Resync(trigger)) => {
                    let Ok(mut p) = pending.lock() else {
                        return;
                    };
                    p.schedule.directory(trigger, Instant::now());
                    tracing::info!(reason = trigger.label(), "{trigger}: full resync now");
                    changed.notify_one();
                }
                Ok(DirWake::Orphaned(path)) => {
                    if let Ok(mut p) = pending.lock() {
                        p.orphaned = Some(path);
                    }
                    changed.notify_one();
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %error_chain(&e), "data directory watch failed; setting it up again");
                    break;
                }
            }
        }
        tokio::time::sleep(dirwatch::REARM).await;
    }
}

async fn watch_reservations(
    client: Client,
    node: String,
    writer: Writer<IPReservation>,
    pending: Arc<Mutex<Pending>>,
    changed: Arc<Notify>,
    metrics: AgentMetrics,
) {
    let api: Api<IPReservation> = Api::all(client);
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut stream = std::pin::pin!(
        watcher::watcher(api, cfg)
            .default_backoff()
            .modify(view::trim)
            .reflect(writer)
    );
    while let Some(event) = stream.next().await {
        let now = Instant::now();
        let Ok(mut p) = pending.lock() else {
            return;
        };
        match event {
            // The store swaps in the relisted objects at InitDone: nothing to do before.
            Ok(Event::Init | Event::InitApply(_)) => {}
            Ok(Event::InitDone) => {
                p.schedule.listed(now);
                tracing::info!("reservations listed");
                changed.notify_one();
            }
            Ok(Event::Apply(_) | Event::Delete(_)) => {
                p.schedule.changed(now);
                changed.notify_one();
            }
            Err(e) => {
                metrics.watch_errors.inc();
                tracing::warn!(error = %e, "reservation watch failed; retrying");
            }
        }
    }
}

/// What the watch fills and the write loop reads.
#[derive(Clone, Copy)]
struct State<'a> {
    store: &'a Store<IPReservation>,
    pending: &'a Mutex<Pending>,
    changed: &'a Notify,
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The thin async shell over [`Schedule`]: wakes on a watch's report, a failed pass's retry
/// time or the periodic tick, asks the schedule what to do, runs the pass on a blocking thread
/// and tells the schedule how it ended.
async fn write_loop(
    config: &AgentConfig,
    state: State<'_>,
    metrics: &AgentMetrics,
    readiness: &Readiness,
    events: &Publisher,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    tokio::pin!(shutdown);
    let mut writers = Some(new_writers(config));
    let mut reported: HashSet<(String, String)> = HashSet::new();
    let State {
        store,
        pending,
        changed,
    } = state;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        let retry_at = schedule(pending, |s| s.retry_at()).flatten();
        let wake_for_retry = async {
            match retry_at {
                Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
                None => std::future::pending().await,
            }
        };
        let wake = tokio::select! {
            () = &mut shutdown => return Ok(()),
            () = changed.notified() => {
                if let Some(path) = pending.lock().ok().and_then(|mut p| p.orphaned.take()) {
                    return Err(AgentError::DataDirOrphaned(path));
                }
                Wake::Changed
            }
            () = wake_for_retry => Wake::Retry,
            _ = tick.tick() => {
                if let Some(since) = schedule(pending, |s| s.since_full(Instant::now())).flatten() {
                    metrics
                        .seconds_since_full_sync
                        .set(i64::try_from(since.as_secs()).unwrap_or(i64::MAX));
                }
                Wake::Tick
            }
        };
        // The store is read under the same lock, so a change the pass takes is in the store.
        let Some((pass, reservations)) =
            pending
                .lock()
                .ok()
                .and_then(|mut p| match p.schedule.next(wake, Instant::now()) {
                    Step::Wait => None,
                    Step::Pass(pass) => Some((pass, store.state())),
                })
        else {
            continue;
        };
        let desired = desired_files(
            &config.node_name,
            &view::reservations(reservations.iter().map(AsRef::as_ref)),
            config.default_retain_for,
        );
        metrics
            .reservations
            .set(i64::try_from(desired.files.len()).unwrap_or(i64::MAX));
        metrics
            .refused
            .set(i64::try_from(desired.refused.len()).unwrap_or(i64::MAX));
        report_refusals(store, &desired.refused, &mut reported, events).await;
        // The controller posts the Warning for a malformed spec.retainFor (on every reservation
        // it releases); the agent, which writes the same default, only leaves a trace.
        for (key, malformed) in &desired.defaulted {
            tracing::debug!(reservation = %key, error = %malformed, "default retention applied");
        }
        let ok = write_pass(config, &mut writers, desired.files, pass.full, metrics).await;
        let now = Instant::now();
        if ok {
            schedule(pending, |s| s.succeeded(&pass, now));
            passed(&pass, metrics, readiness);
        } else {
            schedule(pending, |s| s.failed(pass, now));
        }
    }
}

/// Writes `files` for every network on a blocking thread: a full resync or the changes only;
/// `false` if a step failed. Writers are moved to the thread and back; a thread that panicked
/// loses them, and new ones start from a full resync.
async fn write_pass(
    config: &AgentConfig,
    writers: &mut Option<Vec<NetworkWriter>>,
    files: BTreeMap<PodKey, ValidReservation>,
    full: bool,
    metrics: &AgentMetrics,
) -> bool {
    let mut moved = writers.take().unwrap_or_else(|| new_writers(config));
    let joined = tokio::task::spawn_blocking(move || {
        let results: Vec<_> = moved
            .iter_mut()
            .map(|w| {
                let r = if full {
                    w.full_sync(&files)
                } else {
                    w.apply(&files)
                };
                (w.network().to_owned(), r)
            })
            .collect();
        (moved, results)
    })
    .await;
    let (back, results) = match joined {
        Ok(out) => out,
        Err(e) => {
            tracing::error!(error = %e, "reservation writer task failed");
            metrics.sync_errors.with_label_values(&["pass"]).inc();
            return false;
        }
    };
    *writers = Some(back);
    let mut ok = true;
    for (network, result) in results {
        match result {
            Ok(report) => ok &= account(&network, &report, full, metrics),
            Err(e) => {
                ok = false;
                metrics.sync_errors.with_label_values(&["pass"]).inc();
                tracing::warn!(network = %network, error = %error_chain(&e), "reservation sync failed; retrying");
            }
        }
    }
    ok
}

/// Records a pass that ended well: how long its changes took to reach disk, the directory
/// trigger it answered, and (a full one) the resync, which makes the agent ready.
fn passed(pass: &Pass, metrics: &AgentMetrics, readiness: &Readiness) {
    for at in &pass.arrivals {
        metrics.change_to_file.observe(at.elapsed().as_secs_f64());
    }
    if let Some((since, trigger)) = pass.dir_trigger {
        metrics
            .directory_resyncs
            .with_label_values(&[trigger.label()])
            .inc();
        tracing::info!(
            reason = trigger.label(),
            millis = u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX),
            "reservation files restored after: {trigger}"
        );
    }
    if pass.full {
        metrics.full_syncs.inc();
        metrics.last_full_sync.set(unix_now());
        metrics.seconds_since_full_sync.set(0);
        if !readiness.is_ready() {
            tracing::info!("first full sync done: ready");
        }
        readiness.set(true);
    }
}

/// One writer per network, knowing nothing yet (so its first pass reads the tree).
fn new_writers(config: &AgentConfig) -> Vec<NetworkWriter> {
    config
        .networks
        .iter()
        .map(|n| NetworkWriter::new(&config.data_dir, n))
        .collect()
}

/// Runs `f` on the schedule under its lock (`None` if a watch task panicked holding it).
fn schedule<T>(pending: &Mutex<Pending>, f: impl FnOnce(&mut Schedule) -> T) -> Option<T> {
    pending.lock().ok().map(|mut p| f(&mut p.schedule))
}

/// Counts and logs one network's pass; `false` if a step failed.
fn account(network: &str, report: &PassReport, full: bool, metrics: &AgentMetrics) -> bool {
    metrics.files_written.inc_by(report.written.len() as u64);
    metrics.files_removed.inc_by(report.removed.len() as u64);
    metrics.garbage_cleaned.inc_by(report.cleaned.len() as u64);
    for key in &report.written {
        tracing::debug!(network, pod = %key, "reservation file written");
    }
    for key in &report.removed {
        tracing::info!(network, pod = %key, "reservation file removed");
    }
    for path in &report.cleaned {
        tracing::info!(network, path = %path.display(), "garbage removed from reserved/");
    }
    for failure in &report.failed {
        metrics.sync_errors.with_label_values(&["file"]).inc();
        tracing::warn!(network, error = %failure, "reservation file step failed");
    }
    if full {
        tracing::info!(
            network,
            written = report.written.len(),
            removed = report.removed.len(),
            cleaned = report.cleaned.len(),
            failed = report.failed.len(),
            "full resync done"
        );
    }
    report.failed.is_empty()
}

/// Logs each refused reservation and publishes one Warning Event per object version.
async fn report_refusals(
    store: &Store<IPReservation>,
    refused: &[(Key, Refusal)],
    reported: &mut HashSet<(String, String)>,
    events: &Publisher,
) {
    if refused.is_empty() {
        reported.clear();
        return;
    }
    let refused: Vec<(&Key, &Refusal, Arc<IPReservation>)> = refused
        .iter()
        .filter_map(|(key, refusal)| {
            let obj = store.get(&ObjectRef::new(&key.name).within(&key.namespace))?;
            Some((key, refusal, obj))
        })
        .collect();
    let version_of = |obj: &IPReservation| {
        (
            obj.uid().unwrap_or_default(),
            obj.resource_version().unwrap_or_default(),
        )
    };
    // Forget versions no longer refused, so the set stays as small as the refusals.
    let current: HashSet<(String, String)> =
        refused.iter().map(|(_, _, obj)| version_of(obj)).collect();
    reported.retain(|v| current.contains(v));
    for (key, refusal, obj) in refused {
        if !reported.insert(version_of(&obj)) {
            continue;
        }
        let note = error_chain(refusal);
        tracing::warn!(reservation = %key, error = %note, "reservation refused: no file written");
        events.publish(Notice {
            regarding: obj.object_ref(&()),
            type_: EventType::Warning,
            reason: "InvalidReservation",
            action: "WriteReservationFile",
            note: &note,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    #[test]
    fn the_metrics_address_has_the_controllers_name_and_keeps_its_old_one() {
        use clap::Parser as _;
        let base = ["agent", "--node-name=n", "--network=cbr0"];
        let cases: &[(&[&str], &str)] = &[
            (&[], "0.0.0.0:9102"),
            (&["--metrics-addr=127.0.0.1:9725"], "127.0.0.1:9725"),
            (&["--probe-addr=127.0.0.1:9726"], "127.0.0.1:9726"),
            (&["--probe-addr", "127.0.0.1:9727"], "127.0.0.1:9727"),
        ];
        for (flags, want) in cases {
            let argv = base.iter().chain(flags.iter());
            let got = Cli::try_parse_from(argv).map(|c| c.args.metrics_addr.to_string());
            assert_eq!(got.as_deref().ok(), Some(*want), "{flags:?}: {got:?}");
        }
        let help = Cli::try_parse_from(["agent", "--help"])
            .unwrap_err()
            .to_string();
        assert!(
            help.contains("--metrics-addr <") && !help.contains("--probe-addr <"),
            "{help}"
        );
    }

    #[test]
    fn interval_grammar() {
        let cases: &[(&str, Option<u64>)] = &[
            ("10m", Some(600)),
            ("90s", Some(90)),
            ("1h30m", Some(5_400)),
            ("PT10M", Some(600)),
            ("9000h", Some(32_400_000)),
            ("1d", Some(86_400)),
            ("2w", Some(1_209_600)),
            ("1 month", None),
            ("0s", None),
            ("-5m", None),
            ("10", None),
            ("ten minutes", None),
            ("", None),
        ];
        for (text, want) in cases {
            let got = interval_arg(text);
            assert_eq!(
                got.as_ref().ok().map(Duration::as_secs),
                *want,
                "{text:?}: {got:?}"
            );
        }
    }
}
