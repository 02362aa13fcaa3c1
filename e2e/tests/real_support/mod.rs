//! Shared by the tests that run the controller and the agent against the REAL control plane
//! (`controller_real.rs`, `agent_real.rs`; included with `#[path]`): the shared control plane with
//! the repository's IPReservation CRD installed, the Node objects `node-a` and `node-b` the
//! controller scenarios bind their pods to (fixtures with no kubelet behind them, as in envtest:
//! the tests write the pods' status and finish their deletion themselves), and the chart's RBAC
//! with clients of its ServiceAccounts.
//!
//! Needs the control plane's binaries (`make cluster-bins`, or `IPKEEP_CLUSTER_BIN_DIR`); the
//! tests fail loudly without them.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub use crate::shared::*;

use std::path::Path;

use ipkeep_e2e::{cluster::Cluster, proxy::FaultProxy};

/// The node every controller scenario binds its pods to (`fixtures/controller.rs` says
/// `node-a`): a Node object, Ready and untainted, so that the pod garbage collector does not
/// take its pods for orphans and the scheduler binds StatefulSet pods to it.
pub const NODE: &str = "node-a";

/// The node a returning pod moves to (`fixtures/controller.rs`).
pub const NODE_B: &str = "node-b";

static RBAC: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
static NODE_A: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
static NODE_B_OBJECT: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();

/// The fixture Node `name` (`Cluster::add_node`), written once per test binary.
async fn fixture_node(cell: &'static tokio::sync::OnceCell<()>, cluster: &Cluster, name: &str) {
    cell.get_or_init(|| async {
        cluster
            .add_node(name)
            .await
            .unwrap_or_else(|e| panic!("failed to write the Node {name}: {e}"));
    })
    .await;
}

/// The Node [`NODE`].
pub async fn node_a(cluster: &Cluster) {
    fixture_node(&NODE_A, cluster, NODE).await;
}

/// The Node [`NODE_B`].
pub async fn node_b(cluster: &Cluster) {
    fixture_node(&NODE_B_OBJECT, cluster, NODE_B).await;
}

/// The audit log lines (JSON events) of the shared control plane whose request URI contains
/// every one of `needles`.
pub fn audited(cluster: &Cluster, needles: &[&str]) -> Vec<serde_json::Value> {
    let path = cluster
        .audit_log_path()
        .expect("the shared control plane keeps an audit log");
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("failed to read the audit log {}: {e}", path.display()));
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| {
            let uri = e["requestURI"].as_str().unwrap_or_default();
            needles.iter().all(|n| uri.contains(n))
        })
        .collect()
}

/// The release name the chart's RBAC is rendered with: its ServiceAccounts are
/// `ipkeep-controller` and `ipkeep-agent`.
pub const RELEASE: &str = "ipkeep";

/// The ServiceAccount the chart gives the controller.
pub const CONTROLLER_ACCOUNT: &str = "ipkeep-controller";

/// The ServiceAccount the chart gives the agent.
pub const AGENT_ACCOUNT: &str = "ipkeep-agent";

/// Renders the chart's RBAC (`templates/controller-rbac.yaml`, `templates/agent-rbac.yaml`, default
/// values) with the built helm into a fresh release namespace and applies it, once per test
/// binary; returns the release namespace. Clients of [`CONTROLLER_ACCOUNT`] and
/// [`AGENT_ACCOUNT`] there hold exactly the rights the chart grants.
pub async fn chart_rbac(cluster: &'static Cluster) -> &'static str {
    RBAC.get_or_init(|| async {
        let ns = cluster
            .fresh_namespace("ipkeep-release")
            .await
            .expect("a release namespace");
        let chart = chart_dir();
        let rendered = run_ok(
            cluster.helm(),
            &[
                "template",
                RELEASE,
                chart.to_str().expect("a UTF-8 path"),
                "--namespace",
                &ns,
                "--show-only",
                "templates/controller-rbac.yaml",
                "--show-only",
                "templates/agent-rbac.yaml",
            ],
            None,
        );
        kubectl_ok(cluster, &["apply", "-f", "-"], Some(&rendered));
        ns
    })
    .await
}

/// A client of the chart's ServiceAccount `account` whose requests go through a fault proxy of
/// its own (the test's own requests go straight to the API server), and that proxy.
pub async fn proxied_account_client(
    cluster: &'static Cluster,
    account: &str,
) -> (kube::Client, FaultProxy) {
    let ns = chart_rbac(cluster).await;
    let config = cluster
        .service_account_config(ns, account)
        .await
        .unwrap_or_else(|e| panic!("failed to configure a client of {ns}/{account}: {e}"));
    let proxy = FaultProxy::in_front_of(cluster)
        .await
        .expect("a fault proxy");
    let client =
        kube::Client::try_from(proxy.config_through(config)).expect("a client through the proxy");
    (client, proxy)
}

/// A client of the controller's ServiceAccount (exactly the chart's RBAC).
pub async fn controller_client(cluster: &'static Cluster) -> kube::Client {
    let ns = chart_rbac(cluster).await;
    cluster
        .service_account_client(ns, CONTROLLER_ACCOUNT)
        .await
        .expect("a client of the controller's ServiceAccount")
}

/// A client of the agent's ServiceAccount (exactly the chart's RBAC).
pub async fn agent_client(cluster: &'static Cluster) -> kube::Client {
    let ns = chart_rbac(cluster).await;
    cluster
        .service_account_client(ns, AGENT_ACCOUNT)
        .await
        .expect("a client of the agent's ServiceAccount")
}

/// Writes a kubeconfig of `account` (in the release namespace) to `path`.
pub async fn account_kubeconfig(cluster: &'static Cluster, account: &str, path: &Path) {
    let ns = chart_rbac(cluster).await;
    cluster
        .write_service_account_kubeconfig(ns, account, path)
        .await
        .unwrap_or_else(|e| panic!("failed to write a kubeconfig of {ns}/{account}: {e}"));
}
