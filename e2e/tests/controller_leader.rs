//! Two controller replicas (the built binary, twice) elect a leader through a Lease on the API
//! test server; killing the leader with SIGKILL lets the standby take over, and SIGTERM releases
//! the lease.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "fixtures/harness.rs"]
mod harness;

#[path = "fixtures/controller.rs"]
mod controller;

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
};

use controller::*;
use ipkeep_operator::crd::Phase;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, ResourceExt};

include!("fixtures/operator_binary.rs");

struct Replica {
    identity: &'static str,
    child: Child,
}

fn spawn(bin: &PathBuf, kubeconfig: &PathBuf, identity: &'static str) -> Replica {
    let child = Command::new(bin)
        .args([
            "controller",
            "--metrics-addr",
            "127.0.0.1:0",
            "--identity",
            identity,
            "--lease-namespace",
            "default",
            "--lease-duration",
            "3",
            "--log-level",
            "info",
        ])
        .env("KUBECONFIG", kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("failed to start ipkeep-operator controller");
    Replica { identity, child }
}

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
    let bin = operator_binary();
    let server = harness::start().await;
    let client = server.client();
    let dir = std::env::temp_dir().join(format!("ipkeep-leader-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();

    let mut replicas = vec![
        spawn(&bin, &kubeconfig, "replica-a"),
        spawn(&bin, &kubeconfig, "replica-b"),
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
    let mut dead = replicas.remove(index);
    dead.child.kill().unwrap();
    dead.child.wait().unwrap();
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
        Some(survivor.identity),
        "the standby holds the lease"
    );

    // SIGTERM: the survivor releases the lease and exits cleanly.
    let Replica {
        identity,
        mut child,
    } = survivor;
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(
        status.success(),
        "the controller exits 0 on SIGTERM, got {status}"
    );
    let after = holder(&client).await;
    assert_ne!(
        after.as_deref(),
        Some(identity),
        "the lease was released on SIGTERM"
    );
    let _ = std::fs::remove_dir_all(&dir);
    server.shutdown().await;
}
