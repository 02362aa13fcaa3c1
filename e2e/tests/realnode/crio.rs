//! The scenarios on CRI-O, the runtime that calls CNI GC, installed the README's way
//! (`cni.replaceHostLocal=true`): three real nodes, the first two running CRI-O (built from its Go
//! module, Debian's conmon and runc, the upstream CNI plugins under a conflist of `cniVersion`
//! 1.1.0, so that CRI-O's GC reaches the network), the third containerd, to compare.
//!
//! - The chart's agents are in charge on the CRI-O nodes; `kubectl delete pod` graceful and
//!   forced: the pod returns with its address, reachable from the other CRI-O node; scenario 8
//!   (scale 0 → N, every ordinal back on its addresses).
//! - CRI-O restarted, the kubelet restarted, the node rebooted: running pods keep their
//!   addresses, a returning pod gets its own; CRI-O restarted while a StatefulSet scales back up:
//!   its start-up GC frees no address a pod is getting.
//! - A reboot with two retained pods scaled to 0 and a leaked allocation (an ADD through libcni,
//!   `cnitool`, for a sandbox no runtime knows): at its start CRI-O sends DEL for the cached
//!   attachment it does not know (libcni's `GCNetworkList` sweep), which frees the leak, then GC
//!   to the conflist's top-level plugins (`bridge`, `portmap`: seen by a wrapper that logs what
//!   bridge is called with) — bridge does not pass GC to its IPAM (`/* FIXME GC */` upstream), so
//!   ipkeep never gets GC; both reservations stay. The same reboot of the containerd node leaves
//!   the leak: containerd sends neither.
//! - From a registry, as users install it (the same three nodes with nothing installed): the
//!   image and chart pushed to the harness's registry (TLS, a login), every node trusting its CA
//!   as its runtime's users configure it; a pod without the pull secret gets `ErrImagePull` on a
//!   CRI-O node; `helm install ipkeep oci://…/charts/ipkeep --version <v>` with the pull secret
//!   in `imagePullSecrets` and the chart's pull policy: the kubelet of every node (CRI-O and
//!   containerd) pulls the image (none held it before; an Event says so; the image ID is the
//!   pushed digest); a StatefulSet's pods deleted return with their addresses.
//!
//! Needs root, `make cluster-bins node-bins crio-bins registry-bin image`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::scenarios::retention;
use std::{path::PathBuf, time::Instant};

use ipkeep_e2e::cluster::Registry;
use ipkeep_e2e::cluster::realnode::{
    NodeCni, NodeDirs, NodeRuntime, PodNetwork, RealNode, crio, layout::CNI_NETWORK,
};
use ipkeep_e2e::testkit::realnode::{assert_on_eth0, registry};
use ipkeep_e2e::testkit::system::{phase, scenario_tests};
use ipkeep_e2e::testkit::{kubectl_ok, realnode, wait_for};
use ipkeep_operator::api::Phase;

/// This binary's nodes: two CRI-O nodes for the scenarios, a containerd one to compare.
const NODES: u8 = 3;
/// Their pods' network: the bridge conflist, the first two nodes on CRI-O.
const NETWORK: PodNetwork = PodNetwork {
    dual_stack: false,
    tiny_nodes: 0,
    cni: NodeCni::Bridge,
    dirs: NodeDirs::Standard,
    crio_nodes: 2,
    k3s_nodes: 0,
};

scenario_tests!(realnode::use_nodes(NODES, NETWORK); retention:
    scaled_to_zero_and_back_every_ordinal_gets_its_address_back,
);

/// The node of the cluster that runs `runtime` (the first such).
fn node_running(c: &ipkeep_e2e::cluster::realnode::Cluster, runtime: NodeRuntime) -> &RealNode {
    c.nodes()
        .iter()
        .find(|n| n.runtime() == runtime)
        .unwrap_or_else(|| panic!("no {} node", runtime.name()))
}

/// The StatefulSet pod deleted graceful and forced returns with its address, reachable
/// (`realnode::deleted_graceful_or_forced_returns_reachable`), its pods on the two CRI-O nodes.
async fn deleted_pods_return_on_cri_o(c: &ipkeep_e2e::cluster::realnode::Cluster, ns: &str) {
    let (sys, _) = realnode::deleted_graceful_or_forced_returns_reachable(ns).await;
    for i in 0..2 {
        assert_eq!(
            realnode::node(c, sys.node_name(i)).runtime(),
            NodeRuntime::CriO,
            "the scenario ran on {}",
            sys.node_name(i)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_cri_o_the_agents_are_in_charge_and_a_deleted_pod_returns_with_its_address() {
    let _nodes = realnode::use_nodes(NODES, NETWORK).await;
    let c = realnode::installed();
    for n in c.nodes() {
        let info = kubectl_ok(
            c.plane(),
            &[
                "get",
                "node",
                &n.name(),
                "-o",
                "jsonpath={.status.nodeInfo.containerRuntimeVersion}",
            ],
            None,
        );
        assert!(
            info.starts_with(&format!("{}://", n.runtime().name())),
            "{} reports the runtime {info}, expected {}",
            n.name(),
            n.runtime().name()
        );
        realnode::wait_pod_condition(c, &n.name(), "True", "InCharge").await;
    }
    deleted_pods_return_on_cri_o(c, "crio-delete").await;
}

/// Each fault of a CRI-O node, row by row.
const FAULTS: [realnode::Fault; 3] = [
    ("CRI-O restarted", |n| n.restart_runtime().unwrap()),
    ("kubelet restarted", |n| n.restart_kubelet().unwrap()),
    ("node rebooted", |n| n.reboot().unwrap()),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cri_o_restarted_kubelet_restarted_node_rebooted_pods_keep_and_get_their_addresses() {
    let _alone = realnode::use_nodes_alone(NODES, NETWORK).await;
    let (sys, c) = realnode::system("crio-faults").await;
    let node = realnode::node(c, sys.node_name(0));
    assert_eq!(node.runtime(), NodeRuntime::CriO);
    realnode::faults_keep_pods_on_their_addresses(&sys, node, &FAULTS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cri_o_restarting_while_pods_return_frees_no_address_a_pod_is_getting() {
    let _alone = realnode::use_nodes_alone(NODES, NETWORK).await;
    let (sys, c) = realnode::system("crio-race").await;
    let node_a = sys.node_name(0).to_owned();
    let node = realnode::node(c, &node_a);
    let names = ["db-0", "db-1", "db-2"];
    let before = sys.run_retained("db", 3, &node_a).await;
    sys.kubectl(&["scale", "statefulset", "db", "--replicas=0"]);
    for n in names {
        sys.wait_reservation(n, "Released", |r| phase(r) == Some(Phase::Released))
            .await;
    }
    // The pods come back while CRI-O restarts: its start-up GC (the DEL sweep of cached
    // attachments it does not know, then GC) runs while the kubelet asks for their sandboxes.
    sys.kubectl(&["scale", "statefulset", "db", "--replicas=3"]);
    node.restart_runtime().unwrap();
    let after = sys.wait_running("app=db", &names).await;
    let dir = realnode::network_dir(node);
    for n in names {
        assert_eq!(after[n].ips, before[n].ips, "{n} came back elsewhere");
        sys.wait_bound(&after[n]).await;
        assert_on_eth0(&sys, &after[n]).await;
        for ip in &after[n].ips {
            assert!(
                dir.join(ip.to_string()).is_file(),
                "{n}'s address {ip} is not allocated on {node_a} after CRI-O's start"
            );
        }
    }
}

/// What the wrapper around a node's `bridge` logs to (the node's `/var/log/crio`), one line per
/// call: the command and the container id; and the stdin of the last GC.
const CALLS: &str = "/var/log/crio/ipkeep-e2e-bridge-calls.log";
/// The stdin of the last GC bridge got.
const GC_STDIN: &str = "/var/log/crio/ipkeep-e2e-bridge-gc.json";

/// Puts a wrapper in front of `node`'s `bridge` that logs each call (and GC's stdin), then runs
/// the real one: how the test sees what CRI-O sends (it logs nothing when GC succeeds).
fn log_bridge_calls(node: &RealNode) {
    let bin = node.host_path("/opt/cni/bin").unwrap();
    let real = bin.join("bridge.real");
    if !real.exists() {
        std::fs::rename(bin.join("bridge"), &real).unwrap();
    }
    // GC's stdin is complete on disk before the call is logged: the test reads it as soon as it
    // sees the call (logged first, a read could find the file still empty).
    let script = format!(
        "#!/bin/sh\n\
         if [ \"$CNI_COMMAND\" = GC ]; then cat > {GC_STDIN}.tmp && mv {GC_STDIN}.tmp {GC_STDIN}; fi\n\
         echo \"$CNI_COMMAND $CNI_CONTAINERID\" >> {CALLS}\n\
         if [ \"$CNI_COMMAND\" = GC ]; then exec /opt/cni/bin/bridge.real < {GC_STDIN}; fi\n\
         exec /opt/cni/bin/bridge.real \"$@\"\n"
    );
    let tmp = bin.join(".bridge.tmp");
    std::fs::write(&tmp, script).unwrap();
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::rename(&tmp, bin.join("bridge")).unwrap();
}

/// The calls the wrapper logged on `node`: (command, container id).
fn bridge_calls(node: &RealNode) -> Vec<(String, String)> {
    std::fs::read_to_string(node.host_path(CALLS).unwrap())
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let (cmd, id) = l.split_once(' ').unwrap_or((l, ""));
            (cmd.to_owned(), id.to_owned())
        })
        .collect()
}

/// The network namespace of the leak, inside a node.
const LEAK_NETNS: &str = "/run/netns/ipkeep-e2e-leak";

/// A leaked allocation on `node`: an ADD through libcni (`cnitool`, whose result libcni caches
/// under `/var/lib/cni/results`, as a runtime's) into a network namespace no runtime knows, and
/// never a DEL. Returns the container id cnitool used and the address.
fn leak(node: &RealNode) -> (String, String) {
    node.exec(&["ip", "netns", "add", "ipkeep-e2e-leak"])
        .unwrap();
    let out = cnitool(node, "add");
    let result: serde_json::Value = serde_json::from_str(&out).unwrap();
    let ip = result["ips"][0]["address"]
        .as_str()
        .and_then(|a| a.split('/').next())
        .unwrap()
        .to_owned();
    let cached = std::fs::read_dir(node.host_path("/var/lib/cni/results").unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|f| f.starts_with(&format!("{CNI_NETWORK}-cnitool-")))
        .unwrap_or_else(|| panic!("libcni cached no result for cnitool on {}", node.name()));
    let id = cached
        .trim_start_matches(&format!("{CNI_NETWORK}-"))
        .trim_end_matches("-eth0")
        .to_owned();
    (id, ip)
}

/// `cnitool VERB` of the leak's network namespace on `node` (libcni over the node's conflist
/// and plugins); its stdout, or the test fails with what it said.
fn cnitool(node: &RealNode, verb: &str) -> String {
    let cnitool = crio::bin_dir().unwrap().join("cnitool");
    let mut command = node.command(&cnitool.to_string_lossy());
    command
        .env("CNI_PATH", "/opt/cni/bin")
        .env("NETCONFPATH", "/etc/cni/net.d")
        .args([verb, CNI_NETWORK, LEAK_NETNS]);
    ipkeep_e2e::command::stdout_of(&mut command, None)
        .unwrap_or_else(|e| panic!("on {}: {}", node.name(), ipkeep_e2e::error_chain(&e)))
}

/// The leak's DEL through libcni (what no runtime sends on a containerd node), and its network
/// namespace gone.
fn unleak(node: &RealNode) {
    cnitool(node, "del");
    let _ = node.exec(&["ip", "netns", "del", "ipkeep-e2e-leak"]);
}

/// The allocation file of `ip` on `node`.
fn allocation(node: &RealNode, ip: &str) -> PathBuf {
    realnode::network_dir(node).join(ip)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reboot_frees_a_leak_on_cri_o_not_on_containerd_and_keeps_both_reservations() {
    let _alone = realnode::use_nodes_alone(NODES, NETWORK).await;
    let (sys, c) = realnode::system("crio-gc").await;
    let crio_node = realnode::node(c, sys.node_name(1));
    assert_eq!(crio_node.runtime(), NodeRuntime::CriO);
    let containerd_node = node_running(c, NodeRuntime::Containerd);
    let pods = sys.run_retained("db", 2, &crio_node.name()).await;
    sys.kubectl(&["scale", "statefulset", "db", "--replicas=0"]);
    sys.wait_running("app=db", &[]).await;
    for name in ["db-0", "db-1"] {
        sys.wait_reservation(name, "Released", |r| phase(r) == Some(Phase::Released))
            .await;
        sys.wait_file(&realnode::reserved_file(crio_node, &sys.ns, name), true)
            .await;
    }
    log_bridge_calls(crio_node);
    let (crio_leak, crio_leaked_ip) = leak(crio_node);
    let (containerd_leak, containerd_leaked_ip) = leak(containerd_node);
    assert!(allocation(crio_node, &crio_leaked_ip).is_file());
    assert!(allocation(containerd_node, &containerd_leaked_ip).is_file());
    let calls_before = bridge_calls(crio_node).len();

    eprintln!("{}: rebooted (CRI-O)", crio_node.name());
    crio_node.reboot().unwrap();
    // CRI-O's start: the leaked attachment is DELeted through bridge and ipkeep, then bridge
    // gets GC with the sandboxes CRI-O knows as the valid attachments.
    sys.wait_file(&allocation(crio_node, &crio_leaked_ip), false)
        .await;
    let gc_seen = wait_for("CRI-O's start-up GC reaching bridge", || async {
        let calls = bridge_calls(crio_node);
        calls[calls_before..]
            .iter()
            .position(|(cmd, _)| cmd == "GC")
            .map(|at| calls[calls_before..calls_before + at].to_vec())
    })
    .await;
    assert!(
        gc_seen
            .iter()
            .any(|(cmd, id)| cmd == "DEL" && *id == crio_leak),
        "CRI-O's start sent no DEL for the leaked attachment {crio_leak} before its GC: {gc_seen:?}"
    );
    let gc: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(crio_node.host_path(GC_STDIN).unwrap()).unwrap(),
    )
    .unwrap();
    assert_eq!(gc["cniVersion"], "1.1.0");
    let valid = gc["cni.dev/valid-attachments"]
        .as_array()
        .unwrap_or_else(|| panic!("GC without cni.dev/valid-attachments: {gc}"));
    assert!(
        valid.iter().all(|a| a["containerID"] != crio_leak.as_str()),
        "the leak is among the valid attachments: {gc}"
    );
    eprintln!(
        "{}: CRI-O sent DEL for the leak, then GC to bridge with {} valid attachments",
        crio_node.name(),
        valid.len()
    );
    for name in ["db-0", "db-1"] {
        assert!(
            realnode::reserved_file(crio_node, &sys.ns, name).is_file(),
            "{name}'s reservation is gone after CRI-O's start-up GC"
        );
    }

    eprintln!("{}: rebooted (containerd)", containerd_node.name());
    containerd_node.reboot().unwrap();
    // containerd is up and has networked a pod since: its start is over, and it sent nothing.
    let probe = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: after-reboot\nspec:\n  nodeName: {}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: w\n    image: {}\n    imagePullPolicy: Never\n    command: [\"sleep\", \"3600\"]\n",
        containerd_node.name(),
        ipkeep_e2e::cluster::realnode::WORKLOAD_IMAGE
    );
    sys.apply(&probe);
    sys.wait_running("", &["after-reboot"]).await;
    assert!(
        allocation(containerd_node, &containerd_leaked_ip).is_file(),
        "containerd freed the leak {containerd_leaked_ip} ({containerd_leak}): it never sends GC or DEL for an attachment it does not know"
    );
    assert!(
        containerd_node
            .host_path(&format!(
                "/var/lib/cni/results/{CNI_NETWORK}-{containerd_leak}-eth0"
            ))
            .unwrap()
            .is_file(),
        "libcni's cached result of the leak is gone on the containerd node"
    );
    sys.kubectl(&["delete", "pod", "after-reboot", "--wait=false"]);
    unleak(containerd_node);
    sys.wait_file(&allocation(containerd_node, &containerd_leaked_ip), false)
        .await;

    sys.kubectl(&["scale", "statefulset", "db", "--replicas=2"]);
    let back = sys.wait_running("app=db", &["db-0", "db-1"]).await;
    for (name, p) in &back {
        assert_eq!(p.ips, pods[name].ips, "{name} after CRI-O's start-up GC");
        sys.wait_bound(p).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_image_and_chart_from_a_registry_every_node_pulls_and_pods_keep_their_addresses() {
    let t0 = Instant::now();
    // The same nodes with nothing installed, to this test alone: the install is its own.
    let held = realnode::use_shape(
        realnode::Shape::bare(NODES, NETWORK),
        realnode::Access::Spoils,
    )
    .await;
    let c = held.cluster().expect("this binary's own nodes");
    let booted = t0.elapsed();
    let t = Instant::now();
    let registry_server = Registry::start()
        .await
        .unwrap_or_else(|e| panic!("{}", ipkeep_e2e::error_chain(&e)));
    let release = registry::publish(
        c,
        &registry_server,
        &realnode::image_archive(),
        &ipkeep_e2e::testkit::chart_dir(),
    );
    registry::use_registry(c, &registry_server);
    let published = t.elapsed();
    let before = registry::node_images(c);
    registry::assert_absent(&before, &release);

    let t = Instant::now();
    let crio_node = node_running(c, NodeRuntime::CriO).name();
    let refused = registry::assert_refused_without_pull_secret(c, &crio_node, &release).await;
    eprintln!("{crio_node}: without the pull secret: {refused}");
    let refusal = t.elapsed();

    let t = Instant::now();
    registry::install(c, &registry_server, &release, &[]).await;
    let installed = t.elapsed();
    for (node, id) in registry::assert_pulled(c, &release, &before).await {
        eprintln!(
            "{node} ({}) pulled {id}",
            realnode::node(c, &node).runtime().name()
        );
    }

    let t = Instant::now();
    deleted_pods_return_on_cri_o(c, "crio-registry").await;
    eprintln!(
        "realnode crio registry install {}: nodes {:.1}s, registry and push {:.1}s, refusal {:.1}s, install with pulls {:.1}s, StatefulSet {:.1}s, total {:.1}s",
        release.version,
        booted.as_secs_f64(),
        published.as_secs_f64(),
        refusal.as_secs_f64(),
        installed.as_secs_f64(),
        t.elapsed().as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
}
