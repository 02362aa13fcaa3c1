//! The docs checked against the code: every flag, chart value, metric, Event reason, annotation,
//! label, printer column and docs anchor that README.md, docs/*.md and the chart's NOTES.txt name
//! must exist, and the reference tables must list every metric and Event reason the code has.
//! [`check`] is a function over texts and a [`Truth`] taken from the code; the tests below feed it
//! the real files, and README.md with one deliberate misspelling at a time, so that it reports a
//! misspelling is itself tested.
//!
//! Where each truth comes from (never a list kept here):
//! - **flags**: the built binaries' `--help` (`ipkeep-operator` and each subcommand it lists,
//!   `ipkeep-docker` and its subcommands), and each hidden `alias = "…"` the sources declare that
//!   the binary takes; the plugin `ipkeep` has no flags.
//! - **chart values**: `charts/ipkeep/files/defaults.json` (generated from `values.yaml`): a
//!   dotted name starting with a top-level key (`controller.maxRetainFor`) must be a value, a
//!   section holding values (`policy.admission`), or a path inside a value that is a map or list
//!   (`controller.resources.limits.memory`).
//! - **metrics**: every `"ipkeep_…"` string literal in the Rust sources of operator/ and docker/;
//!   a name in the docs may add a histogram's `_bucket`/`_sum`/`_count`.
//! - **Event reasons**: `ipkeep_operator::api::reason::ALL`, each with its type and its poster.
//! - **annotations and labels**: every `ipkeep.dev/…` key in the Rust sources, the chart
//!   (templates and values.yaml) and the CRD.
//! - **printer columns**: the CRD's `additionalPrinterColumns` (`crds/`).
//! - **anchors**: GitHub's heading slugs of the linked document.
//!
//! What is checked, and how a name is found:
//! - A flag is attributed to a program by the command it appears in: a code-block line (with its
//!   `\` continuations) or an inline code span where `ipkeep-operator`, `/ipkeep-operator` or
//!   `ipkeep-docker` is run (first on the command, or after `--`, `exec`, `sudo`, `env`; also
//!   `cargo run -p ipkeep-operator -- …`), or a code span starting with one of `ipkeep-operator`'s
//!   subcommands (`install-cni --from …`): the `--flags` after the program and its subcommand are
//!   that subcommand's. A code span that is only a flag (`` `--output json` ``) belongs to the
//!   programs its sentence names and the one its nearest heading names
//!   (`## The controller: `ipkeep-operator controller``; a binary without a subcommand has all its
//!   subcommands' flags), unless the sentence's prose names another tool (helm, kubectl, k3s,
//!   Docker, the kubelet, …); when nothing names a program, it is reported only as a near miss
//!   (within a fifth of its length in edits of one of ipkeep's flags, and not one). Flags on other
//!   programs' commands (helm, kubectl, cargo, make, …) are never checked, and a flag-only span is
//!   taken as another tool's when the same flag appears on another program's command anywhere.
//! - Chart values are found in prose (unless the sentence names another project's chart:
//!   Cilium's `cni.uninstall`) and code lines; metrics and annotations anywhere. A metric followed by `::`
//!   or named like a crate is a crate path; a dotted name ending in a file extension
//!   (`controller.rs`), inside a path or followed by `/` (`cni.dev/…`) is not a value.
//! - An Event reason is a backticked CamelCase word in a sentence that speaks of Events
//!   (`Event`, `Warning`, `Normal`). A reason the code has, called "Warning" or "Normal" right
//!   before it, must be of that type. A name that is no reason is reported when it is called
//!   "Warning"/"Normal" or is a near miss of a reason, and the operator's sources and the CRD do
//!   not use it otherwise (`Bound`, `StatefulSet`): Kubernetes' own reasons (`FailedCreate`,
//!   `Pulled`) are not checked. docs/operator.md's table with a Normal and a Warning column must
//!   list every reason, under its type, in its poster's row, and nothing else.
//! - Every metric the operator registers is named in docs/operator.md, every one the Docker
//!   driver registers in docs/docker.md, within the sections whose heading speaks of metrics
//!   (the whole page when none does).
//! - A `kubectl get ipr` line's `# NAME, IPS, …` comment must be the CRD's columns shown by default
//!   (priority 0), a `# + …` comment the `-o wide` ones; the same in a sentence naming
//!   `kubectl get ipr` and listing columns (`shows NAME, IPS, … and AGE`, `-o wide` adds …; after
//!   "at least" each listed one must only be a column); a backticked upper-case word before
//!   "column" must be a column.
//! - Every relative link `doc.md#anchor` (and `#anchor`) in the Markdown files, and every
//!   `docs/….md#anchor` in the chart's templates, values.yaml and files (the alerts' runbook links
//!   in `files/ipkeep-rules.yaml`, the dashboard's), must name a heading.
//!
//! A paragraph holding `<!-- docs-check: wrong on purpose -->` shows a mistake on purpose (a
//! misspelt value and the error refusing it): its flag-only spans, values and reasons are not
//! checked.
//!
//! A paragraph holding `<!-- docs-check: names every Event reason -->` (README's) must name every
//! reason, and its sentences that speak of Warning (or Normal) Events only, reasons of that type.
//!
//! Not checked: flags in YAML `args:` lists, environment variables, flags outside code, and links
//! to anything but Markdown files.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;
use std::process::Command;

use ipkeep_e2e::testkit::{docker_binary, operator_binary, repo_root};
use ipkeep_operator::api::reason::{ALL, EventReason, Poster};
use serde_json::Value;

/// One text the check reads: its path from the repository's root, and its content.
#[derive(Debug, Clone)]
struct Doc {
    path: String,
    text: String,
}

/// What kind of name a finding is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Flag,
    Value,
    Metric,
    Reason,
    Annotation,
    Column,
    Anchor,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Flag => "flag",
            Kind::Value => "chart value",
            Kind::Metric => "metric",
            Kind::Reason => "Event reason",
            Kind::Annotation => "annotation/label",
            Kind::Column => "printer column",
            Kind::Anchor => "link",
        })
    }
}

/// A name the docs give that the code lacks, or one the code has that a reference table lacks.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Finding {
    path: String,
    line: usize,
    kind: Kind,
    name: String,
    problem: String,
    nearest: Option<String>,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: {} `{}`: {}",
            self.path, self.line, self.kind, self.name, self.problem
        )?;
        if let Some(n) = &self.nearest {
            write!(f, " (nearest: `{n}`)")?;
        }
        Ok(())
    }
}

/// What the code, the chart and the CRD have.
#[derive(Debug, Clone, Default)]
struct Truth {
    /// Each program (`ipkeep-operator controller`, `ipkeep-docker`) and its flags.
    flags: BTreeMap<String, BTreeSet<String>>,
    /// Each binary and its subcommands.
    subcommands: BTreeMap<String, BTreeSet<String>>,
    /// The chart's values, flattened as `files/defaults.json` has them.
    values: BTreeMap<String, Value>,
    /// Each metric and the document that must name it.
    metrics: BTreeMap<String, String>,
    /// Every Event reason.
    reasons: Vec<EventReason>,
    /// CamelCase names the operator's sources and the CRD use (phases, kinds, conditions).
    identifiers: BTreeSet<String>,
    /// Every `ipkeep.dev/…` key.
    annotations: BTreeSet<String>,
    /// The CRD's printer columns, upper-cased as kubectl shows them, with their priority.
    columns: Vec<(String, i64)>,
    /// The workspace's crates as Rust paths (`ipkeep_netdir`): not metrics.
    crates: BTreeSet<String>,
}

const BINARIES: [&str; 2] = ["ipkeep-operator", "ipkeep-docker"];
/// Where the Events reference table lives.
const EVENTS_TABLE_DOC: &str = "docs/operator.md";

// ---------------------------------------------------------------------------------------------
// Reading Markdown: code lines, prose paragraphs with their code spans, headings.

/// An inline code span: its text and where it starts in its paragraph's joined text.
#[derive(Debug, Clone)]
struct Span {
    text: String,
    start: usize,
    end: usize,
}

/// A run of prose (a paragraph, a list item, a table row) joined into one line.
#[derive(Debug, Clone)]
struct Paragraph {
    text: String,
    /// Offsets in `text` where each source line starts, with its line number.
    lines: Vec<(usize, usize)>,
    spans: Vec<Span>,
    /// The headings above it, outermost first.
    headings: Vec<String>,
    table_row: bool,
}

/// Other tools and projects a sentence may quote a flag or value of: named in prose (outside
/// code spans), they make a name ipkeep's programs lack that tool's.
const OTHER_TOOLS: [&str; 17] = [
    "helm",
    "kubectl",
    "k3s",
    "Docker",
    "docker",
    "cargo",
    "make",
    "kubelet",
    "kube-apiserver",
    "etcd",
    "buildah",
    "ctr",
    "crictl",
    "containerd",
    "CRI-O",
    "Cilium",
    "Calico",
];

/// Other projects' charts a sentence may quote a value of (`cni.uninstall` is Cilium's).
const OTHER_CHARTS: [&str; 5] = ["Cilium", "Calico", "Antrea", "Spiderpool", "cert-manager"];

/// A paragraph holding this comment names something wrong on purpose (an example of a mistake
/// and what refuses it): it is not checked.
const DELIBERATE: &str = "<!-- docs-check: wrong on purpose -->";

/// A paragraph holding this comment claims to name every Event reason: it must, and a sentence
/// of it that speaks of Warning (or Normal) Events only must name reasons of that type only.
const EVERY_REASON: &str = "<!-- docs-check: names every Event reason -->";

impl Paragraph {
    fn skipped(&self) -> bool {
        self.text.contains(DELIBERATE)
    }

    /// Whether the prose of `text[s..e]` (code spans left out) names another tool.
    fn names_another_tool(&self, s: usize, e: usize) -> bool {
        self.prose_names(s, e, &OTHER_TOOLS)
    }

    /// Whether the prose of `text[s..e]` names one of `names`.
    fn prose_names(&self, s: usize, e: usize, names: &[&str]) -> bool {
        let mut prose = String::new();
        let mut at = s;
        for span in self.spans.iter().filter(|sp| sp.start >= s && sp.end <= e) {
            prose.push_str(&self.text[at..span.start]);
            prose.push(' ');
            at = span.end;
        }
        prose.push_str(&self.text[at.min(e)..e]);
        prose
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .any(|w| names.contains(&w))
    }

    fn line_at(&self, offset: usize) -> usize {
        self.lines
            .iter()
            .rev()
            .find(|(start, _)| *start <= offset)
            .map_or(0, |(_, line)| *line)
    }

    /// The sentence around `offset`: from the previous `. `/`? `/`! ` outside a code span.
    fn sentence(&self, offset: usize) -> (usize, usize) {
        let bytes = self.text.as_bytes();
        let in_span = |i: usize| self.spans.iter().any(|s| s.start <= i && i < s.end);
        let is_end = |i: usize| {
            matches!(bytes[i], b'.' | b'?' | b'!')
                && bytes.get(i + 1) == Some(&b' ')
                && !in_span(i)
                && !self.text[..i].ends_with("e.g")
                && !self.text[..i].ends_with("i.e")
        };
        let start = (0..offset.min(bytes.len()))
            .rev()
            .find(|&i| is_end(i))
            .map_or(0, |i| i + 2);
        let end = (offset..bytes.len())
            .find(|&i| is_end(i))
            .unwrap_or(bytes.len());
        (start, end)
    }
}

/// A line of a fenced code block (continuations joined), or a whole non-Markdown text's line.
#[derive(Debug, Clone)]
struct CodeLine {
    text: String,
    line: usize,
}

/// A Markdown document taken apart.
#[derive(Debug, Default)]
struct Parsed {
    paragraphs: Vec<Paragraph>,
    code: Vec<CodeLine>,
    /// Each heading's text and line.
    headings: Vec<(String, usize)>,
}

fn is_markdown(path: &str) -> bool {
    path.ends_with(".md")
}

fn parse(doc: &Doc) -> Parsed {
    let mut parsed = Parsed::default();
    if !is_markdown(&doc.path) {
        // A template (NOTES.txt): every line is read as a command line would be.
        for (i, line) in doc.text.lines().enumerate() {
            parsed.code.push(CodeLine {
                text: line.to_owned(),
                line: i + 1,
            });
        }
        return parsed;
    }
    let mut headings: Vec<(usize, String)> = Vec::new();
    let mut fence: Option<String> = None;
    let mut current: Vec<(usize, String)> = Vec::new();
    let mut current_is_row = false;
    let mut pending_code: Option<(usize, String)> = None;
    let flush = |current: &mut Vec<(usize, String)>,
                 row: bool,
                 headings: &[(usize, String)],
                 out: &mut Vec<Paragraph>| {
        if current.is_empty() {
            return;
        }
        let mut text = String::new();
        let mut lines = Vec::new();
        for (n, l) in current.drain(..) {
            if !text.is_empty() {
                text.push(' ');
            }
            lines.push((text.len(), n));
            text.push_str(l.trim());
        }
        let spans = code_spans(&text);
        out.push(Paragraph {
            text,
            lines,
            spans,
            headings: headings.iter().map(|(_, h)| h.clone()).collect(),
            table_row: row,
        });
    };
    for (i, raw) in doc.text.lines().enumerate() {
        let n = i + 1;
        let trimmed = raw.trim_start();
        if let Some(open) = &fence {
            if trimmed.starts_with(open.as_str()) {
                fence = None;
                continue;
            }
            // Join `\` continuations into one command line.
            let (start, mut text) = pending_code.take().unwrap_or((n, String::new()));
            text.push_str(raw.trim_end().trim_end_matches('\\'));
            if raw.trim_end().ends_with('\\') {
                text.push(' ');
                pending_code = Some((start, text));
            } else {
                parsed.code.push(CodeLine { text, line: start });
            }
            continue;
        }
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            flush(
                &mut current,
                current_is_row,
                &headings,
                &mut parsed.paragraphs,
            );
            fence = Some(trimmed[..3].to_owned());
            continue;
        }
        if let Some(level) = heading_level(trimmed) {
            flush(
                &mut current,
                current_is_row,
                &headings,
                &mut parsed.paragraphs,
            );
            let title = trimmed[level..].trim().to_owned();
            while headings.last().is_some_and(|(l, _)| *l >= level) {
                headings.pop();
            }
            headings.push((level, title.clone()));
            parsed.headings.push((title.clone(), n));
            // A heading is prose too: its code spans can name programs and flags.
            current.push((n, title));
            flush(&mut current, false, &headings, &mut parsed.paragraphs);
            continue;
        }
        if trimmed.is_empty() {
            flush(
                &mut current,
                current_is_row,
                &headings,
                &mut parsed.paragraphs,
            );
            continue;
        }
        let row = trimmed.starts_with('|');
        let item = trimmed.starts_with("- ")
            || trimmed.starts_with("* ")
            || trimmed
                .split_once(". ")
                .is_some_and(|(d, _)| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()));
        if row || current_is_row || item {
            flush(
                &mut current,
                current_is_row,
                &headings,
                &mut parsed.paragraphs,
            );
        }
        current_is_row = row;
        current.push((n, raw.to_owned()));
    }
    flush(
        &mut current,
        current_is_row,
        &headings,
        &mut parsed.paragraphs,
    );
    parsed
}

fn heading_level(line: &str) -> Option<usize> {
    let level = line.chars().take_while(|c| *c == '#').count();
    (1..=6)
        .contains(&level)
        .then_some(level)
        .filter(|&l| line[l..].starts_with(' '))
}

/// The inline code spans of a paragraph (a run of n backticks closed by the next run of n).
fn code_spans(text: &str) -> Vec<Span> {
    let bytes = text.as_bytes();
    let mut spans = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'`' {
            i += 1;
            continue;
        }
        let run = bytes[i..].iter().take_while(|b| **b == b'`').count();
        let open_end = i + run;
        let mut j = open_end;
        let mut close = None;
        while j < bytes.len() {
            if bytes[j] == b'`' {
                let r = bytes[j..].iter().take_while(|b| **b == b'`').count();
                if r == run {
                    close = Some(j);
                    break;
                }
                j += r;
            } else {
                j += 1;
            }
        }
        match close {
            Some(c) => {
                spans.push(Span {
                    text: text[open_end..c].trim().to_owned(),
                    start: i,
                    end: c + run,
                });
                i = c + run;
            }
            None => i = open_end,
        }
    }
    spans
}

/// GitHub's anchor for a heading: lower case, backticks and punctuation dropped (`-` and `_`
/// kept), spaces become `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor of a document, with GitHub's `-1`, `-2` for repeated headings.
fn anchors(parsed: &Parsed) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (h, _) in &parsed.headings {
        let s = slug(h);
        let n = seen.entry(s.clone()).or_insert(0);
        out.insert(if *n == 0 {
            s.clone()
        } else {
            format!("{s}-{n}")
        });
        *n += 1;
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Commands: which program a flag belongs to.

/// A command in a code line or span: an ipkeep program (`ipkeep-operator check`), or another one
/// (`None`), and the `--flags` given to it.
#[derive(Debug)]
struct Cmd {
    program: Option<String>,
    flags: Vec<String>,
}

/// `--name` of a token such as `--name=value`, `--name,` or `--name)`.
fn flag_name(token: &str) -> Option<String> {
    let t = token.trim_matches(|c: char| matches!(c, '`' | '(' | '[' | '"' | '\''));
    let rest = t.strip_prefix("--")?;
    let name: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    let name = name.trim_end_matches('-');
    (!name.is_empty() && name.starts_with(|c: char| c.is_ascii_lowercase()))
        .then(|| format!("--{name}"))
}

fn basename(token: &str) -> &str {
    token.rsplit('/').next().unwrap_or(token)
}

/// The commands on one line: split at `|`, `&&`, `||`, `;`, and at `#` (a comment).
fn commands(text: &str, truth: &Truth) -> Vec<Cmd> {
    let text = text.split(" #").next().unwrap_or(text);
    let text = if text.trim_start().starts_with('#') {
        ""
    } else {
        text
    };
    let mut out = Vec::new();
    for segment in text.split(['|', ';']).flat_map(|s| s.split("&&")) {
        let tokens: Vec<&str> = segment.split_whitespace().collect();
        let mut program = None;
        let mut flags = Vec::new();
        let mut i = 0;
        while i < tokens.len() {
            let token = tokens[i].trim_matches(|c: char| matches!(c, '`' | '(' | ')' | '"'));
            let base = basename(token);
            let package = i > 0 && matches!(tokens[i - 1], "-p" | "--package" | "--bin");
            let runs = i == 0
                || matches!(tokens[i - 1], "--" | "exec" | "sudo" | "env")
                || tokens[i - 1].contains('=')
                || (package && tokens.get(i + 1) == Some(&"--"));
            let path_alone = token.contains('/') && i + 1 == tokens.len();
            if program.is_none() && BINARIES.contains(&base) && runs && !path_alone {
                let mut name = base.to_owned();
                let mut j = i + 1;
                if tokens.get(j) == Some(&"--") {
                    j += 1;
                }
                if let Some(sub) = tokens.get(j)
                    && truth
                        .subcommands
                        .get(base)
                        .is_some_and(|s| s.contains(*sub))
                {
                    name = format!("{base} {sub}");
                    j += 1;
                }
                program = Some(name);
                // Flags before the program are another command's (kubectl exec … --).
                flags.clear();
                i = j;
                continue;
            }
            if i == 0
                && program.is_none()
                && truth
                    .subcommands
                    .get("ipkeep-operator")
                    .is_some_and(|s| s.contains(token))
                && tokens.get(1).is_some_and(|t| t.starts_with("--"))
            {
                program = Some(format!("ipkeep-operator {token}"));
                i += 1;
                continue;
            }
            if let Some(f) = flag_name(tokens[i]) {
                flags.push(f);
            }
            i += 1;
        }
        if program.is_some() || !flags.is_empty() {
            out.push(Cmd { program, flags });
        }
    }
    out
}

/// The program a code span names, if it is a command of one or a subcommand's bare name.
fn program_named(span: &str, truth: &Truth) -> Option<String> {
    if let Some(cmd) = commands(span, truth)
        .into_iter()
        .find(|c| c.program.is_some())
    {
        return cmd.program;
    }
    truth
        .subcommands
        .get("ipkeep-operator")
        .filter(|s| s.contains(span))
        .map(|_| format!("ipkeep-operator {span}"))
}

// ---------------------------------------------------------------------------------------------
// Small scanners.

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur.push((prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

fn nearest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a String>) -> Option<String> {
    candidates
        .into_iter()
        .min_by_key(|c| (levenshtein(name, c), c.len()))
        .cloned()
}

/// Each match of `prefix` followed by the characters `name_char` admits, with its byte offset.
fn tokens_after<'a>(
    text: &'a str,
    prefix: &str,
    name_char: impl Fn(char) -> bool + 'a,
) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(found) = text[from..].find(prefix) {
        let at = from + found;
        let rest = &text[at + prefix.len()..];
        let len: usize = rest
            .chars()
            .take_while(|c| name_char(*c))
            .map(char::len_utf8)
            .sum();
        out.push((at, format!("{prefix}{}", &rest[..len])));
        from = at + prefix.len();
    }
    out
}

fn is_camel(word: &str) -> bool {
    word.len() > 2
        && word.starts_with(|c: char| c.is_ascii_uppercase())
        && word.chars().all(|c| c.is_ascii_alphanumeric())
        && word.chars().any(|c| c.is_ascii_lowercase())
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset].matches('\n').count() + 1
}

const FILE_EXTENSIONS: [&str; 16] = [
    "rs", "md", "yaml", "yml", "json", "txt", "sh", "tpl", "toml", "tar", "csv", "png", "go",
    "conf", "conflist", "service",
];

// ---------------------------------------------------------------------------------------------
// The check.

/// Every finding in `docs` against `truth`, sorted by file and line.
fn check(docs: &[Doc], truth: &Truth) -> Vec<Finding> {
    let parsed: Vec<(&Doc, Parsed)> = docs.iter().map(|d| (d, parse(d))).collect();
    let mut out = Vec::new();
    let foreign = foreign_flags(&parsed, truth);
    for (doc, p) in &parsed {
        if doc.path.ends_with("CHANGELOG.md") || !is_checked(&doc.path) {
            continue;
        }
        check_flags(doc, p, truth, &foreign, &mut out);
        check_values(doc, p, truth, &mut out);
        check_metrics(doc, truth, &mut out);
        check_annotations(doc, truth, &mut out);
        check_reasons(doc, p, truth, &mut out);
        check_columns(doc, p, truth, &mut out);
    }
    check_reason_table(&parsed, truth, &mut out);
    check_metric_homes(docs, truth, &mut out);
    check_anchors(&parsed, &mut out);
    out.sort();
    out.dedup();
    out
}

/// Texts whose names are checked; the others (the chart's templates, CHANGELOG.md) only serve
/// as link targets or hold links.
fn is_checked(path: &str) -> bool {
    path == "README.md"
        || (path.starts_with("docs/") && is_markdown(path))
        || path.ends_with("templates/NOTES.txt")
}

/// Flags that appear on a command of another program (helm, kubectl, cargo, …) anywhere.
fn foreign_flags(parsed: &[(&Doc, Parsed)], truth: &Truth) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (doc, p) in parsed {
        if !is_checked(&doc.path) {
            continue;
        }
        let texts = p.code.iter().map(|c| c.text.as_str()).chain(
            p.paragraphs
                .iter()
                .flat_map(|para| para.spans.iter().map(|s| s.text.as_str())),
        );
        for text in texts {
            for cmd in commands(text, truth) {
                // A span that is only flags names no program: not evidence of another tool.
                if cmd.program.is_none() && !text.trim_start().starts_with("--") {
                    out.extend(cmd.flags);
                }
            }
        }
    }
    out
}

fn flag_finding(
    doc: &Doc,
    line: usize,
    program: Option<&str>,
    flag: &str,
    truth: &Truth,
) -> Finding {
    let all: BTreeSet<String> = truth.flags.values().flatten().cloned().collect();
    let (problem, candidates) = match program {
        Some(p) => (
            format!("`{p}` has no such flag"),
            truth
                .flags
                .iter()
                .filter(|(q, _)| *q == p || q.starts_with(&format!("{p} ")))
                .flat_map(|(_, f)| f.iter().cloned())
                .collect(),
        ),
        None => ("no ipkeep program has this flag".to_owned(), all),
    };
    Finding {
        path: doc.path.clone(),
        line,
        kind: Kind::Flag,
        name: flag.to_owned(),
        problem,
        nearest: nearest(flag, &candidates),
    }
}

fn check_flags(
    doc: &Doc,
    p: &Parsed,
    truth: &Truth,
    foreign: &BTreeSet<String>,
    out: &mut Vec<Finding>,
) {
    let has = |program: &str, flag: &str| program_has(truth, program, flag);
    for code in &p.code {
        for cmd in commands(&code.text, truth) {
            let Some(program) = &cmd.program else {
                continue;
            };
            for flag in &cmd.flags {
                if !has(program, flag) {
                    out.push(flag_finding(doc, code.line, Some(program), flag, truth));
                }
            }
        }
    }
    for para in &p.paragraphs {
        for span in &para.spans {
            let line = para.line_at(span.start);
            if !span.text.starts_with("--") {
                for cmd in commands(&span.text, truth) {
                    let Some(program) = &cmd.program else {
                        continue;
                    };
                    for flag in &cmd.flags {
                        if !has(program, flag) {
                            out.push(flag_finding(doc, line, Some(program), flag, truth));
                        }
                    }
                }
                continue;
            }
            // A span that is only a flag: the programs its sentence and its heading name.
            let Some(flag) = span.text.split_whitespace().next().and_then(flag_name) else {
                continue;
            };
            if foreign.contains(&flag) || para.skipped() {
                continue;
            }
            let (s, e) = para.sentence(span.start);
            let mut programs: Vec<String> = para
                .spans
                .iter()
                .filter(|o| o.start >= s && o.end <= e && !o.text.starts_with("--"))
                .filter_map(|o| program_named(&o.text, truth))
                .collect();
            programs.extend(para.headings.iter().rev().find_map(|h| {
                code_spans(h)
                    .iter()
                    .find_map(|s| program_named(&s.text, truth))
            }));
            if programs.is_empty() {
                // No program named: a near miss of one of ipkeep's flags is a misspelling.
                let all: BTreeSet<String> = truth.flags.values().flatten().cloned().collect();
                let near = nearest(&flag, &all)
                    .is_some_and(|n| levenshtein(&flag, &n) <= near_miss(&flag[2..]));
                if !all.contains(&flag) && near {
                    out.push(flag_finding(doc, line, None, &flag, truth));
                }
                continue;
            }
            let known = programs.iter().any(|p| program_has(truth, p, &flag));
            if !known && !para.names_another_tool(s, e) {
                out.push(flag_finding(doc, line, Some(&programs[0]), &flag, truth));
            }
        }
    }
}

/// Edits within which a name not found is taken for a misspelling of the nearest real one.
fn near_miss(name: &str) -> usize {
    (name.len() / 5).max(1)
}

/// Whether `program` has `flag`; a binary named without its subcommand has its subcommands'.
fn program_has(truth: &Truth, program: &str, flag: &str) -> bool {
    let prefix = format!("{program} ");
    truth
        .flags
        .iter()
        .any(|(p, flags)| (p == program || p.starts_with(&prefix)) && flags.contains(flag))
}

fn top_level_keys(truth: &Truth) -> BTreeSet<String> {
    truth
        .values
        .keys()
        .map(|k| k.split(['.', '[']).next().unwrap_or(k).to_owned())
        .collect()
}

fn value_exists(path: &str, truth: &Truth) -> bool {
    if truth.values.contains_key(path) {
        return true;
    }
    let section = format!("{path}.");
    if truth.values.keys().any(|k| k.starts_with(&section)) {
        return true;
    }
    truth.values.iter().any(|(k, v)| {
        (v.is_object() || v.is_array())
            && (path.starts_with(&format!("{k}.")) || path.starts_with(&format!("{k}[")))
    })
}

fn check_values(doc: &Doc, p: &Parsed, truth: &Truth, out: &mut Vec<Finding>) {
    for para in p.paragraphs.iter().filter(|para| !para.skipped()) {
        for (at, path) in value_names(&para.text, truth) {
            let (s, e) = para.sentence(at);
            if !para.prose_names(s, e, &OTHER_CHARTS) {
                push_value(doc, para.line_at(at), &path, truth, out);
            }
        }
    }
    for code in &p.code {
        for (_, path) in value_names(&code.text, truth) {
            push_value(doc, code.line, &path, truth, out);
        }
    }
}

/// The dotted names in `text` that start with a top-level key of the chart's values (a path or
/// a file name is not one), with their offsets.
fn value_names(text: &str, truth: &Truth) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for top in top_level_keys(truth) {
        let name_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '[' | ']');
        for (at, found) in tokens_after(text, &format!("{top}."), name_char) {
            let before = text[..at].chars().next_back();
            let after_values = text[..at].ends_with(".Values.");
            if !after_values
                && before.is_some_and(|c| {
                    c.is_ascii_alphanumeric() || matches!(c, '_' | '/' | '.' | '-' | '$')
                })
            {
                continue;
            }
            let path = found.trim_end_matches(['.', '[', ']']);
            let last = path.rsplit('.').next().unwrap_or(path);
            if path.len() <= top.len() + 1
                || FILE_EXTENSIONS.contains(&last)
                || text[at + path.len()..].starts_with('/')
            {
                continue;
            }
            out.push((at, path.to_owned()));
        }
    }
    out
}

fn push_value(doc: &Doc, line: usize, path: &str, truth: &Truth, out: &mut Vec<Finding>) {
    if !value_exists(path, truth) {
        out.push(Finding {
            path: doc.path.clone(),
            line,
            kind: Kind::Value,
            name: path.to_owned(),
            problem: "not a value of the chart (files/defaults.json)".into(),
            nearest: nearest(path, truth.values.keys()),
        });
    }
}

fn check_metrics(doc: &Doc, truth: &Truth, out: &mut Vec<Finding>) {
    let text = &doc.text;
    let name_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    for (at, name) in tokens_after(text, "ipkeep_", name_char) {
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
            || text[at + name.len()..].starts_with("::")
            || truth.crates.contains(&name)
            || name == "ipkeep_"
        {
            continue;
        }
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(&name);
        if !truth.metrics.contains_key(&name) && !truth.metrics.contains_key(base) {
            out.push(Finding {
                path: doc.path.clone(),
                line: line_of(text, at),
                kind: Kind::Metric,
                name: name.clone(),
                problem: "no such metric is registered".into(),
                nearest: nearest(&name, truth.metrics.keys()),
            });
        }
    }
}

fn check_metric_homes(docs: &[Doc], truth: &Truth, out: &mut Vec<Finding>) {
    for (metric, home) in &truth.metrics {
        let Some(doc) = docs.iter().find(|d| &d.path == home) else {
            continue;
        };
        let reference = metrics_sections(&doc.text);
        let named = tokens_after(&reference, metric, |c| {
            c.is_ascii_alphanumeric() || c == '_'
        })
        .iter()
        .any(|(_, n)| n == metric);
        if !named {
            let line = doc
                .text
                .lines()
                .position(|l| l.starts_with('#') && l.to_lowercase().contains("metrics"))
                .map_or(1, |i| i + 1);
            out.push(Finding {
                path: home.clone(),
                line,
                kind: Kind::Metric,
                name: metric.clone(),
                problem: "registered by the code but missing from this page's metrics reference"
                    .into(),
                nearest: None,
            });
        }
    }
}

/// The sections of a page whose heading speaks of metrics (with their subsections), or the whole
/// page when none does.
fn metrics_sections(text: &str) -> String {
    let mut out = String::new();
    let mut inside: Option<usize> = None;
    let mut fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
        }
        if let Some(level) = heading_level(line).filter(|_| !fence) {
            if inside.is_some_and(|l| level <= l) {
                inside = None;
            }
            if inside.is_none() && line.to_lowercase().contains("metrics") {
                inside = Some(level);
            }
        }
        if inside.is_some() {
            out.push_str(line);
            out.push('\n');
        }
    }
    if out.is_empty() { text.to_owned() } else { out }
}

fn check_annotations(doc: &Doc, truth: &Truth, out: &mut Vec<Finding>) {
    let text = doc.text.replace("ipkeep\\.dev/", "ipkeep.dev/");
    for (at, key) in tokens_after(&text, "ipkeep.dev/", annotation_char) {
        let key = key.trim_end_matches(['.', '-']);
        if key == "ipkeep.dev/" || text[at + key.len()..].starts_with('*') {
            continue;
        }
        if !truth.annotations.contains(key) {
            out.push(Finding {
                path: doc.path.clone(),
                line: line_of(&text, at),
                kind: Kind::Annotation,
                name: key.to_owned(),
                problem: "no such key in the code, the chart or the CRD".into(),
                nearest: nearest(key, &truth.annotations),
            });
        }
    }
}

fn annotation_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')
}

fn reason_named(name: &str, truth: &Truth) -> Option<EventReason> {
    truth.reasons.iter().copied().find(|r| r.name == name)
}

fn check_reasons(doc: &Doc, p: &Parsed, truth: &Truth, out: &mut Vec<Finding>) {
    let names: Vec<String> = truth.reasons.iter().map(|r| r.name.to_owned()).collect();
    for para in p.paragraphs.iter().filter(|para| !para.skipped()) {
        if para.text.contains(EVERY_REASON) {
            check_every_reason(doc, para, truth, out);
        }
        for span in &para.spans {
            if !is_camel(&span.text) {
                continue;
            }
            let (s, e) = para.sentence(span.start);
            let sentence = &para.text[s..e];
            let about_events = ["Event", "Warning", "Normal"]
                .iter()
                .any(|w| sentence.contains(w));
            if !about_events {
                continue;
            }
            let line = para.line_at(span.start);
            let before = para.text[..span.start].trim_end();
            let said = if before.ends_with("Warning") || before.ends_with("Warning Event") {
                Some(true)
            } else if before.ends_with("Normal") || before.ends_with("Normal Event") {
                Some(false)
            } else {
                None
            };
            match reason_named(&span.text, truth) {
                Some(r) => {
                    if said.is_some_and(|w| w != r.warning) {
                        out.push(Finding {
                            path: doc.path.clone(),
                            line,
                            kind: Kind::Reason,
                            name: span.text.clone(),
                            problem: format!(
                                "called {}, but the code posts it as {}",
                                type_name(!r.warning),
                                type_name(r.warning)
                            ),
                            nearest: None,
                        });
                    }
                }
                None => {
                    let near = nearest(&span.text, &names);
                    let near_miss = near.as_ref().is_some_and(|n| {
                        levenshtein(&span.text, n) <= near_miss(&span.text).max(span.text.len() / 4)
                    });
                    if !truth.identifiers.contains(&span.text) && (said.is_some() || near_miss) {
                        out.push(Finding {
                            path: doc.path.clone(),
                            line,
                            kind: Kind::Reason,
                            name: span.text.clone(),
                            problem: "no Event has this reason (nor do the sources use the name)"
                                .into(),
                            nearest: near,
                        });
                    }
                }
            }
        }
    }
}

/// A paragraph claiming to name every reason ([`EVERY_REASON`]) names each, under its type.
fn check_every_reason(doc: &Doc, para: &Paragraph, truth: &Truth, out: &mut Vec<Finding>) {
    let line = para.lines[0].1;
    for r in &truth.reasons {
        if !para.spans.iter().any(|s| s.text == r.name) {
            out.push(Finding {
                path: doc.path.clone(),
                line,
                kind: Kind::Reason,
                name: r.name.to_owned(),
                problem: format!(
                    "the {} posts it as {}; this paragraph says it names every reason, but lacks it",
                    poster_name(r.poster),
                    type_name(r.warning)
                ),
                nearest: None,
            });
        }
    }
    for span in &para.spans {
        let Some(r) = reason_named(&span.text, truth) else {
            continue;
        };
        let (s, e) = para.sentence(span.start);
        let sentence = &para.text[s..e];
        let said = match (sentence.contains("Warning"), sentence.contains("Normal")) {
            (true, false) => true,
            (false, true) => false,
            _ => continue,
        };
        if said != r.warning {
            out.push(Finding {
                path: doc.path.clone(),
                line: para.line_at(span.start),
                kind: Kind::Reason,
                name: span.text.clone(),
                problem: format!(
                    "named among {} Events, but the code posts it as {}",
                    type_name(said),
                    type_name(r.warning)
                ),
                nearest: None,
            });
        }
    }
}

fn type_name(warning: bool) -> &'static str {
    if warning { "Warning" } else { "Normal" }
}

fn poster_name(poster: Poster) -> &'static str {
    match poster {
        Poster::Controller => "controller",
        Poster::Agent => "agent",
    }
}

/// Splits a table row into cells at `|` outside code spans (`\|` is not a separator).
fn cells(row: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cell = String::new();
    let mut in_code = false;
    let mut prev = ' ';
    for c in row
        .trim()
        .trim_start_matches('|')
        .trim_end_matches('|')
        .chars()
    {
        if c == '`' {
            in_code = !in_code;
        }
        if c == '|' && !in_code && prev != '\\' {
            out.push(std::mem::take(&mut cell));
        } else {
            cell.push(c);
        }
        prev = c;
    }
    out.push(cell);
    out
}

fn check_reason_table(parsed: &[(&Doc, Parsed)], truth: &Truth, out: &mut Vec<Finding>) {
    let Some((doc, p)) = parsed.iter().find(|(d, _)| d.path == EVENTS_TABLE_DOC) else {
        return;
    };
    let rows: Vec<&Paragraph> = p.paragraphs.iter().filter(|para| para.table_row).collect();
    let Some(header) = rows.iter().position(|r| {
        let c = cells(&r.text);
        c.len() == 3 && c[1].contains("Normal") && c[2].contains("Warning")
    }) else {
        out.push(Finding {
            path: doc.path.clone(),
            line: 1,
            kind: Kind::Reason,
            name: "Normal/Warning".into(),
            problem: "no Events table (a header with a Normal and a Warning column)".into(),
            nearest: None,
        });
        return;
    };
    let header_line = rows[header].lines[0].1;
    // Each reason as listed (a reason listed twice is checked twice).
    let mut listed: Vec<(String, bool, String, usize)> = Vec::new();
    for row in rows[header + 1..]
        .iter()
        .take_while(|r| r.lines[0].1 <= header_line + 20)
        .skip_while(|r| r.text.contains("---"))
    {
        let c = cells(&row.text);
        if c.len() != 3 || c[0].contains("---") {
            break;
        }
        let poster = c[0].trim().to_owned();
        for (column, warning) in [(1, false), (2, true)] {
            for span in code_spans(&c[column]) {
                if is_camel(&span.text) {
                    listed.push((span.text, warning, poster.clone(), row.lines[0].1));
                }
            }
        }
    }
    let names: Vec<String> = truth.reasons.iter().map(|r| r.name.to_owned()).collect();
    for (name, warning, poster, line) in &listed {
        let finding = |problem: String, nearest: Option<String>| Finding {
            path: doc.path.clone(),
            line: *line,
            kind: Kind::Reason,
            name: name.clone(),
            problem,
            nearest,
        };
        match reason_named(name, truth) {
            None => out.push(finding(
                "listed in the Events table, but no Event has this reason".into(),
                nearest(name, &names),
            )),
            Some(r) => {
                if r.warning != *warning {
                    out.push(finding(
                        format!(
                            "listed as {}, but the code posts it as {}",
                            type_name(*warning),
                            type_name(r.warning)
                        ),
                        None,
                    ));
                }
                if poster_name(r.poster) != poster {
                    out.push(finding(
                        format!(
                            "listed in the {poster} row, but the {} posts it",
                            poster_name(r.poster)
                        ),
                        None,
                    ));
                }
            }
        }
    }
    for r in &truth.reasons {
        if !listed.iter().any(|(name, ..)| name == r.name) {
            out.push(Finding {
                path: doc.path.clone(),
                line: header_line,
                kind: Kind::Reason,
                name: r.name.to_owned(),
                problem: format!(
                    "the {} posts it as {}, but the Events table does not list it",
                    poster_name(r.poster),
                    type_name(r.warning)
                ),
                nearest: None,
            });
        }
    }
}

/// The columns a comment or a sentence lists: upper-case words separated by `,` or `and`.
fn column_list(text: &str) -> Vec<String> {
    let words: Vec<&str> = text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|w| !w.is_empty() && *w != "and")
        .collect();
    words
        .iter()
        .map(|w| w.trim_matches(|c: char| matches!(c, '(' | ')' | '.' | ':' | ';' | '`')))
        .take_while(|w| is_column_word(w))
        .map(str::to_owned)
        .collect()
}

fn is_column_word(w: &str) -> bool {
    w.len() > 1
        && w.chars().all(|c| c.is_ascii_uppercase() || c == '-')
        && w.starts_with(|c: char| c.is_ascii_uppercase())
}

/// Which of `kubectl get ipr`'s column lists a text gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Columns {
    /// The default output: NAME and the priority-0 columns.
    Default,
    /// `-o wide`: NAME and every column, in the CRD's order.
    Wide,
    /// What `-o wide` adds: the columns of a higher priority.
    WideAdds,
}

fn compare_columns(
    doc: &Doc,
    line: usize,
    listed: &[String],
    columns: Columns,
    truth: &Truth,
    out: &mut Vec<Finding>,
) {
    let name = std::iter::once("NAME".to_owned());
    let of = |keep: fn(i64) -> bool| {
        truth
            .columns
            .iter()
            .filter(move |(_, p)| keep(*p))
            .map(|(c, _)| c.clone())
    };
    let want: Vec<String> = match columns {
        Columns::Default => name.chain(of(|p| p == 0)).collect(),
        Columns::Wide => name.chain(of(|_| true)).collect(),
        Columns::WideAdds => of(|p| p > 0).collect(),
    };
    if listed == want {
        return;
    }
    let every: Vec<String> = std::iter::once("NAME".to_owned())
        .chain(truth.columns.iter().map(|(c, _)| c.clone()))
        .collect();
    let mut reported = false;
    for c in listed {
        if !every.contains(c) {
            reported = true;
            out.push(Finding {
                path: doc.path.clone(),
                line,
                kind: Kind::Column,
                name: c.clone(),
                problem: "the CRD has no such printer column".into(),
                nearest: nearest(c, &every),
            });
        }
    }
    if !reported {
        out.push(Finding {
            path: doc.path.clone(),
            line,
            kind: Kind::Column,
            name: listed.join(", "),
            problem: match columns {
                Columns::Default => format!("`kubectl get ipr` shows {}", want.join(", ")),
                Columns::Wide => format!("`kubectl get ipr -o wide` shows {}", want.join(", ")),
                Columns::WideAdds => format!("`kubectl get ipr -o wide` adds {}", want.join(", ")),
            },
            nearest: None,
        });
    }
}

fn check_columns(doc: &Doc, p: &Parsed, truth: &Truth, out: &mut Vec<Finding>) {
    for code in &p.code {
        if !(code.text.contains("kubectl get ipr")
            || code.text.contains("kubectl get ipreservation"))
        {
            continue;
        }
        let Some((command, comment)) = code.text.split_once(" # ") else {
            continue;
        };
        let comment = comment.trim();
        let list = column_list(comment.trim_start_matches('+'));
        if list.is_empty() {
            continue;
        }
        let columns = if comment.starts_with('+') {
            Columns::WideAdds
        } else if command.contains("-o wide") {
            Columns::Wide
        } else {
            Columns::Default
        };
        compare_columns(doc, code.line, &list, columns, truth, out);
    }
    let every: Vec<String> = std::iter::once("NAME".to_owned())
        .chain(truth.columns.iter().map(|(c, _)| c.clone()))
        .collect();
    for para in &p.paragraphs {
        // A sentence about `kubectl get ipr` listing columns.
        if para.text.contains("kubectl get ipr") {
            for (at, _) in para.text.match_indices("NAME,") {
                let list = column_list(&para.text[at..]);
                let before = &para.text[at.saturating_sub(12)..at];
                if before.contains("at least") {
                    // A claim about some of the columns: each must be one.
                    for c in list.iter().filter(|c| !every.contains(c)) {
                        out.push(Finding {
                            path: doc.path.clone(),
                            line: para.line_at(at),
                            kind: Kind::Column,
                            name: c.clone(),
                            problem: "the CRD has no such printer column".into(),
                            nearest: nearest(c, &every),
                        });
                    }
                } else {
                    compare_columns(doc, para.line_at(at), &list, Columns::Default, truth, out);
                }
            }
            for (at, _) in para.text.match_indices("-o wide` adds ") {
                let from = at + "-o wide` adds ".len();
                let list = column_list(&para.text[from..]);
                compare_columns(doc, para.line_at(at), &list, Columns::WideAdds, truth, out);
            }
        }
        // A backticked upper-case word called a column.
        for span in &para.spans {
            if is_column_word(&span.text)
                && para.text[span.end..].trim_start().starts_with("column")
                && !every.contains(&span.text)
            {
                out.push(Finding {
                    path: doc.path.clone(),
                    line: para.line_at(span.start),
                    kind: Kind::Column,
                    name: span.text.clone(),
                    problem: "the CRD has no such printer column".into(),
                    nearest: nearest(&span.text, &every),
                });
            }
        }
    }
}

/// Relative links `(file.md#anchor)`, `(#anchor)` in Markdown prose, and `docs/….md#anchor` in
/// the chart's files, each resolved against the target's headings.
fn check_anchors(parsed: &[(&Doc, Parsed)], out: &mut Vec<Finding>) {
    let targets: BTreeMap<&str, BTreeSet<String>> = parsed
        .iter()
        .filter(|(d, _)| is_markdown(&d.path))
        .map(|(d, p)| (d.path.as_str(), anchors(p)))
        .collect();
    for (doc, p) in parsed {
        let mut links: Vec<(usize, String)> = Vec::new();
        if is_markdown(&doc.path) {
            for para in &p.paragraphs {
                for (at, _) in para.text.match_indices("](") {
                    if para.spans.iter().any(|s| s.start <= at && at < s.end) {
                        continue;
                    }
                    let rest = &para.text[at + 2..];
                    let Some(end) = rest.find(')') else { continue };
                    let target = &rest[..end];
                    if target.contains("://") || target.starts_with("mailto:") {
                        continue;
                    }
                    let dir = Path::new(&doc.path).parent().unwrap_or(Path::new(""));
                    let resolved = match target.split_once('#') {
                        Some(("", anchor)) => format!("{}#{anchor}", doc.path),
                        Some((file, anchor)) => format!("{}#{anchor}", normalise(dir, file)),
                        None => normalise(dir, target),
                    };
                    links.push((para.line_at(at), resolved));
                }
            }
        } else {
            let name_char =
                |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/' | '#');
            for (at, found) in tokens_after(&doc.text, "docs/", name_char) {
                let found = found.trim_end_matches(['.', ',']);
                if found.contains(".md#") {
                    links.push((line_of(&doc.text, at), found.to_owned()));
                }
            }
        }
        for (line, link) in links {
            let (file, anchor) = match link.split_once('#') {
                Some((f, a)) => (f.to_owned(), Some(a.to_owned())),
                None => (link.clone(), None),
            };
            if !is_markdown(&file) {
                continue;
            }
            let Some(headings) = targets.get(file.as_str()) else {
                out.push(Finding {
                    path: doc.path.clone(),
                    line,
                    kind: Kind::Anchor,
                    name: link.clone(),
                    problem: "links to a Markdown file the check was not given".into(),
                    nearest: nearest(
                        &file,
                        &targets.keys().map(|k| (*k).to_owned()).collect::<Vec<_>>(),
                    ),
                });
                continue;
            };
            if let Some(anchor) = anchor
                && !headings.contains(&anchor)
            {
                out.push(Finding {
                    path: doc.path.clone(),
                    line,
                    kind: Kind::Anchor,
                    name: link.clone(),
                    problem: format!("{file} has no heading with this anchor"),
                    nearest: nearest(&anchor, headings),
                });
            }
        }
    }
}

/// `dir/file` with `..` and `.` resolved, as a path from the repository's root.
fn normalise(dir: &Path, file: &str) -> String {
    let mut parts: Vec<String> = dir
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    for part in file.split('/') {
        match part {
            "." | "" => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p.to_owned()),
        }
    }
    parts.join("/")
}

// ---------------------------------------------------------------------------------------------
// The truth, from the repository.

/// The flags of each option line of a `--help` (the first `--name` on a line starting with `-`).
fn help_flags(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter(|l| l.trim_start().starts_with('-'))
        .filter_map(|l| l.split_whitespace().find_map(flag_name))
        .collect()
}

/// The subcommands a `--help` lists under `Commands:` (`help` left out).
fn help_subcommands(help: &str) -> BTreeSet<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|s| *s != "help")
        .map(str::to_owned)
        .collect()
}

fn help(binary: &Path, args: &[&str]) -> String {
    let output = Command::new(binary)
        .args(args)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("failed to run {} {args:?} --help: {e}", binary.display()));
    assert!(
        output.status.success(),
        "{} {args:?} --help failed: {}",
        binary.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Whether `binary sub` takes `flag` (given a value, then `--help`): an unknown flag is refused
/// as an "unexpected argument" before the help is printed.
fn accepts(binary: &Path, sub: &str, flag: &str) -> bool {
    let output = Command::new(binary)
        .args([sub, &format!("{flag}=x"), "--help"])
        .output()
        .unwrap_or_else(|e| panic!("failed to run {}: {e}", binary.display()));
    !String::from_utf8_lossy(&output.stderr).contains(&format!("unexpected argument '{flag}"))
}

fn rust_sources(dir: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("failed to read {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path
                .strip_prefix(repo_root())
                .unwrap()
                .to_string_lossy()
                .into_owned();
            out.push((rel, std::fs::read_to_string(&path).unwrap()));
        }
    }
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo_root().join(path))
        .unwrap_or_else(|e| panic!("failed to read {path}: {e}"))
}

impl Truth {
    fn from_repo() -> Truth {
        let root = repo_root();
        let mut truth = Truth {
            reasons: ALL.to_vec(),
            ..Truth::default()
        };
        let mut sources = Vec::new();
        for crate_dir in [
            "operator",
            "docker",
            "plugin",
            "reservation",
            "netdir",
            "hostlocal",
        ] {
            rust_sources(&root.join(crate_dir).join("src"), &mut sources);
        }
        // Hidden aliases (`#[arg(alias = "…")]`) are not in `--help`: each one the sources
        // declare is offered to every program, which takes it or says "unexpected argument".
        let aliases: BTreeSet<String> = sources
            .iter()
            .flat_map(|(_, text)| {
                tokens_after(text, "alias = \"", |c| c.is_ascii_lowercase() || c == '-')
            })
            .map(|(_, a)| format!("--{}", a.trim_start_matches("alias = \"")))
            .collect();
        for (name, binary) in [
            ("ipkeep-operator", operator_binary()),
            ("ipkeep-docker", docker_binary()),
        ] {
            let top = help(&binary, &[]);
            truth.flags.insert(name.to_owned(), help_flags(&top));
            let subs = help_subcommands(&top);
            assert!(
                !subs.is_empty(),
                "{name} --help lists no subcommand:\n{top}"
            );
            for sub in &subs {
                let mut flags = help_flags(&help(&binary, &[sub]));
                flags.extend(aliases.iter().filter(|a| accepts(&binary, sub, a)).cloned());
                truth.flags.insert(format!("{name} {sub}"), flags);
            }
            truth.subcommands.insert(name.to_owned(), subs);
        }
        let defaults: serde_json::Map<String, Value> =
            serde_json::from_str(&read("charts/ipkeep/files/defaults.json")).unwrap();
        truth.values = defaults.into_iter().collect();

        let workspace = read("Cargo.toml");
        for member in workspace
            .lines()
            .find(|l| l.starts_with("members"))
            .unwrap()
            .split('"')
            .skip(1)
            .step_by(2)
        {
            let manifest = read(&format!("{member}/Cargo.toml"));
            let name = manifest
                .lines()
                .find_map(|l| l.strip_prefix("name = \""))
                .and_then(|l| l.strip_suffix('"'))
                .unwrap();
            truth.crates.insert(name.replace('-', "_"));
        }
        let crd = read("crds/ipreservations.ipkeep.dev.yaml");
        let mut chart_texts = vec![read("charts/ipkeep/values.yaml"), crd.clone()];
        for entry in std::fs::read_dir(root.join("charts/ipkeep/templates")).unwrap() {
            chart_texts.push(std::fs::read_to_string(entry.unwrap().path()).unwrap());
        }
        for (path, text) in &sources {
            for (_, literal) in tokens_after(text, "\"ipkeep_", |c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'
            }) {
                let name = literal.trim_start_matches('"').to_owned();
                let home = if path.starts_with("docker/") {
                    "docs/docker.md"
                } else {
                    "docs/operator.md"
                };
                truth.metrics.insert(name, home.to_owned());
            }
            if path.starts_with("operator/") {
                truth.identifiers.extend(
                    text.split(|c: char| !c.is_ascii_alphanumeric())
                        .filter(|w| is_camel(w))
                        .map(str::to_owned),
                );
            }
        }
        truth.identifiers.extend(
            crd.split(|c: char| !c.is_ascii_alphanumeric())
                .filter(|w| is_camel(w))
                .map(str::to_owned),
        );
        for text in sources.iter().map(|(_, t)| t).chain(chart_texts.iter()) {
            for (_, key) in tokens_after(text, "ipkeep.dev/", annotation_char) {
                let key = key.trim_end_matches(['.', '-']);
                if key != "ipkeep.dev/" {
                    truth.annotations.insert(key.to_owned());
                }
            }
        }
        let crd: Value = serde_saphyr::from_str(&crd).unwrap();
        for version in crd["spec"]["versions"].as_array().unwrap() {
            truth
                .annotations
                .insert(format!("ipkeep.dev/{}", version["name"].as_str().unwrap()));
            for column in version["additionalPrinterColumns"].as_array().unwrap() {
                truth.columns.push((
                    column["name"].as_str().unwrap().to_uppercase(),
                    column["priority"].as_i64().unwrap_or(0),
                ));
            }
        }
        truth
    }
}

/// README.md, docs/*.md, NOTES.txt (checked), and the texts that only hold or receive links:
/// CHANGELOG.md, the chart's templates, values.yaml and files.
fn repo_docs() -> Vec<Doc> {
    let mut paths = vec![
        "README.md".to_owned(),
        "CHANGELOG.md".to_owned(),
        "charts/ipkeep/values.yaml".to_owned(),
    ];
    for (dir, ext) in [
        ("docs", "md"),
        ("charts/ipkeep/templates", ""),
        ("charts/ipkeep/files", ""),
    ] {
        let mut names: Vec<String> = std::fs::read_dir(repo_root().join(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(ext))
            .map(|n| format!("{dir}/{n}"))
            .collect();
        names.sort();
        paths.extend(names);
    }
    paths
        .into_iter()
        .map(|path| Doc {
            text: read(&path),
            path,
        })
        .collect()
}

fn truth() -> &'static Truth {
    static TRUTH: std::sync::OnceLock<Truth> = std::sync::OnceLock::new();
    TRUTH.get_or_init(Truth::from_repo)
}

fn report(findings: &[Finding]) -> String {
    findings
        .iter()
        .map(|f| format!("  {f}\n"))
        .collect::<String>()
}

#[test]
fn the_docs_name_only_what_the_code_has_and_list_all_it_has() {
    let findings = check(&repo_docs(), truth());
    assert!(
        findings.is_empty(),
        "{} finding(s) in the docs against the code:\n{}",
        findings.len(),
        report(&findings)
    );
}

/// The docs with one text replaced in one of them (each replacement must apply exactly once).
fn edited(path: &str, from: &str, to: &str) -> Vec<Doc> {
    let mut docs = repo_docs();
    let doc = docs.iter_mut().find(|d| d.path == path).unwrap();
    assert_eq!(
        doc.text.matches(from).count(),
        1,
        "the case's text {from:?} must occur exactly once in {path}"
    );
    doc.text = doc.text.replacen(from, to, 1);
    docs
}

#[test]
fn a_misspelling_in_the_readme_is_reported_with_its_line_and_the_nearest_real_name() {
    // (what, the text, the misspelt text, what the finding must say)
    let cases = [
        (
            "a flag of a command line",
            "-- /ipkeep-operator check`",
            "-- /ipkeep-operator check --outptu json`",
            "flag `--outptu`: `ipkeep-operator check` has no such flag (nearest: `--output`)",
        ),
        (
            "a flag named in a sentence about a subcommand",
            "`--output json` for scripts",
            "`--ouput json` for scripts",
            "flag `--ouput`: `ipkeep-operator check` has no such flag (nearest: `--output`)",
        ),
        (
            "a flag named on its own",
            "`--node-budget`",
            "`--node-budgte`",
            "flag `--node-budgte`: no ipkeep program has this flag (nearest: `--node-budget`)",
        ),
        (
            "a chart value",
            "at most the chart's `controller.maxRetainFor`",
            "at most the chart's `controller.maxRetianFor`",
            "chart value `controller.maxRetianFor`: not a value of the chart (files/defaults.json) (nearest: `controller.maxRetainFor`)",
        ),
        (
            "a metric",
            "`ipkeep_controller_reservations`",
            "`ipkeep_controller_reservation`",
            "metric `ipkeep_controller_reservation`: no such metric is registered (nearest: `ipkeep_controller_reservations`)",
        ),
        (
            "an Event reason",
            "(Warning `NotReserved`:",
            "(Warning `NotReservd`:",
            "Event reason `NotReservd`: no Event has this reason (nor do the sources use the name) (nearest: `NotReserved`)",
        ),
        (
            "an Event reason given the wrong type",
            "a Warning `PlacementMissed`",
            "a Normal `PlacementMissed`",
            "Event reason `PlacementMissed`: called Normal, but the code posts it as Warning",
        ),
        (
            "a Normal reason among the Warnings",
            "`Yielded` and `NodeGone` from the controller",
            "`Yielded`, `Released` and `NodeGone` from the controller",
            "Event reason `Released`: named among Warning Events, but the code posts it as Normal",
        ),
        (
            "an annotation",
            "`ipkeep.dev/release-with-owner: \"true\"`",
            "`ipkeep.dev/release-with-ownr: \"true\"`",
            "annotation/label `ipkeep.dev/release-with-ownr`: no such key in the code, the chart or the CRD (nearest: `ipkeep.dev/release-with-owner`)",
        ),
        (
            "a printer column",
            "# NAME, IPS, NODE, PHASE,",
            "# NAME, IPS, NODE, PHSE,",
            "printer column `PHSE`: the CRD has no such printer column (nearest: `PHASE`)",
        ),
        (
            "a printer column left out",
            "# + POD-UID, RETAIN-FOR",
            "# + POD-UID",
            "printer column `POD-UID`: `kubectl get ipr -o wide` adds POD-UID, RETAIN-FOR",
        ),
        (
            "an anchor",
            "(docs/operator.md#flags)",
            "(docs/operator.md#flgs)",
            "link `docs/operator.md#flgs`: docs/operator.md has no heading with this anchor (nearest: `flags`)",
        ),
    ];
    let readme = read("README.md");
    for (what, from, to, want) in cases {
        let findings = check(&edited("README.md", from, to), truth());
        let line = readme[..readme.find(from).unwrap()].matches('\n').count() + 1;
        let want = format!("README.md:{line}: {want}");
        assert!(
            findings.iter().any(|f| f.to_string() == want),
            "{what}: wanted {want}, found:\n{}",
            report(&findings)
        );
    }
}

#[test]
fn a_reference_table_without_a_name_the_code_has_is_reported() {
    // (what, the page, its text, the edited text, the finding's start)
    let cases = [
        (
            "a metric missing from docs/operator.md",
            "docs/operator.md",
            "`ipkeep_controller_leader`,",
            "",
            "metric `ipkeep_controller_leader`: registered by the code but missing",
        ),
        (
            "a reason missing from the Events table",
            "docs/operator.md",
            "`Rebound`, ",
            "",
            "Event reason `Rebound`: the controller posts it as Normal, but the Events table does not list it",
        ),
        (
            "a reason left out of README's paragraph that names every one",
            "README.md",
            "`PlacementSkipped`, `RetentionCapped`,",
            "`PlacementSkipped`,",
            "Event reason `RetentionCapped`: the controller posts it as Warning; this paragraph says it names every reason, but lacks it",
        ),
        (
            "a reason in the wrong column",
            "docs/operator.md",
            "| `Reserved`, ",
            "| `Yielded`, `Reserved`, ",
            "Event reason `Yielded`: listed as Normal, but the code posts it as Warning",
        ),
    ];
    for (what, path, from, to, want) in cases {
        let findings = check(&edited(path, from, to), truth());
        assert!(
            findings
                .iter()
                .any(|f| f.to_string().contains(want) && f.path == path),
            "{what}: wanted {want}, found:\n{}",
            report(&findings)
        );
    }
}

/// The alerts' runbook links are checked too: one pointing at a heading that does not exist is
/// reported in the rules file.
#[test]
fn a_runbook_link_to_a_missing_heading_is_reported() {
    let path = "charts/ipkeep/files/ipkeep-rules.yaml";
    let findings = check(
        &edited(
            path,
            "docs/operator.md#ipkeeprangefull\"",
            "docs/operator.md#ipkeeprangeful\"",
        ),
        truth(),
    );
    let want = "link `docs/operator.md#ipkeeprangeful`: docs/operator.md has no heading with this anchor (nearest: `ipkeeprangefull`)";
    assert!(
        findings
            .iter()
            .any(|f| f.path == path && f.to_string().ends_with(want)),
        "wanted {want} in {path}, found:\n{}",
        report(&findings)
    );
}

#[test]
fn a_flag_belongs_to_the_program_run_on_its_command() {
    let mut truth = Truth::default();
    truth.subcommands.insert(
        "ipkeep-operator".into(),
        ["check", "install-cni"].map(str::to_owned).into(),
    );
    truth.subcommands.insert(
        "ipkeep-docker".into(),
        ["list", "serve"].map(str::to_owned).into(),
    );
    /// A command as expected: its program (none: another tool's) and its flags.
    type Expected<'a> = (Option<&'a str>, &'a [&'a str]);
    // (the text, each command)
    let cases: [(&str, &[Expected]); 7] = [
        (
            "ipkeep-operator check --output json",
            &[(Some("ipkeep-operator check"), &["--output"])],
        ),
        (
            "cargo run -p ipkeep-operator -- check --wait",
            &[(Some("ipkeep-operator check"), &["--wait"])],
        ),
        (
            "cargo test -p ipkeep-operator --test agent_install_cni",
            &[(None, &["--test"])],
        ),
        (
            "kubectl -n ipkeep-system exec deploy/x -- /ipkeep-operator check --release y",
            &[(Some("ipkeep-operator check"), &["--release"])],
        ),
        (
            "install-cni --from /ipkeep --to DIR",
            &[(Some("ipkeep-operator install-cni"), &["--from", "--to"])],
        ),
        (
            "helm install ipkeep charts/ipkeep --set a=b | ipkeep-docker list --data-dir /d # --nope",
            &[
                (None, &["--set"]),
                (Some("ipkeep-docker list"), &["--data-dir"]),
            ],
        ),
        (
            "--data-dir /var/lib/ipkeep-docker",
            &[(None, &["--data-dir"])],
        ),
    ];
    for (text, want) in cases {
        let got: Vec<(Option<String>, Vec<String>)> = commands(text, &truth)
            .into_iter()
            .map(|c| (c.program, c.flags))
            .collect();
        let want: Vec<(Option<String>, Vec<String>)> = want
            .iter()
            .map(|(p, f)| {
                (
                    p.map(str::to_owned),
                    f.iter().map(|s| (*s).to_owned()).collect(),
                )
            })
            .collect();
        assert_eq!(got, want, "{text}");
    }
}

#[test]
fn github_slugs_drop_punctuation_and_keep_hyphens() {
    for (heading, anchor) in [
        (
            "Switch from host-local, and back",
            "switch-from-host-local-and-back",
        ),
        (
            "Troubleshooting: \"my pod did not get its IP back\"",
            "troubleshooting-my-pod-did-not-get-its-ip-back",
        ),
        ("`cni.replaceHostLocal: true`", "cnireplacehostlocal-true"),
        (
            "Installing the plugin: `ipkeep-operator install-cni`",
            "installing-the-plugin-ipkeep-operator-install-cni",
        ),
        (
            "Speed and memory (`make bench-controller`)",
            "speed-and-memory-make-bench-controller",
        ),
    ] {
        assert_eq!(slug(heading), anchor, "{heading}");
    }
}
