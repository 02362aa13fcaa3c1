//! A registered Node kept Ready without a kubelet: the scheduler binds pods to it, the node
//! lifecycle controller leaves them alone, and a tiny pod finalizer does the one thing a kubelet
//! must do for the control plane to make progress — finish the deletion of pods bound to the
//! node (the API server only marks a scheduled pod with a `deletionTimestamp` and waits for the
//! kubelet to delete it with grace 0).
//!
//! The agent runs on its own thread and tokio runtime, so it outlives the runtime of the test
//! that started it and can serve many tests.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::{
    api::{
        coordination::v1::Lease,
        core::v1::{Node, Pod},
    },
    apimachinery::pkg::apis::meta::v1::{MicroTime, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions, WatchEvent, WatchParams},
};
use serde_json::json;

use super::plane::{Cluster, ClusterError};

/// The field manager of everything the agent writes.
const MANAGER: &str = "ipkeep-e2e-node";
/// The lease the node lifecycle controller watches: 40 s, renewed every 10 s, as a kubelet does.
const LEASE_SECONDS: i32 = 40;
const RENEW_EVERY: Duration = Duration::from_secs(10);
/// The full status (with heartbeat times) is re-posted this often; the lease carries health.
const STATUS_EVERY: Duration = Duration::from_secs(60);

/// A stand-in node: registered, Ready, its Lease renewed, and pods bound to it finalized on
/// deletion. Stops (leaving the Node object) when dropped.
#[derive(Debug)]
pub struct NodeAgent {
    name: String,
    finalized: Arc<AtomicU64>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

fn api_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ClusterError {
    let what = what.into();
    move |source| ClusterError::Api { what, source }
}

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

fn now_json() -> serde_json::Value {
    serde_json::to_value(Time(Timestamp::now())).unwrap_or(serde_json::Value::Null)
}

fn node_status() -> serde_json::Value {
    let now = now_json();
    let condition = |type_: &str, status: &str, reason: &str| {
        json!({
            "type": type_, "status": status, "reason": reason,
            "message": "ipkeep-e2e stand-in node",
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
            "nodeInfo": {
                "architecture": "amd64", "operatingSystem": "linux", "osImage": "ipkeep-e2e",
                "kernelVersion": "", "kubeletVersion": "v1.34.4", "kubeProxyVersion": "",
                "containerRuntimeVersion": "ipkeep-e2e://0", "bootID": "", "machineID": "", "systemUUID": "",
            },
        }
    })
}

async fn register(client: &Client, name: &str) -> Result<(), ClusterError> {
    let nodes: Api<Node> = Api::all(client.clone());
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
                "ipkeep.dev/stand-in-node": "true",
            },
        },
    });
    nodes
        .patch(name, &pp, &Patch::Apply(&node))
        .await
        .map_err(api_err(format!("register Node {name}")))?;
    nodes
        .patch_status(name, &pp, &Patch::Apply(&node_status()))
        .await
        .map_err(api_err(format!("post the status of Node {name}")))?;
    renew_lease(client, name).await
}

async fn renew_lease(client: &Client, name: &str) -> Result<(), ClusterError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let uid = nodes
        .get(name)
        .await
        .map_err(api_err(format!("read Node {name}")))?
        .metadata
        .uid
        .unwrap_or_default();
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": "kube-node-lease",
            "ownerReferences": [{ "apiVersion": "v1", "kind": "Node", "name": name, "uid": uid }],
        },
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": serde_json::to_value(MicroTime(Timestamp::now())).unwrap_or_default(),
        },
    });
    leases
        .patch(
            name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&lease),
        )
        .await
        .map_err(api_err(format!("renew the Lease kube-node-lease/{name}")))?;
    Ok(())
}

async fn heartbeat(client: Client, name: String) {
    let mut last_status = Instant::now();
    loop {
        tokio::time::sleep(RENEW_EVERY).await;
        if let Err(e) = renew_lease(&client, &name).await {
            eprintln!("ipkeep-e2e node {name}: {}", crate::error_chain(&e));
        }
        if last_status.elapsed() >= STATUS_EVERY {
            let nodes: Api<Node> = Api::all(client.clone());
            let pp = PatchParams::apply(MANAGER).force();
            match nodes
                .patch_status(&name, &pp, &Patch::Apply(&node_status()))
                .await
            {
                Ok(_) => last_status = Instant::now(),
                Err(e) => eprintln!("ipkeep-e2e node {name}: failed to post the node status: {e}"),
            }
        }
    }
}

/// Deletes with grace 0 (and the pod's UID as precondition, so a re-created pod of the same
/// name is never hit) a pod bound to this node that has a deletionTimestamp.
async fn finalize(pods_of: &dyn Fn(&str) -> Api<Pod>, pod: &Pod, finalized: &AtomicU64) {
    if pod.metadata.deletion_timestamp.is_none() {
        return;
    }
    let (Some(ns), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
        return;
    };
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match pods_of(ns).delete(name, &dp).await {
        Ok(_) => {
            finalized.fetch_add(1, Ordering::Relaxed);
        }
        // Already gone, or a new pod by that name: nothing to finish.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
        Err(e) => eprintln!("ipkeep-e2e node: failed to finish deleting pod {ns}/{name}: {e}"),
    }
}

async fn pod_finalizer(client: Client, name: String, finalized: Arc<AtomicU64>) {
    let all: Api<Pod> = Api::all(client.clone());
    let pods_of = |ns: &str| Api::<Pod>::namespaced(client.clone(), ns);
    let selector = format!("spec.nodeName={name}");
    loop {
        let list = match all.list(&ListParams::default().fields(&selector)).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("ipkeep-e2e node {name}: failed to list its pods: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        for pod in &list.items {
            finalize(&pods_of, pod, &finalized).await;
        }
        let mut version = list.metadata.resource_version.unwrap_or_default();
        loop {
            let wp = WatchParams::default().fields(&selector).timeout(290);
            let stream = match all.watch(&wp, &version).await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("ipkeep-e2e node {name}: failed to watch its pods: {e}");
                    break;
                }
            };
            let mut stream = stream.boxed();
            let mut relist = false;
            loop {
                match stream.try_next().await {
                    Ok(Some(WatchEvent::Added(pod) | WatchEvent::Modified(pod))) => {
                        version = pod.metadata.resource_version.clone().unwrap_or(version);
                        finalize(&pods_of, &pod, &finalized).await;
                    }
                    Ok(Some(WatchEvent::Deleted(pod))) => {
                        version = pod.metadata.resource_version.clone().unwrap_or(version);
                    }
                    Ok(Some(WatchEvent::Bookmark(b))) => version = b.metadata.resource_version,
                    Ok(Some(WatchEvent::Error(_))) | Err(_) => {
                        relist = true;
                        break;
                    }
                    Ok(None) => break,
                }
            }
            if relist {
                break;
            }
        }
    }
}

impl Cluster {
    /// A client configuration for node `name`'s own identity (`system:node:<name>` in
    /// `system:nodes`), as a kubelet has: the Node authorizer and the NodeRestriction admission
    /// plugin limit it to its own Node, its Lease and the pods bound to it. The certificate is
    /// signed on first use and kept in the state directory.
    pub fn node_config(&self, name: &str) -> Result<kube::Config, ClusterError> {
        if !valid_node_name(name) {
            return Err(ClusterError::Invalid {
                what: "node name",
                value: name.to_owned(),
                why: "a Node name is a DNS-1123 subdomain: lowercase letters, digits, '-' and '.'",
            });
        }
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

impl NodeAgent {
    /// Registers Node `name` on `cluster` under the node's own identity
    /// ([`Cluster::node_config`]), starts its heartbeat and pod finalizer, and returns
    /// once the node is Ready and its `node.kubernetes.io/not-ready` taint is gone (the node
    /// lifecycle controller lifts it), i.e. once the scheduler will bind pods to it.
    pub async fn start(cluster: &Cluster, name: &str) -> Result<NodeAgent, ClusterError> {
        // The node's own identity, as a kubelet: its RBAC is the Node authorizer's.
        let config = cluster.node_config(name)?;
        let finalized = Arc::new(AtomicU64::new(0));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (node, count) = (name.to_owned(), Arc::clone(&finalized));
        let thread = std::thread::Builder::new()
            .name(format!("node-{name}"))
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready_tx.send(Err(ClusterError::Invalid {
                            what: "node agent runtime",
                            value: e.to_string(),
                            why: "it could not be built",
                        }));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let client = match Client::try_from(config) {
                        Ok(c) => c,
                        Err(source) => {
                            let _ = ready_tx.send(Err(ClusterError::Api {
                                what: format!("build a client for node {node}"),
                                source,
                            }));
                            return;
                        }
                    };
                    if let Err(e) = register(&client, &node).await {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                    let _ = ready_tx.send(Ok(()));
                    tokio::select! {
                        _ = stopped => {}
                        () = heartbeat(client.clone(), node.clone()) => {}
                        () = pod_finalizer(client, node, count) => {}
                    }
                });
            })
            .map_err(|e| ClusterError::Invalid {
                what: "node agent thread",
                value: e.to_string(),
                why: "it could not be started",
            })?;
        let agent = NodeAgent {
            name: name.to_owned(),
            finalized,
            stop: Some(stop),
            thread: Some(thread),
        };
        match ready_rx.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(ClusterError::Invalid {
                    what: "node agent",
                    value: name.to_owned(),
                    why: "its thread ended before registering the node",
                });
            }
        }
        agent.wait_schedulable(&cluster.client()?).await?;
        Ok(agent)
    }

    async fn wait_schedulable(&self, client: &Client) -> Result<(), ClusterError> {
        let nodes: Api<Node> = Api::all(client.clone());
        let started = Instant::now();
        let what = format!(
            "wait for Node {} to be Ready without the node.kubernetes.io/not-ready taint",
            self.name
        );
        loop {
            let node = nodes.get(&self.name).await.map_err(api_err(what.clone()))?;
            let ready = node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            let tainted = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|ts| ts.iter().any(|t| t.key == "node.kubernetes.io/not-ready"));
            if ready && !tainted {
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(60) {
                return Err(ClusterError::Timeout {
                    what,
                    waited: started.elapsed(),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The Node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many pod deletions the finalizer has finished.
    pub fn finalized(&self) -> u64 {
        self.finalized.load(Ordering::Relaxed)
    }

    /// Stops the heartbeat and the finalizer (the Node object stays; it turns NotReady after
    /// the controller-manager's grace period).
    pub fn stop(&mut self) {
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for NodeAgent {
    fn drop(&mut self) {
        self.stop();
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
