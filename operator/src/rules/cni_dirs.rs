//! Which CNI bin and configuration directories a node's container runtime really uses, read from
//! the runtime's own configuration (the chart's default: `cni.binDir` and `cni.confDir` unset).
//! install-cni (which installs the plugin there) and the agent (which guards `host-local` there
//! and reads the evidence of being in charge) both call [`discover`], so they never disagree.
//!
//! The rule, in order (the first configuration found decides):
//! 1. k3s's containerd configuration, [`K3S_CONTAINERD_CONFIG`]: k3s writes it again on every
//!    start, so its presence means the node runs k3s (whose containerd is started with it), even
//!    when an `/etc/containerd/config.toml` of a package lies beside it unused;
//! 2. containerd's own, [`CONTAINERD_CONFIG`];
//! 3. CRI-O's [`CRIO_CONFIG`] and the drop-ins in [`CRIO_DROP_INS`] (`*.conf`, file-name order,
//!    a later file's key wins, as CRI-O merges them);
//! 4. none of them: an error that says which values to set ([`DiscoveryError`]).
//!
//! The Node's `status.nodeInfo.containerRuntimeVersion` would tell containerd from CRI-O where a
//! node holds both configurations, but install-cni runs before the agent and the agent's
//! ServiceAccount may not read Nodes: both use the files alone, in the order above.
//!
//! containerd (2.1's `internal/cri/config`; a version 2 configuration is migrated by containerd
//! 2.x to the same keys): `version = 3` reads `[plugins.'io.containerd.cri.v1.runtime'.cni]`,
//! `version = 2` `[plugins."io.containerd.grpc.v1.cri".cni]`, version 1 (or none) `[plugins.cri.cni]`.
//! The bin directory is `bin_dirs` (a list: the runtime looks a plugin up in each in turn, so the
//! first is where a plugin installed once is found first; ipkeep uses the first) or the deprecated
//! `bin_dir` (containerd takes `bin_dir` when `bin_dirs` is left at its default); the configuration
//! directory is `conf_dir`. A key left out or empty is containerd's default, [`DEFAULT_BIN_DIR`]
//! and [`DEFAULT_CONF_DIR`]. k3s's template writes `bin_dirs = ["/var/lib/rancher/k3s/data/cni"]`
//! (its older version 2 template `bin_dir`) and `conf_dir =
//! "/var/lib/rancher/k3s/agent/etc/cni/net.d"`, and leaves the whole table out when it runs no CNI
//! of its own (`--flannel-backend=none`): containerd's defaults then apply, as here.
//!
//! CRI-O: `[crio.network]` `network_dir` and `plugin_dirs` (CRI-O looks plugins up in all of
//! them; ipkeep uses the first), defaults `/etc/cni/net.d/` and `/opt/cni/bin/`.
//!
//! Every directory found must be absolute and plain (no `.` or `..`): the I/O layer resolves it
//! under the node's root as a chroot would, and a path that climbs is refused, not guessed.

use std::fmt;

/// k3s's generated containerd configuration (the node path).
pub const K3S_CONTAINERD_CONFIG: &str = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml";
/// containerd's configuration (the node path).
pub const CONTAINERD_CONFIG: &str = "/etc/containerd/config.toml";
/// CRI-O's configuration (the node path).
pub const CRIO_CONFIG: &str = "/etc/crio/crio.conf";
/// CRI-O's drop-in directory (the node path).
pub const CRIO_DROP_INS: &str = "/etc/crio/crio.conf.d";
/// containerd's and CRI-O's default CNI bin directory.
pub const DEFAULT_BIN_DIR: &str = "/opt/cni/bin";
/// containerd's and CRI-O's default CNI configuration directory.
pub const DEFAULT_CONF_DIR: &str = "/etc/cni/net.d";

/// The chart values that name the directories explicitly (what an error tells to set).
pub const VALUES_HINT: &str = "set the chart values cni.binDir and cni.confDir";

/// What the node's disk holds at the candidate places (each file's text, `None`: no such file).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeConfigs {
    /// [`K3S_CONTAINERD_CONFIG`].
    pub k3s_containerd: Option<String>,
    /// [`CONTAINERD_CONFIG`].
    pub containerd: Option<String>,
    /// [`CRIO_CONFIG`].
    pub crio: Option<String>,
    /// The `*.conf` files of [`CRIO_DROP_INS`]: file name and text, in any order.
    pub crio_drop_ins: Vec<(String, String)>,
}

/// Which configuration the directories came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// k3s's containerd configuration.
    K3s,
    /// containerd's own.
    Containerd,
    /// CRI-O's (with the drop-ins that were read).
    CriO {
        /// The drop-in file names, in the order merged.
        drop_ins: Vec<String>,
    },
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::K3s => write!(f, "k3s's containerd configuration {K3S_CONTAINERD_CONFIG}"),
            Self::Containerd => write!(f, "containerd's configuration {CONTAINERD_CONFIG}"),
            Self::CriO { drop_ins } if drop_ins.is_empty() => {
                write!(f, "CRI-O's configuration {CRIO_CONFIG}")
            }
            Self::CriO { drop_ins } => write!(
                f,
                "CRI-O's configuration {CRIO_CONFIG} and {CRIO_DROP_INS}/{{{}}}",
                drop_ins.join(",")
            ),
        }
    }
}

/// The node's CNI directories, as the node names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniDirs {
    /// Where the runtime looks for plugins (the first of its list).
    pub bin_dir: String,
    /// Where the runtime reads network configurations.
    pub conf_dir: String,
    /// Which configuration said so.
    pub source: Source,
}

/// Why the directories cannot be told (each message ends with what to do).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiscoveryError {
    /// None of the candidate configurations exists.
    #[error(
        "no containerd or CRI-O configuration found ({K3S_CONTAINERD_CONFIG}, {CONTAINERD_CONFIG}, {CRIO_CONFIG}, {CRIO_DROP_INS}/*.conf): {VALUES_HINT}"
    )]
    NotFound,
    /// A configuration is not TOML the rule can read.
    #[error("failed to read {file}: {why}: {VALUES_HINT}")]
    Unreadable {
        /// The file (node path).
        file: String,
        /// What is wrong with it.
        why: String,
    },
    /// A directory the configuration names cannot be used.
    #[error("failed to use {key} = {value:?} from {file}: {why}: {VALUES_HINT}")]
    BadPath {
        /// The file (node path).
        file: String,
        /// The key.
        key: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        why: &'static str,
    },
}

/// The directories the node's runtime uses, from what its disk holds (the rule in the module
/// documentation).
pub fn discover(found: &RuntimeConfigs) -> Result<CniDirs, DiscoveryError> {
    if let Some(text) = &found.k3s_containerd {
        return containerd(K3S_CONTAINERD_CONFIG, text, Source::K3s);
    }
    if let Some(text) = &found.containerd {
        return containerd(CONTAINERD_CONFIG, text, Source::Containerd);
    }
    if found.crio.is_some() || !found.crio_drop_ins.is_empty() {
        return crio(found.crio.as_deref(), &found.crio_drop_ins);
    }
    Err(DiscoveryError::NotFound)
}

/// Parses one TOML file into its top-level table.
/// The error is said on one line (it goes into an Event and a pod condition), with its place.
fn parse(file: &str, text: &str) -> Result<toml::Table, DiscoveryError> {
    text.parse::<toml::Table>().map_err(|e| {
        let place = e.span().map(|span| {
            let before = text.get(..span.start).unwrap_or(text);
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!(" at line {line}, column {column}")
        });
        DiscoveryError::Unreadable {
            file: file.to_owned(),
            why: format!(
                "not valid TOML{}: {}",
                place.unwrap_or_default(),
                e.message().trim()
            ),
        }
    })
}

/// The table at `path` under `table`, if every step is one.
fn table_at<'a>(table: &'a toml::Table, path: &[&str]) -> Option<&'a toml::Table> {
    path.iter()
        .try_fold(table, |t, key| t.get(*key).and_then(toml::Value::as_table))
}

/// A string key of `table`: `None` when left out or empty (containerd's "not set").
fn string_key(
    table: Option<&toml::Table>,
    file: &str,
    key: &'static str,
) -> Result<Option<String>, DiscoveryError> {
    match table.and_then(|t| t.get(key)) {
        None => Ok(None),
        Some(toml::Value::String(s)) if s.is_empty() => Ok(None),
        Some(toml::Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(DiscoveryError::Unreadable {
            file: file.to_owned(),
            why: format!("{key} is a {}, not a string", other.type_str()),
        }),
    }
}

/// A list-of-strings key of `table`: `None` when left out or empty.
fn list_key(
    table: Option<&toml::Table>,
    file: &str,
    key: &'static str,
) -> Result<Option<Vec<String>>, DiscoveryError> {
    let not_list = |what: &str| DiscoveryError::Unreadable {
        file: file.to_owned(),
        why: format!("{key} is {what}, not a list of strings"),
    };
    match table.and_then(|t| t.get(key)) {
        None => Ok(None),
        Some(toml::Value::Array(items)) => {
            let dirs = items
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| not_list("a list holding a non-string"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok((!dirs.is_empty()).then_some(dirs))
        }
        Some(other) => Err(not_list(&format!("a {}", other.type_str()))),
    }
}

/// containerd's CNI table by configuration version.
fn containerd(file: &str, text: &str, source: Source) -> Result<CniDirs, DiscoveryError> {
    let top = parse(file, text)?;
    let version = match top.get("version") {
        None => 1,
        Some(toml::Value::Integer(v)) => *v,
        Some(other) => {
            return Err(DiscoveryError::Unreadable {
                file: file.to_owned(),
                why: format!("version is a {}, not a number", other.type_str()),
            });
        }
    };
    let cni_path: &[&str] = match version {
        3 => &["plugins", "io.containerd.cri.v1.runtime", "cni"],
        2 => &["plugins", "io.containerd.grpc.v1.cri", "cni"],
        1 => &["plugins", "cri", "cni"],
        other => {
            return Err(DiscoveryError::Unreadable {
                file: file.to_owned(),
                why: format!(
                    "configuration version {other} is not one containerd 1.x or 2.x reads (1, 2 or 3)"
                ),
            });
        }
    };
    let cni = table_at(&top, cni_path);
    let bin_dirs = list_key(cni, file, "bin_dirs")?;
    let bin_dir = string_key(cni, file, "bin_dir")?;
    // containerd 2.1: `bin_dir` counts when `bin_dirs` is unset or left at its default.
    let (key, bin) = match (bin_dirs, bin_dir) {
        // Both set: containerd refuses to start; the list is what it would use had it started.
        (Some(dirs), Some(_)) if dirs != [DEFAULT_BIN_DIR] => ("bin_dirs", dirs[0].clone()),
        (_, Some(one)) => ("bin_dir", one),
        (Some(dirs), None) => ("bin_dirs", dirs[0].clone()),
        (None, None) => ("bin_dirs", DEFAULT_BIN_DIR.to_owned()),
    };
    let conf = string_key(cni, file, "conf_dir")?.unwrap_or_else(|| DEFAULT_CONF_DIR.to_owned());
    Ok(CniDirs {
        bin_dir: checked(file, key, bin)?,
        conf_dir: checked(file, "conf_dir", conf)?,
        source,
    })
}

/// CRI-O's `[crio.network]`, the main file first, then each drop-in in file-name order.
fn crio(main: Option<&str>, drop_ins: &[(String, String)]) -> Result<CniDirs, DiscoveryError> {
    let mut ordered: Vec<&(String, String)> = drop_ins.iter().collect();
    ordered.sort_by(|a, b| a.0.cmp(&b.0));
    let files = main
        .map(|text| (CRIO_CONFIG.to_owned(), text))
        .into_iter()
        .chain(
            ordered
                .iter()
                .map(|(name, text)| (format!("{CRIO_DROP_INS}/{name}"), text.as_str())),
        );
    let mut bin = (CRIO_CONFIG.to_owned(), DEFAULT_BIN_DIR.to_owned());
    let mut conf = (CRIO_CONFIG.to_owned(), DEFAULT_CONF_DIR.to_owned());
    for (file, text) in files {
        let top = parse(&file, text)?;
        let network = table_at(&top, &["crio", "network"]);
        if let Some(dir) = string_key(network, &file, "network_dir")? {
            conf = (file.clone(), dir);
        }
        if let Some(dirs) = list_key(network, &file, "plugin_dirs")? {
            bin = (file.clone(), dirs[0].clone());
        }
    }
    Ok(CniDirs {
        bin_dir: checked(&bin.0, "plugin_dirs", bin.1)?,
        conf_dir: checked(&conf.0, "network_dir", conf.1)?,
        source: Source::CriO {
            drop_ins: ordered.iter().map(|(name, _)| name.clone()).collect(),
        },
    })
}

/// `value` as a plain absolute node path without a trailing slash, or why not.
fn checked(file: &str, key: &'static str, value: String) -> Result<String, DiscoveryError> {
    let bad = |why| DiscoveryError::BadPath {
        file: file.to_owned(),
        key,
        value: value.clone(),
        why,
    };
    node_path(&value).map_err(bad)
}

/// A node path as the chart or a runtime names it: absolute, no `.` or `..` component, no NUL;
/// returned without repeated or trailing slashes. The one rule for paths that are resolved under
/// the node's root (install-cni's and the agent's).
pub fn node_path(value: &str) -> Result<String, &'static str> {
    if !value.starts_with('/') {
        return Err("a relative path (the runtime's working directory is not known)");
    }
    if value.contains('\0') {
        return Err("it holds a NUL byte");
    }
    let parts: Vec<&str> = value.split('/').filter(|p| !p.is_empty()).collect();
    if parts.iter().any(|p| *p == "." || *p == "..") {
        return Err("it has a . or .. component");
    }
    if parts.is_empty() {
        return Err("it is the root directory");
    }
    Ok(format!("/{}", parts.join("/")))
}

#[cfg(test)]
mod tests;
