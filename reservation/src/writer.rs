//! The write side of the `reserved/` tree: the only code that changes reservation files.
//!
//! [`ReservationWriter::apply`] makes a network's `reserved/` equal to a desired set of files: it
//! takes only files that passed validation ([`ValidReservation`]), computes the diff (against the
//! tree it reads under the lock when it knows nothing, else against what its last call left), and
//! carries the changes out in batches of at most [`WRITE_BATCH`] writes and [`WRITE_BATCH`]
//! removals, each batch one hold of the network's lock. In every hold the generation counter is
//! bumped durably before the first change, every file is written atomically (temporary file,
//! fsync, rename), each changed directory is fsync'd once at the end, and the plugin's snapshot is
//! patched with the changes instead of rebuilt from a scan (it is rebuilt when it was not valid
//! beforehand, describes garbage, a step failed, or a changed directory holds anything but what
//! the patch expects — a file put there by hand). A writer killed in the middle leaves the bumped
//! counter and the old snapshot, which the plugin then does not trust. A call that finds nothing
//! to change changes nothing, not even the counter, so the snapshot stays valid.
//!
//! [`write_reservation`] and [`remove_reservation`] are the same batch for one file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use ipkeep_netdir::{DirFd, EntryKind, NetDirError, NetworkDir, SubDir};

use super::scan::{
    GENERATION_NAME, RESERVED_DIR, ReservedDirError, Skipped, load_reservations, read_generation,
};
use super::schema::{PodKey, ReservationFile, ValidReservation, validate_namespace};
use super::snapshot;

/// How many writes (and, separately, how many removals) one hold of the network's lock carries:
/// each write costs an fsync, and an ADD waiting for the lock should not wait for hundreds.
pub const WRITE_BATCH: usize = 64;

/// Mode of reservation files (world-readable: they hold nothing secret, and humans read them).
const FILE_MODE: u32 = 0o644;

/// How deep the writer descends when it deletes a directory found where a file should be.
const MAX_GARBAGE_DEPTH: usize = 8;

/// What a step that failed was doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Writing the file of this reservation.
    Write(PodKey),
    /// Removing the file of this reservation.
    Remove(PodKey),
    /// Deleting an entry of `reserved/` that is no reservation.
    Clean(PathBuf),
    /// Removing the namespace directories left without files.
    RemoveEmptyNamespaces,
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Write(key) => write!(f, "write reservation file {key}"),
            Self::Remove(key) => write!(f, "remove reservation file {key}"),
            Self::Clean(path) => write!(f, "delete garbage {}", path.display()),
            Self::RemoveEmptyNamespaces => f.write_str("remove empty namespace directories"),
        }
    }
}

/// A step of [`ReservationWriter::apply`] that failed; the other steps went on.
#[derive(Debug, thiserror::Error)]
#[error("failed to {step}")]
pub struct StepFailure {
    /// What was being done.
    pub step: Step,
    /// Why it failed.
    #[source]
    pub error: ReservedDirError,
}

/// What one [`ReservationWriter::apply`] did.
#[derive(Debug, Default)]
pub struct ApplyReport {
    /// Files written (created, or rewritten because their content differed), in batch order.
    pub written: Vec<PodKey>,
    /// Reservation files removed because no desired file matches them.
    pub removed: Vec<PodKey>,
    /// Desired files already on disk as wanted (not touched).
    pub unchanged: usize,
    /// Garbage deleted from `reserved/` (leftover temporaries, symlinks, directories where files
    /// belong, undecodable files), with why each was garbage.
    pub cleaned: Vec<Skipped>,
    /// Steps that failed (the writer then forgets what it knew: its next call reads the tree).
    pub failed: Vec<StepFailure>,
}

impl ApplyReport {
    /// Whether the call changed nothing on disk.
    pub fn changed_nothing(&self) -> bool {
        self.written.is_empty() && self.removed.is_empty() && self.cleaned.is_empty()
    }

    /// Whether every step succeeded.
    pub fn is_complete(&self) -> bool {
        self.failed.is_empty()
    }
}

/// Keeps one network directory's `reserved/` equal to a desired set of files, remembering
/// between calls what it left on disk so that a steady-state call reads nothing and touches
/// only the files that change. It must be the only writer of the tree while it remembers (the
/// network's lock keeps the plugin out, not a second writer: the lock is released between
/// batches); [`ReservationWriter::forget`] makes the next call read the tree again.
#[derive(Debug, Default)]
pub struct ReservationWriter {
    /// The files on disk as the last call left them; `None`: read the tree first.
    known: Option<BTreeMap<PodKey, ReservationFile>>,
}

impl ReservationWriter {
    /// A writer that knows nothing yet: its first call reads the tree.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets what is on disk, so the next call reads the tree and also deletes garbage (a
    /// full resync).
    pub fn forget(&mut self) {
        self.known = None;
    }

    /// The files on disk as the last call left them, or `None` when the next call reads the tree
    /// (the agent judges the files whose reservation is gone from it, before a pass).
    pub fn known(&self) -> Option<&BTreeMap<PodKey, ReservationFile>> {
        self.known.as_ref()
    }

    /// Makes `reserved/` in `dir` exactly the `desired` files (see the module docs; of two
    /// desired files for one pod the last wins). When the writer knows nothing it first reads
    /// the tree under the lock and deletes, in that same hold, the garbage, the files no desired
    /// file matches and the empty namespace directories. Failed steps are in
    /// the report and the rest goes on; only failing to take the lock, to sync a directory or
    /// to update the snapshot ends the call early, as an error.
    pub fn apply<'a>(
        &mut self,
        dir: &NetworkDir,
        desired: impl IntoIterator<Item = &'a ValidReservation>,
    ) -> Result<ApplyReport, ReservedDirError> {
        let mut report = ApplyReport::default();
        let want: BTreeMap<PodKey, &ValidReservation> =
            desired.into_iter().map(|file| (file.key(), file)).collect();
        let (mut on_disk, removes) = match self.known.take() {
            Some(known) => {
                let stale = known
                    .keys()
                    .filter(|key| !want.contains_key(*key))
                    .cloned()
                    .collect();
                (known, stale)
            }
            None => (read_and_prune(dir, &want, &mut report)?, Vec::new()),
        };
        let mut writes: Vec<&ValidReservation> = Vec::new();
        for (key, file) in &want {
            match on_disk.get(key) {
                Some(existing) if existing == &***file => report.unchanged += 1,
                _ => writes.push(file),
            }
        }
        let mut write_batches = writes.chunks(WRITE_BATCH);
        let mut remove_batches = removes.chunks(WRITE_BATCH);
        loop {
            let (w, r) = match (write_batches.next(), remove_batches.next()) {
                (None, None) => break,
                (w, r) => (w.unwrap_or_default(), r.unwrap_or_default()),
            };
            run_batch(dir, w, r, &mut report, &mut on_disk)?;
        }
        if report.failed.is_empty() {
            self.known = Some(on_disk);
        }
        Ok(report)
    }
}

/// The first hold of the lock of a writer that knows nothing: reads the tree, deletes its
/// garbage first (so a directory squatting on a wanted name is gone before the write), then the
/// files no desired file matches and the empty namespace directories; returns the files left.
fn read_and_prune(
    dir: &NetworkDir,
    want: &BTreeMap<PodKey, &ValidReservation>,
    report: &mut ApplyReport,
) -> Result<BTreeMap<PodKey, ReservationFile>, ReservedDirError> {
    let lock = dir.lock()?;
    let base = snapshot::valid_snapshot(dir);
    let mut section = Section::new();
    let mut current = load_reservations(dir);
    let mut ok = true;
    for garbage in &current.skipped {
        if let Some(reserved) = dir.subdir(&[RESERVED_DIR], false).ok().flatten() {
            section.before_change(&reserved)?;
        }
        match clean_garbage(dir, garbage) {
            Ok(true) => report.cleaned.push(garbage.clone()),
            Ok(false) => {}
            Err(error) => {
                ok = false;
                report.failed.push(StepFailure {
                    step: Step::Clean(garbage.path.clone()),
                    error: error.into(),
                });
            }
        }
    }
    let stale: Vec<PodKey> = current
        .files
        .keys()
        .filter(|key| !want.contains_key(*key))
        .cloned()
        .collect();
    let mut removed = Vec::new();
    for key in stale {
        match remove_locked(dir, key.namespace(), key.name(), &mut section) {
            Ok(gone) => {
                current.files.remove(&key);
                if gone {
                    removed.push(key);
                }
            }
            Err(error) => {
                ok = false;
                report.failed.push(StepFailure {
                    step: Step::Remove(key),
                    error,
                });
            }
        }
    }
    if let Err(error) = remove_empty_namespaces(dir, &mut section) {
        ok = false;
        report.failed.push(StepFailure {
            step: Step::RemoveEmptyNamespaces,
            error: error.into(),
        });
    }
    section.finish(dir)?;
    // Garbage was cleaned: the snapshot described it, so `patch` rebuilds it.
    snapshot::patch(dir, &lock, base.filter(|_| ok), &[], &removed)?;
    report.removed.extend(removed);
    Ok(current.files)
}

/// One hold of the network's lock: `writes` written, `removes` removed (one section, one
/// generation bump), the snapshot patched; `on_disk` follows what succeeded.
fn run_batch(
    dir: &NetworkDir,
    writes: &[&ValidReservation],
    removes: &[PodKey],
    report: &mut ApplyReport,
    on_disk: &mut BTreeMap<PodKey, ReservationFile>,
) -> Result<(), ReservedDirError> {
    let lock = dir.lock()?;
    let base = snapshot::valid_snapshot(dir);
    let mut section = Section::new();
    let mut ok = true;
    let mut written: Vec<&ValidReservation> = Vec::with_capacity(writes.len());
    for file in writes {
        match write_locked(dir, file, &mut section) {
            Ok(()) => written.push(*file),
            Err(error) => {
                ok = false;
                report.failed.push(StepFailure {
                    step: Step::Write(file.key()),
                    error,
                });
            }
        }
    }
    let mut removed: Vec<PodKey> = Vec::new();
    for key in removes {
        match remove_locked(dir, key.namespace(), key.name(), &mut section) {
            Ok(gone) => {
                on_disk.remove(key);
                if gone {
                    removed.push(key.clone());
                }
            }
            Err(error) => {
                ok = false;
                report.failed.push(StepFailure {
                    step: Step::Remove(key.clone()),
                    error,
                });
            }
        }
    }
    section.finish(dir)?;
    let written_files: Vec<&ReservationFile> = written.iter().map(|file| &***file).collect();
    snapshot::patch(dir, &lock, base.filter(|_| ok), &written_files, &removed)?;
    for file in written {
        report.written.push(file.key());
        on_disk.insert(file.key(), ReservationFile::clone(file));
    }
    report.removed.extend(removed);
    Ok(())
}

/// Writes (or replaces) one reservation file atomically under the network's lock: temp file in
/// `reserved/<namespace>/`, fsync, rename, fsync of the directory (and of `reserved/` and the
/// network directory when a directory had to be created), then updates the snapshot.
/// Like [`ReservationWriter::apply`], it must not run at the same time as another writer call
/// for the same network.
pub fn write_reservation(
    dir: &NetworkDir,
    file: &ValidReservation,
) -> Result<(), ReservedDirError> {
    let mut report = ApplyReport::default();
    // A one-off batch: what it leaves on disk is not remembered.
    run_batch(dir, &[file], &[], &mut report, &mut BTreeMap::new())?;
    match report.failed.into_iter().next() {
        Some(failure) => Err(failure.error),
        None => Ok(()),
    }
}

/// Removes the reservation of `namespace`/`pod` (and its namespace directory once empty) under
/// the network's lock; `false` if there was none.
pub fn remove_reservation(
    dir: &NetworkDir,
    namespace: &str,
    pod: &str,
) -> Result<bool, ReservedDirError> {
    let key = PodKey::new(namespace, pod).map_err(ReservedDirError::InvalidName)?;
    let mut report = ApplyReport::default();
    run_batch(dir, &[], &[key], &mut report, &mut BTreeMap::new())?;
    match report.failed.into_iter().next() {
        Some(failure) => Err(failure.error),
        None => Ok(!report.removed.is_empty()),
    }
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

/// Removes the file of `namespace`/`pod` under the held lock (its namespace directory goes at
/// the section's end once empty); `false` if there was none.
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
