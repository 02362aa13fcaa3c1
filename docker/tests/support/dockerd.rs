//! A real `dockerd` (Debian's docker.io 20.10) started by hand for a test: its own data root,
//! exec root, pidfile, API socket, daemon.json and cgroup parent, inside network, mount and PID
//! namespaces of its own (`unshare`): bridges, veths and any iptables chain it makes live in its
//! network namespace, its overlay and netns mounts in its mount namespace, and containerd, the
//! shims and the containers in its PID namespace, so all of it vanishes when dockerd (the
//! namespace's init) exits — on drop (after a clean stop), and when the test process dies in any
//! way (`setpriv --pdeathsig` kills `unshare`, whose `--kill-child` kills dockerd: a clean stop
//! would wait for the driver, which died with the test). No registry: the one image
//! is imported from Debian's static busybox. What outlives a killed test (empty cgroup
//! directories, the plugin socket, the scratch directory) is swept by the next run.
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
    cgroup_parent: String,
    child: Option<Child>,
}

impl Dockerd {
    /// Starts dockerd in `dir` (a short path: socket paths are limited to 107 bytes) and imports
    /// the busybox image; `tag` makes the namespace and cgroup names unique.
    pub fn start(dir: &Path, tag: &str) -> Self {
        assert!(
            TAGS.contains(&tag),
            "add {tag:?} to TAGS so a killed run's leftovers are swept"
        );
        sweep_stale();
        let mut d = Self {
            dir: dir.to_path_buf(),
            host: format!("unix://{}/docker.sock", dir.display()),
            cgroup_parent: format!("ipkeep-{tag}-{}", std::process::id()),
            child: None,
        };
        std::fs::write(dir.join("daemon.json"), "{}\n").unwrap();
        d.launch();
        d.import_busybox();
        d
    }

    /// Starts dockerd and waits until it answers.
    fn launch(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("dockerd.log"))
            .unwrap();
        let child = Command::new("setpriv")
            .args([
                "--pdeathsig",
                "KILL",
                "--",
                "unshare",
                "--net",
                "--pid",
                "--fork",
            ])
            .args([
                "--mount-proc",
                "--propagation",
                "slave",
                "--kill-child=SIGKILL",
                DOCKERD,
            ])
            .arg("--config-file")
            .arg(self.dir.join("daemon.json"))
            .arg("--data-root")
            .arg(self.dir.join("root"))
            .arg("--exec-root")
            .arg(self.dir.join("exec"))
            .arg("--pidfile")
            .arg(self.dir.join("dockerd.pid"))
            .args(["-H", &self.host])
            .args([
                "--bridge=none",
                "--iptables=false",
                "--ip6tables=false",
                "--ip-masq=false",
            ])
            .args(["--userland-proxy=false", "--log-level=warn"])
            .arg(format!("--cgroup-parent=/{}", self.cgroup_parent))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("failed to start {DOCKERD} through setpriv and unshare: {e}")
            });
        self.child = Some(child);
        let start = Instant::now();
        while !self.docker(&["version"]).status.success() {
            assert!(
                self.child
                    .as_mut()
                    .is_some_and(|c| c.try_wait().ok().flatten().is_none()),
                "dockerd exited; its log:\n{}",
                self.log()
            );
            assert!(
                start.elapsed() < Duration::from_secs(90),
                "gave up after 90 s waiting for dockerd; its log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops dockerd cleanly (its containers stop as on a shutdown) and starts it again over the
    /// same data: what an engine upgrade or a reboot does.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// Stops dockerd: SIGTERM, then waits (at most 60 s) for it and `unshare` to exit. When
    /// dockerd (the PID namespace's init) exits, the kernel kills whatever is left in its
    /// namespaces.
    fn stop(&mut self) {
        if let Some(pid) = self.dockerd_pid() {
            let _ = run(Command::new("kill").args(["-TERM", &pid.to_string()]));
        }
        if let Some(mut child) = self.child.take() {
            let start = Instant::now();
            while child.try_wait().ok().flatten().is_none()
                && start.elapsed() < Duration::from_secs(60)
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
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
        let compose = || {
            run(Command::new(COMPOSE)
                .current_dir(project_dir)
                .env("DOCKER_HOST", &self.host)
                .args(["--no-ansi", "-p", project])
                .args(args))
        };
        let mut out = compose();
        // dockerd 20.10 drops a removed container's endpoint after `docker rm` has returned, so
        // compose's `down` can reach the network while an endpoint is still there ("has active
        // endpoints"; seen once in make test under load). `down` again until it goes: a driver
        // that never let the engine release an endpoint still fails, at the deadline.
        if args.first() == Some(&"down") {
            super::wait_for(
                "docker-compose down to find the network's endpoints gone",
                Duration::from_secs(60),
                || {
                    out.status.success()
                        || !String::from_utf8_lossy(&out.stderr).contains("has active endpoints")
                        || {
                            out = compose();
                            out.status.success()
                        }
                },
            );
        }
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

    /// dockerd's PID (the child `unshare` forked; in its namespace it is 1).
    fn dockerd_pid(&self) -> Option<u32> {
        let unshare = self.child.as_ref()?.id();
        let children =
            std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children")).ok()?;
        children.split_whitespace().next()?.parse().ok()
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
        self.stop();
        for controller in cgroup_controllers() {
            remove_cgroup_tree(&controller.join(&self.cgroup_parent));
        }
        // Anything still mounted below the directory (nothing, with a mount namespace of its own).
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

fn cgroup_controllers() -> Vec<PathBuf> {
    std::fs::read_dir("/sys/fs/cgroup")
        .map(|dir| dir.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// The tags of the dockerds and plugins the tests and the benchmark start; only names made of
/// them are ever swept.
const TAGS: [&str; 4] = ["dk", "mp", "km", "bench"];
/// The prefixes of the plugin names (`legacy_plugin`).
const PLUGIN_PREFIXES: [&str; 3] = ["ipkeep-t", "ipkeep-m", "ipkeep-b"];

/// The PID in `<prefix><pid><suffix>`, if `name` is exactly that.
fn pid_in(name: &str, prefix: &str, suffix: &str) -> Option<String> {
    let pid = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    (!pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())).then(|| pid.to_owned())
}

/// Whether `name` is one of ours (`ipkeep-<tag>-<pid>`, `ipkeep-t<pid>.sock`) of a dead process.
fn of_dead_process(name: &str, prefixes: &[String], suffix: &str) -> bool {
    prefixes
        .iter()
        .filter_map(|p| pid_in(name, p, suffix))
        .any(|pid| !Path::new("/proc").join(pid).exists())
}

/// Removes what an earlier, killed run left: its cgroup parents and its plugin sockets.
fn sweep_stale() {
    let cgroups: Vec<String> = TAGS.iter().map(|t| format!("ipkeep-{t}-")).collect();
    for controller in cgroup_controllers() {
        for entry in std::fs::read_dir(&controller)
            .into_iter()
            .flatten()
            .flatten()
        {
            if of_dead_process(&entry.file_name().to_string_lossy(), &cgroups, "") {
                remove_cgroup_tree(&entry.path());
            }
        }
    }
    let sockets: Vec<String> = PLUGIN_PREFIXES.iter().map(|p| p.to_string()).collect();
    for entry in std::fs::read_dir(PLUGIN_DIR)
        .into_iter()
        .flatten()
        .flatten()
    {
        if of_dead_process(&entry.file_name().to_string_lossy(), &sockets, ".sock") {
            let _ = std::fs::remove_file(entry.path());
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
) -> (String, PluginSocket, super::Driver) {
    assert!(
        PLUGIN_PREFIXES.contains(&prefix),
        "add {prefix:?} to PLUGIN_PREFIXES"
    );
    let name = format!("{prefix}{}", std::process::id());
    let socket = PluginSocket::new(&name);
    let driver = super::Driver::start_at(&socket.path, dir, extra);
    (name, socket, driver)
}
