//! Waiting on a condition with a deadline: the one poll loop of the demo and of every e2e test
//! (the tests call it through [`crate::testkit::wait_for`], which fails the test with the message).

use std::{future::Future, time::Duration};

/// The first pause between two checks; it doubles up to [`MAX_PAUSE`], so a condition that
/// comes true at once is seen at once and a slow one costs the API server little.
const FIRST_PAUSE: Duration = Duration::from_millis(10);

/// The longest pause between two checks.
const MAX_PAUSE: Duration = Duration::from_millis(100);

/// A condition that did not come true before its deadline.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("gave up after {deadline:?} waiting for {what}")]
pub struct TimedOut {
    /// What was awaited.
    pub what: String,
    /// How long it was awaited.
    pub deadline: Duration,
}

/// Polls `check` until it yields a value, or fails with [`TimedOut`] naming `what` once
/// `deadline` has passed.
pub async fn wait_for<T, F, Fut>(
    what: &str,
    deadline: Duration,
    mut check: F,
) -> Result<T, TimedOut>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let until = tokio::time::Instant::now() + deadline;
    let mut pause = FIRST_PAUSE;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if tokio::time::Instant::now() >= until {
            return Err(TimedOut {
                what: what.to_owned(),
                deadline,
            });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

/// Awaits `future`, or fails with [`TimedOut`] naming `what` once `deadline` has passed.
pub async fn within<T>(
    what: &str,
    deadline: Duration,
    future: impl Future<Output = T>,
) -> Result<T, TimedOut> {
    tokio::time::timeout(deadline, future)
        .await
        .map_err(|_| TimedOut {
            what: what.to_owned(),
            deadline,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_condition_that_comes_true_is_returned() {
        let mut n = 0;
        let got = wait_for("n to reach 3", Duration::from_secs(1), || {
            n += 1;
            let v = n;
            async move { (v >= 3).then_some(v) }
        })
        .await;
        assert_eq!(got, Ok(3));
    }

    #[tokio::test]
    async fn a_condition_that_never_comes_true_names_what_was_awaited() {
        let got = wait_for("nothing", Duration::from_millis(50), || async {
            None::<()>
        })
        .await;
        let err = got.expect_err("it never comes true");
        assert_eq!(err.to_string(), "gave up after 50ms waiting for nothing");
    }

    #[tokio::test]
    async fn within_names_the_future_it_gave_up_on() {
        let err = within(
            "forever",
            Duration::from_millis(20),
            std::future::pending::<()>(),
        )
        .await
        .expect_err("it never ends");
        assert_eq!(err.to_string(), "gave up after 20ms waiting for forever");
    }
}
