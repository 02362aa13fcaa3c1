//! Allocation of one address from one range set: host-local's `IPAllocator.Get`, over any
//! [`Store`].
//!
//! The reservation seam: a request carries an optional *preferred* address (tried first) and an
//! `is_blocked` predicate (addresses never handed out by the round robin, e.g. those another pod's
//! reservation holds). With no preference and nothing blocked this is exactly host-local.

use std::net::IpAddr;

use crate::candidates::Candidates;
use crate::range::RangeSet;
use crate::result::IpConfig;
use crate::store::{Store, StoreError};
use ipkeep_reservation::PodKey;

/// What one range set's allocation needs.
pub struct Request<'a> {
    /// `CNI_CONTAINERID`.
    pub container_id: &'a str,
    /// `CNI_IFNAME`.
    pub ifname: &'a str,
    /// The range set's index (`last_reserved_ip.<range_id>`, messages).
    pub range_id: usize,
    /// The range set.
    pub set: &'a RangeSet,
    /// An explicitly requested address inside this set (`IP=`, `ips`): that one or an error.
    pub requested: Option<IpAddr>,
    /// An address to try before the round robin (a reservation), if it is in this set.
    pub preferred: Option<IpAddr>,
    /// Addresses the round robin must skip.
    pub is_blocked: &'a dyn Fn(IpAddr) -> bool,
    /// The pod, recorded with the allocation.
    pub pod: Option<&'a PodKey>,
}

impl std::fmt::Debug for Request<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("container_id", &self.container_id)
            .field("ifname", &self.ifname)
            .field("range_id", &self.range_id)
            .field("requested", &self.requested)
            .field("preferred", &self.preferred)
            .finish_non_exhaustive()
    }
}

/// Why a range set could not give an address; the texts are host-local's.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    /// The requested address is the range's gateway.
    #[error("requested ip {0} is subnet's gateway")]
    Gateway(IpAddr),
    /// The requested address is taken (or outside the set).
    #[error("requested IP address {ip} is not available in range set {set}")]
    Unavailable {
        /// The address.
        ip: IpAddr,
        /// The set, as host-local prints it.
        set: String,
    },
    /// The container already holds an address of this set.
    #[error("{ip} has been allocated to {container_id}, duplicate allocation is not allowed")]
    Duplicate {
        /// The address it holds.
        ip: IpAddr,
        /// The container.
        container_id: String,
    },
    /// Every address is taken.
    #[error("no IP addresses available in range set: {0}")]
    Exhausted(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Allocates one address of `req.set` for the container.
pub fn allocate(store: &mut dyn Store, req: &Request<'_>) -> Result<IpConfig, AllocError> {
    let config = |ip: IpAddr, gateway: IpAddr, prefix: u8| IpConfig {
        address: ip,
        prefix,
        gateway: Some(gateway),
    };
    if let Some(ip) = req.requested {
        let Some(range) = req.set.range_for(ip) else {
            return Err(AllocError::Unavailable {
                ip,
                set: req.set.to_string(),
            });
        };
        if ip == range.gateway {
            return Err(AllocError::Gateway(ip));
        }
        // host-local does no duplicate check on this path: a container may request a second address.
        if !store.reserve(ip, req.container_id, req.ifname, req.range_id, req.pod)? {
            return Err(AllocError::Unavailable {
                ip,
                set: req.set.to_string(),
            });
        }
        return Ok(config(ip, range.gateway, range.subnet.prefix));
    }
    for held in store.get_by_id(req.container_id, req.ifname)? {
        if req.set.contains(held) {
            return Err(AllocError::Duplicate {
                ip: held,
                container_id: req.container_id.to_owned(),
            });
        }
    }
    if let Some(ip) = req.preferred
        && let Some(range) = req.set.range_for(ip)
        && ip != range.gateway
        && store.reserve(ip, req.container_id, req.ifname, req.range_id, req.pod)?
    {
        return Ok(config(ip, range.gateway, range.subnet.prefix));
    }
    let last = store.last_reserved_ip(req.range_id);
    for (ip, range) in Candidates::new(req.set, last) {
        if (req.is_blocked)(ip) {
            continue;
        }
        if store.reserve(ip, req.container_id, req.ifname, req.range_id, req.pod)? {
            return Ok(config(ip, range.gateway, range.subnet.prefix));
        }
    }
    Err(AllocError::Exhausted(req.set.to_string()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::addr::{Cidr, parse_ip};
    use crate::range::{RangeSpec, canonicalize_set};
    use crate::store::{MemoryStore, Owner};

    fn set(subnets: &[&str]) -> RangeSet {
        let specs: Vec<RangeSpec> = subnets
            .iter()
            .map(|s| RangeSpec {
                subnet: Cidr::parse(s),
                ..RangeSpec::default()
            })
            .collect();
        canonicalize_set(&specs).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        parse_ip(s).unwrap()
    }

    fn get(
        store: &mut MemoryStore,
        set: &RangeSet,
        id: &str,
        requested: Option<&str>,
    ) -> Result<String, String> {
        let none = |_: IpAddr| false;
        let req = Request {
            container_id: id,
            ifname: "eth0",
            range_id: 0,
            set,
            requested: requested.map(ip),
            preferred: None,
            is_blocked: &none,
            pod: None,
        };
        allocate(store, &req)
            .map(|c| format!("{}/{} gw {}", c.address, c.prefix, c.gateway.unwrap()))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn round_robin_through_the_store() {
        let s = set(&["10.1.0.0/29"]);
        let mut st = MemoryStore::default();
        assert_eq!(
            get(&mut st, &s, "c1", None).unwrap(),
            "10.1.0.2/29 gw 10.1.0.1"
        );
        assert_eq!(
            get(&mut st, &s, "c2", None).unwrap(),
            "10.1.0.3/29 gw 10.1.0.1"
        );
        st.release_by_id("c1", "eth0", crate::store::LegacyRelease::IfNoneMatched)
            .unwrap();
        assert_eq!(
            get(&mut st, &s, "c3", None).unwrap(),
            "10.1.0.4/29 gw 10.1.0.1",
            "round robin, not lowest free"
        );
        for id in ["c4", "c5", "c6"] {
            get(&mut st, &s, id, None).unwrap();
        }
        assert_eq!(
            get(&mut st, &s, "c7", None).unwrap_err(),
            "no IP addresses available in range set: 10.1.0.1-10.1.0.6"
        );
    }

    #[test]
    fn duplicate_and_requested_rules() {
        let s = set(&["10.1.0.0/24"]);
        let mut st = MemoryStore::default();
        get(&mut st, &s, "c1", None).unwrap();
        assert_eq!(
            get(&mut st, &s, "c1", None).unwrap_err(),
            "10.1.0.2 has been allocated to c1, duplicate allocation is not allowed"
        );
        assert_eq!(
            get(&mut st, &s, "c1", Some("10.1.0.50")).unwrap(),
            "10.1.0.50/24 gw 10.1.0.1"
        );
        assert_eq!(
            st.last.get(&0),
            Some(&ip("10.1.0.50")),
            "requests move the round-robin cursor"
        );
        assert_eq!(
            get(&mut st, &s, "c2", Some("10.1.0.1")).unwrap_err(),
            "requested ip 10.1.0.1 is subnet's gateway"
        );
        assert_eq!(
            get(&mut st, &s, "c2", Some("10.1.0.50")).unwrap_err(),
            "requested IP address 10.1.0.50 is not available in range set 10.1.0.1-10.1.0.254"
        );
        // A legacy file of the container counts as a duplicate for any interface.
        st.allocations.insert(
            ip("10.1.0.9"),
            Owner::Legacy {
                container_id: "c9".into(),
            },
        );
        assert_eq!(
            get(&mut st, &s, "c9", None).unwrap_err(),
            "10.1.0.9 has been allocated to c9, duplicate allocation is not allowed"
        );
    }

    #[test]
    fn last_free_address_and_occupied_names() {
        let s = set(&["10.1.0.0/29"]);
        let mut st = MemoryStore::default();
        for last in 2..=6 {
            st.allocations.insert(
                ip(&format!("10.1.0.{last}")),
                Owner::Legacy {
                    container_id: "x".into(),
                },
            );
        }
        st.allocations.remove(&ip("10.1.0.3"));
        st.last.insert(0, ip("10.1.0.3"));
        assert_eq!(
            get(&mut st, &s, "c1", None).unwrap(),
            "10.1.0.3/29 gw 10.1.0.1"
        );
        let mut st = MemoryStore {
            occupied: vec![ip("10.1.0.2")],
            ..MemoryStore::default()
        };
        assert_eq!(
            get(&mut st, &s, "c1", None).unwrap(),
            "10.1.0.3/29 gw 10.1.0.1"
        );
    }

    #[test]
    fn preferred_and_blocked_addresses() {
        let s = set(&["10.1.0.0/24"]);
        let mut st = MemoryStore::default();
        let blocked = |i: IpAddr| i == ip("10.1.0.2") || i == ip("10.1.0.3");
        let req = Request {
            container_id: "c1",
            ifname: "eth0",
            range_id: 0,
            set: &s,
            requested: None,
            preferred: None,
            is_blocked: &blocked,
            pod: None,
        };
        assert_eq!(allocate(&mut st, &req).unwrap().address, ip("10.1.0.4"));
        let req = Request {
            container_id: "c2",
            preferred: Some(ip("10.1.0.2")),
            ..req
        };
        assert_eq!(allocate(&mut st, &req).unwrap().address, ip("10.1.0.2"));
        let req = Request {
            container_id: "c3",
            preferred: Some(ip("10.1.0.2")),
            ..req
        };
        assert_eq!(
            allocate(&mut st, &req).unwrap().address,
            ip("10.1.0.5"),
            "a taken preference falls back"
        );
    }

    #[test]
    fn multi_range_sets() {
        let s = set(&["10.1.0.0/30", "10.2.0.0/30"]);
        let mut st = MemoryStore::default();
        assert_eq!(
            get(&mut st, &s, "c1", None).unwrap(),
            "10.1.0.2/30 gw 10.1.0.1"
        );
        assert_eq!(
            get(&mut st, &s, "c2", None).unwrap(),
            "10.2.0.2/30 gw 10.2.0.1"
        );
        assert_eq!(
            get(&mut st, &s, "c3", None).unwrap_err(),
            "no IP addresses available in range set: 10.1.0.1-10.1.0.2,10.2.0.1-10.2.0.2"
        );
    }
}
