//! The torture run's oracle: ipkeep's promises as rules over what the run saw, with no I/O.
//! The runner feeds it a [`Sample`] of the cluster and the nodes every second, the Events it
//! listed, the reservation deletions of the audit log and the faults in force; it answers with
//! [`Violation`]s.
//!
//! 1. No address held by two live pods at once.
//! 2. No reservation deleted while a pod of its name lived; none deleted before its release time
//!    (but for a `Yielded` one) or later than [`LATE`] after it while nothing held the controller
//!    back.
//! 3. A returning pod came back with its reserved addresses, or ipkeep said why with an Event
//!    ([`EXCUSES`]), or its reservation ended first (or no controller led while it lived, the
//!    documented limitation of Events).
//! 4. Once the run is quiet: every node's reservation files equal its reservations, and no
//!    allocation is held by neither a pod nor a reservation.
//! 5. No unannotated pod waits for an address on a node that holds more Released reservations
//!    than its budget.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::IpAddr,
};

use jiff::{SignedDuration, Timestamp};

use super::schedule::FaultKind;

/// How long two live pods may show the same address before it counts: the kubelet writes a
/// pod's status some seconds after its sandbox changed (after a node's reboot the old address
/// stays in the status until the kubelet's next sync).
pub const DOUBLE_HOLD_GRACE: SignedDuration = SignedDuration::from_secs(10);
/// How long before a deletion a pod of the reservation's name must have been created for the
/// deletion to count as one while it lived: a pod's creation time is kept to the second, and the
/// controller reads the pod from the API server before it deletes, so a pod created in between
/// is one it could not see (and one that came after the release time, which the deletion then
/// honours).
pub const RACE: SignedDuration = SignedDuration::from_secs(2);
/// How late after its release time the controller may delete a reservation while no fault holds
/// it back (it schedules the expiry for that instant; the bound covers a busy API server), not
/// counting the time no controller led.
pub const LATE: SignedDuration = SignedDuration::from_secs(30);
/// How long an unannotated pod may wait for an address on a node over its budget (the
/// controller yields on the release that puts a node over; the kubelet retries a sandbox with a
/// back-off).
pub const STARVED: SignedDuration = SignedDuration::from_secs(90);
/// How long after a pod got other addresses ipkeep has to say why.
pub const EXPLAIN_WITHIN: SignedDuration = SignedDuration::from_secs(60);
/// An allocation younger than this is not judged a leak: its pod's status shows the address
/// later.
pub const YOUNG_ALLOCATION: SignedDuration = SignedDuration::from_secs(60);
/// The Event reasons that say why a returning pod did not get its reserved addresses
/// (docs/operator.md's Events).
pub const EXCUSES: [&str; 10] = [
    "AddressesChanged",
    "PlacementMissed",
    "PlacementSkipped",
    "Yielded",
    "Expired",
    "NodeGone",
    "Conflict",
    "ReservationLost",
    "InvalidReservation",
    "NotInCharge",
];

/// A namespace and a name.
pub type Key = (String, String);

/// A pod as a sample shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    /// Its namespace.
    pub ns: String,
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: String,
    /// Its node, once scheduled.
    pub node: Option<String>,
    /// Its addresses (`status.podIPs`).
    pub ips: Vec<IpAddr>,
    /// `status.phase`.
    pub phase: String,
    /// It has a deletion timestamp.
    pub deleting: bool,
    /// Its `Ready` condition is true; since when.
    pub ready_since: Option<Timestamp>,
    /// When it was created.
    pub created: Timestamp,
    /// It is one ipkeep keeps addresses for (annotated, in a selected namespace).
    pub retained: bool,
    /// It uses the node's network (no address of its own).
    pub host_network: bool,
}

impl PodView {
    /// Not finished: a pod of its name lives.
    pub fn lives(&self) -> bool {
        self.phase != "Succeeded" && self.phase != "Failed"
    }

    /// Holds its addresses as far as the API says: running, ready and not being deleted.
    fn holds_addresses(&self) -> bool {
        self.phase == "Running"
            && !self.deleting
            && self.ready_since.is_some()
            && !self.host_network
    }

    fn key(&self) -> Key {
        (self.ns.clone(), self.name.clone())
    }
}

/// A reservation as a sample shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservationView {
    /// Its namespace.
    pub ns: String,
    /// Its name (its pod's).
    pub name: String,
    /// Its UID.
    pub uid: String,
    /// `spec.nodeName`.
    pub node: String,
    /// `spec.ips`.
    pub ips: Vec<IpAddr>,
    /// `status.phase` is `Released`.
    pub released: bool,
    /// `status.releaseTime`.
    pub release_time: Option<Timestamp>,
    /// `status.conflict` is set: the agent writes no file for it.
    pub conflict: bool,
}

/// What one node's network directory holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFiles {
    /// Allocated addresses, with their allocation file's modification time.
    pub allocations: Vec<(IpAddr, Timestamp)>,
    /// Reservation files: namespace, pod, addresses, the reservation's UID.
    pub reserved: Vec<(Key, Vec<IpAddr>, String)>,
}

/// One look at the cluster and the nodes.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// When.
    pub at: Timestamp,
    /// Every pod.
    pub pods: Vec<PodView>,
    /// Every reservation.
    pub reservations: Vec<ReservationView>,
    /// Each node's files (absent when they could not be read).
    pub nodes: BTreeMap<String, NodeFiles>,
    /// Each node's budget of Released reservations.
    pub budgets: BTreeMap<String, u32>,
    /// A controller leads: the release's Lease is held and was renewed within its duration.
    pub led: bool,
}

/// An Event as listed: about which object, why, when.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct EventSeen {
    /// The object's namespace and name.
    pub about: Key,
    /// Its reason.
    pub reason: String,
    /// When it was (last) emitted.
    pub at: Timestamp,
}

/// A reservation deletion the audit log recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deletion {
    /// When the API server received it.
    pub at: Timestamp,
    /// The reservation.
    pub key: Key,
    /// Who sent it.
    pub user: String,
}

/// A fault with the time it was in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultWindow {
    /// What.
    pub kind: FaultKind,
    /// Its node's name, for a fault on a node.
    pub node: Option<String>,
    /// From.
    pub from: Timestamp,
    /// Until (healed; `None`: still in force).
    pub until: Option<Timestamp>,
    /// It cuts every pod of its node from the API server too: an `AgentPartition` on flannel,
    /// whose `--ip-masq` sends the node's pods' traffic to the API server from the node's own
    /// address, the address the partition matches. A controller on that node is then cut off
    /// with the agent ([`FaultWindow::delays_the_controller`]).
    pub whole_node: bool,
}

impl FaultWindow {
    fn overlaps(&self, from: Timestamp, until: Timestamp) -> bool {
        self.from <= until && self.until.is_none_or(|u| u >= from)
    }

    /// Whether, while in force, it keeps the controller from acting on time: its kind's
    /// ([`FaultKind::delays_the_controller`]), or a partition of a whole node, where a controller
    /// replica may run.
    fn delays_the_controller(&self) -> bool {
        self.kind.delays_the_controller() || self.whole_node
    }
}

/// Which promise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Promise {
    /// 1: one address, one live pod.
    OneHolder,
    /// 2: no reservation deleted while its pod lived, none expired early or late.
    DeletedRightly,
    /// 3: a returning pod got its addresses back, or was told why.
    Returned,
    /// 4: the quiet end: files equal reservations, no leak, `check` passes.
    Settled,
    /// 5: no unannotated pod starved by reservations over the budget.
    NotStarved,
}

impl Promise {
    /// Its number in the list.
    pub fn number(self) -> u8 {
        match self {
            Promise::OneHolder => 1,
            Promise::DeletedRightly => 2,
            Promise::Returned => 3,
            Promise::Settled => 4,
            Promise::NotStarved => 5,
        }
    }
}

/// A broken promise: when, what, and the faults in force then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Which promise.
    pub promise: Promise,
    /// When it was seen.
    pub at: Timestamp,
    /// What, naming the objects.
    pub what: String,
    /// The faults in force.
    pub faults: Vec<String>,
}

/// A pod's life as the samples saw it: from its creation to the last sample that showed it
/// living.
#[derive(Debug, Clone)]
struct Life {
    key: Key,
    from: Timestamp,
    until: Timestamp,
}

/// A returning pod that got other addresses than its reservation's: judged once Events had
/// time to say why.
#[derive(Debug, Clone)]
struct Unexplained {
    key: Key,
    uid: String,
    wanted: Vec<IpAddr>,
    got: Vec<IpAddr>,
    seen: Timestamp,
    /// The reservation it had at its creation.
    reservation_uid: String,
}

/// The last state of a reservation the samples saw, kept after it is gone.
#[derive(Debug, Clone)]
struct Known {
    view: ReservationView,
    gone_at: Option<Timestamp>,
}

/// Times from a pod's creation to its readiness.
#[derive(Debug, Clone, Default)]
pub struct Latencies {
    /// Returning pods that got their reserved addresses.
    pub returning: Vec<SignedDuration>,
    /// Unannotated pods.
    pub unannotated: Vec<SignedDuration>,
}

/// What the oracle remembers between samples.
#[derive(Debug, Default)]
pub struct Oracle {
    /// Address → the pods showing it and since when they both did.
    double: HashMap<IpAddr, (BTreeSet<String>, Timestamp, bool)>,
    /// Every pod UID seen, with its life.
    lives: HashMap<String, Life>,
    /// The reservation each pod UID found at its first sighting (the one it returns to).
    found_at_creation: HashMap<String, Option<ReservationView>>,
    /// UIDs already judged for promise 3 (and their latency taken).
    judged: BTreeSet<String>,
    /// Names that had a pod before: a new UID there is a re-creation.
    names: HashMap<Key, String>,
    /// Re-creations seen.
    pub recreations: usize,
    /// Reservations by UID, the latest view.
    known: HashMap<String, Known>,
    /// Returning pods waiting for their Event.
    unexplained: Vec<Unexplained>,
    /// Every Event listed so far.
    events: BTreeSet<EventSeen>,
    /// Unannotated pods waiting for an address, and since when their node was over budget.
    starving: HashMap<String, Timestamp>,
    /// Violations of promise 5 already said (by pod UID).
    starved: BTreeSet<String>,
    /// Each sample's time and whether a controller led then.
    led: Vec<(Timestamp, bool)>,
    /// Creation-to-ready times.
    pub latencies: Latencies,
    /// Samples taken.
    pub samples: usize,
    /// What the documented limitations explain: a returning pod whose whole life passed while
    /// no controller led (nothing could post its Event). Not violations; reported beside them.
    pub limitations: Vec<String>,
}

impl Oracle {
    /// Takes in one sample; returns what it breaks now (promises 1, 3 and 5).
    pub fn observe(&mut self, s: &Sample, faults: &[FaultWindow]) -> Vec<Violation> {
        self.samples += 1;
        self.led.push((s.at, s.led));
        let mut found = Vec::new();
        self.remember_reservations(s);
        self.follow_lives(s);
        found.extend(self.one_holder(s, faults));
        found.extend(self.returned(s));
        found.extend(self.not_starved(s, faults));
        found.extend(self.explain_due(s.at, faults));
        found
    }

    /// Takes in listed Events.
    pub fn events(&mut self, events: impl IntoIterator<Item = EventSeen>) {
        self.events.extend(events);
    }

    fn remember_reservations(&mut self, s: &Sample) {
        let present: BTreeSet<&str> = s.reservations.iter().map(|r| r.uid.as_str()).collect();
        for k in self.known.values_mut() {
            if k.gone_at.is_none() && !present.contains(k.view.uid.as_str()) {
                k.gone_at = Some(s.at);
            }
        }
        for r in &s.reservations {
            self.known.insert(
                r.uid.clone(),
                Known {
                    view: r.clone(),
                    gone_at: None,
                },
            );
        }
    }

    fn follow_lives(&mut self, s: &Sample) {
        for p in &s.pods {
            if let Some(life) = self.lives.get_mut(&p.uid) {
                if p.lives() {
                    life.until = s.at;
                }
                continue;
            }
            self.lives.insert(
                p.uid.clone(),
                Life {
                    key: p.key(),
                    from: p.created,
                    until: s.at,
                },
            );
            let key = p.key();
            if let Some(before) = self.names.insert(key.clone(), p.uid.clone())
                && before != p.uid
            {
                self.recreations += 1;
            }
            let reservation = s
                .reservations
                .iter()
                .find(|r| r.ns == p.ns && r.name == p.name)
                .cloned();
            self.found_at_creation.insert(p.uid.clone(), reservation);
        }
    }

    /// Promise 1.
    fn one_holder(&mut self, s: &Sample, faults: &[FaultWindow]) -> Vec<Violation> {
        let mut holders: HashMap<IpAddr, BTreeSet<String>> = HashMap::new();
        for p in s.pods.iter().filter(|p| p.holds_addresses()) {
            for ip in &p.ips {
                holders
                    .entry(ip.to_canonical())
                    .or_default()
                    .insert(format!("{}/{} ({})", p.ns, p.name, p.uid));
            }
        }
        let now: HashMap<IpAddr, BTreeSet<String>> =
            holders.into_iter().filter(|(_, h)| h.len() > 1).collect();
        self.double
            .retain(|ip, (pods, _, _)| now.get(ip) == Some(pods));
        let mut found = Vec::new();
        for (ip, pods) in now {
            let entry = self
                .double
                .entry(ip)
                .or_insert_with(|| (pods.clone(), s.at, false));
            if entry.2 || s.at.duration_since(entry.1) < DOUBLE_HOLD_GRACE {
                continue;
            }
            entry.2 = true;
            let what = format!(
                "{ip} held by {} live pods since {}: {}",
                pods.len(),
                entry.1,
                pods.iter().cloned().collect::<Vec<_>>().join(", ")
            );
            found.push(violation(Promise::OneHolder, s.at, what, faults));
        }
        found
    }

    /// Promise 3 (its first half: the addresses compared once a returning pod has them) and
    /// the creation-to-ready times.
    fn returned(&mut self, s: &Sample) -> Vec<Violation> {
        for p in &s.pods {
            let Some(ready) = p.ready_since else { continue };
            if p.ips.is_empty() || p.host_network || self.judged.contains(&p.uid) {
                continue;
            }
            self.judged.insert(p.uid.clone());
            let took = ready.duration_since(p.created);
            if !p.retained {
                self.latencies.unannotated.push(took);
                continue;
            }
            let Some(Some(r)) = self.found_at_creation.get(&p.uid).cloned() else {
                continue;
            };
            if same_addresses(&r.ips, &p.ips) {
                self.latencies.returning.push(took);
                continue;
            }
            self.unexplained.push(Unexplained {
                key: p.key(),
                uid: p.uid.clone(),
                wanted: r.ips.clone(),
                got: p.ips.clone(),
                seen: s.at,
                reservation_uid: r.uid.clone(),
            });
        }
        Vec::new()
    }

    /// Promise 3's second half: each returning pod with other addresses is explained by an
    /// Event about it or its reservation after its creation, or its reservation ended before
    /// it got addresses (its release time came, or it yielded); else, once
    /// [`EXPLAIN_WITHIN`] has passed, it is a violation.
    fn explain_due(&mut self, now: Timestamp, faults: &[FaultWindow]) -> Vec<Violation> {
        let mut found = Vec::new();
        let pending = std::mem::take(&mut self.unexplained);
        for u in pending {
            let created = self.lives.get(&u.uid).map_or(u.seen, |l| l.from);
            let told = self.events.iter().any(|e| {
                e.about == u.key && e.at >= created && EXCUSES.contains(&e.reason.as_str())
            });
            let ended = self.known.get(&u.reservation_uid).is_some_and(|k| {
                k.gone_at.is_some_and(|g| g <= u.seen)
                    || k.view.release_time.is_some_and(|t| t <= u.seen)
            });
            if told || ended {
                continue;
            }
            if now.duration_since(u.seen) < EXPLAIN_WITHIN {
                self.unexplained.push(u);
                continue;
            }
            let until = self.lives.get(&u.uid).map_or(u.seen, |l| l.until);
            if !self
                .led
                .iter()
                .any(|(t, led)| *led && *t >= created && *t <= until)
            {
                self.limitations.push(format!(
                    "{}/{} ({}) came back with {} instead of its reserved {} while no controller led (from its creation {created} to its last sighting {until}): ipkeep's Events come from the leader, and none could say why",
                    u.key.0,
                    u.key.1,
                    u.uid,
                    ips(&u.got),
                    ips(&u.wanted)
                ));
                continue;
            }
            found.push(violation(
                Promise::Returned,
                u.seen,
                format!(
                    "{}/{} ({}) came back with {} instead of its reserved {}, and no Event said why",
                    u.key.0,
                    u.key.1,
                    u.uid,
                    ips(&u.got),
                    ips(&u.wanted)
                ),
                faults,
            ));
        }
        found
    }

    /// Promise 5.
    fn not_starved(&mut self, s: &Sample, faults: &[FaultWindow]) -> Vec<Violation> {
        // What the budget counts: a Released reservation whose pod of that name is not alive again
        // (a replacement without addresses yet keeps its reservation, whatever the budget).
        let alive: BTreeSet<(&str, &str)> = s
            .pods
            .iter()
            .filter(|p| p.lives())
            .map(|p| (p.ns.as_str(), p.name.as_str()))
            .collect();
        let mut released: HashMap<&str, u32> = HashMap::new();
        for r in s
            .reservations
            .iter()
            .filter(|r| r.released && !alive.contains(&(r.ns.as_str(), r.name.as_str())))
        {
            *released.entry(r.node.as_str()).or_default() += 1;
        }
        let over = |node: &str| {
            s.budgets
                .get(node)
                .is_some_and(|b| released.get(node).copied().unwrap_or(0) > *b)
        };
        let waiting: BTreeSet<&str> = s
            .pods
            .iter()
            .filter(|p| {
                !p.retained
                    && !p.host_network
                    && !p.deleting
                    && p.phase == "Pending"
                    && p.ips.is_empty()
                    && p.node.as_deref().is_some_and(over)
            })
            .map(|p| p.uid.as_str())
            .collect();
        self.starving
            .retain(|uid, _| waiting.contains(uid.as_str()));
        let mut found = Vec::new();
        for p in s.pods.iter().filter(|p| waiting.contains(p.uid.as_str())) {
            let since = *self.starving.entry(p.uid.clone()).or_insert(s.at);
            if s.at.duration_since(since) >= STARVED && self.starved.insert(p.uid.clone()) {
                let node = p.node.clone().unwrap_or_default();
                found.push(violation(
                    Promise::NotStarved,
                    s.at,
                    format!(
                        "unannotated {}/{} waits for an address on {node} since {since}, which holds {} Released reservations over its budget of {}",
                        p.ns,
                        p.name,
                        released.get(node.as_str()).copied().unwrap_or(0),
                        s.budgets.get(&node).copied().unwrap_or(0)
                    ),
                    faults,
                ));
            }
        }
        found
    }

    /// Promise 2, over the audit log's deletions. `ours` are the users whose deletions are the
    /// run's own or Kubernetes' (none is expected: the workload deletes no reservation), and are
    /// not judged.
    pub fn deletions(
        &self,
        deletions: &[Deletion],
        ours: &[&str],
        faults: &[FaultWindow],
    ) -> Vec<Violation> {
        let mut found = Vec::new();
        for d in deletions {
            if ours.contains(&d.user.as_str()) {
                continue;
            }
            let lived: Vec<&Life> = self
                .lives
                .values()
                .filter(|l| l.key == d.key && l.from + RACE < d.at && l.until > d.at)
                .collect();
            if !lived.is_empty() {
                found.push(violation(
                    Promise::DeletedRightly,
                    d.at,
                    format!(
                        "reservation {}/{} deleted by {} while its pod lived (created {}, alive at {})",
                        d.key.0, d.key.1, d.user, lived[0].from, lived[0].until
                    ),
                    faults,
                ));
                continue;
            }
            // The object this deletion removed: the first of that name the samples saw vanish at
            // or after it (a later object of the same name, still there or gone later, is not).
            let last = self
                .known
                .values()
                .filter(|k| (k.view.ns.as_str(), k.view.name.as_str()) == (&d.key.0, &d.key.1))
                .filter(|k| k.gone_at.is_some_and(|g| g >= d.at))
                .min_by_key(|k| k.gone_at);
            let Some(release) = last.and_then(|k| k.view.release_time) else {
                continue;
            };
            let yielded = self
                .events
                .iter()
                .any(|e| e.about == d.key && e.reason == "Yielded" && e.at >= d.at - LATE);
            if d.at < release - SignedDuration::from_secs(1) && !yielded {
                found.push(violation(
                    Promise::DeletedRightly,
                    d.at,
                    format!(
                        "reservation {}/{} deleted by {} at {}, before its release time {release}, and not yielded",
                        d.key.0, d.key.1, d.user, d.at
                    ),
                    faults,
                ));
            }
            let late = d.at.duration_since(release) - self.leaderless(release, d.at);
            if late > LATE && !held_back(faults, release, d.at) {
                found.push(violation(
                    Promise::DeletedRightly,
                    d.at,
                    format!(
                        "reservation {}/{} deleted at {}, {:.0}s after its release time {release}, with nothing holding the controller back",
                        d.key.0,
                        d.key.1,
                        d.at,
                        d.at.duration_since(release).as_secs_f64()
                    ),
                    faults,
                ));
            }
        }
        found
    }

    /// Promise 2's end: a reservation still there at `now`, [`LATE`] past its release time.
    pub fn overdue(&self, s: &Sample, faults: &[FaultWindow]) -> Vec<Violation> {
        s.reservations
            .iter()
            .filter_map(|r| {
                let t = r.release_time?;
                let late = s.at.duration_since(t) - self.leaderless(t, s.at);
                (late > LATE && !held_back(faults, t, s.at)).then(|| {
                    violation(
                        Promise::DeletedRightly,
                        s.at,
                        format!(
                            "reservation {}/{} still there {:.0}s after its release time {t}",
                            r.ns,
                            r.name,
                            s.at.duration_since(t).as_secs_f64()
                        ),
                        faults,
                    )
                })
            })
            .collect()
    }

    /// How long no controller led between `from` and `until`, as the samples saw it (each sample
    /// without a leader counts until the next sample): an expiry needs a leader to delete.
    fn leaderless(&self, from: Timestamp, until: Timestamp) -> SignedDuration {
        self.led
            .windows(2)
            .filter(|w| !w[0].1 && w[1].0 > from && w[0].0 < until)
            .map(|w| w[1].0.min(until).duration_since(w[0].0.max(from)))
            .sum()
    }

    /// Promise 3 at the end: every returning pod still unexplained.
    pub fn unexplained_at_end(&mut self, now: Timestamp, faults: &[FaultWindow]) -> Vec<Violation> {
        self.explain_due(now + EXPLAIN_WITHIN, faults)
    }
}

/// The workload's pods (namespaces starting with `ns`) not settled at the quiet end: alive and
/// not Ready, or being deleted. A pod waiting for an address on a node whose every address is
/// held is where the workload put it, not unsettled: the tiny node is asked for one pod more than
/// it has addresses while `keep-tiny` runs all three (`capacity`: how many addresses a node hands
/// out, for the nodes the workload fills; an address is held by an allocation file or a
/// reservation file). Whether those holders are right is promise 4's to judge ([`settled`]).
pub fn unsettled(s: &Sample, ns: &str, capacity: &BTreeMap<String, usize>) -> Vec<String> {
    let full = |node: &str| {
        let (Some(cap), Some(files)) = (capacity.get(node), s.nodes.get(node)) else {
            return false;
        };
        let held: BTreeSet<IpAddr> = files
            .allocations
            .iter()
            .map(|(ip, _)| ip.to_canonical())
            .chain(
                files
                    .reserved
                    .iter()
                    .flat_map(|(_, ips, _)| ips.iter().map(IpAddr::to_canonical)),
            )
            .collect();
        held.len() >= *cap
    };
    s.pods
        .iter()
        .filter(|p| p.ns.starts_with(ns) && p.lives() && (p.ready_since.is_none() || p.deleting))
        .filter(|p| {
            let waits = !p.deleting && p.ips.is_empty() && p.phase == "Pending";
            !(waits && p.node.as_deref().is_some_and(full))
        })
        .map(|p| format!("{}/{} {}", p.ns, p.name, p.phase))
        .collect()
}

/// Promise 4 on a sample of the quiet cluster.
/// `deletions` (the audit log's) are named beside a file without a reservation, to tell an
/// unseen release from a loss.
pub fn settled(s: &Sample, deletions: &[Deletion]) -> Vec<Violation> {
    let mut found = Vec::new();
    let mut say = |what: String| found.push(violation(Promise::Settled, s.at, what, &[]));
    for (node, files) in &s.nodes {
        let want: BTreeMap<Key, (&[IpAddr], &str)> = s
            .reservations
            .iter()
            .filter(|r| &r.node == node && !r.conflict)
            .map(|r| {
                (
                    (r.ns.clone(), r.name.clone()),
                    (r.ips.as_slice(), r.uid.as_str()),
                )
            })
            .collect();
        let have: BTreeMap<Key, (&[IpAddr], &str)> = files
            .reserved
            .iter()
            .map(|(k, ips, uid)| (k.clone(), (ips.as_slice(), uid.as_str())))
            .collect();
        for (k, (ips_want, uid)) in &want {
            match have.get(k) {
                None => say(format!("{node}: no file for reservation {}/{}", k.0, k.1)),
                Some((ips_have, file_uid))
                    if !same_addresses(ips_have, ips_want) || file_uid != uid =>
                {
                    say(format!(
                        "{node}: the file of {}/{} holds {} ({file_uid}), its reservation {} ({uid})",
                        k.0,
                        k.1,
                        ips(ips_have),
                        ips(ips_want)
                    ))
                }
                Some(_) => {}
            }
        }
        for (k, (ips_have, file_uid)) in have.iter().filter(|(k, _)| !want.contains_key(*k)) {
            let deleted: Vec<String> = deletions
                .iter()
                .filter(|d| &d.key == k)
                .map(|d| format!("{} by {}", d.at, d.user))
                .collect();
            say(format!(
                "{node}: file {}/{} ({}, uid {file_uid}) without a reservation; the audit log's deletions of that name: {}",
                k.0,
                k.1,
                ips(ips_have),
                if deleted.is_empty() {
                    "none".to_owned()
                } else {
                    deleted.join(", ")
                }
            ));
        }
        let held: BTreeSet<IpAddr> = s
            .pods
            .iter()
            .filter(|p| p.node.as_deref() == Some(node.as_str()) && p.lives())
            .flat_map(|p| p.ips.iter().map(|ip| ip.to_canonical()))
            .chain(
                files
                    .reserved
                    .iter()
                    .flat_map(|(_, ips, _)| ips.iter().map(|ip| ip.to_canonical())),
            )
            .collect();
        for (ip, since) in &files.allocations {
            if !held.contains(&ip.to_canonical()) && s.at.duration_since(*since) >= YOUNG_ALLOCATION
            {
                say(format!(
                    "{node}: {ip} allocated since {since}, held by no pod and no reservation (a leak)"
                ));
            }
        }
    }
    found
}

/// Whether a fault that holds the controller back was in force between `from` and `until`.
fn held_back(faults: &[FaultWindow], from: Timestamp, until: Timestamp) -> bool {
    faults
        .iter()
        .any(|f| f.delays_the_controller() && f.overlaps(from - LATE, until))
}

fn same_addresses(a: &[IpAddr], b: &[IpAddr]) -> bool {
    let set = |x: &[IpAddr]| {
        x.iter()
            .map(|ip| ip.to_canonical())
            .collect::<BTreeSet<_>>()
    };
    set(a) == set(b)
}

fn ips(list: &[IpAddr]) -> String {
    list.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn violation(promise: Promise, at: Timestamp, what: String, faults: &[FaultWindow]) -> Violation {
    Violation {
        promise,
        at,
        what,
        faults: faults
            .iter()
            .filter(|f| f.overlaps(at - SignedDuration::from_secs(30), at))
            .map(|f| match &f.node {
                Some(n) => format!("{} on {n} from {}", f.kind, f.from),
                None => format!("{} from {}", f.kind, f.from),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests;
