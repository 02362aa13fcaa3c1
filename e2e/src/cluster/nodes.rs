//! Nodes without kubelets, as in controller-runtime's envtest: the test writes a Node object
//! once ([`ControlPlane::add_node`]) and binds pods to it, writes their status itself, and finishes
//! their deletion itself ([`force_delete_pod`]). Nothing heartbeats, so the shared control plane
//! runs kube-controller-manager without its node lifecycle controller
//! ([`super::ControlPlaneOptions::fixture_nodes`]). A node's own identity ([`ControlPlane::node_config`])
//! is here for the tests of the Node authorizer.

use k8s_openapi::{
    api::core::v1::{Node, Pod},
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, Preconditions},
};
use serde_json::json;

use super::plane::{ControlPlane, ControlPlaneError};

/// The field manager of the Node objects the harness writes.
const MANAGER: &str = "ipkeep-e2e-fixture";

/// Whether `name` is a valid DNS-1123 subdomain (a Node name).
fn valid_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn check_node_name(name: &str) -> Result<(), ControlPlaneError> {
    if valid_node_name(name) {
        return Ok(());
    }
    Err(ControlPlaneError::Invalid {
        what: "node name",
        value: name.to_owned(),
        why: "a Node name is a DNS-1123 subdomain: lowercase letters, digits, '-' and '.'",
    })
}

/// The status a kubelet posts on registration: Ready, no pressure, room for 250 pods (the
/// scheduler counts pods against `allocatable`).
fn ready_status() -> serde_json::Value {
    let now = serde_json::to_value(Time(Timestamp::now())).unwrap_or(serde_json::Value::Null);
    let condition = |type_: &str, status: &str, reason: &str| {
        json!({
            "type": type_, "status": status, "reason": reason,
            "message": "a fixture Node: no kubelet behind it",
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        })
    };
    let resources =
        json!({ "cpu": "32", "memory": "64Gi", "pods": "250", "ephemeral-storage": "100Gi" });
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "status": {
            "conditions": [
                condition("Ready", "True", "KubeletReady"),
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                condition("NetworkUnavailable", "False", "RouteCreated"),
            ],
            "capacity": resources,
            "allocatable": resources,
            "addresses": [{ "type": "InternalIP", "address": "127.0.0.1" }],
        }
    })
}

impl ControlPlane {
    /// Writes Node `name` (as admin, once: writing it again changes nothing): Ready, with the
    /// `kubernetes.io/hostname` label, and without taints, so that the scheduler binds pods to
    /// it and the pod garbage collector, which only collects the pods of Nodes that do not
    /// exist, leaves its pods alone. The API server's `TaintNodesByCondition` admission taints
    /// every new Node `node.kubernetes.io/not-ready`; the node lifecycle controller would lift
    /// it, but a plane for fixture Nodes does not run one, so this lifts it.
    pub async fn add_node(&self, name: &str) -> Result<Node, ControlPlaneError> {
        check_node_name(name)?;
        let api_err = |what: &str| {
            let what = format!("{what} Node {name}");
            move |source| ControlPlaneError::Api { what, source }
        };
        let nodes: Api<Node> = Api::all(self.client()?);
        let pp = PatchParams::apply(MANAGER).force();
        let node = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                },
            },
        });
        nodes
            .patch(name, &pp, &Patch::Apply(&node))
            .await
            .map_err(api_err("create"))?;
        nodes
            .patch_status(name, &pp, &Patch::Apply(&ready_status()))
            .await
            .map_err(api_err("write the Ready status of"))?;
        nodes
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "taints": null } })),
            )
            .await
            .map_err(api_err("lift the admission's not-ready taint from"))
    }

    /// A client configuration for node `name`'s own identity (`system:node:<name>` in
    /// `system:nodes`), as a kubelet has: the Node authorizer and the NodeRestriction admission
    /// plugin limit it to its own Node, its Lease and the pods bound to it. The certificate is
    /// signed on first use and kept in the state directory.
    pub fn node_config(&self, name: &str) -> Result<kube::Config, ControlPlaneError> {
        check_node_name(name)?;
        let file = format!("node-{name}");
        let pki = self.pki();
        let cert = match pki.ca_cert.with_file_name(format!("{file}.crt")) {
            existing if existing.is_file() => super::pki::ClientCert {
                key: existing.with_extension("key"),
                cert: existing,
            },
            _ => pki.client_cert(&file, &format!("system:node:{name}"), Some("system:nodes"))?,
        };
        let mut config = self.config();
        config.auth_info = kube::config::AuthInfo {
            client_certificate: Some(cert.cert.to_string_lossy().into_owned()),
            client_key: Some(cert.key.to_string_lossy().into_owned()),
            ..Default::default()
        };
        Ok(config)
    }
}

/// Deletes pod `name` at once, as `kubectl delete --grace-period=0 --force` does: a bound pod
/// is removed without waiting for a kubelet. With `uid`, only that pod (a precondition), so a
/// re-created pod of the same name is never hit: what a kubelet does to finish the deletion of
/// a Terminating pod once its containers stopped. Returns whether it deleted one (not when the
/// pod is gone already, or `uid` names a pod that is).
pub async fn force_delete_pod(
    pods: &Api<Pod>,
    name: &str,
    uid: Option<&str>,
) -> Result<bool, ControlPlaneError> {
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: uid.map(|uid| Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match pods.delete(name, &dp).await {
        Ok(_) => Ok(true),
        // Gone already, or a new pod by that name (the UID precondition failed).
        Err(kube::Error::Api(s)) if s.code == 404 || (s.code == 409 && uid.is_some()) => Ok(false),
        Err(source) => Err(ControlPlaneError::Api {
            what: format!("delete pod {name} with grace period 0"),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::valid_node_name;

    #[test]
    fn node_names_are_dns_subdomains() {
        for ok in ["node-a", "n1", "a.b-c.d"] {
            assert!(valid_node_name(ok), "{ok}");
        }
        for bad in [
            "",
            "Node",
            "-a",
            "a-",
            "a..b",
            "a_b",
            "../x",
            &"x".repeat(64),
        ] {
            assert!(!valid_node_name(bad), "{bad}");
        }
    }
}
