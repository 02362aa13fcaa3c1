//! `ipkeep-operator recover`: re-creates the IPReservations the agents keep as lost
//! ([`crate::rules::loss`]) from their nodes' files. A dry run by default; `--apply` writes.
//!
//! It reads what each agent reports on its own pod ([`crate::api::lost`]) and every reservation,
//! lets [`crate::rules::recovery::plan`] decide, prints one line per lost reservation, and with
//! `--apply` creates the missing ones: `spec.ips` and `spec.nodeName` from the file, and a
//! `spec.retainFor` that makes the controller hold a released one until the file's release time.
//! They are written with server-side apply under the controller's field manager, as the
//! controller writes its own, so its next write for a returning pod replaces that `retainFor`
//! with the pod's own. The lost object's uid is kept in [`RECOVERED_FROM`]. A reservation the
//! API already has is never overwritten: it is read again just before each write. Running it
//! again changes nothing: the agents adopt the re-created objects and stop reporting them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;

use ipkeep_reservation::{PodKey, Timestamp};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use serde_json::json;

use crate::api::lost::RestoredKind;
use crate::api::{self, IPReservation, key_of};
use crate::check::{AGENT_LABEL, Names, agent_view};
use crate::controller::reconcile::FIELD_MANAGER;
use crate::rules::recovery::{Action, Existing, Kind, Lost, agrees, plan};

/// The annotation on a re-created reservation naming the lost object's uid.
pub const RECOVERED_FROM: &str = "ipkeep.dev/recovered-from-uid";

/// Command-line flags of `ipkeep-operator recover`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Which installation (the agent pods report lost reservations in its namespace).
    #[command(flatten)]
    pub target: crate::check::Release,
    /// Create the missing reservations; without it, only say what would be done.
    #[arg(long)]
    pub apply: bool,
    /// `text` (one line per lost reservation) or `json`.
    #[arg(long, short = 'o', value_enum, default_value = "text")]
    pub output: crate::check::Output,
}

/// One lost reservation and what became of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// The pod's namespace/name.
    pub reservation: String,
    /// The node whose file holds it.
    pub node: String,
    /// The addresses the file holds.
    pub ips: Vec<String>,
    /// The file's release time, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release_time: Option<String>,
    /// The lost object's uid.
    pub uid: String,
    /// `create`, `rewrite`, `delete` (dry run), `created`, `rewritten`, `deleted`, `present`,
    /// `skipped` (its namespace is being deleted), `refused`, `failed`.
    pub action: &'static str,
    /// Why, for `refused` and `failed`; the `retainFor` written for `create`/`created`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Errors of reading the cluster.
#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    /// The agent pods could not be listed.
    #[error("failed to list the agent pods in namespace {namespace}")]
    Agents {
        /// The namespace.
        namespace: String,
        /// kube's error.
        #[source]
        source: kube::Error,
    },
    /// The reservations could not be listed (is the CRD applied?).
    #[error("failed to list the IPReservations (apply the CRD first if it was deleted)")]
    Reservations(#[source] kube::Error),
}

/// What the agents report, and the agents whose report cannot be read.
async fn reported(
    client: &Client,
    namespace: &str,
    names: &Names,
) -> Result<(Vec<Lost>, Vec<String>), RecoverError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let prefix = format!("{}-agent-", names.fullname);
    let list = pods
        .list(&ListParams::default().labels(AGENT_LABEL))
        .await
        .map_err(|source| RecoverError::Agents {
            namespace: namespace.to_owned(),
            source,
        })?;
    let mut lost = Vec::new();
    let mut unreadable = Vec::new();
    for agent in list
        .items
        .iter()
        .filter(|p| p.name_any().starts_with(&prefix))
        .filter_map(agent_view)
    {
        match agent.lost {
            Some(Ok(report)) => {
                if report.omitted > 0 {
                    unreadable.push(format!(
                        "agent {} on {}: {} more lost reservations than it lists; run recover again after this one",
                        agent.pod, agent.node, report.omitted
                    ));
                }
                lost.extend(report.lost.into_iter().map(|l| Lost {
                    node: agent.node.clone(),
                    pod: l.pod,
                    ips: l.ips,
                    release_time: l.release_time,
                    uid: l.uid,
                    kind: Kind::Lost,
                }));
                lost.extend(report.restored.into_iter().map(|r| Lost {
                    node: agent.node.clone(),
                    pod: r.pod,
                    ips: r.ips,
                    release_time: None,
                    uid: r.uid,
                    kind: match r.kind {
                        RestoredKind::Older => Kind::RestoredOlder,
                        RestoredKind::Released => Kind::RestoredReleased,
                    },
                }));
            }
            Some(Err(e)) => unreadable.push(format!(
                "agent {} on {}: its {} condition cannot be read: {e}",
                agent.pod,
                agent.node,
                api::lost::POD_CONDITION
            )),
            None => {}
        }
    }
    Ok((lost, unreadable))
}

fn existing_of(r: &IPReservation) -> Existing {
    Existing {
        uid: r.uid().unwrap_or_default(),
        node: r.spec.node_name.clone(),
        ips: r
            .spec
            .ips
            .iter()
            .filter_map(|ip| ip.0.parse().ok())
            .collect(),
    }
}

/// Reads the reports and the reservations, plans, and (with `apply`) creates; one outcome per
/// lost reservation, and the agents whose report could not be read.
pub async fn run(
    client: &Client,
    namespace: &str,
    names: &Names,
    apply: bool,
) -> Result<(Vec<Outcome>, Vec<String>), RecoverError> {
    let (lost, unreadable) = reported(client, namespace, names).await?;
    let all: Api<IPReservation> = Api::all(client.clone());
    let existing: BTreeMap<PodKey, Existing> = all
        .list(&ListParams::default())
        .await
        .map_err(RecoverError::Reservations)?
        .items
        .iter()
        .filter_map(|r| Some((key_of(r).ok()?, existing_of(r))))
        .collect();
    let holders: BTreeMap<(&str, IpAddr), &PodKey> = existing
        .iter()
        .flat_map(|(pod, e)| {
            e.ips
                .iter()
                .map(move |ip| ((e.node.as_str(), ip.to_canonical()), pod))
        })
        .collect();
    let holder = |node: &str, ip: IpAddr| holders.get(&(node, ip)).map(|p| (*p).clone());
    let now = Timestamp::from_system_time(std::time::SystemTime::now());
    let planned = plan(&lost, |pod| existing.get(pod).cloned(), holder, now);
    // Deletions first: a lost reservation of the same pod is created after.
    let order = planned
        .iter()
        .enumerate()
        .filter(|(_, (_, a))| matches!(a, Action::Delete))
        .chain(
            planned
                .iter()
                .enumerate()
                .filter(|(_, (_, a))| !matches!(a, Action::Delete)),
        )
        .map(|(i, _)| i)
        .collect::<Vec<_>>();
    let mut done: BTreeMap<usize, (&'static str, Option<String>)> = BTreeMap::new();
    for i in order {
        let (l, action) = &planned[i];
        done.insert(i, act(client, l, action, apply).await);
    }
    let mut outcomes = Vec::new();
    for (i, (l, _)) in planned.into_iter().enumerate() {
        let (action, detail) = done.remove(&i).unwrap_or(("failed", None));
        outcomes.push(Outcome {
            reservation: l.pod.to_string(),
            node: l.node,
            ips: l.ips.iter().map(ToString::to_string).collect(),
            release_time: l.release_time.map(|t| t.to_string()),
            uid: l.uid,
            action,
            detail,
        });
    }
    Ok((outcomes, unreadable))
}

/// Does (with `apply`) or says (without) what the plan decided for one reservation.
async fn act(
    client: &Client,
    l: &Lost,
    action: &Action,
    apply: bool,
) -> (&'static str, Option<String>) {
    match action {
        Action::Present => ("present", None),
        Action::Disagrees(e) => ("refused", Some(disagreement(e))),
        Action::AddressHeld { ip, by } => (
            "refused",
            Some(format!(
                "{ip} is held in the API by {by} on the same node (after a restore from an older backup: a reservation released since, brought back): not created; delete {by} if it is the stale one, then run recover again"
            )),
        ),
        Action::ClaimedBy(nodes) => (
            "refused",
            Some(format!(
                "the nodes {} each keep a file for this pod: none is re-created; keep the right one by creating it by hand",
                nodes.join(", ")
            )),
        ),
        Action::Create { retain_for } => {
            let detail = retain_for.map(|r| format!("retainFor {r}"));
            if apply {
                create(client, l, retain_for.map(|r| r.to_string()).as_deref()).await
            } else {
                ("create", detail)
            }
        }
        Action::Rewrite => {
            if apply {
                rewrite(client, l).await
            } else {
                ("rewrite", Some(REWRITE.into()))
            }
        }
        Action::Delete => {
            if apply {
                delete(client, l).await
            } else {
                ("delete", Some(DELETE.into()))
            }
        }
        Action::Gone => (
            "present",
            Some("released by the node, and gone from the API already".into()),
        ),
        Action::KeptBy(node) => (
            "present",
            Some(format!(
                "released by this node, but node {node}'s file holds it (it moved there): rewritten from that node's report, not deleted"
            )),
        ),
    }
}

/// What a rewrite does, for the dry run and the result.
const REWRITE: &str = "the API holds an older version (a restore): the node's addresses and node are written back into it";
/// What a deletion does, for the dry run and the result.
const DELETE: &str = "the node released it, a restore brought it back: deleted, its addresses stay with whoever got them since";

/// Writes the node's addresses and node back into an older version of the object, that uid
/// only (server-side apply as the controller, with the uid as a precondition).
async fn rewrite(client: &Client, l: &Lost) -> (&'static str, Option<String>) {
    let api: Api<IPReservation> = Api::namespaced(client.clone(), l.pod.namespace());
    let body = json!({
        "apiVersion": "ipkeep.dev/v1alpha1",
        "kind": "IPReservation",
        "metadata": {
            "name": l.pod.name(),
            "namespace": l.pod.namespace(),
            "uid": l.uid,
        },
        "spec": {
            "ips": l.ips.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "nodeName": l.node,
        },
    });
    match api
        .patch(
            l.pod.name(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
    {
        Ok(_) => ("rewritten", Some(REWRITE.into())),
        Err(e) => ("failed", Some(crate::runtime::logging::error_chain(&e))),
    }
}

/// Deletes an object the node released, that uid only.
async fn delete(client: &Client, l: &Lost) -> (&'static str, Option<String>) {
    let api: Api<IPReservation> = Api::namespaced(client.clone(), l.pod.namespace());
    let params = kube::api::DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some(l.uid.clone()),
            resource_version: None,
        }),
        ..kube::api::DeleteParams::default()
    };
    match api.delete(l.pod.name(), &params).await {
        Ok(_) => ("deleted", Some(DELETE.into())),
        Err(kube::Error::Api(ae)) if ae.code == 404 => (
            "present",
            Some("released by the node, and gone from the API already".into()),
        ),
        Err(e) => ("failed", Some(crate::runtime::logging::error_chain(&e))),
    }
}

fn disagreement(e: &Existing) -> String {
    let ips: Vec<String> = e.ips.iter().map(ToString::to_string).collect();
    format!(
        "the API has this reservation on {} with {}: not overwritten; delete it first if the node's file is the right one",
        e.node,
        ips.join(", ")
    )
}

/// Creates one lost reservation, unless the API has one of that name by now.
async fn create(
    client: &Client,
    l: &Lost,
    retain_for: Option<&str>,
) -> (&'static str, Option<String>) {
    let api: Api<IPReservation> = Api::namespaced(client.clone(), l.pod.namespace());
    match api.get_opt(l.pod.name()).await {
        Ok(Some(r)) => {
            let e = existing_of(&r);
            return if agrees(l, &e) {
                ("present", None)
            } else {
                ("refused", Some(disagreement(&e)))
            };
        }
        Ok(None) => {}
        Err(e) => return ("failed", Some(crate::runtime::logging::error_chain(&e))),
    }
    let mut spec = json!({
        "ips": l.ips.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "nodeName": l.node,
    });
    if let Some(r) = retain_for {
        spec["retainFor"] = json!(r);
    }
    let body = json!({
        "apiVersion": "ipkeep.dev/v1alpha1",
        "kind": "IPReservation",
        "metadata": {
            "name": l.pod.name(),
            "namespace": l.pod.namespace(),
            "labels": {api::MANAGED_BY_LABEL: api::MANAGED_BY_VALUE},
            "annotations": {RECOVERED_FROM: l.uid},
        },
        "spec": spec,
    });
    match api
        .patch(
            l.pod.name(),
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Apply(&body),
        )
        .await
    {
        Ok(_) => ("created", retain_for.map(|r| format!("retainFor {r}"))),
        Err(kube::Error::Api(ae)) if terminating(&ae) => ("skipped", Some(going(l))),
        Err(e) => ("failed", Some(crate::runtime::logging::error_chain(&e))),
    }
}

/// Whether the API server refused a create because the namespace is being deleted (403, "…
/// because it is being terminated", as the NamespaceLifecycle admission plugin says it).
fn terminating(ae: &kube::core::Status) -> bool {
    ae.code == 403 && ae.message.contains("because it is being terminated")
}

/// What becomes of a lost reservation whose namespace is being deleted: nothing to recover.
fn going(l: &Lost) -> String {
    let until = l.release_time.map_or_else(
        || {
            format!(
                "it has no release time (its pod held the addresses), so it stays until removed by hand on {}: delete reserved/{}/{} in the network's directory",
                l.node,
                l.pod.namespace(),
                l.pod.name()
            )
        },
        |t| format!("it is released at its release time {t}"),
    );
    format!(
        "namespace {} is being deleted: its pods go with it and nothing can be created in it, so there is nothing to recover; the node's file keeps the addresses until then: {until}",
        l.pod.namespace()
    )
}

/// The outcomes as text: one line each, then a summary.
pub fn text(outcomes: &[Outcome], unreadable: &[String], apply: bool) -> String {
    let mut out = String::new();
    for o in outcomes {
        let until = o
            .release_time
            .as_deref()
            .map_or_else(|| "bound".to_owned(), |t| format!("held until {t}"));
        let detail = o
            .detail
            .as_deref()
            .map(|d| format!(": {d}"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{} {} on {} ({}, {until}, was uid {}){detail}",
            o.action,
            o.reservation,
            o.node,
            o.ips.join(", "),
            o.uid
        );
    }
    for u in unreadable {
        let _ = writeln!(out, "unread {u}");
    }
    let count = |a: &str| outcomes.iter().filter(|o| o.action == a).count();
    let _ = writeln!(
        out,
        "{} lost reservations: {} to create{}, {} to rewrite, {} to delete, {} present, {} skipped, {} refused, {} failed",
        outcomes.len(),
        count("create") + count("created"),
        if apply {
            format!(" ({} created)", count("created"))
        } else {
            " (a dry run: --apply creates, rewrites and deletes them)".to_owned()
        },
        count("rewrite") + count("rewritten"),
        count("delete") + count("deleted"),
        count("present"),
        count("skipped"),
        count("refused"),
        count("failed")
    );
    out
}

/// Whether a person must look: something refused, failed or unread.
pub fn needs_a_person(outcomes: &[Outcome], unreadable: &[String]) -> bool {
    !unreadable.is_empty()
        || outcomes
            .iter()
            .any(|o| matches!(o.action, "refused" | "failed"))
}

/// Runs the command; `Ok(false)` when something needs a person (exit status 1).
pub fn main(args: Args) -> anyhow::Result<bool> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let names = Names::of(&args.target.release, args.target.fullname.as_deref(), None);
    runtime.block_on(async move {
        let client = Client::try_default().await?;
        let (outcomes, unreadable) =
            run(&client, &args.target.namespace, &names, args.apply).await?;
        match args.output {
            crate::check::Output::Text => print!("{}", text(&outcomes, &unreadable, args.apply)),
            crate::check::Output::Json => println!(
                "{}",
                json!({"apply": args.apply, "reservations": outcomes, "unread": unreadable})
            ),
        }
        Ok(!needs_a_person(&outcomes, &unreadable))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, message: &str) -> kube::core::Status {
        serde_json::from_value(json!({"code": code, "message": message, "status": "Failure"}))
            .unwrap()
    }

    #[test]
    fn a_terminating_namespace_is_skipped_not_failed() {
        // What the NamespaceLifecycle admission plugin answers (kube-apiserver 1.34).
        let refused = status(
            403,
            "ipreservations.ipkeep.dev \"db-0\" is forbidden: unable to create new content in namespace db because it is being terminated",
        );
        assert!(terminating(&refused));
        assert!(!terminating(&status(
            403,
            "ipreservations.ipkeep.dev is forbidden: User \"x\" cannot create resource"
        )));
        assert!(!terminating(&status(500, "because it is being terminated")));
        let lost = |release: Option<i64>| Lost {
            node: "node-a".into(),
            pod: PodKey::new("db", "db-0").unwrap(),
            ips: vec!["10.0.0.1".parse().unwrap()],
            release_time: release.map(Timestamp::from_unix_secs),
            uid: "u".into(),
            kind: Kind::Lost,
        };
        assert!(going(&lost(Some(1_900_000_000))).contains("released at its release time"));
        assert!(going(&lost(None)).contains("removed by hand on node-a"));
        let outcome = |action: &'static str| Outcome {
            reservation: "db/db-0".into(),
            node: "node-a".into(),
            ips: vec!["10.0.0.1".into()],
            release_time: None,
            uid: "u".into(),
            action,
            detail: None,
        };
        assert!(!needs_a_person(
            &[outcome("skipped"), outcome("created")],
            &[]
        ));
        assert!(needs_a_person(
            &[outcome("skipped"), outcome("failed")],
            &[]
        ));
        let summary = text(&[outcome("skipped")], &[], true);
        assert!(summary.contains("1 skipped"), "{summary}");
    }
}
