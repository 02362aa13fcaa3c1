//! What the e2e tests, the benches and the demo's checks share, each said once: waiting with a
//! deadline ([`wait_for`]), a test's own directory ([`Scratch`]), running a command and failing
//! with what it printed ([`run_ok`], [`kubectl_ok`]), the repository's files and built binaries
//! ([`repo_root`], [`operator_binary`]), a controller replica ([`Replica`]) or one in this process
//! ([`controller`]), the shared control plane with the CRD ([`plane`]), the whole system on real
//! nodes with the chart installed ([`system`], [`realnode`]) and the benches' plane ([`bench`]), with
//! [`bench_agents`], many agents in this process for `make bench-scale`.
//!
//! Test support fails the test that called it, so it panics with what went wrong rather than
//! returning errors (hence the `allow`s below, which the rest of the crate does not have).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_debug_implementations
)]

pub mod bench;
pub mod bench_agents;
pub mod commands;
pub mod controller;
pub mod plane;
pub mod realnode;
pub mod replica;
pub mod repo;
pub mod rng;
pub mod scratch;
pub mod system;
pub mod wait;

pub use commands::{KubectlTarget, checked, kubectl, kubectl_json, kubectl_ok, ok, run, run_ok};
pub use plane::control_plane;
pub use replica::Replica;
pub use repo::{
    CONTROLLER_ENV, UNPULLED_IMAGE, chart_dir, cluster_bin_dir, crd_file, docker_binary,
    operator_binary, repo_crds, repo_root,
};
pub use scratch::Scratch;
pub use wait::{DEADLINE, wait_for, within};
