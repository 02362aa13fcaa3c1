//! The agent's write loop: wakes on a watch's report, a failed pass's retry time or the periodic
//! tick, asks the write schedule ([`crate::rules::schedule`]) what to do, computes the desired
//! files ([`crate::rules::desired`]) and writes them through [`super::writer`].

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    future::Future,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use ipkeep_reservation::{PodKey, Timestamp, ValidReservation};
use kube::{
    Resource, ResourceExt,
    runtime::reflector::{ObjectRef, Store},
};
use tokio::sync::Notify;

use super::{
    AgentConfig, AgentError, AgentMetrics,
    loss::{LossReporter, Sightings},
    view,
    writer::{NetworkWriter, PassReport},
};
use crate::{
    api::{IPReservation, key_of},
    rules::{
        desired::{Refusal, desired_files},
        loss::{Fate, LossCause, Restored, Sighting, fate, kept_until, restored, yield_to_kept},
        schedule::{Pass, Schedule, Step, Wake},
    },
    runtime::{
        events::{Notice, Publisher},
        logging::error_chain,
        probes::Readiness,
    },
};

/// What the watches tell the write loop; the reservations themselves are in the reflector
/// store.
#[derive(Debug)]
pub(super) struct Pending {
    /// What they reported, as the write schedule keeps it.
    pub(super) schedule: Schedule,
    /// The data directory was deleted under the agent's mount: the agent must stop.
    pub(super) orphaned: Option<PathBuf>,
    /// The deletions (pod, uid) the watch delivered since the last pass took them: what tells a
    /// released reservation's file from a lost one's ([`crate::rules::loss`]).
    pub(super) deleted: HashSet<(PodKey, String)>,
}

/// What the watch fills and the write loop reads.
#[derive(Clone, Copy)]
pub(super) struct State<'a> {
    pub(super) store: &'a Store<IPReservation>,
    pub(super) pending: &'a Mutex<Pending>,
    pub(super) changed: &'a Notify,
    /// The API client (the CRD is read when a pass judges deletions, the pod's condition written).
    pub(super) client: &'a kube::Client,
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The thin async shell over [`Schedule`]: wakes on a watch's report, a failed pass's retry
/// time or the periodic tick, asks the schedule what to do, runs the pass on a blocking thread
/// and tells the schedule how it ended.
pub(super) async fn write_loop(
    config: &AgentConfig,
    state: State<'_>,
    metrics: &AgentMetrics,
    readiness: &Readiness,
    events: &Publisher,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    tokio::pin!(shutdown);
    let mut writers = Some(new_writers(config));
    let mut reported: HashSet<(String, String)> = HashSet::new();
    let State {
        store,
        pending,
        changed,
        client,
    } = state;
    let mut sightings = Sightings::default();
    let mut loss = LossReporter::new(
        config.node_name.clone(),
        config.in_charge.as_ref().and_then(|r| r.pod.clone()),
        metrics.lost_reservations.clone(),
    );
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        let retry_at = schedule(pending, |s| s.retry_at()).flatten();
        let wake_for_retry = async {
            match retry_at {
                Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
                None => std::future::pending().await,
            }
        };
        let wake = tokio::select! {
            () = &mut shutdown => return Ok(()),
            () = changed.notified() => {
                if let Some(path) = pending.lock().ok().and_then(|mut p| p.orphaned.take()) {
                    return Err(AgentError::DataDirOrphaned(path));
                }
                Wake::Changed
            }
            () = wake_for_retry => Wake::Retry,
            _ = tick.tick() => {
                if let Some(since) = schedule(pending, |s| s.since_full(Instant::now())).flatten() {
                    metrics
                        .seconds_since_full_sync
                        .set(i64::try_from(since.as_secs()).unwrap_or(i64::MAX));
                }
                Wake::Tick
            }
        };
        // The store is read under the same lock, so a change the pass takes is in the store.
        let Some((pass, reservations, deleted)) =
            pending
                .lock()
                .ok()
                .and_then(|mut p| match p.schedule.next(wake, Instant::now()) {
                    Step::Wait => None,
                    Step::Pass(pass) => Some((pass, store.state(), std::mem::take(&mut p.deleted))),
                })
        else {
            continue;
        };
        let mut desired = desired_files(
            &config.node_name,
            &view::reservations(reservations.iter().map(AsRef::as_ref)),
            config.default_retain_for,
        );
        let present: HashSet<PodKey> = reservations
            .iter()
            .filter_map(|r| key_of(r.as_ref()).ok())
            .collect();
        let DiskView {
            gone,
            held,
            released,
        } = read_disk(config, &mut writers, pass.full, &present).await;
        // Objects a restore brought back, judged against the node's files before anything is
        // written ([`crate::rules::loss::restored`]).
        let (restored, lost_to_restore) = restored(&mut desired, &held, &released);
        let judge = Judge {
            sightings: sightings
                .sight(client, &config.node_name, &gone, &deleted)
                .await,
            present,
        };
        let now_utc = Timestamp::from_system_time(SystemTime::now());
        let kept: Vec<(PodKey, Vec<std::net::IpAddr>)> = gone
            .iter()
            .filter(|f| judge.fate(f, now_utc) != Fate::Release)
            .chain(&lost_to_restore)
            .chain(restored.iter().filter_map(Restored::kept))
            .filter_map(|f| Some((f.pod_key().ok()?, f.ips.clone())))
            .collect();
        yield_to_kept(&mut desired, &kept);
        metrics
            .reservations
            .set(i64::try_from(desired.files.len()).unwrap_or(i64::MAX));
        metrics
            .refused
            .set(i64::try_from(desired.refused.len()).unwrap_or(i64::MAX));
        report_refusals(store, &desired.refused, &mut reported, events).await;
        // The controller posts the Warning for a malformed spec.retainFor (on every reservation
        // it releases); the agent, which writes the same default, only leaves a trace.
        for (key, malformed) in &desired.defaulted {
            tracing::debug!(reservation = %key, error = %malformed, "default retention applied");
        }
        let outcome = write_pass(
            config,
            &mut writers,
            desired.files,
            pass.full,
            metrics,
            judge,
        )
        .await;
        let ok = outcome.ok && outcome.undecided == 0;
        let release_due = earliest_release(&outcome.lost);
        schedule(pending, |s| s.release_at(release_due));
        if ok {
            let mut lost = outcome.lost;
            lost.extend(
                lost_to_restore
                    .into_iter()
                    .map(|f| (f, LossCause::Vanished)),
            );
            loss.report(client, lost, restored, events).await;
        } else if let Ok(mut p) = pending.lock() {
            // Judged again on the retry, which reads the tree.
            p.deleted.extend(deleted);
        }
        let now = Instant::now();
        if ok {
            schedule(pending, |s| s.succeeded(&pass, now));
            passed(&pass, metrics, readiness);
        } else {
            schedule(pending, |s| s.failed(pass, now));
        }
    }
}

/// When the earliest release time of the files kept as lost comes, on the monotonic clock.
fn earliest_release(lost: &[(ipkeep_reservation::ReservationFile, LossCause)]) -> Option<Instant> {
    let now = Timestamp::from_system_time(SystemTime::now());
    lost.iter()
        .filter_map(|(f, _)| f.release_time)
        .min()
        .map(|at| Instant::now() + at.saturating_duration_since(now))
}

/// What a pass needs to judge the files whose reservation is gone ([`crate::rules::loss`]).
struct Judge {
    /// Every reservation the store holds, by pod.
    present: HashSet<PodKey>,
    /// How each gone file's object was seen to go, by (pod, uid).
    sightings: HashMap<(PodKey, String), Sighting>,
}

impl Judge {
    /// A file found gone by the pass but not before it (the tree changed in between) is
    /// undecided until the next pass asks about it.
    fn fate(&self, file: &ipkeep_reservation::ReservationFile, now: Timestamp) -> Fate {
        let sighting = file
            .pod_key()
            .ok()
            .and_then(|key| self.sightings.get(&(key, file.uid.clone())).copied())
            .unwrap_or(Sighting::Unasked);
        fate(file.release_time, sighting, now)
    }
}

/// What a pass reads of the node's files before it plans ([`crate::rules::loss`]).
#[derive(Debug, Default)]
struct DiskView {
    /// The files whose reservation is not in the store (one per pod and uid).
    gone: Vec<ipkeep_reservation::ReservationFile>,
    /// The files of the reservations in the store, by pod (the first network's).
    held: BTreeMap<PodKey, ipkeep_reservation::ReservationFile>,
    /// What the node released on purpose, every network's: (uid, generation).
    released: Vec<(String, i64)>,
}

/// Reads every network's files and releases on a blocking thread; nothing if the thread failed
/// (the pass then fails too).
async fn read_disk(
    config: &AgentConfig,
    writers: &mut Option<Vec<NetworkWriter>>,
    full: bool,
    present: &HashSet<PodKey>,
) -> DiskView {
    let moved = writers.take().unwrap_or_else(|| new_writers(config));
    let present = present.clone();
    let joined = tokio::task::spawn_blocking(move || {
        let mut gone = BTreeMap::new();
        let mut view = DiskView::default();
        for w in &moved {
            match w.on_disk(full) {
                Ok(files) => {
                    for (key, file) in files {
                        if present.contains(&key) {
                            view.held.entry(key).or_insert(file);
                        } else {
                            gone.entry((key, file.uid.clone())).or_insert(file);
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(network = %w.network(), error = %error_chain(&e), "cannot read the reservation files to judge");
                }
            }
            view.released.extend(w.released());
        }
        view.gone = gone.into_values().collect();
        (moved, view)
    })
    .await;
    match joined {
        Ok((back, view)) => {
            *writers = Some(back);
            view
        }
        Err(e) => {
            tracing::error!(error = %e, "reservation reader task failed");
            DiskView::default()
        }
    }
}

/// How a pass went, over every network.
#[derive(Debug, Default)]
struct PassOutcome {
    /// Every step succeeded.
    ok: bool,
    /// Files kept as lost, every network's.
    lost: Vec<(ipkeep_reservation::ReservationFile, LossCause)>,
    /// Files kept undecided.
    undecided: usize,
}

/// Writes `files` for every network on a blocking thread: a full resync or the changes only,
/// keeping the files `judge` finds lost. Writers are moved to the thread and back; a thread
/// that panicked loses them, and new ones start from a full resync.
async fn write_pass(
    config: &AgentConfig,
    writers: &mut Option<Vec<NetworkWriter>>,
    files: BTreeMap<PodKey, ValidReservation>,
    full: bool,
    metrics: &AgentMetrics,
    judge: Judge,
) -> PassOutcome {
    let mut moved = writers.take().unwrap_or_else(|| new_writers(config));
    let now = Timestamp::from_system_time(SystemTime::now());
    let default_retain_for = config.default_retain_for;
    let joined = tokio::task::spawn_blocking(move || {
        let results: Vec<_> = moved
            .iter_mut()
            .map(|w| {
                let r = w.pass(
                    &files,
                    full,
                    |key| judge.present.contains(key),
                    |file| judge.fate(file, now),
                    |file, cause| {
                        kept_until(
                            file.release_time,
                            file.retain_for_seconds.map(Duration::from_secs),
                            cause,
                            default_retain_for,
                            now,
                        )
                    },
                );
                (w.network().to_owned(), r)
            })
            .collect();
        (moved, results)
    })
    .await;
    let (back, results) = match joined {
        Ok(out) => out,
        Err(e) => {
            tracing::error!(error = %e, "reservation writer task failed");
            metrics.sync_errors.with_label_values(&["pass"]).inc();
            return PassOutcome::default();
        }
    };
    *writers = Some(back);
    let mut outcome = PassOutcome {
        ok: true,
        ..PassOutcome::default()
    };
    for (network, result) in results {
        match result {
            Ok(report) => {
                outcome.ok &= account(&network, &report, full, metrics);
                outcome.undecided += report.undecided;
                outcome.lost.extend(report.lost);
            }
            Err(e) => {
                outcome.ok = false;
                metrics.sync_errors.with_label_values(&["pass"]).inc();
                tracing::warn!(network = %network, error = %error_chain(&e), "reservation sync failed; retrying");
            }
        }
    }
    outcome
}

/// Records a pass that ended well: how long its changes took to reach disk, the directory
/// trigger it answered, and (a full one) the resync, which makes the agent ready.
fn passed(pass: &Pass, metrics: &AgentMetrics, readiness: &Readiness) {
    for at in &pass.arrivals {
        metrics.change_to_file.observe(at.elapsed().as_secs_f64());
    }
    if let Some((since, trigger)) = pass.dir_trigger {
        metrics
            .directory_resyncs
            .with_label_values(&[trigger.label()])
            .inc();
        tracing::info!(
            reason = trigger.label(),
            millis = u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX),
            "reservation files restored after: {trigger}"
        );
    }
    if pass.full {
        metrics.full_syncs.inc();
        metrics.last_full_sync.set(unix_now());
        metrics.seconds_since_full_sync.set(0);
        if !readiness.is_ready() {
            tracing::info!("first full sync done: ready");
        }
        readiness.set(true);
    }
}

/// One writer per network, knowing nothing yet (so its first pass reads the tree).
fn new_writers(config: &AgentConfig) -> Vec<NetworkWriter> {
    config
        .networks
        .iter()
        .map(|n| NetworkWriter::new(&config.data_dir, n))
        .collect()
}

/// Runs `f` on the schedule under its lock (`None` if a watch task panicked holding it).
fn schedule<T>(pending: &Mutex<Pending>, f: impl FnOnce(&mut Schedule) -> T) -> Option<T> {
    pending.lock().ok().map(|mut p| f(&mut p.schedule))
}

/// Counts and logs one network's pass; `false` if a step failed.
fn account(network: &str, report: &PassReport, full: bool, metrics: &AgentMetrics) -> bool {
    metrics.files_written.inc_by(report.written.len() as u64);
    metrics.files_removed.inc_by(report.removed.len() as u64);
    metrics.garbage_cleaned.inc_by(report.cleaned.len() as u64);
    for key in &report.written {
        tracing::debug!(network, pod = %key, "reservation file written");
    }
    for key in &report.removed {
        tracing::info!(network, pod = %key, "reservation file removed");
    }
    for path in &report.cleaned {
        tracing::info!(network, path = %path.display(), "garbage removed from reserved/");
    }
    for failure in &report.failed {
        metrics.sync_errors.with_label_values(&["file"]).inc();
        tracing::warn!(network, error = %failure, "reservation file step failed");
    }
    if full {
        tracing::info!(
            network,
            written = report.written.len(),
            removed = report.removed.len(),
            cleaned = report.cleaned.len(),
            failed = report.failed.len(),
            "full resync done"
        );
    }
    report.failed.is_empty()
}

/// Logs each refused reservation and publishes one Warning Event per object version.
async fn report_refusals(
    store: &Store<IPReservation>,
    refused: &[Refusal],
    reported: &mut HashSet<(String, String)>,
    events: &Publisher,
) {
    if refused.is_empty() {
        reported.clear();
        return;
    }
    let refused: Vec<(&Refusal, Arc<IPReservation>)> = refused
        .iter()
        .filter_map(|refusal| {
            let (namespace, name) = refusal.names();
            let obj = store.get(&ObjectRef::new(name).within(namespace))?;
            Some((refusal, obj))
        })
        .collect();
    let version_of = |obj: &IPReservation| {
        (
            obj.uid().unwrap_or_default(),
            obj.resource_version().unwrap_or_default(),
        )
    };
    // Forget versions no longer refused, so the set stays as small as the refusals.
    let current: HashSet<(String, String)> =
        refused.iter().map(|(_, obj)| version_of(obj)).collect();
    reported.retain(|v| current.contains(v));
    for (refusal, obj) in refused {
        if !reported.insert(version_of(&obj)) {
            continue;
        }
        let note = error_chain(refusal);
        let (namespace, name) = refusal.names();
        tracing::warn!(reservation = %format_args!("{namespace}/{name}"), error = %note, "reservation refused: no file written");
        events.publish(Notice {
            regarding: obj.object_ref(&()),
            reason: crate::api::reason::INVALID_RESERVATION,
            action: "WriteReservationFile",
            note: &note,
        });
    }
}
