//! Pools: their deterministic identifiers, their range sets, and the candidates handed out when a
//! network is created without a subnet.
//!
//! A pool's ID is made of its address space, subnet and container range only, so a network
//! removed and created again with the same subnet (`compose down` / `up`) finds the same pool
//! directory and the same reservations. IDs are also directory names: they never contain `/`.

use std::fmt;
use std::net::IpAddr;

use ipkeep_hostlocal::addr::{self, Cidr};
use ipkeep_hostlocal::range::{RangeError, RangeSet, RangeSpec, canonicalize_set};

/// The local default address space's name.
pub const LOCAL_SPACE: &str = "ipkeep-local";
/// The global default address space's name.
pub const GLOBAL_SPACE: &str = "ipkeep-global";
/// The longest pool ID accepted (two IPv6 CIDRs and a space name fit well within it).
const MAX_POOL_ID: usize = 160;

/// Why a pool could not be named or parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// The address space is not one this driver serves.
    #[error(
        "failed to use address space {0:?}: ipkeep-docker serves {LOCAL_SPACE:?} and {GLOBAL_SPACE:?}"
    )]
    AddressSpace(String),
    /// The pool is not a CIDR.
    #[error("failed to parse pool {0:?}: expected a subnet such as 198.18.0.0/24")]
    Cidr(String),
    /// The pool is a CIDR the range rules refuse (host bits, too small).
    #[error("failed to use pool {pool}")]
    Range {
        /// The pool as given.
        pool: String,
        /// Why.
        #[source]
        source: RangeError,
    },
    /// A container range without a pool, or outside it.
    #[error(
        "failed to use sub-pool {sub_pool:?} of pool {pool:?}: it must be a subnet inside the pool"
    )]
    SubPool {
        /// The pool as given.
        pool: String,
        /// The sub-pool as given.
        sub_pool: String,
    },
    /// A pool ID this driver never handed out.
    #[error("failed to find pool {0:?}: not a pool ID ipkeep-docker hands out")]
    Id(String),
}

/// One pool: address space, subnet and optional container range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolSpec {
    /// Whether the pool lives in the global address space.
    pub global: bool,
    /// The subnet (network address, prefix).
    pub subnet: Cidr,
    /// The container range (`--ip-range`), when it is narrower than the subnet.
    pub sub_pool: Option<Cidr>,
}

/// `a.b.c.d-len`: a CIDR as a path component.
fn cidr_component(c: &Cidr) -> String {
    format!("{}-{}", c.ip, c.prefix)
}

fn parse_component(text: &str) -> Option<Cidr> {
    let (ip, prefix) = text.rsplit_once('-')?;
    Cidr::parse(&format!("{ip}/{prefix}"))
}

/// Parses a subnet that must be its own network address (no host bits) and big enough.
fn parse_subnet(text: &str) -> Result<Cidr, PoolError> {
    let cidr = Cidr::parse(text).ok_or_else(|| PoolError::Cidr(text.to_owned()))?;
    let spec = RangeSpec {
        subnet: Some(cidr),
        ..RangeSpec::default()
    };
    spec.canonicalize().map_err(|source| PoolError::Range {
        pool: text.to_owned(),
        source,
    })?;
    Ok(cidr)
}

impl PoolSpec {
    /// The pool a `RequestPool` names (`pool` non-empty), checked.
    pub fn from_request(space: &str, pool: &str, sub_pool: &str) -> Result<Self, PoolError> {
        let global = space_is_global(space)?;
        let bad_sub = || PoolError::SubPool {
            pool: pool.to_owned(),
            sub_pool: sub_pool.to_owned(),
        };
        if pool.is_empty() {
            return Err(bad_sub());
        }
        let subnet = parse_subnet(pool)?;
        let sub_pool = match sub_pool {
            "" => None,
            text => {
                let sub = Cidr::parse(text).ok_or_else(bad_sub)?;
                let inside = sub.ip == sub.network()
                    && sub.prefix >= subnet.prefix
                    && subnet.contains(sub.ip)
                    && subnet.contains(sub.last());
                if !inside {
                    return Err(bad_sub());
                }
                (sub != subnet).then_some(sub)
            }
        };
        Ok(Self {
            global,
            subnet,
            sub_pool,
        })
    }

    /// The pool's ID: `<space>_<subnet>[_<sub-pool>]`, with `-` for `/`.
    pub fn id(&self) -> String {
        let space = if self.global {
            GLOBAL_SPACE
        } else {
            LOCAL_SPACE
        };
        let mut id = format!("{space}_{}", cidr_component(&self.subnet));
        if let Some(sub) = &self.sub_pool {
            id.push('_');
            id.push_str(&cidr_component(sub));
        }
        id
    }

    /// Parses an ID [`PoolSpec::id`] made; anything else (`..`, `/`, garbage) is refused.
    pub fn parse_id(id: &str) -> Result<Self, PoolError> {
        let bad = || PoolError::Id(id.chars().take(MAX_POOL_ID).collect());
        if id.len() > MAX_POOL_ID {
            return Err(bad());
        }
        let mut parts = id.split('_');
        let global = match parts.next() {
            Some(LOCAL_SPACE) => false,
            Some(GLOBAL_SPACE) => true,
            _ => return Err(bad()),
        };
        let subnet = parts.next().and_then(parse_component).ok_or_else(bad)?;
        let sub_pool = match parts.next() {
            None => None,
            Some(text) => Some(parse_component(text).ok_or_else(bad)?),
        };
        let spec = Self {
            global,
            subnet,
            sub_pool,
        };
        // Only the canonical spelling is an ID: this refuses every other text for the same pool.
        if parts.next().is_some() || spec.id() != id || spec.range_set().is_err() {
            return Err(bad());
        }
        Ok(spec)
    }

    /// The pool in CIDR form, as the engine expects it back.
    pub fn cidr(&self) -> String {
        self.subnet.to_string()
    }

    /// The addresses containers are given: the sub-pool if any, else the subnet, without the
    /// network address (and, for IPv4, the broadcast address). Every address is allocatable: the
    /// gateway is whatever the engine asks for, so the range's own gateway is the network address
    /// (never in the range).
    pub fn range_set(&self) -> Result<RangeSet, RangeError> {
        let network = self.subnet.network();
        let (range_start, range_end) = match &self.sub_pool {
            None => (None, None),
            Some(sub) => {
                let first = addr::next_ip(network);
                let last_host = if self.subnet.ip.is_ipv4() {
                    addr::from_u128(addr::to_u128(self.subnet.last()) - 1, true)
                } else {
                    self.subnet.last()
                };
                let start = max_ip(sub.network(), first);
                let end = min_ip(sub.last(), last_host);
                (Some(start), Some(end))
            }
        };
        canonicalize_set(&[RangeSpec {
            subnet: Some(self.subnet),
            range_start,
            range_end,
            gateway: Some(network),
        }])
    }

    /// Whether `ip` is inside the subnet (the engine's aux addresses may lie outside the range).
    pub fn subnet_contains(&self, ip: IpAddr) -> bool {
        self.subnet.contains(addr::canonical(ip))
    }
}

fn max_ip(a: IpAddr, b: IpAddr) -> IpAddr {
    if addr::to_u128(a) >= addr::to_u128(b) {
        a
    } else {
        b
    }
}

fn min_ip(a: IpAddr, b: IpAddr) -> IpAddr {
    if addr::to_u128(a) <= addr::to_u128(b) {
        a
    } else {
        b
    }
}

/// Whether `space` is the global space; an error for a space this driver does not serve.
pub fn space_is_global(space: &str) -> Result<bool, PoolError> {
    match space {
        LOCAL_SPACE => Ok(false),
        GLOBAL_SPACE => Ok(true),
        other => Err(PoolError::AddressSpace(other.to_owned())),
    }
}

/// Where pools of the driver's choosing come from: `base` cut into subnets of `prefix` bits
/// (`172.16.0.0/12:16` unless configured: Docker's own default range, cut the same way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AutoPools {
    /// The range the candidates are cut from.
    pub base: Cidr,
    /// Each candidate's prefix length.
    pub prefix: u8,
}

/// The most candidates ever tried for one request (a /8 cut into /24s).
const MAX_CANDIDATES: u128 = 1 << 16;

impl AutoPools {
    /// Parses `<cidr>:<prefix>` (IPv4 only: IPv6 networks name their subnet).
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "failed to parse auto pools {text:?}: expected <IPv4 subnet>:<prefix>, e.g. 172.16.0.0/12:16, with the prefix no shorter than the subnet's and at most 30"
            )
        };
        let (base, prefix) = text.rsplit_once(':').ok_or_else(bad)?;
        let base = Cidr::parse(base).filter(|c| c.ip.is_ipv4() && c.ip == c.network());
        let base = base.ok_or_else(bad)?;
        let prefix: u8 = prefix.parse().map_err(|_| bad())?;
        if prefix < base.prefix || prefix > 30 {
            return Err(bad());
        }
        Ok(Self { base, prefix })
    }

    /// The candidate subnets, in order (at most [`MAX_CANDIDATES`]).
    pub fn candidates(&self) -> impl Iterator<Item = Cidr> + '_ {
        let step = 1u128 << (32 - u32::from(self.prefix));
        let count =
            (1u128 << (u32::from(self.prefix) - u32::from(self.base.prefix))).min(MAX_CANDIDATES);
        let start = addr::to_u128(self.base.network());
        (0..count).map(move |i| Cidr {
            ip: addr::from_u128(start + i * step, true),
            prefix: self.prefix,
            mask_bits: 32,
        })
    }
}

impl fmt::Display for AutoPools {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.base, self.prefix)
    }
}

/// The first candidate that is not in use (`in_use` says, by pool); `None` when all are.
pub fn choose_candidate(
    auto: &AutoPools,
    global: bool,
    mut in_use: impl FnMut(&PoolSpec) -> bool,
) -> Option<PoolSpec> {
    auto.candidates()
        .map(|subnet| PoolSpec {
            global,
            subnet,
            sub_pool: None,
        })
        .find(|spec| !in_use(spec))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_refuse_everything_else() {
        let cases = [
            (
                LOCAL_SPACE,
                "198.18.5.0/24",
                "",
                "ipkeep-local_198.18.5.0-24",
            ),
            (
                GLOBAL_SPACE,
                "198.18.0.0/16",
                "198.18.7.0/24",
                "ipkeep-global_198.18.0.0-16_198.18.7.0-24",
            ),
            (
                LOCAL_SPACE,
                "198.18.5.0/24",
                "198.18.5.0/24",
                "ipkeep-local_198.18.5.0-24",
            ),
            (LOCAL_SPACE, "fd00:1::/64", "", "ipkeep-local_fd00:1::-64"),
        ];
        for (space, pool, sub, id) in cases {
            let spec = PoolSpec::from_request(space, pool, sub).unwrap();
            assert_eq!(spec.id(), id);
            assert_eq!(PoolSpec::parse_id(id).unwrap(), spec, "{id}");
        }
        for bad in [
            "",
            "..",
            "../etc",
            "ipkeep-local_198.18.5.0-24/..",
            "ipkeep-local_198.18.5.1-24",
            "ipkeep-local_198.18.5.0-24_",
            "ipkeep-local_198.18.5.0-24_x",
            "ipkeep-local_198.18.5.0-24_198.18.5.0-25_1",
            "ipkeep-local_198.18.5.0-31",
            "other_198.18.5.0-24",
            "ipkeep-local_198.018.5.0-24",
            "LocalDefault/198.18.5.0/24",
        ] {
            assert!(PoolSpec::parse_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn request_validation_table() {
        let cases: &[(&str, &str, &str, &str)] = &[
            (
                "default",
                "198.18.0.0/24",
                "",
                "failed to use address space \"default\"",
            ),
            (
                LOCAL_SPACE,
                "198.18.0.1/24",
                "",
                "Network has host bits set",
            ),
            (
                LOCAL_SPACE,
                "198.18.0.0/31",
                "",
                "too small to allocate from",
            ),
            (LOCAL_SPACE, "banana", "", "failed to parse pool \"banana\""),
            (
                LOCAL_SPACE,
                "",
                "198.18.0.0/25",
                "it must be a subnet inside the pool",
            ),
            (
                LOCAL_SPACE,
                "198.18.0.0/24",
                "198.18.1.0/25",
                "it must be a subnet inside the pool",
            ),
            (
                LOCAL_SPACE,
                "198.18.0.0/24",
                "198.18.0.0/23",
                "it must be a subnet inside the pool",
            ),
            (
                LOCAL_SPACE,
                "198.18.0.0/24",
                "198.18.0.1/25",
                "it must be a subnet inside the pool",
            ),
        ];
        for (space, pool, sub, want) in cases {
            let e = PoolSpec::from_request(space, pool, sub).unwrap_err();
            let err = ipkeep_reservation::error_chain(&e);
            assert!(err.contains(want), "{pool} {sub}: {err}");
            if let Some(source) = std::error::Error::source(&e) {
                assert!(
                    !e.to_string().contains(&source.to_string()),
                    "{pool} {sub}: {e} repeats its source"
                );
            }
        }
    }

    #[test]
    fn range_sets_leave_out_network_and_broadcast() {
        let set = |pool: &str, sub: &str| {
            PoolSpec::from_request(LOCAL_SPACE, pool, sub)
                .unwrap()
                .range_set()
                .unwrap()
                .to_string()
        };
        assert_eq!(set("198.18.0.0/24", ""), "198.18.0.1-198.18.0.254");
        assert_eq!(
            set("198.18.0.0/24", "198.18.0.128/25"),
            "198.18.0.128-198.18.0.254"
        );
        assert_eq!(
            set("198.18.0.0/24", "198.18.0.0/25"),
            "198.18.0.1-198.18.0.127"
        );
        assert_eq!(set("fd00::/120", ""), "fd00::1-fd00::ff");
    }

    #[test]
    fn candidates_skip_pools_in_use_and_run_out() {
        let auto = AutoPools::parse("198.18.0.0/22:24").unwrap();
        let taken = ["198.18.0.0/24", "198.18.2.0/24"];
        let chosen = choose_candidate(&auto, false, |s| {
            taken.contains(&s.subnet.to_string().as_str())
        });
        assert_eq!(chosen.unwrap().id(), "ipkeep-local_198.18.1.0-24");
        assert_eq!(choose_candidate(&auto, false, |_| true), None);
        assert_eq!(auto.candidates().count(), 4);
        for bad in [
            "198.18.0.0/22",
            "198.18.0.0/22:21",
            "198.18.0.1/22:24",
            "fd00::/64:80",
            "x:24",
        ] {
            assert!(AutoPools::parse(bad).is_err(), "{bad}");
        }
    }
}
