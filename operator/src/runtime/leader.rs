//! Leadership through a Lease: only the replica holding it runs its work; a standby waits, and
//! takes over when the lease is free.

use std::{future::Future, time::Duration};

use kube::Client;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseManagerError};
use prometheus::IntGauge;
use tokio::{sync::watch, task::JoinHandle};

use super::shutdown::stopped;

/// Leader election settings.
#[derive(Debug, Clone)]
pub struct LeaseSettings {
    /// Lease name.
    pub name: String,
    /// Lease namespace.
    pub namespace: String,
    /// This replica's identity.
    pub identity: String,
    /// Lease duration in seconds.
    pub duration_secs: u64,
}

/// Why leading stopped other than by `stop`.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The lease could not be set up.
    #[error("failed to set up leader election on Lease {namespace}/{name}")]
    Lease {
        /// Lease namespace.
        namespace: String,
        /// Lease name.
        name: String,
        /// What failed.
        #[source]
        source: LeaseManagerError,
    },
    /// Another replica took the lease: this one stops so that it never works beside it.
    #[error(
        "failed to keep the leader lease: another replica holds it now; exiting to restart as a standby"
    )]
    LostLease,
}

/// Waits for `lease`, then runs `work` while holding it (`leading` reads 1 meanwhile). Returns
/// `Ok` when `stop` turns true (after releasing the lease), [`LeaderError::LostLease`] when
/// another replica took it, and `work`'s own result if it ends first. `stepped_down` runs as soon
/// as `work` is no longer run, before the lease is given up.
pub async fn lead<E: From<LeaderError>>(
    client: Client,
    lease: &LeaseSettings,
    stop: watch::Receiver<bool>,
    leading_gauge: &IntGauge,
    stepped_down: impl FnOnce(),
    work: impl Future<Output = Result<(), E>>,
) -> Result<(), E> {
    let lease_err = |source| LeaderError::Lease {
        namespace: lease.namespace.clone(),
        name: lease.name.clone(),
        source,
    };
    let grace = (lease.duration_secs / 3).max(1);
    let manager = LeaseManagerBuilder::new(client, &lease.name)
        .with_namespace(&lease.namespace)
        .with_identity(&lease.identity)
        .with_duration(lease.duration_secs)
        .with_grace(grace)
        // One field manager per replica, as the lease library expects: a replica's apply of
        // `holderIdentity` then conflicts (409) with another replica's, so two replicas racing for
        // a free lease can never both believe they hold it.
        .with_field_manager(format!("ipkeep-controller-lease-{}", lease.identity))
        .build()
        .await
        .map_err(lease_err)?;
    let (mut leading, handle) = manager.watch().await;
    let released = ReleaseOnDrop(Some(handle));
    tracing::info!(identity = %lease.identity, lease = %lease.name, "waiting for the leader lease");
    let became_leader = tokio::select! {
        r = leading.wait_for(|l| *l) => r.is_ok(),
        () = stopped(stop.clone()) => false,
    };
    if !became_leader {
        drop(leading);
        released.release().await;
        return if *stop.borrow() {
            Ok(())
        } else {
            Err(LeaderError::LostLease.into())
        };
    }
    tracing::info!(identity = %lease.identity, "leading: reconciling");
    leading_gauge.set(1);
    let result = tokio::select! {
        r = work => r,
        _ = leading.wait_for(|l| !*l) => Err(LeaderError::LostLease.into()),
        () = stopped(stop) => Ok(()),
    };
    // No work may run once the lease is given up.
    stepped_down();
    leading_gauge.set(0);
    drop(leading);
    released.release().await;
    result
}

/// Awaits the lease manager's task after its channel closed (it releases the lease then); if the
/// future owning it is dropped instead, the task still releases it in the background.
struct ReleaseOnDrop(Option<JoinHandle<Result<LeaseManager, LeaseManagerError>>>);

impl ReleaseOnDrop {
    async fn release(mut self) {
        if let Some(handle) = self.0.take() {
            match tokio::time::timeout(Duration::from_secs(5), handle).await {
                Ok(Ok(Ok(_))) => tracing::info!("leader lease released"),
                Ok(Ok(Err(e))) => tracing::warn!(error = %e, "failed to release the leader lease"),
                Ok(Err(e)) => tracing::warn!(error = %e, "the lease task failed"),
                Err(_) => tracing::warn!("gave up waiting 5 s for the lease release"),
            }
        }
    }
}

impl std::fmt::Debug for ReleaseOnDrop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReleaseOnDrop")
    }
}
