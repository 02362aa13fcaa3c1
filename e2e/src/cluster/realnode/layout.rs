//! Where everything of a real-node cluster lives, as plain data: addresses, names, paths, and the
//! configuration files of containerd, the kubelet, kube-proxy and the CNI network. No I/O here.
//!
//! A cluster takes a *slot* (0..[`MAX_SLOTS`]) so that several can run on one machine at once:
//! slot `s` owns the bridge `ipk-nodes<s>` with the host at `198.18.<s>.1/24`, node `i` at
//! `198.18.<s>.<10+i>` with the pod CIDR `198.19.<128+8s+i>.0/24` (a [`PodNetwork`] may make it
//! a /29 inside that block, and add the IPv6 pod CIDR `fd19:198:<s>:<i>::/64`, node-local: the
//! node network is IPv4 only). The Service range
//! is the same in every slot (it only exists inside the nodes' own network namespaces).

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
};

use serde_json::json;

/// How many real-node clusters fit on one machine at once.
pub const MAX_SLOTS: u8 = 16;
/// How many nodes one cluster may have.
pub const MAX_NODES: u8 = 8;
/// The Service range of every real-node cluster.
pub const SERVICE_CIDR: &str = "198.18.128.0/20";
/// The `kubernetes` Service's ClusterIP (the first address of [`SERVICE_CIDR`]).
pub const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 128, 1);
/// The name of the CNI network on every node (flannel's and k3s's).
pub const CNI_NETWORK: &str = "cbr0";
/// The pod sandbox image every node's containerd uses (imported, never pulled).
pub const PAUSE_IMAGE: &str = "localhost/ipkeep-e2e/pause:1";
/// The workload image every node has after `cluster up`.
pub const WORKLOAD_IMAGE: &str = "localhost/ipkeep-e2e/workload:1";
/// The directory under `/var/lib` (disk) holding every slot's node data.
pub const DATA_ROOT: &str = "/var/lib/ipkeep-e2e";
/// The directory under `/run` holding every slot's namespace files.
pub const RUN_ROOT: &str = "/run/ipkeep-e2e-nodes";
/// The cgroup (in every v1 hierarchy) under which every slot's nodes live.
pub const CGROUP_PARENT: &str = "ipkeep-e2e";

/// The IPv4 prefix length of a tiny node's pod CIDR: five addresses for pods (`.2` to `.6`; the
/// network address, the bridge's `.1` and the broadcast address are not handed out).
pub const TINY_PREFIX: u8 = 29;
/// The taint of a tiny node (effect `NoSchedule`): only pods that tolerate it run there, so a test
/// that fills its range knows every pod on it (the chart's agent tolerates every taint).
pub const TINY_TAINT: &str = "ipkeep-e2e/tiny-range";

/// The CNI network the nodes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NodeCni {
    /// A conflist we write (`bridge` + `host-local`, [`cni_conflist`]), with routes we set
    /// between the nodes' pod CIDRs ([`node_routes`]).
    #[default]
    Bridge,
    /// Real flannel: `flanneld --kube-subnet-mgr` on every node (vxlan backend) and flannel's
    /// CNI plugin under kube-flannel's own conflist ([`super::flannel`]); flannel routes the pod
    /// CIDRs between the nodes, not us.
    Flannel,
}

impl NodeCni {
    /// Its name on the command line (`cluster up --cni`).
    pub fn name(self) -> &'static str {
        match self {
            NodeCni::Bridge => "bridge",
            NodeCni::Flannel => "flannel",
        }
    }

    /// The conflist a node of this network has in its CNI configuration directory over its pod
    /// `cidrs`: its file name and its content (flannel's as kube-flannel writes it, or on a k3s
    /// layout as k3s writes it).
    pub fn conflist(
        self,
        cidrs: &[String],
        dirs: NodeDirs,
        runtime: NodeRuntime,
    ) -> (&'static str, serde_json::Value) {
        match (self, dirs) {
            (NodeCni::Bridge, _) => (
                CNI_CONFLIST_FILE,
                cni_conflist(cidrs, runtime.cni_version()),
            ),
            (NodeCni::Flannel, NodeDirs::Standard) => {
                (FLANNEL_CONFLIST_FILE, kube_flannel_conflist())
            }
            (NodeCni::Flannel, NodeDirs::K3s) => (FLANNEL_CONFLIST_FILE, k3s_conflist()),
        }
    }
}

impl std::str::FromStr for NodeCni {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [NodeCni::Bridge, NodeCni::Flannel]
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| format!("{s:?} is not a node network (bridge or flannel)"))
    }
}

/// Where a node keeps its CNI plugins and configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NodeDirs {
    /// `/opt/cni/bin` (the plugins as files) and `/etc/cni/net.d`: kubeadm's, kind's, Debian's.
    #[default]
    Standard,
    /// k3s's: containerd's `bin_dir` is `/var/lib/rancher/k3s/data/cni`, a directory of absolute
    /// symlinks into the release's `data/<release>/bin`, and its `conf_dir`
    /// `/var/lib/rancher/k3s/agent/etc/cni/net.d`. k3s links every plugin name to one multi-call
    /// `cni` binary; the plugins here are Debian's (and flannel's), each linked by its own name.
    K3s,
}

/// k3s's data directory on a node.
pub const K3S_DATA_DIR: &str = "/var/lib/rancher/k3s/data";
/// The release directory (`data/<release>`) a k3s-layout node starts with; k3s names it by its
/// data archive's hash.
pub const K3S_FIRST_RELEASE: &str = "ipkeep-e2e-1";

impl NodeDirs {
    /// Its name on the command line (`cluster up --layout`).
    pub fn name(self) -> &'static str {
        match self {
            NodeDirs::Standard => "standard",
            NodeDirs::K3s => "k3s",
        }
    }

    /// containerd's CNI `bin_dir`, as the node sees it.
    pub fn cni_bin_dir(self) -> &'static str {
        match self {
            NodeDirs::Standard => "/opt/cni/bin",
            NodeDirs::K3s => "/var/lib/rancher/k3s/data/cni",
        }
    }

    /// containerd's CNI `conf_dir`, as the node sees it.
    pub fn cni_conf_dir(self) -> &'static str {
        match self {
            NodeDirs::Standard => "/etc/cni/net.d",
            NodeDirs::K3s => "/var/lib/rancher/k3s/agent/etc/cni/net.d",
        }
    }
}

impl std::str::FromStr for NodeDirs {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [NodeDirs::Standard, NodeDirs::K3s]
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| format!("{s:?} is not a node layout (standard or k3s)"))
    }
}

/// The container runtime a node runs under its kubelet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NodeRuntime {
    /// containerd 2 (`build.sh --node`): it never sends CNI GC.
    #[default]
    Containerd,
    /// CRI-O (`build.sh --crio`) with Debian's conmon and runc: it sends CNI GC at every start,
    /// so its nodes' conflist is `cniVersion` 1.1.0 and their CNI plugins the upstream ones.
    CriO,
}

impl NodeRuntime {
    /// Its name on the command line (`cluster up --runtime`) and in a Node's
    /// `status.nodeInfo.containerRuntimeVersion` (before the `://`).
    pub fn name(self) -> &'static str {
        match self {
            NodeRuntime::Containerd => "containerd",
            NodeRuntime::CriO => "cri-o",
        }
    }

    /// Its daemon: the program, and the name of its log ([`super::RealNode::log`]).
    pub fn daemon(self) -> &'static str {
        match self {
            NodeRuntime::Containerd => "containerd",
            NodeRuntime::CriO => "crio",
        }
    }

    /// The `cniVersion` of the conflist its nodes get: CRI-O's libcni sends GC only to a
    /// network of 1.1.0 or later; Debian's plugins under containerd stop at 1.0.0.
    pub fn cni_version(self) -> &'static str {
        match self {
            NodeRuntime::Containerd => "1.0.0",
            NodeRuntime::CriO => "1.1.0",
        }
    }

    /// Its CRI socket inside the node (whose `/run` is private).
    pub fn socket(self) -> &'static str {
        match self {
            NodeRuntime::Containerd => CONTAINERD_SOCKET,
            NodeRuntime::CriO => CRIO_SOCKET,
        }
    }
}

impl std::str::FromStr for NodeRuntime {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [NodeRuntime::Containerd, NodeRuntime::CriO]
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| format!("{s:?} is not a container runtime (containerd or cri-o)"))
    }
}

/// The bin directory of k3s release `release` (`data/<release>/bin`), as the node sees it.
pub fn k3s_release_bin(release: &str) -> String {
    format!("{K3S_DATA_DIR}/{release}/bin")
}

/// How a cluster's pods are addressed: which families, which nodes get a tiny range, and which
/// CNI network hands out the addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PodNetwork {
    /// Every node also gets an IPv6 pod CIDR (dual-stack: each pod an IPv4 and an IPv6 address).
    pub dual_stack: bool,
    /// How many of the cluster's last nodes get a [`TINY_PREFIX`] IPv4 range and the
    /// [`TINY_TAINT`].
    pub tiny_nodes: u8,
    /// The nodes' CNI network.
    pub cni: NodeCni,
    /// Where the nodes keep their CNI plugins and configuration (all but the last
    /// [`Self::k3s_nodes`]).
    pub dirs: NodeDirs,
    /// How many of the cluster's first nodes run CRI-O instead of containerd (the first: a
    /// mixed cluster may also have tiny nodes, which are the last).
    pub crio_nodes: u8,
    /// How many of the cluster's last nodes have k3s's layout whatever [`Self::dirs`] says (a
    /// cluster mixing k3s-layout and standard nodes, served by one `helm install`).
    pub k3s_nodes: u8,
}

impl PodNetwork {
    /// Whether `node` of a cluster of `nodes` is one of the tiny ones.
    pub fn is_tiny(self, node: NodeLayout, nodes: u8) -> bool {
        u16::from(node.index()) + u16::from(self.tiny_nodes) >= u16::from(nodes)
    }

    /// The container runtime of `node`.
    pub fn runtime(self, node: NodeLayout) -> NodeRuntime {
        if node.index() < self.crio_nodes {
            NodeRuntime::CriO
        } else {
            NodeRuntime::Containerd
        }
    }

    /// Where `node` of a cluster of `nodes` keeps its CNI plugins and configuration.
    pub fn dirs(self, node: NodeLayout, nodes: u8) -> NodeDirs {
        if u16::from(node.index()) + u16::from(self.k3s_nodes) >= u16::from(nodes) {
            NodeDirs::K3s
        } else {
            self.dirs
        }
    }

    /// The pod CIDRs of `node` in a cluster of `nodes`, IPv4 first (`spec.podCIDRs` of its Node,
    /// and the ranges of its CNI network): its /24 block or a /29 at the start of it, then its
    /// IPv6 /64 when dual-stack.
    pub fn pod_cidrs(self, node: NodeLayout, nodes: u8) -> Vec<String> {
        let block = node.pod_cidr();
        let v4 = if self.is_tiny(node, nodes) {
            block.replace("/24", &format!("/{TINY_PREFIX}"))
        } else {
            block
        };
        let mut cidrs = vec![v4];
        if self.dual_stack {
            cidrs.push(node.pod_cidr_v6());
        }
        cidrs
    }

    /// The taints `node` is registered with.
    pub fn taints(self, node: NodeLayout, nodes: u8) -> serde_json::Value {
        if self.is_tiny(node, nodes) {
            json!([{"key": TINY_TAINT, "value": "true", "effect": "NoSchedule"}])
        } else {
            json!([])
        }
    }
}

/// The paths a node sees at their usual place, each backed by its own directory on the host.
/// (`/run` is a fresh tmpfs per node instead, so sockets and pod namespaces are private too.)
/// Then CRI-O's: its image and container storage, its own state (which must survive a reboot:
/// without `/var/lib/crio/version` CRI-O takes a start for an upgrade and wipes its images) and
/// its pods' logs. The last two hold the runtimes' configurations where a real node keeps them
/// (k3s's is under `/var/lib/rancher`), where the agent reads them through its mount of `/`.
pub const NODE_PATHS: [&str; 14] = [
    "/etc/cni/net.d",
    "/opt/cni/bin",
    "/var/lib/rancher",
    "/var/lib/cni",
    "/var/lib/kubelet",
    "/var/log/pods",
    "/var/log/containers",
    "/var/lib/containerd",
    "/var/lib/kube-proxy",
    "/var/lib/containers",
    "/var/lib/crio",
    "/var/log/crio",
    "/etc/containerd",
    "/etc/crio",
];

/// One cluster's place on the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot(u8);

impl Slot {
    /// Slot `n`, if below [`MAX_SLOTS`].
    pub fn new(n: u8) -> Option<Slot> {
        (n < MAX_SLOTS).then_some(Slot(n))
    }

    /// Its number.
    pub fn number(self) -> u8 {
        self.0
    }

    /// The slot's directory name (`slot3`).
    pub fn dir_name(self) -> String {
        format!("slot{}", self.0)
    }

    /// The slot a directory name names, if it is one.
    pub fn parse_dir_name(name: &str) -> Option<Slot> {
        let n = name.strip_prefix("slot")?;
        if n.is_empty() || (n.len() > 1 && n.starts_with('0')) {
            return None;
        }
        Slot::new(n.parse().ok()?)
    }

    /// The host bridge every node of the slot hangs on.
    pub fn bridge(self) -> String {
        format!("ipk-nodes{}", self.0)
    }

    /// The host's address on the bridge: where nodes reach the API server.
    pub fn host_ip(self) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, self.0, 1)
    }

    /// The node network (`198.18.<s>.0/24`).
    pub fn node_network(self) -> String {
        format!("198.18.{}.0/24", self.0)
    }

    /// The range every node's pod CIDR comes from (`198.19.<128+8s>.0/21`).
    pub fn cluster_cidr(self) -> String {
        format!("198.19.{}.0/21", 128 + 8 * u16::from(self.0))
    }

    /// The range every node's IPv6 pod CIDR comes from, when dual-stack (`fd19:198:<s>::/48`).
    pub fn cluster_cidr_v6(self) -> String {
        let net = Ipv6Addr::new(0xfd19, 0x198, u16::from(self.0), 0, 0, 0, 0, 0);
        format!("{net}/48")
    }

    /// The slot's data directory on disk.
    pub fn data_dir(self) -> PathBuf {
        Path::new(DATA_ROOT).join("nodes").join(self.dir_name())
    }

    /// The slot's namespace-file directory (a private mount, so namespaces can be bound there).
    pub fn run_dir(self) -> PathBuf {
        Path::new(RUN_ROOT).join(self.dir_name())
    }

    /// The slot's cgroup, relative to a hierarchy's root.
    pub fn cgroup(self) -> String {
        format!("{CGROUP_PARENT}/{}", self.dir_name())
    }

    /// Node `index` of this slot, if below [`MAX_NODES`].
    pub fn node(self, index: u8) -> Option<NodeLayout> {
        (index < MAX_NODES).then_some(NodeLayout { slot: self, index })
    }
}

/// Everything about one node that follows from its slot and index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeLayout {
    slot: Slot,
    index: u8,
}

impl NodeLayout {
    /// Its slot.
    pub fn slot(self) -> Slot {
        self.slot
    }

    /// Its index in the cluster.
    pub fn index(self) -> u8 {
        self.index
    }

    /// The Kubernetes node name (`node-0`); unique within the cluster, which has its own API.
    pub fn name(self) -> String {
        format!("node-{}", self.index)
    }

    /// The node's address (`198.18.<s>.<10+i>`), on its `eth0`.
    pub fn ip(self) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, self.slot.0, 10 + self.index)
    }

    /// The node's IPv6 address on its `eth0` (`fd18:198:<s>::<10+i>/64`), given only to the nodes
    /// of a dual-stack flannel cluster: flannel's IPv6 vxlan needs an IPv6 address per node.
    pub fn ip_v6(self) -> Ipv6Addr {
        Ipv6Addr::new(
            0xfd18,
            0x198,
            u16::from(self.slot.0),
            0,
            0,
            0,
            0,
            10 + u16::from(self.index),
        )
    }

    /// The node's IPv4 block (`/24`): its pod CIDR, or the one a tiny range lies at the start of
    /// ([`PodNetwork::pod_cidrs`]); the other nodes route it to this node.
    pub fn pod_cidr(self) -> String {
        format!(
            "198.19.{}.0/24",
            128 + 8 * u16::from(self.slot.0) + u16::from(self.index)
        )
    }

    /// The node's IPv6 pod CIDR, when its cluster is dual-stack (`fd19:198:<s>:<i>::/64` in
    /// canonical form, a unique local range no other slot or node uses).
    pub fn pod_cidr_v6(self) -> String {
        let net = Ipv6Addr::new(
            0xfd19,
            0x198,
            u16::from(self.slot.0),
            u16::from(self.index),
            0,
            0,
            0,
            0,
        );
        format!("{net}/64")
    }

    /// The node's network namespace name (`ip netns`), unique on the machine.
    pub fn netns(self) -> String {
        format!("ipk-s{}-n{}", self.slot.0, self.index)
    }

    /// The host end of the node's veth, on the bridge.
    pub fn host_veth(self) -> String {
        format!("ipk{}n{}", self.slot.0, self.index)
    }

    /// The node's data directory on disk: its `/var/lib/...` views and its configuration.
    pub fn data_dir(self) -> PathBuf {
        self.slot.data_dir().join(self.name())
    }

    /// The host directory behind a path the node sees (one of [`NODE_PATHS`]).
    pub fn host_dir(self, node_path: &str) -> PathBuf {
        self.data_dir()
            .join("root")
            .join(node_path.trim_start_matches('/').replace('/', "-"))
    }

    /// The host path behind any path the node sees under one of [`NODE_PATHS`]
    /// (`/var/lib/cni/networks/cbr0` → `<data>/root/var-lib-cni/networks/cbr0`); `None` for a
    /// path outside them or one that climbs (`..`) or is not absolute, so nothing outside the
    /// node's directory is ever named.
    pub fn host_path(self, node_path: &str) -> Option<PathBuf> {
        let (base, rest) = NODE_PATHS.iter().find_map(|p| {
            let rest = node_path.strip_prefix(p)?;
            (rest.is_empty() || rest.starts_with('/')).then_some((*p, rest))
        })?;
        let mut out = self.host_dir(base);
        for part in rest.split('/').filter(|c| !c.is_empty()) {
            if part == ".." || part == "." {
                return None;
            }
            out.push(part);
        }
        Some(out)
    }

    /// The file its persistent mount namespace is bound to.
    pub fn mount_ns_file(self) -> PathBuf {
        self.slot.run_dir().join(format!("{}.mnt", self.name()))
    }

    /// The node's cgroup, relative to a hierarchy's root.
    pub fn cgroup(self) -> String {
        format!("{}/{}", self.slot.cgroup(), self.name())
    }

    /// Where containerd, the kubelet and kube-proxy (and containerd's shims) run.
    pub fn daemons_cgroup(self) -> String {
        format!("{}/daemons", self.cgroup())
    }

    /// The kubelet's `cgroupRoot`: it creates `kubepods` under it.
    pub fn pods_cgroup(self) -> String {
        format!("{}/pods", self.cgroup())
    }
}

/// Where `dirs`'s containerd reads its configuration, inside the node: k3s writes its own under
/// its agent directory (and starts its containerd with it), a standard node has containerd's.
pub fn containerd_config_path(dirs: NodeDirs) -> &'static str {
    match dirs {
        NodeDirs::Standard => "/etc/containerd/config.toml",
        NodeDirs::K3s => "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
    }
}

/// CRI-O's configuration file inside the node.
pub const CRIO_CONFIG_PATH: &str = "/etc/crio/crio.conf";
/// CRI-O's drop-in directory inside the node (empty here, see [`crio_config`]).
pub const CRIO_DROP_IN_DIR: &str = "/etc/crio/crio.conf.d";

/// containerd's socket inside every node (its `/run` is private).
pub const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";

/// containerd's configuration (version 3, containerd 2.x). Defaults where they serve: root
/// `/var/lib/containerd`, state and socket under `/run/containerd` (both private to the node).
/// `hosts_dir` is the CRI image plugin's `config_path`, where a private registry's
/// `<host:port>/hosts.toml` goes ([`super::registries`]); containerd 2.1 reads none without it.
pub fn containerd_config(runc: &Path, dirs: NodeDirs, hosts_dir: &Path) -> String {
    format!(
        r#"version = 3

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '{PAUSE_IMAGE}'
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = '{hosts_dir}'
  [plugins.'io.containerd.cri.v1.runtime']
    # No CAP_SYS_RESOURCE on a test machine: runc cannot lower oom_score_adj below ours.
    restrict_oom_score_adj = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = '{runc}'
      SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['{bin_dir}']
      conf_dir = '{conf_dir}'
  # NRI's socket would be shared by every node on the machine; nothing here uses NRI.
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
"#,
        runc = runc.display(),
        bin_dir = dirs.cni_bin_dir(),
        conf_dir = dirs.cni_conf_dir(),
        hosts_dir = hosts_dir.display(),
    )
}

/// CRI-O's socket inside every CRI-O node.
pub const CRIO_SOCKET: &str = "/run/crio/crio.sock";

/// Where the programs CRI-O runs are, on the machine.
#[derive(Debug, Clone)]
pub struct CrioPrograms {
    /// `pinns` (from `build.sh --crio`).
    pub pinns: PathBuf,
    /// runc: Debian's, through `ipkeep-e2e cluster runc` ([`super::crio::runc_clamped`]).
    pub runc: PathBuf,
    /// conmon (Debian's).
    pub conmon: PathBuf,
    /// The image signature policy file (accept anything: the images are imported, never pulled).
    pub signature_policy: PathBuf,
}

/// CRI-O's configuration: one file, nothing from `crio.conf.d` (a drop-in's
/// `[crio.runtime.runtimes.runc]` replaces the whole table: a `runtime_root` left out falls back
/// to crun's, and CRI-O then loses its containers at the next start). Storage under
/// `/var/lib/containers` (disk) and `/run/containers` (gone at a reboot), cgroupfs (no systemd
/// as PID 1), no SELinux, AppArmor or seccomp (a build without cgo has no seccomp: every
/// container runs unconfined, as CRI-O says at start), NRI off (its socket would be shared by
/// every node on the machine).
pub fn crio_config(programs: &CrioPrograms, dirs: NodeDirs) -> String {
    format!(
        r#"[crio]
root = "/var/lib/containers/storage"
runroot = "/run/containers/storage"
storage_driver = "overlay"
log_dir = "/var/log/crio/pods"
version_file = "/run/crio/version"
version_file_persist = "/var/lib/crio/version"
clean_shutdown_file = "/var/lib/crio/clean.shutdown"

[crio.api]
listen = "{CRIO_SOCKET}"
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
conmon_cgroup = "pod"
namespaces_dir = "/run"
pinns_path = "{pinns}"
container_exits_dir = "/run/crio/exits"
container_attach_socket_dir = "/run/crio"
log_level = "info"
selinux = false
apparmor_profile = "unconfined"
seccomp_profile = ""

[crio.runtime.runtimes.runc]
runtime_path = "{runc}"
runtime_type = "oci"
runtime_root = "/run/runc"
monitor_path = "{conmon}"
monitor_cgroup = "pod"
monitor_env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]

[crio.image]
pause_image = "{PAUSE_IMAGE}"
pause_command = "/pause"
signature_policy = "{policy}"
pinned_images = ["{PAUSE_IMAGE}"]

[crio.network]
network_dir = "{conf_dir}/"
plugin_dirs = ["{bin_dir}/"]

[crio.metrics]
enable_metrics = false

[crio.nri]
enable_nri = false
"#,
        pinns = programs.pinns.display(),
        runc = programs.runc.display(),
        conmon = programs.conmon.display(),
        policy = programs.signature_policy.display(),
        conf_dir = dirs.cni_conf_dir(),
        bin_dir = dirs.cni_bin_dir(),
    )
}

/// Files the kubelet of a node reads.
#[derive(Debug, Clone)]
pub struct KubeletFiles {
    /// The CA that signs API server clients (the API server's kubelet client among them).
    pub client_ca: PathBuf,
    /// The kubelet's serving certificate (SANs: its address and name).
    pub tls_cert: PathBuf,
    /// Its key.
    pub tls_key: PathBuf,
}

/// The kubelet's configuration (JSON, which the kubelet reads as YAML).
pub fn kubelet_config(
    node: NodeLayout,
    files: &KubeletFiles,
    runtime: NodeRuntime,
) -> serde_json::Value {
    json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node.ip().to_string(),
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "tlsCertFile": files.tls_cert,
        "tlsPrivateKeyFile": files.tls_key,
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": true},
            "x509": {"clientCAFile": files.client_ca},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": format!("unix://{}", runtime.socket()),
        // cgroup v1 hosts; no systemd as PID 1, so no systemd driver.
        "failCgroupV1": false,
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": true,
        "cgroupRoot": format!("/{}", node.pods_cgroup()),
        "failSwapOn": false,
        "resolvConf": "/etc/resolv.conf",
        "enforceNodeAllocatable": [],
        "localStorageCapacityIsolation": false,
        // A test machine's disk is shared and often full-ish: no eviction, no image GC.
        "imageGCHighThresholdPercent": 100,
        "evictionHard": {
            "memory.available": "0%",
            "nodefs.available": "0%",
            "nodefs.inodesFree": "0%",
            "imagefs.available": "0%",
        },
        "rotateCertificates": false,
        "serializeImagePulls": false,
    })
}

/// kube-proxy's configuration (iptables mode, inside the node's network namespace).
pub fn kube_proxy_config(node: NodeLayout, kubeconfig: &Path) -> serde_json::Value {
    json!({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig},
        "hostnameOverride": node.name(),
        "bindAddress": node.ip().to_string(),
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "mode": "iptables",
        "clusterCIDR": node.slot().cluster_cidr(),
        // Leave the machine's conntrack sysctls alone.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "iptables": {"minSyncPeriod": "1s"},
        // NodePorts on the node's own address only (kube-proxy warns when this is unset).
        "nodePortAddresses": ["primary"],
    })
}

/// The node's CNI network, as a flannel or k3s node has it: `bridge` on `cbr0` as the pods'
/// gateway with host-local IPAM over the node's pod CIDRs (`cidrs`, one range set each, so a
/// dual-stack pod gets one address of each family; default `dataDir`), then `portmap`; of
/// `cni_version` ([`NodeRuntime::cni_version`]).
pub fn cni_conflist(cidrs: &[String], cni_version: &str) -> serde_json::Value {
    let ranges: Vec<serde_json::Value> = cidrs.iter().map(|c| json!([{"subnet": c}])).collect();
    let routes: Vec<serde_json::Value> = cidrs
        .iter()
        .map(|c| json!({"dst": if c.contains(':') { "::/0" } else { "0.0.0.0/0" }}))
        .collect();
    json!({
        "cniVersion": cni_version,
        "name": CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cbr0",
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": ranges,
                    "routes": routes,
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    })
}

/// A busybox pod named `client` on `node` that only waits, to reach the others from.
pub fn client_pod(node: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: client
spec:
  nodeSelector:
    kubernetes.io/hostname: {node}
  terminationGracePeriodSeconds: 1
  containers:
  - name: client
    image: {WORKLOAD_IMAGE}
    imagePullPolicy: Never
    command: [sleep, "36000"]
"#
    )
}

/// The conflist's file name in `/etc/cni/net.d` (k3s's).
pub const CNI_CONFLIST_FILE: &str = "10-cbr0.conflist";

/// Where kube-flannel's init container writes its conflist (`/etc/cni/net.d`).
pub const FLANNEL_CONFLIST_FILE: &str = "10-flannel.conflist";

/// kube-flannel's `cni-conf.json` as its manifest ships it (`Documentation/kube-flannel.yml`):
/// network `cbr0`, flannel delegating to `bridge` with no `ipam` of its own (flannel's plugin
/// writes the delegate's IPAM from the node's lease: `host-local` unless the top level names
/// another type), then `portmap`.
pub fn kube_flannel_conflist() -> serde_json::Value {
    json!({
        "name": CNI_NETWORK,
        "cniVersion": "1.0.0",
        "plugins": [
            {
                "type": "flannel",
                "delegate": {"hairpinMode": true, "isDefaultGateway": true},
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    })
}

/// k3s's flannel conflist, as k3s writes it on every start
/// (`/var/lib/rancher/k3s/agent/etc/cni/net.d/10-flannel.conflist`, from its template unless
/// `--flannel-cni-conf` names a file): kube-flannel's with `forceAddress` in the delegate and the
/// `bandwidth` plugin last.
pub fn k3s_conflist() -> serde_json::Value {
    json!({
        "name": CNI_NETWORK,
        "cniVersion": "1.0.0",
        "plugins": [
            {
                "type": "flannel",
                "delegate": {"hairpinMode": true, "forceAddress": true, "isDefaultGateway": true},
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
            {"type": "bandwidth", "capabilities": {"bandwidth": true}},
        ],
    })
}

/// The routes a node's network namespace gets besides its own network: the Service range (so
/// connections from the node itself reach kube-proxy's rules) and, on the bridge network, every
/// other node's pod CIDR via that node (flannel sets those itself). No default route: nothing
/// leaves the machine.
pub fn node_routes(node: NodeLayout, nodes: u8, cni: NodeCni) -> Vec<(String, Option<Ipv4Addr>)> {
    let mut routes = vec![(SERVICE_CIDR.to_owned(), None)];
    if cni == NodeCni::Flannel {
        return routes;
    }
    for other in (0..nodes).filter_map(|i| node.slot().node(i)) {
        if other != node {
            routes.push((other.pod_cidr(), Some(other.ip())));
        }
    }
    routes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_conflist_is_kube_flannels_with_no_ipam_of_its_own() {
        let c = kube_flannel_conflist();
        assert_eq!(c["name"], "cbr0");
        assert_eq!(c["plugins"][0]["type"], "flannel");
        assert!(c["plugins"][0].get("ipam").is_none());
        assert!(c["plugins"][0]["delegate"].get("ipam").is_none());
        assert_eq!(c["plugins"][1]["type"], "portmap");
    }

    #[test]
    fn slots_and_nodes_get_disjoint_names_and_addresses() {
        let cases = [
            (
                0,
                0,
                "198.18.0.10",
                "198.19.128.0/24",
                "ipk-s0-n0",
                "ipk0n0",
            ),
            (
                0,
                1,
                "198.18.0.11",
                "198.19.129.0/24",
                "ipk-s0-n1",
                "ipk0n1",
            ),
            (
                3,
                7,
                "198.18.3.17",
                "198.19.159.0/24",
                "ipk-s3-n7",
                "ipk3n7",
            ),
            (
                15,
                7,
                "198.18.15.17",
                "198.19.255.0/24",
                "ipk-s15-n7",
                "ipk15n7",
            ),
        ];
        for (slot, index, ip, cidr, netns, veth) in cases {
            let node = Slot::new(slot).and_then(|s| s.node(index)).unwrap();
            assert_eq!(node.ip().to_string(), ip);
            assert_eq!(node.pod_cidr(), cidr);
            assert_eq!(node.netns(), netns);
            assert_eq!(node.host_veth(), veth);
            assert!(
                node.host_veth().len() <= 15,
                "interface names are at most 15 bytes"
            );
        }
        assert!(Slot::new(MAX_SLOTS).is_none());
        assert!(Slot::new(0).unwrap().node(MAX_NODES).is_none());
        assert_eq!(Slot::new(2).unwrap().cluster_cidr(), "198.19.144.0/21");
        assert!(Slot::new(15).unwrap().bridge().len() <= 15);
    }

    #[test]
    fn slot_dir_names_round_trip_and_reject_the_rest() {
        for (name, slot) in [
            ("slot0", Some(0)),
            ("slot15", Some(15)),
            ("slot16", None),
            ("slot01", None),
            ("slot", None),
            ("slot-1", None),
            ("other", None),
            ("slot1/..", None),
        ] {
            assert_eq!(Slot::parse_dir_name(name).map(Slot::number), slot, "{name}");
        }
    }

    #[test]
    fn node_paths_map_to_their_own_host_directories() {
        let node = Slot::new(1).and_then(|s| s.node(2)).unwrap();
        assert_eq!(
            node.host_dir("/var/lib/cni"),
            Path::new("/var/lib/ipkeep-e2e/nodes/slot1/node-2/root/var-lib-cni")
        );
        let dirs: std::collections::BTreeSet<_> =
            NODE_PATHS.iter().map(|p| node.host_dir(p)).collect();
        assert_eq!(dirs.len(), NODE_PATHS.len());
    }

    #[test]
    fn host_paths_stay_inside_the_node_directory() {
        let node = Slot::new(0).and_then(|s| s.node(1)).unwrap();
        let root = "/var/lib/ipkeep-e2e/nodes/slot0/node-1/root";
        for (path, want) in [
            ("/var/lib/cni", Some(format!("{root}/var-lib-cni"))),
            (
                "/var/lib/cni/networks/cbr0/reserved",
                Some(format!("{root}/var-lib-cni/networks/cbr0/reserved")),
            ),
            ("/opt/cni/bin/", Some(format!("{root}/opt-cni-bin"))),
            ("/var/lib/cni/../../../etc", None),
            ("/var/lib/cni/./x", None),
            ("/var/lib/cnix", None),
            ("/etc/passwd", None),
            ("var/lib/cni", None),
            ("", None),
        ] {
            assert_eq!(node.host_path(path), want.map(PathBuf::from), "{path}");
        }
    }

    #[test]
    fn routes_reach_other_nodes_pods_and_services_but_nothing_else() {
        let slot = Slot::new(0).unwrap();
        let node = slot.node(1).unwrap();
        let routes = node_routes(node, 3, NodeCni::Bridge);
        assert_eq!(
            routes,
            vec![
                (SERVICE_CIDR.to_owned(), None),
                (
                    "198.19.128.0/24".to_owned(),
                    Some(Ipv4Addr::new(198, 18, 0, 10))
                ),
                (
                    "198.19.130.0/24".to_owned(),
                    Some(Ipv4Addr::new(198, 18, 0, 12))
                ),
            ]
        );
        // flannel routes the other nodes' pods itself: we only reach the Services.
        assert_eq!(
            node_routes(node, 3, NodeCni::Flannel),
            vec![(SERVICE_CIDR.to_owned(), None)]
        );
    }

    #[test]
    fn node_layouts_parse_from_their_names_and_name_their_directories() {
        for dirs in [NodeDirs::Standard, NodeDirs::K3s] {
            assert_eq!(dirs.name().parse::<NodeDirs>(), Ok(dirs));
            let config = containerd_config(Path::new("/usr/sbin/runc"), dirs, Path::new("/h"));
            assert!(config.contains(&format!("bin_dirs = ['{}']", dirs.cni_bin_dir())));
            assert!(config.contains("config_path = '/h'"));
            assert!(config.contains(&format!("conf_dir = '{}'", dirs.cni_conf_dir())));
            // Each directory is one the node keeps on disk of its own.
            let node = Slot::new(0).and_then(|s| s.node(0)).unwrap();
            assert!(node.host_path(dirs.cni_bin_dir()).is_some());
            assert!(node.host_path(dirs.cni_conf_dir()).is_some());
        }
        assert!("K3s".parse::<NodeDirs>().is_err());
        assert_eq!(
            k3s_release_bin(K3S_FIRST_RELEASE),
            "/var/lib/rancher/k3s/data/ipkeep-e2e-1/bin"
        );
    }

    #[test]
    fn node_networks_parse_from_their_names_and_nothing_else() {
        for cni in [NodeCni::Bridge, NodeCni::Flannel] {
            assert_eq!(cni.name().parse::<NodeCni>(), Ok(cni));
        }
        for bad in ["", "Flannel", "calico", "bridge "] {
            assert!(bad.parse::<NodeCni>().is_err(), "{bad:?}");
        }
        assert_eq!(NodeCni::default(), NodeCni::Bridge);
    }

    #[test]
    fn the_conflist_is_a_flannel_style_bridge_with_host_local() {
        let node = Slot::new(0).and_then(|s| s.node(0)).unwrap();
        let c = cni_conflist(&PodNetwork::default().pod_cidrs(node, 2), "1.0.0");
        assert_eq!(c["name"], "cbr0");
        assert_eq!(c["plugins"][0]["type"], "bridge");
        assert_eq!(c["plugins"][0]["ipam"]["type"], "host-local");
        assert_eq!(
            c["plugins"][0]["ipam"]["ranges"],
            json!([[{"subnet": "198.19.128.0/24"}]])
        );
        assert_eq!(
            c["plugins"][0]["ipam"]["routes"],
            json!([{"dst": "0.0.0.0/0"}])
        );
        assert!(c["plugins"][0]["ipam"].get("dataDir").is_none());
    }

    #[test]
    fn a_dual_stack_conflist_has_one_range_set_and_one_default_route_per_family() {
        let c = cni_conflist(
            &["198.19.128.0/29".to_owned(), "fd19:198::/64".to_owned()],
            "1.0.0",
        );
        assert_eq!(
            c["plugins"][0]["ipam"]["ranges"],
            json!([[{"subnet": "198.19.128.0/29"}], [{"subnet": "fd19:198::/64"}]])
        );
        assert_eq!(
            c["plugins"][0]["ipam"]["routes"],
            json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}])
        );
    }

    #[test]
    fn the_last_k3s_nodes_have_k3s_layout_and_each_runtime_config_is_node_private() {
        let slot = Slot::new(0).unwrap();
        let mixed = PodNetwork {
            k3s_nodes: 1,
            ..PodNetwork::default()
        };
        let node = |i| slot.node(i).unwrap();
        assert_eq!(mixed.dirs(node(0), 2), NodeDirs::Standard);
        assert_eq!(mixed.dirs(node(1), 2), NodeDirs::K3s);
        assert_eq!(PodNetwork::default().dirs(node(1), 2), NodeDirs::Standard);
        let all_k3s = PodNetwork {
            dirs: NodeDirs::K3s,
            ..PodNetwork::default()
        };
        assert_eq!(all_k3s.dirs(node(0), 2), NodeDirs::K3s);
        // Where the agent reads them through its mount of `/`, each behind the node's own dir.
        for path in [
            containerd_config_path(NodeDirs::Standard),
            containerd_config_path(NodeDirs::K3s),
            CRIO_CONFIG_PATH,
            CRIO_DROP_IN_DIR,
        ] {
            let host = node(0).host_path(path).unwrap();
            assert!(
                host.starts_with(node(0).data_dir()),
                "{path}: {}",
                host.display()
            );
        }
    }

    #[test]
    fn the_first_crio_nodes_run_cri_o_with_a_cni_1_1_conflist_and_its_socket() {
        let slot = Slot::new(0).unwrap();
        let mixed = PodNetwork {
            crio_nodes: 1,
            ..PodNetwork::default()
        };
        let all = PodNetwork {
            crio_nodes: 2,
            ..PodNetwork::default()
        };
        // (network, node index, runtime)
        let cases = [
            (PodNetwork::default(), 0, NodeRuntime::Containerd),
            (mixed, 0, NodeRuntime::CriO),
            (mixed, 1, NodeRuntime::Containerd),
            (all, 0, NodeRuntime::CriO),
            (all, 1, NodeRuntime::CriO),
            (all, 2, NodeRuntime::Containerd),
        ];
        for (network, index, runtime) in cases {
            let node = slot.node(index).unwrap();
            assert_eq!(network.runtime(node), runtime, "{network:?} node {index}");
        }
        let files = KubeletFiles {
            client_ca: "/ca".into(),
            tls_cert: "/c".into(),
            tls_key: "/k".into(),
        };
        let node = slot.node(0).unwrap();
        for (runtime, endpoint, version) in [
            (
                NodeRuntime::Containerd,
                "unix:///run/containerd/containerd.sock",
                "1.0.0",
            ),
            (NodeRuntime::CriO, "unix:///run/crio/crio.sock", "1.1.0"),
        ] {
            assert_eq!(
                kubelet_config(node, &files, runtime)["containerRuntimeEndpoint"],
                endpoint
            );
            let (_, conflist) = NodeCni::Bridge.conflist(&[], NodeDirs::Standard, runtime);
            assert_eq!(conflist["cniVersion"], version);
            assert_eq!(runtime.name().parse::<NodeRuntime>(), Ok(runtime));
        }
        assert!("docker".parse::<NodeRuntime>().is_err());
    }

    #[test]
    fn crio_reads_its_plugins_and_network_from_the_layouts_directories() {
        let programs = CrioPrograms {
            pinns: "/cache/pinns".into(),
            runc: "/usr/sbin/runc".into(),
            conmon: "/usr/bin/conmon".into(),
            signature_policy: "/state/policy.json".into(),
        };
        let conf = crio_config(&programs, NodeDirs::Standard);
        for line in [
            "listen = \"/run/crio/crio.sock\"",
            "pinns_path = \"/cache/pinns\"",
            "runtime_root = \"/run/runc\"",
            "network_dir = \"/etc/cni/net.d/\"",
            "plugin_dirs = [\"/opt/cni/bin/\"]",
            "pause_image = \"localhost/ipkeep-e2e/pause:1\"",
        ] {
            assert!(
                conf.lines().any(|l| l == line),
                "{line} missing from\n{conf}"
            );
        }
    }

    #[test]
    fn pod_networks_give_each_node_its_cidrs_and_taints() {
        let slot = Slot::new(3).unwrap();
        let plain = PodNetwork::default();
        let dual = PodNetwork {
            dual_stack: true,
            ..PodNetwork::default()
        };
        let tiny = PodNetwork {
            dual_stack: true,
            tiny_nodes: 1,
            ..PodNetwork::default()
        };
        // (network, node index, nodes in the cluster, pod CIDRs, tainted)
        let cases: [(PodNetwork, u8, u8, &[&str], bool); 7] = [
            (plain, 0, 2, &["198.19.152.0/24"], false),
            (plain, 1, 2, &["198.19.153.0/24"], false),
            (dual, 1, 2, &["198.19.153.0/24", "fd19:198:3:1::/64"], false),
            (tiny, 1, 3, &["198.19.153.0/24", "fd19:198:3:1::/64"], false),
            (tiny, 2, 3, &["198.19.154.0/29", "fd19:198:3:2::/64"], true),
            (dual, 0, 1, &["198.19.152.0/24", "fd19:198:3::/64"], false),
            (
                PodNetwork {
                    tiny_nodes: 2,
                    ..PodNetwork::default()
                },
                1,
                3,
                &["198.19.153.0/29"],
                true,
            ),
        ];
        for (network, index, nodes, cidrs, tainted) in cases {
            let node = slot.node(index).unwrap();
            assert_eq!(
                network.pod_cidrs(node, nodes),
                cidrs,
                "{network:?} node {index} of {nodes}"
            );
            let taints = network.taints(node, nodes);
            assert_eq!(
                taints.as_array().map(Vec::len),
                Some(usize::from(tainted)),
                "{network:?} node {index} of {nodes}: {taints}"
            );
            if tainted {
                assert_eq!(taints[0]["key"], TINY_TAINT);
                assert_eq!(taints[0]["effect"], "NoSchedule");
            }
        }
        // A tiny range lies inside the node's own /24 block, which the other nodes route to it.
        let node = slot.node(2).unwrap();
        assert!(tiny.pod_cidrs(node, 3)[0].starts_with(node.pod_cidr().trim_end_matches("0/24")));
    }
}
