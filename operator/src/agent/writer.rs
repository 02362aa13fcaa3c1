//! The disk side of the agent: one [`NetworkWriter`] per configured network hands the desired
//! files to the plugin library's [`ReservationWriter`], which owns the diff against disk, the
//! batches, the validation, the lock and the plugin's snapshot (so the files can never disagree
//! with what the plugin reads), and turns its typed report into what the agent counts and logs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ipkeep_reservation::{
    ApplyReport, PodKey, Released, ReservationFile, ReservationWriter, ReservedDirError, Timestamp,
    ValidReservation, load_released, load_reservations, record_released,
};

use crate::rules::loss::{Fate, LossCause};
use ipkeep_reservation::{NetDirError, NetworkDir};

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
    /// The pass could not run to its end (the lock, a directory's fsync or the snapshot failed).
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
    /// Files kept because their reservation is lost ([`crate::rules::loss`]), and why.
    pub lost: Vec<(ReservationFile, LossCause)>,
    /// Files kept because whether their reservation was released is not known yet.
    pub undecided: usize,
    /// Files written (created or rewritten).
    pub written: Vec<PodKey>,
    /// Reservation files removed.
    pub removed: Vec<PodKey>,
    /// Garbage entries deleted (leftover temporaries, symlinks, stray directories, bad files).
    pub cleaned: Vec<PathBuf>,
    /// Refused files and failed steps, one log line each; the rest of the pass went on.
    pub failed: Vec<String>,
}

impl From<ApplyReport> for PassReport {
    fn from(report: ApplyReport) -> Self {
        let failed = report.failed.iter().map(|f| super::error_chain(f));
        Self {
            lost: Vec::new(),
            undecided: 0,
            written: report.written,
            removed: report.removed,
            cleaned: report.cleaned.into_iter().map(|s| s.path).collect(),
            failed: failed.collect(),
        }
    }
}

/// Keeps one network's `reserved/` tree equal to the desired files.
#[derive(Debug)]
pub struct NetworkWriter {
    data_dir: PathBuf,
    network: String,
    writer: ReservationWriter,
}

impl NetworkWriter {
    /// A writer for `<data_dir>/<network>`; nothing is touched until the first pass.
    pub fn new(data_dir: &Path, network: &str) -> Self {
        Self {
            data_dir: data_dir.to_owned(),
            network: network.to_owned(),
            writer: ReservationWriter::new(),
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
    /// leftover temporaries.
    pub fn full_sync(
        &mut self,
        desired: &BTreeMap<PodKey, ValidReservation>,
    ) -> Result<PassReport, WriterError> {
        self.writer.forget();
        self.apply(desired)
    }

    /// The files on disk: what the last pass left, or read from the tree when the writer knows
    /// nothing or `full` asks for it.
    pub fn on_disk(&self, full: bool) -> Result<BTreeMap<PodKey, ReservationFile>, WriterError> {
        Ok(match self.writer.known().filter(|_| !full) {
            Some(known) => known.clone(),
            None => load_reservations(&self.open()?).files,
        })
    }

    /// The files on disk whose reservation is not among `present` ([`NetworkWriter::on_disk`]).
    pub fn gone(
        &self,
        full: bool,
        present: impl Fn(&PodKey) -> bool,
    ) -> Result<Vec<ReservationFile>, WriterError> {
        Ok(self
            .on_disk(full)?
            .into_values()
            .filter(|file| file.pod_key().is_ok_and(|key| !present(&key)))
            .collect())
    }

    /// What this node released on purpose ([`ipkeep_reservation::load_released`]): (uid,
    /// generation) pairs; none when the network directory cannot be opened.
    pub fn released(&self) -> Vec<(String, i64)> {
        let Ok(dir) = self.open() else {
            return Vec::new();
        };
        let mut log = Vec::new();
        let out = load_released(&dir, &mut log)
            .into_iter()
            .map(|r| (r.uid, r.generation))
            .collect();
        for line in log {
            tracing::warn!(network = %self.network, "{line}");
        }
        out
    }

    /// A pass that keeps what is lost: the files [`NetworkWriter::gone`] finds are each given
    /// their [`Fate`] by `judge`; those kept are written along with `desired` (unchanged, so not
    /// touched), the released ones are removed. `full` reads the tree again first.
    pub fn pass(
        &mut self,
        desired: &BTreeMap<PodKey, ValidReservation>,
        full: bool,
        present: impl Fn(&PodKey) -> bool,
        mut judge: impl FnMut(&ReservationFile) -> Fate,
        hold: impl Fn(&ReservationFile, LossCause) -> Option<Timestamp>,
    ) -> Result<PassReport, WriterError> {
        let gone = self.gone(full, present)?;
        if full {
            self.writer.forget();
        }
        let dir = self.open()?;
        let mut kept = Vec::new();
        let (mut lost, mut undecided) = (Vec::new(), 0);
        let mut released = Vec::new();
        for mut file in gone {
            let fate = judge(&file);
            if fate == Fate::Release {
                released.push(file);
                continue;
            }
            if let Fate::Keep(cause) = fate
                && let Some(until) = hold(&file, cause)
            {
                tracing::info!(network = %self.network, namespace = %file.namespace, pod = %file.pod, uid = %file.uid, %until, "a Bound reservation vanished unseen: its file is held for its retention");
                file.release_time = Some(until);
            }
            // A file the scan read is valid; one that no longer validates is garbage either way.
            let Ok(valid) = file.clone().validate() else {
                continue;
            };
            match fate {
                Fate::Keep(cause) => lost.push((file, cause)),
                _ => undecided += 1,
            }
            kept.push(valid);
        }
        let report = self
            .writer
            .apply(&dir, desired.values().chain(kept.iter()))
            .map_err(|source| WriterError::Sync {
                network: self.network.clone(),
                source,
            })?;
        let mut report = PassReport::from(report);
        report.lost = lost;
        report.undecided = undecided;
        self.record_released(&dir, &released, &mut report);
        Ok(report)
    }

    /// Records the released files whose generation is known ([`crate::rules::loss`]: what tells
    /// a released object a restore brought back), whether or not their removal has succeeded yet
    /// (the decision is made). A failure is a failed step of the pass, and is not retried: a
    /// release the node does not remember is only written again if a restore brings it back.
    fn record_released(
        &self,
        dir: &NetworkDir,
        files: &[ReservationFile],
        report: &mut PassReport,
    ) {
        let now = Timestamp::from_system_time(std::time::SystemTime::now());
        let records: Vec<Released> = files
            .iter()
            .filter_map(|f| {
                Some(Released {
                    uid: f.uid.clone(),
                    namespace: f.namespace.clone(),
                    pod: f.pod.clone(),
                    generation: f.generation?,
                    released_at: now,
                })
            })
            .collect();
        if records.is_empty() {
            return;
        }
        let mut log = Vec::new();
        if let Err(e) = record_released(dir, &records, now, &mut log) {
            report.failed.push(format!(
                "failed to record {} released reservations: {}",
                records.len(),
                super::error_chain(&e)
            ));
        }
        report.failed.extend(log);
    }

    /// Brings the tree from what the writer last left to `desired`, touching only the files
    /// that change; the library reads the tree first (a full sync) when the writer knows
    /// nothing (no pass yet, or a step of the last one failed).
    pub fn apply(
        &mut self,
        desired: &BTreeMap<PodKey, ValidReservation>,
    ) -> Result<PassReport, WriterError> {
        let dir = self.open()?;
        let report = self
            .writer
            .apply(&dir, desired.values())
            .map_err(|source| WriterError::Sync {
                network: self.network.clone(),
                source,
            })?;
        Ok(report.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipkeep_reservation::{FORMAT_VERSION, ReservationFile, read_reservation};

    fn file(pod: &str, ip: &str, release: Option<i64>) -> ReservationFile {
        ReservationFile {
            version: FORMAT_VERSION,
            namespace: "db".into(),
            pod: pod.into(),
            ips: vec![ip.parse().unwrap()],
            release_time: release.map(Timestamp::from_unix_secs),
            uid: format!("uid-{pod}"),
            node_name: Some("node-a".into()),
            generation: None,
            retain_for_seconds: None,
        }
    }

    fn map(files: &[ReservationFile]) -> BTreeMap<PodKey, ValidReservation> {
        files
            .iter()
            .map(|f| (f.pod_key().unwrap(), f.clone().validate().unwrap()))
            .collect()
    }

    /// A scratch directory (removed when dropped) and the data directory in it, not yet made.
    fn scratch(name: &str) -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::Builder::new()
            .prefix(&format!("ipkeep-agent-writer-{name}-"))
            .tempdir()
            .unwrap();
        let data = tmp.path().join("data");
        (tmp, data)
    }

    #[test]
    fn creates_the_network_directory_with_host_local_modes() {
        use std::os::unix::fs::PermissionsExt;
        let (_tmp, data) = scratch("mkdir");
        let mut w = NetworkWriter::new(&data.join("nested"), "net1");
        let report = w.full_sync(&map(&[file("a", "10.0.0.1", None)])).unwrap();
        assert_eq!(report.written.len(), 1);
        let mode = std::fs::metadata(data.join("nested/net1"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
    }

    #[test]
    fn steady_state_touches_only_changed_files() {
        let (_tmp, data) = scratch("steady");
        let mut w = NetworkWriter::new(&data, "net1");
        let a = file("a", "10.0.0.1", None);
        let b = file("b", "10.0.0.2", None);
        w.full_sync(&map(&[a.clone(), b.clone()])).unwrap();
        let path_b = data.join("net1/reserved/db/b");
        let ino_b = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path_b).unwrap());

        let a2 = file("a", "10.0.0.1", Some(1_900_000_000));
        let report = w.apply(&map(&[a2.clone(), b.clone()])).unwrap();
        assert_eq!(report.written, vec![a2.pod_key().unwrap()]);
        assert!(report.removed.is_empty());
        let ino_after = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path_b).unwrap());
        assert_eq!(ino_b, ino_after, "the unchanged file was rewritten");
        let dir = NetworkDir::open(&data, "net1").unwrap();
        assert_eq!(read_reservation(&dir, "db", "a").unwrap(), Some(a2.clone()));

        let report = w.apply(&map(std::slice::from_ref(&a2))).unwrap();
        assert_eq!(report.removed, vec![b.pod_key().unwrap()]);
        assert!(!path_b.exists());
        assert_eq!(w.apply(&map(&[a2])).unwrap(), PassReport::default());
    }

    #[test]
    fn many_changes_go_in_batches_and_leave_a_snapshot_the_plugin_trusts() {
        use ipkeep_reservation::{Source, load_reservations, load_reservations_cached};
        let (_tmp, data) = scratch("batches");
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
        let on_disk: BTreeMap<_, _> = next
            .iter()
            .map(|f| (f.pod_key().unwrap(), f.clone()))
            .collect();
        assert_eq!(load_reservations(&dir).files, on_disk);
        let lock = dir.lock().unwrap();
        let (snapshot, source) = load_reservations_cached(&dir, &lock);
        assert_eq!((source, snapshot.len()), (Source::Index, 170));
        drop(lock);
        assert_eq!(w.apply(&map(&next)).unwrap(), PassReport::default());
    }

    #[test]
    fn a_vanished_bound_file_is_held_until_the_time_given_then_released() {
        let (_tmp, data) = scratch("held");
        let mut w = NetworkWriter::new(&data, "net1");
        let kept = file("kept", "10.0.0.1", None);
        let bound = file("gone", "10.0.0.9", None);
        w.full_sync(&map(&[kept.clone(), bound.clone()])).unwrap();
        let path = data.join("net1/reserved/db/gone");
        let desired = map(&[kept]);
        let present = |k: &PodKey| k.name() == "kept";
        let until = Timestamp::from_unix_secs(2_000_000_000);

        // The object vanished unseen: kept, and given the release time.
        let report = w
            .pass(
                &desired,
                true,
                present,
                |_| Fate::Keep(LossCause::Vanished),
                |_, _| Some(until),
            )
            .unwrap();
        assert_eq!(report.lost.len(), 1, "{report:?}");
        assert_eq!(report.lost[0].0.release_time, Some(until));
        let dir = NetworkDir::open(&data, "net1").unwrap();
        let on_disk = read_reservation(&dir, "db", "gone").unwrap().unwrap();
        assert_eq!(on_disk.release_time, Some(until), "written to the file");

        // A pass that keeps it without a new time leaves the file as it is; its time come, it goes.
        w.pass(
            &desired,
            true,
            present,
            |_| Fate::Keep(LossCause::Vanished),
            |_, _| None,
        )
        .unwrap();
        let on_disk = read_reservation(&dir, "db", "gone").unwrap().unwrap();
        assert_eq!(on_disk.release_time, Some(until));
        w.pass(&desired, true, present, |_| Fate::Release, |_, _| None)
            .unwrap();
        assert!(!path.exists());
        assert!(data.join("net1/reserved/db/kept").exists());
    }

    #[test]
    fn full_sync_removes_stale_files_and_leftover_temporaries() {
        let (_tmp, data) = scratch("stale");
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
    }

    #[test]
    fn a_symlinked_network_directory_is_refused() {
        let (_tmp, data) = scratch("symlink");
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
    }
}
