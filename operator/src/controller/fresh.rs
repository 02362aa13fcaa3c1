//! The fresh read of a namespace's pods before expired reservations are deleted, shared by the
//! deletes of one burst.
//!
//! Never deleted while its pod lives: before deleting, the controller reads from the API server,
//! not from its cache, that no live pod of that name exists, then deletes with the reservation's
//! uid and resourceVersion as preconditions. A lone expiry reads its pod with a GET, as before.
//! When expiries of one namespace come together (many reservations due in the same second), a GET
//! each made every delete two requests in a row on its worker; instead they share one LIST of the
//! namespace's pod names (metadata only, read from the API server like the GET, not from a
//! cache). A name in that list is read again with a GET (its pod may have finished); a name absent
//! from it had no pod when the LIST was answered.
//!
//! What the proof covers, in either form: no pod of that name existed when the API server answered
//! a read sent after the delete was decided (the GET) or at most [`FRESH_FOR`] before it (the
//! shared LIST). What neither form excludes (Kubernetes has no precondition across two objects): a
//! pod created between that read and the DELETE. The GET leaves one round trip for it. For the
//! shared LIST the delete also looks in the pod cache just before it is sent: the pod watch began
//! before the LIST, so a pod created since reached the cache within the watch's lag, and a name the
//! cache shows is read with a GET as a lone expiry's is; what is left open is that lag (milliseconds,
//! the order of the GET's round trip), not [`FRESH_FOR`]. Such a pod is new (its first address comes
//! from its node after the scheduler, the kubelet and the sandbox, seconds later), and the controller
//! reserves the addresses a running annotated pod has, so it would still keep them.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client, api::ListParams};

/// How old a shared LIST may be when a delete relies on it, and how close together two expiries
/// of a namespace must come to share one.
pub const FRESH_FOR: Duration = Duration::from_secs(1);

/// What a fresh read said of one pod name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// No pod of that name existed when the API server answered.
    Absent,
    /// A pod of that name may exist: read it (a GET) to know whether it lives.
    ReadIt,
}

/// One namespace's last LIST of pod names and when its last expiry asked.
#[derive(Debug, Default)]
struct Slot {
    listed: Option<Arc<Listed>>,
    last_asked: Option<Instant>,
}

#[derive(Debug)]
struct Listed {
    /// When the LIST was sent: the age a delete relying on it counts from.
    sent: Instant,
    names: HashSet<String>,
}

/// Whether to share a LIST: decided from the namespace's recent asks, pure.
fn plan(slot: &Slot, now: Instant) -> Step {
    if let Some(listed) = &slot.listed
        && now.saturating_duration_since(listed.sent) <= FRESH_FOR
    {
        return Step::Reuse(listed.clone());
    }
    match slot.last_asked {
        Some(asked) if now.saturating_duration_since(asked) <= FRESH_FOR => Step::List,
        _ => Step::Get,
    }
}

#[derive(Debug)]
enum Step {
    Reuse(Arc<Listed>),
    List,
    Get,
}

/// The shared fresh reads, one slot per namespace.
#[derive(Debug, Default)]
pub struct FreshPods {
    slots: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Slot>>>>,
}

impl FreshPods {
    fn slot(&self, namespace: &str) -> Arc<tokio::sync::Mutex<Slot>> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.entry(namespace.to_owned()).or_default().clone()
    }

    /// What the API server says of the pod `namespace/name` before its expired reservation is
    /// deleted: from a LIST shared with the namespace's other expiries when they come together
    /// (one request in flight per namespace; the others wait for its answer), else
    /// [`Seen::ReadIt`] for the caller's GET.
    pub async fn expiry_check(
        &self,
        client: &Client,
        namespace: &str,
        name: &str,
    ) -> Result<Seen, kube::Error> {
        let slot = self.slot(namespace);
        let mut slot = slot.lock().await;
        let now = Instant::now();
        let step = plan(&slot, now);
        slot.last_asked = Some(now);
        let listed = match step {
            Step::Get => {
                slot.listed = None;
                return Ok(Seen::ReadIt);
            }
            Step::Reuse(listed) => listed,
            Step::List => {
                let sent = Instant::now();
                let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
                let names = pods
                    .list_metadata(&ListParams::default())
                    .await?
                    .items
                    .into_iter()
                    .filter_map(|p| p.metadata.name)
                    .collect();
                let listed = Arc::new(Listed { sent, names });
                slot.listed = Some(listed.clone());
                listed
            }
        };
        Ok(if listed.names.contains(name) {
            Seen::ReadIt
        } else {
            Seen::Absent
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(sent: Instant) -> Option<Arc<Listed>> {
        Some(Arc::new(Listed {
            sent,
            names: HashSet::new(),
        }))
    }

    #[test]
    fn a_lone_expiry_reads_its_pod_and_a_burst_shares_one_list_no_older_than_fresh_for() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let cases: [(&str, Slot, Instant, &str); 6] = [
            ("the first expiry", Slot::default(), t0, "get"),
            (
                "another right after it",
                Slot {
                    listed: None,
                    last_asked: Some(t0),
                },
                t0 + ms(100),
                "list",
            ),
            (
                "one long after the last",
                Slot {
                    listed: None,
                    last_asked: Some(t0),
                },
                t0 + FRESH_FOR + ms(1),
                "get",
            ),
            (
                "within FRESH_FOR of a LIST",
                Slot {
                    listed: listed(t0),
                    last_asked: Some(t0),
                },
                t0 + FRESH_FOR,
                "reuse",
            ),
            (
                "a LIST too old, the burst goes on",
                Slot {
                    listed: listed(t0),
                    last_asked: Some(t0 + ms(1_500)),
                },
                t0 + ms(1_600),
                "list",
            ),
            (
                "a LIST too old, the burst over",
                Slot {
                    listed: listed(t0),
                    last_asked: Some(t0),
                },
                t0 + ms(5_000),
                "get",
            ),
        ];
        for (case, slot, now, want) in cases {
            let got = match plan(&slot, now) {
                Step::Reuse(_) => "reuse",
                Step::List => "list",
                Step::Get => "get",
            };
            assert_eq!(got, want, "{case}");
        }
    }
}
