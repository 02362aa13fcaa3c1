//! Scenario 7's API faults on real nodes with the chart installed: kube-apiserver and then etcd
//! killed (SIGKILL, as a crash) and started again by the harness while a StatefulSet pod is
//! deleted (and re-created by the real StatefulSet controller) and another is added. The chart's
//! controller and agents (in pods, on the `kubernetes` Service), the kubelets and the
//! controller-manager all lose the API meanwhile — and it still ends right: the pods keep their
//! addresses, every reservation is Bound with its file on the node, and no reservation was ever
//! deleted. (The faults one component meets at a time — 500s, 409s, `410 Expired`, dropped
//! watches — are injected by the fault proxy in `controller_real.rs` and `agent_real.rs`.)
//!
//! Needs root, `make cluster-bins`, `make node-bins` and `make image`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::testkit::realnode;
use std::time::Duration;

/// The CNI network the nodes' conflist names.
const NETWORK: &str = "cbr0";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_and_etcd_restarts_while_pods_come_and_go_still_end_right() {
    // The API goes away for every test of this binary: none runs meanwhile.
    let _alone = realnode::use_real_nodes_alone().await;
    let (sys, c) = realnode::system("rn-apifaults").await;
    let node_a = sys.node_name(0).to_owned();
    let history = sys.record_reservations();
    let before = sys.run_retained("web", 3, &node_a).await;

    // The faults, while web-1 is deleted (the StatefulSet controller re-creates it) and web-3
    // is added.
    sys.kubectl(&["delete", "pod", "web-1", "--wait=false"]);
    sys.kubectl(&["scale", "statefulset", "web", "--replicas=4"]);
    for component in ["kube-apiserver", "etcd"] {
        eprintln!("{component}: killed, down for 1 s, started again");
        c.plane()
            .restart_component(component, Duration::from_secs(1))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "failed to restart {component}: {}",
                    ipkeep_e2e::error_chain(&e)
                )
            });
    }

    let web_1 = sys.wait_recreated("web-1", &before["web-1"].uid).await;
    let after = sys
        .wait_running("app=web", &["web-0", "web-1", "web-2", "web-3"])
        .await;
    assert_eq!(after["web-1"].uid, web_1.uid, "web-1 was re-created once");
    for n in ["web-0", "web-1", "web-2"] {
        assert_eq!(after[n].ips, before[n].ips, "{n} lost its addresses");
    }
    let node = realnode::node(c, &node_a);
    for p in after.values() {
        sys.wait_bound(p).await;
        let file = node
            .host_path(&format!(
                "/var/lib/cni/networks/{NETWORK}/reserved/{}/{}",
                sys.ns, p.name
            ))
            .expect("/var/lib/cni is private to the node");
        sys.wait_file(&file, true).await;
    }
    assert!(!history.any_deleted(), "a reservation was deleted");
    c.plane()
        .check()
        .expect("every control plane component runs again");
}
