//! Whether ipkeep is in charge of each of the agent's networks on its node, decided from what the
//! node shows, not from the chart's values alone: a reservation file is worth something only
//! while the plugin that reads it is the IPAM the node's runtime calls for that network, with the
//! same data directory. When it is not, reserved addresses are silently not reserved (the next
//! pod gets plain host-local's next address), so the agent says so (`agent::incharge::report`).
//!
//! The evidence ([`Evidence`], read from the node by `agent::incharge::evidence`):
//! * the node's CNI configurations (the runtime's `conf_dir`, mounted read-only): each file's
//!   network name and the IPAM its runtime will call (`type` and `dataDir`). flannel's plugin
//!   fills the IPAM in itself: it takes the plugin's top-level `ipam` (type `host-local` when
//!   none is given) for its delegate, and the delegate's network name is the conflist's;
//! * the node's CNI bin directory: whether `ipkeep` is there, and whether `host-local` is
//!   ipkeep (`cni.replaceHostLocal`) or another binary.
//!
//! The rules ([`decide`], one verdict per network, the first that applies):
//! 0. the node's CNI directories are not known (the runtime's configuration, which names them
//!    when the chart's `cni.binDir`/`cni.confDir` are unset, cannot be read: [`undecided`]) →
//!    `CNIDirectoriesUnknown`, for every network;
//! 1. no configuration file at all → `NoCNIConfiguration`;
//! 2. no file names the network → `NetworkNotConfigured` (the names found are given);
//! 3. the network's configuration has no IPAM → `NoIPAM`;
//! 4. its IPAM `dataDir` is not the agent's data directory → `DataDirMismatch`;
//! 5. IPAM `ipkeep` without an `ipkeep` binary → `PluginMissing`;
//! 6. IPAM `host-local` while `host-local` is not ipkeep → `HostLocalReverted` when ipkeep had
//!    replaced it (an original is kept beside it), else `HostLocalNotReplaced`;
//! 7. any other IPAM → `OtherIPAM`;
//! 8. otherwise ipkeep is in charge.
//!
//! When several files name the network, the first in file-name order counts (the order the
//! runtime reads them in).

use std::fmt;

use serde_json::Value;

use ipkeep_hostlocal::config::DEFAULT_DATA_DIR;
use ipkeep_netdir::go_clean;

/// The IPAM type of ipkeep's plugin.
pub const IPKEEP_TYPE: &str = "ipkeep";
/// The IPAM type of host-local (and of ipkeep installed in its place).
pub const HOST_LOCAL_TYPE: &str = "host-local";
/// The plugin type that builds its delegate's IPAM itself.
const FLANNEL_TYPE: &str = "flannel";

/// One network configuration file of the node, as far as IPAM goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetConf {
    /// The file's name in the configuration directory.
    pub file: String,
    /// The network's `name`.
    pub name: String,
    /// The IPAM the runtime calls for it, if any.
    pub ipam: Option<Ipam>,
}

/// The IPAM of a network configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipam {
    /// `ipam.type`.
    pub type_: String,
    /// `ipam.dataDir`, or host-local's default.
    pub data_dir: String,
}

/// A file of the configuration directory: understood, or why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfFile {
    /// A network configuration.
    Net(NetConf),
    /// Not read or not a network configuration (the runtime skips it too, or fails on it).
    Skipped {
        /// The file's name.
        file: String,
        /// Why.
        why: String,
    },
}

/// What sits in the CNI bin directory under one name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binary {
    /// The plugin this agent's image carries.
    Ipkeep,
    /// Something else (another binary, a symlink, unreadable).
    Other,
    /// Nothing.
    Missing,
}

/// The CNI bin directory, as far as IPAM goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BinDir {
    /// `ipkeep`.
    pub ipkeep: Binary,
    /// `host-local`.
    pub host_local: Binary,
    /// Whether `host-local.ipkeep-orig` is there (ipkeep replaced `host-local` once).
    pub original_kept: bool,
}

/// Everything the rules read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence {
    /// The configuration directory, as the node names it (for messages).
    pub conf_dir: String,
    /// The bin directory, as the node names it (for messages).
    pub bin_dir: String,
    /// The configuration files, in file-name order.
    pub confs: Vec<ConfFile>,
    /// The bin directory's IPAM binaries.
    pub bin: BinDir,
}

/// Why ipkeep is not in charge of a network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// The configuration directory holds no network configuration.
    NoConfiguration {
        /// Files that were not read, and why (a conflist with a typo is one).
        skipped: Vec<String>,
    },
    /// No configuration names the network; the names found.
    NetworkNotConfigured {
        /// Network names the node's configurations have.
        found: Vec<String>,
        /// Files that were not read, and why.
        skipped: Vec<String>,
    },
    /// The network's configuration has no IPAM.
    NoIpam {
        /// Its file.
        file: String,
    },
    /// The IPAM's data directory is not the agent's.
    DataDirMismatch {
        /// Its file.
        file: String,
        /// The IPAM's `dataDir`.
        conf: String,
        /// The agent's.
        agent: String,
    },
    /// IPAM `ipkeep`, but no `ipkeep` in the bin directory.
    PluginMissing {
        /// Its file.
        file: String,
    },
    /// IPAM `host-local`, and `host-local` is not ipkeep (never replaced).
    HostLocalNotReplaced {
        /// Its file.
        file: String,
    },
    /// IPAM `host-local`, ipkeep had replaced it, and something wrote another `host-local`.
    HostLocalReverted {
        /// Its file.
        file: String,
    },
    /// Another IPAM altogether.
    OtherIpam {
        /// Its file.
        file: String,
        /// Its type.
        type_: String,
    },
    /// The node's CNI directories are not known: the container runtime's configuration, which
    /// names them when the chart's `cni.binDir`/`cni.confDir` are unset, cannot be read.
    DirectoriesUnknown {
        /// Why, naming the node and the values to set.
        why: String,
    },
}

impl Reason {
    /// Every label, for resetting metrics.
    pub const LABELS: [&'static str; 9] = [
        "NoCNIConfiguration",
        "NetworkNotConfigured",
        "NoIPAM",
        "DataDirMismatch",
        "PluginMissing",
        "HostLocalNotReplaced",
        "HostLocalReverted",
        "OtherIPAM",
        "CNIDirectoriesUnknown",
    ];

    /// The reason as a condition reason, Event reason suffix and metric label.
    pub fn label(&self) -> &'static str {
        let i = match self {
            Self::NoConfiguration { .. } => 0,
            Self::NetworkNotConfigured { .. } => 1,
            Self::NoIpam { .. } => 2,
            Self::DataDirMismatch { .. } => 3,
            Self::PluginMissing { .. } => 4,
            Self::HostLocalNotReplaced { .. } => 5,
            Self::HostLocalReverted { .. } => 6,
            Self::OtherIpam { .. } => 7,
            Self::DirectoriesUnknown { .. } => 8,
        };
        Self::LABELS[i]
    }
}

/// One network's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// ipkeep is the IPAM the runtime calls for this network, with the agent's data directory.
    InCharge,
    /// It is not: reserved addresses of this network are not protected.
    NotInCharge(Reason),
}

/// A verdict with what it is about, for people: what is wrong and how to fix it.
#[derive(Debug, Clone, Copy)]
pub struct Explained<'a> {
    /// The network.
    pub network: &'a str,
    /// Why it is not in charge.
    pub reason: &'a Reason,
    /// The evidence it was decided from (its directories are named).
    pub evidence: &'a Evidence,
}

impl fmt::Display for Explained<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Explained {
            network,
            reason,
            evidence: e,
        } = *self;
        let (conf, bin) = (&e.conf_dir, &e.bin_dir);
        write!(f, "ipkeep is not in charge of network {network}: ")?;
        match reason {
            Reason::NoConfiguration { skipped } if skipped.is_empty() => write!(
                f,
                "{conf} holds no CNI network configuration; is the network plugin installed? (else set the chart's cni.confDir to the directory the container runtime reads, or leave it unset to use the one the runtime's configuration names)"
            ),
            Reason::NoConfiguration { skipped } => write!(
                f,
                "{conf} holds no CNI network configuration that can be read (not read: {}); fix that file, the container runtime reads it too",
                skipped.join("; ")
            ),
            Reason::NetworkNotConfigured { found, skipped } => {
                write!(
                    f,
                    "no CNI configuration in {conf} names it (found: {}",
                    found.join(", ")
                )?;
                if skipped.is_empty() {
                    return write!(
                        f,
                        "); set the chart's agent.networks to the network the pods use"
                    );
                }
                write!(
                    f,
                    "; not read: {}); if the network is configured in a file not read, fix that file, else set the chart's agent.networks to the network the pods use",
                    skipped.join("; ")
                )
            }
            Reason::NoIpam { file } => write!(f, "{conf}/{file} has no IPAM"),
            Reason::DataDirMismatch {
                file,
                conf: dir,
                agent,
            } => write!(
                f,
                "the IPAM dataDir in {conf}/{file} is {dir} but the agent writes reservations under {agent}; set the chart's agent.dataDir to {dir}"
            ),
            Reason::PluginMissing { file } => write!(
                f,
                "{conf}/{file} names the IPAM ipkeep but there is no ipkeep in {bin}; set the chart's cni.binDir to the runtime's CNI bin directory"
            ),
            Reason::HostLocalNotReplaced { file } => write!(
                f,
                "the IPAM in {conf}/{file} is host-local, and host-local in {bin} is not ipkeep; set the IPAM type to ipkeep there (or in what writes that file, e.g. flannel's ConfigMap), or install with cni.replaceHostLocal=true"
            ),
            Reason::HostLocalReverted { file } => write!(
                f,
                "the IPAM in {conf}/{file} is host-local, ipkeep had replaced host-local in {bin}, and something wrote another host-local there (a package or k3s upgrade?); with cni.replaceHostLocal=true the agent installs ipkeep again, or restart the agent pod"
            ),
            Reason::OtherIpam { file, type_ } => write!(
                f,
                "the IPAM in {conf}/{file} is {type_}; ipkeep hands out addresses only as the IPAM ipkeep (or as host-local with cni.replaceHostLocal=true)"
            ),
            Reason::DirectoriesUnknown { why } => f.write_str(why),
        }
    }
}

/// Reads one configuration file's text: a `.conflist` (`plugins`) or a single `.conf`.
pub fn parse_conf(file: &str, text: &[u8]) -> ConfFile {
    let skipped = |why: String| ConfFile::Skipped {
        file: file.to_owned(),
        why,
    };
    let doc: Value = match serde_json::from_slice(text) {
        Ok(v) => v,
        Err(e) => return skipped(format!("not JSON: {e}")),
    };
    let Some(name) = doc.get("name").and_then(Value::as_str) else {
        return skipped("no network name".to_owned());
    };
    let ipam = match doc.get("plugins") {
        Some(Value::Array(plugins)) => plugins.iter().find_map(plugin_ipam),
        Some(_) => return skipped("plugins is not a list".to_owned()),
        None => plugin_ipam(&doc),
    };
    ConfFile::Net(NetConf {
        file: file.to_owned(),
        name: name.to_owned(),
        ipam,
    })
}

/// The IPAM one plugin's configuration makes the runtime call, if it has one: its `ipam`, or for
/// flannel the `ipam` it hands its delegate (`host-local` unless given).
fn plugin_ipam(plugin: &Value) -> Option<Ipam> {
    let flannel = plugin.get("type").and_then(Value::as_str) == Some(FLANNEL_TYPE);
    let ipam = plugin.get("ipam").and_then(Value::as_object);
    if ipam.is_none() && !flannel {
        return None;
    }
    let field = |key: &str| ipam.and_then(|m| m.get(key)).and_then(Value::as_str);
    let type_ = match field("type") {
        Some(t) if !t.is_empty() => t,
        _ if flannel => HOST_LOCAL_TYPE,
        _ => "",
    };
    Some(Ipam {
        type_: type_.to_owned(),
        data_dir: field("dataDir")
            .filter(|d| !d.is_empty())
            .unwrap_or(DEFAULT_DATA_DIR)
            .to_owned(),
    })
}

/// The verdict for each of `networks`, in order (the rules of the module docs).
pub fn decide<'a>(
    networks: &'a [String],
    agent_data_dir: &str,
    evidence: &Evidence,
) -> Vec<(&'a str, Verdict)> {
    networks
        .iter()
        .map(|n| (n.as_str(), verdict(n, agent_data_dir, evidence)))
        .collect()
}

/// Every network's verdict when the node's CNI directories are not known (rule 0: nothing can be
/// read, so no network is in charge), `why` naming the node and the values to set.
pub fn undecided<'a>(networks: &'a [String], why: &str) -> Vec<(&'a str, Verdict)> {
    networks
        .iter()
        .map(|n| {
            let reason = Reason::DirectoriesUnknown {
                why: why.to_owned(),
            };
            (n.as_str(), Verdict::NotInCharge(reason))
        })
        .collect()
}

fn verdict(network: &str, agent_data_dir: &str, e: &Evidence) -> Verdict {
    let nets: Vec<&NetConf> = e
        .confs
        .iter()
        .filter_map(|c| match c {
            ConfFile::Net(n) => Some(n),
            ConfFile::Skipped { .. } => None,
        })
        .collect();
    let not = Verdict::NotInCharge;
    let skipped = || {
        e.confs
            .iter()
            .filter_map(|c| match c {
                ConfFile::Skipped { file, why } => Some(format!("{file}: {why}")),
                ConfFile::Net(_) => None,
            })
            .collect()
    };
    if nets.is_empty() {
        return not(Reason::NoConfiguration { skipped: skipped() });
    }
    let Some(net) = nets.iter().find(|n| n.name == network) else {
        let mut found: Vec<String> = nets.iter().map(|n| n.name.clone()).collect();
        found.dedup();
        return not(Reason::NetworkNotConfigured {
            found,
            skipped: skipped(),
        });
    };
    let file = net.file.clone();
    let Some(ipam) = &net.ipam else {
        return not(Reason::NoIpam { file });
    };
    if go_clean(&ipam.data_dir) != go_clean(agent_data_dir) {
        return not(Reason::DataDirMismatch {
            file,
            conf: ipam.data_dir.clone(),
            agent: agent_data_dir.to_owned(),
        });
    }
    match ipam.type_.as_str() {
        // Any binary named ipkeep will do (the install-cni init container just wrote this image's).
        IPKEEP_TYPE if e.bin.ipkeep != Binary::Missing => Verdict::InCharge,
        IPKEEP_TYPE => not(Reason::PluginMissing { file }),
        HOST_LOCAL_TYPE if e.bin.host_local == Binary::Ipkeep => Verdict::InCharge,
        HOST_LOCAL_TYPE if e.bin.original_kept => not(Reason::HostLocalReverted { file }),
        HOST_LOCAL_TYPE => not(Reason::HostLocalNotReplaced { file }),
        other => not(Reason::OtherIpam {
            file,
            type_: other.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests;
