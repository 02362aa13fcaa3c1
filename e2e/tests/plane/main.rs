//! The suites on the shared real control plane (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler from their Go modules; no kubelet): one test binary, one control plane, each
//! suite a module. The tests share the plane, each in namespaces of its own; the few that change
//! what every other test sees (the CRD, a `helm install` of the chart) hold it alone
//! (`testkit::plane::use_plane_alone`), the others hold it shared (`use_plane`).
//!
//! Needs `make cluster-bins` (or `IPKEEP_CLUSTER_BIN_DIR`) and fails loudly without it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod agent_real;
mod agent_support;
mod chart_install;
mod chart_node_policy;
mod chart_rbac;
mod cluster_access;
mod cluster_smoke;
mod controller_crd;
mod controller_limits;
mod controller_real;
mod controller_scenarios;
mod kubectl;
