//! The boundary between Kubernetes objects and the lifecycle's plain views: trimming what the
//! node, StatefulSet and Namespace caches keep, and converting reservations into
//! [`ReservationView`] (pods go through [`super::cache::CachedPod`]).

use std::collections::BTreeMap;

use ipnet::IpNet;
use jiff::Timestamp;
use k8s_openapi::{
    api::{
        apps::v1::StatefulSet,
        core::v1::{Namespace, Node, NodeSpec, NodeStatus, Pod},
    },
    apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time},
};
use kube::core::PartialObjectMeta;

use crate::rules::{
    budget::{self, NodeFacts},
    lifecycle::{Conflict, NameSource, ReservationView, StatusView},
    optin,
};
use crate::{
    api::retention::RetainFor,
    api::{self, CONDITION_CONFLICT, ConflictStatus, IPReservation, IPReservationStatus, IpString},
};

/// The prefix of the only annotations the controller reads.
pub const ANNOTATION_PREFIX: &str = "ipkeep.dev/";

/// Keeps only a node's labels (the placement webhook checks a pod's own node affinity against
/// them) and pod CIDRs.
pub fn trim_node(node: &mut Node) {
    let labels = node.metadata.labels.take();
    let budget = node
        .metadata
        .annotations
        .as_mut()
        .and_then(|a| a.remove(budget::NODE_BUDGET));
    trim_meta(&mut node.metadata);
    node.metadata.labels = labels;
    node.metadata.annotations =
        budget.map(|b| BTreeMap::from([(budget::NODE_BUDGET.to_owned(), b)]));
    node.metadata.owner_references = None;
    node.spec = node.spec.take().map(|s| NodeSpec {
        pod_cidr: s.pod_cidr,
        pod_cidrs: s.pod_cidrs,
        ..NodeSpec::default()
    });
    // The kubelet's allocatable pods count goes into the node's budget.
    node.status = node.status.take().map(|s| NodeStatus {
        allocatable: s
            .allocatable
            .and_then(|mut a| a.remove("pods"))
            .map(|pods| BTreeMap::from([("pods".to_owned(), pods)])),
        ..NodeStatus::default()
    });
}

/// What a node's budget is computed from.
pub fn node_facts(node: &Node) -> NodeFacts {
    NodeFacts {
        pod_cidrs: node_pod_cidrs(node)
            .iter()
            .map(ToString::to_string)
            .collect(),
        allocatable_pods: node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get("pods"))
            .and_then(|q| q.0.parse().ok()),
        annotation: node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(budget::NODE_BUDGET))
            .cloned(),
    }
}

/// Keeps only a Namespace's labels (what `--namespace-selector` is matched against).
pub fn trim_namespace(ns: &mut PartialObjectMeta<Namespace>) {
    let labels = ns.metadata.labels.take();
    trim_meta(&mut ns.metadata);
    ns.metadata.annotations = None;
    ns.metadata.owner_references = None;
    ns.metadata.labels = labels;
}

/// Keeps only a StatefulSet's ipkeep annotations.
pub fn trim_statefulset(sts: &mut PartialObjectMeta<StatefulSet>) {
    trim_meta(&mut sts.metadata);
    sts.metadata.owner_references = None;
}

fn trim_meta(meta: &mut ObjectMeta) {
    meta.labels = None;
    meta.managed_fields = None;
    meta.finalizers = None;
    meta.generate_name = None;
    meta.creation_timestamp = None;
    if let Some(annotations) = &mut meta.annotations {
        annotations.retain(|k, _| k.starts_with(ANNOTATION_PREFIX));
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

/// The StatefulSet controlling a pod, if any.
pub fn pod_owner_statefulset(pod: &Pod) -> Option<String> {
    pod.metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.kind == "StatefulSet" && o.controller == Some(true))
        .map(|o| o.name.clone())
}

/// Where a pod's name came from: its controller owner and `generateName`.
pub fn pod_name_source(pod: &Pod) -> NameSource {
    let controller = pod
        .metadata
        .owner_references
        .as_ref()
        .and_then(|owners| owners.iter().find(|o| o.controller == Some(true)))
        .map(|o| (o.kind.as_str(), o.name.as_str()));
    NameSource::of(
        controller,
        pod.metadata.generate_name.as_deref(),
        pod.metadata.name.as_deref().unwrap_or_default(),
    )
}

/// The lifecycle's view of a reservation.
pub fn reservation_view(r: &IPReservation) -> ReservationView {
    let meta = &r.metadata;
    let status = r.status.clone().unwrap_or_default();
    let conflict = recorded_conflict(&status);
    ReservationView {
        ips: r.spec.ips.iter().map(|ip| ip.0.clone()).collect(),
        node_name: r.spec.node_name.clone(),
        retain_for: r.spec.retain_for.as_deref().map(RetainFor::parse),
        managed: meta
            .labels
            .as_ref()
            .and_then(|l| l.get(api::MANAGED_BY_LABEL))
            .is_some_and(|v| v == api::MANAGED_BY_VALUE),
        created: meta
            .creation_timestamp
            .as_ref()
            .map_or(Timestamp::UNIX_EPOCH, |t| t.0),
        owner_statefulset: meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(optin::OWNER_STATEFULSET))
            .cloned(),
        release_with_owner: meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(optin::RELEASE_WITH_OWNER))
            .is_some_and(|v| v == "true"),
        status: StatusView {
            phase: status.phase,
            pod_uid: status.pod_uid,
            released_at: status.released_at.map(|t| t.0),
            release_time: status.release_time.map(|t| t.0),
            conflict,
        },
    }
}

/// The conflict the controller recorded: the typed `status.conflict`, with the time the
/// `Conflict` condition turned true. Without the condition (removed by hand) it counts as not
/// recorded, so the next reconcile writes both again.
fn recorded_conflict(status: &IPReservationStatus) -> Option<Conflict> {
    let recorded = status.conflict.as_ref()?;
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_CONFLICT && c.status == "True")?;
    Some(Conflict {
        ip: recorded.ip.0.parse().ok()?,
        holder: recorded.held_by.clone(),
        since: condition.last_transition_time.0,
    })
}

/// The `Conflict` condition's message, for people.
fn conflict_message(c: &Conflict) -> String {
    format!("address {} is held by the reservation {}", c.ip, c.holder)
}

/// The CRD status the controller writes for a lifecycle status.
pub fn status_object(view: &StatusView, observed_generation: Option<i64>) -> IPReservationStatus {
    IPReservationStatus {
        phase: view.phase,
        pod_uid: view.pod_uid.clone(),
        released_at: view.released_at.map(Time),
        release_time: view.release_time.map(Time),
        observed_generation,
        conflict: view.conflict.as_ref().map(|c| ConflictStatus {
            ip: IpString(c.ip.to_string()),
            held_by: c.holder.clone(),
        }),
        conditions: view
            .conflict
            .iter()
            .map(|c| Condition {
                type_: CONDITION_CONFLICT.into(),
                status: "True".into(),
                reason: "AddressHeld".into(),
                message: conflict_message(c),
                last_transition_time: Time(c.since),
                observed_generation,
            })
            .collect(),
    }
}

/// A node's pod CIDRs (`spec.podCIDRs`, else `spec.podCIDR`).
pub fn node_pod_cidrs(node: &Node) -> Vec<IpNet> {
    let Some(spec) = node.spec.as_ref() else {
        return Vec::new();
    };
    let list = spec
        .pod_cidrs
        .clone()
        .filter(|l| !l.is_empty())
        .or_else(|| spec.pod_cidr.clone().map(|c| vec![c]))
        .unwrap_or_default();
    list.iter().filter_map(|c| c.parse().ok()).collect()
}
