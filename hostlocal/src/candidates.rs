//! The order in which addresses of a range set are tried: host-local's round robin.
//!
//! Start just after the last reserved address if it lies in the set (wrapping from a range's end
//! to the next range's start, and from the last range to the first), otherwise at the first
//! range's start; skip each range's gateway; visit every address once, the last reserved address
//! itself being the final candidate.

use std::net::IpAddr;

use crate::addr;
use crate::range::{Range, RangeSet};

/// Iterator over the candidate addresses of one range set, each with the range it belongs to.
#[derive(Debug)]
pub struct Candidates<'a> {
    set: &'a RangeSet,
    range_idx: usize,
    cur: Option<IpAddr>,
    start: Option<IpAddr>,
    done: bool,
}

impl<'a> Candidates<'a> {
    /// Candidates of `set`, continuing after `last_reserved` when the set contains it.
    pub fn new(set: &'a RangeSet, last_reserved: Option<IpAddr>) -> Self {
        let resume = last_reserved.and_then(|last| {
            set.ranges
                .iter()
                .position(|r| r.contains(last))
                .map(|i| (i, last))
        });
        match resume {
            Some((range_idx, last)) => Self {
                set,
                range_idx,
                cur: Some(addr::canonical(last)),
                start: None,
                done: set.ranges.is_empty(),
            },
            None => Self {
                set,
                range_idx: 0,
                cur: None,
                start: set.ranges.first().map(|r| r.start),
                done: set.ranges.is_empty(),
            },
        }
    }

    fn range(&self) -> Option<&'a Range> {
        self.set.ranges.get(self.range_idx)
    }
}

impl<'a> Iterator for Candidates<'a> {
    type Item = (IpAddr, &'a Range);

    fn next(&mut self) -> Option<Self::Item> {
        // A loop rather than host-local's recursion, so that skipping gateways cannot nest.
        loop {
            if self.done {
                return None;
            }
            let mut r = self.range()?;
            let Some(cur) = self.cur else {
                self.cur = Some(r.start);
                self.start = Some(r.start);
                if r.start == r.gateway {
                    continue;
                }
                return Some((r.start, r));
            };
            let next = if cur == r.end {
                self.range_idx = (self.range_idx + 1) % self.set.ranges.len();
                r = self.range()?;
                r.start
            } else {
                addr::next_ip(cur)
            };
            self.cur = Some(next);
            match self.start {
                None => self.start = Some(next),
                Some(start) if start == next => {
                    self.done = true;
                    return None;
                }
                Some(_) => {}
            }
            if next == r.gateway {
                continue;
            }
            return Some((next, r));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::addr::{Cidr, parse_ip};
    use crate::range::{RangeSpec, canonicalize_set};

    fn set(subnets: &[(&str, &str)]) -> RangeSet {
        let specs: Vec<RangeSpec> = subnets
            .iter()
            .map(|(s, gw)| RangeSpec {
                subnet: Cidr::parse(s),
                gateway: if gw.is_empty() { None } else { parse_ip(gw) },
                ..RangeSpec::default()
            })
            .collect();
        canonicalize_set(&specs).unwrap()
    }

    fn order(set: &RangeSet, last: &str) -> Vec<String> {
        Candidates::new(set, parse_ip(last))
            .map(|(ip, _)| ip.to_string())
            .collect()
    }

    #[test]
    fn candidate_order_table() {
        let s29 = set(&[("10.1.0.0/29", "")]);
        let s29_gw3 = set(&[("10.1.0.0/29", "10.1.0.3")]);
        let two = set(&[("10.1.0.0/30", ""), ("10.2.0.0/30", "")]);
        let v6 = set(&[("fd00::/126", "")]);
        let cases: Vec<(&RangeSet, &str, Vec<&str>)> = vec![
            (
                &s29,
                "",
                vec!["10.1.0.2", "10.1.0.3", "10.1.0.4", "10.1.0.5", "10.1.0.6"],
            ),
            (
                &s29,
                "10.1.0.5",
                vec!["10.1.0.6", "10.1.0.2", "10.1.0.3", "10.1.0.4", "10.1.0.5"],
            ),
            (
                &s29,
                "10.1.0.6",
                vec!["10.1.0.2", "10.1.0.3", "10.1.0.4", "10.1.0.5", "10.1.0.6"],
            ),
            (
                &s29,
                "10.9.9.9",
                vec!["10.1.0.2", "10.1.0.3", "10.1.0.4", "10.1.0.5", "10.1.0.6"],
            ),
            (
                &s29_gw3,
                "",
                vec!["10.1.0.1", "10.1.0.2", "10.1.0.4", "10.1.0.5", "10.1.0.6"],
            ),
            (&two, "", vec!["10.1.0.2", "10.2.0.2"]),
            (&two, "10.1.0.2", vec!["10.2.0.2", "10.1.0.2"]),
            (&two, "10.2.0.2", vec!["10.1.0.2", "10.2.0.2"]),
            (&v6, "", vec!["fd00::2", "fd00::3"]),
            (&v6, "fd00::3", vec!["fd00::2", "fd00::3"]),
        ];
        for (set, last, want) in cases {
            assert_eq!(order(set, last), want, "set {set} last {last:?}");
        }
    }

    #[test]
    fn last_candidate_is_the_last_reserved_one() {
        let s29 = set(&[("10.1.0.0/29", "")]);
        assert_eq!(
            order(&s29, "10.1.0.3").last().map(String::as_str),
            Some("10.1.0.3")
        );
    }

    #[test]
    fn edge_of_the_v4_space() {
        let top = set(&[("255.255.255.252/30", "")]);
        assert_eq!(order(&top, ""), vec!["255.255.255.254"]);
        assert_eq!(order(&top, "255.255.255.254"), vec!["255.255.255.254"]);
    }

    #[test]
    fn huge_v6_range_starts_lazily() {
        let s = set(&[("2001:db8:1::/64", "")]);
        let first: Vec<String> = Candidates::new(&s, None)
            .take(2)
            .map(|(ip, _)| ip.to_string())
            .collect();
        assert_eq!(first, vec!["2001:db8:1::2", "2001:db8:1::3"]);
        let wrap: Vec<String> = Candidates::new(&s, parse_ip("2001:db8:1::ffff:ffff:ffff:ffff"))
            .take(1)
            .map(|(ip, _)| ip.to_string())
            .collect();
        assert_eq!(wrap, vec!["2001:db8:1::2"]);
    }
}
