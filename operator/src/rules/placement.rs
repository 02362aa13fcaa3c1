//! Placement, the rule: which returning pods get a node affinity term for their reservation's
//! node, and why a pod that asked got nothing ([`verdict`]); how a node selector term selects a
//! node ([`term_matches`]); what the webhook recorded on the pod, read back ([`Placed`]). Over
//! plain views: the webhook (`controller::placement`) turns the pod's affinity into [`Term`]s and
//! a [`Verdict`] into the affinity it writes.

use std::{collections::BTreeMap, fmt};

use super::optin::{Mode, Retain};

/// Written by the webhook on every pod it placed or could not place: what it did (see [`Placed`]).
pub const PLACED: &str = "ipkeep.dev/placed";

/// What the webhook recorded on a pod (annotation [`PLACED`]), read back by the controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placed {
    /// No record: the webhook did not see the pod (unreachable, not registered, or the pod was
    /// created before it was).
    Unseen,
    /// A term for this node was added.
    On {
        /// Preferred or required.
        mode: Mode,
        /// The reservation's node.
        node: String,
    },
    /// The pod asked for placement and got none; why.
    Skipped(String),
}

impl Placed {
    /// Reads the annotation's value (absent: [`Placed::Unseen`]).
    pub fn parse(value: Option<&str>) -> Placed {
        let Some(value) = value else {
            return Placed::Unseen;
        };
        if let Some(why) = value.strip_prefix("skipped: ") {
            return Placed::Skipped(why.to_string());
        }
        match value.split_once(' ') {
            Some((mode, node)) => match Mode::parse(mode) {
                Some(mode @ (Mode::Preferred | Mode::Required)) if !node.is_empty() => Placed::On {
                    mode,
                    node: node.to_string(),
                },
                _ => Placed::Skipped(format!("unreadable record {value:?}")),
            },
            None => Placed::Skipped(format!("unreadable record {value:?}")),
        }
    }
}

impl fmt::Display for Placed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placed::Unseen => Ok(()),
            Placed::On { mode, node } => write!(f, "{mode} {node}"),
            Placed::Skipped(why) => write!(f, "skipped: {why}"),
        }
    }
}

/// The node field a term selects on: the node's name, exactly (labels such as
/// `kubernetes.io/hostname` may differ from it).
pub const NODE_NAME_FIELD: &str = "metadata.name";

/// The node a reservation is on, as the controller's node cache has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeFacts<'a> {
    /// `metadata.name`.
    pub name: &'a str,
    /// `metadata.labels`.
    pub labels: &'a BTreeMap<String, String>,
}

/// One requirement of a node selector term (`matchExpressions` or `matchFields`), as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requirement<'a> {
    /// The label key, or the field (`metadata.name`).
    pub key: &'a str,
    /// `In`, `NotIn`, `Exists`, `DoesNotExist`, `Gt` or `Lt`.
    pub operator: &'a str,
    /// The values it compares with.
    pub values: &'a [String],
}

/// A node selector term: its requirements ANDed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Term<'a> {
    /// `matchExpressions`, on the node's labels.
    pub expressions: Vec<Requirement<'a>>,
    /// `matchFields`, on the node's fields.
    pub fields: Vec<Requirement<'a>>,
}

/// What the pod being created says about where it may run.
#[derive(Debug, Clone, Default)]
pub struct Constraints<'a> {
    /// `spec.nodeName`: already bound to a node.
    pub node_name: Option<&'a str>,
    /// `spec.nodeSelector`.
    pub node_selector: Option<&'a BTreeMap<String, String>>,
    /// The terms of `spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution`,
    /// when the pod has one (ORed).
    pub required: Option<Vec<Term<'a>>>,
}

/// Everything [`verdict`] looks at.
#[derive(Debug, Clone)]
pub struct Ask<'a> {
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
    pub pod: Constraints<'a>,
}

/// What the webhook does with one pod, before it is written as an affinity term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing: the pod does not ask, has no reservation, or said `none`.
    Pass,
    /// Add a term for `node`.
    Place {
        /// Preferred or required.
        mode: Mode,
        /// The reservation's node.
        node: String,
    },
    /// The pod asked and has a reservation, but gets no term; why, for the pod's record and a
    /// Warning Event.
    Skip(String),
}

/// Decides what a pod being created gets.
pub fn verdict(ask: &Ask<'_>) -> Verdict {
    let asks = ask.retain == Retain::Yes || ask.reservation_by_hand;
    let Some(node_name) = ask.reservation_node.filter(|_| asks) else {
        return Verdict::Pass;
    };
    if ask.mode == Mode::None {
        return Verdict::Pass;
    }
    if let Some(bound) = ask.pod.node_name.filter(|n| !n.is_empty()) {
        return if bound == node_name {
            Verdict::Pass
        } else {
            Verdict::Skip(format!(
                "the pod names node {bound} itself (spec.nodeName), not {node_name} where its addresses are reserved"
            ))
        };
    }
    let Some(node) = ask.node.as_ref().filter(|n| n.name == node_name) else {
        return Verdict::Skip(format!(
            "node {node_name}, where its addresses are reserved, no longer exists"
        ));
    };
    if let Some(why) = excluded_by_pod(&ask.pod, node) {
        return Verdict::Skip(format!(
            "{why} excludes node {node_name}, where its addresses are reserved; nothing was added to it"
        ));
    }
    Verdict::Place {
        mode: ask.mode,
        node: node_name.to_string(),
    }
}

/// Which of the pod's own hard constraints rules `node` out, if one does.
fn excluded_by_pod(pod: &Constraints<'_>, node: &NodeFacts<'_>) -> Option<&'static str> {
    if let Some(selector) = pod.node_selector
        && !selector
            .iter()
            .all(|(k, v)| node.labels.get(k).is_some_and(|l| l == v))
    {
        return Some("the pod's nodeSelector");
    }
    if let Some(required) = &pod.required
        && !required.iter().any(|t| term_matches(t, node))
    {
        return Some("the pod's required node affinity");
    }
    None
}

/// Whether a term has no requirement at all (it selects nothing, and must stay so).
pub fn term_is_empty(term: &Term<'_>) -> bool {
    term.expressions.is_empty() && term.fields.is_empty()
}

/// Whether a node selector term selects `node`, as the scheduler reads it: its requirements
/// ANDed; an empty term selects nothing.
pub fn term_matches(term: &Term<'_>, node: &NodeFacts<'_>) -> bool {
    if term_is_empty(term) {
        return false;
    }
    let labels_ok = term
        .expressions
        .iter()
        .all(|r| requirement_matches(r, node.labels.get(r.key).map(String::as_str)));
    let fields_ok = term.fields.iter().all(|r| {
        // The API accepts only metadata.name here; any other field selects nothing.
        r.key == NODE_NAME_FIELD && requirement_matches(r, Some(node.name))
    });
    labels_ok && fields_ok
}

fn requirement_matches(r: &Requirement<'_>, value: Option<&str>) -> bool {
    let values = r.values;
    let int = |s: &str| s.trim().parse::<i64>().ok();
    match r.operator {
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
