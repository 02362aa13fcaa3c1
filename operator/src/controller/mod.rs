//! The controller (`ipkeep-operator controller`): keeps each annotated pod's IPReservation in step
//! with the pod and deletes reservations at their release time.
//!
//! Shape: four watches (pods and reservations projected to what decisions read, StatefulSets'
//! metadata, nodes' pod CIDRs) fill caches and enqueue the pod names they touch; a scheduler holds
//! each name until it is due (a reservation's release time is a scheduled run), and the workers
//! take due names from one work queue ([`crate::runtime::queue`]) that never hands out a name being reconciled, so one name
//! is never reconciled twice at once and no worker idles while names wait. Only the leader runs
//! the workers; a standby keeps its caches warm and takes over when the lease is free. A failed
//! reconcile is tried again after its error policy's delay (kube's `error_policy`).
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

mod args;
pub mod cache;
mod error;
pub mod fresh;
pub mod index;
pub mod metrics;
pub mod placement;
pub mod reconcile;
pub mod view;
mod watches;
pub mod webhook;
pub mod webhook_tls;

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use kube::Client;
use prometheus::Registry;
use tokio::{sync::watch, task::JoinSet};

pub use self::{
    args::{Args, Settings, WebhookSettings},
    error::ControllerError,
};
use self::{metrics::Metrics, reconcile::Context, watches::Caches};
use crate::{
    api::PodKey,
    runtime::{
        events::Publisher,
        leader, logging,
        probes::{ProbeServer, Readiness},
        queue::{self, Queue},
        shutdown::{self, stopped},
    },
};

/// Runs `ipkeep-operator controller` until SIGTERM/SIGINT. glibc's malloc arenas are held to one
/// by `MALLOC_ARENA_MAX=1` in the Deployment (the chart), not here.
pub fn main(args: Args) -> anyhow::Result<()> {
    logging::init(&args.log)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(ControllerError::Runtime)?;
    runtime.block_on(async move {
        let client = Client::try_default()
            .await
            .map_err(ControllerError::Client)?;
        let identity = args.identity.clone().unwrap_or_else(args::default_identity);
        if args.default_retain_for.duration() > args.max_retain_for.duration() {
            return Err(ControllerError::DefaultAboveMax {
                default: args.default_retain_for,
                max: args.max_retain_for,
            }
            .into());
        }
        // Before anything reads or writes a reservation: the CRD follows the release.
        crate::crd_apply::ensure(client.clone()).await?;
        let settings = Settings::from_args(&args, identity);
        run(client, settings, shutdown::signal(), |_| {}).await?;
        Ok(())
    })
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
/// address once bound. The wiring, top to bottom: caches and metrics, the reconciles' context,
/// the webhook, the probes, the watches, then leading (waiting for the caches and the lease).
pub async fn run(
    client: Client,
    settings: Settings,
    shutdown: impl Future<Output = ()>,
    on_start: impl FnOnce(Started),
) -> Result<(), ControllerError> {
    let registry = Registry::new();
    let readiness = Arc::new(Readiness::default());
    let (caches, writers) = watches::caches();
    let metrics = Metrics::register(
        &registry,
        caches.reservations.clone(),
        caches.nodes.clone(),
        settings.node_budget,
    )?;
    let identity = settings
        .lease
        .as_ref()
        .map_or_else(args::default_identity, |l| l.identity.clone());
    let (events, drain) = Publisher::start(
        client.clone(),
        reconcile::FIELD_MANAGER,
        &identity,
        settings.events,
        Some(metrics.events_dropped.clone()),
    );
    let ctx = Arc::new(Context::new(
        client.clone(),
        &caches,
        events,
        metrics.clone(),
        &settings,
    ));
    let queue = Arc::new(Queue::<PodKey>::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let webhook = match &settings.webhook {
        Some(w) => {
            Some(webhook::Serving::bind(w, &caches, &settings, &registry, &readiness).await?)
        }
        None => None,
    };
    let probes = ProbeServer::bind(settings.metrics_addr, registry, readiness.clone()).await?;
    on_start(Started {
        probe_addr: probes.local_addr(),
        webhook_addr: webhook.as_ref().and_then(|w| w.local_addr()),
    });
    if let Some(webhook) = webhook {
        webhook.spawn(&mut tasks, &client, &stop_rx);
    }
    tasks.spawn(probes.run(stopped(stop_rx.clone())));
    watches::spawn(&mut tasks, &client, &settings, writers, &ctx, &queue);

    let result = {
        let leading = lead(
            client,
            &settings,
            &caches,
            &ctx,
            &queue,
            &readiness,
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

/// Waits for the caches, then for the lease; runs the workers while leading. Returns `Ok` when
/// `stop` turns true (after releasing the lease) and an error otherwise (losing the lease is one).
async fn lead(
    client: Client,
    settings: &Settings,
    caches: &Caches,
    ctx: &Arc<Context>,
    queue: &Queue<PodKey>,
    readiness: &Readiness,
    stop: watch::Receiver<bool>,
) -> Result<(), ControllerError> {
    tokio::select! {
        r = watches::filled(caches, ctx.namespaces.is_some()) => r?,
        () = stopped(stop.clone()) => return Ok(()),
    }
    readiness.set(true);
    tracing::info!(
        pods = ctx.pods.len(),
        reservations = ctx.reservations.len(),
        "caches filled"
    );
    let work = async {
        queue::work(
            queue,
            settings.workers,
            || watches::enqueue_everything(ctx, queue),
            |key| reconcile::turn(key, ctx.clone()),
            |key, e, failures| reconcile::error_policy(&ctx.metrics, key, e, failures),
        )
        .await;
        Ok(())
    };
    match &settings.lease {
        Some(lease) => {
            let gauge = &ctx.metrics.leader;
            leader::lead(client, lease, stop, gauge, || queue.close(), work).await
        }
        None => {
            ctx.metrics.leader.set(1);
            tokio::select! {
                r = work => r,
                () = stopped(stop) => Ok(()),
            }
        }
    }
}
