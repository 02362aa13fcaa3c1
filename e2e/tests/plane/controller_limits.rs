//! Who may keep addresses, and for how long (issue 26, part 1), against the REAL control plane
//! (`make cluster-bins`): the real ReplicaSet and StatefulSet controllers make the pods (with the
//! `generateName` and owner references they really write), the real scheduler binds them to the
//! fixture Node `node-a`, and the controller runs as the chart's controller ServiceAccount. As in
//! `controller_real.rs`, no kubelet: the test reports the pods Running with addresses. The node
//! budget (part 2) on a fixture Node whose budget its annotation sets; on real nodes, with real
//! address exhaustion, in `e2e/tests/realnode/budget.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::testkit;

use ipkeep_e2e::testkit::controller;
use ipkeep_e2e::testkit::controller::{
    create_running_pod, delete_pod, phase, retain, scrape, start_controller_with, wait_event,
    wait_reservation, wait_reservation_gone,
};

use ipkeep_e2e::testkit::plane;

use std::{net::SocketAddr, time::Duration};

use ipkeep_operator::{
    api::retention::RetainFor,
    api::{IPReservation, Phase},
    controller::Settings,
};
use k8s_openapi::api::{
    apps::v1::{Deployment, StatefulSet},
    core::v1::Pod,
};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use plane::NODE;
use serde_json::json;
use testkit::UNPULLED_IMAGE;

/// Runs `scenario` (as admin) in a fresh namespace with a controller of its own (one hour's
/// default retention) whose maximum retention is `max`.
async fn with_max_retention<F, Fut>(prefix: &str, max: &str, scenario: F)
where
    F: FnOnce(Client, String, SocketAddr) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let adjust = |s: &mut Settings| {
        s.defaults.retain_for = Duration::from_secs(3_600);
        s.defaults.max_retain_for = RetainFor::parse(max).unwrap();
    };
    controller::with_controller_settings(prefix, adjust, scenario).await;
}

/// The pod template of the workloads below: bound to [`NODE`], annotated `retain`.
fn template(app: &str, annotations: serde_json::Value) -> serde_json::Value {
    json!({
        "metadata": {"labels": {"app": app}, "annotations": annotations},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "containers": [{"name": "c", "image": "registry.invalid/app:1"}],
        },
    })
}

/// Waits for `n` pods labelled `app=<app>` bound to [`NODE`] and reports each Running with the
/// next address from `ips`; returns their names.
async fn run_pods(client: &Client, ns: &str, app: &str, ips: &[&str]) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let names = testkit::wait_for(
        &format!("{} pods app={app} bound to {NODE}", ips.len()),
        || async {
            let list = pods
                .list(&ListParams::default().labels(&format!("app={app}")))
                .await
                .ok()?;
            let names: Vec<String> = list
                .items
                .iter()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE))
                .map(ResourceExt::name_any)
                .collect();
            (names.len() == ips.len()).then_some(names)
        },
    )
    .await;
    for (name, ip) in names.iter().zip(ips) {
        let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}});
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap_or_else(|e| panic!("failed to report pod {name} Running: {e}"));
    }
    names
}

/// A Deployment's pods (named by `generateName`, owned by a ReplicaSet) and a bare pod with a
/// `generateName` are told their names never come back and get no reservation; a pod named by
/// hand beside them is reserved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_never_return_are_not_reserved() {
    let _plane = plane::use_plane().await;
    with_max_retention("lim-names", "7d", |c, ns, _| async move {
        let deployments: Api<Deployment> = Api::namespaced(c.clone(), &ns);
        let deploy: Deployment = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": template("web", json!({"ipkeep.dev/retain": "true"})),
            },
        }))
        .unwrap();
        deployments
            .create(&PostParams::default(), &deploy)
            .await
            .unwrap();
        let web = run_pods(&c, &ns, "web", &["10.244.20.2", "10.244.20.3"]).await;

        let pods: Api<Pod> = Api::namespaced(c.clone(), &ns);
        let generated: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "job-", "labels": {"app": "gen"},
                         "annotations": {"ipkeep.dev/retain": "true"}},
            "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "registry.invalid/app:1"}]},
        }))
        .unwrap();
        pods.create(&PostParams::default(), &generated)
            .await
            .unwrap();
        let gen_pods = run_pods(&c, &ns, "gen", &["10.244.20.4"]).await;
        create_running_pod(&c, &ns, "named", NODE, &["10.244.20.5"], &retain(None)).await;

        // The named pod is reserved; by then the others were reconciled too.
        wait_reservation(&c, &ns, "named", "Bound", |r| {
            phase(r) == Some(Phase::Bound)
        })
        .await;
        for name in &web {
            let note = wait_event(&c, &ns, "Pod", name, "NotReserved").await;
            assert!(
                note.contains("ReplicaSet web-") && note.contains("never come back"),
                "{note}"
            );
        }
        let note = wait_event(&c, &ns, "Pod", &gen_pods[0], "NotReserved").await;
        assert!(note.contains("generateName"), "{note}");
        let api: Api<IPReservation> = Api::namespaced(c.clone(), &ns);
        let names: Vec<String> = api
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect();
        assert_eq!(names, ["named"], "only the pod named by hand is reserved");
    })
    .await;
}

/// With a maximum of 1h: a pod asking 30d, a StatefulSet asking 366d on its own metadata, and a
/// reservation written by hand with 30d are all held to 1h, and each asker gets a
/// `RetentionCapped` Warning naming both durations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retention_over_the_maximum_is_held_to_it() {
    let _plane = plane::use_plane().await;
    with_max_retention("lim-max", "1h", |c, ns, _| async move {
        let api: Api<IPReservation> = Api::namespaced(c.clone(), &ns);
        create_running_pod(
            &c,
            &ns,
            "greedy",
            NODE,
            &["10.244.21.2"],
            &retain(Some("30d")),
        )
        .await;
        let r = wait_reservation(&c, &ns, "greedy", "Bound", |r| {
            phase(r) == Some(Phase::Bound)
        })
        .await;
        assert_eq!(r.spec.retain_for.as_deref(), Some("1h"));
        let note = wait_event(&c, &ns, "Pod", "greedy", "RetentionCapped").await;
        assert!(note.contains("30d") && note.contains("1h"), "{note}");

        let sets: Api<StatefulSet> = Api::namespaced(c.clone(), &ns);
        let sts: StatefulSet = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "db", "annotations": {
                "ipkeep.dev/retain": "true", "ipkeep.dev/retain-for": "366d"}},
            "spec": {
                "replicas": 1, "serviceName": "db",
                "selector": {"matchLabels": {"app": "db"}},
                "template": template("db", json!({})),
            },
        }))
        .unwrap();
        sets.create(&PostParams::default(), &sts).await.unwrap();
        run_pods(&c, &ns, "db", &["10.244.21.3"]).await;
        let r =
            wait_reservation(&c, &ns, "db-0", "Bound", |r| phase(r) == Some(Phase::Bound)).await;
        assert_eq!(r.spec.retain_for.as_deref(), Some("1h"));
        let note = wait_event(&c, &ns, "StatefulSet", "db", "RetentionCapped").await;
        assert!(note.contains("366d") && note.contains("1h"), "{note}");

        let hand: IPReservation = serde_json::from_value(json!({
            "apiVersion": "ipkeep.dev/v1alpha1", "kind": "IPReservation",
            "metadata": {"name": "by-hand"},
            "spec": {"ips": ["10.244.21.9"], "nodeName": NODE, "retainFor": "30d"},
        }))
        .unwrap();
        let created = api.create(&PostParams::default(), &hand).await.unwrap();
        let r = wait_reservation(&c, &ns, "by-hand", "Released", |r| {
            phase(r) == Some(Phase::Released)
        })
        .await;
        let created_at = created.metadata.creation_timestamp.unwrap().0;
        let release = r.status.unwrap().release_time.unwrap().0;
        assert_eq!(
            release.as_second() - created_at.as_second(),
            3_600,
            "held to the maximum from its creation"
        );
        assert_eq!(
            r.spec.retain_for.as_deref(),
            Some("30d"),
            "what the admin wrote is left as written"
        );
        let note = wait_event(&c, &ns, "IPReservation", "by-hand", "RetentionCapped").await;
        assert!(
            note.contains("spec.retainFor") && note.contains("30d"),
            "{note}"
        );
    })
    .await;
}

/// A fixture Node with a budget of one (its annotation): of two pods released one after the
/// other, the first yields — deleted before its release time with a Warning `Yielded` naming the
/// budget and the one that takes precedence — while a Bound reservation on the node stays, and
/// the metrics show the node's budget, what it holds and the yield.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_its_nodes_budget_the_earliest_released_yields() {
    let _plane = plane::use_plane().await;
    let plane = plane::control_plane().await;
    let node = "lim-budget-node";
    plane.add_node(node).await.expect("the fixture Node");
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(plane.client().unwrap());
    let budget = json!({"metadata": {"annotations": {"ipkeep.dev/node-budget": "1"}}});
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&budget))
        .await
        .unwrap();
    with_max_retention("lim-budget", "7d", |c, ns, probes| async move {
        for (name, ip) in [
            ("p-0", "10.244.30.2"),
            ("p-1", "10.244.30.3"),
            ("stays", "10.244.30.4"),
        ] {
            create_running_pod(&c, &ns, name, node, &[ip], &retain(Some("1h"))).await;
            wait_reservation(&c, &ns, name, "Bound", |r| phase(r) == Some(Phase::Bound)).await;
        }
        let stays = wait_reservation(&c, &ns, "stays", "Bound", |_| true).await;
        delete_pod(&c, &ns, "p-0").await;
        wait_reservation(&c, &ns, "p-0", "Released", |r| {
            phase(r) == Some(Phase::Released)
        })
        .await;
        delete_pod(&c, &ns, "p-1").await;
        wait_reservation_gone(&c, &ns, "p-0").await;
        let note = wait_event(&c, &ns, "IPReservation", "p-0", "Yielded").await;
        for says in [node, "budget of 1", "10.244.30.2", "p-1"] {
            assert!(note.contains(says), "{says:?} in {note}");
        }
        let p1 = wait_reservation(&c, &ns, "p-1", "Released", |r| {
            phase(r) == Some(Phase::Released)
        })
        .await;
        assert!(p1.status.unwrap().release_time.is_some());
        let now = wait_reservation(&c, &ns, "stays", "Bound", |r| {
            phase(r) == Some(Phase::Bound)
        })
        .await;
        assert_eq!(
            now.metadata.uid, stays.metadata.uid,
            "a Bound reservation never yields"
        );
        assert_eq!(now.status, stays.status);
        let metrics = scrape(probes).await;
        for line in [
            format!("ipkeep_controller_yielded_total{{node=\"{node}\"}} 1"),
            format!("ipkeep_controller_node_budget{{node=\"{node}\",source=\"annotation\"}} 1"),
            format!("ipkeep_controller_node_released_reservations{{node=\"{node}\"}} 1"),
        ] {
            assert!(
                metrics.lines().any(|l| l == line),
                "{line} not in\n{metrics}"
            );
        }
    })
    .await;
}

/// The chart's ValidatingAdmissionPolicy, rendered with `controller.maxRetainFor=1h` (and the default
/// retention within it) and bound to
/// this test's namespace only, on the real API server: malformed annotations and a retention over
/// the maximum are refused when applied (server-side dry run: nothing is created), on a pod, a
/// StatefulSet's own metadata and its pod template, each with a message naming the annotation
/// and where it is; well-formed ones within the maximum are admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admission_policy_refuses_bad_annotations_at_the_door() {
    let _plane = plane::use_plane().await;
    let plane = plane::control_plane().await;
    let ns = plane
        .fresh_namespace("lim-policy")
        .await
        .expect("a fresh namespace");
    let chart = testkit::chart_dir();
    let rendered = testkit::run_ok(
        plane.helm(),
        &[
            "template",
            "ipkeep",
            chart.to_str().unwrap(),
            UNPULLED_IMAGE[0],
            UNPULLED_IMAGE[1],
            "--set",
            "controller.maxRetainFor=1h",
            // No longer than the maximum, or helm refuses the install (as the controller would).
            "--set",
            "controller.defaultRetainFor=1h",
            "--set",
            &format!("fullnameOverride={ns}"),
            "--show-only",
            "templates/admission-policy.yaml",
        ],
        None,
    );
    let anchor = "  validationActions: [Deny]\n";
    assert!(rendered.contains(anchor), "{rendered}");
    let scoped = rendered.replace(
        anchor,
        &format!(
            "{anchor}  matchResources:\n    namespaceSelector:\n      matchLabels: {{kubernetes.io/metadata.name: {ns}}}\n"
        ),
    );
    testkit::kubectl_ok(plane, &["apply", "-f", "-"], Some(&scoped));

    let c = plane.client().unwrap();
    let pods: Api<Pod> = Api::namespaced(c.clone(), &ns);
    let sets: Api<StatefulSet> = Api::namespaced(c.clone(), &ns);
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let pod = |annotations: serde_json::Value| -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "annotations": annotations},
            "spec": {"containers": [{"name": "c", "image": "registry.invalid/app:1"}]},
        }))
        .unwrap()
    };
    // The policy takes effect once the API server has compiled it.
    testkit::wait_for("the policy refusing retain-for 2h", || async {
        let refused = pods
            .create(&dry, &pod(json!({"ipkeep.dev/retain-for": "2h"})))
            .await
            .is_err();
        refused.then_some(())
    })
    .await;
    let refusal = |e: kube::Error| match e {
        kube::Error::Api(status) => (status.code, status.message),
        other => panic!("not an API answer: {other}"),
    };
    let cases = [
        (
            json!({"ipkeep.dev/retain": "yes"}),
            "ipkeep.dev/retain on the pod must be",
        ),
        (
            json!({"ipkeep.dev/retain-for": "1 week"}),
            "positive whole number",
        ),
        (json!({"ipkeep.dev/retain-for": "2h"}), "at most 1h"),
        (json!({"ipkeep.dev/retain-for": "61m"}), "at most 1h"),
        (
            json!({"ipkeep.dev/placement": "anywhere"}),
            "preferred, required, none",
        ),
        (
            json!({"ipkeep.dev/release-with-owner": "1"}),
            "release-with-owner",
        ),
    ];
    for (annotations, says) in cases {
        let e = pods
            .create(&dry, &pod(annotations.clone()))
            .await
            .unwrap_err();
        let (code, message) = refusal(e);
        assert_eq!(code, 422, "{annotations}: {message}");
        assert!(message.contains(says), "{annotations}: {message}");
    }
    for fine in [
        json!({"ipkeep.dev/retain": "true", "ipkeep.dev/retain-for": "1h", "ipkeep.dev/placement": "Required"}),
        json!({"ipkeep.dev/retain-for": "3600s", "ipkeep.dev/release-with-owner": "false"}),
        json!({}),
    ] {
        pods.create(&dry, &pod(fine.clone()))
            .await
            .unwrap_or_else(|e| panic!("{fine} refused: {e}"));
    }
    let sts = |own: serde_json::Value, template: serde_json::Value| -> StatefulSet {
        serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "db", "annotations": own},
            "spec": {
                "serviceName": "db",
                "selector": {"matchLabels": {"app": "db"}},
                "template": {
                    "metadata": {"labels": {"app": "db"}, "annotations": template},
                    "spec": {"containers": [{"name": "c", "image": "registry.invalid/app:1"}]},
                },
            },
        }))
        .unwrap()
    };
    for (own, template) in [
        (json!({"ipkeep.dev/retain-for": "30d"}), json!({})),
        (json!({}), json!({"ipkeep.dev/retain-for": "30d"})),
        (json!({}), json!({"ipkeep.dev/retain": "maybe"})),
    ] {
        let e = sets
            .create(&dry, &sts(own.clone(), template.clone()))
            .await
            .unwrap_err();
        let (code, message) = refusal(e);
        assert_eq!(code, 422, "{own} {template}: {message}");
        assert!(
            message.contains("the StatefulSet or its pod template"),
            "{own} {template}: {message}"
        );
    }
    sets.create(
        &dry,
        &sts(
            json!({"ipkeep.dev/retain": "true"}),
            json!({"ipkeep.dev/retain-for": "45m"}),
        ),
    )
    .await
    .unwrap();
    testkit::kubectl_ok(plane, &["delete", "-f", "-"], Some(&scoped));
    plane
        .check()
        .expect("every control plane component still runs");
}

/// A ResourceQuota of one IPReservation in the namespace: the second annotated pod is told
/// `NotReserved` quoting the API server's refusal, and is reserved once the first reservation
/// expires and is deleted (on that deletion, not by polling).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_quota_a_pod_waits_for_room_and_is_told_why() {
    let _plane = plane::use_plane().await;
    with_max_retention("lim-quota", "7d", |c, ns, _| async move {
        let quotas: Api<k8s_openapi::api::core::v1::ResourceQuota> =
            Api::namespaced(c.clone(), &ns);
        let quota = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": "reservations"},
            "spec": {"hard": {"count/ipreservations.ipkeep.dev": "1"}},
        }))
        .unwrap();
        quotas.create(&PostParams::default(), &quota).await.unwrap();
        // The quota controller computes its usage first; until then the API server refuses all.
        testkit::wait_for("the ResourceQuota's usage computed", || async {
            let q = quotas.get("reservations").await.ok()?;
            q.status?
                .used?
                .contains_key("count/ipreservations.ipkeep.dev")
                .then_some(())
        })
        .await;

        create_running_pod(
            &c,
            &ns,
            "first",
            NODE,
            &["10.244.31.2"],
            &retain(Some("2s")),
        )
        .await;
        wait_reservation(&c, &ns, "first", "Bound", |r| {
            phase(r) == Some(Phase::Bound)
        })
        .await;
        create_running_pod(&c, &ns, "second", NODE, &["10.244.31.3"], &retain(None)).await;
        let note = wait_event(&c, &ns, "Pod", "second", "NotReserved").await;
        assert!(
            note.contains("exceeded quota") && note.contains("count/ipreservations.ipkeep.dev"),
            "{note}"
        );
        let api: Api<IPReservation> = Api::namespaced(c.clone(), &ns);
        assert!(api.get_opt("second").await.unwrap().is_none());

        // The first pod goes; its reservation expires 2 s later and makes room.
        delete_pod(&c, &ns, "first").await;
        wait_reservation_gone(&c, &ns, "first").await;
        let r = wait_reservation(&c, &ns, "second", "Bound", |r| {
            phase(r) == Some(Phase::Bound)
        })
        .await;
        assert_eq!(r.spec.ips[0].0, "10.244.31.3");
    })
    .await;
}

/// `--namespace-selector ipkeep.dev/reserve=true`, with the controller running as the account the
/// chart renders with `controller.namespaceSelector` set (its RBAC: `list`, `watch` on
/// namespaces, nothing more). An annotated pod in the unlabelled namespace gets no reservation and
/// one Warning `NotReserved` naming the selector — once: a further reconcile of the pod tells it
/// nothing; the namespace labelled in, the pod is reserved; labelled out again, the reservation is
/// Released (not deleted) while the pod lives, and the pod told so; the pod gone, the reservation
/// follows the ordinary lifecycle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_outside_the_selector_reserves_nothing_and_releases_when_relabelled_out() {
    let _plane = plane::use_plane().await;
    const SELECTOR: &str = "ipkeep.dev/reserve=true";
    let plane = plane::control_plane().await;
    plane::node_a(plane).await;
    // The chart's controller RBAC with the selector set, in a release namespace of its own.
    let release_ns = plane
        .fresh_namespace("lim-nsel-release")
        .await
        .expect("a release namespace");
    let chart = testkit::chart_dir();
    let rendered = testkit::run_ok(
        plane.helm(),
        &[
            "template",
            "nsel",
            chart.to_str().unwrap(),
            "--namespace",
            &release_ns,
            UNPULLED_IMAGE[0],
            UNPULLED_IMAGE[1],
            "--set",
            &format!("controller.namespaceSelector={SELECTOR}"),
            "--show-only",
            "templates/controller-rbac.yaml",
        ],
        None,
    );
    assert!(rendered.contains("namespaces"), "{rendered}");
    testkit::kubectl_ok(plane, &["apply", "-f", "-"], Some(&rendered));
    let account = plane
        .service_account_client(&release_ns, "nsel-ipkeep-controller")
        .await
        .expect("a client of the controller's ServiceAccount");

    let ns = plane
        .fresh_namespace("lim-nsel")
        .await
        .expect("a fresh namespace");
    let c = plane.client().unwrap();
    let mut settings = ipkeep_operator::controller::Settings::single(Duration::from_secs(3_600));
    settings.namespace = Some(ns.clone());
    settings.namespace_selector = Some(SELECTOR.parse().unwrap());
    let running = start_controller_with(account, settings).await;
    let probes = running.probe_addr;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(c.clone());
    let label = |value: serde_json::Value| {
        let namespaces = namespaces.clone();
        let ns = ns.clone();
        async move {
            let patch = json!({"metadata": {"labels": {"ipkeep.dev/reserve": value}}});
            namespaces
                .patch(&ns, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap_or_else(|e| panic!("failed to label namespace {ns}: {e}"));
        }
    };
    let not_reserved = |text: &str| {
        text.lines()
            .find(|l| {
                l.starts_with("ipkeep_controller_events_total{")
                    && l.contains("reason=\"NotReserved\"")
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let reconciles = |text: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix("ipkeep_controller_reconcile_duration_seconds_count "))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };

    // Outside: no reservation, told once, naming the selector.
    let pod = create_running_pod(&c, &ns, "outside", NODE, &["10.244.32.2"], &retain(None)).await;
    let note = wait_event(&c, &ns, "Pod", "outside", "NotReserved").await;
    assert!(
        note.contains(SELECTOR) && note.contains("--namespace-selector"),
        "{note}"
    );
    let api: Api<IPReservation> = Api::namespaced(c.clone(), &ns);
    assert!(api.get_opt("outside").await.unwrap().is_none());
    // Once per pod: the pod changes (a reconcile of it, the namespace's only name) and is told
    // nothing more. The counter moves in the reconcile that queues the Event, before the
    // reconcile's duration is observed.
    let before = scrape(probes).await;
    assert_eq!(not_reserved(&before), 1, "{before}");
    let pods: Api<Pod> = Api::namespaced(c.clone(), &ns);
    let touched = json!({"metadata": {"annotations": {"ipkeep.dev/retain-for": "2h"}}});
    pods.patch("outside", &PatchParams::default(), &Patch::Merge(&touched))
        .await
        .unwrap();
    let after = testkit::wait_for("a reconcile of the changed pod", || async {
        let text = scrape(probes).await;
        (reconciles(&text) > reconciles(&before)).then_some(text)
    })
    .await;
    assert_eq!(
        not_reserved(&after),
        1,
        "told once, not per reconcile:\n{after}"
    );

    // A label that leaves the verdict as it is, then the one that selects it: reserved.
    label(json!("false")).await;
    label(json!("true")).await;
    let r = wait_reservation(&c, &ns, "outside", "Bound", |r| {
        phase(r) == Some(Phase::Bound)
    })
    .await;
    assert_eq!(r.spec.ips[0].0, "10.244.32.2");
    let uid = r.metadata.uid.clone();

    // Relabelled out: Released with the ordinary retention, never deleted while the pod lives.
    label(serde_json::Value::Null).await;
    let r = wait_reservation(&c, &ns, "outside", "Released", |r| {
        phase(r) == Some(Phase::Released)
    })
    .await;
    assert_eq!(r.metadata.uid, uid, "the same reservation, not deleted");
    let status = r.status.clone().unwrap();
    assert_eq!(
        status.pod_uid.as_deref(),
        pod.metadata.uid.as_deref(),
        "still names the live pod"
    );
    let (released_at, release_time) = (
        status.released_at.unwrap().0,
        status.release_time.unwrap().0,
    );
    assert_eq!(
        release_time.as_second() - released_at.as_second(),
        7_200,
        "the ordinary retention (the pod's 2h)"
    );
    testkit::wait_for("the pod told its reservation is Released", || async {
        let text = scrape(probes).await;
        (not_reserved(&text) == 2).then_some(())
    })
    .await;
    assert!(pods.get_opt("outside").await.unwrap().is_some());

    // Selected again: bound again, the same reservation.
    label(json!("true")).await;
    let r = wait_reservation(&c, &ns, "outside", "Bound again", |r| {
        phase(r) == Some(Phase::Bound)
    })
    .await;
    assert_eq!(r.metadata.uid, uid);

    running.stop().await;
    plane
        .check()
        .expect("every control plane component still runs");
}
