//! A node is never starved: how many addresses Released reservations may hold on one node
//! ([`node_budget`]), and which of them yield when more are held ([`yielding`]). Plain data in,
//! plain data out; no Kubernetes types, no clock.

use std::fmt;

use ipkeep_hostlocal::{
    addr::Cidr,
    range::{RangeSpec, canonicalize_set},
};
use jiff::Timestamp;

use crate::api::PodKey;

/// The Node annotation that sets its budget by hand (a whole number of Released reservations).
pub const NODE_BUDGET: &str = "ipkeep.dev/node-budget";

/// What the budget of one node is computed from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeFacts {
    /// `spec.podCIDRs` as written.
    pub pod_cidrs: Vec<String>,
    /// `status.allocatable.pods`, when the kubelet reported it.
    pub allocatable_pods: Option<u64>,
    /// The Node's [`NODE_BUDGET`] annotation as written, when set.
    pub annotation: Option<String>,
}

/// Where a node's budget came from (said in `Yielded` Events and the metric's label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The Node's [`NODE_BUDGET`] annotation.
    Annotation,
    /// `--node-budget`.
    Flag,
    /// The usable addresses of its pod CIDRs minus its allocatable pods.
    PodCidrs,
}

impl Source {
    /// The metric label and the word in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Annotation => "annotation",
            Source::Flag => "flag",
            Source::PodCidrs => "podCIDRs",
        }
    }
}

/// How many Released reservations may hold addresses on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// The number (each reservation holds at most one address per family).
    pub held: u64,
    /// Where it came from.
    pub source: Source,
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.source {
            Source::Annotation => write!(f, "{} (Node annotation {NODE_BUDGET})", self.held),
            Source::Flag => write!(f, "{} (--node-budget)", self.held),
            Source::PodCidrs => write!(
                f,
                "{} (the node's usable pod addresses minus its allocatable pods)",
                self.held
            ),
        }
    }
}

/// The budget of a node: its annotation, else `--node-budget` (`flag`), else for each family the
/// addresses host-local hands out from its pod CIDR with its default range (network, gateway and
/// the IPv4 broadcast address excluded) minus `status.allocatable.pods`, the smallest of the
/// families, so the kubelet can always run as many pods as it admits. `None` when nothing says
/// (no pod CIDR or no allocatable count yet, and no annotation or flag): no budget applies. A
/// malformed annotation is ignored (the next source applies).
pub fn node_budget(facts: &NodeFacts, flag: Option<u64>) -> Option<Budget> {
    if let Some(held) = facts
        .annotation
        .as_deref()
        .and_then(|a| a.trim().parse::<u64>().ok())
    {
        return Some(Budget {
            held,
            source: Source::Annotation,
        });
    }
    if let Some(held) = flag {
        return Some(Budget {
            held,
            source: Source::Flag,
        });
    }
    let pods = u128::from(facts.allocatable_pods?);
    let usable = facts
        .pod_cidrs
        .iter()
        .filter_map(|c| usable_addresses(c))
        .min()?;
    Some(Budget {
        held: u64::try_from(usable.saturating_sub(pods)).unwrap_or(u64::MAX),
        source: Source::PodCidrs,
    })
}

/// The addresses host-local hands out from `cidr` with its default range: the range's size
/// minus the gateway, which is its first address. `None` for what host-local refuses.
pub fn usable_addresses(cidr: &str) -> Option<u128> {
    let spec = RangeSpec {
        subnet: Some(Cidr::parse(cidr)?),
        ..RangeSpec::default()
    };
    let set = canonicalize_set(&[spec]).ok()?;
    set.ranges.first().map(|r| r.size().saturating_sub(1))
}

/// One Released reservation on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The reservation.
    pub key: PodKey,
    /// `status.releasedAt` (for one made by hand and never bound: its creation).
    pub released_at: Timestamp,
    /// Made by an admin for a pod that has not existed yet: yields last.
    pub by_hand: bool,
}

/// Which Released reservations of one node must yield so that at most `budget` hold addresses:
/// the earliest released first, those made by hand for a pod not yet seen last. Bound
/// reservations are never passed in: they never yield. Returned in the order they yield.
pub fn yielding(budget: u64, released: &[Held]) -> Vec<&Held> {
    let over = (released.len() as u64).saturating_sub(budget);
    let mut order: Vec<&Held> = released.iter().collect();
    order.sort_by(|a, b| {
        (a.by_hand, a.released_at, &a.key).cmp(&(b.by_hand, b.released_at, &b.key))
    });
    order.truncate(usize::try_from(over).unwrap_or(usize::MAX));
    order
}

/// The one that takes precedence over the yielding ones: the latest released that stays.
pub fn kept_latest<'a>(released: &'a [Held], yielded: &[&Held]) -> Option<&'a Held> {
    released
        .iter()
        .filter(|h| !yielded.iter().any(|y| y.key == h.key))
        .max_by(|a, b| (a.released_at, &a.key).cmp(&(b.released_at, &b.key)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(cidrs: &[&str], pods: Option<u64>, annotation: Option<&str>) -> NodeFacts {
        NodeFacts {
            pod_cidrs: cidrs.iter().map(|c| (*c).to_owned()).collect(),
            allocatable_pods: pods,
            annotation: annotation.map(str::to_owned),
        }
    }

    #[test]
    fn usable_addresses_are_host_locals_default_range_without_the_gateway() {
        let cases = [
            ("10.244.1.0/24", Some(253)),
            ("10.244.1.0/28", Some(13)),
            ("198.19.154.0/29", Some(5)),
            ("10.0.0.0/30", Some(1)),
            ("10.0.0.0/31", None),
            ("fd00::/120", Some(254)),
            ("fd00::/64", Some((1u128 << 64) - 2)),
            ("not a cidr", None),
        ];
        for (cidr, want) in cases {
            assert_eq!(usable_addresses(cidr), want, "{cidr}");
        }
    }

    #[test]
    fn the_budget_comes_from_the_annotation_the_flag_then_the_pod_cidrs() {
        let cases = [
            // /24 with 110 pods: 253 - 110.
            (
                facts(&["10.244.1.0/24"], Some(110), None),
                None,
                Some((143, Source::PodCidrs)),
            ),
            // /28 with maxPods 8: 13 - 8.
            (
                facts(&["10.244.1.0/28"], Some(8), None),
                None,
                Some((5, Source::PodCidrs)),
            ),
            // A range smaller than maxPods: nothing may be held.
            (
                facts(&["10.244.1.0/29"], Some(110), None),
                None,
                Some((0, Source::PodCidrs)),
            ),
            // Dual stack: the smaller family decides.
            (
                facts(&["10.244.1.0/24", "fd00::/64"], Some(110), None),
                None,
                Some((143, Source::PodCidrs)),
            ),
            (
                facts(&["10.244.1.0/24"], Some(110), None),
                Some(20),
                Some((20, Source::Flag)),
            ),
            (
                facts(&["10.244.1.0/24"], Some(110), Some("2")),
                Some(20),
                Some((2, Source::Annotation)),
            ),
            // A malformed annotation is passed over.
            (
                facts(&["10.244.1.0/24"], Some(110), Some("two")),
                None,
                Some((143, Source::PodCidrs)),
            ),
            // Not known yet: no budget.
            (facts(&[], Some(110), None), None, None),
            (facts(&["10.244.1.0/24"], None, None), None, None),
        ];
        for (f, flag, want) in cases {
            let got = node_budget(&f, flag).map(|b| (b.held, b.source));
            assert_eq!(got, want, "{f:?} flag {flag:?}");
        }
    }

    #[test]
    fn the_earliest_released_yield_first_and_those_made_by_hand_last() {
        let at = |s: &str| s.parse::<Timestamp>().unwrap();
        let held = |name: &str, when: &str, by_hand: bool| Held {
            key: PodKey::new("ns", name).unwrap(),
            released_at: at(when),
            by_hand,
        };
        let released = [
            held("c", "2026-01-03T00:00:00Z", false),
            held("admin", "2026-01-01T00:00:00Z", true),
            held("a", "2026-01-01T00:00:00Z", false),
            held("b", "2026-01-02T00:00:00Z", false),
        ];
        let names = |v: Vec<&Held>| {
            v.iter()
                .map(|h| h.key.name().to_owned())
                .collect::<Vec<_>>()
        };
        let cases: [(u64, &[&str]); 6] = [
            (4, &[]),
            (9, &[]),
            (3, &["a"]),
            (2, &["a", "b"]),
            (1, &["a", "b", "c"]),
            (0, &["a", "b", "c", "admin"]),
        ];
        for (budget, want) in cases {
            assert_eq!(names(yielding(budget, &released)), want, "budget {budget}");
        }
        let yielded = yielding(2, &released);
        assert_eq!(
            kept_latest(&released, &yielded).map(|h| h.key.name()),
            Some("c")
        );
    }
}
