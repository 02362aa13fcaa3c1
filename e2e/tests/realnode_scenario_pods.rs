//! The scenarios on real nodes with real pods: kubelet, containerd and runc run busybox pods, and
//! containerd calls ipkeep (installed by the chart's init container in place of host-local) with
//! the CNI_ARGS and in the DEL/ADD order a real runtime uses.
//!
//! - Scenarios 1, 2, 5, 6 and 8 of `scenarios/` unchanged (keep IP, unannotated pod, scale to 0
//!   and back, drain to the other node, rolling restarts); their simulator-only checks are
//!   skipped, each with one line.
//! - `kubectl delete pod` with the default grace period and with `--force --grace-period=0`: the
//!   returning pod gets its address whatever order the kubelet and containerd run DEL and ADD in;
//!   from inside the container, `eth0` holds the kept address, and a pod on the other node reaches
//!   it (`wget` to busybox `httpd`).
//!
//! One cluster of two real nodes with the chart installed serves every test of this binary
//! (`realnode_support`). Needs root, `make cluster-bins`, `make node-bins` and `make image`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "fixtures/shared.rs"]
mod shared;

#[path = "system/mod.rs"]
mod system;

#[path = "realnode_support/mod.rs"]
mod realnode;

#[path = "scenarios/keep_ip.rs"]
mod keep_ip;

#[path = "scenarios/moved.rs"]
mod moved;

#[path = "scenarios/retention.rs"]
mod retention;

use realnode::{PAGE, assert_on_eth0, fetch};
use system::*;

scenario_tests!(realnode::use_real_nodes(); keep_ip:
    statefulset_pod_deleted_and_recreated_keeps_its_ipv4_and_ipv6_addresses,
    unannotated_pod_gets_no_reservation_and_its_address_returns_to_the_pool,
);
scenario_tests!(realnode::use_real_nodes_alone(); moved:
    pod_drained_to_another_node_gets_its_address_and_the_reservation_follows,
);
scenario_tests!(realnode::use_real_nodes(); moved:
    rolling_restart_ten_times_keeps_every_address_every_time,
);
scenario_tests!(realnode::use_real_nodes(); retention:
    scaled_to_zero_and_back_every_ordinal_gets_its_address_back,
);

/// A pod on `node` that only waits, to fetch pages from the others.
fn client_pod(node: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: client
spec:
  nodeSelector: {{kubernetes.io/hostname: {node}}}
  terminationGracePeriodSeconds: 1
  containers:
  - name: client
    image: {WORKLOAD_IMAGE}
    imagePullPolicy: Never
    command: [sleep, "3600"]
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_with_the_default_grace_or_forced_the_pod_returns_with_its_address_on_eth0_reachable_from_the_other_node()
 {
    let _nodes = realnode::use_real_nodes().await;
    let (sys, _) = realnode::system("rn-delete").await;
    let (node_a, node_b) = (sys.node_name(0).to_owned(), sys.node_name(1).to_owned());
    let history = sys.record_reservations();
    sys.apply(&client_pod(&node_b));
    let before = sys.run_retained("web", 2, &node_a).await;
    sys.wait_running("", &["client", "web-0", "web-1"]).await;
    for p in before.values() {
        assert_on_eth0(&sys, p).await;
        assert_eq!(fetch(&sys, "client", p).await.trim(), PAGE);
    }
    // Each way a user deletes a pod, row by row: the pod, then kubectl's arguments.
    let deletions: [(&str, &[&str]); 2] = [
        ("web-0", &["delete", "pod", "web-0"]),
        (
            "web-1",
            &["delete", "pod", "web-1", "--force", "--grace-period=0"],
        ),
    ];
    for (pod, args) in deletions {
        sys.kubectl(args);
        let back = sys.wait_recreated(pod, &before[pod].uid).await;
        assert_eq!(
            back.ips, before[pod].ips,
            "{pod} came back with another address after kubectl {args:?}"
        );
        sys.wait_bound(&back).await;
        assert_on_eth0(&sys, &back).await;
        assert_eq!(
            fetch(&sys, "client", &back).await.trim(),
            PAGE,
            "{pod} is not reachable at its kept address from {node_b}"
        );
    }
    assert!(!history.any_deleted(), "a reservation was deleted");
}
