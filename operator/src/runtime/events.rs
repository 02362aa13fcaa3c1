//! Kubernetes Events (`events.k8s.io/v1`), published the same way by the controller and the
//! agent: which Events are posted ([`Policy`]) and how, off the caller's path ([`Publisher`]).
//!
//! **Which.** Warning Events always; Normal Events only when asked for (`--normal-events`). A
//! Normal Event here would retell a transition the object already shows (a reservation's
//! `status.phase`, `releasedAt`, `releaseTime`; its deletion), and the Event guidelines of
//! Kubernetes' instrumentation SIG say not to duplicate what watching the altered resource shows:
//! each Event is a write to etcd, kept an hour, and sent to every Event watcher. Off, a pod's
//! lifecycle costs only the reservation's own writes.
//!
//! **How.** [`Publisher::publish`] never waits: it puts the Event in a bounded queue and returns;
//! a task of its own posts the queue's Events, a few at a time. A full queue drops the Event and
//! counts it (client-go's recorder does the same with its queue of 1 000), so a slow or failing
//! Event write never holds up a reconcile or the agent's file writes. [`Drain::flush`] posts
//! what is queued at shutdown, within a deadline, and what it could not post is logged.
//!
//! Posted directly rather than through kube's `Recorder`: the Recorder keeps every Event it sent
//! for six minutes (to turn repeats into a series) and scans that whole cache on every publish,
//! so 10 000 newly reserved pods cost tens of MiB and quadratic time. Neither component repeats
//! itself: the controller publishes on transitions only, the agent once per refused object
//! version, so a series would never form anyway.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::Poll,
    time::Duration,
};

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::{
    api::{core::v1::ObjectReference, events::v1::Event},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
};
use kube::{Api, Client, api::PostParams};
use prometheus::IntCounter;
use tokio::sync::{mpsc, oneshot};

use crate::api::reason::EventReason;

/// The API server's limit on an Event's `note`.
const NOTE_MAX: usize = 1024;
/// The API server's limit on `reportingInstance`.
const INSTANCE_MAX: usize = 128;
/// Events waiting to be posted before new ones are dropped.
pub const QUEUE_CAPACITY: usize = 1024;
/// Event creates in flight at once: enough to keep up with a burst of Warnings without
/// competing with the reservation writes for the API server.
const IN_FLIGHT: usize = 4;

/// Normal or Warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Something went as it should.
    Normal,
    /// Something a person should look at.
    Warning,
}

impl EventType {
    /// The type of an Event with this reason.
    pub fn of(reason: EventReason) -> EventType {
        if reason.warning {
            EventType::Warning
        } else {
            EventType::Normal
        }
    }

    /// The API's spelling (`Normal`, `Warning`).
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// Which Events are posted; Warnings always.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Policy {
    /// Post Normal Events too (routine transitions).
    pub normal: bool,
}

impl Policy {
    /// Whether an Event of this type is posted.
    pub fn admits(self, type_: EventType) -> bool {
        match type_ {
            EventType::Warning => true,
            EventType::Normal => self.normal,
        }
    }
}

/// One Event to publish.
#[derive(Debug, Clone)]
pub struct Notice<'a> {
    /// The object it is about.
    pub regarding: ObjectReference,
    /// The reason, which says Normal or Warning (`Reserved`, `InvalidReservation`, …).
    pub reason: EventReason,
    /// What the component was doing (`Reconcile`, `WriteReservationFile`).
    pub action: &'a str,
    /// What happened, for people (cut to the API's 1 KiB).
    pub note: &'a str,
}

/// The reference an Event about the Node `name` carries (cluster-scoped: no namespace).
pub fn node_ref(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name.to_owned()),
        ..ObjectReference::default()
    }
}

/// What [`Publisher::publish`] did with a notice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Queued; it will be posted.
    Queued,
    /// Not posted: the [`Policy`] leaves out its type.
    Suppressed,
    /// Not posted: the queue was full, or closed by [`Drain::flush`].
    Dropped,
}

/// Counts shared by the publishers and their drain.
#[derive(Debug, Default)]
struct Counts {
    queued: AtomicU64,
    finished: AtomicU64,
}

impl Counts {
    fn unsent(&self) -> u64 {
        let finished = self.finished.load(Ordering::Acquire);
        self.queued.load(Ordering::Acquire).saturating_sub(finished)
    }
}

/// Publishes Events as one component (`reportingController`) and replica or node
/// (`reportingInstance`); cheap to clone, every clone feeds the same queue.
#[derive(Clone)]
pub struct Publisher {
    queue: mpsc::Sender<Event>,
    policy: Policy,
    controller: &'static str,
    instance: String,
    counts: Arc<Counts>,
    dropped: Option<IntCounter>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("controller", &self.controller)
            .field("instance", &self.instance)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// The receiving end of a publisher's queue, before its drain runs.
#[derive(Debug)]
struct Queue {
    events: mpsc::Receiver<Event>,
    counts: Arc<Counts>,
}

impl Publisher {
    /// A publisher reporting as `controller` (e.g. `ipkeep-agent`) from `instance`, Warnings only,
    /// its drain running until every clone is gone.
    pub fn new(client: Client, controller: &'static str, instance: &str) -> Publisher {
        let (publisher, drain) =
            Publisher::start(client, controller, instance, Policy::default(), None);
        drain.detach();
        publisher
    }

    /// A publisher with `policy`, counting dropped Events in `dropped`, and its drain (a spawned
    /// task; call [`Drain::flush`] at shutdown).
    pub fn start(
        client: Client,
        controller: &'static str,
        instance: &str,
        policy: Policy,
        dropped: Option<IntCounter>,
    ) -> (Publisher, Drain) {
        let (publisher, queue) =
            Publisher::queue(controller, instance, policy, QUEUE_CAPACITY, dropped);
        let drain = queue.drain(move |event| {
            let client = client.clone();
            async move { post(client, event).await }
        });
        (publisher, drain)
    }

    fn queue(
        controller: &'static str,
        instance: &str,
        policy: Policy,
        capacity: usize,
        dropped: Option<IntCounter>,
    ) -> (Publisher, Queue) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let counts = Arc::new(Counts::default());
        let publisher = Publisher {
            queue: tx,
            policy,
            controller,
            instance: instance.chars().take(INSTANCE_MAX).collect(),
            counts: counts.clone(),
            dropped,
        };
        (publisher, Queue { events: rx, counts })
    }

    /// Queues the Event in the namespace of the object it is about, unless the policy leaves it
    /// out or the queue is full; never waits. Posting it is worth a try, not a retry: a failure
    /// is logged.
    pub fn publish(&self, notice: Notice<'_>) -> Outcome {
        if !self.policy.admits(EventType::of(notice.reason)) {
            return Outcome::Suppressed;
        }
        let reason = notice.reason.name;
        match self.queue.try_send(self.event(notice)) {
            Ok(()) => {
                self.counts.queued.fetch_add(1, Ordering::AcqRel);
                Outcome::Queued
            }
            Err(e) => {
                let why = match e {
                    mpsc::error::TrySendError::Full(_) => "the queue is full",
                    mpsc::error::TrySendError::Closed(_) => "the component is stopping",
                };
                // Counted where a metric exports it, else each drop is a log line.
                match &self.dropped {
                    Some(dropped) => {
                        dropped.inc();
                        tracing::debug!(reason, why, "Event dropped");
                    }
                    None => tracing::warn!(reason, why, "Event dropped"),
                }
                Outcome::Dropped
            }
        }
    }

    fn event(&self, notice: Notice<'_>) -> Event {
        let namespace = notice
            .regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = notice.regarding.name.clone().unwrap_or_default();
        let now = Timestamp::now();
        Event {
            metadata: ObjectMeta {
                name: Some(format!("{name}.{:x}", now.as_nanosecond())),
                namespace: Some(namespace),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            action: Some(notice.action.into()),
            reason: Some(notice.reason.name.into()),
            note: Some(notice.note.chars().take(NOTE_MAX).collect()),
            type_: Some(EventType::of(notice.reason).as_str().into()),
            regarding: Some(notice.regarding),
            reporting_controller: Some(self.controller.into()),
            reporting_instance: Some(self.instance.clone()),
            ..Event::default()
        }
    }
}

async fn post(client: Client, event: Event) {
    let namespace = event.metadata.namespace.clone().unwrap_or_default();
    let api: Api<Event> = Api::namespaced(client, &namespace);
    if let Err(e) = api.create(&PostParams::default(), &event).await {
        let regarding = event.regarding.as_ref().and_then(|r| r.name.as_deref());
        tracing::warn!(error = %e, reason = event.reason.as_deref(), object = regarding, "failed to publish an Event");
    }
}

impl Queue {
    /// Spawns the task that posts the queued Events with `post`, [`IN_FLIGHT`] at a time, until
    /// the queue is closed ([`Drain::flush`]) or every publisher is gone, and the queue is empty.
    fn drain<P, F>(self, post: P) -> Drain
    where
        P: Fn(Event) -> F + Send + Sync + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let (close_tx, close_rx) = oneshot::channel::<()>();
        let Queue { mut events, counts } = self;
        let unsent = Unsent(counts.clone());
        let finished = counts.clone();
        let mut close = Some(close_rx);
        let task = tokio::spawn(async move {
            let _unsent = unsent;
            let queued = futures::stream::poll_fn(move |cx| {
                if let Some(signal) = close.as_mut()
                    && let Poll::Ready(result) = Pin::new(signal).poll(cx)
                {
                    // Closed by a flush: take nothing new, post what is queued. A `Drain` gone
                    // without a flush leaves the queue open until the publishers are gone.
                    if result.is_ok() {
                        events.close();
                    }
                    close = None;
                }
                events.poll_recv(cx)
            });
            queued
                .for_each_concurrent(IN_FLIGHT, |event| {
                    let done = post(event);
                    let finished = finished.clone();
                    async move {
                        done.await;
                        finished.finished.fetch_add(1, Ordering::AcqRel);
                    }
                })
                .await;
        });
        Drain {
            task,
            close: close_tx,
            counts,
        }
    }
}

/// Logs the Events queued but never posted when the drain ends (a flush's deadline passed, or
/// the runtime stopped first).
struct Unsent(Arc<Counts>);

impl Drop for Unsent {
    fn drop(&mut self) {
        let unsent = self.0.unsent();
        if unsent > 0 {
            tracing::warn!(
                unsent,
                "Events queued but not published: the component is stopping"
            );
        }
    }
}

/// The task posting a publisher's queue.
#[derive(Debug)]
pub struct Drain {
    task: tokio::task::JoinHandle<()>,
    close: oneshot::Sender<()>,
    counts: Arc<Counts>,
}

/// What a flush did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flushed {
    /// Events posted (or tried: a failed post is logged and counts here) since the start.
    pub posted: u64,
    /// Events queued but not posted when the deadline passed (logged as well).
    pub unsent: u64,
}

impl Drain {
    /// Closes the queue (later Events are dropped) and posts what it holds, for at most `within`.
    pub async fn flush(mut self, within: Duration) -> Flushed {
        let _ = self.close.send(());
        if tokio::time::timeout(within, &mut self.task).await.is_err() {
            self.task.abort();
            let _ = (&mut self.task).await;
        }
        Flushed {
            posted: self.counts.finished.load(Ordering::Acquire),
            unsent: self.counts.unsent(),
        }
    }

    /// Lets the task run until every publisher is gone (what is queued then is still posted).
    pub fn detach(self) {
        // Dropping the close sender is what tells the task not to close the queue.
        drop(self);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    fn notice(type_: EventType, name: &str) -> Notice<'static> {
        Notice {
            regarding: ObjectReference {
                namespace: Some("ns".into()),
                name: Some(name.into()),
                ..ObjectReference::default()
            },
            reason: match type_ {
                EventType::Warning => crate::api::reason::CONFLICT,
                EventType::Normal => crate::api::reason::RESERVED,
            },
            action: "Reconcile",
            note: "note",
        }
    }

    #[test]
    fn the_policy_posts_warnings_always_and_normal_events_when_asked() {
        for (normal, type_, admitted) in [
            (false, EventType::Warning, true),
            (false, EventType::Normal, false),
            (true, EventType::Warning, true),
            (true, EventType::Normal, true),
        ] {
            assert_eq!(
                Policy { normal }.admits(type_),
                admitted,
                "normal events {normal}, {type_:?}"
            );
        }
    }

    #[test]
    fn a_full_queue_drops_and_counts_without_waiting() {
        // (capacity, Events published, Normal among them, expected outcomes)
        use Outcome::{Dropped, Queued, Suppressed};
        for (capacity, published, policy, expected) in [
            (
                2,
                vec![EventType::Warning; 2],
                Policy::default(),
                vec![Queued, Queued],
            ),
            (
                2,
                vec![EventType::Warning; 4],
                Policy::default(),
                vec![Queued, Queued, Dropped, Dropped],
            ),
            (
                1,
                vec![EventType::Normal, EventType::Warning, EventType::Normal],
                Policy::default(),
                vec![Suppressed, Queued, Suppressed],
            ),
            (
                1,
                vec![EventType::Normal, EventType::Warning],
                Policy { normal: true },
                vec![Queued, Dropped],
            ),
        ] {
            let dropped = IntCounter::new("dropped", "dropped").unwrap();
            let (publisher, queue) =
                Publisher::queue("test", "here", policy, capacity, Some(dropped.clone()));
            let outcomes: Vec<Outcome> = published
                .iter()
                .enumerate()
                .map(|(i, t)| publisher.publish(notice(*t, &format!("pod-{i}"))))
                .collect();
            assert_eq!(outcomes, expected, "capacity {capacity}, {published:?}");
            let want_dropped = expected.iter().filter(|o| **o == Dropped).count();
            assert_eq!(dropped.get(), want_dropped as u64);
            assert_eq!(
                queue.events.len(),
                expected.iter().filter(|o| **o == Queued).count()
            );
        }
    }

    #[test]
    fn the_event_is_built_when_published() {
        let (publisher, mut queue) = Publisher::queue(
            "ipkeep-controller",
            &"x".repeat(200),
            Policy::default(),
            1,
            None,
        );
        let mut n = notice(EventType::Warning, "web-0");
        let long = "y".repeat(2000);
        n.note = &long;
        assert_eq!(publisher.publish(n), Outcome::Queued);
        let event = queue.events.try_recv().unwrap();
        assert_eq!(event.metadata.namespace.as_deref(), Some("ns"));
        assert!(event.metadata.name.unwrap().starts_with("web-0."));
        assert!(event.event_time.is_some());
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        assert_eq!(event.note.unwrap().len(), NOTE_MAX);
        assert_eq!(event.reporting_instance.unwrap().len(), INSTANCE_MAX);
        assert_eq!(
            event.reporting_controller.as_deref(),
            Some("ipkeep-controller")
        );
    }

    #[tokio::test]
    async fn a_flush_posts_what_is_queued_then_drops_what_comes_later() {
        let (publisher, queue) = Publisher::queue("test", "here", Policy::default(), 8, None);
        for i in 0..3 {
            publisher.publish(notice(EventType::Warning, &format!("pod-{i}")));
        }
        let posted = Arc::new(Mutex::new(Vec::new()));
        let sink = posted.clone();
        let drain = queue.drain(move |event: Event| {
            sink.lock()
                .unwrap()
                .push(event.regarding.unwrap().name.unwrap());
            std::future::ready(())
        });
        // A deadline for the condition, not a measured time.
        let flushed = drain.flush(Duration::from_secs(60)).await;
        assert_eq!(
            flushed,
            Flushed {
                posted: 3,
                unsent: 0
            }
        );
        let mut names = posted.lock().unwrap().clone();
        names.sort();
        assert_eq!(names, ["pod-0", "pod-1", "pod-2"]);
        assert_eq!(
            publisher.publish(notice(EventType::Warning, "late")),
            Outcome::Dropped
        );
    }

    #[tokio::test]
    async fn a_flush_past_its_deadline_says_what_it_did_not_post() {
        let (publisher, queue) = Publisher::queue("test", "here", Policy::default(), 8, None);
        for i in 0..3 {
            publisher.publish(notice(EventType::Warning, &format!("pod-{i}")));
        }
        // An API server that never answers.
        let drain = queue.drain(|_| std::future::pending::<()>());
        let flushed = drain.flush(Duration::ZERO).await;
        assert_eq!(
            flushed,
            Flushed {
                posted: 0,
                unsent: 3
            }
        );
    }

    #[tokio::test]
    async fn a_detached_drain_posts_until_the_publishers_are_gone() {
        let (publisher, queue) = Publisher::queue("test", "here", Policy::default(), 8, None);
        let (done_tx, done_rx) = tokio::sync::mpsc::unbounded_channel();
        let drain = queue.drain(move |event: Event| {
            let _ = done_tx.send(event.regarding.unwrap().name.unwrap());
            std::future::ready(())
        });
        drain.detach();
        publisher.publish(notice(EventType::Warning, "pod-0"));
        drop(publisher);
        let mut done_rx = done_rx;
        assert_eq!(done_rx.recv().await.as_deref(), Some("pod-0"));
        // The task ended with the last publisher: its sink (the sender) is gone.
        assert_eq!(done_rx.recv().await, None);
    }
}
