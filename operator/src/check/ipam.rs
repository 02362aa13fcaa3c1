//! `ipkeep-operator check --ipam` (as `calicoctl ipam check`): node by node, the allocation
//! files, the reservation files (both as the node's agent serves them, [`crate::agent::ipam`]),
//! the IPReservations and the pods, cross-checked by the pure [`cross_check`] into
//! [`Finding`]s, each a ✗ line with its fix ([`Finding::line`]). Lost reservations are the
//! agents' own report, which plain `check` already prints.
//!
//! What is younger than [`GRACE`] is not judged: a sandbox's address reaches the pod's status a
//! moment after its allocation file is written, an agent writes a new reservation's file a
//! moment after the API has it. The reservations are listed before the agents are read and
//! again after: a file counts as having its IPReservation when either list has it, and an
//! IPReservation as having no file only when both lists have it, so a reservation created or
//! deleted while `check` reads is never a finding.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipkeep_reservation::{PodKey, Timestamp};

use super::Line;
use crate::agent::ipam::{NetworkView, NodeView, ReservedFile};
use crate::rules::desired::{Refusal, Reservation, desired_files};

/// How old an allocation, a reservation file or an IPReservation must be to be judged.
pub const GRACE: Duration = Duration::from_secs(60);

/// A pod that holds its addresses: scheduled, not finished, not on the host's network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LivePod {
    /// Its namespace/name.
    pub key: PodKey,
    /// Its node.
    pub node: String,
    /// `status.podIPs`.
    pub ips: Vec<IpAddr>,
}

/// One node as its agent reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeReport {
    /// The node.
    pub node: String,
    /// Its agent pod.
    pub agent: String,
    /// What the agent serves, or why it could not be read.
    pub view: Result<NodeView, String>,
    /// The reservations the agent reports lost (its pod's condition).
    pub lost: BTreeSet<PodKey>,
    /// The agent keeps lost reservations it does not list (or its report cannot be read): a file
    /// without IPReservation may be one of them, and is not called an orphan.
    pub lost_unlisted: bool,
    /// The reservations a restore brought back that the agent reports (older than its file, or
    /// released by the node: no file on purpose): `check`'s lost line says them, not an orphan.
    pub restored: BTreeSet<PodKey>,
}

/// Everything the cross-check reads.
#[derive(Debug, Clone, PartialEq)]
pub struct IpamObserved {
    /// Every node with an agent.
    pub nodes: Vec<NodeReport>,
    /// The IPReservations listed before the agents were read.
    pub before: Vec<Result<Reservation, Refusal>>,
    /// The IPReservations listed after.
    pub after: Vec<Result<Reservation, Refusal>>,
    /// The live pods.
    pub pods: Vec<LivePod>,
}

/// Who holds an address.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Holder {
    /// A reservation file on the node.
    File(PodKey),
    /// A live pod on the node (its `status.podIPs`).
    Pod(PodKey),
    /// An IPReservation of the node that has no file there.
    Reservation(PodKey),
}

impl Holder {
    fn pod(&self) -> &PodKey {
        match self {
            Holder::File(p) | Holder::Pod(p) | Holder::Reservation(p) => p,
        }
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holder::File(p) => write!(f, "the reservation file of {p}"),
            Holder::Pod(p) => write!(f, "the live pod {p}"),
            Holder::Reservation(p) => write!(f, "the IPReservation {p} (no file)"),
        }
    }
}

/// What the cross-check found wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// An allocation no live pod and no reservation holds: its address is lost to the node
    /// until the file goes.
    Leak {
        /// The node.
        node: String,
        /// The network.
        network: String,
        /// The address.
        ip: IpAddr,
        /// The container the file names (`None`: content no container can match).
        container_id: Option<String>,
        /// The pod ipkeep's index records for it, if any (gone).
        pod: Option<PodKey>,
        /// The file on the node.
        path: PathBuf,
    },
    /// A reservation file no IPReservation of its node has, and the agent does not report lost.
    OrphanFile {
        /// The node.
        node: String,
        /// The network.
        network: String,
        /// Whose file.
        pod: PodKey,
        /// The addresses it holds.
        ips: Vec<IpAddr>,
        /// The node its IPReservation names instead, if it has one.
        elsewhere: Option<String>,
        /// The file on the node.
        path: PathBuf,
    },
    /// An IPReservation of the node with no file there, neither refused nor in conflict: its
    /// addresses are not protected on that network.
    OrphanReservation {
        /// The node.
        node: String,
        /// The network.
        network: String,
        /// Whose reservation.
        pod: PodKey,
        /// Its addresses.
        ips: Vec<String>,
        /// The node's agent pod.
        agent: String,
    },
    /// An address two pods hold.
    Conflict {
        /// The node.
        node: String,
        /// The network.
        network: String,
        /// The address.
        ip: IpAddr,
        /// Who holds it (two pods at least), sorted.
        holders: Vec<Holder>,
    },
}

impl ReservedFile {
    /// Whether the file holds its addresses at `now` (`ReservationFile::is_active`'s rule, on
    /// the view the agent serves): bound, or released but not yet expired.
    fn holds_at(&self, now: Timestamp) -> bool {
        self.release_time.is_none_or(|release| now < release)
    }
}

fn older_than(t: Timestamp, now: Timestamp, grace: Duration) -> bool {
    now.saturating_duration_since(t) >= grace
}

fn timestamp_of(t: jiff::Timestamp) -> Timestamp {
    Timestamp::from_unix_secs(t.as_second())
}

fn reserved_path(data_dir: &std::path::Path, network: &str, pod: &PodKey) -> PathBuf {
    data_dir
        .join(network)
        .join(ipkeep_reservation::add::RESERVED_DIR)
        .join(pod.namespace())
        .join(pod.name())
}

/// The cross-check (pure): every leak, orphan and conflict on every node whose view was read.
pub fn cross_check(o: &IpamObserved, now: Timestamp, grace: Duration) -> Vec<Finding> {
    let valid = |list: &[Result<Reservation, Refusal>]| -> Vec<Reservation> {
        list.iter()
            .filter_map(|r| r.as_ref().ok().cloned())
            .collect()
    };
    let (before, after) = (valid(&o.before), valid(&o.after));
    let mut findings = Vec::new();
    for report in &o.nodes {
        let Ok(view) = &report.view else { continue };
        let node = report.node.as_str();
        let pods: Vec<&LivePod> = o.pods.iter().filter(|p| p.node == node).collect();
        let live: BTreeSet<&PodKey> = pods.iter().map(|p| &p.key).collect();
        let here = |r: &&Reservation| r.node_name == node;
        // A file has its IPReservation if either list has one of this node.
        let named_here: BTreeSet<&PodKey> = before
            .iter()
            .chain(&after)
            .filter(here)
            .map(|r| &r.key)
            .collect();
        // An IPReservation is judged only when both lists have it (same uid) and it is old.
        let steady: Vec<Result<Reservation, Refusal>> = after
            .iter()
            .filter(here)
            .filter(|r| before.iter().any(|b| b.key == r.key && b.uid == r.uid))
            .filter(|r| {
                r.created
                    .is_some_and(|c| older_than(timestamp_of(c), now, grace))
            })
            .map(|r| Ok(r.clone()))
            .collect();
        // The files the agent must have (not those in conflict or refused); the retention only
        // sets release times, which this does not compare.
        let desired = desired_files(node, &steady, Duration::ZERO);
        for network in &view.networks {
            if network.error.is_some() {
                continue;
            }
            let ctx = NetworkContext {
                node,
                view,
                network,
                now,
                grace,
            };
            findings.extend(ctx.leaks(&pods, &live, &before, &after));
            findings.extend(ctx.orphan_files(report, &named_here, &before, &after));
            let conflicts = ctx.conflicts(&pods, &desired.files, &steady);
            let contested: BTreeSet<PodKey> = conflicts
                .iter()
                .flat_map(|c| match c {
                    Finding::Conflict { holders, .. } => {
                        holders.iter().map(|h| h.pod().clone()).collect()
                    }
                    _ => Vec::new(),
                })
                .collect();
            findings.extend(conflicts);
            for (key, file) in &desired.files {
                let has = network.reservations.iter().any(|f| &f.pod == key);
                if has || contested.contains(key) || report.restored.contains(key) {
                    continue;
                }
                findings.push(Finding::OrphanReservation {
                    node: node.to_owned(),
                    network: network.network.clone(),
                    pod: key.clone(),
                    ips: file.ips.iter().map(ToString::to_string).collect(),
                    agent: report.agent.clone(),
                });
            }
        }
    }
    findings
}

/// One network of one node, as the cross-check reads it.
struct NetworkContext<'a> {
    node: &'a str,
    view: &'a NodeView,
    network: &'a NetworkView,
    now: Timestamp,
    grace: Duration,
}

impl NetworkContext<'_> {
    /// The files holding their addresses now.
    fn holding(&self) -> impl Iterator<Item = &ReservedFile> {
        self.network
            .reservations
            .iter()
            .filter(|f| f.holds_at(self.now))
    }

    fn leaks(
        &self,
        pods: &[&LivePod],
        live: &BTreeSet<&PodKey>,
        before: &[Reservation],
        after: &[Reservation],
    ) -> Vec<Finding> {
        let reserved: BTreeSet<IpAddr> = self
            .holding()
            .flat_map(|f| f.ips.iter().copied())
            .chain(
                before
                    .iter()
                    .chain(after)
                    .filter(|r| r.node_name == self.node)
                    .flat_map(|r| r.ips.iter().filter_map(|ip| ip.parse::<IpAddr>().ok())),
            )
            .collect();
        self.network
            .allocations
            .iter()
            .filter(|a| older_than(a.modified, self.now, self.grace))
            .filter(|a| !pods.iter().any(|p| p.ips.contains(&a.ip)))
            // An address of a second network is in no pod's status: the pod its ADD recorded.
            .filter(|a| !a.pod.as_ref().is_some_and(|p| live.contains(p)))
            .filter(|a| !reserved.contains(&a.ip))
            .map(|a| Finding::Leak {
                node: self.node.to_owned(),
                network: self.network.network.clone(),
                ip: a.ip,
                container_id: a.container_id.clone(),
                pod: a.pod.clone(),
                path: self
                    .view
                    .data_dir
                    .join(&self.network.network)
                    .join(a.ip.to_string()),
            })
            .collect()
    }

    fn orphan_files(
        &self,
        report: &NodeReport,
        named_here: &BTreeSet<&PodKey>,
        before: &[Reservation],
        after: &[Reservation],
    ) -> Vec<Finding> {
        self.holding()
            .filter(|f| {
                f.modified
                    .is_none_or(|m| older_than(m, self.now, self.grace))
            })
            .filter(|f| !named_here.contains(&f.pod))
            .filter(|f| !report.lost_unlisted && !report.lost.contains(&f.pod))
            .map(|f| Finding::OrphanFile {
                node: self.node.to_owned(),
                network: self.network.network.clone(),
                pod: f.pod.clone(),
                ips: f.ips.clone(),
                elsewhere: after
                    .iter()
                    .chain(before)
                    .find(|r| r.key == f.pod)
                    .map(|r| r.node_name.clone()),
                path: reserved_path(&self.view.data_dir, &self.network.network, &f.pod),
            })
            .collect()
    }

    fn conflicts(
        &self,
        pods: &[&LivePod],
        desired: &BTreeMap<PodKey, ipkeep_reservation::ValidReservation>,
        steady: &[Result<Reservation, Refusal>],
    ) -> Vec<Finding> {
        let mut by_ip: BTreeMap<IpAddr, BTreeSet<Holder>> = BTreeMap::new();
        for f in self.holding() {
            for ip in &f.ips {
                by_ip
                    .entry(*ip)
                    .or_default()
                    .insert(Holder::File(f.pod.clone()));
            }
        }
        for p in pods {
            for ip in &p.ips {
                by_ip
                    .entry(*ip)
                    .or_default()
                    .insert(Holder::Pod(p.key.clone()));
            }
        }
        // A reservation the agent must write but has not (it refuses one whose address a kept
        // file holds): it claims the address too.
        let has_file = |key: &PodKey| self.network.reservations.iter().any(|f| &f.pod == key);
        for r in steady.iter().flatten() {
            if !desired.contains_key(&r.key) || has_file(&r.key) {
                continue;
            }
            for ip in r.ips.iter().filter_map(|ip| ip.parse::<IpAddr>().ok()) {
                by_ip
                    .entry(ip.to_canonical())
                    .or_default()
                    .insert(Holder::Reservation(r.key.clone()));
            }
        }
        by_ip
            .into_iter()
            .filter(|(_, holders)| {
                let pods: BTreeSet<&PodKey> = holders.iter().map(Holder::pod).collect();
                pods.len() > 1
            })
            .map(|(ip, holders)| Finding::Conflict {
                node: self.node.to_owned(),
                network: self.network.network.clone(),
                ip,
                holders: holders.into_iter().collect(),
            })
            .collect()
    }
}

impl Finding {
    /// The ✗ line that says it, with its fix; `namespace` is the release's.
    pub fn line(&self, namespace: &str) -> Line {
        let (check, node, message, fix) = match self {
            Finding::Leak {
                node,
                network,
                ip,
                container_id,
                pod,
                path,
            } => {
                let owner = match (container_id, pod) {
                    (Some(id), Some(pod)) => format!("container {id} (pod {pod})"),
                    (Some(id), None) => format!("container {id}"),
                    (None, _) => "no container (its content is not host-local's)".to_owned(),
                };
                (
                    "leak",
                    node,
                    format!(
                        "{ip} on network {network} is allocated to {owner}, but no live pod on the node has it and no reservation holds it: no pod can get it until the file goes"
                    ),
                    match container_id {
                        Some(id) => format!(
                            "on the node, make sure the sandbox is gone (crictl pods --id {id} shows none), then rm {}",
                            path.display()
                        ),
                        None => format!("on the node, rm {}", path.display()),
                    },
                )
            }
            Finding::OrphanFile {
                node,
                network,
                pod,
                ips,
                elsewhere,
                path,
            } => {
                let ips: Vec<String> = ips.iter().map(ToString::to_string).collect();
                let why = match elsewhere {
                    Some(other) => format!("its IPReservation names node {other}"),
                    None => "no IPReservation exists for it".to_owned(),
                };
                (
                    "orphan",
                    node,
                    format!(
                        "the reservation file of {pod} on network {network} holds {} but {why}, and the agent does not report it lost",
                        ips.join(", ")
                    ),
                    format!(
                        "the agent judges it at its next full resync (--resync-interval; restarting the agent pod judges it now): released, or kept as lost (then ipkeep-operator recover); to free the addresses now instead, rm {} on the node",
                        path.display()
                    ),
                )
            }
            Finding::OrphanReservation {
                node,
                network,
                pod,
                ips,
                agent,
            } => (
                "orphan",
                node,
                format!(
                    "the IPReservation {pod} ({}) names this node, but its agent has no file for it on network {network}: the plugin does not protect its addresses there",
                    ips.join(", ")
                ),
                format!(
                    "the agent writes it on the reservation's next change or its next full resync; to write it now, restart the agent: kubectl -n {namespace} delete pod {agent}"
                ),
            ),
            Finding::Conflict {
                node,
                network,
                ip,
                holders,
            } => {
                let said: Vec<String> = holders.iter().map(ToString::to_string).collect();
                (
                    "conflict",
                    node,
                    format!(
                        "{ip} on network {network} is held by {}",
                        said.join(" and ")
                    ),
                    "decide which pod keeps the address and kubectl -n <namespace> delete ipr <name> of the reservation that should not hold it (its file goes with it; a file without IPReservation is removed on the node); a live pod that should not have it gets another address when it is re-created".to_owned(),
                )
            }
        };
        Line {
            check,
            ok: false,
            node: Some(node.clone()),
            message,
            fix: Some(fix),
        }
    }
}

/// The lines of `check --ipam`: each node's ✓ when nothing was found there (or ✗ when its
/// view could not be read), then one ✗ per finding.
pub fn lines(o: &IpamObserved, namespace: &str, now: Timestamp, grace: Duration) -> Vec<Line> {
    let findings = cross_check(o, now, grace);
    let mut out = Vec::new();
    for report in &o.nodes {
        let node = Some(report.node.clone());
        match &report.view {
            Err(e) => out.push(Line {
                check: "ipam",
                ok: false,
                node,
                message: format!(
                    "cannot read the node's allocation and reservation files from agent {}: {e}",
                    report.agent
                ),
                fix: Some(format!(
                    "the agent serves them at {} on its metrics port, reached through the API server (pods/proxy: run check with credentials that may get it); agents before 0.3 do not serve it: upgrade the chart",
                    crate::agent::ipam::PATH
                )),
            }),
            Ok(view) => {
                let found = findings.iter().any(|f| f.node() == report.node);
                let unreadable: Vec<String> = view
                    .networks
                    .iter()
                    .filter_map(|n| Some(format!("{}: {}", n.network, n.error.as_ref()?)))
                    .collect();
                let allocations: usize = view.networks.iter().map(|n| n.allocations.len()).sum();
                let files: usize = view.networks.iter().map(|n| n.reservations.len()).sum();
                if !unreadable.is_empty() {
                    out.push(Line {
                        check: "ipam",
                        ok: false,
                        node: node.clone(),
                        message: format!(
                            "the agent cannot read network directories: {}",
                            unreadable.join("; ")
                        ),
                        fix: Some(format!(
                            "kubectl -n {namespace} logs {}; the agent's data directory mount",
                            report.agent
                        )),
                    });
                }
                if !found {
                    out.push(Line {
                        check: "ipam",
                        ok: true,
                        node,
                        message: format!(
                            "{allocations} allocations, {files} reservation files: no leak, orphan or conflict"
                        ),
                        fix: None,
                    });
                }
            }
        }
    }
    out.extend(findings.iter().map(|f| f.line(namespace)));
    out
}

impl Finding {
    /// The node it is on.
    pub fn node(&self) -> &str {
        match self {
            Finding::Leak { node, .. }
            | Finding::OrphanFile { node, .. }
            | Finding::OrphanReservation { node, .. }
            | Finding::Conflict { node, .. } => node,
        }
    }
}

#[cfg(test)]
mod tests;
