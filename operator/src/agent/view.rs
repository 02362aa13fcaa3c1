//! The boundary between the agent's Kubernetes objects and its planning's plain data: what the
//! store keeps of an IPReservation ([`trim`]) and the [`Reservation`] that
//! [`crate::rules::desired`] plans over ([`reservation`]), as `controller/view.rs` does for the
//! controller's lifecycle.

use kube::ResourceExt;

use crate::api::{IPReservation, key_of, retention::RetainFor};
use crate::rules::desired::{Refusal, Reservation};

/// Drops what the agent never reads (`managedFields` is most of an object's size).
pub fn trim(ipr: &mut IPReservation) {
    ipr.metadata.managed_fields = None;
}

/// Planning's view of one IPReservation, or its refusal when its namespace or name is not a
/// valid one (never from a real API server; no file can be named after it).
pub fn reservation(ipr: &IPReservation) -> Result<Reservation, Refusal> {
    let key = key_of(ipr).map_err(|source| Refusal::InvalidName {
        namespace: ipr.namespace().unwrap_or_default(),
        name: ipr.name_any(),
        source,
    })?;
    let status = ipr.status.as_ref();
    Ok(Reservation {
        key,
        uid: ipr.uid(),
        created: ipr.metadata.creation_timestamp.as_ref().map(|t| t.0),
        node_name: ipr.spec.node_name.clone(),
        ips: ipr.spec.ips.iter().map(|ip| ip.0.clone()).collect(),
        retain_for: ipr.spec.retain_for.as_deref().map(RetainFor::parse),
        phase: status.and_then(|s| s.phase),
        released_at: status.and_then(|s| s.released_at.as_ref()).map(|t| t.0),
        release_time: status.and_then(|s| s.release_time.as_ref()).map(|t| t.0),
        in_conflict: ipr.in_conflict(),
        generation: ipr.metadata.generation,
    })
}

/// Planning's view of every reservation given.
pub fn reservations<'a>(
    all: impl IntoIterator<Item = &'a IPReservation>,
) -> Vec<Result<Reservation, Refusal>> {
    all.into_iter().map(reservation).collect()
}

// The view and the rule together: from the objects the API gives to the files desired.
#[cfg(test)]
mod tests;
