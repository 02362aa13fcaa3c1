//! Which reservation files should exist on this node: pure functions over plain data (the
//! [`Reservation`]s that `agent::view` makes of the node's IPReservations, and the files found on
//! disk), with no Kubernetes type, client, disk or clock.
//!
//! * [`reservation_file`] turns one reservation into the file the plugin reads, or says why it
//!   is not written (another node's, in conflict) or refused (an address the plugin could never
//!   use, missing metadata). A reservation whose names could never be a path never becomes a
//!   [`Reservation`]: the view refuses it ([`Refusal::InvalidName`]).
//! * [`desired_files`] does it for every reservation the agent holds; the plugin library's
//!   writer owns the diff against what is on disk.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use ipkeep_reservation::{
    FORMAT_VERSION, PodKey, ReservationFile, SchemaError, Timestamp, ValidReservation,
};

use crate::api::Phase;
use crate::api::retention::{
    Fallback, FoundRetainFor, RetainFor, RetainForError, release_time, retention,
};

/// What planning reads of one IPReservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// Its namespace and name (the pod's).
    pub key: PodKey,
    /// `metadata.uid`.
    pub uid: Option<String>,
    /// `metadata.creationTimestamp`.
    pub created: Option<jiff::Timestamp>,
    /// `spec.nodeName`.
    pub node_name: String,
    /// `spec.ips`, as written.
    pub ips: Vec<String>,
    /// `spec.retainFor`, parsed.
    pub retain_for: Option<FoundRetainFor>,
    /// `status.phase`.
    pub phase: Option<Phase>,
    /// `status.releasedAt`.
    pub released_at: Option<jiff::Timestamp>,
    /// `status.releaseTime`.
    pub release_time: Option<jiff::Timestamp>,
    /// The controller found an older reservation holding one of its addresses.
    pub in_conflict: bool,
    /// `metadata.generation` (written into the file: [`crate::rules::loss`] compares it).
    pub generation: Option<i64>,
}

/// Why a reservation cannot be written (reported as a Warning Event and a log line, never turned
/// into a path).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The namespace or name is not a valid Kubernetes namespace/pod name.
    #[error("failed to use reservation {namespace}/{name} as a file name")]
    InvalidName {
        /// The reservation's namespace as found.
        namespace: String,
        /// The reservation's name as found.
        name: String,
        /// Which rule it breaks.
        #[source]
        source: SchemaError,
    },
    /// An entry of `spec.ips` is not an IP address.
    #[error("failed to parse address {ip:?} of reservation {pod}")]
    InvalidAddress {
        /// Whose reservation.
        pod: PodKey,
        /// The entry as found.
        ip: String,
    },
    /// The reservation has no `metadata.uid` or `metadata.creationTimestamp` (never from a real
    /// API server).
    #[error("failed to write reservation {pod}: it has no metadata.{field}")]
    MissingMetadata {
        /// Whose reservation.
        pod: PodKey,
        /// The missing field.
        field: &'static str,
    },
    /// The file would not be valid (no address, an address twice).
    #[error("failed to write reservation {pod}")]
    InvalidFile {
        /// Whose reservation.
        pod: PodKey,
        /// What is wrong.
        #[source]
        source: SchemaError,
    },
    /// A lost reservation's file on the node holds one of its addresses
    /// ([`crate::rules::loss::yield_to_kept`]): after a restore from an older backup, this is a
    /// reservation released since, brought back.
    #[error(
        "failed to write reservation {pod}: {ip} is held on this node by the file of the lost reservation {holder} (after a restore from an older backup: this one was released since); run ipkeep-operator recover, and delete whichever of the two is stale"
    )]
    HeldByLost {
        /// Whose reservation.
        pod: PodKey,
        /// The address.
        ip: IpAddr,
        /// The lost reservation whose file holds it.
        holder: PodKey,
    },
}

impl Refusal {
    /// The refused reservation's namespace and name, as found.
    pub fn names(&self) -> (&str, &str) {
        match self {
            Refusal::InvalidName {
                namespace, name, ..
            } => (namespace, name),
            Refusal::InvalidAddress { pod, .. }
            | Refusal::MissingMetadata { pod, .. }
            | Refusal::InvalidFile { pod, .. }
            | Refusal::HeldByLost { pod, .. } => (pod.namespace(), pod.name()),
        }
    }
}

/// What [`reservation_file`] decided for one reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileDecision {
    /// This file must exist.
    Write {
        /// The file, validated (boxed: the other decisions carry nothing).
        file: Box<ValidReservation>,
        /// Its release time used the default retention in place of this malformed
        /// `spec.retainFor` (as the controller does; the caller warns).
        defaulted: Option<RetainForError>,
    },
    /// The reservation belongs to another node: no file here.
    OtherNode,
    /// The controller marked it `Conflict`: no file, so the address it claims stays with the
    /// older reservation.
    Conflict,
}

fn timestamp_of(time: jiff::Timestamp) -> Timestamp {
    let secs = time.as_second();
    let nanos = u32::try_from(time.subsec_nanosecond()).unwrap_or(0);
    // A negative sub-second part (before the epoch) is folded into the seconds.
    Timestamp::new(secs, nanos).unwrap_or(Timestamp::from_unix_secs(secs))
}

/// The file for `r` on `node`, or why there is none.
///
/// `releaseTime` in the file:
/// * `Bound` → `null` (the pod holds the addresses);
/// * `status.releaseTime` when the controller set it, exactly (even if it has passed: the
///   plugin ignores an expired file by itself);
/// * otherwise (a reservation made by hand, or one the controller has only just created) the
///   controller's rule, [`release_time`], from `status.releasedAt`, else `creationTimestamp`:
///   the design treats a hand-made reservation as `Released` from its creation until its pod
///   appears. `retainFor` is the reservation's own, else `default_retain_for` (the chart passes
///   the controller's default) — also when its own is malformed, as the controller does: the
///   file is written with the time the controller will write, and the decision says so.
///
/// `retainForSeconds`: that same retention ([`retention`]), held by the node in case the object
/// vanishes while the file is `Bound` ([`crate::rules::loss::kept_until`]).
pub fn reservation_file(
    r: &Reservation,
    node: &str,
    default_retain_for: Duration,
) -> Result<FileDecision, Refusal> {
    if r.node_name != node {
        return Ok(FileDecision::OtherNode);
    }
    if r.in_conflict {
        return Ok(FileDecision::Conflict);
    }
    let pod = r.key.clone();
    let mut ips = Vec::with_capacity(r.ips.len());
    for ip in &r.ips {
        let parsed: IpAddr = ip.parse().map_err(|_| Refusal::InvalidAddress {
            pod: pod.clone(),
            ip: ip.clone(),
        })?;
        ips.push(parsed.to_canonical());
    }
    let Some(uid) = r.uid.clone() else {
        return Err(Refusal::MissingMetadata { pod, field: "uid" });
    };
    let mut defaulted = None;
    let release_time = match (r.phase, r.release_time) {
        (Some(Phase::Bound), _) => None,
        (_, Some(at)) => Some(timestamp_of(at)),
        (_, None) => {
            let Some(released_at) = r.released_at.or(r.created) else {
                return Err(Refusal::MissingMetadata {
                    pod,
                    field: "creationTimestamp",
                });
            };
            // The agent knows no --max-retain-for: the grammar's is the cap until the controller
            // writes status.releaseTime.
            let (at, fallback) = release_time(
                released_at,
                r.retain_for.as_ref(),
                default_retain_for,
                RetainFor::MAX,
            );
            if let Some(Fallback::Malformed(e)) = fallback {
                defaulted = Some(e);
            }
            Some(timestamp_of(at))
        }
    };
    let file = ReservationFile {
        version: FORMAT_VERSION,
        namespace: pod.namespace().to_owned(),
        pod: pod.name().to_owned(),
        ips,
        release_time,
        uid,
        node_name: Some(node.to_owned()),
        generation: r.generation,
        retain_for_seconds: Some(
            retention(r.retain_for.as_ref(), default_retain_for, RetainFor::MAX).as_secs(),
        ),
    };
    let file = file
        .validate()
        .map_err(|source| Refusal::InvalidFile { pod, source })?;
    Ok(FileDecision::Write {
        file: Box::new(file),
        defaulted,
    })
}

/// The files every reservation the agent holds calls for on `node`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    /// The files that must exist, by pod.
    pub files: BTreeMap<PodKey, ValidReservation>,
    /// Reservations not written because the controller marked them `Conflict`.
    pub conflicts: Vec<PodKey>,
    /// Reservations refused, and why (each names its reservation: [`Refusal::names`]).
    pub refused: Vec<Refusal>,
    /// Reservations written with the default retention in place of their malformed
    /// `spec.retainFor`.
    pub defaulted: Vec<(PodKey, RetainForError)>,
}

/// Applies [`reservation_file`] to every reservation, and keeps the refusals of those whose
/// names are not valid ones (from [`crate::agent::view::reservations`]).
pub fn desired_files<'a>(
    node: &str,
    reservations: impl IntoIterator<Item = &'a Result<Reservation, Refusal>>,
    default_retain_for: Duration,
) -> Desired {
    let mut desired = Desired::default();
    for r in reservations {
        let r = match r {
            Ok(r) => r,
            Err(refusal) => {
                desired.refused.push(refusal.clone());
                continue;
            }
        };
        match reservation_file(r, node, default_retain_for) {
            Ok(FileDecision::Write { file, defaulted }) => {
                if let Some(malformed) = defaulted {
                    desired.defaulted.push((r.key.clone(), malformed));
                }
                desired.files.insert(file.key(), *file);
            }
            Ok(FileDecision::OtherNode) => {}
            Ok(FileDecision::Conflict) => desired.conflicts.push(r.key.clone()),
            Err(refusal) => desired.refused.push(refusal),
        }
    }
    desired
}
