//! Scenario 7 on the real control plane: faults while pods come and go — an agent killed
//! (SIGKILL) and restarted by its node, the controller leader killed with a standby running, a
//! simulated node restarted (every sandbox torn down, then set up again) — and every scenario
//! still ends right: pods keep their addresses, every reservation has its file, and no
//! reservation is deleted while its pod lives (a watch records every change from the start).
//!
//! On the kubelet stand-in because the test kills the agent and controller *processes* it
//! started and restarts a node in a second; on real nodes the same faults are the agent and
//! leader pods deleted and containerd, kubelet or the node restarted
//! (`realnode_scenario_operator.rs`, `realnode_scenario_node_faults.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "fixtures/shared.rs"]
mod shared;

#[path = "system/mod.rs"]
mod system;

use system::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_while_pods_change_is_restarted_and_converges() {
    if skipped_on_real_cluster(
        "agent_killed_while_pods_change_is_restarted_and_converges",
        "agent processes, controller processes and node restarts",
    ) {
        return;
    }
    let sys = System::start("agentkill", Options::default()).await;
    let node = &sys.nodes[0];
    let node_a = node.name().to_owned();
    let history = sys.record_reservations();
    let before = sys.run_retained("web", 3, &node_a).await;
    for p in before.values() {
        sys.wait_file(&node.reserved_file(&sys.ns, &p.name), true)
            .await;
    }
    let pids = wait_for("the agent of node a running", || async {
        let p = node.agent_pids();
        (!p.is_empty()).then_some(p)
    })
    .await;
    for pid in &pids {
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(*pid as i32).unwrap(),
            rustix::process::Signal::KILL,
        )
        .unwrap();
    }
    // While it is down: two more pods, and web-0 deleted and re-created.
    sys.kubectl(&["scale", "statefulset", "web", "--replicas=5"]);
    sys.kubectl(&["delete", "pod", "web-0", "--wait=false"]);
    let names = ["web-0", "web-1", "web-2", "web-3", "web-4"];
    let after = sys.wait_running("app=web", &names).await;
    let web0 = sys.wait_recreated("web-0", &before["web-0"].uid).await;
    assert_eq!(web0.ips, before["web-0"].ips, "web-0 lost its address");
    for n in names {
        sys.wait_bound(&after[n]).await;
        sys.wait_file(&node.reserved_file(&sys.ns, n), true).await;
    }
    let restarted = node.agent_pids();
    assert!(
        !restarted.is_empty() && restarted.iter().all(|p| !pids.contains(p)),
        "the agent was not restarted: {pids:?} → {restarted:?}"
    );
    assert!(!history.any_deleted(), "a reservation was deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_leader_killed_the_standby_takes_over() {
    if skipped_on_real_cluster(
        "controller_leader_killed_the_standby_takes_over",
        "agent processes, controller processes and node restarts",
    ) {
        return;
    }
    let mut sys = System::start(
        "leaderkill",
        Options {
            controllers: 2,
            ..Options::default()
        },
    )
    .await;
    let node_a = sys.node_name(0).to_owned();
    let history = sys.record_reservations();
    let before = sys.run_retained("web", 3, &node_a).await;
    let leader = wait_for("a controller holding the Lease", || sys.leader()).await;
    let i = sys
        .controllers
        .iter()
        .position(|c| c.identity == leader)
        .unwrap_or_else(|| panic!("the Lease names {leader}, not one of ours"));
    sys.controllers[i].kill();
    // Without a leader: web-1 deleted and re-created, one more pod.
    sys.kubectl(&["delete", "pod", "web-1", "--wait=false"]);
    sys.kubectl(&["scale", "statefulset", "web", "--replicas=4"]);
    let web1 = sys.wait_recreated("web-1", &before["web-1"].uid).await;
    assert_eq!(web1.ips, before["web-1"].ips, "web-1 lost its address");
    sys.wait_bound(&web1).await;
    let web3 = sys
        .wait_running("app=web", &["web-0", "web-1", "web-2", "web-3"])
        .await["web-3"]
        .clone();
    sys.wait_bound(&web3).await;
    let new_leader = sys.leader().await.unwrap_or_default();
    assert_ne!(
        new_leader, leader,
        "the killed replica still holds the Lease"
    );
    assert!(sys.controllers.iter().any(|c| c.identity == new_leader));
    assert!(!history.any_deleted(), "a reservation was deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_node_restarted_sets_its_pods_up_again_with_their_addresses() {
    if skipped_on_real_cluster(
        "simulated_node_restarted_sets_its_pods_up_again_with_their_addresses",
        "agent processes, controller processes and node restarts",
    ) {
        return;
    }
    let mut sys = System::start("noderestart", Options::default()).await;
    let node_a = sys.node_name(0).to_owned();
    let history = sys.record_reservations();
    let before = sys.run_retained("web", 3, &node_a).await;
    let net = sys.nodes[0].config.network_dir();
    sys.nodes[0].stop();
    for p in before.values() {
        assert!(
            !net.join(p.ips[0].to_string()).exists(),
            "{}'s allocation survived the node's shutdown",
            p.name
        );
    }
    sys.nodes[0].start();
    for p in before.values() {
        sys.wait_file(&net.join(p.ips[0].to_string()), true).await;
    }
    let after = sys
        .wait_running("app=web", &["web-0", "web-1", "web-2"])
        .await;
    assert_eq!(after, before, "a pod changed across the node's restart");
    // And the node works as before: web-2 deleted comes back with its address.
    sys.kubectl(&["delete", "pod", "web-2", "--wait=false"]);
    let web2 = sys.wait_recreated("web-2", &before["web-2"].uid).await;
    assert_eq!(web2.ips, before["web-2"].ips);
    sys.wait_bound(&web2).await;
    assert!(!history.any_deleted(), "a reservation was deleted");
}
