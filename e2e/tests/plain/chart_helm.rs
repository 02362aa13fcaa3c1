//! The Helm chart (`charts/ipkeep/`) through the real `helm` CLI: `helm lint --strict` and
//! `helm template` for the default values and each variant (dual-stack networks, replaceHostLocal,
//! ServiceMonitor, PrometheusRule and dashboard, custom data directory, custom image), every rendered manifest validated against
//! the Kubernetes 1.33 API schemas with `kubernetes-validate --strict`, what each variant must
//! change, least-privilege RBAC, the hardening of every container, bad values rejected by
//! `values.schema.json` with a message naming the value, and the chart's CRD identical to `crds/`.
//!
//! `helm` comes from `IPKEEP_CLUSTER_BIN_DIR`, else `e2e/cluster/build.sh --print-bin-dir`
//! (`make cluster-bins` builds it from its Go module); `kubernetes-validate` from
//! `IPKEEP_KUBERNETES_VALIDATE`, else the project's `.venv` (`scripts/install-packaging-deps.sh`).
//! These tests fail, never skip, when either is missing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::testkit;
use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use serde_json::{Value, json};
use testkit::{Scratch, chart_dir, cluster_bin_dir, crd_file, repo_root};

const RELEASE: &str = "ipkeep";
const NAMESPACE: &str = "ipkeep-system";
/// The Kubernetes version the manifests are rendered for and validated against.
const KUBE_VERSION: &str = "1.33.0";

fn helm_binary() -> PathBuf {
    let helm = cluster_bin_dir().join("helm");
    assert!(
        helm.is_file(),
        "helm not found at {}: run: make cluster-bins (builds helm from its Go module); \
         these tests drive the real helm and cannot run without it",
        helm.display()
    );
    helm
}

fn kubernetes_validate_binary() -> PathBuf {
    let bin = std::env::var_os("IPKEEP_KUBERNETES_VALIDATE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv/bin/kubernetes-validate"));
    assert!(
        bin.is_file(),
        "kubernetes-validate not found at {}: run: scripts/install-packaging-deps.sh \
         (make chart-test and make test run it)",
        bin.display()
    );
    bin
}

/// helm with its own homes inside a test's scratch directory (so nothing is read from or
/// written to the user's helm configuration).
fn helm(scratch: &Path) -> Command {
    let mut cmd = Command::new(helm_binary());
    for (var, sub) in [
        ("HELM_CACHE_HOME", "helm-cache"),
        ("HELM_CONFIG_HOME", "helm-config"),
        ("HELM_DATA_HOME", "helm-data"),
    ] {
        cmd.env(var, scratch.join(sub));
    }
    // `lint` and `template` must never reach a cluster.
    cmd.env("KUBECONFIG", scratch.join("no-kubeconfig"));
    cmd
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// One way of installing the chart: the default values, or `charts/ipkeep/ci/<name>-values.yaml`
/// (helm's chart-testing layout, so the same files drive `helm upgrade` tests and users' examples).
struct Variant {
    name: &'static str,
}

const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

const VARIANTS: &[Variant] = &[
    Variant { name: "default" },
    Variant { name: "dual-stack" },
    Variant {
        name: "replace-host-local",
    },
    Variant {
        name: "service-monitor",
    },
    Variant {
        name: "custom-dirs",
    },
    Variant {
        name: "custom-image",
    },
    Variant {
        name: "custom-image-digest",
    },
    Variant {
        name: "everything-changed",
    },
    Variant {
        name: "no-placement",
    },
    Variant {
        name: "cert-manager",
    },
];

/// The one value every install sets (the chart's default is empty, refused at install): a
/// repository users' nodes pull from.
const REPOSITORY: &str = "image.repository=registry.example.internal/ipkeep";

impl Variant {
    /// helm's arguments for this variant: the defaults but the image's repository, or a file.
    fn args(&self) -> Vec<String> {
        if self.name == "default" {
            return set_args(&[]);
        }
        let file = chart_dir()
            .join("ci")
            .join(format!("{}-values.yaml", self.name));
        assert!(file.is_file(), "{} missing", file.display());
        vec!["--values".to_owned(), file.display().to_string()]
    }
}

fn variant(name: &str) -> &'static Variant {
    VARIANTS.iter().find(|v| v.name == name).unwrap()
}

/// `--set` each of `sets` after the image's repository (so a set may override it).
fn set_args(sets: &[&str]) -> Vec<String> {
    std::iter::once(&REPOSITORY)
        .chain(sets)
        .flat_map(|s| ["--set".to_owned(), (*s).to_owned()])
        .collect()
}

/// `helm template` with these values arguments: the YAML text, or helm's stderr when it refused.
fn template(scratch: &Path, values: &[String], extra: &[&str]) -> Result<String, String> {
    let mut cmd = helm(scratch);
    cmd.args(["template", RELEASE])
        .arg(chart_dir())
        .args(["--namespace", NAMESPACE, "--kube-version", KUBE_VERSION])
        .args(extra)
        .args(values);
    let out = testkit::run(cmd, None);
    let (stdout, stderr) = text(&out);
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(stderr)
    }
}

/// Every manifest `helm template` printed, parsed.
fn documents(yaml: &str) -> Vec<Value> {
    let mut docs = Vec::new();
    let mut current = String::new();
    for line in yaml.lines().chain(std::iter::once("---")) {
        if line == "---" {
            let doc: Value = serde_saphyr::from_str(&current)
                .unwrap_or_else(|e| panic!("helm printed unparseable YAML ({e}):\n{current}"));
            if !doc.is_null() {
                docs.push(doc);
            }
            current.clear();
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    docs
}

fn render(test: &str, variant: &Variant) -> Vec<Value> {
    let dir = Scratch::new(&format!("chart-{test}"));
    let yaml = template(dir.path(), &variant.args(), &[])
        .unwrap_or_else(|e| panic!("helm template failed for variant {}: {e}", variant.name));
    documents(&yaml)
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| {
            let all: Vec<String> = docs
                .iter()
                .map(|d| format!("{}/{}", d["kind"], d["metadata"]["name"]))
                .collect();
            panic!("no {kind} {name} rendered; rendered: {all:?}")
        })
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

fn container<'a>(pod_spec: &'a Value, list: &str, name: &str) -> &'a Value {
    pod_spec[list]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no {list} entry {name} in {pod_spec}"))
}

fn all_containers(pod_spec: &Value) -> Vec<&Value> {
    ["initContainers", "containers"]
        .iter()
        .filter_map(|list| pod_spec[*list].as_array())
        .flatten()
        .collect()
}

fn env_value<'a>(container: &'a Value, name: &str) -> &'a Value {
    container["env"]
        .as_array()
        .and_then(|env| env.iter().find(|e| e["name"] == name))
        .unwrap_or_else(|| panic!("no env {name} in container {}", container["name"]))
}

/// Every container: no privilege escalation, read-only root filesystem, every capability dropped
/// and none added, the runtime's default seccomp profile, not privileged.
fn assert_hardened(workload: &Value) {
    let pod = &workload["spec"]["template"]["spec"];
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let containers = all_containers(pod);
    assert!(!containers.is_empty());
    for c in containers {
        let sc = &c["securityContext"];
        let who = format!("{} container {}", workload["metadata"]["name"], c["name"]);
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{who}");
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{who}");
        assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{who}");
        assert!(
            sc["capabilities"]["add"].is_null(),
            "{who} adds capabilities"
        );
        assert_ne!(sc["privileged"], true, "{who} is privileged");
        assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{who}");
        assert!(
            c["resources"]["requests"]["memory"].is_string(),
            "{who} has no requests"
        );
        assert!(
            c["resources"]["limits"]["memory"].is_string(),
            "{who} has no limits"
        );
    }
}

#[test]
fn helm_lint_strict_passes_for_every_variant() {
    // Every values file in ci/ is one of the variants, so none goes untested.
    let mut files: Vec<String> = std::fs::read_dir(chart_dir().join("ci"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let mut expected: Vec<String> = VARIANTS
        .iter()
        .filter(|v| v.name != "default")
        .map(|v| format!("{}-values.yaml", v.name))
        .collect();
    expected.sort();
    assert_eq!(files, expected, "charts/ipkeep/ci/ and VARIANTS differ");

    let dir = Scratch::new("chart-lint");
    for v in VARIANTS {
        let mut lint = helm(dir.path());
        lint.args(["lint", "--strict", "--kube-version", KUBE_VERSION])
            .arg(chart_dir())
            .args(v.args());
        let out = testkit::run(lint, None);
        let (stdout, stderr) = text(&out);
        assert!(
            out.status.success() && stdout.contains("1 chart(s) linted, 0 chart(s) failed"),
            "helm lint --strict failed for variant {}:\n{stdout}\n{stderr}",
            v.name
        );
        assert!(
            !stdout.contains("[WARNING]") && !stdout.contains("[ERROR]"),
            "helm lint warned for variant {}:\n{stdout}",
            v.name
        );
    }
}

#[test]
fn every_variant_validates_against_the_kubernetes_schemas() {
    let validate = kubernetes_validate_binary();
    let dir = Scratch::new("chart-validate");
    let k8s = KUBE_VERSION.trim_end_matches(".0");

    // The validator itself must reject what the API server would: a misspelt field.
    let broken = dir.join("broken.yaml");
    std::fs::write(
        &broken,
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replica: 2\n  \
         selector: {matchLabels: {a: b}}\n  template:\n    metadata: {labels: {a: b}}\n    \
         spec: {containers: [{name: c, image: i}]}\n",
    )
    .unwrap();
    let mut check = Command::new(&validate);
    check.args(["-k", KUBE_VERSION, "--strict"]).arg(&broken);
    let out = testkit::run(check, None);
    assert!(
        !out.status.success(),
        "kubernetes-validate --strict accepted a Deployment with spec.replica: {:?}",
        text(&out)
    );

    for v in VARIANTS {
        let yaml = template(dir.path(), &v.args(), &["--include-crds"])
            .unwrap_or_else(|e| panic!("helm template failed for variant {}: {e}", v.name));
        let docs = documents(&yaml);
        let file = dir.join(format!("{}.yaml", v.name));
        std::fs::write(&file, &yaml).unwrap();
        let mut check = Command::new(&validate);
        check.args(["-k", KUBE_VERSION, "--strict"]).arg(&file);
        let out = testkit::run(check, None);
        let (stdout, stderr) = text(&out);
        assert!(
            out.status.success(),
            "variant {} does not validate against Kubernetes {KUBE_VERSION}:\n{stdout}\n{stderr}",
            v.name
        );
        // Every manifest of a built-in kind was checked against its schema; only the Prometheus
        // Operator's ServiceMonitor and PrometheusRule and cert-manager's Issuer and Certificate
        // have none there
        // (their shapes are checked below).
        let checked: Vec<&Value> = docs
            .iter()
            .filter(|d| {
                d["apiVersion"] != "monitoring.coreos.com/v1"
                    && d["apiVersion"] != "cert-manager.io/v1"
            })
            .collect();
        let passed = stdout
            .lines()
            .filter(|l| l.contains(" passed for resource ") && l.ends_with(k8s))
            .count();
        assert_eq!(
            passed,
            checked.len(),
            "variant {}: kubernetes-validate passed {passed} resources of {}:\n{stdout}",
            v.name,
            checked.len()
        );
        assert!(
            docs.iter().any(|d| d["kind"] == "CustomResourceDefinition"),
            "variant {}: the CRD was not rendered with --include-crds",
            v.name
        );
    }
}

#[test]
fn the_controller_is_two_hardened_leader_elected_replicas() {
    let docs = render("controller", variant("default"));
    let deploy = find(&docs, "Deployment", "ipkeep-controller");
    assert_eq!(deploy["metadata"]["namespace"], NAMESPACE);
    assert_eq!(deploy["spec"]["replicas"], 2);
    assert_hardened(deploy);
    let pod = &deploy["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "ipkeep-controller");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert!(
        pod["volumes"].is_null(),
        "the controller mounts nothing: {}",
        pod["volumes"]
    );
    assert!(pod["hostNetwork"].is_null());
    let c = container(pod, "containers", "controller");
    // The chart's appVersion, which release-check holds equal to the workspace version.
    assert_eq!(
        c["image"],
        format!(
            "registry.example.internal/ipkeep:{}",
            env!("CARGO_PKG_VERSION")
        )
        .as_str()
    );
    assert_eq!(
        strings(&c["args"]),
        [
            "controller",
            "--default-retain-for=24h",
            "--max-retain-for=7d",
            "--metrics-addr=0.0.0.0:8080",
            "--normal-events=false",
            "--lease-name=ipkeep-controller",
            "--lease-namespace=$(POD_NAMESPACE)",
            "--identity=$(POD_NAME)",
            "--default-placement=preferred",
            "--webhook-addr=0.0.0.0:9443",
            "--webhook-service=ipkeep-webhook",
            "--webhook-secret=ipkeep-webhook-tls",
            "--webhook-configuration=ipkeep-placement",
        ]
    );
    assert_eq!(env_value(c, "IPKEEP_LOG_LEVEL")["value"], "info");
    assert_eq!(env_value(c, "IPKEEP_LOG_FORMAT")["value"], "text");
    // What the benches start the controller with: the memory figures are measured with it.
    for (name, value) in testkit::CONTROLLER_ENV {
        assert_eq!(env_value(c, name)["value"], value);
    }
    assert_eq!(
        env_value(c, "POD_NAMESPACE")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["ports"][0]["containerPort"], 8080);
    assert_eq!(
        c["ports"][1],
        json!({"name": "webhook", "containerPort": 9443, "protocol": "TCP"})
    );
    // The standby replica is spread to another node where there is one.
    assert_eq!(
        pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
            ["topologyKey"],
        "kubernetes.io/hostname"
    );

    let labels = &deploy["spec"]["template"]["metadata"]["labels"];
    let selects_pods = |selector: &Value| {
        let map = selector.as_object().unwrap();
        assert!(!map.is_empty());
        map.iter().all(|(k, v)| &labels[k] == v)
    };
    assert!(selects_pods(&deploy["spec"]["selector"]["matchLabels"]));
    let pdb = find(&docs, "PodDisruptionBudget", "ipkeep-controller");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert!(selects_pods(&pdb["spec"]["selector"]["matchLabels"]));
    let svc = find(&docs, "Service", "ipkeep-controller-metrics");
    assert!(selects_pods(&svc["spec"]["selector"]));
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "metrics");
    assert_eq!(svc["spec"]["ports"][0]["port"], 8080);
    // The agent's pods are not behind the controller's Service.
    let agent_labels =
        &find(&docs, "DaemonSet", "ipkeep-agent")["spec"]["template"]["metadata"]["labels"];
    let svc_selector = svc["spec"]["selector"].as_object().unwrap();
    assert!(!svc_selector.iter().all(|(k, v)| &agent_labels[k] == v));
}

#[test]
fn the_agent_runs_on_every_node_with_only_its_two_host_paths() {
    let docs = render("agent", variant("default"));
    let ds = find(&docs, "DaemonSet", "ipkeep-agent");
    assert_hardened(ds);
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "ipkeep-agent");
    assert_eq!(pod["tolerations"], json!([{"operator": "Exists"}]));
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    assert_eq!(pod["securityContext"]["runAsUser"], 0);
    // No cni.binDir/cni.confDir: the node's root, where the runtime's configuration tells the
    // CNI directories (a hostPath of each candidate directory would create it on every node).
    assert_eq!(
        pod["volumes"],
        json!([
            {"name": "data-dir", "hostPath": {"path": "/var/lib/cni/networks", "type": "DirectoryOrCreate"}},
            {"name": "host-root", "hostPath": {"path": "/", "type": "Directory"}},
        ])
    );

    let init = container(pod, "initContainers", "install-cni");
    assert_eq!(
        strings(&init["args"]),
        ["install-cni", "--from=/ipkeep", "--host-root=/host"]
    );
    assert_eq!(
        init["volumeMounts"],
        json!([{"name": "host-root", "mountPath": "/host", "mountPropagation": "HostToContainer"}])
    );
    // Its errors name the node.
    assert_eq!(
        env_value(init, "NODE_NAME")["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );

    let agent = container(pod, "containers", "agent");
    assert_eq!(
        strings(&agent["args"]),
        [
            "agent",
            "--node-name=$(NODE_NAME)",
            "--data-dir=/var/lib/cni/networks",
            "--network=cbr0",
            "--default-retain-for=24h",
            "--metrics-addr=0.0.0.0:9725",
            "--plugin-binary=/ipkeep",
            "--host-root=/host",
        ]
    );
    assert_eq!(
        env_value(agent, "NODE_NAME")["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
    // Its own pod carries the in-charge condition.
    for (var, field) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        assert_eq!(
            env_value(agent, var)["valueFrom"]["fieldRef"]["fieldPath"],
            field
        );
    }
    // The agent writes the data directory only; the node's root it reads, to tell whether
    // ipkeep is in charge (written only to keep a replaced host-local).
    assert_eq!(
        agent["volumeMounts"],
        json!([
            {"name": "data-dir", "mountPath": "/var/lib/cni/networks"},
            {"name": "host-root", "mountPath": "/host", "mountPropagation": "HostToContainer", "readOnly": true},
        ])
    );
    assert!(agent["lifecycle"].is_null());
    assert_eq!(agent["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(agent["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(
        ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"],
        1
    );
}

/// (apiGroup, resource, verbs, resourceNames) of every rule of a role, sorted.
fn rules(role: &Value) -> BTreeSet<(String, String, String, String)> {
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                out.insert((
                    group.clone(),
                    resource,
                    strings(&rule["verbs"]).join(","),
                    strings(&rule["resourceNames"]).join(","),
                ));
            }
        }
    }
    out
}

fn rule_set(rows: &[(&str, &str, &str, &str)]) -> BTreeSet<(String, String, String, String)> {
    rows.iter()
        .map(|(g, r, v, n)| ((*g).into(), (*r).into(), (*v).into(), (*n).into()))
        .collect()
}

#[test]
fn rbac_grants_each_component_only_what_it_uses() {
    let docs = render("rbac", variant("default"));
    for role in of_kind(&docs, "ClusterRole")
        .into_iter()
        .chain(of_kind(&docs, "Role"))
    {
        let text = role["rules"].to_string();
        assert!(
            !text.contains('*'),
            "a wildcard in {}: {text}",
            role["metadata"]["name"]
        );
        // The one Secret any role names is the webhook's own certificate, by name.
        for rule in role["rules"].as_array().unwrap() {
            if strings(&rule["resources"]).contains(&"secrets".to_owned()) {
                assert_eq!(
                    strings(&rule["resourceNames"]),
                    ["ipkeep-webhook-tls"],
                    "{rule}"
                );
            }
        }
    }
    assert_eq!(
        rules(find(&docs, "ClusterRole", "ipkeep-controller")),
        rule_set(&[
            ("", "pods", "get,list,watch", ""),
            ("", "nodes", "get,list,watch", ""),
            ("apps", "statefulsets", "list,watch", ""),
            (
                "ipkeep.dev",
                "ipreservations",
                "list,watch,create,patch,delete",
                ""
            ),
            ("ipkeep.dev", "ipreservations/status", "patch", ""),
            ("events.k8s.io", "events", "create", ""),
            (
                "apiextensions.k8s.io",
                "customresourcedefinitions",
                "get,patch",
                "ipreservations.ipkeep.dev"
            ),
            (
                "admissionregistration.k8s.io",
                "mutatingwebhookconfigurations",
                "get,patch",
                "ipkeep-placement"
            ),
        ])
    );
    assert_eq!(
        rules(find(&docs, "Role", "ipkeep-controller-leader-election")),
        rule_set(&[
            ("coordination.k8s.io", "leases", "create", ""),
            (
                "coordination.k8s.io",
                "leases",
                "get,patch",
                "ipkeep-controller"
            ),
            ("", "secrets", "get,update", "ipkeep-webhook-tls"),
        ])
    );
    // Without placement, neither the Secret nor the webhook configuration is reachable.
    let docs_off = render("rbac-no-placement", variant("no-placement"));
    for role in of_kind(&docs_off, "ClusterRole")
        .into_iter()
        .chain(of_kind(&docs_off, "Role"))
    {
        let text = role["rules"].to_string();
        assert!(
            !text.contains("secrets") && !text.contains("webhook"),
            "{text}"
        );
    }
    assert_eq!(
        rules(find(&docs, "ClusterRole", "ipkeep-agent")),
        rule_set(&[
            ("ipkeep.dev", "ipreservations", "list,watch", ""),
            ("ipkeep.dev", "ipreservations/status", "patch", ""),
            ("", "nodes", "list,watch,patch", ""),
            ("events.k8s.io", "events", "create", ""),
            (
                "apiextensions.k8s.io",
                "customresourcedefinitions",
                "get",
                "ipreservations.ipkeep.dev"
            ),
        ])
    );
    // Each role is bound to its own component's ServiceAccount, and to nothing else.
    for (kind, binding, account) in [
        (
            "ClusterRoleBinding",
            "ipkeep-controller",
            "ipkeep-controller",
        ),
        (
            "RoleBinding",
            "ipkeep-controller-leader-election",
            "ipkeep-controller",
        ),
        ("ClusterRoleBinding", "ipkeep-agent", "ipkeep-agent"),
    ] {
        let b = find(&docs, kind, binding);
        assert_eq!(b["roleRef"]["name"], binding);
        assert_eq!(
            b["subjects"],
            json!([{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}])
        );
        find(&docs, "ServiceAccount", account);
    }
    assert_eq!(
        find(&docs, "Role", "ipkeep-controller-leader-election")["metadata"]["namespace"],
        NAMESPACE
    );
    // The agent's Role: its own pod's status; its preStop reads its own DaemonSet only with
    // cni.replaceHostLocal.
    assert_eq!(
        rules(find(&docs, "Role", "ipkeep-agent")),
        rule_set(&[("", "pods/status", "patch", "")])
    );
    let docs = render("rbac-replace", variant("replace-host-local"));
    assert_eq!(
        rules(find(&docs, "Role", "ipkeep-agent")),
        rule_set(&[
            ("", "pods/status", "patch", ""),
            ("apps", "daemonsets", "get", "ipkeep-agent")
        ])
    );
    assert_eq!(
        find(&docs, "Role", "ipkeep-agent")["metadata"]["namespace"],
        NAMESPACE
    );
    let b = find(&docs, "RoleBinding", "ipkeep-agent");
    assert_eq!(
        b["roleRef"],
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "ipkeep-agent"})
    );
    assert_eq!(
        b["subjects"],
        json!([{"kind": "ServiceAccount", "name": "ipkeep-agent", "namespace": NAMESPACE}])
    );
}

#[test]
fn each_variant_changes_what_it_says() {
    // Dual-stack: one --network per name, and dual-stack metrics Services.
    let docs = render("dual-stack", variant("dual-stack"));
    let agent = container(
        &find(&docs, "DaemonSet", "ipkeep-agent")["spec"]["template"]["spec"],
        "containers",
        "agent",
    );
    let networks: Vec<String> = strings(&agent["args"])
        .into_iter()
        .filter(|a| a.starts_with("--network="))
        .collect();
    assert_eq!(networks, ["--network=cbr0", "--network=cbr0-v6"]);
    let metrics_services: Vec<&Value> = of_kind(&docs, "Service")
        .into_iter()
        .filter(|s| s["metadata"]["labels"]["ipkeep.dev/metrics"] == "true")
        .collect();
    for svc in &metrics_services {
        assert_eq!(svc["spec"]["ipFamilyPolicy"], "PreferDualStack");
    }
    assert_eq!(metrics_services.len(), 2);

    // replaceHostLocal: the init container replaces, the agent restores when it stops with its
    // DaemonSet gone and so mounts the CNI bin directory too.
    let docs = render("replace", variant("replace-host-local"));
    let pod = &find(&docs, "DaemonSet", "ipkeep-agent")["spec"]["template"]["spec"];
    assert!(
        strings(&container(pod, "initContainers", "install-cni")["args"])
            .contains(&"--replace-host-local".to_owned())
    );
    let agent = container(pod, "containers", "agent");
    assert!(
        strings(&agent["args"]).contains(&"--guard-host-local".to_owned()),
        "the agent keeps the replaced host-local replaced"
    );
    assert_eq!(
        strings(&agent["lifecycle"]["preStop"]["exec"]["command"]),
        [
            "/ipkeep-operator",
            "install-cni",
            "--restore-host-local",
            format!("--if-daemonset-gone={NAMESPACE}/ipkeep-agent").as_str(),
            "--host-root=/host"
        ]
    );
    assert_eq!(
        agent["volumeMounts"][1],
        json!({"name": "host-root", "mountPath": "/host", "mountPropagation": "HostToContainer", "readOnly": false})
    );

    // Both directories given (k3s's): the narrow mounts, every message naming the node's paths,
    // and the preStop restoring in the same directory.
    let docs = render("custom-dirs", variant("custom-dirs"));
    let pod = &find(&docs, "DaemonSet", "ipkeep-agent")["spec"]["template"]["spec"];
    assert_eq!(
        pod["volumes"].as_array().unwrap()[1..],
        [
            json!({"name": "cni-bin", "hostPath": {"path": "/var/lib/rancher/k3s/data/cni", "type": "DirectoryOrCreate"}}),
            json!({"name": "cni-conf", "hostPath": {"path": "/var/lib/rancher/k3s/agent/etc/cni/net.d", "type": "DirectoryOrCreate"}}),
        ]
    );
    assert_eq!(
        strings(&container(pod, "initContainers", "install-cni")["args"]),
        [
            "install-cni",
            "--from=/ipkeep",
            "--to=/host/opt/cni/bin",
            "--to-on-node=/var/lib/rancher/k3s/data/cni"
        ]
    );
    let args = strings(&container(pod, "containers", "agent")["args"]);
    for arg in [
        "--cni-conf-dir=/host/etc/cni/net.d",
        "--cni-conf-dir-on-node=/var/lib/rancher/k3s/agent/etc/cni/net.d",
        "--cni-bin-dir=/host/opt/cni/bin",
        "--cni-bin-dir-on-node=/var/lib/rancher/k3s/data/cni",
    ] {
        assert!(args.contains(&arg.to_owned()), "{arg} not in {args:?}");
    }
    assert!(
        !args.iter().any(|a| a.starts_with("--host-root")),
        "{args:?}"
    );

    // ServiceMonitor: scrapes both metrics Services by their port name.
    let docs = render("monitor", variant("service-monitor"));
    let sm = find(&docs, "ServiceMonitor", "ipkeep");
    assert_eq!(sm["metadata"]["labels"]["release"], "prometheus");
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "metrics");
    assert_eq!(sm["spec"]["endpoints"][0]["interval"], "30s");
    let selector = sm["spec"]["selector"]["matchLabels"].as_object().unwrap();
    let scraped: Vec<&Value> = of_kind(&docs, "Service")
        .into_iter()
        .filter(|svc| {
            selector
                .iter()
                .all(|(k, v)| &svc["metadata"]["labels"][k] == v)
        })
        .collect();
    assert_eq!(scraped.len(), 2, "the ServiceMonitor selects {scraped:?}");
    for svc in scraped {
        assert_eq!(svc["spec"]["ports"][0]["name"], "metrics");
    }
    // The labels the alerts and the dashboard read: job by component, node by the pod's node.
    assert_eq!(
        sm["spec"]["endpoints"][0]["relabelings"],
        json!([
            {
                "sourceLabels": ["__meta_kubernetes_service_label_app_kubernetes_io_component"],
                "targetLabel": "job",
                "replacement": "ipkeep-$1",
            },
            {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"},
        ])
    );
    for svc in of_kind(&docs, "Service")
        .into_iter()
        .filter(|s| s["metadata"]["labels"]["ipkeep.dev/metrics"] == "true")
    {
        let component = svc["metadata"]["labels"]["app.kubernetes.io/component"]
            .as_str()
            .unwrap();
        assert!(["agent", "controller"].contains(&component), "{svc}");
    }
    // The PrometheusRule is the rules file itself, its runbook links made absolute.
    let rule = find(&docs, "PrometheusRule", "ipkeep");
    assert_eq!(rule["metadata"]["labels"]["release"], "prometheus");
    let file = std::fs::read_to_string(chart_dir().join("files/ipkeep-rules.yaml")).unwrap();
    let absolute = file.replace(
        "runbook_url: \"docs/",
        "runbook_url: \"https://git.example.internal/ipkeep/blob/v0.2.0/docs/",
    );
    assert_ne!(absolute, file);
    let want: Value = serde_saphyr::from_str(&absolute).unwrap();
    assert_eq!(rule["spec"], want);
    // Without a base URL the links stay as the file has them.
    let dir = Scratch::new("chart-rule-relative");
    let yaml = template(
        dir.path(),
        &set_args(&["metrics.prometheusRule.enabled=true"]),
        &[],
    )
    .unwrap();
    let docs_relative = documents(&yaml);
    let want: Value = serde_saphyr::from_str(&file).unwrap();
    assert_eq!(
        find(&docs_relative, "PrometheusRule", "ipkeep")["spec"],
        want
    );
    // The dashboard: the file itself, labelled for kube-prometheus-stack's sidecar, in the
    // namespace asked for.
    let dashboard = find(&docs, "ConfigMap", "ipkeep-dashboard");
    assert_eq!(dashboard["metadata"]["namespace"], "monitoring");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(
        dashboard["metadata"]["annotations"]["grafana_folder"],
        "Networking"
    );
    let json = std::fs::read_to_string(chart_dir().join("files/ipkeep-dashboard.json")).unwrap();
    assert_eq!(dashboard["data"]["ipkeep.json"], json.trim_end());
    let defaults = render("no-monitor", variant("default"));
    assert!(of_kind(&defaults, "ServiceMonitor").is_empty());
    assert!(of_kind(&defaults, "PrometheusRule").is_empty());
    assert!(
        !of_kind(&defaults, "ConfigMap")
            .iter()
            .any(|c| c["metadata"]["name"] == "ipkeep-dashboard")
    );

    // Custom directories: the host paths, the mount and the flag follow.
    let docs = render("dirs", variant("custom-dirs"));
    let pod = &find(&docs, "DaemonSet", "ipkeep-agent")["spec"]["template"]["spec"];
    assert_eq!(
        pod["volumes"][0]["hostPath"]["path"],
        "/var/lib/rancher/ipam"
    );
    assert_eq!(
        pod["volumes"][1]["hostPath"]["path"],
        "/var/lib/rancher/k3s/data/cni"
    );
    let agent = container(pod, "containers", "agent");
    assert_eq!(
        agent["volumeMounts"][0]["mountPath"],
        "/var/lib/rancher/ipam"
    );
    assert!(strings(&agent["args"]).contains(&"--data-dir=/var/lib/rancher/ipam".to_owned()));

    // Custom image: every container, by tag or by digest, with the pull policy and secret.
    for (name, image) in [
        (
            "custom-image",
            "registry.example.internal/team/ipkeep:9.9.9".to_owned(),
        ),
        (
            "custom-image-digest",
            format!("registry.example.internal/team/ipkeep@{DIGEST}"),
        ),
    ] {
        let docs = render(name, variant(name));
        let mut seen = 0;
        for workload in [
            find(&docs, "Deployment", "ipkeep-controller"),
            find(&docs, "DaemonSet", "ipkeep-agent"),
        ] {
            let pod = &workload["spec"]["template"]["spec"];
            for c in all_containers(pod) {
                assert_eq!(c["image"], image.as_str(), "{name}: {}", c["name"]);
                seen += 1;
            }
            if name == "custom-image" {
                assert_eq!(pod["imagePullSecrets"], json!([{"name": "pull-secret"}]));
                for c in all_containers(pod) {
                    assert_eq!(c["imagePullPolicy"], "Always");
                }
            }
        }
        assert_eq!(seen, 3, "{name}: controller, install-cni and agent");
    }

    // Everything else a value drives.
    let docs = render("everything", variant("everything-changed"));
    let deploy = find(&docs, "Deployment", "ipkeep-controller");
    assert_eq!(deploy["spec"]["replicas"], 3);
    let c = container(
        &deploy["spec"]["template"]["spec"],
        "containers",
        "controller",
    );
    let args = strings(&c["args"]);
    for expected in [
        "--default-retain-for=7d",
        "--max-retain-for=30d",
        "--lease-name=my-lease",
        "--metrics-addr=0.0.0.0:18080",
        "--pod-selector=ipkeep.dev/enabled=true",
        "--workers=16",
    ] {
        assert!(
            args.contains(&expected.to_owned()),
            "{expected} not in {args:?}"
        );
    }
    assert_eq!(env_value(c, "IPKEEP_LOG_LEVEL")["value"], "debug");
    // `check` inside the controller's pod finds the overridden Lease without a flag.
    assert_eq!(env_value(c, "IPKEEP_LEASE_NAME")["value"], "my-lease");
    assert_eq!(env_value(c, "IPKEEP_LOG_FORMAT")["value"], "json");
    assert_eq!(
        rules(find(&docs, "Role", "ipkeep-controller-leader-election"))
            .iter()
            .filter(|r| r.3 == "my-lease")
            .count(),
        1
    );
    assert!(of_kind(&docs, "PodDisruptionBudget").is_empty());
    assert_eq!(
        of_kind(&docs, "Service")
            .iter()
            .map(|s| s["metadata"]["name"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["ipkeep-webhook"],
        "no metrics Services, the webhook's stays"
    );
    for expected in [
        "--default-placement=required",
        "--webhook-addr=0.0.0.0:19443",
    ] {
        assert!(
            args.contains(&expected.to_owned()),
            "{expected} not in {args:?}"
        );
    }
    let hook = &find(&docs, "MutatingWebhookConfiguration", "ipkeep-placement")["webhooks"][0];
    assert_eq!(hook["timeoutSeconds"], 5);
    let agent = container(
        &find(&docs, "DaemonSet", "ipkeep-agent")["spec"]["template"]["spec"],
        "containers",
        "agent",
    );
    let agent_args = strings(&agent["args"]);
    assert!(agent_args.contains(&"--metrics-addr=0.0.0.0:19725".to_owned()));
    assert!(agent_args.contains(&"--default-retain-for=7d".to_owned()));
    assert!(agent_args.contains(&"--resync-interval=5m".to_owned()));
    assert_eq!(env_value(agent, "IPKEEP_LOG_FORMAT")["value"], "json");
}

#[test]
fn bad_values_are_rejected_with_a_message_naming_them() {
    let dir = Scratch::new("chart-bad-values");
    let cases: &[(&str, &[&str])] = &[
        (
            "controller.replica=3",
            &["/controller", "'replica' not allowed"],
        ),
        (
            "agent.dataDir=var/lib/cni",
            &["/agent/dataDir", "does not match pattern"],
        ),
        (
            "agent.dataDir=/var/lib/../../etc",
            &["/agent/dataDir", "does not match pattern"],
        ),
        (
            "cni.binDir=/opt/cni/./bin",
            &["/cni/binDir", "does not match pattern"],
        ),
        (
            "agent.networks[0]=../etc",
            &["/agent/networks/0", "does not match pattern"],
        ),
        ("logging.format=xml", &["/logging/format", "'text', 'json'"]),
        (
            "controller.defaultRetainFor=forever",
            &["/controller/defaultRetainFor", "'forever'"],
        ),
        (
            "controller.defaultRetainFor=1h30m",
            &["/controller/defaultRetainFor", "'1h30m'"],
        ),
        (
            "cni.replaceHostLocal=yes",
            &["/cni/replaceHostLocal", "want boolean"],
        ),
        (
            "image.pullPolicy=Sometimes",
            &["/image/pullPolicy", "'IfNotPresent'"],
        ),
        (
            "image.digest=latest",
            &["/image/digest", "does not match pattern"],
        ),
        (
            "controller.extraArgs[0]=workers=16",
            &["/controller/extraArgs/0", "does not match pattern"],
        ),
        (
            "agent.metricsPort=70000",
            &["/agent/metricsPort", "maximum"],
        ),
        (
            "controller.replicas=0",
            &["/controller/replicas", "minimum"],
        ),
        (
            "metrics.serviceMonitor.intervall=1m",
            &["/metrics/serviceMonitor", "'intervall' not allowed"],
        ),
        (
            "agent.tolerations[0].operater=Exists",
            &["/agent/tolerations/0", "'operater' not allowed"],
        ),
    ];
    for (set, fragments) in cases {
        let err = template(dir.path(), &set_args(&[set]), &[])
            .err()
            .unwrap_or_else(|| panic!("--set {set} was accepted"));
        assert!(
            err.contains("values don't meet the specifications of the schema"),
            "--set {set}: not a schema error: {err}"
        );
        for fragment in *fragments {
            assert!(
                err.contains(fragment),
                "--set {set}: {fragment:?} not in: {err}"
            );
        }
    }
    // What the schema cannot say, the chart says itself.
    let err = template(
        dir.path(),
        &set_args(&[
            "metrics.serviceMonitor.enabled=true",
            "metrics.service.enabled=false",
        ]),
        &[],
    )
    .unwrap_err();
    assert!(
        err.contains("metrics.serviceMonitor.enabled needs metrics.service.enabled"),
        "{err}"
    );
    // The controller refuses a default retention longer than the maximum: so does helm, naming
    // both values (each unit compared in seconds; equal is allowed).
    for (sets, refused) in [
        (
            &["controller.maxRetainFor=2h"][..],
            Some("(24h) is longer than controller.maxRetainFor (2h)"),
        ),
        (
            &["controller.defaultRetainFor=8d"][..],
            Some("(8d) is longer than controller.maxRetainFor (7d)"),
        ),
        (
            &[
                "controller.defaultRetainFor=91s",
                "controller.maxRetainFor=90s",
            ][..],
            Some("(91s) is longer"),
        ),
        (
            &[
                "controller.defaultRetainFor=61m",
                "controller.maxRetainFor=1h",
            ][..],
            Some("(61m) is longer"),
        ),
        (
            &[
                "controller.defaultRetainFor=24h",
                "controller.maxRetainFor=1d",
            ][..],
            None,
        ),
        (
            &[
                "controller.defaultRetainFor=90s",
                "controller.maxRetainFor=2m",
            ][..],
            None,
        ),
    ] {
        let result = template(dir.path(), &set_args(sets), &[]);
        match refused {
            Some(fragment) => {
                let err = result.err().unwrap_or_else(|| panic!("{sets:?} rendered"));
                assert!(
                    err.contains(fragment),
                    "{sets:?}: {fragment:?} not in: {err}"
                );
                assert!(err.contains("controller.defaultRetainFor ("), "{err}");
            }
            None => {
                result.unwrap_or_else(|e| panic!("{sets:?} refused: {e}"));
            }
        }
    }
    // One CNI directory set alone (as `--reuse-values` from 0.1.0 carries binDir=/opt/cni/bin
    // and no confDir): the narrow mounts, the other at its standard path, as before.
    for (set, bin, conf) in [
        ("cni.binDir=/usr/lib/cni", "/usr/lib/cni", "/etc/cni/net.d"),
        (
            "cni.confDir=/etc/cni/conf.d",
            "/opt/cni/bin",
            "/etc/cni/conf.d",
        ),
    ] {
        let docs = documents(&template(dir.path(), &set_args(&[set]), &[]).unwrap());
        let pod = &find(&docs, "DaemonSet", "ipkeep-agent")["spec"]["template"]["spec"];
        let paths: Vec<&str> = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["hostPath"]["path"].as_str().unwrap())
            .collect();
        assert_eq!(paths, ["/var/lib/cni/networks", bin, conf], "--set {set}");
    }
}

#[test]
fn an_install_without_an_image_repository_is_refused_naming_the_value() {
    let dir = Scratch::new("chart-no-repository");
    let no_value = template(dir.path(), &[], &[]);
    let empty = template(dir.path(), &set_args(&["image.repository="]), &[]);
    for (how, result) in [("no value", no_value), ("an empty one", empty)] {
        let err = result.err().unwrap_or_else(|| panic!("{how}: rendered"));
        for fragment in [
            "image.repository is not set",
            "--set image.repository=",
            "README.md, \"Install with Helm\"",
        ] {
            assert!(err.contains(fragment), "{how}: {fragment:?} not in: {err}");
        }
    }
}

/// `helm upgrade --reuse-values` renders the new chart with the previous release's chart
/// defaults, which lack every value added since; `--set <key>=null` removes a key from the values
/// the same way. With any one value or section removed the chart renders exactly as with the
/// defaults: the schema requires none, and the templates take each from files/defaults.json.
#[test]
fn any_absent_value_renders_as_its_default_as_reuse_values_needs() {
    let text = std::fs::read_to_string(chart_dir().join("files/defaults.json")).unwrap();
    let defaults: serde_json::Map<String, Value> = serde_json::from_str(&text).unwrap();
    // Each value's path and each section above it, once.
    let removable: BTreeSet<String> = defaults
        .keys()
        .flat_map(|path| {
            path.match_indices('.')
                .map(|(at, _)| path[..at].to_owned())
                .chain([path.clone()])
                .collect::<Vec<_>>()
        })
        // The repository has no default to fall back on: its absence is refused (above).
        .filter(|p| p != "image" && p != "image.repository")
        .collect();
    assert!(removable.len() > 50, "only {} keys", removable.len());
    let dir = Scratch::new("chart-absent-values");
    let reference = template(dir.path(), &set_args(&[]), &[]).unwrap();
    for path in &removable {
        let rendered = template(dir.path(), &set_args(&[&format!("{path}=null")]), &[])
            .unwrap_or_else(|e| panic!("without {path}: {e}"));
        assert!(
            rendered == reference,
            "without {path} the chart renders otherwise"
        );
    }
}

#[test]
fn the_chart_holds_the_generated_crd_and_the_workspace_version() {
    let generated = std::fs::read(crd_file()).unwrap();
    let in_chart = std::fs::read(chart_dir().join("crds/ipreservations.ipkeep.dev.yaml")).unwrap();
    assert!(
        generated == in_chart,
        "charts/ipkeep/crds/ipreservations.ipkeep.dev.yaml differs from crds/: run: make crds"
    );
    let crds: Vec<_> = std::fs::read_dir(chart_dir().join("crds"))
        .unwrap()
        .collect();
    assert_eq!(crds.len(), 1, "the chart ships exactly the one CRD");

    let cargo = std::fs::read_to_string(repo_root().join("Cargo.toml")).unwrap();
    let version = cargo
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|l| l.strip_suffix('"'))
        .unwrap();
    let chart_yaml: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(chart_dir().join("Chart.yaml")).unwrap())
            .unwrap();
    assert_eq!(
        chart_yaml["appVersion"], version,
        "Chart.yaml's appVersion must be the workspace version (the default image tag)"
    );
    // A cluster older than selectableFields is refused before anything is installed.
    let dir = Scratch::new("chart-kube-version");
    let mut template = helm(dir.path());
    template
        .args(["template", RELEASE])
        .arg(chart_dir())
        .args(["--kube-version", "1.31.0"]);
    let err = testkit::run(template, None);
    assert!(!err.status.success());
    assert!(text(&err).1.contains("kubeVersion"), "{:?}", text(&err));
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// NOTES.txt as helm renders it after an install. helm prints it only when it talks to a
/// cluster, so a copy of the chart renders the same text into a ConfigMap instead.
fn notes(test: &str, variant: &Variant) -> String {
    let dir = Scratch::new(&format!("chart-{test}"));
    let copy = dir.join("ipkeep");
    copy_dir(&chart_dir(), &copy);
    let templates = copy.join("templates");
    let notes_txt = std::fs::read_to_string(templates.join("NOTES.txt")).unwrap();
    std::fs::remove_file(templates.join("NOTES.txt")).unwrap();
    std::fs::write(
        templates.join("_notes_under_test.tpl"),
        format!("{{{{- define \"ipkeep.notesUnderTest\" -}}}}\n{notes_txt}{{{{- end -}}}}\n"),
    )
    .unwrap();
    std::fs::write(
        templates.join("notes-under-test.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes-under-test\ndata:\n  \
         notes: {{ include \"ipkeep.notesUnderTest\" . | quote }}\n",
    )
    .unwrap();
    let mut template = helm(dir.path());
    template
        .args(["template", RELEASE])
        .arg(&copy)
        .args(["--namespace", NAMESPACE, "--kube-version", KUBE_VERSION])
        .args(["--show-only", "templates/notes-under-test.yaml"])
        .args(variant.args());
    let (stdout, _) = text(&testkit::checked(template, None));
    let docs = documents(&stdout);
    docs[0]["data"]["notes"].as_str().unwrap().to_owned()
}

#[test]
fn notes_tell_the_user_what_to_do_next() {
    let default = notes("notes-default", variant("default"));
    let installed = format!(
        "ipkeep {} is installed in namespace ipkeep-system as release ipkeep.",
        env!("CARGO_PKG_VERSION")
    );
    for expected in [
        installed.as_str(),
        "kubectl -n ipkeep-system exec deploy/ipkeep-controller -- /ipkeep-operator check --wait",
        "no network uses it yet (cbr0)",
        r#""ipam": {"type": "ipkeep", ...}"#,
        "(\"dataDir\" /var/lib/cni/networks, the chart's agent.dataDir)",
        "ipkeep is in each node's CNI plugin directory (read from its containerd or CRI-O configuration),",
        "k3s or kube-flannel (generated configuration, nothing to edit)",
        "--reuse-values --set cni.replaceHostLocal=true",
        "ipkeep.dev/retain=true ipkeep.dev/retain-for=24h",
        "kubectl get ipreservations -A",
        "then helm uninstall ipkeep -n ipkeep-system",
        "kubectl delete crd ipreservations.ipkeep.dev",
    ] {
        assert!(
            default.contains(expected),
            "{expected:?} not in NOTES:\n{default}"
        );
    }

    let replaced = notes("notes-replace", variant("replace-host-local"));
    for expected in [
        "Nothing else to change: ipkeep replaced host-local in each node's CNI plugin directory",
        "host-local.ipkeep-orig",
        "--reuse-values --set cni.replaceHostLocal=false",
    ] {
        assert!(
            replaced.contains(expected),
            "{expected:?} not in NOTES:\n{replaced}"
        );
    }
    assert!(!replaced.contains(r#""type": "ipkeep""#), "{replaced}");

    let dual = notes("notes-dual", variant("dual-stack"));
    assert!(dual.contains("(cbr0, cbr0-v6)"), "{dual}");
}

#[test]
fn the_placement_webhook_is_registered_never_to_block_a_pod() {
    let docs = render("placement", variant("default"));
    let config = find(&docs, "MutatingWebhookConfiguration", "ipkeep-placement");
    let hooks = config["webhooks"].as_array().unwrap();
    assert_eq!(hooks.len(), 1);
    let hook = &hooks[0];
    assert_eq!(hook["name"], "placement.ipkeep.dev");
    assert_eq!(
        hook["failurePolicy"], "Ignore",
        "ipkeep never blocks a pod's creation"
    );
    assert_eq!(hook["sideEffects"], "None");
    assert_eq!(hook["timeoutSeconds"], 2);
    assert_eq!(
        hook["rules"],
        json!([{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                "resources": ["pods"], "scope": "Namespaced"}])
    );
    assert!(
        hook["clientConfig"]["caBundle"].is_null(),
        "the controller's to write"
    );
    assert_eq!(
        hook["clientConfig"]["service"],
        json!({"name": "ipkeep-webhook", "namespace": NAMESPACE, "path": "/mutate-pods", "port": 443})
    );
    let condition = hook["matchConditions"][0]["expression"].as_str().unwrap();
    for needle in ["ipkeep.dev/retain", "StatefulSet", "object.metadata.name"] {
        assert!(condition.contains(needle), "{needle} not in {condition}");
    }
    // The Service selects the controller's pods (every replica serves) on the named port.
    let svc = find(&docs, "Service", "ipkeep-webhook");
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "webhook");
    let labels =
        &find(&docs, "Deployment", "ipkeep-controller")["spec"]["template"]["metadata"]["labels"];
    assert!(
        svc["spec"]["selector"]
            .as_object()
            .unwrap()
            .iter()
            .all(|(k, v)| &labels[k] == v)
    );
    // The Secret is created empty: the controller fills it.
    let secret = find(&docs, "Secret", "ipkeep-webhook-tls");
    assert!(
        secret["data"].is_null() && secret["stringData"].is_null(),
        "{secret}"
    );

    let off = render("placement-off", variant("no-placement"));
    for kind in ["MutatingWebhookConfiguration", "Secret"] {
        assert!(
            of_kind(&off, kind).is_empty(),
            "{kind} rendered with placement off"
        );
    }
    let c = container(
        &find(&off, "Deployment", "ipkeep-controller")["spec"]["template"]["spec"],
        "containers",
        "controller",
    );
    assert!(
        !strings(&c["args"])
            .iter()
            .any(|a| a.contains("webhook") || a.contains("placement"))
    );
}

#[test]
fn with_cert_manager_the_controller_serves_its_certificate_and_keeps_no_secret() {
    let docs = render("cert-manager", variant("cert-manager"));
    let cert = find(&docs, "Certificate", "ipkeep-webhook");
    assert_eq!(cert["metadata"]["namespace"], NAMESPACE);
    assert_eq!(cert["spec"]["secretName"], "ipkeep-webhook-tls");
    assert_eq!(
        cert["spec"]["dnsNames"],
        json!([
            format!("ipkeep-webhook.{NAMESPACE}.svc"),
            format!("ipkeep-webhook.{NAMESPACE}.svc.cluster.local")
        ])
    );
    assert_eq!(
        cert["spec"]["issuerRef"],
        json!({"kind": "Issuer", "name": "ipkeep-webhook-selfsigned"})
    );
    assert_eq!(
        find(&docs, "Issuer", "ipkeep-webhook-selfsigned")["spec"],
        json!({"selfSigned": {}})
    );
    assert_eq!(
        find(&docs, "MutatingWebhookConfiguration", "ipkeep-placement")["metadata"]["annotations"]
            ["cert-manager.io/inject-ca-from"],
        format!("{NAMESPACE}/ipkeep-webhook")
    );
    assert!(
        of_kind(&docs, "Secret").is_empty(),
        "cert-manager writes the Secret"
    );
    let pod = &find(&docs, "Deployment", "ipkeep-controller")["spec"]["template"]["spec"];
    let c = container(pod, "containers", "controller");
    let args = strings(&c["args"]);
    assert!(
        args.contains(&"--webhook-cert-dir=/tls".to_owned()),
        "{args:?}"
    );
    assert!(
        !args
            .iter()
            .any(|a| a.starts_with("--webhook-secret") || a.starts_with("--webhook-configuration")),
        "{args:?}"
    );
    assert_eq!(
        c["volumeMounts"],
        json!([{"name": "webhook-tls", "mountPath": "/tls", "readOnly": true}])
    );
    assert_eq!(
        pod["volumes"],
        json!([{"name": "webhook-tls", "secret": {"secretName": "ipkeep-webhook-tls"}}])
    );
    // The controller touches neither Secrets nor webhook configurations.
    for role in of_kind(&docs, "ClusterRole")
        .into_iter()
        .chain(of_kind(&docs, "Role"))
    {
        let text = role["rules"].to_string();
        assert!(
            !text.contains("secrets") && !text.contains("mutatingwebhook"),
            "{text}"
        );
    }
    // An issuer of the user's replaces the self-signed one.
    let scratch = Scratch::new("chart-cert-manager-issuer");
    let yaml = template(
        scratch.path(),
        &set_args(&[
            "placement.certManager.enabled=true",
            "placement.certManager.issuerRef.kind=ClusterIssuer",
            "placement.certManager.issuerRef.name=corp-ca",
        ]),
        &[],
    )
    .unwrap();
    let docs = documents(&yaml);
    assert!(of_kind(&docs, "Issuer").is_empty());
    assert_eq!(
        find(&docs, "Certificate", "ipkeep-webhook")["spec"]["issuerRef"],
        json!({"kind": "ClusterIssuer", "name": "corp-ca"})
    );
}

/// The admission policy holds the controller's maximum (one chart value for both) and the
/// retention grammar the controller parses with (`RetainFor::PATTERN`); its binding's action
/// follows `policy.admission.action`, and `enabled: false` renders neither.
#[test]
fn the_admission_policy_holds_the_controllers_maximum_and_grammar() {
    let variable = |policy: &Value, name: &str| -> String {
        policy["spec"]["variables"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no variable {name}: {policy}"))["expression"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    for (name, max, action) in [
        ("default", "7d", "Deny"),
        ("everything-changed", "30d", "Warn"),
    ] {
        let docs = render(&format!("policy-{name}"), variant(name));
        let policy = find(&docs, "ValidatingAdmissionPolicy", "ipkeep-annotations");
        assert_eq!(
            variable(policy, "pattern"),
            format!("'{}'", ipkeep_operator::api::retention::RetainFor::PATTERN)
        );
        assert_eq!(variable(policy, "max"), format!("'{max}'"));
        let controller = find(&docs, "Deployment", "ipkeep-controller");
        let args = strings(
            &container(
                &controller["spec"]["template"]["spec"],
                "containers",
                "controller",
            )["args"],
        );
        assert!(
            args.contains(&format!("--max-retain-for={max}")),
            "{args:?}"
        );
        let binding = find(
            &docs,
            "ValidatingAdmissionPolicyBinding",
            "ipkeep-annotations",
        );
        assert_eq!(binding["spec"]["policyName"], "ipkeep-annotations");
        assert_eq!(binding["spec"]["validationActions"], json!([action]));
    }
    let dir = Scratch::new("chart-policy-off");
    let yaml = template(
        dir.path(),
        &set_args(&["policy.admission.enabled=false"]),
        &[],
    )
    .unwrap();
    assert_eq!(
        policy_names(&yaml),
        ["ipkeep-agent-node"],
        "policy.admission.enabled=false renders the annotations policy, or loses the node policy"
    );
}

/// The names of the ValidatingAdmissionPolicies and bindings a rendering holds (each once: a
/// policy and its binding share their name).
fn policy_names(yaml: &str) -> Vec<String> {
    let mut names: Vec<String> = documents(yaml)
        .iter()
        .filter(|d| {
            d["kind"]
                .as_str()
                .is_some_and(|k| k.starts_with("ValidatingAdmissionPolicy"))
        })
        .map(|d| d["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    names.dedup();
    names
}

/// The node policy: on by default, for the agent's ServiceAccount of the release's namespace and
/// bound with Deny; off with policy.nodeRestriction.enabled=false. (What it allows and refuses is
/// proven on a real API server: e2e/tests/plane/chart_node_policy.rs.)
#[test]
fn the_node_policy_matches_the_agents_account_and_turns_off() {
    let dir = Scratch::new("chart-node-policy");
    let yaml = template(
        dir.path(),
        &set_args(&["policy.admission.enabled=false"]),
        &[],
    )
    .unwrap();
    let docs = documents(&yaml);
    let policy = find(&docs, "ValidatingAdmissionPolicy", "ipkeep-agent-node");
    let condition = policy["spec"]["matchConditions"][0]["expression"]
        .as_str()
        .unwrap();
    assert!(
        condition.contains("'system:serviceaccount:ipkeep-system:ipkeep-agent'"),
        "{condition}"
    );
    let binding = find(
        &docs,
        "ValidatingAdmissionPolicyBinding",
        "ipkeep-agent-node",
    );
    assert_eq!(binding["spec"]["policyName"], "ipkeep-agent-node");
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    let off = template(
        dir.path(),
        &set_args(&[
            "policy.admission.enabled=false",
            "policy.nodeRestriction.enabled=false",
        ]),
        &[],
    )
    .unwrap();
    assert!(policy_names(&off).is_empty(), "{:?}", policy_names(&off));
}
