//! Two controller replicas (the built binary, twice) elect a leader through a Lease on the API
//! test server; killing the leader with SIGKILL lets the standby take over, and SIGTERM releases
//! the lease.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "fixtures/shared.rs"]
mod shared;

#[path = "fixtures/harness.rs"]
mod harness;

#[path = "fixtures/controller.rs"]
mod controller;

use controller::*;
use ipkeep_operator::crd::Phase;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, ResourceExt};

async fn holder(client: &kube::Client) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    leases
        .get_opt("ipkeep-controller")
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec.and_then(|s| s.holder_identity))
}

// Multi-threaded: the API test server runs in this process and must keep serving while the test
// waits for a child process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_takes_over_when_the_leader_is_killed_and_sigterm_releases_the_lease() {
    // Built (if need be) before the API test server runs on this runtime.
    harness::operator_binary();
    let server = harness::start().await;
    let client = server.client();
    let dir = harness::Scratch::new("leader");
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();

    let lease = ["--lease-namespace", "default"];
    let mut replicas = vec![
        harness::Replica::spawn(&kubeconfig, "replica-a", &lease, None),
        harness::Replica::spawn(&kubeconfig, "replica-b", &lease, None),
    ];
    let leader = harness::wait_for("a replica to hold the Lease", || {
        let client = client.clone();
        async move { holder(&client).await }
    })
    .await;
    let ns = "default";
    let pod = create_running_pod(
        &client,
        ns,
        "db-0",
        "node-a",
        &["10.244.1.17"],
        &retain(Some("1h")),
    )
    .await;
    let uid = pod.uid().unwrap();
    wait_reservation(&client, ns, "db-0", "Bound by the leader", |r| {
        bound_to(r, &uid)
    })
    .await;

    // SIGKILL the leader: no chance to release the lease.
    let index = replicas
        .iter()
        .position(|r| r.identity == leader)
        .expect("the leader is one of ours");
    replicas.remove(index).kill();
    let survivor = replicas.pop().unwrap();

    // The pod goes; only a new leader can release the reservation.
    delete_pod(&client, ns, "db-0").await;
    wait_reservation(&client, ns, "db-0", "Released by the new leader", |r| {
        phase(r) == Some(Phase::Released)
    })
    .await;
    let new_holder = holder(&client).await;
    assert_eq!(
        new_holder.as_deref(),
        Some(survivor.identity.as_str()),
        "the standby holds the lease"
    );

    // SIGTERM: the survivor releases the lease and exits cleanly.
    let identity = survivor.identity.clone();
    let status = tokio::task::spawn_blocking(move || survivor.terminate())
        .await
        .unwrap();
    assert!(
        status.success(),
        "the controller exits 0 on SIGTERM, got {status}"
    );
    let after = holder(&client).await;
    assert_ne!(
        after.as_deref(),
        Some(identity.as_str()),
        "the lease was released on SIGTERM"
    );
    server.shutdown().await;
}
