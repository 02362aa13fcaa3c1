//! JSON written exactly as Go's `encoding/json` writes it (host-local's results and errors):
//! serde_json's serializer with Go's indentation and Go's HTML-safe string escaping.

/// A JSON value to print; objects keep their keys in insertion order (the workspace builds
/// serde_json with `preserve_order`), which is Go's struct order when built in that order.
pub type Out = serde_json::Value;

/// An object of `members`, in the order given (Go struct order).
pub fn object(members: Vec<(&str, Out)>) -> Out {
    Out::Object(
        members
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
    )
}

/// Go's `json.MarshalIndent(v, "", "    ")`: no trailing newline.
pub fn to_indented(v: &Out) -> String {
    write_with(v, serde_json::ser::PrettyFormatter::with_indent(b"    "))
}

/// Go's `json.Encoder` output: compact, with a trailing newline.
pub fn to_compact_line(v: &Out) -> String {
    let mut s = write_with(v, serde_json::ser::CompactFormatter);
    s.push('\n');
    s
}

fn write_with<F: serde_json::ser::Formatter>(v: &Out, layout: F) -> String {
    let mut bytes = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut bytes, GoEscaping(layout));
    // Serializing a Value into a Vec cannot fail, and the output is UTF-8 as its strings are.
    let _ = serde::Serialize::serialize(v, &mut ser);
    String::from_utf8(bytes).unwrap_or_default()
}

/// serde_json's layout `F` with Go's `escapeHTML` strings: `<`, `>`, `&`, U+2028 and U+2029 as
/// `\u003c`…, and (Go 1.19) `\b`, `\f` as `\u0008`, `\u000c`.
struct GoEscaping<F>(F);

impl<F: serde_json::ser::Formatter> serde_json::ser::Formatter for GoEscaping<F> {
    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            if matches!(c, '<' | '>' | '&' | '\u{2028}' | '\u{2029}') {
                w.write_all(&fragment.as_bytes()[start..i])?;
                write!(w, "\\u{:04x}", u32::from(c))?;
                start = i + c.len_utf8();
            }
        }
        w.write_all(&fragment.as_bytes()[start..])
    }

    fn write_char_escape<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        escape: serde_json::ser::CharEscape,
    ) -> std::io::Result<()> {
        use serde_json::ser::CharEscape;
        match escape {
            CharEscape::Backspace => w.write_all(b"\\u0008"),
            CharEscape::FormFeed => w.write_all(b"\\u000c"),
            other => self.0.write_char_escape(w, other),
        }
    }

    // The layout is F's.
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.begin_array(w)
    }
    fn end_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_array(w)
    }
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.0.begin_array_value(w, first)
    }
    fn end_array_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_array_value(w)
    }
    fn begin_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.begin_object(w)
    }
    fn end_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_object(w)
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.0.begin_object_key(w, first)
    }
    fn end_object_key<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_object_key(w)
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.begin_object_value(w)
    }
    fn end_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_object_value(w)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn output_matches_go_marshal_indent() {
        let v = object(vec![
            ("cniVersion", "0.3.1".into()),
            (
                "ips",
                Out::Array(vec![object(vec![("address", "10.1.0.2/24".into())])]),
            ),
            ("dns", object(vec![])),
            ("empty", Out::Array(vec![])),
        ]);
        assert_eq!(
            to_indented(&v),
            "{\n    \"cniVersion\": \"0.3.1\",\n    \"ips\": [\n        {\n            \"address\": \"10.1.0.2/24\"\n        }\n    ],\n    \"dns\": {},\n    \"empty\": []\n}"
        );
        assert_eq!(
            to_compact_line(&object(vec![
                ("a", Out::Array(vec!["b".into()])),
                ("n", 11.into())
            ])),
            "{\"a\":[\"b\"],\"n\":11}\n"
        );
        assert_eq!(
            to_compact_line(&"<nil> & \u{8}\u{c}\u{1}\u{2028}\u{2029}\"\\\n\té\u{7f}".into()),
            "\"\\u003cnil\\u003e \\u0026 \\u0008\\u000c\\u0001\\u2028\\u2029\\\"\\\\\\n\\té\u{7f}\"\n"
        );
    }
}
