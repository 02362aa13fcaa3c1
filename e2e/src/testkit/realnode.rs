//! Real nodes with ipkeep installed the way the README tells a user (for the
//! `realnode_scenario_*.rs` tests): the shared two-node cluster of the test binary
//! (`crate::cluster::realnode::shared`: kubelet, containerd, runc and kube-proxy per node),
//! `make image`'s archive imported into every node's containerd, and `helm install` from
//! `charts/ipkeep` with that image and `cni.replaceHostLocal=true` — once per test binary. Each
//! test then works in a [`System`] of its own namespace on those nodes, with the chart's
//! controller and agents.
//!
//! A binary may ask for other nodes first ([`choose`]: dual-stack, a tiny node). With
//! `IPKEEP_E2E_KUBECONFIG` set, [`use_real_nodes`] starts nothing and the scenarios run on that
//! cluster instead, each check of this binary's own nodes' disks skipped with one line.
//!
//! Needs root, `make cluster-bins`, `make node-bins` and `make image` (or
//! `IPKEEP_IMAGE_ARCHIVE`); fails loudly, naming what to run, without them.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    sync::OnceLock,
};

use crate::cluster::realnode::{
    self, PodNetwork, RealCluster, RealNode, TINY_TAINT, layout::CNI_NETWORK,
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
pub fn helm(c: &RealCluster, args: &[&str]) -> String {
    run_ok(c.plane().helm(), args, None)
}

static INSTALLED: tokio::sync::OnceCell<&'static RealCluster> = tokio::sync::OnceCell::const_new();

/// The nodes this binary's shared cluster has: how many, and their pods' network.
static NODES_CHOSEN: OnceLock<(u8, PodNetwork)> = OnceLock::new();

/// The `helm install` arguments this binary's shared cluster gets besides the image's.
static INSTALL_CHOSEN: OnceLock<&'static [&'static str]> = OnceLock::new();

/// The README's install: `host-local` replaced by ipkeep.
pub const REPLACE_HOST_LOCAL: &[&str] = &["--set", "cni.replaceHostLocal=true"];

/// This binary's shared cluster gets the chart installed with `extra` instead of
/// [`REPLACE_HOST_LOCAL`]; called by each of its tests before anything else (the first call
/// decides).
pub fn choose_install(extra: &'static [&'static str]) {
    INSTALL_CHOSEN.get_or_init(|| extra);
}

/// This binary's shared cluster gets `nodes` nodes with `network` instead of two plain ones;
/// called by each of its tests before anything else (the first call decides; the cluster fails
/// to come up for a test that asks for other nodes).
pub fn choose(nodes: u8, network: PodNetwork) {
    NODES_CHOSEN.get_or_init(|| (nodes, network));
}

/// The shared real-node cluster with the image loaded and the chart installed (once per test
/// binary); every pod of the release Ready. Returns the cluster.
pub async fn installed() -> &'static RealCluster {
    let (nodes, network) = NODES_CHOSEN
        .get()
        .copied()
        .unwrap_or((2, PodNetwork::default()));
    let c = realnode::shared_with(nodes, network)
        .await
        .unwrap_or_else(|e| panic!("{}", crate::error_chain(&e)));
    INSTALLED
        .get_or_init(|| async {
            let names = c
                .load_image(&image_archive())
                .unwrap_or_else(|e| panic!("{}", crate::error_chain(&e)));
            assert_eq!(names.len(), 1, "one image in the archive: {names:?}");
            let values = image_values(&names[0]);
            let extra = INSTALL_CHOSEN.get().copied().unwrap_or(REPLACE_HOST_LOCAL);
            install(c, &values, extra).await;
            c
        })
        .await
}

/// `helm upgrade --install` of the chart with the image `values` and `extra` arguments, then
/// waits until every pod of the release is Ready.
pub async fn install(c: &RealCluster, values: &[String], extra: &[&str]) {
    let chart = super::chart_dir();
    let mut args = vec![
        "upgrade",
        "--install",
        RELEASE,
        chart.to_str().expect("a UTF-8 path"),
        "--namespace",
        RELEASE_NS,
        "--create-namespace",
        "--wait",
        "--timeout",
        "3m",
    ];
    for v in values {
        args.extend(["--set", v.as_str()]);
    }
    args.extend(extra);
    helm(c, &args);
    release_ready(c).await;
}

/// Waits until the release's controller Deployment and agent DaemonSet have rolled out: every
/// replica updated and Ready, an agent on every node.
pub async fn release_ready(c: &RealCluster) {
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
fn chart_cluster(c: &RealCluster) -> ChartCluster {
    ChartCluster {
        kubeconfig: c.plane().kubeconfig_path().to_path_buf(),
        kubectl: c.plane().bin("kubectl"),
    }
}

/// The tests of one binary share its two nodes: a test that takes a node away (drain, restart,
/// reboot) holds this exclusively, the others hold it shared, so none of them sees a node go
/// away under it.
static NODES: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Makes [`System::start`] put this binary's tests on the installed real nodes (the shared
/// scenarios of `scenarios/` run there); the nodes are shared with the other tests that hold
/// the guard. On a user's cluster ([`on_users_cluster`]) it starts nothing: [`System::start`]
/// goes there.
pub async fn use_real_nodes() -> tokio::sync::RwLockReadGuard<'static, ()> {
    if !on_users_cluster() {
        run_on_chart_cluster(chart_cluster(installed().await));
    }
    NODES.read().await
}

/// As [`use_real_nodes`], for a test that takes a node away: no other test runs meanwhile.
pub async fn use_real_nodes_alone() -> tokio::sync::RwLockWriteGuard<'static, ()> {
    if !on_users_cluster() {
        run_on_chart_cluster(chart_cluster(installed().await));
    }
    NODES.write().await
}

/// [`use_real_nodes`] on this binary's `nodes` nodes with `network` ([`choose`]): every test of
/// a binary that wants other nodes than two plain ones starts with this (or [`use_nodes_alone`]).
pub async fn use_nodes(
    nodes: u8,
    network: PodNetwork,
) -> tokio::sync::RwLockReadGuard<'static, ()> {
    choose(nodes, network);
    use_real_nodes().await
}

/// As [`use_nodes`], for a test that takes a node away ([`use_real_nodes_alone`]).
pub async fn use_nodes_alone(
    nodes: u8,
    network: PodNetwork,
) -> tokio::sync::RwLockWriteGuard<'static, ()> {
    choose(nodes, network);
    use_real_nodes_alone().await
}

/// This binary's own installed nodes, once a test started them; `None` on a user's cluster.
pub fn own() -> Option<&'static RealCluster> {
    INSTALLED.get().copied()
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
pub async fn node_event_notes(c: &RealCluster, node: &str, reason: &str) -> Vec<String> {
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
pub async fn agent_pod(c: &RealCluster, node: &str) -> k8s_openapi::api::core::v1::Pod {
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
    c: &RealCluster,
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
pub fn tiny(c: &RealCluster) -> &RealNode {
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
    let c = installed().await;
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
pub fn set_node_budget(c: &RealCluster, node: &str, budget: u32) {
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
pub async fn system(prefix: &str) -> (System, &'static RealCluster) {
    let c = installed().await;
    let sys = System::on(prefix, Options::default(), chart_cluster(c)).await;
    (sys, c)
}

/// The real node of that name.
pub fn node<'a>(c: &'a RealCluster, name: &str) -> &'a RealNode {
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
    sys.apply(&realnode::layout::client_pod(&node_b));
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
pub fn dump(sys: &System, c: &RealCluster, dir: &std::path::Path) {
    let ipr = kubectl(
        &sys.target,
        &["-n", &sys.ns, "get", "ipr", "-o", "wide"],
        None,
    );
    eprintln!(
        "--- kubectl get ipr:\n{}",
        String::from_utf8_lossy(&ipr.stdout)
    );
    let files = std::process::Command::new("ls")
        .arg("-laR")
        .arg(dir)
        .output();
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
