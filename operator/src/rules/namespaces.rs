//! Which namespaces may keep addresses (`--namespace-selector`): the one parser of Kubernetes'
//! label selector grammar (`a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x,y)`, `a`, `!a`,
//! comma-separated, all must hold), matching as the API server matches (apimachinery's
//! `labels.Selector`, said here as requirements), and what a reconcile is told about a pod's
//! namespace. No Kubernetes client, no clock.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fmt,
};

use crate::api::PodKey;

/// A parsed `--namespace-selector`, with the text it was given (Events quote it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceSelector {
    text: String,
    requirements: Vec<Requirement>,
}

/// One requirement of a label selector; a selector holds when all of its requirements do.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    /// The key is set and its value is one of these.
    In(String, BTreeSet<String>),
    /// The key is not set, or its value is none of these.
    NotIn(String, BTreeSet<String>),
    /// The key is set.
    Exists(String),
    /// The key is not set.
    DoesNotExist(String),
    /// The key is set to this value.
    Equal(String, String),
    /// The key is not set, or set to another value.
    NotEqual(String, String),
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Requirement::In(key, values) => labels.get(key).is_some_and(|v| values.contains(v)),
            Requirement::NotIn(key, values) => labels.get(key).is_none_or(|v| !values.contains(v)),
            Requirement::Exists(key) => labels.contains_key(key),
            Requirement::DoesNotExist(key) => !labels.contains_key(key),
            Requirement::Equal(key, value) => labels.get(key) == Some(value),
            Requirement::NotEqual(key, value) => labels.get(key) != Some(value),
        }
    }
}

/// Why a selector's text is not a label selector.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("failed to parse the label selector {text:?} at character {at}: {what}")]
pub struct SelectorError {
    /// The whole text.
    pub text: String,
    /// Where the parser stopped (0-based, in characters).
    pub at: usize,
    /// What it expected or refused.
    pub what: String,
}

impl NamespaceSelector {
    /// Parses `text`; an empty text selects every namespace.
    pub fn parse(text: &str) -> Result<NamespaceSelector, SelectorError> {
        let requirements = Parser::new(text).requirements()?;
        Ok(NamespaceSelector {
            text: text.trim().to_owned(),
            requirements,
        })
    }

    /// Whether it selects every namespace (no requirement at all).
    pub fn selects_all(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether a namespace with these labels is selected.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// The text as given (trimmed).
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for NamespaceSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::str::FromStr for NamespaceSelector {
    type Err = SelectorError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        NamespaceSelector::parse(text)
    }
}

/// What the controller knows of a pod's namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict<'a> {
    /// No `--namespace-selector`, or the namespace's labels match it.
    Selected,
    /// The namespace's labels do not match the selector.
    NotSelected {
        /// The selector, as given.
        selector: &'a str,
    },
    /// The namespace is not in the cache yet (created just now): wait for it rather than tell a
    /// pod something that may be untrue; its arrival reconciles the namespace's names.
    NotSeen,
}

/// The verdict on a namespace whose labels are `labels` (`None`: not seen) under `selector`
/// (`None`: every namespace).
pub fn verdict<'a>(
    selector: Option<&'a NamespaceSelector>,
    labels: Option<&BTreeMap<String, String>>,
) -> Verdict<'a> {
    match (selector, labels) {
        (None, _) => Verdict::Selected,
        (Some(_), None) => Verdict::NotSeen,
        (Some(s), Some(labels)) if s.matches(labels) => Verdict::Selected,
        (Some(s), Some(_)) => Verdict::NotSelected {
            selector: s.as_str(),
        },
    }
}

/// Each namespace's last verdict, as the Namespace watch saw it: a namespace's names are
/// reconciled only when it changes (a namespace's other labels and annotations change often).
#[derive(Debug, Default)]
pub struct Verdicts(HashMap<String, bool>);

impl Verdicts {
    /// Records that `namespace` is now `selected`; true when that differs from before (first
    /// sighting included: pods reconciled before it was seen waited for it).
    pub fn update(&mut self, namespace: &str, selected: bool) -> bool {
        self.0.insert(namespace.to_owned(), selected) != Some(selected)
    }

    /// The namespace was deleted.
    pub fn forget(&mut self, namespace: &str) {
        self.0.remove(namespace);
    }
}

/// The pods already told (one `NotReserved`) that their namespace is not selected, by name with
/// the uid told: a pod is told once, not at every reconcile; a new pod of the name is told again.
#[derive(Debug, Default)]
pub struct Told(std::sync::Mutex<HashMap<PodKey, String>>);

impl Told {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PodKey, String>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the pod `uid` of name `key` was told.
    pub fn contains(&self, key: &PodKey, uid: &str) -> bool {
        self.lock().get(key).is_some_and(|told| told == uid)
    }

    /// The pod `uid` of name `key` was told.
    pub fn insert(&self, key: &PodKey, uid: &str) {
        self.lock().insert(key.clone(), uid.to_owned());
    }

    /// Nothing of `key` is to be remembered (its pod is gone, or its namespace selected again).
    pub fn forget(&self, key: &PodKey) {
        self.lock().remove(key);
    }
}

/// A token of the selector grammar, with where it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// A key, a value or the words `in` / `notin`.
    Word(String),
    Not,
    Equals,
    NotEquals,
    Comma,
    Open,
    Close,
    End,
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Word(w) => write!(f, "{w:?}"),
            Token::Not => f.write_str("'!'"),
            Token::Equals => f.write_str("'='"),
            Token::NotEquals => f.write_str("'!='"),
            Token::Comma => f.write_str("','"),
            Token::Open => f.write_str("'('"),
            Token::Close => f.write_str("')'"),
            Token::End => f.write_str("the end"),
        }
    }
}

/// Kubernetes' label selector parser (apimachinery `labels.Parse`), for one selector.
struct Parser<'t> {
    text: &'t str,
    tokens: Vec<(usize, Token)>,
    next: usize,
}

/// The longest label name (and value), and the longest prefix of a key.
const NAME_MAX: usize = 63;
const PREFIX_MAX: usize = 253;

impl<'t> Parser<'t> {
    fn new(text: &'t str) -> Parser<'t> {
        let mut tokens = Vec::new();
        let chars: Vec<char> = text.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            let token = match c {
                c if c.is_whitespace() => {
                    i += 1;
                    continue;
                }
                '!' if chars.get(i + 1) == Some(&'=') => Token::NotEquals,
                '!' => Token::Not,
                '=' => Token::Equals,
                ',' => Token::Comma,
                '(' => Token::Open,
                ')' => Token::Close,
                _ => {
                    let start = i;
                    while i < chars.len()
                        && !chars[i].is_whitespace()
                        && !matches!(chars[i], '!' | '=' | ',' | '(' | ')')
                    {
                        i += 1;
                    }
                    tokens.push((start, Token::Word(chars[start..i].iter().collect())));
                    continue;
                }
            };
            tokens.push((i, token.clone()));
            // `!=` and `==` are two characters.
            i += match (token, chars.get(i + 1)) {
                (Token::NotEquals, _) | (Token::Equals, Some('=')) => 2,
                _ => 1,
            };
        }
        tokens.push((chars.len(), Token::End));
        Parser {
            text,
            tokens,
            next: 0,
        }
    }

    fn peek(&self) -> &Token {
        self.tokens.get(self.next).map_or(&Token::End, |(_, t)| t)
    }

    fn take(&mut self) -> (usize, Token) {
        let at = self.tokens.get(self.next).cloned();
        self.next += 1;
        at.unwrap_or((self.text.chars().count(), Token::End))
    }

    fn error(&self, at: usize, what: impl Into<String>) -> SelectorError {
        SelectorError {
            text: self.text.to_owned(),
            at,
            what: what.into(),
        }
    }

    fn requirements(mut self) -> Result<Vec<Requirement>, SelectorError> {
        let mut requirements = Vec::new();
        if *self.peek() == Token::End {
            return Ok(requirements);
        }
        loop {
            requirements.push(self.requirement()?);
            match self.take() {
                (_, Token::End) => break,
                (_, Token::Comma) => {}
                (at, other) => {
                    return Err(self.error(at, format!("expected ',' or the end, found {other}")));
                }
            }
        }
        Ok(requirements)
    }

    fn requirement(&mut self) -> Result<Requirement, SelectorError> {
        if *self.peek() == Token::Not {
            self.take();
            let key = self.key()?;
            return Ok(Requirement::DoesNotExist(key));
        }
        let key = self.key()?;
        match self.peek().clone() {
            Token::Comma | Token::End => Ok(Requirement::Exists(key)),
            Token::Equals => {
                self.take();
                Ok(Requirement::Equal(key, self.value()?))
            }
            Token::NotEquals => {
                self.take();
                Ok(Requirement::NotEqual(key, self.value()?))
            }
            Token::Word(w) if w == "in" || w == "notin" => {
                self.take();
                let values = self.values()?;
                Ok(if w == "in" {
                    Requirement::In(key, values)
                } else {
                    Requirement::NotIn(key, values)
                })
            }
            other => {
                let (at, _) = self.take();
                Err(self.error(
                    at,
                    format!("expected '=', '==', '!=', 'in', 'notin', ',' or the end after key {key:?}, found {other}"),
                ))
            }
        }
    }

    fn key(&mut self) -> Result<String, SelectorError> {
        match self.take() {
            (at, Token::Word(key)) => {
                check_key(&key).map_err(|why| self.error(at, format!("key {key:?}: {why}")))?;
                Ok(key)
            }
            (at, other) => Err(self.error(at, format!("expected a label key, found {other}"))),
        }
    }

    /// The value after `=`, `==` or `!=`: a word, or nothing (the empty value).
    fn value(&mut self) -> Result<String, SelectorError> {
        match self.peek().clone() {
            Token::Comma | Token::End => Ok(String::new()),
            Token::Word(value) => {
                let (at, _) = self.take();
                check_value(&value)
                    .map_err(|why| self.error(at, format!("value {value:?}: {why}")))?;
                Ok(value)
            }
            other => {
                let (at, _) = self.take();
                Err(self.error(at, format!("expected a label value, found {other}")))
            }
        }
    }

    /// `(v1, v2, …)`, at least one value.
    fn values(&mut self) -> Result<BTreeSet<String>, SelectorError> {
        match self.take() {
            (_, Token::Open) => {}
            (at, other) => return Err(self.error(at, format!("expected '(', found {other}"))),
        }
        let mut values = BTreeSet::new();
        loop {
            match self.take() {
                (at, Token::Word(value)) => {
                    check_value(&value)
                        .map_err(|why| self.error(at, format!("value {value:?}: {why}")))?;
                    values.insert(value);
                }
                (at, other) => {
                    return Err(self.error(at, format!("expected a label value, found {other}")));
                }
            }
            match self.take() {
                (_, Token::Comma) => {}
                (_, Token::Close) => return Ok(values),
                (at, other) => {
                    return Err(self.error(at, format!("expected ',' or ')', found {other}")));
                }
            }
        }
    }
}

/// A label key: an optional DNS subdomain prefix and `/`, then a name.
fn check_key(key: &str) -> Result<(), String> {
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            check_prefix(prefix)?;
            name
        }
        None => key,
    };
    if name.is_empty() {
        return Err("the name part is empty".into());
    }
    check_value(name)
}

/// A label value (and a key's name part): at most 63 characters, alphanumeric at both ends,
/// `-`, `_` and `.` between; empty is a value.
fn check_value(value: &str) -> Result<(), String> {
    if value.len() > NAME_MAX {
        return Err(format!("longer than {NAME_MAX} characters"));
    }
    let alnum = |c: Option<char>| c.is_none_or(|c| c.is_ascii_alphanumeric());
    if !alnum(value.chars().next()) || !alnum(value.chars().last()) {
        return Err("must begin and end with a letter or digit".into());
    }
    if let Some(c) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!("{c:?} is none of a letter, a digit, '-', '_', '.'"));
    }
    Ok(())
}

/// A key's prefix: a DNS subdomain (lowercase labels of letters, digits and `-`, dot-separated).
fn check_prefix(prefix: &str) -> Result<(), String> {
    if prefix.is_empty() || prefix.len() > PREFIX_MAX {
        return Err(format!(
            "the prefix must be 1 to {PREFIX_MAX} characters (a DNS subdomain)"
        ));
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= NAME_MAX
            && l.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if prefix.split('.').all(label_ok) {
        Ok(())
    } else {
        Err(format!("the prefix {prefix:?} is not a DNS subdomain"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_grammar_matches_as_the_api_server_does() {
        let reserve = labels(&[("ipkeep.dev/reserve", "true"), ("team", "db")]);
        let other = labels(&[("team", "web")]);
        let none = labels(&[]);
        // (selector, matches `reserve`, `other`, no labels)
        let cases = [
            ("", true, true, true),
            ("ipkeep.dev/reserve=true", true, false, false),
            ("ipkeep.dev/reserve==true", true, false, false),
            ("ipkeep.dev/reserve!=true", false, true, true),
            ("ipkeep.dev/reserve", true, false, false),
            ("!ipkeep.dev/reserve", false, true, true),
            ("team in (db,cache)", true, false, false),
            ("team in ( db , cache )", true, false, false),
            ("team notin (db)", false, true, true),
            ("team,!ipkeep.dev/reserve", false, true, false),
            ("team=db, ipkeep.dev/reserve = true", true, false, false),
            ("team=", false, false, false),
            ("team!=", true, true, true),
        ];
        for (text, on_reserve, on_other, on_none) in cases {
            let s =
                NamespaceSelector::parse(text).unwrap_or_else(|e| panic!("{text:?} refused: {e}"));
            assert_eq!(
                [s.matches(&reserve), s.matches(&other), s.matches(&none)],
                [on_reserve, on_other, on_none],
                "{text:?}"
            );
            assert_eq!(s.as_str(), text.trim());
        }
    }

    #[test]
    fn a_malformed_selector_says_where_and_why() {
        // (selector, where, what the message says)
        let cases = [
            ("a=b,", 4, "expected a label key, found the end"),
            (",a", 0, "expected a label key, found ','"),
            ("a in ()", 6, "expected a label value, found ')'"),
            ("a in x", 5, "expected '(', found \"x\""),
            ("a in (x", 7, "expected ',' or ')', found the end"),
            ("a b", 2, "found \"b\""),
            ("!", 1, "expected a label key"),
            ("a=b=c", 3, "expected ',' or the end, found '='"),
            ("-a=b", 0, "must begin and end with a letter or digit"),
            ("Ex.Com/a", 0, "not a DNS subdomain"),
            ("a/", 0, "the name part is empty"),
            ("a=b c", 4, "found \"c\""),
            ("a=b$", 2, "must begin and end"),
            ("a=b$c", 2, "'$' is none of"),
        ];
        for (text, at, says) in cases {
            let e = NamespaceSelector::parse(text).expect_err(text);
            assert_eq!(e.at, at, "{text:?}: {e}");
            assert!(e.to_string().contains(says), "{text:?}: {e}");
        }
        let long = format!("a={}", "v".repeat(64));
        assert!(
            NamespaceSelector::parse(&long)
                .unwrap_err()
                .to_string()
                .contains("longer than 63")
        );
    }

    #[test]
    fn a_namespace_is_selected_not_selected_or_not_seen_yet() {
        let s = NamespaceSelector::parse("ipkeep.dev/reserve=true").unwrap();
        let yes = labels(&[("ipkeep.dev/reserve", "true")]);
        let no = labels(&[("kubernetes.io/metadata.name", "t")]);
        let cases = [
            (None, Some(&no), Verdict::Selected),
            (None, None, Verdict::Selected),
            (Some(&s), Some(&yes), Verdict::Selected),
            (
                Some(&s),
                Some(&no),
                Verdict::NotSelected {
                    selector: "ipkeep.dev/reserve=true",
                },
            ),
            (Some(&s), None, Verdict::NotSeen),
        ];
        for (selector, labels, want) in cases {
            assert_eq!(verdict(selector, labels), want, "{selector:?} {labels:?}");
        }
    }

    #[test]
    fn a_namespaces_names_are_looked_at_again_only_when_its_verdict_changes() {
        let mut v = Verdicts::default();
        // (namespace, selected now, looked at again)
        let steps = [
            ("a", false, true),
            ("a", false, false),
            ("b", true, true),
            ("a", true, true),
            ("a", true, false),
            ("a", false, true),
        ];
        for (i, (ns, selected, again)) in steps.into_iter().enumerate() {
            assert_eq!(v.update(ns, selected), again, "step {i}");
        }
        v.forget("a");
        assert!(v.update("a", false), "a namespace made again is new");
    }

    #[test]
    fn a_pod_is_told_once_and_a_new_pod_of_its_name_again() {
        let told = Told::default();
        let key = PodKey::new("ns", "web-0").unwrap();
        assert!(!told.contains(&key, "uid-1"));
        told.insert(&key, "uid-1");
        assert!(told.contains(&key, "uid-1"));
        assert!(!told.contains(&key, "uid-2"), "a new pod of that name");
        told.forget(&key);
        assert!(!told.contains(&key, "uid-1"));
    }
}
