//! Placement at the API's boundary: the webhook's [`Request`] (the pod's own affinity as the API
//! types it) becomes the rule's plain view ([`crate::rules::placement::Ask`]), and the rule's
//! verdict becomes the pod's whole affinity with the term added ([`Decision`]) and the JSON patch
//! that writes it ([`patch`]). Which pods get a term, and why one that asked got nothing, is the
//! rule's; this module only translates.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PreferredSchedulingTerm,
};
use serde_json::{Value, json};

use crate::rules::{
    optin::{Mode, Retain},
    placement::{
        self as rule, Ask, Constraints, NODE_NAME_FIELD, NodeFacts, PLACED, Placed, Requirement,
        Term, Verdict,
    },
};

/// The weight of the preferred term: the largest the API allows, so that among nodes that fit it
/// outweighs spreading and balancing (each scores at most 100 before its plugin weight).
pub const PREFERRED_WEIGHT: i32 = 100;
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

/// Decides what a pod being created gets: the rule's verdict, with the pod's affinity.
pub fn decide(req: &Request<'_>) -> Decision {
    let ask = Ask {
        retain: req.retain,
        mode: req.mode,
        reservation_node: req.reservation_node,
        reservation_by_hand: req.reservation_by_hand,
        node: req.node,
        pod: constraints(&req.pod),
    };
    match rule::verdict(&ask) {
        Verdict::Pass => Decision::Pass,
        Verdict::Skip(why) => Decision::Skip(why),
        Verdict::Place { mode, node } => match with_term(req.pod.affinity, mode, &node) {
            Some(affinity) => Decision::Place {
                mode,
                node,
                affinity,
            },
            None => Decision::Pass,
        },
    }
}

/// The pod's whole affinity with a term for `node` added (everything of its own kept); `None`
/// for [`Mode::None`].
fn with_term(own: Option<&Affinity>, mode: Mode, node_name: &str) -> Option<Affinity> {
    let mut affinity = own.cloned().unwrap_or_default();
    let node_affinity = affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default);
    match mode {
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
                    if !rule::term_is_empty(&term_view(term)) {
                        term.match_fields
                            .get_or_insert_with(Vec::new)
                            .push(name_requirement(node_name));
                    }
                }
            }
        }
        Mode::None => return None,
    }
    Some(affinity)
}

/// The pod's constraints as the rule reads them.
fn constraints<'a>(pod: &PodScheduling<'a>) -> Constraints<'a> {
    let required = pod
        .affinity
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    Constraints {
        node_name: pod.node_name,
        node_selector: pod.node_selector,
        required: required.map(|r| r.node_selector_terms.iter().map(term_view).collect()),
    }
}

/// A node selector term as the rule reads it.
fn term_view(term: &NodeSelectorTerm) -> Term<'_> {
    Term {
        expressions: requirements(&term.match_expressions),
        fields: requirements(&term.match_fields),
    }
}

fn requirements(list: &Option<Vec<NodeSelectorRequirement>>) -> Vec<Requirement<'_>> {
    list.iter()
        .flatten()
        .map(|r| Requirement {
            key: &r.key,
            operator: &r.operator,
            values: r.values.as_deref().unwrap_or_default(),
        })
        .collect()
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

/// Whether a node selector term selects `node`, as the scheduler reads it (the rule's
/// [`rule::term_matches`] on the term's view).
pub fn term_matches(term: &NodeSelectorTerm, node: &NodeFacts<'_>) -> bool {
    rule::term_matches(&term_view(term), node)
}
