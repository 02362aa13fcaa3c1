//! The disk store: host-local's files, byte for byte, plus a rebuildable index so that ADD, DEL
//! and CHECK cost O(1) in the number of allocations.
//!
//! # Files (contract 3)
//! `<net>/<ip>` holds `<containerID>\r\n<ifname>` (legacy host-local files hold `<containerID>`),
//! `<net>/last_reserved_ip.<N>` the round-robin cursor, `<net>/lock` the `flock`. Only regular
//! files directly in `<net>/` whose name is the canonical text of an address are allocations;
//! anything else at an address's name (a directory, a symlink, a FIFO) still blocks that address,
//! because the exclusive create fails on it, but is never read, followed or deleted.
//!
//! IP files are created atomically and exclusively: written as a temporary in
//! `<net>/.ipkeep/tmp/` (a spare a DEL left there, rewritten, when there is one: a DEL moves the
//! files it removes there, up to `SPARES`, so that an ADD in steady state creates no inode), then
//! hard-linked to `<net>/<ip>` (`EEXIST` = taken), so neither a
//! reader nor a process killed at any instant ever leaves a half-written file (host-local's
//! `O_EXCL` create followed by a write leaves an empty one when killed in between). IP files and
//! `last_reserved_ip.*` are created with mode 0600 (as upstream host-local ≥ v1.4.0; Debian's
//! 1.1.1 writes 0644).
//!
//! They are deliberately not fsync'd (host-local does not either). An allocation file describes
//! a running container's network namespace, and a power loss ends every such container: after
//! the reboot the runtime creates new sandboxes, so an allocation file lost or emptied by the power
//! loss frees or blocks an address whose owner is gone anyway. An fsync, on the other hand, costs
//! every pod start a journal commit whose latency grows with everything else dirty on the node's
//! file system (measured here: 0.5 ms on a quiet ext4, over 3 ms right after other files were
//! written). The state that must survive a reboot — the reservation files — is written by the
//! agent with fsync of the file and of its directory (`reservation::write_reservation`).
//!
//! # The index (`<net>/.ipkeep/`, ipkeep's private directory; host-local ignores it)
//! * `containers/<containerID>` — JSON: the container's (ip, ifname, pod) records. Written
//!   temp (or spare) in `tmp/` + rename without fsync: it is a cache, rebuilt from the IP files whenever in doubt.
//!   Container IDs longer than 200 bytes are stored under `~<fnv64 of the id>`.
//! * `stamp` — the (dev, ino, mtime ns, ctime ns) of the network directory and of
//!   `.ipkeep/containers/` and `.ipkeep/tmp/`, as seen right after ipkeep's last change. Every
//!   command (under the lock) compares it with the directories: when they differ, someone else
//!   (host-local, a human) changed `<net>/` or the index itself, and the whole index is
//!   rebuilt from the IP files (one O(n) scan that keeps the pod of records still matching their
//!   file). Before its first change a command overwrites the stamp with a "dirty" marker and
//!   writes the new stamp only after its last change, so a process killed at any instant leaves
//!   a stamp that matches nothing and the next command rebuilds. Both writes are in place (no new
//!   inode, no rename: see `NetworkDir::overwrite`), so keeping the index costs a command two
//!   small writes. Index records are always verified against the IP file before they are acted
//!   on.
//!
//! Everything in `.ipkeep/` is rebuildable ([`ipkeep_reservation::private_state`]): whatever is found there
//! that ipkeep did not write (a directory at the stamp's or an index file's name, a FIFO, a
//! symlink, garbage, a file with other permissions, an entry ipkeep does not use) is removed under
//! the lock with one stderr line, and the index rebuilt; it is never an error for the runtime.
//!
//! Residual risk: the directory's timestamps are only as fine as the kernel makes them. Linux
//! ≥ 6.13 gives a fine-grained ("multigrain") timestamp to a change that follows a `stat`, which
//! ipkeep always does right after its own last change, so a foreign change is always seen. On
//! older kernels (or file systems without multigrain support) a foreign change landing in the
//! same timestamp tick (1–10 ms) as ipkeep's last change, and adding no directory entry that
//! changes the inode, goes unnoticed until the next foreign change: ipkeep's DEL/CHECK would then
//! not see that one foreign allocation (the address itself stays blocked: allocation never relies
//! on the index).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::SystemTime;

use crate::store::{LegacyRelease, Owner, Store, StoreError, is_valid_container_id};
use ipkeep_netdir::{EntryKind, NetDirError, NetworkDir, NetworkLock, SubDir, TEMP_PREFIX};
use ipkeep_reservation::private_state::{self, Found};
use ipkeep_reservation::{CivilTime, PodKey, Timestamp};

pub use ipkeep_reservation::private_state::PRIVATE_DIR;
const TMP_DIR: &str = "tmp";
const CONTAINERS_DIR: &str = "containers";
const INDEX_STAMP: &str = "stamp";
const LAST_RESERVED_PREFIX: &str = "last_reserved_ip.";
/// IP files are tiny; anything larger is garbage and never matches.
const MAX_IP_FILE: usize = 4096;
const MAX_INDEX_FILE: usize = 1 << 20;
/// Mode of IP files and `last_reserved_ip.*` (see module docs).
const FILE_MODE: u32 = 0o600;

/// One index record: an address a container holds and who it belongs to.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IndexEntry {
    /// The address.
    pub ip: IpAddr,
    /// The interface (`None` for a legacy id-only file).
    pub ifname: Option<String>,
    /// The pod, when the allocating ADD said (`None` for files known only from host-local).
    #[serde(default, deserialize_with = "recorded_pod")]
    pub pod: Option<PodKey>,
}

/// A recorded pod as stored (`{"namespace": …, "name": …}`, [`PodKey`]'s encoding), before its
/// names are checked.
#[derive(serde::Deserialize)]
struct RecordedPod {
    namespace: String,
    name: String,
}

/// Reads an entry's pod: one whose names Kubernetes would not accept (recorded by an ipkeep
/// that kept `CNI_ARGS` unchecked) reads as no pod, which is what such a pod always counted as
/// (it cannot have a reservation), and keeps the rest of the record instead of making the
/// whole file garbage.
fn recorded_pod<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<PodKey>, D::Error> {
    let recorded: Option<RecordedPod> = serde::Deserialize::deserialize(deserializer)?;
    Ok(recorded.and_then(|pod| PodKey::new(&pod.namespace, &pod.name).ok()))
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct IndexFile {
    #[serde(rename = "containerID")]
    container_id: String,
    attachments: Vec<IndexEntry>,
}

/// One allocation found by a full scan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScannedFile {
    /// The address (the file's name).
    pub ip: IpAddr,
    /// Its owner; `None` for content no container can match (garbage, unreadable).
    pub owner: Option<Owner>,
}

fn index_key(container_id: &str) -> String {
    if container_id.len() <= 200 {
        return container_id.to_owned();
    }
    // FNV-1a: a stable short name for absurdly long IDs; the file records the full ID.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in container_id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("~{h:016x}")
}

/// What the stamp holds while a command is changing things: it matches no directory.
const INDEX_STAMP_DIRTY: &[u8] = b"ipkeep-stamp dirty\n";
/// Every name ipkeep uses in its private directory; anything else there is removed by a rebuild.
const KNOWN_PRIVATE_NAMES: [&str; 6] = [
    INDEX_STAMP,
    TMP_DIR,
    CONTAINERS_DIR,
    ipkeep_reservation::private_state::SNAPSHOT_NAME,
    ipkeep_reservation::private_state::RELEASED_NAME,
    ipkeep_reservation::private_state::WAIT_DIR,
];
/// How every stamp ipkeep writes starts (a torn in-place write keeps it; garbage does not).
const INDEX_STAMP_PREFIX: &[u8] = b"ipkeep-stamp ";
/// Far more than the longest stamp (three directories of four numbers).
const MAX_INDEX_STAMP_LEN: usize = 512;

/// The stamp of the network directory and of the index's own directories, so that a change to
/// either behind ipkeep's back (a file planted in `.ipkeep/containers/`) means a rebuild too.
fn index_stamp_text(
    net: &ipkeep_netdir::FileStat,
    containers: &ipkeep_netdir::FileStat,
    tmp: &ipkeep_netdir::FileStat,
) -> String {
    let (n, c, t) = (net, containers, tmp);
    format!(
        "ipkeep-stamp 2 {} {} {} {} {} {} {} {} {} {} {} {}\n",
        n.dev,
        n.ino,
        n.mtime_ns,
        n.ctime_ns,
        c.dev,
        c.ino,
        c.mtime_ns,
        c.ctime_ns,
        t.dev,
        t.ino,
        t.mtime_ns,
        t.ctime_ns
    )
}

/// The line for a stamp file whose content ipkeep did not write (a torn write of ipkeep's own
/// keeps the prefix and is rebuilt without a word).
#[cold]
#[inline(never)]
fn not_an_index_stamp(meta: &SubDir, saved: &[u8], found: &mut Vec<String>) {
    found.push(format!(
        "found {} at {}, which ipkeep did not write: rebuilding the index",
        if saved.is_empty() {
            "an empty file"
        } else {
            "content that is not a stamp"
        },
        private_state::escape_control(&meta.child_path(INDEX_STAMP).to_string_lossy())
    ));
}

/// Go's `log` timestamp (`2006/01/02 15:04:05`), in UTC.
pub fn go_log_time(now: SystemTime) -> String {
    let CivilTime {
        year,
        month,
        day,
        hour,
        minute,
        second,
    } = Timestamp::from_system_time(now).civil_utc();
    format!("{year:04}/{month:02}/{day:02} {hour:02}:{minute:02}:{second:02}")
}

/// Opens (creating it if needed) one of ipkeep's private directories; something that is not a
/// directory at that name (a planted symlink, a file, a FIFO) is removed, never followed.
fn private_dir(
    parent: &ipkeep_netdir::DirFd,
    name: &str,
    log: &mut Vec<String>,
) -> Result<SubDir, NetDirError> {
    private_state::open_dir(parent, name, true, log)?.ok_or_else(|| NetDirError::NotDirectory {
        path: parent.child_path(name),
    })
}

/// What occupies an address's name in `<net>/` right now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Occupant {
    /// Nothing: the address can be taken.
    Free,
    /// An allocation file, with the pod the index recorded for its container (if any).
    Allocation {
        /// Who the file names.
        owner: Owner,
        /// The pod recorded with the allocation (`None` for host-local's files).
        pod: Option<PodKey>,
    },
    /// Something no container can be named for (a directory, a symlink, garbage content).
    Other,
}

/// The store of one network, locked for as long as it lives.
#[derive(Debug)]
pub struct DiskStore<'a> {
    net: &'a NetworkDir,
    lock: NetworkLock<'a>,
    meta: SubDir,
    tmp: SubDir,
    containers: SubDir,
    now: SystemTime,
    log: Vec<String>,
    /// The stamp has been removed because this command changes things.
    dirty: bool,
    /// The index is known to be consistent with the IP files: false from a failed index write,
    /// and during a rebuild, until a rebuild completes.
    index_ok: bool,
    /// Whether this command rebuilt the index (for tests and logs).
    rebuilt: bool,
    /// Whether the directory had an index stamp when the command began (see [`Self::had_index`]).
    had_index: bool,
}

impl<'a> DiskStore<'a> {
    /// Locks the network directory and makes sure the index is current (rebuilding it if the
    /// directory changed behind ipkeep's back).
    pub fn open(net: &'a NetworkDir, now: SystemTime) -> Result<Self, StoreError> {
        let lock = net.lock()?;
        let mut found = Vec::new();
        let meta = private_dir(net, PRIVATE_DIR, &mut found)?;
        let tmp = private_dir(&meta, TMP_DIR, &mut found)?;
        let containers = private_dir(&meta, CONTAINERS_DIR, &mut found)?;
        let saved = private_state::read_file(&meta, INDEX_STAMP, MAX_INDEX_STAMP_LEN, &mut found)?;
        if let Some(saved) = &saved
            && !saved.starts_with(INDEX_STAMP_PREFIX)
        {
            not_an_index_stamp(&meta, saved, &mut found);
        }
        let mut store = Self {
            net,
            lock,
            meta,
            tmp,
            containers,
            now,
            log: Vec::new(),
            dirty: false,
            index_ok: true,
            rebuilt: false,
            had_index: saved.is_some(),
        };
        store.note_found(found);
        if saved.as_deref() != Some(store.current_index_stamp()?.as_bytes()) {
            store.rebuild()?;
        }
        Ok(store)
    }

    fn current_index_stamp(&self) -> Result<String, NetDirError> {
        Ok(index_stamp_text(
            &self.net.own_stat()?,
            &self.containers.own_stat()?,
            &self.tmp.own_stat()?,
        ))
    }

    /// Adds `lines` to the command's stderr lines, each prefixed `ipkeep: <network>: `.
    pub fn log_lines(&mut self, lines: Vec<String>) {
        self.note_found(lines);
    }

    /// Logs what was found damaged in the private state, one line each, prefixed
    /// `ipkeep: <network>: `.
    fn note_found(&mut self, found: Vec<String>) {
        if !found.is_empty() {
            self.note_found_cold(found);
        }
    }

    #[cold]
    #[inline(never)]
    fn note_found_cold(&mut self, found: Vec<String>) {
        let network = self
            .net
            .path()
            .file_name()
            .map(|n| private_state::escape_control(&n.to_string_lossy()))
            .unwrap_or_default();
        for line in found {
            self.log.push(format!("ipkeep: {network}: {line}"));
        }
    }

    /// The network lock this store holds (for readers that need proof of it).
    pub fn lock(&self) -> &NetworkLock<'a> {
        &self.lock
    }

    /// Who holds `ip`: the owner named by its file and the pod the index recorded for that
    /// container and address.
    pub fn occupant(&mut self, ip: IpAddr) -> Result<Occupant, StoreError> {
        let name = ip.to_string();
        match self.net.stat(&name)? {
            None => return Ok(Occupant::Free),
            Some(st) if st.kind != EntryKind::File => return Ok(Occupant::Other),
            Some(_) => {}
        }
        let Some(owner) = self.owner_of(ip) else {
            return Ok(Occupant::Other);
        };
        let pod = self
            .attachments_of(owner.container_id())?
            .into_iter()
            .find(|e| e.ip == ip && e.ifname.as_deref() == owner.ifname())
            .and_then(|e| e.pod);
        Ok(Occupant::Allocation { owner, pod })
    }

    /// Whether the network directory had an index stamp (current, stale or the "dirty" marker)
    /// when this command opened it. A directory no ipkeep command ever changed has none (a new
    /// one, one only host-local used), nor has one wiped (`rm -rf`) or whose stamp was removed.
    pub fn had_index(&self) -> bool {
        self.had_index
    }

    /// Records `ip` for `(id, ifname)` if nobody holds it, as [`Store::reserve`] does, but leaves
    /// every range set's last reserved address alone: for taking back an attachment that exists
    /// (the runtime's result cache), not for handing out an address.
    pub fn adopt(
        &mut self,
        ip: IpAddr,
        id: &str,
        ifname: &str,
        pod: Option<&PodKey>,
    ) -> Result<bool, StoreError> {
        self.record(ip, id, ifname, None, pod)
    }

    /// Whether this command had to rebuild the index.
    pub fn rebuilt(&self) -> bool {
        self.rebuilt
    }

    /// Lines for stderr collected so far (Go `log` format).
    pub fn take_log(&mut self) -> Vec<String> {
        std::mem::take(&mut self.log)
    }

    fn mark_dirty(&mut self) -> Result<(), StoreError> {
        if !self.dirty {
            self.meta
                .overwrite(INDEX_STAMP, INDEX_STAMP_DIRTY, FILE_MODE)?;
            self.dirty = true;
        }
        Ok(())
    }

    /// Scans every allocation file and rewrites the index from it (keeping recorded pods).
    pub fn rebuild(&mut self) -> Result<Vec<ScannedFile>, StoreError> {
        self.mark_dirty()?;
        // Until the last index file is written the index may lack containers: a rebuild that
        // fails half-way must leave the stamp dirty, or `Drop` would seal the partial index.
        self.index_ok = false;
        self.rebuilt = true;
        self.net.remove_stale_temps()?;
        // `.ipkeep/` itself holds the stamp's and the reservation snapshot's temporaries.
        self.meta.remove_stale_temps()?;
        let mut found = Vec::new();
        for entry in self.meta.entries()? {
            if !KNOWN_PRIVATE_NAMES.contains(&entry.name.as_str()) {
                private_state::discard(
                    &self.meta,
                    &entry.name,
                    "an entry ipkeep does not use",
                    &mut found,
                );
            }
        }
        self.note_found(found);
        // Under the lock nothing in `tmp/` is in use: whatever is there is a killed command's.
        for entry in self.tmp.entries()? {
            self.tmp.remove_tree(&entry.name, 16)?;
        }
        self.containers.remove_stale_temps()?;
        let scanned = self.scan()?;
        let mut by_container: BTreeMap<String, Vec<IndexEntry>> = BTreeMap::new();
        for file in &scanned {
            if let Some(owner) = &file.owner {
                by_container
                    .entry(owner.container_id().to_owned())
                    .or_default()
                    .push(IndexEntry {
                        ip: file.ip,
                        ifname: owner.ifname().map(str::to_owned),
                        pod: None,
                    });
            }
        }
        // Keep the pods of records that still match, and drop index files of vanished containers.
        let mut existing: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        let mut found = Vec::new();
        for entry in self.containers.entries()? {
            if entry.name.starts_with(TEMP_PREFIX) {
                continue;
            }
            let content = private_state::read_file(
                &self.containers,
                &entry.name,
                MAX_INDEX_FILE,
                &mut found,
            )?;
            let old = content
                .as_deref()
                .and_then(|c| serde_json::from_slice::<IndexFile>(c).ok());
            if content.is_some() && old.is_none() {
                found.push(format!(
                    "found content that is not an index record at {}, which ipkeep did not write: rebuilt it",
                    private_state::escape_control(
                        &self.containers.child_path(&entry.name).to_string_lossy()
                    )
                ));
            }
            let keep = match &old {
                Some(old)
                    if index_key(&old.container_id) == entry.name
                        && by_container.contains_key(&old.container_id) =>
                {
                    if let Some(new) = by_container.get_mut(&old.container_id) {
                        for rec in new.iter_mut() {
                            rec.pod = old
                                .attachments
                                .iter()
                                .find(|o| o.ip == rec.ip && o.ifname == rec.ifname)
                                .and_then(|o| o.pod.clone());
                        }
                    }
                    true
                }
                _ => false,
            };
            if keep {
                existing.insert(entry.name, content.unwrap_or_default());
            } else {
                // Stale (its container's files are gone), garbage, or already removed as damaged.
                self.containers.remove_tree(&entry.name, 16)?;
            }
        }
        self.note_found(found);
        for (id, entries) in &by_container {
            let key = index_key(id);
            let json = serialize_index(id, entries);
            if existing.get(&key).map(Vec::as_slice) != Some(json.as_bytes()) {
                self.containers
                    .write_atomic(&key, json.as_bytes(), FILE_MODE, false)?;
            }
        }
        self.index_ok = true;
        Ok(scanned)
    }

    /// Every allocation file directly in `<net>/` (see the module docs for what counts).
    fn scan(&self) -> Result<Vec<ScannedFile>, StoreError> {
        let mut out = Vec::new();
        for entry in self.net.entries()? {
            if entry.kind != EntryKind::File {
                continue;
            }
            let Some(ip) = crate::addr::parse_ip(&entry.name) else {
                continue;
            };
            if ip.to_string() != entry.name {
                continue;
            }
            let owner = self
                .net
                .read_file(&entry.name, MAX_IP_FILE)
                .ok()
                .flatten()
                .as_deref()
                .and_then(Owner::parse);
            out.push(ScannedFile { ip, owner });
        }
        out.sort_by_key(|f| f.ip.to_string());
        Ok(out)
    }

    /// The owner the IP file of `ip` names right now (`None`: absent, not a regular file, garbage).
    fn owner_of(&self, ip: IpAddr) -> Option<Owner> {
        self.net
            .read_file(&ip.to_string(), MAX_IP_FILE)
            .ok()
            .flatten()
            .as_deref()
            .and_then(Owner::parse)
    }

    /// The index records of `container_id` (rebuilding the index once if its file is corrupt).
    pub fn attachments_of(&mut self, container_id: &str) -> Result<Vec<IndexEntry>, StoreError> {
        if !is_valid_container_id(container_id) {
            return Ok(Vec::new());
        }
        let key = index_key(container_id);
        for attempt in 0..2 {
            // Stat first: a device node planted at the name is never opened.
            let file = match private_state::inspect_file(&self.containers, &key, MAX_INDEX_FILE)? {
                Found::Absent => return Ok(Vec::new()),
                // The rebuild says what it was and removes it.
                Found::Damaged(_) => None,
                Found::File => match self.containers.read_file(&key, MAX_INDEX_FILE) {
                    Ok(None) => return Ok(Vec::new()),
                    Ok(Some(raw)) => serde_json::from_slice::<IndexFile>(&raw)
                        .ok()
                        .filter(|file| file.container_id == container_id),
                    Err(e) if attempt > 0 => return Err(e.into()),
                    Err(_) => None,
                },
            };
            match file {
                Some(file) => return Ok(file.attachments),
                // The rebuild replaces whatever is unusable at `key` (under the dirty stamp).
                None if attempt == 0 => {
                    self.rebuild()?;
                }
                None => return Ok(Vec::new()),
            }
        }
        Ok(Vec::new())
    }

    fn write_index(
        &mut self,
        container_id: &str,
        entries: &[IndexEntry],
    ) -> Result<(), StoreError> {
        let key = index_key(container_id);
        let written = if entries.is_empty() {
            self.containers.retire(&key, &self.tmp).map(|_| ())
        } else {
            self.tmp.write_atomic_in(
                &self.containers,
                &key,
                serialize_index(container_id, entries).as_bytes(),
                FILE_MODE,
            )
        };
        // Sticky: a later successful write (a failed ADD's clean-up) does not make up for a
        // record that was never written; only a completed rebuild does.
        if written.is_err() {
            self.index_ok = false;
        }
        Ok(written?)
    }

    /// GC: frees every allocation whose owner is not `valid(owner)` (garbage files are left
    /// alone: they belong to nobody ipkeep can name) and not `protected(ip)`; returns what it freed.
    pub fn collect_garbage(
        &mut self,
        valid: &dyn Fn(&Owner) -> bool,
        protected: &dyn Fn(IpAddr) -> bool,
    ) -> Result<Vec<IpAddr>, StoreError> {
        let scanned = self.rebuild()?;
        let mut freed = Vec::new();
        for file in scanned {
            let Some(owner) = file.owner else { continue };
            if valid(&owner) || protected(file.ip) {
                continue;
            }
            if self.net.remove(&file.ip.to_string())? {
                freed.push(file.ip);
            }
        }
        if !freed.is_empty() {
            self.rebuild()?;
        }
        Ok(freed)
    }

    /// Writes the stamp if this command changed anything and the index is consistent.
    fn seal(&mut self) -> Result<(), StoreError> {
        if self.dirty && self.index_ok {
            let stamp = self.current_index_stamp()?;
            self.meta
                .overwrite(INDEX_STAMP, stamp.as_bytes(), FILE_MODE)?;
            self.dirty = false;
        }
        Ok(())
    }

    /// Ends the command: seals the index; returns the log lines.
    pub fn finish(mut self) -> Vec<String> {
        if let Err(e) = self.seal() {
            self.log
                .push(format!("ipkeep: failed to record the index stamp: {e}"));
        }
        self.take_log()
    }

    fn last_reserved_name(range_id: usize) -> String {
        format!("{LAST_RESERVED_PREFIX}{range_id}")
    }
}

impl Drop for DiskStore<'_> {
    fn drop(&mut self) {
        let _ = self.seal();
    }
}

/// The pod the container index records for each address, with the container it records it for,
/// read without the network's lock and without repairing anything: for reports (the agent's
/// node view that `ipkeep-operator check --ipam` reads), where a record a moment stale or
/// missing only leaves an allocation's pod unnamed. An index file that cannot be read or parsed
/// is skipped; the next command under the lock rebuilds it.
pub fn recorded_pods(net: &NetworkDir) -> BTreeMap<IpAddr, (String, PodKey)> {
    let mut pods = BTreeMap::new();
    let Ok(Some(containers)) = net.subdir(&[PRIVATE_DIR, CONTAINERS_DIR], false) else {
        return pods;
    };
    for name in containers.list().unwrap_or_default() {
        let Ok(Some(raw)) = containers.read_file(&name, MAX_INDEX_FILE) else {
            continue;
        };
        let Ok(file) = serde_json::from_slice::<IndexFile>(&raw) else {
            continue;
        };
        for entry in file.attachments {
            if let Some(pod) = entry.pod {
                pods.insert(entry.ip, (file.container_id.clone(), pod));
            }
        }
    }
    pods
}

fn serialize_index(container_id: &str, entries: &[IndexEntry]) -> String {
    let file = IndexFile {
        container_id: container_id.to_owned(),
        attachments: entries.to_vec(),
    };
    serde_json::to_string(&file).unwrap_or_default()
}

impl DiskStore<'_> {
    /// The allocation of `ip` to `(id, ifname)`, created exclusively (`Ok(false)`: taken), with
    /// range set `cursor`'s last reserved address moved to it when there is one.
    fn record(
        &mut self,
        ip: IpAddr,
        id: &str,
        ifname: &str,
        cursor: Option<usize>,
        pod: Option<&PodKey>,
    ) -> Result<bool, StoreError> {
        if !is_valid_container_id(id) {
            return Err(StoreError::Message(format!(
                "invalid characters in containerID {id:?}"
            )));
        }
        ipkeep_netdir::check_name(ifname)?;
        let content = Owner::content(id, ifname);
        // Larger files are skipped as garbage when read back: CHECK and DEL would never find
        // this allocation, so it would leak.
        if content.len() > MAX_IP_FILE {
            return Err(StoreError::Message(format!(
                "failed to reserve {ip}: a container ID of {} bytes does not fit in an allocation file (at most {MAX_IP_FILE} bytes)",
                id.len()
            )));
        }
        self.mark_dirty()?;
        let name = ip.to_string();
        if !self
            .tmp
            .create_exclusive_in(self.net, &name, content.as_bytes(), FILE_MODE)?
        {
            return Ok(false);
        }
        if let Some(last) = cursor.map(Self::last_reserved_name)
            && let Err(e) = self.net.overwrite(&last, name.as_bytes(), FILE_MODE)
        {
            // Unlike host-local (which leaves the address allocated), undo the reservation.
            let _ = self.net.remove(&name);
            return Err(match e {
                NetDirError::Io { errno, .. } => StoreError::Message(format!(
                    "open {}: {}",
                    self.net.child_path(&last).display(),
                    ipkeep_netdir::go_errno_text(errno)
                )),
                other => other.into(),
            });
        }
        let mut entries = self.attachments_of(id)?;
        entries.retain(|e| e.ip != ip);
        entries.push(IndexEntry {
            ip,
            ifname: Some(ifname.to_owned()),
            pod: pod.cloned(),
        });
        self.write_index(id, &entries)?;
        Ok(true)
    }
}

impl Store for DiskStore<'_> {
    fn reserve(
        &mut self,
        ip: IpAddr,
        id: &str,
        ifname: &str,
        range_id: usize,
        pod: Option<&PodKey>,
    ) -> Result<bool, StoreError> {
        self.record(ip, id, ifname, Some(range_id), pod)
    }

    fn release(&mut self, ip: IpAddr, id: &str, ifname: &str) -> Result<bool, StoreError> {
        if !self
            .owner_of(ip)
            .is_some_and(|o| o.is_attachment(id, ifname))
        {
            return Ok(false);
        }
        self.mark_dirty()?;
        let removed = self.net.retire(&ip.to_string(), &self.tmp)?;
        let mut entries = self.attachments_of(id)?;
        entries.retain(|e| e.ip != ip);
        self.write_index(id, &entries)?;
        Ok(removed)
    }

    fn release_by_id(
        &mut self,
        id: &str,
        ifname: &str,
        legacy: LegacyRelease,
    ) -> Result<Vec<IpAddr>, StoreError> {
        let entries = self.attachments_of(id)?;
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let verified: Vec<(IpAddr, Option<Owner>)> = entries
            .iter()
            .map(|e| (e.ip, self.owner_of(e.ip)))
            .collect();
        let mut to_free: Vec<IpAddr> = verified
            .iter()
            .filter(|(_, o)| o.as_ref().is_some_and(|o| o.is_attachment(id, ifname)))
            .map(|(ip, _)| *ip)
            .collect();
        if to_free.is_empty() || legacy == LegacyRelease::Always {
            to_free.extend(
                verified
                    .iter()
                    .filter(|(_, o)| o.as_ref().is_some_and(|o| o.is_legacy_of(id)))
                    .map(|(ip, _)| *ip),
            );
        }
        self.mark_dirty()?;
        let mut freed = Vec::new();
        for ip in &to_free {
            if self.net.retire(&ip.to_string(), &self.tmp)? {
                freed.push(*ip);
            }
        }
        // Keep only records that still describe a file of this container.
        let remaining: Vec<IndexEntry> = entries
            .into_iter()
            .zip(verified)
            .filter(|(e, (_, owner))| {
                !to_free.contains(&e.ip)
                    && owner.as_ref().is_some_and(|o| {
                        o.container_id() == id && o.ifname() == e.ifname.as_deref()
                    })
            })
            .map(|(e, _)| e)
            .collect();
        self.write_index(id, &remaining)?;
        Ok(freed)
    }

    fn get_by_id(&mut self, id: &str, ifname: &str) -> Result<Vec<IpAddr>, StoreError> {
        let mut ips: Vec<IpAddr> = self
            .attachments_of(id)?
            .iter()
            .filter(|e| {
                self.owner_of(e.ip)
                    .is_some_and(|o| o.is_attachment(id, ifname) || o.is_legacy_of(id))
            })
            .map(|e| e.ip)
            .collect();
        ips.sort_by_key(|ip| ip.to_string());
        Ok(ips)
    }

    fn find_by_id(&mut self, id: &str, ifname: &str) -> Result<bool, StoreError> {
        Ok(!self.get_by_id(id, ifname)?.is_empty())
    }

    fn last_reserved_ip(&mut self, range_id: usize) -> Option<IpAddr> {
        let name = Self::last_reserved_name(range_id);
        match self.net.read_file(&name, 256) {
            // Used verbatim, like host-local: "10.1.0.5\n" does not parse and counts as none.
            Ok(Some(bytes)) => std::str::from_utf8(&bytes)
                .ok()
                .and_then(crate::addr::parse_ip),
            Ok(None) => None,
            Err(e) => {
                let text = match (&e, self.net.stat(&name)) {
                    (NetDirError::NotRegular { path }, Ok(Some(st)))
                        if st.kind == EntryKind::Dir =>
                    {
                        format!("read {}: is a directory", path.display())
                    }
                    _ => e.to_string(),
                };
                self.log.push(format!(
                    "{} Error retrieving last reserved ip: {text}",
                    go_log_time(self.now)
                ));
                None
            }
        }
    }

    fn is_free(&mut self, ip: IpAddr) -> Result<bool, StoreError> {
        Ok(self.net.stat(&ip.to_string())?.is_none())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    use tempfile::TempDir;

    fn ip(s: &str) -> IpAddr {
        crate::addr::parse_ip(s).unwrap()
    }

    #[test]
    fn log_time_format() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        assert_eq!(go_log_time(t), "2023/11/14 22:13:20");
        assert_eq!(go_log_time(SystemTime::UNIX_EPOCH), "1970/01/01 00:00:00");
    }

    #[test]
    fn reserve_release_and_index_round_trip() {
        let s = TempDir::new().unwrap();
        let net = NetworkDir::open(s.path(), "net1").unwrap();
        let pod = PodKey::new("ns", "p").unwrap();
        {
            let mut st = DiskStore::open(&net, SystemTime::now()).unwrap();
            assert!(st.rebuilt(), "first open builds the index");
            assert!(
                st.reserve(ip("10.1.0.2"), "c1", "eth0", 0, Some(&pod))
                    .unwrap()
            );
            assert!(!st.reserve(ip("10.1.0.2"), "c2", "eth0", 0, None).unwrap());
            st.finish();
        }
        assert_eq!(
            std::fs::read(s.path().join("net1/10.1.0.2")).unwrap(),
            b"c1\r\neth0"
        );
        assert_eq!(
            std::fs::read(s.path().join("net1/last_reserved_ip.0")).unwrap(),
            b"10.1.0.2"
        );
        let mut st = DiskStore::open(&net, SystemTime::now()).unwrap();
        assert!(!st.rebuilt(), "the stamp matches: no rescan");
        assert_eq!(st.attachments_of("c1").unwrap()[0].pod, Some(pod.clone()));
        assert_eq!(st.get_by_id("c1", "eth0").unwrap(), vec![ip("10.1.0.2")]);
        assert_eq!(st.last_reserved_ip(0), Some(ip("10.1.0.2")));
        assert_eq!(
            st.release_by_id("c1", "eth0", LegacyRelease::IfNoneMatched)
                .unwrap(),
            vec![ip("10.1.0.2")]
        );
        assert!(!st.find_by_id("c1", "eth0").unwrap());
        st.finish();
        assert!(!s.path().join("net1/10.1.0.2").exists());
        assert!(!s.path().join("net1/.ipkeep/containers/c1").exists());
    }

    /// An index record is encoded as it always was; a recorded pod whose names Kubernetes would
    /// not accept (as an ipkeep that kept `CNI_ARGS` unchecked wrote) reads as no pod and keeps
    /// the rest of the file, as does a record without a pod.
    #[test]
    fn index_records_keep_their_encoding() {
        let entry = IndexEntry {
            ip: ip("10.1.0.2"),
            ifname: Some("eth0".into()),
            pod: Some(PodKey::new("ns", "p").unwrap()),
        };
        let text = serialize_index("c1", std::slice::from_ref(&entry));
        assert_eq!(
            text,
            r#"{"containerID":"c1","attachments":[{"ip":"10.1.0.2","ifname":"eth0","pod":{"namespace":"ns","name":"p"}}]}"#
        );
        let read: IndexFile = serde_json::from_str(&text).unwrap();
        assert_eq!(read.attachments, vec![entry.clone()]);
        let podless = IndexEntry { pod: None, ..entry };
        for other in [
            text.replace(r#""name":"p""#, r#""name":"Not_A_Pod""#),
            text.replace(r#","pod":{"namespace":"ns","name":"p"}"#, ""),
        ] {
            let read: IndexFile = serde_json::from_str(&other).unwrap();
            assert_eq!(read.container_id, "c1", "{other}");
            assert_eq!(read.attachments, vec![podless.clone()], "{other}");
        }
    }

    #[test]
    fn foreign_changes_trigger_a_rebuild_that_keeps_pods() {
        let s = TempDir::new().unwrap();
        let net = NetworkDir::open(s.path(), "net1").unwrap();
        let pod = PodKey::new("ns", "p").unwrap();
        {
            let mut st = DiskStore::open(&net, SystemTime::now()).unwrap();
            st.reserve(ip("10.1.0.2"), "c1", "eth0", 0, Some(&pod))
                .unwrap();
            st.finish();
        }
        // host-local (or a human) adds files behind our back, including a legacy one and garbage.
        std::fs::write(s.path().join("net1/10.1.0.3"), b"c2\r\neth0").unwrap();
        std::fs::write(s.path().join("net1/10.1.0.4"), b"c3").unwrap();
        std::fs::write(s.path().join("net1/10.1.0.5"), b"\xff garbage").unwrap();
        std::fs::create_dir(s.path().join("net1/10.1.0.6")).unwrap();
        let mut st = DiskStore::open(&net, SystemTime::now()).unwrap();
        assert!(st.rebuilt());
        assert_eq!(
            st.attachments_of("c1").unwrap()[0].pod,
            Some(pod),
            "pod survives the rebuild"
        );
        assert_eq!(st.get_by_id("c2", "eth0").unwrap(), vec![ip("10.1.0.3")]);
        assert_eq!(
            st.get_by_id("c3", "eth9").unwrap(),
            vec![ip("10.1.0.4")],
            "legacy files match any ifname"
        );
        assert!(
            !st.is_free(ip("10.1.0.6")).unwrap(),
            "a directory blocks its address"
        );
        assert!(!st.reserve(ip("10.1.0.6"), "c9", "eth0", 0, None).unwrap());
        st.finish();
    }

    #[test]
    fn stale_index_entries_are_verified() {
        let s = TempDir::new().unwrap();
        let net = NetworkDir::open(s.path(), "net1").unwrap();
        {
            let mut st = DiskStore::open(&net, SystemTime::now()).unwrap();
            st.reserve(ip("10.1.0.2"), "c1", "eth0", 0, None).unwrap();
            st.finish();
        }
        // Rewriting a file in place does not change the directory: the index is stale.
        std::fs::write(s.path().join("net1/10.1.0.2"), b"c2\r\neth0").unwrap();
        let mut st = DiskStore::open(&net, SystemTime::now()).unwrap();
        assert!(
            st.release_by_id("c1", "eth0", LegacyRelease::Always)
                .unwrap()
                .is_empty()
        );
        assert!(
            s.path().join("net1/10.1.0.2").exists(),
            "another container's file is never removed"
        );
        st.finish();
    }

    /// `had_index` tells a directory no ipkeep command changed (new, host-local's, wiped) from
    /// one that has an index, current or not.
    #[test]
    fn had_index_is_false_only_without_a_stamp() {
        let s = TempDir::new().unwrap();
        let net = NetworkDir::open(s.path(), "net1").unwrap();
        let stamp = s.path().join("net1/.ipkeep/stamp");
        let open = || {
            let st = DiskStore::open(&net, SystemTime::now()).unwrap();
            let had = st.had_index();
            st.finish();
            had
        };
        assert!(!open(), "a new directory");
        assert!(open(), "after a command finished");
        std::fs::write(&stamp, INDEX_STAMP_DIRTY).unwrap();
        assert!(open(), "a killed command's dirty marker");
        std::fs::write(s.path().join("net1/10.1.0.9"), b"c9\r\neth0").unwrap();
        assert!(open(), "a stale stamp");
        std::fs::remove_file(&stamp).unwrap();
        assert!(!open(), "the stamp removed");
        std::fs::remove_dir_all(s.path().join("net1")).unwrap();
        let net = NetworkDir::open(s.path(), "net1").unwrap();
        let st = DiskStore::open(&net, SystemTime::now()).unwrap();
        assert!(!st.had_index(), "the directory wiped");
    }

    /// `adopt` records an attachment exclusively, with its pod, and moves no cursor.
    #[test]
    fn adopt_records_exclusively_and_leaves_the_cursor() {
        let s = TempDir::new().unwrap();
        let net = NetworkDir::open(s.path(), "net1").unwrap();
        let pod = PodKey::new("ns", "p").unwrap();
        let mut st = DiskStore::open(&net, SystemTime::now()).unwrap();
        assert!(st.reserve(ip("10.1.0.2"), "c1", "eth0", 0, None).unwrap());
        assert!(st.adopt(ip("10.1.0.7"), "c7", "eth0", Some(&pod)).unwrap());
        assert!(
            !st.adopt(ip("10.1.0.2"), "c8", "eth0", None).unwrap(),
            "taken"
        );
        assert!(st.adopt(ip("10.1.0.8"), "bad/id", "eth0", None).is_err());
        assert_eq!(st.last_reserved_ip(0), Some(ip("10.1.0.2")));
        assert_eq!(st.attachments_of("c7").unwrap()[0].pod, Some(pod));
        st.finish();
        assert_eq!(
            std::fs::read(s.path().join("net1/10.1.0.7")).unwrap(),
            b"c7\r\neth0"
        );
        assert!(!s.path().join("net1/10.1.0.8").exists());
    }

    /// A rebuild removes what ipkeep does not use from `.ipkeep/`, and keeps what the agent
    /// keeps there: the reservation snapshot and the record of what it released on purpose.
    #[test]
    fn a_rebuild_keeps_the_agents_private_files() {
        let s = TempDir::new().unwrap();
        let net = NetworkDir::open(s.path(), "net1").unwrap();
        DiskStore::open(&net, SystemTime::now()).unwrap().finish();
        let meta = s.path().join("net1/.ipkeep");
        for name in [
            ipkeep_reservation::private_state::RELEASED_NAME,
            ipkeep_reservation::private_state::SNAPSHOT_NAME,
            "stranger",
        ] {
            std::fs::write(meta.join(name), b"{}").unwrap();
        }
        std::fs::remove_file(meta.join(INDEX_STAMP)).unwrap();
        let st = DiskStore::open(&net, SystemTime::now()).unwrap();
        assert!(st.rebuilt());
        st.finish();
        assert!(
            meta.join(ipkeep_reservation::private_state::RELEASED_NAME)
                .exists()
        );
        assert!(
            meta.join(ipkeep_reservation::private_state::SNAPSHOT_NAME)
                .exists()
        );
        assert!(!meta.join("stranger").exists());
    }

    #[test]
    fn dirty_or_missing_stamp_means_rebuild() {
        let s = TempDir::new().unwrap();
        let net = NetworkDir::open(s.path(), "net1").unwrap();
        {
            let mut st = DiskStore::open(&net, SystemTime::now()).unwrap();
            st.reserve(ip("10.1.0.2"), "c1", "eth0", 0, None).unwrap();
            st.finish();
        }
        let stamp = s.path().join("net1/.ipkeep/stamp");
        assert!(
            !std::fs::read(&stamp)
                .unwrap()
                .starts_with(INDEX_STAMP_DIRTY)
        );
        // What a kill between the IP file and the index leaves: no index record and the dirty
        // marker (written before the first change; the stamp is written after the last).
        std::fs::remove_file(s.path().join("net1/.ipkeep/containers/c1")).unwrap();
        std::fs::write(&stamp, INDEX_STAMP_DIRTY).unwrap();
        {
            let mut st = DiskStore::open(&net, SystemTime::now()).unwrap();
            assert!(st.rebuilt());
            assert_eq!(st.get_by_id("c1", "eth0").unwrap(), vec![ip("10.1.0.2")]);
            st.finish();
        }
        // A stamp removed by hand, or one half overwritten, is as good as dirty.
        std::fs::remove_file(s.path().join("net1/.ipkeep/containers/c1")).unwrap();
        std::fs::remove_file(&stamp).unwrap();
        let mut st = DiskStore::open(&net, SystemTime::now()).unwrap();
        assert!(st.rebuilt());
        assert_eq!(st.get_by_id("c1", "eth0").unwrap(), vec![ip("10.1.0.2")]);
    }

    #[test]
    fn failed_rebuild_never_seals_a_partial_index() {
        let s = TempDir::new().unwrap();
        let net = NetworkDir::open(s.path(), "net1").unwrap();
        DiskStore::open(&net, SystemTime::now()).unwrap().finish();
        // host-local allocated for two containers behind ipkeep's back, and the index directory
        // cannot be written (as on a full disk), so the rebuild fails before it writes c2's file.
        std::fs::write(s.path().join("net1/10.1.0.2"), b"c1\r\neth0").unwrap();
        std::fs::write(s.path().join("net1/10.1.0.3"), b"c2\r\neth0").unwrap();
        {
            let _frozen = Immutable::new(s.path().join("net1/.ipkeep/containers"));
            assert!(DiskStore::open(&net, SystemTime::now()).is_err());
        }
        // The obstacle goes away: the next command must rebuild, not trust an index that lacks c2.
        let mut st = DiskStore::open(&net, SystemTime::now()).unwrap();
        assert_eq!(st.get_by_id("c2", "eth0").unwrap(), vec![ip("10.1.0.3")]);
        st.finish();
    }

    /// Makes a directory immutable (`chattr +i`) for as long as it lives: entries can be read
    /// but none created, which is how these tests make an index write fail as root.
    struct Immutable(PathBuf);
    impl Immutable {
        fn new(dir: PathBuf) -> Self {
            let status = std::process::Command::new("chattr")
                .arg("+i")
                .arg(&dir)
                .status()
                .expect("this test needs chattr (e2fsprogs) to make an index write fail");
            assert!(
                status.success(),
                "this test needs root and a file system with immutable directories (ext4) to make an index write fail: chattr +i {} failed",
                dir.display()
            );
            Self(dir)
        }
    }
    impl Drop for Immutable {
        fn drop(&mut self) {
            let _ = std::process::Command::new("chattr")
                .arg("-i")
                .arg(&self.0)
                .status();
        }
    }

    #[test]
    fn a_failed_index_write_is_not_forgotten_by_a_later_one() {
        let s = TempDir::new().unwrap();
        let net = NetworkDir::open(s.path(), "net1").unwrap();
        {
            let mut st = DiskStore::open(&net, SystemTime::now()).unwrap();
            assert!(st.reserve(ip("10.1.0.2"), "c1", "eth0", 0, None).unwrap());
            {
                let _frozen = Immutable::new(s.path().join("net1/.ipkeep/containers"));
                // The second range set's file is linked, then recording it in the index fails.
                assert!(st.reserve(ip("10.2.0.2"), "c1", "eth0", 1, None).is_err());
            }
            // The failed ADD frees what it reserved; this index write succeeds.
            assert!(st.release(ip("10.1.0.2"), "c1", "eth0").unwrap());
            st.finish();
        }
        assert!(s.path().join("net1/10.2.0.2").exists());
        // The runtime's DEL must find the address whose index record was never written.
        let mut st = DiskStore::open(&net, SystemTime::now()).unwrap();
        assert_eq!(st.get_by_id("c1", "eth0").unwrap(), vec![ip("10.2.0.2")]);
        st.finish();
    }

    #[test]
    fn planted_symlink_at_private_dir_is_replaced() {
        let s = TempDir::new().unwrap();
        std::fs::create_dir_all(s.path().join("net1")).unwrap();
        std::fs::create_dir(s.path().join("outside")).unwrap();
        std::os::unix::fs::symlink(s.path().join("outside"), s.path().join("net1/.ipkeep"))
            .unwrap();
        let net = NetworkDir::open(s.path(), "net1").unwrap();
        let mut st = DiskStore::open(&net, SystemTime::now()).unwrap();
        st.reserve(ip("10.1.0.2"), "c1", "eth0", 0, None).unwrap();
        st.finish();
        assert!(
            std::fs::read_dir(s.path().join("outside"))
                .unwrap()
                .next()
                .is_none(),
            "nothing written through the link"
        );
        assert!(s.path().join("net1/.ipkeep").is_dir());
    }

    #[test]
    fn last_reserved_directory_is_logged() {
        let s = TempDir::new().unwrap();
        let net = NetworkDir::open(s.path(), "net1").unwrap();
        std::fs::create_dir(s.path().join("net1/last_reserved_ip.0")).unwrap();
        let mut st = DiskStore::open(&net, SystemTime::UNIX_EPOCH).unwrap();
        assert_eq!(st.last_reserved_ip(0), None);
        let log = st.take_log();
        assert_eq!(
            log,
            vec![format!(
                "1970/01/01 00:00:00 Error retrieving last reserved ip: read {}/net1/last_reserved_ip.0: is a directory",
                s.path().display()
            )]
        );
        let err = st
            .reserve(ip("10.1.0.2"), "c1", "eth0", 0, None)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "open {}/net1/last_reserved_ip.0: is a directory",
                s.path().display()
            )
        );
        assert!(
            !s.path().join("net1/10.1.0.2").exists(),
            "the failed reservation is undone"
        );
    }
}
