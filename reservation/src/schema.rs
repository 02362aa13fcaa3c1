//! The reservation file's schema (`<dataDir>/<network>/reserved/<namespace>/<pod>`) and the
//! validation of every name that becomes a path.

use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::timestamp::Timestamp;

/// The schema version this build writes and the only one it reads. Adding an optional field keeps
/// the version (readers ignore fields they do not know); anything an older reader would
/// misunderstand (a renamed field, a new meaning) bumps it, and older plugins then skip the file
/// with [`SchemaError::UnsupportedVersion`] instead of guessing.
pub const FORMAT_VERSION: u32 = 1;

/// Largest reservation file read: a real one is about 200 bytes.
pub const MAX_FILE_LEN: usize = 64 * 1024;

/// Kubernetes' limit for a DNS-1123 label (namespace names).
const MAX_LABEL_LEN: usize = 63;
/// Kubernetes' limit for a DNS-1123 subdomain (pod names).
const MAX_SUBDOMAIN_LEN: usize = 253;

/// One reservation as the agent writes it and the plugin reads it.
///
/// ```json
/// {"version":1,"namespace":"db","pod":"postgres-0","ips":["10.244.1.17","fd00:10:244:1::11"],
///  "releaseTime":null,"uid":"5b0c…","nodeName":"node-a","generation":3,"retainForSeconds":86400}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReservationFile {
    /// Schema version, [`FORMAT_VERSION`].
    pub version: u32,
    /// The pod's namespace (also the directory name).
    pub namespace: String,
    /// The pod's name (also the file name).
    pub pod: String,
    /// The reserved addresses, at most one per configured range set.
    pub ips: Vec<IpAddr>,
    /// When the reservation stops holding its addresses; `null` while a pod holds them (`Bound`).
    pub release_time: Option<Timestamp>,
    /// The IPReservation's `metadata.uid`, to tell a re-created reservation from the old one.
    pub uid: String,
    /// The node the reservation belongs to (for humans reading the file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// The IPReservation's `metadata.generation` the file was written from: what tells an object
    /// an etcd restore brought back in an older version from the one this file holds (the
    /// operator's `rules::loss`). Optional, so the version stays 1: files written before it
    /// (absent: unknown, never compared) and plugins built before it (they ignore it) both read
    /// as they did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// The reservation's retention in seconds (its own `retainFor`, else the default) when the
    /// file was written: how long the node keeps a `Bound` file whose object vanished without a
    /// deletion it saw (the operator's `rules::loss::kept_until`). Optional, as `generation` is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain_for_seconds: Option<u64>,
}

/// A pod's identity, which its reservation shares: its namespace and name, both valid as
/// Kubernetes validates them. [`PodKey::new`] is the only way to build one, decoding included,
/// so a key can always become a path. Displays as `namespace/name` and orders as that text does
/// (the operator's tie-break between two reservations created in the same second). Encoded as
/// `{"namespace": …, "name": …}` (ipkeep's container index on disk, the operator's status).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct PodKey {
    /// The namespace.
    namespace: String,
    /// The name.
    name: String,
}

/// A [`PodKey`]'s encoding before its names are checked.
#[derive(Deserialize)]
struct PodKeyFields {
    namespace: String,
    name: String,
}

/// Why a name or a reservation file is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// The namespace is not a DNS-1123 label.
    #[error("invalid namespace {name:?}: {why}")]
    InvalidNamespace {
        /// The name as found.
        name: String,
        /// Which rule it breaks.
        why: &'static str,
    },
    /// The pod name is not a DNS-1123 subdomain.
    #[error("invalid pod name {name:?}: {why}")]
    InvalidPodName {
        /// The name as found.
        name: String,
        /// Which rule it breaks.
        why: &'static str,
    },
    /// The bytes are not JSON of the expected shape.
    #[error("failed to decode reservation file: {0}")]
    Json(String),
    /// The file has no `version`.
    #[error("failed to decode reservation file: no \"version\" field")]
    MissingVersion,
    /// The file was written for a schema this plugin does not know.
    #[error(
        "failed to decode reservation file: version {found} is not supported (this plugin reads version {FORMAT_VERSION}); upgrade the plugin"
    )]
    UnsupportedVersion {
        /// The version in the file.
        found: u64,
    },
    /// The file lists no address.
    #[error("reservation of {0} lists no address")]
    NoAddresses(PodKey),
    /// An address appears twice.
    #[error("reservation of {pod} lists {ip} twice")]
    DuplicateAddress {
        /// Whose reservation.
        pod: PodKey,
        /// The repeated address.
        ip: IpAddr,
    },
}

impl PodKey {
    /// A key from a namespace and a pod name, both validated as Kubernetes validates them.
    pub fn new(namespace: &str, name: &str) -> Result<Self, SchemaError> {
        validate_namespace(namespace)?;
        validate_pod_name(name)?;
        Ok(Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The pod's (and its reservation's) name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bytes of `namespace/name`, which the order follows.
    fn text(&self) -> impl Iterator<Item = u8> + '_ {
        self.namespace
            .bytes()
            .chain(std::iter::once(b'/'))
            .chain(self.name.bytes())
    }
}

impl Ord for PodKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.text().cmp(other.text())
    }
}

impl PartialOrd for PodKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for PodKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl<'de> Deserialize<'de> for PodKey {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let fields = PodKeyFields::deserialize(deserializer)?;
        PodKey::new(&fields.namespace, &fields.name).map_err(serde::de::Error::custom)
    }
}

impl ReservationFile {
    /// The namespace/name of the pod this reservation is for, if both are valid names (always,
    /// for a file read with [`ReservationFile::from_json`]; [`ValidReservation::key`] cannot fail).
    pub fn pod_key(&self) -> Result<PodKey, SchemaError> {
        PodKey::new(&self.namespace, &self.pod)
    }

    /// Whether the reservation holds its addresses at `now`: bound (no release time) or released
    /// but not yet expired. At exactly `releaseTime` it no longer holds them.
    pub fn is_active(&self, now: Timestamp) -> bool {
        self.release_time.is_none_or(|release| now < release)
    }

    /// Decodes and validates a file's bytes; IPv4-mapped IPv6 addresses become IPv4 (as
    /// host-local canonicalises requested addresses).
    pub fn from_json(bytes: &[u8]) -> Result<Self, SchemaError> {
        // Read the version first so a future schema is refused by number, not by whatever field
        // happens to fail to decode.
        #[derive(Deserialize)]
        struct VersionProbe {
            version: Option<serde_json::Value>,
        }
        let probe: VersionProbe =
            serde_json::from_slice(bytes).map_err(|e| SchemaError::Json(e.to_string()))?;
        match probe.version {
            None | Some(serde_json::Value::Null) => return Err(SchemaError::MissingVersion),
            Some(serde_json::Value::Number(n)) if n.as_u64() == Some(u64::from(FORMAT_VERSION)) => {
            }
            Some(serde_json::Value::Number(n)) if n.as_u64().is_some() => {
                return Err(SchemaError::UnsupportedVersion {
                    found: n.as_u64().unwrap_or_default(),
                });
            }
            Some(other) => {
                return Err(SchemaError::Json(format!(
                    "\"version\" must be a non-negative integer, found {other}"
                )));
            }
        }
        let mut file: ReservationFile =
            serde_json::from_slice(bytes).map_err(|e| SchemaError::Json(e.to_string()))?;
        for ip in &mut file.ips {
            *ip = ip.to_canonical();
        }
        file.check()?;
        Ok(file)
    }

    /// Encodes the file as the agent writes it: one line of JSON and a newline.
    pub fn to_json(&self) -> Vec<u8> {
        // Serialising plain strings, addresses and timestamps cannot fail; fall back to an empty
        // object rather than panic, which validation then rejects on read.
        let mut out = serde_json::to_vec(self).unwrap_or_else(|_| b"{}".to_vec());
        out.push(b'\n');
        out
    }

    /// The file, once its names, version and addresses are checked: what the writer takes, so it
    /// never writes what the reader would skip.
    pub fn validate(self) -> Result<ValidReservation, SchemaError> {
        self.check()?;
        Ok(ValidReservation(self))
    }

    /// The rule [`ReservationFile::validate`] and [`ReservationFile::from_json`] apply.
    fn check(&self) -> Result<(), SchemaError> {
        if self.version != FORMAT_VERSION {
            return Err(SchemaError::UnsupportedVersion {
                found: u64::from(self.version),
            });
        }
        let key = self.pod_key()?;
        if self.ips.is_empty() {
            return Err(SchemaError::NoAddresses(key));
        }
        let mut seen = HashSet::with_capacity(self.ips.len());
        for ip in &self.ips {
            if !seen.insert(ip.to_canonical()) {
                return Err(SchemaError::DuplicateAddress { pod: key, ip: *ip });
            }
        }
        Ok(())
    }
}

/// A [`ReservationFile`] that passed [`ReservationFile::validate`]; only that builds one, so
/// holding it proves the file may be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidReservation(ReservationFile);

impl ValidReservation {
    /// The file itself.
    pub fn into_inner(self) -> ReservationFile {
        self.0
    }

    /// The namespace/name of the pod this reservation is for.
    pub fn key(&self) -> PodKey {
        // Checked by `validate`, and the file cannot change since.
        PodKey {
            namespace: self.0.namespace.clone(),
            name: self.0.pod.clone(),
        }
    }
}

impl std::ops::Deref for ValidReservation {
    type Target = ReservationFile;

    fn deref(&self) -> &ReservationFile {
        &self.0
    }
}

/// A namespace name as Kubernetes allows it (`ValidateNamespaceName`: a DNS-1123 label):
/// 1–63 characters of `[a-z0-9-]`, starting and ending with a letter or digit.
pub fn validate_namespace(name: &str) -> Result<(), SchemaError> {
    let bad = |why| SchemaError::InvalidNamespace {
        name: name.to_owned(),
        why,
    };
    if name.len() > MAX_LABEL_LEN {
        return Err(bad("longer than 63 characters"));
    }
    check_label(name.as_bytes()).map_err(bad)
}

/// A pod name as Kubernetes allows it (`ValidatePodName`: a DNS-1123 subdomain): at most 253
/// characters, dot-separated labels of `[a-z0-9-]` that each start and end with a letter or
/// digit. So `.`, `..`, `/`, empty labels and upper case are all impossible.
pub fn validate_pod_name(name: &str) -> Result<(), SchemaError> {
    let bad = |why| SchemaError::InvalidPodName {
        name: name.to_owned(),
        why,
    };
    if name.len() > MAX_SUBDOMAIN_LEN {
        return Err(bad("longer than 253 characters"));
    }
    if name.is_empty() {
        return Err(bad("empty"));
    }
    name.as_bytes()
        .split(|&c| c == b'.')
        .try_for_each(check_label)
        .map_err(bad)
}

/// One DNS-1123 label without its length limit (a subdomain's labels are only bounded by the
/// whole name's length in Kubernetes' validation).
fn check_label(label: &[u8]) -> Result<(), &'static str> {
    let (Some(first), Some(last)) = (label.first(), label.last()) else {
        return Err("empty label");
    };
    if !label
        .iter()
        .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
    {
        return Err("only lower-case letters, digits and '-' are allowed in a DNS-1123 label");
    }
    if *first == b'-' || *last == b'-' {
        return Err("must start and end with a letter or digit");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn sample() -> ReservationFile {
        ReservationFile {
            version: 1,
            namespace: "db".into(),
            pod: "postgres-0".into(),
            ips: vec![
                IpAddr::V4(Ipv4Addr::new(10, 244, 1, 17)),
                "fd00:10:244:1::11".parse().unwrap(),
            ],
            release_time: None,
            uid: "5b0c7a3e-1d2f-4c1a-9b7e-0d7c2f4e9a11".into(),
            node_name: Some("node-a".into()),
            generation: None,
            retain_for_seconds: None,
        }
    }

    #[test]
    fn pod_keys_order_as_their_text() {
        let key = |ns, name| PodKey::new(ns, name).unwrap();
        let cases = [
            (key("a-b", "x"), key("a", "x")),
            (key("a", "b"), key("a", "c")),
            (key("a", "z"), key("b", "a")),
            (key("a", "b"), key("a", "b.c")),
        ];
        for (low, high) in cases {
            assert!(low < high, "{low} < {high}");
            assert!(low.to_string() < high.to_string(), "{low} < {high} as text");
        }
    }

    #[test]
    fn pod_keys_encode_both_names_and_decode_only_valid_ones() {
        let key = PodKey::new("db", "postgres-0").unwrap();
        assert_eq!((key.namespace(), key.name()), ("db", "postgres-0"));
        assert_eq!(key.to_string(), "db/postgres-0");
        let text = serde_json::to_string(&key).unwrap();
        assert_eq!(text, r#"{"namespace":"db","name":"postgres-0"}"#);
        assert_eq!(serde_json::from_str::<PodKey>(&text).unwrap(), key);
        for bad in [
            r#"{"namespace":"db","name":"Postgres_0"}"#,
            r#"{"namespace":"d/b","name":"postgres-0"}"#,
            r#"{"namespace":"db","name":".."}"#,
            r#"{"namespace":"db"}"#,
        ] {
            assert!(serde_json::from_str::<PodKey>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn namespace_names() {
        let long63 = "a".repeat(63);
        let long64 = "a".repeat(64);
        let cases: &[(&str, bool)] = &[
            ("default", true),
            ("kube-system", true),
            ("a", true),
            ("0", true),
            ("a-0", true),
            (&long63, true),
            (&long64, false),
            ("", false),
            ("-a", false),
            ("a-", false),
            ("A", false),
            ("a.b", false),
            ("a_b", false),
            (".", false),
            ("..", false),
            ("a/b", false),
            ("é", false),
            ("a\0", false),
        ];
        for &(name, ok) in cases {
            assert_eq!(validate_namespace(name).is_ok(), ok, "{name:?}");
        }
    }

    #[test]
    fn pod_names() {
        let long253 = format!("{}.{}", "a".repeat(126), "b".repeat(126));
        let long254 = "a".repeat(254);
        let cases: &[(&str, bool)] = &[
            ("postgres-0", true),
            ("web.example", true),
            ("a.b.c", true),
            ("0", true),
            (&long253, true),
            (&"a".repeat(200), true),
            (&long254, false),
            ("", false),
            (".", false),
            ("..", false),
            ("a..b", false),
            (".a", false),
            ("a.", false),
            ("a.-b", false),
            ("a-.b", false),
            ("-a", false),
            ("Pod", false),
            ("a/b", false),
            ("../etc", false),
            ("a b", false),
            ("a\n", false),
        ];
        for &(name, ok) in cases {
            assert_eq!(validate_pod_name(name).is_ok(), ok, "{name:?}");
        }
    }

    #[test]
    fn json_round_trip_and_layout() {
        let file = sample();
        let json = file.to_json();
        assert_eq!(
            String::from_utf8(json.clone()).unwrap(),
            "{\"version\":1,\"namespace\":\"db\",\"pod\":\"postgres-0\",\"ips\":[\"10.244.1.17\",\"fd00:10:244:1::11\"],\"releaseTime\":null,\"uid\":\"5b0c7a3e-1d2f-4c1a-9b7e-0d7c2f4e9a11\",\"nodeName\":\"node-a\"}\n"
        );
        assert_eq!(ReservationFile::from_json(&json).unwrap(), file);

        let released = ReservationFile {
            release_time: Some(Timestamp::from_unix_secs(1_795_262_400)),
            node_name: None,
            ..sample()
        };
        let text = String::from_utf8(released.to_json()).unwrap();
        assert!(
            text.contains("\"releaseTime\":\"2026-11-21T12:00:00Z\""),
            "{text}"
        );
        assert!(!text.contains("nodeName"), "{text}");
        assert_eq!(
            ReservationFile::from_json(text.as_bytes()).unwrap(),
            released
        );
    }

    #[test]
    fn the_generation_is_written_when_known_and_optional_to_read() {
        let file = ReservationFile {
            generation: Some(3),
            ..sample()
        };
        let text = String::from_utf8(file.to_json()).unwrap();
        assert!(text.ends_with(",\"generation\":3}\n"), "{text}");
        assert_eq!(ReservationFile::from_json(text.as_bytes()).unwrap(), file);
        // A file an older agent wrote has none, and reads as unknown.
        let old = String::from_utf8(sample().to_json()).unwrap();
        assert!(!old.contains("generation"), "{old}");
        assert_eq!(
            ReservationFile::from_json(old.as_bytes())
                .unwrap()
                .generation,
            None
        );
        // The same layout, as a reader built before the field knows it: the rest of the file
        // and nothing else (what older plugins read; the unknown field is ignored).
        #[derive(serde::Deserialize, PartialEq, Debug)]
        #[serde(rename_all = "camelCase")]
        struct BeforeGeneration {
            version: u32,
            ips: Vec<IpAddr>,
            uid: String,
        }
        let before: BeforeGeneration = serde_json::from_str(&text).unwrap();
        assert_eq!((before.version, before.uid), (1, sample().uid));
    }

    #[test]
    fn decoding_accepts_and_canonicalises() {
        let json = br#"{"version":1,"namespace":"db","pod":"p","ips":["::ffff:10.0.0.1"],
            "releaseTime":"2026-11-21T12:00:00.25Z","uid":"u","futureField":{"x":1}}"#;
        let file = ReservationFile::from_json(json).unwrap();
        assert_eq!(file.ips, vec![IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))]);
        assert_eq!(
            file.release_time,
            Some(Timestamp::new(1_795_262_400, 250_000_000).unwrap())
        );
        assert_eq!(file.node_name, None);
        // A missing releaseTime reads as bound.
        let json = br#"{"version":1,"namespace":"db","pod":"p","ips":["::1"],"uid":"u"}"#;
        let file = ReservationFile::from_json(json).unwrap();
        assert_eq!(file.release_time, None);
        assert_eq!(file.ips, vec![IpAddr::V6(Ipv6Addr::LOCALHOST)]);
    }

    #[test]
    fn decoding_rejects() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "failed to decode reservation file"),
            (b"{", "failed to decode reservation file"),
            (b"[]", "failed to decode reservation file"),
            (br#"{"namespace":"db"}"#, "no \"version\" field"),
            (br#"{"version":null}"#, "no \"version\" field"),
            (br#"{"version":2,"whatever":true}"#, "version 2 is not supported"),
            (br#"{"version":"1"}"#, "must be a non-negative integer"),
            (br#"{"version":-1}"#, "must be a non-negative integer"),
            (br#"{"version":1.5}"#, "must be a non-negative integer"),
            (
                br#"{"version":1,"namespace":"db","pod":"p","ips":["10.0.0.300"],"releaseTime":null,"uid":"u"}"#,
                "invalid IP address",
            ),
            (
                br#"{"version":1,"namespace":"db","pod":"p","ips":["10.0.0.3"],"releaseTime":"soon","uid":"u"}"#,
                "failed to parse timestamp",
            ),
            (
                br#"{"version":1,"namespace":"DB","pod":"p","ips":["10.0.0.3"],"releaseTime":null,"uid":"u"}"#,
                "invalid namespace",
            ),
            (
                br#"{"version":1,"namespace":"db","pod":"../x","ips":["10.0.0.3"],"releaseTime":null,"uid":"u"}"#,
                "invalid pod name",
            ),
            (
                br#"{"version":1,"namespace":"db","pod":"p","ips":[],"releaseTime":null,"uid":"u"}"#,
                "lists no address",
            ),
            (
                br#"{"version":1,"namespace":"db","pod":"p","ips":["10.0.0.3","::ffff:10.0.0.3"],"releaseTime":null,"uid":"u"}"#,
                "lists 10.0.0.3 twice",
            ),
            (
                br#"{"version":1,"namespace":"db","pod":"p","ips":["10.0.0.3"],"releaseTime":null}"#,
                "missing field `uid`",
            ),
        ];
        for &(bytes, expect) in cases {
            let err = ReservationFile::from_json(bytes).unwrap_err().to_string();
            assert!(
                err.contains(expect),
                "{:?}: {err}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[test]
    fn activity_depends_on_release_time() {
        let t = Timestamp::from_unix_secs(1_000);
        let bound = sample();
        assert!(bound.is_active(t));
        let released = ReservationFile {
            release_time: Some(t),
            ..sample()
        };
        assert!(released.is_active(Timestamp::new(999, 999_999_999).unwrap()));
        assert!(!released.is_active(t));
        assert!(!released.is_active(Timestamp::from_unix_secs(1_001)));
    }
}
