//! Real nodes: kubelet, containerd and runc run busybox pods on two nodes of this machine, each
//! in its own network and mount namespace; the API server serves `kubectl exec` and `logs`
//! through the kubelets; a pod reaches a pod on the other node and the `kubernetes` Service.
//!
//! Needs root, the control plane binaries (`make cluster-bins`) and the node binaries
//! (`make node-bins`); fails loudly, naming what to install, without them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use ipkeep_e2e::cluster::realnode::{self, RealCluster, WORKLOAD_IMAGE};

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

async fn cluster() -> &'static RealCluster {
    match realnode::shared().await {
        Ok(c) => c,
        Err(e) => panic!("{}", ipkeep_e2e::error_chain(&e)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_on_two_real_nodes_talk_and_answer_exec_and_logs() {
    let c = cluster().await;
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
}
