//! The built `ipkeep-operator agent` binary as a DaemonSet runs it: killed with SIGKILL while the
//! reservations change (the files stay as they were meanwhile), restarted, and the files equal
//! the reservations again — including a leftover temporary of an interrupted write removed.
//! SIGTERM stops it gracefully (exit 0).
//!
//! The binary is `$IPKEEP_OPERATOR_BIN` when set, else built with cargo into this target dir.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "fixtures/shared.rs"]
mod shared;

#[path = "agent_support/mod.rs"]
mod support;

use support::*;

#[tokio::test]
async fn killed_agent_catches_up_on_the_test_server() {
    let server = start_server().await;
    let scratch = Scratch::new("kubeconfig");
    let kubeconfig = scratch.join("config");
    server
        .write_kubeconfig(&kubeconfig)
        .expect("failed to write the kubeconfig");
    scenarios::killed_agent_catches_up(server.client(), &kubeconfig).await;
}
