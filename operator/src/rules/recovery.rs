//! What `ipkeep-operator recover` does with each lost reservation the agents report
//! ([`crate::rules::loss`]): re-create it, leave it (the API has it as the node does), or refuse
//! and list it (the API has a different one, or two nodes claim the pod). Pure: the command reads
//! the reports and the reservations, [`plan`] decides, the command prints and applies.

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
}

/// A reservation the API has, as recovery compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Existing {
    /// `spec.nodeName`.
    pub node: String,
    /// `spec.ips`, parsed (an entry that is no address is left out: it cannot match).
    pub ips: Vec<IpAddr>,
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
    for l in lost {
        nodes.entry(&l.pod).or_default().push(l.node.clone());
    }
    lost.iter()
        .filter(|l| l.release_time.is_none_or(|at| now < at))
        .map(|l| {
            let claimed = nodes.get(&l.pod).map_or(1, Vec::len);
            let action = match existing(&l.pod) {
                Some(e) if agrees(l, &e) => Action::Present,
                Some(e) => Action::Disagrees(e),
                None if claimed > 1 => {
                    Action::ClaimedBy(nodes.get(&l.pod).cloned().unwrap_or_default())
                }
                None => match l.ips.iter().find_map(|ip| {
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
        }
    }

    fn existing(node: &str, ip: &str) -> Existing {
        Existing {
            node: node.into(),
            ips: vec![ip.parse().unwrap()],
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
}
