//! The controller's watches: each fills its cache (kube's reflector store, objects projected to
//! what decisions read) and enqueues the names an event touches.

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::{
    apps::v1::StatefulSet,
    core::v1::{Namespace, Node, Pod},
};
use kube::{
    Api, Client, ResourceExt,
    core::PartialObjectMeta,
    runtime::{
        WatchStreamExt,
        reflector::{self, Store, reflector, store::Writer},
        watcher,
    },
};
use tokio::task::JoinSet;

use super::{
    ControllerError, Settings,
    cache::{self, CachedPod, CachedReservation},
    reconcile::{self, Context},
    view,
};
use crate::{
    api::{IPReservation, Phase, PodKey},
    rules::namespaces::{NamespaceSelector, Verdicts},
    runtime::queue::Queue,
};

/// The caches the watches fill, as the reconciles and the webhook read them.
#[derive(Clone)]
pub(super) struct Caches {
    pub pods: Store<CachedPod>,
    pub reservations: Store<CachedReservation>,
    pub statefulsets: Store<PartialObjectMeta<StatefulSet>>,
    pub nodes: Store<Node>,
    pub namespaces: Store<PartialObjectMeta<Namespace>>,
}

/// The writing ends of [`Caches`], one per watch.
pub(super) struct Writers {
    pods: Writer<CachedPod>,
    reservations: Writer<CachedReservation>,
    statefulsets: Writer<PartialObjectMeta<StatefulSet>>,
    nodes: Writer<Node>,
    namespaces: Writer<PartialObjectMeta<Namespace>>,
}

/// Empty caches and their writers.
pub(super) fn caches() -> (Caches, Writers) {
    let (pods, pod_writer) = reflector::store();
    let (reservations, reservation_writer) = reflector::store();
    let (statefulsets, sts_writer) = reflector::store();
    let (nodes, node_writer) = reflector::store();
    let (namespaces, namespace_writer) = reflector::store();
    let caches = Caches {
        pods,
        reservations,
        statefulsets,
        nodes,
        namespaces,
    };
    let writers = Writers {
        pods: pod_writer,
        reservations: reservation_writer,
        statefulsets: sts_writer,
        nodes: node_writer,
        namespaces: namespace_writer,
    };
    (caches, writers)
}

/// Spawns every watch on `tasks`: pods (of `--namespace`, matching `--pod-selector`),
/// reservations and StatefulSets (of `--namespace`), nodes, and Namespaces when
/// `--namespace-selector` is set.
pub(super) fn spawn(
    tasks: &mut JoinSet<()>,
    client: &Client,
    settings: &Settings,
    writers: Writers,
    ctx: &Arc<Context>,
    queue: &Arc<Queue<PodKey>>,
) {
    let namespace = settings.namespace.as_deref();
    let mut pod_cfg = watcher::Config::default();
    if let Some(selector) = &settings.pod_selector {
        pod_cfg = pod_cfg.labels(selector);
    }
    tasks.spawn(watch_pods(
        scoped(client, namespace),
        pod_cfg,
        writers.pods,
        ctx.clone(),
        queue.clone(),
    ));
    tasks.spawn(watch_reservations(
        scoped(client, namespace),
        writers.reservations,
        ctx.clone(),
        queue.clone(),
    ));
    tasks.spawn(watch_statefulsets(
        scoped(client, namespace),
        writers.statefulsets,
        ctx.clone(),
        queue.clone(),
    ));
    tasks.spawn(watch_nodes(
        Api::all(client.clone()),
        writers.nodes,
        ctx.clone(),
        queue.clone(),
    ));
    if let Some(selected) = &ctx.namespaces {
        tasks.spawn(watch_namespaces(
            Api::all(client.clone()),
            selected.selector.clone(),
            writers.namespaces,
            ctx.clone(),
            queue.clone(),
        ));
    }
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

/// Enqueues every name the pod and reservation caches hold (after a relist, or on taking the lead).
pub(super) fn enqueue_everything(ctx: &Context, queue: &Queue<PodKey>) {
    if !queue.active() {
        return;
    }
    for key in ctx.pods.state().iter().filter_map(|p| p.key()) {
        queue.enqueue(key);
    }
    for key in ctx.reservations.state().iter().filter_map(|r| r.key()) {
        queue.enqueue(key);
    }
}

async fn watch_pods(
    api: Api<Pod>,
    cfg: watcher::Config,
    writer: Writer<CachedPod>,
    ctx: Arc<Context>,
    queue: Arc<Queue<PodKey>>,
) {
    let mut events = std::pin::pin!(reflector(
        writer,
        watcher(api, cfg)
            .default_backoff()
            .map_ok(|e| cache::projected(e, CachedPod::project)),
    ));
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(p) | watcher::Event::Delete(p)) => {
                if let Some(key) = p.key() {
                    queue.enqueue(key);
                }
            }
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
    writer: Writer<CachedReservation>,
    ctx: Arc<Context>,
    queue: Arc<Queue<PodKey>>,
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
                let Some(key) = r.key() else { continue };
                ctx.expectations.observed(&key, r.resource_version());
                for other in ctx.index.upsert(key.clone(), &r.view) {
                    queue.enqueue(other);
                }
                // One more held address on its node may push others over the node's budget.
                if r.view.status.phase == Some(Phase::Released) {
                    for other in reconcile::node_yielding(&ctx, &r.view.node_name).yielded {
                        queue.enqueue(other);
                    }
                }
                queue.enqueue(key);
            }
            Ok(watcher::Event::Delete(r)) => {
                let Some(key) = r.key() else { continue };
                ctx.expectations.observed(&key, None);
                // Room under the namespace's ResourceQuota.
                for waiting in ctx.over_quota.take(key.namespace()) {
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
                ctx.index
                    .rebuild(all.iter().filter_map(|r| Some((r.key()?, &r.view))));
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
    writer: Writer<PartialObjectMeta<StatefulSet>>,
    ctx: Arc<Context>,
    queue: Arc<Queue<PodKey>>,
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
                    if p.namespace() == ns
                        && p.owner_statefulset() == Some(name.as_str())
                        && let Some(key) = p.key()
                    {
                        queue.enqueue(key);
                    }
                }
                for r in ctx.reservations.state() {
                    if r.namespace() == ns
                        && r.view.owner_statefulset.as_deref() == Some(name.as_str())
                        && let Some(key) = r.key()
                    {
                        queue.enqueue(key);
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
    writer: Writer<Node>,
    ctx: Arc<Context>,
    queue: Arc<Queue<PodKey>>,
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
                    if r.view.node_name == name
                        && let Some(key) = r.key()
                    {
                        queue.enqueue(key);
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
    writer: Writer<PartialObjectMeta<Namespace>>,
    ctx: Arc<Context>,
    queue: Arc<Queue<PodKey>>,
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
fn enqueue_namespace(ctx: &Context, queue: &Queue<PodKey>, namespace: &str) {
    if !queue.active() {
        return;
    }
    let pods = ctx.pods.state();
    let reservations = ctx.reservations.state();
    let keys = pods
        .iter()
        .filter_map(|p| p.key())
        .chain(reservations.iter().filter_map(|r| r.key()));
    for key in keys.filter(|k| k.namespace() == namespace) {
        queue.enqueue(key);
    }
}

/// Completes once every cache the watches fill has its first list (an error if a watch ended
/// before).
pub(super) async fn filled(caches: &Caches, namespaces: bool) -> Result<(), ControllerError> {
    let never = ControllerError::CacheNeverReady;
    caches
        .pods
        .wait_until_ready()
        .await
        .map_err(|_| never("pod"))?;
    caches
        .reservations
        .wait_until_ready()
        .await
        .map_err(|_| never("IPReservation"))?;
    caches
        .statefulsets
        .wait_until_ready()
        .await
        .map_err(|_| never("StatefulSet"))?;
    caches
        .nodes
        .wait_until_ready()
        .await
        .map_err(|_| never("node"))?;
    if namespaces {
        caches
            .namespaces
            .wait_until_ready()
            .await
            .map_err(|_| never("Namespace"))?;
    }
    Ok(())
}
