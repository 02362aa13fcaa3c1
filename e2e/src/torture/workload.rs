//! The torture run's workload: the manifests it starts with and what each [`Op`] does to them.
//! An operation that fails (the API is down, the pod is not there yet) is counted and the run
//! goes on: under faults, failing is what requests do.

use std::net::Ipv4Addr;

use crate::{
    cluster::{
        ControlPlane,
        realnode::{TINY_TAINT, layout::WORKLOAD_IMAGE},
    },
    testkit::{commands::kubectl, system::statefulset},
};

use super::schedule::{HAND, Op, SETS};

/// The namespace of the retained workload and the churn (selected by the controller).
pub const NS: &str = "torture";
/// The namespace outside the controller's namespace selector.
pub const OUTSIDE_NS: &str = "torture-outside";
/// The label that keeps a namespace out of the controller's selector.
pub const OUTSIDE_LABEL: &str = "ipkeep-torture/outside";
/// The controller's namespace selector the run installs the chart with.
pub const SELECTOR: &str = "ipkeep-torture/outside!=true";
/// How long the addresses of the pods made by hand stay reserved after they are gone.
pub const RETAIN_FOR: &str = "90s";

/// What the workload runs on: the cluster's node names (the first ordinary, the last tiny).
#[derive(Debug, Clone)]
pub struct Nodes {
    /// Every node, by index.
    pub names: Vec<String>,
    /// The tiny node's name.
    pub tiny: String,
    /// The first node's pod CIDR (IPv4), where reservations made by hand take addresses.
    pub first_cidr: (Ipv4Addr, u8),
}

impl Nodes {
    /// Every node but the tiny one.
    pub fn ordinary(&self) -> Vec<&str> {
        self.names
            .iter()
            .filter(|n| **n != self.tiny)
            .map(String::as_str)
            .collect()
    }
}

/// The manifests of the workload at the start.
pub fn manifests(nodes: &Nodes) -> Vec<(String, String)> {
    let ordinary = nodes.ordinary();
    let mut out = vec![(
        String::new(),
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: {OUTSIDE_NS}\n  labels:\n    {OUTSIDE_LABEL}: \"true\"\n"
        ),
    )];
    for set in SETS {
        let placed: Vec<&str> = if set.tiny {
            vec![nodes.tiny.as_str()]
        } else {
            ordinary.clone()
        };
        let yaml = statefulset(
            set.name,
            set.replicas,
            true,
            &placed,
            &[
                ("ipkeep.dev/retain", "true"),
                ("ipkeep.dev/retain-for", set.retain_for),
                ("ipkeep.dev/placement", set.placement),
            ],
        );
        out.push((NS.to_owned(), tolerating(&yaml)));
    }
    out.push((
        OUTSIDE_NS.to_owned(),
        statefulset(
            "outside",
            2,
            true,
            &ordinary,
            &[("ipkeep.dev/retain", "true")],
        ),
    ));
    out.push((NS.to_owned(), deployment("churn", 2, &ordinary)));
    out.push((
        NS.to_owned(),
        tolerating(&deployment(
            "churn-tiny",
            super::schedule::TINY_CHURN,
            &[nodes.tiny.as_str()],
        )),
    ));
    out
}

/// An unannotated Deployment of `replicas` pods on `nodes`.
fn deployment(name: &str, replicas: u32, nodes: &[&str]) -> String {
    let affinity = on_nodes(nodes);
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
spec:
  replicas: {replicas}
  selector:
    matchLabels: {{app: {name}}}
  template:
    metadata:
      labels: {{app: {name}}}
    spec:
      terminationGracePeriodSeconds: 1
{affinity}      containers:
      - name: app
        image: {WORKLOAD_IMAGE}
        imagePullPolicy: Never
        command: [httpd, -f, -p, "8080", -h, /www]
"#
    )
}

/// `yaml`'s pod template with a toleration of the tiny node's taint (any pod of the run may
/// land there when its affinity allows).
fn tolerating(yaml: &str) -> String {
    let anchor = "      terminationGracePeriodSeconds: 1\n";
    yaml.replacen(
        anchor,
        &format!(
            "{anchor}      tolerations:\n      - {{key: {TINY_TAINT}, operator: Exists, effect: NoSchedule}}\n"
        ),
        1,
    )
}

/// A pod template's node affinity for `nodes` (indented as a pod spec's field).
fn on_nodes(nodes: &[&str]) -> String {
    format!(
        "      affinity:\n        nodeAffinity:\n          requiredDuringSchedulingIgnoredDuringExecution:\n            nodeSelectorTerms:\n            - matchExpressions:\n              - {{key: kubernetes.io/hostname, operator: In, values: [{}]}}\n",
        nodes.join(", ")
    )
}

/// A one-pod unannotated Job.
fn job(n: u32, nodes: &[&str]) -> String {
    let affinity = on_nodes(nodes);
    format!(
        r#"apiVersion: batch/v1
kind: Job
metadata:
  name: job-{n}
spec:
  ttlSecondsAfterFinished: 20
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      terminationGracePeriodSeconds: 1
{affinity}      containers:
      - name: job
        image: {WORKLOAD_IMAGE}
        imagePullPolicy: Never
        command: [sleep, "3"]
"#
    )
}

/// The reservation `hand-N`, made by hand for a pod not yet there: an address high in the first
/// node's range (the churn takes the low ones first).
fn hand_reservation(n: u32, nodes: &Nodes) -> String {
    let (base, prefix) = nodes.first_cidr;
    let size = 1u32 << (32 - u32::from(prefix));
    let ip = Ipv4Addr::from(u32::from(base) + size - 10 - n);
    format!(
        "apiVersion: ipkeep.dev/v1alpha1\nkind: IPReservation\nmetadata:\n  name: hand-{n}\nspec:\n  ips: [\"{ip}\"]\n  nodeName: {}\n  retainFor: {RETAIN_FOR}\n",
        nodes.names[0]
    )
}

/// The annotated pod `hand-N` on the first node.
fn hand_pod(n: u32, nodes: &Nodes) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: hand-{n}
  annotations: {{"ipkeep.dev/retain": "true", "ipkeep.dev/retain-for": "{RETAIN_FOR}"}}
spec:
  nodeSelector:
    kubernetes.io/hostname: {}
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {WORKLOAD_IMAGE}
    imagePullPolicy: Never
    command: [httpd, -f, -p, "8080", -h, /www]
"#,
        nodes.names[0]
    )
}

/// Does `op`; `Err` says why it failed.
pub fn apply(plane: &ControlPlane, nodes: &Nodes, op: &Op) -> Result<(), String> {
    let ns = ["-n", NS];
    let run = |args: &[&str], stdin: Option<&str>| -> Result<(), String> {
        let out = kubectl(plane, args, stdin);
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
        }
    };
    match op {
        Op::DeletePod {
            set,
            ordinal,
            force,
        } => {
            let pod = format!("{set}-{ordinal}");
            let mut args = vec![ns[0], ns[1], "delete", "pod", pod.as_str(), "--wait=false"];
            if *force {
                args.extend(["--force", "--grace-period=0"]);
            }
            run(&args, None)
        }
        Op::Scale { set, replicas } => run(
            &[
                ns[0],
                ns[1],
                "scale",
                &format!("statefulset/{set}"),
                &format!("--replicas={replicas}"),
            ],
            None,
        ),
        Op::Churn {
            deployment,
            replicas,
        } => run(
            &[
                ns[0],
                ns[1],
                "scale",
                &format!("deployment/{deployment}"),
                &format!("--replicas={replicas}"),
            ],
            None,
        ),
        Op::DeleteTinyChurn { pick } => {
            let listed = kubectl(
                plane,
                &[
                    ns[0],
                    ns[1],
                    "get",
                    "pods",
                    "-l",
                    "app=churn-tiny",
                    "-o",
                    "name",
                ],
                None,
            );
            if !listed.status.success() {
                return Err(String::from_utf8_lossy(&listed.stderr).trim().to_owned());
            }
            let text = String::from_utf8_lossy(&listed.stdout).into_owned();
            let mut pods: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
            pods.sort_unstable();
            let Some(pod) = pods.get(*pick as usize % pods.len().max(1)) else {
                return Err("no churn-tiny pod to delete".to_owned());
            };
            run(&[ns[0], ns[1], "delete", pod, "--wait=false"], None)
        }
        Op::Job { n } => {
            let ordinary = nodes.ordinary();
            run(
                &[ns[0], ns[1], "apply", "-f", "-"],
                Some(&job(*n, &ordinary)),
            )
        }
        Op::DeleteOutside { ordinal } => run(
            &[
                "-n",
                OUTSIDE_NS,
                "delete",
                "pod",
                &format!("outside-{ordinal}"),
                "--wait=false",
            ],
            None,
        ),
        Op::Reserve { n } => run(
            &[ns[0], ns[1], "apply", "-f", "-"],
            Some(&hand_reservation(*n % HAND, nodes)),
        ),
        Op::HandPod { n } => {
            let name = format!("hand-{n}");
            let there = kubectl(plane, &[ns[0], ns[1], "get", "pod", &name], None);
            if there.status.success() {
                run(
                    &[ns[0], ns[1], "delete", "pod", &name, "--wait=false"],
                    None,
                )
            } else {
                run(
                    &[ns[0], ns[1], "create", "-f", "-"],
                    Some(&hand_pod(*n, nodes)),
                )
            }
        }
    }
}

/// The kind of `op`, for the report.
pub fn kind(op: &Op) -> &'static str {
    match op {
        Op::DeletePod { force: false, .. } => "delete retained pod",
        Op::DeletePod { force: true, .. } => "force-delete retained pod",
        Op::Scale { replicas: 0, .. } => "scale retained set to 0",
        Op::Scale { .. } => "scale retained set",
        Op::Churn { .. } => "scale unannotated deployment",
        Op::DeleteTinyChurn { .. } => "delete unannotated pod on the tiny node",
        Op::Job { .. } => "run unannotated job",
        Op::DeleteOutside { .. } => "delete pod outside the selector",
        Op::Reserve { .. } => "reserve by hand",
        Op::HandPod { .. } => "create/delete pod of a hand reservation",
    }
}
