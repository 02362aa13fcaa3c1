//! One reconcile: read the caches, ask [`decide`], carry the plan out against the API server.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
    time::Duration,
};

use jiff::Timestamp;
use k8s_openapi::api::{
    apps::v1::StatefulSet,
    core::v1::{Namespace, Node, Pod},
};
use kube::{
    Api, Client, Resource,
    api::{DeleteParams, Patch, PatchParams, Preconditions},
    core::PartialObjectMeta,
    runtime::reflector::{ObjectRef, Store},
};
use serde_json::json;

use super::{
    cache::{CachedPod, CachedReservation},
    fresh::{FreshPods, Seen},
    index::AddressIndex,
    metrics::Metrics,
    view,
};
use crate::rules::{
    budget::{self, Budget, Held},
    lifecycle::{self, Defaults, DeleteReason, Input, OwnerState, Plan, Subject, Yield, decide},
    namespaces::{self, NamespaceSelector, Told},
    optin,
};
use crate::{
    api::PodKey,
    api::reason::EventReason,
    api::retention,
    api::{self, IPReservation},
    runtime::events::{EventType, Notice, Outcome, Publisher},
    runtime::expectations::Expectations,
    runtime::{backoff::Backoff, logging::error_chain},
};

/// The field manager of every write the controller makes (spec and status).
pub const FIELD_MANAGER: &str = "ipkeep-controller";

/// What a reconcile needs; shared by every worker.
pub struct Context {
    /// The API client (the pre-delete check and every write go through it).
    pub client: Client,
    /// Pods, projected (see [`CachedPod`]).
    pub pods: Store<CachedPod>,
    /// Every IPReservation in the watched scope, projected (see [`CachedReservation`]).
    pub reservations: Store<CachedReservation>,
    /// StatefulSets' metadata (their own ipkeep annotations).
    pub statefulsets: Store<PartialObjectMeta<StatefulSet>>,
    /// Nodes, trimmed to their labels and pod CIDRs.
    pub nodes: Store<Node>,
    /// Which reservations claim each node's addresses.
    pub index: AddressIndex,
    /// Queues Events (as `ipkeep-controller` from this replica) for their own task to post.
    pub events: Publisher,
    /// The controller's writes the reservation cache has not shown yet.
    pub expectations: Expectations,
    /// The fresh reads of pods that expiries of one namespace share.
    pub fresh: FreshPods,
    /// The controller's metrics.
    pub metrics: Metrics,
    /// Defaults from the flags.
    pub defaults: Defaults,
    /// `--node-budget`: every node's budget unless its annotation says.
    pub node_budget: Option<u64>,
    /// Pods whose reservation a ResourceQuota refused, by namespace: tried again when one of the
    /// namespace's reservations is deleted.
    pub over_quota: OverQuota,
    /// `--namespace-selector` and the Namespaces it is matched against; `None`: every namespace
    /// (and no Namespace is watched).
    pub namespaces: Option<SelectedNamespaces>,
    /// The pods told that their namespace is not selected.
    pub told: Told,
}

/// `--namespace-selector` and the cache of Namespaces (their labels) it is matched against.
#[derive(Debug, Clone)]
pub struct SelectedNamespaces {
    /// The selector.
    pub selector: NamespaceSelector,
    /// Every Namespace, trimmed to its labels.
    pub store: Store<PartialObjectMeta<Namespace>>,
}

/// The pods waiting for room under their namespace's ResourceQuota.
#[derive(Debug, Default)]
pub struct OverQuota(std::sync::Mutex<QuotaWaits>);

/// How long after a deletion in its namespace a refused pod is tried again every second: the
/// API server counts usage from the ResourceQuota's `status.used`, which kube-controller-manager
/// recomputes after the deletion, not at it (seen on the real control plane: the first retry,
/// made at the deletion, was refused again).
pub const QUOTA_CATCH_UP: std::time::Duration = std::time::Duration::from_secs(30);

/// [`OverQuota`]'s state: who waits for room, who was told, and when room last appeared.
#[derive(Debug, Default)]
pub struct QuotaWaits {
    /// Pods waiting, by namespace.
    waiting: HashMap<String, BTreeSet<PodKey>>,
    /// Pods already told (one `NotReserved` each) until they are reserved.
    told: BTreeSet<PodKey>,
    /// Pods tried again after a deletion in their namespace, and when it was.
    room: HashMap<PodKey, std::time::Instant>,
}

/// What to do with a pod whose reservation the quota refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaWait {
    /// The first refusal: tell the pod, then wait for a deletion in its namespace.
    Tell,
    /// Refused again soon after a deletion: the quota's usage is not recomputed yet; try again.
    CatchUp,
    /// Refused again later: wait for the next deletion, quietly.
    Wait,
}

impl QuotaWaits {
    /// A create for `key` was refused at `now`.
    pub fn refused(&mut self, key: &PodKey, now: std::time::Instant) -> QuotaWait {
        self.waiting
            .entry(key.namespace().to_owned())
            .or_default()
            .insert(key.clone());
        if let Some(since) = self.room.get(key) {
            if now.saturating_duration_since(*since) < QUOTA_CATCH_UP {
                return QuotaWait::CatchUp;
            }
            self.room.remove(key);
        }
        if self.told.insert(key.clone()) {
            QuotaWait::Tell
        } else {
            QuotaWait::Wait
        }
    }

    /// A reservation of `namespace` was deleted at `now`: the pods waiting there, to try again.
    pub fn room(&mut self, namespace: &str, now: std::time::Instant) -> Vec<PodKey> {
        let keys: Vec<PodKey> = self
            .waiting
            .remove(namespace)
            .map(|keys| keys.into_iter().collect())
            .unwrap_or_default();
        for k in &keys {
            self.room.insert(k.clone(), now);
        }
        keys
    }

    /// `key`'s reservation exists: nothing of it waits any more.
    pub fn reserved(&mut self, key: &PodKey) {
        if let Some(w) = self.waiting.get_mut(key.namespace()) {
            w.remove(key);
        }
        self.told.remove(key);
        self.room.remove(key);
    }
}

impl OverQuota {
    fn lock(&self) -> std::sync::MutexGuard<'_, QuotaWaits> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A create for `key` was refused by the quota.
    fn refused(&self, key: &PodKey) -> QuotaWait {
        self.lock().refused(key, std::time::Instant::now())
    }

    /// A reservation of `namespace` was deleted: the pods waiting there, to try again.
    pub fn take(&self, namespace: &str) -> Vec<PodKey> {
        self.lock().room(namespace, std::time::Instant::now())
    }

    /// `key`'s reservation was written.
    fn reserved(&self, key: &PodKey) {
        self.lock().reserved(key);
    }
}

/// Whether the API server refused a create because a ResourceQuota has no room for it (403
/// Forbidden, "exceeded quota"), the message to quote when it did.
pub fn quota_refusal(e: &kube::Error) -> Option<&str> {
    match e {
        kube::Error::Api(status)
            if status.code == 403 && status.message.contains("exceeded quota") =>
        {
            Some(status.message.as_str())
        }
        _ => None,
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("defaults", &self.defaults)
            .finish_non_exhaustive()
    }
}

/// Why a reconcile failed (it is retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// Writing the reservation's spec failed.
    #[error("failed to apply the spec of IPReservation {key}")]
    ApplySpec {
        /// The reservation.
        key: PodKey,
        /// kube's error.
        #[source]
        source: kube::Error,
    },
    /// Writing the reservation's status failed.
    #[error("failed to apply the status of IPReservation {key}")]
    ApplyStatus {
        /// The reservation.
        key: PodKey,
        /// kube's error.
        #[source]
        source: kube::Error,
    },
    /// Reading the pod from the API server before a delete failed.
    #[error("failed to read pod {key} from the API server before deleting its reservation")]
    RecheckPod {
        /// The pod.
        key: PodKey,
        /// kube's error.
        #[source]
        source: kube::Error,
    },
    /// Reading the reservation's node from the API server before a delete failed.
    #[error("failed to read node {node} from the API server before deleting its reservations")]
    RecheckNode {
        /// The node.
        node: String,
        /// kube's error.
        #[source]
        source: kube::Error,
    },
    /// Deleting the reservation failed.
    #[error("failed to delete IPReservation {key}")]
    Delete {
        /// The reservation.
        key: PodKey,
        /// kube's error.
        #[source]
        source: kube::Error,
    },
}

impl ReconcileError {
    /// A short label for the errors metric.
    pub fn kind(&self) -> &'static str {
        match self {
            ReconcileError::ApplySpec { .. } => "apply_spec",
            ReconcileError::ApplyStatus { .. } => "apply_status",
            ReconcileError::RecheckPod { .. } => "recheck_pod",
            ReconcileError::RecheckNode { .. } => "recheck_node",
            ReconcileError::Delete { .. } => "delete",
        }
    }
}

/// When to look at a key again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Only when something changes.
    AwaitChange,
    /// At this instant (a release time).
    At(Timestamp),
    /// Soon: a delete was held back or raced, or the cache has not shown this controller's last
    /// write yet; re-check after this many milliseconds (a change still enqueues it sooner).
    RetryMs(u64),
}

impl Context {
    /// The context of a controller run: its caches (filled by the watches), Events, metrics and
    /// settings; the index, expectations and bookkeeping start empty.
    pub(super) fn new(
        client: Client,
        caches: &super::watches::Caches,
        events: Publisher,
        metrics: Metrics,
        settings: &super::Settings,
    ) -> Context {
        Context {
            client,
            pods: caches.pods.clone(),
            reservations: caches.reservations.clone(),
            statefulsets: caches.statefulsets.clone(),
            nodes: caches.nodes.clone(),
            index: AddressIndex::default(),
            expectations: Expectations::default(),
            fresh: FreshPods::default(),
            events,
            metrics,
            defaults: settings.defaults.clone(),
            node_budget: settings.node_budget,
            over_quota: OverQuota::default(),
            namespaces: (settings.namespace_selector.clone()).map(|selector| SelectedNamespaces {
                selector,
                store: caches.namespaces.clone(),
            }),
            told: Told::default(),
        }
    }
}

/// One worker's turn on `key`: reconciles it, times it, and says when to look at it again
/// (`None`: only when a change enqueues it).
pub(super) async fn turn(
    key: Arc<PodKey>,
    ctx: Arc<Context>,
) -> Result<Option<Duration>, ReconcileError> {
    let started = std::time::Instant::now();
    let result = reconcile(&key, &ctx).await;
    ctx.metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    Ok(match result? {
        Next::AwaitChange => None,
        Next::At(t) => {
            Some(Duration::try_from(t.duration_since(Timestamp::now())).unwrap_or(Duration::ZERO))
        }
        Next::RetryMs(ms) => Some(Duration::from_millis(ms)),
    })
}

/// The error policy (kube-runtime's name): a failed reconcile is counted by its kind, logged, and
/// tried again after [`Backoff::RECONCILE`]'s delay for its `failures` in a row.
pub(super) fn error_policy(
    metrics: &Metrics,
    key: &PodKey,
    e: &ReconcileError,
    failures: u32,
) -> Duration {
    let delay = Backoff::RECONCILE.delay(failures);
    metrics
        .reconcile_errors
        .with_label_values(&[e.kind()])
        .inc();
    tracing::warn!(%key, error = %error_chain(e), retry_in_ms = delay.as_millis() as u64, "reconcile failed");
    delay
}

/// A node's budget and the Released reservations on it that must yield to it.
#[derive(Debug, Default)]
pub struct NodeYielding {
    /// The node's budget, when one applies.
    pub budget: Option<Budget>,
    /// The Released reservations holding its addresses.
    pub held: Vec<Held>,
    /// Those that yield, earliest first.
    pub yielded: Vec<PodKey>,
}

impl NodeYielding {
    /// Why `key` yields, if it does.
    pub fn of(&self, key: &PodKey) -> Option<Yield> {
        let budget = self.budget?;
        self.yielded.contains(key).then(|| {
            let yielded: Vec<&Held> = self
                .held
                .iter()
                .filter(|h| self.yielded.contains(&h.key))
                .collect();
            Yield {
                budget,
                held: self.held.len(),
                kept: budget::kept_latest(&self.held, &yielded).map(|h| h.key.clone()),
            }
        })
    }
}

/// Applies [`budget::yielding`] to `node` as the caches show it. A Released reservation whose pod
/// of that name is alive again (a replacement without addresses yet) is not counted: it is never
/// deleted while that pod lives.
pub fn node_yielding(ctx: &Context, node: &str) -> NodeYielding {
    let Some(budget) = ctx
        .nodes
        .get(&ObjectRef::new(node))
        .and_then(|n| budget::node_budget(&view::node_facts(&n), ctx.node_budget))
    else {
        return NodeYielding::default();
    };
    let held: Vec<Held> = ctx
        .index
        .on_node(node)
        .into_iter()
        .filter_map(|key| {
            let r = ctx
                .reservations
                .get(&ObjectRef::new(key.name()).within(key.namespace()))?;
            let status = &r.view.status;
            if status.phase != Some(crate::api::Phase::Released) {
                return None;
            }
            let alive = ctx
                .pods
                .get(&ObjectRef::new(key.name()).within(key.namespace()))
                .is_some_and(|p| !p.finished);
            if alive {
                return None;
            }
            let by_hand = status.pod_uid.is_none() && !r.view.managed;
            Some(Held {
                released_at: status.released_at?,
                key,
                by_hand,
            })
        })
        .collect();
    let yielded = budget::yielding(budget.held, &held)
        .into_iter()
        .map(|h| h.key.clone())
        .collect();
    NodeYielding {
        budget: Some(budget),
        held,
        yielded,
    }
}

/// Reconciles the reservation of the pod name `key`.
pub async fn reconcile(key: &PodKey, ctx: &Context) -> Result<Next, ReconcileError> {
    let started = std::time::Instant::now();
    if let Some(until) = ctx.expectations.awaited(key, started) {
        // The watch event carrying the last write enqueues the name again.
        tracing::trace!(%key, "waiting for the cache to show the last write");
        let wait = until.duration_since(started).as_millis();
        return Ok(Next::RetryMs(u64::try_from(wait).unwrap_or(u64::MAX)));
    }
    let now = Timestamp::now();
    let pod = ctx
        .pods
        .get(&ObjectRef::new(key.name()).within(key.namespace()));
    let reservation = ctx
        .reservations
        .get(&ObjectRef::new(key.name()).within(key.namespace()));
    let owner_name = pod
        .as_ref()
        .and_then(|p| p.owner_statefulset().map(str::to_owned))
        .or_else(|| {
            reservation
                .as_ref()
                .and_then(|r| r.view.owner_statefulset.clone())
        });
    let owner = owner_name.as_ref().and_then(|n| {
        ctx.statefulsets
            .get(&ObjectRef::new(n).within(key.namespace()))
    });
    let owner_state = match (&owner_name, &owner) {
        (None, _) => OwnerState::None,
        (Some(_), Some(_)) => OwnerState::Present,
        (Some(_), None) => OwnerState::Gone,
    };
    let owner_annotations = owner.as_ref().and_then(|o| o.metadata.annotations.clone());
    let pod_view = pod.as_ref().map(|p| p.view(owner_annotations.as_ref()));
    let reservation_view = reservation.as_ref().map(|r| &r.view);
    let conflict = reservation.as_ref().and_then(|_| ctx.index.conflict(key));
    let yields = reservation_view
        .filter(|r| r.status.phase == Some(crate::api::Phase::Released))
        .and_then(|r| node_yielding(ctx, &r.node_name).of(key));
    let namespace = match &ctx.namespaces {
        None => namespaces::Verdict::Selected,
        Some(n) => {
            let found = n.store.get(&ObjectRef::new(key.namespace()));
            let unlabelled = BTreeMap::new();
            let labels = found
                .as_ref()
                .map(|ns| ns.metadata.labels.as_ref().unwrap_or(&unlabelled));
            namespaces::verdict(Some(&n.selector), labels)
        }
    };
    let told = pod_view
        .as_ref()
        .is_some_and(|p| ctx.told.contains(key, &p.uid));
    let cidrs = pod_view
        .as_ref()
        .and_then(|p| p.node_name.as_ref())
        .and_then(|n| ctx.nodes.get(&ObjectRef::new(n)))
        .map(|n| view::node_pod_cidrs(&n));
    let input = Input {
        pod: pod_view.as_ref(),
        reservation: reservation_view,
        owner: owner_state,
        conflict: conflict.as_ref().map(|(ip, holder)| (*ip, holder)),
        node_pod_cidrs: cidrs.as_deref(),
        // Reconciles run only once every cache was filled: a node missing here is gone.
        node_gone: reservation_view
            .is_some_and(|r| ctx.nodes.get(&ObjectRef::new(&r.node_name)).is_none()),
        yields: yields.as_ref(),
        namespace,
        told,
    };
    let plan = decide(&input, now, &ctx.defaults);
    let live_uid = pod_view.as_ref().filter(|p| !p.finished).map(|p| &p.uid);
    match live_uid {
        Some(uid) if plan.told => ctx.told.insert(key, uid),
        Some(_) if matches!(namespace, namespaces::Verdict::NotSelected { .. }) => {}
        _ => ctx.told.forget(key),
    }
    if !plan.writes_nothing() {
        tracing::debug!(%key, ?plan, "carrying out plan");
    }
    execute(
        key,
        ctx,
        plan,
        pod,
        reservation,
        owner.as_deref(),
        owner_annotations,
    )
    .await
}

async fn execute(
    key: &PodKey,
    ctx: &Context,
    plan: Plan,
    pod: Option<Arc<CachedPod>>,
    reservation: Option<Arc<CachedReservation>>,
    owner: Option<&PartialObjectMeta<StatefulSet>>,
    owner_annotations: Option<BTreeMap<String, String>>,
) -> Result<Next, ReconcileError> {
    let about = About {
        pod: pod.as_deref(),
        owner,
    };
    let api: Api<IPReservation> = Api::namespaced(ctx.client.clone(), key.namespace());
    if let (Some(reason), Some(r)) = (plan.delete, reservation.as_deref()) {
        let next = delete(key, ctx, &api, r, reason, owner_annotations.as_ref()).await?;
        if next == Next::AwaitChange {
            publish(ctx, &plan, &about, Some(r));
        }
        return Ok(next);
    }
    let mut current = reservation.as_deref().cloned();
    let mut wrote = false;
    if let Some(spec) = &plan.spec {
        let managed = current.as_ref().is_none_or(|r| r.view.managed);
        let mut metadata = json!({"name": key.name(), "namespace": key.namespace()});
        if managed {
            let mut annotations = serde_json::Map::new();
            if let Some(owner) = &spec.owner_statefulset {
                annotations.insert(optin::OWNER_STATEFULSET.into(), json!(owner));
            }
            if spec.release_with_owner {
                annotations.insert(optin::RELEASE_WITH_OWNER.into(), json!("true"));
            }
            metadata["labels"] = json!({api::MANAGED_BY_LABEL: api::MANAGED_BY_VALUE});
            metadata["annotations"] = serde_json::Value::Object(annotations);
        }
        let mut body_spec = json!({"ips": spec.ips, "nodeName": spec.node_name});
        if let Some(retain_for) = &spec.retain_for {
            body_spec["retainFor"] = json!(retention::written(retain_for));
        }
        let body = json!({
            "apiVersion": "ipkeep.dev/v1alpha1",
            "kind": "IPReservation",
            "metadata": metadata,
            "spec": body_spec,
        });
        let written = match api
            .patch(
                key.name(),
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
        {
            Ok(written) => {
                if current.is_none() {
                    ctx.over_quota.reserved(key);
                }
                written
            }
            // Over quota: said once, and tried again when the namespace has room (a reservation
            // there is deleted), not by polling; right after a deletion, every second until the
            // quota's usage catches up with it.
            Err(e) if current.is_none() && quota_refusal(&e).is_some() => {
                let wait = ctx.over_quota.refused(key);
                if wait == QuotaWait::CatchUp {
                    return Ok(Next::RetryMs(1000));
                }
                if wait == QuotaWait::Tell
                    && let Some(p) = about.pod
                {
                    let quoted = quota_refusal(&e).unwrap_or_default();
                    emit(
                        ctx,
                        p.object_ref(),
                        lifecycle::reason::NOT_RESERVED,
                        format!(
                            "the namespace's ResourceQuota has no room for another IPReservation ({quoted}): reserved as soon as one of its reservations is deleted"
                        ),
                    );
                }
                return Ok(Next::AwaitChange);
            }
            Err(source) => {
                return Err(ReconcileError::ApplySpec {
                    key: key.clone(),
                    source,
                });
            }
        };
        current = Some(CachedReservation::project(&written));
        wrote = true;
    }
    if let Some(r) = &current {
        let generation = r.generation;
        let stale_generation = r.has_status && r.observed_generation != generation;
        if plan.status.is_some() || stale_generation {
            let status = plan.status.clone().unwrap_or_else(|| r.view.status.clone());
            let body = json!({
                "apiVersion": "ipkeep.dev/v1alpha1",
                "kind": "IPReservation",
                "status": view::status_object(&status, generation),
            });
            let written = api
                .patch_status(
                    key.name(),
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&body),
                )
                .await
                .map_err(|source| ReconcileError::ApplyStatus {
                    key: key.clone(),
                    source,
                })?;
            current = Some(CachedReservation::project(&written));
            wrote = true;
        }
    }
    if wrote
        && let Some(version) = current
            .as_ref()
            .and_then(|r| r.resource_version().map(str::to_owned))
    {
        let cached = || {
            ctx.reservations
                .get(&ObjectRef::new(key.name()).within(key.namespace()))
                .and_then(|r| r.resource_version().map(str::to_owned))
        };
        ctx.expectations
            .expect(key.clone(), version, cached, std::time::Instant::now());
    }
    publish(ctx, &plan, &about, current.as_ref());
    Ok(plan.requeue_at.map_or(Next::AwaitChange, Next::At))
}

/// Deletes a reservation after checking the pod against the API server (never the cache: a GET,
/// or a LIST that expiries of one namespace share, see [`super::fresh`]), with uid and
/// resourceVersion preconditions so a reservation changed meanwhile is never deleted.
async fn delete(
    key: &PodKey,
    ctx: &Context,
    api: &Api<IPReservation>,
    r: &CachedReservation,
    reason: DeleteReason,
    owner_annotations: Option<&BTreeMap<String, String>>,
) -> Result<Next, ReconcileError> {
    let recheck = |source| ReconcileError::RecheckPod {
        key: key.clone(),
        source,
    };
    let seen = match reason {
        DeleteReason::Expired { .. } => ctx
            .fresh
            .expiry_check(&ctx.client, key.namespace(), key.name())
            .await
            .map_err(recheck)?,
        _ => Seen::ReadIt,
    };
    // A shared LIST can be up to FRESH_FOR old: a pod created since then reached the pod watch,
    // which started before that LIST, within the watch's lag. If the cache shows one now, read
    // it as a lone expiry would, so what the LIST leaves open is that lag, not FRESH_FOR.
    let seen = match seen {
        Seen::Absent
            if ctx
                .pods
                .get(&ObjectRef::new(key.name()).within(key.namespace()))
                .is_some() =>
        {
            Seen::ReadIt
        }
        seen => seen,
    };
    let fresh = match seen {
        Seen::Absent => None,
        Seen::ReadIt => {
            let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), key.namespace());
            let pod = pods.get_opt(key.name()).await.map_err(recheck)?;
            pod.as_ref().map(CachedPod::project)
        }
    };
    let hold = match (reason, &fresh) {
        (
            DeleteReason::Expired { .. } | DeleteReason::NodeGone | DeleteReason::Yielded,
            Some(p),
        ) => !p.finished,
        (DeleteReason::OptedOut, Some(p)) => p.opted_in(owner_annotations),
        (_, None) => false,
    };
    if hold {
        tracing::info!(%key, ?reason, "not deleting the reservation: the API server has a live pod of that name the cache had not shown yet");
        return Ok(Next::RetryMs(1_000));
    }
    if reason == DeleteReason::NodeGone {
        let node = &r.view.node_name;
        let nodes: Api<Node> = Api::all(ctx.client.clone());
        let exists = nodes
            .get_metadata_opt(node)
            .await
            .map_err(|source| ReconcileError::RecheckNode {
                node: node.clone(),
                source,
            })?
            .is_some();
        if exists {
            tracing::info!(%key, %node, "not deleting the reservation: the API server has its node, which the cache had not shown yet");
            return Ok(Next::RetryMs(1_000));
        }
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: r.uid(),
            resource_version: r.resource_version().map(str::to_owned),
        }),
        ..DeleteParams::default()
    };
    match api.delete(key.name(), &params).await {
        Ok(_) => {
            if let DeleteReason::Expired { due } = reason {
                let late = Timestamp::now().duration_since(due).as_secs_f64().max(0.0);
                ctx.metrics.expirations.inc();
                ctx.metrics.expiry_lateness.observe(late);
                tracing::info!(%key, late_seconds = late, "reservation expired and was deleted");
                let note = format!(
                    "release time {due} reached and no pod of this name is alive: deleted, {} free",
                    r.view.ips.join(", ")
                );
                emit(ctx, r.object_ref(), lifecycle::reason::EXPIRED, note);
            } else if reason == DeleteReason::Yielded {
                ctx.metrics
                    .yielded
                    .with_label_values(&[r.view.node_name.as_str()])
                    .inc();
                tracing::info!(%key, node = %r.view.node_name, "reservation yielded to its node's budget and was deleted");
            } else if reason == DeleteReason::NodeGone {
                tracing::info!(%key, node = %r.view.node_name, "reservation deleted: its node is gone");
            } else {
                tracing::info!(%key, "reservation ended: the pod no longer asks for it");
            }
            Ok(Next::AwaitChange)
        }
        // Someone changed it meanwhile (uid or resourceVersion precondition) or deleted it.
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(Next::RetryMs(200)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Next::AwaitChange),
        Err(source) => Err(ReconcileError::Delete {
            key: key.clone(),
            source,
        }),
    }
}

/// The objects besides the reservation that a plan's Events may be about.
struct About<'a> {
    pod: Option<&'a CachedPod>,
    owner: Option<&'a PartialObjectMeta<StatefulSet>>,
}

fn publish(ctx: &Context, plan: &Plan, about: &About<'_>, r: Option<&CachedReservation>) {
    let pod = about.pod.map(CachedPod::object_ref);
    let owner = about.owner.map(|o| o.object_ref(&()));
    let reservation = r.map(CachedReservation::object_ref);
    for notice in &plan.notices {
        let targets = match notice.subject {
            Subject::Pod => [pod.as_ref(), None],
            Subject::Reservation => [reservation.as_ref(), None],
            Subject::Both => [pod.as_ref(), reservation.as_ref()],
            Subject::StatefulSet => [owner.as_ref(), None],
        };
        for regarding in targets.into_iter().flatten() {
            emit(
                ctx,
                regarding.clone(),
                notice.reason,
                notice.message.clone(),
            );
        }
    }
}

fn emit(
    ctx: &Context,
    regarding: k8s_openapi::api::core::v1::ObjectReference,
    reason: EventReason,
    note: String,
) {
    let outcome = ctx.events.publish(Notice {
        regarding,
        reason,
        action: "Reconcile",
        note: &note,
    });
    if outcome == Outcome::Queued {
        ctx.metrics
            .events
            .with_label_values(&[reason.name, EventType::of(reason).as_str()])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure(message, reason)
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn a_refused_pod_is_told_once_and_tried_again_while_the_quota_catches_up() {
        let t0 = std::time::Instant::now();
        let key = PodKey::new("ns", "second").unwrap();
        let other_ns = PodKey::new("other", "x").unwrap();
        let mut w = QuotaWaits::default();
        // (step, what happens at t0 + seconds, expected)
        assert_eq!(
            w.refused(&key, t0),
            QuotaWait::Tell,
            "the first refusal tells"
        );
        assert_eq!(
            w.refused(&key, t0 + std::time::Duration::from_secs(5)),
            QuotaWait::Wait,
            "a second refusal with no deletion waits, quietly"
        );
        assert!(w.room("other", t0).is_empty(), "another namespace's room");
        assert_eq!(
            w.room("ns", t0 + std::time::Duration::from_secs(10)),
            vec![key.clone()]
        );
        assert_eq!(
            w.refused(&key, t0 + std::time::Duration::from_secs(11)),
            QuotaWait::CatchUp,
            "refused right after the deletion: the quota's usage lags"
        );
        assert_eq!(
            w.refused(&key, t0 + std::time::Duration::from_secs(39)),
            QuotaWait::CatchUp
        );
        assert_eq!(
            w.refused(&key, t0 + std::time::Duration::from_secs(41)),
            QuotaWait::Wait,
            "past the catch-up window: the room was taken by someone else; wait, told already"
        );
        w.reserved(&key);
        assert_eq!(
            w.refused(&key, t0 + std::time::Duration::from_secs(50)),
            QuotaWait::Tell
        );
        assert_eq!(w.refused(&other_ns, t0), QuotaWait::Tell);
    }

    #[test]
    fn only_a_quota_refusal_waits_for_room() {
        let full = "ipreservations.ipkeep.dev \"b\" is forbidden: exceeded quota: ipr, requested: count/ipreservations.ipkeep.dev=1, used: count/ipreservations.ipkeep.dev=1, limited: count/ipreservations.ipkeep.dev=1";
        let cases = [
            (answer(403, "Forbidden", full), Some(full)),
            (answer(403, "Forbidden", "User cannot patch resource"), None),
            (answer(409, "Conflict", "exceeded quota"), None),
            (answer(422, "Invalid", "spec.ips: Invalid value"), None),
        ];
        for (e, want) in cases {
            assert_eq!(quota_refusal(&e), want, "{e}");
        }
    }
}
