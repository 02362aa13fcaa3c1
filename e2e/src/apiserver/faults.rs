//! Fault injection: what a test can make the server do wrong, on purpose.

use std::{
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use tokio::sync::watch;

use super::store::Store;

/// A request verb, as fault filters name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// GET of one object.
    Get,
    /// GET of a collection.
    List,
    /// GET of a collection with `watch=true`.
    Watch,
    /// POST.
    Create,
    /// PUT.
    Update,
    /// PATCH.
    Patch,
    /// DELETE (one object or a collection).
    Delete,
}

impl Verb {
    /// Parse the lowercase verb name used by the admin endpoint (`list`, `watch`, ...).
    pub fn parse(s: &str) -> Option<Verb> {
        Some(match s.to_ascii_lowercase().as_str() {
            "get" => Verb::Get,
            "list" => Verb::List,
            "watch" => Verb::Watch,
            "create" => Verb::Create,
            "update" => Verb::Update,
            "patch" => Verb::Patch,
            "delete" => Verb::Delete,
            _ => return None,
        })
    }
}

/// Which requests a fault applies to; `None` fields match anything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestFilter {
    /// Only this verb.
    pub verb: Option<Verb>,
    /// Only this resource, by plural name (`pods`, `ipreservations`).
    pub resource: Option<String>,
}

impl RequestFilter {
    fn matches(&self, verb: Verb, resource: &str) -> bool {
        self.verb.is_none_or(|v| v == verb)
            && self.resource.as_deref().is_none_or(|r| r == resource)
    }
}

#[derive(Debug)]
struct PendingFailure {
    left: usize,
    filter: RequestFilter,
    status: u16,
}

#[derive(Debug, Default)]
struct FaultState {
    failures: Vec<PendingFailure>,
    delay: Duration,
}

/// A request to the accept loop: drop the connections, stop listening for `down`, listen again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Restart {
    /// How long the port stays closed.
    pub down: Duration,
    /// The connection asking for it (the admin request), left to finish its reply.
    pub keep: Option<tokio::task::Id>,
}

/// The fault-injection handle of a running server (see [`super::TestServer::faults`]).
#[derive(Debug)]
pub struct Faults {
    state: Mutex<FaultState>,
    store: Arc<Mutex<Store>>,
    restarts: watch::Sender<Option<Restart>>,
}

impl Faults {
    pub(crate) fn new(store: Arc<Mutex<Store>>) -> Self {
        Faults {
            state: Mutex::new(FaultState::default()),
            store,
            restarts: watch::Sender::new(None),
        }
    }

    fn state(&self) -> MutexGuard<'_, FaultState> {
        // A poisoned lock only means a test thread panicked; the data is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// End every open watch stream now (clients see a clean end of stream and re-watch).
    pub fn close_watches(&self) {
        self.store
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .close_watches();
    }

    /// Answer the next `n` requests matching `filter` with `status` (a proper `Status` body;
    /// `Retry-After: 1` for 429) instead of serving them.
    pub fn fail_next(&self, n: usize, filter: RequestFilter, status: u16) {
        if n > 0 {
            self.state().failures.push(PendingFailure {
                left: n,
                filter,
                status,
            });
        }
    }

    /// Delay every response by `d` (`Duration::ZERO` turns it off).
    pub fn set_delay(&self, d: Duration) {
        self.state().delay = d;
    }

    /// Forget the history: every watch resuming from an earlier version gets an in-stream 410 Gone,
    /// and continue tokens from before become invalid.
    pub fn compact(&self) {
        self.store
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .compact();
    }

    /// Restart the server in place: drop every connection (and watch), refuse connections for
    /// `down`, then listen again on the same port; all data is kept. This is what the binary's
    /// `POST /admin/restart` does; in-process tests may also use [`super::TestServer::pause`].
    pub fn restart(&self, down: Duration) {
        self.restart_keeping(down, None);
    }

    /// [`Faults::restart`], sparing one connection (the one whose request asked for it).
    pub(crate) fn restart_keeping(&self, down: Duration, keep: Option<tokio::task::Id>) {
        self.restarts.send_replace(Some(Restart { down, keep }));
    }

    /// Restart requests made from now on (an accept loop waits on this).
    pub(crate) fn restarts(&self) -> watch::Receiver<Option<Restart>> {
        self.restarts.subscribe()
    }

    /// The status to fail this request with, if a pending failure matches (consuming one).
    pub(crate) fn take_failure(&self, verb: Verb, resource: &str) -> Option<u16> {
        let mut state = self.state();
        let idx = state
            .failures
            .iter()
            .position(|f| f.filter.matches(verb, resource))?;
        let failure = &mut state.failures[idx];
        let status = failure.status;
        failure.left -= 1;
        if failure.left == 0 {
            state.failures.remove(idx);
        }
        Some(status)
    }

    /// The current response delay.
    pub(crate) fn delay(&self) -> Duration {
        self.state().delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_consumed_in_order_and_filtered() {
        let f = Faults::new(Arc::new(Mutex::new(Store::new())));
        f.fail_next(
            2,
            RequestFilter {
                verb: Some(Verb::List),
                resource: Some("pods".into()),
            },
            500,
        );
        f.fail_next(1, RequestFilter::default(), 429);
        assert_eq!(f.take_failure(Verb::List, "pods"), Some(500));
        assert_eq!(f.take_failure(Verb::Get, "pods"), Some(429));
        assert_eq!(f.take_failure(Verb::Get, "pods"), None);
        assert_eq!(f.take_failure(Verb::List, "nodes"), None);
        assert_eq!(f.take_failure(Verb::List, "pods"), Some(500));
        assert_eq!(f.take_failure(Verb::List, "pods"), None);
    }

    #[test]
    fn verbs_parse() {
        for (s, v) in [
            ("get", Verb::Get),
            ("LIST", Verb::List),
            ("watch", Verb::Watch),
            ("delete", Verb::Delete),
        ] {
            assert_eq!(Verb::parse(s), Some(v));
        }
        assert_eq!(Verb::parse("frobnicate"), None);
    }
}
