//! Released or lost: what the agent does with a reservation file whose IPReservation is gone.
//!
//! A reservation is *released* when someone decided it: the controller's expiry (its release time
//! came), an owner's cascade, a yielded budget, an opt-out, an admin's `kubectl delete ipr`. Every
//! one of them is a DELETE sent to the API server, which the agent's watch delivers as a deletion
//! of that object (uid). A reservation is *lost* when its object vanished and nobody decided it:
//!
//! * `kubectl delete crd ipreservations.ipkeep.dev`: kube-apiserver's CRD finalizer deletes every
//!   custom resource (a DELETE per namespace), and the watch delivers those deletions too — but
//!   while the CRD is terminating or already gone, which the agent reads before it believes one;
//! * an etcd restored from an older snapshot (and a Velero restore without some objects): no
//!   DELETE is ever sent; the object is missing from the next list;
//! * a DELETE while the agent was not watching (stopped, or a watch gap): the agent cannot tell
//!   it from the restore, and keeps the file (see [`fate`]: the safe side). A reservation that
//!   moved to another node meanwhile is no loss: the agent asks the API server for the object
//!   by name before it keeps a file it did not see deleted.
//!
//! A lost reservation's file stays and keeps protecting its addresses until it is recovered
//! (`ipkeep-operator recover` re-creates the object), released on purpose (recover, then delete
//! it), or its own release time passes. The rule is [`fate`], said once, table-tested below.

use std::net::IpAddr;

use ipkeep_reservation::{PodKey, Timestamp};

use super::desired::{Desired, Refusal};

/// The IPReservation CRD as the agent read it when it saw a deletion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrdState {
    /// The CRD exists and is not being deleted: a deletion is somebody's decision.
    Live,
    /// The CRD is terminating or gone: deletions are its finalizer's, nobody's decision about
    /// the reservation.
    Deleting,
    /// The CRD could not be read: decide on a later pass.
    Unknown,
}

/// How the agent learned that a file's IPReservation is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sighting {
    /// The watch delivered the deletion of the object (the file's uid), and the CRD was then as
    /// given.
    Deleted(CrdState),
    /// Not seen deleted, and the API server has the same object (uid) on another node: it moved
    /// with its pod while the agent was not watching.
    Elsewhere,
    /// Not seen deleted, and the API server has no such object: an etcd restore, or a delete
    /// while the agent was not watching.
    Vanished,
    /// Not seen deleted, and the API server could not be asked: decide on a later pass.
    Unasked,
}

/// Why a reservation counts as lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossCause {
    /// Deleted by the CRD's deletion.
    CrdDeleted,
    /// Absent without a deletion seen.
    Vanished,
}

impl LossCause {
    /// What happened, for people (Events, logs).
    pub fn explain(self) -> &'static str {
        match self {
            LossCause::CrdDeleted => {
                "deleted with the IPReservation CRD (kubectl delete crd), not released"
            }
            LossCause::Vanished => {
                "gone from the API without a deletion this agent saw (an etcd or backup restore, or a delete while the agent was not watching)"
            }
        }
    }
}

/// What becomes of a file whose IPReservation is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Released: the file is removed and its addresses are free.
    Release,
    /// Lost: the file stays, keeps protecting its addresses, and the agent says so.
    Keep(LossCause),
    /// Not known yet (the CRD could not be read): the file stays, silently, and the deletion is
    /// judged again on the next pass.
    Undecided,
}

/// The rule. `release_time` is the file's (`None`: the pod held the addresses). A file whose
/// release time has come is released whatever happened to its object: the plugin no longer
/// honours it, and it would be released by then anyway. Otherwise only a deletion seen while the
/// CRD lives is a release; anything else is a loss, kept — a wrong "lost" keeps an address a
/// while longer and says so, a wrong "released" hands a pod's address to another pod.
pub fn fate(release_time: Option<Timestamp>, sighting: Sighting, now: Timestamp) -> Fate {
    if release_time.is_some_and(|at| at <= now) {
        return Fate::Release;
    }
    match sighting {
        Sighting::Deleted(CrdState::Live) => Fate::Release,
        Sighting::Deleted(CrdState::Deleting) => Fate::Keep(LossCause::CrdDeleted),
        Sighting::Elsewhere => Fate::Release,
        Sighting::Deleted(CrdState::Unknown) | Sighting::Unasked => Fate::Undecided,
        Sighting::Vanished => Fate::Keep(LossCause::Vanished),
    }
}

/// A file kept in place keeps its addresses: a reservation of another pod that claims one of
/// them is not written (moved from `desired.files` to its refusals), as the controller lets the
/// older of two reservations keep an address. Only a restore from an older backup brings such a
/// reservation (one released since, its address given to the pod whose reservation is lost): the
/// plugin never hands out an address a file holds.
pub fn yield_to_kept(desired: &mut Desired, kept: &[(PodKey, Vec<IpAddr>)]) {
    if kept.is_empty() {
        return;
    }
    let held: std::collections::HashMap<IpAddr, &PodKey> = kept
        .iter()
        .flat_map(|(pod, ips)| ips.iter().map(move |ip| (ip.to_canonical(), pod)))
        .collect();
    let withheld: Vec<(PodKey, IpAddr, PodKey)> = desired
        .files
        .iter()
        .filter_map(|(pod, file)| {
            file.ips.iter().find_map(|ip| {
                let holder = held.get(&ip.to_canonical())?;
                (*holder != pod).then(|| (pod.clone(), *ip, (*holder).clone()))
            })
        })
        .collect();
    for (pod, ip, holder) in withheld {
        desired.files.remove(&pod);
        desired
            .refused
            .push(Refusal::HeldByLost { pod, ip, holder });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_or_lost() {
        let now = Timestamp::from_unix_secs(1_000);
        let past = Some(Timestamp::from_unix_secs(999));
        let at_now = Some(now);
        let future = Some(Timestamp::from_unix_secs(1_001));
        let bound = None;
        let deleted = Sighting::Deleted(CrdState::Live);
        let crd_gone = Sighting::Deleted(CrdState::Deleting);
        let unknown = Sighting::Deleted(CrdState::Unknown);
        let vanished = Sighting::Vanished;
        let moved = Sighting::Elsewhere;
        let unasked = Sighting::Unasked;
        let keep = |c| Fate::Keep(c);
        // (what happened, the file's release time, how it was seen, the fate)
        let cases = [
            ("controller's expiry", past, deleted, Fate::Release),
            ("expiry at the instant", at_now, deleted, Fate::Release),
            ("expired, unseen", past, vanished, Fate::Release),
            ("expired, with the CRD", past, crd_gone, Fate::Release),
            (
                "admin delete of a Released one",
                future,
                deleted,
                Fate::Release,
            ),
            ("admin delete of a Bound one", bound, deleted, Fate::Release),
            (
                "CRD deleted, Released",
                future,
                crd_gone,
                keep(LossCause::CrdDeleted),
            ),
            (
                "CRD deleted, Bound",
                bound,
                crd_gone,
                keep(LossCause::CrdDeleted),
            ),
            (
                "etcd restore, Released",
                future,
                vanished,
                keep(LossCause::Vanished),
            ),
            (
                "etcd restore, Bound",
                bound,
                vanished,
                keep(LossCause::Vanished),
            ),
            ("CRD unreadable", future, unknown, Fate::Undecided),
            ("CRD unreadable, Bound", bound, unknown, Fate::Undecided),
            ("CRD unreadable, expired", past, unknown, Fate::Release),
            ("moved to another node unseen", bound, moved, Fate::Release),
            ("API unreachable", future, unasked, Fate::Undecided),
        ];
        for (what, release_time, sighting, want) in cases {
            assert_eq!(fate(release_time, sighting, now), want, "{what}");
        }
    }

    #[test]
    fn a_kept_file_keeps_its_address_against_a_restored_reservation() {
        use ipkeep_reservation::{FORMAT_VERSION, ReservationFile};
        let key = |n: &str| PodKey::new("db", n).unwrap();
        let file = |n: &str, ip: &str| {
            ReservationFile {
                version: FORMAT_VERSION,
                namespace: "db".into(),
                pod: n.into(),
                ips: vec![ip.parse().unwrap()],
                release_time: None,
                uid: format!("uid-{n}"),
                node_name: Some("node-a".into()),
            }
            .validate()
            .unwrap()
        };
        let ip = |t: &str| t.parse::<IpAddr>().unwrap();
        let mut desired = Desired::default();
        for (n, a) in [
            ("restored", "10.0.0.8"),
            ("other", "10.0.0.9"),
            ("same", "10.0.0.7"),
        ] {
            desired.files.insert(key(n), file(n, a));
        }
        // (the kept files, what stays written, what is refused)
        let kept = [
            (key("lost"), vec![ip("10.0.0.8")]),
            (key("same"), vec![ip("10.0.0.7")]),
        ];
        yield_to_kept(&mut desired, &kept);
        let written: Vec<&str> = desired.files.keys().map(PodKey::name).collect();
        assert_eq!(
            written,
            ["other", "same"],
            "a pod's own address is never held against it"
        );
        assert_eq!(
            desired.refused,
            [Refusal::HeldByLost {
                pod: key("restored"),
                ip: ip("10.0.0.8"),
                holder: key("lost"),
            }]
        );
        let mut untouched = Desired::default();
        untouched.files.insert(key("x"), file("x", "10.0.0.8"));
        let before = untouched.clone();
        yield_to_kept(&mut untouched, &[]);
        assert_eq!(untouched, before);
    }
}
