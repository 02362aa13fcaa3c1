//! What a control plane is started with: [`ControlPlaneOptions`], how it serves real nodes
//! ([`NodeAccess`]), and where its binaries are ([`bin_dir`]).

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use super::ControlPlaneError;

/// The binaries a control plane needs (helm is built alongside for the chart tests).
pub const COMPONENT_BINARIES: [&str; 6] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "helm",
];

/// What to start. `Default` is what tests want: free ports, a new directory under the system
/// temp dir, the binaries from `IPKEEP_CLUSTER_BIN_DIR` or the version-keyed build cache.
#[derive(Debug, Clone, Default)]
pub struct ControlPlaneOptions {
    /// Where the binaries are; default: [`bin_dir`].
    pub bin_dir: Option<PathBuf>,
    /// Use exactly this state directory (it must not exist); default: a new
    /// `ipkeep-cluster-<pid>-<n>` under `state_parent`.
    pub state_dir: Option<PathBuf>,
    /// Parent of the generated state directory; default: the system temp dir.
    pub state_parent: Option<PathBuf>,
    /// Serve the API on this port instead of a free one.
    pub apiserver_port: Option<u16>,
    /// Write an audit log (level Metadata, every request) to `audit.log` in the state dir.
    pub audit_log: bool,
    /// With `audit_log`: this audit policy (YAML) instead of Metadata for every request.
    pub audit_policy: Option<String>,
    /// Extra flags per component (`"kube-scheduler" => ["--v=4"]`), appended last.
    pub extra_args: BTreeMap<String, Vec<String>>,
    /// Serve the API to real nodes on this address instead of loopback alone (see [`NodeAccess`]).
    pub node_access: Option<NodeAccess>,
    /// A command (program and arguments) the watchdog runs after the owner died and it stopped
    /// the components (real nodes: `ipkeep-e2e cluster reap-nodes`); empty for none.
    pub cleanup_command: Vec<String>,
    /// The Nodes are fixtures with no kubelet behind them ([`ControlPlane::add_node`]): run
    /// kube-controller-manager without its node lifecycle controller, which would judge them by
    /// heartbeats nobody sends (NotReady after its grace period, tainted, their pods evicted).
    /// Off for real nodes, whose faults it must notice.
    pub fixture_nodes: bool,
}

/// How a control plane serves real nodes: the API server binds and advertises `address` (the
/// host's address on the nodes' bridge, so the `kubernetes` Service has a usable endpoint), its
/// certificate names that address, the Service IP and `kubernetes.default.svc`, and it reaches
/// kubelets by their InternalIP with a client certificate, checking theirs against the run's CA.
#[derive(Debug, Clone)]
pub struct NodeAccess {
    /// The address nodes reach the API server at.
    pub address: Ipv4Addr,
    /// The `kubernetes` Service's ClusterIP (the first address of [`SERVICE_CIDR`]).
    pub service_ip: Ipv4Addr,
}

/// The Service range of every control plane (inside 198.18.0.0/15, never routed).
pub const SERVICE_CIDR: &str = "198.18.128.0/20";

/// The directory of the control plane binaries: `IPKEEP_CLUSTER_BIN_DIR`, else what
/// `e2e/cluster/build.sh --print-bin-dir` names; checked to hold every binary.
pub fn bin_dir() -> Result<PathBuf, ControlPlaneError> {
    let dir = match std::env::var_os("IPKEEP_CLUSTER_BIN_DIR").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("cluster/build.sh");
            let out = crate::command::stdout_of(
                std::process::Command::new(&script).arg("--print-bin-dir"),
                None,
            )
            .map_err(|source| ControlPlaneError::BinDir { script, source })?;
            PathBuf::from(out.trim())
        }
    };
    check_bin_dir(&dir)?;
    Ok(dir)
}

pub(super) fn check_bin_dir(dir: &Path) -> Result<(), ControlPlaneError> {
    for b in COMPONENT_BINARIES {
        if !dir.join(b).is_file() {
            return Err(ControlPlaneError::BinariesMissing {
                dir: dir.to_owned(),
                missing: b.to_owned(),
            });
        }
    }
    Ok(())
}
