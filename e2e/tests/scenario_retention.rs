//! Scenarios 3, 4 and 5 on the real control plane with two simulated nodes, their agents and the
//! controller: a Released reservation's address is never handed to another pod (they stay Pending
//! with the plugin's error when the range is otherwise full); `retain-for: 3s` expires at its
//! release time (never before; how late is printed), the file leaves the node and the address is allocated again; a
//! StatefulSet scaled to 0 and back within the retention gets every ordinal's address back.
//!
//! The bodies are in `scenarios/`; `realnode_scenario_pods.rs` runs the same ones on real nodes.
//! They stay on the kubelet stand-in too for what only it gives: nodes of the test's own (a /29
//! range to fill, dual-stack CIDRs) and their data directories read directly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "fixtures/shared.rs"]
mod shared;

#[path = "system/mod.rs"]
mod system;

#[path = "scenarios/retention.rs"]
mod retention;

scenario_tests!(retention: released_address_is_never_handed_to_another_pod_even_when_the_range_is_full, retain_for_3s_expires_at_its_release_time_and_the_address_is_allocated_again, scaled_to_zero_and_back_every_ordinal_gets_its_address_back);
