//! The agent's report of the reservation files it keeps as lost ([`crate::rules::loss`]), on its
//! own pod: the condition [`POD_CONDITION`] (`True` while any is kept), whose message is a
//! [`LostReport`] as JSON — typed data that `ipkeep-operator check` and `recover` read back, not
//! prose. A pod's status is the one place the agent already writes about its node (the
//! `ipkeep.dev/InCharge` condition), so reporting needs no new right.

use std::net::IpAddr;

use ipkeep_reservation::{PodKey, Timestamp};
use serde::{Deserialize, Serialize};

/// The condition type on the agent's pod.
pub const POD_CONDITION: &str = "ipkeep.dev/ReservationsLost";
/// How many lost reservations one report lists; the rest are counted (`omitted`) and listed once
/// the first ones are recovered. A pod's status must stay well under the API server's request
/// limit; 500 entries are about 100 KiB.
pub const MAX_LISTED: usize = 500;

/// What one agent keeps as lost.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LostReport {
    /// The lost reservations, by pod.
    pub lost: Vec<LostReservation>,
    /// How many more are kept than [`LostReport::lost`] lists.
    #[serde(default)]
    pub omitted: usize,
    /// Objects a restore brought back that the node holds newer word of
    /// ([`crate::rules::loss::restored`]); absent in reports of agents built before them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restored: Vec<RestoredReservation>,
}

/// An object a restore brought back, as the node holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoredReservation {
    /// The pod's (and the reservation's) namespace and name.
    pub pod: PodKey,
    /// Older than the node's file, or released by the node.
    pub kind: RestoredKind,
    /// The object's `metadata.uid`.
    pub uid: String,
    /// Older: the addresses the node's file holds (what `recover` writes back). Released: the
    /// addresses the API's version claims (not written).
    pub ips: Vec<IpAddr>,
    /// Older: the generation of the node's file. Released: the generation the node released it
    /// at.
    pub generation: i64,
    /// The generation the API holds.
    pub api_generation: Option<i64>,
}

/// What the node holds of an object a restore brought back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RestoredKind {
    /// The API holds an older version: the node's file stays; `recover --apply` writes its
    /// addresses and node back into the object.
    Older,
    /// The node released it: no file; `recover --apply` deletes it.
    Released,
}

/// One lost reservation, as its file on the node holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LostReservation {
    /// The pod's (and the reservation's) namespace and name.
    pub pod: PodKey,
    /// The addresses the file protects.
    pub ips: Vec<IpAddr>,
    /// When the file stops protecting them (`None`: the pod held them, no release time yet).
    pub release_time: Option<Timestamp>,
    /// The lost object's `metadata.uid`.
    pub uid: String,
}

impl LostReport {
    /// The report of `all` (sorted by pod), listing at most [`MAX_LISTED`].
    pub fn of(mut all: Vec<LostReservation>) -> LostReport {
        all.sort_by(|a, b| a.pod.cmp(&b.pod));
        let omitted = all.len().saturating_sub(MAX_LISTED);
        all.truncate(MAX_LISTED);
        LostReport {
            lost: all,
            omitted,
            restored: Vec::new(),
        }
    }

    /// The report with `restored` (sorted by pod) listed too, as many as [`MAX_LISTED`] leaves
    /// room for; the rest counted in `omitted`.
    pub fn with_restored(mut self, mut restored: Vec<RestoredReservation>) -> LostReport {
        restored.sort_by(|a, b| a.pod.cmp(&b.pod));
        let room = MAX_LISTED.saturating_sub(self.lost.len());
        self.omitted += restored.len().saturating_sub(room);
        restored.truncate(room);
        self.restored = restored;
        self
    }

    /// How many are kept in all (lost and restored).
    pub fn total(&self) -> usize {
        self.lost.len() + self.restored.len() + self.omitted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_reads_back_as_written_and_lists_at_most_max() {
        let lost = |i: usize| LostReservation {
            pod: PodKey::new("db", &format!("web-{i}")).unwrap(),
            ips: vec![format!("10.1.{}.{}", i / 250, i % 250).parse().unwrap()],
            release_time: i
                .is_multiple_of(2)
                .then(|| Timestamp::from_unix_secs(1_800_000_000)),
            uid: format!("uid-{i}"),
        };
        let report = LostReport::of((0..3).rev().map(lost).collect());
        assert_eq!(report.lost[0].pod.name(), "web-0");
        let json = serde_json::to_string(&report).unwrap();
        assert_eq!(serde_json::from_str::<LostReport>(&json).unwrap(), report);
        let big = LostReport::of((0..MAX_LISTED + 7).map(lost).collect());
        assert_eq!(
            (big.lost.len(), big.omitted, big.total()),
            (MAX_LISTED, 7, MAX_LISTED + 7)
        );
        // Restored ones go along; a report without them (an older agent's) reads as before.
        let restored = RestoredReservation {
            pod: PodKey::new("db", "back").unwrap(),
            kind: RestoredKind::Older,
            uid: "uid-b".into(),
            ips: vec!["10.1.9.9".parse().unwrap()],
            generation: 3,
            api_generation: Some(2),
        };
        let both = report.clone().with_restored(vec![restored]);
        let text = serde_json::to_string(&both).unwrap();
        assert!(text.contains("\"kind\":\"older\""), "{text}");
        assert_eq!(serde_json::from_str::<LostReport>(&text).unwrap(), both);
        assert_eq!(both.total(), 4);
        assert!(!json.contains("restored"), "{json}");
        // A name that could never be a pod's is refused, not turned into a reservation.
        let bad = json.replace("web-0", "../etc");
        assert!(serde_json::from_str::<LostReport>(&bad).is_err());
    }
}
