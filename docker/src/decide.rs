//! The driver's decisions as plain functions over plain data, `now` passed in: who an address
//! request is for, which address it gets, what a release becomes, when a retention ends.
//!
//! Who holds an address is written in host-local's allocation file itself, as
//! `<id>\r\n<kind>`: a container's name with the kind `endpoint`, `gateway` for the network's
//! gateway, a random token with the kind `unnamed` for a request without a name (engines before
//! 29, auxiliary addresses, `--ip` without a name). A retained address keeps its file, so nobody
//! else can be given it; the retention itself (until when) is in the pool's state file.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use ipkeep_hostlocal::addr;
use ipkeep_hostlocal::go_log_time;
use ipkeep_hostlocal::store::{Owner, is_valid_container_id};
use ipkeep_reservation::{RetainFor, effective_release_time};

use crate::protocol::{ENDPOINT_NAME, GATEWAY_TYPE, MAC_ADDRESS, Options, REQUEST_ADDRESS_TYPE};

/// The allocation file's interface field for a named container's address.
pub const NAMED_KIND: &str = "endpoint";
/// The allocation file's interface field for an address kept for a pinned MAC address.
pub const MAC_KIND: &str = "mac";
/// The allocation file's interface field (and id) for a network's gateway.
pub const GATEWAY_KIND: &str = "gateway";
/// The allocation file's interface field for an address requested without a name.
pub const UNNAMED_KIND: &str = "unnamed";
/// The longest container name accepted (Docker's own names are far shorter).
const MAX_NAME: usize = 200;

/// Why a request's input was refused (nothing is changed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// The endpoint name cannot be a Docker container name.
    #[error(
        "failed to use endpoint name {0:?}: a container name is 1 to 200 characters of [a-zA-Z0-9_.-], starting with a letter or digit"
    )]
    Name(String),
    /// The MAC address is not one.
    #[error("failed to use MAC address {0:?}: expected six hex octets such as 02:42:c6:12:00:0a")]
    Mac(String),
    /// The address is not an IP address.
    #[error("failed to parse address {0:?}: expected an IP address such as 198.18.0.7")]
    Address(String),
    /// The address is outside the pool.
    #[error("failed to use address {ip}: it is outside pool {pool}")]
    OutsidePool {
        /// The address.
        ip: IpAddr,
        /// The pool.
        pool: String,
    },
}

/// What a sticky address is kept for: a container's name (Engine ≥ 29), or, with
/// `--key-by-mac`, a MAC address pinned with `--mac-address` (engines before 29).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct StickyKey {
    /// The owner written in the allocation file: the name, or `mac-02-42-c6-12-00-0a`.
    id: String,
    /// The allocation file's kind: [`NAMED_KIND`] or [`MAC_KIND`].
    kind: &'static str,
}

/// The prefix of a MAC key's retention record (`:` is never in a container name).
const MAC_RECORD_PREFIX: &str = "mac:";

impl StickyKey {
    /// A container name, checked: Docker's own rule, which is the CNI container ID rule (a
    /// leading `/`, as the engine prints names, is not part of it).
    pub fn parse(text: &str) -> Result<Self, InputError> {
        if text.len() <= MAX_NAME && is_valid_container_id(text) {
            Ok(Self {
                id: text.to_owned(),
                kind: NAMED_KIND,
            })
        } else {
            Err(InputError::Name(text.chars().take(MAX_NAME).collect()))
        }
    }

    /// A MAC address as the engine prints it (`02:42:c6:12:00:0a`, any case).
    pub fn from_mac(mac: &str) -> Result<Self, InputError> {
        let octets: Vec<&str> = mac.split(':').collect();
        let valid = octets.len() == 6
            && octets
                .iter()
                .all(|o| o.len() == 2 && o.bytes().all(|b| b.is_ascii_hexdigit()));
        if !valid {
            return Err(InputError::Mac(mac.chars().take(MAX_NAME).collect()));
        }
        Ok(Self {
            id: format!("mac-{}", octets.join("-").to_ascii_lowercase()),
            kind: MAC_KIND,
        })
    }

    /// The key an allocation file names, if it is one.
    pub fn from_file(id: &str, kind: &str) -> Option<Self> {
        match kind {
            NAMED_KIND => Self::parse(id).ok(),
            MAC_KIND => Self::from_mac(&id.strip_prefix("mac-")?.replace('-', ":"))
                .ok()
                .filter(|key| key.id == id),
            _ => None,
        }
    }

    /// The key of a retention record ([`StickyKey::record_key`]).
    pub fn from_record_key(record: &str) -> Option<Self> {
        match record.strip_prefix(MAC_RECORD_PREFIX) {
            Some(mac) => Self::from_mac(mac).ok(),
            None => Self::parse(record).ok(),
        }
    }

    /// The owner written in the allocation file.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The allocation file's kind.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// The MAC address, for a MAC key.
    pub fn mac(&self) -> Option<String> {
        (self.kind == MAC_KIND)
            .then(|| self.id.strip_prefix("mac-").map(|m| m.replace('-', ":")))
            .flatten()
    }

    /// The key of this key's retention record: the name, or `mac:<MAC>`.
    pub fn record_key(&self) -> String {
        match self.mac() {
            Some(mac) => format!("{MAC_RECORD_PREFIX}{mac}"),
            None => self.id.clone(),
        }
    }
}

impl fmt::Display for StickyKey {
    /// `container web`, `container with MAC 02:42:c6:12:00:0a`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.mac() {
            Some(mac) => write!(f, "container with MAC {mac}"),
            None => write!(f, "container {}", self.id),
        }
    }
}

/// What an address is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// The network's gateway: never tied to a name.
    Gateway,
    /// A container with a name (Docker ≥ 29): sticky.
    Named(StickyKey),
    /// Anything without a name (older engines, auxiliary addresses): plain host-local allocation.
    Unnamed,
}

/// One `RequestAddress`, classified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddressRequest {
    /// What the address is for.
    pub purpose: Purpose,
    /// The address asked for (`--ip`, `--gateway`, an aux address), if any.
    pub requested: Option<IpAddr>,
}

/// Classifies a `RequestAddress` from its options and address text; with `key_by_mac`, a request
/// without a name is kept for its MAC address.
pub fn classify(
    options: &Options,
    address: &str,
    key_by_mac: bool,
) -> Result<AddressRequest, InputError> {
    let requested = match address {
        "" => None,
        text => Some(addr::parse_ip(text).ok_or_else(|| InputError::Address(text.to_owned()))?),
    };
    let option = |key: &str| {
        options
            .as_ref()
            .and_then(|o| o.get(key))
            .map(String::as_str)
    };
    let purpose = if option(REQUEST_ADDRESS_TYPE) == Some(GATEWAY_TYPE) {
        Purpose::Gateway
    } else {
        match (option(ENDPOINT_NAME), option(MAC_ADDRESS)) {
            (Some(name), _) => Purpose::Named(StickyKey::parse(name.trim_start_matches('/'))?),
            (None, Some(mac)) if key_by_mac => Purpose::Named(StickyKey::from_mac(mac)?),
            (None, _) => Purpose::Unnamed,
        }
    };
    Ok(AddressRequest { purpose, requested })
}

/// Who an allocation file says holds an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Holder {
    /// A named container (in use, or retained for it).
    Named(StickyKey),
    /// The network's gateway.
    Gateway,
    /// A request without a name (the token in the file).
    Unnamed(String),
    /// A file this driver did not write (host-local's, a human's, garbage).
    Foreign,
}

impl Holder {
    /// Reads an allocation file's owner.
    pub fn from_owner(owner: &Owner) -> Self {
        let id = owner.container_id();
        match owner.ifname() {
            Some(kind @ (NAMED_KIND | MAC_KIND)) => {
                StickyKey::from_file(id, kind).map_or(Self::Foreign, Self::Named)
            }
            Some(GATEWAY_KIND) if id == GATEWAY_KIND => Self::Gateway,
            Some(UNNAMED_KIND) => Self::Unnamed(id.to_owned()),
            _ => Self::Foreign,
        }
    }

    /// The `(id, kind)` written in the allocation file.
    pub fn file_owner(&self) -> Option<(&str, &str)> {
        match self {
            Self::Named(key) => Some((key.id(), key.kind())),
            Self::Gateway => Some((GATEWAY_KIND, GATEWAY_KIND)),
            Self::Unnamed(token) => Some((token.as_str(), UNNAMED_KIND)),
            Self::Foreign => None,
        }
    }
}

/// A released named address, held for its name until `until` (seconds since the epoch).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Retention {
    /// Whom for: [`StickyKey::record_key`] (the name, or `mac:<MAC>`).
    pub name: String,
    /// The address.
    pub ip: IpAddr,
    /// When the address becomes free, in seconds since the Unix epoch.
    pub until: u64,
}

/// When a retention that starts at `now` ends, in seconds since the epoch: the contract's
/// release-time rule, with the pool's retention (parsed and checked when the pool was requested)
/// as the default, since a Docker address has none of its own.
pub fn release_time(now: u64, retain_for: Duration) -> u64 {
    effective_release_time(Duration::from_secs(now), None, retain_for, RetainFor::MAX)
        .at
        .as_secs()
}

/// Whether a retention has ended at `now`.
pub fn is_expired(retention: &Retention, now: u64) -> bool {
    retention.until <= now
}

/// `until` as people read it (UTC).
pub fn until_text(until: u64) -> String {
    let time = std::time::UNIX_EPOCH + Duration::from_secs(until);
    format!("{} UTC", go_log_time(time))
}

/// What the pool looks like to one request, gathered by the disk layer under the pool's lock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// The address the requesting name already holds in this pool (in use or retained), if any.
    pub name_holds: Option<IpAddr>,
    /// Who holds the requested address, if an address was asked for and is held.
    pub requested_holder: Option<Holder>,
    /// Retentions of this pool by name.
    pub retained: BTreeMap<String, Retention>,
    /// Whether the gateway already holds an address (a gateway request replayed after a crash).
    pub gateway_holds: Option<IpAddr>,
    /// The first address of the pool's range (the gateway's default).
    pub first: Option<IpAddr>,
}

/// Whom a fresh allocation is written for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AllocateFor {
    /// A named container.
    Named(StickyKey),
    /// The gateway.
    Gateway,
    /// A request without a name (the disk layer makes a token).
    Unnamed,
}

/// What to do for one address request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Give back the address the name (or the gateway) already holds, ending its retention.
    Reuse(IpAddr),
    /// Allocate like host-local: the requested address, else the preferred one, else round robin.
    Allocate {
        /// Whom for.
        holder: AllocateFor,
        /// The address asked for (that one or an error).
        requested: Option<IpAddr>,
        /// An address to try first.
        preferred: Option<IpAddr>,
        /// An address the name held before that it gives up (it asked for another one).
        then_free: Option<IpAddr>,
    },
    /// Refuse with a clear error; nothing changes.
    Refuse(Refusal),
}

/// Why a requested address cannot be given: another name holds or retains it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("failed to give {ip}: it is {}", match until {
    Some(until) => format!("retained for {holder} until {}", until_text(*until)),
    None => format!("in use by {holder}"),
})]
pub struct Refusal {
    /// The address.
    pub ip: IpAddr,
    /// Who holds it (`container web`).
    pub holder: String,
    /// Until when it is retained (`None`: in use).
    pub until: Option<u64>,
}

/// Decides one address request.
pub fn decide_request(req: &AddressRequest, view: &View) -> Plan {
    match &req.purpose {
        Purpose::Gateway => decide_gateway(req.requested, view),
        Purpose::Named(name) => decide_named(name, req.requested, view),
        Purpose::Unnamed => Plan::Allocate {
            holder: AllocateFor::Unnamed,
            requested: req.requested,
            preferred: None,
            then_free: None,
        },
    }
}

/// The gateway: the address asked for, else the range's first address, else round robin; a
/// gateway already held (its release was lost) is given back when it is the one asked for.
fn decide_gateway(requested: Option<IpAddr>, view: &View) -> Plan {
    if let Some(held) = view.gateway_holds
        && requested.is_none_or(|r| r == held)
    {
        return Plan::Reuse(held);
    }
    Plan::Allocate {
        holder: AllocateFor::Gateway,
        requested,
        preferred: requested.is_none().then_some(view.first).flatten(),
        then_free: None,
    }
}

/// A named container: its own address back (retained, or never released), else the address it
/// asks for unless another name holds or retains it, else a fresh one.
fn decide_named(name: &StickyKey, requested: Option<IpAddr>, view: &View) -> Plan {
    match (view.name_holds, requested) {
        (Some(held), None) => return Plan::Reuse(held),
        (Some(held), Some(want)) if held == want => return Plan::Reuse(held),
        _ => {}
    }
    if let (Some(want), Some(Holder::Named(other))) = (requested, &view.requested_holder) {
        return Plan::Refuse(Refusal {
            ip: want,
            holder: other.to_string(),
            until: view.retained.get(&other.record_key()).map(|r| r.until),
        });
    }
    Plan::Allocate {
        holder: AllocateFor::Named(name.clone()),
        requested,
        preferred: None,
        then_free: view.name_holds,
    }
}

/// What a `ReleaseAddress` does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReleasePlan {
    /// Nobody holds it: nothing to do (the engine may release twice).
    AlreadyFree,
    /// Keep the file and record the retention.
    Retain(Retention),
    /// Remove the allocation file of this holder.
    Free(Holder),
    /// The file is not this driver's: refuse, change nothing.
    Foreign,
}

/// Decides a release of `ip`, held by `holder` (`None`: free).
pub fn decide_release(
    ip: IpAddr,
    holder: Option<Holder>,
    retain_for: Duration,
    now: u64,
) -> ReleasePlan {
    match holder {
        None => ReleasePlan::AlreadyFree,
        Some(Holder::Foreign) => ReleasePlan::Foreign,
        Some(Holder::Named(key)) if !retain_for.is_zero() => ReleasePlan::Retain(Retention {
            name: key.record_key(),
            ip,
            until: release_time(now, retain_for),
        }),
        Some(holder) => ReleasePlan::Free(holder),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        addr::parse_ip(s).unwrap()
    }

    fn name(s: &str) -> StickyKey {
        StickyKey::parse(s).unwrap()
    }

    fn opts(pairs: &[(&str, &str)]) -> Options {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn classify_table() {
        let named = |n: &str| Purpose::Named(name(n));
        type Want = Result<(Purpose, Option<IpAddr>), &'static str>;
        let cases: Vec<(Options, &str, Want)> = vec![
            (None, "", Ok((Purpose::Unnamed, None))),
            (
                opts(&[]),
                "198.18.0.9",
                Ok((Purpose::Unnamed, Some(ip("198.18.0.9")))),
            ),
            (
                opts(&[(REQUEST_ADDRESS_TYPE, GATEWAY_TYPE)]),
                "",
                Ok((Purpose::Gateway, None)),
            ),
            (
                opts(&[(ENDPOINT_NAME, "web-1")]),
                "",
                Ok((named("web-1"), None)),
            ),
            (
                opts(&[(ENDPOINT_NAME, "/web-1")]),
                "",
                Ok((named("web-1"), None)),
            ),
            (
                opts(&[
                    (ENDPOINT_NAME, "db"),
                    (
                        "com.docker.network.endpoint.macaddress",
                        "02:42:c6:12:00:02",
                    ),
                ]),
                "198.18.0.7",
                Ok((named("db"), Some(ip("198.18.0.7")))),
            ),
            (
                opts(&[(ENDPOINT_NAME, "../etc")]),
                "",
                Err("failed to use endpoint name \"../etc\""),
            ),
            (
                opts(&[(ENDPOINT_NAME, "a/b")]),
                "",
                Err("failed to use endpoint name \"a/b\""),
            ),
            (
                opts(&[(ENDPOINT_NAME, "")]),
                "",
                Err("failed to use endpoint name \"\""),
            ),
            (
                opts(&[(ENDPOINT_NAME, "..")]),
                "",
                Err("failed to use endpoint name \"..\""),
            ),
            (
                None,
                "198.18.0.300",
                Err("failed to parse address \"198.18.0.300\""),
            ),
            (None, "198.18.0.0/24", Err("failed to parse address")),
        ];
        for (options, address, want) in cases {
            let got = classify(&options, address, false)
                .map(|r| (r.purpose, r.requested))
                .map_err(|e| e.to_string());
            match want {
                Ok(w) => assert_eq!(got.unwrap(), w, "{options:?} {address}"),
                Err(w) => assert!(got.unwrap_err().contains(w), "{options:?} {address}"),
            }
        }
        assert!(StickyKey::parse(&"a".repeat(201)).is_err());
    }

    #[test]
    fn mac_keys_table() {
        let mac_opts = opts(&[(MAC_ADDRESS, "02:42:C6:12:0A:05")]);
        let by_mac = classify(&mac_opts, "", true).unwrap().purpose;
        let key = StickyKey::from_mac("02:42:c6:12:0a:05").unwrap();
        assert_eq!(by_mac, Purpose::Named(key.clone()));
        assert_eq!((key.id(), key.kind()), ("mac-02-42-c6-12-0a-05", MAC_KIND));
        assert_eq!(key.record_key(), "mac:02:42:c6:12:0a:05");
        assert_eq!(
            StickyKey::from_record_key(&key.record_key()),
            Some(key.clone())
        );
        assert_eq!(key.to_string(), "container with MAC 02:42:c6:12:0a:05");
        assert_eq!(
            classify(&mac_opts, "", false).unwrap().purpose,
            Purpose::Unnamed,
            "without --key-by-mac a MAC is ignored"
        );
        let both = opts(&[(MAC_ADDRESS, "02:42:c6:12:0a:05"), (ENDPOINT_NAME, "web")]);
        assert_eq!(
            classify(&both, "", true).unwrap().purpose,
            Purpose::Named(name("web")),
            "a name wins over a MAC"
        );
        for bad in [
            "",
            "02:42:c6:12:0a",
            "02:42:c6:12:0a:05:07",
            "zz:42:c6:12:0a:05",
            "02-42-c6-12-0a-05",
            "../../etc",
        ] {
            let err = classify(&opts(&[(MAC_ADDRESS, bad)]), "", true).unwrap_err();
            assert!(
                err.to_string().starts_with("failed to use MAC address"),
                "{bad}: {err}"
            );
        }
        for (id, kind) in [
            ("mac-02-42-C6-12-0a-05", MAC_KIND),
            ("mac-zz", MAC_KIND),
            ("web", MAC_KIND),
        ] {
            assert_eq!(StickyKey::from_file(id, kind), None, "{id}");
        }
    }

    #[test]
    fn holders_round_trip_through_files() {
        let holders = [
            Holder::Named(name("web")),
            Holder::Named(StickyKey::from_mac("02:42:c6:12:0a:05").unwrap()),
            Holder::Gateway,
            Holder::Unnamed("u1f2".into()),
        ];
        for holder in holders {
            let (id, kind) = holder.file_owner().unwrap();
            let owner = Owner::parse(Owner::content(id, kind).as_bytes()).unwrap();
            assert_eq!(Holder::from_owner(&owner), holder);
        }
        for content in ["c1\r\neth0", "c1", "web\r\ngateway"] {
            let owner = Owner::parse(content.as_bytes()).unwrap();
            assert_eq!(Holder::from_owner(&owner), Holder::Foreign, "{content:?}");
        }
    }

    /// The spec, one row per rule: (what, request, view, plan).
    #[test]
    fn request_decisions_table() {
        let named_req = |n: &str, want: Option<&str>| AddressRequest {
            purpose: Purpose::Named(name(n)),
            requested: want.map(ip),
        };
        let retained = |n: &str, a: &str, until: u64| {
            BTreeMap::from([(
                n.to_string(),
                Retention {
                    name: n.into(),
                    ip: ip(a),
                    until,
                },
            )])
        };
        let alloc = |holder: AllocateFor,
                     requested: Option<&str>,
                     preferred: Option<&str>,
                     then_free: Option<&str>| {
            Plan::Allocate {
                holder,
                requested: requested.map(ip),
                preferred: preferred.map(ip),
                then_free: then_free.map(ip),
            }
        };
        let cases: Vec<(&str, AddressRequest, View, Plan)> = vec![
            (
                "a new name gets a fresh address",
                named_req("web", None),
                View::default(),
                alloc(AllocateFor::Named(name("web")), None, None, None),
            ),
            (
                "a name with a retained address gets it back",
                named_req("web", None),
                View {
                    name_holds: Some(ip("198.18.0.5")),
                    retained: retained("web", "198.18.0.5", 99),
                    ..View::default()
                },
                Plan::Reuse(ip("198.18.0.5")),
            ),
            (
                "a name whose release was lost gets its own address back",
                named_req("web", None),
                View {
                    name_holds: Some(ip("198.18.0.5")),
                    ..View::default()
                },
                Plan::Reuse(ip("198.18.0.5")),
            ),
            (
                "a name asking for the address it holds gets it",
                named_req("web", Some("198.18.0.5")),
                View {
                    name_holds: Some(ip("198.18.0.5")),
                    ..View::default()
                },
                Plan::Reuse(ip("198.18.0.5")),
            ),
            (
                "a name asking for another address gets it and gives up its old one",
                named_req("web", Some("198.18.0.9")),
                View {
                    name_holds: Some(ip("198.18.0.5")),
                    ..View::default()
                },
                alloc(
                    AllocateFor::Named(name("web")),
                    Some("198.18.0.9"),
                    None,
                    Some("198.18.0.5"),
                ),
            ),
            (
                "an explicit address another name retains is refused",
                named_req("web", Some("198.18.0.7")),
                View {
                    requested_holder: Some(Holder::Named(name("db"))),
                    retained: retained("db", "198.18.0.7", 99),
                    ..View::default()
                },
                Plan::Refuse(Refusal {
                    ip: ip("198.18.0.7"),
                    holder: "container db".into(),
                    until: Some(99),
                }),
            ),
            (
                "an explicit address another name uses is refused",
                named_req("web", Some("198.18.0.7")),
                View {
                    requested_holder: Some(Holder::Named(name("db"))),
                    ..View::default()
                },
                Plan::Refuse(Refusal {
                    ip: ip("198.18.0.7"),
                    holder: "container db".into(),
                    until: None,
                }),
            ),
            (
                "an explicit address held by no name goes to the allocator (which says if it is taken)",
                named_req("web", Some("198.18.0.7")),
                View {
                    requested_holder: Some(Holder::Gateway),
                    ..View::default()
                },
                alloc(
                    AllocateFor::Named(name("web")),
                    Some("198.18.0.7"),
                    None,
                    None,
                ),
            ),
            (
                "a gateway without an address prefers the range's first address",
                AddressRequest {
                    purpose: Purpose::Gateway,
                    requested: None,
                },
                View {
                    first: Some(ip("198.18.0.1")),
                    ..View::default()
                },
                alloc(AllocateFor::Gateway, None, Some("198.18.0.1"), None),
            ),
            (
                "a gateway replayed after a lost release gets its address back",
                AddressRequest {
                    purpose: Purpose::Gateway,
                    requested: Some(ip("198.18.0.254")),
                },
                View {
                    gateway_holds: Some(ip("198.18.0.254")),
                    ..View::default()
                },
                Plan::Reuse(ip("198.18.0.254")),
            ),
            (
                "a gateway asked elsewhere than the one held is allocated there",
                AddressRequest {
                    purpose: Purpose::Gateway,
                    requested: Some(ip("198.18.0.1")),
                },
                View {
                    gateway_holds: Some(ip("198.18.0.254")),
                    ..View::default()
                },
                alloc(AllocateFor::Gateway, Some("198.18.0.1"), None, None),
            ),
            (
                "without a name it is host-local",
                AddressRequest {
                    purpose: Purpose::Unnamed,
                    requested: Some(ip("198.18.0.200")),
                },
                View::default(),
                alloc(AllocateFor::Unnamed, Some("198.18.0.200"), None, None),
            ),
        ];
        for (what, req, view, want) in cases {
            assert_eq!(decide_request(&req, &view), want, "{what}");
        }
    }

    #[test]
    fn release_decisions_table() {
        let day = Duration::from_secs(86_400);
        let cases: Vec<(&str, Option<Holder>, Duration, ReleasePlan)> = vec![
            ("free: nothing to do", None, day, ReleasePlan::AlreadyFree),
            (
                "a named address is retained for retain-for",
                Some(Holder::Named(name("web"))),
                day,
                ReleasePlan::Retain(Retention {
                    name: "web".into(),
                    ip: ip("198.18.0.5"),
                    until: 1_000 + 86_400,
                }),
            ),
            (
                "the gateway is freed",
                Some(Holder::Gateway),
                day,
                ReleasePlan::Free(Holder::Gateway),
            ),
            (
                "an unnamed address is freed",
                Some(Holder::Unnamed("t".into())),
                day,
                ReleasePlan::Free(Holder::Unnamed("t".into())),
            ),
            (
                "without retention a named address is freed",
                Some(Holder::Named(name("web"))),
                Duration::ZERO,
                ReleasePlan::Free(Holder::Named(name("web"))),
            ),
            (
                "a foreign file is refused",
                Some(Holder::Foreign),
                day,
                ReleasePlan::Foreign,
            ),
        ];
        for (what, holder, retain_for, want) in cases {
            assert_eq!(
                decide_release(ip("198.18.0.5"), holder, retain_for, 1_000),
                want,
                "{what}"
            );
        }
    }

    #[test]
    fn expiry_and_messages() {
        let r = Retention {
            name: "web".into(),
            ip: ip("198.18.0.5"),
            until: 100,
        };
        assert!(!is_expired(&r, 99));
        assert!(is_expired(&r, 100));
        assert_eq!(release_time(u64::MAX, Duration::from_secs(5)), u64::MAX);
        let refusal = Refusal {
            ip: ip("198.18.0.7"),
            holder: "container db".into(),
            until: Some(0),
        };
        assert_eq!(
            refusal.to_string(),
            "failed to give 198.18.0.7: it is retained for container db until 1970/01/01 00:00:00 UTC"
        );
    }
}
