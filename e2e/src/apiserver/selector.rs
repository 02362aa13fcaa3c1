//! Label and field selectors with kube-apiserver's grammar and matching rules.
//!
//! Label selectors: `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a`, `!a`, `a>1`, `a<1`,
//! joined with `,`. Field selectors: `a=b`, `a==b`, `a!=b` joined with `,` (with `\,` `\=` `\\`
//! escapes in values). Which field paths are supported is the caller's choice
//! ([`FieldSelector::check_supported`]). Error texts follow kube-apiserver's, since the server puts
//! them into its 400 `Status` messages.

use std::collections::BTreeMap;

/// A selector that could not be parsed or uses an unsupported field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// The label selector text is not valid.
    #[error("unable to parse requirement: {0}")]
    Label(String),
    /// A field selector term has no operator.
    #[error("invalid selector: '{selector}'; can't understand '{term}'")]
    Field {
        /// The whole selector.
        selector: String,
        /// The term that failed.
        term: String,
    },
    /// A field selector names a field the resource does not index.
    #[error("field label not supported: {0}")]
    UnsupportedField(String),
}

/// A label selector operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelOp {
    /// `a=b`, `a==b`, `a in (b,c)`.
    In(Vec<String>),
    /// `a!=b`, `a notin (b,c)`.
    NotIn(Vec<String>),
    /// `a`.
    Exists,
    /// `!a`.
    DoesNotExist,
    /// `a>5`.
    GreaterThan(i64),
    /// `a<5`.
    LessThan(i64),
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelRequirement {
    /// The label key.
    pub key: String,
    /// How the label's value is tested.
    pub op: LabelOp,
}

impl LabelRequirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match &self.op {
            LabelOp::In(values) => value.is_some_and(|v| values.contains(v)),
            LabelOp::NotIn(values) => value.is_none_or(|v| !values.contains(v)),
            LabelOp::Exists => value.is_some(),
            LabelOp::DoesNotExist => value.is_none(),
            LabelOp::GreaterThan(n) => value
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v > *n),
            LabelOp::LessThan(n) => value
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v < *n),
        }
    }
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    /// All requirements; an object must meet every one.
    pub requirements: Vec<LabelRequirement>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    Not,
    Eq,
    DoubleEq,
    NotEq,
    Gt,
    Lt,
    Open,
    Close,
    Comma,
}

impl Token {
    fn text(&self) -> String {
        match self {
            Self::Ident(s) => s.clone(),
            Self::Not => "!".into(),
            Self::Eq => "=".into(),
            Self::DoubleEq => "==".into(),
            Self::NotEq => "!=".into(),
            Self::Gt => ">".into(),
            Self::Lt => "<".into(),
            Self::Open => "(".into(),
            Self::Close => ")".into(),
            Self::Comma => ",".into(),
        }
    }
}

fn is_special(c: char) -> bool {
    matches!(c, '!' | '=' | '>' | '<' | '(' | ')' | ',') || c.is_whitespace()
}

fn lex(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let (token, width) = match (c, next) {
            (c, _) if c.is_whitespace() => {
                i += 1;
                continue;
            }
            ('!', Some('=')) => (Token::NotEq, 2),
            ('!', _) => (Token::Not, 1),
            ('=', Some('=')) => (Token::DoubleEq, 2),
            ('=', _) => (Token::Eq, 1),
            ('>', _) => (Token::Gt, 1),
            ('<', _) => (Token::Lt, 1),
            ('(', _) => (Token::Open, 1),
            (')', _) => (Token::Close, 1),
            (',', _) => (Token::Comma, 1),
            _ => {
                let start = i;
                while i < chars.len() && !is_special(chars[i]) {
                    i += 1;
                }
                tokens.push(Token::Ident(chars[start..i].iter().collect()));
                continue;
            }
        };
        tokens.push(token);
        i += width;
    }
    tokens
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn next(&mut self) -> Option<Token> {
        let t = self.tokens.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn unexpected(found: Option<&Token>, expected: &str) -> SelectorError {
        let found = found.map_or_else(|| "end of string".to_string(), Token::text);
        SelectorError::Label(format!("found '{found}', expected: {expected}"))
    }

    fn requirement(&mut self) -> Result<LabelRequirement, SelectorError> {
        if self.peek() == Some(&Token::Not) {
            self.pos += 1;
            let key = self.key()?;
            return Ok(LabelRequirement {
                key,
                op: LabelOp::DoesNotExist,
            });
        }
        let key = self.key()?;
        let op = match self.peek().cloned() {
            None | Some(Token::Comma) => LabelOp::Exists,
            Some(Token::Eq | Token::DoubleEq) => {
                self.pos += 1;
                LabelOp::In(vec![self.single_value()?])
            }
            Some(Token::NotEq) => {
                self.pos += 1;
                LabelOp::NotIn(vec![self.single_value()?])
            }
            Some(Token::Gt) => {
                self.pos += 1;
                LabelOp::GreaterThan(self.integer()?)
            }
            Some(Token::Lt) => {
                self.pos += 1;
                LabelOp::LessThan(self.integer()?)
            }
            Some(Token::Ident(word)) if word == "in" || word == "notin" => {
                self.pos += 1;
                let values = self.value_set()?;
                if word == "in" {
                    LabelOp::In(values)
                } else {
                    LabelOp::NotIn(values)
                }
            }
            other => {
                return Err(Self::unexpected(
                    other.as_ref(),
                    "in, notin, =, ==, !=, gt, lt",
                ));
            }
        };
        Ok(LabelRequirement { key, op })
    }

    fn key(&mut self) -> Result<String, SelectorError> {
        match self.next() {
            Some(Token::Ident(k)) => {
                validate_key(&k)?;
                Ok(k)
            }
            other => Err(Self::unexpected(other.as_ref(), "identifier")),
        }
    }

    /// The value after `=`/`!=`; an empty value (`a=`) is allowed.
    fn single_value(&mut self) -> Result<String, SelectorError> {
        match self.peek().cloned() {
            Some(Token::Ident(v)) => {
                self.pos += 1;
                validate_value(&v)?;
                Ok(v)
            }
            None | Some(Token::Comma) => Ok(String::new()),
            other => Err(Self::unexpected(other.as_ref(), "identifier")),
        }
    }

    fn integer(&mut self) -> Result<i64, SelectorError> {
        match self.next() {
            Some(Token::Ident(v)) => v.parse().map_err(|_| {
                SelectorError::Label(format!(
                    "for 'Gt', 'Lt' operators, the value must be an integer: {v:?}"
                ))
            }),
            other => Err(Self::unexpected(other.as_ref(), "identifier")),
        }
    }

    fn value_set(&mut self) -> Result<Vec<String>, SelectorError> {
        match self.next() {
            Some(Token::Open) => {}
            other => return Err(Self::unexpected(other.as_ref(), "'('")),
        }
        let mut values = Vec::new();
        let mut expect_value = true;
        loop {
            match self.next() {
                Some(Token::Ident(v)) if expect_value => {
                    validate_value(&v)?;
                    values.push(v);
                    expect_value = false;
                }
                Some(Token::Comma) => {
                    if expect_value {
                        values.push(String::new());
                    }
                    expect_value = true;
                }
                Some(Token::Close) => {
                    if expect_value {
                        values.push(String::new());
                    }
                    break;
                }
                other => return Err(Self::unexpected(other.as_ref(), "',', ')' or identifier")),
            }
        }
        values.sort();
        values.dedup();
        Ok(values)
    }
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63 characters.
fn is_label_name(s: &str) -> bool {
    let ok_edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    s.len() <= 63
        && ok_edge(s.chars().next())
        && ok_edge(s.chars().last())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A DNS-1123 subdomain: lowercase labels joined by dots, at most 253 characters.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn validate_key(key: &str) -> Result<(), SelectorError> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if prefix.is_some_and(|p| !is_dns_subdomain(p)) {
        return Err(SelectorError::Label(format!(
            "Invalid value: {key:?}: prefix part must be a lowercase RFC 1123 subdomain"
        )));
    }
    if !is_label_name(name) {
        return Err(SelectorError::Label(format!(
            "Invalid value: {key:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character and be at most 63 characters"
        )));
    }
    Ok(())
}

fn validate_value(value: &str) -> Result<(), SelectorError> {
    if value.is_empty() || is_label_name(value) {
        return Ok(());
    }
    Err(SelectorError::Label(format!(
        "Invalid value: {value:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character and be at most 63 characters"
    )))
}

impl LabelSelector {
    /// Parses a selector such as `app=web,tier in (a,b),!canary`.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let mut parser = Parser {
            tokens: lex(text),
            pos: 0,
        };
        let mut requirements = Vec::new();
        if parser.peek().is_none() {
            return Ok(Self::default());
        }
        loop {
            requirements.push(parser.requirement()?);
            match parser.next() {
                None => break,
                Some(Token::Comma) => {}
                other => return Err(Parser::unexpected(other.as_ref(), "',' or 'end of string'")),
            }
        }
        Ok(Self { requirements })
    }

    /// True when the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// True when `labels` meet every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }
}

/// One `field op value` term of a field selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    /// The field path, e.g. `spec.nodeName`.
    pub field: String,
    /// `true` for `!=`.
    pub negated: bool,
    /// The (unescaped) value.
    pub value: String,
}

/// A parsed field selector; the empty selector matches everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FieldSelector {
    /// All terms; an object must meet every one.
    pub requirements: Vec<FieldRequirement>,
}

/// Splits on `sep` where it is not escaped with a backslash.
fn split_unescaped(text: &str, sep: char) -> Vec<String> {
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut escaped = false;
    for c in text.chars() {
        if escaped {
            current.push('\\');
            current.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            parts.push(std::mem::take(&mut current));
        } else {
            current.push(c);
        }
    }
    if escaped {
        current.push('\\');
    }
    parts.push(current);
    parts
}

/// A field selector value with its escapes (`\\`, `\,`, `\=`) undone; `None`, as
/// kube-apiserver refuses them, for an unescaped `=` or `,` and any other escape.
fn unescape(value: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                _ => return None,
            },
            '=' | ',' => return None,
            c => out.push(c),
        }
    }
    Some(out)
}

impl FieldSelector {
    /// Parses a selector such as `spec.nodeName=node-a,metadata.name!=x`.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        if text.is_empty() {
            return Ok(Self::default());
        }
        for term in split_unescaped(text, ',') {
            let split = (0..term.len())
                .filter(|i| term.is_char_boundary(*i))
                .find_map(|i| {
                    // An escaped operator character belongs to the field or value.
                    if term[..i].ends_with('\\') && !term[..i].ends_with("\\\\") {
                        return None;
                    }
                    ["!=", "==", "="]
                        .iter()
                        .find(|op| term[i..].starts_with(**op))
                        .map(|op| (i, *op))
                });
            let Some((at, op)) = split else {
                return Err(SelectorError::Field {
                    selector: text.to_string(),
                    term,
                });
            };
            let Some(value) = unescape(&term[at + op.len()..]) else {
                return Err(SelectorError::Field {
                    selector: text.to_string(),
                    term,
                });
            };
            requirements.push(FieldRequirement {
                field: term[..at].trim().to_string(),
                negated: op == "!=",
                value,
            });
        }
        Ok(Self { requirements })
    }

    /// True when the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The field paths this selector tests, in order.
    pub fn fields(&self) -> Vec<&str> {
        self.requirements.iter().map(|r| r.field.as_str()).collect()
    }

    /// Fails with `field label not supported: X` for the first field outside `supported`.
    pub fn check_supported(&self, supported: &[&str]) -> Result<(), SelectorError> {
        match self
            .requirements
            .iter()
            .find(|r| !supported.contains(&r.field.as_str()))
        {
            Some(r) => Err(SelectorError::UnsupportedField(r.field.clone())),
            None => Ok(()),
        }
    }

    /// True when every term holds; `field` returns a field's value (`None` is read as `""`, as
    /// kube-apiserver does for an unset `spec.nodeName`).
    pub fn matches(&self, field: &dyn Fn(&str) -> Option<String>) -> bool {
        self.requirements.iter().all(|r| {
            let value = field(&r.field).unwrap_or_default();
            (value == r.value) != r.negated
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_selector_matching() {
        let web = labels(&[
            ("app", "web"),
            ("tier", "front"),
            ("app.kubernetes.io/managed-by", "ipkeep"),
            ("n", "5"),
        ]);
        let none = labels(&[]);
        let cases = [
            ("", true, true),
            ("app=web", true, false),
            ("app==web", true, false),
            ("app = web", true, false),
            ("app!=web", false, true),
            ("app!=db", true, true),
            ("app in (web,db)", true, false),
            ("app in (db)", false, false),
            ("app notin (db)", true, true),
            ("app notin (web, db)", false, true),
            ("app", true, false),
            ("!app", false, true),
            ("!canary", true, true),
            ("app=web,tier=front", true, false),
            ("app=web,tier=back", false, false),
            ("app.kubernetes.io/managed-by=ipkeep", true, false),
            ("n>4", true, false),
            ("n>5", false, false),
            ("n<6", true, false),
            ("tier=", false, false),
            ("tier in (,front)", true, false),
        ];
        for (text, on_web, on_none) in cases {
            let sel = LabelSelector::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(sel.matches(&web), on_web, "{text} on web");
            assert_eq!(sel.matches(&none), on_none, "{text} on no labels");
        }
        assert!(LabelSelector::parse("").unwrap().is_empty());
    }

    #[test]
    fn label_selector_parse_result() {
        let sel = LabelSelector::parse("a in (y,x,y),!b,c!=d").unwrap();
        assert_eq!(
            sel.requirements,
            vec![
                LabelRequirement {
                    key: "a".into(),
                    op: LabelOp::In(vec!["x".into(), "y".into()])
                },
                LabelRequirement {
                    key: "b".into(),
                    op: LabelOp::DoesNotExist
                },
                LabelRequirement {
                    key: "c".into(),
                    op: LabelOp::NotIn(vec!["d".into()])
                },
            ]
        );
    }

    #[test]
    fn label_selector_errors() {
        let cases = [
            (
                "a b",
                "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt",
            ),
            (
                "a=b c",
                "unable to parse requirement: found 'c', expected: ',' or 'end of string'",
            ),
            (
                "a in b",
                "unable to parse requirement: found 'b', expected: '('",
            ),
            (
                "a in (b",
                "unable to parse requirement: found 'end of string', expected: ',', ')' or identifier",
            ),
            (
                "=b",
                "unable to parse requirement: found '=', expected: identifier",
            ),
            (
                "a,",
                "unable to parse requirement: found 'end of string', expected: identifier",
            ),
            (
                "a>x",
                "unable to parse requirement: for 'Gt', 'Lt' operators, the value must be an integer: \"x\"",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(
                LabelSelector::parse(text).unwrap_err().to_string(),
                want,
                "{text}"
            );
        }
        for bad in ["-a=b", "a=-b", "Bad_Prefix/x=y", "a=b!"] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad} should fail");
        }
    }

    #[test]
    fn field_selector_matching() {
        let pod = |f: &str| match f {
            "metadata.name" => Some("web-0".to_string()),
            "metadata.namespace" => Some("default".to_string()),
            "spec.nodeName" => Some("node-a".to_string()),
            _ => None,
        };
        let unscheduled = |f: &str| match f {
            "metadata.name" => Some("web-1".to_string()),
            _ => None,
        };
        let cases = [
            ("", true, true),
            ("spec.nodeName=node-a", true, false),
            ("spec.nodeName==node-a", true, false),
            ("spec.nodeName!=node-a", false, true),
            ("spec.nodeName=", false, true),
            ("metadata.name=web-0,spec.nodeName=node-a", true, false),
            ("metadata.name=web-0,spec.nodeName=node-b", false, false),
        ];
        for (text, on_pod, on_unscheduled) in cases {
            let sel = FieldSelector::parse(text).unwrap();
            assert_eq!(sel.matches(&pod), on_pod, "{text} on pod");
            assert_eq!(
                sel.matches(&unscheduled),
                on_unscheduled,
                "{text} on unscheduled"
            );
        }
    }

    #[test]
    fn field_selector_parsing() {
        let sel = FieldSelector::parse(r"a=x\,y,b!=z,c==w\=v").unwrap();
        assert_eq!(
            sel.requirements,
            vec![
                FieldRequirement {
                    field: "a".into(),
                    negated: false,
                    value: "x,y".into()
                },
                FieldRequirement {
                    field: "b".into(),
                    negated: true,
                    value: "z".into()
                },
                FieldRequirement {
                    field: "c".into(),
                    negated: false,
                    value: "w=v".into()
                },
            ]
        );
        assert_eq!(sel.fields(), ["a", "b", "c"]);
        assert_eq!(
            FieldSelector::parse("spec.nodeName")
                .unwrap_err()
                .to_string(),
            "invalid selector: 'spec.nodeName'; can't understand 'spec.nodeName'"
        );
        assert_eq!(
            FieldSelector::parse("a=b,oops").unwrap_err().to_string(),
            "invalid selector: 'a=b,oops'; can't understand 'oops'"
        );
    }

    #[test]
    fn unsupported_fields() {
        let sel = FieldSelector::parse("metadata.name=a,spec.bogus=b").unwrap();
        assert_eq!(
            sel.check_supported(&["metadata.name", "spec.bogus"]),
            Ok(())
        );
        assert_eq!(
            sel.check_supported(&["metadata.name"])
                .unwrap_err()
                .to_string(),
            "field label not supported: spec.bogus"
        );
    }
}
