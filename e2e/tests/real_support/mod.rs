//! Shared by the tests that run the controller and the agent against the REAL control plane
//! (`controller_real.rs`, `agent_real.rs`; included with `#[path]`): the shared control plane with
//! the repository's IPReservation CRD installed, the stand-in node `node-a` the controller
//! scenarios bind their pods to, an in-process controller limited to one namespace, and the
//! built `ipkeep-operator` binary.
//!
//! Needs the control plane's binaries (`make cluster-bins`, or `IPKEEP_CLUSTER_BIN_DIR`); the
//! tests fail loudly without them.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    io::Write,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Output, Stdio},
    time::Duration,
};

use ipkeep_e2e::cluster::{Cluster, NodeAgent, shared};
use ipkeep_operator::controller::{self, Settings, Started};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use tokio::{sync::oneshot, task::JoinHandle};

/// The node every controller scenario binds its pods to (`fixtures/controller.rs` says
/// `node-a`): registered and kept Ready, so the pod garbage collector never takes its pods for
/// orphans and the scheduler can bind StatefulSet pods to it.
pub const NODE: &str = "node-a";

static CRD: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
static RBAC: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
static NODE_A: tokio::sync::OnceCell<NodeAgent> = tokio::sync::OnceCell::const_new();

/// The repository's generated CRD file (`crds/`), the one the chart ships.
pub fn crd_file() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../crds/ipreservations.ipkeep.dev.yaml")
}

/// Runs the built kubectl as admin; fails the test with its output unless it succeeds.
pub fn kubectl_ok(cluster: &Cluster, args: &[&str]) -> String {
    let out: Output = cluster
        .kubectl()
        .args(args)
        .output()
        .expect("failed to run the built kubectl");
    assert!(
        out.status.success(),
        "kubectl {args:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The shared control plane of this test binary with the IPReservation CRD applied (once) and
/// Established.
pub async fn cluster() -> &'static Cluster {
    let cluster = shared().await.unwrap_or_else(|e| {
        panic!(
            "the real control plane did not start ({e}); build its binaries with `make cluster-bins`"
        )
    });
    CRD.get_or_init(|| async {
        let file = crd_file();
        let file = file.to_str().expect("a UTF-8 path");
        kubectl_ok(cluster, &["apply", "--server-side", "-f", file]);
        kubectl_ok(
            cluster,
            &[
                "wait",
                "--for=condition=Established",
                "crd/ipreservations.ipkeep.dev",
                "--timeout=60s",
            ],
        );
        past_the_just_established_window(cluster).await;
    })
    .await;
    cluster
}

/// Waits until the CRD has been Established for more than two seconds. The API server delays
/// every create of a custom resource whose CRD became Established less than two seconds ago by
/// two seconds (apiextensions-apiserver's `customresource_handler.go`, so that in HA setups no
/// other server answers 404 for it): a one-time wait of the control plane that would otherwise
/// land in a test's first measured step. `lastTransitionTime` has one-second resolution, hence
/// three seconds.
async fn past_the_just_established_window(cluster: &Cluster) {
    let client = cluster.client().expect("an admin client");
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
    while jiff::Timestamp::now() < open {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The stand-in node [`NODE`], registered once per test binary; it lives (on its own thread)
/// until the process exits.
pub async fn node_a(cluster: &'static Cluster) -> &'static NodeAgent {
    NODE_A
        .get_or_init(|| async {
            NodeAgent::start(cluster, NODE)
                .await
                .unwrap_or_else(|e| panic!("failed to register the stand-in node {NODE}: {e}"))
        })
        .await
}

/// A controller running in this process, limited to one namespace so that the tests of one
/// binary, sharing one control plane, each have their own.
pub struct NamespacedController {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), controller::ControllerError>>,
    /// Where its probes and metrics listen.
    pub probe_addr: SocketAddr,
}

impl NamespacedController {
    /// Starts one for `ns` (no leader election, default retention one day, as the scenarios of
    /// `fixtures/controller.rs` expect).
    pub async fn start(client: kube::Client, ns: &str) -> NamespacedController {
        let (stop, stopped) = oneshot::channel::<()>();
        let (started_tx, started_rx) = oneshot::channel::<Started>();
        let mut settings = Settings::single(Duration::from_secs(86_400));
        settings.namespace = Some(ns.to_owned());
        let task = tokio::spawn(controller::run(
            client,
            settings,
            async move {
                let _ = stopped.await;
            },
            move |s| {
                let _ = started_tx.send(s);
            },
        ));
        let started = started_rx.await.expect("the controller started");
        NamespacedController {
            stop: Some(stop),
            task,
            probe_addr: started.probe_addr.expect("a probe address"),
        }
    }

    /// Stops it (as SIGTERM would), waits until it has, and fails the test if it had failed.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let result = (&mut self.task).await.expect("the controller task ended");
        result.expect("the controller ran without error");
    }
}

include!("../fixtures/operator_binary.rs");

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
        let chart = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../charts/ipkeep");
        let rendered = cluster
            .helm()
            .arg("template")
            .arg(RELEASE)
            .arg(&chart)
            .args(["--namespace", &ns])
            .args(["--show-only", "templates/controller-rbac.yaml"])
            .args(["--show-only", "templates/agent-rbac.yaml"])
            .output()
            .expect("failed to run the built helm");
        assert!(
            rendered.status.success(),
            "helm template of the chart's RBAC failed: {}",
            String::from_utf8_lossy(&rendered.stderr)
        );
        let mut apply = cluster
            .kubectl()
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("failed to run the built kubectl");
        apply
            .stdin
            .take()
            .expect("kubectl's stdin")
            .write_all(&rendered.stdout)
            .expect("failed to give kubectl the rendered RBAC");
        let out = apply
            .wait_with_output()
            .expect("failed to wait for kubectl");
        assert!(
            out.status.success(),
            "kubectl apply of the chart's RBAC failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        ns
    })
    .await
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
