//! The node agent against the REAL control plane (kube-apiserver v1.34, `make cluster-bins`):
//! the scenarios of `agent_support/scenarios.rs`, with `spec.nodeName` a real `selectableFields`
//! entry the API server filters on, and each step of a reservation's life (created, changed,
//! moved, deleted) measured from the API write to the file on disk; convergence through API
//! faults — dropped watches, watches failing with 500 or answered `410 Expired`, failing lists,
//! an outage of the API server's address — injected by a fault proxy (`ipkeep_e2e::proxy`)
//! between the agent and kube-apiserver; the probe endpoints and metrics; the periodic resync
//! and a data directory retried until usable.
//!
//! The agents run in this process (each "node" its own data directory) and, for the restart
//! scenario, as the built binary, as the chart's agent ServiceAccount (the chart's RBAC rendered
//! with the built helm and applied). Each test has its own nodes and namespace, and a fault test
//! its own proxy, on the control plane the tests of this binary share.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::testkit::plane;

use std::{collections::BTreeMap, time::Duration};

use crate::agent_support::{
    NETWORKS, Node, garbage_of, http_get, namespace, reservation, scenarios, unique, wait_file,
};
use ipkeep_e2e::proxy::{Fault, FaultProxy, Rule, Verb};
use ipkeep_e2e::testkit::{Scratch, wait_for};
use ipkeep_operator::{api::IPReservation, runtime::probes::ProbeServer};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflict_on_the_real_api_server() {
    let _plane = plane::use_plane().await;
    let plane = plane::control_plane().await;
    scenarios::conflict_is_not_written(plane.client().expect("client")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_agent_catches_up_on_the_real_api_server() {
    let _plane = plane::use_plane().await;
    let plane = plane::control_plane().await;
    // The agent binary runs as the chart's agent ServiceAccount.
    let scratch = Scratch::new("kubeconfig");
    let kubeconfig = scratch.join("config");
    plane::account_kubeconfig(plane, plane::AGENT_ACCOUNT, &kubeconfig).await;
    scenarios::killed_agent_catches_up(plane.client().expect("client"), &kubeconfig).await;
}

/// The reservation lifecycle (`scenarios::reservation_lifecycle`, each step's time from its API
/// write to the node's disk printed) with the agents holding only the chart's RBAC. Their watches
/// carry the `spec.nodeName` field selector, which the real API server evaluates (the audit log
/// shows the requests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_on_the_real_api_server_as_the_agent_service_account() {
    let _plane = plane::use_plane().await;
    let plane = plane::control_plane().await;
    let client = plane.client().expect("client");
    // The agents run as the chart's agent ServiceAccount: exactly the chart's RBAC.
    let agent_client = plane::agent_client(plane).await;
    let (a, b) = scenarios::reservation_lifecycle(client, agent_client).await;
    // The filtering is the API server's: each agent's watch asked for its own node only.
    for node in [&a, &b] {
        let selector = format!("fieldSelector=spec.nodeName%3D{node}");
        let watches = plane::audited(plane, &["/ipreservations?", &selector, "watch=true"]);
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

async fn wait_hits(proxy: &FaultProxy, id: ipkeep_e2e::proxy::RuleId, n: usize, what: &str) {
    wait_for(what, || {
        let hits = proxy.hits(id);
        async move { (hits >= n).then_some(()) }
    })
    .await;
}

/// Dropped watches, watches failing with 500 and answered `410 Expired`, failing lists, an
/// outage of the API server's address, with changes made while the agent could not see them
/// and garbage planted on disk: the agent converges to the reservations, and the relist was a
/// full resync. A reservation deleted while the agent could not see it is kept as lost
/// (`rules::loss`: the agent cannot tell that delete from an etcd restore), and said so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn converges_through_api_faults() {
    let _plane = plane::use_plane().await;
    let plane = plane::control_plane().await;
    let client = plane.client().expect("client");
    let (agent_client, proxy) = plane::proxied_account_client(plane, plane::AGENT_ACCOUNT).await;
    let ns = namespace(&client, "agent-faults").await;
    let a = Node::start(&agent_client, "node-a");
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
    proxy.close_watches();
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

    // 2. Watches failing (500) while reservations change, then one answered 410 Expired (what a
    //    compaction does to a resumed watch): the agent relists. Garbage planted meanwhile must
    //    go in that resync.
    let failing = proxy.add(
        Rule::new(Fault::status(500))
            .verb(Verb::Watch)
            .resource("ipreservations")
            .times(3),
    );
    let expired = proxy.add(
        Rule::new(Fault::Expired)
            .verb(Verb::Watch)
            .resource("ipreservations")
            .times(1),
    );
    proxy.close_watches();
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
    // A stale file, expired: released whatever its object (one still protecting an address
    // would be kept as lost).
    std::fs::write(
        ns_dir.join("ghost"),
        format!(
            "{{\"version\":1,\"namespace\":\"{ns}\",\"pod\":\"ghost\",\"ips\":[\"10.0.0.9\"],\"releaseTime\":\"2020-01-01T00:00:00Z\",\"uid\":\"x\"}}\n"
        ),
    )
    .unwrap();
    wait_hits(&proxy, failing, 3, "the agent's watch to fail three times").await;
    wait_hits(
        &proxy,
        expired,
        1,
        "the agent's watch to be answered 410 Expired",
    )
    .await;
    // r1 was deleted while the watch failed: its file is kept, as lost.
    let mut want_now = vec![
        (r1.as_str(), "10.0.0.1"),
        (r2.as_str(), "10.0.0.22"),
        (r3.as_str(), "10.0.0.3"),
    ];
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

    // 3. Lists failing too, then the API server's address going away (every connection dropped,
    //    connections refused for a second) while reservations change, and the resumed watch
    //    expired: the agent relists through the failing lists and sees the changes.
    let lists = proxy.add(
        Rule::new(Fault::status(500))
            .verb(Verb::List)
            .resource("ipreservations")
            .times(2),
    );
    let expired_again = proxy.add(
        Rule::new(Fault::Expired)
            .verb(Verb::Watch)
            .resource("ipreservations")
            .times(1),
    );
    let addr = proxy.addr();
    let changes = async {
        wait_for("the proxy's port to refuse connections", || async move {
            tokio::net::TcpStream::connect(addr)
                .await
                .is_err()
                .then_some(())
        })
        .await;
        api.delete("r3", &DeleteParams::default())
            .await
            .expect("failed to delete r3");
        api.create(
            &PostParams::default(),
            &reservation("r4", &a.name, &["10.0.0.4"], None),
        )
        .await
        .expect("failed to create r4");
    };
    tokio::join!(proxy.outage(Duration::from_secs(1)), changes);
    wait_hits(
        &proxy,
        expired_again,
        1,
        "the resumed watch to be answered 410 Expired",
    )
    .await;
    wait_hits(&proxy, lists, 2, "the agent's relist to fail twice").await;
    let r4 = format!("{ns}/r4");
    want_now = vec![
        (r1.as_str(), "10.0.0.1"),
        (r2.as_str(), "10.0.0.22"),
        (r3.as_str(), "10.0.0.3"),
        (r4.as_str(), "10.0.0.4"),
    ];
    wait_pods(
        &a,
        &want_now,
        "convergence after failing lists and an outage",
    )
    .await;
    // The files converge before the count can: a pass that could not ask the API server about
    // r3 (the lists failing) keeps its file undecided and reports nothing until a retry asks.
    wait_for("r1 and r3, deleted unseen, counted as lost", || {
        let n = a.metrics.lost_reservations.get();
        async move { (n == 2).then_some(()) }
    })
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
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_and_metrics() {
    let _plane = plane::use_plane().await;
    let plane = plane::control_plane().await;
    let client = plane.client().expect("client");
    let (agent_client, proxy) = plane::proxied_account_client(plane, plane::AGENT_ACCOUNT).await;
    let ns = namespace(&client, "agent-probes").await;
    let api: Api<IPReservation> = Api::namespaced(client.clone(), &ns);
    let node = unique("node-a");
    api.create(
        &PostParams::default(),
        &reservation("m-0", &node, &["10.0.0.7"], None),
    )
    .await
    .expect("failed to create");
    let failing_lists = proxy.add(
        Rule::new(Fault::status(500))
            .verb(Verb::List)
            .resource("ipreservations")
            .times(3),
    );
    let scratch = Scratch::new(&node);
    let a = Node::start_named(&agent_client, &node, scratch.path());
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
    assert_eq!(proxy.hits(failing_lists), 3, "the first three lists failed");
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
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_resync_repairs_hand_edits() {
    let _plane = plane::use_plane().await;
    let plane = plane::control_plane().await;
    let client = plane.client().expect("client");
    let agent_client = plane::agent_client(plane).await;
    let ns = namespace(&client, "agent-resync").await;
    let node = unique("node-r");
    let scratch = Scratch::new(&node);
    let a = Node::start_with(&agent_client, &node, scratch.path(), Duration::from_secs(1));
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
    // Expired: a stray file still protecting an address would be kept, as lost.
    std::fs::write(
        ns_dir.join("stray"),
        format!(
            "{{\"version\":1,\"namespace\":\"{ns}\",\"pod\":\"stray\",\"ips\":[\"10.3.0.7\"],\"releaseTime\":\"2020-01-01T00:00:00Z\",\"uid\":\"x\"}}\n"
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
    let _plane = plane::use_plane().await;
    let plane = plane::control_plane().await;
    let client = plane.client().expect("client");
    let agent_client = plane::agent_client(plane).await;
    let ns = namespace(&client, "agent-wipe").await;
    let node = unique("node-w");
    let scratch = Scratch::new(&node);
    let data = scratch.join("data");
    let a = Node::start_named(&agent_client, &node, &data);
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
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_data_dir_is_retried_until_it_works() {
    let _plane = plane::use_plane().await;
    let plane = plane::control_plane().await;
    let client = plane.client().expect("client");
    let agent_client = plane::agent_client(plane).await;
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
    let a = Node::start_named(&agent_client, &node, &data_dir);
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

/// An etcd restore's shape on the real API server (`rules::loss`): a reservation deleted while
/// the agent was stopped is kept as lost, and a reservation of another pod claiming its address
/// (what a restore brings back: one released since, its address given to the lost one's pod) is
/// not written, with a Warning `InvalidReservation` naming the lost one. Recovering the lost one
/// is refused too, naming the holder (`rules::recovery`, table-tested).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_file_keeps_its_address_against_a_reservation_claiming_it() {
    let _plane = plane::use_plane().await;
    let plane = plane::control_plane().await;
    let client = plane.client().expect("client");
    let agent_client = plane::agent_client(plane).await;
    let ns = namespace(&client, "agent-lost").await;
    let node = unique("node-l");
    let scratch = Scratch::new(&node);
    let a = Node::start_named(&agent_client, &node, scratch.path());
    a.ready().await;
    let api: Api<IPReservation> = Api::namespaced(client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &reservation("newer", &node, &["10.4.0.8"], None),
    )
    .await
    .expect("failed to create");
    let newer = format!("{ns}/newer");
    wait_pods(&a, &[(&newer, "10.4.0.8")], "newer's file").await;
    a.stop().await;

    // While the agent is stopped: newer vanishes unseen, an older one claiming 10.4.0.8 appears.
    api.delete("newer", &DeleteParams::default())
        .await
        .expect("failed to delete");
    api.create(
        &PostParams::default(),
        &reservation("restored", &node, &["10.4.0.8"], None),
    )
    .await
    .expect("failed to create");
    let a = Node::start_named(&agent_client, &node, scratch.path());
    a.ready().await;
    wait_pods(
        &a,
        &[(&newer, "10.4.0.8")],
        "newer kept, the restored one not written",
    )
    .await;
    assert_eq!(a.metrics.lost_reservations.get(), 1);
    assert_eq!(a.metrics.refused.get(), 1);
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
    let note = wait_for(
        "a Warning InvalidReservation on the restored one",
        || async {
            events
                .list(&Default::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("InvalidReservation")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("restored")
                })?
                .note
        },
    )
    .await;
    assert!(
        note.contains("10.4.0.8 is held on this node by the file of the lost reservation")
            && note.contains(&newer),
        "{note}"
    );

    // Deleted on purpose, the restored one goes; the lost file stays, its address protected.
    api.delete("restored", &DeleteParams::default())
        .await
        .expect("failed to delete");
    wait_for("the refusal to clear", || {
        let n = a.metrics.refused.get();
        async move { (n == 0).then_some(()) }
    })
    .await;
    wait_pods(&a, &[(&newer, "10.4.0.8")], "newer still kept").await;
    a.stop().await;
}

/// How full the node is, on its Node and in the metrics: a Node with a /29 pod CIDR (5 addresses
/// host-local hands out) and a budget annotation of 2, a container's allocation file in one
/// network, a Bound reservation of that address and a Released one of another. The agent, as the
/// chart's agent ServiceAccount (its RBAC: watch and patch Nodes), writes the two annotations with
/// a merge patch under its field manager and nothing else of the Node, and exports the figures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_on_the_node_and_in_the_metrics_as_the_agent_service_account() {
    use ipkeep_operator::rules::capacity::{CAPACITY, FREE_ADDRESSES};
    use k8s_openapi::api::core::v1::Node as KubeNode;

    let _plane = plane::use_plane().await;
    let plane = plane::control_plane().await;
    let client = plane.client().expect("client");
    let agent_client = plane::agent_client(plane).await;
    let ns = namespace(&client, "agent-capacity").await;
    let name = unique("node-cap");
    let nodes: Api<KubeNode> = Api::all(client.clone());
    let node: KubeNode = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": {"ipkeep.dev/node-budget": "2"}},
        "spec": {"podCIDR": "10.77.0.0/29", "podCIDRs": ["10.77.0.0/29"]},
    }))
    .unwrap();
    nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("failed to create the Node");
    let scratch = Scratch::new(&name);
    std::fs::create_dir_all(scratch.join(NETWORKS[0])).unwrap();
    std::fs::write(scratch.join(NETWORKS[0]).join("10.77.0.2"), "c1\r\neth0").unwrap();
    std::fs::write(
        scratch.join(NETWORKS[0]).join("last_reserved_ip.0"),
        "10.77.0.2",
    )
    .unwrap();
    let api: Api<IPReservation> = Api::namespaced(client.clone(), &ns);
    for (pod, ip) in [("bound-0", "10.77.0.2"), ("released-0", "10.77.0.3")] {
        api.create(
            &PostParams::default(),
            &reservation(pod, &name, &[ip], None),
        )
        .await
        .expect("failed to create");
    }
    // A reservation without status is one made by hand, held until its retention ends: the
    // controller's Bound is what makes it held for a running pod.
    api.patch_status(
        "bound-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Bound", "podUID": "p1"}})),
    )
    .await
    .expect("failed to bind");
    api.patch_status(
        "released-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "phase": "Released",
            "releasedAt": "2026-01-01T00:00:00Z",
            "releaseTime": "2099-01-01T00:00:00Z",
        }})),
    )
    .await
    .expect("failed to release");
    let a = Node::start_named(&agent_client, &name, scratch.path());
    a.ready().await;
    let want_capacity = format!(
        "{n0} 10.77.0.0/29: 3 of 5 free (1 allocated, held by reservations: 1 Bound, 1 Released); \
         {n1} 10.77.0.0/29: 3 of 5 free (0 allocated, held by reservations: 1 Bound, 1 Released); \
         budget headroom 1 of 2 (annotation)",
        n0 = NETWORKS[0],
        n1 = NETWORKS[1]
    );
    let annotated = wait_for("the Node's capacity annotations", || {
        let nodes = nodes.clone();
        let name = name.clone();
        async move {
            let n = nodes.get(&name).await.ok()?;
            let a = n.metadata.annotations.clone().unwrap_or_default();
            a.contains_key(CAPACITY).then_some(n)
        }
    })
    .await;
    let annotations = annotated.metadata.annotations.clone().unwrap();
    assert_eq!(annotations[CAPACITY], want_capacity);
    assert_eq!(annotations[FREE_ADDRESSES], "3");
    // The agent's write: an Update under its field manager owning exactly its two keys.
    let entries: Vec<_> = annotated
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.manager.as_deref() == Some("ipkeep-agent"))
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].operation.as_deref(), Some("Update"));
    assert_eq!(
        entries[0].fields_v1.as_ref().unwrap().0,
        json!({"f:metadata": {"f:annotations": {
            format!("f:{CAPACITY}"): {},
            format!("f:{FREE_ADDRESSES}"): {},
        }}})
    );
    let free = &a.metrics.capacity.free;
    assert_eq!(
        free.with_label_values(&[NETWORKS[0], "10.77.0.0/29"]).get(),
        3.0
    );
    let reserved = &a.metrics.capacity.reserved;
    for (phase, count) in [("Bound", 1.0), ("Released", 1.0)] {
        assert_eq!(
            reserved
                .with_label_values(&[NETWORKS[0], "10.77.0.0/29", phase])
                .get(),
            count,
            "{phase}"
        );
    }
    assert_eq!(
        a.metrics
            .capacity
            .headroom
            .with_label_values(&["annotation"])
            .get(),
        1
    );
    // The Released reservation gone: its address is free again, on the Node too.
    api.delete("released-0", &DeleteParams::default())
        .await
        .expect("failed to delete");
    wait_for("4 free addresses on the Node", || {
        let nodes = nodes.clone();
        let name = name.clone();
        async move {
            let n = nodes.get(&name).await.ok()?;
            (n.metadata.annotations?.get(FREE_ADDRESSES)? == "4").then_some(())
        }
    })
    .await;
    a.stop().await;
    nodes
        .delete(&name, &DeleteParams::default())
        .await
        .expect("failed to delete the Node");
}
