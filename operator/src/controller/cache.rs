//! What the controller's pod and reservation caches hold: each object projected, as the watch
//! delivers it, to what the controller's decisions read, so a cached pod and its reservation cost
//! about 1.8 KB together (with the address index; 2.2 KB before these compact fields, 6 KB as full
//! objects), measured as RSS per pod over 100 000 of each projected into the stores (issue 28).
//!
//! A full `Pod` is 2 176 bytes before any of its strings (a `PodSpec` with every field `None` is
//! 1 416), and every map of annotations or labels, even of one entry, costs a whole B-tree node of
//! about 550 bytes. The projections keep plain fields, the `ipkeep.dev/` annotations as a list,
//! and a reservation already converted to the [`ReservationView`] the lifecycle decides on. They
//! implement kube's [`Lookup`] without a uid or resourceVersion, so the store's keys copy only the
//! name and namespace. Every allocation costs at least 32 bytes, so the fields are compact: a uid
//! is its 16 bytes (text only when it is not a canonical UUID), namespace and node names are one
//! shared copy each ([`Interner`]), text is `Box<str>` and lists boxed slices (no capacity word).
//! A pod read fresh from the API server (before a delete) is projected the same way, so the cache
//! and the recheck read a pod through one conversion.

use std::{
    borrow::Cow,
    collections::{BTreeMap, HashSet},
    fmt,
    net::IpAddr,
    sync::{Arc, LazyLock, Mutex},
};

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::runtime::{reflector::Lookup, watcher};

use super::view;
use crate::api::{IPReservation, PodKey};
use crate::rules::{
    lifecycle::{NameSource, PodView, ReservationView},
    optin,
    placement::{PLACED, Placed},
};

/// A pod as the controller keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedPod {
    /// `metadata.name`.
    name: Box<str>,
    /// `metadata.namespace`, shared with every other object of the namespace.
    namespace: Arc<str>,
    /// `metadata.uid`.
    uid: Uid,
    /// `metadata.resourceVersion`, for the Events about the pod.
    resource_version: Option<Box<str>>,
    /// `spec.nodeName`, once scheduled, shared with every other pod of the node.
    node_name: Option<Arc<str>>,
    /// `status.podIPs` (else `status.podIP`), parsed.
    ips: Box<[IpAddr]>,
    /// `status.phase` is `Running`.
    pub running: bool,
    /// `status.phase` is `Succeeded` or `Failed`.
    pub finished: bool,
    /// `spec.hostNetwork`.
    pub host_network: bool,
    /// The StatefulSet controlling it, if one does.
    owner_statefulset: Option<Box<str>>,
    /// Where its name came from.
    name_source: Source,
    /// Its `ipkeep.dev/` annotations, the only ones read (a list: see the module's note).
    annotations: Box<[(Box<str>, Box<str>)]>,
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
            name: meta.name.as_deref().unwrap_or_default().into(),
            namespace: NAMES.get(meta.namespace.as_deref().unwrap_or_default()),
            uid: Uid::new(meta.uid.as_deref().unwrap_or_default()),
            resource_version: meta.resource_version.as_deref().map(Box::from),
            node_name: spec
                .and_then(|s| s.node_name.as_deref())
                .filter(|n| !n.is_empty())
                .map(|n| NAMES.get(n)),
            ips: ips.into(),
            running: phase == Some("Running"),
            finished: matches!(phase, Some("Succeeded" | "Failed")),
            host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
            owner_statefulset: view::pod_owner_statefulset(pod).map(Box::from),
            name_source: Source::of(view::pod_name_source(pod)),
            annotations: meta
                .annotations
                .iter()
                .flatten()
                .filter(|(k, _)| k.starts_with(view::ANNOTATION_PREFIX))
                .map(|(k, v)| (Box::from(k.as_str()), Box::from(v.as_str())))
                .collect(),
        }
    }

    /// The pod's key; `None` (logged) if its names are not valid ones.
    pub fn key(&self) -> Option<PodKey> {
        checked_key("pod", &self.namespace, &self.name)
    }

    /// `metadata.namespace`.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The StatefulSet controlling it, if one does.
    pub fn owner_statefulset(&self) -> Option<&str> {
        self.owner_statefulset.as_deref()
    }

    /// The lifecycle's view of the pod, given its owner's annotations.
    pub fn view(&self, owner_annotations: Option<&BTreeMap<String, String>>) -> PodView {
        let annotations: BTreeMap<String, String> = self
            .annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        PodView {
            uid: self.uid.to_string(),
            node_name: self.node_name.as_deref().map(str::to_owned),
            ips: self.ips.to_vec(),
            running: self.running,
            finished: self.finished,
            host_network: self.host_network,
            opt_in: optin::opt_in(&annotations, owner_annotations),
            owner_statefulset: self.owner_statefulset.as_deref().map(str::to_owned),
            placed: Placed::parse(annotations.get(PLACED).map(String::as_str)),
            name: self.name_source.to_view(),
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
            name: Some(self.name.to_string()),
            namespace: Some(self.namespace.to_string()),
            uid: Some(self.uid.to_string()).filter(|u| !u.is_empty()),
            resource_version: self.resource_version.as_deref().map(str::to_owned),
            field_path: None,
        }
    }
}

/// [`NameSource`] in 16 bytes rather than 48 (the owner, rare, behind a pointer).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    Stable,
    Generated,
    OwnedBy(Box<(Box<str>, Box<str>)>),
}

impl Source {
    fn of(source: NameSource) -> Source {
        match source {
            NameSource::Stable => Source::Stable,
            NameSource::Generated => Source::Generated,
            NameSource::OwnedBy { kind, name } => {
                Source::OwnedBy(Box::new((kind.into(), name.into())))
            }
        }
    }

    fn to_view(&self) -> NameSource {
        match self {
            Source::Stable => NameSource::Stable,
            Source::Generated => NameSource::Generated,
            Source::OwnedBy(owner) => NameSource::OwnedBy {
                kind: owner.0.to_string(),
                name: owner.1.to_string(),
            },
        }
    }
}

/// A `metadata.uid`: the 16 bytes of a UUID in its canonical text (what the API server assigns),
/// else the text as it came.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Uid {
    Uuid([u8; 16]),
    Text(Box<str>),
}

/// Where the dashes of a canonical UUID's 36 characters are.
const UUID_DASHES: [usize; 4] = [8, 13, 18, 23];

impl Uid {
    fn new(text: &str) -> Uid {
        Uid::parse(text).map_or_else(|| Uid::Text(text.into()), Uid::Uuid)
    }

    /// The bytes of a UUID written as `Display` writes it back (lowercase, dashed), else `None`.
    fn parse(text: &str) -> Option<[u8; 16]> {
        let text = text.as_bytes();
        if text.len() != 36 || UUID_DASHES.iter().any(|&i| text[i] != b'-') {
            return None;
        }
        let mut digits = text.iter().filter(|&&c| c != b'-').map(|&c| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        });
        let mut bytes = [0u8; 16];
        for byte in &mut bytes {
            *byte = (digits.next()?? << 4) | digits.next()??;
        }
        digits.next().is_none().then_some(bytes)
    }
}

impl fmt::Display for Uid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Uid::Text(text) => f.write_str(text),
            Uid::Uuid(bytes) => {
                for (i, b) in bytes.iter().enumerate() {
                    if matches!(i, 4 | 6 | 8 | 10) {
                        f.write_str("-")?;
                    }
                    write!(f, "{b:02x}")?;
                }
                Ok(())
            }
        }
    }
}

/// One shared copy of each namespace and node name the caches hold (a cluster has far fewer of
/// them than pods); a name no object holds any more is dropped when the set has doubled.
#[derive(Debug, Default)]
struct Interner {
    names: Mutex<(HashSet<Arc<str>>, usize)>,
}

/// The process's one [`Interner`]: projections are plain functions, called from the watches and
/// from writes' answers alike.
static NAMES: LazyLock<Interner> = LazyLock::new(Interner::default);

impl Interner {
    /// The shared copy of `name`.
    fn get(&self, name: &str) -> Arc<str> {
        let mut guard = self.names.lock().unwrap_or_else(|e| e.into_inner());
        let (names, prune_at) = &mut *guard;
        if let Some(n) = names.get(name) {
            return n.clone();
        }
        if names.len() >= *prune_at {
            names.retain(|n| Arc::strong_count(n) > 1);
            *prune_at = (names.len() * 2).max(1024);
        }
        let n: Arc<str> = Arc::from(name);
        names.insert(n.clone());
        n
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
                Some(Cow::Borrowed(&*self.name))
            }

            fn namespace(&self) -> Option<Cow<'_, str>> {
                Some(Cow::Borrowed(&*self.namespace))
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
    name: Box<str>,
    /// `metadata.namespace`, shared with every other object of the namespace.
    namespace: Arc<str>,
    /// `metadata.uid`, a delete's precondition.
    uid: Option<Uid>,
    /// `metadata.resourceVersion`, a delete's precondition.
    resource_version: Option<Box<str>>,
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
            name: meta.name.as_deref().unwrap_or_default().into(),
            namespace: NAMES.get(meta.namespace.as_deref().unwrap_or_default()),
            uid: meta.uid.as_deref().map(Uid::new),
            resource_version: meta.resource_version.as_deref().map(Box::from),
            generation: meta.generation,
            has_status: r.status.is_some(),
            observed_generation: r.status.as_ref().and_then(|s| s.observed_generation),
            view: view::reservation_view(r),
        }
    }

    /// The reservation's key; `None` (logged) if its names are not valid ones.
    pub fn key(&self) -> Option<PodKey> {
        checked_key("IPReservation", &self.namespace, &self.name)
    }

    /// `metadata.namespace`.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// `metadata.uid`, a delete's precondition.
    pub fn uid(&self) -> Option<String> {
        self.uid.as_ref().map(Uid::to_string)
    }

    /// `metadata.resourceVersion`, a delete's precondition.
    pub fn resource_version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }

    /// The reference Events about the reservation carry.
    pub fn object_ref(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("ipkeep.dev/v1alpha1".into()),
            kind: Some("IPReservation".into()),
            name: Some(self.name.to_string()),
            namespace: Some(self.namespace.to_string()),
            uid: self.uid(),
            resource_version: self.resource_version().map(str::to_owned),
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

/// The key of a cached object, or `None` when its names are not valid ones: a real API server
/// never returns such an object, so the controller skips it rather than reconcile it.
fn checked_key(kind: &str, namespace: &str, name: &str) -> Option<PodKey> {
    PodKey::new(namespace, name)
        .inspect_err(|e| {
            tracing::debug!(kind, namespace, name, error = %e, "object with an invalid name skipped");
        })
        .ok()
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
            assert_eq!(p.key(), Some(PodKey::new("ns", "web-0").unwrap()));
        }
    }

    #[test]
    fn a_projected_pod_keeps_only_the_ipkeep_annotations_and_no_copies_in_the_stores_keys() {
        let p = CachedPod::project(&pod(json!({"phase": "Running"})));
        let kept: Vec<&str> = p.annotations.iter().map(|(k, _)| &**k).collect();
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
    fn a_uid_reads_back_as_it_came_whether_kept_as_16_bytes_or_as_text() {
        let cases = [
            ("6f1c2a3e-4b5d-4e6f-8a9b-0c1d2e3f4a5b", true),
            ("00000000-0000-0000-0000-000000000000", true),
            ("6F1C2A3E-4B5D-4E6F-8A9B-0C1D2E3F4A5B", false),
            ("6f1c2a3e4b5d4e6f8a9b0c1d2e3f4a5b", false),
            ("6f1c2a3e-4b5d-4e6f-8a9b-0c1d2e3f4a5g", false),
            ("6f1c2a3e-4b5d-4e6f-8a9b+0c1d2e3f4a5b", false),
            ("u-1", false),
            ("", false),
        ];
        for (text, as_bytes) in cases {
            let uid = Uid::new(text);
            assert_eq!(uid.to_string(), text);
            assert_eq!(matches!(uid, Uid::Uuid(_)), as_bytes, "{text}");
        }
    }

    #[test]
    fn names_are_shared_by_every_object_that_holds_them() {
        let a = NAMES.get("shared-ns");
        let b = NAMES.get("shared-ns");
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &NAMES.get("other-ns")));
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
            (c.uid().as_deref(), c.resource_version()),
            (Some("r-1"), Some("9"))
        );
        assert_eq!(
            (c.generation, c.has_status, c.observed_generation),
            (Some(2), true, Some(1))
        );
        assert_eq!(c.key(), Some(PodKey::new("ns", "web-0").unwrap()));
        assert_eq!(c.object_ref().kind.as_deref(), Some("IPReservation"));
    }

    #[test]
    fn an_object_with_an_invalid_name_has_no_key() {
        let r: IPReservation = serde_json::from_value(json!({
            "apiVersion": "ipkeep.dev/v1alpha1", "kind": "IPReservation",
            "metadata": {"name": "Web_0", "namespace": "ns"},
            "spec": {"ips": ["10.0.0.1"], "nodeName": "node-a"},
        }))
        .unwrap();
        assert_eq!(CachedReservation::project(&r).key(), None);
    }
}
