//! Saying where users look whether ipkeep is in charge on this node, within [`POLL`] of the
//! evidence changing, and clearing it all by itself once it is fixed:
//! * a Warning Event `NotInCharge` on the Node naming the network, what is wrong and the fix (a
//!   Normal `InCharge` when it is fixed);
//! * `ipkeep_agent_in_charge{network}` (1 or 0) and `ipkeep_agent_not_in_charge{network,reason}`;
//! * the condition [`POD_CONDITION`] on the agent's own pod (what `ipkeep-operator check` reads);
//! * the condition `Unprotected` ([`crate::api::CONDITION_UNPROTECTED`]) on each of the node's
//!   reservations while any of its networks is not in charge (`kubectl get ipr` shows its reason),
//!   written with server-side apply under [`FIELD_MANAGER`], so the controller's own status
//!   fields and its `Conflict` condition are untouched, and removed by applying none.
//!
//! The evidence is read every [`POLL`] (a few small files and two `stat`s; the plugin binary is
//! read only when `host-local`'s size matches it).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Api, Client};
use prometheus::IntGaugeVec;
use serde_json::json;

use super::evidence::{self, EvidenceError, Sources};
use crate::api::{CONDITION_UNPROTECTED, IPReservation};
use crate::api::{PodKey, key_of};
use crate::rules::incharge::{
    BinDir, Binary, Evidence, Explained, Reason, Verdict, decide, undecided,
};
use crate::runtime::events::{Notice, Publisher, node_ref};
use crate::runtime::logging::error_chain;

/// How often the evidence is read.
pub const POLL: Duration = Duration::from_secs(2);
/// The condition on the agent's pod: `True` while ipkeep is in charge of every network.
pub const POD_CONDITION: &str = "ipkeep.dev/InCharge";
/// The field manager of the agent's status writes.
pub const FIELD_MANAGER: &str = "ipkeep-agent";

/// What the in-charge check needs besides the client and the reservations.
#[derive(Debug, Clone)]
pub struct Reporter {
    /// Where the evidence is.
    pub sources: Sources,
    /// The agent's networks.
    pub networks: Vec<String>,
    /// The agent's data directory (the same path on the node).
    pub data_dir: String,
    /// This node's name.
    pub node: String,
    /// The agent's own pod, whose condition says the node's state.
    pub pod: Option<PodKey>,
}

/// The node as a whole: protected when every network is in charge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    /// Every network in charge.
    pub in_charge: bool,
    /// The first network's reason (`InCharge` when in charge).
    pub reason: &'static str,
    /// Every network's explanation, for people.
    pub message: String,
}

/// The node's state from its networks' verdicts (pure).
pub fn node_state(verdicts: &[(&str, Verdict)], evidence: &Evidence) -> NodeState {
    let not: Vec<(&str, &Reason)> = verdicts
        .iter()
        .filter_map(|(n, v)| match v {
            Verdict::NotInCharge(r) => Some((*n, r)),
            Verdict::InCharge => None,
        })
        .collect();
    match not.first() {
        None => NodeState {
            in_charge: true,
            reason: "InCharge",
            message: format!(
                "ipkeep is the IPAM of {} on this node",
                verdicts
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
        Some((_, first)) => NodeState {
            in_charge: false,
            reason: first.label(),
            message: not
                .iter()
                .map(|(network, reason)| {
                    Explained {
                        network,
                        reason,
                        evidence,
                    }
                    .to_string()
                })
                .collect::<Vec<_>>()
                .join("; "),
        },
    }
}

/// The `Unprotected` condition a reservation carries: its reason and message.
pub type Mark<'a> = Option<(&'a str, &'a str)>;

/// Which reservations need a write for `state` (pure): `true` to mark, `false` to clear. A
/// reservation already marked with the same reason and message is left alone.
pub fn marks_to_write<'a>(
    current: impl IntoIterator<Item = (PodKey, Mark<'a>)>,
    state: &NodeState,
) -> Vec<(PodKey, bool)> {
    current
        .into_iter()
        .filter_map(|(key, mark)| match (state.in_charge, mark) {
            (true, None) => None,
            (true, Some(_)) => Some((key, false)),
            (false, Some((r, m))) if r == state.reason && m == state.message => None,
            (false, _) => Some((key, true)),
        })
        .collect()
}

/// The agent's `Unprotected` mark on a reservation, if any.
fn mark_of(ipr: &IPReservation) -> Mark<'_> {
    ipr.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_UNPROTECTED && c.status == "True")
        .map(|c| (c.reason.as_str(), c.message.as_str()))
}

/// The in-charge metrics.
#[derive(Debug, Clone)]
pub struct InChargeMetrics {
    /// `ipkeep_agent_in_charge{network}`.
    pub in_charge: IntGaugeVec,
    /// `ipkeep_agent_not_in_charge{network,reason}`.
    pub not_in_charge: IntGaugeVec,
}

impl InChargeMetrics {
    fn set(&self, network: &str, verdict: &Verdict) {
        self.in_charge
            .with_label_values(&[network])
            .set(i64::from(*verdict == Verdict::InCharge));
        for label in Reason::LABELS {
            let on = matches!(verdict, Verdict::NotInCharge(r) if r.label() == label);
            self.not_in_charge
                .with_label_values(&[network, label])
                .set(i64::from(on));
        }
    }
}

/// The evidence when the directories are not known: nothing read (the reason's message says why).
fn unknown_dirs() -> Evidence {
    Evidence {
        conf_dir: String::new(),
        bin_dir: String::new(),
        confs: Vec::new(),
        bin: BinDir {
            ipkeep: Binary::Missing,
            host_local: Binary::Missing,
            original_kept: false,
        },
    }
}

/// Reads the evidence every [`POLL`] and says what changed, until the task is aborted.
pub async fn run(
    r: Reporter,
    client: Client,
    store: Store<IPReservation>,
    events: Publisher,
    metrics: InChargeMetrics,
) {
    let mut last: Option<Vec<Verdict>> = None;
    let mut pod_written: Option<NodeState> = None;
    let mut tick = tokio::time::interval(POLL);
    loop {
        tick.tick().await;
        let (evidence, verdicts) = match evidence::read(&r.sources) {
            Ok(e) => {
                let verdicts = decide(&r.networks, &r.data_dir, &e);
                (e, verdicts)
            }
            Err(EvidenceError::Locate(e)) => {
                let why = format!("node {}: {}", r.node, error_chain(&e));
                (unknown_dirs(), undecided(&r.networks, &why))
            }
            Err(e) => {
                tracing::warn!(error = %error_chain(&e), "cannot read whether ipkeep is in charge on this node");
                continue;
            }
        };
        for (i, (network, verdict)) in verdicts.iter().enumerate() {
            let before = last.as_ref().and_then(|l| l.get(i));
            if before == Some(verdict) {
                continue;
            }
            metrics.set(network, verdict);
            announce(
                &r.node,
                network,
                verdict,
                before.is_some(),
                &evidence,
                &events,
            );
        }
        last = Some(verdicts.iter().map(|(_, v)| v.clone()).collect());
        let state = node_state(&verdicts, &evidence);
        if pod_written.as_ref() != Some(&state) {
            pod_written = match write_pod_condition(&client, r.pod.as_ref(), &state).await {
                Ok(()) => Some(state.clone()),
                Err(e) => {
                    tracing::warn!(error = %error_chain(&e), "failed to write the agent pod's {POD_CONDITION} condition; retrying");
                    None
                }
            };
        }
        let all = store.state();
        let changes = marks_to_write(
            all.iter()
                .filter_map(|o| Some((key_of(o.as_ref()).ok()?, mark_of(o)))),
            &state,
        );
        for (key, mark) in changes {
            if let Err(e) = write_mark(&client, &key, mark.then_some(&state)).await {
                tracing::warn!(reservation = %key, error = %error_chain(&e), "failed to write the Unprotected condition; retrying");
            }
        }
    }
}

fn announce(
    node: &str,
    network: &str,
    verdict: &Verdict,
    was_known: bool,
    evidence: &Evidence,
    events: &Publisher,
) {
    let (reason, note) = match verdict {
        Verdict::NotInCharge(reason) => {
            let note = Explained {
                network,
                reason,
                evidence,
            }
            .to_string();
            tracing::warn!(network, reason = reason.label(), "{note}");
            (crate::api::reason::NOT_IN_CHARGE, note)
        }
        Verdict::InCharge => {
            tracing::info!(network, "ipkeep is in charge of network {network}");
            if !was_known {
                return;
            }
            (
                crate::api::reason::IN_CHARGE,
                format!(
                    "ipkeep is in charge of network {network} again: its reserved addresses are protected"
                ),
            )
        }
    };
    events.publish(Notice {
        regarding: node_ref(node),
        reason,
        action: "CheckInCharge",
        note: &note,
    });
}

async fn write_pod_condition(
    client: &Client,
    pod: Option<&PodKey>,
    state: &NodeState,
) -> Result<(), kube::Error> {
    let Some(pod) = pod else {
        return Ok(());
    };
    let (namespace, name) = (pod.namespace(), pod.name());
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let condition = json!({
        "type": POD_CONDITION,
        "status": if state.in_charge { "True" } else { "False" },
        "reason": state.reason,
        "message": state.message,
        "lastTransitionTime": Time(jiff::Timestamp::now()),
    });
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Strategic(json!({"status": {"conditions": [condition]}})),
    )
    .await
    .map(drop)
}

async fn write_mark(
    client: &Client,
    key: &PodKey,
    mark: Option<&NodeState>,
) -> Result<(), kube::Error> {
    let api: Api<IPReservation> = Api::namespaced(client.clone(), key.namespace());
    let conditions: Vec<Condition> = mark
        .map(|s| Condition {
            type_: CONDITION_UNPROTECTED.into(),
            status: "True".into(),
            reason: s.reason.into(),
            message: s.message.clone(),
            last_transition_time: Time(jiff::Timestamp::now()),
            observed_generation: None,
        })
        .into_iter()
        .collect();
    let body = json!({
        "apiVersion": "ipkeep.dev/v1alpha1",
        "kind": "IPReservation",
        "status": {"conditions": conditions},
    });
    api.patch_status(
        key.name(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: &str) -> PodKey {
        PodKey::new("ns", n).unwrap()
    }

    #[test]
    fn reservations_are_marked_and_cleared_only_when_they_differ() {
        let bad = NodeState {
            in_charge: false,
            reason: "HostLocalNotReplaced",
            message: "m".into(),
        };
        let good = NodeState {
            in_charge: true,
            reason: "InCharge",
            message: "ok".into(),
        };
        let current = || {
            vec![
                (key("unmarked"), None),
                (key("same"), Some(("HostLocalNotReplaced", "m"))),
                (key("other"), Some(("NetworkNotConfigured", "m"))),
            ]
        };
        assert_eq!(
            marks_to_write(current(), &bad),
            vec![(key("unmarked"), true), (key("other"), true)]
        );
        assert_eq!(
            marks_to_write(current(), &good),
            vec![(key("same"), false), (key("other"), false)]
        );
    }

    #[test]
    fn the_node_is_in_charge_only_when_every_network_is() {
        let e = Evidence {
            conf_dir: "/etc/cni/net.d".into(),
            bin_dir: "/opt/cni/bin".into(),
            confs: vec![],
            bin: crate::rules::incharge::BinDir {
                ipkeep: crate::rules::incharge::Binary::Ipkeep,
                host_local: crate::rules::incharge::Binary::Other,
                original_kept: false,
            },
        };
        let ok = node_state(&[("a", Verdict::InCharge), ("b", Verdict::InCharge)], &e);
        assert!(ok.in_charge);
        assert_eq!(ok.reason, "InCharge");
        let missing = Verdict::NotInCharge(Reason::NetworkNotConfigured {
            found: vec!["a".into()],
            skipped: vec![],
        });
        let half = node_state(&[("a", Verdict::InCharge), ("b", missing)], &e);
        assert!(!half.in_charge);
        assert_eq!(half.reason, "NetworkNotConfigured");
        assert!(half.message.contains("network b:"), "{}", half.message);
        assert!(!half.message.contains("network a:"), "{}", half.message);
    }
}
