//! ipkeep's reservation contract: the files that make a returning pod get its addresses back, and
//! the decision an ADD takes with them.
//!
//! # Files
//! `<dataDir>/<network>/reserved/<namespace>/<pod>`, one JSON object per reservation, written
//! only by the agent (through [`ReservationWriter::apply`], [`write_reservation`],
//! [`remove_reservation`]: temp file in the same directory, fsync, rename, fsync of the
//! directory, all under the network's `lock`) and only read by the plugin:
//!
//! ```json
//! {"version":1,"namespace":"db","pod":"postgres-0","ips":["10.244.1.17","fd00:10:244:1::11"],
//!  "releaseTime":null,"uid":"5b0c7a3e-1d2f-4c1a-9b7e-0d7c2f4e9a11","nodeName":"node-a"}
//! ```
//!
//! `releaseTime` is `null` while the pod exists, else RFC 3339 UTC (`2026-11-21T12:00:00Z`); a
//! reservation holds its addresses until that instant ([`ReservationFile::is_active`]). The
//! namespace must be a DNS-1123 label and the pod name a DNS-1123 subdomain, exactly what
//! Kubernetes accepts, so no name can be `.`, `..` or contain `/`; the names inside the file must
//! equal the path. See `schema.rs` for versioning. The writer takes a [`ValidReservation`], which
//! only [`ReservationFile::validate`] makes: the rule runs once, where the agent builds the file.
//!
//! # Reading cost, and the snapshot
//! Reading 1 000 reservation files (open, fstat, read, close and a JSON decode each) costs several
//! milliseconds — more than a whole ADD. An ADD therefore reads its own file directly
//! ([`read_reservation`], O(1) via the path) and asks "is this address another pod's?" of the
//! binary snapshot `<net>/.ipkeep/reserved.index` (`snapshot.rs`) through
//! [`load_reservations_at`](add::load_reservations_at): one file read, a validity check against the
//! writer's generation counter and the stamps of `reserved/` and its namespace directories (so
//! files put there by hand count at once), then binary searches. The writer keeps it current: after
//! a batch of changes (`writer.rs`) it patches the snapshot with them instead of rescanning the
//! tree, after checking that the changed directories hold exactly what the patch predicts.
//! `make bench` measures an ADD with 1 000 reservation files on the node against one with none.
//!
//! # The decision
//! [`decide`](add::decide) is pure: given the range sets, requested addresses, the pod's own
//! reservation, the other pods' active reservations, who holds each address and the pod's
//! [`WaitMarker`](add::WaitMarker), it says per range set "this reserved address", "requested" or
//! "normal allocation skipping
//! [`ReservationLookup::is_blocked`](add::ReservationLookup::is_blocked)", or refuses / answers
//! "try again later" (CNI code 11).
//!
//! # The grace period
//! When the reserved address is still held by the *same* pod's previous container (a force-deleted
//! pod re-created before the runtime ran the old sandbox's DEL), the ADD answers "try again later"
//! for at most [`DEFAULT_GRACE`](add::DEFAULT_GRACE). The plugin remembers nothing between runs,
//! and the old allocation file's mtime says when the *old* container got the address, not how long
//! the new one has waited; so the first such ADD writes a wait marker
//! `<net>/.ipkeep/wait/<namespace>/<pod>` with the holder's container ID and the time (`wait.rs`).
//! Later ADDs measure the wait from it; once the grace has passed the pod takes a fresh address
//! (and the marker stays, so its later ADDs do not wait for the same stale container again). A
//! marker naming another holder restarts the wait; a successful ADD of the reserved address removes
//! it.
//!
//! # In the plugin's commands
//! `plugin/src/commands/reservations.rs` runs this under the lock the disk store
//! (`ipkeep-hostlocal`) holds:
//! * **ADD** with `K8S_POD_NAMESPACE`/`K8S_POD_NAME`: snapshot, own file, wait marker, holders of
//!   the own addresses (IP file + the side index's pod), [`decide`](add::decide), marker action;
//!   then the allocator gets the reserved address as its preferred one and
//!   [`ReservationLookup::is_blocked`](add::ReservationLookup::is_blocked) as its skip predicate.
//!   Without a `reserved/` directory nothing more is read and nothing is logged (host-local's
//!   behaviour and its empty stderr). Refusals: code 999 for a requested address another pod's
//!   active reservation holds, code 11 while the previous container holds the pod's address; a
//!   range full of reserved addresses is the normal range-full error.
//! * **DEL**, **CHECK**: unchanged; the reservation keeps holding a freed address, and a container
//!   holding its reserved address is an ordinary allocation.
//! * **GC** frees stale containers' files even at reserved addresses (the reservation goes on
//!   blocking them for everyone else, so GC never frees a reserved address for another pod, and
//!   the pod gets it back at once) and prunes the wait markers of pods without an active
//!   reservation ([`prune_wait_markers`](add::prune_wait_markers)).
//! * **STATUS** counts a free address held by a reservation as free (its pod can still be
//!   added) and says on stderr when a range set has no other free address.
//!
//! The grace is [`DEFAULT_GRACE`](add::DEFAULT_GRACE) unless the `ipam` section sets
//! `"reservationGraceSeconds"` (0 to 86 400). Every decision note and every skipped garbage entry
//! is one stderr line `ipkeep: <network>: …`.
//!
//! # Modules, bottom up
//! `schema.rs` and `timestamp.rs` (the file's format) ← `scan.rs` (the read side: the tree's
//! layout, the full scan, one pod's file) ← `snapshot.rs` (the snapshot an ADD reads, built from
//! the scan and patched by the writer) ← `writer.rs` (the write side: the diff against disk, the
//! batches, garbage). `decision.rs` and `wait.rs` serve the plugin's ADD.

// ipkeep's private directory in the network directory (`ipkeep-netdir`): the agent's writer and
// the plugin both go through it, and the allocator's disk store builds on it.
pub mod private_state;

mod decision;
mod released;
mod retain_for;
mod scan;
mod schema;
mod snapshot;
mod timestamp;
mod wait;
mod writer;

// The contract the agent (operator), the Docker driver and the plugin share: the file, its
// times, the network directory it lives in (`ipkeep-netdir`'s, named here because the writer and
// the readers take it and return its errors), the writer and the readers.
pub use ipkeep_netdir::{NetDirError, NetworkDir, TEMP_PREFIX};
pub use released::{MAX_RECORDS, REMEMBERED, Released, load_released, record_released};
pub use retain_for::{Fallback, ReleaseTime, RetainFor, RetainForError, effective_release_time};
pub use scan::{ReservationSet, ReservedDirError, Skipped, load_reservations, read_reservation};
pub use schema::{FORMAT_VERSION, PodKey, ReservationFile, SchemaError, ValidReservation};
pub use snapshot::{Source, load_reservations_cached};
pub use timestamp::{CivilTime, Timestamp, TimestampError};
pub use writer::{
    ApplyReport, ReservationWriter, Step, StepFailure, remove_reservation, write_reservation,
};

/// What the plugin's commands read under the network's lock: the snapshot of `reserved/`, the
/// pure decision of an ADD, and the wait markers of the grace period.
pub mod add {
    pub use crate::decision::{
        ActiveReservations, CurrentHolder, DEFAULT_GRACE, Decision, DecisionInput, MarkerAction,
        Note, Outcome, RangeSetPlan, RangeSetView, ReservationLookup, RetryLater,
        TRY_AGAIN_LATER_CODE, WaitMarker, decide,
    };
    pub use crate::scan::RESERVED_DIR;
    pub use crate::snapshot::{
        ReservationSnapshot, STALE_TEMP_AGE, SnapshotLookup, load_reservations_at,
    };
    pub use crate::wait::{
        prune_wait_markers, read_wait_marker, remove_wait_marker, write_wait_marker,
    };
}

/// An error and its sources on one line (`failed to …: because …: because …`), for log lines,
/// Events and answers; each layer's message says only its own part, so nothing is said twice.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests;
