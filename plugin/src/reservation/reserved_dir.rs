//! The `reserved/` tree of a network directory: the full scan every other view is built from,
//! and the agent's writer (atomic writes, removal, a full sync that also cleans garbage).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use crate::netdir::{DirFd, EntryKind, FileStamp, NetDirError, NetworkDir, SubDir, TEMP_PREFIX};

use super::schema::{
    MAX_FILE_LEN, PodKey, ReservationFile, SchemaError, validate_namespace, validate_pod_name,
};

/// The directory below `<dataDir>/<network>/` holding one file per reservation.
pub const RESERVED_DIR: &str = "reserved";

/// The writer's change counter inside `reserved/` (a name no namespace can have).
pub const GENERATION_NAME: &str = ".generation";

/// Mode of reservation files (world-readable: they hold nothing secret, and humans read them).
const FILE_MODE: u32 = 0o644;

/// How deep the writer descends when it deletes a directory found where a file should be.
const MAX_GARBAGE_DEPTH: usize = 8;

/// Errors of reading or writing the `reserved/` tree.
#[derive(Debug, thiserror::Error)]
pub enum ReservedDirError {
    /// The reservation to write is not valid.
    #[error("failed to write reservation: {0}")]
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
        self.files.get(&PodKey {
            namespace: namespace.to_owned(),
            pod: pod.to_owned(),
        })
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

/// The identity and change times of a directory, as recorded in the index to detect changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DirStamp {
    /// Device number.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i128,
    /// Status change time, nanoseconds since the epoch.
    pub ctime_ns: i128,
}

impl From<FileStamp> for DirStamp {
    fn from(st: FileStamp) -> Self {
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
pub struct ScanStamp {
    /// `reserved` itself (whatever it is; `None`: absent).
    pub reserved: Option<DirStamp>,
    /// The generation counter (`None`: absent or unreadable, which no snapshot matches).
    pub generation: Option<u64>,
}

/// The current stamp and `reserved/` opened (when it is a directory).
pub(super) fn current_stamp_and_dir(dir: &NetworkDir) -> (ScanStamp, Option<SubDir>) {
    let reserved = match dir.stat(RESERVED_DIR) {
        Ok(Some(st)) => st,
        Ok(None) | Err(_) => return (ScanStamp::default(), None),
    };
    let sub = dir.subdir(&[RESERVED_DIR], false).ok().flatten();
    let generation = sub.as_ref().and_then(|sub| read_generation(sub));
    let stamp = ScanStamp {
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
    pub(super) stamp: DirStamp,
}

/// What a full scan found.
#[derive(Debug, Clone, Default)]
pub(super) struct Scan {
    /// The reservations and the garbage.
    pub(super) set: ReservationSet,
    /// `reserved` and the generation counter, taken before anything was listed.
    pub(super) stamp: ScanStamp,
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

fn read_generation(reserved: &DirFd) -> Option<u64> {
    let bytes = reserved.read_file(GENERATION_NAME, 64).ok()??;
    std::str::from_utf8(&bytes).ok()?.trim_end().parse().ok()
}

/// Bumps the generation counter (durably: a snapshot must never outlive a change it missed).
/// Called before every change, so a crash between the two leaves the snapshot invalid.
fn bump_generation(reserved: &DirFd) -> Result<(), NetDirError> {
    let next = read_generation(reserved).unwrap_or(0).wrapping_add(1);
    reserved.write_atomic(
        GENERATION_NAME,
        format!("{next}\n").as_bytes(),
        FILE_MODE,
        true,
    )
}

/// The full scan, with the stamp taken before anything is listed (so a change during the scan
/// makes the stamp stale, never the other way round; the caller holds the lock anyway).
pub(super) fn scan(dir: &NetworkDir) -> (ReservationSet, ScanStamp) {
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
        match ns_dir.stamp() {
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
            Ok(Some(file)) => {
                scan.set.files.insert(file.pod_key(), file);
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

/// Reads and checks `reserved/<namespace>/<name>`; `Ok(None)` if it vanished meanwhile.
fn read_entry(
    ns_dir: &DirFd,
    namespace: &str,
    name: &str,
    kind: EntryKind,
) -> Result<Option<ReservationFile>, String> {
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
    if file.namespace != namespace || file.pod != name {
        return Err(format!(
            "the file is for pod {}/{} but sits at {namespace}/{name}",
            file.namespace, file.pod
        ));
    }
    Ok(Some(file))
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

/// Opens `reserved/`, creating it; a symlink or file in its place (not something a writer of
/// ours made) is removed first — unlinking a symlink never touches its target.
fn open_reserved_for_writing(dir: &NetworkDir) -> Result<(SubDir, bool), NetDirError> {
    let created = prepare_dir_slot(dir, RESERVED_DIR)?;
    let reserved = dir.subdir(&[RESERVED_DIR], true)?;
    match reserved {
        Some(sub) => Ok((sub, created)),
        None => Err(NetDirError::NotDirectory {
            path: dir.child_path(RESERVED_DIR),
        }),
    }
}

/// Makes sure `name` in `parent` is a real directory or absent: anything else is deleted.
/// Returns whether the directory will have to be created.
fn prepare_dir_slot(parent: &DirFd, name: &str) -> Result<bool, NetDirError> {
    match parent.stat(name)? {
        None => Ok(true),
        Some(st) if st.kind == EntryKind::Dir => Ok(false),
        Some(_) => {
            parent.remove(name)?;
            Ok(true)
        }
    }
}

/// Deletes `name` in `parent` whatever it is: a file or symlink is unlinked, a directory is
/// emptied (bounded depth, never following links) and removed.
fn remove_any(parent: &DirFd, name: &str, depth: usize) -> Result<(), NetDirError> {
    match parent.stat(name)? {
        None => Ok(()),
        Some(st) if st.kind == EntryKind::Dir => {
            if depth >= MAX_GARBAGE_DEPTH {
                return Err(NetDirError::InvalidName {
                    name: parent.child_path(name).to_string_lossy().into_owned(),
                    reason: "garbage directory nested too deep to remove",
                });
            }
            if let Some(child) = parent.subdir(&[name], false)? {
                for entry in child.entries()? {
                    remove_any(&child, &entry.name, depth + 1)?;
                }
            }
            parent.remove_dir(name)?;
            Ok(())
        }
        Some(_) => parent.remove(name).map(|_| ()),
    }
}

/// One hold of the network's lock during which the writer changes `reserved/`: the generation
/// counter is bumped (durably) once, before the first change, so no snapshot taken before the
/// section can pass for one taken after it — not even after a crash in the middle. The
/// directories it changed are fsync'd once each at the end ([`Section::finish`]), before the
/// snapshot is rewritten and the lock released.
#[derive(Default)]
struct Section {
    bumped: bool,
    /// Namespace directories whose entries changed (fsync'd at the end).
    ns_changed: BTreeSet<String>,
    /// Namespace directories a file was removed from (removed at the end when empty).
    ns_emptied: BTreeSet<String>,
    /// Whether `reserved/` itself gained or lost an entry (fsync'd at the end).
    reserved_changed: bool,
    /// Whether the network directory gained `reserved/` (fsync'd at the end).
    net_changed: bool,
}

impl Section {
    fn new() -> Self {
        Self::default()
    }

    fn before_change(&mut self, reserved: &DirFd) -> Result<(), NetDirError> {
        if !self.bumped {
            bump_generation(reserved)?;
            self.bumped = true;
        }
        Ok(())
    }

    /// Removes the namespace directories left empty and fsyncs every directory that changed.
    fn finish(&mut self, dir: &NetworkDir) -> Result<(), NetDirError> {
        let reserved = match dir.subdir(&[RESERVED_DIR], false) {
            Ok(reserved) => reserved,
            Err(NetDirError::Symlink { .. } | NetDirError::NotDirectory { .. }) => None,
            Err(e) => return Err(e),
        };
        if let Some(reserved) = reserved {
            for ns in std::mem::take(&mut self.ns_changed) {
                match reserved.subdir(&[&ns], false) {
                    Ok(Some(ns_dir)) => ns_dir.sync()?,
                    Ok(None)
                    | Err(NetDirError::Symlink { .. } | NetDirError::NotDirectory { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            for ns in std::mem::take(&mut self.ns_emptied) {
                let Ok(Some(ns_dir)) = reserved.subdir(&[&ns], false) else {
                    continue;
                };
                if !ns_dir.entries()?.is_empty() {
                    continue;
                }
                match reserved.remove_dir(&ns) {
                    Ok(_) => self.reserved_changed = true,
                    // Someone wrote into it meanwhile (not under our lock): leave it.
                    Err(NetDirError::Io { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            if std::mem::take(&mut self.reserved_changed) {
                reserved.sync()?;
            }
        }
        if std::mem::take(&mut self.net_changed) {
            dir.sync()?;
        }
        Ok(())
    }
}

/// Writes (or replaces) one reservation file atomically under the network's lock: temp file in
/// `reserved/<namespace>/`, fsync, rename, fsync of the directory (and of `reserved/` and the
/// network directory when a directory had to be created), then updates the snapshot.
/// The agent must not run two writer calls for the same network at once (the lock keeps the
/// plugin out, not a second writer task: [`sync_reservations`] releases it between batches).
pub fn write_reservation(dir: &NetworkDir, file: &ReservationFile) -> Result<(), ReservedDirError> {
    let report = apply_reservations(dir, std::slice::from_ref(file), &[])?;
    match report.failed.into_iter().next() {
        Some(failure) => Err(failure.error),
        None => Ok(()),
    }
}

fn write_locked(
    dir: &NetworkDir,
    file: &ReservationFile,
    section: &mut Section,
) -> Result<(), ReservedDirError> {
    let (reserved, reserved_created) = open_reserved_for_writing(dir)?;
    section.before_change(&reserved)?;
    section.net_changed |= reserved_created;
    let ns_created = prepare_dir_slot(&reserved, &file.namespace)?;
    let Some(ns_dir) = reserved.subdir(&[&file.namespace], true)? else {
        return Err(NetDirError::NotDirectory {
            path: reserved.child_path(&file.namespace),
        }
        .into());
    };
    section.reserved_changed |= ns_created;
    section.ns_changed.insert(file.namespace.clone());
    // A directory (or anything else renameat cannot replace) squatting on the file's name.
    if let Some(st) = ns_dir.stat(&file.pod)?
        && st.kind == EntryKind::Dir
    {
        remove_any(&ns_dir, &file.pod, 0)?;
    }
    ns_dir.write_atomic_defer_dir_sync(&file.pod, &file.to_json(), FILE_MODE)?;
    Ok(())
}

/// Removes the reservation of `namespace`/`pod` (and its namespace directory once empty) under
/// the network's lock; `false` if there was none.
pub fn remove_reservation(
    dir: &NetworkDir,
    namespace: &str,
    pod: &str,
) -> Result<bool, ReservedDirError> {
    validate_namespace(namespace).map_err(ReservedDirError::InvalidName)?;
    validate_pod_name(pod).map_err(ReservedDirError::InvalidName)?;
    let key = PodKey {
        namespace: namespace.to_owned(),
        pod: pod.to_owned(),
    };
    let report = apply_reservations(dir, &[], std::slice::from_ref(&key))?;
    match report.failed.into_iter().next() {
        Some(failure) => Err(failure.error),
        None => Ok(!report.removed.is_empty()),
    }
}

fn remove_locked(
    dir: &NetworkDir,
    namespace: &str,
    pod: &str,
    section: &mut Section,
) -> Result<bool, ReservedDirError> {
    let reserved = match dir.subdir(&[RESERVED_DIR], false) {
        Ok(Some(reserved)) => reserved,
        Ok(None) => return Ok(false),
        // A symlink or file at `reserved/` holds no reservation of ours.
        Err(NetDirError::Symlink { .. } | NetDirError::NotDirectory { .. }) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    let ns_dir = match reserved.subdir(&[namespace], false) {
        Ok(Some(ns_dir)) => ns_dir,
        Ok(None) => return Ok(false),
        Err(NetDirError::Symlink { .. } | NetDirError::NotDirectory { .. }) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    if ns_dir.stat(pod)?.is_none() {
        return Ok(false);
    }
    section.before_change(&reserved)?;
    section.ns_changed.insert(namespace.to_owned());
    section.ns_emptied.insert(namespace.to_owned());
    remove_any(&ns_dir, pod, 0)?;
    Ok(true)
}

/// One write or removal [`apply_reservations`] could not do.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct ApplyFailure {
    /// The reservation concerned.
    pub key: PodKey,
    /// What failed.
    #[source]
    pub error: ReservedDirError,
}

/// What [`apply_reservations`] did.
#[derive(Debug, Default)]
pub struct ApplyReport {
    /// Files written (created or replaced).
    pub written: Vec<PodKey>,
    /// Reservation files removed (a removal of a file that was not there is in neither list).
    pub removed: Vec<PodKey>,
    /// Writes and removals that failed (invalid reservations among them, never written); the
    /// others went on.
    pub failed: Vec<ApplyFailure>,
}

/// Writes `writes` and removes the reservations `removes` in one hold of the network's lock:
/// the generation counter is bumped durably once before the first change, every file is
/// written atomically (temporary file, fsync, rename), each changed directory is fsync'd once
/// at the end, and the plugin's snapshot is patched with the changes instead of rebuilt from a
/// scan of the whole tree (it is rebuilt when it was not valid beforehand, describes garbage,
/// a step failed, or the changed directories hold anything but what the patch expects — a file
/// put there by hand). A killed writer leaves the bumped counter and the old snapshot, which the
/// plugin then does not trust. A key both written and removed is written. The cost is one lock,
/// one generation bump, one fsync per written file and one per changed directory, a listing of
/// each changed namespace directory, and the snapshot's rewrite; only failing to take the lock
/// or to update the snapshot is an error.
pub fn apply_reservations(
    dir: &NetworkDir,
    writes: &[ReservationFile],
    removes: &[PodKey],
) -> Result<ApplyReport, ReservedDirError> {
    let mut report = ApplyReport::default();
    let mut valid: BTreeMap<PodKey, &ReservationFile> = BTreeMap::new();
    for file in writes {
        match file.validate() {
            Ok(()) => {
                valid.insert(file.pod_key(), file);
            }
            Err(e) => report.failed.push(ApplyFailure {
                key: file.pod_key(),
                error: e.into(),
            }),
        }
    }
    let mut gone: BTreeSet<&PodKey> = BTreeSet::new();
    for key in removes {
        if valid.contains_key(key) {
            continue;
        }
        let checked = validate_namespace(&key.namespace)
            .and_then(|()| validate_pod_name(&key.pod))
            .map_err(ReservedDirError::InvalidName);
        match checked {
            Ok(()) => {
                gone.insert(key);
            }
            Err(error) => report.failed.push(ApplyFailure {
                key: key.clone(),
                error,
            }),
        }
    }
    if valid.is_empty() && gone.is_empty() {
        return Ok(report);
    }
    let lock = dir.lock()?;
    let base = super::index::valid_snapshot(dir);
    let mut section = Section::new();
    let mut ok = true;
    let mut written: Vec<&ReservationFile> = Vec::new();
    for (key, file) in &valid {
        match write_locked(dir, file, &mut section) {
            Ok(()) => {
                written.push(file);
                report.written.push(key.clone());
            }
            Err(error) => {
                ok = false;
                report.failed.push(ApplyFailure {
                    key: key.clone(),
                    error,
                });
            }
        }
    }
    for key in gone {
        match remove_locked(dir, &key.namespace, &key.pod, &mut section) {
            Ok(true) => report.removed.push(key.clone()),
            Ok(false) => {}
            Err(error) => {
                ok = false;
                report.failed.push(ApplyFailure {
                    key: key.clone(),
                    error,
                });
            }
        }
    }
    section.finish(dir)?;
    let base = if ok { base } else { None };
    super::index::patch(dir, &lock, base, &written, &report.removed)?;
    Ok(report)
}

/// What [`sync_reservations`] changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Files written because they were missing.
    pub created: Vec<PodKey>,
    /// Files rewritten because their content differed.
    pub updated: Vec<PodKey>,
    /// Reservation files removed because no desired reservation matches them.
    pub removed: Vec<PodKey>,
    /// Garbage deleted (paths and why each was garbage).
    pub cleaned: Vec<Skipped>,
    /// Desired reservations refused as invalid (never written).
    pub invalid: Vec<String>,
    /// Steps that failed (garbage that could not be deleted, a file that could not be written
    /// or removed); the rest of the sync went on.
    pub failed: Vec<String>,
}

/// How many files [`sync_reservations`] writes per hold of the lock: each costs an fsync, and
/// an ADD waiting for the lock should not wait for a thousand of them.
const SYNC_BATCH: usize = 64;

/// Makes `reserved/` exactly equal to `desired`: deletes garbage (symlinks, directories where
/// files belong, undecodable files, leftover temporaries), stale files and empty namespace
/// directories, then writes new and changed files in batches, each batch under one hold of the
/// network's lock (as [`apply_reservations`]: the snapshot is patched, not rebuilt). A sync
/// that finds nothing to change changes nothing (not even the generation counter, so the
/// snapshot stays valid). A step that fails is reported in [`SyncReport::failed`] and the
/// others go on; only failing to take the lock is an error.
pub fn sync_reservations(
    dir: &NetworkDir,
    desired: &[ReservationFile],
) -> Result<SyncReport, ReservedDirError> {
    let mut report = SyncReport::default();
    let mut want: BTreeMap<PodKey, &ReservationFile> = BTreeMap::new();
    for file in desired {
        match file.validate() {
            Ok(()) => {
                want.insert(file.pod_key(), file);
            }
            Err(e) => report.invalid.push(e.to_string()),
        }
    }
    let mut writes: Vec<&ReservationFile> = Vec::new();
    {
        let lock = dir.lock()?;
        let base = super::index::valid_snapshot(dir);
        let mut section = Section::new();
        let current = load_reservations(dir);
        let mut ok = true;
        // Garbage first, so a directory squatting on a wanted name is gone before the write.
        for garbage in &current.skipped {
            if let Some(reserved) = dir.subdir(&[RESERVED_DIR], false).ok().flatten() {
                section.before_change(&reserved)?;
            }
            match clean_garbage(dir, garbage) {
                Ok(true) => report.cleaned.push(garbage.clone()),
                Ok(false) => {}
                Err(e) => {
                    ok = false;
                    report.failed.push(e.to_string());
                }
            }
        }
        for key in current.files.keys() {
            if want.contains_key(key) {
                continue;
            }
            match remove_locked(dir, &key.namespace, &key.pod, &mut section) {
                Ok(true) => report.removed.push(key.clone()),
                Ok(false) => {}
                Err(e) => {
                    ok = false;
                    report.failed.push(e.to_string());
                }
            }
        }
        if let Err(e) = remove_empty_namespaces(dir, &mut section) {
            ok = false;
            report.failed.push(e.to_string());
        }
        for (key, file) in &want {
            match current.files.get(key) {
                Some(existing) if existing == *file => {}
                Some(_) => {
                    writes.push(file);
                    report.updated.push(key.clone());
                }
                None => {
                    writes.push(file);
                    report.created.push(key.clone());
                }
            }
        }
        section.finish(dir)?;
        // Garbage was cleaned: the snapshot described it, so `patch` rebuilds it.
        let base = if ok { base } else { None };
        super::index::patch(dir, &lock, base, &[], &report.removed)?;
    }
    for batch in writes.chunks(SYNC_BATCH) {
        let lock = dir.lock()?;
        let base = super::index::valid_snapshot(dir);
        let mut section = Section::new();
        let mut written: Vec<&ReservationFile> = Vec::new();
        for file in batch {
            match write_locked(dir, file, &mut section) {
                Ok(()) => written.push(file),
                Err(e) => {
                    report.failed.push(e.to_string());
                    let key = file.pod_key();
                    report.created.retain(|k| *k != key);
                    report.updated.retain(|k| *k != key);
                }
            }
        }
        section.finish(dir)?;
        let base = if written.len() == batch.len() {
            base
        } else {
            None
        };
        super::index::patch(dir, &lock, base, &written, &[])?;
    }
    Ok(report)
}

/// Deletes one skipped entry if it lies inside `reserved/` (or is `reserved` itself when that is
/// not a directory). Returns whether something was deleted.
fn clean_garbage(dir: &NetworkDir, garbage: &Skipped) -> Result<bool, NetDirError> {
    let reserved_path = dir.child_path(RESERVED_DIR);
    let Ok(rel) = garbage.path.strip_prefix(&reserved_path) else {
        return Ok(false);
    };
    let parts: Vec<&str> = rel
        .components()
        .filter_map(|c| match c {
            std::path::Component::Normal(s) => s.to_str(),
            _ => None,
        })
        .collect();
    match parts.as_slice() {
        [] => {
            // `reserved` itself is a symlink or a file: replace it later with a directory.
            match dir.stat(RESERVED_DIR)? {
                Some(st) if st.kind != EntryKind::Dir => Ok(dir.remove(RESERVED_DIR)?),
                _ => Ok(false),
            }
        }
        [name] => match dir.subdir(&[RESERVED_DIR], false)? {
            // A well-named namespace directory is only ever reported because listing it failed
            // (a passing I/O error): deleting it would drop valid reservations until a later batch
            // writes them again, a window in which an ADD could hand their addresses out.
            Some(reserved)
                if validate_namespace(name).is_ok()
                    && reserved
                        .stat(name)?
                        .is_some_and(|st| st.kind == EntryKind::Dir) =>
            {
                Ok(false)
            }
            Some(reserved) => {
                remove_any(&reserved, name, 0)?;
                Ok(true)
            }
            None => Ok(false),
        },
        [ns, name] => match dir.subdir(&[RESERVED_DIR, ns], false) {
            Ok(Some(ns_dir)) => {
                remove_any(&ns_dir, name, 0)?;
                Ok(true)
            }
            Ok(None) | Err(NetDirError::Symlink { .. } | NetDirError::NotDirectory { .. }) => {
                Ok(false)
            }
            Err(e) => Err(e),
        },
        _ => Ok(false),
    }
}

fn remove_empty_namespaces(dir: &NetworkDir, section: &mut Section) -> Result<(), NetDirError> {
    let Some(reserved) = dir.subdir(&[RESERVED_DIR], false)? else {
        return Ok(());
    };
    for entry in reserved.entries()? {
        if entry.kind != EntryKind::Dir {
            continue;
        }
        if let Some(ns_dir) = reserved.subdir(&[&entry.name], false)?
            && ns_dir.entries()?.is_empty()
        {
            section.before_change(&reserved)?;
            reserved.remove_dir(&entry.name)?;
            section.reserved_changed = true;
        }
    }
    Ok(())
}
