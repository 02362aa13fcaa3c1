//! The chart installed into the real control plane with the real `helm`: `helm install` (every
//! manifest accepted by the real API server, the CRD installed, NOTES printed), `helm upgrade` to a
//! changed values file and back (objects follow the values: replicas, the PodDisruptionBudget and the
//! Services go and come back, the Lease rule follows its name), and `helm uninstall` leaving nothing
//! of the release behind (pods, ReplicaSets and ControllerRevisions included, once the garbage
//! collector has run) but the CRD and the reservations, as Helm does.
//!
//! Needs the binaries: `make cluster-bins` (or `IPKEEP_CLUSTER_BIN_DIR`); fails loudly without.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use ipkeep_e2e::cluster::{Cluster, shared};
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn chart() -> PathBuf {
    root().join("charts/ipkeep")
}

fn run(mut cmd: Command, stdin: Option<&str>) -> Output {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut pipe = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        pipe.write_all(text.as_bytes()).unwrap();
    }
    drop(pipe);
    child.wait_with_output().unwrap()
}

fn ok(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// helm against the cluster (its homes in the cluster's state directory).
fn helm(cluster: &Cluster, args: &[&str]) -> String {
    let mut cmd = cluster.helm();
    cmd.args(args);
    ok(&format!("helm {args:?}"), run(cmd, None))
}

fn kubectl(cluster: &Cluster, args: &[&str]) -> String {
    let mut cmd = cluster.kubectl();
    cmd.args(args);
    ok(&format!("kubectl {args:?}"), run(cmd, None))
}

fn kubectl_json(cluster: &Cluster, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&kubectl(cluster, &all)).unwrap()
}

/// Polls `check` until it returns Some, failing with `what` after 120 s.
async fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "gave up after 120 s waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Namespaced kinds a release creates or causes (the controllers' ReplicaSets, pods and
/// ControllerRevisions, the helm release records).
const NAMESPACED: &str = "deployments,replicasets,daemonsets,controllerrevisions,pods,services,\
                          serviceaccounts,roles,rolebindings,poddisruptionbudgets,configmaps";
const CLUSTER_SCOPED: &str = "clusterroles,clusterrolebindings";

/// Every object of the release still in the cluster, as `kind/name`.
fn release_objects(cluster: &Cluster, namespace: &str, release: &str) -> Vec<String> {
    let selector = format!("app.kubernetes.io/instance={release}");
    let mut names: Vec<String> = Vec::new();
    for (kinds, scope) in [
        (NAMESPACED, vec!["-n", namespace]),
        (CLUSTER_SCOPED, vec![]),
    ] {
        let mut args = vec!["get", kinds, "-l", &selector, "-o", "name"];
        args.extend(scope);
        names.extend(kubectl(cluster, &args).lines().map(str::to_owned));
    }
    let records = format!("owner=helm,name={release}");
    names.extend(
        kubectl(
            cluster,
            &[
                "get", "secrets", "-n", namespace, "-l", &records, "-o", "name",
            ],
        )
        .lines()
        .map(str::to_owned),
    );
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_upgrade_and_uninstall_leave_the_cluster_clean() {
    let cluster = shared().await.unwrap();
    let ns = cluster.fresh_namespace("chart").await.unwrap();
    let release = format!("rel-{}", std::process::id());
    let chart_dir = chart().display().to_string();
    let values = |name: &str| {
        chart()
            .join("ci")
            .join(format!("{name}-values.yaml"))
            .display()
            .to_string()
    };
    let fullname = format!("{release}-ipkeep");

    // Install: the real API server accepts every manifest; the CRD comes from crds/.
    let out = helm(cluster, &["install", &release, &chart_dir, "-n", &ns]);
    assert!(out.contains("STATUS: deployed"), "{out}");
    assert!(
        out.contains("kubectl get ipreservations -A"),
        "no NOTES in:\n{out}"
    );
    let crd = kubectl_json(cluster, &["get", "crd", "ipreservations.ipkeep.dev"]);
    assert_eq!(crd["spec"]["names"]["shortNames"][0], "ipr");
    let deploy = kubectl_json(
        cluster,
        &[
            "get",
            "deployment",
            &format!("{fullname}-controller"),
            "-n",
            &ns,
        ],
    );
    assert_eq!(deploy["spec"]["replicas"], 2);
    let installed = release_objects(cluster, &ns, &release);
    for expected in [
        format!("deployment.apps/{fullname}-controller"),
        format!("daemonset.apps/{fullname}-agent"),
        format!("service/{fullname}-controller-metrics"),
        format!("service/{fullname}-agent-metrics"),
        format!("serviceaccount/{fullname}-controller"),
        format!("serviceaccount/{fullname}-agent"),
        format!("role.rbac.authorization.k8s.io/{fullname}-controller-leader-election"),
        format!("rolebinding.rbac.authorization.k8s.io/{fullname}-controller-leader-election"),
        format!("poddisruptionbudget.policy/{fullname}-controller"),
        format!("clusterrole.rbac.authorization.k8s.io/{fullname}-controller"),
        format!("clusterrole.rbac.authorization.k8s.io/{fullname}-agent"),
        format!("clusterrolebinding.rbac.authorization.k8s.io/{fullname}-controller"),
        format!("clusterrolebinding.rbac.authorization.k8s.io/{fullname}-agent"),
    ] {
        assert!(
            installed.contains(&expected),
            "{expected} not in {installed:?}"
        );
    }

    // A reservation made while installed, which uninstalling must keep.
    let reservation = format!(
        "apiVersion: ipkeep.dev/v1alpha1\nkind: IPReservation\nmetadata:\n  name: web-0\n  \
         namespace: {ns}\nspec:\n  ips: [\"10.244.1.17\"]\n  nodeName: node-a\n  retainFor: 24h\n"
    );
    let mut apply = cluster.kubectl();
    apply.args(["apply", "-f", "-"]);
    ok(
        "kubectl apply (a reservation)",
        run(apply, Some(&reservation)),
    );

    // Upgrade to a changed values file: the objects follow.
    let out = helm(
        cluster,
        &[
            "upgrade",
            &release,
            &chart_dir,
            "-n",
            &ns,
            "-f",
            &values("everything-changed"),
        ],
    );
    assert!(out.contains("REVISION: 2"), "{out}");
    let deploy = kubectl_json(
        cluster,
        &[
            "get",
            "deployment",
            &format!("{fullname}-controller"),
            "-n",
            &ns,
        ],
    );
    assert_eq!(deploy["spec"]["replicas"], 3);
    let args = deploy["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains("--default-retain-for=7d"), "{args}");
    let role = kubectl_json(
        cluster,
        &[
            "get",
            "role",
            &format!("{fullname}-controller-leader-election"),
            "-n",
            &ns,
        ],
    );
    assert!(
        role["rules"].to_string().contains("my-lease"),
        "{}",
        role["rules"]
    );
    let upgraded = release_objects(cluster, &ns, &release);
    for gone in [
        format!("poddisruptionbudget.policy/{fullname}-controller"),
        format!("service/{fullname}-controller-metrics"),
        format!("service/{fullname}-agent-metrics"),
    ] {
        assert!(
            !upgraded.contains(&gone),
            "{gone} survived the upgrade: {upgraded:?}"
        );
    }

    // And back to the defaults (--reset-values): what went comes back.
    helm(
        cluster,
        &["upgrade", &release, &chart_dir, "-n", &ns, "--reset-values"],
    );
    let back = release_objects(cluster, &ns, &release);
    assert!(back.contains(&format!("poddisruptionbudget.policy/{fullname}-controller")));
    assert!(back.contains(&format!("service/{fullname}-agent-metrics")));

    // Uninstall: nothing of the release is left once the garbage collector has removed what the
    // controllers made; the CRD and the reservation stay.
    helm(cluster, &["uninstall", &release, "-n", &ns]);
    let left = eventually("every object of the release to be deleted", || {
        let left = release_objects(cluster, &ns, &release);
        left.is_empty().then_some(left)
    })
    .await;
    assert!(left.is_empty());
    kubectl(cluster, &["get", "crd", "ipreservations.ipkeep.dev"]);
    let kept = kubectl_json(cluster, &["get", "ipreservations", "web-0", "-n", &ns]);
    assert_eq!(kept["spec"]["ips"][0], "10.244.1.17");
}
