//! The agent's two watches: its node's IPReservations (kube's reflector store) and the data
//! directory on disk (inotify, [`dirwatch`]). Each reports to the write schedule and wakes the
//! write loop.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::StreamExt;
use kube::{
    Api, Client, ResourceExt,
    runtime::{
        WatchStreamExt,
        reflector::store::Writer,
        watcher::{self, Event},
    },
};
use tokio::sync::Notify;

use super::{
    AgentMetrics,
    dirwatch::{self, DirWatch, Wake as DirWake},
    sync::Pending,
    view,
};
use crate::{
    api::{IPReservation, key_of},
    runtime::{logging::error_chain, probes::Readiness},
};

/// The pause before the data directory's watch is set up again after it failed.
const WATCH_RETRY: Duration = Duration::from_secs(30);

/// Runs the data directory's watch ([`dirwatch`]): each burst that asks for a resync makes the
/// next pass a full one, at once; once the first full sync made every directory (the agent is
/// ready), a directory found missing does too. Without inotify (or after a read error) the agent
/// goes on with its periodic resync and sets the watch up again after a pause.
pub(super) async fn watch_directories(
    data_dir: PathBuf,
    networks: Vec<String>,
    pending: Arc<Mutex<Pending>>,
    changed: Arc<Notify>,
    readiness: Arc<Readiness>,
) {
    loop {
        let mut watch = match DirWatch::new(&data_dir, &networks) {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %error_chain(&e), "cannot watch the data directory; only the periodic resync repairs it; retrying");
                tokio::time::sleep(WATCH_RETRY).await;
                continue;
            }
        };
        loop {
            match watch.next(|| readiness.is_ready()).await {
                Ok(DirWake::Resync(trigger)) => {
                    let Ok(mut p) = pending.lock() else {
                        return;
                    };
                    p.schedule.directory(trigger, Instant::now());
                    tracing::info!(reason = trigger.label(), "{trigger}: full resync now");
                    changed.notify_one();
                }
                Ok(DirWake::Orphaned(path)) => {
                    if let Ok(mut p) = pending.lock() {
                        p.orphaned = Some(path);
                    }
                    changed.notify_one();
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %error_chain(&e), "data directory watch failed; setting it up again");
                    break;
                }
            }
        }
        tokio::time::sleep(dirwatch::REARM).await;
    }
}

/// Records a deletion the watch delivers, before the store forgets the object: a pass that no
/// longer finds it in the store finds the deletion (`rules::loss`: released, not lost).
fn record_deletion(pending: &Mutex<Pending>, event: &Result<Event<IPReservation>, watcher::Error>) {
    if let Ok(Event::Delete(obj)) = event
        && let (Ok(key), Some(uid)) = (key_of(obj), obj.uid())
        && let Ok(mut p) = pending.lock()
    {
        p.deleted.insert((key, uid));
    }
}

pub(super) async fn watch_reservations(
    client: Client,
    node: String,
    writer: Writer<IPReservation>,
    pending: Arc<Mutex<Pending>>,
    changed: Arc<Notify>,
    metrics: AgentMetrics,
) {
    let api: Api<IPReservation> = Api::all(client);
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut stream = std::pin::pin!(
        watcher::watcher(api, cfg)
            .default_backoff()
            .modify(view::trim)
            .inspect(|event| record_deletion(&pending, event))
            .reflect(writer)
    );
    while let Some(event) = stream.next().await {
        let now = Instant::now();
        let Ok(mut p) = pending.lock() else {
            return;
        };
        match event {
            // The store swaps in the relisted objects at InitDone: nothing to do before.
            Ok(Event::Init | Event::InitApply(_)) => {}
            Ok(Event::InitDone) => {
                p.schedule.listed(now);
                tracing::info!("reservations listed");
                changed.notify_one();
            }
            Ok(Event::Apply(_) | Event::Delete(_)) => {
                p.schedule.changed(now);
                changed.notify_one();
            }
            Err(e) => {
                metrics.watch_errors.inc();
                tracing::warn!(error = %e, "reservation watch failed; retrying");
            }
        }
    }
}
