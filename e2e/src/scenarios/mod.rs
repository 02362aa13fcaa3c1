//! The end-to-end scenarios on a cluster with the chart installed, one `pub async fn` each, shared
//! by the real-node tests (`tests/realnode/`, on their own nodes or on a user's cluster with
//! `IPKEEP_E2E_KUBECONFIG`) and the demo ([`crate::demo`]), which narrates scenario 1.
//!
//! Like the testkit they run on, they fail by panicking with what went wrong.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod keep_ip;
pub mod moved;
pub mod retention;
