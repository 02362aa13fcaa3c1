//! The chart on nodes laid out as k3s lays itself out, with real flannel: containerd's CNI
//! `bin_dir` is `/var/lib/rancher/k3s/data/cni`, a directory of absolute symlinks into the
//! release's `data/<release>/bin`, its `conf_dir` `/var/lib/rancher/k3s/agent/etc/cni/net.d`
//! holding k3s's flannel conflist, containerd started with k3s's
//! `/var/lib/rancher/k3s/agent/etc/containerd/config.toml` naming both, and the chart installed
//! with no directory values (only `cni.replaceHostLocal=true`): install-cni and the agents find
//! k3s's directories in that file, read k3s's conflist there and say ipkeep is in charge.
//!
//! - install-cni replaces the `host-local` symlink by ipkeep and keeps the symlink itself as the
//!   original (never following it out of the directory);
//! - a deleted pod returns with its address, reachable from the other node;
//! - a k3s upgrade (a new release extracted, every name in `data/cni` re-linked into it, what
//!   held the name removed first): the agent puts ipkeep back as `host-local` at once, keeps the
//!   new symlink as the original, and says so on the Node; pods still keep their addresses;
//! - `helm uninstall` puts back the newest original: the symlink into the new release.
//!
//! What is not k3s here: no k3s process runs (its agent, its embedded flannel and containerd are
//! flanneld and our containerd), and the plugins are Debian's and flannel's, each linked by its
//! own name, where k3s links them all to one multi-call `cni` binary. Needs root,
//! `make cluster-bins node-bins flannel-bins image`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use ipkeep_e2e::cluster::realnode::{
    NodeDirs, PodNetwork, RealNode,
    layout::{self, K3S_FIRST_RELEASE, k3s_release_bin},
};
use ipkeep_e2e::testkit::realnode::{RELEASE, RELEASE_NS};
use ipkeep_e2e::testkit::system::skipped_on_users_cluster;
use ipkeep_e2e::testkit::{realnode, wait_for};

/// The chart as a k3s admin installs it: no directory to know.
const INSTALL: &[&str] = &["--set", "cni.replaceHostLocal=true"];

/// Two flannel nodes with k3s's directories.
const NETWORK: PodNetwork = realnode::K3S_FLANNEL;

/// The release a k3s upgrade extracts.
const NEXT_RELEASE: &str = "ipkeep-e2e-2";

/// `data/cni` of `node`, as the machine sees it.
fn cni_dir(node: &RealNode) -> PathBuf {
    node.host_path(NodeDirs::K3s.cni_bin_dir()).unwrap()
}

/// Where the symlink `link` points, if it is one.
fn link_target(link: &Path) -> Option<PathBuf> {
    std::fs::read_link(link).ok()
}

/// The absolute target k3s's link for `name` has in `release`.
fn release_target(release: &str, name: &str) -> PathBuf {
    PathBuf::from(format!("{}/{name}", k3s_release_bin(release)))
}

/// Waits until `data/cni/host-local` on `node` is ipkeep again (a regular file with the bytes of
/// `data/cni/ipkeep`); returns how long it was something else after `since`.
async fn wait_ipkeep_again(node: &RealNode, since: std::time::Instant) -> std::time::Duration {
    let dir = cni_dir(node);
    let ipkeep = std::fs::read(dir.join("ipkeep")).unwrap();
    wait_for(
        &format!("{}: data/cni/host-local to be ipkeep again", node.name()),
        || {
            let host_local = dir.join("host-local");
            let back = host_local.symlink_metadata().is_ok_and(|m| m.is_file())
                && std::fs::read(&host_local).is_ok_and(|b| b == ipkeep);
            async move { back.then(|| since.elapsed()) }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_k3s_directories_the_chart_replaces_the_host_local_link_survives_a_k3s_upgrade_and_uninstall_restores_the_newest()
 {
    if skipped_on_users_cluster(
        "on_k3s_directories_the_chart_replaces_the_host_local_link_survives_a_k3s_upgrade_and_uninstall_restores_the_newest",
        "this binary's own k3s-layout nodes",
    ) {
        return;
    }
    // It uninstalls the chart at the end: the cluster goes with the test.
    let shape = realnode::Shape {
        chart: Some(INSTALL),
        ..realnode::Shape::chart(2, NETWORK)
    };
    let _nodes = realnode::use_shape(shape, realnode::Access::Spoils).await;
    let c = realnode::installed();
    for n in c.nodes() {
        // The agent reads k3s's conflist where k3s writes it and sees ipkeep in charge.
        realnode::wait_pod_condition(c, &n.name(), "True", "InCharge").await;
        let dir = cni_dir(n);
        let conflist = realnode::read_node_file(
            n,
            &format!(
                "{}/{}",
                NodeDirs::K3s.cni_conf_dir(),
                layout::FLANNEL_CONFLIST_FILE
            ),
        );
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&conflist).unwrap(),
            layout::k3s_conflist()
        );
        assert_eq!(
            link_target(&dir.join("host-local.ipkeep-orig")),
            Some(release_target(K3S_FIRST_RELEASE, "host-local")),
            "{}: install-cni kept the symlink itself",
            n.name()
        );
        assert_eq!(
            std::fs::read(dir.join("host-local")).unwrap(),
            std::fs::read(dir.join("ipkeep")).unwrap(),
            "{}: host-local is ipkeep",
            n.name()
        );
        assert_eq!(
            link_target(&dir.join("bridge")),
            Some(release_target(K3S_FIRST_RELEASE, "bridge")),
            "{}: the other plugins stay k3s's links",
            n.name()
        );
    }
    let (sys, pods) = realnode::deleted_graceful_or_forced_returns_reachable("k3s-delete").await;
    sys.check("on k3s's directories, deleted pods return with their addresses");

    // A k3s upgrade on the node of web-0: every name in data/cni re-linked into the new release.
    let node_a = pods["web-0"].node.clone();
    let a = realnode::node(c, &node_a);
    let relinked = a.upgrade_k3s(NEXT_RELEASE).unwrap();
    let upgraded = std::time::Instant::now();
    assert!(relinked.iter().any(|n| n == "host-local"), "{relinked:?}");
    let window = wait_ipkeep_again(a, upgraded).await;
    eprintln!(
        "k3s upgrade: host-local was not ipkeep for at most {:.1} ms",
        window.as_secs_f64() * 1000.0
    );
    let dir = cni_dir(a);
    assert_eq!(
        link_target(&dir.join("host-local.ipkeep-orig")),
        Some(release_target(NEXT_RELEASE, "host-local")),
        "the newest original, the new release's link, is the one kept"
    );
    assert_eq!(
        link_target(&dir.join("bridge")),
        Some(release_target(NEXT_RELEASE, "bridge"))
    );
    wait_for(
        "a Warning HostLocalReplaced on the upgraded node",
        || async {
            let notes = realnode::node_event_notes(c, &node_a, "HostLocalReplaced").await;
            notes.iter().any(|n| n.contains("symlink")).then_some(())
        },
    )
    .await;
    sys.check("a k3s upgrade re-linked host-local: ipkeep again at once, the new link kept");
    let before = pods["web-0"].clone();
    sys.kubectl(&["delete", "pod", "web-0", "--wait=false"]);
    let back = sys.wait_recreated("web-0", &before.uid).await;
    assert_eq!(back.ips, before.ips, "web-0 after the k3s upgrade");
    sys.wait_bound(&back).await;

    // Uninstalled: each node's newest original comes back under the name.
    realnode::helm(
        c,
        &["uninstall", RELEASE, "--namespace", RELEASE_NS, "--wait"],
    );
    for n in c.nodes() {
        let release = if n.name() == node_a {
            NEXT_RELEASE
        } else {
            K3S_FIRST_RELEASE
        };
        let dir = cni_dir(n);
        wait_for(
            &format!("{}: host-local to be k3s's link again", n.name()),
            || {
                let back = link_target(&dir.join("host-local"))
                    == Some(release_target(release, "host-local"));
                async move { back.then_some(()) }
            },
        )
        .await;
        assert!(!dir.join("host-local.ipkeep-orig").exists(), "{}", n.name());
    }
}
