//! The whole system for the end-to-end scenarios (included with `#[path]`): the real control plane
//! (`ipkeep_e2e::cluster::shared()`), the IPReservation CRD, simulated nodes — each a kubelet
//! stand-in running Debian's `bridge` with the built `ipkeep` in network namespaces and its own
//! ipkeep agent (the built `ipkeep-operator agent`, supervised by the stand-in) — and the ipkeep
//! controller (the built binary, leader-elected, one or more replicas).
//!
//! Each test starts its own [`System`] in a fresh namespace with its own node names, CIDRs,
//! bridges and Lease, so the tests of one file run in parallel on one control plane. Dropping it
//! stops the nodes (every sandbox torn down, bridge removed, agent stopped), the controllers and
//! removes the directory, also when an assertion fails.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    collections::BTreeMap,
    future::Future,
    io::Write,
    net::IpAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use futures::StreamExt;
use ipkeep_e2e::{
    cluster::Cluster,
    node::{NodeConfig, agent::AgentConfig, host},
};
use ipkeep_operator::crd::{IPReservation, Phase};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::{Api, Client, ResourceExt, api::ListParams, runtime::watcher};

/// Debian's `bridge` plugin (package `containernetworking-plugins`).
pub const BRIDGE: &str = "/usr/lib/cni/bridge";

/// How long a scenario waits for one condition before it fails, naming the condition.
pub const DEADLINE: Duration = Duration::from_secs(90);

/// Fails the test, loudly, unless it runs as root with `ip`, `setpriv` and Debian's `bridge`.
pub fn require_root_and_tools() {
    assert!(
        host::is_root(),
        "the end-to-end scenarios create network namespaces and bridges: run them as root (CI does)"
    );
    assert!(
        Path::new(BRIDGE).is_file(),
        "{BRIDGE} is missing: install Debian's containernetworking-plugins (`make deps`)"
    );
    for tool in ["ip", "setpriv"] {
        assert!(
            Command::new(tool)
                .arg("-V")
                .output()
                .is_ok_and(|o| o.status.success()),
            "`{tool}` is missing: install iproute2 and util-linux (`make deps`)"
        );
    }
}

/// The built `ipkeep` plugin and `ipkeep-operator`, next to this test's `ipkeep-e2e` binary
/// (`cargo test --workspace` and `make test` build them; `IPKEEP_PLUGIN_BIN` overrides the
/// plugin). Fails loudly with the command to run when they are missing.
pub fn binaries() -> &'static (PathBuf, PathBuf) {
    static BINS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    BINS.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_BIN_EXE_ipkeep-e2e"))
            .parent()
            .unwrap()
            .to_path_buf();
        let plugin =
            std::env::var_os("IPKEEP_PLUGIN_BIN").map_or_else(|| dir.join("ipkeep"), PathBuf::from);
        let operator = dir.join("ipkeep-operator");
        for b in [&plugin, &operator] {
            assert!(
                b.is_file(),
                "no binary at {}: run `cargo build -p ipkeep-plugin -p ipkeep-operator` first",
                b.display()
            );
        }
        (plugin, operator)
    })
}

/// A script that runs the built `ipkeep-operator` with the stand-in's arguments and a probe
/// address of its own (several agents share this machine; the default port would collide).
pub fn agent_wrapper(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("ipkeep-operator-agent");
    let script = format!(
        "#!/bin/sh\nexec {} \"$@\" --probe-addr 127.0.0.1:0\n",
        binaries().1.display()
    );
    std::fs::write(&path, script).expect("write the agent wrapper");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// The control plane with the IPReservation CRD installed and established.
pub async fn cluster() -> &'static Cluster {
    let cluster = ipkeep_e2e::cluster::shared()
        .await
        .unwrap_or_else(|e| panic!("{}", ipkeep_e2e::error_chain(&e)));
    static CRD: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    CRD.get_or_init(|| async {
        let crd = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../crds/ipreservations.ipkeep.dev.yaml");
        kubectl_ok(cluster, &["apply", "-f", crd.to_str().unwrap()], None);
        kubectl_ok(
            cluster,
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd/ipreservations.ipkeep.dev",
            ],
            None,
        );
    })
    .await;
    cluster
}

/// Where kubectl runs: the test's own control plane, or (real-cluster mode) a cluster named by
/// a kubeconfig.
pub trait KubectlTarget {
    /// A kubectl command aimed at it.
    fn kubectl_command(&self) -> Command;
}

impl KubectlTarget for Cluster {
    fn kubectl_command(&self) -> Command {
        self.kubectl()
    }
}

/// The cluster a [`System`] talks to.
pub enum Target {
    /// The control plane these tests start (`cluster::shared()`).
    Sim(&'static Cluster),
    /// A real cluster with the chart installed, named by `IPKEEP_E2E_KUBECONFIG`.
    Real(PathBuf),
}

impl KubectlTarget for Target {
    fn kubectl_command(&self) -> Command {
        match self {
            Target::Sim(c) => c.kubectl(),
            Target::Real(kubeconfig) => {
                let mut cmd = Command::new(
                    std::env::var_os("IPKEEP_E2E_KUBECTL").unwrap_or_else(|| "kubectl".into()),
                );
                cmd.arg("--kubeconfig").arg(kubeconfig);
                cmd
            }
        }
    }
}

/// The variable that turns on real-cluster mode: the path of a kubeconfig of a cluster with the
/// chart installed. Deliberately not `KUBECONFIG`, so a developer's everyday kubeconfig never
/// makes `make test` touch their cluster.
pub const REAL_CLUSTER_ENV: &str = "IPKEEP_E2E_KUBECONFIG";

/// The kubeconfig of the real cluster, when real-cluster mode is on.
pub fn real_cluster() -> Option<PathBuf> {
    std::env::var_os(REAL_CLUSTER_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// For a scenario made only of the simulator's hooks: in real-cluster mode, says loudly that it
/// is skipped and why, and returns true (the test then returns).
pub fn skipped_on_real_cluster(test: &str, hooks: &str) -> bool {
    if real_cluster().is_none() {
        return false;
    }
    eprintln!(
        "SKIPPED on a real cluster: {test} needs the simulator's {hooks}; ran 0 checks (it runs without {REAL_CLUSTER_ENV})"
    );
    true
}

/// Runs kubectl against `target`.
pub fn kubectl(target: &impl KubectlTarget, args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = target.kubectl_command();
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("run kubectl");
    let mut pipe = child.stdin.take().expect("kubectl stdin");
    if let Some(text) = stdin {
        pipe.write_all(text.as_bytes())
            .expect("write kubectl stdin");
    }
    drop(pipe);
    child.wait_with_output().expect("wait for kubectl")
}

/// Runs kubectl and returns its stdout; fails the test with its output if it failed.
pub fn kubectl_ok(target: &impl KubectlTarget, args: &[&str], stdin: Option<&str>) -> String {
    let out = kubectl(target, args, stdin);
    assert!(
        out.status.success(),
        "kubectl {args:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls `check` every 100 ms until it returns `Some`, failing after [`DEADLINE`] with `what`.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "waited {DEADLINE:?} for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// The third octet of the `seq`-th node CIDR of this process: 32 per process (by pid), so two
/// test processes on one machine rarely collide.
fn v4_third_octet(seq: u32) -> u32 {
    (std::process::id() % 8) * 32 + seq % 32
}

/// The `seq`-th node CIDR of this process, in 198.19.0.0/16 (the benchmarking range, never routed;
/// the stand-in's own tests use 198.18.0.0/16): `198.19.<n>.0/<prefix>`.
pub fn v4_cidr(seq: u32, prefix: u8) -> String {
    format!("198.19.{}.0/{prefix}", v4_third_octet(seq))
}

/// A node CIDR of this process no other [`System`] node has.
pub fn next_v4_cidr() -> String {
    v4_cidr(SEQ.fetch_add(1, Ordering::Relaxed), 24)
}

/// One simulated node: a stand-in with its agent, on its own thread and runtime so it can be
/// stopped and started again (a node restart) independently of the test's runtime.
pub struct SimNode {
    /// Its configuration (name, CIDRs, data directory, network).
    pub config: NodeConfig,
    kube: kube::Config,
    running: Option<Running>,
}

/// A running stand-in: its stop signal and its thread.
type Running = (
    tokio::sync::oneshot::Sender<()>,
    std::thread::JoinHandle<Result<(), String>>,
);

impl SimNode {
    /// A node of that configuration talking to the API server of `kube` (not started).
    pub fn new(config: NodeConfig, kube: kube::Config) -> SimNode {
        SimNode {
            config,
            kube,
            running: None,
        }
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Starts the stand-in (registers the Node, starts the agent).
    pub fn start(&mut self) {
        assert!(self.running.is_none(), "node {} already runs", self.name());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let config = self.config.clone();
        let kube = self.kube.clone();
        let name = self.config.name.clone();
        let thread = std::thread::Builder::new()
            .name(format!("node-{name}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .map_err(|e| format!("runtime for node {name}: {e}"))?;
                rt.block_on(async move {
                    let client = Client::try_from(kube)
                        .map_err(|e| format!("client for node {name}: {e}"))?;
                    ipkeep_e2e::node::run(client, config, async {
                        let _ = rx.await;
                    })
                    .await
                    .map_err(|e| format!("node {name}: {}", ipkeep_e2e::error_chain(&e)))
                })
            })
            .expect("spawn a node thread");
        self.running = Some((tx, thread));
    }

    /// Stops the stand-in as SIGTERM would: every sandbox torn down, bridge removed, agent
    /// stopped. Fails the test if the stand-in ended with an error.
    pub fn stop(&mut self) {
        if let Some(r) = self.stop_quietly() {
            r.unwrap_or_else(|e| panic!("{e}"));
        }
    }

    fn stop_quietly(&mut self) -> Option<Result<(), String>> {
        let (tx, thread) = self.running.take()?;
        let _ = tx.send(());
        Some(
            thread
                .join()
                .unwrap_or_else(|_| Err(format!("node {} panicked", self.config.name))),
        )
    }

    /// The reservation file of `ns/pod` on this node.
    pub fn reserved_file(&self, ns: &str, pod: &str) -> PathBuf {
        self.config
            .network_dir()
            .join("reserved")
            .join(ns)
            .join(pod)
    }

    /// The pids of this node's agent processes (children of this test process running
    /// `ipkeep-operator agent --node-name <name>`).
    pub fn agent_pids(&self) -> Vec<u32> {
        let me = std::process::id().to_string();
        let mut pids = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .unwrap_or("");
            if ppid != me {
                continue;
            }
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            if args.iter().any(|a| a == "agent")
                && args
                    .windows(2)
                    .any(|w| w[0] == "--node-name" && w[1] == self.config.name)
            {
                pids.push(pid);
            }
        }
        pids
    }
}

impl Drop for SimNode {
    fn drop(&mut self) {
        if let Some(Err(e)) = self.stop_quietly() {
            eprintln!("{e}");
        }
    }
}

/// One controller replica: the built binary in its own process, killed with this test process.
pub struct Controller {
    /// Its identity in the Lease.
    pub identity: String,
    child: Child,
    /// Its log file.
    pub log: PathBuf,
}

impl Controller {
    /// Kills it (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts a controller replica (the built binary) watching `ns`, electing its leader through the
/// Lease `ns/lease` (3 s), logging to `<dir>/<identity>.log`.
pub fn spawn_controller(
    kubeconfig: &Path,
    ns: &str,
    lease: &str,
    identity: &str,
    dir: &Path,
) -> Controller {
    let (_, operator) = binaries();
    let log = dir.join(format!("{identity}.log"));
    let file = std::fs::File::create(&log).expect("controller log");
    // setpriv: the kernel kills the replica if this test process dies without dropping it.
    let child = Command::new("setpriv")
        .args(["--pdeathsig", "KILL", "--"])
        .arg(operator)
        .args([
            "controller",
            "--namespace",
            ns,
            "--lease-name",
            lease,
            "--lease-namespace",
            ns,
            "--lease-duration",
            "3",
            "--identity",
            identity,
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .expect("start ipkeep-operator controller");
    Controller {
        identity: identity.to_owned(),
        child,
        log,
    }
}

/// What a test asks of its system.
#[derive(Debug, Clone)]
pub struct Options {
    /// Number of nodes (each with its agent).
    pub nodes: usize,
    /// Controller replicas.
    pub controllers: usize,
    /// Dual-stack nodes (an IPv4 and an IPv6 CIDR each).
    pub dual_stack: bool,
    /// The IPv4 prefix length of each node's CIDR (24 by default; 29 for a tiny range).
    pub v4_prefix: u8,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            nodes: 2,
            controllers: 1,
            dual_stack: false,
            v4_prefix: 24,
        }
    }
}

/// The whole system of one test.
pub struct System {
    /// The cluster: the test's control plane, or a real one (`IPKEEP_E2E_KUBECONFIG`).
    pub target: Target,
    /// An admin client (on the test's runtime).
    pub client: Client,
    /// The test's namespace (the controllers watch only it).
    pub ns: String,
    /// The simulated nodes (none on a real cluster).
    pub nodes: Vec<SimNode>,
    /// The names of the test's nodes: the simulated ones, or a real cluster's schedulable nodes.
    pub node_names: Vec<String>,
    /// Whether the test's nodes are dual-stack (asked for, or found on a real cluster).
    pub dual_stack: bool,
    /// The checks of the test: (what, the hook it needed when skipped).
    checks: Mutex<Vec<(String, Option<String>)>>,
    /// The controller replicas.
    pub controllers: Vec<Controller>,
    /// The test's directory (node data, bin dir, logs).
    pub dir: PathBuf,
    lease: String,
    replicas_started: u32,
}

impl System {
    /// Starts the nodes (Ready and untainted) and the controllers in a fresh namespace.
    pub async fn start(prefix: &str, options: Options) -> System {
        if let Some(kubeconfig) = real_cluster() {
            return System::on_real_cluster(prefix, options, kubeconfig).await;
        }
        require_root_and_tools();
        let (plugin, _) = binaries();
        let cluster = cluster().await;
        let client = cluster.client().expect("an admin client");
        let ns = cluster
            .fresh_namespace(prefix)
            .await
            .unwrap_or_else(|e| panic!("{}", ipkeep_e2e::error_chain(&e)));
        let pid = std::process::id();
        let dir = std::env::temp_dir().join(format!("ipkeep-e2e-{ns}-{pid}"));
        let _ = std::fs::remove_dir_all(&dir);
        let bin_dir = dir.join("bin");
        std::fs::create_dir_all(&bin_dir).unwrap();
        host::link_cni_bin_dir(&bin_dir, Path::new(BRIDGE), plugin).expect("link the CNI bin dir");
        let agent = agent_wrapper(&dir);
        let mut nodes = Vec::new();
        for i in 0..options.nodes {
            let seq = SEQ.fetch_add(1, Ordering::Relaxed);
            let mut cidrs = vec![v4_cidr(seq, options.v4_prefix)];
            if options.dual_stack {
                cidrs.push(format!("fd00:1:{}::/64", v4_third_octet(seq)));
            }
            let letter = (b'a' + i as u8) as char;
            let name = format!("{ns}-{letter}-{pid}");
            let mut config = NodeConfig::new(
                &name,
                cidrs,
                dir.join(format!("node-{letter}")),
                vec![bin_dir.clone()],
            );
            config.agent = Some(AgentConfig {
                bin: agent.clone(),
                kubeconfig: Some(cluster.kubeconfig_path().to_path_buf()),
            });
            let mut node = SimNode::new(config, cluster.config());
            node.start();
            nodes.push(node);
        }
        let node_names = nodes.iter().map(|n| n.name().to_owned()).collect();
        let mut system = System {
            target: Target::Sim(cluster),
            client,
            node_names,
            dual_stack: options.dual_stack,
            checks: Mutex::default(),
            lease: format!("ipkeep-{ns}"),
            ns,
            nodes,
            controllers: Vec::new(),
            dir,
            replicas_started: 0,
        };
        for i in 0..system.nodes.len() {
            system.wait_node_schedulable(i).await;
        }
        for _ in 0..options.controllers {
            system.start_controller();
        }
        system
    }

    /// Real-cluster mode: a client from `kubeconfig`, the chart's CRD checked (not applied), the
    /// cluster's Ready untainted nodes instead of simulated ones, no controller started (the
    /// chart's runs), a fresh namespace.
    async fn on_real_cluster(prefix: &str, options: Options, kubeconfig: PathBuf) -> System {
        let config = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap_or_else(|e| {
            panic!(
                "{REAL_CLUSTER_ENV}={}: failed to read the kubeconfig: {e}",
                kubeconfig.display()
            )
        });
        let config = kube::Config::from_custom_kubeconfig(config, &Default::default())
            .await
            .unwrap_or_else(|e| panic!("failed to load {}: {e}", kubeconfig.display()));
        let client = Client::try_from(config).expect("a client for the real cluster");
        let crds: Api<
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        > = Api::all(client.clone());
        let crd = crds
            .get_opt("ipreservations.ipkeep.dev")
            .await
            .unwrap_or_else(|e| panic!("failed to read the IPReservation CRD: {e}"));
        assert!(
            crd.is_some(),
            "{REAL_CLUSTER_ENV} is set but the cluster has no CRD ipreservations.ipkeep.dev: install the chart first: helm install ipkeep charts/ipkeep --namespace ipkeep-system --create-namespace"
        );
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
        let mut usable: Vec<(String, usize)> = nodes
            .list(&ListParams::default())
            .await
            .expect("list the cluster's nodes")
            .items
            .into_iter()
            .filter(schedulable)
            .map(|n| {
                let cidrs = n
                    .spec
                    .as_ref()
                    .and_then(|s| s.pod_cidrs.clone())
                    .unwrap_or_default();
                (n.name_any(), cidrs.len())
            })
            .collect();
        usable.sort();
        assert!(
            usable.len() >= options.nodes,
            "the real cluster has {} Ready untainted nodes, this test needs {}",
            usable.len(),
            options.nodes
        );
        usable.truncate(options.nodes);
        let ns_api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
        let mut ns_obj = k8s_openapi::api::core::v1::Namespace::default();
        ns_obj.metadata.generate_name = Some(format!("ipkeep-e2e-{prefix}-"));
        let ns = ns_api
            .create(&Default::default(), &ns_obj)
            .await
            .expect("create the test's namespace")
            .name_any();
        eprintln!(
            "real-cluster mode ({REAL_CLUSTER_ENV}={}): namespace {ns}, nodes {:?}; no control plane, nodes, agents or controller started",
            kubeconfig.display(),
            usable.iter().map(|(n, _)| n).collect::<Vec<_>>()
        );
        let dir = std::env::temp_dir().join(format!("ipkeep-e2e-{ns}-{}", std::process::id()));
        System {
            target: Target::Real(kubeconfig),
            client,
            lease: format!("ipkeep-{ns}"),
            ns,
            nodes: Vec::new(),
            dual_stack: options.dual_stack && usable.iter().all(|(_, c)| *c >= 2),
            node_names: usable.into_iter().map(|(n, _)| n).collect(),
            checks: Mutex::default(),
            controllers: Vec::new(),
            dir,
            replicas_started: 0,
        }
    }

    /// Whether this runs on a real cluster (`IPKEEP_E2E_KUBECONFIG`).
    pub fn real(&self) -> bool {
        matches!(self.target, Target::Real(_))
    }

    /// The name of the test's `i`-th node.
    pub fn node_name(&self, i: usize) -> &str {
        &self.node_names[i]
    }

    /// Records an API-visible check (it runs in both modes).
    pub fn check(&self, what: &str) {
        self.checks.lock().unwrap().push((what.to_owned(), None));
    }

    /// A check that needs the simulator's `hook`: true on the simulator; on a real cluster it
    /// says loudly (once per hook) that it is skipped and returns false.
    pub fn hook(&self, what: &str, hook: &str) -> bool {
        let mut checks = self.checks.lock().unwrap();
        if !self.real() {
            checks.push((what.to_owned(), None));
            return true;
        }
        if !checks.iter().any(|(w, h)| w == what && h.is_some()) {
            eprintln!("skipped on a real cluster: {what} needs the simulator's {hook}");
            checks.push((what.to_owned(), Some(hook.to_owned())));
        }
        false
    }

    /// The summary of the test's checks: "ran N of M checks; skipped: ...".
    pub fn summary(&self) -> String {
        let checks = self.checks.lock().unwrap();
        let mut seen: Vec<&(String, Option<String>)> = Vec::new();
        for c in checks.iter() {
            if !seen.contains(&c) {
                seen.push(c);
            }
        }
        let skipped: Vec<&str> = seen
            .iter()
            .filter(|(_, h)| h.is_some())
            .map(|(w, _)| w.as_str())
            .collect();
        format!(
            "ran {} of {} checks; skipped: {}",
            seen.len() - skipped.len(),
            seen.len(),
            if skipped.is_empty() {
                "none".to_owned()
            } else {
                skipped.join(", ")
            }
        )
    }

    /// Starts one more controller replica.
    pub fn start_controller(&mut self) {
        let Target::Sim(cluster) = self.target else {
            panic!("a real cluster runs the chart's controller; the test cannot start one");
        };
        self.replicas_started += 1;
        let identity = format!("{}-controller-{}", self.ns, self.replicas_started);
        let c = spawn_controller(
            cluster.kubeconfig_path(),
            &self.ns,
            &self.lease,
            &identity,
            &self.dir,
        );
        self.controllers.push(c);
    }

    /// The Lease's current holder.
    pub async fn leader(&self) -> Option<String> {
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(self.client.clone(), &self.ns);
        leases
            .get_opt(&self.lease)
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
    }

    async fn wait_node_schedulable(&self, i: usize) {
        let name = self.nodes[i].name().to_owned();
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        eventually(&format!("node {name} Ready without taints"), || {
            let nodes = nodes.clone();
            let name = name.clone();
            async move {
                let node = nodes.get_opt(&name).await.ok()??;
                schedulable(&node).then_some(())
            }
        })
        .await;
    }

    /// kubectl in the test's namespace.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", self.ns.as_str()];
        all.extend_from_slice(args);
        kubectl_ok(&self.target, &all, None)
    }

    /// `kubectl apply -f -` of `yaml` in the test's namespace.
    pub fn apply(&self, yaml: &str) -> String {
        kubectl_ok(
            &self.target,
            &["-n", &self.ns, "apply", "-f", "-"],
            Some(yaml),
        )
    }

    /// Pods of the namespace.
    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Reservations of the namespace.
    pub fn reservations(&self) -> Api<IPReservation> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// The running pods with addresses matching `labels`: name → what they are.
    pub async fn running(&self, labels: &str) -> BTreeMap<String, RunningPod> {
        let list = self
            .pods()
            .list(&ListParams::default().labels(labels))
            .await
            .expect("list pods");
        list.items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| RunningPod::of(&p))
            .map(|r| (r.name.clone(), r))
            .collect()
    }

    /// Waits until exactly `names` run (with addresses) among pods matching `labels`.
    pub async fn wait_running(&self, labels: &str, names: &[&str]) -> BTreeMap<String, RunningPod> {
        let mut want: Vec<String> = names.iter().map(|s| (*s).to_owned()).collect();
        want.sort();
        eventually(&format!("pods {want:?} Running with addresses"), || async {
            let running = self.running(labels).await;
            let got: Vec<String> = running.keys().cloned().collect();
            (got == want).then_some(running)
        })
        .await
    }

    /// Waits until `pod` runs with a UID other than `old_uid`, and returns it.
    pub async fn wait_recreated(&self, pod: &str, old_uid: &str) -> RunningPod {
        eventually(&format!("{pod} re-created and Running"), || async {
            let p = self.pods().get_opt(pod).await.ok()??;
            let r = RunningPod::of(&p)?;
            (r.uid != old_uid && p.metadata.deletion_timestamp.is_none()).then_some(r)
        })
        .await
    }

    /// Waits until the reservation of `pod` satisfies `check`.
    pub async fn wait_reservation(
        &self,
        pod: &str,
        what: &str,
        check: impl Fn(&IPReservation) -> bool,
    ) -> IPReservation {
        eventually(
            &format!("reservation {}/{pod}: {what}", self.ns),
            || async {
                let r = self.reservations().get_opt(pod).await.ok()??;
                check(&r).then_some(r)
            },
        )
        .await
    }

    /// Waits until the reservation of `pod` is Bound to `uid` with `ips`.
    pub async fn wait_bound(&self, pod: &RunningPod) -> IPReservation {
        let want: Vec<String> = pod.ips.iter().map(|i| i.to_string()).collect();
        self.wait_reservation(
            &pod.name,
            &format!("Bound to {} with {want:?}", pod.uid),
            |r| {
                phase(r) == Some(Phase::Bound)
                    && r.status.as_ref().and_then(|s| s.pod_uid.as_deref())
                        == Some(pod.uid.as_str())
                    && ips(r) == want
                    && r.spec.node_name == pod.node
            },
        )
        .await
    }

    /// Waits until `path` exists (`present`) or is gone.
    pub async fn wait_file(&self, path: &Path, present: bool) {
        eventually(
            &format!(
                "{} to {}",
                path.display(),
                if present { "exist" } else { "be gone" }
            ),
            || async { (path.exists() == present).then_some(()) },
        )
        .await;
    }

    /// The node of that name.
    pub fn node(&self, name: &str) -> &SimNode {
        self.nodes
            .iter()
            .find(|n| n.name() == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// Events of the namespace about `kind`/`name`.
    pub async fn events(&self, kind: &str, name: &str) -> Vec<Event> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), &self.ns);
        events
            .list(&ListParams::default())
            .await
            .expect("list events")
            .items
            .into_iter()
            .filter(|e| {
                e.involved_object.kind.as_deref() == Some(kind)
                    && e.involved_object.name.as_deref() == Some(name)
            })
            .collect()
    }

    /// Records every change of the namespace's reservations from now on, in order.
    pub fn record_reservations(&self) -> History {
        let log: Arc<Mutex<Vec<(SystemTime, Change)>>> = Arc::default();
        let history = log.clone();
        let api = self.reservations();
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, watcher::Config::default()).boxed();
            while let Some(ev) = stream.next().await {
                let at = SystemTime::now();
                let mut log = log.lock().unwrap();
                match ev {
                    Ok(watcher::Event::Apply(r) | watcher::Event::InitApply(r)) => {
                        log.push((at, Change::Applied(r)))
                    }
                    Ok(watcher::Event::Delete(r)) => log.push((at, Change::Deleted(r))),
                    Ok(_) => {}
                    Err(e) => log.push((at, Change::Error(e.to_string()))),
                }
            }
        });
        History(history, Some(Arc::new(task)))
    }
}

impl Drop for System {
    fn drop(&mut self) {
        if !self.checks.lock().unwrap().is_empty() {
            eprintln!("{}: {}", self.ns, self.summary());
        }
        if self.real() {
            // The namespace and everything in it go; the chart's controller and agents stay.
            let out = kubectl(
                &self.target,
                &["delete", "namespace", &self.ns, "--wait=false"],
                None,
            );
            if !out.status.success() {
                eprintln!(
                    "failed to delete namespace {}: {}",
                    self.ns,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            return;
        }
        for c in &mut self.controllers {
            c.kill();
        }
        for n in &mut self.nodes {
            if let Some(Err(e)) = n.stop_quietly() {
                eprintln!("{e}");
            }
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("logs kept in {}", self.dir.display());
        }
    }
}

/// A reservation change seen by [`System::record_reservations`].
#[derive(Debug, Clone)]
pub enum Change {
    /// Created or updated.
    Applied(IPReservation),
    /// Deleted.
    Deleted(IPReservation),
    /// The watch failed (it retries).
    Error(String),
}

/// The recorded changes, each with the moment it arrived.
#[derive(Default, Clone)]
pub struct History(
    Arc<Mutex<Vec<(SystemTime, Change)>>>,
    Option<Arc<tokio::task::JoinHandle<()>>>,
);

impl History {
    /// The changes so far.
    pub fn changes(&self) -> Vec<(SystemTime, Change)> {
        self.0.lock().unwrap().clone()
    }

    /// The successive phases of `name` (consecutive repeats folded; `None` for a delete).
    pub fn phases(&self, name: &str) -> Vec<Option<Phase>> {
        let mut out: Vec<Option<Phase>> = Vec::new();
        for (_, c) in self.changes() {
            let p = match &c {
                Change::Applied(r) if r.name_any() == name => phase(r),
                Change::Deleted(r) if r.name_any() == name => None,
                _ => continue,
            };
            if matches!(c, Change::Applied(_)) && p.is_none() {
                continue;
            }
            if out.last() != Some(&p) {
                out.push(p);
            }
        }
        out
    }
}

impl History {
    /// The successive (phase, podUID) of `name` (consecutive repeats folded; a delete is
    /// `(None, None)`).
    pub fn bindings(&self, name: &str) -> Vec<(Option<Phase>, Option<String>)> {
        let mut out: Vec<(Option<Phase>, Option<String>)> = Vec::new();
        for (_, c) in self.changes() {
            let b = match &c {
                Change::Applied(r) if r.name_any() == name => {
                    (phase(r), r.status.as_ref().and_then(|s| s.pod_uid.clone()))
                }
                Change::Deleted(r) if r.name_any() == name => (None, None),
                _ => continue,
            };
            if matches!(c, Change::Applied(_)) && b.0.is_none() {
                continue;
            }
            if out.last() != Some(&b) {
                out.push(b);
            }
        }
        out
    }

    /// Whether any reservation was deleted.
    pub fn any_deleted(&self) -> bool {
        self.changes()
            .iter()
            .any(|(_, c)| matches!(c, Change::Deleted(_)))
    }
}

impl Drop for History {
    fn drop(&mut self) {
        if let Some(task) = &self.1
            && Arc::strong_count(task) == 1
        {
            task.abort();
        }
    }
}

/// A running pod's identity and addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningPod {
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: String,
    /// Its node.
    pub node: String,
    /// `status.podIPs`, in order.
    pub ips: Vec<IpAddr>,
}

impl RunningPod {
    /// The pod if it is Running with addresses.
    pub fn of(p: &Pod) -> Option<RunningPod> {
        let status = p.status.as_ref()?;
        if status.phase.as_deref() != Some("Running") {
            return None;
        }
        let ips: Vec<IpAddr> = status
            .pod_ips
            .as_ref()?
            .iter()
            .filter_map(|i| i.ip.parse().ok())
            .collect();
        if ips.is_empty() {
            return None;
        }
        Some(RunningPod {
            name: p.name_any(),
            uid: p.metadata.uid.clone()?,
            node: p.spec.as_ref()?.node_name.clone()?,
            ips,
        })
    }
}

/// Whether a node is Ready without taints.
pub fn schedulable(node: &k8s_openapi::api::core::v1::Node) -> bool {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| !t.is_empty());
    ready && !tainted
}

/// A reservation's phase.
pub fn phase(r: &IPReservation) -> Option<Phase> {
    r.status.as_ref().and_then(|s| s.phase)
}

/// A reservation's addresses as text.
pub fn ips(r: &IPReservation) -> Vec<String> {
    r.spec.ips.iter().map(|i| i.0.clone()).collect()
}

/// A StatefulSet `name` (label `app=<name>`), its template annotated with `annotations`, its pods
/// placed on `nodes` only.
pub fn statefulset(
    name: &str,
    replicas: u32,
    parallel: bool,
    nodes: &[&str],
    annotations: &[(&str, &str)],
) -> String {
    let policy = if parallel { "Parallel" } else { "OrderedReady" };
    let nodes = nodes
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let annotations = annotations
        .iter()
        .map(|(k, v)| format!("\"{k}\": \"{v}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {name}
spec:
  serviceName: {name}
  replicas: {replicas}
  podManagementPolicy: {policy}
  selector:
    matchLabels: {{app: {name}}}
  template:
    metadata:
      labels: {{app: {name}}}
      annotations: {{{annotations}}}
    spec:
      terminationGracePeriodSeconds: 1
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions:
              - {{key: kubernetes.io/hostname, operator: In, values: [{nodes}]}}
      containers:
      - name: app
        image: registry.invalid/none:1
"#
    )
}
