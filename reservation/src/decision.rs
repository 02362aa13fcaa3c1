//! The reservation decision of an ADD: for each range set, hand out the pod's reserved address,
//! allocate normally while skipping other pods' reserved addresses, or refuse / ask the runtime
//! to try again. Pure: the caller gathers the facts (files, who holds an address, the clock).

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use super::schema::{PodKey, ReservationFile};
use super::timestamp::Timestamp;

/// How long a pod waits (ADD answers CNI error 11) for its previous container to release its
/// reserved address before it gives up and takes a fresh one. Long enough for a runtime to run
/// the old sandbox's DEL after a force delete (seconds), short enough that a sandbox whose DEL
/// never comes delays the pod only by a couple of kubelet retries.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(120);

/// The CNI error code of [`Outcome::RetryLater`] ("try again later", CNI spec 0.4.0+).
pub const TRY_AGAIN_LATER_CODE: u32 = 11;

/// What the decision needs to know about a configured range set.
pub trait RangeSetView {
    /// Whether `ip` lies inside one of the set's ranges.
    fn contains(&self, ip: IpAddr) -> bool;

    /// Why `ip`, inside one of the set's subnets, can never be handed out (the network or
    /// broadcast address, outside `rangeStart`–`rangeEnd`, a range's gateway), as words that
    /// follow "reserved address `<ip>` "; `None` when it can be, or lies in none of the subnets.
    fn why_unusable(&self, _ip: IpAddr) -> Option<String> {
        None
    }
}

/// Who holds an address in the network directory right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CurrentHolder {
    /// No file at the address: it can be taken.
    Free,
    /// An allocation file of a container; `pod` is what the plugin's side index recorded for it
    /// (`None` for containers allocated by host-local or without `K8S_POD_*` arguments).
    Container {
        /// The container ID in the allocation file.
        container_id: String,
        /// The pod the container belonged to, if known.
        pod: Option<PodKey>,
    },
    /// Something that is not an allocation file (a directory, a symlink, unreadable bytes): it
    /// blocks the address, and nobody can say for how long.
    Foreign,
}

/// "The pod's previous container still held its address when first seen at `since`": the
/// plugin keeps no memory across runs, so this record on disk is what makes the grace period
/// measurable. It is keyed by pod (a retried ADD comes with a new sandbox ID) and names the
/// holder, so a different stale container starts a new wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitMarker {
    /// The container that held the reserved address.
    pub holder: String,
    /// When an ADD first found it holding the address.
    pub since: Timestamp,
}

/// "Does an active reservation of another pod hold this address?" — answered by
/// [`ActiveReservations`] (built from files) or by the on-disk snapshot without decoding it
/// ([`crate::snapshot::SnapshotLookup`]).
pub trait ReservationLookup {
    /// A pod other than `me` whose active reservation holds `ip`.
    fn held_for_other(&self, ip: IpAddr, me: Option<&PodKey>) -> Option<PodKey>;

    /// Whether normal allocation for `me` must skip `ip`.
    fn is_blocked(&self, ip: IpAddr, me: Option<&PodKey>) -> bool {
        self.held_for_other(ip, me).is_some()
    }

    /// Whether any active reservation holds `ip` (GC keeps such addresses).
    fn is_reserved(&self, ip: IpAddr) -> bool {
        self.held_for_other(ip, None).is_some()
    }
}

/// The node's active reservations by address, built from decoded files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ActiveReservations {
    /// Usually one owner per address; more only if reservations conflict.
    by_ip: HashMap<IpAddr, Vec<PodKey>>,
}

impl ActiveReservations {
    /// The addresses of every reservation active at `now`.
    pub fn new<'a>(files: impl IntoIterator<Item = &'a ReservationFile>, now: Timestamp) -> Self {
        let mut by_ip: HashMap<IpAddr, Vec<PodKey>> = HashMap::new();
        for file in files.into_iter().filter(|f| f.is_active(now)) {
            // Names that are not valid are no reservation (reading a file checks them).
            let Ok(key) = file.pod_key() else {
                continue;
            };
            for ip in &file.ips {
                by_ip
                    .entry(ip.to_canonical())
                    .or_default()
                    .push(key.clone());
            }
        }
        Self { by_ip }
    }

    /// How many distinct addresses are held.
    pub fn len(&self) -> usize {
        self.by_ip.len()
    }

    /// Whether no address is held.
    pub fn is_empty(&self) -> bool {
        self.by_ip.is_empty()
    }
}

impl ReservationLookup for ActiveReservations {
    fn held_for_other(&self, ip: IpAddr, me: Option<&PodKey>) -> Option<PodKey> {
        self.by_ip
            .get(&ip.to_canonical())?
            .iter()
            .find(|owner| Some(*owner) != me)
            .cloned()
    }
}

/// Everything [`decide`] looks at.
#[derive(Clone, Copy)]
pub struct DecisionInput<'a, R> {
    /// The configured range sets, in rangeID order.
    pub range_sets: &'a [R],
    /// Requested addresses (`IP=`, `args.cni.ips`, `runtimeConfig.ips`), canonical.
    pub requested: &'a [IpAddr],
    /// The ADD's container ID.
    pub container_id: &'a str,
    /// The pod from `K8S_POD_NAMESPACE` / `K8S_POD_NAME`, if the runtime sent them.
    pub pod: Option<&'a PodKey>,
    /// The pod's reservation file, if present (active or not).
    pub own: Option<&'a ReservationFile>,
    /// Every active reservation on the node (the pod's own included; it is told apart by key).
    pub others: &'a dyn ReservationLookup,
    /// Who holds an address now.
    pub holder: &'a dyn Fn(IpAddr) -> CurrentHolder,
    /// The pod's wait record from an earlier ADD, if any.
    pub wait_marker: Option<&'a WaitMarker>,
    /// The current time.
    pub now: Timestamp,
    /// How long to wait for the pod's previous container, usually [`DEFAULT_GRACE`].
    pub grace: Duration,
}

impl<R> fmt::Debug for DecisionInput<'_, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DecisionInput")
            .field("range_sets", &self.range_sets.len())
            .field("requested", &self.requested)
            .field("container_id", &self.container_id)
            .field("pod", &self.pod)
            .field("own", &self.own)
            .field("wait_marker", &self.wait_marker)
            .field("now", &self.now)
            .field("grace", &self.grace)
            .finish_non_exhaustive()
    }
}

/// What to do for one range set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeSetPlan {
    /// Return exactly this address (it is the pod's, and free).
    Reserved(IpAddr),
    /// A requested address lies in this set: the usual requested-IP handling applies.
    Requested,
    /// Allocate as host-local does, skipping addresses [`ReservationLookup::is_blocked`] says.
    Normal,
}

/// The outcome of the decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Allocate: one plan per range set, in order.
    Allocate(Vec<RangeSetPlan>),
    /// Answer CNI error 11: the pod's previous container still holds the reserved address.
    RetryLater(RetryLater),
    /// Refuse the ADD: a requested address is another pod's reserved address.
    RequestedIsReserved {
        /// The requested address.
        ip: IpAddr,
        /// The pod whose active reservation holds it.
        owner: PodKey,
    },
}

/// Details of a "try again later" answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryLater {
    /// The pod asking.
    pub pod: PodKey,
    /// Its reserved address.
    pub ip: IpAddr,
    /// The previous container still holding it.
    pub holder: String,
    /// How long ADDs have been waiting for it.
    pub waited: Duration,
    /// The grace period.
    pub grace: Duration,
}

impl fmt::Display for RetryLater {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "reserved address {} of pod {} is still held by its previous container {} (waited {}s of {}s); try again later",
            self.ip,
            self.pod,
            self.holder,
            self.waited.as_secs(),
            self.grace.as_secs()
        )
    }
}

/// What to do with the pod's wait record after the decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkerAction {
    /// Leave it as it is (or absent).
    Keep,
    /// Write this record (a wait starts).
    Write(WaitMarker),
    /// Delete it (the wait is over).
    Remove,
}

/// A reason to log: why a reservation was not honoured (fully or at all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// The reservation's `releaseTime` has passed.
    Expired {
        /// When it expired.
        release_time: Timestamp,
    },
    /// The address lies outside every configured range set.
    OutsideRanges {
        /// The reserved address.
        ip: IpAddr,
    },
    /// The address is in a configured subnet but can never be handed out.
    Unusable {
        /// The reserved address.
        ip: IpAddr,
        /// Why, e.g. "is the gateway of range 10.1.0.1-10.1.0.254".
        reason: String,
    },
    /// A requested address in the same range set wins over the reserved one.
    RequestedWins {
        /// The reserved address not used.
        ip: IpAddr,
        /// The range set.
        range_set: usize,
    },
    /// A second reserved address in a range set that already got one.
    SecondInRangeSet {
        /// The extra address.
        ip: IpAddr,
        /// The range set.
        range_set: usize,
    },
    /// Another pod's active reservation claims the same address: neither gets it.
    AlsoReservedBy {
        /// The address.
        ip: IpAddr,
        /// The other pod.
        other: PodKey,
    },
    /// A container of another (or an unknown) pod holds the address; it is never taken away.
    HeldByOtherPod {
        /// The address.
        ip: IpAddr,
        /// The holding container.
        container_id: String,
        /// Its pod, if known.
        pod: Option<PodKey>,
    },
    /// Something that is not an allocation file occupies the address's name.
    HeldByForeignEntry {
        /// The address.
        ip: IpAddr,
    },
    /// The pod's previous container held the address longer than the grace period.
    GraceExpired {
        /// The address.
        ip: IpAddr,
        /// The holding container.
        container_id: String,
        /// How long ADDs waited.
        waited: Duration,
    },
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::Expired { release_time } => {
                write!(f, "reservation expired at {release_time}; ignored")
            }
            Note::OutsideRanges { ip } => write!(
                f,
                "reserved address {ip} is outside every configured range (another node's, or the ranges changed); ignored"
            ),
            Note::Unusable { ip, reason } => {
                write!(f, "reserved address {ip} {reason}; ignored")
            }
            Note::RequestedWins { ip, range_set } => write!(
                f,
                "a requested address takes precedence over reserved address {ip} in range set {range_set}"
            ),
            Note::SecondInRangeSet { ip, range_set } => write!(
                f,
                "reserved address {ip} is a second address for range set {range_set}; ignored"
            ),
            Note::AlsoReservedBy { ip, other } => write!(
                f,
                "reserved address {ip} is also reserved by pod {other}; allocating a fresh address"
            ),
            Note::HeldByOtherPod {
                ip,
                container_id,
                pod: Some(pod),
            } => write!(
                f,
                "reserved address {ip} is in use by container {container_id} of pod {pod}; allocating a fresh address"
            ),
            Note::HeldByOtherPod {
                ip,
                container_id,
                pod: None,
            } => write!(
                f,
                "reserved address {ip} is in use by container {container_id} of an unknown pod; allocating a fresh address"
            ),
            Note::HeldByForeignEntry { ip } => write!(
                f,
                "reserved address {ip} is blocked by an entry that is not an allocation; allocating a fresh address"
            ),
            Note::GraceExpired {
                ip,
                container_id,
                waited,
            } => write!(
                f,
                "reserved address {ip} is still held by the pod's previous container {container_id} after {}s; allocating a fresh address",
                waited.as_secs()
            ),
        }
    }
}

/// The decision and what to log and record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// What the ADD does.
    pub outcome: Outcome,
    /// Reasons to log (stderr / the plugin's log), in the order found.
    pub notes: Vec<Note>,
    /// What to do with the pod's wait record.
    pub marker: MarkerAction,
}

/// Decides, per range set, between the pod's reserved address and normal allocation.
///
/// Rules, in order:
/// 1. A requested address held by another pod's active reservation refuses the ADD.
/// 2. A range set containing a requested address follows the requested-address rules.
/// 3. Otherwise, if the pod has an active reservation with an address in the set: the address
///    is returned when free (or already this container's — the allocator then reports the
///    duplicate as host-local does); if the pod's previous container holds it, the ADD is
///    answered "try again later" until that has lasted `grace`, then a fresh address is taken;
///    any other holder (another pod, an unknown pod, a foreign entry) or a conflicting
///    reservation of another pod means a fresh address. Every such fallback is noted.
/// 4. Every other set allocates normally, skipping other pods' reserved addresses.
pub fn decide<R: RangeSetView>(input: &DecisionInput<'_, R>) -> Decision {
    let me = input.pod;
    let keep = |outcome, notes| Decision {
        outcome,
        notes,
        marker: MarkerAction::Keep,
    };
    for &ip in input.requested {
        if let Some(owner) = input.others.held_for_other(ip, me) {
            return keep(Outcome::RequestedIsReserved { ip, owner }, Vec::new());
        }
    }

    let mut notes = Vec::new();
    let own = match (me, input.own) {
        (Some(_), Some(file)) if file.is_active(input.now) => Some(file),
        (Some(_), Some(file)) => {
            if let Some(release_time) = file.release_time {
                notes.push(Note::Expired { release_time });
            }
            None
        }
        _ => None,
    };
    let reserved: &[IpAddr] = own.map_or(&[], |file| &file.ips);

    let mut plans = Vec::with_capacity(input.range_sets.len());
    let mut grace_expired = false;
    for (index, set) in input.range_sets.iter().enumerate() {
        let mut in_set = reserved
            .iter()
            .copied()
            .filter(|ip| set.contains(*ip) && set.why_unusable(*ip).is_none());
        let first = in_set.next();
        for extra in in_set {
            notes.push(Note::SecondInRangeSet {
                ip: extra,
                range_set: index,
            });
        }
        if input.requested.iter().any(|ip| set.contains(*ip)) {
            if let Some(ip) = first.filter(|ip| !input.requested.contains(ip)) {
                notes.push(Note::RequestedWins {
                    ip,
                    range_set: index,
                });
            }
            plans.push(RangeSetPlan::Requested);
            continue;
        }
        let Some(ip) = first else {
            plans.push(RangeSetPlan::Normal);
            continue;
        };
        if let Some(other) = input.others.held_for_other(ip, me) {
            notes.push(Note::AlsoReservedBy { ip, other });
            plans.push(RangeSetPlan::Normal);
            continue;
        }
        match (input.holder)(ip) {
            CurrentHolder::Free => plans.push(RangeSetPlan::Reserved(ip)),
            CurrentHolder::Container { container_id, .. } if container_id == input.container_id => {
                plans.push(RangeSetPlan::Reserved(ip));
            }
            CurrentHolder::Container {
                container_id,
                pod: Some(pod),
            } if Some(&pod) == me => {
                // A marker from the future means the clock stepped back since it was written;
                // trusting it would make the pod wait until the clock catches up, not `grace`.
                let since = match input.wait_marker {
                    Some(marker) if marker.holder == container_id && marker.since <= input.now => {
                        marker.since
                    }
                    _ => input.now,
                };
                let waited = input.now.saturating_duration_since(since);
                if waited < input.grace {
                    let marker = WaitMarker {
                        holder: container_id.clone(),
                        since,
                    };
                    let action = if input.wait_marker == Some(&marker) {
                        MarkerAction::Keep
                    } else {
                        MarkerAction::Write(marker)
                    };
                    return Decision {
                        outcome: Outcome::RetryLater(RetryLater {
                            pod,
                            ip,
                            holder: container_id,
                            waited,
                            grace: input.grace,
                        }),
                        notes,
                        marker: action,
                    };
                }
                grace_expired = true;
                notes.push(Note::GraceExpired {
                    ip,
                    container_id,
                    waited,
                });
                plans.push(RangeSetPlan::Normal);
            }
            CurrentHolder::Container { container_id, pod } => {
                notes.push(Note::HeldByOtherPod {
                    ip,
                    container_id,
                    pod,
                });
                plans.push(RangeSetPlan::Normal);
            }
            CurrentHolder::Foreign => {
                notes.push(Note::HeldByForeignEntry { ip });
                plans.push(RangeSetPlan::Normal);
            }
        }
    }
    for &ip in reserved {
        if let Some(reason) = input.range_sets.iter().find_map(|set| set.why_unusable(ip)) {
            notes.push(Note::Unusable { ip, reason });
        } else if !input.range_sets.iter().any(|set| set.contains(ip)) {
            notes.push(Note::OutsideRanges { ip });
        }
    }
    // After giving up on a stale holder the record stays, so the pod's next ADDs do not wait
    // for the same container again; any other end of a wait removes it.
    let marker = if grace_expired || input.wait_marker.is_none() {
        MarkerAction::Keep
    } else {
        MarkerAction::Remove
    };
    Decision {
        outcome: Outcome::Allocate(plans),
        notes,
        marker,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A range set of one CIDR.
    struct Cidr(IpAddr, u8);

    impl RangeSetView for Cidr {
        fn contains(&self, ip: IpAddr) -> bool {
            match (self.0, ip) {
                (IpAddr::V4(net), IpAddr::V4(ip)) => {
                    let mask = u32::MAX.checked_shl(32 - u32::from(self.1)).unwrap_or(0);
                    u32::from(net) & mask == u32::from(ip) & mask
                }
                (IpAddr::V6(net), IpAddr::V6(ip)) => {
                    let mask = u128::MAX.checked_shl(128 - u32::from(self.1)).unwrap_or(0);
                    u128::from(net) & mask == u128::from(ip) & mask
                }
                _ => false,
            }
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn key(ns: &str, pod: &str) -> PodKey {
        PodKey::new(ns, pod).unwrap()
    }

    const NOW: i64 = 1_795_262_400;

    fn at(offset_secs: i64) -> Timestamp {
        Timestamp::from_unix_secs(NOW + offset_secs)
    }

    fn reservation(ns: &str, pod: &str, ips: &[&str], release: Option<i64>) -> ReservationFile {
        ReservationFile {
            version: 1,
            namespace: ns.into(),
            pod: pod.into(),
            ips: ips.iter().map(|s| ip(s)).collect(),
            release_time: release.map(at),
            uid: format!("uid-{pod}"),
            node_name: None,
            generation: None,
            retain_for_seconds: None,
        }
    }

    fn held(container: &str, pod: Option<(&str, &str)>) -> CurrentHolder {
        CurrentHolder::Container {
            container_id: container.into(),
            pod: pod.map(|(ns, p)| key(ns, p)),
        }
    }

    /// One table row: the facts and the expected decision.
    struct Case {
        name: &'static str,
        dual_stack: bool,
        requested: Vec<&'static str>,
        /// The ADD's pod (always db/web-0 unless `None`).
        has_pod: bool,
        own: Option<ReservationFile>,
        others: Vec<ReservationFile>,
        holders: Vec<(&'static str, CurrentHolder)>,
        marker: Option<WaitMarker>,
        expect: Outcome,
        notes: Vec<Note>,
        marker_action: MarkerAction,
    }

    fn base(name: &'static str) -> Case {
        Case {
            name,
            dual_stack: false,
            requested: vec![],
            has_pod: true,
            own: None,
            others: vec![],
            holders: vec![],
            marker: None,
            expect: Outcome::Allocate(vec![RangeSetPlan::Normal]),
            notes: vec![],
            marker_action: MarkerAction::Keep,
        }
    }

    /// "Try again later": `address` of db/web-0 is still held by `old-sandbox`, waited so far.
    fn retry_later(address: &str, waited_secs: u64) -> Outcome {
        Outcome::RetryLater(RetryLater {
            pod: key("db", "web-0"),
            ip: ip(address),
            holder: "old-sandbox".into(),
            waited: Duration::from_secs(waited_secs),
            grace: DEFAULT_GRACE,
        })
    }

    /// The wait for `old-sandbox` starts now.
    fn start_waiting() -> MarkerAction {
        MarkerAction::Write(WaitMarker {
            holder: "old-sandbox".into(),
            since: at(0),
        })
    }

    fn run(case: &Case) -> Decision {
        let mut sets = vec![Cidr(ip("10.1.0.0"), 24)];
        if case.dual_stack {
            sets.push(Cidr(ip("fd00::"), 64));
        }
        let requested: Vec<IpAddr> = case.requested.iter().map(|s| ip(s)).collect();
        let me = key("db", "web-0");
        let mut all: Vec<&ReservationFile> = case.others.iter().collect();
        all.extend(case.own.iter());
        let active = ActiveReservations::new(all, at(0));
        let holders: HashMap<IpAddr, CurrentHolder> = case
            .holders
            .iter()
            .map(|(a, h)| (ip(a), h.clone()))
            .collect();
        let holder = move |a: IpAddr| holders.get(&a).cloned().unwrap_or(CurrentHolder::Free);
        decide(&DecisionInput {
            range_sets: &sets,
            requested: &requested,
            container_id: "new-sandbox",
            pod: case.has_pod.then_some(&me),
            own: case.own.as_ref(),
            others: &active,
            holder: &holder,
            wait_marker: case.marker.as_ref(),
            now: at(0),
            grace: DEFAULT_GRACE,
        })
    }

    #[test]
    fn decision_table() {
        use RangeSetPlan::{Normal, Requested, Reserved};
        let own_v4 = || Some(reservation("db", "web-0", &["10.1.0.7"], None));
        let own_dual = || Some(reservation("db", "web-0", &["10.1.0.7", "fd00::7"], None));
        let same_pod = || held("old-sandbox", Some(("db", "web-0")));
        let cases = vec![
            base("no reservation: normal allocation"),
            Case {
                has_pod: false,
                ..base("no pod arguments: normal allocation")
            },
            Case {
                own: own_v4(),
                expect: Outcome::Allocate(vec![Reserved(ip("10.1.0.7"))]),
                ..base("bound reservation (null releaseTime), address free")
            },
            Case {
                own: Some(reservation("db", "web-0", &["10.1.0.7"], Some(60))),
                expect: Outcome::Allocate(vec![Reserved(ip("10.1.0.7"))]),
                ..base("released, now before releaseTime")
            },
            Case {
                own: Some(reservation("db", "web-0", &["10.1.0.7"], Some(0))),
                notes: vec![Note::Expired {
                    release_time: at(0),
                }],
                ..base("released, now exactly at releaseTime: expired")
            },
            Case {
                own: Some(reservation("db", "web-0", &["10.1.0.7"], Some(-1))),
                notes: vec![Note::Expired {
                    release_time: at(-1),
                }],
                ..base("released, now after releaseTime: expired")
            },
            Case {
                dual_stack: true,
                own: own_dual(),
                expect: Outcome::Allocate(vec![Reserved(ip("10.1.0.7")), Reserved(ip("fd00::7"))]),
                ..base("dual-stack: both reserved")
            },
            Case {
                dual_stack: true,
                own: own_v4(),
                expect: Outcome::Allocate(vec![Reserved(ip("10.1.0.7")), Normal]),
                ..base("dual-stack: a set with no reserved address allocates normally")
            },
            Case {
                own: Some(reservation("db", "web-0", &["10.9.0.7"], None)),
                notes: vec![Note::OutsideRanges { ip: ip("10.9.0.7") }],
                ..base("reserved address outside every range: ignored and noted")
            },
            Case {
                dual_stack: true,
                own: Some(reservation("db", "web-0", &["10.9.0.7", "fd00::7"], None)),
                expect: Outcome::Allocate(vec![Normal, Reserved(ip("fd00::7"))]),
                notes: vec![Note::OutsideRanges { ip: ip("10.9.0.7") }],
                ..base("dual-stack: one outside the ranges, the other honoured")
            },
            Case {
                own: Some(reservation("db", "web-0", &["10.1.0.7", "10.1.0.8"], None)),
                expect: Outcome::Allocate(vec![Reserved(ip("10.1.0.7"))]),
                notes: vec![Note::SecondInRangeSet {
                    ip: ip("10.1.0.8"),
                    range_set: 0,
                }],
                ..base("two reserved addresses in one range set: the first is used")
            },
            Case {
                requested: vec!["10.1.0.9"],
                own: own_v4(),
                expect: Outcome::Allocate(vec![Requested]),
                notes: vec![Note::RequestedWins {
                    ip: ip("10.1.0.7"),
                    range_set: 0,
                }],
                ..base("requested address takes precedence over the reserved one")
            },
            Case {
                requested: vec!["10.1.0.7"],
                own: own_v4(),
                expect: Outcome::Allocate(vec![Requested]),
                ..base("requesting the own reserved address is fine")
            },
            Case {
                dual_stack: true,
                requested: vec!["fd00::9"],
                own: own_dual(),
                expect: Outcome::Allocate(vec![Reserved(ip("10.1.0.7")), Requested]),
                notes: vec![Note::RequestedWins {
                    ip: ip("fd00::7"),
                    range_set: 1,
                }],
                ..base("dual-stack: requested v6, reserved v4")
            },
            Case {
                requested: vec!["10.1.0.5"],
                others: vec![reservation("db", "web-1", &["10.1.0.5"], None)],
                expect: Outcome::RequestedIsReserved {
                    ip: ip("10.1.0.5"),
                    owner: key("db", "web-1"),
                },
                ..base("requested address held by another pod's active reservation: refused")
            },
            Case {
                requested: vec!["10.1.0.5"],
                others: vec![reservation("db", "web-1", &["10.1.0.5"], Some(60))],
                expect: Outcome::RequestedIsReserved {
                    ip: ip("10.1.0.5"),
                    owner: key("db", "web-1"),
                },
                ..base("requested address of a released, unexpired reservation: refused")
            },
            Case {
                requested: vec!["10.1.0.5"],
                others: vec![reservation("db", "web-1", &["10.1.0.5"], Some(-5))],
                expect: Outcome::Allocate(vec![Requested]),
                ..base("requested address of an expired reservation: allowed")
            },
            Case {
                has_pod: false,
                requested: vec!["10.1.0.5"],
                others: vec![reservation("db", "web-1", &["10.1.0.5"], None)],
                expect: Outcome::RequestedIsReserved {
                    ip: ip("10.1.0.5"),
                    owner: key("db", "web-1"),
                },
                ..base("no pod arguments: every reservation counts as another pod's")
            },
            Case {
                own: own_v4(),
                others: vec![reservation("db", "web-1", &["10.1.0.7"], None)],
                notes: vec![Note::AlsoReservedBy {
                    ip: ip("10.1.0.7"),
                    other: key("db", "web-1"),
                }],
                ..base("conflicting reservations: neither pod gets the address")
            },
            Case {
                own: own_v4(),
                others: vec![reservation("db", "web-1", &["10.1.0.7"], Some(-1))],
                expect: Outcome::Allocate(vec![Reserved(ip("10.1.0.7"))]),
                ..base("the other, conflicting reservation has expired")
            },
            Case {
                own: own_v4(),
                holders: vec![("10.1.0.7", held("c9", Some(("other", "x"))))],
                notes: vec![Note::HeldByOtherPod {
                    ip: ip("10.1.0.7"),
                    container_id: "c9".into(),
                    pod: Some(key("other", "x")),
                }],
                ..base("held by another pod's container: never taken, fresh address")
            },
            Case {
                own: own_v4(),
                holders: vec![("10.1.0.7", held("c9", None))],
                notes: vec![Note::HeldByOtherPod {
                    ip: ip("10.1.0.7"),
                    container_id: "c9".into(),
                    pod: None,
                }],
                ..base("held by a container of an unknown pod (host-local's): fresh address")
            },
            Case {
                own: own_v4(),
                holders: vec![("10.1.0.7", CurrentHolder::Foreign)],
                notes: vec![Note::HeldByForeignEntry { ip: ip("10.1.0.7") }],
                ..base("a foreign entry at the address: fresh address")
            },
            Case {
                own: own_v4(),
                holders: vec![("10.1.0.7", held("new-sandbox", Some(("db", "web-0"))))],
                expect: Outcome::Allocate(vec![Reserved(ip("10.1.0.7"))]),
                ..base("already this container's: the allocator reports the duplicate")
            },
            Case {
                own: own_v4(),
                holders: vec![("10.1.0.7", same_pod())],
                expect: retry_later("10.1.0.7", 0),
                marker_action: start_waiting(),
                ..base("same pod's previous container, first time: try again later, start waiting")
            },
            Case {
                own: own_v4(),
                holders: vec![("10.1.0.7", same_pod())],
                marker: Some(WaitMarker {
                    holder: "old-sandbox".into(),
                    since: at(-30),
                }),
                expect: retry_later("10.1.0.7", 30),
                ..base("same pod's previous container, within grace: try again later")
            },
            Case {
                own: own_v4(),
                holders: vec![("10.1.0.7", same_pod())],
                marker: Some(WaitMarker {
                    holder: "older-sandbox".into(),
                    since: at(-300),
                }),
                expect: retry_later("10.1.0.7", 0),
                marker_action: start_waiting(),
                ..base("a marker for another holder restarts the wait")
            },
            Case {
                own: own_v4(),
                holders: vec![("10.1.0.7", same_pod())],
                marker: Some(WaitMarker {
                    holder: "old-sandbox".into(),
                    since: at(-120),
                }),
                notes: vec![Note::GraceExpired {
                    ip: ip("10.1.0.7"),
                    container_id: "old-sandbox".into(),
                    waited: Duration::from_secs(120),
                }],
                ..base("same pod's previous container past grace: fresh address, marker kept")
            },
            Case {
                own: own_v4(),
                holders: vec![("10.1.0.7", same_pod())],
                marker: Some(WaitMarker {
                    holder: "old-sandbox".into(),
                    since: at(86_400),
                }),
                expect: retry_later("10.1.0.7", 0),
                marker_action: start_waiting(),
                ..base("a marker from the future (the clock stepped back) restarts the wait now")
            },
            Case {
                own: own_v4(),
                marker: Some(WaitMarker {
                    holder: "old-sandbox".into(),
                    since: at(-30),
                }),
                expect: Outcome::Allocate(vec![Reserved(ip("10.1.0.7"))]),
                marker_action: MarkerAction::Remove,
                ..base("the old container let go: reserved address, marker removed")
            },
            Case {
                dual_stack: true,
                own: own_dual(),
                holders: vec![("fd00::7", same_pod())],
                expect: retry_later("fd00::7", 0),
                marker_action: start_waiting(),
                ..base("dual-stack: one family still held by the old container → retry whole ADD")
            },
        ];
        for case in &cases {
            let got = run(case);
            let want = Decision {
                outcome: case.expect.clone(),
                notes: case.notes.clone(),
                marker: case.marker_action.clone(),
            };
            assert_eq!(got, want, "case: {}", case.name);
        }
    }

    #[test]
    fn normal_allocation_skips_only_other_pods_active_reservations() {
        let files = [
            reservation("db", "web-0", &["10.1.0.7", "fd00::7"], None),
            reservation("db", "web-1", &["10.1.0.8"], Some(10)),
            reservation("db", "web-2", &["10.1.0.9"], Some(-10)),
        ];
        let active = ActiveReservations::new(&files, at(0));
        let me = key("db", "web-0");
        let cases: &[(&str, Option<&PodKey>, bool)] = &[
            ("10.1.0.7", Some(&me), false),
            ("fd00::7", Some(&me), false),
            ("10.1.0.7", None, true),
            ("::ffff:10.1.0.7", None, true),
            ("10.1.0.8", Some(&me), true),
            ("10.1.0.8", None, true),
            ("10.1.0.9", Some(&me), false),
            ("10.1.0.10", Some(&me), false),
        ];
        for &(addr, who, blocked) in cases {
            assert_eq!(
                active.is_blocked(ip(addr), who),
                blocked,
                "{addr} for {who:?}"
            );
        }
        assert!(active.is_reserved(ip("10.1.0.7")));
        assert!(!active.is_reserved(ip("10.1.0.9")), "expired holds nothing");
        assert_eq!(active.len(), 3);
        // Once web-1's reservation expires it holds nothing either.
        let later = ActiveReservations::new(&files, at(10));
        assert!(!later.is_blocked(ip("10.1.0.8"), Some(&me)));
    }

    #[test]
    fn messages_say_why() {
        let retry = RetryLater {
            pod: key("db", "web-0"),
            ip: ip("10.1.0.7"),
            holder: "abc".into(),
            waited: Duration::from_secs(30),
            grace: DEFAULT_GRACE,
        };
        assert_eq!(
            retry.to_string(),
            "reserved address 10.1.0.7 of pod db/web-0 is still held by its previous container abc (waited 30s of 120s); try again later"
        );
        let note = Note::OutsideRanges { ip: ip("10.9.0.7") };
        assert!(note.to_string().contains("outside every configured range"));
        let note = Note::HeldByOtherPod {
            ip: ip("10.1.0.7"),
            container_id: "c9".into(),
            pod: Some(key("other", "x")),
        };
        assert!(
            note.to_string().contains("container c9 of pod other/x"),
            "{note}"
        );
    }
}
