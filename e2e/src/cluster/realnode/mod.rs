//! Real Kubernetes nodes on this machine: the control plane plus N nodes, each a kubelet,
//! containerd (with Debian's runc) and kube-proxy in its own network namespace, mount namespace
//! and cgroup, on a host bridge, with a flannel/k3s-style CNI network (`bridge` + `host-local`,
//! network `cbr0`). See `docs/real-nodes.md` for the layout and what the real components did.
//!
//! [`Cluster::start`] starts a cluster (the `realnode` test binary runs one at a time, shared
//! by the tests of its shape: `crate::testkit::realnode`). Everything is removed when the
//! cluster is stopped or dropped; after a crash, the next start (or `ipkeep-e2e cluster down`)
//! removes what the crashed run left ([`cleanup_stale`]).

pub mod crio;
pub mod flannel;
pub mod host;
pub mod layout;
pub mod node;
pub mod registries;

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Node;
use kube::{Api, api::PostParams};

pub use host::HostError;
pub use layout::{
    NodeCni, NodeDirs, NodeLayout, NodeRuntime, PodNetwork, Slot, TINY_TAINT, WORKLOAD_IMAGE,
};
pub use node::RealNode;

use super::{ControlPlane, ControlPlaneError, ControlPlaneOptions, plane::NodeAccess};

/// The binaries a node needs (`e2e/cluster/build.sh --node`).
pub const NODE_BINARIES: [&str; 6] = [
    "kubelet",
    "kube-proxy",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "pause",
];

/// How long the nodes may take to become Ready.
const NODES_READY: Duration = Duration::from_secs(180);

/// Failures of the real nodes. Each says which node and what to do.
#[derive(Debug, thiserror::Error)]
pub enum RealNodeError {
    /// The control plane failed.
    #[error(transparent)]
    ControlPlane(#[from] ControlPlaneError),
    /// A host operation for a node failed.
    #[error("node {node}: failed to {stage}")]
    Host {
        /// The node.
        node: String,
        /// What was being done.
        stage: String,
        /// Why.
        #[source]
        source: HostError,
    },
    /// A host operation for the whole cluster failed.
    #[error("failed to {stage}")]
    Machine {
        /// What was being done.
        stage: String,
        /// Why.
        #[source]
        source: HostError,
    },
    /// A file of a node could not be written or read.
    #[error("node {node}: failed to {what}")]
    Io {
        /// The node.
        node: String,
        /// What.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A node's certificate could not be made.
    #[error("node {node}: failed to make its certificates")]
    Pki {
        /// The node.
        node: String,
        /// Why.
        #[source]
        source: super::pki::PkiError,
    },
    /// A node daemon could not be started.
    #[error("node {node}: failed to start {daemon}")]
    Start {
        /// The node.
        node: String,
        /// The daemon.
        daemon: String,
        /// Why.
        #[source]
        source: Box<ControlPlaneError>,
    },
    /// A node daemon exited or never answered.
    #[error("node {node}: {daemon} failed: {how}; last lines of {}:\n{tail}", log.display())]
    Daemon {
        /// The node.
        node: String,
        /// The daemon.
        daemon: String,
        /// What happened.
        how: String,
        /// Its log.
        log: PathBuf,
        /// The end of its log.
        tail: String,
    },
    /// The node binaries are not built.
    #[error(
        "failed to find the node binaries: {dir} has no {missing}; run: make node-bins (or set IPKEEP_NODE_BIN_DIR)"
    )]
    BinariesMissing {
        /// Where they were looked for.
        dir: PathBuf,
        /// The first missing one.
        missing: String,
    },
    /// flannel's binaries are not built.
    #[error(
        "failed to find flannel: {dir} has no {missing}; run: make flannel-bins (or set IPKEEP_FLANNEL_BIN_DIR)"
    )]
    FlannelMissing {
        /// Where they were looked for.
        dir: PathBuf,
        /// The first missing one.
        missing: String,
    },
    /// CRI-O's binaries are not built.
    #[error(
        "failed to find CRI-O: {dir} has no {missing}; run: make crio-bins (or set IPKEEP_CRIO_BIN_DIR)"
    )]
    CrioMissing {
        /// Where they were looked for.
        dir: PathBuf,
        /// The first missing one.
        missing: String,
    },
    /// A helper script failed.
    #[error("failed to run {script}: {why}")]
    Script {
        /// The script.
        script: PathBuf,
        /// What went wrong, with its output.
        why: String,
    },
    /// Every slot is taken.
    #[error(
        "failed to start real nodes: all {} cluster slots under {} are in use by running clusters; stop one (ipkeep-e2e cluster down)",
        layout::MAX_SLOTS,
        layout::DATA_ROOT
    )]
    NoSlot,
    /// An argument was not acceptable.
    #[error("invalid {what}: {value:?} ({why})")]
    Invalid {
        /// Which argument.
        what: &'static str,
        /// Its value.
        value: String,
        /// The rule it breaks.
        why: &'static str,
    },
    /// A condition did not come true.
    #[error("failed to {what}: still not true after {}s ({last})", waited.as_secs())]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        waited: Duration,
        /// What was seen last.
        last: String,
    },
    /// A Kubernetes API call failed.
    #[error("failed to {what}")]
    Api {
        /// What.
        what: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
}

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// How many nodes (1..=8).
    pub nodes: u8,
    /// The pods' addresses: dual-stack or not, how many tiny nodes.
    pub network: PodNetwork,
    /// The control plane's options (`node_access` is set by [`Cluster::start`]).
    pub plane: ControlPlaneOptions,
    /// The node binaries; default: [`node_bin_dir`].
    pub node_bin_dir: Option<PathBuf>,
    /// The directory of `pause.oci.tar` and `workload.oci.tar`; default: [`node_image_dir`].
    pub image_dir: Option<PathBuf>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            nodes: 2,
            network: PodNetwork::default(),
            plane: ControlPlaneOptions::default(),
            node_bin_dir: None,
            image_dir: None,
        }
    }
}

/// Runs a script that prints a directory on its last stdout line.
fn script_dir(script: &Path, args: &[&str]) -> Result<PathBuf, RealNodeError> {
    let text = crate::command::stdout_of(std::process::Command::new(script).args(args), None)
        .map_err(|e| RealNodeError::Script {
            script: script.to_owned(),
            why: crate::error_chain(&e),
        })?;
    Ok(PathBuf::from(
        text.lines().last().unwrap_or_default().trim(),
    ))
}

/// The directory of the node binaries: `IPKEEP_NODE_BIN_DIR`, else what
/// `e2e/cluster/build.sh --print-node-bin-dir` names; checked to hold every binary.
pub fn node_bin_dir() -> Result<PathBuf, RealNodeError> {
    let dir = built_dir("IPKEEP_NODE_BIN_DIR", "--print-node-bin-dir")?;
    check_node_bin_dir(&dir)?;
    Ok(dir)
}

/// Where a set of Go-built binaries is: the environment variable `env` when set, else the
/// directory `e2e/cluster/build.sh PRINT_FLAG` names (the cache its versions build into).
fn built_dir(env: &str, print_flag: &str) -> Result<PathBuf, RealNodeError> {
    match std::env::var_os(env).filter(|v| !v.is_empty()) {
        Some(dir) => Ok(PathBuf::from(dir)),
        None => script_dir(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("cluster/build.sh"),
            &[print_flag],
        ),
    }
}

/// Fails naming the first node binary `dir` lacks, and how to build it.
fn check_node_bin_dir(dir: &Path) -> Result<(), RealNodeError> {
    match NODE_BINARIES.iter().find(|b| !dir.join(b).is_file()) {
        Some(b) => Err(RealNodeError::BinariesMissing {
            dir: dir.to_owned(),
            missing: (*b).to_owned(),
        }),
        None => Ok(()),
    }
}

/// The directory of the node images: `IPKEEP_NODE_IMAGE_DIR`, else built (or found in the
/// cache) by `scripts/build-node-images.sh`.
pub fn node_image_dir(node_bin_dir: &Path) -> Result<PathBuf, RealNodeError> {
    match std::env::var_os("IPKEEP_NODE_IMAGE_DIR").filter(|v| !v.is_empty()) {
        Some(dir) => Ok(PathBuf::from(dir)),
        None => script_dir(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/build-node-images.sh"),
            &[&node_bin_dir.to_string_lossy()],
        ),
    }
}

/// The `ipkeep-e2e` binary, which removes a crashed run's nodes (`cluster reap-nodes`):
/// `IPKEEP_E2E_BIN`, else this very program if it is `ipkeep-e2e`, else the one Cargo builds
/// beside a test binary (`target/<profile>/ipkeep-e2e` for `target/<profile>/deps/<test>`).
pub fn e2e_exe() -> Result<PathBuf, RealNodeError> {
    if let Some(bin) = std::env::var_os("IPKEEP_E2E_BIN").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(bin));
    }
    let exe = std::env::current_exe().map_err(|e| RealNodeError::Script {
        script: PathBuf::from("ipkeep-e2e"),
        why: format!("cannot find this program's path: {e}"),
    })?;
    if exe.file_name().is_some_and(|n| n == "ipkeep-e2e") {
        return Ok(exe);
    }
    let beside = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("ipkeep-e2e"))
        .filter(|p| p.is_file());
    beside.ok_or_else(|| RealNodeError::Script {
        script: PathBuf::from("ipkeep-e2e"),
        why: format!(
            "it is not beside {} (it removes the nodes of a crashed run): build it with `cargo build -p ipkeep-e2e --bin ipkeep-e2e`, or set IPKEEP_E2E_BIN",
            exe.display()
        ),
    })
}

/// Where [`Cluster::start`] found what the nodes run.
#[derive(Debug, Clone, Copy)]
struct BootDirs<'a> {
    /// The node binaries.
    bin: &'a Path,
    /// The node images.
    image: &'a Path,
    /// flannel's binaries, for a flannel network.
    flannel: Option<&'a Path>,
    /// CRI-O's binaries, when some nodes run it.
    crio: Option<&'a Path>,
}

/// A control plane and its real nodes. Dropping it removes everything it made.
#[derive(Debug)]
pub struct Cluster {
    plane: Arc<ControlPlane>,
    nodes: Vec<RealNode>,
    slot: Slot,
    network: PodNetwork,
    bin_dir: PathBuf,
    /// Set by the first [`Cluster::stop`]: the slot may be someone else's after that.
    stopped: std::sync::atomic::AtomicBool,
}

/// The lock every claim of a slot and every "last one out restores the sysctls" takes (a file
/// in `/run`, so a reboot clears it; `flock`, so a killed holder releases it).
fn machine_lock() -> Result<std::fs::File, RealNodeError> {
    let path = Path::new("/run/ipkeep-e2e-nodes.lock");
    let io = |what: &str| {
        let what = format!("{what} {}", path.display());
        move |source| RealNodeError::Io {
            node: "-".into(),
            what,
            source,
        }
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(io("open"))?;
    file.lock().map_err(io("lock"))?;
    Ok(file)
}

/// The slot's `owner` file: the pid of the process that runs it.
fn owner_file(slot: Slot) -> PathBuf {
    slot.data_dir().join("owner")
}

fn slot_owner(slot: Slot) -> Option<u32> {
    std::fs::read_to_string(owner_file(slot))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Claims a free slot: removes the leftovers of crashed runs first, then takes the first slot
/// whose directory does not exist. The directory is the lock, and it appears whole, with its
/// `owner` file, by a rename: a concurrent [`cleanup_stale`] never sees it without an owner.
fn claim_slot() -> Result<Slot, RealNodeError> {
    for line in cleanup_stale() {
        eprintln!("ipkeep-e2e nodes: {line}");
    }
    let parent = Path::new(layout::DATA_ROOT).join("nodes");
    let io = |what: String| {
        move |source| RealNodeError::Io {
            node: "-".into(),
            what,
            source,
        }
    };
    // Under the machine lock: a cleanup that finds no slot in use and restores the sysctls
    // never runs between our claim and our record of them, and the last cleanup's removal of
    // the empty parent never runs between our creating it and our claim inside it (the race
    // a test binary starting while the previous one's watchdog cleaned up once lost).
    let _lock = machine_lock()?;
    std::fs::create_dir_all(&parent).map_err(io(format!("create {}", parent.display())))?;
    host::record_sysctls().map_err(|source| RealNodeError::Machine {
        stage: "record the sysctls the kubelet changes".into(),
        source,
    })?;
    let claim = parent.join(format!(".claim-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&claim);
    std::fs::create_dir(&claim).map_err(io(format!("create {}", claim.display())))?;
    std::fs::write(claim.join("owner"), format!("{}\n", std::process::id()))
        .map_err(io(format!("write the owner file in {}", claim.display())))?;
    for n in 0..layout::MAX_SLOTS {
        let Some(slot) = Slot::new(n) else { continue };
        // rename(2) onto an existing non-empty directory fails: the slot is someone's.
        if slot.data_dir().symlink_metadata().is_err()
            && std::fs::rename(&claim, slot.data_dir()).is_ok()
        {
            return Ok(slot);
        }
    }
    let _ = std::fs::remove_dir_all(&claim);
    Err(RealNodeError::NoSlot)
}

/// Removes everything a slot may hold, whatever state a crash left, in dependency order:
/// every process in its cgroups (daemons, shims, containers), each node's mount namespace
/// (and with it every mount inside) and network namespace (and its veths), the bridge (and the
/// host routes through it), the namespace directory, the cgroups (depth-first, in every
/// hierarchy), the data directory; and, when no other slot is in use, restores the sysctls.
/// Returns what it changed, one line each.
pub fn cleanup_slot(slot: Slot) -> Result<Vec<String>, RealNodeError> {
    let machine = |stage: &str| {
        let stage = format!("{stage} (cluster slot {})", slot.number());
        move |source| RealNodeError::Machine { stage, source }
    };
    let mut done = Vec::new();
    host::kill_cgroup(&slot.cgroup()).map_err(machine("kill the nodes' processes"))?;
    for i in 0..layout::MAX_NODES {
        let Some(node) = slot.node(i) else { continue };
        host::delete_mount_ns(node).map_err(machine("remove a node's mount namespace"))?;
        if host::netns_path(&node.netns()).exists() {
            done.push(format!("removed network namespace {}", node.netns()));
        }
        host::delete_node_netns(node).map_err(machine("remove a node's network namespace"))?;
    }
    if host::link_exists(&slot.bridge()) {
        done.push(format!("removed bridge {}", slot.bridge()));
    }
    host::delete_link(&slot.bridge()).map_err(machine("remove the bridge"))?;
    let run_dir = slot.run_dir();
    if host::is_mount_point(&run_dir) {
        host::run("umount", &[&run_dir.to_string_lossy()]).map_err(machine("unmount"))?;
    }
    let _ = std::fs::remove_dir(&run_dir);
    host::remove_cgroup(&slot.cgroup()).map_err(machine("remove the cgroups"))?;
    let data = slot.data_dir();
    if data.symlink_metadata().is_ok() {
        std::fs::remove_dir_all(&data).map_err(|source| RealNodeError::Io {
            node: "-".into(),
            what: format!("remove {}", data.display()),
            source,
        })?;
        done.push(format!("removed {}", data.display()));
    }
    let _lock = machine_lock()?;
    if slots_in_use().is_empty() {
        host::remove_cgroup_parent_if_empty();
        let _ = std::fs::remove_dir(layout::RUN_ROOT);
        let _ = std::fs::remove_dir(Path::new(layout::DATA_ROOT).join("nodes"));
        for change in host::restore_sysctls().map_err(machine("restore the sysctls"))? {
            done.push(format!("restored sysctl {change}"));
        }
        let _ = std::fs::remove_dir(layout::DATA_ROOT);
    }
    Ok(done)
}

/// What a slot still holds on this machine, read from the system itself (not from any record):
/// processes in its cgroups, its cgroups, network namespaces, links, mounts, root-namespace
/// firewall rules naming its bridge, its data directory. Empty once [`cleanup_slot`] ran.
pub fn leftovers(slot: Slot) -> Vec<String> {
    let mut left = Vec::new();
    let pids = host::cgroup_pids(&slot.cgroup());
    if !pids.is_empty() {
        left.push(format!("processes {pids:?} in cgroup {}", slot.cgroup()));
    }
    for h in host::cgroup_hierarchies() {
        if h.join(slot.cgroup()).exists() {
            left.push(format!("cgroup {}", h.join(slot.cgroup()).display()));
        }
    }
    for i in 0..layout::MAX_NODES {
        let Some(node) = slot.node(i) else { continue };
        if host::netns_path(&node.netns()).exists() {
            left.push(format!("network namespace {}", node.netns()));
        }
        if host::link_exists(&node.host_veth()) {
            left.push(format!("veth {}", node.host_veth()));
        }
    }
    if host::link_exists(&slot.bridge()) {
        left.push(format!("bridge {}", slot.bridge()));
    }
    for m in host::mount_points() {
        if m.starts_with(slot.run_dir()) || m.starts_with(slot.data_dir()) {
            left.push(format!("mount {}", m.display()));
        }
    }
    for (tool, args) in [
        ("iptables-save", &[][..]),
        ("nft", &["list", "ruleset"][..]),
    ] {
        if let Ok(rules) = host::run(tool, args)
            && rules.contains(&slot.bridge())
        {
            left.push(format!("{tool} rules naming {}", slot.bridge()));
        }
    }
    if slot.data_dir().symlink_metadata().is_ok() {
        left.push(format!("directory {}", slot.data_dir().display()));
    }
    left
}

/// The slots whose directory exists (clusters running, or crashed and not yet cleaned).
pub fn slots_in_use() -> Vec<Slot> {
    let parent = Path::new(layout::DATA_ROOT).join("nodes");
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| Slot::parse_dir_name(&e.file_name().to_string_lossy()))
        .collect()
}

/// Cleans every slot whose owner process is gone (a crashed test or supervisor); returns
/// what it did. Slots of running clusters are left alone.
pub fn cleanup_stale() -> Vec<String> {
    let mut lines = Vec::new();
    // A claim directory of a process that died between creating and renaming it.
    if let Ok(entries) = std::fs::read_dir(Path::new(layout::DATA_ROOT).join("nodes")) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let dead = name
                .strip_prefix(".claim-")
                .and_then(|pid| pid.parse::<u32>().ok())
                .is_some_and(|pid| !super::plane::process_alive(pid));
            if dead && e.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    for slot in slots_in_use() {
        if slot_owner(slot).is_some_and(super::plane::process_alive) {
            continue;
        }
        match cleanup_slot(slot) {
            Ok(done) if !done.is_empty() => lines.push(format!(
                "cleaned up after a crashed run in slot {}: {}",
                slot.number(),
                done.join(", ")
            )),
            Ok(_) => {}
            Err(e) => lines.push(format!(
                "could not clean up slot {}: {}",
                slot.number(),
                crate::error_chain(&e)
            )),
        }
    }
    lines
}

/// The name ctr and the kubelet resolve a short image reference to (`ipkeep:1` →
/// `docker.io/library/ipkeep:1`); `None` when the reference is already fully qualified.
pub fn normalized_image_name(name: &str) -> Option<String> {
    let (first, rest) = match name.split_once('/') {
        Some((first, rest)) => (first, Some(rest)),
        None => (name, None),
    };
    let has_domain =
        rest.is_some() && (first.contains('.') || first.contains(':') || first == "localhost");
    if has_domain {
        return None;
    }
    Some(match rest {
        Some(_) => format!("docker.io/{name}"),
        None => format!("docker.io/library/{name}"),
    })
}

/// The image names an OCI archive carries (`org.opencontainers.image.ref.name` or
/// `io.containerd.image.name` of each manifest in its `index.json`).
pub fn archive_image_names(archive: &Path) -> Result<Vec<String>, RealNodeError> {
    let out = host::run("tar", &["-xOf", &archive.to_string_lossy(), "index.json"]).map_err(
        |source| RealNodeError::Machine {
            stage: format!("read index.json of {} (an OCI archive?)", archive.display()),
            source,
        },
    )?;
    let index: serde_json::Value =
        serde_json::from_str(&out).map_err(|e| RealNodeError::Invalid {
            what: "OCI archive",
            value: archive.display().to_string(),
            why: if e.is_syntax() {
                "its index.json is not JSON"
            } else {
                "its index.json is not an OCI index"
            },
        })?;
    let names: Vec<String> = index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| {
            let a = &m["annotations"];
            a["io.containerd.image.name"]
                .as_str()
                .or(a["org.opencontainers.image.ref.name"].as_str())
                .map(str::to_owned)
        })
        .collect();
    if names.is_empty() {
        return Err(RealNodeError::Invalid {
            what: "OCI archive",
            value: archive.display().to_string(),
            why: "no manifest in its index.json carries an image name (build it with a name: buildah commit ... oci-archive:FILE:NAME:TAG)",
        });
    }
    Ok(names)
}

impl Cluster {
    /// Starts the control plane and `options.nodes` real nodes, and returns once every node
    /// is Ready with its images imported.
    pub async fn start(options: ClusterOptions) -> Result<Cluster, RealNodeError> {
        if options.nodes == 0 || options.nodes > layout::MAX_NODES {
            return Err(RealNodeError::Invalid {
                what: "number of nodes",
                value: options.nodes.to_string(),
                why: "1 to 8",
            });
        }
        if options.network.tiny_nodes > options.nodes {
            return Err(RealNodeError::Invalid {
                what: "number of tiny nodes",
                value: options.network.tiny_nodes.to_string(),
                why: "at most the number of nodes",
            });
        }
        host::check_prerequisites().map_err(|source| RealNodeError::Machine {
            stage: "check this machine".into(),
            source,
        })?;
        let bin_dir = match &options.node_bin_dir {
            Some(d) => {
                check_node_bin_dir(d)?;
                d.clone()
            }
            None => node_bin_dir()?,
        };
        let image_dir = match &options.image_dir {
            Some(d) => d.clone(),
            None => node_image_dir(&bin_dir)?,
        };
        let flannel_dir = match options.network.cni {
            NodeCni::Flannel => Some(flannel::bin_dir()?),
            NodeCni::Bridge => None,
        };
        let crio_dir = if options.network.crio_nodes > 0 {
            if options.network.cni != NodeCni::Bridge
                || options.network.dirs != NodeDirs::Standard
                || options.network.k3s_nodes > 0
            {
                return Err(RealNodeError::Invalid {
                    what: "CRI-O nodes",
                    value: format!("{:?}", options.network),
                    why: "CRI-O nodes run the bridge network in the standard layout (flannel's CNI plugin here stops at cniVersion 1.0.0, and CRI-O sends GC only to 1.1.0)",
                });
            }
            if options.network.crio_nodes > options.nodes {
                return Err(RealNodeError::Invalid {
                    what: "number of CRI-O nodes",
                    value: options.network.crio_nodes.to_string(),
                    why: "at most the number of nodes",
                });
            }
            Some(crio::bin_dir()?)
        } else {
            None
        };
        let slot = claim_slot()?;
        let dirs = BootDirs {
            bin: &bin_dir,
            image: &image_dir,
            flannel: flannel_dir.as_deref(),
            crio: crio_dir.as_deref(),
        };
        let started = Self::boot(&options, slot, dirs).await;
        if started.is_err() {
            // Whatever was made goes; the error says why the start failed.
            let _ = cleanup_slot(slot);
        }
        started
    }

    async fn boot(
        options: &ClusterOptions,
        slot: Slot,
        dirs: BootDirs<'_>,
    ) -> Result<Cluster, RealNodeError> {
        let bin_dir = dirs.bin;
        let machine = |stage: &str| {
            let stage = stage.to_owned();
            move |source| RealNodeError::Machine { stage, source }
        };
        // Any leftovers of an earlier run in this slot (a deleted data directory) go first.
        cleanup_slot_network(slot)?;
        host::create_bridge(slot).map_err(machine("create the nodes' bridge"))?;
        host::prepare_run_dir(slot).map_err(machine("prepare the namespace directory"))?;
        let mut plane_options = options.plane.clone();
        plane_options.cleanup_command = vec![
            e2e_exe()?.to_string_lossy().into_owned(),
            "cluster".into(),
            "reap-nodes".into(),
        ];
        plane_options.node_access = Some(NodeAccess {
            address: slot.host_ip(),
            service_ip: layout::KUBERNETES_SERVICE_IP,
        });
        let plane = Arc::new(ControlPlane::start(plane_options).await?);
        let mut cluster = Cluster {
            plane: Arc::clone(&plane),
            nodes: Vec::new(),
            slot,
            network: options.network,
            bin_dir: bin_dir.to_owned(),
            stopped: std::sync::atomic::AtomicBool::new(false),
        };
        let client = plane.client()?;
        let nodes_api: Api<Node> = Api::all(client.clone());
        if options.network.cni == NodeCni::Flannel {
            cluster.kubectl(&["apply", "-f", "-"], Some(&flannel::rbac()))?;
        }
        for i in 0..options.nodes {
            let Some(layout) = slot.node(i) else { continue };
            // Registered ahead with its pod CIDRs and taints, which the kubelet keeps when it
            // registers.
            let cidrs = options.network.pod_cidrs(layout, options.nodes);
            let runtime = options.network.runtime(layout);
            let node: Node = serde_json::from_value(serde_json::json!({
                "metadata": {"name": layout.name()},
                "spec": {
                    "podCIDR": cidrs[0],
                    "podCIDRs": cidrs,
                    "taints": options.network.taints(layout, options.nodes),
                },
            }))
            .map_err(|e| RealNodeError::Invalid {
                what: "Node object",
                value: e.to_string(),
                why: "does not deserialize",
            })?;
            nodes_api
                .create(&PostParams::default(), &node)
                .await
                .map_err(|source| RealNodeError::Api {
                    what: format!("create Node {}", layout.name()),
                    source,
                })?;
            let spec = node::NodeSpec {
                pod_cidrs: cidrs,
                nodes_in_cluster: options.nodes,
                cni: options.network.cni,
                dual_stack: options.network.dual_stack,
                dirs: options.network.dirs(layout, options.nodes),
                bin_dir: bin_dir.to_owned(),
                flannel_dir: dirs.flannel.map(Path::to_owned),
                runtime,
                crio_dir: match runtime {
                    NodeRuntime::CriO => dirs.crio.map(Path::to_owned),
                    NodeRuntime::Containerd => None,
                },
            };
            let n = RealNode::prepare(layout, spec, Arc::clone(&plane))?;
            cluster.nodes.push(n);
        }
        let pause = dirs.image.join("pause.oci.tar");
        let workload = dirs.image.join("workload.oci.tar");
        for n in &cluster.nodes {
            n.start_runtime()?;
            n.import_image(&pause, true, &[])?;
            n.import_image(&workload, false, &[])?;
            n.start_kubelet()?;
            n.start_kube_proxy()?;
        }
        // flanneld comes once the kubelet has registered its Node, as a DaemonSet pod does:
        // v0.28.10 panics on a Node without annotations (a nil map in AcquireLease), which
        // only a Node made ahead of its kubelet, as ours are, ever is.
        for n in &cluster.nodes {
            if n.cni() == NodeCni::Flannel {
                cluster.wait_registered(&nodes_api, n).await?;
                n.start_network()?;
            }
        }
        cluster.wait_ready(&nodes_api).await?;
        Ok(cluster)
    }

    /// Waits until the kubelet of `n` has registered its Node (and annotated it).
    async fn wait_registered(
        &self,
        nodes_api: &Api<Node>,
        n: &RealNode,
    ) -> Result<(), RealNodeError> {
        let started = Instant::now();
        loop {
            n.check()?;
            let node = read_node(nodes_api, n).await?;
            if node.metadata.annotations.is_some_and(|a| !a.is_empty()) {
                return Ok(());
            }
            if started.elapsed() > NODES_READY {
                return Err(RealNodeError::Timeout {
                    what: format!("wait for the kubelet of {} to register its Node", n.name()),
                    waited: started.elapsed(),
                    last: "the Node has no annotations yet".into(),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn wait_ready(&self, nodes_api: &Api<Node>) -> Result<(), RealNodeError> {
        let started = Instant::now();
        loop {
            let mut not_ready = Vec::new();
            for n in &self.nodes {
                n.check()?;
                let node = read_node(nodes_api, n).await?;
                let ready = node
                    .status
                    .and_then(|s| s.conditions)
                    .into_iter()
                    .flatten()
                    .find(|c| c.type_ == "Ready");
                match ready {
                    Some(c) if c.status == "True" => {}
                    Some(c) => not_ready.push(format!(
                        "{}: {} {}",
                        n.name(),
                        c.reason.unwrap_or_default(),
                        c.message.unwrap_or_default()
                    )),
                    None => not_ready.push(format!("{}: no Ready condition yet", n.name())),
                }
            }
            self.plane.check()?;
            if not_ready.is_empty() {
                return Ok(());
            }
            if started.elapsed() > NODES_READY {
                return Err(RealNodeError::Timeout {
                    what: "wait for every node to be Ready".into(),
                    waited: started.elapsed(),
                    last: not_ready.join("; "),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The control plane (kubectl, helm, clients, namespaces).
    pub fn plane(&self) -> &ControlPlane {
        &self.plane
    }

    /// The nodes, in index order.
    pub fn nodes(&self) -> &[RealNode] {
        &self.nodes
    }

    /// The node named `name`.
    pub fn node(&self, name: &str) -> Option<&RealNode> {
        self.nodes.iter().find(|n| n.name() == name)
    }

    /// Where this cluster lives on the machine.
    pub fn slot(&self) -> Slot {
        self.slot
    }

    /// How its pods are addressed.
    pub fn network(&self) -> PodNetwork {
        self.network
    }

    /// The node binaries' directory.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// Imports an OCI archive into every node's runtime and returns the image names it
    /// carries (`REPOSITORY:TAG`), each usable in a pod spec with `imagePullPolicy: Never`:
    /// a short name (`ipkeep:1`) is also tagged as the kubelet resolves it
    /// (`docker.io/library/ipkeep:1`).
    pub fn load_image(&self, archive: &Path) -> Result<Vec<String>, RealNodeError> {
        let targets: Vec<_> = self.nodes.iter().map(RealNode::running).collect();
        load_image(&targets, archive)
    }

    /// Makes every node trust the registry at `host_port` whose certificates `ca_pem` signs
    /// ([`RealNode::trust_registry`]).
    pub fn trust_registry(&self, host_port: &str, ca_pem: &str) -> Result<(), RealNodeError> {
        self.nodes
            .iter()
            .try_for_each(|n| n.trust_registry(host_port, ca_pem))
    }

    /// Runs the cluster's kubectl (admin) with `args`, `stdin` fed in; its stdout, or an error
    /// with what it said.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, RealNodeError> {
        let mut command = self.plane.kubectl();
        command.args(args);
        crate::command::stdout_of(&mut command, stdin).map_err(|source| RealNodeError::Machine {
            stage: format!("kubectl {}", args.join(" ")),
            source: source.into(),
        })
    }

    /// Waits until pod `namespace/name` is Ready (with a deadline) and returns it; fails early
    /// if it cannot start (its waiting reason says why).
    pub async fn wait_pod_ready(
        &self,
        namespace: &str,
        name: &str,
        within: Duration,
    ) -> Result<k8s_openapi::api::core::v1::Pod, RealNodeError> {
        let pods: Api<k8s_openapi::api::core::v1::Pod> =
            Api::namespaced(self.plane.client()?, namespace);
        let started = Instant::now();
        let mut last = String::from("not created yet");
        loop {
            self.check()?;
            let pod = pods
                .get_opt(name)
                .await
                .map_err(|source| RealNodeError::Api {
                    what: format!("read pod {namespace}/{name}"),
                    source,
                })?;
            if let Some(pod) = pod {
                let status = pod.status.clone().unwrap_or_default();
                let ready = status
                    .conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                if ready && pod.metadata.deletion_timestamp.is_none() {
                    return Ok(pod);
                }
                let waiting: Vec<String> = status
                    .container_statuses
                    .iter()
                    .chain(status.init_container_statuses.iter())
                    .flatten()
                    .filter_map(|c| {
                        let w = c.state.as_ref()?.waiting.as_ref()?;
                        Some(format!(
                            "{}: {} {}",
                            c.name,
                            w.reason.clone().unwrap_or_default(),
                            w.message.clone().unwrap_or_default()
                        ))
                    })
                    .collect();
                last = format!(
                    "phase {}; {}",
                    status.phase.unwrap_or_default(),
                    waiting.join("; ")
                );
            }
            if started.elapsed() > within {
                return Err(RealNodeError::Timeout {
                    what: format!("wait for pod {namespace}/{name} to be Ready"),
                    waited: started.elapsed(),
                    last,
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Ok while the control plane and every node daemon run.
    pub fn check(&self) -> Result<(), RealNodeError> {
        self.plane.check()?;
        self.nodes.iter().try_for_each(RealNode::check)
    }

    /// Stops everything and removes it (idempotent); returns what the cleanup did.
    pub fn stop(&self) -> Result<Vec<String>, RealNodeError> {
        if self.stopped.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Ok(Vec::new());
        }
        for n in &self.nodes {
            n.stop_daemons();
        }
        let done = cleanup_slot(self.slot);
        self.plane.stop();
        done
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!(
                "ipkeep-e2e nodes: cleanup incomplete: {}",
                crate::error_chain(&e)
            );
        }
    }
}

/// The Node object of `n`.
async fn read_node(nodes_api: &Api<Node>, n: &RealNode) -> Result<Node, RealNodeError> {
    nodes_api
        .get(&n.name())
        .await
        .map_err(|source| RealNodeError::Api {
            what: format!("read Node {}", n.name()),
            source,
        })
}

/// Removes a slot's network leftovers (bridge, namespaces) before the slot is set up again.
fn cleanup_slot_network(slot: Slot) -> Result<(), RealNodeError> {
    for i in 0..layout::MAX_NODES {
        let Some(node) = slot.node(i) else { continue };
        host::delete_node_netns(node).map_err(|source| RealNodeError::Machine {
            stage: "remove a leftover network namespace".into(),
            source,
        })?;
    }
    host::delete_link(&slot.bridge()).map_err(|source| RealNodeError::Machine {
        stage: "remove a leftover bridge".into(),
        source,
    })
}

/// [`Cluster::load_image`] over any set of running nodes (`cluster load-image`).
pub fn load_image(
    nodes: &[node::RunningNode],
    archive: &Path,
) -> Result<Vec<String>, RealNodeError> {
    let names = archive_image_names(archive)?;
    let also: Vec<(String, String)> = names
        .iter()
        .filter_map(|name| Some((name.clone(), normalized_image_name(name)?)))
        .collect();
    for n in nodes {
        node::import_image(n.clone(), archive, false, &also)?;
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_image_names_are_normalized_as_the_kubelet_does() {
        for (name, full) in [
            ("ipkeep:0.1.0", Some("docker.io/library/ipkeep:0.1.0")),
            ("team/ipkeep:1", Some("docker.io/team/ipkeep:1")),
            ("localhost/ipkeep-e2e/workload:1", None),
            ("registry.example.internal/ipkeep:1", None),
            ("registry:5000/ipkeep:1", None),
            ("docker.io/library/ipkeep:1", None),
        ] {
            assert_eq!(normalized_image_name(name).as_deref(), full, "{name}");
        }
    }
}
