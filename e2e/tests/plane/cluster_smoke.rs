//! The real control plane, driven through the kubectl that `make cluster-bins` built: CRD
//! `selectableFields` and CEL rules enforced by the real API server, and a StatefulSet run by the
//! real StatefulSet controller, scheduler and garbage collector on a Node object the test writes
//! (no kubelet, as in envtest: the test finishes the deletion of the pods it sees Terminating).
//!
//! Needs the binaries: `make cluster-bins` (or `IPKEEP_CLUSTER_BIN_DIR`); fails loudly without.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::testkit;

use std::collections::BTreeMap;

use ipkeep_e2e::cluster::{force_delete_pod, shared};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{DynamicObject, ListParams, PostParams},
    core::{ApiResource, GroupVersionKind},
};
use testkit::{kubectl, kubectl_ok, wait_for};

const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.smoke.ipkeep.dev
spec:
  group: smoke.ipkeep.dev
  names: {kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    selectableFields:
    - jsonPath: .spec.color
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [color, min, max]
            x-kubernetes-validations:
            - rule: "self.min <= self.max"
              message: "min must not exceed max"
            properties:
              color: {type: string}
              min: {type: integer}
              max: {type: integer}
"#;

fn widget(name: &str, color: &str, min: i64, max: i64) -> String {
    format!(
        "apiVersion: smoke.ipkeep.dev/v1\nkind: Widget\nmetadata:\n  name: {name}\nspec:\n  color: {color}\n  min: {min}\n  max: {max}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crd_selectable_fields_and_cel_rules_are_enforced() {
    let _plane = testkit::plane::use_plane().await;
    let plane = shared().await.expect("the shared control plane");
    let ns = plane.fresh_namespace("crd").await.expect("namespace");
    kubectl_ok(plane, &["apply", "-f", "-"], Some(CRD));
    kubectl_ok(
        plane,
        &[
            "wait",
            "--for=condition=Established",
            "crd/widgets.smoke.ipkeep.dev",
            "--timeout=60s",
        ],
        None,
    );
    kubectl_ok(
        plane,
        &["-n", &ns, "apply", "-f", "-"],
        Some(&widget("red", "red", 1, 2)),
    );
    kubectl_ok(
        plane,
        &["-n", &ns, "apply", "-f", "-"],
        Some(&widget("blue", "blue", 3, 3)),
    );

    // The CEL rule rejects min > max, through kubectl...
    let out = kubectl(
        plane,
        &["-n", &ns, "apply", "-f", "-"],
        Some(&widget("bad", "red", 5, 1)),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a Widget with min > max was accepted"
    );
    assert!(stderr.contains("min must not exceed max"), "{stderr}");
    // ...and as a 422 Invalid naming the rule's message, through the API.
    let gvk = GroupVersionKind::gvk("smoke.ipkeep.dev", "v1", "Widget");
    let widgets: Api<DynamicObject> = Api::namespaced_with(
        plane.client().expect("client"),
        &ns,
        &ApiResource::from_gvk(&gvk),
    );
    let bad: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "smoke.ipkeep.dev/v1", "kind": "Widget",
        "metadata": {"name": "bad"}, "spec": {"color": "red", "min": 5, "max": 1}
    }))
    .expect("widget json");
    match widgets.create(&PostParams::default(), &bad).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422, "{s:?}");
            assert!(s.message.contains("min must not exceed max"), "{s:?}");
        }
        other => panic!("expected 422, got {other:?}"),
    }

    // selectableFields: the server filters on .spec.color...
    let red = kubectl_ok(
        plane,
        &[
            "-n",
            &ns,
            "get",
            "widgets",
            "--field-selector",
            "spec.color=red",
            "-o",
            "name",
        ],
        None,
    );
    assert_eq!(red.trim(), "widget.smoke.ipkeep.dev/red");
    // ...and refuses a field that is not selectable.
    let out = kubectl(
        plane,
        &[
            "-n",
            &ns,
            "get",
            "widgets",
            "--field-selector",
            "spec.min=1",
        ],
        None,
    );
    assert!(
        !out.status.success(),
        "spec.min is not selectable but was accepted"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("spec.min"), "{stderr}");
}

const STATEFULSET: &str = r#"
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
spec:
  serviceName: web
  replicas: 3
  podManagementPolicy: Parallel
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      # The plane's other suites have Nodes too: the scheduler is to bind these to this one.
      nodeSelector: {kubernetes.io/hostname: smoke-node}
      containers:
      - name: web
        image: registry.invalid/none:1
"#;

/// The pods labelled app=web: name → (uid, node).
async fn web_pods(pods: &Api<Pod>) -> BTreeMap<String, (String, String)> {
    pods.list(&ListParams::default().labels("app=web"))
        .await
        .expect("list pods")
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let node = p.spec.and_then(|s| s.node_name).unwrap_or_default();
            (
                p.metadata.name.unwrap_or_default(),
                (p.metadata.uid.unwrap_or_default(), node),
            )
        })
        .collect()
}

/// Waits until pod `name` of UID `uid` is Terminating (someone deleted it; being bound, it
/// waits for its kubelet), then finishes its deletion as the kubelet would once its containers
/// stopped: grace period 0, that UID only.
async fn finish_when_terminating(pods: &Api<Pod>, name: &str, uid: &str) {
    wait_for(&format!("pod {name} ({uid}) Terminating"), || async {
        let pod = pods.get_opt(name).await.ok()??;
        let terminating =
            pod.metadata.uid.as_deref() == Some(uid) && pod.metadata.deletion_timestamp.is_some();
        terminating.then_some(())
    })
    .await;
    let finished = force_delete_pod(pods, name, Some(uid))
        .await
        .unwrap_or_else(|e| panic!("failed to finish deleting pod {name}: {e}"));
    assert!(finished, "pod {name} ({uid}) was there to finish deleting");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statefulset_pods_are_created_scheduled_recreated_and_collected() {
    let _plane = testkit::plane::use_plane().await;
    let plane = shared().await.expect("the shared control plane");
    plane
        .add_node("smoke-node")
        .await
        .expect("the Node smoke-node");
    let ns = plane.fresh_namespace("sts").await.expect("namespace");
    let pods: Api<Pod> = Api::namespaced(plane.client().expect("client"), &ns);
    kubectl_ok(plane, &["-n", &ns, "apply", "-f", "-"], Some(STATEFULSET));

    let want: Vec<String> = (0..3).map(|i| format!("web-{i}")).collect();
    let first = wait_for("web-0..2 bound to smoke-node", || async {
        let got = web_pods(&pods).await;
        let bound = got.len() == 3
            && want
                .iter()
                .all(|n| got.get(n).is_some_and(|(_, node)| node == "smoke-node"));
        bound.then_some(got)
    })
    .await;

    // A scheduled pod's deletion waits for its kubelet: `kubectl delete` leaves web-1
    // Terminating, the test finishes the deletion, and the StatefulSet controller makes a new
    // web-1.
    kubectl_ok(
        plane,
        &["-n", &ns, "delete", "pod", "web-1", "--wait=false"],
        None,
    );
    let old_uid = first["web-1"].0.clone();
    finish_when_terminating(&pods, "web-1", &old_uid).await;
    wait_for("a new web-1 (new UID) bound to smoke-node", || async {
        let got = web_pods(&pods).await;
        got.get("web-1")
            .is_some_and(|(uid, n)| *uid != old_uid && n == "smoke-node")
            .then_some(())
    })
    .await;
    let after = web_pods(&pods).await;
    assert_eq!(after["web-0"].0, first["web-0"].0, "web-0 was replaced");
    assert_eq!(after["web-2"].0, first["web-2"].0, "web-2 was replaced");

    // Deleting the StatefulSet garbage-collects its pods: the garbage collector deletes each
    // (they turn Terminating), the test finishes each deletion.
    kubectl_ok(
        plane,
        &["-n", &ns, "delete", "statefulset", "web", "--wait=false"],
        None,
    );
    for (name, (uid, _)) in &after {
        finish_when_terminating(&pods, name, uid).await;
    }
    wait_for("every web pod gone", || async {
        let left = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .expect("list pods")
            .items;
        left.is_empty().then_some(())
    })
    .await;
    plane.check().expect("every component still runs");
}
