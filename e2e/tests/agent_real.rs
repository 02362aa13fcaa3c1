//! The node agent against the REAL control plane (kube-apiserver v1.34, `make cluster-bins`):
//! the scenarios of `agent_support/scenarios.rs` unchanged, with `spec.nodeName` a real
//! `selectableFields` entry the API server filters on, and each step of a reservation's life
//! (created, changed, moved, deleted) measured from the API write to the file on disk against
//! the one-second figure of the design.
//!
//! The agents run in this process (two "nodes", each its own data directory) and, for the
//! restart scenario, as the built binary; in the timed and the restart tests they run as the
//! chart's agent ServiceAccount (the chart's RBAC rendered with the built helm and applied).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "agent_support/mod.rs"]
mod support;

#[path = "real_support/mod.rs"]
mod real;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use ipkeep_operator::crd::IPReservation;
use ipkeep_plugin::reservation::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_on_the_real_api_server() {
    let cluster = real::cluster().await;
    scenarios::reservation_lifecycle(cluster.client().expect("client")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflict_on_the_real_api_server() {
    let cluster = real::cluster().await;
    scenarios::conflict_is_not_written(cluster.client().expect("client")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_agent_catches_up_on_the_real_api_server() {
    let cluster = real::cluster().await;
    // The agent binary runs as the chart's agent ServiceAccount.
    let kubeconfig = scratch("kubeconfig").join("config");
    real::account_kubeconfig(cluster, real::AGENT_ACCOUNT, &kubeconfig).await;
    scenarios::killed_agent_catches_up(cluster.client().expect("client"), &kubeconfig).await;
}

/// The agent's own arrival→file histogram (sum of seconds, count), to tell its share of a
/// step's time from the API server's.
fn agent_side(node: &Node) -> (f64, u64) {
    let h = &node.metrics.change_to_file;
    (h.get_sample_sum(), h.get_sample_count())
}

/// Reports how long one step took from the API write to `node`'s disk (printed, not asserted: a
/// wall-clock bound fails on a loaded machine for reasons that are not the agent's; the 1 s p99
/// target is measured by `make bench-agent`); `before` is [`agent_side`] taken before the write.
fn report_step(step: &str, took: Duration, node: &Node, before: (f64, u64)) {
    let (sum, count) = agent_side(node);
    let agent = match count.saturating_sub(before.1) {
        0 => "the agent's own figure not recorded yet".to_owned(),
        n => format!(
            "{:.1} ms in the agent (mean of {n} events)",
            (sum - before.0) * 1000.0 / n as f64
        ),
    };
    eprintln!("{step}: {took:?} from the API write, {agent}");
}

fn addrs(ips: &[&str]) -> Vec<IpAddr> {
    ips.iter().map(|ip| ip.parse().unwrap()).collect()
}

/// A reservation for node A is a file on A only; changed (addresses, then released), the file
/// follows; moved to B, it leaves A and appears on B; deleted, it is gone — each step within one
/// second of its API write, with the agents holding only the chart's RBAC. Their watches carry the `spec.nodeName` field selector, which
/// the real API server evaluates (the audit log shows the requests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_step_reaches_the_node_within_one_second() {
    let cluster = real::cluster().await;
    let client = cluster.client().expect("client");
    let ns = namespace(&client, "agent-timed").await;
    // The agents run as the chart's agent ServiceAccount: exactly the chart's RBAC.
    let agent_client = real::agent_client(cluster).await;
    let a = Node::start(&agent_client, "node-a");
    let b = Node::start(&agent_client, "node-b");
    a.ready().await;
    b.ready().await;
    let api: Api<IPReservation> = Api::namespaced(client.clone(), &ns);
    let only_on_a = |what: &str| {
        for n in NETWORKS {
            assert!(
                b.files(n).is_empty(),
                "{what}: node B holds a file of node A's reservation"
            );
        }
    };

    let (t, sa, _) = (Instant::now(), agent_side(&a), agent_side(&b));
    api.create(
        &PostParams::default(),
        &reservation(
            "pg-0",
            &a.name,
            &["10.244.1.17", "fd00:10:244:1::11"],
            Some("30m"),
        ),
    )
    .await
    .expect("failed to create the reservation");
    let (file, _) = wait_file(&a.data_dir, &ns, "pg-0", "pg-0's file on node A", |f| {
        f.is_some()
    })
    .await;
    report_step("created → file on A", t.elapsed(), &a, sa);
    assert_eq!(
        file.unwrap().ips,
        addrs(&["10.244.1.17", "fd00:10:244:1::11"])
    );
    only_on_a("created");

    let (t, sa, _) = (Instant::now(), agent_side(&a), agent_side(&b));
    api.patch(
        "pg-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"ips": ["10.244.1.18"]}})),
    )
    .await
    .expect("failed to change the addresses");
    wait_file(&a.data_dir, &ns, "pg-0", "the new address on node A", |f| {
        f.is_some_and(|f| f.ips == addrs(&["10.244.1.18"]))
    })
    .await;
    report_step("addresses changed → file on A", t.elapsed(), &a, sa);

    let (t, sa, _) = (Instant::now(), agent_side(&a), agent_side(&b));
    api.patch_status(
        "pg-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "phase": "Released",
            "releasedAt": "2026-11-21T11:30:00Z",
            "releaseTime": "2026-11-21T12:00:00Z",
        }})),
    )
    .await
    .expect("failed to release the reservation");
    let released = Some(Timestamp::from_unix_secs(1_795_262_400));
    wait_file(
        &a.data_dir,
        &ns,
        "pg-0",
        "the release time on node A",
        |f| f.is_some_and(|f| f.release_time == released),
    )
    .await;
    report_step("released → file on A", t.elapsed(), &a, sa);
    only_on_a("released");

    let (t, sa, sb) = (Instant::now(), agent_side(&a), agent_side(&b));
    api.patch(
        "pg-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"nodeName": b.name}})),
    )
    .await
    .expect("failed to move the reservation");
    wait_file(&a.data_dir, &ns, "pg-0", "the file to leave node A", |f| {
        f.is_none()
    })
    .await;
    report_step("moved → gone from A", t.elapsed(), &a, sa);
    wait_file(
        &b.data_dir,
        &ns,
        "pg-0",
        "the file to appear on node B",
        |f| f.is_some_and(|f| f.release_time == released && f.ips == addrs(&["10.244.1.18"])),
    )
    .await;
    report_step("moved → file on B", t.elapsed(), &b, sb);

    let (t, _, sb) = (Instant::now(), agent_side(&a), agent_side(&b));
    api.delete("pg-0", &DeleteParams::default())
        .await
        .expect("failed to delete the reservation");
    wait_file(
        &b.data_dir,
        &ns,
        "pg-0",
        "the file to go with the reservation",
        |f| f.is_none(),
    )
    .await;
    report_step("deleted → gone from B", t.elapsed(), &b, sb);
    for n in NETWORKS {
        assert!(a.files(n).is_empty(), "node A keeps a file in {n}");
        assert!(b.files(n).is_empty(), "node B keeps a file in {n}");
    }

    // The filtering is the API server's: each agent's watch asked for its own node only.
    for node in [&a.name, &b.name] {
        let selector = format!("fieldSelector=spec.nodeName%3D{node}");
        let watches = real::audited(cluster, &["/ipreservations?", &selector, "watch=true"]);
        assert!(
            !watches.is_empty(),
            "the audit log holds no IPReservation watch with {selector}"
        );
        assert!(
            watches.iter().all(|e| e["responseStatus"]["code"]
                .as_i64()
                .is_none_or(|c| c == 200)),
            "a watch with {selector} was refused: {watches:?}"
        );
    }
    a.stop().await;
    b.stop().await;
}
