//! Retention, said once: the `retainFor` grammar ([`RetainFor`]) that the
//! `ipkeep.dev/retain-for` annotation, the CRD's `spec.retainFor` (and its validation), the
//! `--default-retain-for` flag share, and the release-time rule ([`release_time`], the
//! contract's [`effective_release_time`] on jiff's clock) that the controller and the agent share.

use std::time::Duration;

use ipkeep_reservation::{ReleaseTime, effective_release_time};
use jiff::{SignedDuration, Timestamp};

pub use ipkeep_reservation::{Fallback, RetainFor, RetainForError};

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

/// The release-time rule ([`effective_release_time`]) on the operator's clock: `releasedAt` plus
/// the reservation's own `spec.retainFor` as found, held to `max`, or `default` when it has none
/// or a malformed one — for a reservation made by hand that no pod has held yet, `releasedAt` is
/// its `creationTimestamp`. Saturates at the latest instant rather than failing (and reads an
/// instant before the epoch as the epoch).
pub fn release_time(
    released_at: Timestamp,
    own: Option<&FoundRetainFor>,
    default: Duration,
    max: RetainFor,
) -> (Timestamp, Option<Fallback>) {
    let since_epoch = Duration::try_from(released_at.as_duration()).unwrap_or(Duration::ZERO);
    let ReleaseTime { at, fallback } = effective_release_time(since_epoch, own, default, max);
    let at = SignedDuration::try_from(at)
        .ok()
        .and_then(|at| Timestamp::from_duration(at).ok())
        .unwrap_or(Timestamp::MAX);
    (at, fallback)
}

/// The retention itself ([`effective_release_time`] from the epoch): the reservation's own
/// `spec.retainFor` as found, held to `max`, else `default`.
pub fn retention(own: Option<&FoundRetainFor>, default: Duration, max: RetainFor) -> Duration {
    effective_release_time(Duration::ZERO, own, default, max).at
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_time_adds_and_saturates() {
        let at = Timestamp::from_second(1_795_262_400).unwrap();
        let day = Duration::from_secs(86_400);
        let own = |s: &str| Some(RetainFor::parse(s));
        let cases = [
            (at, own("30m"), at.as_second() + 1_800),
            (at, None, at.as_second() + 86_400),
            (at, own("05m"), at.as_second() + 86_400),
            (Timestamp::MAX, own("1s"), Timestamp::MAX.as_second()),
        ];
        for (from, retain, want) in cases {
            let (got, _) = release_time(from, retain.as_ref(), day, RetainFor::MAX);
            assert_eq!(got.as_second(), want, "{from} + {retain:?}");
        }
        for (retain, want) in [(own("30m"), 1_800), (None, 86_400), (own("05m"), 86_400)] {
            let got = retention(retain.as_ref(), day, RetainFor::MAX);
            assert_eq!(got.as_secs(), want, "{retain:?}");
        }
        let nanos = Timestamp::new(1_795_262_400, 5).unwrap();
        let (got, _) = release_time(nanos, None, day, RetainFor::MAX);
        assert_eq!(got, Timestamp::new(1_795_262_400 + 86_400, 5).unwrap());
    }
}
