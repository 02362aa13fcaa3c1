//! The scenarios on real nodes with real pods: kubelet, containerd and runc run busybox pods, and
//! containerd calls ipkeep (installed by the chart's init container in place of host-local) with
//! the CNI_ARGS and in the DEL/ADD order a real runtime uses.
//!
//! - Scenarios 1 to 6 and 8 of `scenarios/` (keep IP with IPv4 and IPv6, unannotated pod, a
//!   Released address never handed out on a full /29, expiry with the node's file gone, scale to 0
//!   and back, drain to the other node, rolling restarts), the reservation files checked on the
//!   nodes' disks.
//! - `kubectl delete pod` with the default grace period and with `--force --grace-period=0`: the
//!   returning pod gets its address whatever order the kubelet and containerd run DEL and ADD in;
//!   from inside the container, `eth0` holds the kept address, and a pod on the other node reaches
//!   it (`wget` to busybox `httpd`).
//!
//! One cluster with the chart installed serves every test of this binary (`testkit::realnode`):
//! three dual-stack real nodes, the third a tiny one (a /29, tainted so that only the tests that
//! fill its range, one at a time, put pods there). Needs root, `make cluster-bins`,
//! `make node-bins` and `make image`. With `IPKEEP_E2E_KUBECONFIG` the scenarios run on that
//! cluster instead (see `docs/testing.md`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::cluster::realnode::{NodeCni, NodeDirs, PodNetwork};
use ipkeep_e2e::scenarios::keep_ip;
use ipkeep_e2e::scenarios::moved;
use ipkeep_e2e::scenarios::retention;
use ipkeep_e2e::testkit::realnode::assert_on_eth0;
use ipkeep_e2e::testkit::system::{scenario_tests, skipped_on_users_cluster};
use ipkeep_e2e::testkit::{realnode, wait_for};

/// This binary's nodes: two for the scenarios, the tiny one for filling a range; all dual-stack.
const NODES: u8 = 3;
/// Their pods' network.
const NETWORK: PodNetwork = PodNetwork {
    dual_stack: true,
    tiny_nodes: 1,
    cni: NodeCni::Bridge,
    dirs: NodeDirs::Standard,
    crio_nodes: 0,
    k3s_nodes: 0,
};

scenario_tests!(realnode::use_nodes(NODES, NETWORK); keep_ip:
    statefulset_pod_deleted_and_recreated_keeps_its_ipv4_and_ipv6_addresses,
    unannotated_pod_gets_no_reservation_and_its_address_returns_to_the_pool,
);
scenario_tests!(realnode::use_nodes_alone(NODES, NETWORK); moved:
    pod_drained_to_another_node_gets_its_address_and_the_reservation_follows,
);
scenario_tests!(realnode::use_nodes(NODES, NETWORK); moved:
    rolling_restart_ten_times_keeps_every_address_every_time,
);
scenario_tests!(realnode::use_nodes(NODES, NETWORK); retention:
    released_address_is_never_handed_to_another_pod_even_when_the_range_is_full,
    retain_for_3s_expires_at_its_release_time_and_the_address_is_allocated_again,
    scaled_to_zero_and_back_every_ordinal_gets_its_address_back,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_with_the_default_grace_or_forced_the_pod_returns_with_its_address_on_eth0_reachable_from_the_other_node()
 {
    if skipped_on_users_cluster(
        "deleted_with_the_default_grace_or_forced_the_pod_returns_with_its_address_on_eth0_reachable_from_the_other_node",
        "the workload image",
    ) {
        return;
    }
    let _nodes = realnode::use_nodes(NODES, NETWORK).await;
    realnode::deleted_graceful_or_forced_returns_reachable("rn-delete").await;
}

/// The pids of the agent processes (`ipkeep-operator agent`) running in `node`'s cgroup.
fn agent_pids(node: &ipkeep_e2e::cluster::realnode::RealNode) -> Vec<i32> {
    let cgroup = format!("/{}/", node.layout().cgroup());
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let in_node = std::fs::read_to_string(entry.path().join("cgroup"))
            .is_ok_and(|c| c.lines().any(|l| l.contains(&cgroup)));
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let mut args = cmdline.split(|b| *b == 0);
        let is_agent = args.next().is_some_and(|a| a.ends_with(b"ipkeep-operator"))
            && args.next() == Some(b"agent".as_slice());
        if in_node && is_agent {
            pids.push(pid);
        }
    }
    pids
}

/// How many times the kubelet restarted the containers of the agent pod on `node_name`.
async fn agent_restarts(c: &ipkeep_e2e::cluster::realnode::Cluster, node_name: &str) -> i32 {
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(c.plane().client().unwrap(), realnode::RELEASE_NS);
    let on_node = format!("spec.nodeName={node_name}");
    let list = pods
        .list(
            &kube::api::ListParams::default()
                .labels("app.kubernetes.io/component=agent")
                .fields(&on_node),
        )
        .await
        .expect("list the agent pods");
    list.items
        .iter()
        .filter_map(|p| p.status.as_ref()?.container_statuses.as_ref())
        .flatten()
        .map(|s| s.restart_count)
        .sum()
}

/// Scenario 7's agent fault: the agent's process on a node SIGKILLed (its pod stays; the kubelet
/// restarts its container — `realnode/operator.rs` deletes the pod instead), and while
/// it is down the StatefulSet scales from 3 to 5 and `web-0` is deleted and re-created: `web-0`
/// keeps its addresses, all five reservations end Bound with their files on the node's disk,
/// and none is deleted on the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_while_pods_change_is_restarted_by_the_kubelet_and_converges() {
    if skipped_on_users_cluster(
        "agent_killed_while_pods_change_is_restarted_by_the_kubelet_and_converges",
        "its nodes' processes and disks",
    ) {
        return;
    }
    // The node's agent goes down: no other test meanwhile.
    let _alone = realnode::use_nodes_alone(NODES, NETWORK).await;
    let (sys, c) = realnode::system("rn-agentkill").await;
    let node_a = sys.node_name(0).to_owned();
    let node = realnode::node(c, &node_a);
    let history = sys.record_reservations();
    let before = sys.run_retained("web", 3, &node_a).await;
    for p in before.values() {
        sys.wait_file(&realnode::reserved_file(node, &sys.ns, &p.name), true)
            .await;
    }
    let restarts = agent_restarts(c, &node_a).await;
    let pids = wait_for(&format!("the agent of {node_a} running"), || async {
        let p = agent_pids(node);
        (!p.is_empty()).then_some(p)
    })
    .await;
    for pid in &pids {
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(*pid).unwrap(),
            rustix::process::Signal::KILL,
        )
        .unwrap();
    }
    // While it is down: two more pods, and web-0 deleted and re-created.
    sys.kubectl(&["scale", "statefulset", "web", "--replicas=5"]);
    sys.kubectl(&["delete", "pod", "web-0", "--wait=false"]);
    let names = ["web-0", "web-1", "web-2", "web-3", "web-4"];
    let web0 = sys.wait_recreated("web-0", &before["web-0"].uid).await;
    assert_eq!(web0.ips, before["web-0"].ips, "web-0 lost its address");
    let after = sys.wait_running("app=web", &names).await;
    for n in names {
        sys.wait_bound(&after[n]).await;
        sys.wait_file(&realnode::reserved_file(node, &sys.ns, n), true)
            .await;
    }
    wait_for(
        &format!("the kubelet restarting the agent's container on {node_a}"),
        || async { (agent_restarts(c, &node_a).await > restarts).then_some(()) },
    )
    .await;
    let now = agent_pids(node);
    assert!(
        !now.is_empty() && now.iter().all(|p| !pids.contains(p)),
        "the agent was not restarted: {pids:?} → {now:?}"
    );
    assert_on_eth0(&sys, &web0).await;
    assert!(!history.any_deleted(), "a reservation was deleted");
}
