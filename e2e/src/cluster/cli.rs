//! `ipkeep-e2e cluster up|down|env`: the control plane for people and scripts.
//!
//! `up` starts a supervisor (`up --foreground` in its own process group, log beside the state
//! directory) and returns once the control plane is ready; the supervisor owns the components,
//! so if it is killed they die with it (see [`super::process`]). `down` stops the supervisor and
//! removes whatever is left, even after a crash. `env` prints the shell lines to use it.
//! `fault-proxy` serves a [`crate::proxy::FaultProxy`] in front of its API server.

use std::{
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use super::{
    ControlPlane, ControlPlaneError, ControlPlaneOptions,
    plane::{kill_recorded_groups, process_alive},
    process::{LOG_TAIL_LINES, log_tail},
    realnode::{self, Cluster, ClusterOptions, RealNodeError},
};

/// Failures of the command line, each with the command that fixes it.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The control plane itself failed.
    #[error(transparent)]
    ControlPlane(#[from] ControlPlaneError),
    /// The real nodes failed.
    #[error(transparent)]
    Nodes(#[from] RealNodeError),
    /// `exec` naming a node the running cluster does not have.
    #[error("no node {node} in the running cluster (its nodes: {nodes})")]
    NoSuchNode {
        /// The name given.
        node: String,
        /// The cluster's nodes.
        nodes: String,
    },
    /// `load-image` or `exec` without running nodes.
    #[error("no real nodes are running at {0}; run: ipkeep-e2e cluster up --nodes 2")]
    NoNodes(PathBuf),
    /// Another supervisor owns the state directory.
    #[error(
        "a control plane is already running at {dir} (supervisor pid {pid}); run: ipkeep-e2e cluster down"
    )]
    AlreadyRunning {
        /// The state directory.
        dir: PathBuf,
        /// Its supervisor.
        pid: u32,
    },
    /// `env` without a running control plane.
    #[error("no control plane is running at {0}; run: ipkeep-e2e cluster up")]
    NotRunning(PathBuf),
    /// The supervisor exited before the control plane was ready.
    #[error("failed to start the control plane: the supervisor exited ({status}); last lines of {}:\n{tail}", log.display())]
    SupervisorExited {
        /// How it exited.
        status: std::process::ExitStatus,
        /// Its log.
        log: PathBuf,
        /// The end of its log.
        tail: String,
    },
    /// Some file or process operation failed.
    #[error("failed to {what}")]
    Io {
        /// What.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The state directory is not one the harness made, or not one `down` may stop.
    #[error("refusing to touch {dir}: {why}")]
    NotOurs {
        /// The directory.
        dir: PathBuf,
        /// Why.
        why: &'static str,
    },
    /// Interrupted while waiting.
    #[error("interrupted: the control plane was stopped again")]
    Interrupted,
    /// A strike the supervisor carried out and that failed, or one it never answered.
    #[error("{0}")]
    Strike(String),
    /// The fault proxy.
    #[error(transparent)]
    Proxy(#[from] crate::proxy::ProxyError),
}

/// The state directory the command line uses unless told otherwise.
pub fn default_state_dir() -> PathBuf {
    std::env::temp_dir().join(format!("{}cli", super::plane::STATE_DIR_PREFIX))
}

fn supervisor_log(dir: &Path) -> PathBuf {
    let mut name = dir.as_os_str().to_owned();
    name.push(".log");
    PathBuf::from(name)
}

/// The supervisor's own error (its last `ipkeep-e2e cluster:` line and the component log tail
/// quoted under it), else the end of its log.
fn supervisor_error(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    match lines
        .iter()
        .rposition(|l| l.starts_with("ipkeep-e2e cluster: "))
    {
        Some(i) => lines[i..]
            .iter()
            .take(LOG_TAIL_LINES + 5)
            .map(|l| format!("    | {l}"))
            .collect::<Vec<_>>()
            .join("\n"),
        None => log_tail(log, LOG_TAIL_LINES),
    }
}

fn owner(dir: &Path) -> Option<u32> {
    std::fs::read_to_string(dir.join("owner"))
        .ok()
        .and_then(|t| t.trim().parse().ok())
}

/// What a `--state-dir` currently is.
enum StateDir {
    /// Nothing there.
    Absent,
    /// Ours, and its owner is gone.
    Stale,
    /// Ours, and its owner runs with this pid.
    Running(u32),
}

/// Looks at a state directory without trusting it: anything that is not a directory holding an
/// `owner` file is refused, so a mistyped `--state-dir` never removes someone's files.
fn inspect(dir: &Path) -> Result<StateDir, CliError> {
    let Ok(meta) = dir.symlink_metadata() else {
        return Ok(StateDir::Absent);
    };
    let not_ours = |why: &'static str| CliError::NotOurs {
        dir: dir.to_owned(),
        why,
    };
    if !meta.is_dir() {
        return Err(not_ours(
            "it is not a directory (a symlink is never followed)",
        ));
    }
    match owner(dir) {
        None => Err(not_ours(
            "it has no owner file, so it is not a control plane state directory; choose another --state-dir",
        )),
        Some(pid) if process_alive(pid) => Ok(StateDir::Running(pid)),
        Some(_) => Ok(StateDir::Stale),
    }
}

/// Clears a state directory whose supervisor is gone; refuses one whose supervisor runs.
fn clear_stale(dir: &Path) -> Result<Option<String>, CliError> {
    match inspect(dir)? {
        StateDir::Absent => Ok(None),
        StateDir::Running(pid) => Err(CliError::AlreadyRunning {
            dir: dir.to_owned(),
            pid,
        }),
        StateDir::Stale => {
            let killed = kill_recorded_groups(dir);
            std::fs::remove_dir_all(dir).map_err(|source| CliError::Io {
                what: format!("remove the stale state directory {}", dir.display()),
                source,
            })?;
            Ok(Some(format!(
                "removed the stale state directory {} of a killed run ({killed} leftover process group(s) killed)",
                dir.display()
            )))
        }
    }
}

/// Whether process `pid` runs with `dir` on its command line (a supervisor started by `up`).
fn mentions(pid: u32, dir: &Path) -> bool {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    String::from_utf8_lossy(&raw)
        .split('\0')
        .any(|arg| Path::new(arg) == dir)
}

/// Options of `cluster up`.
#[derive(Debug, Clone)]
pub struct UpOptions {
    /// The state directory.
    pub state_dir: PathBuf,
    /// A fixed API server port.
    pub apiserver_port: Option<u16>,
    /// Turn on the audit log.
    pub audit_log: bool,
    /// Real nodes to start with it (0: the control plane alone).
    pub nodes: u8,
    /// Their CNI network.
    pub cni: realnode::NodeCni,
    /// Where they keep their CNI plugins and configuration.
    pub dirs: realnode::NodeDirs,
    /// How many of the first nodes run CRI-O instead of containerd.
    pub crio_nodes: u8,
}

/// The file `up --nodes` writes once the nodes are Ready: which slot, how many nodes, and
/// where their binaries are (what `load-image` needs).
fn nodes_file(dir: &Path) -> PathBuf {
    dir.join("nodes.json")
}

/// Either kind of cluster the supervisor runs.
enum Supervised {
    Plane(Box<ControlPlane>),
    Nodes(Box<Cluster>),
}

impl Supervised {
    fn check(&self) -> Result<(), CliError> {
        match self {
            Supervised::Plane(c) => c.check().map_err(CliError::from),
            Supervised::Nodes(c) => c.check().map_err(CliError::from),
        }
    }

    /// Carries out a strike request of `cluster reboot|restart`: Ok, or what went wrong.
    fn strike(&self, request: &StrikeRequest) -> Result<(), String> {
        let Supervised::Nodes(c) = self else {
            return Err("this cluster has no real nodes".into());
        };
        let node = c.node(&request.node).ok_or_else(|| {
            let names: Vec<String> = c.nodes().iter().map(|n| n.name()).collect();
            format!(
                "no node {} in the running cluster (its nodes: {})",
                request.node,
                names.join(", ")
            )
        })?;
        eprintln!("ipkeep-e2e cluster: {}: {:?}", request.node, request.strike);
        node.strike(&request.strike)
            .map_err(|e| crate::error_chain(&e))
    }

    fn stop(&self) {
        match self {
            Supervised::Plane(c) => c.stop(),
            Supervised::Nodes(c) => {
                for line in c.stop().unwrap_or_else(|e| vec![crate::error_chain(&e)]) {
                    eprintln!("ipkeep-e2e cluster: {line}");
                }
            }
        }
    }
}

/// `cluster up --foreground`: runs the control plane in this process until SIGINT or SIGTERM,
/// or until a component dies (then it says which and fails).
pub async fn run_foreground(options: UpOptions) -> Result<(), CliError> {
    if let Some(line) = clear_stale(&options.state_dir)? {
        eprintln!("ipkeep-e2e cluster: {line}");
    }
    let t0 = Instant::now();
    let plane = ControlPlaneOptions {
        state_dir: Some(options.state_dir.clone()),
        state_parent: options.state_dir.parent().map(Path::to_owned),
        apiserver_port: options.apiserver_port,
        audit_log: options.audit_log,
        ..ControlPlaneOptions::default()
    };
    let io = |what: &str| {
        let what = what.to_owned();
        move |source| CliError::Io { what, source }
    };
    let cluster = if options.nodes == 0 {
        Supervised::Plane(Box::new(ControlPlane::start(plane).await?))
    } else {
        let c = Cluster::start(ClusterOptions {
            nodes: options.nodes,
            network: realnode::PodNetwork {
                cni: options.cni,
                dirs: options.dirs,
                crio_nodes: options.crio_nodes,
                ..realnode::PodNetwork::default()
            },
            plane,
            ..ClusterOptions::default()
        })
        .await?;
        let info = serde_json::json!({
            "slot": c.slot().number(),
            "nodes": c.nodes().len(),
            "binDir": c.bin_dir(),
            "cni": options.cni.name(),
            "layout": options.dirs.name(),
            "runtimes": c.nodes().iter().map(|n| n.runtime().name()).collect::<Vec<_>>(),
        });
        let file = nodes_file(&options.state_dir);
        let tmp = file.with_extension("tmp");
        std::fs::write(&tmp, info.to_string())
            .and_then(|()| std::fs::rename(&tmp, &file))
            .map_err(io("write the nodes file"))?;
        for n in c.nodes() {
            eprintln!(
                "ipkeep-e2e cluster: node {} at {} (pods {}, {}, {}), network namespace {}",
                n.name(),
                n.ip(),
                n.pod_cidr(),
                n.cni().name(),
                n.runtime().name(),
                n.layout().netns()
            );
        }
        Supervised::Nodes(Box::new(c))
    };
    let (server, kubeconfig) = match &cluster {
        Supervised::Plane(c) => (c.server().to_owned(), c.kubeconfig_path().to_owned()),
        Supervised::Nodes(c) => (
            c.plane().server().to_owned(),
            c.plane().kubeconfig_path().to_owned(),
        ),
    };
    eprintln!(
        "ipkeep-e2e cluster: ready in {:.1}s at {server}; KUBECONFIG={}",
        t0.elapsed().as_secs_f64(),
        kubeconfig.display()
    );
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(io("listen for SIGTERM"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(io("listen for SIGINT"))?;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let cluster = std::sync::Arc::new(cluster);
    let outcome = loop {
        tokio::select! {
            _ = term.recv() => break Ok(()),
            _ = int.recv() => break Ok(()),
            _ = tick.tick() => {
                if let Err(e) = cluster.check() {
                    break Err(e);
                }
                if let Some(request) = take_strike(&options.state_dir) {
                    let c = std::sync::Arc::clone(&cluster);
                    let answer = tokio::task::spawn_blocking(move || c.strike(&request))
                        .await
                        .unwrap_or_else(|e| Err(e.to_string()));
                    answer_strike(&options.state_dir, &answer).map_err(io("answer a strike"))?;
                }
            }
        }
    };
    let t1 = Instant::now();
    tokio::task::spawn_blocking(move || cluster.stop())
        .await
        .map_err(|e| CliError::Io {
            what: "stop the control plane".into(),
            source: std::io::Error::other(e),
        })?;
    eprintln!(
        "ipkeep-e2e cluster: stopped in {:.1}s",
        t1.elapsed().as_secs_f64()
    );
    outcome
}

/// `cluster up`: starts the supervisor in the background and returns once the control plane is
/// ready (printing the `env` lines), or fails with the supervisor's log tail. Ctrl-C while
/// waiting stops it again.
pub async fn up(options: UpOptions) -> Result<(), CliError> {
    if let Some(line) = clear_stale(&options.state_dir)? {
        eprintln!("ipkeep-e2e cluster: {line}");
    }
    let t0 = Instant::now();
    let io = |what: String| move |source| CliError::Io { what, source };
    let exe = std::env::current_exe().map_err(io("find the ipkeep-e2e executable".into()))?;
    let log_path = supervisor_log(&options.state_dir);
    let log =
        std::fs::File::create(&log_path).map_err(io(format!("create {}", log_path.display())))?;
    let log2 = log
        .try_clone()
        .map_err(io(format!("open {}", log_path.display())))?;
    let mut command = Command::new(exe);
    command
        .args(["cluster", "up", "--foreground", "--state-dir"])
        .arg(&options.state_dir);
    if let Some(p) = options.apiserver_port {
        command.arg("--apiserver-port").arg(p.to_string());
    }
    if options.audit_log {
        command.arg("--audit-log");
    }
    if options.nodes > 0 {
        command.arg("--nodes").arg(options.nodes.to_string());
        command.arg("--cni").arg(options.cni.name());
        command.arg("--layout").arg(options.dirs.name());
        command
            .arg("--crio-nodes")
            .arg(options.crio_nodes.to_string());
    }
    let mut child = command
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        .process_group(0)
        .spawn()
        .map_err(io("start the control plane supervisor".into()))?;
    // With nodes, the control plane is ready long before them: wait for the nodes' file.
    let ready = if options.nodes > 0 {
        nodes_file(&options.state_dir)
    } else {
        options.state_dir.join("ready")
    };
    let mut interrupt = std::pin::pin!(tokio::signal::ctrl_c());
    loop {
        if ready.is_file() {
            break;
        }
        if let Some(status) = child
            .try_wait()
            .map_err(io("wait for the supervisor".into()))?
        {
            return Err(CliError::SupervisorExited {
                status,
                tail: supervisor_error(&log_path),
                log: log_path,
            });
        }
        tokio::select! {
            _ = &mut interrupt => {
                // The supervisor may not have written its owner file yet, so `down` alone could
                // miss it: kill it (its components and watchdog follow), then clean up.
                let _ = child.kill();
                let _ = child.wait();
                down(&options.state_dir)?;
                return Err(CliError::Interrupted);
            }
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
    eprintln!(
        "ipkeep-e2e cluster: up in {:.1}s (supervisor pid {}, log {}); stop it with: ipkeep-e2e cluster down",
        t0.elapsed().as_secs_f64(),
        child.id(),
        log_path.display()
    );
    print!("{}", env(&options.state_dir)?);
    Ok(())
}

fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.to_string_lossy().replace('\'', r"'\''"))
}

/// The `ready` file of the control plane running at `state_dir` (server, kubeconfig, ports, ...).
fn read_ready(state_dir: &Path) -> Result<serde_json::Value, CliError> {
    let ready = state_dir.join("ready");
    let text =
        std::fs::read_to_string(&ready).map_err(|_| CliError::NotRunning(state_dir.to_owned()))?;
    serde_json::from_str(&text).map_err(|e| CliError::Io {
        what: format!("read {}", ready.display()),
        source: std::io::Error::other(e),
    })
}

/// `cluster env`: the shell lines that point kubectl, helm and the tests at the running control
/// plane.
pub fn env(state_dir: &Path) -> Result<String, CliError> {
    let info = read_ready(state_dir)?;
    // The binaries this control plane runs, whatever the environment of this call says.
    let bins = match info["binDir"].as_str() {
        Some(dir) => PathBuf::from(dir),
        None => super::bin_dir()?,
    };
    Ok(format!(
        "export KUBECONFIG={}\nexport IPKEEP_CLUSTER_BIN_DIR={}\nexport PATH={}:\"$PATH\"\n# server {}\n",
        shell_quote(&state_dir.join("admin.kubeconfig")),
        shell_quote(&bins),
        shell_quote(&bins),
        info["server"].as_str().unwrap_or("?"),
    ))
}

/// Flags of `cluster fault-proxy`.
#[derive(Debug, Clone)]
pub struct FaultProxyOptions {
    /// Where the proxy listens.
    pub listen: std::net::SocketAddr,
    /// Where its control endpoint listens.
    pub admin: std::net::SocketAddr,
    /// A kubeconfig to rewrite through the proxy, and where to write the result.
    pub kubeconfig: Option<(PathBuf, PathBuf)>,
}

/// `cluster fault-proxy`: a fault proxy in front of the running control plane's API server
/// (its CA, its serving certificate shown to clients) with its control endpoint; prints both
/// URLs and serves until Ctrl-C or SIGTERM.
pub async fn fault_proxy(state_dir: &Path, options: FaultProxyOptions) -> Result<(), CliError> {
    let info = read_ready(state_dir)?;
    let pki = state_dir.join("pki");
    let proxy = crate::proxy::FaultProxy::start(crate::proxy::ProxyOptions {
        listen: options.listen,
        upstream: info["server"].as_str().unwrap_or_default().to_owned(),
        upstream_ca: pki.join("ca.crt"),
        cert: pki.join("serving.crt"),
        key: pki.join("serving.key"),
    })
    .await?;
    if let Some((from, to)) = &options.kubeconfig {
        proxy.kubeconfig_through(from, to)?;
    }
    let proxy = std::sync::Arc::new(proxy);
    let admin =
        crate::proxy::AdminServer::start(std::sync::Arc::clone(&proxy), options.admin).await?;
    println!("{}\nhttp://{}", proxy.url(), admin.addr());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|source| CliError::Io {
            what: "wait for SIGTERM".into(),
            source,
        })?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    Ok(())
}

/// `cluster down`: stops the supervisor (SIGTERM, then SIGKILL after 30 s), then kills any
/// component still recorded and removes the state directory and the supervisor log. Returns a
/// line saying what it did.
pub fn down(state_dir: &Path) -> Result<String, CliError> {
    let t0 = Instant::now();
    let log = supervisor_log(state_dir);
    let mut note = String::new();
    match inspect(state_dir)? {
        StateDir::Absent => {
            let _ = std::fs::remove_file(&log);
            return Ok(format!("no control plane at {}", state_dir.display()));
        }
        StateDir::Stale => {
            note = " (its supervisor was already gone: cleaned up after it)".into();
        }
        StateDir::Running(pid) if !mentions(pid, state_dir) => {
            return Err(CliError::NotOurs {
                dir: state_dir.to_owned(),
                why: "its owner is not a `cluster up` supervisor (a test process owns it, and it goes when that process ends)",
            });
        }
        StateDir::Running(pid) => {
            let target = i32::try_from(pid)
                .ok()
                .and_then(rustix::process::Pid::from_raw);
            if let Some(p) = target {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            while process_alive(pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            if process_alive(pid) {
                if let Some(p) = target {
                    let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                }
                note = format!(" (supervisor pid {pid} did not stop on SIGTERM: killed)");
            }
        }
    }
    if state_dir.symlink_metadata().is_ok() {
        kill_recorded_groups(state_dir);
        match std::fs::remove_dir_all(state_dir) {
            // The supervisor's watchdog may be removing it at the same moment.
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(CliError::Io {
                    what: format!("remove {}", state_dir.display()),
                    source: e,
                });
            }
            _ => {}
        }
    }
    let _ = std::fs::remove_file(&log);
    // Real nodes whose owner is gone (this supervisor, or a crashed test) leave containers,
    // namespaces, mounts and cgroups that only this removes.
    for line in realnode::cleanup_stale() {
        note.push_str(&format!("; {line}"));
    }
    Ok(format!(
        "stopped the control plane at {} in {:.1}s{note}",
        state_dir.display(),
        t0.elapsed().as_secs_f64()
    ))
}

/// A strike asked of the supervisor: which node, what.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct StrikeRequest {
    node: String,
    #[serde(flatten)]
    strike: realnode::node::Strike,
}

/// The file a strike request waits in, and the one its answer is written to.
fn strike_files(dir: &Path) -> (PathBuf, PathBuf) {
    (dir.join("strike.json"), dir.join("strike-answer.json"))
}

/// The waiting strike request, if any (taken: the file is removed).
fn take_strike(dir: &Path) -> Option<StrikeRequest> {
    let (request, _) = strike_files(dir);
    let text = std::fs::read_to_string(&request).ok()?;
    let _ = std::fs::remove_file(&request);
    serde_json::from_str(&text).ok()
}

/// Writes the answer to the strike just carried out (atomically: the asker polls for it).
fn answer_strike(dir: &Path, answer: &Result<(), String>) -> std::io::Result<()> {
    let (_, file) = strike_files(dir);
    let tmp = file.with_extension("tmp");
    let doc = match answer {
        Ok(()) => serde_json::json!({"ok": true}),
        Err(e) => serde_json::json!({"ok": false, "error": e}),
    };
    std::fs::write(&tmp, doc.to_string())?;
    std::fs::rename(&tmp, &file)
}

/// How long a strike may take (a reboot restarts every daemon of the node).
const STRIKE_DEADLINE: Duration = Duration::from_secs(300);

/// `cluster reboot NODE` and `cluster restart NODE DAEMON`: asks the running cluster's
/// supervisor, which owns the node's daemons, to strike the node, and waits for its answer.
pub fn strike(
    state_dir: &Path,
    node: &str,
    strike: realnode::node::Strike,
) -> Result<(), CliError> {
    running_node(state_dir, node)?;
    let (request, answer) = strike_files(state_dir);
    let io = |what: &str| {
        let what = what.to_owned();
        move |source| CliError::Io { what, source }
    };
    if request.exists() {
        return Err(CliError::Strike(format!(
            "another strike is waiting ({}); try again once it is done",
            request.display()
        )));
    }
    let _ = std::fs::remove_file(&answer);
    let doc = serde_json::to_string(&StrikeRequest {
        node: node.to_owned(),
        strike,
    })
    .map_err(|e| CliError::Strike(e.to_string()))?;
    let tmp = request.with_extension("tmp");
    std::fs::write(&tmp, doc)
        .and_then(|()| std::fs::rename(&tmp, &request))
        .map_err(io("write the strike request"))?;
    let t0 = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(&answer) {
            let _ = std::fs::remove_file(&answer);
            let doc: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            return match doc["ok"].as_bool() {
                Some(true) => {
                    eprintln!(
                        "ipkeep-e2e cluster: {node} struck in {:.1}s",
                        t0.elapsed().as_secs_f64()
                    );
                    Ok(())
                }
                _ => Err(CliError::Strike(
                    doc["error"].as_str().unwrap_or(&text).to_owned(),
                )),
            };
        }
        if owner(state_dir).is_none() {
            return Err(CliError::NotRunning(state_dir.to_owned()));
        }
        if t0.elapsed() > STRIKE_DEADLINE {
            let _ = std::fs::remove_file(&request);
            return Err(CliError::Strike(format!(
                "the supervisor did not answer within {}s (its log: {})",
                STRIKE_DEADLINE.as_secs(),
                supervisor_log(state_dir).display()
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `cluster load-image ARCHIVE`: imports an OCI archive into every node of the running
/// cluster; returns the image names it carries (`REPOSITORY:TAG`).
pub fn load_image(state_dir: &Path, archive: &Path) -> Result<Vec<String>, CliError> {
    Ok(realnode::load_image(&running_nodes(state_dir)?, archive)?)
}

/// `cluster exec NODE -- COMMAND...`: runs the command inside that node of the running cluster
/// (its network and mount namespaces), its stdio the caller's; returns how it exited.
pub fn exec(
    state_dir: &Path,
    node: &str,
    command: &[String],
) -> Result<std::process::ExitStatus, CliError> {
    let target = running_node(state_dir, node)?;
    let Some((program, args)) = command.split_first() else {
        return Err(CliError::Io {
            what: "run a command in a node".into(),
            source: std::io::Error::other("no command given after --"),
        });
    };
    realnode::host::node_command(target.node, &target.bin_dir, program)
        .args(args)
        .status()
        .map_err(|source| CliError::Io {
            what: format!("run {program} in node {node}"),
            source,
        })
}

/// The node named `node` of the cluster running at `state_dir`, or an error naming its nodes.
fn running_node(state_dir: &Path, node: &str) -> Result<realnode::node::RunningNode, CliError> {
    let nodes = running_nodes(state_dir)?;
    let names: Vec<String> = nodes.iter().map(|n| n.node.name()).collect();
    nodes
        .into_iter()
        .find(|n| n.node.name() == node)
        .ok_or_else(|| CliError::NoSuchNode {
            node: node.to_owned(),
            nodes: names.join(", "),
        })
}

/// The nodes of the cluster running at `state_dir` (each with its runtime, binaries and
/// configuration directory), from the `nodes.json` its supervisor wrote.
fn running_nodes(state_dir: &Path) -> Result<Vec<realnode::node::RunningNode>, CliError> {
    let file = nodes_file(state_dir);
    let text =
        std::fs::read_to_string(&file).map_err(|_| CliError::NoNodes(state_dir.to_owned()))?;
    let info: serde_json::Value = serde_json::from_str(&text).map_err(|e| CliError::Io {
        what: format!("read {}", file.display()),
        source: std::io::Error::other(e),
    })?;
    let not_ours = || CliError::NotOurs {
        dir: state_dir.to_owned(),
        why: "its nodes.json does not name a slot, a node count and a bin dir",
    };
    let slot = info["slot"]
        .as_u64()
        .and_then(|n| u8::try_from(n).ok())
        .and_then(realnode::Slot::new)
        .ok_or_else(not_ours)?;
    let count = info["nodes"]
        .as_u64()
        .and_then(|n| u8::try_from(n).ok())
        .ok_or_else(not_ours)?;
    let bin_dir = PathBuf::from(info["binDir"].as_str().ok_or_else(not_ours)?);
    let runtime = |i: u8| {
        info["runtimes"][usize::from(i)]
            .as_str()
            .and_then(|r| r.parse().ok())
            .unwrap_or_default()
    };
    Ok((0..count)
        .filter_map(|i| {
            let node = slot.node(i)?;
            Some(realnode::node::RunningNode {
                node,
                runtime: runtime(i),
                bin_dir: bin_dir.clone(),
                config_dir: state_dir.join("nodes").join(node.name()),
            })
        })
        .collect())
}
