//! The reservation lifecycle as one pure function: given the pod (or none), the reservation (or
//! none), the instant `now` and the defaults, [`decide`] says what to write, what to delete, when
//! to look again and what to tell the user. No Kubernetes types, no clock, no I/O.

use std::{collections::BTreeSet, fmt::Write as _, net::IpAddr, time::Duration};

use ipnet::IpNet;
use jiff::Timestamp;

use super::{
    budget::Budget,
    namespaces::Verdict,
    optin::Mode,
    optin::{OptIn, Retain},
    placement::Placed,
};
use crate::{
    api::PodKey,
    api::retention::{self, Fallback, FoundRetainFor, RetainFor, written},
};

use crate::api::Phase;

/// What the lifecycle needs to know about a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    /// The pod's UID.
    pub uid: String,
    /// The node it was scheduled to, once it was.
    pub node_name: Option<String>,
    /// `status.podIPs`.
    pub ips: Vec<IpAddr>,
    /// `status.phase` is `Running`.
    pub running: bool,
    /// `status.phase` is `Succeeded` or `Failed`: the pod holds no addresses any more.
    pub finished: bool,
    /// `spec.hostNetwork`: the pod's addresses are its node's.
    pub host_network: bool,
    /// The effective annotations (the pod's, else its StatefulSet's).
    pub opt_in: OptIn,
    /// The name of the StatefulSet owning the pod, if one does.
    pub owner_statefulset: Option<String>,
    /// What the placement webhook recorded on the pod when it was created.
    pub placed: Placed,
    /// Why the pod's name will never come back, when it will not (see [`NameSource`]).
    pub name: NameSource,
}

/// Where a pod's name came from, which says whether a pod of that name can ever return.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameSource {
    /// Given by whoever created the pod (a StatefulSet, an operator, a person): it may return.
    Stable,
    /// Made by `metadata.generateName`: never made again.
    Generated,
    /// Made by a controller whose pods' names never return ([`EPHEMERAL_OWNERS`]).
    OwnedBy {
        /// The owner's kind.
        kind: String,
        /// The owner's name.
        name: String,
    },
}

/// Whether the API server made `name` from `base` (`metadata.generateName`): the base, cut to
/// 58 characters, then 5 characters of its random alphabet (apiserver's `SimpleNameGenerator`).
fn generated_from(base: &str, name: &str) -> bool {
    const ALPHABET: &str = "bcdfghjklmnpqrstvwxz2456789";
    let base = base.get(..base.len().min(58)).unwrap_or(base);
    name.strip_prefix(base)
        .is_some_and(|rest| rest.len() == 5 && rest.chars().all(|c| ALPHABET.contains(c)))
}

/// Controller kinds whose pods get a fresh name each time: reserving for them holds addresses
/// for nobody.
pub const EPHEMERAL_OWNERS: [&str; 3] = ["ReplicaSet", "Job", "DaemonSet"];

impl NameSource {
    /// Classifies a pod by its controller owner (kind, name), its `generateName` and its name. A
    /// StatefulSet owner makes it stable whatever else it says (the StatefulSet controller writes a
    /// `generateName` too, then sets the name itself).
    pub fn of(
        controller: Option<(&str, &str)>,
        generate_name: Option<&str>,
        name: &str,
    ) -> NameSource {
        match controller {
            Some((kind, owner)) if EPHEMERAL_OWNERS.contains(&kind) => NameSource::OwnedBy {
                kind: kind.to_owned(),
                name: owner.to_owned(),
            },
            Some(("StatefulSet", _)) => NameSource::Stable,
            _ if generate_name.is_some_and(|base| generated_from(base, name)) => {
                NameSource::Generated
            }
            _ => NameSource::Stable,
        }
    }

    /// Why a pod of this name will never return, when it will not.
    fn never_returns(&self) -> Option<String> {
        match self {
            NameSource::Stable => None,
            NameSource::Generated => {
                Some("its name was generated (metadata.generateName)".to_owned())
            }
            NameSource::OwnedBy { kind, name } => {
                Some(format!("its name was made by {kind} {name}"))
            }
        }
    }
}

/// A `Conflict` condition: another reservation on the same node holds an address ([`holder`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The address both claim.
    pub ip: IpAddr,
    /// The reservation holding it.
    pub holder: PodKey,
    /// When the condition became true (kept while it stays true).
    pub since: Timestamp,
}

/// A reservation's status as the lifecycle sees and writes it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StatusView {
    /// `status.phase`; `None` before the controller first wrote it.
    pub phase: Option<Phase>,
    /// `status.podUID`.
    pub pod_uid: Option<String>,
    /// `status.releasedAt`.
    pub released_at: Option<Timestamp>,
    /// `status.releaseTime`.
    pub release_time: Option<Timestamp>,
    /// The `Conflict` condition, when true.
    pub conflict: Option<Conflict>,
}

/// What the lifecycle needs to know about a reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservationView {
    /// `spec.ips`, as written.
    pub ips: Vec<String>,
    /// `spec.nodeName`.
    pub node_name: String,
    /// `spec.retainFor`, parsed.
    pub retain_for: Option<FoundRetainFor>,
    /// Created by the controller (label `app.kubernetes.io/managed-by=ipkeep`), not by hand.
    pub managed: bool,
    /// `metadata.creationTimestamp`.
    pub created: Timestamp,
    /// The owning StatefulSet recorded on the reservation (annotation).
    pub owner_statefulset: Option<String>,
    /// `ipkeep.dev/release-with-owner: "true"` recorded on the reservation.
    pub release_with_owner: bool,
    /// The current status.
    pub status: StatusView,
}

/// The state of the StatefulSet that owns (or owned) the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerState {
    /// No StatefulSet is involved.
    None,
    /// It exists.
    Present,
    /// It was deleted.
    Gone,
}

/// Everything [`decide`] looks at besides `now` and the defaults.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// The pod of the reservation's namespace and name, if the cache has one.
    pub pod: Option<&'a PodView>,
    /// The reservation, if one exists.
    pub reservation: Option<&'a ReservationView>,
    /// The owning StatefulSet's state.
    pub owner: OwnerState,
    /// A reservation on the same node holding one of this one's addresses against it ([`holder`]).
    pub conflict: Option<(IpAddr, &'a PodKey)>,
    /// The `spec.podCIDRs` of the pod's node, when known (to explain changed addresses).
    pub node_pod_cidrs: Option<&'a [IpNet]>,
    /// The reservation's node is known not to exist (the node cache is filled and lacks it).
    pub node_gone: bool,
    /// The node's budget says this Released reservation yields ([`super::budget::yielding`]).
    pub yields: Option<&'a Yield>,
    /// What `--namespace-selector` says of the namespace.
    pub namespace: Verdict<'a>,
    /// The live pod was told already that its namespace is not selected.
    pub told: bool,
}

/// Why a Released reservation yields to its node's budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Yield {
    /// The node's budget.
    pub budget: Budget,
    /// How many Released reservations hold addresses on the node.
    pub held: usize,
    /// The latest released reservation that stays: it takes precedence.
    pub kept: Option<PodKey>,
}

/// Controller-wide defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Defaults {
    /// Retention when neither the annotation nor `spec.retainFor` says (`--default-retain-for`).
    pub retain_for: Duration,
    /// Placement when neither the pod nor its StatefulSet says (`--default-placement`).
    pub placement: Mode,
    /// The longest retention anyone gets (`--max-retain-for`); a longer request is held to it.
    pub max_retain_for: RetainFor,
}

/// The spec (and recorded owner) a reservation must have; written when it differs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredSpec {
    /// `spec.ips`.
    pub ips: Vec<String>,
    /// `spec.nodeName`.
    pub node_name: String,
    /// `spec.retainFor`.
    pub retain_for: Option<FoundRetainFor>,
    /// The owning StatefulSet to record.
    pub owner_statefulset: Option<String>,
    /// Whether to record `release-with-owner`.
    pub release_with_owner: bool,
}

/// Why a reservation is to be deleted; each has its own check against the API server first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteReason {
    /// The release time came and no pod of that name is alive.
    Expired {
        /// The release time.
        due: Timestamp,
    },
    /// The live pod no longer asks for a reservation.
    OptedOut,
    /// The reservation's node was deleted and no pod of that name is alive: its range is gone,
    /// and a required placement on it would strand the pod.
    NodeGone,
    /// Its node holds more Released reservations than its budget and this one was released
    /// earliest; no pod of that name is alive.
    Yielded,
}

/// Who an Event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    /// The pod.
    Pod,
    /// The reservation.
    Reservation,
    /// Both (one Event each).
    Both,
    /// The pod's owning StatefulSet (whose own annotation asked).
    StatefulSet,
}

/// A Kubernetes Event to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// Who it is about.
    pub subject: Subject,
    /// The reason, which says Warning or Normal (`Reserved`, `Released`, ...).
    pub reason: EventReason,
    /// What happened, for people.
    pub message: String,
}

/// What to do; an empty plan means the reservation is as it should be.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Create (no reservation yet) or update the spec.
    pub spec: Option<DesiredSpec>,
    /// Write this status.
    pub status: Option<StatusView>,
    /// Delete the reservation.
    pub delete: Option<DeleteReason>,
    /// Look again at this instant (the release time).
    pub requeue_at: Option<Timestamp>,
    /// Events to publish.
    pub notices: Vec<Notice>,
    /// The live pod is told (in `notices`) that its namespace is not selected: not again.
    pub told: bool,
}

impl Plan {
    fn notice(&mut self, subject: Subject, reason: EventReason, message: String) {
        self.notices.push(Notice {
            subject,
            reason,
            message,
        });
    }

    /// Whether nothing is to be written or deleted.
    pub fn writes_nothing(&self) -> bool {
        self.spec.is_none() && self.status.is_none() && self.delete.is_none()
    }
}

/// Event reasons (said once, in the API).
pub use crate::api::reason;
use crate::api::reason::EventReason;

/// Decides what the reservation of one pod name must become.
pub fn decide(input: &Input<'_>, now: Timestamp, defaults: &Defaults) -> Plan {
    let mut plan = Plan::default();
    if let Some(pod) = input.pod {
        for problem in &pod.opt_in.problems {
            plan.notice(Subject::Pod, reason::INVALID_ANNOTATION, problem.clone());
        }
    }
    let alive = input.pod.filter(|p| !p.finished);
    match (alive, input.reservation) {
        (None, None) => {}
        (None, Some(r)) => released(&mut plan, input, r, now, defaults, GONE),
        (Some(pod), r) => live(&mut plan, input, pod, r, now, defaults),
    }
    plan
}

/// A pod of that name is alive (possibly terminating: it still holds its addresses).
fn live(
    plan: &mut Plan,
    input: &Input<'_>,
    pod: &PodView,
    r: Option<&ReservationView>,
    now: Timestamp,
    defaults: &Defaults,
) {
    // The StatefulSet whose own annotations opted the pod in was deleted (its pods follow soon):
    // what it said is what the reservation recorded.
    let owner_gone = input.owner == OwnerState::Gone && r.is_some_and(|r| r.managed);
    let wants = match pod.opt_in.retain {
        Retain::Yes => true,
        Retain::No if owner_gone => true,
        // A reservation made by hand opts its pod in; the controller's own ones end.
        Retain::No => r.is_some_and(|r| !r.managed),
        Retain::Malformed => r.is_some(),
    };
    if !wants {
        if r.is_some() {
            plan.delete = Some(DeleteReason::OptedOut);
            plan.notice(
                Subject::Pod,
                reason::ENDED,
                format!(
                    "{} is no longer \"true\": the reservation is deleted and its addresses are free",
                    super::optin::RETAIN
                ),
            );
        }
        return;
    }
    match input.namespace {
        Verdict::Selected => {}
        // Its arrival in the cache reconciles this name again: nothing is decided before.
        Verdict::NotSeen => return,
        Verdict::NotSelected { selector } => {
            not_selected(plan, input, pod, r, selector, now, defaults);
            return;
        }
    }
    if pod.host_network {
        if r.is_none() {
            plan.notice(
                Subject::Pod,
                reason::NOT_RESERVED,
                "the pod uses the host network: its addresses are its node's, there is nothing to reserve".into(),
            );
        }
        return;
    }
    let ips = one_per_family(&pod.ips);
    // A name that never returns gets no new reservation; one that exists already (made by hand,
    // or before this rule) lives out its lifecycle.
    if r.is_none()
        && let Some(why) = pod.name.never_returns()
    {
        // Once per pod, in practice: when it first runs with addresses, where it would be reserved.
        if pod.running && !ips.is_empty() {
            plan.notice(
                Subject::Pod,
                reason::NOT_RESERVED,
                format!(
                    "{why}: a pod of this name will never come back, so its addresses are not kept"
                ),
            );
        }
        return;
    }
    let Some(node) = pod.node_name.as_deref().filter(|_| !ips.is_empty()) else {
        if pod.running && r.is_none() {
            plan.notice(
                Subject::Pod,
                reason::NOT_RESERVED,
                "the pod is running but has no IP address (status.podIPs is empty): nothing to reserve yet".into(),
            );
        }
        // The pod that held the addresses is gone and one of the same name has none yet (a
        // StatefulSet re-creates a deleted pod within milliseconds): the reservation is Released
        // with its release time running, as users read it, but never deleted while this pod
        // lives; it binds again when the pod gets its addresses.
        if let Some(r) = r
            && r.status.phase == Some(Phase::Bound)
            && r.status
                .pod_uid
                .as_deref()
                .is_some_and(|uid| uid != pod.uid)
        {
            released(plan, input, r, now, defaults, GONE);
            plan.delete = None;
        }
        // Not scheduled or no address yet: otherwise leave any reservation as it is until it has one.
        return;
    };
    let retain_for = if owner_gone {
        r.and_then(|r| r.retain_for.clone())
    } else if let Some(asked) = pod.opt_in.retain_for {
        let held = asked.held_to(defaults.max_retain_for);
        if held != asked && r.is_none_or(|r| r.retain_for != Some(Ok(held))) {
            let (subject, on) = if pod.opt_in.retain_for_on_owner {
                (Subject::StatefulSet, "the StatefulSet's")
            } else {
                (Subject::Pod, "the pod's")
            };
            plan.notice(
                subject,
                reason::RETENTION_CAPPED,
                capped_message(&format!("{on} {}", super::optin::RETAIN_FOR), asked, held),
            );
        }
        Some(Ok(held))
    } else if pod.opt_in.retain_for_malformed || r.is_some_and(|r| !r.managed) {
        r.and_then(|r| r.retain_for.clone())
    } else {
        None
    };
    let desired = DesiredSpec {
        ips: ips.iter().map(ToString::to_string).collect(),
        node_name: node.to_string(),
        retain_for,
        owner_statefulset: pod.owner_statefulset.clone(),
        release_with_owner: if owner_gone {
            r.is_some_and(|r| r.release_with_owner)
        } else {
            pod.opt_in.release_with_owner
        },
    };
    let status = StatusView {
        phase: Some(Phase::Bound),
        pod_uid: Some(pod.uid.clone()),
        released_at: None,
        release_time: None,
        conflict: conflict(input, r, now),
    };
    match r {
        None => {
            plan.notice(
                Subject::Pod,
                reason::RESERVED,
                format!(
                    "reserved {} on node {node}; kept for {} after the pod is gone",
                    desired.ips.join(", "),
                    desired
                        .retain_for
                        .as_ref()
                        .map_or_else(|| "the default retention".into(), written)
                ),
            );
            plan.spec = Some(desired);
            plan.status = Some(status);
        }
        Some(r) => {
            placement_notice(plan, pod, r, defaults);
            let same_addresses = parsed_set(&r.ips) == ips.iter().copied().collect::<BTreeSet<_>>()
                && r.node_name == node;
            if !same_addresses {
                let why = why_changed(r, &ips, node, input.node_pod_cidrs);
                plan.notice(Subject::Both, reason::ADDRESSES_CHANGED, why);
            } else if r.status.phase == Some(Phase::Released) {
                plan.notice(
                    Subject::Both,
                    reason::REBOUND,
                    format!(
                        "pod returned with its reserved addresses {}: bound again, release time cleared",
                        desired.ips.join(", ")
                    ),
                );
            }
            if !spec_matches(r, &desired) {
                plan.spec = Some(desired);
            }
            conflict_notice(plan, r, &status);
            if r.status != status {
                plan.status = Some(status);
            }
        }
    }
}

/// A live pod asks for a reservation in a namespace `--namespace-selector` leaves out: none is
/// made, and one it has is Released with the normal retention (as if the pod were gone) but never
/// deleted while the pod lives; it binds again if the namespace is selected again. The pod is told
/// once, when it runs with addresses (where it would be reserved).
fn not_selected(
    plan: &mut Plan,
    input: &Input<'_>,
    pod: &PodView,
    r: Option<&ReservationView>,
    selector: &str,
    now: Timestamp,
    defaults: &Defaults,
) {
    let mut held = String::new();
    if let Some(r) = r {
        released(plan, input, r, now, defaults, NOT_SELECTED);
        plan.delete = None;
        if let Some(until) = plan
            .status
            .as_ref()
            .and_then(|s| s.release_time)
            .or(r.status.release_time)
        {
            held = format!(
                "; its reservation is Released, held until {until} and never deleted while this pod lives"
            );
        }
    }
    if !input.told && pod.running && !one_per_family(&pod.ips).is_empty() {
        plan.notice(
            Subject::Pod,
            reason::NOT_RESERVED,
            format!(
                "this namespace's labels do not match the controller's --namespace-selector {selector:?}: the pod's addresses are not kept{held}"
            ),
        );
        plan.told = true;
    }
}

/// Why a reservation whose pod lives is Released.
const NOT_SELECTED: &str = "the namespace no longer matches --namespace-selector";
/// Why a reservation is Released, as a rule.
const GONE: &str = "the pod is gone";

/// No pod of that name is alive (or its namespace is not selected, `why` says): the reservation
/// is (or becomes) Released, and expires.
fn released(
    plan: &mut Plan,
    input: &Input<'_>,
    r: &ReservationView,
    now: Timestamp,
    defaults: &Defaults,
    why: &str,
) {
    let (released_at, fresh) = match (r.status.phase, r.status.released_at) {
        (Some(Phase::Released), Some(at)) => (at, false),
        // Made by hand and never bound: honoured from its creation.
        (None, _) if !r.managed => (r.created, true),
        _ => (now, true),
    };
    let (mut release_time, fallback) = retention::release_time(
        released_at,
        r.retain_for.as_ref(),
        defaults.retain_for,
        defaults.max_retain_for,
    );
    let mut capped = None;
    match fallback {
        Some(Fallback::Malformed(e)) => plan.notice(
            Subject::Reservation,
            reason::INVALID_ANNOTATION,
            format!("spec.retainFor: {e}; the default retention applies"),
        ),
        Some(Fallback::Capped { asked, held }) => capped = Some((asked, held)),
        None => {}
    }
    let owner_released = r.release_with_owner && input.owner == OwnerState::Gone;
    if owner_released {
        release_time = released_at;
    }
    if input.node_gone {
        plan.delete = Some(DeleteReason::NodeGone);
        plan.notice(
            Subject::Reservation,
            reason::NODE_GONE,
            format!(
                "node {} was deleted: its pod range is gone, {} released now (the pod of this name, if it returns, gets new addresses wherever it lands)",
                r.node_name,
                r.ips.join(", ")
            ),
        );
        return;
    }
    // Never while a pod of that name lives (a replacement without addresses yet comes here too).
    if let Some(y) = input
        .yields
        .filter(|_| input.pod.is_none_or(|p| p.finished))
    {
        plan.delete = Some(DeleteReason::Yielded);
        let precedence = y.kept.as_ref().map_or_else(String::new, |k| {
            format!("; {k}, released later, takes precedence")
        });
        plan.notice(
            Subject::Reservation,
            reason::YIELDED,
            format!(
                "node {} holds {} addresses for pods that are gone, over its budget of {}: this reservation, released earliest, is deleted before its release time and {} is free for the pods the node admits{precedence}",
                r.node_name,
                y.held,
                y.budget,
                r.ips.join(", ")
            ),
        );
        return;
    }
    let status = StatusView {
        phase: Some(Phase::Released),
        pod_uid: r.status.pod_uid.clone(),
        released_at: Some(released_at),
        release_time: Some(release_time),
        conflict: conflict(input, Some(r), now),
    };
    if let Some((asked, held)) = capped
        && r.status.release_time != Some(release_time)
    {
        plan.notice(
            Subject::Reservation,
            reason::RETENTION_CAPPED,
            capped_message("spec.retainFor", asked, held),
        );
    }
    if now >= release_time {
        plan.delete = Some(DeleteReason::Expired { due: release_time });
        return;
    }
    if fresh {
        let (why, reason) = if r.status.phase.is_none() && !r.managed {
            ("no pod of this name exists yet", reason::HONOURED)
        } else {
            (why, reason::RELEASED)
        };
        plan.notice(
            Subject::Reservation,
            reason,
            format!("{why}: {} held until {release_time}", r.ips.join(", ")),
        );
    } else if owner_released && r.status.release_time != Some(release_time) {
        plan.notice(
            Subject::Reservation,
            reason::RELEASED,
            format!(
                "StatefulSet {} was deleted and {} is \"true\": released now",
                r.owner_statefulset.as_deref().unwrap_or("?"),
                super::optin::RELEASE_WITH_OWNER
            ),
        );
    }
    conflict_notice(plan, r, &status);
    if r.status != status {
        plan.status = Some(status);
    }
    plan.requeue_at = Some(release_time);
}

fn capped_message(what: &str, asked: RetainFor, held: RetainFor) -> String {
    format!(
        "{what} asks for {asked}, longer than this cluster's maximum retention (--max-retain-for): {held} applies"
    )
}

/// Once per returning pod (the reservation still names the previous pod): says when the pod asked
/// to be placed on the reservation's node and was not.
fn placement_notice(plan: &mut Plan, pod: &PodView, r: &ReservationView, defaults: &Defaults) {
    let returning = r
        .status
        .pod_uid
        .as_deref()
        .is_some_and(|uid| uid != pod.uid);
    if !returning || pod.opt_in.placement_or(defaults.placement) == Mode::None {
        return;
    }
    match &pod.placed {
        Placed::On { .. } => {}
        Placed::Unseen => plan.notice(
            Subject::Pod,
            reason::PLACEMENT_MISSED,
            format!(
                "the placement webhook did not see this pod when it was created (unreachable or not registered): it was scheduled without a preference for node {}, where {} is reserved",
                r.node_name,
                r.ips.join(", ")
            ),
        ),
        Placed::Skipped(why) => plan.notice(
            Subject::Pod,
            reason::PLACEMENT_SKIPPED,
            format!("no placement on node {} was added: {why}", r.node_name),
        ),
    }
}

fn conflict(input: &Input<'_>, r: Option<&ReservationView>, now: Timestamp) -> Option<Conflict> {
    let (ip, holder) = input.conflict?;
    let since = r
        .and_then(|r| r.status.conflict.as_ref())
        .filter(|c| c.ip == ip && c.holder == *holder)
        .map_or(now, |c| c.since);
    Some(Conflict {
        ip,
        holder: holder.clone(),
        since,
    })
}

fn conflict_notice(plan: &mut Plan, r: &ReservationView, status: &StatusView) {
    if let Some(c) = &status.conflict
        && r.status
            .conflict
            .as_ref()
            .is_none_or(|old| old.holder != c.holder || old.ip != c.ip)
    {
        plan.notice(
            Subject::Reservation,
            reason::CONFLICT,
            format!(
                "address {} on node {} is held by the reservation {} (a live pod's before one whose pod is away, else the older): this one is not honoured",
                c.ip, r.node_name, c.holder
            ),
        );
    }
}

fn spec_matches(r: &ReservationView, desired: &DesiredSpec) -> bool {
    r.ips == desired.ips
        && r.node_name == desired.node_name
        && r.retain_for == desired.retain_for
        && (!r.managed
            || (r.owner_statefulset == desired.owner_statefulset
                && r.release_with_owner == desired.release_with_owner))
}

fn why_changed(r: &ReservationView, ips: &[IpAddr], node: &str, cidrs: Option<&[IpNet]>) -> String {
    let new = ips
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let old = r.ips.join(", ");
    let mut why = String::new();
    if r.node_name != node {
        let _ = write!(
            why,
            "the pod now runs on node {node}, not {} where {old} was reserved (allocation is node-local)",
            r.node_name
        );
    } else if let Some(cidrs) = cidrs {
        let outside: Vec<&String> = r
            .ips
            .iter()
            .filter(|ip| {
                ip.parse::<IpAddr>()
                    .map_or(true, |ip| !cidrs.iter().any(|c| c.contains(&ip)))
            })
            .collect();
        if outside.is_empty() {
            let _ = write!(
                why,
                "the pod got {new} instead of the reserved {old} (another pod held one, or ipkeep is not this node's IPAM plugin)"
            );
        } else {
            let list: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
            let _ = write!(
                why,
                "the reserved {} lies outside node {node}'s podCIDRs {}",
                outside
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                list.join(", ")
            );
        }
    } else {
        let _ = write!(
            why,
            "the pod got {new} instead of the reserved {old} (another pod held one, or ipkeep is not this node's IPAM plugin)"
        );
    }
    let _ = write!(why, ": the reservation now holds {new} on node {node}");
    why
}

/// The first address of each family, IPv4 first (`status.podIPs` holds at most one per family).
pub fn one_per_family(ips: &[IpAddr]) -> Vec<IpAddr> {
    let v4 = ips.iter().find(|ip| ip.is_ipv4());
    let v6 = ips.iter().find(|ip| ip.is_ipv6());
    v4.into_iter().chain(v6).copied().collect()
}

fn parsed_set(ips: &[String]) -> BTreeSet<IpAddr> {
    ips.iter().filter_map(|s| s.parse().ok()).collect()
}

/// One reservation's claim on addresses of a node, for conflict detection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The reservation.
    pub key: PodKey,
    /// `metadata.creationTimestamp`.
    pub created: Timestamp,
    /// Its pod holds the addresses now (`Bound`).
    pub bound: bool,
    /// It already yields an address to another (its `Conflict` condition is set).
    pub yielded: bool,
}

impl Claim {
    /// The order of [`holder`]: the first holds.
    fn rank(&self) -> (bool, bool, Timestamp, &PodKey) {
        (self.yielded, !self.bound, self.created, &self.key)
    }
}

/// Which of two claims on an address holds it, in this order:
/// 1. one that does not yield already beats one that does: a decision once made stays, so it
///    does not swing back and forth as the two pods come and go;
/// 2. a `Bound` one beats one whose pod is away: the live pod keeps the address it runs with.
///    After an etcd restore, a reservation released since can come back claiming an address a
///    pod got afterwards, and is older than that pod's re-created reservation;
/// 3. the older (earlier creation), then the smaller `namespace/name`.
///
/// Returns the holder that beats `me`, if any.
pub fn holder<'a>(me: &Claim, others: impl IntoIterator<Item = &'a Claim>) -> Option<&'a Claim> {
    others
        .into_iter()
        .filter(|o| o.key != me.key)
        .filter(|o| o.rank() < me.rank())
        .min_by(|a, b| a.rank().cmp(&b.rank()))
}
