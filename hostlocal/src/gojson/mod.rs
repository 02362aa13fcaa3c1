//! Go's JSON as host-local reads and writes it: the reader (`read.rs`, ours, for Go's exact
//! decoding rules and error texts) and the writer (`write.rs`, serde_json with Go's formatting),
//! plus Go's `%q` quoting that host-local's error texts use.

mod read;
mod write;

use std::fmt::Write as _;

pub use read::{DecodeError, Decoder, Value, key_matches, parse};
pub use write::{Out, object, to_compact_line, to_indented};

/// Go's `strconv.Quote` (as used by `%q`).
pub fn go_quote(text: &str) -> String {
    let mut s = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\u{7}' => s.push_str("\\a"),
            '\u{8}' => s.push_str("\\b"),
            '\u{c}' => s.push_str("\\f"),
            '\n' => s.push_str("\\n"),
            '\r' => s.push_str("\\r"),
            '\t' => s.push_str("\\t"),
            '\u{b}' => s.push_str("\\v"),
            c if is_go_printable(c) => s.push(c),
            c if u32::from(c) < 0x80 => {
                let _ = write!(s, "\\x{:02x}", u32::from(c));
            }
            c if u32::from(c) < 0x10000 => {
                let _ = write!(s, "\\u{:04x}", u32::from(c));
            }
            c => {
                let _ = write!(s, "\\U{:08x}", u32::from(c));
            }
        }
    }
    s.push('"');
    s
}

/// An approximation of Go's `strconv.IsPrint` (exact for ASCII and Latin-1).
fn is_go_printable(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    if c.is_control() || c.is_whitespace() {
        return false;
    }
    !matches!(u32::from(c), 0xAD | 0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x206F | 0xFEFF | 0xFFF9..=0xFFFB | 0xE000..=0xF8FF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_quote_matches_strconv() {
        assert_eq!(go_quote("IP=foo"), "\"IP=foo\"");
        assert_eq!(
            go_quote("a\"b\\\n\u{1}é\u{a0}"),
            "\"a\\\"b\\\\\\n\\x01é\\u00a0\""
        );
    }
}
