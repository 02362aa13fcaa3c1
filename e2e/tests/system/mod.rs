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

pub use crate::shared::*;

use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicU32, Ordering},
    },
    time::SystemTime,
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

/// The CNI bin directory of a test's nodes, `<dir>/bin`: Debian's `bridge` and the built
/// `ipkeep` linked in.
pub fn cni_bin_dir(dir: &Path) -> PathBuf {
    let bin_dir = dir.join("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    host::link_cni_bin_dir(&bin_dir, Path::new(BRIDGE), &plugin_binary())
        .expect("link the CNI bin dir");
    bin_dir
}

/// A stand-in node `name` with `cidrs`, its data under `data`, the plugins of `bin_dir`, and its
/// agent (the built `ipkeep-operator`, probes on a port of its own) talking to the API server of
/// `kubeconfig`.
pub fn node_config(
    name: &str,
    cidrs: Vec<String>,
    data: &Path,
    bin_dir: &Path,
    kubeconfig: &Path,
) -> NodeConfig {
    let mut config = NodeConfig::new(name, cidrs, data.to_path_buf(), vec![bin_dir.to_path_buf()]);
    config.agent = Some(AgentConfig::on_own_port(
        operator_binary(),
        kubeconfig.to_path_buf(),
    ));
    config
}

/// The cluster a [`System`] talks to.
pub enum Target {
    /// The control plane these tests start (`cluster::shared()`).
    Sim(&'static Cluster),
    /// A real cluster with the chart installed: one named by `IPKEEP_E2E_KUBECONFIG`, or this test
    /// binary's real nodes (`realnode_scenarios.rs`).
    Real(ChartCluster),
}

/// A cluster with the chart installed: its kubeconfig and the kubectl to use.
#[derive(Debug, Clone)]
pub struct ChartCluster {
    /// Its kubeconfig.
    pub kubeconfig: PathBuf,
    /// The kubectl that talks to it.
    pub kubectl: PathBuf,
}

impl KubectlTarget for Target {
    fn kubectl_command(&self) -> Command {
        match self {
            Target::Sim(c) => c.kubectl(),
            Target::Real(real) => {
                let mut cmd = Command::new(&real.kubectl);
                cmd.arg("--kubeconfig").arg(&real.kubeconfig);
                cmd
            }
        }
    }
}

/// The variable that turns on real-cluster mode: the path of a kubeconfig of a cluster with the
/// chart installed. Deliberately not `KUBECONFIG`, so a developer's everyday kubeconfig never
/// makes `make test` touch their cluster.
pub const REAL_CLUSTER_ENV: &str = "IPKEEP_E2E_KUBECONFIG";

/// This test binary's own cluster with the chart installed, when it runs its scenarios on real
/// nodes (set once by [`run_on_chart_cluster`]).
static CHART_CLUSTER: OnceLock<ChartCluster> = OnceLock::new();

/// From now on, [`System::start`] puts the tests of this binary on `cluster` (the chart
/// installed on real nodes) as it does on a cluster named by `IPKEEP_E2E_KUBECONFIG`.
pub fn run_on_chart_cluster(cluster: ChartCluster) {
    CHART_CLUSTER.get_or_init(|| cluster);
}

/// The cluster with the chart installed the scenarios run on, if any: this binary's real nodes,
/// or a cluster named by `IPKEEP_E2E_KUBECONFIG` (with `IPKEEP_E2E_KUBECTL`, else `kubectl`).
pub fn real_cluster() -> Option<ChartCluster> {
    if let Some(c) = CHART_CLUSTER.get() {
        return Some(c.clone());
    }
    std::env::var_os(REAL_CLUSTER_ENV)
        .filter(|v| !v.is_empty())
        .map(|kubeconfig| ChartCluster {
            kubeconfig: PathBuf::from(kubeconfig),
            kubectl: std::env::var_os("IPKEEP_E2E_KUBECTL")
                .map_or_else(|| PathBuf::from("kubectl"), PathBuf::from),
        })
}

/// One `#[tokio::test]` per scenario `module::name` (an `async fn()`), each run where
/// [`System::start`] puts this binary's tests; with `before;`, that is awaited first (a
/// real-node binary's setup, whose result lives as long as the test).
#[macro_export]
macro_rules! scenario_tests {
    ($module:ident: $($name:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                $module::$name().await;
            }
        )+
    };
    ($before:expr; $module:ident: $($name:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let _setup = $before.await;
                $module::$name().await;
            }
        )+
    };
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

/// Starts a controller replica (the built binary) watching `ns`, electing its leader through the
/// Lease `ns/lease` (3 s), logging to `<dir>/<identity>.log`.
pub fn spawn_controller(
    kubeconfig: &Path,
    ns: &str,
    lease: &str,
    identity: &str,
    dir: &Path,
) -> Replica {
    let log = dir.join(format!("{identity}.log"));
    Replica::spawn(
        kubeconfig,
        identity,
        &[
            "--namespace",
            ns,
            "--lease-name",
            lease,
            "--lease-namespace",
            ns,
        ],
        Some(&log),
    )
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
    pub controllers: Vec<Replica>,
    /// The test's directory (node data, bin dir, logs), removed with it unless the test failed.
    pub dir: Scratch,
    lease: String,
    replicas_started: u32,
    /// When it started, to print how long the test took.
    started: std::time::Instant,
}

impl System {
    /// Starts the nodes (Ready and untainted) and the controllers in a fresh namespace.
    pub async fn start(prefix: &str, options: Options) -> System {
        if let Some(real) = real_cluster() {
            return System::on_chart_cluster(prefix, options, real).await;
        }
        require_root_and_tools();
        let cluster = cluster().await;
        let client = cluster.client().expect("an admin client");
        let ns = cluster
            .fresh_namespace(prefix)
            .await
            .unwrap_or_else(|e| panic!("{}", ipkeep_e2e::error_chain(&e)));
        let pid = std::process::id();
        let dir = Scratch::new(&format!("e2e-{ns}"));
        let bin_dir = cni_bin_dir(dir.path());
        let mut nodes = Vec::new();
        for i in 0..options.nodes {
            let seq = SEQ.fetch_add(1, Ordering::Relaxed);
            let mut cidrs = vec![v4_cidr(seq, options.v4_prefix)];
            if options.dual_stack {
                cidrs.push(format!("fd00:1:{}::/64", v4_third_octet(seq)));
            }
            let letter = (b'a' + i as u8) as char;
            let name = format!("{ns}-{letter}-{pid}");
            let config = node_config(
                &name,
                cidrs,
                &dir.join(format!("node-{letter}")),
                &bin_dir,
                cluster.kubeconfig_path(),
            );
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
            started: std::time::Instant::now(),
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
    pub async fn on_chart_cluster(prefix: &str, options: Options, real: ChartCluster) -> System {
        let kubeconfig = real.kubeconfig.clone();
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
        let dir = Scratch::new(&format!("e2e-{ns}"));
        System {
            target: Target::Real(real),
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
            started: std::time::Instant::now(),
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
            self.dir.path(),
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
        wait_for(&format!("node {name} Ready without taints"), || {
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

    /// Applies the StatefulSet `name` of `replicas` pods kept for an hour, placed on `node`, and
    /// waits until they run with their reservations Bound.
    pub async fn run_retained(
        &self,
        name: &str,
        replicas: u32,
        node: &str,
    ) -> BTreeMap<String, RunningPod> {
        self.apply(&statefulset(
            name,
            replicas,
            true,
            &[node],
            &retain(Some("1h")),
        ));
        let names: Vec<String> = (0..replicas).map(|i| format!("{name}-{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let pods = self.wait_running(&format!("app={name}"), &names).await;
        for p in pods.values() {
            self.wait_bound(p).await;
        }
        pods
    }

    /// Waits until exactly `names` run (with addresses) among pods matching `labels`.
    pub async fn wait_running(&self, labels: &str, names: &[&str]) -> BTreeMap<String, RunningPod> {
        let mut want: Vec<String> = names.iter().map(|s| (*s).to_owned()).collect();
        want.sort();
        wait_for(&format!("pods {want:?} Running with addresses"), || async {
            let running = self.running(labels).await;
            let got: Vec<String> = running.keys().cloned().collect();
            (got == want).then_some(running)
        })
        .await
    }

    /// Waits until `pod` runs with a UID other than `old_uid`, and returns it.
    pub async fn wait_recreated(&self, pod: &str, old_uid: &str) -> RunningPod {
        wait_for(&format!("{pod} re-created and Running"), || async {
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
        wait_for(
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
        wait_for(
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
        eprintln!(
            "{}: took {:.1}s",
            self.ns,
            self.started.elapsed().as_secs_f64()
        );
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

/// The annotations of a pod whose addresses are kept: `ipkeep.dev/retain: "true"` and, when
/// given, `ipkeep.dev/retain-for`.
pub fn retain(retain_for: Option<&'static str>) -> Vec<(&'static str, &'static str)> {
    let mut a = vec![("ipkeep.dev/retain", "true")];
    a.extend(retain_for.map(|r| ("ipkeep.dev/retain-for", r)));
    a
}

/// The workload image every real node has (`cluster up` imports it): busybox with `sh`, `ip`,
/// `httpd`, `wget` and `sleep`. The stand-in runs no container and ignores it.
pub const WORKLOAD_IMAGE: &str = "localhost/ipkeep-e2e/workload:1";

/// A StatefulSet `name` (label `app=<name>`), its template annotated with `annotations`, its pods
/// placed on `nodes` only; each pod serves the workload's page with busybox `httpd` on port 8080.
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
        image: {WORKLOAD_IMAGE}
        imagePullPolicy: Never
        command: [httpd, -f, -p, "8080", -h, /www]
"#
    )
}
