//! The second route on real flannel, for users who can edit flannel's configuration: the chart
//! installed without replacing `host-local` (`cni.replaceHostLocal=false`: it only puts `ipkeep`
//! into the CNI bin directory) and `"ipam": {"type": "ipkeep"}` at the top level of flannel's
//! conflist — what a user writes into kube-flannel's ConfigMap (its init container copies it to
//! `/etc/cni/net.d/10-flannel.conflist`) or k3s's `--flannel-cni-conf` file. flannel's CNI plugin
//! keeps that `type`, fills in the ranges and routes from the node's lease, and passes the rest on.
//!
//! What happens to pods created before the switch: flannel saved their delegate configuration
//! (`host-local`) at ADD time and replays it at DEL, so they are deleted through host-local; the
//! agent wrote their reservations all along, so the first re-creation after the switch, through
//! ipkeep, already gets the address back.
//!
//! Needs root, `make cluster-bins node-bins flannel-bins image`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::cluster::realnode::{PodNetwork, RealNode, layout};
use ipkeep_e2e::testkit::realnode;
use ipkeep_e2e::testkit::system::{retain, skipped_on_users_cluster, statefulset};

/// The chart as a user who edits flannel's conflist installs it.
const INSTALL: &[&str] = &["--set", "cni.replaceHostLocal=false"];

/// Two flannel nodes.
const NETWORK: PodNetwork = realnode::FLANNEL;

/// kube-flannel's conflist with ipkeep as the IPAM, as a user edits it.
fn conflist_with_ipkeep() -> serde_json::Value {
    let mut conflist = layout::kube_flannel_conflist();
    conflist["plugins"][0]["ipam"] = serde_json::json!({"type": "ipkeep"});
    conflist
}

/// Writes `conflist` where kube-flannel's init container writes it on `node`.
fn write_conflist(node: &RealNode, conflist: &serde_json::Value) {
    let path = node
        .host_path(&format!("/etc/cni/net.d/{}", layout::FLANNEL_CONFLIST_FILE))
        .unwrap();
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(conflist).unwrap()).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
}

/// The IPAM types of the delegate configurations flannel saved on `node`, one per sandbox.
fn saved_ipam_types(node: &RealNode) -> Vec<String> {
    realnode::flannel_delegates(node)
        .iter()
        .map(|c| c["ipam"]["type"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flannel_conflist_naming_ipkeep_keeps_addresses_and_pods_from_before_the_switch_get_theirs()
{
    if skipped_on_users_cluster(
        "flannel_conflist_naming_ipkeep_keeps_addresses_and_pods_from_before_the_switch_get_theirs",
        "this binary's own flannel nodes and their conflists",
    ) {
        return;
    }
    let shape = realnode::Shape {
        chart: Some(INSTALL),
        ..realnode::Shape::chart(2, NETWORK)
    };
    let _nodes = realnode::use_shape(shape, realnode::Access::Alone).await;
    let (sys, c) = realnode::system("fl-ipam").await;
    let node_a = sys.node_name(0).to_owned();
    let a = realnode::node(c, &node_a);
    for n in c.nodes() {
        let bin = |name: &str| n.host_path(&format!("/opt/cni/bin/{name}")).unwrap();
        assert!(bin("ipkeep").is_file(), "{}: no ipkeep binary", n.name());
        assert!(
            !bin("host-local.ipkeep-orig").exists(),
            "{}: host-local was replaced",
            n.name()
        );
    }

    // Before the switch the agents say ipkeep is not in charge: flannel's IPAM is host-local.
    for n in c.nodes() {
        realnode::wait_pod_condition(c, &n.name(), "False", "HostLocalNotReplaced").await;
    }

    // Before the switch: the nodes' host-local hands out the addresses.
    sys.apply(&statefulset(
        "old",
        1,
        true,
        &[&node_a],
        &retain(Some("1h")),
    ));
    sys.apply(&statefulset("plain", 1, true, &[&node_a], &[]));
    let old = sys.wait_running("app=old", &["old-0"]).await["old-0"].clone();
    let plain = sys.wait_running("app=plain", &["plain-0"]).await["plain-0"].clone();
    sys.wait_bound(&old).await;
    sys.wait_file(&realnode::reserved_file(a, &sys.ns, "old-0"), true)
        .await;
    let before = saved_ipam_types(a);
    assert!(
        !before.is_empty() && before.iter().all(|t| t == "host-local"),
        "before the switch every pod's IPAM is host-local: {before:?}"
    );

    // The switch, as kube-flannel's init container makes it from an edited ConfigMap.
    for n in c.nodes() {
        write_conflist(n, &conflist_with_ipkeep());
    }
    for n in c.nodes() {
        realnode::wait_pod_condition(c, &n.name(), "True", "InCharge").await;
    }
    sys.check("flannel's conflist names ipkeep on every node, and the agents see it");

    // A pod from before goes through host-local, whose DEL flannel replays: its address is free.
    sys.kubectl(&["delete", "pod", "plain-0", "--wait=false"]);
    let plain_file = realnode::network_dir(a).join(plain.ips[0].to_string());
    let back_plain = sys.wait_recreated("plain-0", &plain.uid).await;
    // host-local's round robin goes on after the last address handed out (ipkeep keeps its
    // file), so the new pod has another address and the old one's file must go.
    assert_ne!(back_plain.ips, plain.ips, "{back_plain:?}");
    sys.wait_file(&plain_file, false).await;

    // The annotated one from before comes back through ipkeep with its address.
    sys.kubectl(&["delete", "pod", "old-0", "--wait=false"]);
    let back = sys.wait_recreated("old-0", &old.uid).await;
    assert_eq!(back.ips, old.ips, "old-0 lost its address at the switch");
    sys.wait_bound(&back).await;
    let after = saved_ipam_types(a);
    assert!(
        after.iter().any(|t| t == "ipkeep"),
        "no pod's IPAM is ipkeep after the switch: {after:?}"
    );
    sys.check("a pod from before the switch re-created through ipkeep with its address");

    // After the switch, the README's promises on this route: graceful and forced deletion keep
    // the address, reachable from the other node through flannel.
    drop(sys);
    let (_sys, returned) =
        realnode::deleted_graceful_or_forced_returns_reachable("fl-ipam-del").await;
    assert_eq!(returned.len(), 2);
}
