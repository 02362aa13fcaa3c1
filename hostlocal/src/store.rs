//! Allocation storage behind a small trait (host-local's `backend.Store`), with an in-memory
//! implementation for allocator tests; the disk implementation is in `disk_store`.
//!
//! Differences from host-local's store, on purpose: locking is done once per command by whoever
//! opens the store (the whole command is atomic, not each range set), and releases name exactly
//! which address they free so a failed ADD frees only what it reserved.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipkeep_reservation::PodKey;

/// Who an allocation file says holds the address.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Owner {
    /// `<containerID>\r\n<ifname>`: the current format.
    Attachment {
        /// The container ID.
        container_id: String,
        /// The interface name.
        ifname: String,
    },
    /// `<containerID>` alone: written by host-local before it recorded interfaces; matches any ifname.
    Legacy {
        /// The container ID.
        container_id: String,
    },
}

/// Go's `strings.TrimSpace` set (Unicode white space).
fn trim_go_space(s: &str) -> &str {
    s.trim_matches(char::is_whitespace)
}

impl Owner {
    /// Reads an allocation file's content the way host-local matches it (`TrimSpace(content)`
    /// compared with `id + "\r\n" + ifname`, else with `id`). `None` for content no valid
    /// container could ever match (empty, not UTF-8, or an invalid container ID).
    pub fn parse(content: &[u8]) -> Option<Owner> {
        let text = std::str::from_utf8(content).ok()?;
        let trimmed = trim_go_space(text);
        let owner = match trimmed.split_once("\r\n") {
            Some((id, ifname)) => Owner::Attachment {
                container_id: id.to_owned(),
                ifname: ifname.to_owned(),
            },
            None => Owner::Legacy {
                container_id: trimmed.to_owned(),
            },
        };
        is_valid_container_id(owner.container_id()).then_some(owner)
    }

    /// The file content host-local writes for an attachment.
    pub fn content(container_id: &str, ifname: &str) -> String {
        format!("{}\r\n{ifname}", trim_go_space(container_id))
    }

    /// The container ID.
    pub fn container_id(&self) -> &str {
        match self {
            Owner::Attachment { container_id, .. } | Owner::Legacy { container_id } => container_id,
        }
    }

    /// The interface, for the current format.
    pub fn ifname(&self) -> Option<&str> {
        match self {
            Owner::Attachment { ifname, .. } => Some(ifname),
            Owner::Legacy { .. } => None,
        }
    }

    /// Whether this is exactly `(id, ifname)` in the current format.
    pub fn is_attachment(&self, id: &str, ifname: &str) -> bool {
        matches!(self, Owner::Attachment { container_id, ifname: i } if container_id == id && i == ifname)
    }

    /// Whether this is a legacy file of container `id`.
    pub fn is_legacy_of(&self, id: &str) -> bool {
        matches!(self, Owner::Legacy { container_id } if container_id == id)
    }
}

/// The CNI library's container ID rule, `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$` (also network names).
pub fn is_valid_container_id(id: &str) -> bool {
    let mut bytes = id.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphanumeric())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// Errors of a store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The disk layer failed.
    #[error(transparent)]
    Disk(#[from] ipkeep_netdir::NetDirError),
    /// An error whose text is host-local's (e.g. `open …/last_reserved_ip.0: is a directory`).
    #[error("{0}")]
    Message(String),
}

/// Which legacy (id-only) files a release also removes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LegacyRelease {
    /// host-local with one range set: legacy files only when no current-format file matched.
    IfNoneMatched,
    /// host-local with two or more range sets (the second pass finds only legacy files): always.
    Always,
}

/// Allocation storage: the operations the allocator and the commands need.
pub trait Store {
    /// Records `ip` for `(id, ifname)` if nobody holds it (exclusively); `Ok(false)` if taken.
    /// On success also records `ip` as range set `range_id`'s last reserved address.
    fn reserve(
        &mut self,
        ip: IpAddr,
        id: &str,
        ifname: &str,
        range_id: usize,
        pod: Option<&PodKey>,
    ) -> Result<bool, StoreError>;
    /// Frees `ip` if (and only if) it is still held by `(id, ifname)`.
    fn release(&mut self, ip: IpAddr, id: &str, ifname: &str) -> Result<bool, StoreError>;
    /// Frees the container's addresses with host-local's DEL rule; returns what was freed.
    fn release_by_id(
        &mut self,
        id: &str,
        ifname: &str,
        legacy: LegacyRelease,
    ) -> Result<Vec<IpAddr>, StoreError>;
    /// The addresses held by `(id, ifname)` or by legacy files of `id`, in file-name order.
    fn get_by_id(&mut self, id: &str, ifname: &str) -> Result<Vec<IpAddr>, StoreError>;
    /// Whether `(id, ifname)` (or, failing that, a legacy file of `id`) holds any address.
    fn find_by_id(&mut self, id: &str, ifname: &str) -> Result<bool, StoreError>;
    /// Range set `range_id`'s last reserved address (unreadable or garbage counts as none).
    fn last_reserved_ip(&mut self, range_id: usize) -> Option<IpAddr>;
    /// Whether nothing at all occupies `ip` (no file, link or directory of that name).
    fn is_free(&mut self, ip: IpAddr) -> Result<bool, StoreError>;
}

/// An in-memory store for allocator tests.
#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    /// Address → owner (ordered like file names are not, but tests only need determinism).
    pub allocations: BTreeMap<IpAddr, Owner>,
    /// Addresses occupied by something that is not an allocation (a directory, a symlink).
    pub occupied: Vec<IpAddr>,
    /// Range set → last reserved address.
    pub last: BTreeMap<usize, IpAddr>,
    /// Pod recorded per address.
    pub pods: BTreeMap<IpAddr, PodKey>,
}

impl Store for MemoryStore {
    fn reserve(
        &mut self,
        ip: IpAddr,
        id: &str,
        ifname: &str,
        range_id: usize,
        pod: Option<&PodKey>,
    ) -> Result<bool, StoreError> {
        if self.allocations.contains_key(&ip) || self.occupied.contains(&ip) {
            return Ok(false);
        }
        self.allocations.insert(
            ip,
            Owner::Attachment {
                container_id: id.to_owned(),
                ifname: ifname.to_owned(),
            },
        );
        if let Some(pod) = pod {
            self.pods.insert(ip, pod.clone());
        }
        self.last.insert(range_id, ip);
        Ok(true)
    }

    fn release(&mut self, ip: IpAddr, id: &str, ifname: &str) -> Result<bool, StoreError> {
        if self
            .allocations
            .get(&ip)
            .is_some_and(|o| o.is_attachment(id, ifname))
        {
            self.allocations.remove(&ip);
            self.pods.remove(&ip);
            return Ok(true);
        }
        Ok(false)
    }

    fn release_by_id(
        &mut self,
        id: &str,
        ifname: &str,
        legacy: LegacyRelease,
    ) -> Result<Vec<IpAddr>, StoreError> {
        let mut freed: Vec<IpAddr> = self
            .allocations
            .iter()
            .filter(|(_, o)| o.is_attachment(id, ifname))
            .map(|(ip, _)| *ip)
            .collect();
        if freed.is_empty() || legacy == LegacyRelease::Always {
            freed.extend(
                self.allocations
                    .iter()
                    .filter(|(_, o)| o.is_legacy_of(id))
                    .map(|(ip, _)| *ip),
            );
        }
        for ip in &freed {
            self.allocations.remove(ip);
            self.pods.remove(ip);
        }
        Ok(freed)
    }

    fn get_by_id(&mut self, id: &str, ifname: &str) -> Result<Vec<IpAddr>, StoreError> {
        Ok(self
            .allocations
            .iter()
            .filter(|(_, o)| o.is_attachment(id, ifname) || o.is_legacy_of(id))
            .map(|(ip, _)| *ip)
            .collect())
    }

    fn find_by_id(&mut self, id: &str, ifname: &str) -> Result<bool, StoreError> {
        Ok(self
            .allocations
            .values()
            .any(|o| o.is_attachment(id, ifname) || o.is_legacy_of(id)))
    }

    fn last_reserved_ip(&mut self, range_id: usize) -> Option<IpAddr> {
        self.last.get(&range_id).copied()
    }

    fn is_free(&mut self, ip: IpAddr) -> Result<bool, StoreError> {
        Ok(!self.allocations.contains_key(&ip) && !self.occupied.contains(&ip))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn owner_parsing_table() {
        let att = |i: &str, f: &str| {
            Some(Owner::Attachment {
                container_id: i.into(),
                ifname: f.into(),
            })
        };
        let leg = |i: &str| {
            Some(Owner::Legacy {
                container_id: i.into(),
            })
        };
        let cases: &[(&[u8], Option<Owner>)] = &[
            (b"c1\r\neth0", att("c1", "eth0")),
            (b" c1\r\neth0\n", att("c1", "eth0")),
            (b"c1", leg("c1")),
            (b" c1 \n", leg("c1")),
            (b"c1\neth0", None),
            (b"", None),
            (b"\xff\xfe", None),
            (b"{\"containerID\":\"c1\"}", None),
            (b"10.1.0.2", leg("10.1.0.2")),
        ];
        for (content, want) in cases {
            assert_eq!(
                &Owner::parse(content),
                want,
                "{:?}",
                String::from_utf8_lossy(content)
            );
        }
        assert_eq!(Owner::content(" c1 ", "eth0"), "c1\r\neth0");
    }

    #[test]
    fn container_id_rule() {
        for ok in ["c1", "a.b-c_d", "10.1.0.2", "A"] {
            assert!(is_valid_container_id(ok), "{ok}");
        }
        for bad in ["", ".a", "-a", "a b", "a/b", "..", "é"] {
            assert!(!is_valid_container_id(bad), "{bad}");
        }
    }

    #[test]
    fn memory_store_release_rules() {
        let ip = |s: &str| crate::addr::parse_ip(s).unwrap();
        let mut s = MemoryStore::default();
        assert!(s.reserve(ip("10.1.0.2"), "c1", "eth0", 0, None).unwrap());
        assert!(!s.reserve(ip("10.1.0.2"), "c2", "eth0", 0, None).unwrap());
        s.allocations.insert(
            ip("10.1.0.9"),
            Owner::Legacy {
                container_id: "c1".into(),
            },
        );
        assert_eq!(s.get_by_id("c1", "eth7").unwrap(), vec![ip("10.1.0.9")]);
        assert_eq!(
            s.release_by_id("c1", "eth0", LegacyRelease::IfNoneMatched)
                .unwrap(),
            vec![ip("10.1.0.2")]
        );
        assert!(
            s.find_by_id("c1", "eth0").unwrap(),
            "the legacy file survives with one range set"
        );
        assert_eq!(
            s.release_by_id("c1", "eth0", LegacyRelease::IfNoneMatched)
                .unwrap(),
            vec![ip("10.1.0.9")]
        );
        assert!(!s.release(ip("10.1.0.2"), "c1", "eth0").unwrap());
    }
}
