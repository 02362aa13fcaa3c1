//! IP address text and arithmetic exactly as host-local (Go 1.19's `net` package) handles them.
//!
//! Addresses are canonicalised the way host-local's `canonicalizeIP` does: an IPv4-mapped IPv6
//! address (`::ffff:10.1.0.9`) *is* the IPv4 address. Arithmetic uses `u128` for both families.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

const BIG: u32 = 0xFF_FFFF;

/// Go's `dtoi`: leading decimal digits; `None` if there are none or the value overflows.
fn dtoi(s: &[u8]) -> Option<(u32, usize)> {
    let mut n: u32 = 0;
    let mut i = 0;
    while i < s.len() && s[i].is_ascii_digit() {
        n = n * 10 + u32::from(s[i] - b'0');
        if n >= BIG {
            return None;
        }
        i += 1;
    }
    if i == 0 { None } else { Some((n, i)) }
}

/// Go's `xtoi`: leading hex digits.
fn xtoi(s: &[u8]) -> Option<(u32, usize)> {
    let mut n: u32 = 0;
    let mut i = 0;
    while i < s.len() {
        let Some(d) = char::from(s[i]).to_digit(16) else {
            break;
        };
        n = n * 16 + d;
        if n >= BIG {
            return None;
        }
        i += 1;
    }
    if i == 0 { None } else { Some((n, i)) }
}

/// Go 1.19 `parseIPv4` (rejects leading zeros).
fn parse_v4(mut s: &[u8]) -> Option<[u8; 4]> {
    let mut p = [0u8; 4];
    for (i, slot) in p.iter_mut().enumerate() {
        if s.is_empty() {
            return None;
        }
        if i > 0 {
            if s[0] != b'.' {
                return None;
            }
            s = &s[1..];
        }
        let (n, c) = dtoi(s)?;
        if n > 0xFF || (c > 1 && s[0] == b'0') {
            return None;
        }
        s = &s[c..];
        *slot = u8::try_from(n).ok()?;
    }
    if s.is_empty() { Some(p) } else { None }
}

/// Go 1.19 `parseIPv6` (no zone).
fn parse_v6(mut s: &[u8]) -> Option<[u8; 16]> {
    let mut ip = [0u8; 16];
    let mut ellipsis: Option<usize> = None;
    if s.len() >= 2 && s[0] == b':' && s[1] == b':' {
        ellipsis = Some(0);
        s = &s[2..];
        if s.is_empty() {
            return Some(ip);
        }
    }
    let mut i = 0;
    while i < 16 {
        let (n, c) = xtoi(s)?;
        if n > 0xFFFF {
            return None;
        }
        if c < s.len() && s[c] == b'.' {
            if ellipsis.is_none() && i != 12 {
                return None;
            }
            if i + 4 > 16 {
                return None;
            }
            let v4 = parse_v4(s)?;
            ip[i..i + 4].copy_from_slice(&v4);
            s = &[];
            i += 4;
            break;
        }
        ip[i] = (n >> 8) as u8;
        ip[i + 1] = n as u8;
        i += 2;
        s = &s[c..];
        if s.is_empty() {
            break;
        }
        if s[0] != b':' || s.len() == 1 {
            return None;
        }
        s = &s[1..];
        if s[0] == b':' {
            if ellipsis.is_some() {
                return None;
            }
            ellipsis = Some(i);
            s = &s[1..];
            if s.is_empty() {
                break;
            }
        }
    }
    if !s.is_empty() {
        return None;
    }
    if i < 16 {
        let e = ellipsis?;
        let n = 16 - i;
        for j in (e..i).rev() {
            ip[j + n] = ip[j];
        }
        for slot in &mut ip[e..e + n] {
            *slot = 0;
        }
    } else if ellipsis.is_some() {
        return None;
    }
    Some(ip)
}

/// host-local's canonical form: IPv4-mapped IPv6 addresses become IPv4.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// Go's `net.ParseIP`, canonicalised.
pub fn parse_ip(s: &str) -> Option<IpAddr> {
    let b = s.as_bytes();
    for &c in b {
        if c == b'.' {
            return parse_v4(b).map(|p| IpAddr::V4(Ipv4Addr::from(p)));
        }
        if c == b':' {
            return parse_v6(b).map(|p| canonical(IpAddr::V6(Ipv6Addr::from(p))));
        }
    }
    None
}

/// A CIDR as Go's `net.ParseCIDR` returns it: the address as written (host bits kept,
/// canonicalised) and the mask (its length and whether it is an IPv6-sized mask).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    /// The address as written, canonicalised.
    pub ip: IpAddr,
    /// The prefix length.
    pub prefix: u8,
    /// The mask's size in bits (32 or 128): a mapped address with a /120 keeps a 128-bit mask.
    pub mask_bits: u8,
}

impl Cidr {
    /// Go's `net.ParseCIDR`; `None` where Go says `invalid CIDR address`.
    pub fn parse(s: &str) -> Option<Self> {
        let (addr, mask) = s.split_once('/')?;
        let (ip, bits) = match parse_v4(addr.as_bytes()) {
            Some(p) => (IpAddr::V4(Ipv4Addr::from(p)), 32u32),
            None => (
                IpAddr::V6(Ipv6Addr::from(parse_v6(addr.as_bytes())?)),
                128u32,
            ),
        };
        let (n, used) = dtoi(mask.as_bytes())?;
        if used != mask.len() || n > bits {
            return None;
        }
        Some(Self {
            ip: canonical(ip),
            prefix: u8::try_from(n).ok()?,
            mask_bits: u8::try_from(bits).ok()?,
        })
    }

    /// The network address (host bits cleared).
    pub fn network(&self) -> IpAddr {
        let bits = family_bits(self.ip);
        let host_bits = u32::from(bits).saturating_sub(u32::from(self.prefix));
        let mask = if host_bits >= 128 {
            0
        } else {
            u128::MAX << host_bits
        };
        from_u128(to_u128(self.ip) & mask, self.ip.is_ipv4())
    }

    /// The last address of the subnet (all host bits set).
    pub fn last(&self) -> IpAddr {
        let bits = family_bits(self.ip);
        let host_bits = u32::from(bits).saturating_sub(u32::from(self.prefix));
        let host_mask = if host_bits >= 128 {
            u128::MAX
        } else {
            (1u128 << host_bits) - 1
        };
        from_u128(to_u128(self.ip) | host_mask, self.ip.is_ipv4())
    }

    /// Whether `ip` is inside this subnet (same family).
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.ip.is_ipv4() && {
            let net = to_u128(self.network());
            let last = to_u128(self.last());
            (net..=last).contains(&to_u128(ip))
        }
    }
}

impl std::fmt::Display for Cidr {
    /// Go's `IPNet.String()`: the address as written and the prefix length. An IPv4(-mapped)
    /// address with an IPv6-sized mask prints the mask's last 32 bits (`::ffff:10.1.0.0/127` is
    /// `10.1.0.0/31`), as Go does.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let prefix = if self.ip.is_ipv4() && self.mask_bits == 128 {
            self.prefix.saturating_sub(96)
        } else {
            self.prefix
        };
        write!(f, "{}/{}", self.ip, prefix)
    }
}

/// Number of bits of `ip`'s family.
pub fn family_bits(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { 32 } else { 128 }
}

/// The address as an integer (host-local's `ipToInt`).
pub fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The address of integer `v` in the given family (truncated to 32 bits for IPv4).
pub fn from_u128(v: u128, v4: bool) -> IpAddr {
    if v4 {
        IpAddr::V4(Ipv4Addr::from(v as u32))
    } else {
        IpAddr::V6(Ipv6Addr::from(v))
    }
}

/// The next address (wrapping at the end of the family's space).
pub fn next_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(Ipv4Addr::from(u32::from(v4).wrapping_add(1))),
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6).wrapping_add(1))),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn parse_ip_like_go_1_19() {
        let cases: &[(&str, Option<&str>)] = &[
            ("10.1.0.2", Some("10.1.0.2")),
            ("255.255.255.254", Some("255.255.255.254")),
            ("010.1.0.2", None),
            ("10.1.0", None),
            ("10.1.0.256", None),
            ("10.1.0.2.", None),
            ("2001:DB8:0:0:0:0:0:00AB", Some("2001:db8::ab")),
            ("::ffff:10.1.0.9", Some("10.1.0.9")),
            ("::", Some("::")),
            ("fd00::1:2", Some("fd00::1:2")),
            ("1:2:3:4:5:6:7:8", Some("1:2:3:4:5:6:7:8")),
            ("1:2:3:4:5:6:7::", Some("1:2:3:4:5:6:7:0")),
            ("1:2:3:4:5:6:7:8:9", None),
            ("1::2::3", None),
            ("fe80::1%eth0", None),
            ("::1.2.3.4", Some("::102:304")),
            ("", None),
            ("foo", None),
            ("10.1.0.2/24", None),
        ];
        for (input, want) in cases {
            assert_eq!(
                parse_ip(input).map(|ip| ip.to_string()).as_deref(),
                *want,
                "{input}"
            );
        }
    }

    #[test]
    fn parse_cidr_like_go() {
        let c = Cidr::parse("10.1.0.1/31").unwrap();
        assert_eq!(c.to_string(), "10.1.0.1/31");
        assert_eq!(c.network().to_string(), "10.1.0.0");
        assert_eq!(c.last().to_string(), "10.1.0.1");
        let m = Cidr::parse("::ffff:10.1.0.0/120").unwrap();
        assert_eq!(
            (m.ip.to_string(), m.prefix, m.mask_bits),
            ("10.1.0.0".into(), 120, 128)
        );
        for bad in [
            "10.1.0.0/33",
            "10.1.0.0",
            "10.1.0.0/",
            "10.1.0.0/2x",
            "x/24",
            "fd00::/129",
            "",
        ] {
            assert!(Cidr::parse(bad).is_none(), "{bad}");
        }
        assert_eq!(Cidr::parse("10.1.0.0/024").unwrap().prefix, 24);
        let v6 = Cidr::parse("2001:db8:24:19ff::/63").unwrap();
        assert_eq!(v6.network().to_string(), "2001:db8:24:19fe::");
        assert_eq!(
            Cidr::parse("0.0.0.0/0").unwrap().last().to_string(),
            "255.255.255.255"
        );
        assert_eq!(
            Cidr::parse("::/0").unwrap().last().to_string(),
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
        );
    }

    #[test]
    fn arithmetic() {
        assert_eq!(
            next_ip(parse_ip("10.1.0.255").unwrap()).to_string(),
            "10.1.1.0"
        );
        assert_eq!(
            next_ip(parse_ip("fd00::ffff").unwrap()).to_string(),
            "fd00::1:0"
        );
        assert_eq!(next_ip(parse_ip("0.0.0.0").unwrap()).to_string(), "0.0.0.1");
        let c = Cidr::parse("10.1.0.0/24").unwrap();
        assert!(c.contains(parse_ip("10.1.0.255").unwrap()));
        assert!(!c.contains(parse_ip("10.1.1.0").unwrap()));
        assert!(!c.contains(parse_ip("::a01:2").unwrap()));
    }
}
