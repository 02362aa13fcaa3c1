//! The disk side of the agent: one [`NetworkWriter`] per configured network makes
//! `<dataDir>/<network>/reserved/` equal to the desired files, only through the plugin library's
//! writer ([`sync_reservations`] for a full resync, [`apply_reservations`] for the changes of a
//! steady-state pass), so the format, the lock and the plugin's snapshot can never disagree with
//! what the plugin reads.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ipkeep_plugin::netdir::{NetDirError, NetworkDir};
use ipkeep_plugin::reservation::{
    PodKey, ReservationFile, ReservationSet, ReservedDirError, apply_reservations,
    sync_reservations,
};

use super::desired::{FilePlan, plan};

/// How many changes one [`apply_reservations`] call of a steady-state pass carries: one hold of
/// the lock, one generation bump, one fsync per file and per changed directory, the plugin's
/// snapshot patched instead of rebuilt. More changes take several calls, releasing the lock in
/// between, so an ADD never waits for hundreds of fsyncs (the same bound as a full sync's).
const BATCH: usize = 64;

/// Errors of one network's disk work.
#[derive(Debug, thiserror::Error)]
pub enum WriterError {
    /// The network directory could not be opened or created.
    #[error("failed to open network directory {network:?} in {}", data_dir.display())]
    Open {
        /// The data directory.
        data_dir: PathBuf,
        /// The network.
        network: String,
        /// What failed.
        #[source]
        source: NetDirError,
    },
    /// The full sync could not run at all (the lock could not be taken).
    #[error("failed to sync the reservation files of network {network:?}")]
    Sync {
        /// The network.
        network: String,
        /// What failed.
        #[source]
        source: ReservedDirError,
    },
}

/// What one pass changed on disk for one network.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Files written (created or rewritten).
    pub written: Vec<PodKey>,
    /// Reservation files removed.
    pub removed: Vec<PodKey>,
    /// Garbage entries deleted (leftover temporaries, symlinks, stray directories, bad files).
    pub cleaned: Vec<PathBuf>,
    /// Steps that failed; the rest of the pass went on.
    pub failed: Vec<String>,
}

/// Keeps one network's `reserved/` tree equal to the desired files.
#[derive(Debug)]
pub struct NetworkWriter {
    data_dir: PathBuf,
    network: String,
    /// What the agent believes is on disk (exact after a full sync, then kept up to date by its
    /// own writes; the agent is the only writer of `reserved/`).
    on_disk: ReservationSet,
    /// Whether `on_disk` can be trusted (false until a full sync succeeded, and after a failure).
    trusted: bool,
}

impl NetworkWriter {
    /// A writer for `<data_dir>/<network>`; nothing is touched until the first pass.
    pub fn new(data_dir: &Path, network: &str) -> Self {
        Self {
            data_dir: data_dir.to_owned(),
            network: network.to_owned(),
            on_disk: ReservationSet::default(),
            trusted: false,
        }
    }

    /// The network's name.
    pub fn network(&self) -> &str {
        &self.network
    }

    /// Opens the network directory, creating it (and the data directory) with host-local's
    /// modes (0755) when it does not exist yet; a symlink at the network's name is refused.
    fn open(&self) -> Result<NetworkDir, WriterError> {
        NetworkDir::open(&self.data_dir, &self.network).map_err(|source| WriterError::Open {
            data_dir: self.data_dir.clone(),
            network: self.network.clone(),
            source,
        })
    }

    /// Reads the tree, then makes it equal to `desired`: writes missing and changed files,
    /// removes files without a desired reservation, and deletes garbage including the writer's
    /// leftover temporaries. Afterwards the writer trusts what it read and wrote.
    pub fn full_sync(
        &mut self,
        desired: &BTreeMap<PodKey, ReservationFile>,
    ) -> Result<PassReport, WriterError> {
        self.trusted = false;
        let dir = self.open()?;
        let files: Vec<ReservationFile> = desired.values().cloned().collect();
        let report = sync_reservations(&dir, &files).map_err(|source| WriterError::Sync {
            network: self.network.clone(),
            source,
        })?;
        if report.failed.is_empty() && report.invalid.is_empty() {
            // Every step succeeded: the tree is exactly the desired files (no rescan needed).
            self.on_disk = ReservationSet {
                files: desired.clone(),
                skipped: Vec::new(),
            };
            self.trusted = true;
        } else {
            // Failed steps leave files the agent cannot know: the next pass is a full sync,
            // which reads the tree again.
            self.on_disk = ReservationSet::default();
            self.trusted = false;
        }
        Ok(PassReport {
            written: report.created.into_iter().chain(report.updated).collect(),
            removed: report.removed,
            cleaned: report.cleaned.into_iter().map(|s| s.path).collect(),
            failed: report.failed.into_iter().chain(report.invalid).collect(),
        })
    }

    /// Brings the tree from what the writer last left to `desired`, touching only the files
    /// that change; falls back to [`NetworkWriter::full_sync`] when the writer does not trust
    /// its view (no full sync yet, or a step failed).
    pub fn apply(
        &mut self,
        desired: &BTreeMap<PodKey, ReservationFile>,
    ) -> Result<PassReport, WriterError> {
        if !self.trusted {
            return self.full_sync(desired);
        }
        let changes = plan(desired, &self.on_disk);
        if changes.is_empty() {
            return Ok(PassReport::default());
        }
        let dir = self.open()?;
        Ok(self.apply_batch(&dir, changes))
    }

    fn apply_batch(&mut self, dir: &NetworkDir, changes: FilePlan) -> PassReport {
        let mut report = PassReport::default();
        if !changes.garbage.is_empty() {
            // Only a full sync deletes garbage; the next pass will be one.
            self.trusted = false;
        }
        let writes: Vec<ReservationFile> =
            changes.create.into_iter().chain(changes.update).collect();
        let mut pending_writes = writes.chunks(BATCH);
        let mut pending_removes = changes.remove.chunks(BATCH);
        loop {
            let (w, r) = match (pending_writes.next(), pending_removes.next()) {
                (None, None) => break,
                (w, r) => (w.unwrap_or_default(), r.unwrap_or_default()),
            };
            let applied = match apply_reservations(dir, w, r) {
                Ok(applied) => applied,
                Err(e) => {
                    report.failed.push(e.to_string());
                    self.trusted = false;
                    return report;
                }
            };
            let failed: std::collections::BTreeSet<&PodKey> =
                applied.failed.iter().map(|f| &f.key).collect();
            for file in w {
                if !failed.contains(&file.pod_key()) {
                    self.on_disk.files.insert(file.pod_key(), file.clone());
                }
            }
            for key in r {
                if !failed.contains(key) {
                    self.on_disk.files.remove(key);
                }
            }
            if !applied.failed.is_empty() {
                self.trusted = false;
                report
                    .failed
                    .extend(applied.failed.iter().map(|f| f.to_string()));
            }
            report.written.extend(applied.written);
            report.removed.extend(applied.removed);
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipkeep_plugin::reservation::{FORMAT_VERSION, Timestamp, read_reservation};

    fn file(pod: &str, ip: &str, release: Option<i64>) -> ReservationFile {
        ReservationFile {
            version: FORMAT_VERSION,
            namespace: "db".into(),
            pod: pod.into(),
            ips: vec![ip.parse().unwrap()],
            release_time: release.map(Timestamp::from_unix_secs),
            uid: format!("uid-{pod}"),
            node_name: Some("node-a".into()),
        }
    }

    fn map(files: &[ReservationFile]) -> BTreeMap<PodKey, ReservationFile> {
        files.iter().map(|f| (f.pod_key(), f.clone())).collect()
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("ipkeep-agent-writer-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn creates_the_network_directory_with_host_local_modes() {
        use std::os::unix::fs::PermissionsExt;
        let data = scratch("mkdir");
        let mut w = NetworkWriter::new(&data.join("nested"), "net1");
        let report = w.full_sync(&map(&[file("a", "10.0.0.1", None)])).unwrap();
        assert_eq!(report.written.len(), 1);
        let mode = std::fs::metadata(data.join("nested/net1"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        std::fs::remove_dir_all(&data).unwrap();
    }

    #[test]
    fn steady_state_touches_only_changed_files() {
        let data = scratch("steady");
        let mut w = NetworkWriter::new(&data, "net1");
        let a = file("a", "10.0.0.1", None);
        let b = file("b", "10.0.0.2", None);
        w.full_sync(&map(&[a.clone(), b.clone()])).unwrap();
        let path_b = data.join("net1/reserved/db/b");
        let ino_b = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path_b).unwrap());

        let a2 = file("a", "10.0.0.1", Some(1_900_000_000));
        let report = w.apply(&map(&[a2.clone(), b.clone()])).unwrap();
        assert_eq!(report.written, vec![a2.pod_key()]);
        assert!(report.removed.is_empty());
        let ino_after = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path_b).unwrap());
        assert_eq!(ino_b, ino_after, "the unchanged file was rewritten");
        let dir = NetworkDir::open(&data, "net1").unwrap();
        assert_eq!(read_reservation(&dir, "db", "a").unwrap(), Some(a2.clone()));

        let report = w.apply(&map(std::slice::from_ref(&a2))).unwrap();
        assert_eq!(report.removed, vec![b.pod_key()]);
        assert!(!path_b.exists());
        assert_eq!(w.apply(&map(&[a2])).unwrap(), PassReport::default());
        std::fs::remove_dir_all(&data).unwrap();
    }

    #[test]
    fn many_changes_go_in_batches_and_leave_a_snapshot_the_plugin_trusts() {
        use ipkeep_plugin::reservation::{Source, load_reservations, load_reservations_cached};
        let data = scratch("batches");
        let mut w = NetworkWriter::new(&data, "net1");
        let files: Vec<ReservationFile> = (0..200)
            .map(|i| {
                file(
                    &format!("p-{i}"),
                    &format!("10.9.{}.{}", i / 200, i % 200),
                    None,
                )
            })
            .collect();
        w.full_sync(&map(&files)).unwrap();
        let generation = || -> u64 {
            std::fs::read_to_string(data.join("net1/reserved/.generation"))
                .unwrap()
                .trim_end()
                .parse()
                .unwrap()
        };
        let before = generation();
        // 150 rewrites and 30 removals: three batches of writes, the removals in the first.
        let mut next: Vec<ReservationFile> = files[30..].to_vec();
        for f in next.iter_mut().take(150) {
            f.release_time = Some(Timestamp::from_unix_secs(1_900_000_000));
        }
        let report = w.apply(&map(&next)).unwrap();
        assert_eq!(report.written.len(), 150, "{report:?}");
        assert_eq!(report.removed.len(), 30);
        assert!(report.failed.is_empty(), "{:?}", report.failed);
        assert_eq!(generation(), before + 3, "one bump per batch of 64");
        let dir = NetworkDir::open(&data, "net1").unwrap();
        assert_eq!(load_reservations(&dir).files, map(&next));
        let lock = dir.lock().unwrap();
        let (snapshot, source) = load_reservations_cached(&dir, &lock);
        assert_eq!((source, snapshot.len()), (Source::Index, 170));
        drop(lock);
        assert_eq!(w.apply(&map(&next)).unwrap(), PassReport::default());
        std::fs::remove_dir_all(&data).unwrap();
    }

    #[test]
    fn full_sync_removes_stale_files_and_leftover_temporaries() {
        let data = scratch("stale");
        let mut w = NetworkWriter::new(&data, "net1");
        let a = file("a", "10.0.0.1", None);
        w.full_sync(&map(&[a.clone(), file("gone", "10.0.0.9", None)]))
            .unwrap();
        let ns = data.join("net1/reserved/db");
        std::fs::write(ns.join(".ipkeep-tmp-999-0"), b"{\"version\":1").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", ns.join("evil")).unwrap();

        // A fresh writer (the agent restarted) starts with a full sync.
        let mut w = NetworkWriter::new(&data, "net1");
        let report = w.apply(&map(&[a])).unwrap();
        assert_eq!(report.removed.len(), 1, "{report:?}");
        assert_eq!(report.cleaned.len(), 2, "{report:?}");
        let mut left: Vec<_> = std::fs::read_dir(&ns)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["a"]);
        assert!(std::path::Path::new("/etc/passwd").exists());
        std::fs::remove_dir_all(&data).unwrap();
    }

    #[test]
    fn a_symlinked_network_directory_is_refused() {
        let data = scratch("symlink");
        std::fs::create_dir_all(data.join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(data.join("elsewhere"), data.join("net1")).unwrap();
        let mut w = NetworkWriter::new(&data, "net1");
        let err = w
            .full_sync(&map(&[file("a", "10.0.0.1", None)]))
            .unwrap_err();
        assert!(
            err.to_string().contains("failed to open network directory"),
            "{err}"
        );
        assert_eq!(
            std::fs::read_dir(data.join("elsewhere")).unwrap().count(),
            0
        );
        std::fs::remove_dir_all(&data).unwrap();
    }
}
