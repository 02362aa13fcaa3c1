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
//!
//! A restore can also bring objects *back*, older than what the node holds ([`restored`]):
//!
//! * the same object (uid) in an older version: its pod's address changed after the backup, and
//!   the controller changed `spec.ips`, which bumps `metadata.generation`. The file records the
//!   generation it was written from; an object of the same uid with a lower generation that
//!   claims other addresses is the older one ([`Restored::Older`]): the file stays and
//!   `recover --apply` writes its addresses back into the object. A generation starts again from
//!   the backup's value after a restore, so only a difference in what is claimed is compared:
//!   an equal or higher generation is the API's newer word;
//! * an object the node released since the backup (its deletion seen, its release time come, or
//!   moved away): the node records each uid it releases, with the generation its file held
//!   (`ipkeep_reservation::record_released`). An object of such a uid at that generation or
//!   lower is that released object come back ([`Restored::Released`]): no file is written, its
//!   addresses stay with whoever got them since, and `recover --apply` deletes it. A reservation
//!   that truly returns to the node (moved away and back) has a higher generation.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use ipkeep_reservation::{PodKey, ReservationFile, Timestamp};

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
    /// Not seen deleted, and the API server has the same object on another node, in an older
    /// version than the file's ([`is_older`]): a restore took it back to where it was before it
    /// moved here.
    ElsewhereOlder,
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
    /// The API holds this object in an older version (a lower generation claiming other
    /// addresses): the node's file is the newer one ([`Restored::Older`]).
    RestoredOlder,
    /// The API holds this object, which the node released ([`Restored::Released`]): nothing is
    /// written for it.
    RestoredReleased,
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
            LossCause::RestoredOlder => {
                "brought back by a restore in an older version than the node's file"
            }
            LossCause::RestoredReleased => "brought back by a restore after this node released it",
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
        Sighting::ElsewhereOlder => Fate::Keep(LossCause::RestoredOlder),
        Sighting::Deleted(CrdState::Unknown) | Sighting::Unasked => Fate::Undecided,
        Sighting::Vanished => Fate::Keep(LossCause::Vanished),
    }
}

/// The release time a kept file is given when it has none. A `Bound` file whose object vanished
/// without a deletion the node saw ([`LossCause::Vanished`]) is held for its retention
/// (`retain_for`: the file's `retainForSeconds`, else the default) from `now`, when the node
/// found it gone; [`fate`] then releases it once that time passes. Its pod held the addresses
/// when the node last heard of it, so the object's own release time, had it been released on
/// purpose while the agent was away (its pod deleted, the retention run out, the controller's
/// expiry), came before this one; had it been lost to a restore, the pod still gets its whole
/// retention from the moment the node knew, for `recover` to bring it back. A file that has a
/// release time keeps it, and the CRD's deletion keeps its files as they are (every reservation
/// went at once: the admin recovers them).
pub fn kept_until(
    release_time: Option<Timestamp>,
    retain_for: Option<Duration>,
    cause: LossCause,
    default: Duration,
    now: Timestamp,
) -> Option<Timestamp> {
    (cause == LossCause::Vanished && release_time.is_none())
        .then(|| now.saturating_add(retain_for.unwrap_or(default)))
}

/// Whether the API's version of an object is older than the node's file of the same object: a
/// lower generation that claims something else (other addresses, another node). Either
/// generation unknown (a file an older agent wrote) is never older.
pub fn is_older(api_generation: Option<i64>, file_generation: Option<i64>, differs: bool) -> bool {
    differs && matches!((api_generation, file_generation), (Some(a), Some(f)) if a < f)
}

/// Whether an object at `generation` is one the node released at `released_at` (the generation
/// its file held then; `None`: the node released no object of that uid), brought back by a
/// restore: released at that generation or a later one. An unknown generation is never taken for
/// one.
pub fn was_released(generation: Option<i64>, released_at: Option<i64>) -> bool {
    matches!((generation, released_at), (Some(g), Some(at)) if g <= at)
}

/// What [`restored`] found of one object the API holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restored {
    /// Older than the node's file: the file (`kept`) stays as it is.
    Older {
        /// The node's file, kept.
        kept: ReservationFile,
        /// What the API's version would have written on this node (`None`: the API has it on
        /// another node, [`Sighting::ElsewhereOlder`]).
        api: Option<ReservationFile>,
    },
    /// Released by the node: not written.
    Released {
        /// What the API's version would have written.
        api: ReservationFile,
        /// The generation the node released it at.
        released_at_generation: i64,
    },
}

impl Restored {
    /// The node's file kept for it (an older object's), if any.
    pub fn kept(&self) -> Option<&ReservationFile> {
        match self {
            Restored::Older { kept, .. } => Some(kept),
            Restored::Released { .. } => None,
        }
    }

    /// The file reported for it (the node's for an older one, the API's for a released one),
    /// and why.
    pub fn reported(&self) -> (&ReservationFile, LossCause) {
        match self {
            Restored::Older { kept, .. } => (kept, LossCause::RestoredOlder),
            Restored::Released { api, .. } => (api, LossCause::RestoredReleased),
        }
    }
}

/// The restore's rule over the files the API's reservations call for (`desired`), the node's
/// files of the same pods (`on_disk`) and what the node released (`released`: uid, generation).
/// An older object's file is replaced in `desired` by the node's file, which so stays; a
/// released one is taken out of `desired`, and a node's file of the same pod with another uid
/// (made after the backup, gone from the restored API) stays too, returned as lost. Both are
/// returned, to be reported; the rest of `desired` is untouched.
pub fn restored(
    desired: &mut Desired,
    on_disk: &BTreeMap<PodKey, ReservationFile>,
    released: &[(String, i64)],
) -> (Vec<Restored>, Vec<ReservationFile>) {
    let mut found = Vec::new();
    let mut lost = Vec::new();
    // The latest release of each uid (a uid released twice: moved away, back, and away again).
    let mut released_at: std::collections::HashMap<&str, i64> = std::collections::HashMap::new();
    for (uid, generation) in released {
        let at = released_at.entry(uid.as_str()).or_insert(*generation);
        *at = (*at).max(*generation);
    }
    let keys: Vec<PodKey> = desired.files.keys().cloned().collect();
    for key in keys {
        let Some(api) = desired.files.get(&key).map(|f| (**f).clone()) else {
            continue;
        };
        let disk = on_disk.get(&key);
        if let Some(disk) = disk.filter(|d| d.uid == api.uid)
            && is_older(api.generation, disk.generation, !same_claim(&api, disk))
            && let Ok(valid) = disk.clone().validate()
        {
            desired.files.insert(key, valid);
            found.push(Restored::Older {
                kept: disk.clone(),
                api: Some(api),
            });
            continue;
        }
        if was_released(api.generation, released_at.get(api.uid.as_str()).copied()) {
            desired.files.remove(&key);
            if let Some(disk) = disk.filter(|d| d.uid != api.uid)
                && let Ok(valid) = disk.clone().validate()
            {
                desired.files.insert(key, valid);
                lost.push(disk.clone());
            }
            let at = released_at
                .get(api.uid.as_str())
                .copied()
                .unwrap_or_default();
            found.push(Restored::Released {
                api,
                released_at_generation: at,
            });
        }
    }
    (found, lost)
}

/// Whether two files of one object claim the same: addresses and node.
fn same_claim(a: &ReservationFile, b: &ReservationFile) -> bool {
    let canon = |f: &ReservationFile| {
        let mut v: Vec<IpAddr> = f.ips.iter().map(IpAddr::to_canonical).collect();
        v.sort();
        v
    };
    canon(a) == canon(b) && a.node_name == b.node_name
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
            (
                "a restore took it back to the node it left",
                bound,
                Sighting::ElsewhereOlder,
                keep(LossCause::RestoredOlder),
            ),
            (
                "taken back, expired since",
                past,
                Sighting::ElsewhereOlder,
                Fate::Release,
            ),
            ("API unreachable", future, unasked, Fate::Undecided),
        ];
        for (what, release_time, sighting, want) in cases {
            assert_eq!(fate(release_time, sighting, now), want, "{what}");
        }
    }

    #[test]
    fn a_bound_file_that_vanished_is_held_for_its_retention() {
        let now = Timestamp::from_unix_secs(1_000);
        let day = Duration::from_secs(86_400);
        let own = Some(Duration::from_secs(90));
        let later = Some(Timestamp::from_unix_secs(5_000));
        let at = |s| Some(Timestamp::from_unix_secs(s));
        // (what happened, the file's release time, its retention, why kept, the release time given)
        let cases = [
            ("Bound, vanished", None, own, LossCause::Vanished, at(1_090)),
            (
                "Bound, vanished, retention unknown",
                None,
                None,
                LossCause::Vanished,
                at(87_400),
            ),
            ("Released, vanished", later, own, LossCause::Vanished, None),
            ("Bound, CRD deleted", None, own, LossCause::CrdDeleted, None),
            (
                "Bound, restored older",
                None,
                own,
                LossCause::RestoredOlder,
                None,
            ),
        ];
        for (what, release_time, retain_for, cause, want) in cases {
            assert_eq!(
                kept_until(release_time, retain_for, cause, day, now),
                want,
                "{what}"
            );
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
                generation: None,
                retain_for_seconds: None,
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

    #[test]
    fn an_older_version_and_a_released_object_are_told_by_generation() {
        // (what happened, the API's generation, the file's, whether they claim differently, older)
        let older = [
            (
                "address changed after the backup",
                Some(2),
                Some(3),
                true,
                true,
            ),
            (
                "the same claim, a lower generation",
                Some(2),
                Some(3),
                false,
                false,
            ),
            (
                "the API changed it since the restore",
                Some(3),
                Some(3),
                true,
                false,
            ),
            ("the API moved on", Some(4), Some(3), true, false),
            ("a file an older agent wrote", Some(2), None, true, false),
            ("no generation in the API", None, Some(3), true, false),
        ];
        for (what, api, file, differs, want) in older {
            assert_eq!(is_older(api, file, differs), want, "{what}");
        }
        // (what happened, the API's generation, the generation the node released it at, was
        // released)
        let cases = [
            ("deleted after the backup, restored", Some(3), Some(3), true),
            ("restored from further back", Some(1), Some(3), true),
            ("moved away and back since", Some(4), Some(3), false),
            ("never released here", Some(1), None, false),
            ("no generation in the API", None, Some(1), false),
        ];
        for (what, generation, released_at, want) in cases {
            assert_eq!(was_released(generation, released_at), want, "{what}");
        }
    }

    #[test]
    fn a_restore_keeps_the_newer_file_and_writes_no_released_object() {
        use ipkeep_reservation::FORMAT_VERSION;
        let key = |n: &str| PodKey::new("db", n).unwrap();
        let file = |n: &str, uid: &str, ip: &str, generation: Option<i64>| ReservationFile {
            version: FORMAT_VERSION,
            namespace: "db".into(),
            pod: n.into(),
            ips: vec![ip.parse().unwrap()],
            release_time: None,
            uid: uid.into(),
            node_name: Some("node-a".into()),
            generation,
            retain_for_seconds: None,
        };
        let mut desired = Desired::default();
        let api = [
            // The API's version was before the pod's address changed.
            file("moved", "u-moved", "10.0.0.1", Some(2)),
            // Released by the node since the backup, and re-created for the pod after it.
            file("gone", "u-gone-old", "10.0.0.2", Some(1)),
            // Released by the node since the backup; no file for the pod since.
            file("freed", "u-freed", "10.0.0.3", Some(2)),
            // The API changed it after the restore, or it was never restored: the API wins.
            file("newer", "u-newer", "10.0.0.4", Some(5)),
            // Unchanged.
            file("same", "u-same", "10.0.0.5", Some(1)),
            // Moved away from the node and back since it was released: written.
            file("back", "u-back", "10.0.0.6", Some(7)),
        ];
        for f in &api {
            desired
                .files
                .insert(f.pod_key().unwrap(), f.clone().validate().unwrap());
        }
        let disk: BTreeMap<PodKey, ReservationFile> = [
            file("moved", "u-moved", "10.0.0.11", Some(3)),
            file("gone", "u-gone-new", "10.0.0.12", Some(1)),
            file("newer", "u-newer", "10.0.0.14", Some(4)),
            file("same", "u-same", "10.0.0.5", Some(1)),
        ]
        .into_iter()
        .map(|f| (f.pod_key().unwrap(), f))
        .collect();
        let released = [
            ("u-gone-old".to_owned(), 1),
            ("u-freed".to_owned(), 2),
            ("u-back".to_owned(), 5),
        ];
        let (found, lost) = restored(&mut desired, &disk, &released);
        let written: Vec<(&str, String)> = desired
            .files
            .iter()
            .map(|(k, f)| (k.name(), f.ips[0].to_string()))
            .collect();
        assert_eq!(
            written,
            [
                ("back", "10.0.0.6".to_owned()),
                ("gone", "10.0.0.12".to_owned()),
                ("moved", "10.0.0.11".to_owned()),
                ("newer", "10.0.0.4".to_owned()),
                ("same", "10.0.0.5".to_owned()),
            ],
            "the newer file stays, the released object is not written"
        );
        let reported: Vec<(&str, LossCause)> = found
            .iter()
            .map(|r| {
                let (f, cause) = r.reported();
                (f.pod.as_str(), cause)
            })
            .collect();
        assert_eq!(
            reported,
            [
                ("freed", LossCause::RestoredReleased),
                ("gone", LossCause::RestoredReleased),
                ("moved", LossCause::RestoredOlder),
            ]
        );
        assert_eq!(lost, [disk[&key("gone")].clone()]);
        let mut untouched = Desired::default();
        untouched
            .files
            .insert(key("same"), api[4].clone().validate().unwrap());
        let before = untouched.clone();
        assert_eq!(
            restored(&mut untouched, &BTreeMap::new(), &[]),
            (vec![], vec![])
        );
        assert_eq!(untouched, before);
    }
}
