//! The control plane itself: etcd, kube-apiserver, kube-controller-manager and kube-scheduler on
//! 127.0.0.1 with fresh state in a private directory, started in order and awaited on `/readyz`.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddrV4, TcpListener},
    path::{Path, PathBuf},
    process::ExitStatus,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use kube::{
    Client,
    config::{KubeConfigOptions, Kubeconfig},
};

use super::{
    kubeconfig::{KubeUser, KubeconfigWriteError, kubeconfig, write_kubeconfig},
    pki::{Pki, PkiError},
    process::{Component, LOG_TAIL_LINES, ProcessError, Spawner, Watchdog, log_tail},
};

/// The binaries a control plane needs (helm is built alongside for the chart tests).
pub const COMPONENT_BINARIES: [&str; 6] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "helm",
];

/// The prefix of every state directory the harness creates, so a later run can find stale ones.
pub const STATE_DIR_PREFIX: &str = "ipkeep-cluster-";

/// How long each component may take to become ready (a busy 2-core machine, a cold page cache).
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Failures of the control plane harness. Each says what to do next.
#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    /// The binaries are not built.
    #[error(
        "failed to find the control plane binaries: {dir} has no {missing}; run: make cluster-bins (or set IPKEEP_CLUSTER_BIN_DIR)"
    )]
    BinariesMissing {
        /// Where they were looked for.
        dir: PathBuf,
        /// The first missing one.
        missing: String,
    },
    /// `build.sh --print-bin-dir` could not be run.
    #[error(
        "failed to locate the control plane binaries with {script} --print-bin-dir; run: make cluster-bins"
    )]
    BinDir {
        /// The script.
        script: PathBuf,
        /// Why.
        #[source]
        source: crate::command::CommandError,
    },
    /// A port asked for is in use.
    #[error(
        "failed to start the control plane: port 127.0.0.1:{port} for {what} is already taken by another process"
    )]
    PortTaken {
        /// The port.
        port: u16,
        /// Which component wanted it.
        what: String,
    },
    /// No free port could be found.
    #[error("failed to find a free port on 127.0.0.1")]
    NoFreePort(#[source] std::io::Error),
    /// The state directory could not be prepared or removed.
    #[error("failed to {action} the state directory {path}")]
    StateDir {
        /// What was attempted.
        action: &'static str,
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Certificates.
    #[error("failed to generate the control plane's certificates")]
    Pki(#[from] PkiError),
    /// Starting a process.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// Writing a kubeconfig.
    #[error(transparent)]
    Kubeconfig(#[from] KubeconfigWriteError),
    /// A component exited while starting.
    #[error("failed to start {}: it exited ({status}) before it was ready; {report}", report.name)]
    Exited {
        /// Which component, and its log.
        report: Box<ComponentReport>,
        /// How it exited.
        status: ExitStatus,
    },
    /// A component did not become ready in time.
    #[error("failed to start {}: {why}; {report}", report.name)]
    NotReady {
        /// Which component, and its log.
        report: Box<ComponentReport>,
        /// What the readiness probe last saw.
        why: String,
    },
    /// A component died after the control plane was ready.
    #[error("{} (pid {pid}) died while the control plane was running ({status}); {report}", report.name)]
    Died {
        /// Which component, and its log.
        report: Box<ComponentReport>,
        /// Its pid.
        pid: u32,
        /// How it exited.
        status: ExitStatus,
    },
    /// The control plane was stopped already.
    #[error("the control plane at {0} was stopped")]
    Stopped(PathBuf),
    /// Building a client from the admin kubeconfig.
    #[error("failed to build a client from {path}")]
    ClientConfig {
        /// The kubeconfig.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// Reading the admin kubeconfig.
    #[error("failed to read {path}")]
    ReadKubeconfig {
        /// The kubeconfig.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// An API call the harness makes failed.
    #[error("failed to {what}")]
    Api {
        /// What the harness was doing.
        what: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// A condition the harness waits for did not come true.
    #[error("failed to {what}: still not true after {}s", waited.as_secs())]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        waited: Duration,
    },
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
    /// The shared control plane of this test binary failed to start earlier.
    #[error("the shared control plane of this test binary failed to start: {0}")]
    Shared(String),
}

/// A component's name, its log file and the end of that log, for error messages.
#[derive(Debug)]
pub struct ComponentReport {
    /// The component (`etcd`, `kube-apiserver`, ...).
    pub name: String,
    /// Its log file.
    pub log: PathBuf,
    /// Its last lines.
    pub tail: String,
}

impl ComponentReport {
    fn of(c: &Component) -> Box<ComponentReport> {
        Box::new(ComponentReport {
            name: c.name().to_owned(),
            log: c.log().to_owned(),
            tail: log_tail(c.log(), LOG_TAIL_LINES),
        })
    }
}

impl std::fmt::Display for ComponentReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "last lines of {}:\n{}", self.log.display(), self.tail)
    }
}

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

fn check_bin_dir(dir: &Path) -> Result<(), ControlPlaneError> {
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

/// The API server's URL: on the nodes' address when it serves nodes, else on loopback.
fn api_url(options: &ControlPlaneOptions, ports: Ports) -> String {
    let host = options
        .node_access
        .as_ref()
        .map_or(Ipv4Addr::LOCALHOST, |a| a.address);
    format!("https://{host}:{}", ports.apiserver)
}

fn free_port() -> Result<u16, ControlPlaneError> {
    let l = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
        .map_err(ControlPlaneError::NoFreePort)?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(ControlPlaneError::NoFreePort)
}

fn check_port_free(port: u16, what: &str) -> Result<u16, ControlPlaneError> {
    match TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)) {
        Ok(_) => Ok(port),
        Err(_) => Err(ControlPlaneError::PortTaken {
            port,
            what: what.to_owned(),
        }),
    }
}

/// The ports of one control plane.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Ports {
    /// etcd clients (plain HTTP on loopback).
    pub etcd_client: u16,
    /// etcd peers.
    pub etcd_peer: u16,
    /// kube-apiserver (HTTPS).
    pub apiserver: u16,
    /// kube-controller-manager's health and metrics (HTTPS).
    pub controller_manager: u16,
    /// kube-scheduler's health and metrics (HTTPS).
    pub scheduler: u16,
}

fn state_err(
    action: &'static str,
    path: &Path,
) -> impl FnOnce(std::io::Error) -> ControlPlaneError {
    let path = path.to_owned();
    move |source| ControlPlaneError::StateDir {
        action,
        path,
        source,
    }
}

/// Whether process `pid` runs (a zombie, dead but not yet reaped, does not).
pub fn process_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the parenthesised command name, which may itself hold ") ".
    stat.rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next())
        .is_some_and(|state| state != 'Z' && state != 'X')
}

/// Kills the process groups a state directory records whose leader still runs with that
/// directory on its command line (so a recycled pid is never hit); returns how many.
pub fn kill_recorded_groups(state_dir: &Path) -> usize {
    let Ok(text) = std::fs::read_to_string(state_dir.join("pgids")) else {
        return 0;
    };
    let needle = state_dir.to_string_lossy().into_owned();
    let mut killed = 0;
    for pid in text.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if !cmdline.contains(&needle) {
            continue;
        }
        if let Some(p) = rustix::process::Pid::from_raw(pid)
            && rustix::process::kill_process_group(p, rustix::process::Signal::KILL).is_ok()
        {
            killed += 1;
        }
    }
    killed
}

/// Removes the state directories under `parent` left by runs whose owner process is gone
/// (killed so hard that even the watchdog went with it), killing whatever they still run.
/// Returns what it removed, one line each.
pub fn reap_stale(parent: &Path) -> Vec<String> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(parent) else {
        return removed;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        // symlink_metadata: a link named like ours is never followed, nor removed.
        let is_dir = entry.path().symlink_metadata().is_ok_and(|m| m.is_dir());
        if !name.starts_with(STATE_DIR_PREFIX) || !is_dir {
            continue;
        }
        let dir = entry.path();
        let Some(owner) = std::fs::read_to_string(dir.join("owner"))
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
        else {
            continue;
        };
        if process_alive(owner) {
            continue;
        }
        let killed = kill_recorded_groups(&dir);
        if std::fs::remove_dir_all(&dir).is_ok() {
            removed.push(format!(
                "removed the stale state directory {} of a killed run (owner pid {owner} is gone; {killed} leftover process group(s) killed)",
                dir.display()
            ));
        }
    }
    removed
}

/// How a component was started and is probed, so it can be started again the same way.
struct Launch {
    program: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    /// The readiness probe: a client configuration and the path that answers `ok`.
    probe: Option<(kube::Config, &'static str)>,
}

struct Running {
    components: Vec<Arc<Component>>,
    /// By component name.
    launches: BTreeMap<String, Launch>,
    /// Seconds from the first process start to each component's readiness.
    ready_after: Vec<(String, f64)>,
    watchdog: Watchdog,
}

/// A running control plane. Dropping it stops everything and removes its state directory;
/// so does the death of the process that owns it (see [`super::process`]).
pub struct ControlPlane {
    state_dir: PathBuf,
    bin_dir: PathBuf,
    ports: Ports,
    server: String,
    kubeconfig: PathBuf,
    ca: PathBuf,
    pki: Pki,
    audit_log: Option<PathBuf>,
    config: kube::Config,
    running: Mutex<Option<Running>>,
    // Dropped last: the parent-death signal of every component is tied to this thread.
    spawner: Spawner,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("state_dir", &self.state_dir)
            .field("server", &self.server)
            .field("ports", &self.ports)
            .finish_non_exhaustive()
    }
}

static STATE_DIR_SEQ: AtomicU64 = AtomicU64::new(0);

fn arg(name: &str, value: impl std::fmt::Display) -> String {
    format!("--{name}={value}")
}

fn path_arg(name: &str, value: &Path) -> String {
    format!("--{name}={}", value.display())
}

const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n";

impl ControlPlane {
    /// Starts a control plane and returns once every component answers its readiness probe
    /// (`/readyz`; the controller-manager only has `/healthz`).
    ///
    /// Free ports are found by binding port 0 and letting go, so another process can take one
    /// before the component binds it: a component that then fails with "address already in use"
    /// on a port the harness picked is retried (twice) on new ports, and says so.
    pub async fn start(options: ControlPlaneOptions) -> Result<ControlPlane, ControlPlaneError> {
        let mut attempt = 1;
        loop {
            match Self::start_once(&options).await {
                Err(ControlPlaneError::Exited { report, .. })
                    if attempt < 3
                        && report.tail.contains("address already in use")
                        && !(report.name == "kube-apiserver"
                            && options.apiserver_port.is_some()) =>
                {
                    eprintln!(
                        "ipkeep-e2e cluster: {} lost a port the harness picked to another process (attempt {attempt}); retrying on new ports",
                        report.name
                    );
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn start_once(options: &ControlPlaneOptions) -> Result<ControlPlane, ControlPlaneError> {
        let started = Instant::now();
        let bin_dir = match &options.bin_dir {
            Some(d) => {
                check_bin_dir(d)?;
                d.clone()
            }
            None => bin_dir()?,
        };
        let parent = options
            .state_parent
            .clone()
            .unwrap_or_else(std::env::temp_dir);
        for line in reap_stale(&parent) {
            eprintln!("ipkeep-e2e cluster: {line}");
        }
        let state_dir = match &options.state_dir {
            Some(d) => d.clone(),
            None => parent.join(format!(
                "{STATE_DIR_PREFIX}{}-{}",
                std::process::id(),
                STATE_DIR_SEQ.fetch_add(1, Ordering::Relaxed)
            )),
        };
        let apiserver_port = match options.apiserver_port {
            Some(p) => check_port_free(p, "kube-apiserver")?,
            None => free_port()?,
        };
        let ports = Ports {
            etcd_client: free_port()?,
            etcd_peer: free_port()?,
            apiserver: apiserver_port,
            controller_manager: free_port()?,
            scheduler: free_port()?,
        };

        // create_dir (not _all) on the leaf: an existing directory, or a symlink planted in its
        // place, is refused rather than reused.
        std::fs::create_dir_all(&parent).map_err(state_err("create the parent of", &parent))?;
        // Private: it holds keys and, later, token kubeconfigs.
        std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
            .create(&state_dir)
            .map_err(state_err("create", &state_dir))?;
        std::fs::write(state_dir.join("owner"), format!("{}\n", std::process::id()))
            .map_err(state_err("write the owner file of", &state_dir))?;
        let spawner =
            Spawner::new().map_err(state_err("start the spawner thread for", &state_dir))?;
        let watchdog = Watchdog::start(&spawner, &state_dir, &options.cleanup_command)?;
        let mut running = Running {
            components: Vec::new(),
            launches: BTreeMap::new(),
            ready_after: Vec::new(),
            watchdog,
        };
        match Self::boot(options, &bin_dir, &state_dir, ports, &spawner, &mut running).await {
            Ok((pki, kubeconfig, config, audit_log)) => {
                for c in &running.components {
                    c.announce_death();
                }
                let cluster = ControlPlane {
                    server: api_url(options, ports),
                    ca: pki.ca_cert.clone(),
                    pki,
                    state_dir,
                    bin_dir,
                    ports,
                    kubeconfig,
                    audit_log,
                    config,
                    running: Mutex::new(Some(running)),
                    spawner,
                };
                let ready = serde_json::json!({
                    "server": cluster.server,
                    "kubeconfig": cluster.kubeconfig,
                    "binDir": cluster.bin_dir,
                    "ports": ports,
                    "pids": cluster.pids(),
                    "startSeconds": started.elapsed().as_secs_f64(),
                    "readyAfterSeconds": cluster.ready_after(),
                });
                // Renamed into place: `cluster up` takes its existence as the signal to read it.
                let tmp = cluster.state_dir.join("ready.tmp");
                std::fs::write(&tmp, ready.to_string())
                    .and_then(|()| std::fs::rename(&tmp, cluster.state_dir.join("ready")))
                    .map_err(state_err("write the ready file of", &cluster.state_dir))?;
                Ok(cluster)
            }
            Err(e) => {
                stop_running(&mut running, &state_dir, Duration::from_secs(2));
                Err(e)
            }
        }
    }

    /// Starts the components in order, each once the one it needs is ready: the certificates
    /// and kubeconfigs, etcd, kube-apiserver, then kube-controller-manager and kube-scheduler.
    async fn boot(
        options: &ControlPlaneOptions,
        bin_dir: &Path,
        dir: &Path,
        ports: Ports,
        spawner: &Spawner,
        running: &mut Running,
    ) -> Result<(Pki, PathBuf, kube::Config, Option<PathBuf>), ControlPlaneError> {
        let boot = Boot {
            options,
            bin_dir,
            dir,
            ports,
            spawner,
            logs: dir.join("logs"),
            pgids: dir.join("pgids"),
            started: Instant::now(),
        };
        let credentials = boot.write_credentials()?;
        let etcd = boot.start_etcd(running).await?;
        let (config, audit_log) = boot.start_apiserver(running, &credentials, &etcd).await?;
        boot.start_controller_manager_and_scheduler(running, &credentials, &config)
            .await?;
        Ok((credentials.pki, credentials.admin, config, audit_log))
    }

    /// The API server's URL (`https://127.0.0.1:PORT`).
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The admin kubeconfig (user `admin` in `system:masters`).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The CA certificate the API server's serving certificate chains to.
    pub fn ca_path(&self) -> &Path {
        &self.ca
    }

    /// Every certificate and key of this run.
    pub fn pki(&self) -> &Pki {
        &self.pki
    }

    /// The state directory (removed when the control plane stops).
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// The ports in use.
    pub fn ports(&self) -> Ports {
        self.ports
    }

    /// The API server's audit log, when started with [`ControlPlaneOptions::audit_log`].
    pub fn audit_log_path(&self) -> Option<&Path> {
        self.audit_log.as_deref()
    }

    /// The path of one of the built binaries (`kubectl`, `helm`, ...).
    pub fn bin(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }

    /// A `kubectl` command with `KUBECONFIG` set to the admin kubeconfig.
    pub fn kubectl(&self) -> std::process::Command {
        let mut c = std::process::Command::new(self.bin("kubectl"));
        c.env("KUBECONFIG", &self.kubeconfig);
        c
    }

    /// A `helm` command with `KUBECONFIG` set to the admin kubeconfig and Helm's cache, config
    /// and data directories inside the state directory, so no test reads or writes `~/.cache/helm`.
    pub fn helm(&self) -> std::process::Command {
        let mut c = std::process::Command::new(self.bin("helm"));
        let home = self.state_dir.join("helm");
        c.env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"));
        c
    }

    /// The admin client configuration; build a [`Client`] from it in the runtime that uses it.
    pub fn config(&self) -> kube::Config {
        self.config.clone()
    }

    /// A new admin client, bound to the calling tokio runtime (a client must not outlive the
    /// runtime that made it, so each test makes its own).
    pub fn client(&self) -> Result<Client, ControlPlaneError> {
        Client::try_from(self.config()).map_err(|source| ControlPlaneError::ClientConfig {
            path: self.kubeconfig.clone(),
            source,
        })
    }

    /// Seconds from starting etcd to each component's readiness, in the order they got ready.
    pub fn ready_after(&self) -> Vec<(String, f64)> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running
            .as_ref()
            .map(|r| r.ready_after.clone())
            .unwrap_or_default()
    }

    /// Process ids by component name (empty once stopped).
    pub fn pids(&self) -> BTreeMap<String, u32> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running
            .iter()
            .flat_map(|r| r.components.iter())
            .map(|c| (c.name().to_owned(), c.pid()))
            .chain(
                running
                    .iter()
                    .map(|r| ("watchdog".to_owned(), r.watchdog.pid())),
            )
            .collect()
    }

    /// Resident memory of each component, in KiB, from `/proc/<pid>/status`.
    pub fn rss_kib(&self) -> BTreeMap<String, u64> {
        self.pids()
            .into_iter()
            .filter(|(name, _)| name != "watchdog")
            .filter_map(|(name, pid)| Some((name, super::process::rss_kib(pid)?)))
            .collect()
    }

    /// Starts another process under this control plane's supervision (a node's containerd,
    /// kubelet, kube-proxy): in its own process group, dying with the owner like the
    /// components, its group killed by the watchdog if the owner dies. `args` must name the
    /// state directory (the watchdog kills only groups whose leader does). The caller stops it.
    pub fn start_process(
        &self,
        name: &str,
        program: &Path,
        args: &[String],
        log: &Path,
    ) -> Result<Component, ControlPlaneError> {
        let c = Component::start(
            &self.spawner,
            name,
            program,
            args,
            log,
            &self.state_dir.join("pgids"),
        )?;
        c.announce_death();
        Ok(c)
    }

    /// Ok while every component runs; else which one died, how, and the end of its log.
    pub fn check(&self) -> Result<(), ControlPlaneError> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let Some(r) = running.as_ref() else {
            return Err(ControlPlaneError::Stopped(self.state_dir.clone()));
        };
        for c in &r.components {
            if let Some(status) = c.exit_status() {
                return Err(ControlPlaneError::Died {
                    report: ComponentReport::of(c),
                    pid: c.pid(),
                    status,
                });
            }
        }
        Ok(())
    }

    /// Kills component `name` (`etcd`, `kube-apiserver`, ...) with SIGKILL as a crash would,
    /// leaves it down for `down`, starts it again with the same flags, state and port, and
    /// returns once it is ready again. The others keep running (and reconnect on their own).
    pub async fn restart_component(
        &self,
        name: &str,
        down: Duration,
    ) -> Result<(), ControlPlaneError> {
        let not_running = || ControlPlaneError::Invalid {
            what: "component to restart",
            value: name.to_owned(),
            why: "not a running component of this control plane",
        };
        let (old, program, args, log, probe) = {
            let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            let r = running.as_ref().ok_or_else(not_running)?;
            let old = r
                .components
                .iter()
                .find(|c| c.name() == name)
                .cloned()
                .ok_or_else(not_running)?;
            let launch = r.launches.get(name).ok_or_else(not_running)?;
            (
                old,
                launch.program.clone(),
                launch.args.clone(),
                launch.log.clone(),
                launch.probe.clone(),
            )
        };
        // Zero grace: SIGTERM and SIGKILL at once, no graceful shutdown.
        let stopping = Arc::clone(&old);
        let _ = tokio::task::spawn_blocking(move || stopping.stop(Duration::ZERO)).await;
        tokio::time::sleep(down).await;
        let new = {
            let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            let r = running.as_mut().ok_or_else(not_running)?;
            let new = Arc::new(Component::start(
                &self.spawner,
                name,
                &program,
                &args,
                &log,
                &self.state_dir.join("pgids"),
            )?);
            for c in r.components.iter_mut() {
                if Arc::ptr_eq(c, &old) {
                    *c = Arc::clone(&new);
                }
            }
            new
        };
        if let Some((config, path)) = probe {
            probe_ready(&new, config, path).await?;
        }
        new.announce_death();
        Ok(())
    }

    /// Stops every component (scheduler and controller-manager first, etcd last), then removes
    /// the state directory. Idempotent; blocks for up to a few seconds.
    pub fn stop(&self) {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(mut r) = running.take() {
            stop_running(&mut r, &self.state_dir, Duration::from_secs(5));
        }
    }
}

fn stop_running(running: &mut Running, state_dir: &Path, grace: Duration) {
    for c in running.components.iter().rev() {
        c.stop(grace);
    }
    running.components.clear();
    let _ = std::fs::remove_file(state_dir.join("pgids"));
    let _ = std::fs::remove_dir_all(state_dir);
    running.watchdog.finish();
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits until component `name` answers `path` on `config`'s URL, and keeps that probe for a
/// restart.
async fn wait_ready(
    running: &mut Running,
    name: &str,
    config: kube::Config,
    path: &'static str,
) -> Result<(), ControlPlaneError> {
    let Some(component) = running.components.iter().find(|c| c.name() == name) else {
        return Err(ControlPlaneError::Invalid {
            what: "component",
            value: name.to_owned(),
            why: "not started",
        });
    };
    let component = Arc::clone(component);
    if let Some(launch) = running.launches.get_mut(name) {
        launch.probe = Some((config.clone(), path));
    }
    probe_ready(&component, config, path).await
}

async fn probe_ready(
    component: &Component,
    mut config: kube::Config,
    path: &str,
) -> Result<(), ControlPlaneError> {
    let name = component.name();
    config.connect_timeout = Some(Duration::from_secs(2));
    config.read_timeout = Some(Duration::from_secs(5));
    let url = format!(
        "{}{}",
        config.cluster_url.to_string().trim_end_matches('/'),
        path
    );
    let client = Client::try_from(config).map_err(|source| ControlPlaneError::Api {
        what: format!("build a client to probe {name}"),
        source,
    })?;
    let started = Instant::now();
    let mut last: String;
    loop {
        if let Some(status) = component.exit_status() {
            return Err(ControlPlaneError::Exited {
                report: ComponentReport::of(component),
                status,
            });
        }
        let request = http::Request::get(path).body(Vec::new());
        match request {
            Ok(req) => match client.request_text(req).await {
                Ok(body) if body.trim() == "ok" || body.contains("\"health\":\"true\"") => {
                    return Ok(());
                }
                Ok(body) => last = body.chars().take(300).collect(),
                Err(e) => last = e.to_string(),
            },
            Err(e) => last = e.to_string(),
        }
        if started.elapsed() > READY_TIMEOUT {
            return Err(ControlPlaneError::NotReady {
                report: ComponentReport::of(component),
                why: format!(
                    "{url} was not ready after {}s (last answer: {last})",
                    started.elapsed().as_secs()
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What every step of [`ControlPlane::boot`] starts its component with.
struct Boot<'a> {
    options: &'a ControlPlaneOptions,
    bin_dir: &'a Path,
    /// The state directory.
    dir: &'a Path,
    ports: Ports,
    spawner: &'a Spawner,
    /// Where each component's log goes (`<name>.log`).
    logs: PathBuf,
    /// The process groups file the watchdog reads.
    pgids: PathBuf,
    /// When the first step began: each component's readiness is reported from here.
    started: Instant,
}

/// The control plane's certificates and the kubeconfigs made from them.
struct Credentials {
    pki: Pki,
    /// The admin's kubeconfig (what `ControlPlane::kubeconfig_path` names).
    admin: PathBuf,
    controller_manager: PathBuf,
    /// The scheduler's configuration file (it names the scheduler's kubeconfig).
    scheduler_config: PathBuf,
    scheduler: PathBuf,
}

impl Boot<'_> {
    /// The certificates (with the nodes' names for the API server when nodes reach it), the
    /// admin's, kube-controller-manager's and kube-scheduler's kubeconfigs, and the scheduler's
    /// configuration file.
    fn write_credentials(&self) -> Result<Credentials, ControlPlaneError> {
        let (options, dir, ports) = (self.options, self.dir, self.ports);
        let pki_dir = dir.join("pki");
        for d in [&pki_dir, &self.logs] {
            std::fs::create_dir(d).map_err(state_err("create a directory in", dir))?;
        }
        let extra_sans: Vec<String> = match &options.node_access {
            Some(access) => vec![
                access.address.to_string(),
                access.service_ip.to_string(),
                "kubernetes".into(),
                "kubernetes.default".into(),
                "kubernetes.default.svc".into(),
                "kubernetes.default.svc.cluster.local".into(),
            ],
            None => Vec::new(),
        };
        let pki = Pki::generate_with_sans(&pki_dir, &extra_sans)?;
        let server = api_url(options, ports);
        let write_kc = |file: &str, user: &str, cert: &super::pki::ClientCert| {
            let path = dir.join(file);
            let doc = kubeconfig(
                &server,
                &pki.ca_cert,
                user,
                &KubeUser::Cert {
                    cert: cert.cert.clone(),
                    key: cert.key.clone(),
                },
                None,
            );
            write_kubeconfig(&path, &doc).map(|()| path)
        };
        let admin_kc = write_kc("admin.kubeconfig", "admin", &pki.admin)?;
        let kcm_kc = write_kc(
            "kube-controller-manager.kubeconfig",
            "system:kube-controller-manager",
            &pki.controller_manager,
        )?;
        let sched_kc = write_kc(
            "kube-scheduler.kubeconfig",
            "system:kube-scheduler",
            &pki.scheduler,
        )?;
        let sched_config = dir.join("kube-scheduler-config.yaml");
        std::fs::write(
            &sched_config,
            format!(
                "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nclientConnection:\n  kubeconfig: {}\nleaderElection:\n  leaderElect: false\n",
                serde_json::to_string(&sched_kc).unwrap_or_default()
            ),
        )
        .map_err(state_err("write the scheduler configuration in", dir))?;

        Ok(Credentials {
            pki,
            admin: admin_kc,
            controller_manager: kcm_kc,
            scheduler_config: sched_config,
            scheduler: sched_kc,
        })
    }

    /// The options' extra arguments for component `name`.
    fn extra(&self, name: &str) -> Vec<String> {
        self.options
            .extra_args
            .get(name)
            .cloned()
            .unwrap_or_default()
    }

    /// Starts component `name` (the binary of that name) with `args`, its log in `logs/`.
    fn start(
        &self,
        name: &str,
        args: Vec<String>,
        running: &mut Running,
    ) -> Result<(), ControlPlaneError> {
        let launch = Launch {
            program: self.bin_dir.join(name),
            args,
            log: self.logs.join(format!("{name}.log")),
            probe: None,
        };
        let c = Component::start(
            self.spawner,
            name,
            &launch.program,
            &launch.args,
            &launch.log,
            &self.pgids,
        )?;
        running.components.push(Arc::new(c));
        running.launches.insert(name.to_owned(), launch);
        Ok(())
    }

    /// Waits until component `name` answers `path` at `config`'s address, and records when.
    async fn wait_until_ready(
        &self,
        running: &mut Running,
        name: &str,
        config: kube::Config,
        path: &'static str,
    ) -> Result<(), ControlPlaneError> {
        wait_ready(running, name, config, path).await?;
        running
            .ready_after
            .push((name.into(), self.started.elapsed().as_secs_f64()));
        Ok(())
    }

    /// Starts etcd and waits until it is ready; its client URL.
    async fn start_etcd(&self, running: &mut Running) -> Result<String, ControlPlaneError> {
        let (dir, ports) = (self.dir, self.ports);
        let etcd_client = format!("http://127.0.0.1:{}", ports.etcd_client);
        let etcd_peer = format!("http://127.0.0.1:{}", ports.etcd_peer);
        let mut args = vec![
            arg("name", "ipkeep"),
            path_arg("data-dir", &dir.join("etcd")),
            arg("listen-client-urls", &etcd_client),
            arg("advertise-client-urls", &etcd_client),
            arg("listen-peer-urls", &etcd_peer),
            arg("initial-advertise-peer-urls", &etcd_peer),
            arg("initial-cluster", format!("ipkeep={etcd_peer}")),
            // Test data: durability buys nothing and fsync costs seconds on a busy disk.
            arg("unsafe-no-fsync", true),
            arg("auto-compaction-retention", 1),
            arg("log-level", "warn"),
        ];
        args.extend(self.extra("etcd"));
        self.start("etcd", args, running)?;
        let mut etcd_config =
            kube::Config::new(
                etcd_client
                    .parse()
                    .map_err(|e| ControlPlaneError::Invalid {
                        what: "etcd URL",
                        value: format!("{etcd_client} ({e})"),
                        why: "not a URL",
                    })?,
            );
        etcd_config.auth_info = Default::default();
        self.wait_until_ready(running, "etcd", etcd_config, "/readyz")
            .await?;
        Ok(etcd_client)
    }

    /// Starts kube-apiserver on `etcd_client` (with the audit log when asked for) and waits
    /// until it is ready; the admin's client configuration and the audit log's path.
    async fn start_apiserver(
        &self,
        running: &mut Running,
        credentials: &Credentials,
        etcd_client: &str,
    ) -> Result<(kube::Config, Option<PathBuf>), ControlPlaneError> {
        let (options, dir, ports, pki) = (self.options, self.dir, self.ports, &credentials.pki);
        let admin_kc = &credentials.admin;
        let mut args = vec![
            arg("etcd-servers", etcd_client),
            arg("secure-port", ports.apiserver),
            path_arg("tls-cert-file", &pki.serving.cert),
            path_arg("tls-private-key-file", &pki.serving.key),
            path_arg("client-ca-file", &pki.ca_cert),
            arg("authorization-mode", "Node,RBAC"),
            arg("enable-admission-plugins", "NodeRestriction"),
            arg(
                "service-account-issuer",
                "https://kubernetes.default.svc.cluster.local",
            ),
            path_arg("service-account-key-file", &pki.sa_pub),
            path_arg("service-account-signing-key-file", &pki.sa_key),
            arg("service-cluster-ip-range", SERVICE_CIDR),
            arg("allow-privileged", true),
            // /debug/pprof, for the controller bench's profiles (admin only, on loopback).
            arg("profiling", true),
            path_arg("cert-dir", &dir.join("apiserver-certs")),
            // The API server reaches admission webhooks (ipkeep's placement webhook) at their
            // Service's endpoints, not its ClusterIP: this host is the control plane and runs no
            // kube-proxy, as on clusters whose control plane is not a node. Without endpoints (a
            // chart installed on a plane without nodes) a call fails at once, never dials out.
            arg("enable-aggregator-routing", true),
        ];
        match &options.node_access {
            Some(access) => {
                let kubelet_client = pki.client_cert(
                    "apiserver-kubelet-client",
                    "kube-apiserver-kubelet-client",
                    Some("system:masters"),
                )?;
                args.extend([
                    arg("bind-address", access.address),
                    arg("advertise-address", access.address),
                    path_arg("kubelet-client-certificate", &kubelet_client.cert),
                    path_arg("kubelet-client-key", &kubelet_client.key),
                    path_arg("kubelet-certificate-authority", &pki.ca_cert),
                    arg("kubelet-preferred-address-types", "InternalIP"),
                ]);
            }
            None => args.extend([
                arg("bind-address", "127.0.0.1"),
                arg("advertise-address", "127.0.0.1"),
                // The apiserver's own address is loopback: nothing in-cluster could use it.
                arg("endpoint-reconciler-type", "none"),
            ]),
        }
        let audit_log = if options.audit_log {
            let policy = dir.join("audit-policy.yaml");
            std::fs::write(
                &policy,
                options.audit_policy.as_deref().unwrap_or(AUDIT_POLICY),
            )
            .map_err(state_err("write the audit policy in", dir))?;
            let log = dir.join("audit.log");
            args.extend([
                path_arg("audit-policy-file", &policy),
                path_arg("audit-log-path", &log),
                // Every event is on disk before the request returns: tests read it right after.
                arg("audit-log-mode", "blocking"),
                arg("audit-log-format", "json"),
            ]);
            Some(log)
        } else {
            None
        };
        args.extend(self.extra("kube-apiserver"));
        self.start("kube-apiserver", args, running)?;
        let config = kube::Config::from_custom_kubeconfig(
            Kubeconfig::read_from(admin_kc).map_err(|source| {
                ControlPlaneError::ReadKubeconfig {
                    path: admin_kc.clone(),
                    source,
                }
            })?,
            &KubeConfigOptions::default(),
        )
        .await
        .map_err(|source| ControlPlaneError::ReadKubeconfig {
            path: admin_kc.clone(),
            source,
        })?;
        self.wait_until_ready(running, "kube-apiserver", config.clone(), "/readyz")
            .await?;
        Ok((config, audit_log))
    }

    /// Starts kube-controller-manager and kube-scheduler together and waits until both are
    /// ready (`config`: the admin's, aimed at each in turn).
    async fn start_controller_manager_and_scheduler(
        &self,
        running: &mut Running,
        credentials: &Credentials,
        config: &kube::Config,
    ) -> Result<(), ControlPlaneError> {
        let (options, ports, pki) = (self.options, self.ports, &credentials.pki);
        let (kcm_kc, sched_kc, sched_config) = (
            &credentials.controller_manager,
            &credentials.scheduler,
            &credentials.scheduler_config,
        );
        let common = |port: u16, kc: &Path| {
            vec![
                path_arg("authentication-kubeconfig", kc),
                path_arg("authorization-kubeconfig", kc),
                arg("bind-address", "127.0.0.1"),
                arg("secure-port", port),
                path_arg("tls-cert-file", &pki.serving.cert),
                path_arg("tls-private-key-file", &pki.serving.key),
                path_arg("client-ca-file", &pki.ca_cert),
                arg(
                    "authorization-always-allow-paths",
                    "/healthz,/readyz,/livez,/metrics",
                ),
                arg("profiling", false),
            ]
        };
        let mut args = common(ports.controller_manager, kcm_kc);
        args.extend([
            path_arg("kubeconfig", kcm_kc),
            arg("leader-elect", false),
            arg(
                "controllers",
                if options.fixture_nodes {
                    "*,-node-lifecycle-controller"
                } else {
                    "*"
                },
            ),
            // Each controller acts as its own ServiceAccount with its bootstrap role.
            arg("use-service-account-credentials", true),
            path_arg("service-account-private-key-file", &pki.sa_key),
            path_arg("root-ca-file", &pki.ca_cert),
            path_arg("cluster-signing-cert-file", &pki.ca_cert),
            path_arg("cluster-signing-key-file", &pki.ca_key),
            arg("service-cluster-ip-range", SERVICE_CIDR),
            // Notice a registered node's Ready condition (and lift its not-ready taint) sooner.
            arg("node-monitor-period", "1s"),
            // A ResourceQuota on a custom resource (count/ipreservations.ipkeep.dev) created before
            // the quota controller's discovery (every 30 s) found the CRD gets no usage for it
            // until the next full resync: 5 minutes by default, which a loaded machine reached
            // (the quota test gave up after 120 s). 10 s here.
            arg("resource-quota-sync-period", "10s"),
        ]);
        args.extend(self.extra("kube-controller-manager"));
        self.start("kube-controller-manager", args, running)?;
        let mut args = common(ports.scheduler, sched_kc);
        args.push(path_arg("config", sched_config));
        args.extend(self.extra("kube-scheduler"));
        self.start("kube-scheduler", args, running)?;
        // kube-controller-manager serves no /readyz (404); its /healthz covers its controllers.
        for (name, port, path) in [
            (
                "kube-controller-manager",
                ports.controller_manager,
                "/healthz",
            ),
            ("kube-scheduler", ports.scheduler, "/readyz"),
        ] {
            let mut c = config.clone();
            c.cluster_url = format!("https://127.0.0.1:{port}").parse().map_err(|e| {
                ControlPlaneError::Invalid {
                    what: "component URL",
                    value: format!("{port} ({e})"),
                    why: "not a URL",
                }
            })?;
            self.wait_until_ready(running, name, c, path).await?;
        }
        Ok(())
    }
}
