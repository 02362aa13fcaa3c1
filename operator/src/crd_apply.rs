//! The CRD follows the release: at start-up, before anything else, the controller server-side
//! applies the IPReservation CRD its own types generate (field manager `ipkeep-controller`), so
//! that `helm upgrade` — which never upgrades what a chart's `crds/` holds — leaves the cluster
//! with this release's CRD. The policy it relies on (docs/operator.md): within an API version
//! the CRD only grows, so a newer CRD serves an older controller and agent, and a rollback keeps
//! the newer one: the applied CRD carries the release that applied it, and a controller never
//! applies over a newer release's. Whenever it does not apply (a newer release's CRD, or no
//! right to patch CRDs), it checks the cluster's CRD has everything its own has, and refuses to
//! start, saying what is missing and the one command that fixes it, when it has not.

use std::{fmt, str::FromStr};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Client, CustomResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::Value;

use crate::api::IPReservation;

/// The field manager of the CRD's fields (the controller's, as for reservations).
pub const FIELD_MANAGER: &str = "ipkeep-controller";
/// The annotation naming the ipkeep release whose controller last applied the CRD.
pub const RELEASE_ANNOTATION: &str = "ipkeep.dev/crd-release";
/// Where a user finds the CRD of a release to apply by hand.
const APPLY_BY_HAND: &str = "kubectl apply --server-side --force-conflicts -f crds/ipreservations.ipkeep.dev.yaml (of this release; the chart's crds/ holds the same)";

/// An ipkeep release number, `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Release {
    major: u64,
    minor: u64,
    patch: u64,
}

/// A release number that is not `major.minor.patch`.
#[derive(Debug, thiserror::Error)]
#[error("failed to read {0:?} as a release number (major.minor.patch)")]
pub struct ReleaseParseError(String);

impl FromStr for Release {
    type Err = ReleaseParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ReleaseParseError(s.to_owned());
        let mut parts = s.split('.').map(|p| {
            // Digits only: u64's parser would take a leading '+'.
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            p.parse::<u64>().map_err(|_| bad())
        });
        let (Some(major), Some(minor), Some(patch), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        Ok(Release {
            major: major?,
            minor: minor?,
            patch: patch?,
        })
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// This binary's release (the workspace version).
pub fn own_release() -> Result<Release, ReleaseParseError> {
    env!("CARGO_PKG_VERSION").parse()
}

/// What to do with the cluster's CRD.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Apply this release's CRD: the cluster's was applied by this release or an older one, or
    /// by no controller (Helm's `crds/`, `kubectl apply`, or a value that is no release).
    Apply,
    /// Leave it: a newer release's controller applied it (a rollback); check it serves this one.
    Keep {
        /// The release that applied it.
        applied_by: Release,
    },
}

/// Whether to apply, from the cluster CRD's [`RELEASE_ANNOTATION`] (`None`: absent).
pub fn decide(applied_by: Option<&str>, own: Release) -> Step {
    match applied_by.and_then(|v| v.parse::<Release>().ok()) {
        Some(applied_by) if applied_by > own => Step::Keep { applied_by },
        _ => Step::Apply,
    }
}

/// What `ours` (a CRD as JSON) has that `theirs` lacks, one entry each: a version not served, a
/// schema field, a subresource, a selectable field, a printer column. Empty: `theirs` serves
/// everything a controller and agent of `ours` read and write.
pub fn missing(ours: &Value, theirs: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let none = Vec::new();
    let versions = |crd: &'_ Value| -> Vec<Value> {
        crd.pointer("/spec/versions")
            .and_then(Value::as_array)
            .unwrap_or(&none)
            .clone()
    };
    let theirs_versions = versions(theirs);
    for ours_v in versions(ours) {
        let name = ours_v["name"].as_str().unwrap_or_default();
        let Some(theirs_v) = theirs_versions
            .iter()
            .find(|t| t["name"].as_str() == Some(name) && t["served"] == Value::Bool(true))
        else {
            out.push(format!("the served version {name}"));
            continue;
        };
        schema_fields(
            "",
            &ours_v["schema"]["openAPIV3Schema"],
            &theirs_v["schema"]["openAPIV3Schema"],
            &mut out,
        );
        if let Some(subresources) = ours_v["subresources"].as_object() {
            for key in subresources.keys() {
                if theirs_v["subresources"].get(key).is_none() {
                    out.push(format!("the {key} subresource"));
                }
            }
        }
        for (list, key, what) in [
            ("selectableFields", "jsonPath", "the selectable field"),
            ("additionalPrinterColumns", "name", "the printer column"),
        ] {
            for item in ours_v[list].as_array().unwrap_or(&none) {
                let value = &item[key];
                let present = theirs_v[list]
                    .as_array()
                    .is_some_and(|items| items.iter().any(|t| &t[key] == value));
                if !present {
                    out.push(format!("{what} {}", value.as_str().unwrap_or_default()));
                }
            }
        }
    }
    out
}

/// The fields of schema `ours` (at `path`) absent from `theirs`, as `.spec.ips`.
fn schema_fields(path: &str, ours: &Value, theirs: &Value, out: &mut Vec<String>) {
    if let Some(properties) = ours["properties"].as_object() {
        for (key, ours_p) in properties {
            let field = format!("{path}.{key}");
            match theirs["properties"].get(key) {
                Some(theirs_p) => schema_fields(&field, ours_p, theirs_p, out),
                None => out.push(format!("the field {field}")),
            }
        }
    }
    if ours.get("items").is_some() {
        schema_fields(&format!("{path}[]"), &ours["items"], &theirs["items"], out);
    }
}

/// What start-up did with the CRD.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// This release's CRD is the cluster's (applied; unchanged when it already was).
    Applied {
        /// The release that had applied it before, if any.
        before: Option<String>,
    },
    /// A newer release's CRD, kept: it has all of this release's.
    KeptNewer {
        /// That release.
        applied_by: Release,
    },
    /// Not applied (the controller may not patch CRDs), but the cluster's has all of this
    /// release's.
    NotAllowedButComplete,
}

/// Errors that stop the controller before it starts.
#[derive(Debug, thiserror::Error)]
pub enum CrdApplyError {
    /// The binary's own version is no release number.
    #[error(transparent)]
    OwnRelease(#[from] ReleaseParseError),
    /// The CRD does not exist: the controller never creates it.
    #[error(
        "failed to start: the CRD {name} is not installed: install the chart (Helm creates it from its crds/), or {APPLY_BY_HAND}"
    )]
    NotInstalled {
        /// The CRD's name.
        name: String,
    },
    /// The CRD could not be read.
    #[error("failed to read the CRD {name} (the controller's ClusterRole grants get on it)")]
    Read {
        /// The CRD's name.
        name: String,
        /// What failed.
        #[source]
        source: kube::Error,
    },
    /// The apply failed for another reason than a refusal.
    #[error("failed to server-side apply ipkeep {own}'s CRD {name} as {FIELD_MANAGER}")]
    Apply {
        /// The CRD's name.
        name: String,
        /// This release.
        own: Release,
        /// What failed.
        #[source]
        source: kube::Error,
    },
    /// The cluster's CRD lacks what this release needs, and the controller may not, or will
    /// not, apply its own.
    #[error(
        "failed to start: the CRD {name} lacks what ipkeep {own} reads and writes ({missing}), and {why}; without it the API server would drop those fields silently. Apply this release's CRD: {APPLY_BY_HAND}"
    )]
    Incomplete {
        /// The CRD's name.
        name: String,
        /// This release.
        own: Release,
        /// What it lacks, comma-separated.
        missing: String,
        /// Why the controller did not apply its own.
        why: String,
    },
}

/// Makes the cluster's CRD this release's (or keeps a newer release's that serves this one), or
/// says why it cannot; called once, before the controller watches anything.
pub async fn ensure(client: Client) -> Result<Outcome, CrdApplyError> {
    let own = own_release()?;
    let name = IPReservation::crd_name().to_owned();
    let api: Api<CustomResourceDefinition> = Api::all(client);
    let current = api
        .get_opt(&name)
        .await
        .map_err(|source| CrdApplyError::Read {
            name: name.clone(),
            source,
        })?
        .ok_or_else(|| CrdApplyError::NotInstalled { name: name.clone() })?;
    let before = current
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RELEASE_ANNOTATION))
        .cloned();
    let mut ours = IPReservation::crd();
    ours.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(RELEASE_ANNOTATION.to_owned(), own.to_string());
    let incomplete = |why: String| -> Result<(), CrdApplyError> {
        let lacks = missing(&json(&ours), &json(&current));
        if lacks.is_empty() {
            return Ok(());
        }
        Err(CrdApplyError::Incomplete {
            name: name.clone(),
            own,
            missing: lacks.join(", "),
            why,
        })
    };
    match decide(before.as_deref(), own) {
        Step::Keep { applied_by } => {
            incomplete(format!(
                "it was applied by ipkeep {applied_by}, newer than this release, whose CRD a controller never replaces with an older one"
            ))?;
            tracing::info!(
                crd = %name, release = %own, applied_by = %applied_by,
                "kept the CRD of a newer release: it has all of this release's"
            );
            Ok(Outcome::KeptNewer { applied_by })
        }
        Step::Apply => {
            let params = PatchParams::apply(FIELD_MANAGER).force();
            match api.patch(&name, &params, &Patch::Apply(&ours)).await {
                Ok(_) => {
                    tracing::info!(
                        crd = %name, release = %own,
                        before = before.as_deref().unwrap_or("no ipkeep controller's"),
                        "applied this release's CRD"
                    );
                    Ok(Outcome::Applied { before })
                }
                Err(kube::Error::Api(e)) if e.code == 403 => {
                    incomplete(format!(
                        "the controller may not patch it ({}: its ClusterRole grants get, patch on customresourcedefinitions named {name})",
                        e.message
                    ))?;
                    tracing::warn!(
                        crd = %name, release = %own,
                        "may not patch the CRD; it has all of this release's already, so the controller starts"
                    );
                    Ok(Outcome::NotAllowedButComplete)
                }
                Err(source) => Err(CrdApplyError::Apply { name, own, source }),
            }
        }
    }
}

/// A CRD as JSON (`Null` if it cannot be: then it lacks everything).
fn json(crd: &CustomResourceDefinition) -> Value {
    serde_json::to_value(crd).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn release(s: &str) -> Release {
        s.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn release_numbers_are_three_whole_numbers() {
        for (text, ok) in [
            ("0.2.0", true),
            ("10.0.31", true),
            ("0.2", false),
            ("0.2.0.1", false),
            ("0.2.x", false),
            ("+1.2.3", false),
            ("0.2.0-rc.1", false),
            ("", false),
            ("1..2", false),
        ] {
            assert_eq!(text.parse::<Release>().is_ok(), ok, "{text:?}");
        }
        assert_eq!(release("0.10.0").to_string(), "0.10.0");
        assert!(release("0.10.0") > release("0.9.9"), "numbers, not text");
        assert!(release("1.0.0") > release("0.99.99"));
        assert!(
            own_release().is_ok(),
            "the workspace version is a release number"
        );
    }

    #[test]
    fn a_controller_never_applies_over_a_newer_release() {
        let own = release("0.2.0");
        for (annotation, step) in [
            (None, Step::Apply),
            (Some("0.1.0"), Step::Apply),
            (Some("0.2.0"), Step::Apply),
            (Some("not a release"), Step::Apply),
            (
                Some("0.2.1"),
                Step::Keep {
                    applied_by: release("0.2.1"),
                },
            ),
            (
                Some("0.10.0"),
                Step::Keep {
                    applied_by: release("0.10.0"),
                },
            ),
        ] {
            assert_eq!(decide(annotation, own), step, "{annotation:?}");
        }
    }

    fn crd(version: Value) -> Value {
        json!({"spec": {"versions": [version]}})
    }

    fn ours() -> Value {
        crd(json!({
            "name": "v1alpha1",
            "served": true,
            "schema": {"openAPIV3Schema": {"properties": {
                "spec": {"properties": {"ips": {"items": {"type": "string"}}, "nodeName": {}}},
                "status": {"properties": {
                    "conditions": {"items": {"properties": {"type": {}, "reason": {}}}},
                    "phase": {}
                }}
            }}},
            "subresources": {"status": {}},
            "selectableFields": [{"jsonPath": ".spec.nodeName"}],
            "additionalPrinterColumns": [{"name": "Phase"}, {"name": "Unprotected"}]
        }))
    }

    /// The object at `pointer` in `c`, which the test's CRD has.
    fn at<'a>(c: &'a mut Value, pointer: &str) -> &'a mut Value {
        c.pointer_mut(pointer)
            .unwrap_or_else(|| panic!("no {pointer}"))
    }

    const V0: &str = "/spec/versions/0";
    const STATUS: &str = "/spec/versions/0/schema/openAPIV3Schema/properties/status/properties";

    /// A change made to the test's CRD.
    type Change = Box<dyn Fn(&mut Value)>;

    #[test]
    fn what_a_crd_lacks_is_named_field_by_field() {
        let cases: [(&str, Change, &[&str]); 9] = [
            ("the same", Box::new(|_| {}), &[]),
            (
                "newer: more fields, columns and versions",
                Box::new(|c| {
                    at(c, STATUS)["newField"] = json!({});
                    at(c, &format!("{V0}/additionalPrinterColumns"))
                        .as_array_mut()
                        .unwrap()
                        .push(json!({"name": "New"}));
                    at(c, "/spec/versions")
                        .as_array_mut()
                        .unwrap()
                        .push(json!({"name": "v1beta1", "served": true}));
                }),
                &[],
            ),
            (
                "an older one without the column",
                Box::new(|c| {
                    at(c, V0)["additionalPrinterColumns"] = json!([{"name": "Phase"}]);
                }),
                &["the printer column Unprotected"],
            ),
            (
                "a status field",
                Box::new(|c| {
                    at(c, STATUS).as_object_mut().unwrap().remove("phase");
                }),
                &["the field .status.phase"],
            ),
            (
                "a field inside a list's items",
                Box::new(|c| {
                    at(c, &format!("{STATUS}/conditions/items/properties"))
                        .as_object_mut()
                        .unwrap()
                        .remove("reason");
                }),
                &["the field .status.conditions[].reason"],
            ),
            (
                "the whole status",
                Box::new(|c| {
                    at(c, &format!("{V0}/schema/openAPIV3Schema/properties"))
                        .as_object_mut()
                        .unwrap()
                        .remove("status");
                }),
                &["the field .status"],
            ),
            (
                "the version not served",
                Box::new(|c| at(c, V0)["served"] = json!(false)),
                &["the served version v1alpha1"],
            ),
            (
                "the subresource and the selectable field",
                Box::new(|c| {
                    at(c, V0)["subresources"] = json!({});
                    at(c, V0)["selectableFields"] = json!([]);
                }),
                &[
                    "the status subresource",
                    "the selectable field .spec.nodeName",
                ],
            ),
            (
                "no CRD at all",
                Box::new(|c| *c = Value::Null),
                &["the served version v1alpha1"],
            ),
        ];
        for (what, change, lacks) in cases {
            let mut theirs = ours();
            change(&mut theirs);
            assert_eq!(missing(&ours(), &theirs), lacks, "{what}");
        }
    }

    #[test]
    fn the_generated_crd_lacks_nothing_of_itself() {
        let ours = json(&IPReservation::crd());
        assert!(
            ours.pointer("/spec/versions/0/additionalPrinterColumns")
                .is_some(),
            "the generated CRD as JSON: {ours}"
        );
        assert_eq!(missing(&ours, &ours), Vec::<String>::new());
        let mut older = ours.clone();
        if let Some(columns) = older
            .pointer_mut("/spec/versions/0/additionalPrinterColumns")
            .and_then(Value::as_array_mut)
        {
            columns.retain(|c| c["name"] != "Unprotected");
        }
        assert_eq!(missing(&ours, &older), ["the printer column Unprotected"]);
    }
}
