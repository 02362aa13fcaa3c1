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
//! before a new pod could get one.
//!
//! One cluster of two real nodes with the chart installed serves every test of this binary; each
//! test holds the nodes alone while it strikes them.
//! Needs root, `make cluster-bins`, `make node-bins` and `make image`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::cluster::realnode::RealNode;
use ipkeep_e2e::testkit::realnode;
use ipkeep_e2e::testkit::system::{RunningPod, phase, statefulset};
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
                std::fs::remove_dir_all(realnode::network_dir(n)).unwrap()
            }),
            ("its whole /var/lib/cni/networks wiped while it runs", |n| {
                std::fs::remove_dir_all(n.host_path("/var/lib/cni/networks").unwrap()).unwrap()
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
    std::fs::remove_dir_all(realnode::network_dir(node)).unwrap();
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
