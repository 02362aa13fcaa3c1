//! The controller through the real `kube` client against the API test server: the scenarios of
//! `fixtures/controller.rs`, plus injected faults (dropped watches, 409s, 500s, 410s, a restart)
//! that only the test server can produce.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "fixtures/shared.rs"]
mod shared;

#[path = "fixtures/harness.rs"]
mod harness;

#[path = "fixtures/controller.rs"]
mod controller;

use controller::*;
use ipkeep_e2e::apiserver::{RequestFilter, Verb};
use ipkeep_operator::crd::{IPReservation, Phase};
use kube::{Api, ResourceExt};

async fn with_controller<F, Fut>(scenario: F)
where
    F: FnOnce(kube::Client) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let server = harness::start().await;
    let running = start_controller(server.client()).await;
    scenario(server.client()).await;
    running.stop().await;
    server.shutdown().await;
}

#[tokio::test]
async fn bound_then_released_then_bound_again() {
    with_controller(|c| async move { bound_released_rebound(&c, "default").await }).await;
}

#[tokio::test]
async fn a_short_retention_expires_at_its_release_time_never_before() {
    with_controller(|c| async move { short_retention_expires_on_time(&c, "default").await }).await;
}

#[tokio::test]
async fn removing_the_annotation_ends_the_reservation() {
    with_controller(
        |c| async move { annotation_removed_ends_the_reservation(&c, "default").await },
    )
    .await;
}

#[tokio::test]
async fn hand_made_reservations_are_honoured_and_conflicts_reported() {
    with_controller(|c| async move { hand_made_reservations_and_conflicts(&c, "default").await })
        .await;
}

#[tokio::test]
async fn statefulset_annotations_and_release_with_owner() {
    with_controller(|c| async move { statefulset_annotations_and_cascade(&c, "default").await })
        .await;
}

/// Dropped watches, 500s on writes, 409s on deletes, a compaction (410 on resume) and a restart
/// of the API server while pods come and go: the controller converges, and no reservation is
/// ever deleted before its release time or while its pod lives.
#[tokio::test]
async fn converges_through_faults_and_deletes_nothing_early() {
    let server = harness::start().await;
    let client = server.client();
    let (deletions, watch_task) = DeletionLog::watch(&client);
    let running = start_controller(client.clone()).await;
    let ns = "default";

    // Twelve long-lived pods, six short-lived ones (2 s after they go).
    let mut long = Vec::new();
    for i in 0..12 {
        let name = format!("long-{i}");
        let ip = format!("10.244.1.{}", 100 + i);
        create_running_pod(&client, ns, &name, "node-a", &[&ip], &retain(Some("1h"))).await;
        long.push(name);
    }
    let mut short = Vec::new();
    for i in 0..6 {
        let name = format!("short-{i}");
        let ip = format!("10.244.1.{}", 150 + i);
        create_running_pod(&client, ns, &name, "node-a", &[&ip], &retain(Some("2s"))).await;
        short.push(name);
    }
    for name in long.iter().chain(&short) {
        wait_reservation(&client, ns, name, "Bound", |r| {
            phase(r) == Some(Phase::Bound)
        })
        .await;
    }

    let faults = server.faults();
    let ipr_writes = |verb| RequestFilter {
        verb: Some(verb),
        resource: Some("ipreservations".into()),
    };
    faults.fail_next(4, ipr_writes(Verb::Patch), 500);
    faults.fail_next(2, ipr_writes(Verb::Delete), 409);
    faults.fail_next(
        2,
        RequestFilter {
            verb: Some(Verb::Get),
            resource: Some("pods".into()),
        },
        500,
    );
    faults.close_watches();
    // Half the long-lived pods go, and all the short-lived ones, around a restart and a
    // compaction: some deletions happen while the controller cannot watch.
    for name in long.iter().take(6) {
        delete_pod(&client, ns, name).await;
    }
    // An API server restart: every connection dropped, the port closed for 800 ms; the
    // controller's watches and writes fail meanwhile and back off.
    faults.restart(std::time::Duration::from_millis(800));
    harness::wait_for("the API server to go down for the restart", || {
        let client = client.clone();
        async move { client.apiserver_version().await.err().map(|_| ()) }
    })
    .await;
    harness::wait_for("the API server to answer again after the restart", || {
        let client = client.clone();
        async move { client.apiserver_version().await.ok().map(|_| ()) }
    })
    .await;
    faults.compact();
    for name in &short {
        delete_pod(&client, ns, name).await;
    }
    faults.close_watches();
    faults.fail_next(3, ipr_writes(Verb::Patch), 500);

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
        "node-a",
        &["10.244.1.100"],
        &retain(Some("1h")),
    )
    .await;
    let uid = again.uid().unwrap();
    wait_reservation(&client, ns, &long[0], "Bound again", |r| bound_to(r, &uid)).await;

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
    server.shutdown().await;
}

/// A pod deleted and re-created while the controller is stopped, its reservation's 1 s retention
/// long past by the time the controller starts again: the reservation is re-bound, never deleted.
#[tokio::test]
async fn a_restarted_controller_never_deletes_the_reservation_of_a_live_pod() {
    let server = harness::start().await;
    let client = server.client();
    let ns = "default";
    let running = start_controller(client.clone()).await;
    create_running_pod(
        &client,
        ns,
        "sticky-0",
        "node-a",
        &["10.244.1.77"],
        &retain(Some("1s")),
    )
    .await;
    wait_reservation(&client, ns, "sticky-0", "Bound", |r| {
        phase(r) == Some(Phase::Bound)
    })
    .await;
    running.stop().await;
    // Controller down: the pod goes and returns.
    delete_pod(&client, ns, "sticky-0").await;
    let again = create_running_pod(
        &client,
        ns,
        "sticky-0",
        "node-a",
        &["10.244.1.77"],
        &retain(Some("1s")),
    )
    .await;
    let running = start_controller(client.clone()).await;
    let uid = again.uid().unwrap();
    wait_reservation(&client, ns, "sticky-0", "Bound to the returned pod", |r| {
        bound_to(r, &uid)
    })
    .await;
    running.stop().await;
    server.shutdown().await;
}

/// `/metrics` passes `promtool check metrics` (Debian package `prometheus`).
#[tokio::test]
async fn metrics_pass_promtool() {
    let server = harness::start().await;
    let client = server.client();
    let running = start_controller(client.clone()).await;
    create_running_pod(
        &client,
        "default",
        "m-0",
        "node-a",
        &["10.244.1.90"],
        &retain(Some("1s")),
    )
    .await;
    wait_reservation(&client, "default", "m-0", "Bound", |r| {
        phase(r) == Some(Phase::Bound)
    })
    .await;
    delete_pod(&client, "default", "m-0").await;
    wait_reservation_gone(&client, "default", "m-0").await;
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
    let mut child = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    running.stop().await;
    server.shutdown().await;
}

async fn wait_for_metric(addr: std::net::SocketAddr, line: &str) -> String {
    harness::wait_for(&format!("/metrics to show {line}"), || async move {
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
#[tokio::test]
async fn a_reconcile_with_nothing_to_change_writes_nothing() {
    let server = harness::start().await;
    let client = server.client();
    let running = start_controller(client.clone()).await;
    let ns = "default";
    let pod = create_running_pod(
        &client,
        ns,
        "quiet-0",
        "node-a",
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
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
    pods.patch(
        "quiet-0",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"metadata": {"labels": {"touched": "yes"}}})),
    )
    .await
    .unwrap();
    harness::wait_for("a reconcile after the label change", || async {
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
    server.shutdown().await;
}

#[tokio::test]
async fn a_pod_returning_on_another_node_moves_its_reservation_with_a_warning() {
    with_controller(|c| async move { returning_pod_on_another_node(&c, "default").await }).await;
}

/// `/healthz` answers at once; `/readyz` once the caches are filled.
#[tokio::test]
async fn health_and_readiness_endpoints() {
    let server = harness::start().await;
    let running = start_controller(server.client()).await;
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
    harness::wait_for("/readyz to answer 200", || async {
        get("/readyz")
            .await
            .starts_with("HTTP/1.1 200")
            .then_some(())
    })
    .await;
    running.stop().await;
    server.shutdown().await;
}
