//! The scenarios on real flannel (dual-stack: flannel's IPv4 and IPv6 vxlan), installed the README's way (`cni.replaceHostLocal=true`): three
//! real nodes (the third a tiny one: a /29 lease, tainted) each running `flanneld --kube-subnet-mgr` with the vxlan backend and flannel's CNI
//! plugin under kube-flannel's own conflist (`cbr0`, no `ipam` of its own), so flannel's plugin
//! writes the IPAM configuration — `host-local`, which the chart replaced by ipkeep — from the
//! node's lease, and saves it for DEL.
//!
//! - Scenarios 1 and 2 of `scenarios/` (an annotated StatefulSet pod keeps its address, an
//!   unannotated pod never gets a reservation).
//! - `kubectl delete pod` graceful and forced: the pod returns with its address, which a pod on
//!   the other node reaches through flannel's vxlan device (the node routes nothing else there);
//!   flannel's saved delegate configuration names `host-local` over the node's lease, and the
//!   reservation file lies in the network flannel named (`cbr0`).
//!
//! The other route, `"ipam": {"type": "ipkeep"}` in flannel's conflist with no replaced binary,
//! is `realnode/flannel_ipam.rs`. Needs root, `make cluster-bins node-bins flannel-bins image`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::cluster::realnode::{PodNetwork, flannel, layout};
use ipkeep_e2e::scenarios::keep_ip;
use ipkeep_e2e::testkit::realnode;
use ipkeep_e2e::testkit::system::{scenario_tests, skipped_on_users_cluster};

/// This binary's nodes: two for the scenarios, a tiny one (a /29 lease) for filling a range.
const NODES: u8 = 3;
/// Their pods' network: flannel.
const NETWORK: PodNetwork = PodNetwork {
    dual_stack: true,
    tiny_nodes: 1,
    ..realnode::FLANNEL
};

scenario_tests!(realnode::use_nodes(NODES, NETWORK); keep_ip:
    statefulset_pod_deleted_and_recreated_keeps_its_ipv4_and_ipv6_addresses,
    unannotated_pod_gets_no_reservation_and_its_address_returns_to_the_pool,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_flannel_a_deleted_pod_returns_with_its_address_reachable_through_vxlan() {
    if skipped_on_users_cluster(
        "on_flannel_a_deleted_pod_returns_with_its_address_reachable_through_vxlan",
        "this binary's own flannel nodes",
    ) {
        return;
    }
    let _nodes = realnode::use_nodes(NODES, NETWORK).await;
    let c = realnode::installed();
    for n in c.nodes() {
        // The agent reads flannel's conflist as flannel does: no ipam of its own, so host-local,
        // which is ipkeep here.
        realnode::wait_pod_condition(c, &n.name(), "True", "InCharge").await;
        let conflist = realnode::read_node_file(
            n,
            &format!("/etc/cni/net.d/{}", layout::FLANNEL_CONFLIST_FILE),
        );
        let conflist: serde_json::Value = serde_json::from_str(&conflist).unwrap();
        assert_eq!(
            conflist,
            layout::kube_flannel_conflist(),
            "{}'s conflist",
            n.name()
        );
        assert!(
            n.host_path("/opt/cni/bin/host-local.ipkeep-orig")
                .unwrap()
                .is_file(),
            "{}: the chart did not replace host-local",
            n.name()
        );
    }
    let (sys, returned) = realnode::deleted_graceful_or_forced_returns_reachable("fl-delete").await;
    let client_node = realnode::node(c, sys.node_name(1));
    for pod in returned.values() {
        let node = realnode::node(c, &pod.node);
        let ip = pod.ips[0].to_string();
        // The other node reaches it through flannel's device: it has no route of ours to it.
        let route = client_node.exec(&["ip", "route", "get", &ip]).unwrap();
        assert!(
            route.contains(&format!("dev {}", flannel::VXLAN_DEVICE)),
            "{} routes {ip} elsewhere: {route}",
            client_node.name()
        );
        // flannel wrote the IPAM: host-local over the node's lease, in network cbr0.
        let lease = realnode::read_node_file(node, flannel::SUBNET_FILE);
        let subnet = flannel::leased_subnet(&lease).expect("a lease");
        let saved = realnode::flannel_delegates(node);
        assert!(
            !saved.is_empty(),
            "{}: flannel saved no delegate configuration",
            node.name()
        );
        for conf in &saved {
            assert_eq!(conf["name"], "cbr0", "{conf}");
            assert_eq!(conf["type"], "bridge", "{conf}");
            assert_eq!(conf["ipam"]["type"], "host-local", "{conf}");
            let ranges: Vec<&str> = conf["ipam"]["ranges"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|set| set[0]["subnet"].as_str())
                .collect();
            assert_eq!(ranges, node.pod_cidrs(), "lease {subnet}: {conf}");
        }
        assert!(
            realnode::network_dir(node).join(&ip).is_file(),
            "no allocation file for {ip} in {}",
            realnode::network_dir(node).display()
        );
        sys.wait_file(&realnode::reserved_file(node, &sys.ns, &pod.name), true)
            .await;
        // Dual-stack: the kept IPv6 address too, through flannel's IPv6 vxlan device.
        let ip6 = pod.ips[1].to_string();
        let route6 = client_node
            .exec(&["ip", "-6", "route", "get", &ip6])
            .unwrap();
        assert!(
            route6.contains(&format!("dev {}", flannel::VXLAN_DEVICE_V6)),
            "{} routes {ip6} elsewhere: {route6}",
            client_node.name()
        );
        let url = format!("http://[{ip6}]:8080/");
        let page = realnode::exec_until_it_works(&sys, "client", &["wget", "-qO-", &url]).await;
        assert_eq!(page.trim(), realnode::PAGE, "{} at {ip6}", pod.name);
    }
}
