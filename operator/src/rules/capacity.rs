//! How full a node's ranges are, network by network: for each of its pod CIDRs (the range
//! host-local hands addresses out of, as [`budget::usable_addresses`] counts it) how many
//! addresses it has, how many have an allocation file, how many the node's reservations hold
//! (Bound, Released) and how many an ADD can still take; and how many more Released reservations
//! the node's budget lets it hold before the oldest yields. What the agent exports as metrics and
//! writes on its Node ([`FREE_ADDRESSES`], [`CAPACITY`]). Plain data in, plain data out; `now` is
//! an argument.
//!
//! "Free" is what the plugin would find: an address is taken when a container holds it (its
//! allocation file) or an active reservation holds it for its pod, whichever; the gateway is never
//! handed out.

use std::{collections::BTreeSet, fmt, net::IpAddr};

use ipkeep_hostlocal::{
    addr::{self, Cidr},
    range::{Range, RangeSpec, canonicalize_set},
};
use ipkeep_reservation::{ReservationFile, Timestamp};

use super::budget::{self, Budget, NodeFacts};

/// The Node annotation with the fewest free addresses of any of the node's ranges (a number,
/// for `kubectl get nodes -o custom-columns=...`); absent while no range is known.
pub const FREE_ADDRESSES: &str = "ipkeep.dev/free-addresses";
/// The Node annotation with every range's figures and the budget's headroom, for people
/// (`kubectl describe node`).
pub const CAPACITY: &str = "ipkeep.dev/capacity";

/// Which reservations hold an address, as the plugin counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Holder {
    /// Its pod exists (no release time).
    Bound,
    /// Its pod is gone and its release time has not come.
    Released,
}

impl Holder {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Holder::Bound => "Bound",
            Holder::Released => "Released",
        }
    }
}

/// One active reservation of the node: the addresses it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    /// Bound or Released.
    pub holder: Holder,
    /// Its addresses (one per family).
    pub ips: Vec<IpAddr>,
}

/// The reservations that hold addresses at `now`, from the files the agent writes: an expired one
/// holds nothing (the plugin ignores it even while its file is still there).
pub fn holdings<'a>(
    files: impl IntoIterator<Item = &'a ReservationFile>,
    now: Timestamp,
) -> Vec<Holding> {
    files
        .into_iter()
        .filter(|f| f.is_active(now))
        .map(|f| Holding {
            holder: if f.release_time.is_some() {
                Holder::Released
            } else {
                Holder::Bound
            },
            ips: f.ips.clone(),
        })
        .collect()
}

/// The addresses of a network directory's entries that are allocation files: regular files named
/// by an address in its canonical form, as host-local writes them (`last_reserved_ip.0`, `lock`
/// and anything else are not).
pub fn allocated<'a>(regular_files: impl IntoIterator<Item = &'a str>) -> Vec<IpAddr> {
    regular_files
        .into_iter()
        .filter_map(|name| addr::parse_ip(name).filter(|ip| ip.to_string() == name))
        .collect()
}

/// One range of one network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeCapacity {
    /// The pod CIDR, as the Node writes it.
    pub cidr: String,
    /// Addresses the range hands out (the gateway excluded).
    pub addresses: u128,
    /// Addresses with an allocation file (a container holds them).
    pub allocated: u64,
    /// Addresses Bound reservations hold.
    pub bound: u64,
    /// Addresses Released reservations hold (no container has them; only their pods may).
    pub released: u64,
    /// Addresses an ADD of a pod without a reservation can take.
    pub free: u128,
}

/// One network's ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkCapacity {
    /// The network's name.
    pub network: String,
    /// One per pod CIDR the node has and host-local can allocate from.
    pub ranges: Vec<RangeCapacity>,
}

/// What the agent reports for its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCapacity {
    /// Each network, in the agent's order.
    pub networks: Vec<NetworkCapacity>,
    /// The node's budget, when one applies ([`budget::node_budget`]).
    pub budget: Option<Budget>,
    /// Released reservations holding addresses on the node.
    pub released_reservations: u64,
}

impl NodeCapacity {
    /// How many more Released reservations the node may hold before the oldest yields (negative
    /// while the controller has not yet deleted those over it); `None` without a budget.
    pub fn headroom(&self) -> Option<i128> {
        self.budget
            .map(|b| i128::from(b.held) - i128::from(self.released_reservations))
    }

    /// The fewest free addresses of any range; `None` when no range is known.
    pub fn fewest_free(&self) -> Option<u128> {
        self.networks
            .iter()
            .flat_map(|n| &n.ranges)
            .map(|r| r.free)
            .min()
    }

    /// The Node annotations that say it, each with its value or `None` to remove it:
    /// [`FREE_ADDRESSES`] (removed while no range is known) and [`CAPACITY`].
    pub fn annotations(&self) -> [(&'static str, Option<String>); 2] {
        [
            (FREE_ADDRESSES, self.fewest_free().map(|f| f.to_string())),
            (CAPACITY, Some(self.to_string())),
        ]
    }
}

impl fmt::Display for NodeCapacity {
    /// `cbr0 10.244.1.0/24: 238 of 253 free (12 allocated, held by reservations: 11 Bound,
    /// 3 Released); budget headroom 140 of 143 (podCIDRs)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for n in &self.networks {
            if n.ranges.is_empty() {
                write!(
                    f,
                    "{}{}: no range known (the Node has no spec.podCIDRs)",
                    sep(first),
                    n.network
                )?;
                first = false;
            }
            for r in &n.ranges {
                write!(
                    f,
                    "{}{} {}: {} of {} free ({} allocated, held by reservations: {} Bound, {} Released)",
                    sep(first),
                    n.network,
                    r.cidr,
                    r.free,
                    r.addresses,
                    r.allocated,
                    r.bound,
                    r.released
                )?;
                first = false;
            }
        }
        match (self.budget, self.headroom()) {
            (Some(b), Some(h)) => write!(
                f,
                "; budget headroom {h} of {} ({})",
                b.held,
                b.source.as_str()
            ),
            _ => write!(f, "; no budget"),
        }
    }
}

fn sep(first: bool) -> &'static str {
    if first { "" } else { "; " }
}

/// The node's figures: each network's ranges from the Node's pod CIDRs (`facts`), the addresses
/// with an allocation file in each network (`allocations`, by network in the agent's order), and
/// the node's active reservations (`holdings`, the same in every network). The budget uses the
/// Node's annotation or its pod CIDRs, as the controller does without `--node-budget`.
pub fn node_capacity(
    facts: &NodeFacts,
    allocations: &[(String, Vec<IpAddr>)],
    holdings: &[Holding],
) -> NodeCapacity {
    let ranges: Vec<(&str, Range)> = facts
        .pod_cidrs
        .iter()
        .filter_map(|c| Some((c.as_str(), default_range(c)?)))
        .collect();
    let networks = allocations
        .iter()
        .map(|(network, allocated)| NetworkCapacity {
            network: network.clone(),
            ranges: ranges
                .iter()
                .map(|(cidr, range)| range_capacity(cidr, range, allocated, holdings))
                .collect(),
        })
        .collect();
    NodeCapacity {
        networks,
        budget: budget::node_budget(facts, None),
        released_reservations: holdings
            .iter()
            .filter(|h| h.holder == Holder::Released)
            .count() as u64,
    }
}

/// host-local's range for a pod CIDR given as its subnet and nothing else.
fn default_range(cidr: &str) -> Option<Range> {
    let spec = RangeSpec {
        subnet: Some(Cidr::parse(cidr)?),
        ..RangeSpec::default()
    };
    canonicalize_set(&[spec]).ok()?.ranges.first().copied()
}

fn range_capacity(
    cidr: &str,
    range: &Range,
    allocated: &[IpAddr],
    holdings: &[Holding],
) -> RangeCapacity {
    let usable = |ip: &IpAddr| range.contains(*ip) && *ip != range.gateway;
    let files: BTreeSet<IpAddr> = allocated.iter().copied().filter(usable).collect();
    let held = |holder: Holder| -> BTreeSet<IpAddr> {
        holdings
            .iter()
            .filter(|h| h.holder == holder)
            .flat_map(|h| h.ips.iter().map(|ip| addr::canonical(*ip)))
            .filter(usable)
            .collect()
    };
    let (bound, released) = (held(Holder::Bound), held(Holder::Released));
    let taken = files.union(&bound).copied().collect::<BTreeSet<_>>();
    let taken = taken.union(&released).count() as u128;
    let addresses = range
        .size()
        .saturating_sub(u128::from(range.contains(range.gateway)));
    RangeCapacity {
        cidr: cidr.to_owned(),
        addresses,
        allocated: files.len() as u64,
        bound: bound.len() as u64,
        released: released.len() as u64,
        free: addresses.saturating_sub(taken),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::budget::Source;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|s| ip(s)).collect()
    }

    fn facts(cidrs: &[&str], pods: Option<u64>) -> NodeFacts {
        NodeFacts {
            pod_cidrs: cidrs.iter().map(|c| (*c).to_owned()).collect(),
            allocatable_pods: pods,
            annotation: None,
        }
    }

    fn bound(list: &[&str]) -> Holding {
        Holding {
            holder: Holder::Bound,
            ips: ips(list),
        }
    }

    fn released(list: &[&str]) -> Holding {
        Holding {
            holder: Holder::Released,
            ips: ips(list),
        }
    }

    /// (addresses, allocated, bound, released, free) of each range of the first network.
    fn figures(c: &NodeCapacity) -> Vec<(u128, u64, u64, u64, u128)> {
        c.networks[0]
            .ranges
            .iter()
            .map(|r| (r.addresses, r.allocated, r.bound, r.released, r.free))
            .collect()
    }

    #[test]
    fn free_is_what_neither_a_container_nor_a_reservation_holds() {
        type Case = (
            &'static str,
            &'static [&'static str],
            Vec<Holding>,
            (u128, u64, u64, u64, u128),
        );
        let cases: Vec<Case> = vec![
            (
                "empty /29: 5 addresses, the gateway excluded",
                &[],
                vec![],
                (5, 0, 0, 0, 5),
            ),
            (
                "a running reserved pod: its address counted once",
                &["10.0.0.2"],
                vec![bound(&["10.0.0.2"])],
                (5, 1, 1, 0, 4),
            ),
            (
                "a Released reservation holds an address no container has",
                &["10.0.0.2"],
                vec![released(&["10.0.0.3"])],
                (5, 1, 0, 1, 3),
            ),
            (
                "a Released one whose address a container holds (GC not yet run)",
                &["10.0.0.3"],
                vec![released(&["10.0.0.3"])],
                (5, 1, 0, 1, 4),
            ),
            (
                "full: every address allocated or held",
                &["10.0.0.2", "10.0.0.3", "10.0.0.4"],
                vec![released(&["10.0.0.5"]), released(&["10.0.0.6"])],
                (5, 3, 0, 2, 0),
            ),
            (
                "addresses outside the range, the gateway and another family are not counted",
                &["10.0.0.1", "10.9.0.2", "fd00::2"],
                vec![bound(&["10.9.0.3", "fd00::3"]), released(&["10.0.0.0"])],
                (5, 0, 0, 0, 5),
            ),
            (
                "an IPv4-mapped address in a reservation is its IPv4 address",
                &[],
                vec![released(&["::ffff:10.0.0.4"])],
                (5, 0, 0, 1, 4),
            ),
        ];
        for (what, files, holding, want) in cases {
            let c = node_capacity(
                &facts(&["10.0.0.0/29"], None),
                &[("net".into(), ips(files))],
                &holding,
            );
            assert_eq!(figures(&c), vec![want], "{what}");
        }
    }

    #[test]
    fn every_network_has_every_family_and_the_budget_counts_released_reservations() {
        let c = node_capacity(
            &facts(&["10.244.1.0/28", "fd00:1::/120"], Some(8)),
            &[
                ("a".into(), ips(&["10.244.1.2", "fd00:1::2"])),
                ("b".into(), vec![]),
            ],
            &[
                released(&["10.244.1.3", "fd00:1::3"]),
                released(&["10.244.1.4", "fd00:1::4"]),
                bound(&["10.244.1.2", "fd00:1::2"]),
            ],
        );
        let a = &c.networks[0];
        assert_eq!(a.ranges.len(), 2);
        assert_eq!((a.ranges[0].addresses, a.ranges[0].free), (13, 10));
        assert_eq!((a.ranges[1].addresses, a.ranges[1].free), (254, 251));
        // Another network's directory has none of a's allocations, but the same reservations.
        let b = &c.networks[1];
        assert_eq!((b.ranges[0].allocated, b.ranges[0].free), (0, 10));
        assert_eq!(
            c.budget,
            Some(Budget {
                held: 5,
                source: Source::PodCidrs
            })
        );
        assert_eq!(c.released_reservations, 2);
        assert_eq!(c.headroom(), Some(3));
        assert_eq!(c.fewest_free(), Some(10));
        assert_eq!(
            c.annotations(),
            [
                (FREE_ADDRESSES, Some("10".to_owned())),
                (
                    CAPACITY,
                    Some("a 10.244.1.0/28: 10 of 13 free (1 allocated, held by reservations: 1 Bound, 2 Released); \
                     a fd00:1::/120: 251 of 254 free (1 allocated, held by reservations: 1 Bound, 2 Released); \
                     b 10.244.1.0/28: 10 of 13 free (0 allocated, held by reservations: 1 Bound, 2 Released); \
                     b fd00:1::/120: 251 of 254 free (0 allocated, held by reservations: 1 Bound, 2 Released); \
                     budget headroom 3 of 5 (podCIDRs)"
                        .to_owned())
                ),
            ]
        );
    }

    #[test]
    fn over_budget_is_a_negative_headroom_and_no_pod_cidr_no_range() {
        let mut f = facts(&[], None);
        f.annotation = Some("1".into());
        let c = node_capacity(
            &f,
            &[("net".into(), ips(&["10.0.0.2"]))],
            &[released(&["10.0.0.3"]), released(&["10.0.0.4"])],
        );
        assert_eq!(c.headroom(), Some(-1));
        assert_eq!(c.fewest_free(), None);
        assert_eq!(
            c.annotations(),
            [
                (FREE_ADDRESSES, None),
                (
                    CAPACITY,
                    Some(
                        "net: no range known (the Node has no spec.podCIDRs); budget headroom -1 of 1 (annotation)"
                            .to_owned()
                    )
                )
            ]
        );
        let none = node_capacity(&facts(&[], None), &[], &[]);
        assert_eq!(none.headroom(), None);
        assert_eq!(none.to_string(), "; no budget");
    }

    #[test]
    fn only_canonically_named_addresses_are_allocation_files() {
        let names = [
            "10.0.0.2",
            "fd00::2",
            "fd00:0::3",
            "010.0.0.4",
            "last_reserved_ip.0",
            "lock",
            "reserved",
            ".ipkeep",
        ];
        assert_eq!(allocated(names), ips(&["10.0.0.2", "fd00::2"]));
    }

    #[test]
    fn an_expired_reservation_holds_nothing() {
        let at = |s: &str| Timestamp::parse_rfc3339(s).unwrap();
        let file = |pod: &str, ip: &str, release: Option<&str>| ReservationFile {
            version: ipkeep_reservation::FORMAT_VERSION,
            namespace: "ns".into(),
            pod: pod.into(),
            ips: ips(&[ip]),
            release_time: release.map(at),
            uid: "u".into(),
            node_name: None,
            generation: None,
            retain_for_seconds: None,
        };
        let files = [
            file("bound", "10.0.0.2", None),
            file("released", "10.0.0.3", Some("2026-01-01T00:01:00Z")),
            file("expired", "10.0.0.4", Some("2026-01-01T00:00:00Z")),
        ];
        assert_eq!(
            holdings(&files, at("2026-01-01T00:00:00Z")),
            vec![bound(&["10.0.0.2"]), released(&["10.0.0.3"])]
        );
    }
}
