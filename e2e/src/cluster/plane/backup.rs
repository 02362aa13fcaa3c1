//! etcd backed up and restored as an operator does it: `etcdctl snapshot save` against the
//! running member, and `etcdutl snapshot restore` into a new data directory that etcd is then
//! started on (etcd's "Disaster recovery" guide, Kubernetes' "Restoring an etcd cluster").
//! etcdctl and etcdutl are built by `e2e/cluster/build.sh --etcd-tools`, at the plane's etcd
//! version.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::{ControlPlane, ControlPlaneError};
use crate::command::{self, Stdin};

/// How far `etcdutl snapshot restore --bump-revision` moves the revision: the value etcd's and
/// Kubernetes' restore guidance uses, far beyond the writes a cluster makes between a backup and
/// its restore, so every revision a client saw before the restore is below the restored store's.
pub const BUMP_REVISION: u64 = 1_000_000_000;

/// The directory of etcdctl and etcdutl: `IPKEEP_ETCD_TOOLS_BIN_DIR`, else what
/// `e2e/cluster/build.sh --print-etcd-tools-bin-dir` names; checked to hold both.
pub fn etcd_tools_bin_dir() -> Result<PathBuf, ControlPlaneError> {
    let dir = match std::env::var_os("IPKEEP_ETCD_TOOLS_BIN_DIR").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("cluster/build.sh");
            let out = command::stdout_of(
                Command::new(&script).arg("--print-etcd-tools-bin-dir"),
                Stdin::Empty,
            )
            .map_err(|source| ControlPlaneError::BinDir { script, source })?;
            PathBuf::from(out.trim())
        }
    };
    match ["etcdctl", "etcdutl"]
        .iter()
        .find(|b| !dir.join(b).is_file())
    {
        Some(missing) => Err(ControlPlaneError::EtcdToolsMissing {
            dir,
            missing: (*missing).to_owned(),
        }),
        None => Ok(dir),
    }
}

/// How etcd is restored from a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revisions {
    /// `--bump-revision` [`BUMP_REVISION`] `--mark-compacted`: revisions go on upwards, and
    /// every watch from before the restore ends with 410 Gone, so clients list again.
    Bumped,
    /// As the snapshot left them: revisions go back to the snapshot's.
    AsSaved,
}

impl ControlPlane {
    /// `etcdctl snapshot save to` against the running etcd.
    pub fn etcd_snapshot_save(&self, to: &Path) -> Result<(), ControlPlaneError> {
        let tools = etcd_tools_bin_dir()?;
        command::checked(
            Command::new(tools.join("etcdctl"))
                .arg(format!("--endpoints={}", self.etcd_client_url()))
                .args(["snapshot", "save"])
                .arg(to),
            Stdin::Empty,
        )
        .map(drop)
        .map_err(|source| ControlPlaneError::EtcdTool {
            what: "snapshot save",
            source,
        })
    }

    /// etcd stopped, its data directory removed, `etcdutl snapshot restore snapshot` into a new
    /// one at the same place (the member's name and peer URL as etcd is started with), etcd
    /// started on it; returns once it is ready. kube-apiserver and the rest are the caller's to
    /// restart, as the guides say.
    pub async fn etcd_snapshot_restore(
        &self,
        snapshot: &Path,
        revisions: Revisions,
    ) -> Result<(), ControlPlaneError> {
        let tools = etcd_tools_bin_dir()?;
        let data = self.etcd_data_dir();
        let peer = self.etcd_peer_url();
        let mut restore = Command::new(tools.join("etcdutl"));
        restore
            .args(["snapshot", "restore"])
            .arg(snapshot)
            .arg("--data-dir")
            .arg(&data)
            .args(["--name", "ipkeep"])
            .arg(format!("--initial-cluster=ipkeep={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"));
        if revisions == Revisions::Bumped {
            restore
                .arg(format!("--bump-revision={BUMP_REVISION}"))
                .arg("--mark-compacted");
        }
        let mut outcome = Ok(());
        self.restart_component_with("etcd", Duration::from_secs(5), async {
            outcome = std::fs::remove_dir_all(&data)
                .map_err(|source| ControlPlaneError::StateDir {
                    action: "remove etcd's data directory in",
                    path: data.clone(),
                    source,
                })
                .and_then(|()| {
                    command::checked(&mut restore, Stdin::Empty)
                        .map(drop)
                        .map_err(|source| ControlPlaneError::EtcdTool {
                            what: "snapshot restore",
                            source,
                        })
                });
        })
        .await?;
        outcome
    }
}
