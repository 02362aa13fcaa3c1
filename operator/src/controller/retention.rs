//! The retention duration grammar shared by the `ipkeep.dev/retain-for` annotation, the
//! `--default-retain-for` flag and the CRD's `spec.retainFor`: a positive whole number followed by
//! `s`, `m`, `h` or `d`, at most 366 days.

use std::time::Duration;

/// The longest retention accepted: 366 days (the CRD's CEL rule says the same).
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
pub fn parse_retain_for(text: &str) -> Result<Duration, RetainForError> {
    let syntax = || RetainForError::Syntax(text.to_string());
    let unit_at = text.len().checked_sub(1).ok_or_else(syntax)?;
    let (digits, unit) = text.split_at(unit_at);
    let scale: u64 = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return Err(syntax()),
    };
    // Same shape as the CRD's rule: 1 to 6 digits, no leading zero, no sign.
    if digits.is_empty()
        || digits.len() > 6
        || digits.starts_with('0')
        || !digits.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(syntax());
    }
    let value: u64 = digits.parse().map_err(|_| syntax())?;
    let secs = value.checked_mul(scale).ok_or_else(syntax)?;
    let duration = Duration::from_secs(secs);
    if duration > MAX_RETAIN_FOR {
        return Err(RetainForError::TooLong(text.to_string()));
    }
    Ok(duration)
}
