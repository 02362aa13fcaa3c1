//! The compiled snapshot of `reserved/` that lets an ADD answer "is this address another pod's?"
//! without reading every reservation file.
//!
//! Measured on the 2-core CI machine while designing it (release build, warm cache): a full
//! scan of 1 000 reservation files costs about 9 ms (20 ms when spread over 1 000 namespaces)
//! and a JSON snapshot of them still 1.2 ms to decode, while an exec of `/bin/true` costs about
//! 0.8 ms: either would more than double an ADD. So the snapshot is a flat binary table sorted
//! by address, checked once and then binary-searched in place: about 90 µs for 1 000
//! reservations (2 000 addresses) including the lock, the validity check and five lookups.
//!
//! `<net>/.ipkeep/reserved.index` holds one 40-byte record per reserved address (address,
//! release time, owner), the owners' `namespace/pod` names, the skipped garbage (JSON, decoded
//! only on demand), and the stamps it was built from: the `lstat` of `reserved`, the writer's
//! generation counter `reserved/.generation` (absent in a tree built by hand), and the `lstat` of
//! every namespace directory and of every skipped file. A reader holding the lock trusts the
//! snapshot iff all of them still match; otherwise it rescans and rewrites it. So a file put into
//! `reserved/<namespace>/` by hand (which changes that directory) or a half-copied file that
//! is completed later (which changes the file) is seen at the next ADD, at the cost of one
//! `lstat` per namespace directory. The writer still bumps the counter durably *before* every
//! change and rewrites the snapshot after it: its own changes never depend on timestamps.
//! The snapshot lives outside `reserved/` so that writing it does not change what it records,
//! and is only a cache: written temp + rename without fsync; missing, torn or foreign content
//! means a rescan (content that is not a snapshot at all is reported and removed).
//!
//! A writer killed between its temporary file and the rename leaves a `.ipkeep-tmp-*` in
//! `reserved/` or a namespace directory. The writer creates temporaries only while it holds the
//! network's lock, so under the lock such a file belongs to a dead writer: the plugin's rescan
//! removes those last changed more than [`STALE_TEMP_AGE`] ago (the age guards against a writer
//! that does not take the lock), and a snapshot that still lists a younger one is not trusted,
//! so the next ADD looks again.
//!
//! Residual risk: a file rewritten in place by hand (same inode, `cat > file`) changes neither
//! its directory nor a watched stamp and is seen only at the next change of either; likewise a
//! file renamed by hand over an existing reservation (no new name) in a namespace directory the
//! writer changes, during the writer's batch (its patch lists names, it does not read the files it
//! did not write): seen at the next rescan (the agent's periodic resync rewrites it anyway); and, as for
//! the network directory, on kernels before 6.13 a change in the same timestamp tick as the scan
//! can go unnoticed until the next one.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use crate::private_state::PRIVATE_DIR;
use ipkeep_netdir::{EntryKind, NetDirError, NetworkDir, NetworkLock};

use super::decision::ReservationLookup;
use super::scan::{
    GENERATION_NAME, RESERVED_DIR, ReservationSet, Scan, Skipped, SnapshotDirStamp, SnapshotStamp,
    Watched, current_stamp_and_dir, scan_full,
};
use super::schema::{PodKey, ReservationFile};
use super::timestamp::Timestamp;
use crate::private_state;

/// The snapshot's file name inside [`PRIVATE_DIR`].
pub const SNAPSHOT_NAME: &str = "reserved.index";

/// Start of the file; another value (an older layout, zeros after a crash) means "rebuild".
const MAGIC: &[u8; 8] = b"IPKSNAP2";
/// What every layout of the snapshot starts with (anything else is not ipkeep's).
const MAGIC_FAMILY: &[u8] = b"IPKSNAP";
/// How old a writer's temporary in `reserved/` must be before an ADD removes it.
pub const STALE_TEMP_AGE: std::time::Duration = std::time::Duration::from_secs(5);
/// Bytes of a watched entry besides its name: name length, dev, ino, mtime, ctime.
const WATCH_FIXED_LEN: usize = 2 + 8 + 8 + 16 + 16;
/// End of the file, so a truncated file is never taken for a complete one.
const TRAILER: &[u8; 8] = b"IPKSEND1";
const HEADER_LEN: usize = 96;
const RECORD_LEN: usize = 40;
/// Largest snapshot read (about 60 bytes per reserved address).
const MAX_SNAPSHOT_LEN: usize = 256 * 1024 * 1024;

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

/// The reserved addresses of a network, as stored in the snapshot file.
#[derive(Clone, PartialEq, Eq)]
pub struct ReservationSnapshot {
    bytes: Vec<u8>,
    count: usize,
    owners_at: usize,
    owners_len: usize,
    skipped_at: usize,
    skipped_len: usize,
    watch_at: usize,
    watch_len: usize,
}

impl std::fmt::Debug for ReservationSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReservationSnapshot")
            .field("addresses", &self.count)
            .field("bytes", &self.bytes.len())
            .finish_non_exhaustive()
    }
}

/// The reservations of a network as an ADD needs them: from the snapshot when it is valid, else
/// from a full scan (after which the snapshot is rewritten). Needs the network's lock (the
/// snapshot must describe the tree as no writer is changing it). Never fails: a snapshot that
/// cannot be read or written only costs the scan. Same as [`load_reservations_at`] without
/// removing killed writers' temporaries or reporting damage.
pub fn load_reservations_cached(
    dir: &NetworkDir,
    lock: &NetworkLock<'_>,
) -> (ReservationSnapshot, Source) {
    load(dir, lock, None, &mut Vec::new())
}

/// [`load_reservations_cached`] for a plugin command at `now`: a rescan also removes the
/// temporaries of killed writers older than [`STALE_TEMP_AGE`], and a snapshot file that ipkeep
/// did not write (a directory, a FIFO, garbage) is removed and rebuilt; `found` gets one line
/// for each such thing.
pub fn load_reservations_at(
    dir: &NetworkDir,
    lock: &NetworkLock<'_>,
    now: Timestamp,
    found: &mut Vec<String>,
) -> (ReservationSnapshot, Source) {
    let now_ns = i128::from(now.unix_secs()) * 1_000_000_000 + i128::from(now.subsec_nanos());
    let before = now_ns - i128::from(STALE_TEMP_AGE.as_secs()) * 1_000_000_000;
    load(dir, lock, Some(before), found)
}

fn load(
    dir: &NetworkDir,
    _lock: &NetworkLock<'_>,
    clean_before: Option<i128>,
    found: &mut Vec<String>,
) -> (ReservationSnapshot, Source) {
    if let Ok(None) = dir.stat(RESERVED_DIR) {
        let empty =
            ReservationSnapshot::encode(&ReservationSet::default(), &SnapshotStamp::default());
        return (empty, Source::NoReservations);
    }
    if let Some(snapshot) = read_valid(dir, found) {
        return (snapshot, Source::Index);
    }
    let mut scan = scan_full(dir, clean_before);
    if !scan.removed.is_empty() {
        for path in &scan.removed {
            found.push(format!(
                "removed {}: a temporary file left by a killed reservation writer",
                private_state::escape_control(&path.to_string_lossy())
            ));
        }
        // The removals changed the directories the scan had stamped.
        scan = scan_full(dir, clean_before);
    }
    let snapshot = ReservationSnapshot::encode_scan(&scan);
    // A snapshot that cannot be written only means the next ADD scans too.
    let _ = write(dir, &snapshot, found);
    (snapshot, Source::Rescanned)
}

/// Rewrites the snapshot if it is stale (the writer calls this after each change).
pub(super) fn refresh(dir: &NetworkDir, _lock: &NetworkLock<'_>) -> Result<(), NetDirError> {
    if dir.stat(RESERVED_DIR)?.is_none() {
        // Nothing to describe; a leftover snapshot would be ignored anyway.
        if let Some(private) = dir.subdir(&[PRIVATE_DIR], false)? {
            private.remove_tree(SNAPSHOT_NAME, 16)?;
        }
        return Ok(());
    }
    let mut found = Vec::new();
    if read_valid(dir, &mut found).is_some() {
        return Ok(());
    }
    let scan = scan_full(dir, None);
    write(dir, &ReservationSnapshot::encode_scan(&scan), &mut found)
}

/// The snapshot, if it is valid now: what the writer reads before its first change so that it
/// can patch it afterwards ([`patch`]). Needs the network's lock.
pub(super) fn valid_snapshot(dir: &NetworkDir) -> Option<ReservationSnapshot> {
    read_valid(dir, &mut Vec::new())
}

/// Rewrites the snapshot after the writer's changes: `base` (valid before the first change, or
/// `None`) patched with the files `written` and the reservations `removed`, when the tree is
/// exactly what that predicts; otherwise rebuilt from a full scan ([`refresh`]).
///
/// The patch trusts the records of pods it did not touch (the base snapshot was valid under
/// the lock, and every other namespace directory keeps its recorded stamp, so a later change
/// there still invalidates the result) and checks the rest against the tree: the stamp of
/// `reserved` and the generation counter are taken first, then `reserved/` is listed and must
/// hold exactly the counter and the expected namespace directories; each changed namespace
/// directory is stamped, then listed, and must hold exactly the expected files. A file or
/// directory added by hand before a stamp is seen in a listing (a mismatch: full scan), one
/// added after it changes the stamp (the next reader rescans). A base snapshot describing
/// garbage or a writer's temporary is never patched.
pub(super) fn patch(
    dir: &NetworkDir,
    lock: &NetworkLock<'_>,
    base: Option<ReservationSnapshot>,
    written: &[&ReservationFile],
    removed: &[PodKey],
) -> Result<(), NetDirError> {
    match base.and_then(|base| patched(dir, &base, written, removed)) {
        Some(snapshot) => write(dir, &snapshot, &mut Vec::new()),
        None => refresh(dir, lock),
    }
}

fn patched(
    dir: &NetworkDir,
    base: &ReservationSnapshot,
    written: &[&ReservationFile],
    removed: &[PodKey],
) -> Option<ReservationSnapshot> {
    if base.has_temporaries() || base.skipped_bytes()? != b"[]" {
        return None;
    }
    let mut changed: HashSet<(&str, &str)> = HashSet::new();
    let mut touched: BTreeSet<&str> = BTreeSet::new();
    for file in written {
        changed.insert((&file.namespace, &file.pod));
        touched.insert(&file.namespace);
    }
    for key in removed {
        changed.insert((key.namespace(), key.name()));
        touched.insert(key.namespace());
    }
    if changed.is_empty() {
        return None;
    }
    // The records of untouched pods, and the files expected in each changed directory.
    let mut expected: BTreeMap<&str, HashSet<&str>> = BTreeMap::new();
    let mut owners = String::new();
    let mut owner_at: HashMap<&str, (usize, usize)> = HashMap::new();
    let mut records: Vec<RecordParts> = Vec::with_capacity(base.count);
    for i in 0..base.count {
        let record = base.record(i)?;
        let owner = base.owner(&record)?;
        let (namespace, pod) = owner.split_once('/')?;
        if changed.contains(&(namespace, pod)) {
            continue;
        }
        if touched.contains(namespace) {
            expected.entry(namespace).or_default().insert(pod);
        }
        let at = *owner_at.entry(owner).or_insert_with(|| {
            let at = owners.len();
            owners.push_str(owner);
            (at, owner.len())
        });
        records.push((record.key, record.release, at.0, at.1));
    }
    for file in written {
        expected
            .entry(&file.namespace)
            .or_default()
            .insert(&file.pod);
        push_file(file, &mut owners, &mut records);
    }
    // Same order as a full scan's: by address, then by owner (the first owner of an address
    // held twice is the one a lookup names).
    let owner_of = |r: &RecordParts| {
        owners
            .get(r.2..r.2 + r.3)
            .and_then(|o| o.split_once('/'))
            .unwrap_or_default()
    };
    records.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| owner_of(a).cmp(&owner_of(b))));

    let recorded: HashMap<&str, SnapshotDirStamp> = base.watched().collect();
    if recorded.keys().any(|name| name.contains('/')) {
        return None;
    }
    let (stamp, reserved) = current_stamp_and_dir(dir);
    stamp.generation?;
    let reserved = reserved?;
    let mut listed: HashSet<String> = HashSet::new();
    for entry in reserved.entries().ok()? {
        if entry.name == GENERATION_NAME {
            continue;
        }
        if entry.kind != EntryKind::Dir {
            return None;
        }
        listed.insert(entry.name);
    }
    let mut watched = Vec::with_capacity(listed.len());
    for name in &listed {
        if !touched.contains(name.as_str()) {
            // Untouched: it must be one the base knew, and keeps the stamp recorded then.
            let stamp = *recorded.get(name.as_str())?;
            watched.push(Watched {
                name: name.clone(),
                stamp,
            });
            continue;
        }
        let ns_dir = reserved.subdir(&[name], false).ok()??;
        let stamp = ns_dir.own_stat().ok()?;
        let want = expected.get(name.as_str());
        let entries = ns_dir.entries().ok()?;
        if entries.len() != want.map_or(0, HashSet::len) {
            return None;
        }
        for entry in entries {
            if entry.kind != EntryKind::File || !want?.contains(entry.name.as_str()) {
                return None;
            }
        }
        watched.push(Watched {
            name: name.clone(),
            stamp: stamp.into(),
        });
    }
    // Every directory the base knew (and not emptied by the writer) must still be there.
    for name in recorded.keys() {
        if !listed.contains(*name) && !touched.contains(name) {
            return None;
        }
    }
    for (name, pods) in &expected {
        if !pods.is_empty() && !listed.contains(*name) {
            return None;
        }
    }
    Some(ReservationSnapshot::encode_records(
        records,
        &owners,
        base.skipped_bytes()?,
        &stamp,
        &watched,
        false,
    ))
}

/// The snapshot if it exists, is well-formed, and every stamp it recorded matches the tree.
/// A file that is not a snapshot ipkeep wrote is removed (and `found` says what it was).
fn read_valid(dir: &NetworkDir, found: &mut Vec<String>) -> Option<ReservationSnapshot> {
    let private = dir.subdir(&[PRIVATE_DIR], false).ok()??;
    let bytes =
        private_state::read_file(&private, SNAPSHOT_NAME, MAX_SNAPSHOT_LEN, found).ok()??;
    if !bytes.starts_with(MAGIC_FAMILY) {
        private_state::discard(
            &private,
            SNAPSHOT_NAME,
            if bytes.is_empty() {
                "an empty file"
            } else {
                "content that is not a reservation snapshot"
            },
            found,
        );
        return None;
    }
    // An older layout, or a stale snapshot: rescanned and rewritten without a word.
    let snapshot = ReservationSnapshot::decode(bytes)?;
    if snapshot.has_temporaries() {
        // Rescan, so that they are removed once old enough.
        return None;
    }
    let (current, reserved) = current_stamp_and_dir(dir);
    if snapshot.stamp() != current {
        return None;
    }
    let reserved = reserved?;
    snapshot.watched_unchanged(&reserved).then_some(snapshot)
}

fn write(
    dir: &NetworkDir,
    snapshot: &ReservationSnapshot,
    found: &mut Vec<String>,
) -> Result<(), NetDirError> {
    let Some(private) = private_state::open_dir(dir, PRIVATE_DIR, true, found)? else {
        return Ok(());
    };
    // `rename` cannot replace a directory: whatever is not a file goes first.
    if let private_state::Found::Damaged(what) =
        private_state::inspect_file(&private, SNAPSHOT_NAME, MAX_SNAPSHOT_LEN)?
    {
        private_state::discard(&private, SNAPSHOT_NAME, &what, found);
    }
    private.write_atomic(
        SNAPSHOT_NAME,
        &snapshot.bytes,
        private_state::FILE_MODE,
        false,
    )
}

fn stamp_bytes(stamp: &SnapshotDirStamp) -> [u8; 48] {
    let mut out = [0; 48];
    out[..8].copy_from_slice(&stamp.dev.to_le_bytes());
    out[8..16].copy_from_slice(&stamp.ino.to_le_bytes());
    out[16..32].copy_from_slice(&stamp.mtime_ns.to_le_bytes());
    out[32..].copy_from_slice(&stamp.ctime_ns.to_le_bytes());
    out
}

/// Fixed-size little-endian field at `at`, `None` when out of bounds.
fn field<const N: usize>(bytes: &[u8], at: usize) -> Option<[u8; N]> {
    bytes.get(at..at.checked_add(N)?)?.try_into().ok()
}

fn u32_at(bytes: &[u8], at: usize) -> Option<usize> {
    usize::try_from(u32::from_le_bytes(field(bytes, at)?)).ok()
}

/// Addresses sort as 128-bit numbers, IPv4 as IPv4-mapped IPv6.
fn key_of(ip: IpAddr) -> u128 {
    match ip.to_canonical() {
        IpAddr::V4(v4) => u128::from(v4.to_ipv6_mapped()),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// Appends `file`'s owner (`namespace/pod`) to `owners` and one record per address of it.
fn push_file(file: &ReservationFile, owners: &mut String, records: &mut Vec<RecordParts>) {
    let at = owners.len();
    owners.push_str(&file.namespace);
    owners.push('/');
    owners.push_str(&file.pod);
    for ip in &file.ips {
        records.push((key_of(*ip), file.release_time, at, owners.len() - at));
    }
}

fn len_u32(len: usize) -> [u8; 4] {
    u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes()
}

impl ReservationSnapshot {
    /// Builds the snapshot of `set` taken at `stamp` (watching nothing below `reserved/`).
    pub(super) fn encode(set: &ReservationSet, stamp: &SnapshotStamp) -> Self {
        Self::encode_parts(set, stamp, &[], false)
    }

    /// Builds the snapshot of a full scan.
    pub(super) fn encode_scan(scan: &Scan) -> Self {
        Self::encode_parts(&scan.set, &scan.stamp, &scan.watched, scan.temporaries)
    }

    fn encode_parts(
        set: &ReservationSet,
        stamp: &SnapshotStamp,
        watched: &[Watched],
        temporaries: bool,
    ) -> Self {
        let mut owners = String::new();
        let mut records: Vec<RecordParts> = Vec::new();
        for file in set.files.values() {
            push_file(file, &mut owners, &mut records);
        }
        records.sort_by_key(|r| r.0);
        let skipped = serde_json::to_vec(&set.skipped).unwrap_or_else(|_| b"[]".to_vec());
        Self::encode_records(records, &owners, &skipped, stamp, watched, temporaries)
    }

    /// Builds the snapshot from its parts; `records` sorted by address.
    fn encode_records(
        records: Vec<RecordParts>,
        owners: &str,
        skipped: &[u8],
        stamp: &SnapshotStamp,
        watched: &[Watched],
        temporaries: bool,
    ) -> Self {
        let mut watch = Vec::new();
        for entry in watched {
            // Names below `reserved/` are at most a namespace and a file name (< 64 KiB).
            let Ok(len) = u16::try_from(entry.name.len()) else {
                continue;
            };
            watch.extend_from_slice(&len.to_le_bytes());
            watch.extend_from_slice(entry.name.as_bytes());
            watch.extend_from_slice(&stamp_bytes(&entry.stamp));
        }

        let mut bytes = Vec::with_capacity(
            HEADER_LEN
                + records.len() * RECORD_LEN
                + owners.len()
                + skipped.len()
                + watch.len()
                + TRAILER.len(),
        );
        bytes.extend_from_slice(MAGIC);
        bytes.push(u8::from(stamp.generation.is_some()));
        bytes.push(u8::from(temporaries));
        bytes.extend_from_slice(&[0; 6]);
        bytes.extend_from_slice(&stamp.generation.unwrap_or(0).to_le_bytes());
        bytes.push(u8::from(stamp.reserved.is_some()));
        bytes.extend_from_slice(&[0; 7]);
        let dir = stamp.reserved.unwrap_or(SnapshotDirStamp {
            dev: 0,
            ino: 0,
            mtime_ns: 0,
            ctime_ns: 0,
        });
        bytes.extend_from_slice(&dir.dev.to_le_bytes());
        bytes.extend_from_slice(&dir.ino.to_le_bytes());
        bytes.extend_from_slice(&dir.mtime_ns.to_le_bytes());
        bytes.extend_from_slice(&dir.ctime_ns.to_le_bytes());
        bytes.extend_from_slice(&len_u32(records.len()));
        bytes.extend_from_slice(&len_u32(owners.len()));
        bytes.extend_from_slice(&len_u32(skipped.len()));
        bytes.extend_from_slice(&len_u32(watch.len()));
        for (key, release, owner_at, owner_len) in &records {
            bytes.extend_from_slice(&key.to_le_bytes());
            let (secs, nanos) = release.map_or((0, 0), |t| (t.unix_secs(), t.subsec_nanos()));
            bytes.extend_from_slice(&secs.to_le_bytes());
            bytes.extend_from_slice(&nanos.to_le_bytes());
            bytes.extend_from_slice(&u32::from(release.is_some()).to_le_bytes());
            bytes.extend_from_slice(&len_u32(*owner_at));
            bytes.extend_from_slice(&len_u32(*owner_len));
        }
        bytes.extend_from_slice(owners.as_bytes());
        bytes.extend_from_slice(skipped);
        bytes.extend_from_slice(&watch);
        bytes.extend_from_slice(TRAILER);
        let owners_at = HEADER_LEN + records.len() * RECORD_LEN;
        Self {
            count: records.len(),
            owners_at,
            owners_len: owners.len(),
            skipped_at: owners_at + owners.len(),
            skipped_len: skipped.len(),
            watch_at: owners_at + owners.len() + skipped.len(),
            watch_len: watch.len(),
            bytes,
        }
    }

    /// The skipped section's raw JSON.
    fn skipped_bytes(&self) -> Option<&[u8]> {
        self.bytes
            .get(self.skipped_at..self.skipped_at.checked_add(self.skipped_len)?)
    }

    /// Whether the scan left a writer's temporary behind (too young to remove).
    fn has_temporaries(&self) -> bool {
        self.bytes.get(9) == Some(&1)
    }

    /// The watched entries: name and stamp (`decode` checked they parse).
    fn watched(&self) -> impl Iterator<Item = (&str, SnapshotDirStamp)> {
        let mut rest = self
            .bytes
            .get(self.watch_at..self.watch_at + self.watch_len)
            .unwrap_or_default();
        std::iter::from_fn(move || {
            let len = usize::from(u16::from_le_bytes(field(rest, 0)?));
            let name = std::str::from_utf8(rest.get(2..2 + len)?).ok()?;
            let at = 2 + len;
            let stamp = SnapshotDirStamp {
                dev: u64::from_le_bytes(field(rest, at)?),
                ino: u64::from_le_bytes(field(rest, at + 8)?),
                mtime_ns: i128::from_le_bytes(field(rest, at + 16)?),
                ctime_ns: i128::from_le_bytes(field(rest, at + 32)?),
            };
            rest = rest.get(at + 48..)?;
            Some((name, stamp))
        })
    }

    /// Whether every watched entry below `reserved` still has the stamp the scan saw: one
    /// `lstat` per namespace directory (and per skipped file).
    fn watched_unchanged(&self, reserved: &ipkeep_netdir::DirFd) -> bool {
        self.watched().all(|(name, recorded)| {
            rustix::fs::statat(reserved.fd(), name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|st| {
                    SnapshotDirStamp::from(ipkeep_netdir::FileStat::from_stat(&st)) == recorded
                })
        })
    }

    /// Checks the layout completely (sizes, bounds, order, UTF-8), so lookups cannot go wrong.
    fn decode(bytes: Vec<u8>) -> Option<Self> {
        if bytes.get(..MAGIC.len())? != MAGIC || !bytes.ends_with(TRAILER) {
            return None;
        }
        let count = u32_at(&bytes, 80)?;
        let owners_len = u32_at(&bytes, 84)?;
        let skipped_len = u32_at(&bytes, 88)?;
        let watch_len = u32_at(&bytes, 92)?;
        let owners_at = count.checked_mul(RECORD_LEN)?.checked_add(HEADER_LEN)?;
        let skipped_at = owners_at.checked_add(owners_len)?;
        let watch_at = skipped_at.checked_add(skipped_len)?;
        let end = watch_at
            .checked_add(watch_len)?
            .checked_add(TRAILER.len())?;
        if end != bytes.len() {
            return None;
        }
        std::str::from_utf8(bytes.get(owners_at..skipped_at)?).ok()?;
        let snapshot = Self {
            bytes,
            count,
            owners_at,
            owners_len,
            skipped_at,
            skipped_len,
            watch_at,
            watch_len,
        };
        // The watched entries must account for their section exactly.
        let mut parsed = 0;
        for (name, _) in snapshot.watched() {
            parsed += WATCH_FIXED_LEN + name.len();
        }
        if parsed != watch_len {
            return None;
        }
        let mut previous = 0u128;
        for i in 0..count {
            let record = snapshot.record(i)?;
            let owner_end = record.owner_at.checked_add(record.owner_len)?;
            if record.key < previous
                || owner_end > owners_len
                || snapshot.owner(&record)?.split_once('/').is_none()
            {
                return None;
            }
            previous = record.key;
        }
        Some(snapshot)
    }

    fn stamp(&self) -> SnapshotStamp {
        let b = &self.bytes;
        let generation = (b.get(8) == Some(&1))
            .then(|| field(b, 16).map(u64::from_le_bytes))
            .flatten();
        let reserved = (b.get(24) == Some(&1))
            .then(|| {
                Some(SnapshotDirStamp {
                    dev: u64::from_le_bytes(field(b, 32)?),
                    ino: u64::from_le_bytes(field(b, 40)?),
                    mtime_ns: i128::from_le_bytes(field(b, 48)?),
                    ctime_ns: i128::from_le_bytes(field(b, 64)?),
                })
            })
            .flatten();
        SnapshotStamp {
            reserved,
            generation,
        }
    }

    fn record(&self, i: usize) -> Option<Record> {
        let at = HEADER_LEN.checked_add(i.checked_mul(RECORD_LEN)?)?;
        let b = &self.bytes;
        let has_release = u32::from_le_bytes(field(b, at + 28)?) == 1;
        let release = if has_release {
            Some(Timestamp::new(
                i64::from_le_bytes(field(b, at + 16)?),
                u32::from_le_bytes(field(b, at + 24)?),
            )?)
        } else {
            None
        };
        Some(Record {
            key: u128::from_le_bytes(field(b, at)?),
            release,
            owner_at: u32_at(b, at + 32)?,
            owner_len: u32_at(b, at + 36)?,
        })
    }

    fn owner(&self, record: &Record) -> Option<&str> {
        let start = self.owners_at.checked_add(record.owner_at)?;
        let bytes = self
            .bytes
            .get(start..start.checked_add(record.owner_len)?)?;
        std::str::from_utf8(bytes).ok()
    }

    /// How many reserved addresses (active or not) the snapshot holds.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The garbage found when the snapshot was built (decoded on demand, for reporting).
    pub fn skipped(&self) -> Vec<Skipped> {
        self.bytes
            .get(self.skipped_at..self.skipped_at + self.skipped_len)
            .and_then(|json| serde_json::from_slice(json).ok())
            .unwrap_or_default()
    }

    /// The lookup of addresses held by reservations active at `now`.
    pub fn lookup(&self, now: Timestamp) -> SnapshotLookup<'_> {
        SnapshotLookup {
            snapshot: self,
            now,
        }
    }
}

/// A record before encoding: address key, release time, owner's offset and length.
type RecordParts = (u128, Option<Timestamp>, usize, usize);

struct Record {
    key: u128,
    release: Option<Timestamp>,
    owner_at: usize,
    owner_len: usize,
}

/// [`ReservationLookup`] straight over the snapshot's sorted records.
#[derive(Debug, Clone, Copy)]
pub struct SnapshotLookup<'a> {
    snapshot: &'a ReservationSnapshot,
    now: Timestamp,
}

impl ReservationLookup for SnapshotLookup<'_> {
    fn held_for_other(&self, ip: IpAddr, me: Option<&PodKey>) -> Option<PodKey> {
        let key = key_of(ip);
        let snap = self.snapshot;
        // First record whose key is not below `key` (records are sorted; `decode` checked).
        let (mut low, mut high) = (0, snap.count);
        while low < high {
            let mid = low + (high - low) / 2;
            if snap.record(mid)?.key < key {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        for i in low..snap.count {
            let record = snap.record(i)?;
            if record.key != key {
                break;
            }
            if record.release.is_some_and(|release| self.now >= release) {
                continue;
            }
            let (namespace, pod) = snap.owner(&record)?.split_once('/')?;
            if me.is_some_and(|me| me.namespace() == namespace && me.name() == pod) {
                continue;
            }
            // The owner was a validated file's key when the snapshot was written.
            return PodKey::new(namespace, pod).ok();
        }
        None
    }
}

/// Access to the private encoding for the module's tests.
#[cfg(test)]
pub(super) mod tests_support {
    use super::{ReservationSet, ReservationSnapshot, SnapshotStamp};

    /// The snapshot's bytes.
    pub fn encode(set: &ReservationSet, stamp: &SnapshotStamp) -> Vec<u8> {
        ReservationSnapshot::encode(set, stamp).bytes
    }

    /// The decoded snapshot, if the bytes are accepted.
    pub fn decode(bytes: Vec<u8>) -> Option<ReservationSnapshot> {
        ReservationSnapshot::decode(bytes)
    }
}
