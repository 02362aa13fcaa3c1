//! The reservation step of ADD and STATUS: gathers the facts the pure [`decide`] needs from the
//! locked network directory, applies its wait-marker action, and turns its outcome into a plan
//! per range set or a CNI error. Everything it has to say goes to stderr as one line each,
//! `ipkeep: <network>: …`; with no `reserved/` directory it reads nothing more and says nothing,
//! so a node without reservations behaves (and logs) exactly like host-local.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use ipkeep_hostlocal::config::IpamConfig;
use ipkeep_hostlocal::{DiskStore, Occupant};
use ipkeep_netdir::NetworkDir;
use ipkeep_reservation::add::{
    CurrentHolder, DecisionInput, MarkerAction, Outcome, RESERVED_DIR, RangeSetPlan,
    ReservationLookup, ReservationSnapshot, TRY_AGAIN_LATER_CODE, decide, load_reservations_at,
    prune_wait_markers, read_wait_marker, remove_wait_marker, write_wait_marker,
};
use ipkeep_reservation::{PodKey, ReservationFile, Source, Timestamp, read_reservation};

use super::CniError;

/// The lines of one command's reservation step, each prefixed with the network name.
#[derive(Debug)]
pub(super) struct ReservationLog {
    prefix: String,
    lines: Vec<String>,
}

impl ReservationLog {
    /// An empty log for `network`.
    pub(super) fn new(network: &str) -> Self {
        Self {
            prefix: format!("ipkeep: {network}: "),
            lines: Vec::new(),
        }
    }

    /// Adds one line. Control characters are escaped: pod names from `CNI_ARGS` and file names
    /// found on disk end up here, and a newline, carriage return or terminal escape in them
    /// must not split the line or forge another in the runtime's log.
    pub(super) fn line(&mut self, text: impl std::fmt::Display) {
        let line = ipkeep_reservation::private_state::escape_control(&text.to_string());
        self.lines.push(format!("{}{line}", self.prefix));
    }

    /// Adds several lines.
    pub(super) fn lines(&mut self, lines: Vec<String>) {
        for line in lines {
            self.line(line);
        }
    }

    /// The lines, in order.
    pub(super) fn into_lines(self) -> Vec<String> {
        self.lines
    }
}

/// The node's reservations as one command sees them: `None` when there is no `reserved/`.
pub(super) struct Reservations {
    snapshot: Option<ReservationSnapshot>,
    now: Timestamp,
}

impl Reservations {
    /// Loads the snapshot under the store's lock and reports the garbage it skipped.
    pub(super) fn load(
        dir: &NetworkDir,
        store: &DiskStore<'_>,
        now: Timestamp,
        log: &mut ReservationLog,
    ) -> Self {
        let mut found = Vec::new();
        let (snapshot, source) = load_reservations_at(dir, store.lock(), now, &mut found);
        log.lines(found);
        if source == Source::NoReservations {
            return Self {
                snapshot: None,
                now,
            };
        }
        for skipped in snapshot.skipped() {
            log.line(format_args!(
                "skipped {}: {}",
                skipped.path.display(),
                skipped.reason
            ));
        }
        Self {
            snapshot: Some(snapshot),
            now,
        }
    }

    /// Whether an active reservation of a pod other than `me` holds `ip`.
    pub(super) fn is_blocked(&self, ip: IpAddr, me: Option<&PodKey>) -> bool {
        self.snapshot
            .as_ref()
            .is_some_and(|s| s.lookup(self.now).is_blocked(ip, me))
    }
}

/// What ADD does per range set after the reservation decision.
pub(super) struct AddPlan {
    /// The pod of the ADD, when `CNI_ARGS` named a valid one.
    pub(super) me: Option<PodKey>,
    /// The pod's reserved address per range set (the allocator's preferred address).
    pub(super) preferred: Vec<Option<IpAddr>>,
    /// The node's reservations (for the allocator's `is_blocked`).
    pub(super) reservations: Reservations,
}

impl AddPlan {
    /// Whether normal allocation must skip `ip` for this pod.
    pub(super) fn is_blocked(&self, ip: IpAddr) -> bool {
        self.reservations.is_blocked(ip, self.me.as_ref())
    }
}

/// The facts of one ADD that [`plan_add`] does not read itself.
pub(super) struct AddFacts<'a> {
    /// The configuration.
    pub(super) conf: &'a IpamConfig,
    /// `CNI_CONTAINERID`.
    pub(super) container_id: &'a str,
    /// Requested addresses, de-duplicated.
    pub(super) requested: &'a [IpAddr],
    /// The current time.
    pub(super) now: Timestamp,
    /// The grace period for the pod's previous container.
    pub(super) grace: Duration,
}

/// The pod named by `K8S_POD_NAMESPACE` / `K8S_POD_NAME`, when both are valid Kubernetes names.
fn pod_key(conf: &IpamConfig, log: &mut ReservationLog) -> Option<PodKey> {
    let (Some(namespace), Some(name)) = (&conf.args.pod_namespace, &conf.args.pod_name) else {
        return None;
    };
    match PodKey::new(namespace, name) {
        Ok(key) => Some(key),
        Err(e) => {
            log.line(format_args!(
                "pod {namespace}/{name} has no valid Kubernetes name ({e}); its reservation is not consulted"
            ));
            None
        }
    }
}

/// Who holds each of the reservation's addresses (the only addresses [`decide`] asks about).
fn holders_of(
    store: &mut DiskStore<'_>,
    own: Option<&ReservationFile>,
) -> HashMap<IpAddr, CurrentHolder> {
    let mut holders = HashMap::new();
    for &ip in own.map_or(&[][..], |f| &f.ips) {
        let holder = match store.occupant(ip) {
            Ok(Occupant::Free) => CurrentHolder::Free,
            Ok(Occupant::Allocation { owner, pod }) => CurrentHolder::Container {
                container_id: owner.container_id().to_owned(),
                pod,
            },
            // Unreadable counts as occupied: the exclusive create decides in the end anyway.
            Ok(Occupant::Other) | Err(_) => CurrentHolder::Foreign,
        };
        holders.insert(ip, holder);
    }
    holders
}

/// Runs the reservation decision of an ADD: `Ok` with the plan, or the CNI error to answer
/// (code 11 while the pod's previous container holds its address, 999 when a requested address
/// is another pod's reserved one).
pub(super) fn plan_add(
    dir: &NetworkDir,
    store: &mut DiskStore<'_>,
    facts: &AddFacts<'_>,
    log: &mut ReservationLog,
) -> Result<AddPlan, CniError> {
    let sets = facts.conf.range_sets.len();
    let reservations = Reservations::load(dir, store, facts.now, log);
    let Some(snapshot) = &reservations.snapshot else {
        return Ok(AddPlan {
            me: None,
            preferred: vec![None; sets],
            reservations,
        });
    };
    let me = pod_key(facts.conf, log);
    let own = me.as_ref().and_then(|me| {
        read_reservation(dir, me.namespace(), me.name()).unwrap_or_else(|e| {
            log.line(format_args!("ignoring the reservation of pod {me}: {e}"));
            None
        })
    });
    let mut found = Vec::new();
    let marker = me
        .as_ref()
        .and_then(|me| read_wait_marker(dir, me, &mut found));
    let holders = holders_of(store, own.as_ref());
    // `decide` asks only about the reservation's own addresses, all looked up above.
    let holder = |ip: IpAddr| holders.get(&ip).cloned().unwrap_or(CurrentHolder::Foreign);
    let requested: Vec<IpAddr> = facts.requested.iter().map(|ip| ip.to_canonical()).collect();
    let lookup = snapshot.lookup(facts.now);
    let decision = decide(&DecisionInput {
        range_sets: &facts.conf.range_sets,
        requested: &requested,
        container_id: facts.container_id,
        pod: me.as_ref(),
        own: own.as_ref(),
        others: &lookup,
        holder: &holder,
        wait_marker: marker.as_ref(),
        now: facts.now,
        grace: facts.grace,
    });
    if let Some(me) = &me {
        let applied = match &decision.marker {
            MarkerAction::Keep => Ok(()),
            MarkerAction::Write(m) => write_wait_marker(dir, me, m, &mut found),
            MarkerAction::Remove => remove_wait_marker(dir, me),
        };
        log.lines(found);
        if let Err(e) = applied {
            log.line(format_args!(
                "failed to record the wait of pod {me} for its address: {e}"
            ));
        }
    }
    let who = me
        .as_ref()
        .map_or_else(String::new, |me| format!("pod {me}: "));
    for note in &decision.notes {
        log.line(format_args!("{who}{note}"));
    }
    match decision.outcome {
        Outcome::Allocate(plans) => {
            let preferred = plans
                .iter()
                .map(|plan| match plan {
                    RangeSetPlan::Reserved(ip) => Some(*ip),
                    RangeSetPlan::Requested | RangeSetPlan::Normal => None,
                })
                .collect();
            Ok(AddPlan {
                me,
                preferred,
                reservations,
            })
        }
        Outcome::RetryLater(retry) => {
            log.line(&retry);
            Err(CniError::new(TRY_AGAIN_LATER_CODE, retry.to_string()))
        }
        Outcome::RequestedIsReserved { ip, owner } => {
            let path = dir
                .path()
                .join(RESERVED_DIR)
                .join(owner.namespace())
                .join(owner.name());
            Err(CniError::internal(format!(
                "failed to allocate requested IP {ip}: it is reserved for pod {owner} by the active reservation {}",
                path.display()
            )))
        }
    }
}

/// GC's cleanup of wait markers: a marker outlives its use only when its pod never came back
/// after giving up on the old container, or its reservation went away meanwhile. Must run under
/// the network's lock (the caller's store holds it).
pub(super) fn prune_waits(dir: &NetworkDir, now: Timestamp, log: &mut ReservationLog) {
    let active = |pod: &PodKey| {
        read_reservation(dir, pod.namespace(), pod.name())
            .ok()
            .flatten()
            .is_some_and(|file| file.is_active(now))
    };
    let mut found = Vec::new();
    let pruned = prune_wait_markers(dir, &active, &mut found);
    log.lines(found);
    match pruned {
        Ok(pods) => {
            for pod in pods {
                log.line(format_args!(
                    "GC removed the wait marker of pod {pod}: it has no active reservation"
                ));
            }
        }
        Err(e) => log.line(format_args!("failed to prune wait markers: {e}")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::ReservationLog;

    #[test]
    fn log_lines_cannot_be_split_or_forged() {
        // Pod names from CNI_ARGS and file names found in reserved/ end up in these lines.
        let mut log = ReservationLog::new("net1");
        log.line("pod a\nb/c\rfake line\u{1b}[2J\tend");
        assert_eq!(
            log.into_lines(),
            vec!["ipkeep: net1: pod a\\nb/c\\rfake line\\u{1b}[2J\\tend".to_owned()]
        );
    }
}
