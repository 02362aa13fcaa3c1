//! The controller against the REAL control plane (kube-apiserver, controller-manager and
//! scheduler v1.34, `make cluster-bins`): the scenarios of `fixtures/controller.rs` unchanged, and
//! what only a real API server can prove — the CRD's CEL rules refusing bad reservations with
//! 422, leader election through a real Lease with the built binary run twice, and the real
//! StatefulSet controller and garbage collector deleting a StatefulSet's pods without touching
//! their reservations.
//!
//! The controllers run as the chart's controller ServiceAccount (the chart's RBAC rendered with
//! the built helm and applied), so they are held to exactly the rights the chart grants.
//!
//! There is no kubelet: pods bind to the stand-in node `node-a` (`NodeAgent`, which also
//! finishes their deletion as a kubelet would), and the test writes the status a kubelet would
//! report (`phase: Running`, `podIPs`) through `pods/status` as admin.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "fixtures/shared.rs"]
mod shared;

#[path = "fixtures/harness.rs"]
mod harness;

#[path = "fixtures/controller.rs"]
mod controller;

#[path = "real_support/mod.rs"]
mod real;

use std::{collections::BTreeMap, time::Duration};

use controller::*;
use ipkeep_operator::crd::{IPReservation, Phase};
use k8s_openapi::api::{apps::v1::StatefulSet, coordination::v1::Lease, core::v1::Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use real::{NODE, Replica};
use serde_json::json;

/// Runs `scenario` (as admin) in a fresh namespace of the real control plane with a controller of
/// its own, which runs as the chart's controller ServiceAccount: exactly the chart's RBAC.
async fn with_controller<F, Fut>(prefix: &str, scenario: F)
where
    F: FnOnce(Client, String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let cluster = real::cluster().await;
    real::node_a(cluster).await;
    let ns = cluster
        .fresh_namespace(prefix)
        .await
        .expect("a fresh namespace");
    let client = cluster.client().expect("an admin client");
    let running = start_controller_in(real::controller_client(cluster).await, Some(&ns)).await;
    scenario(client, ns).await;
    running.stop().await;
    cluster
        .check()
        .expect("every control plane component still runs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bound_then_released_then_bound_again() {
    with_controller("ctl-life", |c, ns| async move {
        bound_released_rebound(&c, &ns).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_retention_expires_within_a_second_of_its_release_time() {
    with_controller("ctl-expiry", |c, ns| async move {
        short_retention_expires_on_time(&c, &ns).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_annotation_ends_the_reservation() {
    with_controller("ctl-annot", |c, ns| async move {
        annotation_removed_ends_the_reservation(&c, &ns).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_made_reservations_are_honoured_and_conflicts_reported() {
    with_controller("ctl-hand", |c, ns| async move {
        hand_made_reservations_and_conflicts(&c, &ns).await
    })
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
    let status = harness::api_error(result);
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
    let cluster = real::cluster().await;
    let ns = cluster.fresh_namespace("ctl-cel").await.expect("namespace");
    let client = cluster.client().expect("client");
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
    let cluster = real::cluster().await;
    real::node_a(cluster).await;
    let ns = cluster
        .fresh_namespace("ctl-leader")
        .await
        .expect("namespace");
    let client = cluster.client().expect("client");
    // The chart's ServiceAccount: its Lease rights are one Lease in the release namespace.
    let release_ns = real::chart_rbac(cluster).await;
    let scratch = real::Scratch::new("leader-real");
    let kubeconfig = scratch.join("kubeconfig");
    real::account_kubeconfig(cluster, real::CONTROLLER_ACCOUNT, &kubeconfig).await;
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
    let leader = harness::wait_for("a replica to hold the Lease", || {
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

    // The control plane runs in other processes and the stand-in node on its own thread: a
    // blocking wait here holds up nothing.
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
    harness::wait_for(
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
/// the StatefulSets lets the real garbage collector delete the pods: their reservations are
/// Released with their release time kept (they have no ownerReference the collector could
/// follow) — except with `release-with-owner`, where they go at once. Re-creating the
/// StatefulSet binds the same reservation objects to the new pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_garbage_collector_deleting_statefulset_pods_keeps_their_reservations() {
    with_controller("ctl-sts", |client, ns| async move {
        let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let iprs: Api<IPReservation> = Api::namespaced(client.clone(), &ns);
        let pp = PostParams::default();
        let keep_annotations = json!({"ipkeep.dev/retain": "true", "ipkeep.dev/retain-for": "1h"});
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
            let r = wait_reservation(&client, &ns, name, "Bound to the StatefulSet's pod", |r| {
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

        // Background cascading deletion: the garbage collector deletes the pods, the stand-in
        // node finishes each deletion as a kubelet would.
        for set in ["keep", "cascade"] {
            sets.delete(set, &DeleteParams::background()).await.unwrap();
        }
        harness::wait_for(
            "the garbage collector to delete every pod of both StatefulSets",
            || async {
                let left = pods.list(&ListParams::default()).await.ok()?;
                left.items.is_empty().then_some(())
            },
        )
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
    })
    .await;
}
