//! A pool's state file, `<data-dir>/state/<pool-id>.json`: what the engine asked for (the pool,
//! its retention, whether a network uses it) and the retentions by name. Written whole, atomically
//! and fsync'd, always under the pool's lock: it is what must survive a reboot.

use std::collections::BTreeMap;

use ipkeep_netdir::{DirFd, NetDirError};

use crate::decide::Retention;

/// A state file larger than this is not ours (a /16 full of retentions is about 5 MB).
const MAX_STATE_FILE: usize = 64 << 20;
/// State files are the driver's alone.
const STATE_MODE: u32 = 0o600;

/// Errors of the state files.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Reading or writing failed.
    #[error(transparent)]
    Disk(#[from] NetDirError),
    /// The file is not a state file.
    #[error("failed to parse pool state {path}")]
    Parse {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
}

/// Whether a change must survive a power loss, or only a crash of the driver (which loses
/// nothing written: the page cache outlives the process).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// fsync: a new retention, a pool requested or released.
    Fsync,
    /// No fsync: a retention ended (by its name's return or by expiry). Lost to a power loss, it
    /// comes back and is ended again: after the reboot the engine asks again for every
    /// container it restarts (the name gets its address back, ending the retention), and a
    /// retention of a container not restarted is right to stand.
    PageCache,
}

/// One pool's state.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolState {
    /// How long a released named address is held, in seconds.
    pub retain_for_secs: u64,
    /// Whether a network holds the pool (between `RequestPool` and `ReleasePool`).
    pub active: bool,
    /// Retentions by container name.
    pub retained: BTreeMap<String, Retention>,
}

fn file_name(pool_id: &str) -> String {
    format!("{pool_id}.json")
}

impl PoolState {
    /// Reads the state of `pool_id`; `None` if the pool was never requested.
    pub fn load(dir: &DirFd, pool_id: &str) -> Result<Option<Self>, StateError> {
        let name = file_name(pool_id);
        let Some(bytes) = dir.read_file(&name, MAX_STATE_FILE)? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| StateError::Parse {
                path: dir.child_path(&name).display().to_string(),
                source,
            })
    }

    /// Replaces the state of `pool_id` atomically (temporary file, rename); with
    /// [`Durability::Fsync`] the file and the directory are fsync'd too.
    pub fn save(
        &self,
        dir: &DirFd,
        pool_id: &str,
        durability: Durability,
    ) -> Result<(), StateError> {
        let mut bytes = serde_json::to_vec(self).unwrap_or_default();
        bytes.push(b'\n');
        let fsync = durability == Durability::Fsync;
        dir.write_atomic(&file_name(pool_id), &bytes, STATE_MODE, fsync)?;
        Ok(())
    }

    /// The pool IDs that have a state file, sorted.
    pub fn pool_ids(dir: &DirFd) -> Result<Vec<String>, StateError> {
        let mut ids: Vec<String> = dir
            .list()?
            .into_iter()
            .filter_map(|n| n.strip_suffix(".json").map(str::to_owned))
            .collect();
        ids.sort();
        Ok(ids)
    }
}
