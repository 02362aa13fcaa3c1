//! Every decision the controller and the agent take, as plain functions over plain data: no
//! Kubernetes client and no Kubernetes types (no `kube`, no `k8s_openapi`;
//! `operator/tests/rules_without_kube.rs` holds that), no clock but the instant passed in, no I/O. Callers turn what the API gives them into
//! these modules' views at the boundary (`controller::view`, `controller::cache`, `agent::view`).
//!
//! Controller: [`lifecycle`] (what one reconcile does), [`optin`] (what a pod asks for),
//! [`budget`] (how many released reservations a node may hold), [`namespaces`] (which
//! namespaces keep addresses), [`placement`] (the webhook's record read back).
//! Agent: [`desired`] (which files should exist), [`schedule`] (when a pass runs, full or not),
//! [`incharge`] (whether ipkeep is the IPAM the node's runtime calls, network by network),
//! [`loss`] (a file whose reservation is gone: released or lost), [`capacity`] (how full the node's
//! ranges are).
//! `recover`: [`recovery`] (what becomes of each lost reservation).
//! Both install-cni and the agent: [`cni_dirs`] (which CNI directories the node's runtime uses).

pub mod budget;
pub mod capacity;
pub mod cni_dirs;
pub mod desired;
pub mod incharge;
pub mod lifecycle;
pub mod loss;
pub mod namespaces;
pub mod optin;
pub mod placement;
pub mod recovery;
pub mod schedule;
