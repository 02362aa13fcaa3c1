//! ipkeep's own pods under fault on real nodes, the chart installed as the README says: the agent
//! pod of the pods' node and the controller leader pod deleted with `kubectl delete pod` while
//! pods come and go; `helm upgrade` (every agent and controller pod replaced) while a pod returns:
//! the node's `host-local` stays ipkeep throughout and the pod gets its address; Debian's
//! host-local written over it (`install -m 755`) and then a k3s-style symlink: the agent puts
//! ipkeep back at once each time (the window is printed) and keeps the newest original; then `helm
//! uninstall` of the release installed with `cni.replaceHostLocal=true`: host-local is back in
//! `/opt/cni/bin`, every allocation stays valid (the running pods keep their addresses, a new pod
//! gets a free one).
//!
//! One test, its steps in order: they act on the release every test of a binary shares.
//! Needs root, `make cluster-bins`, `make node-bins` and `make image`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::testkit;
use std::collections::BTreeMap;

use ipkeep_e2e::cluster::realnode::Cluster;
use ipkeep_e2e::testkit::realnode::{RELEASE, RELEASE_NS, assert_on_eth0};
use ipkeep_e2e::testkit::system::{RunningPod, System, statefulset};
use ipkeep_e2e::testkit::{kubectl_ok, realnode, wait_for};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, api::ListParams};

/// The host-local every node starts with (Debian's, copied into each node's `/opt/cni/bin`).
const DEBIAN_HOST_LOCAL: &str = "/usr/lib/cni/host-local";

/// A fault of ipkeep's pods: what it is, the workload pod deleted meanwhile, how it is done.
type Fault<'a> = (&'static str, &'static str, Box<dyn Fn() + 'a>);

/// kubectl in the release's namespace.
fn release_kubectl(c: &Cluster, args: &[&str]) -> String {
    let mut all = vec!["-n", RELEASE_NS];
    all.extend_from_slice(args);
    kubectl_ok(c.plane(), &all, None)
}

/// The controller replica holding the leader Lease (its pod's name).
async fn leader(c: &Cluster) -> String {
    let leases: Api<Lease> = Api::namespaced(c.plane().client().unwrap(), RELEASE_NS);
    wait_for("a controller holding the leader Lease", || async {
        let list = leases.list(&ListParams::default()).await.ok()?;
        list.items
            .into_iter()
            .filter_map(|l| l.spec?.holder_identity)
            .find(|h| h.contains("controller"))
    })
    .await
}

/// Deletes `pod` (not waiting) and waits until it is back with the addresses it had.
async fn churn_one(sys: &System, pods: &BTreeMap<String, RunningPod>, pod: &str, during: &str) {
    let back = sys.wait_recreated(pod, &pods[pod].uid).await;
    assert_eq!(
        back.ips, pods[pod].ips,
        "{pod} lost its address during {during}"
    );
    sys.wait_bound(&back).await;
    assert_on_eth0(sys, &back).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_and_leader_pods_deleted_and_helm_upgrade_while_pods_churn_then_helm_uninstall() {
    // It uninstalls the chart at the end: the cluster goes with the test.
    let _nodes =
        realnode::use_shape(realnode::Shape::default_chart(), realnode::Access::Spoils).await;
    let (sys, c) = realnode::system("rn-operator").await;
    let node_a = sys.node_name(0).to_owned();
    let history = sys.record_reservations();
    let mut pods = sys.run_retained("web", 3, &node_a).await;

    // Rows: what happens to ipkeep, and which pod is deleted meanwhile.
    let agent_on_a = format!("spec.nodeName={node_a}");
    let leader_pod = leader(c).await;
    let faults: [Fault; 2] = [
        (
            "the agent pod of the node deleted",
            "web-1",
            Box::new(|| {
                release_kubectl(
                    c,
                    &[
                        "delete",
                        "pod",
                        "-l",
                        "app.kubernetes.io/component=agent",
                        "--field-selector",
                        &agent_on_a,
                        "--wait=false",
                    ],
                );
            }),
        ),
        (
            "the controller leader pod deleted",
            "web-2",
            Box::new(|| {
                release_kubectl(c, &["delete", "pod", &leader_pod, "--wait=false"]);
            }),
        ),
    ];
    for (during, pod, fault) in faults {
        eprintln!("{during}, {pod} deleted meanwhile");
        sys.kubectl(&["delete", "pod", pod, "--wait=false"]);
        fault();
        churn_one(&sys, &pods, pod, during).await;
        realnode::release_ready(c).await;
        pods = sys
            .wait_running("app=web", &["web-0", "web-1", "web-2"])
            .await;
    }
    assert!(!history.any_deleted(), "a reservation was deleted");

    // `helm upgrade` (new arguments: every agent and controller pod replaced) while web-0
    // returns. The replaced agent's preStop finds its DaemonSet still there and leaves ipkeep
    // as host-local: the kept original never goes back (watched every 10 ms, as a stand-in for
    // an ADD at any instant), and web-0 gets its address.
    let node = realnode::node(c, &node_a);
    let bin = node.host_path("/opt/cni/bin").unwrap();
    let kept = bin.join("host-local.ipkeep-orig");
    assert!(kept.exists(), "{} before the upgrade", kept.display());
    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = {
        let watching = watching.clone();
        let kept = kept.clone();
        std::thread::spawn(move || {
            let mut looks = 0_u64;
            while watching.load(std::sync::atomic::Ordering::Relaxed) {
                if !kept.exists() {
                    return Err(looks);
                }
                looks += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Ok(looks)
        })
    };
    sys.kubectl(&["delete", "pod", "web-0", "--wait=false"]);
    realnode::helm(
        c,
        &[
            "upgrade",
            RELEASE,
            testkit::chart_dir().to_str().unwrap(),
            "--namespace",
            RELEASE_NS,
            "--reuse-values",
            "--set",
            "logging.level=debug",
        ],
    );
    churn_one(&sys, &pods, "web-0", "helm upgrade").await;
    realnode::release_ready(c).await;
    watching.store(false, std::sync::atomic::Ordering::Relaxed);
    let looks = watcher.join().unwrap().unwrap_or_else(|after| {
        panic!(
            "the original host-local was put back during helm upgrade ({} gone after {after} looks)",
            kept.display()
        )
    });
    eprintln!("helm upgrade: host-local stayed ipkeep through {looks} looks");
    pods = sys
        .wait_running("app=web", &["web-0", "web-1", "web-2"])
        .await;

    // A package upgrade writes Debian's host-local over ipkeep (`install -m 755`, as dpkg and
    // `make install` do), then k3s-style a symlink to a multi-call binary replaces it: the agent
    // installs ipkeep again at once each time, keeps what was written as the new original, and
    // says so on the Node. The window is how long the other host-local stood there.
    let ipkeep_bytes = std::fs::read(bin.join("ipkeep")).unwrap();
    let is_ipkeep = |p: &std::path::Path| std::fs::read(p).is_ok_and(|b| b == ipkeep_bytes);
    let host_local_path = bin.join("host-local");
    let replaced_windows = [
        ("a package upgrade (install -m 755)", vec!["install", "-m", "755", DEBIAN_HOST_LOCAL, "/opt/cni/bin/host-local"]),
        ("a k3s-style re-link (a symlink to a multi-call binary)", vec!["sh", "-c", "cp /usr/lib/cni/host-local /opt/cni/bin/cni && ln -sfn cni /opt/cni/bin/host-local"]),
    ]
    .into_iter()
    .map(|(what, command)| {
        assert!(is_ipkeep(&host_local_path), "host-local is ipkeep before {what}");
        node.exec(&command).unwrap_or_else(|e| panic!("{what}: {e}"));
        let written = std::time::Instant::now();
        let stood = {
            let mut looks = 0_u32;
            while !is_ipkeep(&host_local_path) {
                looks += 1;
                assert!(looks < 60_000, "host-local was not ipkeep again 60 s after {what}");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            written.elapsed()
        };
        eprintln!("{what}: host-local was ipkeep again {:.1} ms after the command returned", stood.as_secs_f64() * 1000.0);
        (what, stood)
    })
    .collect::<Vec<_>>();
    assert_eq!(
        std::fs::read_link(&kept).unwrap(),
        std::path::Path::new("cni"),
        "the newest original (the symlink) is the one kept"
    );
    let nodes_events = wait_for("the Warnings HostLocalReplaced on the node", || async {
        let notes = realnode::node_event_notes(c, &node_a, "HostLocalReplaced").await;
        (notes.len() >= 2).then_some(notes)
    })
    .await;
    assert!(
        nodes_events.iter().any(|n| n.contains("overwritten")),
        "{nodes_events:?}"
    );
    assert!(
        nodes_events.iter().any(|n| n.contains("symlink")),
        "{nodes_events:?}"
    );
    sys.check("host-local written over ipkeep: ipkeep again at once, the newest original kept, a Warning on the Node");
    eprintln!("host-local guard windows: {replaced_windows:?}");
    // The re-created pods still get their addresses through the reclaimed host-local.
    sys.kubectl(&["delete", "pod", "web-1", "--wait=false"]);
    churn_one(&sys, &pods, "web-1", "the reclaimed host-local").await;
    pods = sys
        .wait_running("app=web", &["web-0", "web-1", "web-2"])
        .await;

    // Uninstalled: host-local is back (the newest original: the symlink to the multi-call
    // binary), the pods keep running on their addresses, and a new pod gets an address none of
    // them has.
    realnode::helm(
        c,
        &["uninstall", RELEASE, "--namespace", RELEASE_NS, "--wait"],
    );
    wait_for("the release's pods gone", || async {
        let left = release_kubectl(c, &["get", "pods", "-o", "name"]);
        left.trim().is_empty().then_some(())
    })
    .await;
    let host_local = std::fs::read(bin.join("host-local")).unwrap();
    assert!(
        host_local == std::fs::read(DEBIAN_HOST_LOCAL).unwrap(),
        "{}/host-local is not the original host-local again",
        bin.display()
    );
    assert_eq!(
        std::fs::read_link(bin.join("host-local")).unwrap(),
        std::path::Path::new("cni"),
        "the newest original, the symlink, is what came back"
    );
    assert!(
        !bin.join("host-local.ipkeep-orig").exists(),
        "the kept original is still there"
    );
    let still = sys
        .wait_running("app=web", &["web-0", "web-1", "web-2"])
        .await;
    for (name, p) in &pods {
        assert_eq!(still[name].ips, p.ips, "{name} after the uninstall");
    }
    sys.apply(&statefulset("plain", 1, true, &[&node_a], &[]));
    let plain = sys.wait_running("app=plain", &["plain-0"]).await["plain-0"].clone();
    assert!(
        pods.values().all(|p| p.ips[0] != plain.ips[0]),
        "host-local handed out {} which a running pod holds",
        plain.ips[0]
    );
    assert_on_eth0(&sys, &plain).await;
}
