//! The compiled snapshot of `reserved/` that lets an ADD skip reading every reservation file.
//!
//! `<net>/.ipkeep/reserved.index` holds every valid reservation, the skipped garbage, and the
//! stamps (device, inode, mtime, ctime) of `reserved/` and of each namespace directory as they
//! were when the snapshot was taken. A reader trusts it only if all those stamps still match
//! (`lstat` of `reserved` plus one `fstatat` per namespace directory); otherwise it rescans and
//! rewrites it. Every change the writer makes renames or unlinks an entry of a namespace
//! directory (or of `reserved/`), which updates that directory's mtime and ctime, so a stale
//! snapshot is detected. The writer refreshes the snapshot itself after each change, so ADDs
//! normally find it valid.
//!
//! It lives outside `reserved/` because writing it there would change the stamps it records. It
//! is only a cache: written temp + rename without fsync (after a crash the stamps of any change
//! made durable differ from the snapshot's, or the file is missing or torn, and it is rebuilt).
//!
//! Residual risk: a change made by something other than this module's writer (a human editing a
//! file in place, which changes no directory) is not seen until the next change of that
//! directory. On kernels before 6.13 timestamps are coarse (one tick, a few ms), so a directory
//! changed by an outside hand within the same tick as the snapshot also goes unnoticed until its
//! next change. Neither can happen through the agent, the only writer the contract allows.

use serde::{Deserialize, Serialize};

use crate::netdir::{NetDirError, NetworkDir, NetworkLock};

use super::reserved_dir::{DirStamp, RESERVED_DIR, ReservationSet, Skipped, TreeStamps, scan};
use super::schema::ReservationFile;

/// The plugin's private directory inside the network directory.
pub const PRIVATE_DIR: &str = ".ipkeep";
/// The snapshot's file name inside [`PRIVATE_DIR`].
pub const INDEX_NAME: &str = "reserved.index";

/// Bumped whenever the snapshot's layout changes; another number means "rebuild".
const INDEX_FORMAT: u32 = 1;
/// Largest snapshot read (about 200 bytes per reservation).
const MAX_INDEX_LEN: usize = 64 * 1024 * 1024;

#[derive(Serialize, Deserialize)]
struct IndexFile {
    format: u32,
    stamps: TreeStamps,
    files: Vec<ReservationFile>,
    skipped: Vec<Skipped>,
}

/// Where a [`load_reservations_cached`] result came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// There is no `reserved/`: nothing to read.
    NoReservations,
    /// The snapshot was valid.
    Index,
    /// The snapshot was missing or stale: the tree was scanned and the snapshot rewritten.
    Rescanned,
}

/// The reservations of a network as an ADD needs them: from the snapshot when it is valid, else
/// from a full scan (after which the snapshot is rewritten). Needs the network's lock (the
/// snapshot must describe the tree as no writer is changing it). Never fails: a snapshot that
/// cannot be read or written only costs the scan.
pub fn load_reservations_cached(
    dir: &NetworkDir,
    _lock: &NetworkLock<'_>,
) -> (ReservationSet, Source) {
    if let Ok(None) = dir.stat(RESERVED_DIR) {
        return (ReservationSet::default(), Source::NoReservations);
    }
    if let Some(set) = read_valid(dir) {
        return (set, Source::Index);
    }
    let (set, stamps) = scan(dir);
    // A snapshot that cannot be written only means the next ADD scans too.
    let _ = write(dir, &set, stamps);
    (set, Source::Rescanned)
}

/// Rewrites the snapshot if it is stale (the writer calls this after each change).
pub(super) fn refresh(dir: &NetworkDir, _lock: &NetworkLock<'_>) -> Result<(), NetDirError> {
    if dir.stat(RESERVED_DIR)?.is_none() {
        // Nothing to describe; a leftover snapshot would be ignored anyway, remove it for tidiness.
        if let Some(private) = dir.subdir(&[PRIVATE_DIR], false)? {
            private.remove(INDEX_NAME)?;
        }
        return Ok(());
    }
    if read_valid(dir).is_some() {
        return Ok(());
    }
    let (set, stamps) = scan(dir);
    write(dir, &set, stamps)
}

/// The snapshot's content if it exists, parses, and all its stamps match the tree.
fn read_valid(dir: &NetworkDir) -> Option<ReservationSet> {
    let private = dir.subdir(&[PRIVATE_DIR], false).ok()??;
    let bytes = private.read_file(INDEX_NAME, MAX_INDEX_LEN).ok()??;
    let index: IndexFile = serde_json::from_slice(&bytes).ok()?;
    if index.format != INDEX_FORMAT || !stamps_match(dir, &index.stamps) {
        return None;
    }
    Some(ReservationSet {
        files: index.files.into_iter().map(|f| (f.pod_key(), f)).collect(),
        skipped: index.skipped,
    })
}

fn stamps_match(dir: &NetworkDir, stamps: &TreeStamps) -> bool {
    let Ok(now) = dir.stat(RESERVED_DIR) else {
        return false;
    };
    if now.map(Into::into) != stamps.reserved {
        return false;
    }
    if stamps.namespaces.is_empty() {
        return true;
    }
    let Ok(Some(reserved)) = dir.subdir(&[RESERVED_DIR], false) else {
        return false;
    };
    stamps.namespaces.iter().all(|(name, recorded)| {
        matches!(reserved.stat(name), Ok(Some(st)) if DirStamp::from(st) == *recorded)
    })
}

fn write(dir: &NetworkDir, set: &ReservationSet, stamps: TreeStamps) -> Result<(), NetDirError> {
    let index = IndexFile {
        format: INDEX_FORMAT,
        stamps,
        files: set.files.values().cloned().collect(),
        skipped: set.skipped.clone(),
    };
    let Ok(bytes) = serde_json::to_vec(&index) else {
        return Ok(());
    };
    let Some(private) = dir.subdir(&[PRIVATE_DIR], true)? else {
        return Ok(());
    };
    private.write_atomic(INDEX_NAME, &bytes, 0o600, false)
}
