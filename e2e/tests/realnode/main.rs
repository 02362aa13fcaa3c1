//! The suites on real nodes (a control plane plus kubelets with containerd or CRI-O, each node
//! in namespaces of its own on this machine, `docs/real-nodes.md`) with ipkeep installed as the
//! README says: one test binary, each suite a module. Each test says which shape of cluster it
//! needs (`testkit::realnode::use_shape`: how many nodes, dual-stack, a tiny node, flannel, CRI-O,
//! the k3s layout, the chart or not) and the binary runs one cluster at a time: the tests of its
//! shape share it, and the next shape's first test waits until they are done, then the cluster
//! is stopped (everything it made removed) and the next one started. libtest runs the tests in
//! name order, so the shape changes about once per module; modules of one shape sit together
//! (`incharge`, `kube_api_faults`, `node_faults`, `node_keeps_lost_reservations`, `operator`: two
//! nodes with the chart) and share one cluster. A test that takes a node or the API away holds the nodes alone; `cluster` holds
//! the whole machine (no cluster of the binary runs while it starts and stops its own).
//!
//! Needs root, `make cluster-bins`, `make node-bins`, `make flannel-bins`, `make crio-bins`,
//! `make image` (or `IPKEEP_IMAGE_ARCHIVE`), for `upgrade` `make previous-release`, and for the
//! installs from a registry (`crio`, `upgrade`) `make registry-bin` and `make packaging-deps`
//! (skopeo and jq, which `scripts/publish.sh` runs); fails loudly, naming what to run, without
//! them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod budget;
mod chart;
mod check_ipam;
mod cluster;
mod crio;
mod flannel;
mod flannel_ipam;
mod flannel_k3s_layout;
mod incharge;
mod kube_api_faults;
mod mixed_layout;
mod monitoring;
mod node_faults;
mod node_keeps_lost_reservations;
mod node_trust;
mod operator;
mod placement;
mod pods;
mod quick_start;
mod torture;
mod upgrade;
