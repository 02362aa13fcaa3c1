//! One `helm install` without directory values on a cluster that mixes node layouts: real flannel
//! on two nodes, `node-0` laid out as a kubeadm node (containerd's `/etc/containerd/config.toml`
//! naming `/opt/cni/bin` and `/etc/cni/net.d`), `node-1` as k3s lays itself out (k3s's
//! `/var/lib/rancher/k3s/agent/etc/containerd/config.toml` naming `data/cni` and its
//! `agent/etc/cni/net.d`). Each node's install-cni and agent read that node's runtime
//! configuration through the chart's mount of `/`:
//!
//! - every agent says ipkeep is in charge; each node's `host-local` is ipkeep in its own bin
//!   directory, and the other layout's directories are not created on it;
//! - a retained pod on each node, deleted, returns with its address, reachable across nodes;
//! - a node whose runtime configuration cannot be read (k3s's file made unparsable) is
//!   `NotInCharge` (`CNIDirectoriesUnknown`), the Warning naming the node, the file and the values
//!   to set; the file restored, it is in charge again.
//!
//! Needs root, `make cluster-bins node-bins flannel-bins image`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::cluster::realnode::{NodeDirs, PodNetwork, RealNode, layout};
use ipkeep_e2e::testkit::system::skipped_on_users_cluster;
use ipkeep_e2e::testkit::{realnode, wait_for};

/// The chart with no directory values.
const INSTALL: &[&str] = &["--set", "cni.replaceHostLocal=true"];

/// Two flannel nodes: the first standard, the last k3s's layout.
const NETWORK: PodNetwork = PodNetwork {
    k3s_nodes: 1,
    ..realnode::FLANNEL
};

/// The bytes at `node_path` on `node`, if it is a regular file.
fn node_file(node: &RealNode, node_path: &str) -> Option<Vec<u8>> {
    let path = node.host_path(node_path).unwrap();
    path.symlink_metadata()
        .is_ok_and(|m| m.is_file())
        .then(|| std::fs::read(&path).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_install_without_directory_values_is_in_charge_on_k3s_and_standard_nodes_and_says_which_node_it_cannot_read()
 {
    if skipped_on_users_cluster(
        "one_install_without_directory_values_is_in_charge_on_k3s_and_standard_nodes_and_says_which_node_it_cannot_read",
        "this binary's own mixed-layout nodes",
    ) {
        return;
    }
    let shape = realnode::Shape {
        chart: Some(INSTALL),
        ..realnode::Shape::chart(2, NETWORK)
    };
    // It breaks a node's runtime configuration for a while (restored before it ends).
    let _nodes = realnode::use_shape(shape, realnode::Access::Alone).await;
    let c = realnode::installed();
    let layouts: Vec<(String, NodeDirs)> = c.nodes().iter().map(|n| (n.name(), n.dirs())).collect();
    assert_eq!(
        layouts.iter().map(|(_, d)| *d).collect::<Vec<_>>(),
        [NodeDirs::Standard, NodeDirs::K3s],
        "{layouts:?}"
    );
    for n in c.nodes() {
        realnode::wait_pod_condition(c, &n.name(), "True", "InCharge").await;
        let (bin, other_bin) = match n.dirs() {
            NodeDirs::Standard => (
                NodeDirs::Standard.cni_bin_dir(),
                NodeDirs::K3s.cni_bin_dir(),
            ),
            NodeDirs::K3s => (
                NodeDirs::K3s.cni_bin_dir(),
                NodeDirs::Standard.cni_bin_dir(),
            ),
        };
        let ipkeep = node_file(n, &format!("{bin}/ipkeep"))
            .unwrap_or_else(|| panic!("{}: no ipkeep in {bin}", n.name()));
        assert_eq!(
            node_file(n, &format!("{bin}/host-local")).as_ref(),
            Some(&ipkeep),
            "{}: host-local in {bin} is ipkeep",
            n.name()
        );
        assert_eq!(
            node_file(n, &format!("{other_bin}/ipkeep")),
            None,
            "{}: install-cni wrote into the other layout's {other_bin}",
            n.name()
        );
    }

    // A retained pod on each node returns with its address, reachable from the other node.
    let (sys, _) = realnode::system("mixed-delete").await;
    let names: Vec<String> = c.nodes().iter().map(|n| n.name()).collect();
    sys.apply(&layout::client_pod(&names[1]));
    sys.wait_running("", &["client"]).await;
    for (i, node) in names.iter().enumerate() {
        let set = format!("web{i}");
        let pod = format!("{set}-0");
        let before = sys.run_retained(&set, 1, node).await.remove(&pod).unwrap();
        assert_eq!(
            realnode::fetch(&sys, "client", &before).await.trim(),
            realnode::PAGE
        );
        sys.kubectl(&["delete", "pod", &pod]);
        let back = sys.wait_recreated(&pod, &before.uid).await;
        assert_eq!(back.ips, before.ips, "{pod} on {node} came back elsewhere");
        sys.wait_bound(&back).await;
        assert_eq!(
            realnode::fetch(&sys, "client", &back).await.trim(),
            realnode::PAGE,
            "{pod} on {node} is not reachable at its kept address"
        );
    }
    sys.check("on a mixed cluster, retained pods on both layouts return with their addresses");

    // The k3s node's configuration made unreadable: the agent says so, naming node and values.
    let k3s = c
        .nodes()
        .iter()
        .find(|n| n.dirs() == NodeDirs::K3s)
        .unwrap();
    let config = k3s
        .host_path(layout::containerd_config_path(NodeDirs::K3s))
        .unwrap();
    let kept = std::fs::read(&config).unwrap();
    std::fs::write(&config, "version = 3\n[plugins\n").unwrap();
    let pod = realnode::wait_pod_condition(c, &k3s.name(), "False", "CNIDirectoriesUnknown").await;
    let note = wait_for(
        &format!("a Warning NotInCharge on {} naming the file", k3s.name()),
        || async {
            realnode::node_event_notes(c, &k3s.name(), "NotInCharge")
                .await
                .into_iter()
                .find(|n| n.contains("config.toml"))
        },
    )
    .await;
    std::fs::write(&config, &kept).unwrap();
    eprintln!("{}'s Warning NotInCharge: {note}", k3s.name());
    let message = pod
        .status
        .and_then(|s| s.conditions)
        .and_then(|cs| cs.into_iter().find(|c| c.type_ == realnode::POD_CONDITION))
        .and_then(|c| c.message)
        .unwrap_or_default();
    for text in [&note, &message] {
        for part in [
            format!("node {}: ", k3s.name()),
            format!(
                "failed to read {}: not valid TOML",
                layout::containerd_config_path(NodeDirs::K3s)
            ),
            "set the chart values cni.binDir and cni.confDir".to_owned(),
        ] {
            assert!(text.contains(&part), "{part:?} not in {text:?}");
        }
    }
    realnode::wait_pod_condition(c, &k3s.name(), "True", "InCharge").await;
    let other = c
        .nodes()
        .iter()
        .find(|n| n.dirs() == NodeDirs::Standard)
        .unwrap();
    realnode::wait_pod_condition(c, &other.name(), "True", "InCharge").await;
}
