//! Smoke tests of the API test server through the real kube client: CRUD, selectors, status
//! subresource, server-side apply, a watcher + reflector that survives closed watches, compaction
//! and a pause/resume of the server, and discovery.
//!
//! The tests made with `both!` run twice from one body: against the API test server
//! (`<test>::test_server`) and the real control plane (`<test>::real`, needs `make
//! cluster-bins`). The others are for the test server alone: `watcher_stays_in_sync_across_faults`,
//! `admin_endpoint_injects_faults` and `list_resource_versions_are_checked` drive its `/admin`
//! faults (closed watches, injected failures, compaction), `oversized_request_bodies_are_refused_with_413`
//! and `watch_with_huge_timeout_keeps_streaming` guard this server's own request handling.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "fixtures/shared.rs"]
mod shared;

#[path = "fixtures/harness.rs"]
mod harness;

use futures::StreamExt;
use harness::{Backend, DEADLINE, start, wait_for};
use ipkeep_e2e::apiserver::{RequestFilter, Verb};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, reflector, watcher},
};
use serde_json::json;

fn reservation(name: &str, node: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "ipkeep.dev/v1alpha1",
        "kind": "IPReservation",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "ipkeep"}},
        "spec": {"ips": ["10.244.1.17"], "nodeName": node}
    }))
    .unwrap()
}

fn pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}
    }))
    .unwrap()
}

async fn pods_crud_selectors_status_and_graceful_delete(b: &Backend) {
    let ns = b.namespace("pods-crud-selectors-status-and").await;
    let server = b;
    let pods: Api<Pod> = Api::namespaced(server.client(), &ns);
    let created = pods
        .create(&PostParams::default(), &pod("web-0", "node-a"))
        .await
        .unwrap();
    assert!(created.metadata.uid.is_some() && created.metadata.creation_timestamp.is_some());
    assert_eq!(
        created.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending")
    );
    pods.create(&PostParams::default(), &pod("web-1", "node-b"))
        .await
        .unwrap();

    let err = pods
        .create(&PostParams::default(), &pod("web-0", "node-a"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists"),
        "{err:?}"
    );

    let on_a = pods
        .list(&ListParams::default().fields("spec.nodeName=node-a"))
        .await
        .unwrap();
    assert_eq!(
        on_a.items.iter().map(|p| p.name_any()).collect::<Vec<_>>(),
        vec!["web-0"]
    );
    let err = pods
        .list(&ListParams::default().fields("spec.bogus=x"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 400),
        "{err:?}"
    );
    let page = pods.list(&ListParams::default().limit(1)).await.unwrap();
    assert_eq!(page.items.len(), 1);
    let next = pods
        .list(
            &ListParams::default()
                .limit(1)
                .continue_token(page.metadata.continue_.as_deref().unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(next.items[0].name_any(), "web-1");
    assert!(next.metadata.continue_.is_none());

    // Status subresource: the main resource ignores status, /status ignores the rest.
    let status = json!({"status": {"phase": "Running", "podIP": "10.244.1.17"}});
    let patched = pods
        .patch_status("web-0", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    assert_eq!(
        patched.status.unwrap().pod_ip.as_deref(),
        Some("10.244.1.17")
    );
    let ignored = pods
        .patch(
            "web-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Failed"}})),
        )
        .await
        .unwrap();
    assert_eq!(ignored.status.unwrap().phase.as_deref(), Some("Running"));

    // Stale resourceVersion on update: 409 Conflict.
    let mut stale = created.clone();
    stale.metadata.labels = Some([("x".to_string(), "y".to_string())].into());
    let err = pods
        .replace("web-0", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 409 && s.reason == "Conflict"),
        "{err:?}"
    );

    // A pod on a node is deleted gracefully: deletionTimestamp first, then gone.
    let deleted = pods
        .delete("web-0", &DeleteParams::default())
        .await
        .unwrap();
    let pending = deleted
        .left()
        .expect("a pod on a node is returned while terminating");
    assert!(pending.metadata.deletion_timestamp.is_some());
    if b.is_real() {
        // The real control plane runs no kubelet: confirm the deletion as the kubelet does
        // (the test server's emulated kubelet does it by itself).
        pods.delete("web-0", &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
    }
    wait_for("web-0 to be gone", || async {
        (pods.get_opt("web-0").await.unwrap().is_none()).then_some(())
    })
    .await;
}

async fn custom_resources_validation_apply_and_generation(b: &Backend) {
    let ns = b.namespace("custom-resources-validation-ap").await;
    let server = b;
    let client = server.client();
    let iprs: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &harness::ipr_resource());
    let created = iprs
        .create(&PostParams::default(), &reservation("web-0", "node-a"))
        .await
        .unwrap();
    assert_eq!(
        created.data["spec"].get("retainFor"),
        None,
        "no schema default: the controller's --default-retain-for applies"
    );
    assert_eq!(created.metadata.generation, Some(1));

    let mut bad = reservation("bad", "node-a");
    bad.data["spec"]["ips"] = json!([]);
    let err = iprs.create(&PostParams::default(), &bad).await.unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 422 && s.reason == "Invalid"),
        "{err:?}"
    );

    let status = json!({"apiVersion": "ipkeep.dev/v1alpha1", "kind": "IPReservation", "status": {"phase": "Bound"}});
    let applied = iprs
        .patch_status(
            "web-0",
            &PatchParams::apply("ipkeep").force(),
            &Patch::Apply(&status),
        )
        .await
        .unwrap();
    assert_eq!(applied.data["status"]["phase"], "Bound");
    assert_eq!(
        applied.metadata.generation,
        Some(1),
        "status changes do not bump generation"
    );
    let managers: Vec<_> = applied
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    // The create recorded its writer too (no fieldManager and no User-Agent: "unknown", as
    // kube-apiserver names it); Apply entries come before Update ones.
    assert_eq!(managers, vec!["ipkeep", "unknown"]);

    let spec = json!({"spec": {"ips": ["10.244.1.18"]}});
    let changed = iprs
        .patch("web-0", &PatchParams::default(), &Patch::Merge(&spec))
        .await
        .unwrap();
    assert_eq!(changed.metadata.generation, Some(2));

    // Across namespaces, counting this test's only (the real cluster is shared).
    let selected: Api<DynamicObject> = Api::all_with(client, &harness::ipr_resource());
    let mine = |items: Vec<DynamicObject>| {
        items
            .into_iter()
            .filter(|o| o.namespace().as_deref() == Some(ns.as_str()))
            .count()
    };
    let on_b = selected
        .list(&ListParams::default().fields("spec.nodeName=node-b"))
        .await
        .unwrap();
    assert_eq!(mine(on_b.items), 0);
    let on_a = selected
        .list(&ListParams::default().fields("spec.nodeName=node-a"))
        .await
        .unwrap();
    assert_eq!(mine(on_a.items), 1);
}

#[tokio::test]
async fn watcher_stays_in_sync_across_faults() {
    let server = start().await;
    let client = server.client();
    let iprs: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &harness::ipr_resource());
    let writer = reflector::store::Writer::new(harness::ipr_resource());
    let reader = writer.as_reader();
    let config = watcher::Config::default().fields("spec.nodeName=node-a");
    let stream = watcher(
        Api::<DynamicObject>::all_with(client.clone(), &harness::ipr_resource()),
        config,
    )
    .default_backoff()
    .reflect(writer)
    .for_each(|_| async {});
    let task = tokio::spawn(stream);
    let names = || {
        let mut names: Vec<String> = reader.state().iter().map(|o| o.name_any()).collect();
        names.sort();
        names
    };

    iprs.create(&PostParams::default(), &reservation("a", "node-a"))
        .await
        .unwrap();
    iprs.create(&PostParams::default(), &reservation("other", "node-b"))
        .await
        .unwrap();
    wait_for("a in the store", || async {
        (names() == ["a"]).then_some(())
    })
    .await;

    server.faults().close_watches();
    iprs.create(&PostParams::default(), &reservation("b", "node-a"))
        .await
        .unwrap();
    wait_for("b after closed watches", || async {
        (names() == ["a", "b"]).then_some(())
    })
    .await;

    server.faults().fail_next(
        2,
        RequestFilter {
            verb: Some(Verb::List),
            resource: Some("ipreservations".into()),
        },
        500,
    );
    server.faults().compact();
    server.faults().close_watches();
    iprs.delete("a", &DeleteParams::default()).await.unwrap();
    wait_for("a gone after compaction and failed relists", || async {
        (names() == ["b"]).then_some(())
    })
    .await;

    server.pause().await;
    server.resume().await.unwrap();
    iprs.create(&PostParams::default(), &reservation("c", "node-a"))
        .await
        .unwrap();
    wait_for("c after pause and resume", || async {
        (names() == ["b", "c"]).then_some(())
    })
    .await;
    task.abort();
}

async fn discovery_and_namespaces(b: &Backend) {
    let server = b;
    let client = server.client();
    let discovery = kube::discovery::Discovery::new(client.clone())
        .run()
        .await
        .unwrap();
    let groups: Vec<String> = discovery.groups().map(|g| g.name().to_string()).collect();
    for want in [
        "",
        "coordination.k8s.io",
        "events.k8s.io",
        "ipkeep.dev",
        "apiextensions.k8s.io",
    ] {
        assert!(
            groups.iter().any(|g| g == want),
            "group {want:?} missing from {groups:?}"
        );
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "team"}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "team");
    pods.create(&PostParams::default(), &pod("p", ""))
        .await
        .unwrap();
    namespaces
        .delete("team", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("namespace team to be gone", || async {
        (namespaces.get_opt("team").await.unwrap().is_none()).then_some(())
    })
    .await;
    let missing: Api<Pod> = Api::namespaced(client, "nowhere");
    let err = missing
        .create(&PostParams::default(), &pod("p", ""))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 404),
        "{err:?}"
    );
}

#[tokio::test]
async fn admin_endpoint_injects_faults() {
    let server = start().await;
    let client = server.client();
    let admin = |path: &str, body: serde_json::Value| {
        hyper::http::Request::post(path.to_string())
            .body(body.to_string().into_bytes())
            .unwrap()
    };
    let reply = client
        .request_text(admin(
            "/admin/fail-next",
            json!({"n": 1, "status": 500, "verb": "list", "resource": "pods"}),
        ))
        .await
        .unwrap();
    assert_eq!(reply, r#"{"ok":true}"#);
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let err = pods.list(&ListParams::default()).await.unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 500 && s.reason == "InternalError"),
        "{err:?}"
    );
    pods.list(&ListParams::default())
        .await
        .expect("only one failure was injected");
    let err = client
        .request_text(admin("/admin/fail-next", json!({"verb": "frobnicate"})))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 400),
        "{err:?}"
    );
}

async fn server_side_apply_conflicts_without_force(b: &Backend) {
    let ns = b.namespace("server-side-apply-conflicts-wi").await;
    let server = b;
    let iprs: Api<DynamicObject> =
        Api::namespaced_with(server.client(), &ns, &harness::ipr_resource());
    let config = |node: &str| {
        json!({"apiVersion": "ipkeep.dev/v1alpha1", "kind": "IPReservation", "metadata": {"name": "web-0"},
               "spec": {"ips": ["10.244.1.17"], "nodeName": node}})
    };
    let created = iprs
        .patch(
            "web-0",
            &PatchParams::apply("first"),
            &Patch::Apply(config("node-a")),
        )
        .await
        .unwrap();
    assert_eq!(created.data["spec"]["nodeName"], "node-a");
    let err = iprs
        .patch(
            "web-0",
            &PatchParams::apply("second"),
            &Patch::Apply(config("node-b")),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 409 && s.message.contains("conflict with \"first\"")),
        "{err:?}"
    );
    let same = iprs
        .patch(
            "web-0",
            &PatchParams::apply("second"),
            &Patch::Apply(config("node-a")),
        )
        .await
        .unwrap();
    assert_eq!(
        same.data["spec"]["nodeName"], "node-a",
        "applying an equal value is no conflict"
    );
    let forced = iprs
        .patch(
            "web-0",
            &PatchParams::apply("second").force(),
            &Patch::Apply(config("node-b")),
        )
        .await
        .unwrap();
    assert_eq!(forced.data["spec"]["nodeName"], "node-b");
    // A field the manager stops applying is removed when nobody else owns it.
    let smaller = json!({"apiVersion": "ipkeep.dev/v1alpha1", "kind": "IPReservation", "metadata": {"name": "web-0", "labels": {"a": "b"}}});
    let labelled = iprs
        .patch(
            "web-0",
            &PatchParams::apply("third"),
            &Patch::Apply(&smaller),
        )
        .await
        .unwrap();
    assert_eq!(labelled.labels().get("a").map(String::as_str), Some("b"));
    let unlabelled_config = json!({"apiVersion": "ipkeep.dev/v1alpha1", "kind": "IPReservation", "metadata": {"name": "web-0"}});
    let unlabelled = iprs
        .patch(
            "web-0",
            &PatchParams::apply("third"),
            &Patch::Apply(&unlabelled_config),
        )
        .await
        .unwrap();
    assert!(
        unlabelled.labels().get("a").is_none(),
        "{:?}",
        unlabelled.labels()
    );
}

#[tokio::test]
async fn oversized_request_bodies_are_refused_with_413() {
    let server = start().await;
    // kube-apiserver refuses bodies over 3 MiB before decoding them.
    let big = "x".repeat(3 * 1024 * 1024 + 1);
    let config_map = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"}, "data": {"k": big}});
    let request = hyper::http::Request::post("/api/v1/namespaces/default/configmaps")
        .header("content-type", "application/json")
        .body(config_map.to_string().into_bytes())
        .unwrap();
    let err = server.client().request_text(request).await.unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 413 && s.reason == "RequestEntityTooLarge"),
        "{err:?}"
    );
    let request = hyper::http::Request::get("/api/v1/namespaces/default/configmaps/big")
        .body(Vec::new())
        .unwrap();
    let err = server.client().request_text(request).await.unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 404),
        "nothing was stored: {err:?}"
    );
}

#[tokio::test]
async fn watch_with_huge_timeout_keeps_streaming() {
    let server = start().await;
    let iprs: Api<DynamicObject> =
        Api::namespaced_with(server.client(), "default", &harness::ipr_resource());
    // i64::MAX seconds cannot be added to an instant; the watch must still run (not die in a
    // panic). (u64::MAX is no int64: kube-apiserver answers it 400, and so does the test server.)
    let request = hyper::http::Request::get(
        "/apis/ipkeep.dev/v1alpha1/namespaces/default/ipreservations?watch=true&timeoutSeconds=9223372036854775807",
    )
    .body(Vec::new())
    .unwrap();
    let mut events = server
        .client()
        .request_events::<DynamicObject>(request)
        .await
        .unwrap()
        .boxed();
    iprs.create(&PostParams::default(), &reservation("a", "node-a"))
        .await
        .unwrap();
    let event = tokio::time::timeout(DEADLINE, events.next())
        .await
        .expect("an event within the deadline");
    assert!(
        matches!(&event, Some(Ok(kube::api::WatchEvent::Added(o))) if o.name_any() == "a"),
        "{event:?}"
    );
}

async fn marking_for_deletion_bumps_generation(b: &Backend) {
    let ns = b.namespace("marking-for-deletion-bumps-gen").await;
    let server = b;
    let iprs: Api<DynamicObject> =
        Api::namespaced_with(server.client(), &ns, &harness::ipr_resource());
    let mut held = reservation("held", "node-a");
    held.metadata.finalizers = Some(vec!["ipkeep.dev/release".into()]);
    let created = iprs.create(&PostParams::default(), &held).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    let pending = iprs
        .delete("held", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .expect("finalizers keep the object");
    assert!(pending.metadata.deletion_timestamp.is_some());
    // kube-apiserver bumps generation when it sets deletionTimestamp, so controllers filtering on
    // generation still see the deletion.
    assert_eq!(pending.metadata.generation, Some(2));
    let again = iprs
        .delete("held", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(
        again.metadata.generation,
        Some(2),
        "only the first delete bumps it"
    );
}

async fn a_no_op_apply_changes_nothing(b: &Backend) {
    let ns = b.namespace("a-no-op-apply-changes-nothing").await;
    let server = b;
    let iprs: Api<DynamicObject> =
        Api::namespaced_with(server.client(), &ns, &harness::ipr_resource());
    iprs.create(&PostParams::default(), &reservation("web-0", "node-a"))
        .await
        .unwrap();
    let status = json!({"apiVersion": "ipkeep.dev/v1alpha1", "kind": "IPReservation", "status": {"phase": "Bound"}});
    let params = PatchParams::apply("ipkeep").force();
    let first = iprs
        .patch_status("web-0", &params, &Patch::Apply(&status))
        .await
        .unwrap();
    // Make the manager's entry older, as it is after any real wait, without sleeping.
    let mut aged = first.clone();
    for entry in aged.metadata.managed_fields.iter_mut().flatten() {
        entry.time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2000-01-01T00:00:00Z".parse().unwrap(),
        ));
    }
    let aged = iprs
        .replace_status("web-0", &PostParams::default(), &aged)
        .await
        .unwrap();
    let again = iprs
        .patch_status("web-0", &params, &Patch::Apply(&status))
        .await
        .unwrap();
    // kube-apiserver leaves a no-op apply alone: no new resourceVersion, no MODIFIED event, so a
    // controller that applies its status on every reconcile does not wake itself up forever.
    assert_eq!(again.resource_version(), aged.resource_version());
    assert_eq!(again.metadata.managed_fields, aged.metadata.managed_fields);
}

#[tokio::test]
async fn list_resource_versions_are_checked() {
    let server = start().await;
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let created = pods
        .create(&PostParams::default(), &pod("web-0", "node-a"))
        .await
        .unwrap();
    let rv: u64 = created.resource_version().unwrap().parse().unwrap();
    let list_at = |rv: String, exact: bool| {
        let params = ListParams::default().at(&rv);
        if exact {
            params.matching(kube::api::VersionMatch::Exact)
        } else {
            params.matching(kube::api::VersionMatch::NotOlderThan)
        }
    };
    let listed = pods.list(&list_at(rv.to_string(), false)).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    let any = pods.list(&ListParams::default().match_any()).await.unwrap();
    assert_eq!(
        any.items.len(),
        1,
        "resourceVersion=0 serves the current state"
    );

    let err = pods
        .list(&list_at("not-a-number".into(), false))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 400),
        "{err:?}"
    );
    // A version the server has not reached yet: kube-apiserver gives up with 504 "Too large
    // resource version" (this server does not wait first).
    let err = pods
        .list(&list_at((rv + 1000).to_string(), false))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 504 && s.reason == "Timeout"),
        "{err:?}"
    );
    // An exact version that compaction has forgotten is 410 Expired.
    server.faults().compact();
    let err = pods.list(&list_at(rv.to_string(), true)).await.unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 410 && s.reason == "Expired"),
        "{err:?}"
    );
}

both!(
    pods_crud_selectors_status_and_graceful_delete,
    super::pods_crud_selectors_status_and_graceful_delete
);
both!(
    custom_resources_validation_apply_and_generation,
    super::custom_resources_validation_apply_and_generation
);
both!(discovery_and_namespaces, super::discovery_and_namespaces);
both!(
    server_side_apply_conflicts_without_force,
    super::server_side_apply_conflicts_without_force
);
both!(
    marking_for_deletion_bumps_generation,
    super::marking_for_deletion_bumps_generation
);
both!(
    a_no_op_apply_changes_nothing,
    super::a_no_op_apply_changes_nothing
);
