//! What the controller's pod and reservation caches hold: each object projected, as the watch
//! delivers it, to what the controller's decisions read, so a cached pod and its reservation cost
//! about 2 KiB together rather than 6 (issue 28: 150 000 pods are about 300 MiB, not 900).
//!
//! A full `Pod` is 2 176 bytes before any of its strings (a `PodSpec` with every field `None` is
//! 1 416), and every map of annotations or labels, even of one entry, costs a whole B-tree node of
//! about 550 bytes. The projections keep plain fields, the `ipkeep.dev/` annotations as a list,
//! and a reservation already converted to the [`ReservationView`] the lifecycle decides on. They
//! implement kube's [`Lookup`] without a uid or resourceVersion, so the store's keys copy only the
//! name and namespace. A pod read fresh from the API server (before a delete) is projected the
//! same way, so the cache and the recheck read a pod through one conversion.

use std::{borrow::Cow, collections::BTreeMap, net::IpAddr};

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::runtime::{reflector::Lookup, watcher};

use super::{
    lifecycle::{NameSource, PodView, ReservationView},
    optin,
    placement::{self, Placed},
    view,
};
use crate::{crd::IPReservation, key::Key};

/// A pod as the controller keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedPod {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.resourceVersion`, for the Events about the pod.
    pub resource_version: Option<String>,
    /// `spec.nodeName`, once scheduled.
    pub node_name: Option<String>,
    /// `status.podIPs` (else `status.podIP`), parsed.
    pub ips: Vec<IpAddr>,
    /// `status.phase` is `Running`.
    pub running: bool,
    /// `status.phase` is `Succeeded` or `Failed`.
    pub finished: bool,
    /// `spec.hostNetwork`.
    pub host_network: bool,
    /// The StatefulSet controlling it, if one does.
    pub owner_statefulset: Option<String>,
    /// Where its name came from.
    pub name_source: NameSource,
    /// Its `ipkeep.dev/` annotations, the only ones read (a list: see the module's note).
    annotations: Box<[(String, String)]>,
}

impl CachedPod {
    /// Projects a pod (from the watch or from a GET).
    pub fn project(pod: &Pod) -> CachedPod {
        let meta = &pod.metadata;
        let status = pod.status.as_ref();
        let mut ips: Vec<IpAddr> = status
            .and_then(|s| s.pod_ips.as_ref())
            .map(|list| list.iter().filter_map(|p| p.ip.parse().ok()).collect())
            .unwrap_or_default();
        if ips.is_empty()
            && let Some(ip) = status
                .and_then(|s| s.pod_ip.as_deref())
                .and_then(|s| s.parse().ok())
        {
            ips.push(ip);
        }
        let spec = pod.spec.as_ref();
        let phase = status.and_then(|s| s.phase.as_deref());
        CachedPod {
            name: meta.name.clone().unwrap_or_default(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone(),
            node_name: spec
                .and_then(|s| s.node_name.clone())
                .filter(|n| !n.is_empty()),
            ips,
            running: phase == Some("Running"),
            finished: matches!(phase, Some("Succeeded" | "Failed")),
            host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
            owner_statefulset: view::pod_owner_statefulset(pod),
            name_source: view::pod_name_source(pod),
            annotations: meta
                .annotations
                .iter()
                .flatten()
                .filter(|(k, _)| k.starts_with(view::ANNOTATION_PREFIX))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }

    /// The pod's key.
    pub fn key(&self) -> Key {
        Key::new(&self.namespace, &self.name)
    }

    /// The lifecycle's view of the pod, given its owner's annotations.
    pub fn view(&self, owner_annotations: Option<&BTreeMap<String, String>>) -> PodView {
        let annotations: BTreeMap<String, String> = self.annotations.iter().cloned().collect();
        PodView {
            uid: self.uid.clone(),
            node_name: self.node_name.clone(),
            ips: self.ips.clone(),
            running: self.running,
            finished: self.finished,
            host_network: self.host_network,
            opt_in: optin::opt_in(&annotations, owner_annotations),
            owner_statefulset: self.owner_statefulset.clone(),
            placed: Placed::parse(annotations.get(placement::PLACED).map(String::as_str)),
            name: self.name_source.clone(),
        }
    }

    /// Whether a live pod asks for a reservation (the check before deleting an opted-out one).
    pub fn opted_in(&self, owner_annotations: Option<&BTreeMap<String, String>>) -> bool {
        let view = self.view(owner_annotations);
        !view.finished && view.opt_in.retain != optin::Retain::No
    }

    /// The reference Events about the pod carry.
    pub fn object_ref(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(self.name.clone()),
            namespace: Some(self.namespace.clone()),
            uid: Some(self.uid.clone()).filter(|u| !u.is_empty()),
            resource_version: self.resource_version.clone(),
            field_path: None,
        }
    }
}

/// kube's [`Lookup`] for a projection with `name` and `namespace` fields: the store's keys hold
/// only those two (no uid, no resourceVersion; the store finds by name).
macro_rules! lookup_by_name {
    ($type:ty, $kind:literal, $group:literal, $version:literal, $plural:literal) => {
        impl Lookup for $type {
            type DynamicType = ();

            fn kind(_: &()) -> Cow<'_, str> {
                $kind.into()
            }

            fn group(_: &()) -> Cow<'_, str> {
                $group.into()
            }

            fn version(_: &()) -> Cow<'_, str> {
                $version.into()
            }

            fn plural(_: &()) -> Cow<'_, str> {
                $plural.into()
            }

            fn name(&self) -> Option<Cow<'_, str>> {
                Some(Cow::Borrowed(&self.name))
            }

            fn namespace(&self) -> Option<Cow<'_, str>> {
                Some(Cow::Borrowed(&self.namespace))
            }

            fn resource_version(&self) -> Option<Cow<'_, str>> {
                None
            }

            fn uid(&self) -> Option<Cow<'_, str>> {
                None
            }
        }
    };
}

lookup_by_name!(CachedPod, "Pod", "", "v1", "pods");
lookup_by_name!(
    CachedReservation,
    "IPReservation",
    "ipkeep.dev",
    "v1alpha1",
    "ipreservations"
);

/// A reservation as the controller keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedReservation {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.uid`, a delete's precondition.
    pub uid: Option<String>,
    /// `metadata.resourceVersion`, a delete's precondition.
    pub resource_version: Option<String>,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// Whether it has a status at all.
    pub has_status: bool,
    /// `status.observedGeneration`.
    pub observed_generation: Option<i64>,
    /// What the lifecycle decides on.
    pub view: ReservationView,
}

impl CachedReservation {
    /// Projects a reservation (from the watch or from a write's answer).
    pub fn project(r: &IPReservation) -> CachedReservation {
        let meta = &r.metadata;
        CachedReservation {
            name: meta.name.clone().unwrap_or_default(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
            generation: meta.generation,
            has_status: r.status.is_some(),
            observed_generation: r.status.as_ref().and_then(|s| s.observed_generation),
            view: view::reservation_view(r),
        }
    }

    /// The reservation's key.
    pub fn key(&self) -> Key {
        Key::new(&self.namespace, &self.name)
    }

    /// The reference Events about the reservation carry.
    pub fn object_ref(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("ipkeep.dev/v1alpha1".into()),
            kind: Some("IPReservation".into()),
            name: Some(self.name.clone()),
            namespace: Some(self.namespace.clone()),
            uid: self.uid.clone(),
            resource_version: self.resource_version.clone(),
            field_path: None,
        }
    }
}

/// A watch's events with each object projected (`project` runs once per object delivered, before
/// the reflector stores it).
pub fn projected<K, C>(event: watcher::Event<K>, project: impl Fn(&K) -> C) -> watcher::Event<C> {
    match event {
        watcher::Event::Apply(o) => watcher::Event::Apply(project(&o)),
        watcher::Event::Delete(o) => watcher::Event::Delete(project(&o)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(o) => watcher::Event::InitApply(project(&o)),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use serde_json::json;

    /// A pod as the API server sends it, with much the controller does not read.
    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "web-0", "namespace": "ns", "uid": "u-1", "resourceVersion": "7",
                "labels": {"app": "web"},
                "annotations": {
                    "ipkeep.dev/retain": "true", "ipkeep.dev/placed": "node-a",
                    "kubectl.kubernetes.io/last-applied-configuration": "{}",
                },
                "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "s", "controller": true},
                ],
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
            },
            "spec": {"nodeName": "node-a", "hostNetwork": false,
                     "containers": [{"name": "app", "image": "app", "env": [{"name": "A", "value": "b"}]}]},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn a_projected_pod_reads_as_the_full_pod_does() {
        let cases = [
            (
                json!({"phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]}),
                vec!["10.0.0.1", "fd00::1"],
                (true, false),
            ),
            (
                json!({"phase": "Pending", "podIP": "10.0.0.2"}),
                vec!["10.0.0.2"],
                (false, false),
            ),
            (json!({"phase": "Succeeded"}), vec![], (false, true)),
            (
                json!({"phase": "Failed", "podIPs": []}),
                vec![],
                (false, true),
            ),
        ];
        for (status, ips, (running, finished)) in cases {
            let p = CachedPod::project(&pod(status.clone()));
            let view = p.view(None);
            let want: Vec<IpAddr> = ips.iter().map(|ip| ip.parse().unwrap()).collect();
            assert_eq!(view.ips, want, "{status}");
            assert_eq!(
                (view.running, view.finished),
                (running, finished),
                "{status}"
            );
            assert_eq!(view.uid, "u-1");
            assert_eq!(view.node_name.as_deref(), Some("node-a"));
            assert_eq!(view.owner_statefulset.as_deref(), Some("web"));
            assert_eq!(view.opt_in.retain, optin::Retain::Yes);
            assert_eq!(view.placed, Placed::parse(Some("node-a")));
            assert_eq!(view.name, NameSource::Stable);
            assert_eq!(p.opted_in(None), !finished);
            assert_eq!(p.key(), Key::new("ns", "web-0"));
        }
    }

    #[test]
    fn a_projected_pod_keeps_only_the_ipkeep_annotations_and_no_copies_in_the_stores_keys() {
        let p = CachedPod::project(&pod(json!({"phase": "Running"})));
        let kept: Vec<&str> = p.annotations.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(kept, ["ipkeep.dev/placed", "ipkeep.dev/retain"]);
        let key = p.to_object_ref(());
        assert_eq!(
            (key.name.as_str(), key.namespace.as_deref()),
            ("web-0", Some("ns"))
        );
        assert_eq!((key.extra.uid, key.extra.resource_version), (None, None));
        let r = p.object_ref();
        assert_eq!(
            (
                r.kind.as_deref(),
                r.uid.as_deref(),
                r.resource_version.as_deref()
            ),
            (Some("Pod"), Some("u-1"), Some("7"))
        );
    }

    #[test]
    fn a_projected_reservation_carries_its_view_and_the_delete_preconditions() {
        let r: IPReservation = serde_json::from_value(json!({
            "apiVersion": "ipkeep.dev/v1alpha1", "kind": "IPReservation",
            "metadata": {"name": "web-0", "namespace": "ns", "uid": "r-1", "resourceVersion": "9",
                         "generation": 2, "creationTimestamp": "2026-01-01T00:00:00Z",
                         "labels": {"app.kubernetes.io/managed-by": "ipkeep"}},
            "spec": {"ips": ["10.0.0.1"], "nodeName": "node-a"},
            "status": {"phase": "Bound", "podUID": "u-1", "observedGeneration": 1},
        }))
        .unwrap();
        let c = CachedReservation::project(&r);
        assert_eq!(c.view, view::reservation_view(&r));
        assert_eq!(
            (c.uid.as_deref(), c.resource_version.as_deref()),
            (Some("r-1"), Some("9"))
        );
        assert_eq!(
            (c.generation, c.has_status, c.observed_generation),
            (Some(2), true, Some(1))
        );
        assert_eq!(c.key(), Key::new("ns", "web-0"));
        assert_eq!(c.object_ref().kind.as_deref(), Some("IPReservation"));
    }
}
