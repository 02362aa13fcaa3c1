//! Graceful shutdown: both components stop on SIGTERM (what the kubelet sends) or SIGINT (Ctrl-C).

/// Completes when the process receives SIGTERM or SIGINT. If a handler cannot be installed, that
/// signal is logged and only the other one is awaited.
pub async fn signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM received: shutting down"),
                _ = int.recv() => tracing::info!("SIGINT received: shutting down"),
            }
        }
        (Ok(mut term), Err(e)) => {
            tracing::warn!(error = %e, "failed to install the SIGINT handler");
            term.recv().await;
        }
        (Err(e), Ok(mut int)) => {
            tracing::warn!(error = %e, "failed to install the SIGTERM handler");
            int.recv().await;
        }
        (Err(e), Err(_)) => {
            tracing::error!(error = %e, "failed to install any signal handler: stop with SIGKILL");
            std::future::pending::<()>().await;
        }
    }
}

/// Completes once `stop` turns true (or its sender is gone): how a task spawned beside the main
/// loop learns that the process is stopping.
pub async fn stopped(mut stop: tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
