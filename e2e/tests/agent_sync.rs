//! The node agent through the real `kube` client: two nodes (temporary data directories), a
//! reservation's file following it through create, status changes, a move and a delete; conflict
//! and refusal; convergence after dropped watches, 410s, failed lists and an API server restart;
//! the probe endpoints and metrics.
//!
//! Scenarios are `async fn(Client, …)`; the `#[tokio::test]`s run them against the API test
//! server, and a real control plane can run the same functions.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "fixtures/shared.rs"]
mod shared;

#[path = "agent_support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use ipkeep_e2e::apiserver::{RequestFilter, Verb};
use ipkeep_operator::crd::IPReservation;
use ipkeep_operator::probes::ProbeServer;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::*;

#[tokio::test]
async fn lifecycle_on_the_test_server() {
    let server = start_server().await;
    scenarios::reservation_lifecycle(server.client(), server.client()).await;
}

#[tokio::test]
async fn conflict_on_the_test_server() {
    let server = start_server().await;
    scenarios::conflict_is_not_written(server.client()).await;
}

/// A reservation the plugin could never use (an address that is none; a real API server's CEL
/// rules refuse it, the test server does not evaluate CEL) is refused with a Warning Event and
/// never becomes a file, while the node's valid reservations are written.
#[tokio::test]
async fn invalid_reservation_is_refused_with_a_warning_event() {
    let server = start_server().await;
    let client = server.client();
    let ns = namespace(&client, "agent-refuse").await;
    let a = Node::start(&client, "node-a");
    a.ready().await;
    let api: Api<IPReservation> = Api::namespaced(client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &reservation("bad", &a.name, &["10.0.0.300"], None),
    )
    .await
    .expect("failed to create the invalid reservation");
    api.create(
        &PostParams::default(),
        &reservation("good", &a.name, &["10.0.0.3"], None),
    )
    .await
    .expect("failed to create the valid reservation");
    wait_file(
        &a.data_dir,
        &ns,
        "good",
        "the valid reservation's file",
        |f| f.is_some(),
    )
    .await;
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let event = wait_for("a Warning Event on the invalid reservation", || {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items
                .into_iter()
                .find(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("bad"))
        }
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.reason.as_deref(), Some("InvalidReservation"));
    assert!(
        event
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("10.0.0.300"),
        "{:?}",
        event.note
    );
    assert_eq!(event.reporting_controller.as_deref(), Some("ipkeep-agent"));
    for n in NETWORKS {
        let files = a.files(n);
        assert_eq!(files.len(), 1, "{files:?}");
    }
    assert_eq!(a.metrics.refused.get(), 1);
    a.stop().await;
}

/// The pods and addresses of the files of every network, for comparing with what the API holds.
fn pods_and_ips(node: &Node) -> Vec<BTreeMap<String, Vec<std::net::IpAddr>>> {
    NETWORKS
        .iter()
        .map(|n| {
            node.files(n)
                .into_iter()
                .map(|(k, f)| (k.to_string(), f.ips))
                .collect()
        })
        .collect()
}

async fn wait_pods(node: &Node, want: &[(&str, &str)], what: &str) {
    let want: BTreeMap<String, Vec<std::net::IpAddr>> = want
        .iter()
        .map(|(k, ip)| ((*k).to_owned(), vec![ip.parse().unwrap()]))
        .collect();
    wait_for(what, || {
        let got = pods_and_ips(node);
        let ok = got.iter().all(|g| *g == want);
        async move { ok.then_some(()) }
    })
    .await;
}

/// Dropped watches, an in-stream 410, failing lists and watches, an API server restart, with
/// changes made while the agent could not see them and garbage planted on disk: the agent
/// converges to exactly the reservations, and the relists were full resyncs.
#[tokio::test]
async fn converges_through_watch_faults() {
    let server = start_server().await;
    let client = server.client();
    let ns = namespace(&client, "agent-faults").await;
    let a = Node::start(&client, "node-a");
    a.ready().await;
    let api: Api<IPReservation> = Api::namespaced(client.clone(), &ns);
    for (name, ip) in [("r1", "10.0.0.1"), ("r2", "10.0.0.2")] {
        api.create(
            &PostParams::default(),
            &reservation(name, &a.name, &[ip], None),
        )
        .await
        .expect("failed to create");
    }
    let r1 = format!("{ns}/r1");
    let r2 = format!("{ns}/r2");
    let r3 = format!("{ns}/r3");
    wait_pods(
        &a,
        &[(&r1, "10.0.0.1"), (&r2, "10.0.0.2")],
        "r1 and r2 on disk",
    )
    .await;
    let full_before = a.metrics.full_syncs.get();

    // 1. A dropped watch: resumes from its resourceVersion.
    server.faults().close_watches();
    api.create(
        &PostParams::default(),
        &reservation("r3", &a.name, &["10.0.0.3"], None),
    )
    .await
    .expect("failed to create r3");
    wait_pods(
        &a,
        &[(&r1, "10.0.0.1"), (&r2, "10.0.0.2"), (&r3, "10.0.0.3")],
        "r3 after a dropped watch",
    )
    .await;

    // 2. Watches failing (500) while reservations change, then a compaction: the resumed watch
    //    gets a 410 and the agent relists. Garbage planted meanwhile must go in that resync.
    let watch_filter = RequestFilter {
        verb: Some(Verb::Watch),
        resource: Some("ipreservations".into()),
    };
    server.faults().fail_next(3, watch_filter, 500);
    server.faults().close_watches();
    api.delete("r1", &DeleteParams::default())
        .await
        .expect("failed to delete r1");
    api.patch(
        "r2",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"ips": ["10.0.0.22"]}})),
    )
    .await
    .expect("failed to change r2");
    let ns_dir = a.data_dir.join(NETWORKS[0]).join("reserved").join(&ns);
    std::fs::write(ns_dir.join(".ipkeep-tmp-999-0"), b"{\"version\":1,").unwrap();
    std::fs::write(
        ns_dir.join("ghost"),
        format!(
            "{{\"version\":1,\"namespace\":\"{ns}\",\"pod\":\"ghost\",\"ips\":[\"10.0.0.9\"],\"releaseTime\":null,\"uid\":\"x\"}}\n"
        ),
    )
    .unwrap();
    server.faults().compact();
    server.faults().close_watches();
    let mut want_now = vec![(r2.as_str(), "10.0.0.22"), (r3.as_str(), "10.0.0.3")];
    wait_pods(&a, &want_now, "convergence after failing watches and a 410").await;
    wait_for("a full resync after the 410", || {
        let n = a.metrics.full_syncs.get();
        async move { (n > full_before).then_some(()) }
    })
    .await;
    assert!(
        !ns_dir.join(".ipkeep-tmp-999-0").exists(),
        "the leftover temporary survived the resync"
    );
    assert!(
        !ns_dir.join("ghost").exists(),
        "the stale file survived the resync"
    );
    assert!(a.metrics.watch_errors.get() > 0, "no watch error was seen");

    // 3. Lists failing too, then the server restarting (all connections dropped, refused for a
    //    while): changes made before the restart show up after it.
    let list_filter = RequestFilter {
        verb: Some(Verb::List),
        resource: Some("ipreservations".into()),
    };
    server.faults().fail_next(2, list_filter, 500);
    server.faults().compact();
    api.delete("r3", &DeleteParams::default())
        .await
        .expect("failed to delete r3");
    api.create(
        &PostParams::default(),
        &reservation("r4", &a.name, &["10.0.0.4"], None),
    )
    .await
    .expect("failed to create r4");
    server.faults().restart(Duration::from_millis(300));
    let r4 = format!("{ns}/r4");
    want_now = vec![(r2.as_str(), "10.0.0.22"), (r4.as_str(), "10.0.0.4")];
    wait_pods(
        &a,
        &want_now,
        "convergence after failing lists and a restart",
    )
    .await;
    let data_dir = a.data_dir.clone();
    a.stop().await;
    for n in NETWORKS {
        assert_eq!(
            garbage_of(&data_dir, n),
            Vec::<String>::new(),
            "garbage left in {n}"
        );
    }
}

/// `/healthz` answers at once, `/readyz` only after the first full sync (held back here by
/// failing lists), `/metrics` counts what the agent did.
#[tokio::test]
async fn probes_and_metrics() {
    let server = start_server().await;
    let client = server.client();
    let ns = namespace(&client, "agent-probes").await;
    let api: Api<IPReservation> = Api::namespaced(client.clone(), &ns);
    let node = unique("node-a");
    api.create(
        &PostParams::default(),
        &reservation("m-0", &node, &["10.0.0.7"], None),
    )
    .await
    .expect("failed to create");
    server.faults().fail_next(
        3,
        RequestFilter {
            verb: Some(Verb::List),
            resource: Some("ipreservations".into()),
        },
        500,
    );
    let scratch = Scratch::new(&node);
    let a = Node::start_named(&client, &node, scratch.path());
    let probes = ProbeServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        a.registry.clone(),
        a.readiness.clone(),
    )
    .await
    .expect("failed to bind the probe server");
    let addr = probes.local_addr().expect("a bound address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(probes.run(async move {
        let _ = stopped.await;
    }));

    assert_eq!(http_get(addr, "/healthz").await.0, 200);
    let (code, _) = http_get(addr, "/readyz").await;
    assert_eq!(
        code, 503,
        "ready before the first full sync (the lists are failing)"
    );
    wait_for("/readyz to answer 200", || async move {
        (http_get(addr, "/readyz").await.0 == 200).then_some(())
    })
    .await;
    wait_file(&a.data_dir, &ns, "m-0", "m-0's file", |f| f.is_some()).await;
    // The counters move right after the files (same pass).
    let text = wait_for("/metrics to count the two written files", || async move {
        let (code, text) = http_get(addr, "/metrics").await;
        (code == 200 && text.contains("ipkeep_agent_files_written_total 2")).then_some(text)
    })
    .await;
    for line in [
        "ipkeep_agent_reservations 1",
        "ipkeep_agent_full_syncs_total 1",
        "ipkeep_agent_sync_errors_total{kind=\"file\"} 0",
        "ipkeep_agent_sync_errors_total{kind=\"pass\"} 0",
        "ipkeep_agent_change_to_file_seconds_count",
        "ipkeep_agent_last_full_sync_timestamp_seconds",
        "ipkeep_agent_files_removed_total 0",
    ] {
        assert!(text.contains(line), "/metrics lacks {line:?}:\n{text}");
    }
    let since: i64 = text
        .lines()
        .find_map(|l| l.strip_prefix("ipkeep_agent_seconds_since_last_full_sync "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no seconds-since-full-sync gauge:\n{text}"));
    assert!(
        since >= 0,
        "the gauge still says no full sync happened: {since}"
    );
    assert!(
        a.metrics.watch_errors.get() >= 1,
        "the failing lists were not counted"
    );
    api.delete("m-0", &DeleteParams::default())
        .await
        .expect("failed to delete");
    wait_file(&a.data_dir, &ns, "m-0", "m-0's file to go", |f| f.is_none()).await;
    // The counters move right after the files (same pass).
    wait_for("/metrics to count the two removed files", || async move {
        let (_, text) = http_get(addr, "/metrics").await;
        (text.contains("ipkeep_agent_files_removed_total 2")
            && text.contains("ipkeep_agent_reservations 0"))
        .then_some(())
    })
    .await;
    let _ = stop.send(());
    serving.await.unwrap();
    a.stop().await;
}

/// The periodic full resync repairs what someone changed on disk behind the agent's back (a file
/// deleted, one edited, a stray file added) without any change in the API.
#[tokio::test]
async fn periodic_resync_repairs_hand_edits() {
    let server = start_server().await;
    let client = server.client();
    let ns = namespace(&client, "agent-resync").await;
    let node = unique("node-r");
    let scratch = Scratch::new(&node);
    let a = Node::start_with(&client, &node, scratch.path(), Duration::from_secs(1));
    a.ready().await;
    let api: Api<IPReservation> = Api::namespaced(client.clone(), &ns);
    for (name, ip) in [("p0", "10.3.0.1"), ("p1", "10.3.0.2")] {
        api.create(
            &PostParams::default(),
            &reservation(name, &node, &[ip], None),
        )
        .await
        .expect("failed to create");
    }
    let p0 = format!("{ns}/p0");
    let p1 = format!("{ns}/p1");
    wait_pods(&a, &[(&p0, "10.3.0.1"), (&p1, "10.3.0.2")], "both files").await;
    let full_before = a.metrics.full_syncs.get();
    let ns_dir = a.data_dir.join(NETWORKS[0]).join("reserved").join(&ns);
    std::fs::remove_file(ns_dir.join("p0")).unwrap();
    let edited = std::fs::read_to_string(ns_dir.join("p1"))
        .unwrap()
        .replace("10.3.0.2", "10.3.0.99");
    std::fs::write(ns_dir.join("p1"), edited).unwrap();
    std::fs::write(
        ns_dir.join("stray"),
        format!(
            "{{\"version\":1,\"namespace\":\"{ns}\",\"pod\":\"stray\",\"ips\":[\"10.3.0.7\"],\"releaseTime\":null,\"uid\":\"x\"}}\n"
        ),
    )
    .unwrap();
    wait_for("a periodic full resync", || {
        let n = a.metrics.full_syncs.get();
        async move { (n > full_before).then_some(()) }
    })
    .await;
    wait_pods(
        &a,
        &[(&p0, "10.3.0.1"), (&p1, "10.3.0.2")],
        "the hand edits repaired",
    )
    .await;
    a.stop().await;
}

/// The data directory's watch: a network directory removed (`rm -rf`, as reset tools do), a
/// `reserved/` moved away and the whole data directory removed are each repaired by a full resync
/// at once, with the periodic resync an hour away; the metric counts each by its cause.
#[tokio::test]
async fn a_wiped_network_directory_is_restored_at_once() {
    let server = start_server().await;
    let client = server.client();
    let ns = namespace(&client, "agent-wipe").await;
    let node = unique("node-w");
    let scratch = Scratch::new(&node);
    let data = scratch.join("data");
    let a = Node::start_named(&client, &node, &data);
    a.ready().await;
    let api: Api<IPReservation> = Api::namespaced(client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &reservation("w-0", &node, &["10.5.0.1"], None),
    )
    .await
    .expect("failed to create");
    let w0 = format!("{ns}/w-0");
    wait_pods(&a, &[(&w0, "10.5.0.1")], "the file").await;
    type Wipe = fn(&std::path::Path);
    let wipes: [(&str, Wipe, &str); 3] = [
        (
            "a network directory removed",
            |d| std::fs::remove_dir_all(d.join(NETWORKS[0])).unwrap(),
            "network_dir_removed",
        ),
        (
            "a reserved/ moved away",
            |d| {
                let net = d.join(NETWORKS[1]);
                std::fs::rename(net.join("reserved"), net.join("reserved.old")).unwrap();
            },
            "reserved_removed",
        ),
        (
            "the data directory removed",
            |d| std::fs::remove_dir_all(d).unwrap(),
            "data_dir_removed",
        ),
    ];
    for (what, wipe, reason) in wipes {
        let counted = a.metrics.directory_resyncs.with_label_values(&[reason]);
        let before = counted.get();
        wipe(&a.data_dir);
        wait_pods(
            &a,
            &[(&w0, "10.5.0.1")],
            &format!("the file back after {what}"),
        )
        .await;
        wait_for(
            &format!("the resync after {what} counted as {reason}"),
            || {
                let n = counted.get();
                async move { (n > before).then_some(()) }
            },
        )
        .await;
    }
    a.stop().await;
}

/// A data directory the agent cannot use (a file where it should be) keeps it unready and counts
/// failed passes; once the directory is usable the retried full sync writes the files and the
/// agent becomes ready, without any change in the API.
#[tokio::test]
async fn unusable_data_dir_is_retried_until_it_works() {
    let server = start_server().await;
    let client = server.client();
    let ns = namespace(&client, "agent-retry").await;
    let node = unique("node-e");
    let api: Api<IPReservation> = Api::namespaced(client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &reservation("q-0", &node, &["10.4.0.1"], None),
    )
    .await
    .expect("failed to create");
    let parent = Scratch::new(&node);
    let data_dir = parent.join("data");
    std::fs::write(&data_dir, b"not a directory").unwrap();
    let a = Node::start_named(&client, &node, &data_dir);
    // One failed pass counts once per network: wait for two passes (a first try and a retry).
    let two_passes = 2 * NETWORKS.len() as u64;
    wait_for("two failed passes", || {
        let n = a.metrics.sync_errors.with_label_values(&["pass"]).get();
        async move { (n >= two_passes).then_some(()) }
    })
    .await;
    assert!(!a.readiness.is_ready(), "ready although no sync succeeded");
    std::fs::remove_file(&data_dir).unwrap();
    std::fs::create_dir(&data_dir).unwrap();
    a.ready().await;
    wait_file(&data_dir, &ns, "q-0", "q-0's file after the retry", |f| {
        f.is_some()
    })
    .await;
    a.stop().await;
}
