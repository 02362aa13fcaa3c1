//! The demo's failures, each naming the step.

use std::path::PathBuf;

use crate::cluster::{ClusterError, realnode::RealNodeError};

/// Failures of the demo; each names the step.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// Something the demo needs is missing.
    #[error("failed to find {what} at {path}: {hint}")]
    Missing {
        /// What is missing.
        what: &'static str,
        /// Where it was looked for.
        path: PathBuf,
        /// What to do.
        hint: &'static str,
    },
    /// Not root.
    #[error(
        "failed to start: the demo creates network namespaces and bridges, run it as root (make demo does not sudo for you)"
    )]
    NotRoot,
    /// The control plane failed.
    #[error("failed to run the control plane")]
    Cluster(#[from] ClusterError),
    /// The real nodes failed.
    #[error("failed to run the real nodes")]
    RealNodes(#[from] RealNodeError),
    /// A command could not be run, or failed.
    #[error(transparent)]
    Command(#[from] crate::command::CommandError),
    /// The story did not go as told.
    #[error("the story went wrong: {0}")]
    Story(String),
    /// A Kubernetes API call failed.
    #[error("failed to {what}")]
    Api {
        /// What was asked.
        what: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// A step of the story did not come true in time.
    #[error("a step of the story took too long")]
    Timeout(#[from] crate::wait::TimedOut),
    /// A local file operation failed.
    #[error("failed to {what}")]
    Io {
        /// What was done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A node failed.
    #[error("failed to run node {node}: {detail}")]
    Node {
        /// The node.
        node: String,
        /// Why.
        detail: String,
    },
    /// Interrupted by Ctrl-C or SIGTERM (everything was cleaned up).
    #[error("interrupted; everything was stopped and removed")]
    Interrupted,
}
