//! The node agent (`ipkeep-operator agent`, a DaemonSet): watches its node's IPReservations and
//! keeps `<dataDir>/<network>/reserved/<namespace>/<pod>` equal to them for every configured
//! network (contract 3 of the design).
//!
//! * The decision "which files should exist" is pure ([`crate::rules::desired`]); the disk work goes only
//!   through the plugin library's writer ([`writer`]).
//! * Built like the controller: the watch (field selector `spec.nodeName=<node>`, all
//!   namespaces) fills kube's reflector store; [`view`] turns what the store holds into the
//!   plain [`crate::rules::desired::Reservation`]s that planning reads. Every relist (start, and after any
//!   watch gap: a 410, a dropped connection that cannot resume) makes the next pass a full
//!   resync, which also deletes garbage and leftover temporaries; other passes touch only
//!   the files that change.
//! * A file whose reservation is gone is removed only when it was released: its deletion seen
//!   while the CRD lives, the object moved to another node, or its release time passed. Any
//!   other is lost and kept, protecting its addresses, and reported ([`loss`],
//!   [`crate::rules::loss`]).
//! * It reads reservations (and the CRD, to judge deletions) and creates Events (through
//!   [`crate::runtime::events`], as the controller does); of status it writes only its own
//!   conditions (its pod's, and `Unprotected` on its node's reservations).
//! * A network directory or its `reserved/` removed or replaced on the node (a reset tool's
//!   `rm -rf`) makes the next pass a full resync at once ([`dirwatch`], inotify), not at the next
//!   periodic one; the data directory deleted under the agent's mount makes it exit, to be
//!   restarted on a fresh mount.
//! * It serves what is on its node's disk (allocation and reservation files) as JSON at `/ipam` on
//!   its probe port, which `ipkeep-operator check --ipam` cross-checks ([`ipam`]).
//! * When the agent is down the files stay as they were: the plugin keeps honouring them, and
//!   stops honouring each at its `releaseTime` by itself.

mod args;
pub mod capacity;
pub mod dirwatch;
pub mod hostlocal;
pub mod incharge;
pub mod ipam;
pub mod loss;
pub mod metrics;
mod sync;
pub mod view;
mod watches;
pub mod writer;

use std::{
    future::Future,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use kube::{Client, runtime::reflector};
use tokio::sync::Notify;

use self::args::GuardedDir;
use self::sync::Pending;
pub use self::{args::Args, metrics::AgentMetrics};
use crate::{
    api::IPReservation,
    rules::schedule::Schedule,
    runtime::{
        events::{Policy, Publisher},
        logging::{self, error_chain},
        probes::{ProbeServer, Readiness},
        shutdown::{self, stopped},
    },
};

/// The Event reporter name (`reportingController`).
pub const REPORTER: &str = "ipkeep-agent";

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
    /// Whether to count how full the node's ranges are and say it in metrics and on the Node
    /// ([`capacity`]). Off only in the bench's fan-out, whose agents have no Node.
    pub report_capacity: bool,
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
    /// `--pod-namespace`/`--pod-name` are not a valid namespace and pod name.
    #[error("failed to use the agent's own pod (--pod-namespace, --pod-name)")]
    OwnPod(#[source] ipkeep_reservation::SchemaError),
    /// The plugin binary to compare the node's with cannot be read.
    #[error("failed to read the plugin binary {}", .0.display())]
    PluginBinary(PathBuf, #[source] std::io::Error),
    /// `--guard-host-local` without a directory, and none to take (`--cni-bin-dir`, `--host-root`).
    #[error(
        "failed to guard host-local: --guard-host-local names no directory and neither --cni-bin-dir nor --host-root is given"
    )]
    NoGuardedDir,
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
        let mut probes = ProbeServer::bind(args.metrics_addr, registry, readiness.clone()).await?;
        if !args.no_node_view {
            let (node, dir, networks) = (
                args.node_name.clone(),
                args.data_dir.clone(),
                args.networks.clone(),
            );
            probes = probes.with_document(
                ipam::PATH,
                Arc::new(move || {
                    Box::pin(ipam::served(node.clone(), dir.clone(), networks.clone()))
                }),
            );
        }
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let probe_task = tokio::spawn(probes.run(stopped(stop_rx.clone())));
        if let Some(guarded) = args.guarded()? {
            let events = Publisher::new(client.clone(), REPORTER, &args.node_name);
            let reclaimed = metrics.host_local_reclaimed.clone();
            let (plugin, node) = (args.plugin_binary.clone(), args.node_name.clone());
            tokio::spawn(async move {
                let dir = match guarded {
                    GuardedDir::Mounted(dir) => dir,
                    GuardedDir::Discovered(root) => hostlocal::discovered_dir(&root).await,
                };
                let guard = hostlocal::Guard { dir, plugin, node };
                hostlocal::run(guard, events, reclaimed).await;
            });
        }
        let in_charge = args.in_charge()?;
        let config = AgentConfig {
            in_charge,
            node_name: args.node_name,
            data_dir: args.data_dir,
            networks: args.networks,
            default_retain_for: args.default_retain_for,
            resync_interval: args.resync_interval,
            watch_data_dir: true,
            report_capacity: true,
        };
        let result = run(client, config, metrics, readiness, shutdown::signal()).await;
        let _ = stop_tx.send(true);
        let _ = probe_task.await;
        drop(stop_rx);
        result.map_err(anyhow::Error::from)
    })
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
        if ipkeep_netdir::check_name(network).is_err() || network.is_empty() {
            return Err(AgentError::InvalidNetwork(network.clone()));
        }
    }
    let (store, writer) = reflector::store::<IPReservation>();
    let pending = Arc::new(Mutex::new(Pending {
        schedule: Schedule::new(config.resync_interval),
        orphaned: None,
        deleted: std::collections::HashSet::new(),
    }));
    let changed = Arc::new(Notify::new());
    let watch = tokio::spawn(watches::watch_reservations(
        client.clone(),
        config.node_name.clone(),
        writer,
        pending.clone(),
        changed.clone(),
        metrics.clone(),
    ));
    let dirs = config.watch_data_dir.then(|| {
        tokio::spawn(watches::watch_directories(
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
    let capacity = config.report_capacity.then(|| {
        tokio::spawn(capacity::run(
            config.clone(),
            client.clone(),
            store.clone(),
            metrics.capacity.clone(),
        ))
    });
    let events = Publisher::new(client.clone(), REPORTER, &config.node_name);
    let client_for_check = client.clone();
    let client_for_loss = client.clone();
    let in_charge = config.in_charge.clone().map(|r| {
        // Its one Normal Event (fixed: `InCharge`) is no routine transition: it is posted.
        let (events, drain) = Publisher::start(
            client,
            REPORTER,
            &config.node_name,
            Policy { normal: true },
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
    let state = sync::State {
        store: &store,
        pending: &pending,
        changed: &changed,
        client: &client_for_loss,
    };
    let result = sync::write_loop(&config, state, &metrics, &readiness, &events, shutdown).await;
    watch.abort();
    if let Some(task) = dirs {
        task.abort();
    }
    if let Some(task) = in_charge {
        task.abort();
    }
    if let Some(task) = capacity {
        task.abort();
    }
    match &result {
        Ok(()) => tracing::info!("agent stopped"),
        Err(e) => tracing::error!(error = %error_chain(e), "agent stopped"),
    }
    result
}
