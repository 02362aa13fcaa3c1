//! Real nodes with ipkeep installed the way the README tells a user, for the `realnode` test
//! binary (`e2e/tests/realnode/`, one module per suite): a control plane and real nodes
//! (`crate::cluster::realnode`: kubelet, containerd or CRI-O, kube-proxy per node), `make
//! image`'s archive imported into every node, and `helm install` from `charts/ipkeep` with that
//! image and `cni.replaceHostLocal=true`. Each test then works in a [`System`] of its own
//! namespace on those nodes, with the chart's controller and agents.
//!
//! A test says which [`Shape`] of cluster it needs ([`use_shape`], [`use_nodes`]: how many
//! nodes, dual-stack, a tiny node, flannel, CRI-O, the k3s layout, the chart or not) and how it
//! holds it ([`Access`]). One cluster runs at a time: the tests of its shape share it; a test of
//! another shape waits until they are done, then the cluster is stopped — everything it made
//! removed — and one of the new shape started. The last one is removed when the binary exits:
//! the control plane's watchdog sees its owner gone and runs `ipkeep-e2e cluster reap-nodes`;
//! after a crash of even the watchdog, the next start (or `cluster down`) removes it.
//!
//! With `IPKEEP_E2E_KUBECONFIG` set, [`use_shape`] starts nothing and the scenarios run on that
//! cluster instead, each check of the binary's own nodes' disks skipped with one line.
//!
//! Needs root, `make cluster-bins`, `make node-bins` and `make image` (or
//! `IPKEEP_IMAGE_ARCHIVE`); fails loudly, naming what to run, without them.

pub mod registry;

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    time::Instant,
};

use crate::cluster::realnode::{
    Cluster, ClusterOptions, NodeCni, NodeDirs, PodNetwork, RealNode, TINY_TAINT,
    layout::CNI_NETWORK,
};

use super::{
    kubectl, kubectl_ok, run_ok,
    system::{ChartCluster, Options, RunningPod, System, on_users_cluster, run_on_chart_cluster},
    wait_for,
};

/// The chart's release name and namespace, as in the README.
pub const RELEASE: &str = "ipkeep";
/// The release's namespace.
pub const RELEASE_NS: &str = "ipkeep-system";

/// The image archive `make image` writes (`IPKEEP_IMAGE_ARCHIVE` overrides it).
pub fn image_archive() -> PathBuf {
    let path = std::env::var_os("IPKEEP_IMAGE_ARCHIVE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| super::repo_root().join("target/image/ipkeep.oci.tar"));
    assert!(
        path.is_file(),
        "{} is missing: run `make image` (or set IPKEEP_IMAGE_ARCHIVE)",
        path.display()
    );
    path
}

/// The label the README's install gives the release's namespace: the agent (hostPath, root,
/// host networking) is refused by Pod Security's `baseline`, which the harness's control planes
/// enforce by default as a hardened cluster does.
pub const PRIVILEGED: &str = "pod-security.kubernetes.io/enforce=privileged";

/// Creates the release's namespace with [`PRIVILEGED`] (or labels it, when it exists).
pub fn release_namespace(c: &Cluster) {
    let (key, value) = PRIVILEGED.split_once('=').expect("a label is key=value");
    kubectl_ok(
        c.plane(),
        &["apply", "-f", "-"],
        Some(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {RELEASE_NS}\n  labels:\n    {key}: {value}\n"
        )),
    );
}

/// The chart's values for the imported image: what a local install without a registry sets.
pub fn image_values(reference: &str) -> Vec<String> {
    let (repository, tag) = reference
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("the archive's image {reference} has no tag"));
    vec![
        format!("image.repository={repository}"),
        format!("image.tag={tag}"),
        "image.pullPolicy=Never".to_owned(),
    ]
}

/// helm against the cluster; its stdout, or the test fails with its output.
pub fn helm(c: &Cluster, args: &[&str]) -> String {
    run_ok(c.plane().helm(), args, None)
}

/// `helm upgrade --install` of the chart with the image `values` and `extra` arguments, then
/// waits until every pod of the release is Ready.
pub async fn install(c: &Cluster, values: &[String], extra: &[&str]) {
    let chart = super::chart_dir();
    let mut args = vec![
        "upgrade",
        "--install",
        RELEASE,
        chart.to_str().expect("a UTF-8 path"),
        "--namespace",
        RELEASE_NS,
        "--wait",
        "--timeout",
        "3m",
    ];
    for v in values {
        args.extend(["--set", v.as_str()]);
    }
    args.extend(extra);
    release_namespace(c);
    helm(c, &args);
    release_ready(c).await;
}

/// Waits until the release's controller Deployment and agent DaemonSet have rolled out: every
/// replica updated and Ready, an agent on every node.
pub async fn release_ready(c: &Cluster) {
    for workload in ["daemonset/ipkeep-agent", "deployment/ipkeep-controller"] {
        kubectl_ok(
            c.plane(),
            &[
                "-n",
                RELEASE_NS,
                "rollout",
                "status",
                workload,
                "--timeout=180s",
            ],
            None,
        );
    }
}

/// The installed real nodes as a cluster with the chart.
fn chart_cluster(c: &Cluster) -> ChartCluster {
    ChartCluster {
        kubeconfig: c.plane().kubeconfig_path().to_path_buf(),
        kubectl: c.plane().bin("kubectl"),
    }
}

/// The README's install: `host-local` replaced by ipkeep.
pub const REPLACE_HOST_LOCAL: &[&str] = &["--set", "cni.replaceHostLocal=true"];

/// What a test needs of the real nodes: how many, their pods' network, and whether the chart is
/// installed on them (with which `helm install` arguments besides the image's). Tests of equal
/// shapes share one cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// How many nodes.
    pub nodes: u8,
    /// Their pods' network.
    pub network: PodNetwork,
    /// The chart installed with these arguments; `None`: nothing installed (the test installs
    /// what it needs, and leaves the cluster changed: see [`Access::Spoils`]).
    pub chart: Option<&'static [&'static str]>,
}

impl Shape {
    /// `nodes` nodes with `network`, the chart installed as the README says.
    pub const fn chart(nodes: u8, network: PodNetwork) -> Shape {
        Shape {
            nodes,
            network,
            chart: Some(REPLACE_HOST_LOCAL),
        }
    }

    /// `nodes` nodes with `network` and nothing installed.
    pub const fn bare(nodes: u8, network: PodNetwork) -> Shape {
        Shape {
            nodes,
            network,
            chart: None,
        }
    }

    /// Two plain containerd nodes with the chart installed as the README says: the default.
    pub const fn default_chart() -> Shape {
        Shape::chart(2, PLAIN)
    }
}

/// Containerd nodes on the bridge network in the standard layout, IPv4 only.
pub const PLAIN: PodNetwork = PodNetwork {
    dual_stack: false,
    tiny_nodes: 0,
    cni: NodeCni::Bridge,
    dirs: NodeDirs::Standard,
    crio_nodes: 0,
    k3s_nodes: 0,
};

/// Containerd nodes with real flannel (kube-flannel's conflist) in the standard layout, IPv4 only.
pub const FLANNEL: PodNetwork = PodNetwork {
    cni: NodeCni::Flannel,
    ..PLAIN
};

/// The same laid out as k3s lays itself out (k3s's conflist, plugin and configuration directories).
pub const K3S_FLANNEL: PodNetwork = PodNetwork {
    dirs: NodeDirs::K3s,
    ..FLANNEL
};

/// How a test holds the real nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// With the other tests of the same shape.
    Shared,
    /// Alone: it takes a node away (drain, restart, reboot) or the API; no other test runs.
    Alone,
    /// Alone, and it leaves the cluster other than its shape says (uninstalls the chart,
    /// installs its own): the cluster is stopped when the test ends.
    Spoils,
}

/// Whether a test of shape `wanted` may use the running cluster of shape `running`: only one of
/// its shape that no test spoiled.
fn serves(running: Option<Shape>, spoiled: bool, wanted: Shape) -> bool {
    running == Some(wanted) && !spoiled
}

/// The one cluster of this test binary that runs, and what it is.
struct Running {
    /// The running cluster and its shape.
    current: Option<(Shape, &'static Cluster)>,
    /// The current cluster is spoiled: it goes before anyone uses it again.
    spoiled: bool,
    /// The shapes that failed to start, with why: each fails once, its other tests say so.
    failed: Vec<(Shape, String)>,
}

impl Running {
    /// Stops the current cluster: everything it started is removed (processes, mounts,
    /// namespaces, veths, firewall rules, cgroups; sysctls restored when no other cluster of the
    /// machine runs).
    fn stop_current(&mut self) {
        self.spoiled = false;
        *CURRENT.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let Some((shape, c)) = self.current.take() else {
            return;
        };
        let t0 = Instant::now();
        match c.stop() {
            Ok(done) => eprintln!(
                "ipkeep-e2e nodes: stopped the cluster of {shape:?} in {:.1}s{}",
                t0.elapsed().as_secs_f64(),
                if done.is_empty() {
                    String::new()
                } else {
                    format!(": {}", done.join(", "))
                }
            ),
            Err(e) => eprintln!(
                "ipkeep-e2e nodes: cleanup of the cluster of {shape:?} incomplete: {}",
                crate::error_chain(&e)
            ),
        }
    }

    /// The running cluster if it serves a test of `shape` ([`serves`]), checked to be up (the
    /// test fails if one of its daemons died).
    fn serving(&self, shape: Shape) -> Option<&'static Cluster> {
        let (_, c) = self
            .current
            .filter(|(s, _)| serves(Some(*s), self.spoiled, shape))?;
        if let Err(e) = c.check() {
            panic!("{}", crate::error_chain(&e));
        }
        Some(c)
    }

    /// Makes the running cluster one of `shape`: the current one if it is, else the current one
    /// stopped and one of `shape` started (its image loaded and its chart installed).
    async fn ensure(&mut self, shape: Shape) -> &'static Cluster {
        if let Some((_, why)) = self.failed.iter().find(|(s, _)| *s == shape) {
            panic!("the real-node cluster of {shape:?} failed to start earlier: {why}");
        }
        if let Some(c) = self.serving(shape) {
            return c;
        }
        self.stop_current();
        let t0 = Instant::now();
        let options = ClusterOptions {
            nodes: shape.nodes,
            network: shape.network,
            // Who did what, for the tests that prove a component's writes from it
            // (node_trust.rs: every write of the agents was allowed).
            plane: crate::cluster::ControlPlaneOptions {
                audit_log: true,
                ..Default::default()
            },
            ..ClusterOptions::default()
        };
        let c = match Cluster::start(options).await {
            // Never freed: a `&'static` a test was handed stays a valid reference; the cluster
            // behind it is stopped (and everything it made removed) when its shape's turn ends.
            Ok(c) => &*Box::leak(Box::new(c)),
            Err(e) => {
                let why = crate::error_chain(&e);
                self.failed.push((shape, why.clone()));
                panic!("{why}");
            }
        };
        eprintln!(
            "ipkeep-e2e nodes: cluster of {} real nodes ({shape:?}) ready in {:.1}s at {}",
            c.nodes().len(),
            t0.elapsed().as_secs_f64(),
            c.plane().server()
        );
        self.current = Some((shape, c));
        *CURRENT.lock().unwrap_or_else(|p| p.into_inner()) = Some(c);
        if let Some(extra) = shape.chart {
            let names = c
                .load_image(&image_archive())
                .unwrap_or_else(|e| panic!("{}", crate::error_chain(&e)));
            assert_eq!(names.len(), 1, "one image in the archive: {names:?}");
            install(c, &image_values(&names[0]), extra).await;
            run_on_chart_cluster(chart_cluster(c));
        }
        c
    }
}

/// The tests of the binary share its one running cluster: those of the running shape hold this
/// shared, a test that needs the nodes to itself (or another shape, or the whole machine)
/// holds it exclusively. libtest hands the tests out in name order, so one module's tests come
/// together and the shape changes about once per module.
static NODES: tokio::sync::RwLock<Running> = tokio::sync::RwLock::const_new(Running {
    current: None,
    spoiled: false,
    failed: Vec::new(),
});

/// The running cluster, for the test that holds [`NODES`] (read without taking [`NODES`] again,
/// which a waiting writer would block).
static CURRENT: std::sync::Mutex<Option<&'static Cluster>> = std::sync::Mutex::new(None);

/// The guard of a test on the real nodes ([`use_shape`]): while it lives, the nodes stay as the
/// test's shape says.
pub struct Nodes {
    /// Held with the other tests of its shape (only held, never read).
    _shared: Option<tokio::sync::RwLockReadGuard<'static, Running>>,
    /// Held alone.
    alone: Option<tokio::sync::RwLockWriteGuard<'static, Running>>,
}

impl Nodes {
    /// Held with the other tests of its shape.
    fn shared(guard: tokio::sync::RwLockReadGuard<'static, Running>) -> Nodes {
        Nodes {
            _shared: Some(guard),
            alone: None,
        }
    }

    /// Held alone.
    fn alone(guard: tokio::sync::RwLockWriteGuard<'static, Running>) -> Nodes {
        Nodes {
            _shared: None,
            alone: Some(guard),
        }
    }

    /// The cluster the test holds; `None` on a user's cluster.
    pub fn cluster(&self) -> Option<&'static Cluster> {
        own()
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        if let Some(running) = &mut self.alone
            && running.spoiled
        {
            running.stop_current();
        }
    }
}

/// The real nodes of `shape` for the calling test, held as `access` says: the running cluster
/// if it has that shape, else (once every test on it is done) it is stopped and one of `shape`
/// started. On a user's cluster ([`on_users_cluster`]) it starts nothing, and [`System::start`]
/// goes there.
pub async fn use_shape(shape: Shape, access: Access) -> Nodes {
    if on_users_cluster() {
        return match access {
            Access::Shared => Nodes::shared(NODES.read().await),
            Access::Alone | Access::Spoils => Nodes::alone(NODES.write().await),
        };
    }
    if access == Access::Shared {
        let running = NODES.read().await;
        if running.serving(shape).is_some() {
            return Nodes::shared(running);
        }
    }
    let mut running = NODES.write().await;
    running.ensure(shape).await;
    match access {
        // Downgraded in place: no test of another shape gets in between.
        Access::Shared => Nodes::shared(running.downgrade()),
        Access::Alone => Nodes::alone(running),
        Access::Spoils => {
            running.spoiled = true;
            Nodes::alone(running)
        }
    }
}

/// The whole machine for the calling test: no cluster of this binary runs (the running one is
/// stopped) and no other test runs meanwhile. For the tests that start and stop clusters of
/// their own and check what the machine is left with.
pub async fn use_machine_alone() -> Nodes {
    let mut running = NODES.write().await;
    running.stop_current();
    Nodes::alone(running)
}

/// The default nodes ([`Shape::default_chart`]), shared with the other tests of that shape.
pub async fn use_real_nodes() -> Nodes {
    use_shape(Shape::default_chart(), Access::Shared).await
}

/// As [`use_real_nodes`], for a test that takes a node away: no other test runs meanwhile.
pub async fn use_real_nodes_alone() -> Nodes {
    use_shape(Shape::default_chart(), Access::Alone).await
}

/// [`use_real_nodes`] on `nodes` nodes with `network`.
pub async fn use_nodes(nodes: u8, network: PodNetwork) -> Nodes {
    use_shape(Shape::chart(nodes, network), Access::Shared).await
}

/// As [`use_nodes`], for a test that takes a node away ([`use_real_nodes_alone`]).
pub async fn use_nodes_alone(nodes: u8, network: PodNetwork) -> Nodes {
    use_shape(Shape::chart(nodes, network), Access::Alone).await
}

/// The installed nodes the calling test holds ([`use_shape`]); the test fails if it holds none.
pub fn installed() -> &'static Cluster {
    own().expect(
        "no real-node cluster: the test takes one first (testkit::realnode::use_nodes and the like)",
    )
}

/// The own nodes the calling test holds ([`use_shape`]); `None` on a user's cluster.
pub fn own() -> Option<&'static Cluster> {
    *CURRENT.lock().unwrap_or_else(|p| p.into_inner())
}

/// host-local's data directory of the nodes' network on `node`, as the machine sees it.
pub fn network_dir(node: &RealNode) -> PathBuf {
    node.host_path(&format!("/var/lib/cni/networks/{CNI_NETWORK}"))
        .expect("/var/lib/cni is private to the node")
}

/// The text of the file `path` as `node` sees it (one of its private directories, or its
/// `/run`, read from inside the node); the test fails if it cannot be read.
pub fn read_node_file(node: &RealNode, path: &str) -> String {
    match node.host_path(path) {
        Some(host) => std::fs::read_to_string(&host)
            .unwrap_or_else(|e| panic!("{}: read {path} ({}): {e}", node.name(), host.display())),
        None => node
            .exec(&["cat", path])
            .unwrap_or_else(|e| panic!("{}: read {path}: {}", node.name(), crate::error_chain(&e))),
    }
}

/// The delegate configurations flannel's CNI plugin saved on `node` at ADD time, one per pod
/// sandbox it set up (`/var/lib/cni/flannel/<sandbox id>`), which its DEL replays.
pub fn flannel_delegates(node: &RealNode) -> Vec<serde_json::Value> {
    let dir = node
        .host_path("/var/lib/cni/flannel")
        .expect("/var/lib/cni is the node's");
    std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            let text = std::fs::read_to_string(e.path()).unwrap();
            serde_json::from_str(&text)
                .unwrap_or_else(|err| panic!("{}: {err}: {text}", e.path().display()))
        })
        .collect()
}

/// The notes of the Events with `reason` about Node `node` (the agent's Warnings go to the
/// `default` namespace, where Node events live).
pub async fn node_event_notes(c: &Cluster, node: &str, reason: &str) -> Vec<String> {
    let events: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(c.plane().client().unwrap(), "default");
    events
        .list(&kube::api::ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node)
        })
        .filter_map(|e| e.note)
        .collect()
}

/// The condition the agent puts on its own pod: whether ipkeep is in charge on its node.
pub const POD_CONDITION: &str = "ipkeep.dev/InCharge";

/// The agent pod of `node`, once there is exactly one and it is not being deleted.
pub async fn agent_pod(c: &Cluster, node: &str) -> k8s_openapi::api::core::v1::Pod {
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(c.plane().client().unwrap(), RELEASE_NS);
    wait_for(&format!("one agent pod on {node}"), || async {
        let lp = kube::api::ListParams::default()
            .labels("app.kubernetes.io/component=agent")
            .fields(&format!("spec.nodeName={node}"));
        let mut list: Vec<k8s_openapi::api::core::v1::Pod> = pods
            .list(&lp)
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        (list.len() == 1).then(|| list.remove(0))
    })
    .await
}

/// The agent pod's `ipkeep.dev/InCharge` condition: (status, reason).
pub fn in_charge_condition(pod: &k8s_openapi::api::core::v1::Pod) -> Option<(String, String)> {
    let c = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == POD_CONDITION)?;
    Some((c.status.clone(), c.reason.clone().unwrap_or_default()))
}

/// Waits until the agent pod on `node` says `status` with `reason`; returns the pod.
pub async fn wait_pod_condition(
    c: &Cluster,
    node: &str,
    status: &str,
    reason: &str,
) -> k8s_openapi::api::core::v1::Pod {
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(c.plane().client().unwrap(), RELEASE_NS);
    wait_for(
        &format!("the agent pod on {node}: {POD_CONDITION}={status} ({reason})"),
        || async {
            let name = agent_pod(c, node).await.metadata.name?;
            let pod = pods.get(&name).await.ok()?;
            (in_charge_condition(&pod) == Some((status.to_owned(), reason.to_owned())))
                .then_some(pod)
        },
    )
    .await
}

/// Removes `dir` and everything in it while the node goes on writing there (the plugin, the
/// agent), as `rm -rf` in a cleanup script does: a file made after the listing leaves it not
/// empty, and the removal starts again. Gone already is done.
pub fn wipe(dir: &Path) -> std::io::Result<()> {
    let mut tries = 0;
    loop {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty && tries < 10 => {
                tries += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The reservation file of `ns/pod` on `node`.
pub fn reserved_file(node: &RealNode, ns: &str, pod: &str) -> PathBuf {
    network_dir(node).join("reserved").join(ns).join(pod)
}

/// The data directory of the network on node `name` for the check `what`, when the test runs on
/// this binary's own nodes (the check is recorded); on a user's cluster the check is recorded
/// as skipped and there is none.
pub fn node_dir(sys: &System, what: &str, name: &str) -> Option<PathBuf> {
    match own() {
        Some(c) => {
            sys.check(what);
            Some(network_dir(node(c, name)))
        }
        None => {
            sys.skip(what, "own nodes' data directories on disk");
            None
        }
    }
}

/// How many addresses the tiny node hands out: its /29 less the network address, the bridge's
/// `.1` and the broadcast address.
pub const TINY_ADDRESSES: u32 = 5;

/// The tiny node: the one this binary's cluster gives a /29 and the [`TINY_TAINT`].
pub fn tiny(c: &Cluster) -> &RealNode {
    let n = c.network().tiny_nodes;
    assert!(n > 0, "this test binary's cluster has no tiny node");
    &c.nodes()[c.nodes().len() - usize::from(n)]
}

/// The one test at a time that fills the tiny node's range.
static TINY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The tiny node, for the calling test alone (while it holds the guard): returned once nothing
/// of an earlier holder is left on it — no address allocated, no reservation file — so the test
/// knows every address of the range is its own to fill.
pub async fn tiny_alone() -> (tokio::sync::MutexGuard<'static, ()>, &'static RealNode) {
    let guard = TINY.lock().await;
    let c = installed();
    let node = tiny(c);
    // Its /29 has fewer addresses than the kubelet admits pods, so the controller's default node
    // budget is 0 Released reservations; the tests that fill it hold addresses on purpose and set
    // the budget to the whole range (the budget's own test sets it lower).
    set_node_budget(c, &node.name(), TINY_ADDRESSES);
    let dir = network_dir(node);
    wait_for(
        &format!(
            "no allocation and no reservation file left on the tiny node {} ({})",
            node.name(),
            dir.display()
        ),
        || async { files_left(&dir).is_empty().then_some(()) },
    )
    .await;
    (guard, node)
}

/// Sets the Node annotation `ipkeep.dev/node-budget` of `node` to `budget`.
pub fn set_node_budget(c: &Cluster, node: &str, budget: u32) {
    kubectl_ok(
        c.plane(),
        &[
            "annotate",
            "node",
            node,
            "--overwrite",
            &format!("ipkeep.dev/node-budget={budget}"),
        ],
        None,
    );
}

/// The allocation files (named by an address) and reservation files under `dir`.
fn files_left(dir: &Path) -> Vec<PathBuf> {
    let mut left: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<IpAddr>().is_ok())
        .map(|e| e.path())
        .collect();
    let reserved = dir.join("reserved");
    for ns in std::fs::read_dir(reserved).into_iter().flatten().flatten() {
        left.extend(
            std::fs::read_dir(ns.path())
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path()),
        );
    }
    left
}

/// Applies the StatefulSet `name` of `replicas` pods (`Parallel`, annotated with
/// `annotations`) placed on the tiny node `node`, in the test's namespace.
pub fn apply_on_tiny(
    sys: &System,
    node: &str,
    name: &str,
    replicas: u32,
    annotations: &[(&str, &str)],
) {
    sys.apply(&tolerating_tiny(&super::system::statefulset(
        name,
        replicas,
        true,
        &[node],
        annotations,
    )));
}

/// `yaml` (a pod template of `system::statefulset`) with a toleration of the tiny node's taint,
/// so its pods may run there.
pub fn tolerating_tiny(yaml: &str) -> String {
    let anchor = "      terminationGracePeriodSeconds: 1\n";
    assert!(
        yaml.contains(anchor),
        "no pod spec to add a toleration to:\n{yaml}"
    );
    yaml.replacen(
        anchor,
        &format!(
            "{anchor}      tolerations:\n      - {{key: {TINY_TAINT}, operator: Exists, effect: NoSchedule}}\n"
        ),
        1,
    )
}

/// A fresh [`System`] on the installed real nodes: a namespace of its own, the nodes, the chart's
/// controller and agents.
pub async fn system(prefix: &str) -> (System, &'static Cluster) {
    let c = installed();
    let sys = System::on(prefix, Options::default(), chart_cluster(c)).await;
    (sys, c)
}

/// The real node of that name.
pub fn node<'a>(c: &'a Cluster, name: &str) -> &'a RealNode {
    c.node(name)
        .unwrap_or_else(|| panic!("no real node {name}"))
}

/// What `command` prints in `pod`'s container (`kubectl exec`), retried until it succeeds: the
/// kubelet may just have been restarted, a server in another pod may not listen yet.
pub async fn exec_until_it_works(sys: &System, pod: &str, command: &[&str]) -> String {
    let mut args = vec!["-n", sys.ns.as_str(), "exec", pod, "--"];
    args.extend_from_slice(command);
    wait_for(&format!("`{}` to work in {pod}", command.join(" ")), || {
        let out = kubectl(&sys.target, &args, None);
        let printed = out
            .status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned());
        async move { printed }
    })
    .await
}

/// What `ip -o addr show eth0` says inside the pod's container.
pub async fn eth0(sys: &System, pod: &str) -> String {
    exec_until_it_works(sys, pod, &["ip", "-o", "addr", "show", "eth0"]).await
}

/// Asserts the container of `pod` holds each of its addresses on `eth0`.
pub async fn assert_on_eth0(sys: &System, pod: &RunningPod) {
    let shown = eth0(sys, &pod.name).await;
    for ip in &pod.ips {
        assert!(
            shown.contains(&format!(" {ip}/")),
            "{}'s eth0 does not hold {ip}:\n{shown}",
            pod.name
        );
    }
}

/// The page `from` fetches from `to`'s busybox httpd (port 8080) over the pod network.
pub async fn fetch(sys: &System, from: &str, to: &RunningPod) -> String {
    let url = format!("http://{}:8080/", to.ips[0]);
    exec_until_it_works(sys, from, &["wget", "-qO-", &url]).await
}

/// What the workload image's httpd serves.
pub const PAGE: &str = "ipkeep-e2e workload";

/// Each way a user deletes a pod — `kubectl delete pod` with the default grace period, and with
/// `--force --grace-period=0` — on the installed nodes, in a namespace named after `prefix`: the
/// returning pod gets its address whatever order the kubelet and containerd run DEL and ADD in;
/// from inside the container, `eth0` holds the kept address, and a pod on the other node reaches
/// it (`wget` to busybox `httpd`). Returns the system and the pods as they came back.
pub async fn deleted_graceful_or_forced_returns_reachable(
    prefix: &str,
) -> (System, std::collections::BTreeMap<String, RunningPod>) {
    let (sys, _) = system(prefix).await;
    let (node_a, node_b) = (sys.node_name(0).to_owned(), sys.node_name(1).to_owned());
    let history = sys.record_reservations();
    sys.apply(&crate::cluster::realnode::layout::client_pod(&node_b));
    let before = sys.run_retained("web", 2, &node_a).await;
    sys.wait_running("", &["client", "web-0", "web-1"]).await;
    for p in before.values() {
        assert_on_eth0(&sys, p).await;
        assert_eq!(fetch(&sys, "client", p).await.trim(), PAGE);
    }
    // Each way a user deletes a pod, row by row: the pod, then kubectl's arguments.
    let deletions: [(&str, &[&str]); 2] = [
        ("web-0", &["delete", "pod", "web-0"]),
        (
            "web-1",
            &["delete", "pod", "web-1", "--force", "--grace-period=0"],
        ),
    ];
    let mut returned = std::collections::BTreeMap::new();
    for (pod, args) in deletions {
        sys.kubectl(args);
        let back = sys.wait_recreated(pod, &before[pod].uid).await;
        assert_eq!(
            back.ips, before[pod].ips,
            "{pod} came back with another address after kubectl {args:?}"
        );
        sys.wait_bound(&back).await;
        assert_on_eth0(&sys, &back).await;
        assert_eq!(
            fetch(&sys, "client", &back).await.trim(),
            PAGE,
            "{pod} is not reachable at its kept address from {node_b}"
        );
        returned.insert(pod.to_owned(), back);
    }
    assert!(!history.any_deleted(), "a reservation was deleted");
    (sys, returned)
}

/// A fault of a node: what it is, and how the node suffers it.
pub type Fault = (&'static str, fn(&RealNode));

/// `node` suffers each fault in turn while two retained pods of a StatefulSet `web` run there:
/// after each, the running pods keep (after a reboot: get back) their addresses, and a pod
/// deleted then returns with its own. No reservation is deleted.
pub async fn faults_keep_pods_on_their_addresses(sys: &System, node: &RealNode, faults: &[Fault]) {
    let history = sys.record_reservations();
    let name = node.name();
    let mut pods = sys.run_retained("web", 2, &name).await;
    for (fault, strike) in faults {
        eprintln!("{name}: {fault}");
        strike(node);
        let after = sys.wait_running("app=web", &["web-0", "web-1"]).await;
        for (pod, p) in &pods {
            assert_eq!(
                after[pod].ips, p.ips,
                "{pod} changed its address across: {fault}"
            );
        }
        for p in after.values() {
            sys.wait_bound(p).await;
            assert_on_eth0(sys, p).await;
        }
        sys.kubectl(&["delete", "pod", "web-0", "--wait=false"]);
        let back = sys.wait_recreated("web-0", &after["web-0"].uid).await;
        assert_eq!(back.ips, pods["web-0"].ips, "web-0 after {fault}");
        sys.wait_bound(&back).await;
        pods = sys.wait_running("app=web", &["web-0", "web-1"]).await;
    }
    assert!(!history.any_deleted(), "a reservation was deleted");
}

/// What a failing real-node test needs to see: the reservations, the files under `dir` and the
/// last lines of every agent's log (printed; libtest shows it when the test fails).
pub fn dump(sys: &System, c: &Cluster, dir: &std::path::Path) {
    let ipr = kubectl(
        &sys.target,
        &["-n", &sys.ns, "get", "ipr", "-o", "wide"],
        None,
    );
    eprintln!(
        "--- kubectl get ipr:\n{}",
        String::from_utf8_lossy(&ipr.stdout)
    );
    let files = crate::command::run(std::process::Command::new("ls").arg("-laR").arg(dir), None);
    if let Ok(out) = files {
        eprintln!(
            "--- {}:\n{}",
            dir.display(),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let logs = kubectl(
        c.plane(),
        &[
            "-n",
            RELEASE_NS,
            "logs",
            "-l",
            "app.kubernetes.io/component=agent",
            "--tail=40",
            "--prefix",
        ],
        None,
    );
    eprintln!("--- agent logs:\n{}", String::from_utf8_lossy(&logs.stdout));
}

#[cfg(test)]
mod tests {
    use super::*;

    const OTHER_INSTALL: &[&str] = &["--set", "cni.replaceHostLocal=false"];
    const SAME_INSTALL: &[&str] = &["--set", "cni.replaceHostLocal=true"];

    #[test]
    fn a_test_uses_the_running_cluster_only_when_it_has_the_test_s_shape_and_is_not_spoiled() {
        let default = Shape::default_chart();
        let dual = PodNetwork {
            dual_stack: true,
            ..PLAIN
        };
        let other_install = Shape {
            chart: Some(OTHER_INSTALL),
            ..default
        };
        let same_install = Shape {
            chart: Some(SAME_INSTALL),
            ..default
        };
        let cases = [
            ("nothing runs", None, false, default, false),
            ("the same shape", Some(default), false, default, true),
            (
                "the same shape, spoiled",
                Some(default),
                true,
                default,
                false,
            ),
            (
                "more nodes",
                Some(Shape::chart(3, PLAIN)),
                false,
                default,
                false,
            ),
            (
                "another network",
                Some(Shape::chart(2, dual)),
                false,
                default,
                false,
            ),
            (
                "nothing installed",
                Some(Shape::bare(2, PLAIN)),
                false,
                default,
                false,
            ),
            (
                "other install arguments",
                Some(other_install),
                false,
                default,
                false,
            ),
            (
                "equal arguments, another slice",
                Some(same_install),
                false,
                default,
                true,
            ),
        ];
        for (case, running, spoiled, wanted, expected) in cases {
            assert_eq!(serves(running, spoiled, wanted), expected, "{case}");
        }
    }
}
