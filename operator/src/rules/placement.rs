//! What the placement webhook recorded on a pod (annotation [`PLACED`]), as the controller reads it
//! back: the one part of placement the lifecycle rule needs. The affinity terms themselves are
//! Kubernetes types and stay with the webhook (`controller::placement`).

use std::fmt;

use super::optin::Mode;

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
