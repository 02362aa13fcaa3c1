//! The CRD follows the release, against the real API server (kube-apiserver v1.34, `make
//! cluster-bins`): the built `ipkeep-operator controller` at start-up, as the chart's controller
//! ServiceAccount (the chart's RBAC rendered with helm) or as an account that may only read the
//! CRD, against the cluster's CRD in each state a release can leave it:
//!
//! | the cluster's CRD | may patch | the controller |
//! |---|---|---|
//! | older (a column less), no release annotation (the chart's `crds/`) | yes | applies its own: the column, `ipkeep.dev/crd-release: <version>`, field manager `ipkeep-controller`; starts |
//! | a newer release's (annotation 99.0.0, a column more) | yes | leaves it untouched (same resourceVersion); starts |
//! | a newer release's lacking a column of its own | yes | exits 1 naming the column, the newer release and the fix; the CRD untouched |
//! | older | no (get only) | exits 1 naming the column, the missing right and the fix |
//! | its own, unannotated | no | starts, with a warning |
//!
//! One test: the CRD is cluster-wide, so the cases run in turn on the binary's one control plane.
//! Needs `make cluster-bins` and the operator binary (`IPKEEP_OPERATOR_BIN`, else the debug build
//! `cargo test --workspace` makes); fails loudly without them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::testkit;

use ipkeep_e2e::testkit::plane;

use std::path::Path;

use ipkeep_e2e::cluster::ControlPlane;
use ipkeep_operator::api::IPReservation;
use ipkeep_operator::crd_apply::{FIELD_MANAGER, RELEASE_ANNOTATION};
use kube::CustomResourceExt;
use serde_json::{Value, json};

const VERSION: &str = env!("CARGO_PKG_VERSION");
/// A release no controller here is: newer than every one.
const NEWER: &str = "99.0.0";

/// The working tree's CRD as JSON, with `annotation` as its release, a column less (`older`)
/// or a column more (`newer`).
fn crd(release: Option<&str>, change: Option<&str>) -> Value {
    let mut crd = serde_json::to_value(IPReservation::crd()).unwrap();
    if let Some(release) = release {
        crd["metadata"]["annotations"] = json!({ RELEASE_ANNOTATION: release });
    }
    let columns = crd
        .pointer_mut("/spec/versions/0/additionalPrinterColumns")
        .and_then(Value::as_array_mut)
        .unwrap();
    match change {
        Some("older") => columns.retain(|c| c["name"] != "Unprotected"),
        Some("newer") => {
            columns.push(json!({"name": "Future", "type": "string", "jsonPath": ".status.phase"}))
        }
        _ => {}
    }
    crd
}

/// Makes the cluster's CRD exactly `crd` (`kubectl replace` as admin: annotations included).
fn set_crd(plane: &ControlPlane, crd: &Value) {
    testkit::kubectl_ok(plane, &["replace", "-f", "-"], Some(&crd.to_string()));
}

/// The cluster's CRD, its managed fields included.
fn cluster_crd(plane: &ControlPlane) -> Value {
    testkit::kubectl_json(
        plane,
        &[
            "get",
            "crd",
            IPReservation::crd_name(),
            "--show-managed-fields",
        ],
    )
}

fn columns(crd: &Value) -> Vec<String> {
    crd.pointer("/spec/versions/0/additionalPrinterColumns")
        .and_then(Value::as_array)
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect()
}

/// The controller's command line: one replica (no Lease), in `ns`.
fn args(ns: &str) -> Vec<String> {
    ["--leader-elect=false", "--namespace", ns]
        .map(String::from)
        .to_vec()
}

/// Runs the controller with `kubeconfig` until it exits (it must, within 60 s): its stderr.
fn refused(kubeconfig: &Path, ns: &str) -> String {
    let out = std::process::Command::new("timeout")
        .arg("60")
        .arg(testkit::operator_binary())
        .args(["controller", "--metrics-addr", "127.0.0.1:0"])
        .args(args(ns))
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("timeout (coreutils) runs the controller");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(1),
        "the controller exits 1 (124: still running after 60 s): {stderr}"
    );
    stderr
}

/// Starts the controller with `kubeconfig` and waits until its log says `says`; then stops it.
async fn starts(kubeconfig: &Path, ns: &str, says: &str, scratch: &testkit::Scratch, name: &str) {
    let log = scratch.join(format!("{name}.log"));
    let args = args(ns);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut replica = testkit::Replica::spawn(kubeconfig, name, &args, Some(&log));
    testkit::wait_for(
        &format!("{name}: the controller's log to say {says:?}"),
        || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let running = replica.is_running();
            async move {
                assert!(running, "the controller exited: {text}");
                text.contains(says).then_some(())
            }
        },
    )
    .await;
    replica.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_applies_its_release_s_crd_never_over_a_newer_one_and_refuses_one_lacking_its_own()
 {
    let _plane = plane::use_plane_alone().await;
    let plane = testkit::control_plane().await;
    let release_ns = plane::chart_rbac(plane).await;
    let ns = plane.fresh_namespace("ctl-crd").await.unwrap();
    let scratch = testkit::Scratch::new("controller-crd");
    let chart_account = scratch.join("chart-account.kubeconfig");
    plane::account_kubeconfig(plane, plane::CONTROLLER_ACCOUNT, &chart_account).await;
    // An account that may read the CRD, and nothing else of it.
    let reader = "crd-reader";
    let rbac = format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {reader}, namespace: {release_ns}}}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {{name: ipkeep-e2e-{reader}}}\n\
         rules: [{{apiGroups: [apiextensions.k8s.io], resources: [customresourcedefinitions], resourceNames: [{}], verbs: [get]}}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: ipkeep-e2e-{reader}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: ipkeep-e2e-{reader}}}\n\
         subjects: [{{kind: ServiceAccount, name: {reader}, namespace: {release_ns}}}]\n",
        IPReservation::crd_name()
    );
    testkit::kubectl_ok(plane, &["apply", "-f", "-"], Some(&rbac));
    let reader_account = scratch.join("reader.kubeconfig");
    plane
        .write_service_account_kubeconfig(release_ns, reader, &reader_account)
        .await
        .unwrap();

    // An older CRD, as the chart's crds/ left it: applied, and the controller starts.
    set_crd(plane, &crd(None, Some("older")));
    starts(
        &chart_account,
        &ns,
        "applied this release's CRD",
        &scratch,
        "older",
    )
    .await;
    let now = cluster_crd(plane);
    assert!(columns(&now).contains(&"Unprotected".to_owned()), "{now}");
    assert_eq!(now["metadata"]["annotations"][RELEASE_ANNOTATION], VERSION);
    let appliers: Vec<&str> = now["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["operation"] == "Apply")
        .map(|m| m["manager"].as_str().unwrap())
        .collect();
    // Beside the test fixture's own `kubectl apply --server-side`.
    assert!(appliers.contains(&FIELD_MANAGER), "{appliers:?}");

    // A newer release's CRD, with everything of this one's: untouched, and it starts.
    set_crd(plane, &crd(Some(NEWER), Some("newer")));
    let version = cluster_crd(plane)["metadata"]["resourceVersion"].clone();
    starts(
        &chart_account,
        &ns,
        "kept the CRD of a newer release",
        &scratch,
        "newer",
    )
    .await;
    let now = cluster_crd(plane);
    assert_eq!(now["metadata"]["resourceVersion"], version, "untouched");
    assert!(columns(&now).contains(&"Future".to_owned()));

    // A newer release's CRD lacking a column of this one's: refused, untouched.
    set_crd(plane, &crd(Some(NEWER), Some("older")));
    let version = cluster_crd(plane)["metadata"]["resourceVersion"].clone();
    let stderr = refused(&chart_account, &ns);
    for says in [
        format!("lacks what ipkeep {VERSION} reads and writes (the printer column Unprotected)"),
        format!("it was applied by ipkeep {NEWER}, newer than this release"),
        "kubectl apply --server-side --force-conflicts -f crds/ipreservations.ipkeep.dev.yaml"
            .to_owned(),
    ] {
        assert!(stderr.contains(&says), "{says:?} not in: {stderr}");
    }
    assert_eq!(cluster_crd(plane)["metadata"]["resourceVersion"], version);

    // An older CRD, and no right to patch it: refused, saying which right.
    set_crd(plane, &crd(None, Some("older")));
    let stderr = refused(&reader_account, &ns);
    for says in [
        "lacks what ipkeep",
        "(the printer column Unprotected)",
        "the controller may not patch it",
        "its ClusterRole grants get, patch on customresourcedefinitions named ipreservations.ipkeep.dev",
        "kubectl apply --server-side --force-conflicts",
    ] {
        assert!(stderr.contains(says), "{says:?} not in: {stderr}");
    }

    // Its own CRD, and no right to patch it: it starts, warning.
    set_crd(plane, &crd(None, None));
    starts(
        &reader_account,
        &ns,
        "may not patch the CRD; it has all of this release's already",
        &scratch,
        "complete",
    )
    .await;

    // The shared control plane's CRD as the fixture applied it; the reader gone.
    set_crd(plane, &crd(None, None));
    testkit::kubectl_ok(plane, &["delete", "-f", "-"], Some(&rbac));
}
