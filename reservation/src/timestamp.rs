//! An exact instant with nanosecond precision, read and written as the RFC 3339 UTC text that
//! Kubernetes emits (`2026-11-21T12:00:00Z`, optionally with a fraction of a second).
//!
//! The plugin must start in about a millisecond and carries no date/time crate, so the civil
//! calendar arithmetic lives here: proleptic Gregorian calendar, years 0000–9999 (the range RFC 3339
//! can express), no leap seconds (Kubernetes and Go never write `:60`). Measured (issue 27): `jiff`
//! (as the operator uses it, no default features) in its place adds 165 KB (+11 %) to the static
//! plugin and 184 KiB (+15 %) to the peak RSS of an ADD that reads no reservation file (most
//! likely the static-pie binary's start-up relocations touching its larger data).

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

const NANOS_PER_SEC: u32 = 1_000_000_000;
const SECS_PER_DAY: i64 = 86_400;

/// Seconds and nanoseconds since the Unix epoch, UTC; `nanos` is always below one second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    secs: i64,
    nanos: u32,
}

/// Why a text is not an RFC 3339 timestamp.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimestampError {
    /// The text does not have the `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)` shape.
    #[error(
        "failed to parse timestamp {text:?}: expected RFC 3339 like 2026-11-21T12:00:00Z ({what})"
    )]
    Shape {
        /// The text as given.
        text: String,
        /// Which part is wrong.
        what: &'static str,
    },
    /// A field is out of its range (month 13, 31 April, hour 24, …).
    #[error("failed to parse timestamp {text:?}: {field} out of range")]
    Range {
        /// The text as given.
        text: String,
        /// The field that is out of range.
        field: &'static str,
    },
}

impl Timestamp {
    /// The Unix epoch, 1970-01-01T00:00:00Z.
    pub const UNIX_EPOCH: Timestamp = Timestamp { secs: 0, nanos: 0 };

    /// An instant `secs` seconds and `nanos` nanoseconds after the epoch; `None` if `nanos` ≥ 1 s.
    pub const fn new(secs: i64, nanos: u32) -> Option<Self> {
        if nanos < NANOS_PER_SEC {
            Some(Self { secs, nanos })
        } else {
            None
        }
    }

    /// A whole number of seconds since the epoch.
    pub const fn from_unix_secs(secs: i64) -> Self {
        Self { secs, nanos: 0 }
    }

    /// Converts a system clock reading (before the epoch too), saturating at the `i64` limits.
    pub fn from_system_time(time: SystemTime) -> Self {
        match time.duration_since(UNIX_EPOCH) {
            Ok(after) => Self {
                secs: i64::try_from(after.as_secs()).unwrap_or(i64::MAX),
                nanos: after.subsec_nanos(),
            },
            Err(before) => {
                let before = before.duration();
                let secs = i64::try_from(before.as_secs()).unwrap_or(i64::MAX);
                if before.subsec_nanos() == 0 {
                    Self {
                        secs: -secs,
                        nanos: 0,
                    }
                } else {
                    Self {
                        secs: -secs - 1,
                        nanos: NANOS_PER_SEC - before.subsec_nanos(),
                    }
                }
            }
        }
    }

    /// Whole seconds since the epoch (rounded towards the past).
    pub const fn unix_secs(&self) -> i64 {
        self.secs
    }

    /// The nanoseconds past `unix_secs`.
    pub const fn subsec_nanos(&self) -> u32 {
        self.nanos
    }

    /// How long after `earlier` this instant is; zero if it is not after it.
    pub fn saturating_duration_since(&self, earlier: Timestamp) -> Duration {
        if *self <= earlier {
            return Duration::ZERO;
        }
        let (mut secs, mut nanos) = (self.secs.abs_diff(earlier.secs), self.nanos);
        if nanos < earlier.nanos {
            secs -= 1;
            nanos += NANOS_PER_SEC;
        }
        Duration::new(secs, nanos - earlier.nanos)
    }

    /// This instant moved `by` into the future, saturating at the largest representable instant.
    pub fn saturating_add(&self, by: Duration) -> Timestamp {
        let mut nanos = self.nanos + by.subsec_nanos();
        let mut carry = 0;
        if nanos >= NANOS_PER_SEC {
            nanos -= NANOS_PER_SEC;
            carry = 1;
        }
        let add = i64::try_from(by.as_secs()).unwrap_or(i64::MAX);
        match self
            .secs
            .checked_add(add)
            .and_then(|s| s.checked_add(carry))
        {
            Some(secs) => Timestamp { secs, nanos },
            None => Timestamp {
                secs: i64::MAX,
                nanos: NANOS_PER_SEC - 1,
            },
        }
    }

    /// Parses RFC 3339: `YYYY-MM-DDTHH:MM:SS`, an optional `.` and 1–9 fraction digits, then `Z`
    /// or a `±HH:MM` offset (`t`/`z` accepted in lower case, as RFC 3339 allows).
    pub fn parse_rfc3339(text: &str) -> Result<Self, TimestampError> {
        let shape = |what| TimestampError::Shape {
            text: text.to_owned(),
            what,
        };
        let range = |field| TimestampError::Range {
            text: text.to_owned(),
            field,
        };
        let b = text.as_bytes();
        if b.len() < 20 {
            return Err(shape("too short"));
        }
        if b[4] != b'-' || b[7] != b'-' || b[13] != b':' || b[16] != b':' {
            return Err(shape("separators"));
        }
        if b[10] != b'T' && b[10] != b't' {
            return Err(shape("missing T between date and time"));
        }
        let year = digits(&b[0..4]).ok_or_else(|| shape("year"))?;
        let month = digits(&b[5..7]).ok_or_else(|| shape("month"))?;
        let day = digits(&b[8..10]).ok_or_else(|| shape("day"))?;
        let hour = digits(&b[11..13]).ok_or_else(|| shape("hour"))?;
        let minute = digits(&b[14..16]).ok_or_else(|| shape("minute"))?;
        let second = digits(&b[17..19]).ok_or_else(|| shape("second"))?;

        let mut rest = &b[19..];
        let mut nanos = 0u32;
        if let Some((b'.', fraction)) = rest.split_first() {
            let len = fraction.iter().take_while(|c| c.is_ascii_digit()).count();
            if len == 0 {
                return Err(shape("empty fraction"));
            }
            if len > 9 {
                return Err(shape("fraction finer than nanoseconds"));
            }
            let value = digits(&fraction[..len]).ok_or_else(|| shape("fraction"))?;
            nanos = value * 10u32.pow(9 - len as u32);
            rest = &fraction[len..];
        }
        let offset_secs: i64 = match rest {
            [b'Z'] | [b'z'] => 0,
            [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
                let oh = digits(&[*h1, *h2]).ok_or_else(|| shape("offset hour"))?;
                let om = digits(&[*m1, *m2]).ok_or_else(|| shape("offset minute"))?;
                if oh > 23 {
                    return Err(range("offset hour"));
                }
                if om > 59 {
                    return Err(range("offset minute"));
                }
                let magnitude = i64::from(oh * 3600 + om * 60);
                if *sign == b'+' { magnitude } else { -magnitude }
            }
            _ => return Err(shape("time zone must be Z or ±HH:MM")),
        };

        if !(1..=12).contains(&month) {
            return Err(range("month"));
        }
        if day == 0 || day > days_in_month(year, month) {
            return Err(range("day"));
        }
        if hour > 23 {
            return Err(range("hour"));
        }
        if minute > 59 {
            return Err(range("minute"));
        }
        if second > 59 {
            return Err(range("second"));
        }
        let days = days_from_civil(i64::from(year), month, day);
        let secs =
            days * SECS_PER_DAY + i64::from(hour * 3600 + minute * 60 + second) - offset_secs;
        Ok(Timestamp { secs, nanos })
    }

    /// Formats as RFC 3339 in UTC with `Z`; the fraction is written only when non-zero, without
    /// trailing zeros (what Go's `RFC3339Nano` does), so whole seconds look exactly like kube's.
    pub fn to_rfc3339(&self) -> String {
        self.to_string()
    }
}

/// A UTC calendar date and time of day, to the second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CivilTime {
    /// The year (proleptic Gregorian).
    pub year: i64,
    /// The month, 1–12.
    pub month: u32,
    /// The day of the month, 1–31.
    pub day: u32,
    /// The hour, 0–23.
    pub hour: i64,
    /// The minute, 0–59.
    pub minute: i64,
    /// The second, 0–59.
    pub second: i64,
}

impl Timestamp {
    /// The UTC calendar date and time of day of this instant (the fraction dropped).
    pub fn civil_utc(&self) -> CivilTime {
        let days = self.secs.div_euclid(SECS_PER_DAY);
        let of_day = self.secs.rem_euclid(SECS_PER_DAY);
        let (year, month, day) = civil_from_days(days);
        CivilTime {
            year,
            month,
            day,
            hour: of_day / 3600,
            minute: of_day / 60 % 60,
            second: of_day % 60,
        }
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let CivilTime {
            year,
            month,
            day,
            hour,
            minute,
            second,
        } = self.civil_utc();
        write!(
            f,
            "{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}"
        )?;
        if self.nanos != 0 {
            let mut fraction = format!("{:09}", self.nanos);
            while fraction.ends_with('0') {
                fraction.pop();
            }
            write!(f, ".{fraction}")?;
        }
        f.write_str("Z")
    }
}

impl From<SystemTime> for Timestamp {
    fn from(time: SystemTime) -> Self {
        Self::from_system_time(time)
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Timestamp::parse_rfc3339(&text).map_err(serde::de::Error::custom)
    }
}

/// The value of a run of ASCII digits, `None` if any byte is not a digit.
fn digits(bytes: &[u8]) -> Option<u32> {
    bytes.iter().try_fold(0u32, |acc, &c| {
        c.is_ascii_digit().then(|| acc * 10 + u32::from(c - b'0'))
    })
}

fn is_leap(year: u32) -> bool {
    year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400))
}

fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a civil date. The year is counted from March so that the leap day
/// falls at the end, which makes the day-of-year a linear formula of the month; whole 400-year
/// cycles (146 097 days) handle the century rules.
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let cycle = year.div_euclid(400);
    let year_of_cycle = year.rem_euclid(400);
    let month_from_march = i64::from((month + 9) % 12);
    let day_of_year = (153 * month_from_march + 2) / 5 + i64::from(day) - 1;
    let day_of_cycle = year_of_cycle * 365 + year_of_cycle / 4 - year_of_cycle / 100 + day_of_year;
    // 719 468 days separate 0000-03-01 (the start of cycle 0) from 1970-01-01.
    cycle * 146_097 + day_of_cycle - 719_468
}

/// The inverse of [`days_from_civil`].
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let days = days + 719_468;
    let cycle = days.div_euclid(146_097);
    let day_of_cycle = days.rem_euclid(146_097);
    let year_of_cycle =
        (day_of_cycle - day_of_cycle / 1460 + day_of_cycle / 36_524 - day_of_cycle / 146_096) / 365;
    let day_of_year =
        day_of_cycle - (365 * year_of_cycle + year_of_cycle / 4 - year_of_cycle / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_cycle + cycle * 400 + i64::from(month <= 2);
    // Both fit by construction: the month is 1..=12 and the day 1..=31.
    (year, month as u32, day as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_known_instants() {
        let cases: &[(&str, i64, u32)] = &[
            ("1970-01-01T00:00:00Z", 0, 0),
            ("1969-12-31T23:59:59Z", -1, 0),
            ("2026-11-21T12:00:00Z", 1_795_262_400, 0),
            ("2000-03-01T00:00:00Z", 951_868_800, 0),
            ("2024-02-29T23:59:59Z", 1_709_251_199, 0),
            ("0000-01-01T00:00:00Z", -62_167_219_200, 0),
            ("9999-12-31T23:59:59Z", 253_402_300_799, 0),
            ("2026-11-21T12:00:00.5Z", 1_795_262_400, 500_000_000),
            ("2026-11-21T12:00:00.000000001Z", 1_795_262_400, 1),
            ("2026-11-21T12:00:00.123456789Z", 1_795_262_400, 123_456_789),
            ("2026-11-21t12:00:00z", 1_795_262_400, 0),
            ("2026-11-21T13:30:00+01:30", 1_795_262_400, 0),
            ("2026-11-21T10:00:00-02:00", 1_795_262_400, 0),
            ("1969-12-31T23:59:59.75Z", -1, 750_000_000),
        ];
        for &(text, secs, nanos) in cases {
            let got = Timestamp::parse_rfc3339(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(
                (got.unix_secs(), got.subsec_nanos()),
                (secs, nanos),
                "{text}"
            );
        }
    }

    #[test]
    fn rejects_malformed_and_out_of_range() {
        let cases: &[(&str, &str)] = &[
            ("", "too short"),
            ("2026-11-21", "too short"),
            ("2026-11-21 12:00:00Z", "missing T"),
            ("2026/11/21T12:00:00Z", "separators"),
            ("2026-11-21T12:00:00", "too short"),
            ("2026-11-21T12:00:00.Z", "empty fraction"),
            ("2026-11-21T12:00:00.1234567891Z", "finer than nanoseconds"),
            ("2026-11-21T12:00:00+0100", "time zone"),
            ("2026-11-21T12:00:00Zjunk", "time zone"),
            ("2026-11-21T12:00:00UTC", "time zone"),
            ("20a6-11-21T12:00:00Z", "year"),
            ("+2026-11-21T12:00:00Z", "separators"),
            ("2026-13-01T00:00:00Z", "month out of range"),
            ("2026-00-01T00:00:00Z", "month out of range"),
            ("2026-04-31T00:00:00Z", "day out of range"),
            ("2023-02-29T00:00:00Z", "day out of range"),
            ("1900-02-29T00:00:00Z", "day out of range"),
            ("2026-11-00T00:00:00Z", "day out of range"),
            ("2026-11-21T24:00:00Z", "hour out of range"),
            ("2026-11-21T12:60:00Z", "minute out of range"),
            ("2026-12-31T23:59:60Z", "second out of range"),
            ("2026-11-21T12:00:00+24:00", "offset hour out of range"),
            ("2026-11-21T12:00:00+01:60", "offset minute out of range"),
            ("2026-11-21T12:00:00-01:-1", "offset minute"),
        ];
        for &(text, expect) in cases {
            let err = Timestamp::parse_rfc3339(text)
                .err()
                .unwrap_or_else(|| panic!("{text:?} parsed"));
            let msg = err.to_string();
            assert!(msg.contains(expect), "{text:?}: {msg}");
            assert!(msg.starts_with("failed to parse timestamp"), "{msg}");
        }
    }

    #[test]
    fn leap_years_follow_the_gregorian_rules() {
        for (year, leap) in [
            (2000, true),
            (1900, false),
            (2024, true),
            (2023, false),
            (2400, true),
        ] {
            let text = format!("{year:04}-02-29T00:00:00Z");
            assert_eq!(Timestamp::parse_rfc3339(&text).is_ok(), leap, "{text}");
        }
    }

    #[test]
    fn formats_like_kubernetes_and_round_trips() {
        let cases: &[(i64, u32, &str)] = &[
            (0, 0, "1970-01-01T00:00:00Z"),
            (1_795_262_400, 0, "2026-11-21T12:00:00Z"),
            (1_795_262_400, 500_000_000, "2026-11-21T12:00:00.5Z"),
            (1_795_262_400, 120_000, "2026-11-21T12:00:00.00012Z"),
            (-1, 999_999_999, "1969-12-31T23:59:59.999999999Z"),
            (253_402_300_799, 0, "9999-12-31T23:59:59Z"),
            (-62_167_219_200, 0, "0000-01-01T00:00:00Z"),
        ];
        for &(secs, nanos, text) in cases {
            let ts = Timestamp::new(secs, nanos).unwrap();
            assert_eq!(ts.to_rfc3339(), text);
            assert_eq!(Timestamp::parse_rfc3339(text).unwrap(), ts);
        }
    }

    #[test]
    fn every_day_of_the_supported_range_round_trips() {
        // One instant every 13 days (at a varying second of the day) from year 0 to 9999.
        let first = days_from_civil(0, 1, 1);
        let last = days_from_civil(9999, 12, 31);
        let mut previous = None;
        for day in (first..=last).step_by(13) {
            let secs = day * SECS_PER_DAY + (day.rem_euclid(SECS_PER_DAY));
            let ts = Timestamp::from_unix_secs(secs);
            let text = ts.to_rfc3339();
            assert_eq!(Timestamp::parse_rfc3339(&text).unwrap(), ts, "{text}");
            let date = text[..10].to_owned();
            assert_ne!(
                previous.as_ref(),
                Some(&date),
                "two days formatted as {date}"
            );
            previous = Some(date);
        }
    }

    #[test]
    fn system_time_conversion_handles_both_sides_of_the_epoch() {
        let after = UNIX_EPOCH + Duration::new(1_795_262_400, 7);
        assert_eq!(
            Timestamp::from_system_time(after),
            Timestamp::new(1_795_262_400, 7).unwrap()
        );
        let before = UNIX_EPOCH - Duration::new(1, 250_000_000);
        assert_eq!(
            Timestamp::from_system_time(before),
            Timestamp::new(-2, 750_000_000).unwrap()
        );
        assert_eq!(
            Timestamp::from_system_time(UNIX_EPOCH),
            Timestamp::UNIX_EPOCH
        );
    }

    #[test]
    fn durations_between_instants() {
        let a = Timestamp::new(10, 900_000_000).unwrap();
        let b = Timestamp::new(12, 100_000_000).unwrap();
        assert_eq!(b.saturating_duration_since(a), Duration::from_millis(1200));
        assert_eq!(a.saturating_duration_since(b), Duration::ZERO);
        assert_eq!(a.saturating_add(Duration::from_millis(1200)), b);
        assert_eq!(
            Timestamp::new(i64::MAX, 0)
                .unwrap()
                .saturating_add(Duration::from_secs(5)),
            Timestamp::new(i64::MAX, 999_999_999).unwrap()
        );
        assert!(Timestamp::new(0, NANOS_PER_SEC).is_none());
    }

    #[test]
    fn serde_uses_the_rfc3339_text() {
        let ts = Timestamp::from_unix_secs(1_795_262_400);
        assert_eq!(
            serde_json::to_string(&ts).unwrap(),
            "\"2026-11-21T12:00:00Z\""
        );
        let back: Timestamp = serde_json::from_str("\"2026-11-21T12:00:00Z\"").unwrap();
        assert_eq!(back, ts);
        let err = serde_json::from_str::<Timestamp>("\"tomorrow\"").unwrap_err();
        assert!(
            err.to_string().contains("failed to parse timestamp"),
            "{err}"
        );
    }
}
