//! The stand-in's memory of its sandboxes: one JSON file per sandbox in `<data-dir>/sandboxes/`,
//! written before the namespace exists and marked established after ADD, so that a stand-in
//! killed at any point finds on its next start everything it must tear down.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use super::{cni::PodRef, names, plan::SandboxState};

/// One sandbox on disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxRecord {
    /// `CNI_CONTAINERID` (also the file name).
    pub container_id: String,
    /// The network namespace's name.
    pub netns: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID.
    pub uid: String,
    /// ADD succeeded and the pod's status was written.
    pub established: bool,
    /// The addresses configured in the namespace (empty until established).
    pub ips: Vec<String>,
}

impl SandboxRecord {
    /// The pod.
    pub fn pod(&self) -> PodRef {
        PodRef {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            uid: self.uid.clone(),
        }
    }

    /// The record as the planner sees it.
    pub fn state(&self) -> SandboxState {
        SandboxState {
            container_id: self.container_id.clone(),
            pod: self.pod(),
            established: self.established,
        }
    }
}

/// A record file that could not be written, read or removed.
#[derive(Debug, thiserror::Error)]
#[error("failed to {action} sandbox record {path}")]
pub struct RecordError {
    /// write, read, remove, list.
    pub action: &'static str,
    /// The file or directory.
    pub path: PathBuf,
    /// The OS or decoding error.
    #[source]
    pub source: std::io::Error,
}

/// The sandbox records of one node.
#[derive(Debug, Clone)]
pub struct Records {
    dir: PathBuf,
    netns_prefix: String,
}

impl Records {
    /// The records in `dir` (created if missing) for namespaces named with `netns_prefix`.
    pub fn open(dir: PathBuf, netns_prefix: String) -> Result<Records, RecordError> {
        ensure_real_dir(&dir).map_err(|source| RecordError {
            action: "create the directory of",
            path: dir.clone(),
            source,
        })?;
        Ok(Records { dir, netns_prefix })
    }

    fn path(&self, container_id: &str) -> Option<PathBuf> {
        names::is_container_id(container_id).then(|| self.dir.join(format!("{container_id}.json")))
    }

    fn invalid(&self, what: &str) -> RecordError {
        RecordError {
            action: "name",
            path: self.dir.join(what),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a sandbox ID"),
        }
    }

    /// Writes a record atomically (temporary file, fsync, rename), never through a symlink.
    pub fn write(&self, record: &SandboxRecord) -> Result<(), RecordError> {
        let path = self
            .path(&record.container_id)
            .ok_or_else(|| self.invalid(&record.container_id))?;
        let err = |source| RecordError {
            action: "write",
            path: path.clone(),
            source,
        };
        let body = serde_json::to_vec_pretty(record).map_err(|e| err(e.into()))?;
        write_file_atomically(&path, &body).map_err(err)
    }

    /// Removes a record; one already gone is fine.
    pub fn remove(&self, container_id: &str) -> Result<(), RecordError> {
        let path = self
            .path(container_id)
            .ok_or_else(|| self.invalid(container_id))?;
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(RecordError {
                action: "remove",
                path,
                source: e,
            }),
            _ => Ok(()),
        }
    }

    /// Every valid record. Files that are not regular, not named `<64 hex>.json`, undecodable,
    /// or naming a namespace outside this node's prefix are skipped (and said on stderr): the
    /// stand-in never acts on a name it did not make.
    pub fn load(&self) -> Result<Vec<SandboxRecord>, RecordError> {
        let entries = std::fs::read_dir(&self.dir).map_err(|source| RecordError {
            action: "list",
            path: self.dir.clone(),
            source,
        })?;
        let mut records = Vec::new();
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            let Some(id) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".json"))
                .map(str::to_owned)
            else {
                continue;
            };
            if !names::is_container_id(&id) || !is_regular(&path) {
                continue;
            }
            match std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<SandboxRecord>(&b).ok())
            {
                Some(r) if r.container_id == id && self.owns_netns(&r.netns) => records.push(r),
                _ => eprintln!(
                    "ipkeep-e2e node: skipping unusable sandbox record {}",
                    path.display()
                ),
            }
        }
        records.sort_by(|a, b| a.container_id.cmp(&b.container_id));
        Ok(records)
    }

    /// Whether `netns` is a namespace name this node makes.
    pub fn owns_netns(&self, netns: &str) -> bool {
        netns
            .strip_prefix(&self.netns_prefix)
            .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_hexdigit()))
    }
}

/// `mkdir -p`, then checks that `dir` itself is a directory, not a symlink to one: the stand-in
/// writes nothing outside its data directory.
pub fn ensure_real_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    if std::fs::symlink_metadata(dir)?.file_type().is_dir() {
        Ok(())
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a directory (a symlink is refused)",
        ))
    }
}

/// Writes `path` through a fresh temporary file (created exclusively, so a symlink planted at its
/// name is never followed), fsync, rename (which replaces a symlink at `path`, not its target).
pub fn write_file_atomically(path: &Path, body: &[u8]) -> std::io::Result<()> {
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = PathBuf::from(tmp_name);
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)?;
    file.write_all(body)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

fn is_regular(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ipkeep-records-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn record(id: &str, netns: &str) -> SandboxRecord {
        SandboxRecord {
            container_id: id.into(),
            netns: netns.into(),
            namespace: "db".into(),
            name: "web-0".into(),
            uid: "u1".into(),
            established: false,
            ips: vec![],
        }
    }

    #[test]
    fn a_symlinked_records_directory_is_refused() {
        let dir = scratch("link");
        std::fs::create_dir_all(dir.join("real")).unwrap();
        std::os::unix::fs::symlink(dir.join("real"), dir.join("link")).unwrap();
        assert!(Records::open(dir.join("link"), "p-".into()).is_err());
        assert!(Records::open(dir.join("real"), "p-".into()).is_ok());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn records_round_trip_and_garbage_is_skipped() {
        let dir = scratch("rt");
        let records = Records::open(dir.clone(), "ipk-0000abcd-".into()).unwrap();
        let id = "a".repeat(64);
        let mut r = record(&id, "ipk-0000abcd-aaaa");
        records.write(&r).unwrap();
        r.established = true;
        records.write(&r).unwrap();
        std::fs::write(dir.join("junk.json"), "{}").unwrap();
        std::fs::write(dir.join(format!("{}.json", "b".repeat(64))), "not json").unwrap();
        let foreign = record(&"c".repeat(64), "some-other-netns");
        std::fs::write(
            dir.join(format!("{}.json", "c".repeat(64))),
            serde_json::to_vec(&foreign).unwrap(),
        )
        .unwrap();
        std::os::unix::fs::symlink(
            dir.join(format!("{id}.json")),
            dir.join(format!("{}.json", "d".repeat(64))),
        )
        .unwrap();
        assert_eq!(records.load().unwrap(), vec![r]);
        records.remove(&id).unwrap();
        records.remove(&id).unwrap();
        assert!(records.write(&record("../x", "ipk-0000abcd-aa")).is_err());
        // Symlinks planted at the temporary or the final name are replaced, never written through.
        let outside = dir.join("outside");
        std::fs::write(&outside, "untouched").unwrap();
        let planted = "e".repeat(64);
        std::os::unix::fs::symlink(&outside, dir.join(format!("{planted}.json.tmp"))).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join(format!("{planted}.json"))).unwrap();
        records.write(&record(&planted, "ipk-0000abcd-ee")).unwrap();
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "untouched");
        assert!(is_regular(&dir.join(format!("{planted}.json"))));
        records.remove(&planted).unwrap();
        assert!(records.remove("../x").is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
