//! Node faults on real nodes with the chart installed: containerd restarted alone, the kubelet
//! restarted alone, and the whole node rebooted (its daemons and containers killed, its network
//! namespace torn down, `/var/lib` kept): running pods keep their addresses and returning pods
//! get theirs. A node rebooted with two retained StatefulSet pods on it (scaled to 0 first), so
//! that no pod can be restored: the reserved addresses survive it. containerd sends no CNI GC on
//! its restart (no release calls it: its go-cni v1.1.12 has `GCNetworkList` only in a test mock,
//! and its tree never calls it; containerd/go-cni#131 is open), so this reboot proves nothing
//! about GC — a runtime that calls it (CRI-O) is issue 25's. The node's `/var/lib/cni/networks/cbr0`, then its whole
//! `/var/lib/cni/networks`, wiped while it runs (what reset tools and cleanup scripts do): the
//! reservations are back on disk from the IPReservations before a returning pod needs them; and
//! the running pods' addresses, reserved or not, are taken back from the runtime's result cache
//! before a new pod could get one. A node's agent away while a reservation there expires: back,
//! it holds the file one retention more and then removes it by itself.
//!
//! One cluster of two real nodes with the chart installed serves every test of this binary; each
//! test holds the nodes alone while it strikes them.
//! Needs root, `make cluster-bins`, `make node-bins` and `make image`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::cluster::realnode::RealNode;
use ipkeep_e2e::testkit::realnode::{self, RELEASE_NS};
use ipkeep_e2e::testkit::system::{RunningPod, phase, retain, statefulset};
use ipkeep_e2e::testkit::{kubectl_ok, wait_for};
use ipkeep_operator::api::Phase;

/// Each fault, row by row.
const FAULTS: [realnode::Fault; 3] = [
    ("containerd restarted", |n| n.restart_runtime().unwrap()),
    ("kubelet restarted", |n| n.restart_kubelet().unwrap()),
    ("node rebooted", |n| n.reboot().unwrap()),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_faults_keep_running_and_returning_pods_on_their_addresses() {
    let _alone = realnode::use_real_nodes_alone().await;
    let (sys, c) = realnode::system("rn-faults").await;
    let node = realnode::node(c, sys.node_name(0));
    realnode::faults_keep_pods_on_their_addresses(&sys, node, &FAULTS).await;
}

/// A strike of a node: what happens to it, and how.
type Strike = (&'static str, fn(&RealNode));

/// Node b suffers each strike in turn while its two retained pods are gone (scaled to 0, their
/// reservations Released): after each the reservations are back on its disk by themselves (the
/// time it took printed), and the pods, scaled back, get their addresses.
async fn retained_pods_survive(prefix: &str, strikes: &[Strike]) {
    let _alone = realnode::use_real_nodes_alone().await;
    let (sys, c) = realnode::system(prefix).await;
    let node_b = sys.node_name(1).to_owned();
    let node = realnode::node(c, &node_b);
    let pods = sys.run_retained("db", 2, &node_b).await;
    sys.kubectl(&["scale", "statefulset", "db", "--replicas=0"]);
    sys.wait_running("app=db", &[]).await;
    for name in ["db-0", "db-1"] {
        sys.wait_reservation(name, "Released", |r| phase(r) == Some(Phase::Released))
            .await;
        sys.wait_file(&realnode::reserved_file(node, &sys.ns, name), true)
            .await;
    }
    for (fault, strike) in strikes {
        eprintln!("{node_b}: {fault}");
        let struck = std::time::Instant::now();
        strike(node);
        realnode::dump(&sys, c, &realnode::network_dir(node));
        for name in ["db-0", "db-1"] {
            sys.wait_file(&realnode::reserved_file(node, &sys.ns, name), true)
                .await;
        }
        eprintln!(
            "{node_b}: reservations back on disk {:.2}s after: {fault}",
            struck.elapsed().as_secs_f64()
        );
    }
    sys.kubectl(&["scale", "statefulset", "db", "--replicas=2"]);
    let back = sys.wait_running("app=db", &["db-0", "db-1"]).await;
    for (name, p) in &back {
        assert_eq!(p.ips, pods[name].ips, "{name} after the node was struck");
        sys.wait_bound(p).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reboot_with_two_retained_pods_keeps_their_reservations() {
    retained_pods_survive(
        "rn-reboot",
        &[(
            "rebooted: every container killed, nothing left to restore",
            |n| n.reboot().unwrap(),
        )],
    )
    .await;
}

/// The agent's periodic resync is 10 minutes away and the wait's deadline 2: the files come back
/// because the agent watches its data directory. First the network's directory, then the whole
/// data directory (the agent's own mount: the agent exits and the kubelet restarts it on the
/// re-created directory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_network_directory_gets_its_reservations_back_before_a_returning_pod_needs_them() {
    retained_pods_survive(
        "rn-wipe",
        &[
            ("its /var/lib/cni/networks/cbr0 wiped while it runs", |n| {
                realnode::wipe(&realnode::network_dir(n)).unwrap()
            }),
            ("its whole /var/lib/cni/networks wiped while it runs", |n| {
                realnode::wipe(&n.host_path("/var/lib/cni/networks").unwrap()).unwrap()
            }),
        ],
    )
    .await;
}

/// A wiped network directory also forgets the addresses of pods without a reservation (ipkeep's
/// own controller among them). The plugin's first command in the wiped directory takes them back
/// from the runtime's result cache, so the pods started after the wipe get none of the running
/// pods' addresses. Before that, ipkeep handed them out again as host-local does: the torture
/// run's wiped directory found it (issue 47), a workload pod given the controller's address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_wiped_network_directory_new_pods_get_no_running_pods_address() {
    let _alone = realnode::use_real_nodes_alone().await;
    let (sys, c) = realnode::system("rn-wipe-running").await;
    let node_b = sys.node_name(1).to_owned();
    let node = realnode::node(c, &node_b);
    let names = |set: &str| (0..3).map(|i| format!("{set}-{i}")).collect::<Vec<_>>();
    let on_node = || async {
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::all(c.plane().client().unwrap());
        let list = pods
            .list(&kube::api::ListParams::default().fields(&format!("spec.nodeName={node_b}")))
            .await
            .unwrap();
        list.items
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.host_network) != Some(true))
            .filter_map(RunningPod::of)
            .collect::<Vec<_>>()
    };
    sys.apply(&statefulset("old", 3, true, &[&node_b], &[]));
    let old_names = names("old");
    let old_refs: Vec<&str> = old_names.iter().map(String::as_str).collect();
    sys.wait_running("app=old", &old_refs).await;
    let running = on_node().await;
    eprintln!(
        "{node_b} before the wipe: {:?}",
        running
            .iter()
            .map(|p| (&p.name, &p.ips))
            .collect::<Vec<_>>()
    );
    realnode::wipe(&realnode::network_dir(node)).unwrap();
    sys.apply(&statefulset("new", 3, true, &[&node_b], &[]));
    let new_names = names("new");
    let new_refs: Vec<&str> = new_names.iter().map(String::as_str).collect();
    sys.wait_running("app=new", &new_refs).await;
    let after = on_node().await;
    let mut holders: std::collections::BTreeMap<std::net::IpAddr, Vec<&str>> = Default::default();
    for p in &after {
        for ip in &p.ips {
            holders.entry(*ip).or_default().push(&p.name);
        }
    }
    let shared: Vec<_> = holders.iter().filter(|(_, who)| who.len() > 1).collect();
    assert!(
        shared.is_empty(),
        "addresses held by two running pods on {node_b} after the wipe: {shared:?}"
    );
    for p in &running {
        for ip in &p.ips {
            assert!(
                realnode::network_dir(node).join(ip.to_string()).is_file(),
                "{} ({ip}) has no allocation file after the wipe",
                p.name
            );
        }
    }
    sys.kubectl(&["delete", "statefulset", "old", "new", "--wait=false"]);
}

/// The agent of node b away (its DaemonSet kept off the node) while a retained pod there is
/// deleted and its reservation (`retain-for: 20s`) expires. Back, the agent finds the object
/// gone, no deletion it saw, and its file `Bound`: nothing tells that from a restore, so it keeps
/// the file (a Warning `ReservationLost` saying until when), for one retention from then, and
/// then removes it by itself. Before, it kept the file until someone ran `recover`: the stray
/// files of the torture run (issue 47), where a node's agent missed a whole `retain-for`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_that_expired_while_the_agent_was_away_goes_one_retention_later() {
    let _alone = realnode::use_real_nodes_alone().await;
    let (sys, c) = realnode::system("rn-away").await;
    let node_a = sys.node_name(0).to_owned();
    let node_b = sys.node_name(1).to_owned();
    let node = realnode::node(c, &node_b);
    sys.apply(&statefulset(
        "away",
        1,
        true,
        &[&node_b],
        &retain(Some("20s")),
    ));
    let pods = sys.wait_running("app=away", &["away-0"]).await;
    sys.wait_bound(&pods["away-0"]).await;
    let file = realnode::reserved_file(node, &sys.ns, "away-0");
    sys.wait_file(&file, true).await;
    let release_time = || {
        let text = std::fs::read_to_string(&file).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["releaseTime"].as_str().map(str::to_owned)
    };
    assert_eq!(release_time(), None, "the pod holds it: Bound");

    let agents_on = |hostname: serde_json::Value| {
        let patch = serde_json::json!({"spec": {"template": {"spec": {"nodeSelector": {
            "kubernetes.io/hostname": hostname}}}}});
        kubectl_ok(
            c.plane(),
            &[
                "-n",
                RELEASE_NS,
                "patch",
                "daemonset/ipkeep-agent",
                "--type",
                "merge",
                "-p",
                &patch.to_string(),
            ],
            None,
        );
    };
    let agents: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(c.plane().client().unwrap(), RELEASE_NS);
    agents_on(serde_json::Value::from(node_a.as_str()));
    wait_for(&format!("no agent pod on {node_b}"), || async {
        let lp = kube::api::ListParams::default()
            .labels("app.kubernetes.io/component=agent")
            .fields(&format!("spec.nodeName={node_b}"));
        agents.list(&lp).await.ok()?.items.is_empty().then_some(())
    })
    .await;

    sys.kubectl(&["delete", "statefulset", "away", "--wait=false"]);
    let reservations = sys.reservations();
    wait_for("away-0's reservation to expire", || async {
        reservations
            .get_opt("away-0")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    assert_eq!(
        release_time(),
        None,
        "no agent on {node_b} wrote the release"
    );

    agents_on(serde_json::Value::Null);
    realnode::agent_pod(c, &node_b).await;
    let until = wait_for(
        "the agent to hold away-0's file for its retention",
        || async { release_time() },
    )
    .await;
    eprintln!("{node_b}: away-0's file held until {until}");
    let notes = wait_for(
        "a ReservationLost Warning on the node about away-0",
        || async {
            let notes: Vec<String> = realnode::node_event_notes(c, &node_b, "ReservationLost")
                .await
                .into_iter()
                .filter(|n| n.contains(&format!("{}/away-0", sys.ns)))
                .collect();
            (!notes.is_empty()).then_some(notes)
        },
    )
    .await;
    assert!(notes[0].contains(&format!("until {until}")), "{notes:?}");
    sys.wait_file(&file, false).await;
}
