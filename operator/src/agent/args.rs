//! The agent's flags (`ipkeep-operator agent`, each also read from the environment).

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use super::{AgentError, incharge};
use crate::{
    api::{
        PodKey,
        retention::{RetainFor, RetainForError},
    },
    runtime::logging::LogArgs,
};

/// Command-line flags of `ipkeep-operator agent`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// This node's name (from the downward API: `spec.nodeName`).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// host-local's data directory on the node (the `dataDir` of the IPAM configuration).
    #[arg(long, env = "IPKEEP_DATA_DIR", default_value = "/var/lib/cni/networks")]
    pub data_dir: PathBuf,
    /// A CNI network whose reservation files the agent keeps (the network's `name`); repeat
    /// the flag or separate names with commas.
    #[arg(
        long = "network",
        env = "IPKEEP_NETWORKS",
        value_delimiter = ',',
        required = true
    )]
    pub networks: Vec<String>,
    /// Retention for reservations without `spec.retainFor` that have no release time yet
    /// (hand-made ones): the file's releaseTime is creationTimestamp + this.
    #[arg(long, env = "IPKEEP_DEFAULT_RETAIN_FOR", default_value = "24h", value_parser = retain_for_arg)]
    pub default_retain_for: Duration,
    /// How often a full resync runs even without a watch gap (catches hand edits on disk).
    /// A positive duration in jiff's friendly form (`10m`, `90s`, `1h30m`) or ISO 8601 (`PT10M`),
    /// not a retention: it has no 366-day cap.
    #[arg(long, env = "IPKEEP_RESYNC_INTERVAL", default_value = "10m", value_parser = interval_arg)]
    pub resync_interval: Duration,
    /// Where `/metrics`, `/healthz` and `/readyz` are served (the controller's flag of the same
    /// name; `--probe-addr`, its old name, is still accepted).
    #[arg(
        long,
        alias = "probe-addr",
        env = "IPKEEP_METRICS_ADDR",
        default_value = "0.0.0.0:9102"
    )]
    pub metrics_addr: SocketAddr,
    /// Do not serve the node's allocation and reservation files at `/ipam` on `--metrics-addr`
    /// (what `ipkeep-operator check --ipam` reads, `agent::ipam`); `check --ipam` then says it
    /// cannot read this node.
    #[arg(long, env = "IPKEEP_NO_NODE_VIEW")]
    pub no_node_view: bool,
    /// Keep `host-local` in the CNI bin directory ipkeep: when something writes it again (a
    /// package or k3s upgrade), install ipkeep again at once, keeping what was written as the new
    /// `host-local.ipkeep-orig` (the chart passes it with `cni.replaceHostLocal`). Given a DIR (as
    /// mounted), that directory; without one, the CNI bin directory of `--cni-bin-dir` or, with
    /// `--host-root`, the one the node's container runtime's configuration names.
    #[arg(long, env = "IPKEEP_GUARD_HOST_LOCAL", value_name = "DIR", num_args = 0..=1)]
    pub guard_host_local: Option<Option<PathBuf>>,
    /// The plugin binary `--guard-host-local` installs (inside the image), and what `ipkeep`
    /// and a replaced `host-local` in the CNI bin directory are compared with.
    #[arg(long, env = "IPKEEP_PLUGIN_BINARY", default_value = "/ipkeep")]
    pub plugin_binary: PathBuf,
    /// The node's CNI configuration directory as mounted here (read-only): with
    /// `--cni-bin-dir`, the evidence of whether ipkeep is in charge of each network
    /// (`agent::incharge`), the chart's route when `cni.confDir` and `cni.binDir` are set.
    #[arg(
        long,
        env = "IPKEEP_CNI_CONF_DIR",
        value_name = "DIR",
        requires = "cni_bin_dir"
    )]
    pub cni_conf_dir: Option<PathBuf>,
    /// The same directory's path on the node, for messages.
    #[arg(long, default_value = "/etc/cni/net.d")]
    pub cni_conf_dir_on_node: String,
    /// The node's CNI bin directory as mounted here.
    #[arg(long, env = "IPKEEP_CNI_BIN_DIR", value_name = "DIR")]
    pub cni_bin_dir: Option<PathBuf>,
    /// The same directory's path on the node, for messages.
    #[arg(long, default_value = "/opt/cni/bin")]
    pub cni_bin_dir_on_node: String,
    /// The node's root filesystem as mounted here (the chart's `/host` when `cni.binDir` and
    /// `cni.confDir` are unset): the CNI directories are the ones the node's container runtime's
    /// configuration names (`rules::cni_dirs`, the rule install-cni follows too), found again at
    /// every check. Ignored for the in-charge check when `--cni-conf-dir` is given.
    #[arg(long, env = "IPKEEP_HOST_ROOT", value_name = "DIR")]
    pub host_root: Option<PathBuf>,
    /// The agent's own pod (downward API), whose condition `ipkeep.dev/InCharge` says whether
    /// ipkeep is in charge on this node.
    #[arg(long, env = "POD_NAME", requires = "pod_namespace")]
    pub pod_name: Option<String>,
    /// The agent pod's namespace (downward API).
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
    /// Logging.
    #[command(flatten)]
    pub log: LogArgs,
}

fn retain_for_arg(text: &str) -> Result<Duration, RetainForError> {
    RetainFor::parse(text).map(RetainFor::duration)
}

/// Why an interval flag was refused.
#[derive(Debug, thiserror::Error)]
enum IntervalError {
    /// Not a duration jiff reads.
    #[error("failed to parse interval {0:?}: expected a duration such as 10m, 90s, 1h30m or 1d")]
    Syntax(String, #[source] jiff::Error),
    /// Zero or negative.
    #[error("failed to accept interval {0:?}: it must be positive")]
    NotPositive(String),
}

/// The agent's intervals (`--resync-interval`): jiff's duration grammar, positive; a day is 24
/// hours and a week 7 days (calendar units, months and years, are refused: they have no fixed length).
fn interval_arg(text: &str) -> Result<Duration, IntervalError> {
    let parsed = text
        .parse::<jiff::Span>()
        .and_then(|span| span.to_duration(jiff::SpanRelativeTo::days_are_24_hours()))
        .map_err(|e| IntervalError::Syntax(text.to_owned(), e))?;
    Duration::try_from(parsed)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| IntervalError::NotPositive(text.to_owned()))
}

impl Args {
    /// Where the node's CNI directories are: the ones given, or the node runtime's under
    /// `--host-root` (`None`: neither, the agent does not check).
    fn cni_dirs(&self) -> Option<incharge::evidence::Dirs> {
        match (&self.cni_conf_dir, &self.cni_bin_dir, &self.host_root) {
            (Some(conf), Some(bin), _) => Some(incharge::evidence::Dirs::Fixed {
                conf_dir: conf.clone(),
                conf_dir_on_node: self.cni_conf_dir_on_node.clone(),
                bin_dir: bin.clone(),
                bin_dir_on_node: self.cni_bin_dir_on_node.clone(),
            }),
            (_, _, Some(root)) => Some(incharge::evidence::Dirs::Discovered {
                host_root: root.clone(),
            }),
            _ => None,
        }
    }

    /// Which bin directory `--guard-host-local` keeps (`None`: no guard).
    pub(super) fn guarded(&self) -> Result<Option<GuardedDir>, AgentError> {
        match &self.guard_host_local {
            None => Ok(None),
            Some(Some(dir)) => Ok(Some(GuardedDir::Mounted(dir.clone()))),
            Some(None) => match (&self.cni_bin_dir, &self.host_root) {
                (Some(dir), _) => Ok(Some(GuardedDir::Mounted(dir.clone()))),
                (None, Some(root)) => Ok(Some(GuardedDir::Discovered(root.clone()))),
                (None, None) => Err(AgentError::NoGuardedDir),
            },
        }
    }

    /// Whether and how to check that ipkeep is in charge on the node: only with both CNI
    /// directories given, or the node's root to find them in.
    pub(super) fn in_charge(&self) -> Result<Option<incharge::report::Reporter>, AgentError> {
        let Some(dirs) = self.cni_dirs() else {
            return Ok(None);
        };
        Ok(Some(incharge::report::Reporter {
            sources: incharge::evidence::Sources {
                dirs,
                plugin: std::fs::read(&self.plugin_binary)
                    .map_err(|e| AgentError::PluginBinary(self.plugin_binary.clone(), e))?,
            },
            networks: self.networks.clone(),
            data_dir: self.data_dir.to_string_lossy().into_owned(),
            node: self.node_name.clone(),
            pod: (self.pod_namespace.as_deref().zip(self.pod_name.as_deref()))
                .map(|(namespace, name)| PodKey::new(namespace, name))
                .transpose()
                .map_err(AgentError::OwnPod)?,
        }))
    }
}

/// The CNI bin directory the host-local guard keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuardedDir {
    /// A directory as mounted.
    Mounted(PathBuf),
    /// The one the node runtime's configuration names, under the node's root mounted here.
    Discovered(PathBuf),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    #[test]
    fn the_metrics_address_has_the_controllers_name_and_keeps_its_old_one() {
        use clap::Parser as _;
        let base = ["agent", "--node-name=n", "--network=cbr0"];
        let cases: &[(&[&str], &str)] = &[
            (&[], "0.0.0.0:9102"),
            (&["--metrics-addr=127.0.0.1:9725"], "127.0.0.1:9725"),
            (&["--probe-addr=127.0.0.1:9726"], "127.0.0.1:9726"),
            (&["--probe-addr", "127.0.0.1:9727"], "127.0.0.1:9727"),
        ];
        for (flags, want) in cases {
            let argv = base.iter().chain(flags.iter());
            let got = Cli::try_parse_from(argv).map(|c| c.args.metrics_addr.to_string());
            assert_eq!(got.as_deref().ok(), Some(*want), "{flags:?}: {got:?}");
        }
        let help = Cli::try_parse_from(["agent", "--help"])
            .unwrap_err()
            .to_string();
        assert!(
            help.contains("--metrics-addr <") && !help.contains("--probe-addr <"),
            "{help}"
        );
    }

    #[test]
    fn the_guard_and_the_check_take_the_given_dirs_or_the_node_runtimes() {
        use clap::Parser as _;
        let base = ["agent", "--node-name=n", "--network=cbr0"];
        let parse = |flags: &[&str]| {
            Cli::try_parse_from(base.iter().chain(flags.iter()))
                .unwrap()
                .args
        };
        let cases: &[(&[&str], Option<GuardedDir>, &str)] = &[
            (&[], None, "none"),
            (
                &["--guard-host-local=/host/opt/cni/bin"],
                Some(GuardedDir::Mounted("/host/opt/cni/bin".into())),
                "none",
            ),
            (
                &[
                    "--guard-host-local",
                    "--cni-bin-dir=/b",
                    "--cni-conf-dir=/c",
                    "--host-root=/host",
                ],
                Some(GuardedDir::Mounted("/b".into())),
                "fixed",
            ),
            (
                &["--guard-host-local", "--host-root=/host"],
                Some(GuardedDir::Discovered("/host".into())),
                "discovered",
            ),
            (&["--host-root=/host"], None, "discovered"),
        ];
        for (flags, guard, check) in cases {
            let args = parse(flags);
            assert_eq!(args.guarded().unwrap(), *guard, "{flags:?}");
            let got = match args.cni_dirs() {
                None => "none",
                Some(incharge::evidence::Dirs::Fixed { .. }) => "fixed",
                Some(incharge::evidence::Dirs::Discovered { .. }) => "discovered",
            };
            assert_eq!(got, *check, "{flags:?}");
        }
        assert!(matches!(
            parse(&["--guard-host-local"]).guarded(),
            Err(AgentError::NoGuardedDir)
        ));
    }

    #[test]
    fn interval_grammar() {
        let cases: &[(&str, Option<u64>)] = &[
            ("10m", Some(600)),
            ("90s", Some(90)),
            ("1h30m", Some(5_400)),
            ("PT10M", Some(600)),
            ("9000h", Some(32_400_000)),
            ("1d", Some(86_400)),
            ("2w", Some(1_209_600)),
            ("1 month", None),
            ("0s", None),
            ("-5m", None),
            ("10", None),
            ("ten minutes", None),
            ("", None),
        ];
        for (text, want) in cases {
            let got = interval_arg(text);
            assert_eq!(
                got.as_ref().ok().map(Duration::as_secs),
                *want,
                "{text:?}: {got:?}"
            );
        }
    }
}
