//! Contract 2: the annotations users write, on a pod or on its owning StatefulSet's own metadata
//! (the pod's own annotation wins where both are set).

use std::{collections::BTreeMap, fmt};

use crate::api::retention::RetainFor;

/// `ipkeep.dev/retain: "true"` keeps a pod's addresses after it is gone.
pub const RETAIN: &str = "ipkeep.dev/retain";
/// `ipkeep.dev/retain-for: "24h"`: how long, after the pod is gone.
pub const RETAIN_FOR: &str = "ipkeep.dev/retain-for";
/// `ipkeep.dev/release-with-owner: "true"`: release at once when the owning StatefulSet is deleted.
pub const RELEASE_WITH_OWNER: &str = "ipkeep.dev/release-with-owner";
/// Annotation on a controller-made reservation naming the pod's owning StatefulSet (so the
/// release-with-owner choice can be applied after the pod is gone).
pub const OWNER_STATEFULSET: &str = "ipkeep.dev/owner-statefulset";

/// `ipkeep.dev/placement` (on the pod or its StatefulSet): `preferred`, `required` or `none`.
pub const PLACEMENT: &str = "ipkeep.dev/placement";

/// What a pod asks for when it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Prefer the reservation's node; go elsewhere (with new addresses) when it cannot take the pod.
    Preferred,
    /// Only the reservation's node: the pod waits, as one with a local volume would.
    Required,
    /// Let the scheduler decide alone.
    None,
}

impl Mode {
    /// Parses an annotation or flag value.
    pub fn parse(text: &str) -> Option<Mode> {
        match text.trim() {
            t if t.eq_ignore_ascii_case("preferred") => Some(Mode::Preferred),
            t if t.eq_ignore_ascii_case("required") => Some(Mode::Required),
            t if t.eq_ignore_ascii_case("none") => Some(Mode::None),
            _ => None,
        }
    }

    /// The value as written.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Preferred => "preferred",
            Mode::Required => "required",
            Mode::None => "none",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What `ipkeep.dev/retain` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retain {
    /// `"true"`.
    Yes,
    /// Absent or `"false"`.
    No,
    /// Any other value: reported, and the reservation (if any) is left as it is.
    Malformed,
}

/// The effective opt-in of one pod, after merging its owner's annotations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptIn {
    /// Whether the pod asks for its addresses to be kept.
    pub retain: Retain,
    /// `ipkeep.dev/retain-for`, parsed; `None` when absent or malformed.
    pub retain_for: Option<RetainFor>,
    /// Whether `ipkeep.dev/retain-for` came from the owning StatefulSet (not the pod).
    pub retain_for_on_owner: bool,
    /// Whether `ipkeep.dev/retain-for` was set but malformed (the current value is kept).
    pub retain_for_malformed: bool,
    /// `ipkeep.dev/release-with-owner: "true"`.
    pub release_with_owner: bool,
    /// `ipkeep.dev/placement`, parsed; `None` when absent or malformed (the controller's default
    /// applies).
    pub placement: Option<Mode>,
    /// One message per malformed annotation, for a Warning Event on the pod.
    pub problems: Vec<String>,
}

impl OptIn {
    /// The opt-in of a pod nobody annotated.
    pub fn none() -> OptIn {
        OptIn {
            retain: Retain::No,
            retain_for: None,
            retain_for_on_owner: false,
            retain_for_malformed: false,
            release_with_owner: false,
            placement: None,
            problems: Vec::new(),
        }
    }

    /// The placement this pod gets: its own (or its StatefulSet's) choice, else `default`.
    pub fn placement_or(&self, default: Mode) -> Mode {
        self.placement.unwrap_or(default)
    }
}

/// Reads the four annotations from a pod, falling back to its owning StatefulSet's metadata.
pub fn opt_in(pod: &BTreeMap<String, String>, owner: Option<&BTreeMap<String, String>>) -> OptIn {
    let get = |key: &str| -> Option<(&str, &'static str)> {
        pod.get(key).map(|v| (v.as_str(), "pod")).or_else(|| {
            owner
                .and_then(|o| o.get(key))
                .map(|v| (v.as_str(), "StatefulSet"))
        })
    };
    let mut out = OptIn::none();
    if let Some((value, on)) = get(RETAIN) {
        out.retain = match parse_bool(value) {
            Some(true) => Retain::Yes,
            Some(false) => Retain::No,
            None => {
                out.problems.push(format!(
                    "annotation {RETAIN}={value:?} on the {on} is neither \"true\" nor \"false\": the reservation is left as it is"
                ));
                Retain::Malformed
            }
        };
    }
    if let Some((value, on)) = get(RETAIN_FOR) {
        match RetainFor::parse(value) {
            Ok(retain_for) => {
                out.retain_for = Some(retain_for);
                out.retain_for_on_owner = on == "StatefulSet";
            }
            Err(e) => {
                out.retain_for_malformed = true;
                out.problems.push(format!(
                    "annotation {RETAIN_FOR} on the {on}: {e}; the current retention is kept"
                ));
            }
        }
    }
    if let Some((value, on)) = get(RELEASE_WITH_OWNER) {
        match parse_bool(value) {
            Some(b) => out.release_with_owner = b,
            None => out.problems.push(format!(
                "annotation {RELEASE_WITH_OWNER}={value:?} on the {on} is neither \"true\" nor \"false\": taken as \"false\""
            )),
        }
    }
    if let Some((value, on)) = get(PLACEMENT) {
        match Mode::parse(value) {
            Some(mode) => out.placement = Some(mode),
            None => out.problems.push(format!(
                "annotation {}={value:?} on the {on} is none of \"preferred\", \"required\" or \"none\": the default placement applies",
                PLACEMENT
            )),
        }
    }
    out
}

fn parse_bool(value: &str) -> Option<bool> {
    match value.trim() {
        v if v.eq_ignore_ascii_case("true") => Some(true),
        v if v.eq_ignore_ascii_case("false") => Some(false),
        _ => None,
    }
}
