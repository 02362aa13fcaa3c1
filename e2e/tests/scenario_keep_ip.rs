//! Scenarios 1 and 2, on the real control plane with two simulated nodes, their agents and the
//! controller: an annotated StatefulSet pod deleted and re-created gets the same addresses (its
//! reservation goes Bound → Released → Bound and `kubectl get ipr` shows it); an unannotated pod
//! gets no reservation and its address returns to the pool.
//!
//! The bodies are in `scenarios/`; `realnode_scenario_pods.rs` runs the same ones on real nodes.
//! They stay on the kubelet stand-in too for what only it gives: nodes of the test's own (a /29
//! range to fill, dual-stack CIDRs) and their data directories read directly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "fixtures/shared.rs"]
mod shared;

#[path = "system/mod.rs"]
mod system;

#[path = "scenarios/keep_ip.rs"]
mod keep_ip;

scenario_tests!(keep_ip: statefulset_pod_deleted_and_recreated_keeps_its_ipv4_and_ipv6_addresses, unannotated_pod_gets_no_reservation_and_its_address_returns_to_the_pool);
