//! The shared real control plane of a test binary (`crate::cluster::shared`) with what the tests
//! on it need: the repository's IPReservation CRD applied once and Established, the Node objects
//! `node-a` and `node-b` the controller scenarios bind their pods to (fixtures with no kubelet
//! behind them, as in envtest: the tests write the pods' status and finish their deletion
//! themselves), the chart's RBAC with clients of its ServiceAccounts, its audit log, and the
//! guard that lets a test change what every other test sees ([`use_plane_alone`]).
//!
//! Needs the control plane's binaries (`make cluster-bins`, or `IPKEEP_CLUSTER_BIN_DIR`); the
//! tests fail loudly without them.

use std::path::Path;

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;

use super::{chart_dir, crd_file, kubectl_ok, run_ok, wait_for};
use crate::{
    cluster::{ControlPlane, shared},
    proxy::FaultProxy,
};

/// The node every controller scenario binds its pods to (`tests/plane/controller_scenarios.rs` says
/// `node-a`): a Node object, Ready and untainted, so that the pod garbage collector does not
/// take its pods for orphans and the scheduler binds StatefulSet pods to it.
pub const NODE: &str = "node-a";

/// The node a returning pod moves to (`tests/plane/controller_scenarios.rs`).
pub const NODE_B: &str = "node-b";

/// The shared control plane of this test binary with the IPReservation CRD applied (once) and
/// Established for longer than the API server's just-established window.
pub async fn control_plane() -> &'static ControlPlane {
    let plane = shared().await.unwrap_or_else(|e| {
        panic!(
            "the real control plane did not start (build its binaries with `make cluster-bins` or set IPKEEP_CLUSTER_BIN_DIR): {}",
            crate::error_chain(&e)
        )
    });
    static CRD: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    CRD.get_or_init(|| async {
        let file = crd_file();
        let file = file.to_str().expect("a UTF-8 path");
        kubectl_ok(plane, &["apply", "--server-side", "-f", file], None);
        kubectl_ok(
            plane,
            &[
                "wait",
                "--for=condition=Established",
                "crd/ipreservations.ipkeep.dev",
                "--timeout=60s",
            ],
            None,
        );
        past_the_just_established_window(plane).await;
    })
    .await;
    plane
}

/// Waits until the CRD has been Established for more than two seconds. The API server delays
/// every create of a custom resource whose CRD became Established less than two seconds ago by
/// two seconds (apiextensions-apiserver's `customresource_handler.go`, so that in HA setups no
/// other server answers 404 for it): a one-time wait of the control plane that would otherwise
/// land in a test's first measured step. `lastTransitionTime` has one-second resolution, hence
/// three seconds.
async fn past_the_just_established_window(plane: &ControlPlane) {
    let client = plane.client().expect("an admin client");
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    let crd = crds
        .get("ipreservations.ipkeep.dev")
        .await
        .expect("failed to read the IPReservation CRD");
    let established = crd
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Established" && c.status == "True")
        .and_then(|c| c.last_transition_time)
        .expect("the CRD is Established")
        .0;
    let open = established
        .checked_add(Duration::from_secs(3))
        .expect("a representable time");
    wait_for("the CRD Established for three seconds", || async {
        (jiff::Timestamp::now() >= open).then_some(())
    })
    .await;
}

/// The tests of one binary share its control plane, each in namespaces of its own: a test that
/// changes what every other test sees (the IPReservation CRD, a webhook, cluster-wide RBAC of a
/// `helm install`) holds this exclusively, every other test holds it shared.
static PLANE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// The shared control plane with the CRD ([`control_plane`]), for a test that changes nothing
/// cluster-wide; it shares the plane with the other tests that hold the guard.
pub async fn use_plane() -> (
    tokio::sync::RwLockReadGuard<'static, ()>,
    &'static ControlPlane,
) {
    let guard = PLANE.read().await;
    (guard, control_plane().await)
}

/// As [`use_plane`], for a test that changes what every other test sees: no other test runs
/// on the plane meanwhile. The test leaves the cluster-wide objects as it found them.
pub async fn use_plane_alone() -> (
    tokio::sync::RwLockWriteGuard<'static, ()>,
    &'static ControlPlane,
) {
    let guard = PLANE.write().await;
    (guard, control_plane().await)
}

/// Uninstalls a Helm release when dropped, whether its test passed or failed: a release left
/// behind (its webhook, admission policy and ClusterRoles act on every namespace) would change
/// what the plane's other tests see. A test that uninstalls it itself, to check what that leaves,
/// makes this a no-op.
pub struct UninstallOnDrop<'a> {
    plane: &'a ControlPlane,
    release: String,
    namespace: String,
}

impl<'a> UninstallOnDrop<'a> {
    /// Guards `release` in `namespace`.
    pub fn new(plane: &'a ControlPlane, release: &str, namespace: &str) -> Self {
        UninstallOnDrop {
            plane,
            release: release.to_owned(),
            namespace: namespace.to_owned(),
        }
    }
}

impl Drop for UninstallOnDrop<'_> {
    fn drop(&mut self) {
        // `--ignore-not-found`: the test may have uninstalled it already.
        let mut uninstall = self.plane.helm();
        uninstall
            .args(["uninstall", &self.release, "-n", &self.namespace])
            .args(["--ignore-not-found", "--wait", "--timeout", "60s"]);
        if let Err(e) = crate::command::checked(&mut uninstall, None) {
            eprintln!("{}", crate::error_chain(&e));
        }
    }
}

static RBAC: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
static NODE_A: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
static NODE_B_OBJECT: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();

/// The fixture Node `name` (`ControlPlane::add_node`), written once per test binary.
async fn fixture_node(cell: &'static tokio::sync::OnceCell<()>, plane: &ControlPlane, name: &str) {
    cell.get_or_init(|| async {
        plane
            .add_node(name)
            .await
            .unwrap_or_else(|e| panic!("failed to write the Node {name}: {e}"));
    })
    .await;
}

/// The Node [`NODE`].
pub async fn node_a(plane: &ControlPlane) {
    fixture_node(&NODE_A, plane, NODE).await;
}

/// The Node [`NODE_B`].
pub async fn node_b(plane: &ControlPlane) {
    fixture_node(&NODE_B_OBJECT, plane, NODE_B).await;
}

/// The audit log lines (JSON events) of the shared control plane whose request URI contains
/// every one of `needles`.
pub fn audited(plane: &ControlPlane, needles: &[&str]) -> Vec<serde_json::Value> {
    let path = plane
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
pub async fn chart_rbac(plane: &'static ControlPlane) -> &'static str {
    RBAC.get_or_init(|| async {
        let ns = plane
            .fresh_namespace("ipkeep-release")
            .await
            .expect("a release namespace");
        let chart = chart_dir();
        let rendered = run_ok(
            plane.helm(),
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
                super::repo::UNPULLED_IMAGE[0],
                super::repo::UNPULLED_IMAGE[1],
            ],
            None,
        );
        kubectl_ok(plane, &["apply", "-f", "-"], Some(&rendered));
        ns
    })
    .await
}

/// A client of the chart's ServiceAccount `account` whose requests go through a fault proxy of
/// its own (the test's own requests go straight to the API server), and that proxy.
pub async fn proxied_account_client(
    plane: &'static ControlPlane,
    account: &str,
) -> (kube::Client, FaultProxy) {
    let ns = chart_rbac(plane).await;
    let config = plane
        .service_account_config(ns, account)
        .await
        .unwrap_or_else(|e| panic!("failed to configure a client of {ns}/{account}: {e}"));
    let proxy = FaultProxy::in_front_of(plane).await.expect("a fault proxy");
    let client =
        kube::Client::try_from(proxy.config_through(config)).expect("a client through the proxy");
    (client, proxy)
}

/// A client of the controller's ServiceAccount (exactly the chart's RBAC).
pub async fn controller_client(plane: &'static ControlPlane) -> kube::Client {
    let ns = chart_rbac(plane).await;
    plane
        .service_account_client(ns, CONTROLLER_ACCOUNT)
        .await
        .expect("a client of the controller's ServiceAccount")
}

/// A client of the agent's ServiceAccount (exactly the chart's RBAC).
pub async fn agent_client(plane: &'static ControlPlane) -> kube::Client {
    let ns = chart_rbac(plane).await;
    plane
        .service_account_client(ns, AGENT_ACCOUNT)
        .await
        .expect("a client of the agent's ServiceAccount")
}

/// Writes a kubeconfig of `account` (in the release namespace) to `path`.
pub async fn account_kubeconfig(plane: &'static ControlPlane, account: &str, path: &Path) {
    let ns = chart_rbac(plane).await;
    plane
        .write_service_account_kubeconfig(ns, account, path)
        .await
        .unwrap_or_else(|e| panic!("failed to write a kubeconfig of {ns}/{account}: {e}"));
}
