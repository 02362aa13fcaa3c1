//! Least privilege, proven both ways against the real API server's audit log.
//!
//! The chart is installed with `helm` (with `cni.replaceHostLocal=true`, so every command line of
//! the DaemonSet is exercised, and `controller.normalEvents=true`, so the controller's Normal
//! Events, off by default, prove the value reaches the binary). Then the real `ipkeep-operator`
//! runs the containers **as the chart's ServiceAccounts** (tokens minted for them), with the
//! command lines and environment read from the Deployment and DaemonSet the API server holds: a
//! flag renamed in the code but not in the chart makes a component exit and the test fail. Only
//! values that name the pod's world are mapped: absolute paths under a scratch root, listen
//! addresses to `127.0.0.1:0`, downward-API fields to this run's names.
//!
//! Scenario 1, simplified (no kubelet; the admin sets the pod's status as a kubelet would): an
//! annotated pod runs with an IP, is deleted (its reservation is Released, the agent's file keeps
//! the IP for the plugin) and re-created with the same name (Rebound), deleted again and its
//! reservation expires (deleted, the file removed); the agent's preStop keeps ipkeep as host-local
//! while its DaemonSet exists and restores the original once it is deleted. A reservation the agent refuses (the CRD's
//! rule that would have refused it first is dropped) makes it publish a Warning Event for each
//! refused version of it (two creates: the agent never patches an Event into a series). The
//! node's network renamed in its CNI configuration: the agent marks the reservation `Unprotected`
//! and clears the mark when the name is back (and says so on its own pod's status).
//!
//! Before anything runs, the table [`ACCESS`] of (account, verb, resource, allowed) rows is asked
//! of the API server's authorizer (a SubjectAccessReview per row), and every row it answers
//! otherwise is reported.
//!
//! Then from the audit log: every request of each account was allowed (no 403), and the set of
//! (verb, resource) each account used equals what the chart grants it, but for the exceptions
//! the chart names with an `rbac-exception:` comment and justifies (a stale exception fails too).
//!
//! Needs the control plane binaries (`make cluster-bins`) and the operator binary
//! (`IPKEEP_OPERATOR_BIN`, else `target/debug/ipkeep-operator`, which `cargo test --workspace`
//! builds); fails loudly without them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::testkit;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::{Child, Command},
    time::Instant,
};

use Scope::{ClusterWide, InRelease, InWorkload};
use Subject::{Agent, Controller};
use ipkeep_e2e::cluster::{ControlPlane, shared};
use ipkeep_e2e::testkit::plane::UninstallOnDrop;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::{Api, api::PostParams};
use serde_json::Value;
use testkit::{
    DEADLINE, Scratch, UNPULLED_IMAGE, chart_dir, checked, kubectl_json, kubectl_ok, ok,
    operator_binary, wait_for,
};

/// A container of a pod template as the API server holds it: its command line and environment,
/// mapped to this machine.
struct ContainerRun {
    argv: Vec<String>,
    env: Vec<(String, String)>,
}

/// Maps a command line of the chart to this machine: `/ipkeep-operator` is the built binary,
/// other absolute paths in `--flag=/path` live under `fs_root`, listen addresses become
/// `127.0.0.1:0`, and `$(VAR)` expands from the container's environment as the kubelet does.
fn map_argv(argv: &[String], env: &[(String, String)], fs_root: &Path) -> Vec<String> {
    argv.iter()
        .enumerate()
        .map(|(i, arg)| {
            let mut arg = arg.clone();
            for (k, v) in env {
                arg = arg.replace(&format!("$({k})"), v);
            }
            assert!(!arg.contains("$("), "unexpanded variable in {arg:?}");
            if i == 0 {
                assert_eq!(arg, "/ipkeep-operator", "the image's entry point");
                return operator_binary().display().to_string();
            }
            match arg.split_once('=') {
                Some((flag, value)) if flag.ends_with("-addr") => {
                    assert!(value.starts_with("0.0.0.0:"), "{arg}");
                    format!("{flag}=127.0.0.1:0")
                }
                Some((flag, value)) if value.starts_with('/') => {
                    format!("{flag}={}", fs_root.join(&value[1..]).display())
                }
                _ => arg,
            }
        })
        .collect()
}

/// The container `name` of `template` (init containers included), with the downward API fields
/// resolved from `fields` (fieldPath → value).
fn container(
    template: &Value,
    name: &str,
    fields: &BTreeMap<&str, String>,
    fs_root: &Path,
) -> (ContainerRun, Value) {
    let spec = &template["spec"];
    let c = spec["containers"]
        .as_array()
        .into_iter()
        .chain(spec["initContainers"].as_array())
        .flatten()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name} in {template}"))
        .clone();
    let mut env = Vec::new();
    for e in c["env"].as_array().into_iter().flatten() {
        let key = e["name"].as_str().unwrap().to_owned();
        let value = if let Some(v) = e["value"].as_str() {
            v.to_owned()
        } else {
            let path = e["valueFrom"]["fieldRef"]["fieldPath"]
                .as_str()
                .unwrap_or_else(|| panic!("env {key}: only values and fieldRefs are mapped: {e}"));
            fields
                .get(path)
                .unwrap_or_else(|| panic!("env {key}: no value for fieldPath {path}"))
                .clone()
        };
        env.push((key, value));
    }
    let argv: Vec<String> = c["command"]
        .as_array()
        .into_iter()
        .chain(c["args"].as_array())
        .flatten()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    let argv = map_argv(&argv, &env, fs_root);
    (ContainerRun { argv, env }, c)
}

/// A component process, stopped with SIGTERM (so it releases its Lease) when dropped.
struct Component {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Component {
    fn start(name: &'static str, kubeconfig: &Path, run: &ContainerRun, log: PathBuf) -> Self {
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(&run.argv[0])
            .args(&run.argv[1..])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(run.env.iter().map(|(k, v)| (k, v)))
            .env("KUBECONFIG", kubeconfig)
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        Component { name, child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("the {} exited ({status}):\n{}", self.name, self.log());
        }
    }

    fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let status = self.child.wait().unwrap();
        assert!(
            status.success(),
            "the {} did not exit 0 on SIGTERM ({status}):\n{}",
            self.name,
            self.log()
        );
        std::mem::forget(self);
    }
}

impl Drop for Component {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `check` until true while every component runs; fails with `what` and the components'
/// logs after [`DEADLINE`].
async fn eventually(
    what: &str,
    components: &mut [&mut Component],
    mut check: impl FnMut() -> bool,
) {
    let waited = ipkeep_e2e::wait::wait_for(what, DEADLINE, || {
        for c in components.iter_mut() {
            c.assert_running();
        }
        let done = check();
        async move { done.then_some(()) }
    })
    .await;
    if let Err(e) = waited {
        let logs: Vec<String> = components
            .iter()
            .map(|c| format!("--- {}:\n{}", c.name, c.log()))
            .collect();
        panic!("{e}\n{}", logs.join("\n"));
    }
}

/// (verb, "group/resource[/subresource]"), the unit RBAC grants.
type Access = (String, String);

fn resource_key(group: &str, resource: &str) -> String {
    if group.is_empty() {
        format!("core/{resource}")
    } else {
        format!("{group}/{resource}")
    }
}

/// Every resource request `user` made, from the audit log, with the response codes seen.
/// Non-resource requests (discovery, `/version`) are authorized for every authenticated user by
/// the cluster's defaults, not by the chart, and are left out.
fn used_by(audit_log: &Path, user: &str) -> BTreeMap<Access, BTreeSet<i64>> {
    let mut out: BTreeMap<Access, BTreeSet<i64>> = BTreeMap::new();
    for line in std::fs::read_to_string(audit_log).unwrap().lines() {
        let event: Value = serde_json::from_str(line).unwrap();
        if event["user"]["username"] != user || event["objectRef"].is_null() {
            continue;
        }
        let o = &event["objectRef"];
        let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let mut resource = resource_key(&s(&o["apiGroup"]), &s(&o["resource"]));
        if let Some(sub) = o["subresource"].as_str() {
            resource = format!("{resource}/{sub}");
        }
        let code = event["responseStatus"]["code"].as_i64().unwrap_or_default();
        out.entry((s(&event["verb"]), resource))
            .or_default()
            .insert(code);
    }
    out
}

/// What the rules of the given (Cluster)Roles grant, as (verb, resource).
fn granted_by(roles: &[Value]) -> BTreeSet<Access> {
    let mut out = BTreeSet::new();
    for role in roles {
        for rule in role["rules"].as_array().unwrap() {
            for group in rule["apiGroups"].as_array().unwrap() {
                for resource in rule["resources"].as_array().unwrap() {
                    for verb in rule["verbs"].as_array().unwrap() {
                        out.insert((
                            verb.as_str().unwrap().to_owned(),
                            resource_key(group.as_str().unwrap(), resource.as_str().unwrap()),
                        ));
                    }
                }
            }
        }
    }
    out
}

/// The chart's named exceptions in `template`: lines `# rbac-exception: <verb> <group/resource>: <why>`.
fn exceptions_in(template: &str) -> BTreeMap<Access, String> {
    let text = std::fs::read_to_string(chart_dir().join("templates").join(template)).unwrap();
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.trim().strip_prefix("# rbac-exception:") else {
            continue;
        };
        let (what, why) = rest
            .split_once(": ")
            .unwrap_or_else(|| panic!("no reason in {line:?}"));
        let (verb, resource) = what.trim().split_once(' ').unwrap();
        assert!(
            why.trim().len() > 20,
            "an exception needs a real justification: {line:?}"
        );
        out.insert(
            (verb.to_owned(), resource.to_owned()),
            why.trim().to_owned(),
        );
    }
    out
}

fn pod_yaml(ns: &str, node: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web-0\n  namespace: {ns}\n  annotations:\n    \
         ipkeep.dev/retain: \"true\"\n    ipkeep.dev/retain-for: 4s\nspec:\n  nodeName: {node}\n  \
         containers:\n  - name: web\n    image: registry.invalid/web:1\n"
    )
}

/// Sets the pod's status as a kubelet would once the CNI plugin gave it `ip`.
fn run_pod(plane: &ControlPlane, ns: &str, ip: &str) {
    let status = format!(
        r#"{{"status":{{"phase":"Running","podIP":"{ip}","podIPs":[{{"ip":"{ip}"}}],"hostIP":"192.0.2.10","conditions":[{{"type":"Ready","status":"True"}}]}}}}"#
    );
    kubectl_ok(
        plane,
        &[
            "patch",
            "pod",
            "web-0",
            "-n",
            ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status,
        ],
        None,
    );
}

fn reservation(plane: &ControlPlane, ns: &str, name: &str) -> Option<Value> {
    let mut get = plane.kubectl();
    get.args([
        "get",
        "ipreservations",
        name,
        "-n",
        ns,
        "-o",
        "json",
        "--ignore-not-found",
    ]);
    let out = checked(get, None);
    if out.stdout.is_empty() {
        None
    } else {
        Some(serde_json::from_slice(&out.stdout).unwrap())
    }
}

fn events(plane: &ControlPlane, ns: &str, reporter: &str) -> Vec<Value> {
    let list = kubectl_json(plane, &["get", "events.events.k8s.io", "-n", ns]);
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reportingController"] == reporter)
        .cloned()
        .collect()
}

/// Held by each test while its controller runs: both watch every namespace, so one would reserve
/// the other's pods.
static ONE_CONTROLLER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The verbs of `access` on core `namespaces`.
fn namespace_verbs(access: &BTreeSet<Access>) -> BTreeSet<String> {
    access
        .iter()
        .filter(|(_, resource)| resource == "core/namespaces")
        .map(|(verb, _)| verb.clone())
        .collect()
}

/// What each test of this file starts from: the shared control plane and its audit log, the
/// release's namespace and the workload's, and a scratch directory with the node's files under
/// `fs_root`.
struct Setup {
    plane: &'static ControlPlane,
    audit_log: PathBuf,
    ns: String,
    work: String,
    scratch: Scratch,
    fs_root: PathBuf,
}

/// A [`Setup`] named after `prefix`.
async fn setup(prefix: &str) -> Setup {
    let plane = shared().await.unwrap();
    let audit_log = plane
        .audit_log_path()
        .expect("the shared control plane writes an audit log")
        .to_path_buf();
    let ns = plane.fresh_namespace(prefix).await.unwrap();
    let work = plane
        .fresh_namespace(&format!("{prefix}-work"))
        .await
        .unwrap();
    let scratch = Scratch::new(&format!("chart-{prefix}"));
    let fs_root = scratch.join("root");
    Setup {
        plane,
        audit_log,
        ns,
        work,
        scratch,
        fs_root,
    }
}

/// The downward-API fields of a pod `name` in `ns` on `node`, as the kubelet fills them in.
fn pod_fields(name: &str, ns: &str, node: &str) -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        ("metadata.name", name.to_owned()),
        ("metadata.namespace", ns.to_owned()),
        ("spec.nodeName", node.to_owned()),
    ])
}

/// The chart's names in one release: `<release>-ipkeep` (the prefix of every object it makes)
/// and its two ServiceAccounts.
struct Release {
    fullname: String,
    controller_sa: String,
    agent_sa: String,
}

impl Release {
    fn named(release: &str) -> Self {
        let fullname = format!("{release}-ipkeep");
        Release {
            controller_sa: format!("{fullname}-controller"),
            agent_sa: format!("{fullname}-agent"),
            fullname,
        }
    }
}

/// Whose access a row of [`ACCESS`] asks about.
#[derive(Debug, Clone, Copy)]
enum Subject {
    Controller,
    Agent,
}

/// Where a row of [`ACCESS`] asks: cluster-wide, in the release's namespace, or in the
/// workload's.
#[derive(Debug, Clone, Copy)]
enum Scope {
    ClusterWide,
    InRelease,
    InWorkload,
}

/// What the chart's RBAC (default values, `cni.replaceHostLocal=true`) must answer, row by row:
/// may the subject use the verb on `group/resource[/subresource]` (`:name` for one object,
/// `{fullname}` the release's prefix) in that scope? The audit log proves the chart grants no
/// more than the components use; these rows say what that is, and that what they must never do
/// (write pods, read other Secrets, take other Leases) is refused.
#[rustfmt::skip]
const ACCESS: &[(Subject, &str, &str, Scope, bool)] = &[
    (Controller, "get", "core/pods", InWorkload, true),
    (Controller, "list", "core/pods", ClusterWide, true),
    (Controller, "watch", "core/pods", ClusterWide, true),
    (Controller, "patch", "core/pods", InWorkload, false),
    (Controller, "delete", "core/pods", InWorkload, false),
    (Controller, "get", "core/nodes", ClusterWide, true),
    (Controller, "list", "core/nodes", ClusterWide, true),
    (Controller, "watch", "core/nodes", ClusterWide, true),
    (Controller, "patch", "core/nodes", ClusterWide, false),
    (Controller, "list", "core/namespaces", ClusterWide, false),
    (Controller, "list", "apps/statefulsets", ClusterWide, true),
    (Controller, "watch", "apps/statefulsets", ClusterWide, true),
    (Controller, "get", "apps/statefulsets", InWorkload, false),
    (Controller, "list", "ipkeep.dev/ipreservations", ClusterWide, true),
    (Controller, "watch", "ipkeep.dev/ipreservations", ClusterWide, true),
    (Controller, "create", "ipkeep.dev/ipreservations", InWorkload, true),
    (Controller, "patch", "ipkeep.dev/ipreservations", InWorkload, true),
    (Controller, "delete", "ipkeep.dev/ipreservations", InWorkload, true),
    (Controller, "update", "ipkeep.dev/ipreservations", InWorkload, false),
    (Controller, "patch", "ipkeep.dev/ipreservations/status", InWorkload, true),
    (Controller, "update", "ipkeep.dev/ipreservations/status", InWorkload, false),
    (Controller, "create", "events.k8s.io/events", InWorkload, true),
    (Controller, "patch", "events.k8s.io/events", InWorkload, false),
    (Controller, "get", "apiextensions.k8s.io/customresourcedefinitions:ipreservations.ipkeep.dev", ClusterWide, true),
    (Controller, "patch", "apiextensions.k8s.io/customresourcedefinitions:ipreservations.ipkeep.dev", ClusterWide, true),
    (Controller, "patch", "apiextensions.k8s.io/customresourcedefinitions:widgets.example.com", ClusterWide, false),
    (Controller, "create", "apiextensions.k8s.io/customresourcedefinitions", ClusterWide, false),
    (Controller, "get", "admissionregistration.k8s.io/mutatingwebhookconfigurations:{fullname}-placement", ClusterWide, true),
    (Controller, "patch", "admissionregistration.k8s.io/mutatingwebhookconfigurations:{fullname}-placement", ClusterWide, true),
    (Controller, "patch", "admissionregistration.k8s.io/mutatingwebhookconfigurations:another-webhook", ClusterWide, false),
    (Controller, "create", "coordination.k8s.io/leases", InRelease, true),
    (Controller, "get", "coordination.k8s.io/leases:{fullname}-controller", InRelease, true),
    (Controller, "patch", "coordination.k8s.io/leases:{fullname}-controller", InRelease, true),
    (Controller, "patch", "coordination.k8s.io/leases:another-lease", InRelease, false),
    (Controller, "create", "coordination.k8s.io/leases", InWorkload, false),
    (Controller, "get", "core/secrets:{fullname}-webhook-tls", InRelease, true),
    (Controller, "update", "core/secrets:{fullname}-webhook-tls", InRelease, true),
    (Controller, "get", "core/secrets:another-secret", InRelease, false),
    (Controller, "list", "core/secrets", InRelease, false),
    (Agent, "list", "ipkeep.dev/ipreservations", ClusterWide, true),
    (Agent, "watch", "ipkeep.dev/ipreservations", ClusterWide, true),
    (Agent, "patch", "ipkeep.dev/ipreservations", InWorkload, false),
    (Agent, "delete", "ipkeep.dev/ipreservations", InWorkload, false),
    (Agent, "patch", "ipkeep.dev/ipreservations/status", InWorkload, true),
    (Agent, "create", "events.k8s.io/events", InWorkload, true),
    (Agent, "patch", "core/pods/status", InRelease, true),
    (Agent, "patch", "core/pods/status", InWorkload, false),
    (Agent, "list", "core/pods", ClusterWide, false),
    (Agent, "get", "core/nodes", ClusterWide, false),
    (Agent, "get", "apps/daemonsets:{fullname}-agent", InRelease, true),
    (Agent, "get", "apps/daemonsets:another-agent", InRelease, false),
    (Agent, "list", "apps/daemonsets", InRelease, false),
    (Agent, "get", "core/secrets:{fullname}-webhook-tls", InRelease, false),
    (Agent, "get", "apiextensions.k8s.io/customresourcedefinitions:ipreservations.ipkeep.dev", ClusterWide, true),
    (Agent, "get", "apiextensions.k8s.io/customresourcedefinitions:widgets.example.com", ClusterWide, false),
    (Agent, "patch", "apiextensions.k8s.io/customresourcedefinitions:ipreservations.ipkeep.dev", ClusterWide, false),
];

/// Asks the API server's authorizer every row of [`ACCESS`] (a SubjectAccessReview as each
/// ServiceAccount of `release`, installed in `ns`) and returns every row it answers otherwise.
async fn access_table_failures(
    plane: &ControlPlane,
    release: &Release,
    ns: &str,
    work: &str,
) -> Vec<String> {
    let reviews: Api<SubjectAccessReview> = Api::all(plane.client().unwrap());
    let mut failures = Vec::new();
    for &(subject, verb, resource, scope, allowed) in ACCESS {
        let account = match subject {
            Controller => &release.controller_sa,
            Agent => &release.agent_sa,
        };
        let resource = resource.replace("{fullname}", &release.fullname);
        let (path, name) = match resource.split_once(':') {
            Some((path, name)) => (path, Some(name.to_owned())),
            None => (resource.as_str(), None),
        };
        let mut parts = path.splitn(3, '/');
        let group = parts.next().unwrap();
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(format!("system:serviceaccount:{ns}:{account}")),
                groups: Some(vec![
                    "system:serviceaccounts".to_owned(),
                    format!("system:serviceaccounts:{ns}"),
                    "system:authenticated".to_owned(),
                ]),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.to_owned()),
                    group: Some(if group == "core" { "" } else { group }.to_owned()),
                    resource: parts.next().map(str::to_owned),
                    subresource: parts.next().map(str::to_owned),
                    name: name.clone(),
                    namespace: match scope {
                        ClusterWide => None,
                        InRelease => Some(ns.to_owned()),
                        InWorkload => Some(work.to_owned()),
                    },
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = reviews
            .create(&PostParams::default(), &review)
            .await
            .unwrap();
        let got = answer.status.is_some_and(|s| s.allowed);
        if got != allowed {
            failures.push(format!(
                "{subject:?} {verb} {path}{} in {scope:?}: the API server says {}, the table {}",
                name.map(|n| format!(" {n}")).unwrap_or_default(),
                if got { "allowed" } else { "denied" },
                if allowed { "allowed" } else { "denied" },
            ));
        }
    }
    failures
}

/// The chart's two components as the API server holds them, started on this machine as their
/// ServiceAccounts.
struct Components {
    agent: Component,
    controller: Component,
}

impl Components {
    /// Both, for [`eventually`] to check that neither exited.
    fn both(&mut self) -> [&mut Component; 2] {
        [&mut self.agent, &mut self.controller]
    }
}

/// The first scenario's steps on the running components: the annotated pod `web-0` in `work`
/// on `node` Bound with its file, Unprotected while the node's network is renamed, Released
/// with the file kept, Rebound when re-created, and expired (reservation and file gone), with
/// the controller's Events for each.
async fn scenario_one(
    plane: &ControlPlane,
    components: &mut Components,
    work: &str,
    node: &str,
    fs_root: &Path,
    conflist: &dyn Fn(&str) -> String,
) {
    let conf_dir = fs_root.join("host/etc/cni/net.d");
    let file = fs_root.join(format!("var/lib/cni/networks/cbr0/reserved/{work}/web-0"));
    // The annotated pod runs with its IP; the controller reserves it, the agent writes the file
    // the plugin reads.
    kubectl_ok(plane, &["apply", "-f", "-"], Some(&pod_yaml(work, node)));
    run_pod(plane, work, "10.244.1.17");
    let phase = |plane: &ControlPlane| {
        reservation(plane, work, "web-0")
            .map(|r| r["status"]["phase"].as_str().unwrap_or_default().to_owned())
    };
    eventually("the reservation Bound", &mut components.both(), || {
        phase(plane).as_deref() == Some("Bound")
    })
    .await;
    eventually(
        "the agent to write the reservation file",
        &mut components.both(),
        || std::fs::read_to_string(&file).is_ok_and(|t| t.contains("10.244.1.17")),
    )
    .await;

    // The node's network renamed under the agent (agent.networks no longer names it): the agent
    // marks the reservation Unprotected, and unmarks it when the name is back.
    let unprotected = |plane: &ControlPlane| {
        reservation(plane, work, "web-0").is_some_and(|r| {
            r["status"]["conditions"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["type"] == "Unprotected"))
        })
    };
    std::fs::write(conf_dir.join("10-cbr0.conflist"), conflist("other")).unwrap();
    eventually(
        "the agent to mark the reservation Unprotected",
        &mut components.both(),
        || unprotected(plane),
    )
    .await;
    std::fs::write(conf_dir.join("10-cbr0.conflist"), conflist("cbr0")).unwrap();
    eventually(
        "the agent to clear the reservation's Unprotected",
        &mut components.both(),
        || !unprotected(plane),
    )
    .await;

    // Deleted (as the kubelet would finish it): Released, the file still holds the IP.
    force_delete_web_0(plane, work);
    eventually("the reservation Released", &mut components.both(), || {
        phase(plane).as_deref() == Some("Released")
    })
    .await;
    assert!(
        std::fs::read_to_string(&file)
            .unwrap()
            .contains("10.244.1.17")
    );

    // Re-created: the plugin would give it the reserved IP (the file); the pod runs with it
    // and the reservation is Bound to the new pod.
    kubectl_ok(plane, &["apply", "-f", "-"], Some(&pod_yaml(work, node)));
    let new_uid = kubectl_ok(
        plane,
        &[
            "get",
            "pod",
            "web-0",
            "-n",
            work,
            "-o",
            "jsonpath={.metadata.uid}",
        ],
        None,
    );
    run_pod(plane, work, "10.244.1.17");
    eventually(
        "the reservation Bound to the re-created pod",
        &mut components.both(),
        || {
            reservation(plane, work, "web-0").is_some_and(|r| {
                r["status"]["phase"] == "Bound" && r["status"]["podUID"] == new_uid.as_str()
            })
        },
    )
    .await;
    assert_eq!(
        reservation(plane, work, "web-0").unwrap()["spec"]["ips"][0],
        "10.244.1.17",
        "the re-created pod keeps its IP"
    );

    // Gone for good: after retain-for (4 s) the controller deletes it, the agent the file.
    force_delete_web_0(plane, work);
    eventually(
        "the controller to delete the expired reservation",
        &mut components.both(),
        || reservation(plane, work, "web-0").is_none(),
    )
    .await;
    eventually(
        "the agent to remove the reservation file",
        &mut components.both(),
        || !file.exists(),
    )
    .await;
    let reasons: BTreeSet<String> = events(plane, work, "ipkeep-controller")
        .iter()
        .map(|e| e["reason"].as_str().unwrap_or_default().to_owned())
        .collect();
    for reason in ["Reserved", "Released", "Rebound", "Expired"] {
        assert!(
            reasons.contains(reason),
            "no {reason} Event from the controller: {reasons:?}"
        );
    }
}

/// Deletes pod `web-0` of `ns` at once, as the kubelet would finish its deletion.
fn force_delete_web_0(plane: &ControlPlane, ns: &str) {
    kubectl_ok(
        plane,
        &[
            "delete",
            "pod",
            "web-0",
            "-n",
            ns,
            "--grace-period=0",
            "--force",
        ],
        None,
    );
}

/// A reservation the agent refuses: a Warning Event, and for a second version with the same
/// refusal a second Event (posted, not patched). The CRD already refuses an address that is none,
/// so its rules on `ips` are dropped here, as on an API server that does not enforce CRD
/// validation rules (CEL) or with a CRD edited by hand: the case the agent's check is for.
async fn the_agent_reports_each_refused_version(
    plane: &ControlPlane,
    components: &mut Components,
    work: &str,
    node: &str,
) {
    kubectl_ok(
        plane,
        &[
            "patch",
            "crd",
            "ipreservations.ipkeep.dev",
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/ips/x-kubernetes-validations"}]"#,
        ],
        None,
    );
    let refused = |label: &str| {
        format!(
            "apiVersion: ipkeep.dev/v1alpha1\nkind: IPReservation\nmetadata:\n  name: bad-0\n  namespace: {work}\n  \
             labels: {{try: \"{label}\"}}\nspec:\n  ips: [\"10.244.1.999\"]\n  nodeName: {node}\n  retainFor: 1h\n"
        )
    };
    eventually(
        "the API server to accept the refused reservation (the CRD change to take effect)",
        &mut components.both(),
        || {
            testkit::kubectl(plane, &["apply", "-f", "-"], Some(&refused("one")))
                .status
                .success()
        },
    )
    .await;
    let agent_event_count = |plane: &ControlPlane| {
        events(plane, work, "ipkeep-agent")
            .iter()
            .filter(|e| e["reason"] == "InvalidReservation")
            .count()
    };
    eventually(
        "the agent's InvalidReservation Event",
        &mut components.both(),
        || agent_event_count(plane) >= 1,
    )
    .await;
    kubectl_ok(plane, &["apply", "-f", "-"], Some(&refused("two")));
    eventually(
        "the agent's second InvalidReservation Event (one per refused version)",
        &mut components.both(),
        || agent_event_count(plane) >= 2,
    )
    .await;
    kubectl_ok(
        plane,
        &["delete", "ipreservations", "bad-0", "-n", work],
        None,
    );
}

/// What the controller does beyond the pods' reservations: a reservation on a node that is gone
/// is deleted (the controller reads the Node afresh, `get nodes`, first), and the placement
/// webhook's certificate is filled in the chart's Secret and its CA put in the webhook
/// configuration (`get`/`update` on the one Secret, `get`/`patch` on the one configuration).
async fn the_controller_deletes_orphans_and_fills_the_webhook(
    plane: &ControlPlane,
    components: &mut Components,
    release: &Release,
    ns: &str,
    work: &str,
) {
    kubectl_ok(
        plane,
        &["apply", "-f", "-"],
        Some(&format!(
            "apiVersion: ipkeep.dev/v1alpha1\nkind: IPReservation\nmetadata:\n  name: orphan-0\n  \
             namespace: {work}\nspec:\n  ips: [\"10.244.7.7\"]\n  nodeName: rbac-node-gone\n  retainFor: 1h\n"
        )),
    );
    eventually(
        "the controller to delete the reservation of a node that does not exist",
        &mut components.both(),
        || reservation(plane, work, "orphan-0").is_none(),
    )
    .await;
    let fullname = &release.fullname;
    eventually(
        "the controller to fill the webhook's Secret and caBundle",
        &mut components.both(),
        || {
            let secret = kubectl_json(
                plane,
                &[
                    "get",
                    "secret",
                    &format!("{fullname}-webhook-tls"),
                    "-n",
                    ns,
                ],
            );
            let hook = kubectl_json(
                plane,
                &[
                    "get",
                    "mutatingwebhookconfiguration",
                    &format!("{fullname}-placement"),
                ],
            );
            secret["data"]["ca.crt"].is_string()
                && hook["webhooks"][0]["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
        },
    )
    .await;
}

/// Least privilege from the audit log, for each account of `release` in `ns`: never refused,
/// used nothing the chart does not grant, and was granted nothing it did not use but for the
/// exceptions the chart names. Returns every failure, and the report of what each used and was
/// granted.
fn audit_log_failures(
    plane: &ControlPlane,
    audit_log: &Path,
    release: &Release,
    ns: &str,
) -> (Vec<String>, String) {
    let controller_sa = &release.controller_sa;
    let agent_sa = &release.agent_sa;
    let controller_roles = vec![
        kubectl_json(plane, &["get", "clusterrole", controller_sa]),
        kubectl_json(
            plane,
            &[
                "get",
                "role",
                &format!("{controller_sa}-leader-election"),
                "-n",
                ns,
            ],
        ),
    ];
    let agent_roles = vec![
        kubectl_json(plane, &["get", "clusterrole", agent_sa]),
        kubectl_json(plane, &["get", "role", agent_sa, "-n", ns]),
    ];
    let mut report = String::new();
    let mut failures = Vec::new();
    for (sa, roles, template) in [
        (controller_sa, controller_roles, "controller-rbac.yaml"),
        (agent_sa, agent_roles, "agent-rbac.yaml"),
    ] {
        let user = format!("system:serviceaccount:{ns}:{sa}");
        let used = used_by(audit_log, &user);
        let granted = granted_by(&roles);
        let exceptions = exceptions_in(template);
        let used_set: BTreeSet<Access> = used.keys().cloned().collect();
        let denied: Vec<&Access> = used
            .iter()
            .filter(|(_, codes)| codes.contains(&403))
            .map(|(k, _)| k)
            .collect();
        let missing: Vec<&Access> = used_set.difference(&granted).collect();
        let unused: BTreeSet<Access> = granted.difference(&used_set).cloned().collect();
        let named: BTreeSet<Access> = exceptions.keys().cloned().collect();
        report.push_str(&format!(
            "{sa}\n  used:    {used:?}\n  granted: {granted:?}\n  exceptions: {exceptions:?}\n"
        ));
        if !denied.is_empty() {
            failures.push(format!("{sa} was denied {denied:?}"));
        }
        if !missing.is_empty() {
            failures.push(format!(
                "{sa} used what the chart does not grant: {missing:?}"
            ));
        }
        if unused != named {
            failures.push(format!(
                "{sa}: granted but never used {unused:?}, the chart names as exceptions {named:?}"
            ));
        }
    }
    // Without controller.namespaceSelector the controller neither reads Namespaces nor may.
    let controller_user = format!("system:serviceaccount:{ns}:{controller_sa}");
    let used_namespaces =
        namespace_verbs(&used_by(audit_log, &controller_user).into_keys().collect());
    let granted_namespaces = namespace_verbs(&granted_by(&[kubectl_json(
        plane,
        &["get", "clusterrole", controller_sa],
    )]));
    if !used_namespaces.is_empty() || !granted_namespaces.is_empty() {
        failures.push(format!(
            "no selector, no Namespaces: the controller used {used_namespaces:?} and was granted {granted_namespaces:?}"
        ));
    }
    (failures, report)
}

/// The controller's one exception, proven needed: a server-side apply creating a reservation
/// succeeds as the controller (its kubeconfig `controller_kc`), and is forbidden once `create`
/// is taken from its rule.
async fn the_controller_needs_create_for_server_side_apply(
    plane: &ControlPlane,
    controller_sa: &str,
    controller_kc: &Path,
    work: &str,
    node: &str,
) {
    let probe = |name: &str| {
        let yaml = format!(
            "apiVersion: ipkeep.dev/v1alpha1\nkind: IPReservation\nmetadata: {{name: {name}, namespace: {work}}}\n\
             spec: {{ips: [\"10.244.1.50\"], nodeName: {node}}}\n"
        );
        let mut kubectl = Command::new(plane.bin("kubectl"));
        kubectl
            .args([
                "apply",
                "--server-side",
                "--field-manager=ipkeep-controller",
                "-f",
                "-",
            ])
            .env("KUBECONFIG", controller_kc);
        testkit::run(kubectl, Some(&yaml))
    };
    ok(
        "server-side apply of a new reservation as the controller",
        probe("probe-0"),
    );
    let role = kubectl_json(plane, &["get", "clusterrole", controller_sa]);
    let index = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .position(|r| r["resources"] == serde_json::json!(["ipreservations"]))
        .unwrap();
    let verbs: Vec<&str> = role["rules"][index]["verbs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .filter(|v| *v != "create")
        .collect();
    let change = serde_json::json!([{"op": "replace", "path": format!("/rules/{index}/verbs"), "value": verbs}]);
    kubectl_ok(
        plane,
        &[
            "patch",
            "clusterrole",
            controller_sa,
            "--type=json",
            "-p",
            &change.to_string(),
        ],
        None,
    );
    let denied = wait_for("the RBAC change to deny the create", || {
        let out = probe("probe-1");
        let denied =
            (!out.status.success()).then(|| String::from_utf8_lossy(&out.stderr).into_owned());
        if denied.is_none() {
            kubectl_ok(
                plane,
                &["delete", "ipreservations", "probe-1", "-n", work],
                None,
            );
        }
        async move { denied }
    })
    .await;
    assert!(
        denied.contains("forbidden")
            && denied.contains("cannot create resource \"ipreservations\""),
        "{denied}"
    );
}

/// The agent's init container (`install-cni`, run as mapped here): the plugin in the CNI bin
/// directory `bin_dir`, and as host-local, the original kept beside it.
fn the_init_container_installs_the_plugin_as_host_local(
    install_run: &ContainerRun,
    bin_dir: &Path,
) {
    let out = Command::new(&install_run.argv[0])
        .args(&install_run.argv[1..])
        .envs(install_run.env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    ok(
        &format!("the install-cni init container {:?}", install_run.argv),
        out,
    );
    assert_eq!(
        std::fs::read(bin_dir.join("ipkeep")).unwrap(),
        b"the plugin, from the image"
    );
    assert_eq!(
        std::fs::read(bin_dir.join("host-local")).unwrap(),
        b"the plugin, from the image"
    );
    assert_eq!(
        std::fs::read(bin_dir.join("host-local.ipkeep-orig")).unwrap(),
        b"the real host-local"
    );
}

/// The agent's preStop `pre_stop`, as the agent's account (`agent_kc`): while its DaemonSet
/// `agent_sa` in `ns` exists (the pod is only replaced) host-local in `bin_dir` stays ipkeep;
/// once the DaemonSet is deleted the original is back.
fn the_pre_stop_keeps_ipkeep_until_the_daemonset_is_gone(
    plane: &ControlPlane,
    pre_stop: &[String],
    agent_run: &ContainerRun,
    agent_kc: &Path,
    bin_dir: &Path,
    ns: &str,
    agent_sa: &str,
) {
    let run_pre_stop = || {
        let mut cmd = Command::new(&pre_stop[0]);
        cmd.args(&pre_stop[1..])
            .envs(agent_run.env.iter().map(|(k, v)| (k, v)))
            .env("KUBECONFIG", agent_kc);
        String::from_utf8_lossy(&checked(cmd, None).stderr).into_owned()
    };
    let replaced = run_pre_stop();
    assert!(replaced.contains("stays ipkeep"), "{replaced}");
    assert_eq!(
        std::fs::read(bin_dir.join("host-local")).unwrap(),
        b"the plugin, from the image"
    );
    kubectl_ok(plane, &["delete", "daemonset", agent_sa, "-n", ns], None);
    let removed = run_pre_stop();
    assert!(removed.contains("it is gone"), "{removed}");
    assert_eq!(
        std::fs::read(bin_dir.join("host-local")).unwrap(),
        b"the real host-local"
    );
    assert!(!bin_dir.join("host-local.ipkeep-orig").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_grants_exactly_what_the_components_use() {
    let _plane = testkit::plane::use_plane_alone().await;
    let _alone = ONE_CONTROLLER.lock().await;
    let t0 = Instant::now();
    let Setup {
        plane,
        audit_log,
        ns,
        work,
        scratch,
        fs_root,
    } = setup("rbac").await;
    std::fs::create_dir_all(fs_root.join("host/opt/cni/bin")).unwrap();
    std::fs::write(fs_root.join("ipkeep"), b"the plugin, from the image").unwrap();
    std::fs::write(
        fs_root.join("host/opt/cni/bin/host-local"),
        b"the real host-local",
    )
    .unwrap();

    let release_name = "rbac";
    let mut install = plane.helm();
    install
        .args(["install", release_name])
        .arg(chart_dir())
        .args(["-n", &ns, "--set", "cni.replaceHostLocal=true"])
        .args(UNPULLED_IMAGE)
        .args(["--set", "controller.normalEvents=true"]);
    checked(install, None);
    let installed = t0.elapsed();
    let _uninstall = UninstallOnDrop::new(plane, release_name, &ns);
    let release = Release::named(release_name);
    let Release {
        controller_sa,
        agent_sa,
        ..
    } = &release;

    // What each account may do, as the authorizer answers, before anything runs.
    let table_failures = access_table_failures(plane, &release, &ns, &work).await;
    assert!(
        table_failures.is_empty(),
        "the chart's RBAC answers {} of {} rows otherwise:\n{}",
        table_failures.len(),
        ACCESS.len(),
        table_failures.join("\n")
    );

    // The pod templates as the API server holds them, and the ServiceAccounts they name.
    let deploy = kubectl_json(plane, &["get", "deployment", controller_sa, "-n", &ns]);
    let daemonset = kubectl_json(plane, &["get", "daemonset", agent_sa, "-n", &ns]);
    let controller_template = &deploy["spec"]["template"];
    let agent_template = &daemonset["spec"]["template"];
    assert_eq!(
        controller_template["spec"]["serviceAccountName"],
        controller_sa.as_str()
    );
    assert_eq!(
        agent_template["spec"]["serviceAccountName"],
        agent_sa.as_str()
    );
    // A node of its own: the plane's other suites leave reservations on `node-a` (with the
    // addresses this scenario uses), which the chart's cluster-wide controller would see.
    let node = "node-rbac";
    // The pods of the story are bound to it: a Node that exists (a fixture, no kubelet), or the pod
    // garbage collector would delete them as orphans.
    plane.add_node(node).await.expect("the fixture Node");
    let controller_fields = pod_fields(&format!("{controller_sa}-7d9f-x1"), &ns, node);
    let agent_pod = format!("{agent_sa}-q2m");
    let agent_fields = pod_fields(&agent_pod, &ns, node);
    let (controller_run, _) = container(
        controller_template,
        "controller",
        &controller_fields,
        &fs_root,
    );
    let (install_run, _) = container(agent_template, "install-cni", &agent_fields, &fs_root);
    let (agent_run, agent_container) = container(agent_template, "agent", &agent_fields, &fs_root);
    let pre_stop: Vec<String> = agent_container["lifecycle"]["preStop"]["exec"]["command"]
        .as_array()
        .expect("cni.replaceHostLocal=true gives the agent a preStop")
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    let pre_stop = map_argv(&pre_stop, &agent_run.env, &fs_root);

    // The node's root (the chart's default, no cni.binDir): the directories are the ones its
    // containerd's configuration names, as `containerd config default` writes it.
    let containerd = fs_root.join("host/etc/containerd");
    std::fs::create_dir_all(&containerd).unwrap();
    std::fs::write(
        containerd.join("config.toml"),
        "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.cni]\n  bin_dir = ''\n  bin_dirs = ['/opt/cni/bin']\n  conf_dir = '/etc/cni/net.d'\n",
    )
    .unwrap();
    let bin_dir = fs_root.join("host/opt/cni/bin");
    the_init_container_installs_the_plugin_as_host_local(&install_run, &bin_dir);

    // The node's CNI configuration the agent reads (a bridge + host-local with the agent's data
    // directory, as mapped here: in charge, host-local being ipkeep).
    let conf_dir = fs_root.join("host/etc/cni/net.d");
    std::fs::create_dir_all(&conf_dir).unwrap();
    let ipam_data_dir = fs_root.join("var/lib/cni/networks");
    let conflist = |network: &str| {
        format!(
            r#"{{"cniVersion": "1.0.0", "name": "{network}", "plugins": [{{"type": "bridge", "ipam": {{"type": "host-local", "dataDir": "{}"}}}}]}}"#,
            ipam_data_dir.display()
        )
    };
    std::fs::write(conf_dir.join("10-cbr0.conflist"), conflist("cbr0")).unwrap();

    // Each component as its own ServiceAccount.
    let controller_kc = scratch.join("controller.kubeconfig");
    let agent_kc = scratch.join("agent.kubeconfig");
    plane
        .write_service_account_kubeconfig(&ns, controller_sa, &controller_kc)
        .await
        .unwrap();
    // The agent's pod as the DaemonSet's would be on the node (a fixture: no kubelet runs it), and
    // a token bound to it as the kubelet's is: the API server names the pod and its node in
    // every request the agent makes, and the chart's node policy holds it to them.
    kubectl_ok(
        plane,
        &["apply", "-f", "-"],
        Some(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {agent_pod}\n  namespace: {ns}\nspec:\n  \
             nodeName: {node}\n  serviceAccountName: {agent_sa}\n  containers:\n  - name: agent\n    \
             image: registry.invalid/ipkeep:1\n"
        )),
    );
    plane
        .write_pod_kubeconfig(&ns, agent_sa, &agent_pod, &agent_kc)
        .await
        .unwrap();
    let mut components = Components {
        agent: Component::start("agent", &agent_kc, &agent_run, scratch.join("agent.log")),
        controller: Component::start(
            "controller",
            &controller_kc,
            &controller_run,
            scratch.join("controller.log"),
        ),
    };
    let scenario_started = Instant::now();
    scenario_one(plane, &mut components, &work, node, &fs_root, &conflist).await;
    the_agent_reports_each_refused_version(plane, &mut components, &work, node).await;
    the_controller_deletes_orphans_and_fills_the_webhook(
        plane,
        &mut components,
        &release,
        &ns,
        &work,
    )
    .await;
    let scenario = scenario_started.elapsed();
    components.controller.stop();
    components.agent.stop();

    the_pre_stop_keeps_ipkeep_until_the_daemonset_is_gone(
        plane, &pre_stop, &agent_run, &agent_kc, &bin_dir, &ns, agent_sa,
    );

    // Least privilege, both ways.
    let (failures, report) = audit_log_failures(plane, &audit_log, &release, &ns);
    eprintln!(
        "chart_rbac: helm install {:.1}s, scenario {:.1}s, total {:.1}s\n{report}",
        installed.as_secs_f64(),
        scenario.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{}\n{report}", failures.join("\n"));
    the_controller_needs_create_for_server_side_apply(
        plane,
        controller_sa,
        &controller_kc,
        &work,
        node,
    )
    .await;
}

/// The other variant: `controller.namespaceSelector` set. The chart's controller rules are the
/// default's plus `list`, `watch` on namespaces and nothing else; the controller, run from the
/// installed Deployment's command line as its account, tells an annotated pod in an unlabelled
/// namespace `NotReserved` and reserves it once the namespace is labelled, and the audit log shows
/// it used exactly `list` and `watch` on namespaces, and was never refused anything. (The rest of
/// the controller's rules are proven used by the test above, with the default values.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_namespace_selector_the_controller_lists_and_watches_namespaces_only() {
    let _plane = testkit::plane::use_plane_alone().await;
    const SELECTOR: &str = "ipkeep.dev/reserve=true";
    let _alone = ONE_CONTROLLER.lock().await;
    let Setup {
        plane,
        audit_log,
        ns,
        work,
        scratch,
        fs_root,
    } = setup("rbac-nsel").await;
    let release = "rbacnsel";
    // No webhook nor admission policy: cluster-wide objects the delta does not touch.
    let values = [
        "--set",
        "placement.enabled=false",
        "--set",
        "policy.admission.enabled=false",
    ];
    let mut install = plane.helm();
    install
        .args(["install", release])
        .arg(chart_dir())
        .args(["-n", &ns])
        .args(values)
        .args(UNPULLED_IMAGE)
        .args(["--set", &format!("controller.namespaceSelector={SELECTOR}")]);
    checked(install, None);
    let _uninstall = UninstallOnDrop::new(plane, release, &ns);
    let controller_sa = format!("{release}-ipkeep-controller");

    // The rules: the default's, plus list and watch on namespaces.
    let default_role = {
        let chart = chart_dir();
        let mut args = vec![
            "template",
            release,
            chart.to_str().unwrap(),
            "--show-only",
            "templates/controller-rbac.yaml",
        ];
        args.extend(values);
        args.extend(UNPULLED_IMAGE);
        let yaml = testkit::run_ok(plane.helm(), &args, None);
        // One JSON object per rendered document.
        let json = kubectl_ok(
            plane,
            &["create", "--dry-run=client", "-o", "json", "-f", "-"],
            Some(&yaml),
        );
        serde_json::Deserializer::from_str(&json)
            .into_iter::<Value>()
            .map(Result::unwrap)
            .find(|o| o["kind"] == "ClusterRole")
            .unwrap()
    };
    let granted = granted_by(&[kubectl_json(plane, &["get", "clusterrole", &controller_sa])]);
    let added: BTreeSet<Access> = granted
        .difference(&granted_by(&[default_role]))
        .cloned()
        .collect();
    let expected: BTreeSet<Access> = ["list", "watch"]
        .iter()
        .map(|v| ((*v).to_owned(), "core/namespaces".to_owned()))
        .collect();
    assert_eq!(
        added, expected,
        "what the value adds to the controller's rules"
    );

    // The controller as the chart runs it, as its account.
    let deploy = kubectl_json(plane, &["get", "deployment", &controller_sa, "-n", &ns]);
    // A node of its own: the plane's other suites leave reservations on `node-a` (with the
    // addresses this scenario uses), which the chart's cluster-wide controller would see.
    let node = "node-rbac";
    plane.add_node(node).await.expect("the fixture Node");
    let fields = pod_fields(&format!("{controller_sa}-7d9f-x2"), &ns, node);
    let (run, _) = container(&deploy["spec"]["template"], "controller", &fields, &fs_root);
    assert!(
        run.argv
            .contains(&format!("--namespace-selector={SELECTOR}")),
        "{:?}",
        run.argv
    );
    let kubeconfig = scratch.join("controller.kubeconfig");
    plane
        .write_service_account_kubeconfig(&ns, &controller_sa, &kubeconfig)
        .await
        .unwrap();
    let mut controller = Component::start(
        "controller",
        &kubeconfig,
        &run,
        scratch.join("controller.log"),
    );
    kubectl_ok(plane, &["apply", "-f", "-"], Some(&pod_yaml(&work, node)));
    run_pod(plane, &work, "10.244.1.18");
    eventually(
        "a NotReserved Event naming the selector",
        &mut [&mut controller],
        || {
            events(plane, &work, "ipkeep-controller").iter().any(|e| {
                e["reason"] == "NotReserved"
                    && e["note"].as_str().is_some_and(|n| n.contains(SELECTOR))
            })
        },
    )
    .await;
    assert!(reservation(plane, &work, "web-0").is_none());
    kubectl_ok(plane, &["label", "namespace", &work, SELECTOR], None);
    eventually("the reservation Bound", &mut [&mut controller], || {
        reservation(plane, &work, "web-0").is_some_and(|r| r["status"]["phase"] == "Bound")
    })
    .await;
    controller.stop();

    let used = used_by(
        &audit_log,
        &format!("system:serviceaccount:{ns}:{controller_sa}"),
    );
    let denied: Vec<&Access> = used
        .iter()
        .filter(|(_, codes)| codes.contains(&403))
        .map(|(k, _)| k)
        .collect();
    assert!(denied.is_empty(), "denied {denied:?}; used {used:?}");
    let used: BTreeSet<Access> = used.into_keys().collect();
    assert_eq!(
        namespace_verbs(&used),
        namespace_verbs(&expected),
        "the Namespace verbs the controller used; all it used: {used:?}"
    );
    let lease_role = kubectl_json(
        plane,
        &[
            "get",
            "role",
            &format!("{controller_sa}-leader-election"),
            "-n",
            &ns,
        ],
    );
    let granted: BTreeSet<Access> = granted.union(&granted_by(&[lease_role])).cloned().collect();
    assert!(
        used.is_subset(&granted),
        "used {used:?}, granted {granted:?}"
    );
    let mut uninstall = plane.helm();
    uninstall.args(["uninstall", release, "-n", &ns]);
    checked(uninstall, None);
}
