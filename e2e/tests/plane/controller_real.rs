//! The controller against the REAL control plane (kube-apiserver, controller-manager and
//! scheduler v1.34, `make cluster-bins`): the scenarios of `controller_scenarios.rs`; API faults —
//! dropped watches, 500s, 409s, `410 Expired` watches, an outage of the API server's address —
//! injected by a fault proxy (`ipkeep_e2e::proxy`) between the controller and kube-apiserver;
//! and what only a real API server can prove — the CRD's CEL rules refusing bad reservations
//! with 422, leader election through a real Lease with the built binary run twice, and the real
//! StatefulSet controller and garbage collector deleting a StatefulSet's pods without touching
//! their reservations.
//!
//! The controllers run as the chart's controller ServiceAccount (the chart's RBAC rendered with
//! the built helm and applied), so they are held to exactly the rights the chart grants; each
//! test has its own namespace, and a fault test its own proxy, on the control plane the tests of
//! this binary share.
//!
//! There is no kubelet, as in envtest: `node-a` and `node-b` are Node objects the tests write
//! once (Ready, untainted; the control plane runs without its node lifecycle controller), pods
//! bind to them, the test writes the status a kubelet would report (`phase: Running`, `podIPs`)
//! through `pods/status` as admin, and it deletes pods with grace period 0 — or, where the
//! garbage collector deleted them, finishes each Terminating pod's deletion as a kubelet would.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::testkit;

use ipkeep_e2e::testkit::controller;

use ipkeep_e2e::testkit::plane;

use std::{collections::BTreeMap, time::Duration};

use crate::controller_scenarios;
use ipkeep_e2e::testkit::Replica;
use ipkeep_e2e::testkit::controller::{
    DeletionLog, RunningController, bound_to, create_running_pod, delete_pod, phase, retain,
    scrape, start_controller_in, wait_event, wait_reservation, wait_reservation_gone,
    with_controller_settings,
};
use ipkeep_e2e::{
    cluster::force_delete_pod,
    proxy::{Fault, FaultProxy, Rule, Verb},
};
use ipkeep_operator::api::{IPReservation, Phase};
use k8s_openapi::api::{apps::v1::StatefulSet, coordination::v1::Lease, core::v1::Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use plane::NODE;
use serde_json::json;

/// One test per scenario of `controller_scenarios.rs`, named after it: the scenario (as admin) in
/// a fresh namespace `prefix-<n>` of the real control plane with a controller of its own, which
/// runs as the chart's controller ServiceAccount: exactly the chart's RBAC.
macro_rules! controller_scenario_tests {
    ($($prefix:literal => $name:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let _plane = plane::use_plane().await;
                controller::with_controller_settings($prefix, |_| {}, |client, ns, _| async move {
                    controller_scenarios::$name(&client, &ns).await
                })
                .await;
            }
        )+
    };
}

controller_scenario_tests!(
    "ctl-life" => bound_then_released_then_bound_again,
    "ctl-expiry" => a_short_retention_expires_within_a_second_of_its_release_time,
    "ctl-annot" => removing_the_annotation_ends_the_reservation,
    "ctl-hand" => hand_made_reservations_are_honoured_and_conflicts_reported,
    "ctl-roam" => a_pod_returning_on_another_node_moves_its_reservation_with_a_warning,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reservations_of_a_deleted_node_are_released() {
    let _plane = plane::use_plane().await;
    let plane = plane::control_plane().await;
    let node = "ctl-gone-node";
    plane.add_node(node).await.expect("the fixture Node");
    controller::with_controller_settings(
        "ctl-gone",
        |_| {},
        |c, ns, _| async move {
            let api: Api<IPReservation> = Api::namespaced(c.clone(), &ns);
            let kept = reservation(
                "kept-0",
                json!({"ips": ["10.244.9.5"], "nodeName": NODE, "retainFor": "1h"}),
            );
            let gone = reservation(
                "gone-0",
                json!({"ips": ["10.244.9.6"], "nodeName": node, "retainFor": "1h"}),
            );
            for r in [&kept, &gone] {
                api.create(&PostParams::default(), r).await.unwrap();
            }
            for name in ["kept-0", "gone-0"] {
                wait_reservation(&c, &ns, name, "Released (honoured)", |r| {
                    r.status.as_ref().and_then(|s| s.phase) == Some(Phase::Released)
                })
                .await;
            }
            // The node goes (a scale-in, a replaced machine): its reservation with it, and why.
            let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
            nodes.delete(node, &DeleteParams::default()).await.unwrap();
            wait_reservation_gone(&c, &ns, "gone-0").await;
            let note = wait_event(&c, &ns, "IPReservation", "gone-0", "NodeGone").await;
            assert!(note.contains(node) && note.contains("10.244.9.6"), "{note}");
            assert!(
                api.get_opt("kept-0").await.unwrap().is_some(),
                "a reservation on a node that exists is kept"
            );
        },
    )
    .await;
}

/// A reservation object with `spec`.
fn reservation(name: &str, spec: serde_json::Value) -> IPReservation {
    serde_json::from_value(json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "IPReservation",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap()
}

/// The 422 of a refused write, with the message that must name the broken rule.
fn assert_invalid<T: std::fmt::Debug>(result: Result<T, kube::Error>, case: &str, want: &str) {
    let status = match result {
        Err(kube::Error::Api(status)) => *status,
        other => panic!("{case}: expected an API error status, got {other:?}"),
    };
    assert_eq!(
        status.code, 422,
        "{case}: expected 422 Invalid, got {status:?}"
    );
    assert_eq!(status.reason, "Invalid", "{case}: {status:?}");
    assert!(
        status.message.contains(want),
        "{case}: the 422 does not say {want:?}: {}",
        status.message
    );
}

/// The CRD's validation as the real API server enforces it (CEL and OpenAPI): every address
/// valid and one a pod can hold, at most one per family, no duplicates, a positive retention of at most 366 days, a
/// valid node name — on create and on update — while the good shapes are accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cel_rules_reject_bad_reservations_with_422() {
    let _plane = plane::use_plane().await;
    let plane = plane::control_plane().await;
    let ns = plane.fresh_namespace("ctl-cel").await.expect("namespace");
    let client = plane.client().expect("client");
    let api: Api<IPReservation> = Api::namespaced(client, &ns);
    let pp = PostParams::default();

    let refused: &[(&str, serde_json::Value, &str)] = &[
        (
            "not-an-ip",
            json!({"ips": ["10.0.0.300"], "nodeName": "node-a"}),
            "every entry of ips must be an IP address",
        ),
        (
            "a-name",
            json!({"ips": ["db.example"], "nodeName": "node-a"}),
            "every entry of ips must be an IP address",
        ),
        (
            "unspecified-v4",
            json!({"ips": ["0.0.0.0"], "nodeName": "node-a"}),
            "ips must be addresses a pod can hold",
        ),
        (
            "broadcast",
            json!({"ips": ["255.255.255.255"], "nodeName": "node-a"}),
            "ips must be addresses a pod can hold",
        ),
        (
            "multicast-v4",
            json!({"ips": ["224.0.0.1"], "nodeName": "node-a"}),
            "ips must be addresses a pod can hold",
        ),
        (
            "loopback-v4",
            json!({"ips": ["127.0.0.1"], "nodeName": "node-a"}),
            "ips must be addresses a pod can hold",
        ),
        (
            "unspecified-v6",
            json!({"ips": ["::"], "nodeName": "node-a"}),
            "ips must be addresses a pod can hold",
        ),
        (
            "loopback-v6",
            json!({"ips": ["::1"], "nodeName": "node-a"}),
            "ips must be addresses a pod can hold",
        ),
        (
            "multicast-v6",
            json!({"ips": ["ff02::1"], "nodeName": "node-a"}),
            "ips must be addresses a pod can hold",
        ),
        (
            "loopback-beside-a-good-one",
            json!({"ips": ["10.0.0.1", "::1"], "nodeName": "node-a"}),
            "ips must be addresses a pod can hold",
        ),
        (
            "two-v4",
            json!({"ips": ["10.0.0.1", "10.0.0.2"], "nodeName": "node-a"}),
            "ips holds at most one address per family",
        ),
        (
            "two-v6",
            json!({"ips": ["fd00::1", "fd00::2"], "nodeName": "node-a"}),
            "ips holds at most one address per family",
        ),
        (
            "repeated-v4",
            json!({"ips": ["10.0.0.1", "10.0.0.1"], "nodeName": "node-a"}),
            "ips must not repeat an address",
        ),
        (
            "repeated-v6",
            json!({"ips": ["fd00::1", "fd00::1"], "nodeName": "node-a"}),
            "ips must not repeat an address",
        ),
        (
            "no-ips",
            json!({"ips": [], "nodeName": "node-a"}),
            "should have at least 1 items",
        ),
        (
            "three-ips",
            json!({"ips": ["10.0.0.1", "fd00::1", "10.0.0.2"], "nodeName": "node-a"}),
            "must have at most 2 items",
        ),
        (
            "zero-retention",
            json!({"ips": ["10.0.0.1"], "nodeName": "node-a", "retainFor": "0s"}),
            "should match '^[1-9][0-9]{0,5}(s|m|h|d)$'",
        ),
        (
            "negative-retention",
            json!({"ips": ["10.0.0.1"], "nodeName": "node-a", "retainFor": "-5m"}),
            "should match '^[1-9][0-9]{0,5}(s|m|h|d)$'",
        ),
        (
            "over-a-year",
            json!({"ips": ["10.0.0.1"], "nodeName": "node-a", "retainFor": "367d"}),
            "retainFor must be at most 366d",
        ),
        (
            "hours-over-a-year",
            json!({"ips": ["10.0.0.1"], "nodeName": "node-a", "retainFor": "8785h"}),
            "retainFor must be at most 366d",
        ),
        (
            "node-upper",
            json!({"ips": ["10.0.0.1"], "nodeName": "Node_A"}),
            "nodeName must be a valid node name (lowercase DNS subdomain)",
        ),
        (
            "node-dash",
            json!({"ips": ["10.0.0.1"], "nodeName": "node-"}),
            "nodeName must be a valid node name (lowercase DNS subdomain)",
        ),
        (
            "node-path",
            json!({"ips": ["10.0.0.1"], "nodeName": "../etc"}),
            "nodeName must be a valid node name (lowercase DNS subdomain)",
        ),
    ];
    for (case, spec, want) in refused {
        assert_invalid(
            api.create(&pp, &reservation(case, spec.clone())).await,
            case,
            want,
        );
    }

    // The good shapes are accepted: dual-stack, the longest retention, a dotted node name.
    let accepted: &[(&str, serde_json::Value)] = &[
        (
            "dual-stack",
            json!({"ips": ["10.0.0.1", "fd00::1"], "nodeName": "node-a", "retainFor": "366d"}),
        ),
        (
            "dotted-node",
            json!({"ips": ["fd00::2"], "nodeName": "node-a.example.org", "retainFor": "8784h"}),
        ),
        ("defaults", json!({"ips": ["10.0.0.2"], "nodeName": "n1"})),
        (
            "link-local",
            json!({"ips": ["169.254.0.5", "fe80::5"], "nodeName": "node-a"}),
        ),
    ];
    for (case, spec) in accepted {
        api.create(&pp, &reservation(case, spec.clone()))
            .await
            .unwrap_or_else(|e| panic!("{case}: a valid reservation was refused: {e}"));
    }

    // An update is held to the same rules.
    let patch = |spec: serde_json::Value| Patch::Merge(json!({"spec": spec}));
    assert_invalid(
        api.patch(
            "dual-stack",
            &PatchParams::default(),
            &patch(json!({"ips": ["10.0.0.1", "10.0.0.1"]})),
        )
        .await,
        "update to a repeated address",
        "ips must not repeat an address",
    );
    assert_invalid(
        api.patch(
            "defaults",
            &PatchParams::default(),
            &patch(json!({"retainFor": "400d"})),
        )
        .await,
        "update to 400d",
        "retainFor must be at most 366d",
    );
    let kept = api.get("dual-stack").await.unwrap();
    let ips: Vec<&str> = kept.spec.ips.iter().map(|ip| ip.0.as_str()).collect();
    assert_eq!(
        ips,
        ["10.0.0.1", "fd00::1"],
        "a refused update changed nothing"
    );
}

/// A replica process, SIGKILLed and reaped when dropped (a failing test leaves none behind).
/// Who holds the Lease `ipkeep-controller` in `ns`.
async fn holder(client: &Client, ns: &str) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    leases
        .get_opt("ipkeep-controller")
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec.and_then(|s| s.holder_identity))
}

fn spawn_replica(kubeconfig: &std::path::Path, ns: &str, lease_ns: &str, id: &str) -> Replica {
    Replica::spawn(
        kubeconfig,
        id,
        &["--namespace", ns, "--lease-namespace", lease_ns],
        None,
    )
}

/// Two replicas of the built binary, as the chart's controller ServiceAccount (its Lease rights
/// are one Lease in the release namespace), elect a leader through a real `coordination.k8s.io`
/// Lease;
/// the leader SIGKILLed, the standby takes the Lease over and carries on (it releases the
/// reservation of a pod deleted after the kill); SIGTERM then releases the Lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_takes_over_the_real_lease_when_the_leader_is_killed() {
    let _plane = plane::use_plane().await;
    let plane = plane::control_plane().await;
    plane::node_a(plane).await;
    let ns = plane
        .fresh_namespace("ctl-leader")
        .await
        .expect("namespace");
    let client = plane.client().expect("client");
    // The chart's ServiceAccount: its Lease rights are one Lease in the release namespace.
    let release_ns = plane::chart_rbac(plane).await;
    let scratch = testkit::Scratch::new("leader-real");
    let kubeconfig = scratch.join("kubeconfig");
    plane::account_kubeconfig(plane, plane::CONTROLLER_ACCOUNT, &kubeconfig).await;
    let mut replicas = vec![
        (
            "replica-a",
            spawn_replica(&kubeconfig, &ns, release_ns, "replica-a"),
        ),
        (
            "replica-b",
            spawn_replica(&kubeconfig, &ns, release_ns, "replica-b"),
        ),
    ];
    let leader = testkit::wait_for("a replica to hold the Lease", || {
        let client = client.clone();
        async move { holder(&client, release_ns).await }
    })
    .await;
    let pod = create_running_pod(
        &client,
        &ns,
        "db-0",
        NODE,
        &["10.244.1.17"],
        &retain(Some("1h")),
    )
    .await;
    let uid = pod.uid().unwrap();
    wait_reservation(&client, &ns, "db-0", "Bound by the leader", |r| {
        bound_to(r, &uid)
    })
    .await;
    // The leader is whoever holds the Lease right before the kill: with a 3 s Lease on a loaded
    // machine it may have moved since the first look (a replica that loses it exits).
    let leases: Api<Lease> = Api::namespaced(client.clone(), release_ns);
    let before = leases.get("ipkeep-controller").await.unwrap();
    let current = before
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .expect("the Lease has a holder");
    if current != leader {
        eprintln!("the Lease moved from {leader} to {current} before the kill");
    }
    let index = replicas
        .iter()
        .position(|(id, _)| *id == current)
        .unwrap_or_else(|| panic!("the Lease names {current:?}, none of ours"));
    replicas.remove(index).1.kill();
    let (survivor, mut standby) = replicas.pop().expect("two replicas were started");
    assert!(
        standby.is_running(),
        "the standby {survivor} is still running"
    );

    // Only the new leader can release the reservation of a pod deleted after the kill.
    delete_pod(&client, &ns, "db-0").await;
    wait_reservation(&client, &ns, "db-0", "Released by the new leader", |r| {
        phase(r) == Some(Phase::Released)
    })
    .await;
    let after = leases.get("ipkeep-controller").await.unwrap();
    let spec = after.spec.clone().unwrap();
    assert_eq!(
        spec.holder_identity.as_deref(),
        Some(survivor),
        "the standby holds the Lease"
    );
    assert_ne!(
        before.resource_version(),
        after.resource_version(),
        "the real Lease was written by the new holder"
    );
    assert!(
        spec.acquire_time.is_some() && spec.renew_time.is_some(),
        "the Lease records its acquire and renew times: {spec:?}"
    );

    // The control plane runs in other processes: a blocking wait here holds up nothing.
    let exit = standby.terminate();
    assert!(
        exit.success(),
        "the controller exits 0 on SIGTERM, got {exit}"
    );
    assert_ne!(
        holder(&client, release_ns).await.as_deref(),
        Some(survivor),
        "the Lease was released on SIGTERM"
    );
}

fn statefulset(name: &str, replicas: i32, annotations: serde_json::Value) -> StatefulSet {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "replicas": replicas, "serviceName": name, "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": NODE},
                    "containers": [{"name": "c", "image": "registry.invalid/app:1"}],
                },
            },
        },
    }))
    .unwrap()
}

/// Waits for the StatefulSet's pods `<set>-0..n` (not being deleted) bound to [`NODE`], and
/// returns their UIDs by name.
async fn scheduled_pods(pods: &Api<Pod>, set: &str, n: usize) -> BTreeMap<String, String> {
    testkit::wait_for(
        &format!("{n} pods of StatefulSet {set} bound to {NODE} by the scheduler"),
        || async {
            let list = pods
                .list(&ListParams::default().labels(&format!("app={set}")))
                .await
                .ok()?;
            let bound: BTreeMap<String, String> = list
                .items
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE))
                .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
                .collect();
            (bound.len() == n).then_some(bound)
        },
    )
    .await
}

/// What a kubelet reports once the sandbox runs: phase Running and the addresses.
async fn report_running(pods: &Api<Pod>, name: &str, ip: &str) {
    let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap_or_else(|e| panic!("failed to report pod {name} Running: {e}"));
}

/// The real StatefulSet controller creates the pods, the real scheduler binds them, and deleting
/// the StatefulSets lets the real garbage collector delete the pods: while they are Terminating
/// their reservations stay Bound; once they are gone, the reservations are Released with their
/// release time kept (they have no ownerReference the collector could
/// follow) — except with `release-with-owner`, where they go at once. Re-creating the
/// StatefulSet binds the same reservation objects to the new pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_garbage_collector_deleting_statefulset_pods_keeps_their_reservations() {
    let _plane = plane::use_plane().await;
    controller::with_controller_settings(
        "ctl-sts",
        |_| {},
        |client, ns, _| async move {
            let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
            let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
            let iprs: Api<IPReservation> = Api::namespaced(client.clone(), &ns);
            let pp = PostParams::default();
            let keep_annotations =
                json!({"ipkeep.dev/retain": "true", "ipkeep.dev/retain-for": "1h"});
            sets.create(&pp, &statefulset("keep", 2, keep_annotations.clone()))
                .await
                .unwrap();
            sets.create(
                &pp,
                &statefulset(
                    "cascade",
                    1,
                    json!({"ipkeep.dev/retain": "true", "ipkeep.dev/release-with-owner": "true"}),
                ),
            )
            .await
            .unwrap();
            let ips = BTreeMap::from([
                ("keep-0", "10.244.1.70"),
                ("keep-1", "10.244.1.71"),
                ("cascade-0", "10.244.1.72"),
            ]);
            let mut pod_uids = scheduled_pods(&pods, "keep", 2).await;
            pod_uids.extend(scheduled_pods(&pods, "cascade", 1).await);
            for (name, ip) in &ips {
                report_running(&pods, name, ip).await;
            }
            let mut reservation_uids = BTreeMap::new();
            for name in ips.keys() {
                let uid = &pod_uids[*name];
                let r =
                    wait_reservation(&client, &ns, name, "Bound to the StatefulSet's pod", |r| {
                        bound_to(r, uid)
                    })
                    .await;
                let got: Vec<&str> = r.spec.ips.iter().map(|ip| ip.0.as_str()).collect();
                assert_eq!(
                    got,
                    [ips[name]],
                    "{name}: the reservation holds the pod's address"
                );
                assert_eq!(r.spec.node_name, NODE);
                assert!(
                    r.metadata.owner_references.is_none(),
                    "{name}: no ownerReference"
                );
                reservation_uids.insert(*name, r.uid().unwrap());
            }
            assert_eq!(
                iprs.get("keep-0").await.unwrap().spec.retain_for.as_deref(),
                Some("1h"),
                "the StatefulSet's retain-for applies"
            );

            // Background cascading deletion: the garbage collector deletes the pods. They are bound
            // to a node, so the API server only marks them Terminating (a deletionTimestamp) and
            // leaves the rest to their kubelet; there is none, so the test finishes each deletion
            // as a kubelet would once the containers stopped — only of a pod the collector deleted.
            for set in ["keep", "cascade"] {
                sets.delete(set, &DeleteParams::background()).await.unwrap();
            }
            let terminating = testkit::wait_for(
                "the garbage collector to delete every pod of both StatefulSets (all Terminating)",
                || async {
                    let list = pods.list(&ListParams::default()).await.ok()?;
                    let all = list.items.len() == pod_uids.len()
                        && list
                            .items
                            .iter()
                            .all(|p| p.metadata.deletion_timestamp.is_some());
                    all.then(|| {
                        list.items
                            .iter()
                            .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
                            .collect::<BTreeMap<_, _>>()
                    })
                },
            )
            .await;
            assert_eq!(
                terminating, pod_uids,
                "the Terminating pods are the StatefulSets' own"
            );
            // A Terminating pod still holds its addresses (its containers may still run): its
            // reservation stays Bound, the release-with-owner one too, although its StatefulSet is
            // gone. keep-0 goes first; once its reservation is Released, the controller has had the
            // other pods' deletionTimestamps on its watch (they came before keep-0's deletion).
            let finish = |name: &'static str| {
                let (pods, uid) = (pods.clone(), pod_uids[name].clone());
                async move {
                    let done = force_delete_pod(&pods, name, Some(&uid))
                        .await
                        .unwrap_or_else(|e| panic!("failed to finish deleting pod {name}: {e}"));
                    assert!(done, "pod {name} was still there to finish deleting");
                }
            };
            finish("keep-0").await;
            wait_reservation(
                &client,
                &ns,
                "keep-0",
                "Released once its pod is gone",
                |r| phase(r) == Some(Phase::Released),
            )
            .await;
            for name in ["keep-1", "cascade-0"] {
                let r = iprs.get(name).await.unwrap();
                assert!(
                    bound_to(&r, &pod_uids[name]),
                    "{name}: a Terminating pod keeps its reservation Bound: {:?}",
                    r.status
                );
            }
            finish("keep-1").await;
            finish("cascade-0").await;
            testkit::wait_for("every pod of both StatefulSets gone", || async {
                let left = pods.list(&ListParams::default()).await.ok()?;
                left.items.is_empty().then_some(())
            })
            .await;
            wait_reservation_gone(&client, &ns, "cascade-0").await;
            for name in ["keep-0", "keep-1"] {
                let r = wait_reservation(
                    &client,
                    &ns,
                    name,
                    "Released after the garbage collection",
                    |r| phase(r) == Some(Phase::Released),
                )
                .await;
                assert_eq!(
                    r.uid().as_deref(),
                    Some(reservation_uids[name].as_str()),
                    "{name}: the same reservation object, never deleted"
                );
                let s = r.status.unwrap();
                assert_eq!(s.pod_uid.as_deref(), Some(pod_uids[name].as_str()));
                assert_eq!(
                    s.release_time.unwrap().0,
                    s.released_at
                        .unwrap()
                        .0
                        .checked_add(Duration::from_secs(3600))
                        .unwrap(),
                    "{name}: without release-with-owner the release time is kept"
                );
            }

            // The StatefulSet re-created: its new pods (new UIDs) get the same reservation objects.
            sets.create(&pp, &statefulset("keep", 2, keep_annotations))
                .await
                .unwrap();
            let new_uids = scheduled_pods(&pods, "keep", 2).await;
            for name in ["keep-0", "keep-1"] {
                assert_ne!(new_uids[name], pod_uids[name], "{name} is a new pod");
                report_running(&pods, name, ips[name]).await;
            }
            for name in ["keep-0", "keep-1"] {
                let uid = &new_uids[name];
                let r = wait_reservation(&client, &ns, name, "Bound to the re-created pod", |r| {
                    bound_to(r, uid)
                })
                .await;
                assert_eq!(r.uid().as_deref(), Some(reservation_uids[name].as_str()));
            }
            sets.delete("keep", &DeleteParams::background())
                .await
                .unwrap();
        },
    )
    .await;
}

/// A controller of the controller's ServiceAccount watching only `ns`, its requests going
/// through a fault proxy of its own (the test's own requests go straight to the API server).
async fn start_proxied_controller(
    plane: &'static ipkeep_e2e::cluster::ControlPlane,
    ns: &str,
) -> (RunningController, FaultProxy) {
    let (client, proxy) = plane::proxied_account_client(plane, plane::CONTROLLER_ACCOUNT).await;
    (start_controller_in(client, Some(ns)).await, proxy)
}

/// Dropped watches, 500s on writes and reads, 409s on deletes, watches answered `410 Expired`
/// (what a compaction does to a resumed watch) and an outage of the API server's address while
/// pods come and go: the controller converges, and no reservation is ever deleted before its
/// release time or while its pod lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn converges_through_api_faults_and_deletes_nothing_early() {
    let _plane = plane::use_plane().await;
    let plane = plane::control_plane().await;
    plane::node_a(plane).await;
    let ns = plane
        .fresh_namespace("ctl-faults")
        .await
        .expect("namespace");
    let client = plane.client().expect("client");
    let (deletions, watch_task) = DeletionLog::watch(&client, &ns);
    let (running, proxy) = start_proxied_controller(plane, &ns).await;
    let ns = ns.as_str();

    // Twelve long-lived pods, six short-lived ones (2 s after they go).
    let mut long = Vec::new();
    for i in 0..12 {
        let name = format!("long-{i}");
        let ip = format!("10.244.1.{}", 100 + i);
        create_running_pod(&client, ns, &name, NODE, &[&ip], &retain(Some("1h"))).await;
        long.push(name);
    }
    let mut short = Vec::new();
    for i in 0..6 {
        let name = format!("short-{i}");
        let ip = format!("10.244.1.{}", 150 + i);
        create_running_pod(&client, ns, &name, NODE, &[&ip], &retain(Some("2s"))).await;
        short.push(name);
    }
    for name in long.iter().chain(&short) {
        wait_reservation(&client, ns, name, "Bound", |r| {
            phase(r) == Some(Phase::Bound)
        })
        .await;
    }

    let patch_500 = proxy.add(
        Rule::new(Fault::status(500))
            .verb(Verb::Patch)
            .resource("ipreservations")
            .times(4),
    );
    let delete_409 = proxy.add(
        Rule::new(Fault::status(409))
            .verb(Verb::Delete)
            .resource("ipreservations")
            .times(2),
    );
    proxy.add(
        Rule::new(Fault::status(500))
            .verb(Verb::Get)
            .resource("pods")
            .times(2),
    );
    proxy.close_watches();
    // Half the long-lived pods go, and all the short-lived ones, around an outage and expired
    // watches: some deletions happen while the controller cannot watch.
    for name in long.iter().take(6) {
        delete_pod(&client, ns, name).await;
    }
    // What the controller sees of an API server restart: every connection dropped, the
    // address refusing connections for 800 ms; its watches and writes fail meanwhile and back off.
    proxy.outage(Duration::from_millis(800)).await;
    // Its watches resume from a resourceVersion the API server no longer has (a compaction).
    let expired = proxy.add(Rule::new(Fault::Expired).verb(Verb::Watch).times(2));
    proxy.close_watches();
    for name in &short {
        delete_pod(&client, ns, name).await;
    }
    proxy.close_watches();
    proxy.add(
        Rule::new(Fault::status(500))
            .verb(Verb::Patch)
            .resource("ipreservations")
            .times(3),
    );

    for name in long.iter().take(6) {
        wait_reservation(&client, ns, name, "Released after the faults", |r| {
            phase(r) == Some(Phase::Released)
        })
        .await;
    }
    for name in long.iter().skip(6) {
        wait_reservation(&client, ns, name, "still Bound after the faults", |r| {
            phase(r) == Some(Phase::Bound)
        })
        .await;
    }
    for name in &short {
        wait_reservation_gone(&client, ns, name).await;
    }
    // A re-created pod after all this is bound again.
    let again = create_running_pod(
        &client,
        ns,
        &long[0],
        NODE,
        &["10.244.1.100"],
        &retain(Some("1h")),
    )
    .await;
    let uid = again.uid().unwrap();
    wait_reservation(&client, ns, &long[0], "Bound again", |r| bound_to(r, &uid)).await;
    // Each fault reached the controller.
    for (what, id, want) in [
        ("500 on a patch", patch_500, 4),
        ("409 on a delete", delete_409, 2),
        ("410 on a watch", expired, 2),
    ] {
        assert_eq!(
            proxy.hits(id),
            want,
            "the controller met {what} {want} times"
        );
    }

    let seen = deletions.entries();
    let short_keys: Vec<String> = short.iter().map(|n| format!("{ns}/{n}")).collect();
    for (key, when, release) in &seen {
        assert!(
            short_keys.contains(key),
            "{key} was deleted but its pod's retention is 1h"
        );
        let release = release.unwrap_or_else(|| panic!("{key} was deleted without a release time"));
        assert!(
            *when >= release,
            "{key} deleted at {when}, before its release time {release}"
        );
    }
    let api: Api<IPReservation> = Api::namespaced(client.clone(), ns);
    let left = api.list(&Default::default()).await.unwrap();
    assert_eq!(
        left.items.len(),
        long.len(),
        "every long-lived reservation is still there"
    );
    watch_task.abort();
    running.stop().await;
}

/// A pod deleted and re-created while the controller is stopped, its reservation's 1 s retention
/// long past by the time the controller starts again: the reservation is re-bound, never deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_controller_never_deletes_the_reservation_of_a_live_pod() {
    let _plane = plane::use_plane().await;
    let plane = plane::control_plane().await;
    plane::node_a(plane).await;
    let ns = plane
        .fresh_namespace("ctl-sticky")
        .await
        .expect("namespace");
    let client = plane.client().expect("client");
    let (deletions, watch_task) = DeletionLog::watch(&client, &ns);
    let controller =
        || async { start_controller_in(plane::controller_client(plane).await, Some(&ns)).await };
    let running = controller().await;
    create_running_pod(
        &client,
        &ns,
        "sticky-0",
        NODE,
        &["10.244.1.77"],
        &retain(Some("1s")),
    )
    .await;
    wait_reservation(&client, &ns, "sticky-0", "Bound", |r| {
        phase(r) == Some(Phase::Bound)
    })
    .await;
    running.stop().await;
    // Controller down: the pod goes and returns.
    delete_pod(&client, &ns, "sticky-0").await;
    let again = create_running_pod(
        &client,
        &ns,
        "sticky-0",
        NODE,
        &["10.244.1.77"],
        &retain(Some("1s")),
    )
    .await;
    let running = controller().await;
    let uid = again.uid().unwrap();
    wait_reservation(&client, &ns, "sticky-0", "Bound to the returned pod", |r| {
        bound_to(r, &uid)
    })
    .await;
    running.stop().await;
    watch_task.abort();
    assert_eq!(deletions.entries(), Vec::new(), "a reservation was deleted");
}

/// Expiries due in the same second share one fresh read of their namespace's pods (a LIST, not a
/// GET each; issue 28), and still never delete the reservation of a live pod: ten reservations
/// due together, one of them named like a live pod the controller's cache cannot see (outside its
/// `--pod-selector`, as a pod created a moment ago would be). The nine others are deleted, none
/// before its release time; the tenth only once its pod is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiries_due_together_spare_the_reservation_of_a_live_pod_the_cache_cannot_see() {
    let _plane = plane::use_plane().await;
    let selector = |s: &mut ipkeep_operator::controller::Settings| {
        s.pod_selector = Some("ipkeep.dev/enabled=true".into());
    };
    with_controller_settings("ctl-burst", selector, |client, ns, _| async move {
        let (deletions, watch_task) = DeletionLog::watch(&client, &ns);
        let live = "burst-3";
        create_running_pod(&client, &ns, live, NODE, &["10.244.1.203"], &BTreeMap::new()).await;
        let due = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second() + 5).unwrap();
        let released_at = due - jiff::SignedDuration::from_secs(60);
        let api: Api<IPReservation> = Api::namespaced(client.clone(), &ns);
        let apply = PatchParams::apply("ipkeep-test").force();
        let names: Vec<String> = (0..10).map(|i| format!("burst-{i}")).collect();
        for (i, name) in names.iter().enumerate() {
            let spec = json!({
                "apiVersion": "ipkeep.dev/v1alpha1", "kind": "IPReservation",
                "metadata": {"name": name},
                "spec": {"ips": [format!("10.244.1.{}", 200 + i)], "nodeName": NODE, "retainFor": "60s"},
            });
            api.patch(name, &apply, &Patch::Apply(&spec)).await.unwrap();
            let status = json!({
                "apiVersion": "ipkeep.dev/v1alpha1", "kind": "IPReservation",
                "status": {"phase": "Released", "releasedAt": released_at.to_string(), "releaseTime": due.to_string()},
            });
            api.patch_status(name, &apply, &Patch::Apply(&status))
                .await
                .unwrap();
        }
        for name in names.iter().filter(|n| *n != live) {
            wait_reservation_gone(&client, &ns, name).await;
        }
        assert!(
            api.get_opt(live).await.unwrap().is_some(),
            "the reservation of the live pod {live} was deleted with the others"
        );
        let pod_gone = jiff::Timestamp::now();
        delete_pod(&client, &ns, live).await;
        wait_reservation_gone(&client, &ns, live).await;
        watch_task.abort();
        let seen = deletions.entries();
        assert_eq!(seen.len(), names.len(), "each reservation deleted once: {seen:?}");
        for (key, when, release) in &seen {
            assert!(
                *when >= release.expect("a release time"),
                "{key} deleted at {when}, before its release time"
            );
            if *key == format!("{ns}/{live}") {
                assert!(
                    *when >= pod_gone,
                    "{key} deleted at {when}, while its pod lived (deleted at {pod_gone})"
                );
            }
        }
    })
    .await;
}

/// A fresh namespace with a controller of its own (the chart's controller ServiceAccount), and
/// an admin client.
async fn controller_in(prefix: &str) -> (Client, String, RunningController) {
    let plane = plane::control_plane().await;
    plane::node_a(plane).await;
    let ns = plane.fresh_namespace(prefix).await.expect("namespace");
    let running = start_controller_in(plane::controller_client(plane).await, Some(&ns)).await;
    (plane.client().expect("client"), ns, running)
}

/// `/metrics` passes `promtool check metrics` (Debian package `prometheus`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_pass_promtool() {
    let _plane = plane::use_plane().await;
    let (client, ns, running) = controller_in("ctl-metrics").await;
    create_running_pod(
        &client,
        &ns,
        "m-0",
        NODE,
        &["10.244.1.90"],
        &retain(Some("1s")),
    )
    .await;
    wait_reservation(&client, &ns, "m-0", "Bound", |r| {
        phase(r) == Some(Phase::Bound)
    })
    .await;
    delete_pod(&client, &ns, "m-0").await;
    wait_reservation_gone(&client, &ns, "m-0").await;
    let text = wait_for_metric(running.probe_addr, "ipkeep_controller_expirations_total 1").await;
    for name in [
        "ipkeep_controller_reservations{phase=\"Bound\"}",
        "ipkeep_controller_expiry_lateness_seconds_count 1",
        "ipkeep_controller_reconcile_duration_seconds_count",
        "ipkeep_controller_next_expiry_seconds",
        "ipkeep_controller_leader 1",
        "ipkeep_controller_events_dropped_total 0",
    ] {
        assert!(text.contains(name), "/metrics lacks {name}:\n{text}");
    }
    // Normal Events are off by default: the lifecycle queued none.
    assert!(
        !text.contains("type=\"Normal\""),
        "Normal Events were queued by default:\n{text}"
    );
    let promtool = which("promtool").unwrap_or_else(|| {
        panic!("promtool is not installed: install Debian's `prometheus` package (make deps does) to check /metrics")
    });
    let mut check = std::process::Command::new(promtool);
    check.args(["check", "metrics"]);
    let out = testkit::run(check, Some(&text));
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    running.stop().await;
}

async fn wait_for_metric(addr: std::net::SocketAddr, line: &str) -> String {
    testkit::wait_for(&format!("/metrics to show {line}"), || async move {
        let text = scrape(addr).await;
        text.contains(line).then_some(text)
    })
    .await
}

fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|p| p.is_file())
    })
}

/// A reconcile that finds the reservation as it should be writes nothing: after a pod change that
/// does not matter (a label), the reservation's resourceVersion is unchanged once the controller
/// has looked at the pod again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_with_nothing_to_change_writes_nothing() {
    let _plane = plane::use_plane().await;
    let (client, ns, running) = controller_in("ctl-quiet").await;
    let ns = ns.as_str();
    let pod = create_running_pod(
        &client,
        ns,
        "quiet-0",
        NODE,
        &["10.244.1.33"],
        &retain(None),
    )
    .await;
    let uid = pod.uid().unwrap();
    let before = wait_reservation(&client, ns, "quiet-0", "Bound", |r| bound_to(r, &uid)).await;
    let reconciles = |text: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix("ipkeep_controller_reconcile_duration_seconds_count "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    // Let the reconciles caused by the controller's own writes settle: the count stops moving
    // once a scrape sees the reservation's latest version reconciled.
    let settled = reconciles(&scrape(running.probe_addr).await);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.patch(
        "quiet-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
    )
    .await
    .unwrap();
    testkit::wait_for("a reconcile after the label change", || async {
        (reconciles(&scrape(running.probe_addr).await) > settled).then_some(())
    })
    .await;
    let api: Api<IPReservation> = Api::namespaced(client.clone(), ns);
    let after = api.get("quiet-0").await.unwrap();
    assert_eq!(
        after.resource_version(),
        before.resource_version(),
        "a reconcile with nothing to change wrote to the reservation"
    );
    running.stop().await;
}

/// `/healthz` answers at once; `/readyz` once the caches are filled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_readiness_endpoints() {
    let _plane = plane::use_plane().await;
    let (_, _, running) = controller_in("ctl-probes").await;
    let get = |path: &'static str| {
        let addr = running.probe_addr;
        async move {
            tokio::task::spawn_blocking(move || {
                use std::io::{Read, Write};
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                write!(
                    s,
                    "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                )
                .unwrap();
                let mut text = String::new();
                s.read_to_string(&mut text).unwrap();
                text
            })
            .await
            .unwrap()
        }
    };
    assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
    testkit::wait_for("/readyz to answer 200", || async {
        get("/readyz")
            .await
            .starts_with("HTTP/1.1 200")
            .then_some(())
    })
    .await;
    running.stop().await;
}
