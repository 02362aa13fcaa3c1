//! The kubelet stand-in (`ipkeep-e2e node`): one simulated Kubernetes node that registers its
//! Node (with pod CIDRs) and keeps it Ready (status and Lease heartbeats), and for every pod bound
//! to it runs the real CNI chain — Debian's `bridge` delegating IPAM to `ipkeep` — in a network
//! namespace of its own, writes the pod's status from the address really configured there, and
//! tears sandboxes down (CNI DEL) when pods go, as a kubelet and its runtime do.
//!
//! ```no_run
//! # async fn demo(client: kube::Client) -> Result<(), ipkeep_e2e::node::NodeError> {
//! use ipkeep_e2e::node::{NodeConfig, run};
//! let config = NodeConfig::new("node-a", vec!["10.244.1.0/24".into()], "/tmp/node-a".into(),
//!     vec!["/tmp/cni-bin".into()]);
//! run(client, config, async { let _ = tokio::signal::ctrl_c().await; }).await
//! # }
//! ```
//!
//! The pure part — names ([`names`]), CNI requests and replies ([`cni`]), the objects a kubelet
//! writes ([`objects`]), what to do for which pod ([`plan`]) — takes `now` as an argument; the
//! I/O ([`host`], [`records`], the kube client) is thin.
//!
//! Why it stays beside the real nodes (`ipkeep_e2e::cluster::realnode`), which now run every
//! end-to-end scenario (`realnode_scenario_*.rs`: 1 to 8, dual-stack, a /29 filled, the agent
//! SIGKILLed, node and operator faults): its remaining users need what no real node gives. The
//! API-fault scenario (`scenario_faults_apiserver.rs`, through `e2e/tests/system/mod.rs`) runs on
//! the in-memory API test server, which no real kubelet can talk to; `make demo FAST=1`
//! (`crate::demo`) tells the story in seconds without a Go build; `ipkeep-e2e node` is its command
//! line, and `node_standin.rs` tests it for those users.

pub mod agent;
pub mod cli;
pub mod cni;
pub mod host;
pub mod names;
pub mod objects;
pub mod plan;
pub mod records;
mod standin;

use std::{
    net::{IpAddr, Ipv4Addr},
    path::PathBuf,
    time::Duration,
};

pub use agent::AgentConfig;

/// The default CNI network name (a directory under `<data-dir>/networks/`).
pub const DEFAULT_NETWORK: &str = "podnet";

/// How often the Node's status and Lease are renewed by default (the kubelet's 10 s).
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10);

/// What one simulated node is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    /// The Node's name (a DNS-1123 subdomain).
    pub name: String,
    /// The pod CIDRs (`spec.podCIDRs`; one per address family, IPv4 first is usual).
    pub pod_cidrs: Vec<String>,
    /// The node's own directory: `networks/` (ipkeep's data), `sandboxes/`, `cni/`.
    pub data_dir: PathBuf,
    /// Where `bridge` and `ipkeep` are found (`CNI_PATH`, searched in order).
    pub cni_bin_dirs: Vec<PathBuf>,
    /// The CNI network name.
    pub network: String,
    /// The address the node reports (`InternalIP`, pods' `hostIP`).
    pub host_ip: IpAddr,
    /// How often the Node status and the Lease are renewed.
    pub heartbeat: Duration,
    /// The ipkeep agent to run and supervise, if any.
    pub agent: Option<AgentConfig>,
    /// How long a sandbox's teardown (and its pod's deletion confirmation) waits after it is
    /// first due: zero for a prompt runtime; more reproduces the force-delete order, where a
    /// re-created pod's ADD comes before the old sandbox's DEL.
    pub teardown_delay: Duration,
}

impl NodeConfig {
    /// A node with the defaults: network [`DEFAULT_NETWORK`], host IP 127.0.0.1, heartbeat every
    /// 10 s, no agent, no teardown delay.
    pub fn new(
        name: &str,
        pod_cidrs: Vec<String>,
        data_dir: PathBuf,
        cni_bin_dirs: Vec<PathBuf>,
    ) -> NodeConfig {
        NodeConfig {
            name: name.to_owned(),
            pod_cidrs,
            data_dir,
            cni_bin_dirs,
            network: DEFAULT_NETWORK.to_owned(),
            host_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            heartbeat: DEFAULT_HEARTBEAT,
            agent: None,
            teardown_delay: Duration::ZERO,
        }
    }

    /// ipkeep's data directory (`dataDir` of the IPAM config, the agent's `--data-dir`).
    pub fn ipam_data_dir(&self) -> PathBuf {
        self.data_dir.join("networks")
    }

    /// ipkeep's directory of this network: `<data-dir>/networks/<network>`.
    pub fn network_dir(&self) -> PathBuf {
        self.ipam_data_dir().join(&self.network)
    }

    /// Where the node's CNI network configuration is written (for people and tools to read).
    pub fn cni_config_path(&self) -> PathBuf {
        self.data_dir
            .join("cni")
            .join(format!("10-{}.conf", self.network))
    }

    /// The node's network configuration, exactly as the stand-in passes it to `bridge`.
    pub fn network_config(&self) -> serde_json::Value {
        cni::network_config(
            &self.network,
            &names::bridge_name(&names::node_tag(&self.name)),
            &self.pod_cidrs,
            &self.ipam_data_dir(),
        )
    }

    /// Checks names, CIDRs and directories before anything is touched.
    pub fn validate(&self) -> Result<(), NodeError> {
        names::validate_node_name(&self.name).map_err(NodeError::Name)?;
        names::validate_network_name(&self.network).map_err(NodeError::Name)?;
        if self.pod_cidrs.is_empty() || self.pod_cidrs.len() > 2 {
            return Err(NodeError::Config(format!(
                "{} pod CIDRs given; give one, or two of different families",
                self.pod_cidrs.len()
            )));
        }
        for cidr in &self.pod_cidrs {
            if cni::parse_cidr(cidr).is_none() {
                return Err(NodeError::Config(format!(
                    "{cidr:?} is not an address/prefix"
                )));
            }
        }
        if !self.data_dir.is_absolute() {
            return Err(NodeError::Config(format!(
                "the data directory {} must be an absolute path (it is written into the CNI configuration)",
                self.data_dir.display()
            )));
        }
        if self.cni_bin_dirs.is_empty() {
            return Err(NodeError::Config("no CNI bin directory given".into()));
        }
        Ok(())
    }
}

/// Why the stand-in could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// A name given on the command line is unusable.
    #[error(transparent)]
    Name(names::NameError),
    /// The node's configuration is unusable.
    #[error("failed to accept the node configuration: {0}")]
    Config(String),
    /// The data directory or a file in it could not be written.
    #[error("failed to prepare {path}")]
    DataDir {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A host operation failed (the node's locks).
    #[error(transparent)]
    Host(host::HostError),
    /// A sandbox record could not be handled.
    #[error(transparent)]
    Record(records::RecordError),
    /// An API call failed.
    #[error("failed to {what}")]
    Kube {
        /// What was attempted.
        what: String,
        /// kube's error.
        #[source]
        source: Box<kube::Error>,
    },
    /// An object could not be built from its JSON form.
    #[error("failed to build the {what} object: {reason}")]
    Object {
        /// The kind.
        what: String,
        /// The decoding error.
        reason: String,
    },
    /// The pod watch ended before it was in sync.
    #[error("failed to start the pod watch: {0}")]
    Watch(String),
    /// The kube client could not be configured.
    #[error("failed to configure the kube client from {source_name}")]
    Client {
        /// The kubeconfig or "the environment".
        source_name: String,
        /// What went wrong.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Runs one simulated node until `shutdown` completes, then tears every sandbox down (CNI DEL),
/// removes the bridge and stops the agent.
///
/// On start it registers the Node, then reconciles: sandboxes of pods that no longer exist are
/// torn down with DEL, this node's namespaces without a record are removed, and the IPAM plugin's
/// GC frees allocations of attachments that are no longer valid.
pub async fn run(
    client: kube::Client,
    config: NodeConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), NodeError> {
    standin::run(client, config, shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> NodeConfig {
        NodeConfig::new(
            "node-a",
            vec!["10.244.1.0/24".into()],
            "/var/lib/node-a".into(),
            vec!["/opt/cni/bin".into()],
        )
    }

    #[test]
    fn paths_hang_off_the_data_directory() {
        let c = config();
        assert_eq!(c.ipam_data_dir(), PathBuf::from("/var/lib/node-a/networks"));
        assert_eq!(
            c.network_dir(),
            PathBuf::from("/var/lib/node-a/networks/podnet")
        );
        assert_eq!(
            c.cni_config_path(),
            PathBuf::from("/var/lib/node-a/cni/10-podnet.conf")
        );
        assert_eq!(
            c.network_config()["ipam"]["dataDir"],
            "/var/lib/node-a/networks"
        );
        assert_eq!(
            c.network_config()["bridge"],
            names::bridge_name(&names::node_tag("node-a"))
        );
    }

    #[test]
    fn unusable_configurations_are_refused_before_anything_is_touched() {
        assert!(config().validate().is_ok());
        type Change = Box<dyn Fn(&mut NodeConfig)>;
        let cases: Vec<(&str, Change)> = vec![
            ("bad node name", Box::new(|c| c.name = "Node_A".into())),
            (
                "network name with a slash",
                Box::new(|c| c.network = "../x".into()),
            ),
            ("no pod CIDR", Box::new(|c| c.pod_cidrs.clear())),
            (
                "three pod CIDRs",
                Box::new(|c| c.pod_cidrs = vec!["10.0.0.0/24".into(); 3]),
            ),
            (
                "not a CIDR",
                Box::new(|c| c.pod_cidrs = vec!["10.0.0.0".into()]),
            ),
            (
                "relative data dir",
                Box::new(|c| c.data_dir = "data".into()),
            ),
            ("no CNI bin dir", Box::new(|c| c.cni_bin_dirs.clear())),
        ];
        for (what, change) in cases {
            let mut c = config();
            change(&mut c);
            assert!(c.validate().is_err(), "{what}");
        }
    }

    #[test]
    fn command_line_flags_become_the_configuration() {
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct Cli {
            #[command(flatten)]
            args: cli::NodeArgs,
        }
        let cli = Cli::try_parse_from([
            "node",
            "--name",
            "node-b",
            "--pod-cidr",
            "10.244.2.0/24",
            "--pod-cidr",
            "fd00:2::/64",
            "--data-dir",
            "/d",
            "--cni-bin-dir",
            "/b1",
            "--cni-bin-dir",
            "/b2",
            "--heartbeat-seconds",
            "2",
            "--teardown-delay-ms",
            "1500",
            "--agent-bin",
            "/bin/ipkeep-operator",
            "--kubeconfig",
            "/k",
        ])
        .unwrap();
        let c = cli.args.config();
        assert_eq!(c.pod_cidrs, vec!["10.244.2.0/24", "fd00:2::/64"]);
        assert_eq!(
            c.cni_bin_dirs,
            vec![PathBuf::from("/b1"), PathBuf::from("/b2")]
        );
        assert_eq!(c.heartbeat, Duration::from_secs(2));
        assert_eq!(c.teardown_delay, Duration::from_millis(1500));
        assert_eq!(c.network, DEFAULT_NETWORK);
        assert_eq!(
            c.agent,
            Some(AgentConfig {
                bin: "/bin/ipkeep-operator".into(),
                kubeconfig: Some("/k".into()),
                extra_args: Vec::new(),
            })
        );
        assert_eq!(
            agent::agent_args(&c.name, &c.ipam_data_dir(), &c.network),
            [
                "agent",
                "--node-name",
                "node-b",
                "--data-dir",
                "/d/networks",
                "--network",
                "podnet"
            ]
        );
        assert!(
            Cli::try_parse_from([
                "node",
                "--name",
                "x",
                "--data-dir",
                "/d",
                "--cni-bin-dir",
                "/b"
            ])
            .is_err(),
            "a pod CIDR is required"
        );
    }
}
