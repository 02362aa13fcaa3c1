//! The host side of sandboxes: `ip netns`, links, the addresses inside a namespace, and the
//! execution of CNI plugins the way a runtime executes them. Blocking; the stand-in calls it
//! from `spawn_blocking`.

use std::{
    io::Write as _,
    net::IpAddr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use serde_json::Value;

use super::cni::{self, Attachment, CniCommand, CniFailure, POD_IFNAME};

/// Where `ip netns add` puts named network namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// A failed `ip` command.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// `ip` could not be started.
    #[error("failed to run `ip {args}`")]
    Spawn {
        /// The arguments.
        args: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `ip` exited unsuccessfully.
    #[error("failed to run `ip {args}`: {stderr}")]
    Failed {
        /// The arguments.
        args: String,
        /// What it said.
        stderr: String,
    },
    /// The namespace directory could not be listed.
    #[error("failed to list {NETNS_DIR}")]
    ListNetns(#[source] std::io::Error),
    /// Another stand-in holds the node's lock.
    #[error("failed to lock {path}: {reason}")]
    Locked {
        /// The lock file.
        path: PathBuf,
        /// Why (another stand-in runs for this node or data directory, or an OS error).
        reason: String,
    },
    /// `ip -j addr` printed something unexpected.
    #[error("failed to read the addresses in network namespace {netns}: {reason}")]
    Addresses {
        /// The namespace.
        netns: String,
        /// What was wrong.
        reason: String,
    },
}

fn ip(args: &[&str]) -> Result<String, HostError> {
    let output = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| HostError::Spawn {
            args: args.join(" "),
            source,
        })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(HostError::Failed {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

/// Where the per-node-name locks live (the bridge and namespaces are named from the node's name,
/// so two stand-ins for one name on a machine would tear down each other's sandboxes).
pub const LOCK_DIR: &str = "/run/ipkeep-e2e";

/// Takes the stand-in's exclusive locks, held as long as the returned files live: on
/// `<data-dir>/lock` (two stand-ins sharing a data directory would free each other's addresses
/// with GC) and on `/run/ipkeep-e2e/node-<tag>.lock`.
pub fn lock_node(data_dir: &Path, tag: &str) -> Result<Vec<std::fs::File>, HostError> {
    let lock = |path: PathBuf| -> Result<std::fs::File, HostError> {
        let err = |reason: String| HostError::Locked {
            path: path.clone(),
            reason,
        };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| err(e.to_string()))?;
        }
        if std::fs::symlink_metadata(&path).is_ok_and(|m| !m.file_type().is_file()) {
            return Err(err("not a regular file".into()));
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| err(e.to_string()))?;
        match file.try_lock() {
            Ok(()) => Ok(file),
            Err(std::fs::TryLockError::WouldBlock) => Err(err(
                "another stand-in runs for this node or data directory".into(),
            )),
            Err(std::fs::TryLockError::Error(e)) => Err(err(e.to_string())),
        }
    };
    Ok(vec![
        lock(data_dir.join("lock"))?,
        lock(Path::new(LOCK_DIR).join(format!("node-{tag}.lock")))?,
    ])
}

/// Whether this process runs with effective UID 0 (from `/proc/self/status`).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().nth(1).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// The path runtimes pass as `CNI_NETNS` for a named namespace.
pub fn netns_path(name: &str) -> String {
    format!("{NETNS_DIR}/{name}")
}

/// `ip netns add <name>`, then the namespace's loopback up (as a runtime's `loopback` plugin).
pub fn add_netns(name: &str) -> Result<(), HostError> {
    ip(&["netns", "add", name])?;
    ip(&["-n", name, "link", "set", "lo", "up"]).map(drop)
}

/// `ip netns del <name>`; a namespace that is already gone is fine.
pub fn delete_netns(name: &str) -> Result<(), HostError> {
    if !Path::new(&netns_path(name)).exists() {
        return Ok(());
    }
    ip(&["netns", "del", name]).map(drop)
}

/// The named namespaces starting with `prefix`.
pub fn list_netns(prefix: &str) -> Result<Vec<String>, HostError> {
    let entries = match std::fs::read_dir(NETNS_DIR) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(HostError::ListNetns(e)),
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix))
        .collect();
    names.sort();
    Ok(names)
}

/// Whether a network interface of this name exists on the host.
pub fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// `ip link del <name>`; a link that is already gone is fine.
pub fn delete_link(name: &str) -> Result<(), HostError> {
    if !link_exists(name) {
        return Ok(());
    }
    ip(&["link", "del", name]).map(drop)
}

/// The global addresses of the pod interface inside a namespace, read with `ip -j addr`.
pub fn pod_addresses(netns: &str) -> Result<Vec<(IpAddr, u8)>, HostError> {
    let text = ip(&["-n", netns, "-j", "addr", "show", "dev", POD_IFNAME])?;
    cni::parse_ip_addr_json(&text, POD_IFNAME).map_err(|reason| HostError::Addresses {
        netns: netns.to_owned(),
        reason,
    })
}

/// Fills a node's CNI bin directory: symlinks `bridge` (Debian's, usually `/usr/lib/cni/bridge`)
/// and `ipkeep` (the built plugin) into `dir`, which is created if missing.
pub fn link_cni_bin_dir(dir: &Path, bridge: &Path, ipkeep: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, target) in [("bridge", bridge), ("ipkeep", ipkeep)] {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_ok() {
            std::fs::remove_file(&link)?;
        }
        std::os::unix::fs::symlink(target, link)?;
    }
    Ok(())
}

/// Executes CNI plugins found in the node's CNI bin directories (`CNI_PATH`).
#[derive(Debug, Clone)]
pub struct CniExec {
    /// The directories searched, in order.
    pub bin_dirs: Vec<PathBuf>,
    /// The network configuration (stdin of ADD and DEL).
    pub config: Value,
}

impl CniExec {
    fn cni_path(&self) -> String {
        self.bin_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    }

    /// The plugin binary named `kind`, from the first directory that has it.
    pub fn find(&self, kind: &str) -> Option<PathBuf> {
        self.bin_dirs
            .iter()
            .map(|d| d.join(kind))
            .find(|p| p.is_file())
    }

    fn exec(
        &self,
        kind: &str,
        command: CniCommand,
        attachment: Option<&Attachment>,
        stdin: &Value,
    ) -> Result<Vec<u8>, CniFailure> {
        let missing = || CniFailure {
            code: 999,
            msg: format!(
                "failed to find plugin {kind:?} in the CNI path {}",
                self.cni_path()
            ),
            details: String::new(),
        };
        let bin = self.find(kind).ok_or_else(missing)?;
        let mut child = Command::new(&bin)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(cni::cni_env(command, attachment, &self.cni_path()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| CniFailure {
                code: 999,
                msg: format!("failed to execute plugin {}: {e}", bin.display()),
                details: String::new(),
            })?;
        if let Some(mut input) = child.stdin.take() {
            // A plugin that exits without reading its stdin is judged by its reply, not by this.
            let _ = input.write_all(stdin.to_string().as_bytes());
        }
        let output = child.wait_with_output().map_err(|e| CniFailure {
            code: 999,
            msg: format!("failed to wait for plugin {}: {e}", bin.display()),
            details: String::new(),
        })?;
        if output.status.success() {
            Ok(output.stdout)
        } else {
            Err(cni::parse_error(
                &output.stdout,
                &output.stderr,
                output.status.code(),
            ))
        }
    }

    /// CNI ADD of the network's plugin; the addresses of its result.
    pub fn add(&self, attachment: &Attachment) -> Result<Vec<(IpAddr, u8)>, CniFailure> {
        let kind = self.main_type();
        let stdout = self.exec(&kind, CniCommand::Add, Some(attachment), &self.config)?;
        cni::parse_add_result(&stdout)
    }

    /// CNI DEL of the network's plugin.
    pub fn del(&self, attachment: &Attachment) -> Result<(), CniFailure> {
        let kind = self.main_type();
        self.exec(&kind, CniCommand::Del, Some(attachment), &self.config)
            .map(drop)
    }

    /// CNI GC of the IPAM plugin with the attachments that are still valid.
    pub fn gc(&self, valid: &[(String, String)]) -> Result<(), CniFailure> {
        let kind = cni::ipam_type(&self.config).unwrap_or("ipkeep").to_owned();
        let config = cni::gc_config(&self.config, valid);
        self.exec(&kind, CniCommand::Gc, None, &config).map(drop)
    }

    fn main_type(&self) -> String {
        self.config
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("bridge")
            .to_owned()
    }
}
