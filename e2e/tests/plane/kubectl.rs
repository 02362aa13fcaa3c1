//! The real `kubectl` (the one `make cluster-bins` builds) against the real control plane with
//! the repository's IPReservation CRD: discovery, `get` (the CRD's printer columns,
//! `-o json|yaml|name|wide`), its short name and category, `describe`, `apply -f` (create, update,
//! no-op), `delete`, and pods selected by `--field-selector spec.nodeName=…` — each test in a
//! namespace of its own on the control plane the tests of this binary share.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::testkit;

use std::{path::PathBuf, process::Command};

use ipkeep_e2e::cluster::ControlPlane;
use ipkeep_operator::api::IPReservation;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

/// kubectl bound to the shared control plane through its own kubeconfig and discovery cache.
struct Kubectl {
    bin: PathBuf,
    dir: testkit::Scratch,
    namespace: String,
}

struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Kubectl {
    /// kubectl as admin, working in namespace `ns`.
    fn new(plane: &ControlPlane, test: &str, ns: &str) -> Self {
        let dir = testkit::Scratch::new(&format!("kubectl-{test}"));
        std::fs::copy(plane.kubeconfig_path(), dir.join("kubeconfig")).unwrap();
        Self {
            bin: plane.bin("kubectl"),
            dir,
            namespace: ns.to_owned(),
        }
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Runs kubectl off the async runtime.
    async fn run(&self, args: &[&str]) -> Run {
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--kubeconfig")
            .arg(self.dir.join("kubeconfig"))
            .arg("--cache-dir")
            .arg(self.dir.join("cache"))
            .arg("--namespace")
            .arg(&self.namespace)
            .args(args)
            .env_remove("KUBECONFIG");
        let shown = format!("kubectl {}", args.join(" "));
        let out = tokio::task::spawn_blocking(move || testkit::run(cmd, None))
            .await
            .unwrap_or_else(|e| panic!("{shown}: {e}"));
        Run {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs kubectl, fails the test unless it succeeds, returns stdout.
    async fn ok(&self, args: &[&str]) -> String {
        let r = self.run(args).await;
        assert!(
            r.ok,
            "kubectl {} failed:\nstdout: {}\nstderr: {}",
            args.join(" "),
            r.stdout,
            r.stderr
        );
        r.stdout
    }
}

/// The shared control plane with the CRD, a fresh namespace `<prefix>-<n>` and kubectl in it.
async fn setup(prefix: &str) -> (&'static ControlPlane, String, Kubectl) {
    let plane = testkit::control_plane().await;
    let ns = plane
        .fresh_namespace(prefix)
        .await
        .expect("a fresh namespace");
    let k = Kubectl::new(plane, prefix, &ns);
    (plane, ns, k)
}

fn header(out: &str) -> Vec<&str> {
    out.lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect()
}

/// The whitespace-separated cells of the row that starts with `name`.
fn row<'a>(out: &'a str, name: &str) -> Vec<&'a str> {
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&name))
        .unwrap_or_else(|| panic!("no row for {name} in:\n{out}"))
}

fn reservation_yaml(ns: &str, node: &str) -> String {
    format!(
        "apiVersion: ipkeep.dev/v1alpha1\nkind: IPReservation\nmetadata:\n  name: web-0\n  namespace: {ns}\n\
         spec:\n  ips:\n  - 10.244.1.17\n  nodeName: {node}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_discovers_crds_and_builtins() {
    let _plane = testkit::plane::use_plane().await;
    let (_, _, k) = setup("kubectl-discovery").await;

    let crds = k.ok(&["get", "crd"]).await;
    assert_eq!(header(&crds), ["NAME", "CREATED", "AT"], "{crds}");
    row(&crds, "ipreservations.ipkeep.dev");

    let resources = k.ok(&["api-resources"]).await;
    let ipr_row = row(&resources, "ipreservations");
    assert_eq!(
        ipr_row,
        [
            "ipreservations",
            "ipr",
            "ipkeep.dev/v1alpha1",
            "true",
            "IPReservation"
        ],
        "{resources}"
    );
    for kind in [
        "Pod",
        "Node",
        "Namespace",
        "Lease",
        "Event",
        "CustomResourceDefinition",
    ] {
        assert!(
            resources
                .lines()
                .any(|l| l.split_whitespace().last() == Some(kind)),
            "{kind} in:\n{resources}"
        );
    }

    let namespaces = k.ok(&["get", "namespaces"]).await;
    assert_eq!(header(&namespaces), ["NAME", "STATUS", "AGE"]);
    assert_eq!(row(&namespaces, "default")[1], "Active");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_gets_describes_and_deletes_a_reservation() {
    let _plane = testkit::plane::use_plane().await;
    let (plane, ns, k) = setup("kubectl-ipr").await;
    let manifest = k.file("web-0.yaml", &reservation_yaml(&ns, "node-a"));
    let manifest = manifest.to_str().unwrap();

    let created = k.ok(&["apply", "-f", manifest]).await;
    assert_eq!(created.trim(), "ipreservation.ipkeep.dev/web-0 created");
    let unchanged = k.ok(&["apply", "-f", manifest]).await;
    assert_eq!(unchanged.trim(), "ipreservation.ipkeep.dev/web-0 unchanged");
    k.file("web-0.yaml", &reservation_yaml(&ns, "node-b"));
    let configured = k.ok(&["apply", "-f", manifest]).await;
    assert_eq!(
        configured.trim(),
        "ipreservation.ipkeep.dev/web-0 configured"
    );

    // A status written by the controller shows in the PHASE column.
    let status = json!({"apiVersion": "ipkeep.dev/v1alpha1", "kind": "IPReservation", "status": {"phase": "Bound"}});
    Api::<IPReservation>::namespaced(plane.client().expect("client"), &ns)
        .patch_status(
            "web-0",
            &PatchParams::apply("ipkeep-controller").force(),
            &Patch::Apply(&status),
        )
        .await
        .unwrap();

    let table = k.ok(&["get", "ipr"]).await;
    assert_eq!(
        header(&table),
        [
            "NAME",
            "IPS",
            "NODE",
            "PHASE",
            "UNPROTECTED",
            "RELEASE-TIME",
            "AGE"
        ],
        "{table}"
    );
    // kube-apiserver sends `.spec.ips` as JSON text and null cells for the missing Unprotected
    // condition and release time, which kubectl prints as blank (so the row has five words).
    let cells = row(&table, "web-0");
    assert_eq!(
        cells[..4],
        ["web-0", "[\"10.244.1.17\"]", "node-b", "Bound"],
        "{table}"
    );
    assert_eq!(cells.len(), 5, "{table}");
    assert!(
        cells[4].ends_with('s') || cells[4].ends_with('m'),
        "an age: {table}"
    );
    let by_category = k.ok(&["get", "ipkeep"]).await;
    assert!(
        by_category.contains("web-0"),
        "category ipkeep lists the reservation:\n{by_category}"
    );

    let as_json: Value =
        serde_json::from_str(&k.ok(&["get", "ipr", "web-0", "-o", "json"]).await).unwrap();
    assert_eq!(as_json["spec"]["nodeName"], "node-b");
    assert_eq!(
        as_json["spec"].get("retainFor"),
        None,
        "no schema default: the controller's --default-retain-for applies"
    );
    assert!(
        as_json["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .is_string(),
        "{as_json}"
    );
    let as_yaml = k
        .ok(&["get", "ipreservations.ipkeep.dev", "web-0", "-o", "yaml"])
        .await;
    assert!(as_yaml.contains("nodeName: node-b"), "{as_yaml}");
    assert!(as_yaml.contains("kind: IPReservation"), "{as_yaml}");

    let described = k.ok(&["describe", "ipr", "web-0"]).await;
    for needle in ["Name:", "web-0", "Node Name:", "node-b", "Phase:", "Bound"] {
        assert!(described.contains(needle), "{needle} in:\n{described}");
    }

    let deleted = k.ok(&["delete", "ipr", "web-0"]).await;
    // kubectl 1.34 (the one `make cluster-bins` builds) names the namespace; older ones did not.
    assert!(
        [
            format!("ipreservation.ipkeep.dev \"web-0\" deleted from {ns} namespace"),
            "ipreservation.ipkeep.dev \"web-0\" deleted".to_owned(),
        ]
        .iter()
        .any(|m| m == deleted.trim()),
        "{deleted}"
    );
    let gone = k.run(&["get", "ipr", "web-0"]).await;
    assert!(!gone.ok);
    assert!(
        gone.stderr.contains("NotFound") && gone.stderr.contains("\"web-0\" not found"),
        "{}",
        gone.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_lists_pods_by_node() {
    let _plane = testkit::plane::use_plane().await;
    let (plane, ns, k) = setup("kubectl-pods").await;
    let pods: Api<Pod> = Api::namespaced(plane.client().expect("client"), &ns);
    for (name, node, ip) in [
        ("p-a", "node-a", "10.244.1.5"),
        ("p-b", "node-b", "10.244.2.5"),
    ] {
        // A pod bound to a Node that does not exist is an orphan the pod garbage collector deletes.
        plane.add_node(node).await.expect("the fixture Node");
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}}))
        .unwrap();
        pods.create(&PostParams::default(), &p).await.unwrap();
        let st = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
            "containerStatuses": [{"name": "c", "ready": true, "restartCount": 0, "image": "i", "imageID": "",
                                   "state": {"running": {"startedAt": "2024-05-01T10:00:00Z"}}}]}});
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&st))
            .await
            .unwrap();
    }

    let selected = k
        .ok(&[
            "get",
            "pods",
            "--field-selector",
            "spec.nodeName=node-a",
            "-o",
            "name",
        ])
        .await;
    assert_eq!(selected.trim(), "pod/p-a");
    let table = k.ok(&["get", "pods"]).await;
    assert_eq!(
        header(&table),
        ["NAME", "READY", "STATUS", "RESTARTS", "AGE"],
        "{table}"
    );
    assert_eq!(row(&table, "p-b")[..4], ["p-b", "1/1", "Running", "0"]);
    let wide = k.ok(&["get", "pods", "-o", "wide"]).await;
    assert_eq!(
        header(&wide),
        [
            "NAME",
            "READY",
            "STATUS",
            "RESTARTS",
            "AGE",
            "IP",
            "NODE",
            "NOMINATED",
            "NODE",
            "READINESS",
            "GATES"
        ],
        "{wide}"
    );
    let cells = row(&wide, "p-a");
    assert_eq!(cells[5..7], ["10.244.1.5", "node-a"], "{wide}");
    let unsupported = k
        .run(&["get", "pods", "--field-selector", "spec.bogus=x"])
        .await;
    assert!(!unsupported.ok);
    assert!(
        unsupported
            .stderr
            .contains("field label not supported: spec.bogus"),
        "{}",
        unsupported.stderr
    );
}
