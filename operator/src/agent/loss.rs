//! The agent's side of a lost reservation ([`crate::rules::loss`]): it reads the CRD when it saw
//! deletions (were they the CRD's?), and says what it keeps — a Warning `ReservationLost` on the
//! Node once per lost object (`RestoredOlder`, `RestoredReleased` for an object a restore brought
//! back), `ipkeep_agent_lost_reservations` (all of them), and the condition
//! [`crate::api::lost::POD_CONDITION`] on its own pod, which `check` and `recover` read.

use std::collections::{BTreeMap, HashMap, HashSet};

use ipkeep_reservation::{PodKey, ReservationFile};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, CustomResourceExt};
use prometheus::IntGauge;
use serde_json::json;

use crate::api::IPReservation;
use crate::api::lost::{
    LostReport, LostReservation, POD_CONDITION, RestoredKind, RestoredReservation,
};
use crate::rules::loss::{CrdState, LossCause, Restored, Sighting, is_older};
use crate::runtime::events::{Notice, Publisher, node_ref};
use crate::runtime::logging::error_chain;

/// Reads the IPReservation CRD: live, deleting (terminating or absent), or unknown (the read
/// failed).
pub async fn crd_state(client: &Client) -> CrdState {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    match api.get_opt(IPReservation::crd_name()).await {
        Ok(Some(crd)) if crd.metadata.deletion_timestamp.is_none() => CrdState::Live,
        Ok(_) => CrdState::Deleting,
        Err(e) => {
            tracing::warn!(error = %error_chain(&e), "cannot read the IPReservation CRD to judge deletions; judging them again on the next pass");
            CrdState::Unknown
        }
    }
}

/// What the agent has said about lost reservations, so each thing is said once.
#[derive(Debug)]
pub struct LossReporter {
    /// The node.
    pub node: String,
    /// The agent's own pod (no condition is written without it).
    pub pod: Option<PodKey>,
    /// `ipkeep_agent_lost_reservations`.
    pub gauge: IntGauge,
    /// The lost objects already announced (pod, uid).
    announced: HashSet<(PodKey, String)>,
    /// The report last written on the pod (`None`: write it).
    written: Option<LostReport>,
}

impl LossReporter {
    /// A reporter that has said nothing yet.
    pub fn new(node: String, pod: Option<PodKey>, gauge: IntGauge) -> Self {
        Self {
            node,
            pod,
            gauge,
            announced: HashSet::new(),
            written: None,
        }
    }

    /// Says what this pass keeps as lost (every network's, each pod once), and the objects a
    /// restore brought back that it holds newer word of.
    pub async fn report(
        &mut self,
        client: &Client,
        lost: Vec<(ReservationFile, LossCause)>,
        restored: Vec<Restored>,
        events: &Publisher,
    ) {
        let mut by_pod: BTreeMap<PodKey, (ReservationFile, LossCause)> = BTreeMap::new();
        let mut restored = restored;
        for (file, cause) in lost {
            if cause == LossCause::RestoredOlder {
                // Kept against the same object elsewhere, older: as an older object here.
                restored.push(Restored::Older {
                    kept: file,
                    api: None,
                });
            } else if let Ok(key) = file.pod_key() {
                by_pod.entry(key).or_insert((file, cause));
            }
        }
        let mut restored_by_pod: BTreeMap<PodKey, Restored> = BTreeMap::new();
        for r in restored {
            if let Ok(key) = r.reported().0.pod_key() {
                restored_by_pod.entry(key).or_insert(r);
            }
        }
        self.gauge
            .set(i64::try_from(by_pod.len() + restored_by_pod.len()).unwrap_or(i64::MAX));
        let current: HashSet<(PodKey, String)> = by_pod
            .iter()
            .map(|(k, (f, _))| (k.clone(), f.uid.clone()))
            .chain(
                restored_by_pod
                    .iter()
                    .map(|(k, r)| (k.clone(), r.reported().0.uid.clone())),
            )
            .collect();
        self.announced.retain(|v| current.contains(v));
        for (key, (file, cause)) in &by_pod {
            if !self.announced.insert((key.clone(), file.uid.clone())) {
                continue;
            }
            let ips: Vec<String> = file.ips.iter().map(ToString::to_string).collect();
            let until = file.release_time.map_or_else(
                || "until recovered or released".to_owned(),
                |t| format!("until {t} at most"),
            );
            let note = format!(
                "IPReservation {key} ({}) was {}: its file stays on node {} and keeps {} for the pod {until}. Run `ipkeep-operator recover` (then --apply) to re-create it, and `kubectl delete ipr` after that to free the addresses",
                file.uid,
                cause.explain(),
                self.node,
                ips.join(", ")
            );
            tracing::warn!(reservation = %key, uid = %file.uid, "{note}");
            events.publish(Notice {
                regarding: node_ref(&self.node),
                reason: crate::api::reason::RESERVATION_LOST,
                action: "KeepReservationFile",
                note: &note,
            });
        }
        for (key, r) in &restored_by_pod {
            let uid = r.reported().0.uid.clone();
            if !self.announced.insert((key.clone(), uid)) {
                continue;
            }
            let (reason, action, note) = restored_note(key, r, &self.node);
            tracing::warn!(reservation = %key, "{note}");
            events.publish(Notice {
                regarding: node_ref(&self.node),
                reason,
                action,
                note: &note,
            });
        }
        let report = LostReport::of(
            by_pod
                .into_iter()
                .map(|(pod, (file, _))| LostReservation {
                    pod,
                    ips: file.ips,
                    release_time: file.release_time,
                    uid: file.uid,
                })
                .collect(),
        )
        .with_restored(
            restored_by_pod
                .into_iter()
                .map(|(pod, r)| restored_entry(pod, r))
                .collect(),
        );
        if self.written.as_ref() == Some(&report) {
            return;
        }
        match write_condition(client, self.pod.as_ref(), &report).await {
            Ok(()) => self.written = Some(report),
            Err(e) => {
                tracing::warn!(error = %error_chain(&e), "failed to write the agent pod's {POD_CONDITION} condition; retrying on the next pass");
            }
        }
    }
}

/// The Warning for an object a restore brought back: its reason, action and note, naming the
/// API's version and the node's.
fn restored_note(
    key: &PodKey,
    r: &Restored,
    node: &str,
) -> (crate::api::reason::EventReason, &'static str, String) {
    let list = |ips: &[std::net::IpAddr]| {
        ips.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let generation = |g: Option<i64>| g.map_or_else(|| "?".to_owned(), |g| g.to_string());
    match r {
        Restored::Older { kept, api } => {
            let api = api.as_ref().map_or_else(
                || "an older generation on another node".to_owned(),
                |a| {
                    format!(
                        "generation {} with {}",
                        generation(a.generation),
                        list(&a.ips)
                    )
                },
            );
            (
                crate::api::reason::RESTORED_OLDER,
                "KeepReservationFile",
                format!(
                    "IPReservation {key} ({}) in the API is {api}, while node {node}'s file holds the newer generation {} with {}: a restore from an older backup brought the old version back. The file stays and keeps {} for the pod; run `ipkeep-operator recover` (then --apply) to write them back into the object",
                    kept.uid,
                    generation(kept.generation),
                    list(&kept.ips),
                    list(&kept.ips)
                ),
            )
        }
        Restored::Released {
            api,
            released_at_generation,
        } => (
            crate::api::reason::RESTORED_RELEASED,
            "SkipReservationFile",
            format!(
                "IPReservation {key} ({}) in the API (generation {}, {}) was released by node {node} at generation {released_at_generation}: a restore from an older backup brought it back. No file is written, so its addresses ({}) stay free for whoever got them since; run `ipkeep-operator recover` (then --apply) to delete it",
                api.uid,
                generation(api.generation),
                list(&api.ips),
                list(&api.ips)
            ),
        ),
    }
}

/// The report's entry for an object a restore brought back.
fn restored_entry(pod: PodKey, r: Restored) -> RestoredReservation {
    match r {
        Restored::Older { kept, api } => RestoredReservation {
            pod,
            kind: RestoredKind::Older,
            uid: kept.uid,
            ips: kept.ips,
            generation: kept.generation.unwrap_or_default(),
            api_generation: api.and_then(|a| a.generation),
        },
        Restored::Released {
            api,
            released_at_generation,
        } => RestoredReservation {
            pod,
            kind: RestoredKind::Released,
            uid: api.uid,
            ips: api.ips,
            generation: released_at_generation,
            api_generation: api.generation,
        },
    }
}

/// Writes the report on the agent's pod (a strategic merge of one condition, keyed by type, so
/// the in-charge condition is left alone).
async fn write_condition(
    client: &Client,
    pod: Option<&PodKey>,
    report: &LostReport,
) -> Result<(), kube::Error> {
    let Some(pod) = pod else {
        return Ok(());
    };
    let api: Api<Pod> = Api::namespaced(client.clone(), pod.namespace());
    let lost = report.total() > 0;
    let message = serde_json::to_string(report).unwrap_or_default();
    let condition = json!({
        "type": POD_CONDITION,
        "status": if lost { "True" } else { "False" },
        "reason": if lost { "ReservationsLost" } else { "NoneLost" },
        "message": message,
        "lastTransitionTime": Time(jiff::Timestamp::now()),
    });
    api.patch_status(
        pod.name(),
        &PatchParams::default(),
        &Patch::Strategic(json!({"status": {"conditions": [condition]}})),
    )
    .await
    .map(drop)
}

/// How the objects of the gone files went ([`Sighting`]), asked of the API server as little as
/// possible: the CRD once per pass that has deletions to judge, and each file not seen deleted
/// once (by name, through the list right the agent has), remembered while the file stays.
#[derive(Debug, Default)]
pub struct Sightings {
    /// Files not seen deleted, already asked about: (pod, uid) → what the API server said.
    asked: HashMap<(PodKey, String), Sighting>,
}

impl Sightings {
    /// The sighting of every file in `gone` on `node`, given the deletions the watch delivered.
    pub async fn sight(
        &mut self,
        client: &Client,
        node: &str,
        gone: &[ReservationFile],
        deleted: &HashSet<(PodKey, String)>,
    ) -> HashMap<(PodKey, String), Sighting> {
        let mut crd = None;
        let mut out = HashMap::new();
        for file in gone {
            let Ok(key) = file.pod_key() else {
                continue;
            };
            let id = (key, file.uid.clone());
            let sighting = if deleted.contains(&id) {
                if crd.is_none() {
                    crd = Some(crd_state(client).await);
                }
                let seen = Sighting::Deleted(crd.unwrap_or(CrdState::Unknown));
                // The deletion is taken by this pass: what it was is remembered while the file
                // stays (the CRD's deletion must not be asked again as a vanished object).
                if crd != Some(CrdState::Unknown) {
                    self.asked.insert(id.clone(), seen);
                }
                seen
            } else if let Some(known) = self.asked.get(&id) {
                *known
            } else {
                let asked = elsewhere(client, node, &id.0, file).await;
                if asked != Sighting::Unasked {
                    self.asked.insert(id.clone(), asked);
                }
                asked
            };
            out.insert(id, sighting);
        }
        self.asked.retain(|id, _| out.contains_key(id));
        out
    }
}

/// Asks the API server for `pod`'s reservation: the same object on another node (it moved while
/// the agent was not watching; or, older than `file`, a restore took it back there), or none (or
/// another object: lost, for `recover` to list).
async fn elsewhere(client: &Client, node: &str, pod: &PodKey, file: &ReservationFile) -> Sighting {
    let api: Api<IPReservation> = Api::namespaced(client.clone(), pod.namespace());
    let params = ListParams::default().fields(&format!("metadata.name={}", pod.name()));
    match api.list(&params).await {
        Ok(list) => {
            let moved = list.items.iter().find(|r| {
                r.metadata.uid.as_deref() == Some(file.uid.as_str()) && r.spec.node_name != node
            });
            match moved {
                Some(r) if is_older(r.metadata.generation, file.generation, true) => {
                    Sighting::ElsewhereOlder
                }
                Some(_) => Sighting::Elsewhere,
                None => Sighting::Vanished,
            }
        }
        // No such resource: the CRD is gone, and the object with it.
        Err(kube::Error::Api(ae)) if ae.code == 404 => Sighting::Vanished,
        Err(e) => {
            tracing::warn!(reservation = %pod, error = %error_chain(&e), "cannot ask the API server for a reservation this node's watch no longer shows; asking again on the next pass");
            Sighting::Unasked
        }
    }
}
