//! Address ranges and range sets: host-local's canonicalisation rules, containment and overlap,
//! with the exact error texts.

use std::fmt;
use std::net::IpAddr;

use ipkeep_reservation::add::RangeSetView;

use crate::addr::{self, Cidr};

/// One configured range, as written (before canonicalisation).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeSpec {
    /// `subnet` (required: `None` is host-local's nil subnet).
    pub subnet: Option<Cidr>,
    /// `rangeStart`, if given.
    pub range_start: Option<IpAddr>,
    /// `rangeEnd`, if given.
    pub range_end: Option<IpAddr>,
    /// `gateway`, if given.
    pub gateway: Option<IpAddr>,
}

/// A canonical range: every address from `start` to `end` inclusive, inside `subnet`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    /// The subnet (network address, prefix).
    pub subnet: Cidr,
    /// First allocatable address.
    pub start: IpAddr,
    /// Last allocatable address.
    pub end: IpAddr,
    /// The gateway (never handed out by the iterator when it is in this range).
    pub gateway: IpAddr,
}

/// A canonical range set: the ranges one ADD allocates exactly one address from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeSet {
    /// The ranges, in configured order (all of one family).
    pub ranges: Vec<Range>,
}

/// Why a range or range set is invalid; the texts are host-local's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// No subnet.
    #[error("IP <nil> not v4 nor v6")]
    NoSubnet,
    /// Fewer than two host bits.
    #[error("Network {0} too small to allocate from")]
    TooSmall(Cidr),
    /// An IPv4-mapped address with an IPv6 mask.
    #[error("IPNet IP and Mask version mismatch")]
    MaskMismatch,
    /// The subnet address has host bits.
    #[error(
        "Network has host bits set. For a subnet mask of length {prefix} the network address is {network}"
    )]
    HostBits {
        /// Prefix length.
        prefix: u8,
        /// The network address it should have been.
        network: IpAddr,
    },
    /// `rangeStart` outside the subnet (or after `rangeEnd`).
    #[error("RangeStart {0} not in network {1}")]
    StartOutside(IpAddr, Cidr),
    /// `rangeEnd` outside the subnet (or before `rangeStart`).
    #[error("RangeEnd {0} not in network {1}")]
    EndOutside(IpAddr, Cidr),
    /// An empty range set.
    #[error("empty range set")]
    Empty,
    /// Ranges of both families in one set.
    #[error("mixed address families")]
    MixedFamilies,
    /// Two ranges of one set overlap.
    #[error("subnets {0} and {1} overlap")]
    Overlap(String, String),
}

/// host-local's `Range.Contains` during canonicalisation: in the subnet and within whichever of
/// start/end are known (compared as integers, as host-local's `ip.Cmp` does).
fn spec_contains(subnet: &Cidr, start: Option<IpAddr>, end: Option<IpAddr>, ip: IpAddr) -> bool {
    if ip.is_ipv4() != subnet.ip.is_ipv4() || !subnet.contains(ip) {
        return false;
    }
    let v = addr::to_u128(ip);
    start.is_none_or(|s| v >= addr::to_u128(s)) && end.is_none_or(|e| v <= addr::to_u128(e))
}

impl RangeSpec {
    /// host-local's `Range.Canonicalize`, step for step (the order decides which error is shown).
    pub fn canonicalize(&self) -> Result<Range, RangeError> {
        let subnet = self.subnet.ok_or(RangeError::NoSubnet)?;
        if subnet.prefix > subnet.mask_bits.saturating_sub(2) {
            return Err(RangeError::TooSmall(subnet));
        }
        if addr::family_bits(subnet.ip) != subnet.mask_bits {
            return Err(RangeError::MaskMismatch);
        }
        let network = subnet.network();
        if network != subnet.ip {
            return Err(RangeError::HostBits {
                prefix: subnet.prefix,
                network,
            });
        }
        let first = addr::next_ip(network);
        let gateway = self.gateway.unwrap_or(first);
        let start = match self.range_start {
            Some(s) => {
                if !spec_contains(&subnet, Some(s), self.range_end, s) {
                    return Err(RangeError::StartOutside(s, subnet));
                }
                s
            }
            None => first,
        };
        let end = match self.range_end {
            Some(e) => {
                if !spec_contains(&subnet, Some(start), Some(e), e) {
                    return Err(RangeError::EndOutside(e, subnet));
                }
                e
            }
            None => {
                // IPv4 leaves out the broadcast address; IPv6 includes the all-ones address.
                let last = subnet.last();
                if last.is_ipv4() {
                    addr::from_u128(addr::to_u128(last) - 1, true)
                } else {
                    last
                }
            }
        };
        Ok(Range {
            subnet,
            start,
            end,
            gateway,
        })
    }
}

impl Range {
    /// Whether `ip` is in this range (same family, in the subnet, start ≤ ip ≤ end).
    pub fn contains(&self, ip: IpAddr) -> bool {
        spec_contains(
            &self.subnet,
            Some(self.start),
            Some(self.end),
            addr::canonical(ip),
        )
    }

    /// host-local's `Range.Overlaps`.
    pub fn overlaps(&self, other: &Range) -> bool {
        self.start.is_ipv4() == other.start.is_ipv4()
            && (self.contains(other.start)
                || self.contains(other.end)
                || other.contains(self.start)
                || other.contains(self.end))
    }

    /// Number of addresses from start to end (inclusive).
    pub fn size(&self) -> u128 {
        (addr::to_u128(self.end) - addr::to_u128(self.start)).saturating_add(1)
    }
}

impl fmt::Display for Range {
    /// `<start>-<end>`, host-local's `Range.String()`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.start, self.end)
    }
}

/// host-local's `RangeSet.Canonicalize`.
pub fn canonicalize_set(specs: &[RangeSpec]) -> Result<RangeSet, RangeError> {
    if specs.is_empty() {
        return Err(RangeError::Empty);
    }
    let mut ranges: Vec<Range> = Vec::with_capacity(specs.len());
    for spec in specs {
        let r = spec.canonicalize()?;
        if let Some(first) = ranges.first()
            && first.start.is_ipv4() != r.start.is_ipv4()
        {
            return Err(RangeError::MixedFamilies);
        }
        ranges.push(r);
    }
    for (i, a) in ranges.iter().enumerate() {
        for b in &ranges[i + 1..] {
            if a.overlaps(b) {
                return Err(RangeError::Overlap(a.to_string(), b.to_string()));
            }
        }
    }
    Ok(RangeSet { ranges })
}

impl RangeSet {
    /// The range containing `ip`, if any.
    pub fn range_for(&self, ip: IpAddr) -> Option<&Range> {
        self.ranges.iter().find(|r| r.contains(ip))
    }

    /// Whether some range of the set contains `ip`.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.range_for(ip).is_some()
    }

    /// host-local's `RangeSet.Overlaps`.
    pub fn overlaps(&self, other: &RangeSet) -> bool {
        self.ranges
            .iter()
            .any(|a| other.ranges.iter().any(|b| a.overlaps(b)))
    }

    /// Whether the set is IPv4 (by its first range, as host-local counts families).
    pub fn is_ipv4(&self) -> bool {
        self.ranges.first().is_some_and(|r| r.start.is_ipv4())
    }
}

impl fmt::Display for RangeSet {
    /// The ranges joined with `,`, host-local's `RangeSet.String()`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

/// What the reservation decision asks of a range set: whether it holds an address, and why not.
impl RangeSetView for RangeSet {
    fn contains(&self, ip: IpAddr) -> bool {
        RangeSet::contains(self, ip)
    }

    fn why_unusable(&self, ip: IpAddr) -> Option<String> {
        let ip = ip.to_canonical();
        if let Some(range) = self.range_for(ip) {
            return (ip == range.gateway).then(|| format!("is the gateway of range {range}"));
        }
        let range = self
            .ranges
            .iter()
            .find(|r| r.subnet.ip.is_ipv4() == ip.is_ipv4() && r.subnet.contains(ip))?;
        let subnet = range.subnet;
        Some(if ip == subnet.network() {
            format!("is the network address of subnet {subnet}")
        } else if ip.is_ipv4() && ip == subnet.last() {
            format!("is the broadcast address of subnet {subnet}")
        } else {
            format!(
                "is not between rangeStart {} and rangeEnd {} of subnet {subnet}",
                range.start, range.end
            )
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::addr::parse_ip;

    fn spec(subnet: &str, start: &str, end: &str, gw: &str) -> RangeSpec {
        let ip = |s: &str| {
            if s.is_empty() {
                None
            } else {
                Some(parse_ip(s).unwrap())
            }
        };
        RangeSpec {
            subnet: Cidr::parse(subnet),
            range_start: ip(start),
            range_end: ip(end),
            gateway: ip(gw),
        }
    }

    #[test]
    fn canonicalisation_table() {
        // (subnet, start, end, gateway) -> Ok("start-end gw") or Err(text)
        type Case<'a> = (&'a str, &'a str, &'a str, &'a str, Result<&'a str, &'a str>);
        let cases: &[Case] = &[
            (
                "10.1.0.0/24",
                "",
                "",
                "",
                Ok("10.1.0.1-10.1.0.254 10.1.0.1"),
            ),
            ("10.1.0.0/30", "", "", "", Ok("10.1.0.1-10.1.0.2 10.1.0.1")),
            (
                "10.1.0.0/29",
                "",
                "",
                "10.1.0.3",
                Ok("10.1.0.1-10.1.0.6 10.1.0.3"),
            ),
            ("fd00::/126", "", "", "", Ok("fd00::1-fd00::3 fd00::1")),
            ("fd00::/120", "", "", "", Ok("fd00::1-fd00::ff fd00::1")),
            (
                "2001:db8:1::/64",
                "",
                "",
                "",
                Ok("2001:db8:1::1-2001:db8:1:0:ffff:ffff:ffff:ffff 2001:db8:1::1"),
            ),
            (
                "255.255.255.252/30",
                "",
                "",
                "",
                Ok("255.255.255.253-255.255.255.254 255.255.255.253"),
            ),
            ("0.0.0.0/24", "", "", "", Ok("0.0.0.1-0.0.0.254 0.0.0.1")),
            (
                "10.1.0.0/24",
                "10.1.0.0",
                "10.1.0.255",
                "",
                Ok("10.1.0.0-10.1.0.255 10.1.0.1"),
            ),
            (
                "10.1.0.0/24",
                "",
                "",
                "192.168.9.9",
                Ok("10.1.0.1-10.1.0.254 192.168.9.9"),
            ),
            (
                "10.1.0.0/24",
                "::ffff:10.1.0.5",
                "",
                "",
                Ok("10.1.0.5-10.1.0.254 10.1.0.1"),
            ),
            (
                "10.1.0.0/31",
                "",
                "",
                "",
                Err("Network 10.1.0.0/31 too small to allocate from"),
            ),
            (
                "10.1.0.1/31",
                "",
                "",
                "",
                Err("Network 10.1.0.1/31 too small to allocate from"),
            ),
            (
                "10.1.0.0/32",
                "",
                "",
                "",
                Err("Network 10.1.0.0/32 too small to allocate from"),
            ),
            (
                "fd00::/127",
                "",
                "",
                "",
                Err("Network fd00::/127 too small to allocate from"),
            ),
            (
                "::ffff:10.1.0.0/120",
                "",
                "",
                "",
                Err("IPNet IP and Mask version mismatch"),
            ),
            // Go prints an IPv4-mapped subnet with its mask's last 32 bits.
            (
                "::ffff:10.1.0.0/127",
                "",
                "",
                "",
                Err("Network 10.1.0.0/31 too small to allocate from"),
            ),
            (
                "::ffff:10.1.0.0/128",
                "",
                "",
                "",
                Err("Network 10.1.0.0/32 too small to allocate from"),
            ),
            (
                "10.1.0.1/24",
                "",
                "",
                "",
                Err(
                    "Network has host bits set. For a subnet mask of length 24 the network address is 10.1.0.0",
                ),
            ),
            (
                "2001:db8:24:19ff::/63",
                "",
                "",
                "",
                Err(
                    "Network has host bits set. For a subnet mask of length 63 the network address is 2001:db8:24:19fe::",
                ),
            ),
            (
                "192.0.2.0/24",
                "192.0.2.50",
                "192.0.2.40",
                "",
                Err("RangeStart 192.0.2.50 not in network 192.0.2.0/24"),
            ),
            (
                "192.0.2.0/24",
                "192.0.3.1",
                "",
                "",
                Err("RangeStart 192.0.3.1 not in network 192.0.2.0/24"),
            ),
            (
                "192.0.2.0/24",
                "",
                "192.0.3.1",
                "",
                Err("RangeEnd 192.0.3.1 not in network 192.0.2.0/24"),
            ),
            (
                "192.0.2.0/24",
                "",
                "fd00::1",
                "",
                Err("RangeEnd fd00::1 not in network 192.0.2.0/24"),
            ),
        ];
        for (subnet, start, end, gw, want) in cases {
            let got = spec(subnet, start, end, gw)
                .canonicalize()
                .map(|r| format!("{r} {}", r.gateway))
                .map_err(|e| e.to_string());
            assert_eq!(
                got.as_deref().map_err(|e| e.as_str()),
                *want,
                "{subnet} {start} {end} {gw}"
            );
        }
        assert_eq!(
            RangeSpec::default().canonicalize().unwrap_err().to_string(),
            "IP <nil> not v4 nor v6"
        );
    }

    #[test]
    fn set_rules() {
        assert_eq!(canonicalize_set(&[]).unwrap_err(), RangeError::Empty);
        assert_eq!(
            canonicalize_set(&[
                spec("10.1.0.0/24", "", "", ""),
                spec("fd00::/120", "", "", "")
            ])
            .unwrap_err(),
            RangeError::MixedFamilies
        );
        assert_eq!(
            canonicalize_set(&[
                spec("10.1.0.0/22", "", "", ""),
                spec("10.1.2.0/24", "", "", "")
            ])
            .unwrap_err()
            .to_string(),
            "subnets 10.1.0.1-10.1.3.254 and 10.1.2.1-10.1.2.254 overlap"
        );
        let set = canonicalize_set(&[
            spec("10.1.0.0/30", "", "", ""),
            spec("10.2.0.0/30", "", "", ""),
        ])
        .unwrap();
        assert_eq!(set.to_string(), "10.1.0.1-10.1.0.2,10.2.0.1-10.2.0.2");
        assert!(set.contains(parse_ip("10.2.0.2").unwrap()));
        assert!(!set.contains(parse_ip("10.2.0.3").unwrap()));
        assert!(set.contains(parse_ip("::ffff:10.1.0.1").unwrap()));
        let other = canonicalize_set(&[spec("10.2.0.0/24", "", "", "")]).unwrap();
        assert!(set.overlaps(&other));
        assert_eq!(set.ranges[0].size(), 2);
    }
}
