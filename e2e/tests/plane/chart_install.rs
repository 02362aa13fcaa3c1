//! The chart installed into the real control plane with the real `helm`: `helm install` (every
//! manifest accepted by the real API server, the CRD installed, NOTES printed), `helm upgrade` to a
//! changed values file and back (objects follow the values: replicas, the PodDisruptionBudget and the
//! Services go and come back, the Lease rule follows its name), and `helm uninstall` leaving nothing
//! of the release behind (pods, ReplicaSets and ControllerRevisions included, once the garbage
//! collector has run) but the CRD and the reservations, as Helm does.
//!
//! Needs the binaries: `make cluster-bins` (or `IPKEEP_CLUSTER_BIN_DIR`); fails loudly without.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::testkit;

use ipkeep_e2e::cluster::{ControlPlane, shared};
use ipkeep_e2e::testkit::plane::UninstallOnDrop;
use testkit::{UNPULLED_IMAGE, chart_dir, kubectl_json, kubectl_ok, run_ok, wait_for};

/// helm against the cluster (its homes in the cluster's state directory).
fn helm(plane: &ControlPlane, args: &[&str]) -> String {
    run_ok(plane.helm(), args, None)
}

/// Namespaced kinds a release creates or causes (the controllers' ReplicaSets, pods and
/// ControllerRevisions, the helm release records).
const NAMESPACED: &str = "deployments,replicasets,daemonsets,controllerrevisions,pods,services,\
                          serviceaccounts,roles,rolebindings,poddisruptionbudgets,configmaps";
const CLUSTER_SCOPED: &str = "clusterroles,clusterrolebindings";

/// Every object of the release still in the cluster, as `kind/name`.
fn release_objects(plane: &ControlPlane, namespace: &str, release: &str) -> Vec<String> {
    let selector = format!("app.kubernetes.io/instance={release}");
    let mut names: Vec<String> = Vec::new();
    for (kinds, scope) in [
        (NAMESPACED, vec!["-n", namespace]),
        (CLUSTER_SCOPED, vec![]),
    ] {
        let mut args = vec!["get", kinds, "-l", &selector, "-o", "name"];
        args.extend(scope);
        names.extend(kubectl_ok(plane, &args, None).lines().map(str::to_owned));
    }
    let records = format!("owner=helm,name={release}");
    names.extend(
        kubectl_ok(
            plane,
            &[
                "get", "secrets", "-n", namespace, "-l", &records, "-o", "name",
            ],
            None,
        )
        .lines()
        .map(str::to_owned),
    );
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_upgrade_and_uninstall_leave_the_cluster_clean() {
    let _plane = testkit::plane::use_plane_alone().await;
    let plane = shared().await.unwrap();
    let ns = plane.fresh_namespace("chart").await.unwrap();
    let release = format!("rel-{}", std::process::id());
    let chart = chart_dir();
    let chart_dir = chart.display().to_string();
    let values = |name: &str| {
        chart
            .join("ci")
            .join(format!("{name}-values.yaml"))
            .display()
            .to_string()
    };
    let fullname = format!("{release}-ipkeep");

    // Install: the real API server accepts every manifest; the CRD comes from crds/.
    let out = helm(
        plane,
        &[
            &["install", &release, &chart_dir, "-n", &ns][..],
            &UNPULLED_IMAGE,
        ]
        .concat(),
    );
    let _uninstall = UninstallOnDrop::new(plane, &release, &ns);
    assert!(out.contains("STATUS: deployed"), "{out}");
    assert!(
        out.contains("kubectl get ipreservations -A"),
        "no NOTES in:\n{out}"
    );
    let crd = kubectl_json(plane, &["get", "crd", "ipreservations.ipkeep.dev"]);
    assert_eq!(crd["spec"]["names"]["shortNames"][0], "ipr");
    let deploy = kubectl_json(
        plane,
        &[
            "get",
            "deployment",
            &format!("{fullname}-controller"),
            "-n",
            &ns,
        ],
    );
    assert_eq!(deploy["spec"]["replicas"], 2);
    let installed = release_objects(plane, &ns, &release);
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
    kubectl_ok(plane, &["apply", "-f", "-"], Some(&reservation));

    // Upgrade to a changed values file: the objects follow.
    let out = helm(
        plane,
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
        plane,
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
        plane,
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
    let upgraded = release_objects(plane, &ns, &release);
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
        plane,
        &[
            &["upgrade", &release, &chart_dir, "-n", &ns, "--reset-values"][..],
            &UNPULLED_IMAGE,
        ]
        .concat(),
    );
    let back = release_objects(plane, &ns, &release);
    assert!(back.contains(&format!("poddisruptionbudget.policy/{fullname}-controller")));
    assert!(back.contains(&format!("service/{fullname}-agent-metrics")));

    // Uninstall: nothing of the release is left once the garbage collector has removed what the
    // controllers made; the CRD and the reservation stay.
    helm(plane, &["uninstall", &release, "-n", &ns]);
    let left = wait_for("every object of the release to be deleted", || {
        let left = release_objects(plane, &ns, &release);
        async move { left.is_empty().then_some(left) }
    })
    .await;
    assert!(left.is_empty());
    kubectl_ok(plane, &["get", "crd", "ipreservations.ipkeep.dev"], None);
    let kept = kubectl_json(plane, &["get", "ipreservations", "web-0", "-n", &ns]);
    assert_eq!(kept["spec"]["ips"][0], "10.244.1.17");
}
