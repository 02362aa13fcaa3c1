//! The read side of the `reserved/` tree of a network directory: its layout (the names both
//! sides use), the full scan every other view is built from, and the O(1) read of one pod's
//! file. Nothing here changes a reservation; the snapshot ([`super::snapshot`]) is built from this
//! scan and the writer ([`super::writer`]) plans from it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use ipkeep_netdir::{DirFd, EntryKind, FileStat, NetDirError, NetworkDir, SubDir, TEMP_PREFIX};

use super::schema::{
    MAX_FILE_LEN, PodKey, ReservationFile, SchemaError, validate_namespace, validate_pod_name,
};

/// The directory below `<dataDir>/<network>/` holding one file per reservation.
pub const RESERVED_DIR: &str = "reserved";

/// The writer's change counter inside `reserved/` (a name no namespace can have).
pub const GENERATION_NAME: &str = ".generation";

/// Errors of reading or writing the `reserved/` tree.
#[derive(Debug, thiserror::Error)]
pub enum ReservedDirError {
    /// The reservation to write is not valid.
    #[error("failed to write reservation: the file is not valid")]
    Invalid(#[from] SchemaError),
    /// A file system step failed.
    #[error(transparent)]
    Io(#[from] NetDirError),
    /// The names to look up or remove are not a valid namespace/pod.
    #[error("failed to use reservation name: {0}")]
    InvalidName(SchemaError),
    /// A reservation file exists but cannot be used.
    #[error("failed to read reservation {}: {reason}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: SchemaError,
    },
}

/// An entry of `reserved/` that is not a valid reservation, skipped and reported.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct Skipped {
    /// Where it is.
    pub path: PathBuf,
    /// Why it was skipped.
    pub reason: String,
}

/// Every valid reservation of a network, by pod, and what was skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReservationSet {
    /// The valid reservations (active or not).
    pub files: BTreeMap<PodKey, ReservationFile>,
    /// Garbage found in `reserved/`, sorted by path.
    pub skipped: Vec<Skipped>,
}

impl ReservationSet {
    /// The reservation of `namespace`/`pod`, if there is one (active or not).
    pub fn get(&self, namespace: &str, pod: &str) -> Option<&ReservationFile> {
        // A name that is not valid has no reservation.
        let key = PodKey::new(namespace, pod).ok()?;
        self.files.get(&key)
    }

    /// The number of valid reservations.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Whether there is no valid reservation.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

/// Reads every file of `reserved/` (no cache; see [`super::load_reservations_cached`] for what
/// an ADD uses). Never fails: whatever cannot be read or is not a valid reservation lands in
/// `skipped`, so garbage can never break an ADD or DEL for anyone.
pub fn load_reservations(dir: &NetworkDir) -> ReservationSet {
    scan(dir).0
}

/// The identity and change times of a directory, as recorded in the snapshot to detect changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SnapshotDirStamp {
    /// Device number.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i128,
    /// Status change time, nanoseconds since the epoch.
    pub ctime_ns: i128,
}

impl From<FileStat> for SnapshotDirStamp {
    fn from(st: FileStat) -> Self {
        Self {
            dev: st.dev,
            ino: st.ino,
            mtime_ns: st.mtime_ns,
            ctime_ns: st.ctime_ns,
        }
    }
}

/// What a snapshot must match to be trusted: the `lstat` stamp of `reserved` and the writer's
/// generation counter (`reserved/.generation`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SnapshotStamp {
    /// `reserved` itself (whatever it is; `None`: absent).
    pub reserved: Option<SnapshotDirStamp>,
    /// The generation counter (`None`: absent or unreadable, which no snapshot matches).
    pub generation: Option<u64>,
}

/// The current stamp and `reserved/` opened (when it is a directory).
pub(super) fn current_stamp_and_dir(dir: &NetworkDir) -> (SnapshotStamp, Option<SubDir>) {
    let reserved = match dir.stat(RESERVED_DIR) {
        Ok(Some(st)) => st,
        Ok(None) | Err(_) => return (SnapshotStamp::default(), None),
    };
    let sub = dir.subdir(&[RESERVED_DIR], false).ok().flatten();
    let generation = sub.as_ref().and_then(|sub| read_generation(sub));
    let stamp = SnapshotStamp {
        reserved: Some(reserved.into()),
        generation,
    };
    (stamp, sub)
}

/// An entry below `reserved/` whose change must invalidate a snapshot although it changes
/// neither `reserved` itself nor the generation counter: every namespace directory (a file
/// copied in by hand changes it), and every skipped file (one still being copied in decodes
/// once the copy ends, which changes the file but not its directory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Watched {
    /// `<namespace>` or `<namespace>/<file>`, relative to `reserved/`.
    pub(super) name: String,
    /// Its `lstat` when the scan read it.
    pub(super) stamp: SnapshotDirStamp,
}

/// What a full scan found.
#[derive(Debug, Clone, Default)]
pub(super) struct Scan {
    /// The reservations and the garbage.
    pub(super) set: ReservationSet,
    /// `reserved` and the generation counter, taken before anything was listed.
    pub(super) stamp: SnapshotStamp,
    /// The entries below `reserved/` a snapshot must also watch.
    pub(super) watched: Vec<Watched>,
    /// Whether a writer's temporary was left in place (too young to be removed).
    pub(super) temporaries: bool,
    /// Temporaries of killed writers the scan removed.
    pub(super) removed: Vec<PathBuf>,
}

/// Removes `name` if it is a writer's temporary file last changed before `before`: the writer
/// creates temporaries only while it holds the network's lock, so one seen by a holder of the
/// lock belongs to a writer that was killed; the age guards against any writer that skips the
/// lock.
fn remove_if_stale_temp(
    parent: &DirFd,
    name: &str,
    kind: EntryKind,
    before_ns: Option<i128>,
) -> bool {
    let Some(before_ns) = before_ns else {
        return false;
    };
    if !name.starts_with(TEMP_PREFIX) || kind != EntryKind::File {
        return false;
    }
    match parent.stat(name) {
        Ok(Some(st)) if st.kind == EntryKind::File && st.mtime_ns < before_ns => {
            parent.remove(name).unwrap_or(false)
        }
        _ => false,
    }
}

/// The writer's generation counter, `None` when absent or unreadable.
pub(super) fn read_generation(reserved: &DirFd) -> Option<u64> {
    let bytes = reserved.read_file(GENERATION_NAME, 64).ok()??;
    std::str::from_utf8(&bytes).ok()?.trim_end().parse().ok()
}

/// The full scan, with the stamp taken before anything is listed (so a change during the scan
/// makes the stamp stale, never the other way round; the caller holds the lock anyway).
pub(super) fn scan(dir: &NetworkDir) -> (ReservationSet, SnapshotStamp) {
    let scan = scan_full(dir, None);
    (scan.set, scan.stamp)
}

#[cfg(test)]
thread_local! {
    /// How many full scans this thread ran (tests check the writer patches instead).
    pub(super) static FULL_SCANS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The full scan, also recording what a snapshot must watch, and removing the temporaries of
/// killed writers last changed before `clean_before` (nanoseconds since the epoch; the caller
/// must hold the network's lock).
pub(super) fn scan_full(dir: &NetworkDir, clean_before: Option<i128>) -> Scan {
    #[cfg(test)]
    FULL_SCANS.with(|n| n.set(n.get() + 1));
    let (stamp, reserved) = current_stamp_and_dir(dir);
    let mut scan = Scan {
        stamp,
        ..Scan::default()
    };
    let set = &mut scan.set;
    if stamp.reserved.is_none() {
        if let Err(e) = dir.stat(RESERVED_DIR) {
            set.skipped.push(Skipped {
                path: dir.child_path(RESERVED_DIR),
                reason: e.to_string(),
            });
        }
        return scan;
    }
    let reserved = match reserved {
        Some(reserved) => reserved,
        None => match dir.subdir(&[RESERVED_DIR], false) {
            Ok(Some(reserved)) => reserved,
            Ok(None) => return scan,
            Err(e) => {
                set.skipped.push(Skipped {
                    path: dir.child_path(RESERVED_DIR),
                    reason: e.to_string(),
                });
                return scan;
            }
        },
    };
    let entries = match reserved.entries() {
        Ok(entries) => entries,
        Err(e) => {
            set.skipped.push(skip(&reserved, "", e.to_string()));
            return scan;
        }
    };
    for entry in entries {
        if entry.name == GENERATION_NAME {
            continue;
        }
        if remove_if_stale_temp(&reserved, &entry.name, entry.kind, clean_before) {
            scan.removed.push(reserved.child_path(&entry.name));
            continue;
        }
        if let Err(why) = namespace_entry_ok(&entry.name, entry.kind) {
            scan.temporaries |= entry.name.starts_with(TEMP_PREFIX);
            scan.set.skipped.push(skip(&reserved, &entry.name, why));
            continue;
        }
        let ns_dir = match reserved.subdir(&[&entry.name], false) {
            Ok(Some(ns_dir)) => ns_dir,
            // Removed between the listing and now: nothing to read.
            Ok(None) => continue,
            Err(e) => {
                scan.set
                    .skipped
                    .push(skip(&reserved, &entry.name, e.to_string()));
                continue;
            }
        };
        // Taken before the listing, like the stamp of `reserved`.
        match ns_dir.own_stat() {
            Ok(st) => scan.watched.push(Watched {
                name: entry.name.clone(),
                stamp: st.into(),
            }),
            Err(e) => {
                scan.set
                    .skipped
                    .push(skip(&reserved, &entry.name, e.to_string()));
                continue;
            }
        }
        load_namespace(&ns_dir, &entry.name, clean_before, &mut scan);
    }
    scan.set.skipped.sort();
    scan
}

/// Reads one `reserved/<namespace>/` directory into `scan`.
fn load_namespace(ns_dir: &DirFd, namespace: &str, clean_before: Option<i128>, scan: &mut Scan) {
    let entries = match ns_dir.entries() {
        Ok(entries) => entries,
        Err(e) => {
            scan.set.skipped.push(skip(ns_dir, "", e.to_string()));
            return;
        }
    };
    for entry in entries {
        if remove_if_stale_temp(ns_dir, &entry.name, entry.kind, clean_before) {
            scan.removed.push(ns_dir.child_path(&entry.name));
            continue;
        }
        // Before reading, so a file still being written is seen to change afterwards.
        let before = match entry.kind {
            EntryKind::File => ns_dir.stat(&entry.name).ok().flatten(),
            _ => None,
        };
        match read_entry(ns_dir, namespace, &entry.name, entry.kind) {
            Ok(Some((key, file))) => {
                scan.set.files.insert(key, file);
            }
            Ok(None) => {}
            Err(why) => {
                if entry.name.starts_with(TEMP_PREFIX) {
                    scan.temporaries = true;
                } else if let Some(st) = before {
                    scan.watched.push(Watched {
                        name: format!("{namespace}/{}", entry.name),
                        stamp: st.into(),
                    });
                }
                scan.set.skipped.push(skip(ns_dir, &entry.name, why));
            }
        }
    }
}

/// Reads and checks `reserved/<namespace>/<name>`, with its key; `Ok(None)` if it vanished
/// meanwhile.
fn read_entry(
    ns_dir: &DirFd,
    namespace: &str,
    name: &str,
    kind: EntryKind,
) -> Result<Option<(PodKey, ReservationFile)>, String> {
    if name.starts_with(TEMP_PREFIX) {
        return Err("leftover temporary file of an interrupted write".to_owned());
    }
    validate_pod_name(name).map_err(|e| e.to_string())?;
    match kind {
        EntryKind::File => {}
        EntryKind::Dir => return Err("a directory where a reservation file should be".to_owned()),
        EntryKind::Symlink => return Err("a symbolic link (never followed)".to_owned()),
        EntryKind::Other => return Err("not a regular file".to_owned()),
    }
    let Some(bytes) = ns_dir
        .read_file(name, MAX_FILE_LEN)
        .map_err(|e| e.to_string())?
    else {
        return Ok(None);
    };
    let file = ReservationFile::from_json(&bytes).map_err(|e| e.to_string())?;
    let key = file.pod_key().map_err(|e| e.to_string())?;
    if file.namespace != namespace || file.pod != name {
        return Err(format!(
            "the file is for pod {}/{} but sits at {namespace}/{name}",
            file.namespace, file.pod
        ));
    }
    Ok(Some((key, file)))
}

/// Whether an entry of `reserved/` can be a namespace directory.
fn namespace_entry_ok(name: &str, kind: EntryKind) -> Result<(), String> {
    if name.starts_with(TEMP_PREFIX) {
        return Err("leftover temporary file of an interrupted write".to_owned());
    }
    validate_namespace(name).map_err(|e| e.to_string())?;
    match kind {
        EntryKind::Dir => Ok(()),
        EntryKind::Symlink => Err("a symbolic link (never followed)".to_owned()),
        EntryKind::File | EntryKind::Other => {
            Err("not a directory where a namespace directory should be".to_owned())
        }
    }
}

fn skip(parent: &DirFd, name: &str, reason: String) -> Skipped {
    let path = if name.is_empty() {
        parent.path().to_owned()
    } else {
        parent.child_path(name)
    };
    Skipped { path, reason }
}

/// Reads the reservation of one pod straight from its path (an O(1) lookup); `Ok(None)` if
/// there is none. Errors say why the file is unusable (the caller logs and goes on without it).
pub fn read_reservation(
    dir: &NetworkDir,
    namespace: &str,
    pod: &str,
) -> Result<Option<ReservationFile>, ReservedDirError> {
    validate_namespace(namespace).map_err(ReservedDirError::InvalidName)?;
    validate_pod_name(pod).map_err(ReservedDirError::InvalidName)?;
    let Some(ns_dir) = dir.subdir(&[RESERVED_DIR, namespace], false)? else {
        return Ok(None);
    };
    let Some(bytes) = ns_dir.read_file(pod, MAX_FILE_LEN)? else {
        return Ok(None);
    };
    let unreadable = |reason| ReservedDirError::Unreadable {
        path: ns_dir.child_path(pod),
        reason,
    };
    let file = ReservationFile::from_json(&bytes).map_err(unreadable)?;
    if file.namespace != namespace || file.pod != pod {
        return Err(unreadable(SchemaError::Json(format!(
            "the file is for pod {}/{} but sits at {namespace}/{pod}",
            file.namespace, file.pod
        ))));
    }
    Ok(Some(file))
}
