//! The resource types the server knows: built-in kinds plus every registered CustomResourceDefinition.

use std::sync::Arc;

use serde_json::{Value, json};

/// The group of CustomResourceDefinitions themselves.
pub const CRD_GROUP: &str = "apiextensions.k8s.io";

/// One served resource (`pods`, `leases.coordination.k8s.io`, `ipreservations.ipkeep.dev`, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceType {
    /// API group, empty for the core group.
    pub group: String,
    /// Served versions; the first is the preferred (storage) version.
    pub versions: Vec<String>,
    /// `kind` of one object.
    pub kind: String,
    /// URL path segment (`pods`).
    pub plural: String,
    /// Lowercase singular name (`pod`).
    pub singular: String,
    /// kubectl short names (`po`, `ipr`).
    pub short_names: Vec<String>,
    /// kubectl categories (`all`).
    pub categories: Vec<String>,
    /// Namespaced (true) or cluster-scoped.
    pub namespaced: bool,
    /// Whether a `status` subresource exists (writes to the main resource then keep status).
    pub status_subresource: bool,
    /// Field paths (without leading dot) accepted in field selectors, besides metadata.name/namespace.
    pub selectable_fields: Vec<String>,
    /// CRD `additionalPrinterColumns` per version (empty for built-ins, which use default columns).
    pub printer_columns: Vec<(String, Vec<Value>)>,
    /// CRD `openAPIV3Schema` per version (None for built-ins: they are not validated).
    pub schemas: Vec<(String, Value)>,
    /// Name of the CRD that registered this type (None for built-ins).
    pub crd_name: Option<String>,
}

impl ResourceType {
    /// `group/plural`, the key objects are stored under (one store for all versions).
    pub fn key(&self) -> String {
        if self.is_events_v1() {
            // kube-apiserver keeps both Event APIs in one storage (core/v1 is the stored form).
            return "/events".to_string();
        }
        format!("{}/{}", self.group, self.plural)
    }

    /// Whether this is `events.k8s.io` Event, served from the core Event storage with conversion.
    pub fn is_events_v1(&self) -> bool {
        self.group == "events.k8s.io" && self.plural == "events"
    }

    /// `group/version` as used in `apiVersion` (just `v1` for the core group).
    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    /// `Kind.group` as used in 422 messages (`Pod`, `IPReservation.ipkeep.dev`).
    pub fn group_kind(&self) -> String {
        if self.group.is_empty() {
            self.kind.clone()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }

    /// `plural.group` (`leases.coordination.k8s.io`, `pods`): what kube-apiserver names as the
    /// kind of a 422 for a missing resourceVersion (the qualified resource, not the kind).
    pub fn group_resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// Whether a PUT without `metadata.resourceVersion` is accepted: kube-apiserver's
    /// `AllowUnconditionalUpdate` of each kind's strategy (v1.34), true for the core kinds and
    /// StatefulSets, false for Leases, CustomResourceDefinitions and custom resources.
    pub fn allows_unconditional_update(&self) -> bool {
        self.crd_name.is_none()
            && !matches!(
                (self.group.as_str(), self.plural.as_str()),
                ("coordination.k8s.io", "leases") | (CRD_GROUP, "customresourcedefinitions")
            )
    }

    /// The schema of one version, if this is a CRD with a schema.
    pub fn schema(&self, version: &str) -> Option<&Value> {
        self.schemas
            .iter()
            .find(|(v, _)| v == version)
            .map(|(_, s)| s)
    }

    /// The printer columns of one version (empty for built-ins).
    pub fn columns(&self, version: &str) -> &[Value] {
        self.printer_columns
            .iter()
            .find(|(v, _)| v == version)
            .map_or(&[], |(_, c)| c.as_slice())
    }

    /// The `APIResource` entries for discovery (the resource and its subresources).
    pub fn discovery_entries(&self) -> Vec<Value> {
        let mut verbs = vec![
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ];
        verbs.sort_unstable();
        let mut main = json!({
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": verbs,
        });
        if let Some(map) = main.as_object_mut() {
            if !self.short_names.is_empty() {
                map.insert("shortNames".into(), json!(self.short_names));
            }
            if !self.categories.is_empty() {
                map.insert("categories".into(), json!(self.categories));
            }
        }
        let mut entries = vec![main];
        if self.status_subresource {
            entries.push(json!({
                "name": format!("{}/status", self.plural),
                "singularName": "",
                "namespaced": self.namespaced,
                "kind": self.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        entries
    }
}

/// Description of a built-in kind, turned into a [`ResourceType`] by [`builtins`].
struct Builtin {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    short: &'static [&'static str],
    categories: &'static [&'static str],
    namespaced: bool,
    status: bool,
    fields: &'static [&'static str],
}

const EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

const BUILTINS: &[Builtin] = &[
    Builtin {
        group: "",
        version: "v1",
        kind: "Namespace",
        plural: "namespaces",
        short: &["ns"],
        categories: &[],
        namespaced: false,
        status: true,
        fields: &["status.phase"],
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "Node",
        plural: "nodes",
        short: &["no"],
        categories: &[],
        namespaced: false,
        status: true,
        fields: &["spec.unschedulable"],
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "Pod",
        plural: "pods",
        short: &["po"],
        categories: &["all"],
        namespaced: true,
        status: true,
        fields: &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "Event",
        plural: "events",
        short: &["ev"],
        categories: &[],
        namespaced: true,
        status: false,
        fields: EVENT_FIELDS,
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "ConfigMap",
        plural: "configmaps",
        short: &["cm"],
        categories: &[],
        namespaced: true,
        status: false,
        fields: &[],
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "ServiceAccount",
        plural: "serviceaccounts",
        short: &["sa"],
        categories: &[],
        namespaced: true,
        status: false,
        fields: &[],
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "ResourceQuota",
        plural: "resourcequotas",
        short: &["quota"],
        categories: &[],
        namespaced: true,
        status: true,
        fields: &[],
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "LimitRange",
        plural: "limitranges",
        short: &["limits"],
        categories: &[],
        namespaced: true,
        status: false,
        fields: &[],
    },
    Builtin {
        group: "events.k8s.io",
        version: "v1",
        kind: "Event",
        plural: "events",
        short: &["ev"],
        categories: &[],
        namespaced: true,
        status: false,
        fields: &[
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "regarding.apiVersion",
            "reason",
            "reportingController",
            "type",
        ],
    },
    // Storage only (no controller creates pods from it): the ipkeep controller reads a pod's
    // owning StatefulSet's own annotations and notices when it is deleted.
    Builtin {
        group: "apps",
        version: "v1",
        kind: "StatefulSet",
        plural: "statefulsets",
        short: &["sts"],
        categories: &["all"],
        namespaced: true,
        status: true,
        fields: &[],
    },
    Builtin {
        group: "coordination.k8s.io",
        version: "v1",
        kind: "Lease",
        plural: "leases",
        short: &[],
        categories: &[],
        namespaced: true,
        status: false,
        fields: &[],
    },
    Builtin {
        group: CRD_GROUP,
        version: "v1",
        kind: "CustomResourceDefinition",
        plural: "customresourcedefinitions",
        short: &["crd", "crds"],
        categories: &["api-extensions"],
        namespaced: false,
        status: true,
        fields: &[],
    },
];

/// The built-in kinds this server serves.
pub fn builtins() -> Vec<Arc<ResourceType>> {
    BUILTINS
        .iter()
        .map(|b| {
            Arc::new(ResourceType {
                group: b.group.into(),
                versions: vec![b.version.into()],
                kind: b.kind.into(),
                plural: b.plural.into(),
                singular: b.kind.to_lowercase(),
                short_names: b.short.iter().map(|s| s.to_string()).collect(),
                categories: b.categories.iter().map(|s| s.to_string()).collect(),
                namespaced: b.namespaced,
                status_subresource: b.status,
                selectable_fields: b.fields.iter().map(|s| s.to_string()).collect(),
                printer_columns: Vec::new(),
                schemas: Vec::new(),
                crd_name: None,
            })
        })
        .collect()
}

/// Why a CustomResourceDefinition cannot be registered.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("failed to register CustomResourceDefinition: {0}")]
pub struct CrdError(pub String);

/// Turn a CustomResourceDefinition object into the resource type it defines.
pub fn from_crd(crd: &Value) -> Result<ResourceType, CrdError> {
    let text = |v: &Value, path: &[&str]| -> Option<String> {
        let mut cur = v;
        for p in path {
            cur = cur.get(p)?;
        }
        cur.as_str().map(str::to_string)
    };
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let spec = crd
        .get("spec")
        .ok_or_else(|| CrdError("spec is missing".into()))?;
    let group = text(spec, &["group"]).ok_or_else(|| CrdError("spec.group is missing".into()))?;
    let names = spec
        .get("names")
        .ok_or_else(|| CrdError("spec.names is missing".into()))?;
    let kind =
        text(names, &["kind"]).ok_or_else(|| CrdError("spec.names.kind is missing".into()))?;
    let plural =
        text(names, &["plural"]).ok_or_else(|| CrdError("spec.names.plural is missing".into()))?;
    let expected_name = format!("{plural}.{group}");
    if let Some(name) = text(crd, &["metadata", "name"])
        && name != expected_name
    {
        return Err(CrdError(format!(
            "metadata.name must be {expected_name}, not {name}"
        )));
    }
    let singular = text(names, &["singular"]).unwrap_or_else(|| kind.to_lowercase());
    let namespaced = match text(spec, &["scope"]).as_deref() {
        Some("Namespaced") => true,
        Some("Cluster") => false,
        other => {
            return Err(CrdError(format!(
                "spec.scope must be Namespaced or Cluster, not {other:?}"
            )));
        }
    };
    let mut versions = Vec::new();
    let mut storage_first = Vec::new();
    let mut status_subresource = false;
    let mut selectable_fields = Vec::new();
    let mut printer_columns = Vec::new();
    let mut schemas = Vec::new();
    for v in spec
        .get("versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(name) = text(v, &["name"]) else {
            continue;
        };
        if v.get("served").and_then(Value::as_bool) == Some(false) {
            continue;
        }
        if v.get("storage").and_then(Value::as_bool) == Some(true) {
            storage_first.insert(0, name.clone());
        } else {
            storage_first.push(name.clone());
        }
        if v.pointer("/subresources/status").is_some() {
            status_subresource = true;
        }
        for f in v
            .get("selectableFields")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(path) = f.get("jsonPath").and_then(Value::as_str) {
                let path = path.trim_start_matches('.').to_string();
                if !selectable_fields.contains(&path) {
                    selectable_fields.push(path);
                }
            }
        }
        let columns = v
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        printer_columns.push((name.clone(), columns));
        if let Some(schema) = v.pointer("/schema/openAPIV3Schema") {
            schemas.push((name.clone(), schema.clone()));
        }
        versions.push(name);
    }
    if storage_first.is_empty() {
        return Err(CrdError(format!("{expected_name} serves no version")));
    }
    Ok(ResourceType {
        group,
        versions: storage_first,
        kind,
        plural,
        singular,
        short_names: strings(names.get("shortNames")),
        categories: strings(names.get("categories")),
        namespaced,
        status_subresource,
        selectable_fields,
        printer_columns,
        schemas,
        crd_name: Some(expected_name),
    })
}

/// The status a registered CRD carries (Established, names accepted).
pub fn crd_status(crd: &Value, now: &str) -> Value {
    let names = crd
        .pointer("/spec/names")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let stored: Vec<Value> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .filter_map(|v| v.get("name").cloned())
        .collect();
    let condition = |type_: &str, reason: &str, message: &str| json!({"type": type_, "status": "True", "lastTransitionTime": now, "reason": reason, "message": message});
    json!({
        "acceptedNames": names,
        "conditions": [
            condition("NamesAccepted", "NoConflicts", "no conflicts found"),
            condition("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        ],
        "storedVersions": stored,
    })
}

/// All resource types currently served, looked up by path segments or by kubectl-style names.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    types: Vec<Arc<ResourceType>>,
}

impl Registry {
    /// A registry holding the built-in kinds.
    pub fn with_builtins() -> Self {
        Registry { types: builtins() }
    }

    /// Every served type.
    pub fn all(&self) -> &[Arc<ResourceType>] {
        &self.types
    }

    /// The type served at `/apis/{group}/{version}/{plural}` (`/api/v1/{plural}` for the core group).
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.types
            .iter()
            .find(|t| {
                t.group == group && t.plural == plural && t.versions.iter().any(|v| v == version)
            })
            .cloned()
    }

    /// The type a CRD of this name registered.
    pub fn find_crd(&self, crd_name: &str) -> Option<Arc<ResourceType>> {
        self.types
            .iter()
            .find(|t| t.crd_name.as_deref() == Some(crd_name))
            .cloned()
    }

    /// Register (or replace) the type a CRD defines.
    pub fn register(&mut self, t: ResourceType) {
        let t = Arc::new(t);
        if let Some(slot) = self
            .types
            .iter_mut()
            .find(|x| x.crd_name.is_some() && x.crd_name == t.crd_name)
        {
            *slot = t;
        } else {
            self.types.push(t);
        }
    }

    /// Forget the type a deleted CRD registered.
    pub fn unregister(&mut self, crd_name: &str) {
        self.types
            .retain(|t| t.crd_name.as_deref() != Some(crd_name));
    }

    /// API groups with their versions, in registration order (core group first, as `""`).
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut groups: Vec<(String, Vec<String>)> = Vec::new();
        for t in &self.types {
            let entry = match groups.iter_mut().position(|(g, _)| *g == t.group) {
                Some(i) => &mut groups[i].1,
                None => {
                    groups.push((t.group.clone(), Vec::new()));
                    let last = groups.len() - 1;
                    &mut groups[last].1
                }
            };
            for v in &t.versions {
                if !entry.contains(v) {
                    entry.push(v.clone());
                }
            }
        }
        groups
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd() -> Value {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "ipreservations.ipkeep.dev"},
            "spec": {
                "group": "ipkeep.dev",
                "names": {"kind": "IPReservation", "plural": "ipreservations", "shortNames": ["ipr"], "categories": ["all"]},
                "scope": "Namespaced",
                "versions": [{
                    "name": "v1alpha1", "served": true, "storage": true,
                    "subresources": {"status": {}},
                    "selectableFields": [{"jsonPath": ".spec.nodeName"}],
                    "additionalPrinterColumns": [{"name": "Node", "type": "string", "jsonPath": ".spec.nodeName"}],
                    "schema": {"openAPIV3Schema": {"type": "object"}}
                }]
            }
        })
    }

    #[test]
    fn crd_becomes_a_resource_type() {
        let t = from_crd(&crd()).unwrap();
        assert_eq!(t.key(), "ipkeep.dev/ipreservations");
        assert_eq!(t.singular, "ipreservation");
        assert_eq!(t.short_names, vec!["ipr"]);
        assert!(t.namespaced && t.status_subresource);
        assert_eq!(t.selectable_fields, vec!["spec.nodeName"]);
        assert_eq!(t.columns("v1alpha1").len(), 1);
        assert!(t.schema("v1alpha1").is_some());
        assert_eq!(t.group_kind(), "IPReservation.ipkeep.dev");
    }

    #[test]
    fn crd_errors_are_reported() {
        let mut bad = crd();
        bad["metadata"]["name"] = json!("wrong.name");
        assert!(
            from_crd(&bad)
                .unwrap_err()
                .to_string()
                .contains("must be ipreservations.ipkeep.dev")
        );
        let mut bad = crd();
        bad["spec"]["scope"] = json!("Galaxy");
        assert!(from_crd(&bad).is_err());
    }

    #[test]
    fn unconditional_updates_follow_each_kinds_strategy() {
        let r = Registry::with_builtins();
        let refused: Vec<String> = r
            .all()
            .iter()
            .filter(|t| !t.allows_unconditional_update())
            .map(|t| t.group_resource())
            .collect();
        assert_eq!(
            refused,
            [
                "leases.coordination.k8s.io",
                "customresourcedefinitions.apiextensions.k8s.io"
            ]
        );
        assert!(!from_crd(&crd()).unwrap().allows_unconditional_update());
    }

    #[test]
    fn registry_registers_and_unregisters() {
        let mut r = Registry::with_builtins();
        assert!(r.find("", "v1", "pods").is_some());
        assert!(r.find("", "v2", "pods").is_none());
        r.register(from_crd(&crd()).unwrap());
        assert!(r.find("ipkeep.dev", "v1alpha1", "ipreservations").is_some());
        assert!(
            r.groups()
                .iter()
                .any(|(g, v)| g == "ipkeep.dev" && v == &["v1alpha1"])
        );
        r.unregister("ipreservations.ipkeep.dev");
        assert!(r.find("ipkeep.dev", "v1alpha1", "ipreservations").is_none());
    }
}
