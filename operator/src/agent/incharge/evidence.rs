//! Reading the in-charge evidence from the node's disk: the CNI configuration directory and the
//! CNI bin directory, both as the agent mounts them (the chart values) or as the node's container
//! runtime names them under the node's root ([`Dirs::Discovered`], found again at every read, so
//! a runtime reconfigured and restarted is followed). Only regular files directly in each
//! directory are read (opened with `O_NOFOLLOW`, at most [`MAX_CONF`] bytes): a symlink or
//! anything else is reported as skipped, never followed out of the directory.

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::host_root::{HostRoot, HostRootError};
use crate::install_cni::{self, HOST_LOCAL, HOST_LOCAL_ORIG};

use crate::rules::incharge::{BinDir, Binary, ConfFile, Evidence, IPKEEP_TYPE, parse_conf};

/// The file name endings the runtime reads (libcni's `ConfFiles`: `.conf`, `.conflist`, `.json`).
const CONF_EXTENSIONS: [&str; 3] = ["conf", "conflist", "json"];
/// Larger than any network configuration; a larger file is skipped, not read.
pub const MAX_CONF: u64 = 1 << 20;

/// Where the CNI directories are.
#[derive(Debug, Clone)]
pub enum Dirs {
    /// Given (the chart values `cni.binDir`, `cni.confDir`, each mounted on its own).
    Fixed {
        /// The CNI configuration directory, as mounted in the agent.
        conf_dir: PathBuf,
        /// The same directory's path on the node (for messages).
        conf_dir_on_node: String,
        /// The CNI bin directory, as mounted in the agent.
        bin_dir: PathBuf,
        /// The same directory's path on the node (for messages).
        bin_dir_on_node: String,
    },
    /// Named by the node's container runtime's configuration, under the node's root mounted here.
    Discovered {
        /// Where the node's root is mounted.
        host_root: PathBuf,
    },
}

/// Where the evidence is, and what the plugin is.
#[derive(Debug, Clone)]
pub struct Sources {
    /// The CNI directories.
    pub dirs: Dirs,
    /// The plugin binary this agent's image carries (what `ipkeep` and a replaced `host-local` are).
    pub plugin: Vec<u8>,
}

/// Errors of reading the evidence (no verdict is made from what was read).
#[derive(Debug, thiserror::Error)]
pub enum EvidenceError {
    /// A directory cannot be listed.
    #[error("failed to list {}", path.display())]
    List {
        /// The directory, as mounted.
        path: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// The node runtime's configuration does not tell the directories (its message names the
    /// values to set): every network is not in charge, and says why.
    #[error(transparent)]
    Locate(#[from] HostRootError),
}

/// Reads the evidence now.
pub fn read(s: &Sources) -> Result<Evidence, EvidenceError> {
    let (conf_dir, conf_on_node, bin_dir, bin_on_node) = match &s.dirs {
        Dirs::Fixed {
            conf_dir,
            conf_dir_on_node,
            bin_dir,
            bin_dir_on_node,
        } => (
            Some(conf_dir.clone()),
            conf_dir_on_node.clone(),
            Some(bin_dir.clone()),
            bin_dir_on_node.clone(),
        ),
        Dirs::Discovered { host_root } => {
            let found = HostRoot::open(host_root)?.locate()?;
            (
                found.conf_dir,
                found.dirs.conf_dir,
                found.bin_dir,
                found.dirs.bin_dir,
            )
        }
    };
    // A directory the node lacks holds nothing (the chart's narrow mounts create theirs empty).
    let confs = match &conf_dir {
        Some(dir) => read_confs(dir)?,
        None => Vec::new(),
    };
    let binary_in = |name: &str| match &bin_dir {
        Some(dir) => binary(&dir.join(name), &s.plugin),
        None => Binary::Missing,
    };
    Ok(Evidence {
        conf_dir: conf_on_node,
        bin_dir: bin_on_node,
        confs,
        bin: BinDir {
            ipkeep: binary_in(IPKEEP_TYPE),
            host_local: binary_in(HOST_LOCAL),
            original_kept: bin_dir
                .as_ref()
                .is_some_and(|d| fs::symlink_metadata(d.join(HOST_LOCAL_ORIG)).is_ok()),
        },
    })
}

fn read_confs(dir: &Path) -> Result<Vec<ConfFile>, EvidenceError> {
    let listing = |source| EvidenceError::List {
        path: dir.to_owned(),
        source,
    };
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(listing)? {
        let name = entry.map_err(listing)?.file_name();
        let Some(name) = name.to_str() else { continue };
        let ours = Path::new(name)
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| CONF_EXTENSIONS.contains(&e));
        if ours {
            names.push(name.to_owned());
        }
    }
    names.sort();
    Ok(names
        .into_iter()
        .map(|name| match read_conf(&dir.join(&name)) {
            Ok(text) => parse_conf(&name, &text),
            Err(why) => ConfFile::Skipped { file: name, why },
        })
        .collect())
}

/// A configuration file's bytes, or why it was not read.
fn read_conf(path: &Path) -> Result<Vec<u8>, String> {
    let meta = fs::symlink_metadata(path).map_err(|e| e.to_string())?;
    if meta.file_type().is_symlink() {
        return Err("a symbolic link (not followed)".to_owned());
    }
    if !meta.is_file() {
        return Err("not a regular file".to_owned());
    }
    // O_NONBLOCK: a FIFO swapped in after the check above must not hang the agent; the fstat
    // after opening is what decides (a socket cannot be opened at all).
    let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK;
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits() as i32)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(code) if code == rustix::io::Errno::LOOP.raw_os_error() => {
                "a symbolic link (not followed)".to_owned()
            }
            Some(code) if code == rustix::io::Errno::NXIO.raw_os_error() => {
                "not a regular file".to_owned()
            }
            _ => e.to_string(),
        })?;
    if !file.metadata().map_err(|e| e.to_string())?.is_file() {
        return Err("not a regular file".to_owned());
    }
    let mut text = Vec::new();
    file.take(MAX_CONF + 1)
        .read_to_end(&mut text)
        .map_err(|e| e.to_string())?;
    if text.len() as u64 > MAX_CONF {
        return Err(format!("larger than {MAX_CONF} bytes"));
    }
    Ok(text)
}

/// What `path` is: this image's plugin, something else, or nothing.
fn binary(path: &Path, plugin: &[u8]) -> Binary {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Binary::Missing,
        Err(_) => Binary::Other,
        Ok(meta) => match install_cni::is_installed(&meta, path, plugin) {
            Ok(true) => Binary::Ipkeep,
            Ok(false) | Err(_) => Binary::Other,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory (removed when dropped) with `conf/` and `bin/` in it.
    fn scratch() -> tempfile::TempDir {
        let tmp = tempfile::Builder::new()
            .prefix("ipkeep-incharge-")
            .tempdir()
            .unwrap();
        fs::create_dir_all(tmp.path().join("conf")).unwrap();
        fs::create_dir_all(tmp.path().join("bin")).unwrap();
        tmp
    }

    #[test]
    fn symlinks_are_skipped_and_other_files_ignored() {
        let tmp = scratch();
        let dir = tmp.path();
        let conf = dir.join("conf");
        let outside = dir.join("outside.conflist");
        fs::write(
            &outside,
            r#"{"name": "evil", "type": "bridge", "ipam": {"type": "ipkeep"}}"#,
        )
        .unwrap();
        std::os::unix::fs::symlink(&outside, conf.join("05-link.conflist")).unwrap();
        fs::write(
            conf.join("10-cbr0.conflist"),
            r#"{"name": "cbr0", "plugins": [{"type": "bridge", "ipam": {"type": "host-local"}}]}"#,
        )
        .unwrap();
        fs::write(conf.join("README"), "not a configuration").unwrap();
        let plugin = b"#!ipkeep".to_vec();
        fs::write(dir.join("bin/ipkeep"), &plugin).unwrap();
        let s = Sources {
            dirs: Dirs::Fixed {
                conf_dir: conf,
                conf_dir_on_node: "/etc/cni/net.d".into(),
                bin_dir: dir.join("bin"),
                bin_dir_on_node: "/opt/cni/bin".into(),
            },
            plugin,
        };
        let e = read(&s).unwrap();
        assert_eq!(
            e.confs,
            vec![
                ConfFile::Skipped {
                    file: "05-link.conflist".into(),
                    why: "a symbolic link (not followed)".into()
                },
                parse_conf(
                    "10-cbr0.conflist",
                    br#"{"name": "cbr0", "plugins": [{"type": "bridge", "ipam": {"type": "host-local"}}]}"#
                ),
            ]
        );
        // The mode is not the installed binary's, so it is not taken for the installed plugin.
        assert_eq!(e.bin.ipkeep, Binary::Other);
        assert_eq!(e.bin.host_local, Binary::Missing);
        assert!(!e.bin.original_kept);
    }
}
