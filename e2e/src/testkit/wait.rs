//! Waiting in a test: the library's one poll loop ([`crate::wait`]) with the tests' deadline,
//! failing the test with what it waited for.

use std::{future::Future, time::Duration};

/// How long a test waits for one condition before it fails, naming the condition.
pub const DEADLINE: Duration = Duration::from_secs(120);

/// Polls `check` until it yields a value; fails the test after [`DEADLINE`] saying `what` it
/// waited for.
pub async fn wait_for<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    crate::wait::wait_for(what, DEADLINE, check)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Awaits `future`; fails the test after [`DEADLINE`] saying `what` it waited for.
pub async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    crate::wait::within(what, DEADLINE, future)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}
