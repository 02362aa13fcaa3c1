//! `ipkeep-operator check`, modelled on `linkerd check` / `cilium status`: what a user needs to
//! know about an install, one line per check with ✓ or ✗ and, for a ✗, the fix; the exit status is
//! non-zero on any ✗; `--output json` for scripts. Run from anywhere with a kubeconfig (or
//! in-cluster credentials).
//!
//! What is read ([`Observed`], by [`observe`]) is turned into lines by the pure [`lines`]:
//! * the IPReservation CRD and its served version;
//! * the controller's leader (its Lease's holder and when it last renewed) and the last status
//!   the controller wrote on a reservation;
//! * the agent DaemonSet: a Ready agent on every node it should run on;
//! * each node's networks in charge or not, as its agent says on its own pod
//!   (`ipkeep.dev/InCharge`, `agent::incharge`), with the reason and the fix;
//! * reservations in conflict, and reservations not protected (`Unprotected`);
//! * reservation files an agent keeps because their IPReservation was lost
//!   (`ipkeep.dev/ReservationsLost` on its pod, `rules::loss`), with `recover` as the fix;
//! * with `--ipam`, each node's allocation and reservation files cross-checked with the
//!   reservations and the pods: leaks, orphans, conflicts ([`ipam`]).

use std::fmt::Write as _;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use serde::Serialize;

use crate::agent::incharge::report::POD_CONDITION;
use crate::api::lost::{self, LostReport};
use crate::api::{CONDITION_CONFLICT, CONDITION_UNPROTECTED, IPReservation};
use crate::api::{PodKey, key_of};
use crate::controller::reconcile::FIELD_MANAGER as CONTROLLER_MANAGER;

/// The CRD's name.
const CRD_NAME: &str = "ipreservations.ipkeep.dev";
/// The version this binary speaks.
const CRD_VERSION: &str = "v1alpha1";
/// The chart's label on the agent pods.
pub(crate) const AGENT_LABEL: &str = "app.kubernetes.io/component=agent";
/// The chart's name, which its full name contains.
const CHART_NAME: &str = "ipkeep";
/// How often `--wait` looks again.
const WAIT_EVERY: Duration = Duration::from_secs(2);
/// The name of the agents' port that serves `/metrics` and the node view.
const METRICS_PORT: &str = "metrics";
/// How long `--ipam` waits for one agent's node view: a node that does not answer is a line of
/// its own, not a check that hangs.
const NODE_VIEW_TIMEOUT: Duration = Duration::from_secs(20);
/// How many names a line lists before "and N more".
const NAMES_SHOWN: usize = 5;

/// Which installation a command looks at: the flags `check` and `recover` share.
#[derive(Debug, clap::Args)]
pub struct Release {
    /// The release's namespace.
    #[arg(
        long,
        short = 'n',
        env = "POD_NAMESPACE",
        default_value = "ipkeep-system"
    )]
    pub namespace: String,
    /// The Helm release's name: the chart names its objects `<release>-ipkeep-*`, or
    /// `<release>-*` when the name contains "ipkeep" (as the README's `ipkeep` does).
    #[arg(long, default_value = "ipkeep")]
    pub release: String,
    /// The chart's full name, when `fullnameOverride` set it (the controller is
    /// `<fullname>-controller`, the agents `<fullname>-agent`); the chart sets it in the
    /// controller's pod, so `kubectl exec deploy/<fullname>-controller -- /ipkeep-operator check`
    /// (or `recover`) needs no flag.
    #[arg(long, env = "IPKEEP_FULLNAME")]
    pub fullname: Option<String>,
}

/// Command-line flags of `ipkeep-operator check`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Which installation.
    #[command(flatten)]
    pub target: Release,
    /// The controller's leader election Lease, when `controller.leaderElection.leaseName` set
    /// it (default `<fullname>-controller`); set in the controller's pod as `--fullname` is.
    #[arg(long, env = "IPKEEP_LEASE_NAME")]
    pub lease_name: Option<String>,
    /// `text` (one line per check) or `json`.
    #[arg(long, short = 'o', value_enum, default_value = "text")]
    pub output: Output,
    /// Check again every two seconds until every check passes (an agent Ready and in charge on
    /// every node, a leader, ...) or `--timeout` passes; then print the last result.
    #[arg(long)]
    pub wait: bool,
    /// How long `--wait` waits (`90s`, `5m`, `1h`).
    #[arg(long, default_value = "5m", value_parser = timeout_arg, requires = "wait")]
    pub timeout: Duration,
    /// Also cross-check every node's allocation files and reservation files (read from its
    /// agent through the API server's pod proxy: needs `get` on `pods/proxy` in the release's
    /// namespace) with the reservations and the pods: leaks, orphans and conflicts, each with
    /// its fix. What is younger than a minute is not judged.
    #[arg(long)]
    pub ipam: bool,
}

fn timeout_arg(text: &str) -> Result<Duration, String> {
    ipkeep_reservation::RetainFor::parse(text)
        .map(|r| r.duration())
        .map_err(|e| e.to_string())
}

/// The names of an install's objects, as the chart derives them from the release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// The chart's full name: the prefix of the controller's and agents' objects.
    pub fullname: String,
    /// The controller's Lease.
    pub lease: String,
}

impl Names {
    /// The chart's rule (`ipkeep.fullname` in `_helpers.tpl`): the override, else the release
    /// when it contains the chart's name, else `<release>-ipkeep`; the Lease `<fullname>-controller`
    /// unless named.
    pub fn of(release: &str, fullname: Option<&str>, lease: Option<&str>) -> Names {
        let nonempty = |v: Option<&str>| v.filter(|v| !v.is_empty()).map(str::to_owned);
        let fullname = nonempty(fullname).unwrap_or_else(|| {
            let name = if release.contains(CHART_NAME) {
                release.to_owned()
            } else {
                format!("{release}-{CHART_NAME}")
            };
            // Helm's `trunc 63 | trimSuffix "-"`.
            name.chars()
                .take(63)
                .collect::<String>()
                .trim_end_matches('-')
                .to_owned()
        });
        let lease = nonempty(lease).unwrap_or_else(|| format!("{fullname}-controller"));
        Names { fullname, lease }
    }
}

/// How the result is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// One line per check with ✓/✗ and the fix.
    Text,
    /// One JSON document: `{"ok": bool, "checks": [...]}`.
    Json,
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Line {
    /// What was checked (`crd`, `controller`, `agent`, `in-charge`, `reservations`).
    pub check: &'static str,
    /// Passed.
    pub ok: bool,
    /// The node it is about, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// What was found.
    pub message: String,
    /// What to do, for a failed check.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// An agent pod as the checks need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentView {
    /// The pod's name.
    pub pod: String,
    /// Its node.
    pub node: String,
    /// Ready.
    pub ready: bool,
    /// Its `ipkeep.dev/InCharge` condition: (in charge, reason, message).
    pub in_charge: Option<(bool, String, String)>,
    /// Its `ipkeep.dev/ReservationsLost` condition's report, or why it could not be read (`None`:
    /// no such condition, an agent before 0.3 or none lost since it started).
    pub lost: Option<Result<LostReport, String>>,
    /// Its container port named `metrics` (where it serves its node view for `--ipam`).
    pub port: Option<i32>,
}

/// A reservation as the checks need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservationView {
    /// Its namespace/name.
    pub key: PodKey,
    /// Its node.
    pub node: String,
    /// In conflict.
    pub conflict: bool,
    /// `Unprotected` reason, if any.
    pub unprotected: Option<String>,
}

/// What one read of an object found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read<T> {
    /// The object, as the check needs it.
    Found(T),
    /// No such object.
    Absent,
    /// These credentials may not read it (as the controller's, in `kubectl exec`).
    Forbidden,
    /// The read failed: why.
    Failed(String),
}

impl<T> Read<T> {
    fn of<O>(answer: Result<Option<O>, kube::Error>, view: impl FnOnce(O) -> T) -> Self {
        match answer {
            Ok(Some(o)) => Read::Found(view(o)),
            Ok(None) => Read::Absent,
            Err(kube::Error::Api(ae)) if ae.code == 403 => Read::Forbidden,
            Err(e) => Read::Failed(why(&e)),
        }
    }
}

/// Everything read from the cluster; a read that failed is its error's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The CRD's served versions.
    pub crd: Read<Vec<String>>,
    /// The controller Lease: (holder, seconds since renewed, lease seconds), or why not read.
    pub leader: Result<Option<(String, Option<i64>, i64)>, String>,
    /// The agent DaemonSet: (desired, ready).
    pub daemonset: Read<(i32, i32)>,
    /// The agent pods (by the DaemonSet's selector, or by their labels and names when the
    /// DaemonSet is not readable).
    pub agents: Result<Vec<AgentView>, String>,
    /// Every reservation.
    pub reservations: Result<Vec<ReservationView>, String>,
    /// Seconds since the controller last wrote a reservation's status, if it ever did.
    pub last_status_write: Option<i64>,
}

fn listed(list: &[String]) -> String {
    let mut text = list
        .iter()
        .take(NAMES_SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if list.len() > NAMES_SHOWN {
        let _ = write!(text, " and {} more", list.len() - NAMES_SHOWN);
    }
    text
}

/// The checks' lines for what was observed (pure).
pub fn lines(o: &Observed, namespace: &str, names: &Names) -> Vec<Line> {
    let release = names.fullname.as_str();
    let lease = names.lease.as_str();
    let line = |check, ok, node: Option<&str>, message: String, fix: Option<String>| Line {
        check,
        ok,
        node: node.map(str::to_owned),
        message,
        fix: if ok { None } else { fix },
    };
    let mut out = Vec::new();
    out.push(match &o.crd {
        Read::Found(versions) if versions.iter().any(|v| v == CRD_VERSION) => line(
            "crd",
            true,
            None,
            format!("{CRD_NAME} serves {}", versions.join(", ")),
            None,
        ),
        Read::Found(versions) => line(
            "crd",
            false,
            None,
            format!("{CRD_NAME} serves {} but not {CRD_VERSION}", versions.join(", ")),
            Some("restart the controller: it applies its release's CRD at start (the chart grants it get and patch on it); or kubectl apply --server-side --force-conflicts -f crds/".into()),
        ),
        Read::Absent => line(
            "crd",
            false,
            None,
            format!("{CRD_NAME} is not installed"),
            Some("helm install the chart (its crds/ holds the CRD), or kubectl apply -f crds/".into()),
        ),
        // The reservations list through the CRD's version: it is there and serves it.
        Read::Forbidden if o.reservations.is_ok() => line(
            "crd",
            true,
            None,
            format!("{CRD_NAME} serves {CRD_VERSION} (the reservations list through it; these credentials cannot read CRDs)"),
            None,
        ),
        Read::Forbidden => line("crd", false, None, format!("cannot read {CRD_NAME}: forbidden"), Some("run check with credentials that can read CustomResourceDefinitions".into())),
        Read::Failed(e) => line("crd", false, None, format!("cannot read {CRD_NAME}: {e}"), Some("run check again, or with other credentials".into())),
    });
    out.push(match &o.leader {
        Ok(Some((holder, Some(age), duration))) if *age <= 2 * duration => {
            let mut m = format!("leader {holder}, Lease renewed {age}s ago");
            if let Some(w) = o.last_status_write {
                let _ = write!(m, "; last reservation status written {w}s ago");
            }
            line("controller", true, None, m, None)
        }
        Ok(Some((holder, age, _))) => line(
            "controller",
            false,
            None,
            format!(
                "the Lease {lease} names {holder} but was not renewed{}",
                age.map(|a| format!(" for {a}s")).unwrap_or_default()
            ),
            Some(format!("kubectl -n {namespace} get pods -l app.kubernetes.io/component=controller; kubectl -n {namespace} logs deploy/{release}-controller")),
        ),
        Ok(None) => line(
            "controller",
            false,
            None,
            format!("no controller holds the Lease {lease}"),
            Some(format!("kubectl -n {namespace} rollout status deploy/{release}-controller")),
        ),
        Err(e) => line("controller", false, None, format!("cannot read the Lease {lease}: {e}"), None),
    });
    match &o.daemonset {
        Read::Found((desired, ready)) => out.push(line(
            "agent",
            desired == ready && *desired > 0,
            None,
            format!("{ready} of {desired} agents Ready"),
            Some(format!(
                "kubectl -n {namespace} get pods -l app.kubernetes.io/component=agent -o wide"
            )),
        )),
        Read::Absent => out.push(line(
            "agent",
            false,
            None,
            format!("no DaemonSet {release}-agent in {namespace}"),
            Some(
                "check --namespace and --release (or --fullname), or helm install the chart".into(),
            ),
        )),
        Read::Forbidden => {
            let agents = o.agents.as_deref().unwrap_or_default();
            let ready = agents.iter().filter(|a| a.ready).count();
            out.push(line(
                "agent",
                !agents.is_empty() && ready == agents.len(),
                None,
                format!("{ready} of {} agent pods Ready (these credentials cannot read the DaemonSet {release}-agent: a node without an agent is not seen)", agents.len()),
                Some(format!("kubectl -n {namespace} get pods -l app.kubernetes.io/component=agent -o wide")),
            ));
        }
        Read::Failed(e) => out.push(line(
            "agent",
            false,
            None,
            format!("cannot read the DaemonSet {release}-agent: {e}"),
            Some("run check again, or with other credentials".into()),
        )),
    }
    match &o.agents {
        Ok(agents) => {
            for a in agents {
                let node = Some(a.node.as_str());
                if !a.ready {
                    out.push(line(
                        "agent",
                        false,
                        node,
                        format!("agent {} is not Ready", a.pod),
                        Some(format!("kubectl -n {namespace} describe pod {}; kubectl -n {namespace} logs {}", a.pod, a.pod)),
                    ));
                }
                out.push(match &a.in_charge {
                    Some((true, _, message)) => line("in-charge", true, node, message.clone(), None),
                    Some((false, reason, message)) => line(
                        "in-charge",
                        false,
                        node,
                        format!("{reason}: {message}"),
                        Some("the message says what to set; the check clears within seconds of the fix".into()),
                    ),
                    None => line(
                        "in-charge",
                        false,
                        node,
                        format!("agent {} has not said whether ipkeep is in charge (condition {POD_CONDITION})", a.pod),
                        Some("upgrade the chart (agents before 0.2 do not say), or wait for the agent to start".into()),
                    ),
                });
                if let Some(l) = lost_line(a) {
                    out.push(l);
                }
            }
        }
        Err(e) => out.push(line(
            "agent",
            false,
            None,
            format!("cannot list the agent pods: {e}"),
            None,
        )),
    }
    match &o.reservations {
        Ok(all) => {
            let conflicts: Vec<String> = all
                .iter()
                .filter(|r| r.conflict)
                .map(|r| r.key.to_string())
                .collect();
            out.push(line(
                "reservations",
                conflicts.is_empty(),
                None,
                if conflicts.is_empty() {
                    format!("{} reservations, none in conflict", all.len())
                } else {
                    format!("{} in conflict: {}", conflicts.len(), listed(&conflicts))
                },
                Some("kubectl describe ipr <name>: the Conflict condition names the older reservation holding the address; delete the one that should not hold it".into()),
            ));
            let mut unprotected: Vec<(&str, String)> = all
                .iter()
                .filter(|r| r.unprotected.is_some())
                .map(|r| (r.node.as_str(), r.key.to_string()))
                .collect();
            unprotected.sort();
            let mut nodes: Vec<&str> = unprotected.iter().map(|(n, _)| *n).collect();
            nodes.dedup();
            if nodes.is_empty() {
                out.push(line(
                    "reservations",
                    true,
                    None,
                    "none unprotected".into(),
                    None,
                ));
            }
            for node in nodes {
                let here: Vec<String> = unprotected
                    .iter()
                    .filter(|(n, _)| *n == node)
                    .map(|(_, k)| k.clone())
                    .collect();
                out.push(line(
                    "reservations",
                    false,
                    Some(node),
                    format!(
                        "{} not protected (ipkeep is not in charge there): {}",
                        here.len(),
                        listed(&here)
                    ),
                    Some("fix the node's in-charge check above".into()),
                ));
            }
        }
        Err(e) => out.push(line(
            "reservations",
            false,
            None,
            format!("cannot list reservations: {e}"),
            None,
        )),
    }
    out
}

/// The lost reservations an agent keeps, as a ✗ line (none when it keeps none).
fn lost_line(a: &AgentView) -> Option<Line> {
    let fix = "ipkeep-operator recover (a dry run: what it would re-create), then ipkeep-operator recover --apply; to free the addresses instead, kubectl delete ipr the recovered reservations (see docs/operator.md, Backup and restore)";
    let message = match a.lost.as_ref()? {
        Ok(report) if report.total() == 0 => return None,
        Ok(report) => {
            let ips = |list: &[std::net::IpAddr]| {
                list.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let names: Vec<String> = report
                .lost
                .iter()
                .map(|l| format!("{} ({})", l.pod, ips(&l.ips)))
                .chain(report.restored.iter().map(|r| {
                    let kind = match r.kind {
                        lost::RestoredKind::Older => "restored older than the node's file",
                        lost::RestoredKind::Released => "restored after the node released it",
                    };
                    format!("{} ({}; {kind})", r.pod, ips(&r.ips))
                }))
                .collect();
            let mut shown = listed(&names);
            if report.omitted > 0 {
                let _ = write!(shown, " (+{} not listed by the agent)", report.omitted);
            }
            format!(
                "{} reservations lost or restored from an older copy (a file kept whose IPReservation is gone before its release time by nobody's decision, or an object older than the node's file; their addresses stay protected): {shown}",
                report.total()
            )
        }
        Err(e) => format!(
            "agent {} reports lost reservations that cannot be read ({}): {e}",
            a.pod,
            lost::POD_CONDITION
        ),
    };
    Some(Line {
        check: "lost",
        ok: false,
        node: Some(a.node.clone()),
        message,
        fix: Some(fix.into()),
    })
}

/// The result as text: one line per check, the fix indented below a ✗.
pub fn text(lines: &[Line]) -> String {
    let mut out = String::new();
    for l in lines {
        let mark = if l.ok { '✓' } else { '✗' };
        let node = l
            .node
            .as_deref()
            .map(|n| format!(" [{n}]"))
            .unwrap_or_default();
        let _ = writeln!(out, "{mark} {}{node}: {}", l.check, l.message);
        if let Some(fix) = &l.fix {
            let _ = writeln!(out, "    fix: {fix}");
        }
    }
    let failed = lines.iter().filter(|l| !l.ok).count();
    let _ = writeln!(
        out,
        "{}",
        if failed == 0 {
            "all checks passed".to_owned()
        } else {
            format!("{failed} of {} checks failed", lines.len())
        }
    );
    out
}

/// The result as JSON.
pub fn json(lines: &[Line]) -> String {
    serde_json::json!({
        "ok": lines.iter().all(|l| l.ok),
        "checks": lines,
    })
    .to_string()
}

fn why(e: &kube::Error) -> String {
    crate::runtime::logging::error_chain(e)
}

/// Reads what the checks need from the cluster.
pub async fn observe(
    client: Client,
    namespace: &str,
    names: &Names,
    now: jiff::Timestamp,
) -> Observed {
    let release = names.fullname.as_str();
    let since = |t: jiff::Timestamp| (now - t).total(jiff::Unit::Second).map(|s| s as i64).ok();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = Read::of(crds.get_opt(CRD_NAME).await, |c| {
        c.spec
            .versions
            .iter()
            .filter(|v| v.served)
            .map(|v| v.name.clone())
            .collect()
    });
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let leader = leases
        .get_opt(&names.lease)
        .await
        .map(|l| {
            let spec = l?.spec?;
            let holder = spec.holder_identity.filter(|h| !h.is_empty())?;
            let age = spec.renew_time.and_then(|t| since(t.0));
            Some((
                holder,
                age,
                i64::from(spec.lease_duration_seconds.unwrap_or(15)),
            ))
        })
        .map_err(|e| why(&e));
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    let ds = daemonsets.get_opt(&format!("{release}-agent")).await;
    let selector = match &ds {
        Ok(d) => d
            .as_ref()
            .and_then(|d| d.spec.as_ref()?.selector.match_labels.as_ref())
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            }),
        // Without the DaemonSet: the chart's component label, and the pods' names below.
        Err(_) => Some(AGENT_LABEL.to_owned()),
    };
    let daemonset = Read::of(ds, |d| {
        let s = d.status.unwrap_or_default();
        (s.desired_number_scheduled, s.number_ready)
    });
    let prefix = format!("{release}-agent-");
    let agents = match selector {
        None => Ok(Vec::new()),
        Some(sel) => {
            let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
            pods.list(&ListParams::default().labels(&sel))
                .await
                .map(|l| {
                    let mut agents: Vec<AgentView> = l
                        .items
                        .iter()
                        .filter(|p| p.name_any().starts_with(&prefix))
                        .filter_map(agent_view)
                        .collect();
                    agents.sort_by(|a, b| a.node.cmp(&b.node));
                    agents
                })
                .map_err(|e| why(&e))
        }
    };
    let iprs: Api<IPReservation> = Api::all(client);
    let listed = iprs.list(&ListParams::default()).await;
    let last_status_write = listed.as_ref().ok().and_then(|l| {
        l.items
            .iter()
            .flat_map(|r| r.metadata.managed_fields.iter().flatten())
            .filter(|m| {
                m.manager.as_deref() == Some(CONTROLLER_MANAGER)
                    && m.subresource.as_deref() == Some("status")
            })
            .filter_map(|m| m.time.as_ref().map(|t| t.0))
            .max()
            .and_then(since)
    });
    let reservations = listed
        .map(|l| l.items.iter().filter_map(reservation_view).collect())
        .map_err(|e| why(&e));
    Observed {
        crd,
        leader,
        daemonset,
        agents,
        reservations,
        last_status_write,
    }
}

/// An agent pod as the checks (and `recover`) need it.
pub(crate) fn agent_view(p: &Pod) -> Option<AgentView> {
    let status = p.status.as_ref()?;
    let conditions = status.conditions.as_deref().unwrap_or_default();
    let ready = conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let in_charge = conditions
        .iter()
        .find(|c| c.type_ == POD_CONDITION)
        .map(|c| {
            (
                c.status == "True",
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        });
    let lost = conditions
        .iter()
        .find(|c| c.type_ == lost::POD_CONDITION)
        .map(|c| {
            serde_json::from_str::<LostReport>(c.message.as_deref().unwrap_or_default())
                .map_err(|e| e.to_string())
        });
    let spec = p.spec.as_ref()?;
    let port = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .find(|port| port.name.as_deref() == Some(METRICS_PORT))
        .map(|port| port.container_port);
    Some(AgentView {
        pod: p.name_any(),
        node: spec.node_name.clone()?,
        ready,
        in_charge,
        lost,
        port,
    })
}

/// `None` for a reservation whose names are not valid ones (never from a real API server).
fn reservation_view(r: &IPReservation) -> Option<ReservationView> {
    let condition = |type_: &str| {
        r.status
            .as_ref()
            .and_then(|s| {
                s.conditions
                    .iter()
                    .find(|c| c.type_ == type_ && c.status == "True")
            })
            .map(|c| c.reason.clone())
    };
    Some(ReservationView {
        key: key_of(r).ok()?,
        node: r.spec.node_name.clone(),
        conflict: condition(CONDITION_CONFLICT).is_some(),
        unprotected: condition(CONDITION_UNPROTECTED),
    })
}

/// Runs the checks and prints the result; `Ok(false)` when any failed. With `--wait`, runs
/// them again until all pass or the timeout, saying on stderr what it still waits for.
pub fn main(args: Args) -> anyhow::Result<bool> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let names = Names::of(
        &args.target.release,
        args.target.fullname.as_deref(),
        args.lease_name.as_deref(),
    );
    runtime.block_on(async move {
        let client = Client::try_default().await?;
        let deadline = tokio::time::Instant::now() + args.timeout;
        let mut waiting_for = String::new();
        let lines = loop {
            let observed = tokio::time::timeout(
                Duration::from_secs(30),
                observe(
                    client.clone(),
                    &args.target.namespace,
                    &names,
                    jiff::Timestamp::now(),
                ),
            )
            .await?;
            let mut lines = lines(&observed, &args.target.namespace, &names);
            if args.ipam {
                let agents = observed.agents.as_deref().unwrap_or_default();
                let now = jiff::Timestamp::now();
                lines.extend(match ipam_observe(&client, &args.target.namespace, agents).await {
                    Ok(o) => ipam::lines(
                        &o,
                        &args.target.namespace,
                        ipkeep_reservation::Timestamp::from_unix_secs(now.as_second()),
                        ipam::GRACE,
                    ),
                    Err(e) => vec![Line {
                        check: "ipam",
                        ok: false,
                        node: None,
                        message: format!("cannot cross-check the nodes' files: {e}"),
                        fix: Some("run check again, or with credentials that can list pods and IPReservations in every namespace".into()),
                    }],
                });
            }
            if !args.wait || lines.iter().all(|l| l.ok) || tokio::time::Instant::now() >= deadline {
                break lines;
            }
            let failed = failed_summary(&lines);
            if failed != waiting_for {
                eprintln!("waiting for: {failed}");
                waiting_for = failed;
            }
            tokio::time::sleep(WAIT_EVERY).await;
        };
        match args.output {
            Output::Text => print!("{}", text(&lines)),
            Output::Json => println!("{}", json(&lines)),
        }
        Ok(lines.iter().all(|l| l.ok))
    })
}

/// Reads what `--ipam` cross-checks: the reservations, each agent's node view (through the API
/// server's pod proxy, every agent at once), the reservations again, and the live pods.
async fn ipam_observe(
    client: &Client,
    namespace: &str,
    agents: &[AgentView],
) -> Result<ipam::IpamObserved, String> {
    let iprs: Api<IPReservation> = Api::all(client.clone());
    let list = || async {
        iprs.list(&ListParams::default())
            .await
            .map(|l| crate::agent::view::reservations(&l.items))
            .map_err(|e| format!("failed to list IPReservations: {}", why(&e)))
    };
    let before = list().await?;
    let nodes =
        futures::future::join_all(agents.iter().map(|a| node_report(client, namespace, a))).await;
    let after = list().await?;
    let pods: Api<Pod> = Api::all(client.clone());
    let pods = pods
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("failed to list pods: {}", why(&e)))?
        .items
        .iter()
        .filter_map(live_pod)
        .collect();
    Ok(ipam::IpamObserved {
        nodes,
        before,
        after,
        pods,
    })
}

/// One agent's node view, read through the API server's pod proxy.
async fn node_report(client: &Client, namespace: &str, a: &AgentView) -> ipam::NodeReport {
    let (lost, lost_unlisted, restored) = match &a.lost {
        None => (Default::default(), false, Default::default()),
        Some(Ok(report)) => (
            report.lost.iter().map(|l| l.pod.clone()).collect(),
            report.omitted > 0,
            report.restored.iter().map(|r| r.pod.clone()).collect(),
        ),
        Some(Err(_)) => (Default::default(), true, Default::default()),
    };
    let view = match a.port {
        None => Err(format!("its pod has no port named {METRICS_PORT}")),
        Some(port) => {
            let path = format!(
                "/api/v1/namespaces/{namespace}/pods/{}:{port}/proxy{}",
                a.pod,
                crate::agent::ipam::PATH
            );
            match hyper::Request::get(path).body(Vec::new()) {
                Err(e) => Err(e.to_string()),
                Ok(request) => {
                    match tokio::time::timeout(NODE_VIEW_TIMEOUT, client.request_text(request))
                        .await
                    {
                        Err(_) => Err(format!("no answer within {}s", NODE_VIEW_TIMEOUT.as_secs())),
                        Ok(Err(e)) => Err(why(&e)),
                        Ok(Ok(text)) => serde_json::from_str::<crate::agent::ipam::NodeView>(&text)
                            .map_err(|e| format!("its answer is not a node view ({e})")),
                    }
                }
            }
        }
    };
    ipam::NodeReport {
        node: a.node.clone(),
        agent: a.pod.clone(),
        view,
        lost,
        lost_unlisted,
        restored,
    }
}

/// A pod that holds its addresses: scheduled, not finished, on the pod network.
fn live_pod(p: &Pod) -> Option<ipam::LivePod> {
    let spec = p.spec.as_ref()?;
    if spec.host_network == Some(true) {
        return None;
    }
    let status = p.status.as_ref()?;
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    Some(ipam::LivePod {
        key: key_of_pod(p)?,
        node: spec.node_name.clone()?,
        ips: status
            .pod_ips
            .iter()
            .flatten()
            .filter_map(|ip| ip.ip.parse::<std::net::IpAddr>().ok())
            .map(|ip| ip.to_canonical())
            .collect(),
    })
}

fn key_of_pod(p: &Pod) -> Option<PodKey> {
    PodKey::new(
        p.metadata.namespace.as_deref()?,
        p.metadata.name.as_deref()?,
    )
    .ok()
}

/// The failed checks in one line: `in-charge [node-1], agent`.
fn failed_summary(lines: &[Line]) -> String {
    lines
        .iter()
        .filter(|l| !l.ok)
        .map(|l| match &l.node {
            Some(n) => format!("{} [{n}]", l.check),
            None => l.check.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

pub mod ipam;
#[cfg(test)]
mod tests;
