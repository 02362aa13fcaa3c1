//! The kubelet stand-in (`ipkeep-e2e node`) against the API test server, running the real CNI
//! chain: Debian's `bridge` delegating IPAM to the built `ipkeep`, in network namespaces made
//! with `ip netns add`.
//!
//! Needs root, `ip` and `/usr/lib/cni/bridge`, and the plugin built (`cargo build -p
//! ipkeep-plugin`, or `IPKEEP_PLUGIN_BIN`): without them these tests FAIL saying what is missing.
//! Every node has its own bridge and namespaces (named from the node's name), removed by a drop
//! guard also when an assertion fails; the pod CIDRs are private test ranges on a bridge with no
//! uplink, so nothing leaves the machine.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "fixtures/shared.rs"]
mod shared;

#[path = "fixtures/harness.rs"]
mod harness;
#[path = "fixtures/node_harness.rs"]
mod node_harness;

use std::{net::IpAddr, process::Command, time::SystemTime};

use harness::wait_for;
use ipkeep_e2e::node::{
    cni::{self, Attachment, PodRef},
    host::{self, CniExec},
};
use ipkeep_plugin::{
    netdir::NetworkDir,
    reservation::{
        FORMAT_VERSION, ReservationFile, Timestamp, remove_reservation, write_reservation,
    },
};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Event, Node, Pod},
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use node_harness::{TestNode, addresses_in, pod};

fn pods(server: &ipkeep_e2e::apiserver::TestServer) -> Api<Pod> {
    Api::namespaced(server.client(), "default")
}

/// Waits until the pod is Running with a pod IP; the pod.
async fn wait_running(api: &Api<Pod>, name: &str) -> Pod {
    wait_for(
        &format!("pod {name} to be Running with a pod IP"),
        || async {
            let p = api.get_opt(name).await.unwrap()?;
            let s = p.status.as_ref()?;
            (s.phase.as_deref() == Some("Running") && s.pod_ip.is_some()).then_some(p)
        },
    )
    .await
}

fn pod_ip(p: &Pod) -> IpAddr {
    p.status
        .as_ref()
        .unwrap()
        .pod_ip
        .as_ref()
        .unwrap()
        .parse()
        .unwrap()
}

fn condition(p: &Pod, kind: &str) -> Option<String> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| c.status.clone())
}

/// The sandbox ID of the pod's running container (`ipkeep-standin://<id>`).
fn sandbox_id(p: &Pod) -> String {
    let statuses = p
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap();
    let id = statuses[0].container_id.as_ref().unwrap();
    id.strip_prefix("ipkeep-standin://").unwrap().to_owned()
}

/// Warning events of one pod.
async fn warnings(server: &ipkeep_e2e::apiserver::TestServer, pod: &str) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(server.client(), "default");
    events
        .list(&ListParams::default().fields(&format!("involvedObject.name={pod}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .collect()
}

/// The node's network directory as the plugin opens it (for the library reservation writer).
fn network_dir(node: &TestNode) -> NetworkDir {
    NetworkDir::open(&node.config.ipam_data_dir(), &node.config.network).unwrap()
}

fn reservation(pod: &str, ips: Vec<IpAddr>, release_time: Option<Timestamp>) -> ReservationFile {
    ReservationFile {
        version: FORMAT_VERSION,
        namespace: "default".into(),
        pod: pod.into(),
        ips,
        release_time,
        uid: format!("resv-{pod}"),
        node_name: None,
    }
}

/// A sandbox the test makes itself with the node's own network configuration, as another
/// runtime's (or a lost) sandbox would be: a namespace, then CNI ADD through `bridge`.
struct ForeignSandbox {
    exec: CniExec,
    attachment: Attachment,
    netns: String,
}

impl ForeignSandbox {
    fn add(node: &TestNode, tag: &str, pod_name: &str) -> (ForeignSandbox, Vec<(IpAddr, u8)>) {
        let netns = format!("ipkt-{}-{tag}", std::process::id());
        let _ = host::delete_netns(&netns);
        host::add_netns(&netns).unwrap();
        let exec = CniExec {
            bin_dirs: node.config.cni_bin_dirs.clone(),
            config: node.config.network_config(),
        };
        let attachment = Attachment {
            container_id: format!("{tag}-{}", std::process::id()),
            netns_path: host::netns_path(&netns),
            pod: PodRef {
                namespace: "default".into(),
                name: pod_name.into(),
                uid: format!("uid-{tag}"),
            },
        };
        let ips = exec.add(&attachment).unwrap();
        (
            ForeignSandbox {
                exec,
                attachment,
                netns,
            },
            ips,
        )
    }

    fn del(&self) {
        self.exec.del(&self.attachment).unwrap();
    }
}

impl Drop for ForeignSandbox {
    fn drop(&mut self) {
        let _ = host::delete_netns(&self.netns);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_registers_ready_with_its_pod_cidr_and_renews_its_lease() {
    let server = harness::start().await;
    let mut node = TestNode::new("standin-reg", "198.18.1.0/24", &server);
    node.start();
    let nodes: Api<Node> = Api::all(server.client());
    let registered = wait_for("Node standin-reg to be Ready", || async {
        let n = nodes.get_opt("standin-reg").await.unwrap()?;
        let ready = n
            .status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then_some(n)
    })
    .await;
    let spec = registered.spec.as_ref().unwrap();
    assert_eq!(spec.pod_cidr.as_deref(), Some("198.18.1.0/24"));
    assert_eq!(
        spec.pod_cidrs.as_deref(),
        Some(&["198.18.1.0/24".to_owned()][..])
    );
    let status = registered.status.as_ref().unwrap();
    assert_eq!(status.allocatable.as_ref().unwrap()["pods"].0, "250");
    assert_eq!(status.capacity.as_ref().unwrap()["cpu"].0, "1k");

    let leases: Api<Lease> = Api::namespaced(server.client(), "kube-node-lease");
    let first = wait_for("the node Lease to exist", || async {
        leases
            .get_opt("standin-reg")
            .await
            .unwrap()?
            .spec?
            .renew_time
    })
    .await;
    let lease = leases.get("standin-reg").await.unwrap();
    assert_eq!(
        lease.spec.as_ref().unwrap().holder_identity.as_deref(),
        Some("standin-reg")
    );
    assert_eq!(
        lease.metadata.owner_references.as_ref().unwrap()[0].uid,
        registered.metadata.uid.clone().unwrap(),
        "the Lease is owned by the Node"
    );
    wait_for("the node Lease to be renewed", || async {
        let renewed = leases.get("standin-reg").await.unwrap().spec?.renew_time?;
        (renewed.0 > first.0).then_some(())
    })
    .await;
    let heartbeat = |n: &Node| {
        n.status
            .as_ref()
            .unwrap()
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap()
            .last_heartbeat_time
            .clone()
            .unwrap()
    };
    let before = heartbeat(&registered);
    wait_for("the Ready condition's heartbeat to move", || async {
        let n = nodes.get("standin-reg").await.unwrap();
        (heartbeat(&n).0 > before.0).then_some(())
    })
    .await;

    // A second stand-in for the same node (it would tear down the first one's sandboxes) is refused.
    let second = Command::new(node_harness::standin_bin())
        .args([
            "node",
            "--name",
            "standin-reg",
            "--pod-cidr",
            "198.18.1.0/24",
        ])
        .arg("--data-dir")
        .arg(node.scratch().join("other-data"))
        .arg("--cni-bin-dir")
        .arg(&node.config.cni_bin_dirs[0])
        .arg("--kubeconfig")
        .arg(&node.kubeconfig)
        .output()
        .unwrap();
    assert!(!second.status.success());
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(
        said.contains("another stand-in runs for this node"),
        "the second stand-in says why it stops: {said}"
    );

    // A deleted Node is registered again, as a kubelet does.
    nodes
        .delete("standin-reg", &DeleteParams::default())
        .await
        .unwrap();
    let again = wait_for("Node standin-reg to be registered again", || async {
        let n = nodes.get_opt("standin-reg").await.unwrap()?;
        (n.metadata.uid != registered.metadata.uid).then_some(n)
    })
    .await;
    assert_eq!(
        again.spec.unwrap().pod_cidr.as_deref(),
        Some("198.18.1.0/24")
    );
    assert!(node.stop().await.success(), "{}", node.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_gets_an_address_configured_in_its_namespace_and_deletion_tears_it_down() {
    let server = harness::start().await;
    let mut node = TestNode::new("standin-pod", "198.18.2.0/24", &server);
    node.start();
    let api = pods(&server);
    api.create(&PostParams::default(), &pod("web-0", "standin-pod"))
        .await
        .unwrap();
    let running = wait_running(&api, "web-0").await;

    let ip = pod_ip(&running);
    assert!(
        cni::cidr_contains("198.18.2.0/24", ip),
        "{ip} is not in the pod CIDR"
    );
    let status = running.status.as_ref().unwrap();
    assert_eq!(
        status.pod_ips.as_ref().unwrap()[0].ip,
        ip.to_string(),
        "podIPs[0] == podIP"
    );
    for kind in ["Initialized", "ContainersReady", "Ready", "PodScheduled"] {
        assert_eq!(condition(&running, kind).as_deref(), Some("True"), "{kind}");
    }
    let container = &status.container_statuses.as_ref().unwrap()[0];
    assert!(container.ready && container.state.as_ref().unwrap().running.is_some());
    assert_eq!(status.host_ip.as_deref(), Some("127.0.0.1"));

    let netns = node.netns();
    assert_eq!(netns.len(), 1, "one namespace for one pod: {netns:?}");
    assert_eq!(
        addresses_in(&netns[0]),
        vec![ip],
        "the pod IP is configured on eth0 in {}",
        netns[0]
    );
    let id = sandbox_id(&running);
    assert_eq!(
        node.allocations(),
        vec![(ip, id.clone())],
        "ipkeep allocated the address to the sandbox"
    );
    assert!(
        host::link_exists(&node.bridge()),
        "the node's bridge {} exists",
        node.bridge()
    );

    api.delete("web-0", &DeleteParams::default()).await.unwrap();
    wait_for("pod web-0 to be gone", || async {
        api.get_opt("web-0").await.unwrap().is_none().then_some(())
    })
    .await;
    wait_for("the pod's namespace to be removed", || async {
        node.netns().is_empty().then_some(())
    })
    .await;
    wait_for("CNI DEL to free the pod's address", || async {
        node.allocations().is_empty().then_some(())
    })
    .await;
    assert!(
        node.log()
            .contains(&format!("tore down sandbox {}", &id[..16])),
        "{}",
        node.log()
    );

    // A second pod, then SIGTERM: every sandbox is torn down (DEL) and the bridge removed.
    api.create(&PostParams::default(), &pod("web-1", "standin-pod"))
        .await
        .unwrap();
    wait_running(&api, "web-1").await;
    assert!(node.stop().await.success(), "{}", node.log());
    assert!(
        node.netns().is_empty(),
        "namespaces left after SIGTERM: {:?}",
        node.netns()
    );
    assert!(
        node.allocations().is_empty(),
        "allocations left after SIGTERM: {:?}",
        node.allocations()
    );
    assert!(
        !host::link_exists(&node.bridge()),
        "the bridge is removed on exit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack_pod_gets_one_address_per_family_in_the_order_of_the_pod_cidrs() {
    let server = harness::start().await;
    let cidrs = ["198.18.7.0/24", "2001:db8:7::/64"];
    let mut node = TestNode::with_cidrs("standin-dual", &cidrs, &server);
    node.start();
    let api = pods(&server);
    api.create(&PostParams::default(), &pod("web-0", "standin-dual"))
        .await
        .unwrap();
    let running = wait_running(&api, "web-0").await;
    let ips: Vec<IpAddr> = running
        .status
        .as_ref()
        .unwrap()
        .pod_ips
        .as_ref()
        .unwrap()
        .iter()
        .map(|p| p.ip.parse().unwrap())
        .collect();
    assert_eq!(ips.len(), 2, "{ips:?}");
    assert!(
        cni::cidr_contains(cidrs[0], ips[0]) && cni::cidr_contains(cidrs[1], ips[1]),
        "{ips:?}"
    );
    assert_eq!(pod_ip(&running), ips[0], "podIP is podIPs[0]");
    let netns = node.netns();
    let mut configured = addresses_in(&netns[0]);
    configured.sort();
    let mut want = ips.clone();
    want.sort();
    assert_eq!(configured, want, "both addresses are configured on eth0");
    let nodes: Api<Node> = Api::all(server.client());
    let registered = nodes.get("standin-dual").await.unwrap();
    assert_eq!(
        registered.spec.unwrap().pod_cidrs.unwrap(),
        cidrs.map(str::to_owned).to_vec()
    );
    assert!(node.stop().await.success(), "{}", node.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_add_leaves_the_pod_pending_with_the_plugins_message_and_is_retried() {
    let server = harness::start().await;
    // A /30: the bridge takes .1 as gateway, .2 is the only address a pod can get.
    let mut node = TestNode::new("standin-fail", "198.18.3.0/30", &server);
    let only: IpAddr = "198.18.3.2".parse().unwrap();
    write_reservation(
        &network_dir(&node),
        &reservation("someone-else", vec![only], None),
    )
    .unwrap();
    node.start();
    let api = pods(&server);
    api.create(&PostParams::default(), &pod("blocked", "standin-fail"))
        .await
        .unwrap();

    let events = wait_for("a Warning event on pod blocked", || async {
        let w = warnings(&server, "blocked").await;
        (!w.is_empty()).then_some(w)
    })
    .await;
    let event = &events[0];
    assert_eq!(event.reason.as_deref(), Some("FailedCreatePodSandBox"));
    let message = event.message.clone().unwrap();
    assert!(
        message.contains("no IP addresses available in range set"),
        "the event carries the plugin's message: {message}"
    );
    let pending = wait_for("pod blocked to be Pending and not Ready", || async {
        let p = api.get("blocked").await.unwrap();
        (p.status.as_ref()?.phase.as_deref() == Some("Pending")).then_some(p)
    })
    .await;
    assert_eq!(condition(&pending, "Ready").as_deref(), Some("False"));
    assert!(pending.status.as_ref().unwrap().pod_ip.is_none());
    assert!(
        node.allocations().is_empty(),
        "a failed ADD allocates nothing: {:?}",
        node.allocations()
    );

    // The reservation goes: the stand-in's next retry succeeds.
    remove_reservation(&network_dir(&node), "default", "someone-else").unwrap();
    let running = wait_running(&api, "blocked").await;
    assert_eq!(pod_ip(&running), only);
    assert_eq!(
        node.netns().len(),
        1,
        "failed attempts leave no namespace behind: {:?}",
        node.netns()
    );
    assert!(node.stop().await.success(), "{}", node.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_again_later_is_retried_until_the_old_sandbox_is_deleted() {
    let server = harness::start().await;
    let mut node = TestNode::new("standin-retry", "198.18.4.0/24", &server);
    node.start();
    node.wait_ready().await;
    // The pod's old sandbox (force-deleted pod, DEL not run yet) holds the reserved address.
    // ipkeep finds the reservation only through K8S_POD_NAMESPACE/K8S_POD_NAME in CNI_ARGS, so
    // the code 11 below also proves the stand-in passes them.
    let (old, ips) = ForeignSandbox::add(&node, "old", "db-0");
    let held = ips[0].0;
    let released =
        Timestamp::from_system_time(SystemTime::now() + std::time::Duration::from_secs(86_400));
    write_reservation(
        &network_dir(&node),
        &reservation("db-0", vec![held], Some(released)),
    )
    .unwrap();

    let api = pods(&server);
    api.create(&PostParams::default(), &pod("db-0", "standin-retry"))
        .await
        .unwrap();
    let events = wait_for("a Warning event saying to try again later", || async {
        let w = warnings(&server, "db-0").await;
        (!w.is_empty()).then_some(w)
    })
    .await;
    let message = events[0].message.clone().unwrap();
    assert!(
        message.contains(&old.attachment.container_id),
        "the code-11 message names the sandbox holding the address: {message}"
    );
    wait_for("the stand-in to retry after code 11", || async {
        (node.log().matches("(CNI code 11)").count() >= 2).then_some(())
    })
    .await;
    assert!(
        api.get("db-0")
            .await
            .unwrap()
            .status
            .and_then(|s| s.pod_ip)
            .is_none()
    );

    old.del();
    let running = wait_running(&api, "db-0").await;
    assert_eq!(
        pod_ip(&running),
        held,
        "after the old DEL the pod gets its reserved address"
    );
    assert!(node.stop().await.success(), "{}", node.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_cleans_up_what_pods_deleted_while_the_node_was_down_left() {
    let server = harness::start().await;
    let mut node = TestNode::new("standin-restart", "198.18.5.0/24", &server);
    node.start();
    let api = pods(&server);
    for name in ["gone", "stays"] {
        api.create(&PostParams::default(), &pod(name, "standin-restart"))
            .await
            .unwrap();
    }
    let gone = wait_running(&api, "gone").await;
    let stays = wait_running(&api, "stays").await;
    let stays_netns = node
        .netns()
        .into_iter()
        .find(|ns| addresses_in(ns).contains(&pod_ip(&stays)))
        .unwrap();

    node.kill();
    api.delete("gone", &DeleteParams::default()).await.unwrap();
    wait_for("pod gone to be deleted while the node is down", || async {
        api.get_opt("gone").await.unwrap().is_none().then_some(())
    })
    .await;
    // A sandbox lost without DEL (its namespace vanished, its allocation stayed), and a stale
    // namespace with the node's prefix but no record.
    let (lost, lost_ips) = ForeignSandbox::add(&node, "lost", "lost-pod");
    host::delete_netns(&lost.netns).unwrap();
    let stale = format!("ipk-{}-deadbeef", node.tag());
    host::add_netns(&stale).unwrap();
    assert_eq!(node.allocations().len(), 3);
    assert_eq!(node.netns().len(), 3, "{:?}", node.netns());

    node.start();
    node.wait_ready().await;
    assert_eq!(
        node.netns(),
        vec![stays_netns.clone()],
        "only the live pod's namespace is left"
    );
    assert_eq!(
        node.allocations(),
        vec![(pod_ip(&stays), sandbox_id(&stays))],
        "DEL freed {} of the deleted pod and GC freed {} of the lost sandbox",
        pod_ip(&gone),
        lost_ips[0].0
    );
    assert!(
        node.log()
            .contains(&format!("tore down sandbox {}", &sandbox_id(&gone)[..16])),
        "the deleted pod's sandbox was torn down with DEL: {}",
        node.log()
    );
    assert_eq!(
        addresses_in(&stays_netns),
        vec![pod_ip(&stays)],
        "the live pod's sandbox is kept as it was"
    );
    let still = api.get("stays").await.unwrap();
    assert_eq!(
        sandbox_id(&still),
        sandbox_id(&stays),
        "no new sandbox for a pod that kept its own"
    );
    assert!(node.stop().await.success(), "{}", node.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_runs_as_a_supervised_child() {
    let server = harness::start().await;
    let mut node = TestNode::new("standin-agent", "198.18.6.0/24", &server);
    let calls = node.scratch().join("agent-calls");
    let script = node.scratch().join("fake-agent");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"$$ $*\" >> {}\nexec sleep 600\n",
            calls.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    node.extra_args = vec!["--agent-bin".into(), script.display().to_string()];
    node.start();

    let lines = |n: usize| {
        let calls = calls.clone();
        move || {
            let text = std::fs::read_to_string(&calls).unwrap_or_default();
            let lines: Vec<String> = text.lines().map(str::to_owned).collect();
            async move { (lines.len() >= n).then_some(lines) }
        }
    };
    let first = wait_for("the agent to be started", lines(1)).await;
    let (pid, args) = first[0].split_once(' ').unwrap();
    assert_eq!(
        args,
        format!(
            "agent --node-name standin-agent --data-dir {} --network podnet",
            node.config.ipam_data_dir().display()
        )
    );
    Command::new("kill").args(["-KILL", pid]).status().unwrap();
    let second = wait_for("the agent to be restarted after it died", lines(2)).await;
    let (pid2, _) = second[1].split_once(' ').unwrap();
    assert_ne!(pid, pid2);
    assert!(node.stop().await.success(), "{}", node.log());
    assert!(
        !std::path::Path::new(&format!("/proc/{pid2}")).exists(),
        "the agent is stopped with the node"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_run_in_one_process_through_the_library_and_each_serves_only_its_pods() {
    let server = harness::start().await;
    let a = TestNode::new("standin-lib-a", "198.18.10.0/24", &server);
    let b = TestNode::new("standin-lib-b", "198.18.11.0/24", &server);
    let mut stops = Vec::new();
    let mut tasks = Vec::new();
    for node in [&a, &b] {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        stops.push(stop);
        tasks.push(tokio::spawn(ipkeep_e2e::node::run(
            server.client(),
            node.config.clone(),
            async move {
                let _ = stopped.await;
            },
        )));
    }
    let api = pods(&server);
    api.create(&PostParams::default(), &pod("on-a", "standin-lib-a"))
        .await
        .unwrap();
    api.create(&PostParams::default(), &pod("on-b", "standin-lib-b"))
        .await
        .unwrap();
    let on_a = wait_running(&api, "on-a").await;
    let on_b = wait_running(&api, "on-b").await;
    assert!(
        cni::cidr_contains("198.18.10.0/24", pod_ip(&on_a)),
        "{}",
        pod_ip(&on_a)
    );
    assert!(
        cni::cidr_contains("198.18.11.0/24", pod_ip(&on_b)),
        "{}",
        pod_ip(&on_b)
    );
    assert_eq!(a.netns().len(), 1, "{:?}", a.netns());
    assert_eq!(b.netns().len(), 1, "{:?}", b.netns());
    assert_eq!(addresses_in(&a.netns()[0]), vec![pod_ip(&on_a)]);
    assert_eq!(addresses_in(&b.netns()[0]), vec![pod_ip(&on_b)]);
    assert_ne!(a.bridge(), b.bridge());
    assert!(host::link_exists(&a.bridge()) && host::link_exists(&b.bridge()));

    for stop in stops {
        stop.send(()).unwrap();
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    for node in [&a, &b] {
        assert!(node.netns().is_empty(), "{:?}", node.netns());
        assert!(
            !host::link_exists(&node.bridge()),
            "{} removed",
            node.bridge()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_deleted_pod_recreated_before_its_old_sandbox_is_deleted_gets_its_address_back() {
    let server = harness::start().await;
    let mut node = TestNode::new("standin-force", "198.18.12.0/24", &server);
    // A slow runtime: the old sandbox's DEL comes 1.5 s after the pod is gone.
    node.config.teardown_delay = std::time::Duration::from_millis(1500);
    node.start();
    let api = pods(&server);
    api.create(&PostParams::default(), &pod("db-0", "standin-force"))
        .await
        .unwrap();
    let first = wait_running(&api, "db-0").await;
    let (ip, old_id) = (pod_ip(&first), sandbox_id(&first));

    // What the agent writes when the controller releases the reservation of a force-deleted pod.
    let released =
        Timestamp::from_system_time(SystemTime::now() + std::time::Duration::from_secs(86_400));
    write_reservation(
        &network_dir(&node),
        &reservation("db-0", vec![ip], Some(released)),
    )
    .unwrap();
    api.delete(
        "db-0",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    api.create(&PostParams::default(), &pod("db-0", "standin-force"))
        .await
        .unwrap();

    let events = wait_for(
        "a try-again-later Warning on the re-created pod",
        || async {
            let w = warnings(&server, "db-0").await;
            (!w.is_empty()).then_some(w)
        },
    )
    .await;
    let message = events[0].message.clone().unwrap();
    assert!(
        message.contains(&old_id),
        "the new sandbox's ADD came before the old DEL and was told which sandbox holds the address: {message}"
    );
    let second = wait_for("the re-created pod to run with a new sandbox", || async {
        let p = api.get("db-0").await.unwrap();
        let running = p.status.as_ref()?.phase.as_deref() == Some("Running");
        (running && p.status.as_ref()?.pod_ip.is_some() && sandbox_id(&p) != old_id).then_some(p)
    })
    .await;
    assert_eq!(
        pod_ip(&second),
        ip,
        "the re-created pod got its reserved address back"
    );
    assert_ne!(first.metadata.uid, second.metadata.uid);
    assert_eq!(node.allocations(), vec![(ip, sandbox_id(&second))]);
    assert_eq!(node.netns().len(), 1, "{:?}", node.netns());
    assert!(node.stop().await.success(), "{}", node.log());
}

#[test]
fn without_root_the_stand_in_refuses_to_start_and_says_why() {
    node_harness::require_root_and_cni();
    let scratch = node_harness::Scratch::new("nonroot");
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(node_harness::standin_bin())
        .args([
            "node",
            "--name",
            "standin-nonroot",
            "--pod-cidr",
            "198.18.13.0/24",
        ])
        .arg("--data-dir")
        .arg(scratch.path().join("data"))
        .arg("--cni-bin-dir")
        .arg(scratch.path())
        .output()
        .expect("setpriv (util-linux) runs the stand-in as nobody");
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("needs root"), "{said}");
    assert!(
        !scratch.path().join("data").exists(),
        "nothing was made before the refusal"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_network_pods_run_with_the_node_address_and_no_sandbox() {
    let server = harness::start().await;
    let mut node = TestNode::new("standin-hostnet", "198.18.14.0/24", &server);
    node.start();
    let api = pods(&server);
    let mut manifest = pod("agent-x", "standin-hostnet");
    manifest.spec.as_mut().unwrap().host_network = Some(true);
    api.create(&PostParams::default(), &manifest).await.unwrap();
    let running = wait_running(&api, "agent-x").await;
    assert_eq!(pod_ip(&running), IpAddr::from([127, 0, 0, 1]));
    assert!(node.netns().is_empty(), "no namespace: {:?}", node.netns());
    assert!(
        node.allocations().is_empty(),
        "no address allocated: {:?}",
        node.allocations()
    );
    assert!(node.stop().await.success(), "{}", node.log());
}
