//! Retention, said once: the `retainFor` grammar ([`RetainFor`]) that the
//! `ipkeep.dev/retain-for` annotation, the CRD's `spec.retainFor` (and its validation), the
//! `--default-retain-for` flag and the agent's `--resync-interval` share, and the release-time
//! rule ([`release_time`]) that the controller and the agent share.

use std::time::Duration;

use jiff::Timestamp;

pub use ipkeep_reservation::{RetainFor, RetainForError};

/// A `spec.retainFor` as found: parsed, or refused with its text kept as written (only an API
/// server that does not evaluate the CRD's CEL rules lets one through).
pub type FoundRetainFor = Result<RetainFor, RetainForError>;

/// The text of a `spec.retainFor` as found, to write back unchanged.
pub fn written(found: &FoundRetainFor) -> String {
    match found {
        Ok(retain_for) => retain_for.to_string(),
        Err(e) => e.written().to_owned(),
    }
}

/// The retention a request gets under a maximum: the request, or the maximum when it is longer
/// (kept as written either way, so events and `spec.retainFor` show what each side said).
pub fn held_to(asked: RetainFor, max: RetainFor) -> RetainFor {
    if asked.duration() > max.duration() {
        max
    } else {
        asked
    }
}

/// When a reservation's addresses become free: `releasedAt + retainFor` — for a reservation
/// made by hand that no pod has held yet, `releasedAt` is its `creationTimestamp`. Saturates at
/// the latest instant rather than failing.
pub fn release_time(released_at: Timestamp, retain_for: Duration) -> Timestamp {
    released_at
        .checked_add(retain_for)
        .unwrap_or(Timestamp::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_held_to_the_maximum() {
        let p = |s: &str| RetainFor::parse(s).unwrap();
        let cases = [
            ("30m", "7d", "30m"),
            ("7d", "7d", "7d"),
            ("168h", "7d", "168h"),
            ("8d", "7d", "7d"),
            ("366d", "1h", "1h"),
            ("3601s", "1h", "1h"),
        ];
        for (asked, max, want) in cases {
            assert_eq!(
                held_to(p(asked), p(max)).to_string(),
                want,
                "{asked} under {max}"
            );
        }
    }

    #[test]
    fn release_time_adds_and_saturates() {
        let at = Timestamp::from_second(1_795_262_400).unwrap();
        let cases = [
            (at, Duration::from_secs(1_800), at.as_second() + 1_800),
            (at, Duration::ZERO, at.as_second()),
            (at, Duration::MAX, Timestamp::MAX.as_second()),
        ];
        for (from, retain, want) in cases {
            assert_eq!(
                release_time(from, retain).as_second(),
                want,
                "{from} + {retain:?}"
            );
        }
    }
}
