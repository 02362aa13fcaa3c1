//! Why the controller stops.

use super::{metrics::MetricsError, webhook::WebhookError};
use crate::{
    api::retention::RetainFor,
    runtime::{leader::LeaderError, logging::LoggingError, probes::ProbeError},
};

/// Errors that stop the controller.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// Logging could not be set up.
    #[error(transparent)]
    Logging(#[from] LoggingError),
    /// The default retention is longer than the maximum.
    #[error(
        "failed to start: --default-retain-for {default} is longer than --max-retain-for {max}"
    )]
    DefaultAboveMax {
        /// `--default-retain-for`.
        default: RetainFor,
        /// `--max-retain-for`.
        max: RetainFor,
    },
    /// The async runtime could not start.
    #[error("failed to start the async runtime")]
    Runtime(#[source] std::io::Error),
    /// No Kubernetes client configuration was found.
    #[error("failed to build a Kubernetes client (in-cluster config or KUBECONFIG)")]
    Client(#[source] kube::Error),
    /// Metrics could not be registered.
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    /// The probe server could not bind.
    #[error(transparent)]
    Probes(#[from] ProbeError),
    /// The placement webhook could not be served.
    #[error(transparent)]
    Webhook(#[from] WebhookError),
    /// Leadership failed or was lost.
    #[error(transparent)]
    Leader(#[from] LeaderError),
    /// A cache's writer went away before the cache was filled.
    #[error("failed to fill the {0} cache: its watch ended")]
    CacheNeverReady(&'static str),
}
