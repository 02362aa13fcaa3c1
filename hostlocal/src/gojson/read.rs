//! JSON exactly as Go's `encoding/json` reads it, because host-local's error messages are
//! produced by it and ipkeep must print the same bytes.
//!
//! A syntax check with Go's scanner and its error texts (`invalid character 'x' after
//! top-level value`, `unexpected end of JSON input`), then a [`Value`] tree that keeps duplicate
//! keys in order, then typed decoding through a [`Decoder`] that reproduces Go's rules: keys match
//! fields case-insensitively, later duplicates are decoded into the same field (merging objects and
//! slices element by element), unknown keys are ignored, `null` leaves most fields alone, and a
//! type mismatch yields Go's `json: cannot unmarshal <kind> into Go struct field <S>.<path> of type
//! <T>` — the first such error is kept while decoding continues, whereas errors raised by custom
//! unmarshalers (addresses, subnets, routes) stop decoding at once, as in Go.

use super::go_quote;

/// Go's maximum nesting depth (`encoding/json` `maxNestingDepth`).
const MAX_DEPTH: usize = 10_000;

/// A parsed JSON value; objects keep every key, duplicates included, in document order.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `null`
    Null,
    /// `true` / `false`
    Bool(bool),
    /// A number, as written.
    Number(String),
    /// A string, unescaped (invalid UTF-8 and lone surrogates become U+FFFD, as in Go).
    String(String),
    /// An array.
    Array(Vec<Value>),
    /// An object's members in document order.
    Object(Vec<(String, Value)>),
}

impl Value {
    /// Go's name for this kind of JSON value in type errors.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "bool",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        }
    }
}

/// A JSON decoding error, formatted like Go's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Go's `*json.SyntaxError` (or `unexpected end of JSON input`).
    #[error("{0}")]
    Syntax(String),
    /// Go's `*json.UnmarshalTypeError`.
    #[error("{}", type_error_text(value, go_type, context.as_ref()))]
    Type {
        /// The JSON kind found (`number`, `string`, …).
        value: &'static str,
        /// The Go type expected.
        go_type: String,
        /// The struct type name and field path, when inside a struct.
        context: Option<(String, String)>,
    },
    /// An error returned by a custom unmarshaler, e.g. `invalid CIDR address: x`.
    #[error("{0}")]
    Custom(String),
}

fn type_error_text(value: &str, go_type: &str, context: Option<&(String, String)>) -> String {
    match context {
        Some((st, field)) => {
            format!(
                "json: cannot unmarshal {value} into Go struct field {st}.{field} of type {go_type}"
            )
        }
        None => format!("json: cannot unmarshal {value} into Go value of type {go_type}"),
    }
}

/// Parses `input` like Go's `json.Unmarshal` does before decoding (full syntax check first).
pub fn parse(input: &[u8]) -> Result<Value, DecodeError> {
    check_valid(input)?;
    let mut builder = Builder { input, pos: 0 };
    Ok(builder.value())
}

// ---------------------------------------------------------------------------------------------
// Go's scanner, reduced to what produces its error messages.

#[derive(Clone, Copy, PartialEq, Eq)]
enum Scan {
    BeginValue,
    BeginValueOrEmpty,
    BeginStringOrEmpty,
    BeginString,
    EndValue,
    EndTop,
    InString,
    InStringEsc,
    InStringEscU(u8),
    Neg,
    One,
    Zero,
    Dot,
    Dot0,
    E,
    ESign,
    E0,
    Literal(&'static [u8], usize, &'static str),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Parse {
    ObjectKey,
    ObjectValue,
    ArrayValue,
}

fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\r' | b'\n')
}

/// Go's `quoteChar`: how a byte is shown in a syntax error.
fn quote_char(c: u8) -> String {
    match c {
        b'\'' => r"'\''".to_owned(),
        b'"' => "'\"'".to_owned(),
        _ => {
            let q = go_quote(&char::from(c).to_string());
            format!("'{}'", &q[1..q.len() - 1])
        }
    }
}

struct Scanner {
    state: Scan,
    stack: Vec<Parse>,
    end_top: bool,
}

impl Scanner {
    fn error(c: u8, context: &str) -> DecodeError {
        DecodeError::Syntax(format!("invalid character {} {context}", quote_char(c)))
    }

    fn push(&mut self, c: u8, p: Parse) -> Result<(), DecodeError> {
        self.stack.push(p);
        if self.stack.len() > MAX_DEPTH {
            return Err(Self::error(c, "exceeded max depth"));
        }
        Ok(())
    }

    fn end_value(&mut self, c: u8) -> Result<(), DecodeError> {
        let Some(top) = self.stack.last().copied() else {
            self.state = Scan::EndTop;
            self.end_top = true;
            return self.step(c);
        };
        if is_space(c) {
            self.state = Scan::EndValue;
            return Ok(());
        }
        match top {
            Parse::ObjectKey => {
                if c == b':' {
                    if let Some(t) = self.stack.last_mut() {
                        *t = Parse::ObjectValue;
                    }
                    self.state = Scan::BeginValue;
                    Ok(())
                } else {
                    Err(Self::error(c, "after object key"))
                }
            }
            Parse::ObjectValue => match c {
                b',' => {
                    if let Some(t) = self.stack.last_mut() {
                        *t = Parse::ObjectKey;
                    }
                    self.state = Scan::BeginString;
                    Ok(())
                }
                b'}' => self.pop(),
                _ => Err(Self::error(c, "after object key:value pair")),
            },
            Parse::ArrayValue => match c {
                b',' => {
                    self.state = Scan::BeginValue;
                    Ok(())
                }
                b']' => self.pop(),
                _ => Err(Self::error(c, "after array element")),
            },
        }
    }

    fn pop(&mut self) -> Result<(), DecodeError> {
        self.stack.pop();
        if self.stack.is_empty() {
            self.state = Scan::EndTop;
            self.end_top = true;
        } else {
            self.state = Scan::EndValue;
        }
        Ok(())
    }

    fn begin_value(&mut self, c: u8) -> Result<(), DecodeError> {
        if is_space(c) {
            return Ok(());
        }
        match c {
            b'{' => {
                self.state = Scan::BeginStringOrEmpty;
                self.push(c, Parse::ObjectKey)
            }
            b'[' => {
                self.state = Scan::BeginValueOrEmpty;
                self.push(c, Parse::ArrayValue)
            }
            b'"' => {
                self.state = Scan::InString;
                Ok(())
            }
            b'-' => {
                self.state = Scan::Neg;
                Ok(())
            }
            b'0' => {
                self.state = Scan::Zero;
                Ok(())
            }
            b't' => {
                self.state = Scan::Literal(b"true", 1, "in literal true");
                Ok(())
            }
            b'f' => {
                self.state = Scan::Literal(b"false", 1, "in literal false");
                Ok(())
            }
            b'n' => {
                self.state = Scan::Literal(b"null", 1, "in literal null");
                Ok(())
            }
            b'1'..=b'9' => {
                self.state = Scan::One;
                Ok(())
            }
            _ => Err(Self::error(c, "looking for beginning of value")),
        }
    }

    fn step(&mut self, c: u8) -> Result<(), DecodeError> {
        match self.state {
            Scan::BeginValue => self.begin_value(c),
            Scan::BeginValueOrEmpty => {
                if is_space(c) {
                    Ok(())
                } else if c == b']' {
                    self.end_value(c)
                } else {
                    self.begin_value(c)
                }
            }
            Scan::BeginStringOrEmpty => {
                if is_space(c) {
                    Ok(())
                } else if c == b'}' {
                    if let Some(t) = self.stack.last_mut() {
                        *t = Parse::ObjectValue;
                    }
                    self.end_value(c)
                } else {
                    self.begin_string(c)
                }
            }
            Scan::BeginString => self.begin_string(c),
            Scan::EndValue => self.end_value(c),
            Scan::EndTop => {
                if is_space(c) {
                    Ok(())
                } else {
                    Err(Self::error(c, "after top-level value"))
                }
            }
            Scan::InString => match c {
                b'"' => {
                    self.state = Scan::EndValue;
                    Ok(())
                }
                b'\\' => {
                    self.state = Scan::InStringEsc;
                    Ok(())
                }
                0..=0x1f => Err(Self::error(c, "in string literal")),
                _ => Ok(()),
            },
            Scan::InStringEsc => match c {
                b'b' | b'f' | b'n' | b'r' | b't' | b'\\' | b'/' | b'"' => {
                    self.state = Scan::InString;
                    Ok(())
                }
                b'u' => {
                    self.state = Scan::InStringEscU(0);
                    Ok(())
                }
                _ => Err(Self::error(c, "in string escape code")),
            },
            Scan::InStringEscU(n) => {
                if c.is_ascii_hexdigit() {
                    self.state = if n == 3 {
                        Scan::InString
                    } else {
                        Scan::InStringEscU(n + 1)
                    };
                    Ok(())
                } else {
                    Err(Self::error(c, "in \\u hexadecimal character escape"))
                }
            }
            Scan::Neg => match c {
                b'0' => {
                    self.state = Scan::Zero;
                    Ok(())
                }
                b'1'..=b'9' => {
                    self.state = Scan::One;
                    Ok(())
                }
                _ => Err(Self::error(c, "in numeric literal")),
            },
            Scan::One => {
                if c.is_ascii_digit() {
                    Ok(())
                } else {
                    self.zero(c)
                }
            }
            Scan::Zero => self.zero(c),
            Scan::Dot => {
                if c.is_ascii_digit() {
                    self.state = Scan::Dot0;
                    Ok(())
                } else {
                    Err(Self::error(c, "after decimal point in numeric literal"))
                }
            }
            Scan::Dot0 => {
                if c.is_ascii_digit() {
                    Ok(())
                } else if c == b'e' || c == b'E' {
                    self.state = Scan::E;
                    Ok(())
                } else {
                    self.end_value(c)
                }
            }
            Scan::E => {
                if c == b'+' || c == b'-' {
                    self.state = Scan::ESign;
                    Ok(())
                } else {
                    self.e_sign(c)
                }
            }
            Scan::ESign => self.e_sign(c),
            Scan::E0 => {
                if c.is_ascii_digit() {
                    Ok(())
                } else {
                    self.end_value(c)
                }
            }
            Scan::Literal(word, i, context) => {
                if c == word[i] {
                    self.state = if i + 1 == word.len() {
                        Scan::EndValue
                    } else {
                        Scan::Literal(word, i + 1, context)
                    };
                    Ok(())
                } else {
                    Err(Self::error(
                        c,
                        &format!("{context} (expecting {})", quote_char(word[i])),
                    ))
                }
            }
        }
    }

    fn begin_string(&mut self, c: u8) -> Result<(), DecodeError> {
        if is_space(c) {
            Ok(())
        } else if c == b'"' {
            self.state = Scan::InString;
            Ok(())
        } else {
            Err(Self::error(c, "looking for beginning of object key string"))
        }
    }

    fn zero(&mut self, c: u8) -> Result<(), DecodeError> {
        match c {
            b'.' => {
                self.state = Scan::Dot;
                Ok(())
            }
            b'e' | b'E' => {
                self.state = Scan::E;
                Ok(())
            }
            _ => self.end_value(c),
        }
    }

    fn e_sign(&mut self, c: u8) -> Result<(), DecodeError> {
        if c.is_ascii_digit() {
            self.state = Scan::E0;
            Ok(())
        } else {
            Err(Self::error(c, "in exponent of numeric literal"))
        }
    }
}

/// Go's `checkValid`: the first syntax error of `input`, with Go's text.
fn check_valid(input: &[u8]) -> Result<(), DecodeError> {
    let mut s = Scanner {
        state: Scan::BeginValue,
        stack: Vec::new(),
        end_top: false,
    };
    for &c in input {
        s.step(c)?;
    }
    // Go's `eof`: feed a space to finish a pending number or literal.
    if s.end_top {
        return Ok(());
    }
    s.step(b' ')?;
    if s.end_top {
        return Ok(());
    }
    Err(DecodeError::Syntax(
        "unexpected end of JSON input".to_owned(),
    ))
}

/// Builds a [`Value`] from input that [`check_valid`] accepted (so it never fails).
struct Builder<'a> {
    input: &'a [u8],
    pos: usize,
}

enum Frame {
    Array(Vec<Value>),
    Object(Vec<(String, Value)>, Option<String>),
}

impl Builder<'_> {
    fn skip_space(&mut self) {
        while self.pos < self.input.len() && is_space(self.input[self.pos]) {
            self.pos += 1;
        }
    }

    fn peek(&self) -> u8 {
        self.input.get(self.pos).copied().unwrap_or(b' ')
    }

    /// Iterative, so that deeply nested (but valid) input cannot overflow the stack.
    fn value(&mut self) -> Value {
        let mut stack: Vec<Frame> = Vec::new();
        loop {
            self.skip_space();
            let mut done = match self.peek() {
                b'{' => {
                    self.pos += 1;
                    self.skip_space();
                    if self.peek() == b'}' {
                        self.pos += 1;
                        Some(Value::Object(Vec::new()))
                    } else {
                        let key = self.string();
                        self.skip_space();
                        self.pos += 1; // ':'
                        stack.push(Frame::Object(Vec::new(), Some(key)));
                        None
                    }
                }
                b'[' => {
                    self.pos += 1;
                    self.skip_space();
                    if self.peek() == b']' {
                        self.pos += 1;
                        Some(Value::Array(Vec::new()))
                    } else {
                        stack.push(Frame::Array(Vec::new()));
                        None
                    }
                }
                b'"' => Some(Value::String(self.string())),
                b't' => {
                    self.pos += 4;
                    Some(Value::Bool(true))
                }
                b'f' => {
                    self.pos += 5;
                    Some(Value::Bool(false))
                }
                b'n' => {
                    self.pos += 4;
                    Some(Value::Null)
                }
                _ => Some(Value::Number(self.number())),
            };
            // Attach finished values to their parents, closing containers as they end.
            while let Some(v) = done.take() {
                let Some(frame) = stack.last_mut() else {
                    return v;
                };
                self.skip_space();
                match frame {
                    Frame::Array(items) => {
                        items.push(v);
                        if self.peek() == b',' {
                            self.pos += 1;
                        } else {
                            self.pos += 1; // ']'
                            if let Some(Frame::Array(items)) = stack.pop() {
                                done = Some(Value::Array(items));
                            }
                        }
                    }
                    Frame::Object(members, key) => {
                        members.push((key.take().unwrap_or_default(), v));
                        if self.peek() == b',' {
                            self.pos += 1;
                            self.skip_space();
                            *key = Some(self.string());
                            self.skip_space();
                            self.pos += 1; // ':'
                        } else {
                            self.pos += 1; // '}'
                            if let Some(Frame::Object(members, _)) = stack.pop() {
                                done = Some(Value::Object(members));
                            }
                        }
                    }
                }
            }
        }
    }

    fn number(&mut self) -> String {
        let start = self.pos;
        while self.pos < self.input.len()
            && matches!(
                self.input[self.pos],
                b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'
            )
        {
            self.pos += 1;
        }
        String::from_utf8_lossy(&self.input[start..self.pos]).into_owned()
    }

    /// Go's `unquote`: escapes decoded, invalid UTF-8 and lone surrogates replaced by U+FFFD.
    fn string(&mut self) -> String {
        self.pos += 1; // opening quote
        let mut out: Vec<u8> = Vec::new();
        while self.pos < self.input.len() {
            let c = self.input[self.pos];
            match c {
                b'"' => {
                    self.pos += 1;
                    break;
                }
                b'\\' => {
                    let e = self.input.get(self.pos + 1).copied().unwrap_or(b'\\');
                    self.pos += 2;
                    let simple = match e {
                        b'b' => Some(0x08),
                        b'f' => Some(0x0c),
                        b'n' => Some(b'\n'),
                        b'r' => Some(b'\r'),
                        b't' => Some(b'\t'),
                        b'u' => None,
                        other => Some(other),
                    };
                    if let Some(b) = simple {
                        out.push(b);
                        continue;
                    }
                    let first = self.hex4();
                    let ch = if (0xD800..0xDC00).contains(&first)
                        && self.input.get(self.pos) == Some(&b'\\')
                        && self.input.get(self.pos + 1) == Some(&b'u')
                    {
                        let save = self.pos;
                        self.pos += 2;
                        let second = self.hex4();
                        if (0xDC00..0xE000).contains(&second) {
                            char::from_u32(0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00))
                        } else {
                            self.pos = save;
                            None
                        }
                    } else {
                        char::from_u32(first)
                    };
                    let ch = ch.unwrap_or('\u{FFFD}');
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                }
                _ => {
                    out.push(c);
                    self.pos += 1;
                }
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    fn hex4(&mut self) -> u32 {
        let mut v = 0u32;
        for _ in 0..4 {
            let d = self
                .input
                .get(self.pos)
                .and_then(|c| char::from(*c).to_digit(16))
                .unwrap_or(0);
            v = v * 16 + d;
            self.pos += 1;
        }
        v
    }
}

// ---------------------------------------------------------------------------------------------
// Typed decoding with Go's semantics.

/// Go's case-insensitive key match (`equalFold`, including its `ſ`→s and Kelvin-sign→k folding).
pub fn key_matches(key: &str, field: &str) -> bool {
    let mut k = key.chars().map(|c| match c {
        '\u{017F}' => 's',
        '\u{212A}' => 'k',
        c => c.to_ascii_lowercase(),
    });
    let mut f = field.chars().map(|c| c.to_ascii_lowercase());
    loop {
        match (k.next(), f.next()) {
            (None, None) => return true,
            (Some(a), Some(b)) if a == b => {}
            _ => return false,
        }
    }
}

/// Decodes [`Value`]s into Rust values the way Go decodes into structs, tracking Go's error
/// context (innermost struct type name and the field path) and the first saved type error.
#[derive(Debug, Default)]
pub struct Decoder {
    struct_name: Option<&'static str>,
    fields: Vec<&'static str>,
    saved: Option<DecodeError>,
}

impl Decoder {
    /// A decoder at the top level of a document.
    pub fn new() -> Self {
        Self::default()
    }

    /// Ends decoding: the first saved type error, if any (Go's `d.savedError`).
    pub fn finish(self) -> Result<(), DecodeError> {
        match self.saved {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn context(&self) -> Option<(String, String)> {
        if self.struct_name.is_none() && self.fields.is_empty() {
            return None;
        }
        Some((
            self.struct_name.unwrap_or("").to_owned(),
            self.fields.join("."),
        ))
    }

    /// Go's `addErrorContext`: a type error gets the current struct and field path.
    pub fn with_context(&self, err: DecodeError) -> DecodeError {
        match err {
            DecodeError::Type {
                value,
                go_type,
                context,
            } => {
                let context = self.context().or(context);
                DecodeError::Type {
                    value,
                    go_type,
                    context,
                }
            }
            other => other,
        }
    }

    /// A type error for `value` not fitting `go_type`, in the current context.
    pub fn type_error(&self, value: &Value, go_type: &str) -> DecodeError {
        DecodeError::Type {
            value: value.kind(),
            go_type: go_type.to_owned(),
            context: self.context(),
        }
    }

    /// Records a type error; decoding continues and the first one is reported at the end.
    pub fn save(&mut self, err: DecodeError) {
        if self.saved.is_none() {
            self.saved = Some(err);
        }
    }

    /// Decodes a JSON object into a Go struct named `struct_name` (Go type `go_type`) whose JSON
    /// field names are `fields`; `decode_field` is called for each member whose key matches a
    /// field, in document order (duplicates included), with the error context set.
    pub fn object<F>(
        &mut self,
        v: &Value,
        go_type: &str,
        struct_name: &'static str,
        fields: &[&'static str],
        mut decode_field: F,
    ) -> Result<(), DecodeError>
    where
        F: FnMut(&mut Decoder, &'static str, &Value) -> Result<(), DecodeError>,
    {
        let members = match v {
            Value::Null => return Ok(()),
            Value::Object(members) => members,
            other => {
                let e = self.type_error(other, go_type);
                self.save(e);
                return Ok(());
            }
        };
        for (key, value) in members {
            // Go prefers an exact match, then the first case-insensitive one.
            let field = fields
                .iter()
                .find(|f| **f == key)
                .or_else(|| fields.iter().find(|f| key_matches(key, f)));
            let Some(field) = field else { continue };
            let saved_struct = self.struct_name.replace(struct_name);
            self.fields.push(field);
            decode_field(self, field, value)?;
            self.fields.pop();
            self.struct_name = saved_struct;
        }
        Ok(())
    }

    /// Decodes a JSON string into a Go `string` field (`null` leaves it unchanged).
    pub fn string(&mut self, v: &Value, out: &mut String) {
        match v {
            Value::Null => {}
            Value::String(s) => s.clone_into(out),
            other => {
                let e = self.type_error(other, "string");
                self.save(e);
            }
        }
    }

    /// Decodes a JSON array into a Go slice of `go_type`, merging into existing elements the way
    /// Go does for repeated keys; `null` empties it.
    pub fn slice<T: Default, F>(
        &mut self,
        v: &Value,
        go_type: &str,
        out: &mut Vec<T>,
        mut elem: F,
    ) -> Result<(), DecodeError>
    where
        F: FnMut(&mut Decoder, &Value, &mut T) -> Result<(), DecodeError>,
    {
        match v {
            Value::Null => out.clear(),
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    if i >= out.len() {
                        out.push(T::default());
                    }
                    if let Some(slot) = out.get_mut(i) {
                        elem(self, item, slot)?;
                    }
                }
                out.truncate(items.len());
            }
            other => {
                let e = self.type_error(other, go_type);
                self.save(e);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn syntax_errors_have_go_texts() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "unexpected end of JSON input"),
            (b"{", "unexpected end of JSON input"),
            (b"[1", "unexpected end of JSON input"),
            (
                b"{\"name\":\"n\"} x",
                "invalid character 'x' after top-level value",
            ),
            (
                b"tru",
                "invalid character ' ' in literal true (expecting 'e')",
            ),
            (
                b"nul",
                "invalid character ' ' in literal null (expecting 'l')",
            ),
            (
                b"fx",
                "invalid character 'x' in literal false (expecting 'a')",
            ),
            (
                b"{\"x\":\"\\u12\"}",
                "invalid character '\"' in \\u hexadecimal character escape",
            ),
            (
                b"{\"name\":\"a\x01\"}",
                "invalid character '\\x01' in string literal",
            ),
            (
                b"\xff",
                "invalid character '\u{ff}' looking for beginning of value",
            ),
            (
                b"{x",
                "invalid character 'x' looking for beginning of object key string",
            ),
            (b"{\"a\" 1}", "invalid character '1' after object key"),
            (
                b"{\"a\":1 2}",
                "invalid character '2' after object key:value pair",
            ),
            (b"[1 2]", "invalid character '2' after array element"),
            (b"-x", "invalid character 'x' in numeric literal"),
            (
                b"1.x",
                "invalid character 'x' after decimal point in numeric literal",
            ),
            (
                b"1ex",
                "invalid character 'x' in exponent of numeric literal",
            ),
            (b"\"\\x\"", "invalid character 'x' in string escape code"),
            (
                b"'",
                "invalid character '\\'' looking for beginning of value",
            ),
            (
                b"\n\n}",
                "invalid character '}' looking for beginning of value",
            ),
        ];
        for (input, want) in cases {
            let got = parse(input).unwrap_err().to_string();
            assert_eq!(&got, want, "input {:?}", String::from_utf8_lossy(input));
        }
    }

    #[test]
    fn parses_values_keeping_duplicates() {
        let v = parse(
            br#" {"a": [1, -2.5e3, true, null], "a": {"b": "x\u00e9\ud83d\ude00\n"}, "c": {}} "#,
        )
        .unwrap();
        let Value::Object(m) = v else {
            panic!("not an object")
        };
        assert_eq!(m.len(), 3);
        assert_eq!(
            m[0].1,
            Value::Array(vec![
                Value::Number("1".into()),
                Value::Number("-2.5e3".into()),
                Value::Bool(true),
                Value::Null
            ])
        );
        assert_eq!(
            m[1].1,
            Value::Object(vec![("b".into(), Value::String("xé😀\n".into()))])
        );
        assert_eq!(m[2].1, Value::Object(vec![]));
    }

    #[test]
    fn lone_surrogates_and_bad_utf8_become_replacement_chars() {
        assert_eq!(
            parse(b"\"\\ud800x\"").unwrap(),
            Value::String("\u{FFFD}x".into())
        );
        assert_eq!(
            parse(b"\"a\xffb\"").unwrap(),
            Value::String("a\u{FFFD}b".into())
        );
    }

    #[test]
    fn deep_nesting_is_limited() {
        let deep = "[".repeat(MAX_DEPTH + 1);
        assert_eq!(
            parse(deep.as_bytes()).unwrap_err().to_string(),
            "invalid character '[' exceeded max depth"
        );
        let ok = format!("{}{}", "[".repeat(1000), "]".repeat(1000));
        assert!(parse(ok.as_bytes()).is_ok());
    }

    #[test]
    fn keys_match_like_go() {
        assert!(key_matches("NAME", "name"));
        assert!(key_matches("dataDIR", "dataDir"));
        assert!(key_matches("\u{017F}ubnet", "subnet"));
        assert!(!key_matches("names", "name"));
    }

    #[test]
    fn decoder_reports_first_type_error_with_context() {
        let v = parse(br#"{"name": 5, "NAME": true}"#).unwrap();
        let mut d = Decoder::new();
        let mut name = String::new();
        d.object(&v, "T", "", &["name"], |d, _, v| {
            d.string(v, &mut name);
            Ok(())
        })
        .unwrap();
        assert_eq!(
            d.finish().unwrap_err().to_string(),
            "json: cannot unmarshal number into Go struct field .name of type string"
        );
        let mut d = Decoder::new();
        d.object(
            &Value::Array(vec![]),
            "struct { X }",
            "",
            &["x"],
            |_, _, _| Ok(()),
        )
        .unwrap();
        assert_eq!(
            d.finish().unwrap_err().to_string(),
            "json: cannot unmarshal array into Go value of type struct { X }"
        );
    }

    #[test]
    fn slices_merge_like_go() {
        let mut d = Decoder::new();
        let mut out = vec![String::from("a"), String::from("b"), String::from("c")];
        d.slice(
            &parse(br#"[null, "y"]"#).unwrap(),
            "[]string",
            &mut out,
            |d, v, s| {
                d.string(v, s);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(out, vec!["a".to_owned(), "y".to_owned()]);
    }
}
