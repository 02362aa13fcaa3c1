//! `ipkeep-operator install-cni`: the agent DaemonSet's init container copies the plugin binary
//! into the node's CNI bin directory.
//!
//! The runtime may exec the plugin at any moment, so the new binary is written to a temporary
//! file in the same directory, fsynced, made executable and renamed over the old one (then the
//! directory is fsynced): the runtime sees the old binary or the new one, never a half-written
//! one. An identical binary already in place is left alone (same inode, same mtime), and
//! temporaries a killed earlier run left behind are removed, so the command is safe to re-run.
//!
//! With `--replace-host-local` (the chart's `cni.replaceHostLocal`, for clusters whose CNI
//! configuration cannot be edited) the plugin is also installed *as* `host-local`: the original
//! is first kept as `host-local.ipkeep-orig` with a hard link (only if no original is kept yet,
//! so re-running never keeps ipkeep as "the original"), then ipkeep is renamed over `host-local`.
//! `--restore-host-local` renames the original back. Every step is a link or a rename in one
//! directory, so the node always has a working `host-local`. Without `--replace-host-local` the
//! init container puts a kept original back too, so `helm upgrade --set
//! cni.replaceHostLocal=false` restores host-local on every node.
//!
//! The agent's preStop runs `--restore-host-local --if-daemonset-gone NAMESPACE/NAME`: it asks
//! the API server for the agent's DaemonSet and restores only when ipkeep is leaving the node
//! (the DaemonSet is gone or being deleted, or the release's credentials are already gone), never
//! when the pod is only replaced (upgrade, rollout, eviction): a returning pod started in between
//! would otherwise get plain host-local's next address instead of its reserved one. The decision
//! over what the API server answered is [`DaemonSetSeen::restore`].

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Prefix of the temporary files (hidden, so no runtime takes one for a plugin).
pub const TEMP_PREFIX: &str = ".ipkeep-install-";

/// Mode of the installed binary.
const BINARY_MODE: u32 = 0o755;

/// What to do about a bin directory another user could change.
pub const TRUST_HINT: &str = "the runtime runs every plugin there as root, so no other user may be able to change it: give it (and the directories on its way) to root, not writable by group or others, or set cni.binDir to a directory that is";

/// Why a directory on the way to the CNI bin directory (`last`: the bin directory itself), of
/// owner `uid`, group `gid` and `mode`, lets another user change what the runtime runs (`None`:
/// only root, or install-cni's own user, can). The runtime runs every plugin found there as root,
/// so whoever can write there, or rename a directory on the way, runs code as root on the node;
/// as sshd's StrictModes does for a user's keys, install-cni refuses to write into such a
/// directory rather than hand that user root. A sticky world-writable directory on the way (`/tmp`)
/// is allowed: its other users cannot rename what is not theirs. The bin directory itself never.
pub(crate) fn why_untrusted(uid: u32, gid: u32, mode: u32, last: bool) -> Option<String> {
    let euid = rustix::process::geteuid().as_raw();
    let sticky = mode & 0o1000 != 0 && !last;
    if uid != 0 && uid != euid {
        Some(format!("is owned by uid {uid}, not root"))
    } else if mode & 0o002 != 0 && !sticky {
        Some(format!(
            "is writable by every user (mode {:o})",
            mode & 0o7777
        ))
    } else if mode & 0o020 != 0 && gid != 0 && !sticky {
        Some(format!(
            "is writable by group {gid} (mode {:o})",
            mode & 0o7777
        ))
    } else {
        None
    }
}

/// Refuses the bin directory `dir` as mounted here (`--to`) when it is a symbolic link or another
/// user could change it ([`why_untrusted`]); a missing one is created by [`install`], root's.
fn check_mounted(dir: &Path) -> Result<(), InstallError> {
    let meta = match fs::symlink_metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(InstallError::Target {
                step: "inspect",
                path: dir.to_owned(),
                source,
            });
        }
    };
    let untrusted = |why: String| InstallError::Untrusted {
        path: dir.to_owned(),
        why,
    };
    if meta.file_type().is_symlink() {
        return Err(untrusted(format!(
            "it is a symbolic link to {} (a hostPath mount never is; not followed)",
            fs::read_link(dir).unwrap_or_default().display()
        )));
    }
    if !meta.is_dir() {
        return Err(untrusted("it is not a directory".to_owned()));
    }
    match why_untrusted(meta.uid(), meta.gid(), meta.mode(), true) {
        Some(why) => Err(untrusted(format!("it {why}"))),
        None => Ok(()),
    }
}

/// Command-line flags of `ipkeep-operator install-cni`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The plugin binary to install (inside the image).
    #[arg(long, default_value = "/ipkeep")]
    pub from: PathBuf,
    /// The node's CNI bin directory as mounted here (the chart's narrow mount, with `cni.binDir`
    /// set). Without it and without `--host-root`: `/host/opt/cni/bin`.
    #[arg(long, conflicts_with = "host_root")]
    pub to: Option<PathBuf>,
    /// `--to`'s path on the node, for messages (the chart passes `cni.binDir`).
    #[arg(long, requires = "to")]
    pub to_on_node: Option<String>,
    /// The node's root filesystem as mounted here (the chart's `/host`, with `cni.binDir` unset):
    /// the CNI bin directory is the one the node's container runtime's configuration names
    /// (`rules::cni_dirs`), resolved under this root and created when missing.
    #[arg(long, value_name = "DIR")]
    pub host_root: Option<PathBuf>,
    /// This node's name, for messages (the chart passes it from the downward API).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// File name in `--to` (default: the file name of `--from`).
    #[arg(long)]
    pub name: Option<String>,
    /// Also install the plugin as `host-local`, keeping the original as
    /// `host-local.ipkeep-orig` (once: an original already kept is never overwritten).
    #[arg(long, conflicts_with = "restore_host_local")]
    pub replace_host_local: bool,
    /// Only put the original `host-local` back (from `host-local.ipkeep-orig`); nothing is
    /// installed. Does nothing when no original is kept.
    #[arg(long)]
    pub restore_host_local: bool,
    /// With `--restore-host-local`: restore only if this DaemonSet (the agent's own) is gone or
    /// being deleted, that is when ipkeep is being removed from the node; a pod replaced while
    /// the DaemonSet stays (upgrade, rollout, eviction) leaves ipkeep in place.
    #[arg(long, value_name = "NAMESPACE/NAME", requires = "restore_host_local")]
    pub if_daemonset_gone: Option<String>,
}

/// The name of the binary `--replace-host-local` takes the place of.
pub const HOST_LOCAL: &str = "host-local";

/// Where the original `host-local` is kept while ipkeep stands in for it.
pub const HOST_LOCAL_ORIG: &str = "host-local.ipkeep-orig";

/// Errors of installing the binary.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// `--replace-host-local` found no `host-local` to replace.
    #[error(
        "failed to replace host-local in {}: there is no host-local there (is it the directory your CNI configuration's plugins are in?)",
        dir.display()
    )]
    NoHostLocal {
        /// The CNI bin directory.
        dir: PathBuf,
    },
    /// `host-local` is already ipkeep but no original is kept: it cannot be kept now.
    #[error(
        "failed to keep the original host-local in {}: host-local is already ipkeep and {HOST_LOCAL_ORIG} is missing; put the original host-local back by hand",
        dir.display()
    )]
    OriginalLost {
        /// The CNI bin directory.
        dir: PathBuf,
    },
    /// `--from` cannot be read or is not a regular file.
    #[error("failed to read the plugin binary {}", path.display())]
    Source {
        /// The source path.
        path: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// The target name is not a plain file name.
    #[error("failed to install as {0:?}: the name must be a single path component")]
    BadName(String),
    /// `--if-daemonset-gone` is not `NAMESPACE/NAME`.
    #[error("failed to use --if-daemonset-gone {0:?}: it must be NAMESPACE/NAME")]
    BadDaemonSet(String),
    /// No Kubernetes client could be built to look the DaemonSet up.
    #[error("failed to build a Kubernetes client to look up the agent's DaemonSet")]
    Client(#[source] kube::Error),
    /// The async runtime for the look-up could not start.
    #[error("failed to start the runtime for the DaemonSet look-up")]
    Runtime(#[source] io::Error),
    /// The bin directory (as mounted here) is one another user could redirect or write into.
    #[error("failed to trust {}: {why}; {TRUST_HINT}", path.display())]
    Untrusted {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// A step in the target directory failed.
    #[error("failed to {step} {}", path.display())]
    Target {
        /// What was being done.
        step: &'static str,
        /// On which path.
        path: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
}

/// What [`install`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// There was no binary: it was installed.
    Installed,
    /// A different binary was replaced.
    Replaced,
    /// An identical binary was already there and was left alone.
    Unchanged,
}

/// What [`replace_host_local`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replacement {
    /// The original was kept now (false: it had been kept by an earlier run).
    pub kept_original: bool,
    /// What installing ipkeep as `host-local` did.
    pub installed: Outcome,
}

/// What [`restore_host_local`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restore {
    /// The original was renamed back over `host-local`.
    Restored,
    /// No original was kept: nothing was changed.
    NothingKept,
}

/// What the API server said about the agent's DaemonSet when its pod stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DaemonSetSeen {
    /// It exists and is not being deleted: this pod is being replaced.
    Present,
    /// It has a deletionTimestamp (a foreground delete): ipkeep is leaving.
    Deleting,
    /// 404: it was deleted (`helm uninstall`, `kubectl delete`).
    Gone,
    /// 401 or 403: the pod's ServiceAccount or its RBAC is already gone, which happens only
    /// when the release itself is removed (Helm deletes them right after the DaemonSet).
    CredentialsRevoked(u16),
    /// No answer that says either (the API server unreachable, a 5xx, a timeout).
    Unknown(String),
}

impl DaemonSetSeen {
    /// Classifies the answer to a GET of the DaemonSet (`Ok`: whether it has a
    /// deletionTimestamp).
    pub fn from_get(answer: Result<bool, kube::Error>) -> Self {
        match answer {
            Ok(false) => Self::Present,
            Ok(true) => Self::Deleting,
            Err(kube::Error::Api(status)) if status.code == 404 => Self::Gone,
            Err(kube::Error::Api(status)) if matches!(status.code, 401 | 403) => {
                Self::CredentialsRevoked(status.code)
            }
            Err(e) => Self::Unknown(crate::runtime::logging::error_chain(&e)),
        }
    }

    /// Whether to put the original host-local back. Only when ipkeep is leaving the node; when
    /// the answer says nothing, ipkeep stays: a wrong restore silently hands reserved addresses
    /// to other pods, a missed one leaves ipkeep standing in for host-local (a drop-in that
    /// keeps working) until the next install or a manual `--restore-host-local`.
    pub fn restore(&self) -> bool {
        matches!(
            self,
            Self::Deleting | Self::Gone | Self::CredentialsRevoked(_)
        )
    }

    /// Whether asking again may give an answer that decides.
    pub fn worth_retrying(&self) -> bool {
        matches!(self, Self::Unknown(_))
    }
}

impl std::fmt::Display for DaemonSetSeen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Present => f.write_str("it exists: this pod is being replaced"),
            Self::Deleting => f.write_str("it is being deleted"),
            Self::Gone => f.write_str("it is gone"),
            Self::CredentialsRevoked(code) => write!(
                f,
                "the API server refused the look-up ({code}): the release's account is gone"
            ),
            Self::Unknown(why) => write!(f, "no answer ({why})"),
        }
    }
}

/// How long the preStop asks the API server before it gives up (ipkeep then stays): well within
/// the pod's default 30 s grace period, which also covers the agent's last pass.
const LOOKUP_BUDGET: std::time::Duration = std::time::Duration::from_secs(10);

/// Splits `NAMESPACE/NAME`.
fn daemonset_ref(text: &str) -> Result<(&str, &str), InstallError> {
    match text.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns, name))
        }
        _ => Err(InstallError::BadDaemonSet(text.to_owned())),
    }
}

/// Asks the API server (in-cluster configuration, or `KUBECONFIG`) about the DaemonSet, again
/// after a pause while the answer says nothing, for at most [`LOOKUP_BUDGET`].
fn look_up_daemonset(namespace: &str, name: &str) -> Result<DaemonSetSeen, InstallError> {
    use k8s_openapi::api::apps::v1::DaemonSet;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(InstallError::Runtime)?;
    runtime.block_on(async {
        let client = kube::Client::try_default()
            .await
            .map_err(InstallError::Client)?;
        let api: kube::Api<DaemonSet> = kube::Api::namespaced(client, namespace);
        let deadline = tokio::time::Instant::now() + LOOKUP_BUDGET;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let seen = match tokio::time::timeout(left, api.get(name)).await {
                Ok(answer) => DaemonSetSeen::from_get(
                    answer.map(|ds| ds.metadata.deletion_timestamp.is_some()),
                ),
                Err(_) => DaemonSetSeen::Unknown("timed out".to_owned()),
            };
            let pause = std::time::Duration::from_millis(500);
            if !seen.worth_retrying() || left <= pause {
                return Ok(seen);
            }
            eprintln!("install-cni: DaemonSet {namespace}/{name}: {seen}; asking again");
            tokio::time::sleep(pause).await;
        }
    })
}

/// The chart's default for the narrow mount (`cni.binDir` set, no `--to`).
const DEFAULT_TO: &str = "/host/opt/cni/bin";

/// Where the directory install-cni works in came from, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The chart value `cni.binDir` (`--to`).
    Value,
    /// The node's container runtime's configuration (`--host-root`).
    Runtime(crate::rules::cni_dirs::Source),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Value => f.write_str("the chart value cni.binDir"),
            Self::Runtime(source) => write!(f, "named by {source}"),
        }
    }
}

/// The CNI bin directory install-cni works in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BinDir {
    /// As reachable here (`None`: it does not exist on the node; only a restore accepts that).
    pub here: Option<PathBuf>,
    /// As the node names it.
    pub on_node: String,
    /// Where it came from.
    pub origin: Origin,
}

/// An install-cni failure as the admin reads it: the node, the directory by its node path and
/// the value that chose it, what went wrong and what to change.
#[derive(Debug, thiserror::Error)]
#[error("node {node}: failed to {action} in the CNI bin directory {on_node} ({origin}): {cause}")]
pub struct NodeError {
    /// The node's name (`?` when `NODE_NAME` is not set).
    pub node: String,
    /// What install-cni was doing.
    pub action: &'static str,
    /// The directory's node path.
    pub on_node: String,
    /// Where it came from.
    pub origin: Origin,
    /// What went wrong and what to change.
    pub cause: String,
}

/// install-cni could not tell which CNI bin directory the node's runtime uses (`--host-root`).
#[derive(Debug, thiserror::Error)]
#[error("node {node}: failed to find the CNI bin directory the container runtime uses")]
pub struct LocateError {
    /// The node's name (`?` when `NODE_NAME` is not set).
    pub node: String,
    /// Why (its message ends with the values to set).
    #[source]
    pub source: crate::host_root::HostRootError,
}

/// The fix for the value that named the directory.
fn set_bin_dir(origin: &Origin) -> &'static str {
    match origin {
        Origin::Value => {
            "set cni.binDir to the directory the container runtime runs CNI plugins from, or leave it unset to use the one the runtime's configuration names"
        }
        Origin::Runtime(_) => {
            "set cni.binDir (and cni.confDir) to the directory the container runtime runs CNI plugins from"
        }
    }
}

/// What went wrong in `dir`, named by node paths, and what to change (pure).
pub fn explain(err: &InstallError, dir: &BinDir) -> String {
    let fix = set_bin_dir(&dir.origin);
    let text = crate::runtime::logging::error_chain(err);
    let text = match &dir.here {
        Some(here) => text.replace(&here.display().to_string(), &dir.on_node),
        None => text,
    };
    match err {
        InstallError::NoHostLocal { .. } => format!(
            "there is no host-local there to replace (cni.replaceHostLocal=true): the runtime does not find its plugins there; {fix}"
        ),
        InstallError::Target { source, .. }
            if matches!(
                source.kind(),
                io::ErrorKind::ReadOnlyFilesystem | io::ErrorKind::PermissionDenied
            ) =>
        {
            format!(
                "the directory is read-only here ({text}): a read-only /usr or an immutable node image keeps its own plugins there; {fix} on a writable disk"
            )
        }
        _ => text,
    }
}

/// The CNI bin directory from the flags: `--to` (the chart value), or the node runtime's own
/// under `--host-root` (created when `create`), or the chart's old default mount.
fn bin_dir(args: &Args, create: bool) -> Result<BinDir, LocateError> {
    let Some(root) = &args.host_root else {
        let here = args.to.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_TO));
        let on_node = args
            .to_on_node
            .clone()
            .unwrap_or_else(|| here.display().to_string());
        return Ok(BinDir {
            here: Some(here),
            on_node,
            origin: Origin::Value,
        });
    };
    let located = crate::host_root::HostRoot::open(root).and_then(|host| {
        let dirs = crate::rules::cni_dirs::discover(&host.runtime_configs()?)?;
        // Before anything is created on the way: nothing is changed in a directory refused.
        host.check_trusted(&dirs.bin_dir)?;
        let here = if create {
            Some(host.dir_or_create(&dirs.bin_dir)?)
        } else {
            host.dir(&dirs.bin_dir)?
        };
        Ok((dirs, here))
    });
    let (dirs, here) = located.map_err(|source| LocateError {
        node: node_name(args),
        source,
    })?;
    Ok(BinDir {
        here,
        on_node: dirs.bin_dir,
        origin: Origin::Runtime(dirs.source),
    })
}

fn node_name(args: &Args) -> String {
    args.node_name.clone().unwrap_or_else(|| "?".to_owned())
}

/// Runs the subcommand.
pub fn main(args: Args) -> anyhow::Result<()> {
    let dir = bin_dir(&args, !args.restore_host_local)?;
    let node_error = |action: &'static str| {
        let dir = dir.clone();
        let node = node_name(&args);
        move |err: InstallError| NodeError {
            node,
            action,
            cause: explain(&err, &dir),
            on_node: dir.on_node.clone(),
            origin: dir.origin.clone(),
        }
    };
    let on_node = |name: &str| format!("{}/{name}", dir.on_node);
    if args.restore_host_local {
        if let Some(text) = &args.if_daemonset_gone {
            let (namespace, name) = daemonset_ref(text)?;
            let seen = look_up_daemonset(namespace, name)?;
            if !seen.restore() {
                eprintln!(
                    "install-cni: DaemonSet {namespace}/{name}: {seen}; {} stays ipkeep",
                    on_node(HOST_LOCAL)
                );
                return Ok(());
            }
            eprintln!("install-cni: DaemonSet {namespace}/{name}: {seen}; restoring host-local");
        }
        let Some(here) = &dir.here else {
            eprintln!(
                "install-cni: {} does not exist: nothing to restore",
                dir.on_node
            );
            return Ok(());
        };
        if dir.origin == Origin::Value {
            check_mounted(here).map_err(node_error("restore host-local"))?;
        }
        match restore_host_local(here).map_err(node_error("restore host-local"))? {
            Restore::Restored => {
                eprintln!("install-cni: restored the original {}", on_node(HOST_LOCAL))
            }
            Restore::NothingKept => eprintln!(
                "install-cni: no {HOST_LOCAL_ORIG} in {}: nothing to restore",
                dir.on_node
            ),
        }
        return Ok(());
    }
    // Found with `create`: it exists (a restore alone accepts a directory the node lacks).
    let Some(here) = &dir.here else {
        return Err(node_error("create")(InstallError::Target {
            step: "create",
            path: PathBuf::from(&dir.on_node),
            source: io::Error::from(io::ErrorKind::NotFound),
        })
        .into());
    };
    if dir.origin == Origin::Value {
        check_mounted(here).map_err(node_error("install ipkeep"))?;
    }
    eprintln!(
        "install-cni: the CNI bin directory is {} ({})",
        dir.on_node, dir.origin
    );
    if args.replace_host_local {
        let done =
            replace_host_local(&args.from, here).map_err(node_error("replace host-local"))?;
        let kept = if done.kept_original {
            "kept the original as"
        } else {
            "the original was already kept as"
        };
        eprintln!(
            "install-cni: {} is ipkeep ({:?}); {kept} {}",
            on_node(HOST_LOCAL),
            done.installed,
            on_node(HOST_LOCAL_ORIG)
        );
    } else if restore_host_local(here).map_err(node_error("restore host-local"))?
        == Restore::Restored
    {
        eprintln!(
            "install-cni: restored the original {} (host-local is no longer replaced)",
            on_node(HOST_LOCAL)
        );
    }
    let outcome =
        install(&args.from, here, args.name.as_deref()).map_err(node_error("install ipkeep"))?;
    let name = target_name(&args.from, args.name.as_deref())?;
    let dest = on_node(&name);
    match outcome {
        Outcome::Installed => eprintln!("install-cni: installed {dest}"),
        Outcome::Replaced => eprintln!("install-cni: replaced {dest}"),
        Outcome::Unchanged => eprintln!("install-cni: {dest} is up to date"),
    }
    Ok(())
}

fn target_name(from: &Path, name: Option<&str>) -> Result<String, InstallError> {
    let name = match name {
        Some(n) => n.to_owned(),
        None => from
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned(),
    };
    if name.is_empty()
        || name == "."
        || name == ".."
        || name.contains('/')
        || name.contains('\0')
        || name.starts_with(TEMP_PREFIX)
    {
        return Err(InstallError::BadName(name));
    }
    Ok(name)
}

/// Installs `from` as `<to>/host-local`, first keeping the original as
/// `<to>/host-local.ipkeep-orig` (a hard link, so `host-local` never goes missing) unless an
/// original is kept already. Idempotent.
pub fn replace_host_local(from: &Path, to: &Path) -> Result<Replacement, InstallError> {
    let host_local = to.join(HOST_LOCAL);
    let orig = to.join(HOST_LOCAL_ORIG);
    let target = |step, path: &Path| {
        let path = path.to_owned();
        move |source| InstallError::Target { step, path, source }
    };
    let kept_original = match fs::symlink_metadata(&orig) {
        Ok(_) => false,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            match fs::symlink_metadata(&host_local) {
                Ok(meta) if meta.is_dir() => {
                    return Err(target("keep", &host_local)(io::Error::other(
                        "host-local is a directory",
                    )));
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(InstallError::NoHostLocal { dir: to.to_owned() });
                }
                Err(e) => return Err(target("inspect", &host_local)(e)),
            }
            let ours = fs::read(from).map_err(|source| InstallError::Source {
                path: from.to_owned(),
                source,
            })?;
            if fs::symlink_metadata(&host_local).is_ok_and(|m| m.is_file())
                && fs::read(&host_local).map_err(target("read", &host_local))? == ours
            {
                return Err(InstallError::OriginalLost { dir: to.to_owned() });
            }
            // link(2) does not follow a symlink (k3s's host-local is one, to its multi-call
            // binary: the link keeps the symlink itself) and fails if `orig` appeared meanwhile.
            match fs::hard_link(&host_local, &orig) {
                Ok(()) => true,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
                Err(e) => return Err(target("keep the original", &orig)(e)),
            }
        }
        Err(e) => return Err(target("inspect", &orig)(e)),
    };
    if kept_original {
        sync_dir(to)?;
    }
    let installed = install(from, to, Some(HOST_LOCAL))?;
    Ok(Replacement {
        kept_original,
        installed,
    })
}

/// What [`reclaim_host_local`] found in place of ipkeep as `host-local`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reclaim {
    /// `host-local` is ipkeep: nothing was done.
    Intact,
    /// No original is kept: ipkeep does not stand in for `host-local` (never installed so, or
    /// put back by `--restore-host-local` as ipkeep leaves the node): nothing was done.
    NotReplaced,
    /// Another file was written as `host-local` (a package upgrade, an admin's `cp`): kept as
    /// the new original, ipkeep installed again.
    Overwritten,
    /// `host-local` became a symlink (k3s re-linking its multi-call binary): the link itself kept
    /// as the new original (never followed), ipkeep installed again.
    Relinked,
    /// `host-local` was removed: ipkeep installed again (the kept original stays).
    Removed,
}

impl Reclaim {
    /// A label for metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            Self::Intact => "intact",
            Self::NotReplaced => "not-replaced",
            Self::Overwritten => "overwritten",
            Self::Relinked => "relinked",
            Self::Removed => "removed",
        }
    }
}

/// Makes `<to>/host-local` ipkeep (`from`) again when something else took its place, keeping
/// what was written there as the new `host-local.ipkeep-orig`, so that `--restore-host-local`
/// (the chart's uninstall) puts back the newest original, not the one kept at install time.
/// Nothing is done in a directory another user could change ([`InstallError::Untrusted`]).
///
/// Only while an original is kept: without `host-local.ipkeep-orig`, ipkeep is not standing in for
/// `host-local` (the agent's `preStop` has just renamed the original back because ipkeep is leaving
/// the node, or it was never replaced), and `host-local` is left as it is.
///
/// The same rules as [`replace_host_local`]: every step is a link or a rename in the directory,
/// so `host-local` is never missing (it is the new file until the instant ipkeep is renamed over
/// it); a symlink is kept as a symlink (link(2) does not follow it), never followed out of the
/// directory; what is left over by a killed run is a hidden temporary the next install removes.
pub fn reclaim_host_local(from: &Path, to: &Path) -> Result<Reclaim, InstallError> {
    // install-cni trusted the directory; an owner or mode changed since is checked again here.
    check_mounted(to)?;
    let host_local = to.join(HOST_LOCAL);
    let orig = to.join(HOST_LOCAL_ORIG);
    let target = |step, path: &Path| {
        let path = path.to_owned();
        move |source| InstallError::Target { step, path, source }
    };
    match fs::symlink_metadata(&orig) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Reclaim::NotReplaced),
        Err(e) => return Err(target("inspect", &orig)(e)),
    }
    let ours = fs::read(from).map_err(|source| InstallError::Source {
        path: from.to_owned(),
        source,
    })?;
    let found = match fs::symlink_metadata(&host_local) {
        Ok(meta) if meta.file_type().is_symlink() => Reclaim::Relinked,
        Ok(meta) if meta.is_dir() => {
            return Err(target("reclaim", &host_local)(io::Error::other(
                "host-local is a directory",
            )));
        }
        Ok(meta) => {
            if is_installed(&meta, &host_local, &ours)? {
                return Ok(Reclaim::Intact);
            }
            Reclaim::Overwritten
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Reclaim::Removed,
        Err(e) => return Err(target("inspect", &host_local)(e)),
    };
    if found != Reclaim::Removed {
        // The newcomer becomes the original: a second link to it under a temporary name, renamed
        // over the kept original in one step.
        let tmp = to.join(format!("{TEMP_PREFIX}{}-orig", std::process::id()));
        let _ = fs::remove_file(&tmp);
        fs::hard_link(&host_local, &tmp).map_err(target("keep the new original", &tmp))?;
        if let Err(e) = fs::rename(&tmp, &orig) {
            let _ = fs::remove_file(&tmp);
            return Err(target("keep the new original", &orig)(e));
        }
        sync_dir(to)?;
    }
    install(from, to, Some(HOST_LOCAL))?;
    Ok(found)
}

/// Renames `<to>/host-local.ipkeep-orig` back over `<to>/host-local` (one rename: `host-local`
/// is ipkeep until the instant it is the original again). Idempotent: without a kept original
/// nothing is changed.
pub fn restore_host_local(to: &Path) -> Result<Restore, InstallError> {
    let host_local = to.join(HOST_LOCAL);
    let orig = to.join(HOST_LOCAL_ORIG);
    let target = |step, path: &Path| {
        let path = path.to_owned();
        move |source| InstallError::Target { step, path, source }
    };
    match fs::symlink_metadata(&orig) {
        Ok(meta) if meta.is_dir() => Err(target("restore", &orig)(io::Error::other(
            "the kept original is a directory",
        ))),
        Ok(meta) => {
            // A run killed between keeping the original and installing ipkeep leaves two links
            // to the original; rename(2) between links to one file does nothing, so unlink.
            let same = fs::symlink_metadata(&host_local)
                .is_ok_and(|h| h.dev() == meta.dev() && h.ino() == meta.ino());
            if same {
                fs::remove_file(&orig).map_err(target("remove", &orig))?;
            } else {
                fs::rename(&orig, &host_local).map_err(target("restore", &host_local))?;
            }
            sync_dir(to)?;
            Ok(Restore::Restored)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Restore::NothingKept),
        Err(e) => Err(target("inspect", &orig)(e)),
    }
}

/// Installs `from` as `<to>/<name>` (name defaults to `from`'s file name) atomically.
pub fn install(from: &Path, to: &Path, name: Option<&str>) -> Result<Outcome, InstallError> {
    let name = target_name(from, name)?;
    let source_err = |source| InstallError::Source {
        path: from.to_owned(),
        source,
    };
    let mut src = File::open(from).map_err(source_err)?;
    if !src.metadata().map_err(source_err)?.is_file() {
        return Err(source_err(io::Error::other("not a regular file")));
    }
    let mut bytes = Vec::new();
    src.read_to_end(&mut bytes).map_err(source_err)?;

    let target = |step, path: &Path| {
        let path = path.to_owned();
        move |source| InstallError::Target { step, path, source }
    };
    fs::create_dir_all(to).map_err(target("create directory", to))?;
    remove_leftovers(to)?;
    let dest = to.join(&name);
    let existing = match fs::symlink_metadata(&dest) {
        Ok(meta) => Some(meta),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(target("inspect", &dest)(e)),
    };
    if let Some(meta) = &existing
        && is_installed(meta, &dest, &bytes)?
    {
        return Ok(Outcome::Unchanged);
    }
    if existing.as_ref().is_some_and(|m| m.is_dir()) {
        return Err(target("replace", &dest)(io::Error::other(
            "a directory is in the way",
        )));
    }
    let tmp = to.join(format!("{TEMP_PREFIX}{}-{name}", std::process::id()));
    let written = write_temp(&tmp, &bytes);
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    // rename(2) replaces a symlink at `dest` itself, never its target.
    if let Err(e) = fs::rename(&tmp, &dest) {
        let _ = fs::remove_file(&tmp);
        return Err(target("rename into place", &dest)(e));
    }
    sync_dir(to)?;
    Ok(if existing.is_some() {
        Outcome::Replaced
    } else {
        Outcome::Installed
    })
}

/// Whether `path` (whose `symlink_metadata` is `meta`) is already the binary `bytes`, installed:
/// a regular file of the same bytes with the binary's mode.
pub(crate) fn is_installed(
    meta: &fs::Metadata,
    path: &Path,
    bytes: &[u8],
) -> Result<bool, InstallError> {
    Ok(meta.is_file()
        && meta.len() == bytes.len() as u64
        && meta.permissions().mode() & 0o777 == BINARY_MODE
        && fs::read(path).map_err(|source| InstallError::Target {
            step: "read",
            path: path.to_owned(),
            source,
        })? == bytes)
}

/// fsyncs the directory `dir`, so a rename or link in it is durable.
fn sync_dir(dir: &Path) -> Result<(), InstallError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| InstallError::Target {
            step: "sync directory",
            path: dir.to_owned(),
            source,
        })
}

fn write_temp(tmp: &Path, bytes: &[u8]) -> Result<(), InstallError> {
    let err = |step| {
        let path = tmp.to_owned();
        move |source| InstallError::Target { step, path, source }
    };
    // create_new: O_EXCL, which also refuses to follow a symlink planted at the name.
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(BINARY_MODE)
        .open(tmp)
        .map_err(err("create"))?;
    file.write_all(bytes).map_err(err("write"))?;
    // The umask may have narrowed the mode given at creation.
    file.set_permissions(fs::Permissions::from_mode(BINARY_MODE))
        .map_err(err("chmod"))?;
    file.sync_all().map_err(err("sync"))?;
    Ok(())
}

/// Removes temporaries of earlier runs that died before their rename.
fn remove_leftovers(dir: &Path) -> Result<(), InstallError> {
    let entries = fs::read_dir(dir).map_err(|source| InstallError::Target {
        step: "list",
        path: dir.to_owned(),
        source,
    })?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let is_ours = name.to_str().is_some_and(|n| n.starts_with(TEMP_PREFIX));
        let is_file = entry.metadata().map(|m| !m.is_dir()).unwrap_or(false);
        if is_ours && is_file {
            let path = entry.path();
            fs::remove_file(&path).map_err(|source| InstallError::Target {
                step: "remove leftover",
                path,
                source,
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Status::failure("refused", "Reason").with_code(code).boxed())
    }

    #[test]
    fn host_local_comes_back_only_when_ipkeep_leaves_the_node() {
        let cases = [
            (
                DaemonSetSeen::from_get(Ok(false)),
                DaemonSetSeen::Present,
                false,
            ),
            (
                DaemonSetSeen::from_get(Ok(true)),
                DaemonSetSeen::Deleting,
                true,
            ),
            (
                DaemonSetSeen::from_get(Err(api_error(404))),
                DaemonSetSeen::Gone,
                true,
            ),
            (
                DaemonSetSeen::from_get(Err(api_error(401))),
                DaemonSetSeen::CredentialsRevoked(401),
                true,
            ),
            (
                DaemonSetSeen::from_get(Err(api_error(403))),
                DaemonSetSeen::CredentialsRevoked(403),
                true,
            ),
        ];
        for (seen, expected, restore) in cases {
            assert_eq!(seen, expected);
            assert_eq!(seen.restore(), restore, "{seen}");
            assert!(!seen.worth_retrying(), "{seen}");
        }
        for code in [500, 503, 429] {
            let seen = DaemonSetSeen::from_get(Err(api_error(code)));
            assert!(
                matches!(seen, DaemonSetSeen::Unknown(_)),
                "{code}: {seen:?}"
            );
            assert!(!seen.restore(), "{seen}");
            assert!(seen.worth_retrying(), "{seen}");
        }
    }

    #[test]
    fn errors_name_the_node_path_the_value_and_the_fix() {
        let mounted = |origin| BinDir {
            here: Some(PathBuf::from("/host/opt/cni/bin")),
            on_node: "/opt/cni/bin".into(),
            origin,
        };
        let k3s = Origin::Runtime(crate::rules::cni_dirs::Source::K3s);
        let target = |kind: io::ErrorKind| InstallError::Target {
            step: "create",
            path: PathBuf::from("/host/opt/cni/bin/.ipkeep-install-1-ipkeep"),
            source: io::Error::from(kind),
        };
        let cases: Vec<(InstallError, Origin, &str, &str)> = vec![
            (
                InstallError::NoHostLocal {
                    dir: "/host/opt/cni/bin".into(),
                },
                Origin::Value,
                "the chart value cni.binDir",
                "there is no host-local there to replace (cni.replaceHostLocal=true): the runtime does not find its plugins there; set cni.binDir to the directory the container runtime runs CNI plugins from, or leave it unset to use the one the runtime's configuration names",
            ),
            (
                target(io::ErrorKind::ReadOnlyFilesystem),
                k3s.clone(),
                "named by k3s's containerd configuration /var/lib/rancher/k3s/agent/etc/containerd/config.toml",
                "the directory is read-only here (failed to create /opt/cni/bin/.ipkeep-install-1-ipkeep: read-only filesystem or storage medium): a read-only /usr or an immutable node image keeps its own plugins there; set cni.binDir (and cni.confDir) to the directory the container runtime runs CNI plugins from on a writable disk",
            ),
            (
                target(io::ErrorKind::StorageFull),
                Origin::Value,
                "the chart value cni.binDir",
                "failed to create /opt/cni/bin/.ipkeep-install-1-ipkeep: no storage space",
            ),
        ];
        for (err, origin, origin_text, cause) in cases {
            let dir = mounted(origin);
            let e = NodeError {
                node: "n1".into(),
                action: "install ipkeep",
                on_node: dir.on_node.clone(),
                origin: dir.origin.clone(),
                cause: explain(&err, &dir),
            };
            assert_eq!(
                e.to_string(),
                format!(
                    "node n1: failed to install ipkeep in the CNI bin directory /opt/cni/bin ({origin_text}): {cause}"
                )
            );
        }
    }

    #[test]
    fn the_daemonset_is_named_namespace_slash_name() {
        assert_eq!(
            daemonset_ref("ipkeep-system/ipkeep-agent").unwrap(),
            ("ipkeep-system", "ipkeep-agent")
        );
        for bad in ["ipkeep-agent", "/ipkeep-agent", "ns/", "ns/a/b", ""] {
            assert!(
                matches!(daemonset_ref(bad), Err(InstallError::BadDaemonSet(_))),
                "{bad:?}"
            );
        }
    }
}
