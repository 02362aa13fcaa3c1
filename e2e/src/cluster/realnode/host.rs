//! The machine side of real nodes: the bridge, each node's network and mount namespaces, its
//! cgroups, the global sysctls the kubelet rewrites, and the checks that say what to install.
//! Blocking; every function undoes or tolerates what an earlier, crashed run left.

use std::{
    io::Write as _,
    net::Ipv4Addr,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use super::layout::{CGROUP_PARENT, NODE_PATHS, NodeLayout, Slot};
use crate::command::{self, CommandError, Stdin};

/// Failures on the host.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A command could not be run, or failed.
    #[error(transparent)]
    Command(#[from] CommandError),
    /// A file operation failed.
    #[error("failed to {action} {path}")]
    Io {
        /// What was attempted.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Something the nodes need is missing on this machine.
    #[error("this machine cannot run real nodes: {what}; {fix}")]
    Missing {
        /// What is missing.
        what: String,
        /// What to install or enable.
        fix: String,
    },
    /// A path is not under one of the directories a node keeps of its own.
    #[error("{0} is not under a directory the node keeps of its own")]
    NotANodePath(String),
    /// A cgroup kept processes after they were killed.
    #[error("failed to empty the cgroup {path}: processes {pids:?} survived SIGKILL")]
    CgroupBusy {
        /// The cgroup directory.
        path: PathBuf,
        /// What is left.
        pids: Vec<u32>,
    },
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> HostError {
    let path = path.to_owned();
    move |source| HostError::Io {
        action,
        path,
        source,
    }
}

/// Runs `program args` to completion; its stdout on success.
pub fn run(program: &str, args: &[&str]) -> Result<String, HostError> {
    Ok(command::stdout_of(
        Command::new(program).args(args),
        Stdin::Empty,
    )?)
}

/// Where Debian's runc is.
pub const RUNC: &str = "/usr/sbin/runc";
/// Where Debian's CNI plugins are.
pub const DEBIAN_CNI_DIR: &str = "/usr/lib/cni";

/// Fails with what to install or enable when something the nodes need is missing: root,
/// runc, the CNI plugins, iptables, nsenter/unshare, overlayfs, cgroup v1 hierarchies.
pub fn check_prerequisites() -> Result<(), HostError> {
    let missing = |what: &str, fix: &str| {
        Err(HostError::Missing {
            what: what.to_owned(),
            fix: fix.to_owned(),
        })
    };
    if !rustix::process::geteuid().is_root() {
        return missing(
            "not running as root",
            "run as root (namespaces, mounts, cgroups and bridges need it)",
        );
    }
    let files: [(&str, &str); 6] = [
        (RUNC, "apt-get install runc (scripts/install-deps.sh does)"),
        (
            "/usr/lib/cni/bridge",
            "apt-get install containernetworking-plugins (scripts/install-deps.sh does)",
        ),
        (
            "/usr/sbin/iptables",
            "apt-get install iptables (scripts/install-deps.sh does)",
        ),
        ("/usr/bin/nsenter", "apt-get install util-linux"),
        ("/usr/bin/unshare", "apt-get install util-linux"),
        (
            "/bin/busybox",
            "apt-get install busybox-static (scripts/install-deps.sh does)",
        ),
    ];
    for (file, fix) in files {
        if !Path::new(file).is_file() {
            return missing(&format!("{file} is missing"), fix);
        }
    }
    let filesystems = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !filesystems
        .lines()
        .any(|l| l.trim_end().ends_with("overlay"))
    {
        // Loading the module registers the filesystem; a kernel without it cannot run containerd's
        // default snapshotter.
        let _ = run("modprobe", &["overlay"]);
        let again = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
        if !again.lines().any(|l| l.trim_end().ends_with("overlay")) {
            return missing(
                "the overlay filesystem is not available",
                "enable overlayfs in the kernel (modprobe overlay)",
            );
        }
    }
    if cgroup_hierarchies().is_empty() {
        return missing(
            "no cgroup v1 hierarchy is mounted under /sys/fs/cgroup",
            "mount the cgroup v1 controllers (cpu, cpuacct, cpuset, memory, pids, ...) under /sys/fs/cgroup; the nodes run with the cgroupfs driver on cgroup v1",
        );
    }
    Ok(())
}

// ----- the bridge and each node's network namespace -----

/// Creates the slot's bridge with the host address, up.
pub fn create_bridge(slot: Slot) -> Result<(), HostError> {
    let bridge = slot.bridge();
    run("ip", &["link", "add", &bridge, "type", "bridge"])?;
    run(
        "ip",
        &[
            "addr",
            "add",
            &format!("{}/24", slot.host_ip()),
            "dev",
            &bridge,
        ],
    )?;
    run("ip", &["link", "set", &bridge, "up"])?;
    Ok(())
}

/// Whether a network interface exists in the root namespace.
pub fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// Deletes a link if it exists (its routes and, for a veth, its peer go with it).
pub fn delete_link(name: &str) -> Result<(), HostError> {
    if link_exists(name) {
        run("ip", &["link", "del", name])?;
    }
    Ok(())
}

/// The path of a named network namespace.
pub fn netns_path(name: &str) -> PathBuf {
    Path::new("/run/netns").join(name)
}

/// Creates the node's network namespace: `eth0` at the node's address on the slot's bridge,
/// `lo` up, the routes of [`super::layout::node_routes`], and a host route to its pod CIDR.
pub fn create_node_netns(
    node: NodeLayout,
    routes: &[(String, Option<Ipv4Addr>)],
    ipv6: bool,
) -> Result<(), HostError> {
    let ns = node.netns();
    let veth = node.host_veth();
    run("ip", &["netns", "add", &ns])?;
    run(
        "ip",
        &[
            "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ],
    )?;
    run(
        "ip",
        &["link", "set", &veth, "master", &node.slot().bridge(), "up"],
    )?;
    let addr = format!("{}/24", node.ip());
    run("ip", &["-n", &ns, "addr", "add", &addr, "dev", "eth0"])?;
    if ipv6 {
        let addr6 = format!("{}/64", node.ip_v6());
        run(
            "ip",
            &["-n", &ns, "addr", "add", &addr6, "dev", "eth0", "nodad"],
        )?;
    }
    run("ip", &["-n", &ns, "link", "set", "eth0", "up"])?;
    run("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
    for (dst, via) in routes {
        match via {
            Some(gw) => run(
                "ip",
                &["-n", &ns, "route", "replace", dst, "via", &gw.to_string()],
            )?,
            None => run("ip", &["-n", &ns, "route", "replace", dst, "dev", "eth0"])?,
        };
    }
    // The API server answers pods from the host: their replies go back through the node.
    run(
        "ip",
        &[
            "route",
            "replace",
            &node.pod_cidr(),
            "via",
            &node.ip().to_string(),
        ],
    )?;
    Ok(())
}

/// Deletes the node's network namespace and its veth (a namespace still held by a process
/// disappears when that process goes; the name is gone at once either way).
pub fn delete_node_netns(node: NodeLayout) -> Result<(), HostError> {
    delete_link(&node.host_veth())?;
    if netns_path(&node.netns()).exists() {
        run("ip", &["netns", "del", &node.netns()])?;
    }
    Ok(())
}

// ----- the node's mount namespace -----

/// Makes the slot's run directory a private mount, so namespaces can be bound to files in it.
pub fn prepare_run_dir(slot: Slot) -> Result<(), HostError> {
    let dir = slot.run_dir();
    std::fs::create_dir_all(&dir).map_err(io_err("create", &dir))?;
    if !is_mount_point(&dir) {
        let d = dir.to_string_lossy();
        run("mount", &["--bind", &d, &d])?;
    }
    run("mount", &["--make-private", &dir.to_string_lossy()])?;
    Ok(())
}

/// Whether `path` is a mount point (in this mount namespace).
pub fn is_mount_point(path: &Path) -> bool {
    mount_points().iter().any(|m| m == path)
}

/// Every mount point of this mount namespace, in mount order.
pub fn mount_points() -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mount_path(p)))
        .collect()
}

fn unescape_mount_path(p: &str) -> String {
    p.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// The script run inside a new mount namespace: shared propagation inside it (the kubelet's
/// volume mounts reach containerd's containers), a fresh `/run`, and each of the node's paths
/// bound from its own host directory. `$1` is the node's `root` directory.
const MOUNT_NS_SCRIPT: &str = r#"set -e
mount --make-rshared /
mount -t tmpfs -o mode=0755 ipkeep-node-run /run
mkdir -p /run/netns /run/containerd
root=$1
shift
for p in "$@"; do
  src="$root/$(echo "${p#/}" | tr / -)"
  mkdir -p "$p"
  mount --bind "$src" "$p"
done
"#;

/// Creates the node's persistent mount namespace (bound to [`NodeLayout::mount_ns_file`]).
/// The host directories behind [`NODE_PATHS`] must exist. Mount points the host lacks
/// (`/var/lib/kubelet`, ...) are created as empty directories and left there.
pub fn create_mount_ns(node: NodeLayout) -> Result<(), HostError> {
    let file = node.mount_ns_file();
    std::fs::File::create(&file).map_err(io_err("create", &file))?;
    let root = node.data_dir().join("root");
    let mut command = Command::new("unshare");
    command
        .arg(format!("--mount={}", file.display()))
        .args([
            "--propagation",
            "private",
            "sh",
            "-c",
            MOUNT_NS_SCRIPT,
            "sh",
        ])
        .arg(&root)
        .args(NODE_PATHS);
    command::checked(&mut command, Stdin::Empty)?;
    Ok(())
}

/// Releases the node's mount namespace: once no process is in it, it and every mount in it
/// (the kubelet's volumes, containerd's overlays, the pods' namespace files) are gone.
pub fn delete_mount_ns(node: NodeLayout) -> Result<(), HostError> {
    let file = node.mount_ns_file();
    if is_mount_point(&file) {
        run("umount", &[&file.to_string_lossy()])?;
    }
    match std::fs::remove_file(&file) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err("remove", &file)(e)),
        _ => Ok(()),
    }
}

/// A command run inside the node: its network and mount namespaces, `PATH` with `bin_dir` first.
pub fn node_command(node: NodeLayout, bin_dir: &Path, program: &str) -> Command {
    let [nsenter, rest @ ..] = enter_args(node);
    let mut command = Command::new(nsenter);
    command
        .args(rest)
        .arg(program)
        .env("PATH", node_path_env(bin_dir));
    command
}

/// `nsenter` into the node's network and mount namespaces (one mount namespace for all its
/// processes: `ip netns exec` would make a new one per command and hide the kubelet's volume
/// mounts from containerd), followed by the command.
pub fn enter_args(node: NodeLayout) -> [String; 4] {
    [
        "nsenter".to_owned(),
        format!("--net={}", netns_path(&node.netns()).display()),
        format!("--mount={}", node.mount_ns_file().display()),
        "--".to_owned(),
    ]
}

/// The `PATH` of everything in a node: our binaries (the containerd 2 shim) before Debian's.
pub fn node_path_env(bin_dir: &Path) -> String {
    format!(
        "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        bin_dir.display()
    )
}

// ----- cgroups -----

/// Every mounted cgroup v1 hierarchy (`/sys/fs/cgroup/cpu`, ..., `/sys/fs/cgroup/systemd`).
pub fn cgroup_hierarchies() -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let fstype = post.split(' ').next()?;
            let point = pre.split(' ').nth(4)?;
            (fstype == "cgroup").then(|| PathBuf::from(unescape_mount_path(point)))
        })
        .collect();
    found.sort();
    found.dedup();
    found
}

/// Creates `relative` in every hierarchy, each level's `cpuset.cpus`/`cpuset.mems` copied from
/// its parent (an empty cpuset refuses every process).
pub fn create_cgroup(relative: &str) -> Result<(), HostError> {
    for hierarchy in cgroup_hierarchies() {
        let mut dir = hierarchy.clone();
        for part in relative.split('/').filter(|p| !p.is_empty()) {
            let parent = dir.clone();
            dir.push(part);
            match std::fs::create_dir(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                    return Err(io_err("create the cgroup", &dir)(e));
                }
                _ => {}
            }
            for file in ["cpuset.cpus", "cpuset.mems"] {
                if let Ok(value) = std::fs::read_to_string(parent.join(file)) {
                    let current = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
                    if current.trim().is_empty() {
                        std::fs::write(dir.join(file), value.trim())
                            .map_err(io_err("write", &dir.join(file)))?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// The `cgroup.procs` files of `relative` in every hierarchy (a process must join each).
pub fn cgroup_procs_files(relative: &str) -> Vec<PathBuf> {
    cgroup_hierarchies()
        .into_iter()
        .map(|h| h.join(relative).join("cgroup.procs"))
        .collect()
}

/// Every process in `relative` or below, in any hierarchy.
pub fn cgroup_pids(relative: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for hierarchy in cgroup_hierarchies() {
        for dir in subtree(&hierarchy.join(relative)) {
            let text = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// A cgroup directory and every cgroup below it, parents before children (no symlinks
/// followed: cgroupfs has none, and a planted one is skipped).
fn subtree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(meta) = d.symlink_metadata() else {
            continue;
        };
        if !meta.is_dir() {
            continue;
        }
        if let Ok(entries) = std::fs::read_dir(&d) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
        out.push(d);
    }
    out
}

/// Kills every process in `relative` and below (the frozen ones thawed first) until none is
/// left, or fails naming the survivors.
pub fn kill_cgroup(relative: &str) -> Result<(), HostError> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pids = cgroup_pids(relative);
        if pids.is_empty() {
            return Ok(());
        }
        for pid in &pids {
            if let Some(p) = i32::try_from(*pid)
                .ok()
                .and_then(rustix::process::Pid::from_raw)
            {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            }
        }
        if Instant::now() > deadline {
            return Err(HostError::CgroupBusy {
                path: PathBuf::from(relative),
                pids,
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Removes `relative` and every cgroup below it, children first, in every hierarchy; the
/// processes in them must be gone ([`kill_cgroup`]).
pub fn remove_cgroup(relative: &str) -> Result<(), HostError> {
    for hierarchy in cgroup_hierarchies() {
        for dir in subtree(&hierarchy.join(relative)).into_iter().rev() {
            // A cgroup whose last process just exited may still be busy for a moment.
            let mut tries = 0;
            loop {
                match std::fs::remove_dir(&dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(_) if tries < 40 => {
                        tries += 1;
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    Err(e) => return Err(io_err("remove the cgroup", &dir)(e)),
                }
            }
        }
    }
    Ok(())
}

/// Removes the shared `ipkeep-e2e` parent cgroups if no slot uses them any more.
pub fn remove_cgroup_parent_if_empty() {
    for hierarchy in cgroup_hierarchies() {
        let _ = std::fs::remove_dir(hierarchy.join(CGROUP_PARENT));
    }
}

// ----- global sysctls -----

/// The global (not namespaced) sysctls the kubelet sets at start
/// (`pkg/kubelet/cm/container_manager_linux.go`, `setupKernelTunables`).
pub const KUBELET_SYSCTLS: [&str; 6] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// The file holding the machine's own values of [`KUBELET_SYSCTLS`] while any real node runs.
pub fn sysctl_record() -> PathBuf {
    Path::new(super::layout::DATA_ROOT).join("sysctls.json")
}

/// Records the current values of [`KUBELET_SYSCTLS`] unless a record exists (then the values
/// now may be a crashed run's kubelet's, and the record holds the machine's own).
pub fn record_sysctls() -> Result<(), HostError> {
    let record = sysctl_record();
    if record.exists() {
        return Ok(());
    }
    let mut values = serde_json::Map::new();
    for key in KUBELET_SYSCTLS {
        let path = Path::new("/proc/sys").join(key);
        let value = std::fs::read_to_string(&path).map_err(io_err("read", &path))?;
        values.insert(key.to_owned(), value.trim().into());
    }
    let dir = Path::new(super::layout::DATA_ROOT);
    std::fs::create_dir_all(dir).map_err(io_err("create", dir))?;
    let tmp = record.with_extension(format!("tmp{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp).map_err(io_err("create", &tmp))?;
    f.write_all(serde_json::Value::Object(values).to_string().as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(io_err("write", &tmp))?;
    // A hard link never replaces: of two runs recording at once, the first record stays.
    let linked = std::fs::hard_link(&tmp, &record);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(io_err("write", &record)(e)),
        _ => Ok(()),
    }
}

/// Writes the recorded values back and removes the record; returns the keys it changed.
pub fn restore_sysctls() -> Result<Vec<String>, HostError> {
    let record = sysctl_record();
    let Ok(text) = std::fs::read_to_string(&record) else {
        return Ok(Vec::new());
    };
    let values: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&text).unwrap_or_default();
    let mut changed = Vec::new();
    for key in KUBELET_SYSCTLS {
        let Some(value) = values.get(key).and_then(|v| v.as_str()) else {
            continue;
        };
        let path = Path::new("/proc/sys").join(key);
        let now = std::fs::read_to_string(&path).unwrap_or_default();
        if now.trim() != value {
            std::fs::write(&path, value).map_err(io_err("write", &path))?;
            changed.push(format!("{key}={value} (was {})", now.trim()));
        }
    }
    std::fs::remove_file(&record).map_err(io_err("remove", &record))?;
    Ok(changed)
}

// ----- files -----

/// The plugins of `src` (Debian's CNI directory): its regular files.
pub fn plugin_files(src: &Path) -> Result<Vec<PathBuf>, HostError> {
    let entries = std::fs::read_dir(src).map_err(io_err("list", src))?;
    Ok(entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.symlink_metadata().is_ok_and(|m| m.is_file()))
        .collect())
}

/// Copies one plugin to `to`, executable (a copy, not a link: the chart's install-cni replaces
/// `host-local` where the node's runtime looks for it).
pub fn copy_cni_plugin(from: &Path, to: &Path) -> Result<(), HostError> {
    std::fs::copy(from, to).map_err(io_err("copy a CNI plugin to", to))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755))
        .map_err(io_err("make executable", to))
}

/// Extracts k3s release `release` on `node` as k3s does: `plugins` copied into
/// `data/<release>/bin`, `data/current` pointed at it (the old one kept as `data/previous`), and
/// every plugin's name in the stable `data/cni` linked to its copy there by an absolute symlink,
/// whatever held that name before removed first (k3s#11123). Returns the names linked.
pub fn extract_k3s_release(
    node: NodeLayout,
    release: &str,
    plugins: &[PathBuf],
) -> Result<Vec<String>, HostError> {
    let in_node = |p: &str| {
        node.host_path(p)
            .ok_or_else(|| HostError::NotANodePath(p.to_owned()))
    };
    let bin_in_node = super::layout::k3s_release_bin(release);
    let bin = in_node(&bin_in_node)?;
    let links = in_node(super::layout::NodeDirs::K3s.cni_bin_dir())?;
    let data = in_node(super::layout::K3S_DATA_DIR)?;
    for dir in [&bin, &links] {
        std::fs::create_dir_all(dir).map_err(io_err("create", dir))?;
    }
    let mut names = Vec::new();
    for from in plugins {
        let Some(name) = from.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        copy_cni_plugin(from, &bin.join(&name))?;
        let link = links.join(&name);
        match std::fs::remove_file(&link) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io_err("remove", &link)(e));
            }
            _ => {}
        }
        std::os::unix::fs::symlink(format!("{bin_in_node}/{name}"), &link)
            .map_err(io_err("link", &link))?;
        names.push(name);
    }
    let current = data.join("current");
    if current.symlink_metadata().is_ok() {
        let previous = data.join("previous");
        std::fs::rename(&current, &previous).map_err(io_err("rename to previous", &current))?;
    }
    std::os::unix::fs::symlink(
        format!("{}/{release}", super::layout::K3S_DATA_DIR),
        &current,
    )
    .map_err(io_err("link", &current))?;
    Ok(names)
}
