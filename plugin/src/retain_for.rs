//! The retention duration grammar (`30m`, `24h`, `7d`) as a library item, for crates that must not
//! depend on the operator (the Docker driver): a positive whole number of at most six digits
//! followed by `s`, `m`, `h` or `d`, at most 366 days — the operator's `retainFor` grammar.

use std::time::Duration;

/// The longest retention accepted: 366 days.
pub const MAX_RETAIN_FOR: Duration = Duration::from_secs(366 * 86_400);

/// Why a retention duration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RetainForError {
    /// The text does not follow the grammar.
    #[error(
        "failed to parse retention {0:?}: expected a positive whole number followed by s, m, h or d (e.g. 30m, 24h, 7d)"
    )]
    Syntax(String),
    /// The duration is longer than [`MAX_RETAIN_FOR`].
    #[error("failed to accept retention {0:?}: the maximum is 366d")]
    TooLong(String),
}

/// Parses `90s`, `30m`, `24h`, `7d`.
pub fn parse(text: &str) -> Result<Duration, RetainForError> {
    let syntax = || RetainForError::Syntax(text.to_owned());
    let (digits, unit) = text
        .split_at_checked(text.len().checked_sub(1).ok_or_else(syntax)?)
        .ok_or_else(syntax)?;
    let unit_secs: u64 = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return Err(syntax()),
    };
    let well_formed = (1..=6).contains(&digits.len())
        && !digits.starts_with('0')
        && digits.bytes().all(|b| b.is_ascii_digit());
    let count: u64 = match well_formed {
        true => digits.parse().map_err(|_| syntax())?,
        false => return Err(syntax()),
    };
    let duration = Duration::from_secs(count.saturating_mul(unit_secs));
    if duration > MAX_RETAIN_FOR {
        return Err(RetainForError::TooLong(text.to_owned()));
    }
    Ok(duration)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn grammar_table() {
        let cases: &[(&str, Option<u64>)] = &[
            ("90s", Some(90)),
            ("30m", Some(1_800)),
            ("24h", Some(86_400)),
            ("7d", Some(604_800)),
            ("366d", Some(366 * 86_400)),
            ("367d", None),
            ("0s", None),
            ("024h", None),
            ("1234567s", None),
            ("-1h", None),
            ("1.5h", None),
            ("h", None),
            ("", None),
            ("24", None),
            ("24H", None),
            ("1hé", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text).ok().map(|d| d.as_secs()), *want, "{text:?}");
        }
        assert_eq!(
            parse("367d").unwrap_err(),
            RetainForError::TooLong("367d".into())
        );
    }
}
