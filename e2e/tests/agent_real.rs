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

#[path = "fixtures/shared.rs"]
mod shared;

#[path = "agent_support/mod.rs"]
mod support;

#[path = "real_support/mod.rs"]
mod real;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflict_on_the_real_api_server() {
    let cluster = real::cluster().await;
    scenarios::conflict_is_not_written(cluster.client().expect("client")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_agent_catches_up_on_the_real_api_server() {
    let cluster = real::cluster().await;
    // The agent binary runs as the chart's agent ServiceAccount.
    let scratch = Scratch::new("kubeconfig");
    let kubeconfig = scratch.join("config");
    real::account_kubeconfig(cluster, real::AGENT_ACCOUNT, &kubeconfig).await;
    scenarios::killed_agent_catches_up(cluster.client().expect("client"), &kubeconfig).await;
}

/// The reservation lifecycle (`scenarios::reservation_lifecycle`, each step's time from its API
/// write to the node's disk printed) with the agents holding only the chart's RBAC. Their watches
/// carry the `spec.nodeName` field selector, which the real API server evaluates (the audit log
/// shows the requests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_on_the_real_api_server_as_the_agent_service_account() {
    let cluster = real::cluster().await;
    let client = cluster.client().expect("client");
    // The agents run as the chart's agent ServiceAccount: exactly the chart's RBAC.
    let agent_client = real::agent_client(cluster).await;
    let (a, b) = scenarios::reservation_lifecycle(client, agent_client).await;
    // The filtering is the API server's: each agent's watch asked for its own node only.
    for node in [&a, &b] {
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
}
