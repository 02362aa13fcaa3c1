//! How long to wait before trying again after consecutive failures: one policy, a first delay
//! doubling up to a cap, for the controller's reconciles and the agent's passes. Pure: the
//! caller counts failures and owns the clock.

use std::time::Duration;

/// A doubling backoff: `first` after the first failure, twice as long after each further one,
/// never longer than `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The wait after the first failure.
    pub first: Duration,
    /// The longest wait.
    pub max: Duration,
}

impl Backoff {
    /// A failed reconcile: 500 ms doubling to a minute, so a failing API server sees no hot loop.
    pub const RECONCILE: Backoff = Backoff {
        first: Duration::from_millis(500),
        max: Duration::from_secs(60),
    };

    /// A failed agent pass (the next try is a full resync): 500 ms doubling to 30 s.
    pub const PASS: Backoff = Backoff {
        first: Duration::from_millis(500),
        max: Duration::from_secs(30),
    };

    /// The wait after the `failures`-th failure in a row (1 for the first; 0 counts as 1).
    pub fn delay(self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.first.saturating_mul(1 << doublings).min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_the_first_delay_up_to_the_cap() {
        let ms = Duration::from_millis;
        let cases = [
            (Backoff::RECONCILE, 0, ms(500)),
            (Backoff::RECONCILE, 1, ms(500)),
            (Backoff::RECONCILE, 2, ms(1_000)),
            (Backoff::RECONCILE, 3, ms(2_000)),
            (Backoff::RECONCILE, 7, ms(32_000)),
            (Backoff::RECONCILE, 8, ms(60_000)),
            (Backoff::RECONCILE, 9, ms(60_000)),
            (Backoff::RECONCILE, u32::MAX, ms(60_000)),
            (Backoff::PASS, 1, ms(500)),
            (Backoff::PASS, 6, ms(16_000)),
            (Backoff::PASS, 7, ms(30_000)),
            (Backoff::PASS, 40, ms(30_000)),
        ];
        for (policy, failures, want) in cases {
            assert_eq!(policy.delay(failures), want, "{policy:?} after {failures}");
        }
    }
}
