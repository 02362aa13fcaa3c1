//! What `ipkeep-operator recover` does with each lost reservation the agents report
//! ([`crate::rules::loss`]): re-create it, leave it (the API has it as the node does), or refuse
//! and list it (the API has a different one, or two nodes claim the pod). With an object a
//! restore brought back ([`Kind`]): write the node's newer addresses back into an older one,
//! delete one the node released. Pure: the command reads the reports and the reservations,
//! [`plan`] decides, the command prints and applies (deletions first, so that a lost
//! reservation of the same pod can be created after).

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipkeep_reservation::{PodKey, RetainFor, Timestamp};

/// One lost reservation as one node's agent reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    /// The node whose file holds it.
    pub node: String,
    /// The pod's namespace and name.
    pub pod: PodKey,
    /// The addresses.
    pub ips: Vec<IpAddr>,
    /// The file's release time (`None`: the pod held them).
    pub release_time: Option<Timestamp>,
    /// The lost object's uid.
    pub uid: String,
    /// What the node holds it as.
    pub kind: Kind,
}

/// What a node reports of a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Gone from the API; the node's file stays.
    Lost,
    /// The API holds an older version (same uid); the node's file stays.
    RestoredOlder,
    /// The API holds it again after the node released it; no file.
    RestoredReleased,
}

/// A reservation the API has, as recovery compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Existing {
    /// `spec.nodeName`.
    pub node: String,
    /// `spec.ips`, parsed (an entry that is no address is left out: it cannot match).
    pub ips: Vec<IpAddr>,
    /// `metadata.uid`.
    pub uid: String,
}

/// What recovery does with one lost reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Create it: `spec.ips` and `spec.nodeName` from the file, and `spec.retainFor` (when the
    /// file has a release time) so that the controller, releasing it from its creation, holds it
    /// until that time (rounded up to the unit `retainFor` can say).
    Create {
        /// `spec.retainFor` to write, if any.
        retain_for: Option<RetainFor>,
    },
    /// The API has it with the same node and addresses (the controller re-created it for a live
    /// pod, or an earlier recover did): nothing to do; the agent adopts it on its next pass.
    Present,
    /// The API has a reservation of that name on another node or with other addresses: not
    /// overwritten; listed for a person to decide.
    Disagrees(Existing),
    /// More than one node reports the pod: none is created; listed with the nodes.
    ClaimedBy(Vec<String>),
    /// Another reservation in the API holds one of its addresses on its node: not created (the
    /// controller would mark the younger one, this, `Conflict`, and the node's file would go).
    /// After a restore from an older backup this is a reservation released since, brought back.
    AddressHeld {
        /// The address.
        ip: IpAddr,
        /// The reservation holding it.
        by: PodKey,
    },
    /// An older version of the object (same uid): write the node's addresses and node into it.
    Rewrite,
    /// An object the node released: delete it (that uid only).
    Delete,
    /// An object the node released is gone from the API already: nothing to do.
    Gone,
    /// An object the node released is kept by another node's file (it moved there after the
    /// backup): that node's report rewrites it; nothing to delete.
    KeptBy(String),
}

/// The smallest `retainFor` that, from `now`, reaches `until`: seconds while they fit the
/// grammar, else minutes, else hours, rounded up; `None` when `until` has come.
pub fn retain_for_until(until: Timestamp, now: Timestamp) -> Option<RetainFor> {
    if until <= now {
        return None;
    }
    let wait = until.saturating_duration_since(now);
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    const MAX_COUNT: u64 = 999_999;
    for (unit, size) in [("s", 1), ("m", 60), ("h", 3600), ("d", 86_400)] {
        let count = secs.div_ceil(size);
        if count <= MAX_COUNT
            && let Ok(r) = RetainFor::parse(&format!("{count}{unit}"))
        {
            return Some(r);
        }
    }
    Some(RetainFor::MAX)
}

/// Whether the API's reservation is the node's file: the same node and the same addresses.
pub fn agrees(l: &Lost, e: &Existing) -> bool {
    let canon = |ips: &[IpAddr]| {
        let mut v: Vec<IpAddr> = ips.iter().map(IpAddr::to_canonical).collect();
        v.sort();
        v
    };
    e.node == l.node && canon(&e.ips) == canon(&l.ips)
}

/// Decides for every lost reservation, in the order given. `existing` is the API's reservation
/// of a pod, if any; `holder` the API's reservation holding an address on a node, if any. A file
/// whose release time has come is left out: it is released already.
pub fn plan(
    lost: &[Lost],
    existing: impl Fn(&PodKey) -> Option<Existing>,
    holder: impl Fn(&str, IpAddr) -> Option<PodKey>,
    now: Timestamp,
) -> Vec<(Lost, Action)> {
    let mut nodes: BTreeMap<&PodKey, Vec<String>> = BTreeMap::new();
    for l in lost.iter().filter(|l| l.kind != Kind::RestoredReleased) {
        nodes.entry(&l.pod).or_default().push(l.node.clone());
    }
    // A uid another node's file holds is that node's to rewrite, not to delete.
    let kept_by = |l: &Lost| {
        lost.iter()
            .find(|o| o.uid == l.uid && o.kind != Kind::RestoredReleased)
            .map(|o| o.node.clone())
    };
    // The objects recovery deletes: a lost reservation of the same pod is created after.
    let deleted: Vec<&str> = lost
        .iter()
        .filter(|l| l.kind == Kind::RestoredReleased && kept_by(l).is_none())
        .map(|l| l.uid.as_str())
        .collect();
    let after = |pod: &PodKey| existing(pod).filter(|e| !deleted.contains(&e.uid.as_str()));
    // Nor does an object deleted hold an address.
    let holder = |node: &str, ip: IpAddr| {
        holder(node, ip)
            .filter(|by| existing(by).is_none_or(|e| !deleted.contains(&e.uid.as_str())))
    };
    lost.iter()
        .filter(|l| l.kind == Kind::RestoredReleased || l.release_time.is_none_or(|at| now < at))
        .map(|l| {
            let claimed = nodes.get(&l.pod).map_or(1, Vec::len);
            let action = match (l.kind, after(&l.pod)) {
                (Kind::RestoredReleased, _) => match kept_by(l) {
                    Some(node) => Action::KeptBy(node),
                    None if existing(&l.pod).is_some_and(|e| e.uid == l.uid) => Action::Delete,
                    None => Action::Gone,
                },
                (_, Some(e)) if agrees(l, &e) => Action::Present,
                (Kind::RestoredOlder, Some(e)) if e.uid == l.uid && claimed == 1 => Action::Rewrite,
                (_, Some(e)) => Action::Disagrees(e),
                (_, None) if claimed > 1 => {
                    Action::ClaimedBy(nodes.get(&l.pod).cloned().unwrap_or_default())
                }
                (_, None) => match l.ips.iter().find_map(|ip| {
                    holder(&l.node, ip.to_canonical()).map(|by| (ip.to_canonical(), by))
                }) {
                    Some((ip, by)) => Action::AddressHeld { ip, by },
                    None => Action::Create {
                        retain_for: l.release_time.and_then(|at| retain_for_until(at, now)),
                    },
                },
            };
            (l.clone(), action)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lost(node: &str, pod: &str, ip: &str, release: Option<i64>) -> Lost {
        Lost {
            node: node.into(),
            pod: PodKey::new("db", pod).unwrap(),
            ips: vec![ip.parse().unwrap()],
            release_time: release.map(Timestamp::from_unix_secs),
            uid: format!("uid-{pod}"),
            kind: Kind::Lost,
        }
    }

    fn existing(node: &str, ip: &str) -> Existing {
        Existing {
            node: node.into(),
            ips: vec![ip.parse().unwrap()],
            uid: format!("api-{ip}"),
        }
    }

    #[test]
    fn retain_for_reaches_the_release_time_in_the_finest_unit_that_fits() {
        let now = Timestamp::from_unix_secs(1_000);
        let at = |s: i64| Timestamp::from_unix_secs(1_000 + s);
        let cases = [
            (at(0), None),
            (at(-5), None),
            (at(1), Some("1s")),
            (at(3_600), Some("3600s")),
            (at(999_999), Some("999999s")),
            (at(1_000_000), Some("16667m")),
            (Timestamp::new(1_010, 1).unwrap(), Some("11s")),
        ];
        for (until, want) in cases {
            let got = retain_for_until(until, now);
            assert_eq!(got.map(|r| r.to_string()).as_deref(), want, "{until}");
        }
    }

    #[test]
    fn recover_creates_what_is_missing_and_never_overwrites() {
        let now = Timestamp::from_unix_secs(1_000);
        let reports = [
            lost("node-a", "gone", "10.0.0.1", Some(1_600)),
            lost("node-a", "bound", "10.0.0.2", None),
            lost("node-a", "back", "10.0.0.3", Some(2_000)),
            lost("node-a", "moved", "10.0.0.4", Some(2_000)),
            lost("node-a", "readdressed", "10.0.0.5", None),
            lost("node-a", "twice", "10.0.0.6", None),
            lost("node-b", "twice", "10.1.0.6", None),
            lost("node-a", "expired", "10.0.0.7", Some(1_000)),
            lost("node-a", "reused", "10.0.0.8", Some(2_000)),
        ];
        let api = |pod: &PodKey| match pod.name() {
            "back" => Some(existing("node-a", "10.0.0.3")),
            "moved" => Some(existing("node-b", "10.0.0.4")),
            "readdressed" => Some(existing("node-a", "10.0.0.99")),
            _ => None,
        };
        // A reservation released since the backup, brought back by the restore, holds 10.0.0.8.
        let stale = PodKey::new("db", "restored").unwrap();
        let holder = |node: &str, ip: IpAddr| {
            (node == "node-a" && ip == "10.0.0.8".parse::<IpAddr>().unwrap()).then(|| stale.clone())
        };
        let first = plan(&reports, api, holder, now);
        let got: Vec<(&str, &str, Action)> = first
            .iter()
            .map(|(l, a)| {
                let node = if l.node == "node-a" { "a" } else { "b" };
                (
                    node,
                    if l.pod.name() == "twice" { "twice" } else { "" },
                    a.clone(),
                )
            })
            .collect();
        let create = |r: Option<&str>| Action::Create {
            retain_for: r.map(|t| RetainFor::parse(t).unwrap()),
        };
        let want = vec![
            ("a", "", create(Some("600s"))),
            ("a", "", create(None)),
            ("a", "", Action::Present),
            ("a", "", Action::Disagrees(existing("node-b", "10.0.0.4"))),
            ("a", "", Action::Disagrees(existing("node-a", "10.0.0.99"))),
            (
                "a",
                "twice",
                Action::ClaimedBy(vec!["node-a".into(), "node-b".into()]),
            ),
            (
                "b",
                "twice",
                Action::ClaimedBy(vec!["node-a".into(), "node-b".into()]),
            ),
            (
                "a",
                "",
                Action::AddressHeld {
                    ip: "10.0.0.8".parse().unwrap(),
                    by: stale.clone(),
                },
            ),
        ];
        assert_eq!(got, want, "the expired one is left out");
        // Applied once, the API has what was created: a second run creates nothing.
        let after = |pod: &PodKey| {
            first
                .iter()
                .find(|(l, a)| &l.pod == pod && matches!(a, Action::Create { .. }))
                .map(|(l, _)| existing(&l.node, &l.ips[0].to_string()))
                .or_else(|| api(pod))
        };
        let again = plan(&reports, after, holder, now);
        assert!(
            again
                .iter()
                .all(|(_, a)| !matches!(a, Action::Create { .. })),
            "{again:?}"
        );
    }

    #[test]
    fn recover_writes_back_an_older_object_and_deletes_a_released_one() {
        let now = Timestamp::from_unix_secs(1_000);
        let with = |mut l: Lost, kind: Kind, uid: &str| {
            l.kind = kind;
            l.uid = uid.into();
            l
        };
        let api_of = |node: &str, ip: &str, uid: &str| Existing {
            uid: uid.into(),
            ..existing(node, ip)
        };
        let reports = [
            // The API holds an older version: the node's addresses go back into it.
            with(
                lost("node-a", "readdressed", "10.0.0.1", None),
                Kind::RestoredOlder,
                "u1",
            ),
            // Rewritten already (or the API changed it to the same since).
            with(
                lost("node-a", "agreed", "10.0.0.2", None),
                Kind::RestoredOlder,
                "u2",
            ),
            // The API's object of that name is another one now: not touched.
            with(
                lost("node-a", "renamed", "10.0.0.3", None),
                Kind::RestoredOlder,
                "u3",
            ),
            // Released by the node, back in the API: deleted; and the pod's newer reservation,
            // lost with the restore, whose address the old one claims, is created after.
            with(
                lost("node-a", "reborn", "10.0.0.4", None),
                Kind::RestoredReleased,
                "u4-old",
            ),
            with(
                lost("node-a", "reborn", "10.0.0.5", None),
                Kind::Lost,
                "u4-new",
            ),
            // Released by the node, gone from the API already.
            with(
                lost("node-a", "freed", "10.0.0.6", Some(500)),
                Kind::RestoredReleased,
                "u6",
            ),
            // Moved from node-a to node-b after the backup: a's report of it as released is
            // b's to rewrite.
            with(
                lost("node-a", "moved", "10.0.0.7", None),
                Kind::RestoredReleased,
                "u7",
            ),
            with(
                lost("node-b", "moved", "10.1.0.7", None),
                Kind::RestoredOlder,
                "u7",
            ),
        ];
        let api = |pod: &PodKey| match pod.name() {
            "readdressed" => Some(api_of("node-a", "10.0.0.99", "u1")),
            "agreed" => Some(api_of("node-a", "10.0.0.2", "u2")),
            "renamed" => Some(api_of("node-a", "10.0.0.98", "other")),
            "reborn" => Some(api_of("node-a", "10.0.0.5", "u4-old")),
            "moved" => Some(api_of("node-a", "10.0.0.7", "u7")),
            _ => None,
        };
        // The released object brought back holds the address the pod's newer reservation has.
        let reborn = PodKey::new("db", "reborn").unwrap();
        let holder = |_: &str, ip: IpAddr| {
            (ip == "10.0.0.5".parse::<IpAddr>().unwrap()).then(|| reborn.clone())
        };
        let got: Vec<(String, Action)> = plan(&reports, api, holder, now)
            .into_iter()
            .map(|(l, a)| (format!("{} {}", l.node, l.pod.name()), a))
            .collect();
        let want = vec![
            ("node-a readdressed".to_owned(), Action::Rewrite),
            ("node-a agreed".to_owned(), Action::Present),
            (
                "node-a renamed".to_owned(),
                Action::Disagrees(api_of("node-a", "10.0.0.98", "other")),
            ),
            ("node-a reborn".to_owned(), Action::Delete),
            (
                "node-a reborn".to_owned(),
                Action::Create { retain_for: None },
            ),
            ("node-a freed".to_owned(), Action::Gone),
            ("node-a moved".to_owned(), Action::KeptBy("node-b".into())),
            ("node-b moved".to_owned(), Action::Rewrite),
        ];
        assert_eq!(got, want);
    }
}
