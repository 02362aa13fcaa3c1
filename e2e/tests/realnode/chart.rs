//! The chart on real nodes, as the README tells a user: `make image`'s archive imported into each
//! node's containerd (`cluster load-image`), `helm install` from `charts/ipkeep` with the local
//! image and `cni.replaceHostLocal=true`; the kubelets run the controller and the agents, the
//! agents' init container installs the plugin in place of host-local, and containerd calls it:
//! a StatefulSet pod deleted with `kubectl delete pod` comes back with the same address, seen
//! from inside the pod and reached from a pod on the other node.
//!
//! Needs root, `make cluster-bins`, `make node-bins` and `make image` (the archive
//! `target/image/ipkeep.oci.tar`, or `IPKEEP_IMAGE_ARCHIVE`); fails loudly without them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{path::Path, time::Duration};

use ipkeep_e2e::cluster::realnode::{Cluster, WORKLOAD_IMAGE};
use ipkeep_e2e::testkit::realnode;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::ListParams};

const READY: Duration = Duration::from_secs(180);

fn pod_ips(pod: &Pod) -> Vec<String> {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ips.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|p| p.ip)
        .collect()
}

/// A StatefulSet of the busybox workload serving HTTP, its pods pinned to `node` and annotated
/// to keep their addresses.
fn web_statefulset(node: &str) -> String {
    serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "web"},
        "spec": {
            "serviceName": "web",
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {
                    "labels": {"app": "web"},
                    "annotations": {"ipkeep.dev/retain": "true", "ipkeep.dev/retain-for": "10m"},
                },
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "terminationGracePeriodSeconds": 2,
                    "containers": [{
                        "name": "web",
                        "image": WORKLOAD_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["httpd", "-f", "-p", "8080", "-h", "/www"],
                        "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                    }],
                },
            },
        },
    })
    .to_string()
}

/// A client pod on `node` that just waits.
fn client_pod(node: &str) -> String {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "client"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "client",
                "image": WORKLOAD_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
            }],
        },
    })
    .to_string()
}

/// Two plain nodes with nothing installed, to this test alone: it installs the chart itself, and
/// the cluster goes with it.
async fn cluster() -> (realnode::Nodes, &'static Cluster) {
    let nodes = realnode::use_shape(
        realnode::Shape::bare(2, realnode::PLAIN),
        realnode::Access::Spoils,
    )
    .await;
    let c = nodes.cluster().expect("this binary's own nodes");
    (nodes, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_installs_on_real_nodes_and_a_deleted_statefulset_pod_keeps_its_address() {
    let archive = realnode::image_archive();
    let (_nodes, c) = cluster().await;

    // The image, as a user without a registry loads it.
    let names = c.load_image(&archive).unwrap();
    assert_eq!(names.len(), 1, "{names:?}");
    let (repository, tag) = names[0].rsplit_once(':').unwrap();

    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/ipkeep");
    realnode::release_namespace(c);
    let out = ipkeep_e2e::command::run(
        c.plane()
            .helm()
            .args(["install", "ipkeep"])
            .arg(&chart)
            .args(["--namespace", realnode::RELEASE_NS])
            .args(["--set", &format!("image.repository={repository}")])
            .args(["--set", &format!("image.tag={tag}")])
            .args(["--set", "image.pullPolicy=Never"])
            .args(["--set", "cni.replaceHostLocal=true"])
            .args(["--wait", "--timeout", "3m"]),
        None,
    )
    .unwrap();
    assert!(
        out.status.success(),
        "helm install failed: {}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        c.kubectl(&["-n", "ipkeep-system", "get", "pods", "-o", "wide"], None)
            .unwrap_or_default()
    );

    // Controller and agent pods Running and Ready, an agent on every node.
    let pods: Api<Pod> = Api::namespaced(c.plane().client().unwrap(), "ipkeep-system");
    let list = pods.list(&ListParams::default()).await.unwrap();
    let mut agents_on = Vec::new();
    let mut controllers = 0;
    for p in &list.items {
        let name = p.metadata.name.clone().unwrap();
        let ready = c
            .wait_pod_ready("ipkeep-system", &name, READY)
            .await
            .unwrap();
        let component = ready
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app.kubernetes.io/component").cloned())
            .unwrap_or_default();
        match component.as_str() {
            "agent" => agents_on.push(ready.spec.and_then(|s| s.node_name).unwrap()),
            "controller" => controllers += 1,
            other => panic!("unexpected pod {name} of component {other:?}"),
        }
    }
    agents_on.sort();
    let mut node_names: Vec<String> = c.nodes().iter().map(|n| n.name()).collect();
    node_names.sort();
    assert_eq!(agents_on, node_names);
    assert_eq!(controllers, 2);

    // The init container put ipkeep in place of host-local, keeping Debian's original.
    let debian_host_local = std::fs::read("/usr/lib/cni/host-local").unwrap();
    for n in c.nodes() {
        let bin = n.host_path("/opt/cni/bin").unwrap();
        let orig = std::fs::read(bin.join("host-local.ipkeep-orig")).unwrap();
        assert!(
            orig == debian_host_local,
            "{}: host-local.ipkeep-orig is not Debian's host-local",
            n.name()
        );
        let installed = std::fs::read(bin.join("host-local")).unwrap();
        let ipkeep = std::fs::read(bin.join("ipkeep")).unwrap();
        assert!(
            installed == ipkeep,
            "{}: host-local is not ipkeep",
            n.name()
        );
        assert!(
            installed != debian_host_local,
            "{}: host-local is still Debian's",
            n.name()
        );
    }

    // A StatefulSet on node-1 keeping its addresses, a client on node-0.
    let ns = c.plane().fresh_namespace("chart").await.unwrap();
    let (server_node, client_node) = (&c.nodes()[1], &c.nodes()[0]);
    c.kubectl(
        &["-n", &ns, "apply", "-f", "-"],
        Some(&web_statefulset(&server_node.name())),
    )
    .unwrap();
    c.kubectl(
        &["-n", &ns, "apply", "-f", "-"],
        Some(&client_pod(&client_node.name())),
    )
    .unwrap();
    c.wait_pod_ready(&ns, "web-0", READY).await.unwrap();
    let before = c.wait_pod_ready(&ns, "web-1", READY).await.unwrap();
    c.wait_pod_ready(&ns, "client", READY).await.unwrap();
    let ips_before = pod_ips(&before);
    assert_eq!(ips_before.len(), 1, "{ips_before:?}");

    // The reservation is on the node before the pod goes: the agent wrote it.
    let reserved = server_node
        .host_path(&format!("/var/lib/cni/networks/cbr0/reserved/{ns}/web-1"))
        .unwrap();
    let deadline = std::time::Instant::now() + READY;
    while !reserved.is_file() {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent never wrote {}",
            reserved.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    c.kubectl(&["-n", &ns, "delete", "pod", "web-1"], None)
        .unwrap();
    let uid_before = before.metadata.uid.clone().unwrap();
    let deadline = std::time::Instant::now() + READY;
    let after = loop {
        let p = c.wait_pod_ready(&ns, "web-1", READY).await.unwrap();
        if p.metadata.uid.as_deref() != Some(uid_before.as_str()) {
            break p;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "web-1 was never re-created"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        pod_ips(&after),
        ips_before,
        "web-1 came back with another address"
    );
    let ip = &ips_before[0];

    // From inside: the kept address is on eth0. From the other node: it answers.
    let addr = c
        .kubectl(
            &[
                "-n", &ns, "exec", "web-1", "--", "ip", "-4", "addr", "show", "eth0",
            ],
            None,
        )
        .unwrap();
    assert!(addr.contains(&format!("inet {ip}/")), "{addr}");
    let page = c
        .kubectl(
            &[
                "-n",
                &ns,
                "exec",
                "client",
                "--",
                "wget",
                "-qO-",
                &format!("http://{ip}:8080/"),
            ],
            None,
        )
        .unwrap();
    assert_eq!(page.trim(), "ipkeep-e2e workload");
    eprintln!(
        "web-1 kept {ip} across kubectl delete pod; reached from {}",
        client_node.name()
    );

    // containerd ran the plugin, and the plugin said why it gave that address.
    let log = std::fs::read_to_string(server_node.runtime_log()).unwrap();
    let decisions: Vec<&str> = log.lines().filter(|l| l.contains("ipkeep: ")).collect();
    for l in &decisions {
        eprintln!("containerd on {}: {l}", server_node.name());
    }
    let want = format!("pod {ns}/web-1: handing out its reserved address {ip}");
    assert!(
        decisions.iter().any(|l| l.contains(&want)),
        "containerd's log on {} has no line {want:?}",
        server_node.name()
    );
}
