//! The IPReservation custom resource (contract 1 of the design): the Rust types are the CRD's
//! source of truth; `ipkeep-operator crd` prints the definition and a test compares it with
//! `crds/ipreservations.ipkeep.dev.yaml`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{
    CustomResource, CustomResourceExt, KubeSchema,
    core::{Message, Rule},
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{phase::Phase, retention::RetainFor};
use ipkeep_reservation::PodKey;

/// The API group of ipkeep's resources.
pub const GROUP: &str = "ipkeep.dev";
/// The label every reservation the controller creates carries (`app.kubernetes.io/managed-by`).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The value of [`MANAGED_BY_LABEL`] on reservations the controller created.
pub const MANAGED_BY_VALUE: &str = "ipkeep";
/// The condition type set on a reservation that claims an address an older reservation holds.
pub const CONDITION_CONFLICT: &str = "Conflict";
/// The condition type the node's agent sets while ipkeep is not in charge of the node's network:
/// the addresses are reserved on paper only (`reason` says why, `message` what to fix).
pub const CONDITION_UNPROTECTED: &str = "Unprotected";

/// Addresses kept for a pod of the same namespace and name: while the pod lives (`Bound`) and for
/// `retainFor` after it is gone (`Released`). The plugin gives them back to a returning pod.
// clippy's duplicated_attributes lint reads the repeated keys of each `printcolumn(...)` as
// duplicates of the first one's; they are separate columns.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "ipkeep.dev",
    version = "v1alpha1",
    kind = "IPReservation",
    plural = "ipreservations",
    singular = "ipreservation",
    namespaced,
    status = "IPReservationStatus",
    derive = "PartialEq",
    printcolumn(
        name = "IPs",
        type_ = "string",
        json_path = ".spec.ips",
        description = "the reserved addresses"
    ),
    printcolumn(
        name = "Node",
        type_ = "string",
        json_path = ".spec.nodeName",
        description = "the node whose ranges hold the addresses"
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Bound while the pod lives, Released after"
    ),
    printcolumn(
        name = "Unprotected",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Unprotected\")].reason",
        description = "why the node's IPAM is not ipkeep, while it is not (empty: protected)"
    ),
    printcolumn(
        name = "Release-Time",
        type_ = "string",
        json_path = ".status.releaseTime",
        description = "when a Released reservation is deleted"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Pod-UID",
        type_ = "string",
        json_path = ".status.podUID",
        priority = 1,
        description = "the pod that last held the addresses"
    ),
    printcolumn(
        name = "Retain-For",
        type_ = "string",
        json_path = ".spec.retainFor",
        priority = 1,
        description = "how long the addresses stay reserved after the pod is gone"
    ),
    shortname = "ipr",
    category = "ipkeep",
    selectable = ".spec.nodeName",
    doc = "Addresses kept for the pod of the same namespace and name, on one node."
)]
#[serde(rename_all = "camelCase")]
pub struct IPReservationSpec {
    /// The reserved addresses, at most one per address family.
    #[schemars(length(min = 1, max = 2))]
    #[x_kube(validation = Rule::new("self.all(ip, isIP(ip))").message("every entry of ips must be an IP address"))]
    // What the plugin can never hand out to a pod (kube-apiserver's IP library: isGlobalUnicast
    // is false for unspecified, loopback, multicast and 255.255.255.255); link-local unicast
    // stays allowed, as a host-local range may use it.
    #[x_kube(validation = Rule::new("self.all(ip, !isIP(ip) || ip(ip).isGlobalUnicast() || ip(ip).isLinkLocalUnicast())").message("ips must be addresses a pod can hold: not unspecified (0.0.0.0, ::), loopback, multicast or broadcast (255.255.255.255)"))]
    #[x_kube(validation = Rule::new("self.all(ip, !isIP(ip) || self.exists_one(o, isIP(o) && ip(o).family() == ip(ip).family()))").message("ips holds at most one address per family"))]
    // No `reason`: the API server turns FieldValueDuplicate into `Duplicate value: "array"` and
    // drops the message.
    #[x_kube(validation = Rule::new("self.all(ip, self.exists_one(o, o == ip))").message("ips must not repeat an address"))]
    pub ips: Vec<IpString>,
    /// The node whose pod ranges the addresses belong to (node-local allocation).
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message("nodeName must be a valid node name (lowercase DNS subdomain)"))]
    pub node_name: String,
    /// How long the addresses stay reserved after the pod is gone (`90s`, `30m`, `24h`, `7d`);
    /// the controller's default applies when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // The grammar as an OpenAPI pattern (checked by every API server, cheaply); the maximum
    // needs arithmetic, so it is a CEL rule. Both come from `RetainFor`, as the parsers do.
    #[schemars(length(min = 2, max = 7), regex(pattern = RetainFor::PATTERN))]
    #[x_kube(validation = retain_for_cap())]
    pub retain_for: Option<String>,
}

/// The CEL rule capping `spec.retainFor` at [`RetainFor::MAX`].
fn retain_for_cap() -> Rule {
    Rule::new(RetainFor::cel_cap()).message(Message::Message(format!(
        "retainFor must be at most {}",
        RetainFor::MAX
    )))
}

/// One reserved address, as text (`10.244.1.17`, `fd00:10:244:1::11`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(transparent)]
pub struct IpString(#[schemars(length(min = 2, max = 45))] pub String);

/// Where a reservation stands; the controller is its only writer.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPReservationStatus {
    /// `Bound` while a pod with this name holds the addresses, `Released` once it is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// The UID of the pod that last held the addresses.
    #[serde(default, rename = "podUID", skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// When the pod went away (or, for a reservation made by hand, when it was created).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_at: Option<Time>,
    /// `releasedAt + retainFor`: when the reservation is deleted and its addresses become free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_time: Option<Time>,
    /// The generation of the spec this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Set while an older reservation on the same node holds one of the addresses: which address
    /// and which reservation. The `Conflict` condition says the same for people; the agent
    /// writes no file for such a reservation.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "conflict_as_found"
    )]
    pub conflict: Option<ConflictStatus>,
    /// Standard conditions: `Conflict` when an older reservation holds the same address (the
    /// controller's), `Unprotected` while ipkeep is not in charge on the node (the agent's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// `status.conflict` as the API holds it, or nothing when it cannot be read: a `heldBy` whose
/// names are not valid (a status edited by hand; the controller writes only valid ones) must not
/// make the whole reservation undecodable, which would stall every watch that lists it. The
/// controller computes the conflict again and writes it back.
fn conflict_as_found<'de, D>(deserializer: D) -> Result<Option<ConflictStatus>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let value = Option::<serde_json::Value>::deserialize(deserializer)?;
    Ok(value.and_then(|v| serde_json::from_value(v).ok()))
}

/// An address of this reservation that an older reservation on the same node holds.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConflictStatus {
    /// The address both reservations claim.
    pub ip: IpString,
    /// The older reservation holding it.
    pub held_by: PodKey,
}

impl IPReservation {
    /// Whether the controller recorded a conflict: `status.conflict`, the source of truth (the
    /// `Conflict` condition is written with it for people and `kubectl wait`, never read alone).
    pub fn in_conflict(&self) -> bool {
        self.status.as_ref().is_some_and(|s| s.conflict.is_some())
    }
}

/// Errors of rendering the CRD.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// The definition could not be serialized to YAML.
    #[error("failed to serialize the IPReservation CRD to YAML")]
    Serialize(#[source] serde_saphyr::ser::Error),
}

/// The CustomResourceDefinition as YAML, exactly as `crds/ipreservations.ipkeep.dev.yaml` holds it.
pub fn crd_yaml() -> Result<String, CrdError> {
    serde_saphyr::to_string(&IPReservation::crd()).map_err(CrdError::Serialize)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_conflict_held_by_an_invalid_name_reads_as_none_and_the_rest_of_the_status_is_kept() {
        let status = |held_by: serde_json::Value| {
            serde_json::from_value::<IPReservationStatus>(serde_json::json!({
                "phase": "Bound",
                "conflict": { "ip": "10.0.0.5", "heldBy": held_by },
            }))
            .unwrap()
        };
        let valid = status(serde_json::json!({ "namespace": "db", "name": "older" }));
        assert_eq!(
            valid.conflict.unwrap().held_by,
            PodKey::new("db", "older").unwrap()
        );
        for invalid in [
            serde_json::json!({ "namespace": "Not_A_Namespace", "name": "older" }),
            serde_json::json!({ "namespace": "db", "name": "" }),
            serde_json::json!({ "namespace": "db" }),
        ] {
            let read = status(invalid.clone());
            assert_eq!(read.conflict, None, "{invalid}");
            assert_eq!(read.phase, Some(Phase::Bound), "{invalid}");
        }
    }
}
