//! Real nodes: kubelet, containerd and runc run busybox pods on two nodes of this machine, each
//! in its own network and mount namespace; the API server serves `kubectl exec` and `logs`
//! through the kubelets; a pod reaches a pod on the other node and the `kubernetes` Service.
//! `ipkeep-e2e cluster up --nodes` / `load-image` / `down` leave nothing behind and put the
//! kubelet's sysctls back, also after the supervisor was killed (with or without its watchdog);
//! `cluster up --cni flannel` runs flanneld on each node, which `cluster exec` looks into.
//!
//! The tests run one at a time (each starts its own cluster), so that "nothing left" and "the
//! sysctls are back" are checked with no other cluster of this binary running.
//!
//! Needs root, the control plane binaries (`make cluster-bins`), the node binaries
//! (`make node-bins`) and flannel's (`make flannel-bins`); fails loudly, naming what to install, without them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    time::{Duration, Instant},
};

use ipkeep_e2e::cluster::realnode::{
    self, Cluster, ClusterOptions, Slot, WORKLOAD_IMAGE, flannel, host::KUBELET_SYSCTLS,
};
use ipkeep_e2e::command;

const POD_READY: Duration = Duration::from_secs(120);

/// A busybox pod pinned to `node` that says hello on stdout, then serves `/www` on port 8080.
fn web_pod(name: &str, node: &str) -> String {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "web",
                "image": WORKLOAD_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", format!("echo hello from {name}; exec httpd -f -p 8080 -h /www")],
                "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
            }],
        },
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_on_two_real_nodes_talk_and_answer_exec_and_logs() {
    let _machine = ipkeep_e2e::testkit::realnode::use_machine_alone().await;
    let t0 = Instant::now();
    let c = match Cluster::start(ClusterOptions::default()).await {
        Ok(c) => c,
        Err(e) => panic!("{}", ipkeep_e2e::error_chain(&e)),
    };
    eprintln!("two real nodes Ready in {:.1}s", t0.elapsed().as_secs_f64());
    assert_eq!(c.nodes().len(), 2);
    let ns = c.plane().fresh_namespace("realnode").await.unwrap();
    let [a, b] = [&c.nodes()[0], &c.nodes()[1]];
    for (pod, node) in [("web-a", a), ("web-b", b)] {
        c.kubectl(
            &["-n", &ns, "apply", "-f", "-"],
            Some(&web_pod(pod, &node.name())),
        )
        .unwrap();
    }
    let pa = c.wait_pod_ready(&ns, "web-a", POD_READY).await.unwrap();
    let pb = c.wait_pod_ready(&ns, "web-b", POD_READY).await.unwrap();
    let ip_of = |p: &k8s_openapi::api::core::v1::Pod| {
        p.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap()
    };
    let (ip_a, ip_b) = (ip_of(&pa), ip_of(&pb));
    let in_cidr = |ip: &str, node: &realnode::RealNode| {
        let prefix = node.pod_cidr().rsplit_once('.').unwrap().0.to_owned();
        ip.starts_with(&format!("{prefix}."))
    };
    assert!(in_cidr(&ip_a, a), "{ip_a} not in {}", a.pod_cidr());
    assert!(in_cidr(&ip_b, b), "{ip_b} not in {}", b.pod_cidr());

    // exec: the container's own eth0 holds the address the API reports.
    let addr = c
        .kubectl(
            &[
                "-n", &ns, "exec", "web-a", "--", "ip", "-4", "addr", "show", "eth0",
            ],
            None,
        )
        .unwrap();
    assert!(addr.contains(&format!("inet {ip_a}/24")), "{addr}");
    // logs: the kubelet serves the container's stdout.
    let logs = c.kubectl(&["-n", &ns, "logs", "web-b"], None).unwrap();
    assert!(logs.contains("hello from web-b"), "{logs}");

    // Pod to pod across nodes: web-a fetches web-b's page through both nodes and the bridge.
    let page = c
        .kubectl(
            &[
                "-n",
                &ns,
                "exec",
                "web-a",
                "--",
                "wget",
                "-qO-",
                &format!("http://{ip_b}:8080/"),
            ],
            None,
        )
        .unwrap();
    assert_eq!(page.trim(), "ipkeep-e2e workload");

    // The kubernetes Service: kube-proxy's rules on node b take web-b to the API server.
    let version = c
        .kubectl(
            &[
                "-n",
                &ns,
                "exec",
                "web-b",
                "--",
                "wget",
                "-qO-",
                "--no-check-certificate",
                &format!(
                    "https://{}/version",
                    realnode::layout::KUBERNETES_SERVICE_IP
                ),
            ],
            None,
        )
        .unwrap();
    assert!(version.contains("\"gitVersion\": \"v1.34"), "{version}");

    for n in c.nodes() {
        eprintln!("memory of {} (KiB): {:?}", n.name(), n.memory_kib());
    }

    // containerd and the kubelet restarted alone: web-b's container runs on, same sandbox.
    let sandbox_pid = |n: &realnode::RealNode| {
        n.exec(&[
            "sh",
            "-c",
            "ls /run/containerd/io.containerd.runtime.v2.task/k8s.io | sort",
        ])
        .unwrap()
    };
    let sandboxes = sandbox_pid(b);
    b.restart_runtime().unwrap();
    b.restart_kubelet().unwrap();
    let still = c.wait_pod_ready(&ns, "web-b", POD_READY).await.unwrap();
    assert_eq!(ip_of(&still), ip_b);
    assert_eq!(
        sandbox_pid(b),
        sandboxes,
        "a restart replaced web-b's containers"
    );

    // A reboot: every container goes with the node's /run and network namespace; the kubelet
    // starts web-b again in a new sandbox on a new veth.
    b.reboot().unwrap();
    let t0 = Instant::now();
    let deadline = t0 + POD_READY;
    loop {
        let now = sandbox_pid(b);
        if !now.is_empty() && now != sandboxes {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "web-b never got a new sandbox after the reboot"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let back = c.wait_pod_ready(&ns, "web-b", POD_READY).await.unwrap();
    assert!(in_cidr(&ip_of(&back), b), "{}", ip_of(&back));
    let logs = c.kubectl(&["-n", &ns, "logs", "web-b"], None).unwrap();
    assert!(logs.contains("hello from web-b"), "{logs}");
    eprintln!(
        "web-b Ready again {:.1}s after {} rebooted: {} (was {ip_b}; host-local's files survive the reboot)",
        t0.elapsed().as_secs_f64(),
        b.name(),
        ip_of(&back)
    );
}

fn e2e_command(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ipkeep-e2e"));
    command.args(args);
    command
}

/// `ipkeep-e2e ARGS`, whatever its exit status.
fn e2e(args: &[&str]) -> Output {
    command::run(&mut e2e_command(args), None)
        .unwrap_or_else(|e| panic!("{}", ipkeep_e2e::error_chain(&e)))
}

/// `ipkeep-e2e ARGS`'s stdout; the test fails with what it said if it fails.
fn e2e_ok(args: &[&str]) -> String {
    command::stdout_of(&mut e2e_command(args), None)
        .unwrap_or_else(|e| panic!("{}", ipkeep_e2e::error_chain(&e)))
}

/// The machine's own values: the record of a cluster still running or being cleaned up (its
/// kubelets' values are live now), else the live ones.
fn machine_sysctls() -> Vec<(String, String)> {
    match std::fs::read_to_string(realnode::host::sysctl_record()) {
        Ok(text) => {
            let record: serde_json::Value = serde_json::from_str(&text).unwrap();
            KUBELET_SYSCTLS
                .iter()
                .map(|k| (k.to_string(), record[k].as_str().unwrap().to_owned()))
                .collect()
        }
        Err(_) => sysctls(),
    }
}

fn sysctls() -> Vec<(String, String)> {
    KUBELET_SYSCTLS
        .iter()
        .map(|k| {
            let v = std::fs::read_to_string(Path::new("/proc/sys").join(k)).unwrap();
            (k.to_string(), v.trim().to_owned())
        })
        .collect()
}

fn state_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ipkeep-cluster-{name}-{}", std::process::id()))
}

/// `cluster up --nodes 1` in `dir`; the slot it took.
fn up_one_node(dir: &Path) -> Slot {
    up_nodes(dir, &["--nodes", "1"])
}

/// `cluster up` with `args` in `dir`; the slot it took.
fn up_nodes(dir: &Path, args: &[&str]) -> Slot {
    let d = dir.to_str().unwrap();
    let mut up = vec!["cluster", "up", "--state-dir", d];
    up.extend_from_slice(args);
    e2e_ok(&up);
    let info = nodes_info(dir);
    let slot = Slot::new(u8::try_from(info["slot"].as_u64().unwrap()).unwrap()).unwrap();
    let left = realnode::leftovers(slot);
    for thing in [
        "network namespace",
        "bridge",
        "cgroup",
        "processes",
        "mount",
    ] {
        assert!(
            left.iter().any(|l| l.starts_with(thing)),
            "a running node should have a {thing}: {left:?}"
        );
    }
    slot
}

/// Waits until the slot holds nothing.
fn wait_gone(slot: Slot, after: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = realnode::leftovers(slot);
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{after}, slot {} still holds {left:?}",
            slot.number()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// With no other real-node cluster on the machine, the sysctls are the machine's own again;
/// with one, their record is kept for the last cluster's cleanup to restore.
fn assert_sysctls_restored(machine: &[(String, String)]) {
    if realnode::slots_in_use().is_empty() {
        assert_eq!(
            sysctls(),
            machine,
            "the kubelet's sysctls were not put back"
        );
        assert!(!realnode::host::sysctl_record().exists());
    } else {
        eprintln!(
            "another real-node cluster runs on this machine: its cleanup restores the sysctls"
        );
        assert!(realnode::host::sysctl_record().exists());
    }
}

/// What `cluster up` wrote of the running nodes at `dir` (`nodes.json`).
fn nodes_info(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("nodes.json")).unwrap()).unwrap()
}

/// `cluster load-image` of the workload image into every node of the cluster at `dir` prints
/// its one name.
fn loads_the_workload_image(dir: &Path) {
    let images = realnode::node_image_dir(&realnode::node_bin_dir().unwrap()).unwrap();
    let printed = e2e_ok(&[
        "cluster",
        "load-image",
        images.join("workload.oci.tar").to_str().unwrap(),
        "--state-dir",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(printed, format!("{WORKLOAD_IMAGE}\n"));
}

/// `cluster down` of the cluster at `dir` in `slot`: nothing of it is left, and the sysctls the
/// machine had (`machine`) are back.
fn down_leaves_nothing(dir: &Path, slot: Slot, machine: &[(String, String)]) {
    e2e_ok(&["cluster", "down", "--state-dir", dir.to_str().unwrap()]);
    assert_eq!(realnode::leftovers(slot), Vec::<String>::new());
    assert!(!dir.exists());
    assert_sysctls_restored(machine);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_up_nodes_load_image_and_down_leave_nothing_and_restore_sysctls() {
    let _machine = ipkeep_e2e::testkit::realnode::use_machine_alone().await;
    let machine = machine_sysctls();
    let dir = state_dir("rn-down");
    let slot = up_one_node(&dir);
    loads_the_workload_image(&dir);
    down_leaves_nothing(&dir, slot, &machine);
}

/// `cluster up --cni flannel`: each node runs flanneld, whose lease and vxlan route `cluster
/// exec` shows from inside the node; `exec` passes the command's exit status on and names the
/// nodes when asked for one that is not there; `down` leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_up_with_flannel_answers_exec_inside_each_node_and_down_leaves_nothing() {
    let _machine = ipkeep_e2e::testkit::realnode::use_machine_alone().await;
    let machine = machine_sysctls();
    let dir = state_dir("rn-flannel");
    let d = dir.to_str().unwrap();
    let slot = up_nodes(&dir, &["--nodes", "2", "--cni", "flannel"]);
    let info = nodes_info(&dir);
    assert_eq!(info["cni"], "flannel");
    for (i, other) in [(0, 1), (1, 0)] {
        let node = slot.node(i).unwrap();
        let lease = e2e_ok(&[
            "cluster",
            "exec",
            &node.name(),
            "--state-dir",
            d,
            "--",
            "cat",
            flannel::SUBNET_FILE,
        ]);
        let own_first = node.pod_cidr().replace(".0/24", ".1/24");
        assert_eq!(
            flannel::leased_subnet(&lease),
            Some(own_first.as_str()),
            "{lease}"
        );
        let routes = e2e_ok(&[
            "cluster",
            "exec",
            &node.name(),
            "--state-dir",
            d,
            "--",
            "ip",
            "route",
        ]);
        let other = slot.node(other).unwrap();
        assert!(
            routes
                .lines()
                .any(|l| l.starts_with(&other.pod_cidr()) && l.contains(flannel::VXLAN_DEVICE)),
            "{}: no route to {} through {}:\n{routes}",
            node.name(),
            other.pod_cidr(),
            flannel::VXLAN_DEVICE
        );
    }
    let status = e2e(&[
        "cluster",
        "exec",
        "node-0",
        "--state-dir",
        d,
        "--",
        "sh",
        "-c",
        "exit 3",
    ]);
    assert_eq!(status.status.code(), Some(3), "{status:?}");
    let missing = e2e(&["cluster", "exec", "node-7", "--state-dir", d, "--", "true"]);
    assert!(!missing.status.success());
    let said = String::from_utf8_lossy(&missing.stderr);
    assert!(
        said.contains("no node node-7") && said.contains("node-0, node-1"),
        "{said}"
    );
    down_leaves_nothing(&dir, slot, &machine);
}

/// `cluster up --runtime cri-o --crio-nodes 1`: node-0 runs CRI-O, node-1 containerd, each
/// answering on its own socket; `load-image` reaches both runtimes; `cluster restart` and
/// `cluster reboot` strike a node through the supervisor (a daemon the node does not run is
/// refused, naming its runtime); `down` leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_up_with_a_cri_o_node_loads_images_into_each_runtime_and_strikes_nodes_by_hand() {
    let _machine = ipkeep_e2e::testkit::realnode::use_machine_alone().await;
    let machine = machine_sysctls();
    let dir = state_dir("rn-crio");
    let d = dir.to_str().unwrap();
    let slot = up_nodes(
        &dir,
        &["--nodes", "2", "--runtime", "cri-o", "--crio-nodes", "1"],
    );
    let info = nodes_info(&dir);
    assert_eq!(info["runtimes"], serde_json::json!(["cri-o", "containerd"]));
    let answers = |node: &str, socket: &str| {
        e2e(&[
            "cluster",
            "exec",
            node,
            "--state-dir",
            d,
            "--",
            "test",
            "-S",
            socket,
        ])
        .status
        .success()
    };
    loads_the_workload_image(&dir);
    e2e_ok(&["cluster", "restart", "node-0", "crio", "--state-dir", d]);
    let refused = e2e(&["cluster", "restart", "node-1", "crio", "--state-dir", d]);
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("containerd"), "{said}");
    e2e_ok(&["cluster", "reboot", "node-1", "--state-dir", d]);
    assert!(answers("node-0", "/run/crio/crio.sock"));
    assert!(answers("node-1", "/run/containerd/containerd.sock"));
    assert!(!answers("node-1", "/run/crio/crio.sock"));
    down_leaves_nothing(&dir, slot, &machine);
}

fn kill(pid: u32) {
    let pid = rustix::process::Pid::from_raw(i32::try_from(pid).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
}

fn supervisor_and_watchdog(dir: &Path) -> (u32, u32) {
    let owner = std::fs::read_to_string(dir.join("owner")).unwrap();
    let ready: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("ready")).unwrap()).unwrap();
    let watchdog = ready["pids"]["watchdog"].as_u64().unwrap();
    (
        owner.trim().parse().unwrap(),
        u32::try_from(watchdog).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_supervisor_leaves_nothing_once_its_watchdog_or_cluster_down_ran() {
    let _machine = ipkeep_e2e::testkit::realnode::use_machine_alone().await;
    let machine = machine_sysctls();

    // SIGKILL of the supervisor: its watchdog stops the daemons and reaps the nodes.
    let dir = state_dir("rn-crash");
    let slot = up_one_node(&dir);
    let (supervisor, _) = supervisor_and_watchdog(&dir);
    kill(supervisor);
    wait_gone(slot, "after the supervisor was killed");
    e2e_ok(&["cluster", "down", "--state-dir", dir.to_str().unwrap()]);
    assert_sysctls_restored(&machine);

    // SIGKILL of the supervisor and its watchdog at once: containers, namespaces, mounts and
    // cgroups stay until `cluster down` removes them.
    let dir = state_dir("rn-crash-hard");
    let slot = up_one_node(&dir);
    let (supervisor, watchdog) = supervisor_and_watchdog(&dir);
    kill(watchdog);
    kill(supervisor);
    let left = realnode::leftovers(slot);
    assert!(
        left.iter().any(|l| l.starts_with("network namespace")),
        "a hard crash should leave the node behind: {left:?}"
    );
    e2e_ok(&["cluster", "down", "--state-dir", dir.to_str().unwrap()]);
    assert_eq!(realnode::leftovers(slot), Vec::<String>::new());
    assert_sysctls_restored(&machine);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_node_binaries_or_a_bad_node_count_fail_saying_what_to_do() {
    let empty = state_dir("rn-nobins");
    std::fs::create_dir_all(&empty).unwrap();
    let options = ClusterOptions {
        node_bin_dir: Some(empty.clone()),
        ..ClusterOptions::default()
    };
    let e = Cluster::start(options).await.unwrap_err();
    let text = ipkeep_e2e::error_chain(&e);
    assert!(
        text.contains("has no kubelet") && text.contains("make node-bins"),
        "{text}"
    );
    std::fs::remove_dir(&empty).unwrap();

    for nodes in [0, 9] {
        let options = ClusterOptions {
            nodes,
            ..ClusterOptions::default()
        };
        let text = ipkeep_e2e::error_chain(&Cluster::start(options).await.unwrap_err());
        assert!(
            text.contains("invalid number of nodes") && text.contains("1 to 8"),
            "{text}"
        );
    }
}
