//! The retention grammar, said once for every part of ipkeep: a positive whole number of
//! seconds, minutes, hours or days (`90s`, `30m`, `24h`, `7d`), at most 366 days. The operator's
//! `ipkeep.dev/retain-for` annotation, the CRD's `spec.retainFor` (its OpenAPI pattern and CEL cap
//! are generated from [`RetainFor`]), the operator's flags and the Docker driver's
//! `ipkeep.dev/retain-for` network option all parse with [`RetainFor::parse`].

use std::{fmt, str::FromStr, time::Duration};

/// A retention as written: a positive whole number of seconds, minutes, hours or days (`90s`,
/// `30m`, `24h`, `7d`), at most [`RetainFor::MAX`]. Displays exactly as it was written, so a
/// value read from an annotation is written to `spec.retainFor` unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RetainFor {
    count: u32,
    unit: Unit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Unit {
    Seconds,
    Minutes,
    Hours,
    Days,
}

impl Unit {
    const ALL: [Unit; 4] = [Unit::Seconds, Unit::Minutes, Unit::Hours, Unit::Days];

    fn suffix(self) -> char {
        match self {
            Unit::Seconds => 's',
            Unit::Minutes => 'm',
            Unit::Hours => 'h',
            Unit::Days => 'd',
        }
    }

    fn seconds(self) -> u64 {
        match self {
            Unit::Seconds => 1,
            Unit::Minutes => 60,
            Unit::Hours => 3_600,
            Unit::Days => 86_400,
        }
    }
}

/// Why a retention was refused; each variant keeps the text as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RetainForError {
    /// The text does not follow the grammar.
    #[error(
        "failed to parse retention {0:?}: expected a positive whole number followed by s, m, h or d (e.g. 30m, 24h, 7d)"
    )]
    Syntax(String),
    /// The duration is longer than [`RetainFor::MAX`].
    #[error("failed to accept retention {0:?}: the maximum is {max}", max = RetainFor::MAX)]
    TooLong(String),
}

impl RetainForError {
    /// The refused text, as written.
    pub fn written(&self) -> &str {
        match self {
            RetainForError::Syntax(text) | RetainForError::TooLong(text) => text,
        }
    }
}

impl RetainFor {
    /// The longest retention accepted: 366 days.
    pub const MAX: RetainFor = RetainFor {
        count: 366,
        unit: Unit::Days,
    };

    /// The grammar as a regular expression (the CRD's OpenAPI `pattern`): 1 to 6 digits without a
    /// leading zero, then the unit.
    pub const PATTERN: &str = "^[1-9][0-9]{0,5}(s|m|h|d)$";

    /// Parses `90s`, `30m`, `24h`, `7d`.
    pub fn parse(text: &str) -> Result<RetainFor, RetainForError> {
        let syntax = || RetainForError::Syntax(text.to_string());
        let (digits, suffix) = text
            .char_indices()
            .last()
            .map(|(at, _)| text.split_at(at))
            .ok_or_else(syntax)?;
        let unit = Unit::ALL
            .into_iter()
            .find(|u| suffix.len() == 1 && suffix.starts_with(u.suffix()))
            .ok_or_else(syntax)?;
        if digits.is_empty()
            || digits.len() > 6
            || digits.starts_with('0')
            || !digits.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(syntax());
        }
        let count: u32 = digits.parse().map_err(|_| syntax())?;
        let parsed = RetainFor { count, unit };
        if parsed.duration() > RetainFor::MAX.duration() {
            return Err(RetainForError::TooLong(text.to_string()));
        }
        Ok(parsed)
    }

    /// How long this is.
    pub fn duration(self) -> Duration {
        Duration::from_secs(u64::from(self.count) * self.unit.seconds())
    }

    /// This retention under a maximum: itself, or `max` when it is longer (kept as written
    /// either way, so events and `spec.retainFor` show what each side said).
    pub fn held_to(self, max: RetainFor) -> RetainFor {
        if self.duration() > max.duration() {
            max
        } else {
            self
        }
    }

    /// The CEL expression that caps a value matching [`RetainFor::PATTERN`] at
    /// [`RetainFor::MAX`] (the pattern cannot do arithmetic).
    pub fn cel_cap() -> String {
        let seconds_of_unit = Unit::ALL[1..]
            .iter()
            .rev()
            .map(|u| format!("self.endsWith('{}') ? {} : ", u.suffix(), u.seconds()))
            .collect::<String>();
        format!(
            "!self.matches('{pattern}') || int(self.substring(0, self.size() - 1)) * ({seconds_of_unit}1) <= {max}",
            pattern = RetainFor::PATTERN,
            max = RetainFor::MAX.duration().as_secs(),
        )
    }
}

/// Why [`effective_release_time`] did not use a reservation's own retention as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fallback {
    /// Its own retention does not follow the grammar (only an API server that skips the CRD's
    /// validation lets one through): the default applied.
    Malformed(RetainForError),
    /// Its own retention is longer than the maximum: the maximum applied.
    Capped {
        /// The retention as given.
        asked: RetainFor,
        /// The retention applied.
        held: RetainFor,
    },
}

/// When a reservation's addresses become free, and whether its own retention was set aside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseTime {
    /// The instant, as time since the Unix epoch; saturates at [`Duration::MAX`] rather than
    /// failing.
    pub at: Duration,
    /// Set when the reservation's own retention was not used as given, so the caller can warn.
    pub fallback: Option<Fallback>,
}

/// The one release-time rule of ipkeep (the controller's `status.releaseTime`, the agent's file
/// before the controller has written one, the Docker driver's retained names): `released_at`
/// plus the reservation's own retention (`own`, as found: unset, parsed, or refused), held to
/// `max`; a malformed one is replaced by `default` — never refused, so a reservation is never
/// dropped over a value that only a non-validating API server lets through — and reported in
/// [`ReleaseTime::fallback`].
pub fn effective_release_time(
    released_at: Duration,
    own: Option<&Result<RetainFor, RetainForError>>,
    default: Duration,
    max: RetainFor,
) -> ReleaseTime {
    let (retain, fallback) = match own {
        None => (default, None),
        Some(Err(e)) => (default, Some(Fallback::Malformed(e.clone()))),
        Some(Ok(asked)) => {
            let held = asked.held_to(max);
            let capped = (held != *asked).then_some(Fallback::Capped {
                asked: *asked,
                held,
            });
            (held.duration(), capped)
        }
    };
    ReleaseTime {
        at: released_at.checked_add(retain).unwrap_or(Duration::MAX),
        fallback,
    }
}

impl fmt::Display for RetainFor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.count, self.unit.suffix())
    }
}

impl FromStr for RetainFor {
    type Err = RetainForError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        RetainFor::parse(text)
    }
}

#[cfg(test)]
#[allow(clippy::panic)]
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
                p(asked).held_to(p(max)).to_string(),
                want,
                "{asked} under {max}"
            );
        }
    }

    #[test]
    fn grammar() {
        let cases: &[(&str, Result<u64, &str>)] = &[
            ("90s", Ok(90)),
            ("1s", Ok(1)),
            ("30m", Ok(1_800)),
            ("24h", Ok(86_400)),
            ("7d", Ok(604_800)),
            ("366d", Ok(31_622_400)),
            ("999999s", Ok(999_999)),
            ("367d", Err("maximum is 366d")),
            ("8785h", Err("maximum is 366d")),
            ("1000000s", Err("positive whole number")),
            ("0s", Err("positive whole number")),
            ("05m", Err("positive whole number")),
            ("-1h", Err("positive whole number")),
            ("+1h", Err("positive whole number")),
            ("1.5h", Err("positive whole number")),
            ("1w", Err("positive whole number")),
            ("h", Err("positive whole number")),
            ("", Err("positive whole number")),
            ("24H", Err("positive whole number")),
            (" 1h", Err("positive whole number")),
            ("1hé", Err("positive whole number")),
            ("é", Err("positive whole number")),
        ];
        for (text, want) in cases {
            match (RetainFor::parse(text), want) {
                (Ok(got), Ok(secs)) => {
                    assert_eq!(got.duration().as_secs(), *secs, "{text:?}");
                    assert_eq!(got.to_string(), *text, "{text:?} displays as written");
                }
                (Err(e), Err(says)) => {
                    assert!(e.to_string().contains(says), "{text:?}: {e}");
                    assert_eq!(e.written(), *text);
                }
                (got, _) => panic!("{text:?}: got {got:?}, wanted {want:?}"),
            }
        }
    }

    /// What was asked, its own retention as found, the maximum, the release second wanted and
    /// the fallback wanted.
    type Case = (
        &'static str,
        Option<Result<RetainFor, RetainForError>>,
        RetainFor,
        u64,
        Option<Fallback>,
    );

    #[test]
    fn effective_release_time_rules() {
        let p = |s: &str| RetainFor::parse(s);
        let at = Duration::from_secs(1_000);
        let day = Duration::from_secs(86_400);
        let week = p("7d").unwrap();
        let cases: &[Case] = &[
            (
                "none of its own: the default",
                None,
                week,
                1_000 + 86_400,
                None,
            ),
            ("its own", Some(p("30m")), week, 1_000 + 1_800, None),
            (
                "its own, at the maximum",
                Some(p("168h")),
                week,
                1_000 + 604_800,
                None,
            ),
            (
                "longer than the maximum: the maximum",
                Some(p("8d")),
                week,
                1_000 + 604_800,
                Some(Fallback::Capped {
                    asked: p("8d").unwrap(),
                    held: week,
                }),
            ),
            (
                "malformed: the default, reported",
                Some(p("05m")),
                week,
                1_000 + 86_400,
                Some(Fallback::Malformed(RetainForError::Syntax("05m".into()))),
            ),
            (
                "too long for the grammar: the default, reported",
                Some(p("367d")),
                RetainFor::MAX,
                1_000 + 86_400,
                Some(Fallback::Malformed(RetainForError::TooLong("367d".into()))),
            ),
        ];
        for (what, own, max, want_at, want_fallback) in cases {
            let got = effective_release_time(at, own.as_ref(), day, *max);
            assert_eq!(got.at, Duration::from_secs(*want_at), "{what}");
            assert_eq!(&got.fallback, want_fallback, "{what}");
        }
        let end = effective_release_time(Duration::MAX, None, day, week);
        assert_eq!(end.at, Duration::MAX, "saturates");
    }

    #[test]
    fn the_cel_cap_says_what_the_parser_says() {
        assert_eq!(
            RetainFor::cel_cap(),
            "!self.matches('^[1-9][0-9]{0,5}(s|m|h|d)$') || int(self.substring(0, self.size() - 1)) * (self.endsWith('d') ? 86400 : self.endsWith('h') ? 3600 : self.endsWith('m') ? 60 : 1) <= 31622400"
        );
        assert_eq!(RetainFor::MAX.to_string(), "366d");
    }
}
