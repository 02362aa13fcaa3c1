//! The demo's failures, each naming the step.

use std::path::PathBuf;

use crate::cluster::{ControlPlaneError, realnode::RealNodeError};

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
    ControlPlane(#[from] ControlPlaneError),
    /// The real nodes failed.
    #[error("failed to run the real nodes")]
    RealNodes(#[from] RealNodeError),
    /// A command could not be run, or failed.
    #[error(transparent)]
    Command(#[from] crate::command::CommandError),
    /// A step of the story failed, or did not go as told.
    #[error("the story went wrong")]
    Story(#[from] crate::scenarios::ScenarioError),
    /// Interrupted by Ctrl-C or SIGTERM (everything was cleaned up).
    #[error("interrupted; everything was stopped and removed")]
    Interrupted,
}
