//! What the agent released on purpose: `<net>/.ipkeep/released.json`, one record per reservation
//! whose file it removed because the reservation was released (its deletion seen, its release
//! time come, or it moved to another node), with the generation the file held.
//!
//! An etcd restore brings objects back that were deleted after the backup was taken; nothing in
//! the object says so. The node remembers: an object whose uid it released at a generation at or
//! above the object's is that deleted object come back, and is not written (the operator's
//! `rules::loss`). A reservation that legitimately returns to a node (moved away and back) has
//! a higher generation, since every move changes its spec. Records older than [`REMEMBERED`] are
//! pruned, and at most [`MAX_RECORDS`] are kept (the newest): a restore from a backup older
//! than that brings back objects the node no longer knows it released, which are then written as
//! any other.
//!
//! The file is ipkeep's private state: written atomically under the network's lock, read without
//! it (a rename is atomic), and anything at its path that does not decode is discarded and the
//! record starts empty, as for the snapshot (`private_state`).

use std::time::Duration;

use ipkeep_netdir::{NetDirError, NetworkDir};
use serde::{Deserialize, Serialize};

use crate::private_state::{self, PRIVATE_DIR};
use crate::timestamp::Timestamp;

/// The file's name inside [`PRIVATE_DIR`].
pub const RELEASED_NAME: &str = "released.json";
/// How long a release is remembered: a restore from a backup older than this is not told from
/// a legitimate new object. A month covers the nightly and weekly backups restores come from.
pub const REMEMBERED: Duration = Duration::from_secs(30 * 24 * 3600);
/// How many releases are remembered at most (the newest; about 150 bytes each).
pub const MAX_RECORDS: usize = 20_000;
/// Largest file read.
const MAX_LEN: usize = 8 * 1024 * 1024;

/// One reservation the agent released.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Released {
    /// The IPReservation's `metadata.uid`.
    pub uid: String,
    /// Its namespace.
    pub namespace: String,
    /// Its (the pod's) name.
    pub pod: String,
    /// The `metadata.generation` its file held when it was removed.
    pub generation: i64,
    /// When the file was removed.
    pub released_at: Timestamp,
}

/// The file's content.
#[derive(Debug, Default, Serialize, Deserialize)]
struct ReleasedFile {
    version: u32,
    released: Vec<Released>,
}

/// The records, newest last; none when there is no file (or it was damaged: then `log` says
/// what was found, and it is removed).
pub fn load_released(dir: &NetworkDir, log: &mut Vec<String>) -> Vec<Released> {
    let Ok(Some(private)) = dir.subdir(&[PRIVATE_DIR], false) else {
        return Vec::new();
    };
    let Ok(Some(bytes)) = private_state::read_file(&private, RELEASED_NAME, MAX_LEN, log) else {
        return Vec::new();
    };
    match serde_json::from_slice::<ReleasedFile>(&bytes) {
        Ok(file) if file.version == 1 => file.released,
        _ => {
            private_state::discard(
                &private,
                RELEASED_NAME,
                "content that is not a record of released reservations",
                log,
            );
            Vec::new()
        }
    }
}

/// Adds `new` to the records under the network's lock, drops those older than [`REMEMBERED`]
/// at `now` (and the oldest beyond [`MAX_RECORDS`]), and writes the file atomically. Nothing is
/// written when nothing changes.
pub fn record_released(
    dir: &NetworkDir,
    new: &[Released],
    now: Timestamp,
    log: &mut Vec<String>,
) -> Result<(), NetDirError> {
    let _lock = dir.lock()?;
    let before = load_released(dir, log);
    let kept = merge(&before, new, now);
    if kept == before {
        return Ok(());
    }
    let Some(private) = private_state::open_dir(dir, PRIVATE_DIR, true, log)? else {
        return Ok(());
    };
    if let private_state::Found::Damaged(what) =
        private_state::inspect_file(&private, RELEASED_NAME, MAX_LEN)?
    {
        private_state::discard(&private, RELEASED_NAME, &what, log);
    }
    let bytes = serde_json::to_vec(&ReleasedFile {
        version: 1,
        released: kept,
    })
    .unwrap_or_default();
    private.write_atomic(RELEASED_NAME, &bytes, private_state::FILE_MODE, true)
}

/// The records after adding `new` at `now`: one per uid (the latest), none older than
/// [`REMEMBERED`], at most [`MAX_RECORDS`], oldest first.
fn merge(before: &[Released], new: &[Released], now: Timestamp) -> Vec<Released> {
    let mut all: Vec<Released> = before
        .iter()
        .filter(|r| !new.iter().any(|n| n.uid == r.uid))
        .chain(new)
        .filter(|r| now.saturating_duration_since(r.released_at) <= REMEMBERED)
        .cloned()
        .collect();
    all.sort_by_key(|r| r.released_at);
    let excess = all.len().saturating_sub(MAX_RECORDS);
    all.drain(..excess);
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(uid: &str, generation: i64, at: i64) -> Released {
        Released {
            uid: uid.into(),
            namespace: "db".into(),
            pod: format!("pod-{uid}"),
            generation,
            released_at: Timestamp::from_unix_secs(at),
        }
    }

    #[test]
    fn records_are_merged_one_per_uid_and_pruned_by_age() {
        let day = 86_400;
        let now = 100 * day;
        let before = [rec("old", 1, now - 31 * day), rec("a", 1, now - day)];
        let merged = merge(
            &before,
            &[rec("a", 3, now), rec("b", 2, now)],
            Timestamp::from_unix_secs(now),
        );
        assert_eq!(merged, [rec("a", 3, now), rec("b", 2, now)]);
        assert_eq!(merge(&merged, &[], Timestamp::from_unix_secs(now)), merged);
        let many: Vec<Released> = (0..MAX_RECORDS as i64 + 5)
            .map(|i| rec(&i.to_string(), 1, now - 1000 + i % 1000))
            .collect();
        let capped = merge(&[], &many, Timestamp::from_unix_secs(now));
        assert_eq!(capped.len(), MAX_RECORDS);
        assert!(
            capped
                .windows(2)
                .all(|w| w[0].released_at <= w[1].released_at)
        );
    }

    #[test]
    fn the_record_survives_on_disk_and_damage_is_discarded() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = NetworkDir::open(tmp.path(), "net1").unwrap();
        let mut log = Vec::new();
        assert!(load_released(&dir, &mut log).is_empty());
        let now = Timestamp::from_unix_secs(1_800_000_000);
        record_released(&dir, &[rec("a", 2, 1_800_000_000)], now, &mut log).unwrap();
        assert_eq!(load_released(&dir, &mut log), [rec("a", 2, 1_800_000_000)]);
        let path = tmp.path().join("net1/.ipkeep").join(RELEASED_NAME);
        std::fs::write(&path, b"not json").unwrap();
        assert!(load_released(&dir, &mut log).is_empty());
        assert!(!path.exists(), "the damaged record stayed");
        assert!(log.iter().any(|l| l.contains("released")), "{log:?}");
    }
}
