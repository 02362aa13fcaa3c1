//! The controller's queue and workers, in kube-runtime's shape: a scheduler in front holds each
//! key until it is due (a key scheduled once, at its earliest instant), the [`WorkQueue`] behind
//! it hands due keys to whichever worker is free and never one being reconciled, and a failed
//! reconcile is tried again after the delay its error policy names.

use std::{
    collections::HashMap,
    fmt::Display,
    future::Future,
    hash::Hash,
    sync::{Arc, Mutex, MutexGuard, RwLock},
    time::Duration,
};

use futures::{StreamExt, channel::mpsc};
use kube::runtime::scheduler::{ScheduleRequest, scheduler};
use tokio::{sync::Notify, time::Instant};
use tracing::Instrument;

use super::workqueue::WorkQueue;

/// The queue's front: one scheduler (keys and the instant each is due), fed only while [`work`]
/// runs (on the controller, while this replica leads); before and after, enqueueing does nothing.
#[derive(Debug)]
pub struct Queue<K> {
    scheduler: RwLock<Option<mpsc::UnboundedSender<ScheduleRequest<Arc<K>>>>>,
}

impl<K> Default for Queue<K> {
    fn default() -> Self {
        Queue {
            scheduler: RwLock::new(None),
        }
    }
}

impl<K> Queue<K> {
    /// Schedules `key` (one allocation of it, shared by the scheduler's two entries and the work
    /// queue's: at start-up every key is queued at once).
    pub fn enqueue_at(&self, key: impl Into<Arc<K>>, run_at: Instant) {
        let scheduler = self.scheduler.read().unwrap_or_else(|e| e.into_inner());
        if let Some(scheduler) = scheduler.as_ref() {
            // A closed scheduler means the process is stopping; nothing is lost that a restart
            // does not redo.
            let _ = scheduler.unbounded_send(ScheduleRequest {
                message: key.into(),
                run_at,
            });
        }
    }

    /// Schedules `key` now.
    pub fn enqueue(&self, key: impl Into<Arc<K>>) {
        self.enqueue_at(key, Instant::now());
    }

    /// Whether [`work`] runs (enqueueing does something).
    pub fn active(&self) -> bool {
        self.scheduler
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// No reconcile may start from here on.
    pub fn close(&self) {
        *self.scheduler.write().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// Opens `queue`, calls `seed` (which enqueues every key known so far), and runs `workers`
/// workers until dropped: each takes a due key, runs `reconcile` on it inside a `reconcile` span
/// naming the key, and schedules it again after the delay `reconcile` returned (`None`: only
/// when something enqueues it) or, on an error, after the delay `error_policy` names for the
/// key's consecutive failures.
pub async fn work<K, E, R, Fut, P>(
    queue: &Queue<K>,
    workers: usize,
    seed: impl FnOnce(),
    reconcile: R,
    error_policy: P,
) where
    K: Hash + Eq + Clone + Display,
    R: Fn(Arc<K>) -> Fut,
    Fut: Future<Output = Result<Option<Duration>, E>>,
    P: Fn(&K, &E, u32) -> Duration,
{
    let (tx, rx) = mpsc::unbounded();
    *queue.scheduler.write().unwrap_or_else(|e| e.into_inner()) = Some(tx);
    seed();
    let ready = Ready::default();
    let feed = async {
        let mut due = std::pin::pin!(scheduler(rx));
        while let Some(key) = due.next().await {
            ready.add(key);
        }
    };
    let failures = Mutex::new(HashMap::new());
    let workers =
        (0..workers.max(1)).map(|_| worker(&ready, &failures, queue, &reconcile, &error_policy));
    futures::future::join(feed, futures::future::join_all(workers)).await;
}

async fn worker<K, E, R, Fut, P>(
    ready: &Ready<K>,
    failures: &Mutex<HashMap<K, u32>>,
    queue: &Queue<K>,
    reconcile: &R,
    error_policy: &P,
) where
    K: Hash + Eq + Clone + Display,
    R: Fn(Arc<K>) -> Fut,
    Fut: Future<Output = Result<Option<Duration>, E>>,
    P: Fn(&K, &E, u32) -> Duration,
{
    loop {
        let key = ready.take().await;
        let span = tracing::info_span!("reconcile", key = %key);
        let result = reconcile(key.clone()).instrument(span.clone()).await;
        let mut failed = failures.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Ok(again) => {
                failed.remove(&*key);
                if let Some(after) = again {
                    queue.enqueue_at(key.clone(), Instant::now() + after);
                }
            }
            Err(e) => {
                let n = failed.entry(K::clone(&key)).or_insert(0);
                *n = n.saturating_add(1);
                let delay = span.in_scope(|| error_policy(&key, &e, *n));
                queue.enqueue_at(key.clone(), Instant::now() + delay);
            }
        }
        drop(failed);
        ready.done(&key);
    }
}

/// The [`WorkQueue`] the workers share, and the wake-up of an idle one.
#[derive(Debug)]
struct Ready<K> {
    keys: Mutex<WorkQueue<Arc<K>>>,
    added: Notify,
}

impl<K> Default for Ready<K> {
    fn default() -> Self {
        Ready {
            keys: Mutex::new(WorkQueue::default()),
            added: Notify::new(),
        }
    }
}

impl<K: Hash + Eq> Ready<K> {
    fn keys(&self) -> MutexGuard<'_, WorkQueue<Arc<K>>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add(&self, key: Arc<K>) {
        if self.keys().add(key) {
            self.added.notify_one();
        }
    }

    /// The next key no other worker is reconciling; waits for one.
    async fn take(&self) -> Arc<K> {
        loop {
            if let Some(key) = self.keys().take() {
                return key;
            }
            // A key added since the look above left a permit: this returns at once.
            self.added.notified().await;
        }
    }

    fn done(&self, key: &Arc<K>) {
        if self.keys().done(key) {
            self.added.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[test]
    fn enqueueing_does_nothing_while_no_work_runs() {
        let queue = Queue::<String>::default();
        assert!(!queue.active());
        queue.enqueue("a".to_owned());
        queue.close();
        assert!(!queue.active());
    }

    /// A key that fails twice runs again after each delay the error policy names, told its
    /// failures in a row (1, then 2); a success clears them and, asking for no requeue, ends it.
    #[tokio::test]
    async fn a_failed_reconcile_runs_again_after_the_error_policys_delay() {
        let queue = Queue::<String>::default();
        let runs = AtomicU32::new(0);
        let told = Mutex::new(Vec::new());
        let work = work(
            &queue,
            2,
            || queue.enqueue("a".to_owned()),
            |_key| {
                let n = runs.fetch_add(1, Ordering::SeqCst);
                async move { if n < 2 { Err("failed") } else { Ok(None) } }
            },
            |key: &String, e: &&str, failures| {
                told.lock().unwrap().push((key.clone(), *e, failures));
                Duration::from_millis(5)
            },
        );
        let settled = async {
            while runs.load(Ordering::SeqCst) < 3 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // Long enough for a fourth run, were one scheduled.
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        tokio::time::timeout(Duration::from_secs(10), async {
            tokio::select! {
                () = work => panic!("work ended on its own"),
                () = settled => {}
            }
        })
        .await
        .expect("three runs within 10 s");
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        let want = vec![("a".to_owned(), "failed", 1), ("a".to_owned(), "failed", 2)];
        assert_eq!(*told.lock().unwrap(), want);
    }
}
