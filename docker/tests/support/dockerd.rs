//! A real `dockerd` (Debian's docker.io 20.10) started by hand for a test: its own data root,
//! exec root, pidfile, API socket, daemon.json and cgroup parent, inside a network namespace of
//! its own (bridges, veths and any iptables chain it makes live and die there) and a mount
//! namespace of its own (its overlay and netns mounts vanish with it). No registry: the one image
//! is imported from Debian's static busybox. Everything is removed on drop, also when an
//! assertion failed: containers, networks, the daemon and its children, the namespace, cgroups,
//! the plugin socket, the directories.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The engine daemon (Debian package docker.io).
pub const DOCKERD: &str = "/usr/sbin/dockerd";
/// The engine's own CLI, of the same version (another `docker` may be first on PATH).
pub const DOCKER: &str = "/usr/bin/docker";
/// Compose v1 (Debian package docker-compose).
pub const COMPOSE: &str = "/usr/bin/docker-compose";
/// A statically linked busybox (Debian package busybox-static): the image's only file.
pub const BUSYBOX: &str = "/bin/busybox";
/// Where the engine finds legacy socket plugins (fixed in the engine).
pub const PLUGIN_DIR: &str = "/run/docker/plugins";
/// The image the tests run.
pub const IMAGE: &str = "ipkeep-busybox:test";
const INSTALL: &str = "run scripts/install-docker-deps.sh as root (Debian packages docker.io, docker-compose, busybox-static)";

fn euid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|u| u.parse().ok())
        .unwrap_or(u32::MAX)
}

/// Fails the test, saying what to install, unless it runs as root with everything there.
pub fn require_docker(what: &str) {
    for tool in [
        DOCKERD,
        DOCKER,
        COMPOSE,
        BUSYBOX,
        "/usr/bin/nsenter",
        "/usr/bin/unshare",
    ] {
        assert!(Path::new(tool).exists(), "{what} needs {tool}: {INSTALL}");
    }
    let busybox = Command::new("file").args(["-L", BUSYBOX]).output();
    assert!(
        busybox.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("statically linked")),
        "{what} needs a statically linked {BUSYBOX}: {INSTALL}"
    );
    assert_eq!(
        euid(),
        0,
        "{what} must run as root (it starts dockerd); CI runs as root"
    );
}

/// Runs a command; its output (whatever the exit status).
fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("failed to run {cmd:?}: {e}"))
}

/// A running dockerd; everything it made is removed on drop.
#[derive(Debug)]
pub struct Dockerd {
    /// Its directory (data root, exec root, socket, logs).
    pub dir: PathBuf,
    /// `unix://<dir>/docker.sock`.
    pub host: String,
    netns: String,
    cgroup_parent: String,
    child: Option<Child>,
}

impl Dockerd {
    /// Starts dockerd in `dir` (a short path: socket paths are limited to 107 bytes) and imports
    /// the busybox image; `tag` makes the namespace and cgroup names unique.
    pub fn start(dir: &Path, tag: &str) -> Self {
        let netns = format!("ipkeep-{tag}-{}", std::process::id());
        let cgroup_parent = netns.clone();
        let mut d = Self {
            dir: dir.to_path_buf(),
            host: format!("unix://{}/docker.sock", dir.display()),
            netns: netns.clone(),
            cgroup_parent: cgroup_parent.clone(),
            child: None,
        };
        let added = run(Command::new("ip").args(["netns", "add", &netns]));
        assert!(
            added.status.success(),
            "ip netns add {netns}: {}",
            String::from_utf8_lossy(&added.stderr)
        );
        std::fs::write(dir.join("daemon.json"), "{}\n").unwrap();
        let log = std::fs::File::create(dir.join("dockerd.log")).unwrap();
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{netns}"))
            .args(["unshare", "--mount", "--propagation", "slave", DOCKERD])
            .arg("--config-file")
            .arg(dir.join("daemon.json"))
            .arg("--data-root")
            .arg(dir.join("root"))
            .arg("--exec-root")
            .arg(dir.join("exec"))
            .arg("--pidfile")
            .arg(dir.join("dockerd.pid"))
            .args(["-H", &d.host])
            .args([
                "--bridge=none",
                "--iptables=false",
                "--ip6tables=false",
                "--ip-masq=false",
            ])
            .args(["--userland-proxy=false", "--log-level=warn"])
            .arg(format!("--cgroup-parent=/{cgroup_parent}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("failed to start {DOCKERD}: {e}"));
        d.child = Some(child);
        let start = Instant::now();
        while !d.docker(&["version"]).status.success() {
            assert!(
                d.child
                    .as_mut()
                    .is_some_and(|c| c.try_wait().ok().flatten().is_none()),
                "dockerd exited; its log:\n{}",
                d.log()
            );
            assert!(
                start.elapsed() < Duration::from_secs(90),
                "gave up after 90 s waiting for dockerd; its log:\n{}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        d.import_busybox();
        d
    }

    /// dockerd's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("dockerd.log")).unwrap_or_default()
    }

    /// Runs the engine's CLI against this daemon.
    pub fn docker(&self, args: &[&str]) -> Output {
        run(Command::new(DOCKER).args(["-H", &self.host]).args(args))
    }

    /// Runs the CLI; its trimmed stdout, failing the test with stderr when it fails.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.docker(args);
        assert!(
            out.status.success(),
            "docker {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Runs docker-compose (v1) against this daemon in `project_dir`.
    pub fn compose(&self, project_dir: &Path, project: &str, args: &[&str]) -> String {
        let out = run(Command::new(COMPOSE)
            .current_dir(project_dir)
            .env("DOCKER_HOST", &self.host)
            .args(["--no-ansi", "-p", project])
            .args(args));
        assert!(
            out.status.success(),
            "docker-compose {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// `docker network create --ipam-driver <driver> --subnet <subnet> [extra…] <network>`.
    pub fn network_on(&self, driver: &str, subnet: &str, network: &str, extra: &[&str]) {
        let mut args = vec![
            "network",
            "create",
            "--ipam-driver",
            driver,
            "--subnet",
            subnet,
        ];
        args.extend_from_slice(extra);
        args.push(network);
        self.ok(&args);
    }

    /// A container's address on `network`.
    pub fn ip_of(&self, container: &str, network: &str) -> String {
        let format = format!("{{{{(index .NetworkSettings.Networks \"{network}\").IPAddress}}}}");
        self.ok(&["inspect", "-f", &format, container])
    }

    /// `docker import` of a root file system holding only busybox and a few links to it.
    fn import_busybox(&self) {
        let rootfs = self.dir.join("rootfs");
        std::fs::create_dir_all(rootfs.join("bin")).unwrap();
        std::fs::copy(BUSYBOX, rootfs.join("bin/busybox")).unwrap();
        for applet in ["sh", "sleep", "ip", "true", "cat"] {
            std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
        }
        let tar = self.dir.join("rootfs.tar");
        let tarred = run(Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .arg("-cf")
            .arg(&tar)
            .arg("."));
        assert!(
            tarred.status.success(),
            "tar: {}",
            String::from_utf8_lossy(&tarred.stderr)
        );
        self.ok(&["import", &tar.to_string_lossy(), IMAGE]);
    }

    fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.dir.join("dockerd.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        // Containers and networks first, while the daemon can still undo what it did.
        let ids = self.docker(&["ps", "-aq"]);
        for id in String::from_utf8_lossy(&ids.stdout).split_whitespace() {
            let _ = self.docker(&["rm", "-f", id]);
        }
        let _ = self.docker(&["network", "prune", "-f"]);
        if let Some(pid) = self.pid() {
            let _ = run(Command::new("kill").args(["-TERM", &pid.to_string()]));
        }
        if let Some(mut child) = self.child.take() {
            let start = Instant::now();
            while child.try_wait().ok().flatten().is_none()
                && start.elapsed() < Duration::from_secs(30)
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        // Whatever is left in the namespace (a shim, containerd) dies with it.
        let pids = run(Command::new("ip").args(["netns", "pids", &self.netns]));
        for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
            let _ = run(Command::new("kill").args(["-KILL", pid]));
        }
        let _ = run(Command::new("ip").args(["netns", "del", &self.netns]));
        // The cgroup parent's directories, deepest first (empty once the containers are gone).
        if let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") {
            for controller in controllers.flatten() {
                remove_cgroup_tree(&controller.path().join(&self.cgroup_parent));
            }
        }
        // Anything still mounted below the directory (nothing, with a private mount namespace).
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let dir = self.dir.to_string_lossy().into_owned();
        for target in mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(1))
            .filter(|t| t.starts_with(&dir))
        {
            let _ = run(Command::new("umount").args(["-l", target]));
        }
    }
}

fn remove_cgroup_tree(dir: &Path) {
    if let Ok(children) = std::fs::read_dir(dir) {
        for child in children.flatten() {
            if child.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&child.path());
            }
        }
        let _ = std::fs::remove_dir(dir);
    }
}

/// The path of the legacy plugin socket for driver `name`; removed on drop.
#[derive(Debug)]
pub struct PluginSocket {
    pub path: PathBuf,
}

impl PluginSocket {
    /// `/run/docker/plugins/<name>.sock`.
    pub fn new(name: &str) -> Self {
        Self {
            path: Path::new(PLUGIN_DIR).join(format!("{name}.sock")),
        }
    }
}

impl Drop for PluginSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The driver (with `extra` flags) serving as the legacy plugin `<prefix><pid>` from `dir`: its
/// name, the socket's guard and the driver (drop the driver before the guard).
pub fn legacy_plugin(
    dir: &Path,
    prefix: &str,
    extra: &[&str],
) -> (String, PluginSocket, crate::support::Driver) {
    let name = format!("{prefix}{}", std::process::id());
    let socket = PluginSocket::new(&name);
    let driver = crate::support::Driver::start_at(&socket.path, dir, extra);
    (name, socket, driver)
}
