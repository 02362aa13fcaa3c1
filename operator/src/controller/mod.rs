//! The controller (`ipkeep-operator controller`): keeps each annotated pod's IPReservation in step
//! with the pod and deletes reservations at their release time.
//!
//! Shape: four watches (pods and reservations projected to what decisions read, StatefulSets'
//! metadata, nodes' pod CIDRs) fill caches and enqueue the pod names they touch; a scheduler holds
//! each name until it is due (a reservation's release time is a scheduled run), and the workers
//! take due names from one [`WorkQueue`] that never hands out a name being reconciled, so one name
//! is never reconciled twice at once and no worker idles while names wait. Only the leader runs
//! the workers; a standby keeps its caches warm and takes over when the lease is free. A failed
//! reconcile is tried again after [`Backoff::RECONCILE`] (the `error_policy` of kube's shape).
//!
//! Why not kube-runtime's `Controller`: its unit of work is one object of one root kind, and it
//! reconciles only what its root store holds (a queued reference whose object is not in the
//! store is dropped as `ObjectNotFound`). Ours is a *name* that a pod and its reservation share,
//! and either may be missing: rooted at IPReservation, a newly annotated pod (no reservation yet)
//! would never be reconciled; rooted at Pod, a deleted pod's reservation would never be released
//! or expired. Bridging that needs a synthetic root store or a finalizer on every pod (a write
//! per pod). Its other gifts we have from the same crate: the scheduler is kube-runtime's
//! `scheduler` (the queue `Controller` is built on: a key scheduled once at its earliest instant),
//! the work queue keeps `Controller`'s rule of one run per key at a time, and the caches are its
//! reflector stores. Leader election also fits better: the watches and
//! caches run on every replica, and only the workers wait for the lease, where `Controller` owns
//! its watches (sharing them needs the `unstable-runtime` streams API).

pub mod cache;
pub mod expectations;
pub mod fresh;
pub mod index;
pub mod malloc;
pub mod metrics;
pub mod placement;
pub mod reconcile;
pub mod view;
pub mod webhook;
pub mod webhook_tls;
pub mod workqueue;

use std::{
    collections::HashMap,
    future::Future,
    net::SocketAddr,
    sync::{Arc, RwLock},
    time::Duration,
};

use futures::{StreamExt, TryStreamExt, channel::mpsc};
use jiff::Timestamp;
use k8s_openapi::api::{
    apps::v1::StatefulSet,
    core::v1::{Namespace, Node, Pod},
};
use kube::{
    Api, Client, ResourceExt,
    core::PartialObjectMeta,
    runtime::{
        WatchStreamExt,
        reflector::{self, reflector},
        scheduler::{ScheduleRequest, scheduler},
        watcher,
    },
};
use prometheus::Registry;
use tokio::{task::JoinSet, time::Instant};

use self::{
    cache::{CachedPod, CachedReservation},
    expectations::Expectations,
    index::AddressIndex,
    metrics::Metrics,
    reconcile::{Context, Next, SelectedNamespaces},
    workqueue::WorkQueue,
};
use crate::{
    api::IPReservation,
    api::Key,
    api::retention::RetainFor,
    backoff::Backoff,
    events::{Policy, Publisher},
    logging::{self, LogArgs, error_chain},
    probes::{ProbeServer, Readiness},
    rules::{
        lifecycle::Defaults,
        namespaces::{self, NamespaceSelector, Verdicts},
        optin,
    },
};

/// Command-line flags of `ipkeep-operator controller` (each also read from the environment).
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Logging.
    #[command(flatten)]
    pub log: LogArgs,
    /// Retention after a pod is gone when neither its `ipkeep.dev/retain-for` annotation nor the
    /// reservation's `spec.retainFor` says (a positive number followed by s, m, h or d; at most 366d).
    #[arg(long, env = "IPKEEP_DEFAULT_RETAIN_FOR", default_value = "24h", value_parser = RetainFor::parse)]
    pub default_retain_for: RetainFor,
    /// The longest retention anyone gets: a longer `ipkeep.dev/retain-for` (on a pod or a
    /// StatefulSet) or `spec.retainFor` is held to it, with a Warning Event `RetentionCapped` on
    /// the object that asked. At least `--default-retain-for`.
    #[arg(long, env = "IPKEEP_MAX_RETAIN_FOR", default_value = "7d", value_parser = RetainFor::parse)]
    pub max_retain_for: RetainFor,
    /// How many Released reservations may hold addresses on a node, for every node without an
    /// `ipkeep.dev/node-budget` annotation (default: its pod CIDRs' usable addresses minus its
    /// allocatable pods). When more do, the earliest released yield (are deleted early).
    #[arg(long, env = "IPKEEP_NODE_BUDGET")]
    pub node_budget: Option<u64>,
    /// Watch pods and reservations of this namespace only (default: every namespace).
    #[arg(long, env = "IPKEEP_NAMESPACE")]
    pub namespace: Option<String>,
    /// Watch only pods matching this label selector (e.g. `ipkeep.dev/enabled=true`); a pod outside
    /// it looks gone, so its reservation is released (but never deleted while the pod lives).
    #[arg(long, env = "IPKEEP_POD_SELECTOR")]
    pub pod_selector: Option<String>,
    /// Reserve only in namespaces whose labels match this label selector (e.g.
    /// `ipkeep.dev/reserve=true`; `a=b`, `a!=b`, `a in (x,y)`, `a notin (x,y)`, `a`, `!a`): an
    /// annotated pod elsewhere gets a Warning Event `NotReserved`, and a namespace relabelled out
    /// releases its reservations (never deleted while their pods live). Default: every namespace,
    /// and Namespaces are not watched.
    #[arg(long, env = "IPKEEP_NAMESPACE_SELECTOR", value_parser = NamespaceSelector::parse)]
    pub namespace_selector: Option<NamespaceSelector>,
    /// Where to serve /metrics, /healthz and /readyz.
    #[arg(long, env = "IPKEEP_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Elect a leader through a Lease so that only one replica reconciles (turn off only when a
    /// single replica runs).
    #[arg(long, env = "IPKEEP_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// The Lease's name.
    #[arg(long, env = "IPKEEP_LEASE_NAME", default_value = "ipkeep-controller")]
    pub lease_name: String,
    /// The Lease's namespace (the chart passes the controller's own namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// How long a lease holds without renewal, in seconds: a standby takes over at most this long
    /// after the leader dies or is cut off.
    #[arg(long, env = "IPKEEP_LEASE_DURATION", default_value_t = 15, value_parser = clap::value_parser!(u64).range(2..=600))]
    pub lease_duration: u64,
    /// This replica's identity in the Lease (default: `POD_NAME`, else host name and process id).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Reconcile workers (one name is never reconciled by two at once).
    #[arg(long, env = "IPKEEP_WORKERS", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub workers: u16,
    /// Also post Normal Events (`Reserved`, `Released`, `Rebound`, `Expired`, …), one write to the
    /// API server per transition the reservation's status already shows; Warnings are always posted.
    #[arg(long, env = "IPKEEP_NORMAL_EVENTS", default_value_t = false, action = clap::ArgAction::Set)]
    pub normal_events: bool,
    /// Where a returning pod goes when neither it nor its StatefulSet says (annotation
    /// `ipkeep.dev/placement`): `preferred` (its reservation's node when that node can take it),
    /// `required` (only that node: the pod waits for it) or `none` (the scheduler decides alone).
    #[arg(long, env = "IPKEEP_DEFAULT_PLACEMENT", default_value = "preferred", value_parser = parse_mode)]
    pub default_placement: optin::Mode,
    /// Serve the placement webhook (HTTPS, POST /mutate-pods) on this address; without it no
    /// webhook is served.
    #[arg(long, env = "IPKEEP_WEBHOOK_ADDR")]
    pub webhook_addr: Option<SocketAddr>,
    /// The Service the API server reaches the webhook through (its DNS names go on the serving
    /// certificate), in the controller's namespace.
    #[arg(long, env = "IPKEEP_WEBHOOK_SERVICE", default_value = "ipkeep-webhook")]
    pub webhook_service: String,
    /// The Secret (in the controller's namespace) where the controller keeps the webhook's CA and
    /// serving certificate.
    #[arg(
        long,
        env = "IPKEEP_WEBHOOK_SECRET",
        default_value = "ipkeep-webhook-tls"
    )]
    pub webhook_secret: String,
    /// The MutatingWebhookConfiguration whose `caBundle` the controller keeps (empty: someone
    /// else keeps it).
    #[arg(
        long,
        env = "IPKEEP_WEBHOOK_CONFIGURATION",
        default_value = "ipkeep-placement"
    )]
    pub webhook_configuration: String,
    /// Serve `tls.crt` and `tls.key` from this directory (cert-manager's Secret, mounted) instead
    /// of keeping a certificate in the Secret.
    #[arg(long, env = "IPKEEP_WEBHOOK_CERT_DIR")]
    pub webhook_cert_dir: Option<std::path::PathBuf>,
}

fn parse_mode(text: &str) -> Result<optin::Mode, String> {
    optin::Mode::parse(text).ok_or_else(|| format!("{text:?} is none of preferred, required, none"))
}

/// The placement webhook's settings.
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    /// Where to serve it (port 0 picks one).
    pub addr: SocketAddr,
    /// Where its certificate comes from.
    pub tls: webhook_tls::TlsSource,
}

/// Leader election settings.
#[derive(Debug, Clone)]
pub struct LeaseSettings {
    /// Lease name.
    pub name: String,
    /// Lease namespace.
    pub namespace: String,
    /// This replica's identity.
    pub identity: String,
    /// Lease duration in seconds.
    pub duration_secs: u64,
}

/// What [`run`] needs besides a client.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Lifecycle defaults.
    pub defaults: Defaults,
    /// `--node-budget`: every node's budget unless its annotation says.
    pub node_budget: Option<u64>,
    /// Only this namespace (else all).
    pub namespace: Option<String>,
    /// Only pods matching this label selector.
    pub pod_selector: Option<String>,
    /// Only namespaces matching this selector keep addresses (`None`: every namespace, none
    /// watched).
    pub namespace_selector: Option<NamespaceSelector>,
    /// Probe server address (port 0 picks one).
    pub metrics_addr: SocketAddr,
    /// Leader election, or none (a single replica).
    pub lease: Option<LeaseSettings>,
    /// Number of reconcile workers.
    pub workers: usize,
    /// Which Events are posted.
    pub events: Policy,
    /// The placement webhook, if served.
    pub webhook: Option<WebhookSettings>,
}

impl Settings {
    /// Settings for one replica without leader election, probes on a free loopback port.
    pub fn single(default_retain_for: Duration) -> Settings {
        Settings {
            defaults: Defaults {
                retain_for: default_retain_for,
                placement: optin::Mode::Preferred,
                max_retain_for: RetainFor::MAX,
            },
            node_budget: None,
            namespace: None,
            pod_selector: None,
            namespace_selector: None,
            metrics_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            lease: None,
            workers: 4,
            events: Policy::default(),
            webhook: None,
        }
    }
}

/// Errors that stop the controller.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// Logging could not be set up.
    #[error(transparent)]
    Logging(#[from] logging::LoggingError),
    /// The default retention is longer than the maximum.
    #[error(
        "failed to start: --default-retain-for {default} is longer than --max-retain-for {max}"
    )]
    DefaultAboveMax {
        /// `--default-retain-for`.
        default: RetainFor,
        /// `--max-retain-for`.
        max: RetainFor,
    },
    /// The async runtime could not start.
    #[error("failed to start the async runtime")]
    Runtime(#[source] std::io::Error),
    /// No Kubernetes client configuration was found.
    #[error("failed to build a Kubernetes client (in-cluster config or KUBECONFIG)")]
    Client(#[source] kube::Error),
    /// Metrics could not be registered.
    #[error(transparent)]
    Metrics(#[from] metrics::MetricsError),
    /// The probe server could not bind.
    #[error(transparent)]
    Probes(#[from] crate::probes::ProbeError),
    /// The placement webhook could not be served.
    #[error(transparent)]
    Webhook(#[from] webhook::WebhookError),
    /// The lease could not be set up.
    #[error("failed to set up leader election on Lease {namespace}/{name}")]
    Lease {
        /// Lease namespace.
        namespace: String,
        /// Lease name.
        name: String,
        /// What failed.
        #[source]
        source: kube_lease_manager::LeaseManagerError,
    },
    /// Another replica took the lease: this one stops so that it never reconciles beside it.
    #[error(
        "failed to keep the leader lease: another replica holds it now; exiting to restart as a standby"
    )]
    LostLease,
    /// A cache's writer went away before the cache was filled.
    #[error("failed to fill the {0} cache: its watch ended")]
    CacheNeverReady(&'static str),
}

/// Runs `ipkeep-operator controller` until SIGTERM/SIGINT.
pub fn main(args: Args) -> anyhow::Result<()> {
    // Before any thread exists; returns only when it did not start the process again.
    let arena = malloc::one_arena();
    logging::init(&args.log)?;
    if let Err(e) = arena {
        tracing::warn!(error = %e, "failed to start again with one malloc arena; running with glibc's default arenas");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(ControllerError::Runtime)?;
    runtime.block_on(async move {
        let client = Client::try_default()
            .await
            .map_err(ControllerError::Client)?;
        let identity = args.identity.clone().unwrap_or_else(default_identity);
        if args.default_retain_for.duration() > args.max_retain_for.duration() {
            return Err(ControllerError::DefaultAboveMax {
                default: args.default_retain_for,
                max: args.max_retain_for,
            }
            .into());
        }
        // Before anything reads or writes a reservation: the CRD follows the release.
        crate::crd_apply::ensure(client.clone()).await?;
        let settings = Settings {
            defaults: Defaults {
                retain_for: args.default_retain_for.duration(),
                placement: args.default_placement,
                max_retain_for: args.max_retain_for,
            },
            node_budget: args.node_budget,
            namespace: args.namespace.clone(),
            pod_selector: args.pod_selector.clone(),
            // An empty selector selects every namespace: as unset, nothing to watch.
            namespace_selector: args.namespace_selector.clone().filter(|s| !s.selects_all()),
            metrics_addr: args.metrics_addr,
            lease: args.leader_elect.then(|| LeaseSettings {
                name: args.lease_name.clone(),
                namespace: args.lease_namespace.clone(),
                identity,
                duration_secs: args.lease_duration,
            }),
            workers: usize::from(args.workers),
            events: Policy {
                normal: args.normal_events,
            },
            webhook: args.webhook_addr.map(|addr| WebhookSettings {
                addr,
                tls: match &args.webhook_cert_dir {
                    Some(dir) => webhook_tls::TlsSource::Files(dir.clone()),
                    None => webhook_tls::TlsSource::Managed {
                        namespace: args.lease_namespace.clone(),
                        secret: args.webhook_secret.clone(),
                        configuration: Some(args.webhook_configuration.clone())
                            .filter(|c| !c.is_empty()),
                        dns_names: webhook_tls::service_dns_names(
                            &args.webhook_service,
                            &args.lease_namespace,
                        ),
                    },
                },
            }),
        };
        run(client, settings, crate::shutdown::signal(), |_| {}).await?;
        Ok(())
    })
}

fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "ipkeep-controller".into());
    format!("{host}-{}", std::process::id())
}

/// The work queue's front: one scheduler (names and the instant each is due, a name scheduled
/// once at its earliest), fed only while this replica leads; [`work`] drains it into the
/// [`WorkQueue`] the workers take from.
#[derive(Debug, Default)]
struct Queue {
    scheduler: RwLock<Option<mpsc::UnboundedSender<ScheduleRequest<Arc<Key>>>>>,
}

impl Queue {
    /// Schedules `key` (one allocation of it, shared by the scheduler's two entries and the work
    /// queue's: at start-up every name is queued at once).
    fn enqueue_at(&self, key: impl Into<Arc<Key>>, run_at: Instant) {
        let scheduler = self.scheduler.read().unwrap_or_else(|e| e.into_inner());
        if let Some(scheduler) = scheduler.as_ref() {
            // A closed scheduler means the controller is stopping; nothing is lost that a restart
            // does not redo.
            let _ = scheduler.unbounded_send(ScheduleRequest {
                message: key.into(),
                run_at,
            });
        }
    }

    fn enqueue(&self, key: impl Into<Arc<Key>>) {
        self.enqueue_at(key, Instant::now());
    }

    fn active(&self) -> bool {
        self.scheduler
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// No reconcile may start from here on.
    fn close(&self) {
        *self.scheduler.write().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// Information a test gets once the controller runs.
#[derive(Debug, Clone)]
pub struct Started {
    /// Where /metrics, /healthz and /readyz are served.
    pub probe_addr: Option<SocketAddr>,
    /// Where the placement webhook is served, when it is.
    pub webhook_addr: Option<SocketAddr>,
}

/// How long a stopping controller keeps posting the Events still queued (a Pod's default grace
/// period is 30 s; the lease is released before this).
const EVENT_FLUSH: Duration = Duration::from_secs(5);

/// Runs the controller with `client` until `shutdown` completes; `on_start` is told the probe
/// address once bound.
pub async fn run(
    client: Client,
    settings: Settings,
    shutdown: impl Future<Output = ()>,
    on_start: impl FnOnce(Started),
) -> Result<(), ControllerError> {
    let registry = Registry::new();
    let readiness = Arc::new(Readiness::default());
    let (pods, pod_writer) = reflector::store::<CachedPod>();
    let (reservations, reservation_writer) = reflector::store::<CachedReservation>();
    let (statefulsets, sts_writer) = reflector::store::<PartialObjectMeta<StatefulSet>>();
    let (nodes, node_writer) = reflector::store::<Node>();
    let (namespace_store, namespace_writer) = reflector::store::<PartialObjectMeta<Namespace>>();
    let metrics = Metrics::register(
        &registry,
        reservations.clone(),
        nodes.clone(),
        settings.node_budget,
    )?;
    let identity = settings
        .lease
        .as_ref()
        .map_or_else(default_identity, |l| l.identity.clone());
    let (events, drain) = Publisher::start(
        client.clone(),
        reconcile::FIELD_MANAGER,
        &identity,
        settings.events,
        Some(metrics.events_dropped.clone()),
    );
    let ctx = Arc::new(Context {
        client: client.clone(),
        pods: pods.clone(),
        reservations: reservations.clone(),
        statefulsets: statefulsets.clone(),
        nodes: nodes.clone(),
        index: AddressIndex::default(),
        expectations: Expectations::default(),
        fresh: fresh::FreshPods::default(),
        events,
        metrics: metrics.clone(),
        defaults: settings.defaults.clone(),
        node_budget: settings.node_budget,
        over_quota: reconcile::OverQuota::default(),
        namespaces: settings
            .namespace_selector
            .clone()
            .map(|selector| SelectedNamespaces {
                selector,
                store: namespace_store,
            }),
        told: namespaces::Told::default(),
    });
    let queue = Arc::new(Queue::default());

    let webhook = match &settings.webhook {
        Some(w) => {
            let slot = Arc::new(webhook::CertSlot::default());
            let server = webhook::WebhookServer::bind(w.addr, slot.clone()).await?;
            let webhook_metrics =
                webhook::WebhookMetrics::register(&registry).map_err(metrics::MetricsError)?;
            readiness.require(slot.clone());
            Some((server, slot, webhook_metrics, w.tls.clone()))
        }
        None => None,
    };
    let probes = ProbeServer::bind(settings.metrics_addr, registry, readiness.clone()).await?;
    on_start(Started {
        probe_addr: probes.local_addr(),
        webhook_addr: webhook.as_ref().and_then(|(s, ..)| s.local_addr()),
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = JoinSet::new();
    if let Some((server, slot, webhook_metrics, tls)) = webhook {
        let caches = webhook::Caches {
            reservations: reservations.clone(),
            statefulsets: statefulsets.clone(),
            nodes: nodes.clone(),
            default_mode: settings.defaults.placement,
        };
        tasks.spawn(server.run(caches, webhook_metrics, stopped(stop_rx.clone())));
        tasks.spawn(webhook_tls::keep(
            client.clone(),
            tls,
            slot,
            stopped(stop_rx.clone()),
        ));
    }
    {
        let mut stop = stop_rx.clone();
        tasks.spawn(probes.run(async move {
            let _ = stop.wait_for(|s| *s).await;
        }));
    }
    let pod_api: Api<Pod> = scoped(&client, settings.namespace.as_deref());
    let mut pod_cfg = watcher::Config::default();
    if let Some(selector) = &settings.pod_selector {
        pod_cfg = pod_cfg.labels(selector);
    }
    tasks.spawn(watch_pods(
        pod_api,
        pod_cfg,
        pod_writer,
        ctx.clone(),
        queue.clone(),
    ));
    tasks.spawn(watch_reservations(
        scoped(&client, settings.namespace.as_deref()),
        reservation_writer,
        ctx.clone(),
        queue.clone(),
    ));
    tasks.spawn(watch_statefulsets(
        scoped(&client, settings.namespace.as_deref()),
        sts_writer,
        ctx.clone(),
        queue.clone(),
    ));
    tasks.spawn(watch_nodes(
        Api::all(client.clone()),
        node_writer,
        ctx.clone(),
        queue.clone(),
    ));
    if let Some(selected) = &ctx.namespaces {
        tasks.spawn(watch_namespaces(
            Api::all(client.clone()),
            selected.selector.clone(),
            namespace_writer,
            ctx.clone(),
            queue.clone(),
        ));
    }

    let result = {
        let leading = lead(
            client,
            &settings,
            ctx.clone(),
            queue.clone(),
            readiness.clone(),
            stop_rx.clone(),
        );
        tokio::pin!(leading);
        tokio::pin!(shutdown);
        tokio::select! {
            () = &mut shutdown => {
                // Let the leader finish its reconciles' writes, stop, and release the lease.
                let _ = stop_tx.send(true);
                leading.await
            }
            r = &mut leading => r,
        }
    };
    readiness.set(false);
    metrics.leader.set(0);
    queue.close();
    let _ = stop_tx.send(true);
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    let flushed = drain.flush(EVENT_FLUSH).await;
    tracing::debug!(
        posted = flushed.posted,
        unsent = flushed.unsent,
        "Events flushed"
    );
    result
}

fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Completes once `stop` turns true (or its sender is gone).
async fn stopped(mut stop: tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Waits for the caches, then for the lease; runs the workers while leading. Returns `Ok` when
/// `stop` turns true (after releasing the lease) and an error otherwise (losing the lease is one).
async fn lead(
    client: Client,
    settings: &Settings,
    ctx: Arc<Context>,
    queue: Arc<Queue>,
    readiness: Arc<Readiness>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(), ControllerError> {
    let caches = async {
        ctx.pods
            .wait_until_ready()
            .await
            .map_err(|_| ControllerError::CacheNeverReady("pod"))?;
        ctx.reservations
            .wait_until_ready()
            .await
            .map_err(|_| ControllerError::CacheNeverReady("IPReservation"))?;
        ctx.statefulsets
            .wait_until_ready()
            .await
            .map_err(|_| ControllerError::CacheNeverReady("StatefulSet"))?;
        ctx.nodes
            .wait_until_ready()
            .await
            .map_err(|_| ControllerError::CacheNeverReady("node"))?;
        if let Some(selected) = &ctx.namespaces {
            selected
                .store
                .wait_until_ready()
                .await
                .map_err(|_| ControllerError::CacheNeverReady("Namespace"))?;
        }
        Ok::<(), ControllerError>(())
    };
    tokio::select! {
        r = caches => r?,
        () = stopped(stop.clone()) => return Ok(()),
    }
    readiness.set(true);
    tracing::info!(
        pods = ctx.pods.len(),
        reservations = ctx.reservations.len(),
        "caches filled"
    );

    let Some(lease) = &settings.lease else {
        ctx.metrics.leader.set(1);
        return tokio::select! {
            r = work(settings.workers, ctx, queue) => r,
            () = stopped(stop) => Ok(()),
        };
    };
    let lease_err = |source| ControllerError::Lease {
        namespace: lease.namespace.clone(),
        name: lease.name.clone(),
        source,
    };
    let grace = (lease.duration_secs / 3).max(1);
    let manager = kube_lease_manager::LeaseManagerBuilder::new(client, &lease.name)
        .with_namespace(&lease.namespace)
        .with_identity(&lease.identity)
        .with_duration(lease.duration_secs)
        .with_grace(grace)
        // One field manager per replica, as the lease library expects: a replica's apply of
        // `holderIdentity` then conflicts (409) with another replica's, so two replicas racing for
        // a free lease can never both believe they hold it.
        .with_field_manager(format!("ipkeep-controller-lease-{}", lease.identity))
        .build()
        .await
        .map_err(lease_err)?;
    let (mut leading, handle) = manager.watch().await;
    let released = ReleaseOnDrop(Some(handle));
    tracing::info!(identity = %lease.identity, lease = %lease.name, "waiting for the leader lease");
    let became_leader = tokio::select! {
        r = leading.wait_for(|l| *l) => r.is_ok(),
        () = stopped(stop.clone()) => false,
    };
    if !became_leader {
        drop(leading);
        released.release().await;
        return if *stop.borrow() {
            Ok(())
        } else {
            Err(ControllerError::LostLease)
        };
    }
    tracing::info!(identity = %lease.identity, "leading: reconciling");
    ctx.metrics.leader.set(1);
    let result = tokio::select! {
        r = work(settings.workers, ctx.clone(), queue.clone()) => r,
        _ = leading.wait_for(|l| !*l) => Err(ControllerError::LostLease),
        () = stopped(stop) => Ok(()),
    };
    // No reconcile may run once the lease is given up.
    queue.close();
    ctx.metrics.leader.set(0);
    drop(leading);
    released.release().await;
    result
}

/// Awaits the lease manager's task after its channel closed (it releases the lease then); if the
/// future owning it is dropped instead, the task still releases it in the background.
struct ReleaseOnDrop(
    Option<
        tokio::task::JoinHandle<
            Result<kube_lease_manager::LeaseManager, kube_lease_manager::LeaseManagerError>,
        >,
    >,
);

impl ReleaseOnDrop {
    async fn release(mut self) {
        if let Some(handle) = self.0.take() {
            match tokio::time::timeout(Duration::from_secs(5), handle).await {
                Ok(Ok(Ok(_))) => tracing::info!("leader lease released"),
                Ok(Ok(Err(e))) => tracing::warn!(error = %e, "failed to release the leader lease"),
                Ok(Err(e)) => tracing::warn!(error = %e, "the lease task failed"),
                Err(_) => tracing::warn!("gave up waiting 5 s for the lease release"),
            }
        }
    }
}

impl std::fmt::Debug for ReleaseOnDrop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReleaseOnDrop")
    }
}

/// Runs the scheduler and the workers; never returns on its own.
async fn work(workers: usize, ctx: Arc<Context>, queue: Arc<Queue>) -> Result<(), ControllerError> {
    let (tx, rx) = mpsc::unbounded();
    *queue.scheduler.write().unwrap_or_else(|e| e.into_inner()) = Some(tx);
    enqueue_everything(&ctx, &queue);
    let ready = Arc::new(Ready::default());
    let feed = {
        let ready = ready.clone();
        async move {
            let mut due = std::pin::pin!(scheduler(rx));
            while let Some(key) = due.next().await {
                ready.add(key);
            }
        }
    };
    let failures = Arc::new(std::sync::Mutex::new(HashMap::new()));
    let workers = (0..workers.max(1))
        .map(|_| worker(ready.clone(), failures.clone(), ctx.clone(), queue.clone()));
    futures::future::join(feed, futures::future::join_all(workers)).await;
    Ok(())
}

/// The [`WorkQueue`] the workers share, and the wake-up of an idle one.
#[derive(Debug, Default)]
struct Ready {
    names: std::sync::Mutex<WorkQueue<Arc<Key>>>,
    added: tokio::sync::Notify,
}

impl Ready {
    fn names(&self) -> std::sync::MutexGuard<'_, WorkQueue<Arc<Key>>> {
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add(&self, key: Arc<Key>) {
        if self.names().add(key) {
            self.added.notify_one();
        }
    }

    /// The next name no other worker is reconciling; waits for one.
    async fn take(&self) -> Arc<Key> {
        loop {
            if let Some(key) = self.names().take() {
                return key;
            }
            // A name added since the look above left a permit: this returns at once.
            self.added.notified().await;
        }
    }

    fn done(&self, key: &Arc<Key>) {
        if self.names().done(key) {
            self.added.notify_one();
        }
    }
}

/// Consecutive failures per name, for the backoff.
type Failures = Arc<std::sync::Mutex<HashMap<Key, u32>>>;

async fn worker(ready: Arc<Ready>, failures: Failures, ctx: Arc<Context>, queue: Arc<Queue>) {
    loop {
        let key = ready.take().await;
        let started = std::time::Instant::now();
        let result = reconcile::reconcile(&key, &ctx).await;
        ctx.metrics
            .reconcile_duration
            .observe(started.elapsed().as_secs_f64());
        let mut failed = failures.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Ok(next) => {
                failed.remove(&*key);
                match next {
                    Next::AwaitChange => {}
                    Next::At(t) => {
                        let wait = t.duration_since(Timestamp::now());
                        let wait = Duration::try_from(wait).unwrap_or(Duration::ZERO);
                        queue.enqueue_at(key.clone(), Instant::now() + wait);
                    }
                    Next::RetryMs(ms) => {
                        queue.enqueue_at(key.clone(), Instant::now() + Duration::from_millis(ms));
                    }
                }
            }
            Err(e) => {
                let n = failed.entry(Key::clone(&key)).or_insert(0);
                *n = n.saturating_add(1);
                let delay = Backoff::RECONCILE.delay(*n);
                ctx.metrics
                    .reconcile_errors
                    .with_label_values(&[e.kind()])
                    .inc();
                tracing::warn!(%key, error = %error_chain(&e), retry_in_ms = delay.as_millis() as u64, "reconcile failed");
                queue.enqueue_at(key.clone(), Instant::now() + delay);
            }
        }
        drop(failed);
        ready.done(&key);
    }
}

fn enqueue_everything(ctx: &Context, queue: &Queue) {
    if !queue.active() {
        return;
    }
    for p in ctx.pods.state() {
        queue.enqueue(p.key());
    }
    for r in ctx.reservations.state() {
        queue.enqueue(r.key());
    }
}

async fn watch_pods(
    api: Api<Pod>,
    cfg: watcher::Config,
    writer: reflector::store::Writer<CachedPod>,
    ctx: Arc<Context>,
    queue: Arc<Queue>,
) {
    let mut events = std::pin::pin!(reflector(
        writer,
        watcher(api, cfg)
            .default_backoff()
            .map_ok(|e| cache::projected(e, CachedPod::project)),
    ));
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(p) | watcher::Event::Delete(p)) => queue.enqueue(p.key()),
            // After a (re)list, pods deleted during a gap left the cache without a Delete event:
            // look at every name again.
            Ok(watcher::Event::InitDone) => enqueue_everything(&ctx, &queue),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "pod watch failed; retrying with backoff"),
        }
    }
}

async fn watch_reservations(
    api: Api<IPReservation>,
    writer: reflector::store::Writer<CachedReservation>,
    ctx: Arc<Context>,
    queue: Arc<Queue>,
) {
    let mut events = std::pin::pin!(reflector(
        writer,
        watcher(api, watcher::Config::default())
            .default_backoff()
            .map_ok(|e| cache::projected(e, CachedReservation::project)),
    ));
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(r)) => {
                let key = r.key();
                ctx.expectations.observed(&key, r.resource_version());
                for other in ctx.index.upsert(key.clone(), &r.view) {
                    queue.enqueue(other);
                }
                // One more held address on its node may push others over the node's budget.
                if r.view.status.phase == Some(crate::api::Phase::Released) {
                    for other in reconcile::node_yielding(&ctx, &r.view.node_name).yielded {
                        queue.enqueue(other);
                    }
                }
                queue.enqueue(key);
            }
            Ok(watcher::Event::Delete(r)) => {
                let key = r.key();
                ctx.expectations.observed(&key, None);
                // Room under the namespace's ResourceQuota.
                for waiting in ctx.over_quota.take(&key.namespace) {
                    queue.enqueue(waiting);
                }
                for other in ctx.index.remove(&key) {
                    queue.enqueue(other);
                }
                queue.enqueue(key);
            }
            Ok(watcher::Event::InitDone) => {
                ctx.expectations.clear();
                let all = ctx.reservations.state();
                ctx.index.rebuild(all.iter().map(|r| (r.key(), &r.view)));
                enqueue_everything(&ctx, &queue);
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "IPReservation watch failed; retrying with backoff")
            }
        }
    }
}

async fn watch_statefulsets(
    api: Api<PartialObjectMeta<StatefulSet>>,
    writer: reflector::store::Writer<PartialObjectMeta<StatefulSet>>,
    ctx: Arc<Context>,
    queue: Arc<Queue>,
) {
    let mut events = std::pin::pin!(
        watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(view::trim_statefulset)
            .reflect(writer)
    );
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(s) | watcher::Event::Delete(s)) => {
                let (ns, name) = (s.namespace().unwrap_or_default(), s.name_any());
                for p in ctx.pods.state() {
                    if p.namespace() == ns && p.owner_statefulset() == Some(name.as_str()) {
                        queue.enqueue(p.key());
                    }
                }
                for r in ctx.reservations.state() {
                    if r.namespace() == ns
                        && r.view.owner_statefulset.as_deref() == Some(name.as_str())
                    {
                        queue.enqueue(r.key());
                    }
                }
            }
            Ok(watcher::Event::InitDone) => enqueue_everything(&ctx, &queue),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "StatefulSet watch failed; retrying with backoff"),
        }
    }
}

async fn watch_nodes(
    api: Api<Node>,
    writer: reflector::store::Writer<Node>,
    ctx: Arc<Context>,
    queue: Arc<Queue>,
) {
    let mut events = std::pin::pin!(
        watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(view::trim_node)
            .reflect(writer)
    );
    while let Some(event) = events.next().await {
        match event {
            // A deleted node's reservations are released (nothing can be honoured there).
            Ok(watcher::Event::Delete(n)) => {
                let name = n.name_any();
                for r in ctx.reservations.state() {
                    if r.view.node_name == name {
                        queue.enqueue(r.key());
                    }
                }
            }
            // Its budget may have shrunk (annotation, pod CIDRs, allocatable pods).
            Ok(watcher::Event::Apply(n)) => {
                for other in reconcile::node_yielding(&ctx, &n.name_any()).yielded {
                    queue.enqueue(other);
                }
            }
            Ok(watcher::Event::InitDone) => enqueue_everything(&ctx, &queue),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "node watch failed; retrying with backoff"),
        }
    }
}

/// Every Namespace's labels, matched here against `--namespace-selector` (run only when it is
/// set). Not a watch filtered by the selector on the API server: a namespace relabelled out of it
/// would arrive as a deletion, and one not in the cache could be either not selected or not seen
/// yet (a pod created right after its namespace would be told `NotReserved` wrongly). Watching
/// them all, as metadata, costs little (a cluster has far fewer namespaces than pods), keeps the
/// two apart ([`namespaces::Verdict::NotSeen`]) and shows a relabelling as the change it is.
async fn watch_namespaces(
    api: Api<PartialObjectMeta<Namespace>>,
    selector: NamespaceSelector,
    writer: reflector::store::Writer<PartialObjectMeta<Namespace>>,
    ctx: Arc<Context>,
    queue: Arc<Queue>,
) {
    let mut verdicts = Verdicts::default();
    let mut events = std::pin::pin!(
        watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(view::trim_namespace)
            .reflect(writer)
    );
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(n)) => {
                let name = n.name_any();
                if verdicts.update(&name, selected(&selector, &n)) {
                    enqueue_namespace(&ctx, &queue, &name);
                }
            }
            // A (re)list: InitDone looks at every name.
            Ok(watcher::Event::Init) => verdicts = Verdicts::default(),
            Ok(watcher::Event::InitApply(n)) => {
                verdicts.update(&n.name_any(), selected(&selector, &n));
            }
            Ok(watcher::Event::Delete(n)) => verdicts.forget(&n.name_any()),
            Ok(watcher::Event::InitDone) => enqueue_everything(&ctx, &queue),
            Err(e) => tracing::warn!(error = %e, "Namespace watch failed; retrying with backoff"),
        }
    }
}

fn selected(selector: &NamespaceSelector, n: &PartialObjectMeta<Namespace>) -> bool {
    match &n.metadata.labels {
        Some(labels) => selector.matches(labels),
        None => selector.matches(&std::collections::BTreeMap::new()),
    }
}

/// Enqueues every name of `namespace` the caches hold (its pods' and its reservations').
fn enqueue_namespace(ctx: &Context, queue: &Queue, namespace: &str) {
    if !queue.active() {
        return;
    }
    let pods = ctx.pods.state();
    let reservations = ctx.reservations.state();
    let keys = pods
        .iter()
        .map(|p| p.key())
        .chain(reservations.iter().map(|r| r.key()));
    for key in keys.filter(|k| k.namespace == namespace) {
        queue.enqueue(key);
    }
}
