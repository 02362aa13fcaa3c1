//! The controller's own writes its reservation cache has not shown yet ("expectations", as
//! kube-controller-manager's ReplicaSet and Job controllers call theirs).
//!
//! A reconcile that runs between a write and the watch event carrying it reads the version before
//! the write and plans the same write again: a request that changes nothing (one in a hundred new
//! reservations paid a second status apply this way on the real API server). So after its last
//! write a reconcile records the `resourceVersion` the API server returned; until the watch shows
//! that version, reconciles of the name wait for it (the event enqueues the name again). Versions
//! are only compared for equality, as the API allows. A version the watch never shows (someone
//! changed the object within the same instant, or a relist skipped it) is given up after
//! [`PATIENCE`]: the reconcile then runs on what the cache holds, as it would without this.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use crate::api::PodKey;

/// How long a reconcile waits for the cache to show the controller's own write.
pub const PATIENCE: Duration = Duration::from_secs(5);

/// Above this many names awaited, expired entries are swept when a new one is recorded.
const SWEEP_ABOVE: usize = 4096;

/// Per name, the `resourceVersion` of the controller's last write and when it was made.
#[derive(Debug, Default)]
pub struct Expectations {
    awaited: Mutex<HashMap<PodKey, (String, Instant)>>,
}

impl Expectations {
    /// Records that the controller's write left `key` at `version` at `now`, unless the cache
    /// already shows that version. `cached` reads the cache's version under the lock
    /// [`Expectations::observed`] takes, so the watch cannot slip the version in between.
    pub fn expect(
        &self,
        key: PodKey,
        version: String,
        cached: impl FnOnce() -> Option<String>,
        now: Instant,
    ) {
        let mut awaited = self.awaited.lock().unwrap_or_else(|e| e.into_inner());
        if cached().as_deref() == Some(version.as_str()) {
            awaited.remove(&key);
            return;
        }
        if awaited.len() > SWEEP_ABOVE {
            awaited.retain(|_, (_, at)| now.duration_since(*at) < PATIENCE);
        }
        awaited.insert(key, (version, now));
    }

    /// The watch put `version` of `key` in the cache (`None`: deleted).
    pub fn observed(&self, key: &PodKey, version: Option<&str>) {
        let mut awaited = self.awaited.lock().unwrap_or_else(|e| e.into_inner());
        let seen = match (awaited.get(key), version) {
            (Some((want, _)), Some(v)) => want == v,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if seen {
            awaited.remove(key);
        }
    }

    /// Until when a reconcile of `key` should wait for the cache, if it should.
    pub fn awaited(&self, key: &PodKey, now: Instant) -> Option<Instant> {
        let mut awaited = self.awaited.lock().unwrap_or_else(|e| e.into_inner());
        let until = awaited.get(key).map(|(_, at)| *at + PATIENCE)?;
        if now >= until {
            awaited.remove(key);
            return None;
        }
        Some(until)
    }

    /// Forgets every expectation: a relist replaced the cache with the current state.
    pub fn clear(&self) {
        self.awaited
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> PodKey {
        PodKey::new("ns", "web-0").unwrap()
    }

    #[test]
    fn a_reconcile_waits_for_its_own_write_only_until_the_watch_shows_it() {
        let t0 = Instant::now();
        // (cache's version when recorded, what the watch reports next, awaited afterwards)
        for (cached, watched, still_awaited) in [
            (Some("1"), None::<Option<&str>>, true),
            (Some("1"), Some(Some("1")), true),
            (Some("1"), Some(Some("2")), false),
            (Some("1"), Some(None), false),
            (Some("2"), None, false),
            (None, Some(Some("2")), false),
        ] {
            let e = Expectations::default();
            e.expect(key(), "2".into(), || cached.map(str::to_owned), t0);
            if let Some(version) = watched {
                e.observed(&key(), version);
            }
            assert_eq!(
                e.awaited(&key(), t0).is_some(),
                still_awaited,
                "cache at {cached:?}, the watch then {watched:?}"
            );
        }
    }

    #[test]
    fn a_version_never_seen_is_given_up_after_the_patience() {
        let t0 = Instant::now();
        let e = Expectations::default();
        e.expect(key(), "2".into(), || Some("1".into()), t0);
        assert_eq!(e.awaited(&key(), t0), Some(t0 + PATIENCE));
        assert_eq!(e.awaited(&key(), t0 + PATIENCE), None);
        // Given up means forgotten.
        assert_eq!(e.awaited(&key(), t0), None);
    }

    #[test]
    fn a_relist_forgets_every_expectation() {
        let t0 = Instant::now();
        let e = Expectations::default();
        e.expect(key(), "2".into(), || None, t0);
        e.clear();
        assert_eq!(e.awaited(&key(), t0), None);
    }
}
