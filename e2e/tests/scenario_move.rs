//! Scenarios 6 and 8 on the real control plane with two simulated nodes, their agents and the
//! controller: a pod that returns on another node (its node cordoned and drained with `kubectl
//! drain`) gets that node's address, its reservation follows it with a Warning Event saying why,
//! and the old node's file goes; a rolling restart (`kubectl rollout restart`) of a 5-replica
//! StatefulSet, ten times, keeps every pod's address every time.
//!
//! The bodies are in `scenarios/`; `realnode_scenario_pods.rs` runs the same ones on real nodes.
//! They stay on the kubelet stand-in too for what only it gives: nodes of the test's own (a /29
//! range to fill, dual-stack CIDRs) and their data directories read directly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "fixtures/shared.rs"]
mod shared;

#[path = "system/mod.rs"]
mod system;

#[path = "scenarios/moved.rs"]
mod moved;

scenario_tests!(moved: pod_drained_to_another_node_gets_its_address_and_the_reservation_follows, rolling_restart_ten_times_keeps_every_address_every_time);
