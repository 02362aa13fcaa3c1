//! Placement: bringing a returning pod back to the node whose range holds its reserved addresses.
//!
//! Addresses are node-local, so a reservation can only be honoured on its node. The scheduler does
//! not know that; the admission webhook ([`super::webhook`]) tells it by adding a node affinity term
//! for the reservation's node to the pod being created. This module is the whole rule, as plain
//! data: which pods get a term, which term, and why a pod that asked got nothing (what is recorded
//! on the pod is [`crate::rules::placement`]). No Kubernetes client, no clock, no I/O; its terms are
//! the API's own types, so it stays beside the webhook rather than among the rules.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PreferredSchedulingTerm,
};
use serde_json::{Value, json};

use crate::rules::{
    optin::{Mode, Retain},
    placement::{PLACED, Placed},
};

/// The weight of the preferred term: the largest the API allows, so that among nodes that fit it
/// outweighs spreading and balancing (each scores at most 100 before its plugin weight).
pub const PREFERRED_WEIGHT: i32 = 100;
/// The node field a term selects on: the node's name, exactly (labels such as
/// `kubernetes.io/hostname` may differ from it).
const NODE_NAME_FIELD: &str = "metadata.name";

/// The node a reservation is on, as the controller's node cache has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeFacts<'a> {
    /// `metadata.name`.
    pub name: &'a str,
    /// `metadata.labels`.
    pub labels: &'a BTreeMap<String, String>,
}

/// What the pod being created says about where it may run.
#[derive(Debug, Clone, Copy, Default)]
pub struct PodScheduling<'a> {
    /// `spec.nodeName`: already bound to a node.
    pub node_name: Option<&'a str>,
    /// `spec.nodeSelector`.
    pub node_selector: Option<&'a BTreeMap<String, String>>,
    /// `spec.affinity`.
    pub affinity: Option<&'a Affinity>,
}

/// Everything [`decide`] looks at.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The effective `ipkeep.dev/retain` (the pod's, else its StatefulSet's).
    pub retain: Retain,
    /// The effective `ipkeep.dev/placement`, already resolved against the controller's default.
    pub mode: Mode,
    /// The node of the reservation of the pod's namespace/name, when one exists.
    pub reservation_node: Option<&'a str>,
    /// Whether that reservation was made by hand (which opts its pod in by itself).
    pub reservation_by_hand: bool,
    /// That node as the cache has it; `None` when the cache has no such node.
    pub node: Option<NodeFacts<'a>>,
    /// The pod's own scheduling constraints.
    pub pod: PodScheduling<'a>,
}

/// What the webhook does with one pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Nothing: the pod does not ask, has no reservation, or said `none`.
    Pass,
    /// Add a term for `node`: the pod's affinity becomes `affinity`.
    Place {
        /// Preferred or required.
        mode: Mode,
        /// The reservation's node.
        node: String,
        /// The pod's whole `spec.affinity` with the term added (everything of its own kept).
        affinity: Affinity,
    },
    /// The pod asked and has a reservation, but gets no term; why, for the pod's record and a
    /// Warning Event.
    Skip(String),
}

impl Decision {
    /// What is recorded on the pod ([`PLACED`]), if anything.
    pub fn record(&self) -> Option<Placed> {
        match self {
            Decision::Pass => None,
            Decision::Place { mode, node, .. } => Some(Placed::On {
                mode: *mode,
                node: node.clone(),
            }),
            Decision::Skip(why) => Some(Placed::Skipped(why.clone())),
        }
    }
}

/// Decides what a pod being created gets.
pub fn decide(req: &Request<'_>) -> Decision {
    let asks = req.retain == Retain::Yes || req.reservation_by_hand;
    let Some(node_name) = req.reservation_node.filter(|_| asks) else {
        return Decision::Pass;
    };
    if req.mode == Mode::None {
        return Decision::Pass;
    }
    if let Some(bound) = req.pod.node_name.filter(|n| !n.is_empty()) {
        return if bound == node_name {
            Decision::Pass
        } else {
            Decision::Skip(format!(
                "the pod names node {bound} itself (spec.nodeName), not {node_name} where its addresses are reserved"
            ))
        };
    }
    let Some(node) = req.node.as_ref().filter(|n| n.name == node_name) else {
        return Decision::Skip(format!(
            "node {node_name}, where its addresses are reserved, no longer exists"
        ));
    };
    if let Some(why) = excluded_by_pod(&req.pod, node) {
        return Decision::Skip(format!(
            "{why} excludes node {node_name}, where its addresses are reserved; nothing was added to it"
        ));
    }
    let mut affinity = req.pod.affinity.cloned().unwrap_or_default();
    let node_affinity = affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default);
    match req.mode {
        Mode::Preferred => node_affinity
            .preferred_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .push(PreferredSchedulingTerm {
                weight: PREFERRED_WEIGHT,
                preference: node_term(node_name),
            }),
        Mode::Required => {
            let required = node_affinity
                .required_during_scheduling_ignored_during_execution
                .get_or_insert_with(|| NodeSelector {
                    node_selector_terms: Vec::new(),
                });
            if required.node_selector_terms.is_empty() {
                required.node_selector_terms.push(node_term(node_name));
            } else {
                // Terms are ORed and a term's requirements ANDed: narrowing every term that can
                // match keeps the pod's own rule and adds ours. An empty term matches nothing and
                // must stay so (adding a requirement would make it match).
                for term in &mut required.node_selector_terms {
                    if !term_is_empty(term) {
                        term.match_fields
                            .get_or_insert_with(Vec::new)
                            .push(name_requirement(node_name));
                    }
                }
            }
        }
        Mode::None => return Decision::Pass,
    }
    Decision::Place {
        mode: req.mode,
        node: node_name.to_string(),
        affinity,
    }
}

/// The JSON patch (RFC 6902) that applies `decision` to a pod whose metadata has `annotations`.
pub fn patch(decision: &Decision, has_annotations: bool) -> Vec<Value> {
    let Some(record) = decision.record() else {
        return Vec::new();
    };
    let mut ops = Vec::new();
    if let Decision::Place { affinity, .. } = decision {
        // `add` on an existing member replaces it: the whole affinity, with the pod's own terms.
        ops.push(json!({"op": "add", "path": "/spec/affinity", "value": affinity}));
    }
    let record = record.to_string();
    if has_annotations {
        // JSON pointer escaping: `/` is `~1`.
        let path = format!("/metadata/annotations/{}", PLACED.replace('/', "~1"));
        ops.push(json!({"op": "add", "path": path, "value": record}));
    } else {
        ops.push(json!({"op": "add", "path": "/metadata/annotations", "value": {PLACED: record}}));
    }
    ops
}

fn node_term(node: &str) -> NodeSelectorTerm {
    NodeSelectorTerm {
        match_expressions: None,
        match_fields: Some(vec![name_requirement(node)]),
    }
}

fn name_requirement(node: &str) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: NODE_NAME_FIELD.into(),
        operator: "In".into(),
        values: Some(vec![node.to_string()]),
    }
}

fn term_is_empty(term: &NodeSelectorTerm) -> bool {
    term.match_expressions.as_ref().is_none_or(Vec::is_empty)
        && term.match_fields.as_ref().is_none_or(Vec::is_empty)
}

/// Which of the pod's own hard constraints rules `node` out, if one does.
fn excluded_by_pod(pod: &PodScheduling<'_>, node: &NodeFacts<'_>) -> Option<&'static str> {
    if let Some(selector) = pod.node_selector
        && !selector
            .iter()
            .all(|(k, v)| node.labels.get(k).is_some_and(|l| l == v))
    {
        return Some("the pod's nodeSelector");
    }
    let required = pod
        .affinity
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    if let Some(required) = required
        && !required
            .node_selector_terms
            .iter()
            .any(|t| term_matches(t, node))
    {
        return Some("the pod's required node affinity");
    }
    None
}

/// Whether a node selector term selects `node`, as the scheduler reads it: its requirements
/// ANDed; an empty term selects nothing.
pub fn term_matches(term: &NodeSelectorTerm, node: &NodeFacts<'_>) -> bool {
    if term_is_empty(term) {
        return false;
    }
    let labels_ok = term
        .match_expressions
        .iter()
        .flatten()
        .all(|r| requirement_matches(r, node.labels.get(&r.key).map(String::as_str)));
    let fields_ok = term.match_fields.iter().flatten().all(|r| {
        // The API accepts only metadata.name here; any other field selects nothing.
        r.key == NODE_NAME_FIELD && requirement_matches(r, Some(node.name))
    });
    labels_ok && fields_ok
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let int = |s: &str| s.trim().parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((value.and_then(int), values.first().and_then(|x| int(x))), (Some(v), Some(x)) if v > x)
        }
        "Lt" => {
            matches!((value.and_then(int), values.first().and_then(|x| int(x))), (Some(v), Some(x)) if v < x)
        }
        // An operator the scheduler does not know selects nothing (the API refuses it anyway).
        _ => false,
    }
}
