//! What the chart ships for monitoring, checked without a Prometheus server: the alerting rules
//! (`charts/ipkeep/files/ipkeep-rules.yaml`) pass `promtool check rules` and their unit tests
//! (`alert_rules.test.yaml`, `promtool test rules`), every alert has a test where it fires and
//! one where it stays silent, its annotations say what an on-call person needs, and every metric
//! the rules name is one the code registers (or one of Kubernetes' own, listed below with where
//! it comes from). The Grafana dashboard (`charts/ipkeep/files/ipkeep-dashboard.json`) declares the
//! schema version this test knows, its panels are laid out on Grafana's 24-column grid without
//! overlapping, each query parses (`promtool check rules`, Grafana's variables given values) and
//! names only metrics that exist.
//!
//! `promtool` is Debian's `prometheus` package (`make deps` installs it); these tests fail, never
//! skip, without it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
};

use ipkeep_e2e::testkit::{self, repo_root};
use serde_json::Value;

/// The rules file, relative to the repository.
const RULES: &str = "charts/ipkeep/files/ipkeep-rules.yaml";
/// Their unit tests, relative to the repository.
const RULE_TESTS: &str = "e2e/tests/plain/alert_rules.test.yaml";

/// The dashboard, relative to the repository.
const DASHBOARD: &str = "charts/ipkeep/files/ipkeep-dashboard.json";
/// The dashboard JSON schema version the dashboard is written in: Grafana 10.4 and 11 write 39,
/// and load it without migrating it.
const DASHBOARD_SCHEMA_VERSION: u64 = 39;
/// The panel types the dashboard may use (Grafana's built-in ones).
const PANEL_TYPES: &[&str] = &[
    "row",
    "timeseries",
    "bargauge",
    "state-timeline",
    "stat",
    "table",
];
/// Grafana's variables in the queries, and what stands for them when a query is parsed.
const GRAFANA_VARIABLES: &[(&str, &str)] = &[("$__rate_interval", "5m"), ("$node", ".*")];

/// Metrics the rules and the dashboard may name that ipkeep does not register, and who does.
const OTHERS_METRICS: &[(&str, &str)] = &[
    ("up", "Prometheus, for every target it scrapes"),
    (
        "apiserver_admission_webhook_fail_open_count",
        "kube-apiserver: calls of a webhook with failurePolicy Ignore that failed",
    ),
    (
        "apiserver_admission_webhook_admission_duration_seconds",
        "kube-apiserver: how long each webhook call took",
    ),
];

/// PromQL's words that are not metric names: the keywords, modifiers and aggregations (which a
/// `by (…)` may separate from their `(`; functions are followed by `(` and skipped anyway).
const PROMQL_WORDS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
];

fn promtool() -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("promtool"))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "promtool is not installed: install Debian's `prometheus` package (make deps does) \
                 to check the alerting rules"
            )
        })
}

/// Runs promtool with `args` in `dir`; its output when it succeeded, else the test fails with it.
fn promtool_ok(dir: &Path, args: &[&str]) -> String {
    let mut cmd = Command::new(promtool());
    cmd.args(args).current_dir(dir);
    let out = testkit::run(cmd, None);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

fn yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(repo_root().join(path)).unwrap();
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{path} is not YAML: {e}"))
}

/// Every alerting rule of the rules file.
fn alerts() -> Vec<Value> {
    yaml(RULES)["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .collect()
}

/// Every `"ipkeep_…"` string literal in the operator's Rust sources: the metrics it registers.
pub fn registered_metrics() -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut dirs = vec![repo_root().join("operator/src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for (at, _) in text.match_indices("\"ipkeep_") {
                    let name: String = text[at + 1..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if text[at + 1 + name.len()..].starts_with('"') {
                        found.insert(name);
                    }
                }
            }
        }
    }
    found
}

/// The metric names a PromQL expression reads: identifiers outside label matchers, ranges and
/// `by (…)` lists, not followed by `(` (a function), not a keyword.
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    let mut last_word = String::new();
    while i < chars.len() {
        let c = chars[i];
        if c == '{' || c == '[' || c == '"' {
            let close = match c {
                '{' => '}',
                '[' => ']',
                _ => '"',
            };
            i += 1;
            while i < chars.len() && chars[i] != close {
                if c == '{' && chars[i] == '"' {
                    i += 1;
                    while i < chars.len() && chars[i] != '"' {
                        i += 1;
                    }
                }
                i += 1;
            }
            i += 1;
            continue;
        }
        if c == '(' && matches!(last_word.as_str(), "by" | "without" | "on" | "ignoring") {
            while i < chars.len() && chars[i] != ')' {
                i += 1;
            }
            i += 1;
            last_word.clear();
            continue;
        }
        if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || matches!(chars[i], '_' | ':'))
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut j = i;
            while j < chars.len() && chars[j].is_whitespace() {
                j += 1;
            }
            let is_call = j < chars.len() && chars[j] == '(';
            let lower = word.to_ascii_lowercase();
            if !is_call && !PROMQL_WORDS.contains(&lower.as_str()) {
                names.insert(word.clone());
            }
            last_word = lower;
            continue;
        }
        if c.is_ascii_digit() {
            // A number (1, 0.5, 1e3) or a duration in an offset.
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
            continue;
        }
        if !c.is_whitespace() {
            last_word.clear();
        }
        i += 1;
    }
    names
}

/// Fails naming each metric of `exprs` that neither ipkeep registers nor is listed in
/// [`OTHERS_METRICS`]; a histogram's series (`_bucket`, `_sum`, `_count`) count as the histogram.
pub fn assert_metrics_exist<'a>(what: &str, exprs: impl IntoIterator<Item = &'a str>) {
    let registered = registered_metrics();
    assert!(
        registered.contains("ipkeep_agent_range_free_addresses"),
        "the scan of operator/src found no metric: {registered:?}"
    );
    let mut unknown = Vec::new();
    for expr in exprs {
        for name in metric_names(expr) {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(&name);
            let known =
                |n: &str| registered.contains(n) || OTHERS_METRICS.iter().any(|(m, _)| *m == n);
            if !known(&name) && !known(base) {
                unknown.push(format!("{name} (in {expr})"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "{what} name metrics no one registers: {unknown:#?}"
    );
}

#[test]
fn the_metric_names_of_an_expression_are_found() {
    let cases: [(&str, &[&str]); 5] = [
        ("up{job=\"ipkeep-agent\"} == 0", &["up"]),
        (
            "histogram_quantile(0.9, sum by (le) (rate(x_bucket{a=\"}\"}[15m]))) > 30",
            &["x_bucket"],
        ),
        ("(sum(a) or vector(0)) < 1", &["a"]),
        ("a / b < 0.1 and c > 0", &["a", "b", "c"]),
        (
            "sum without (instance) (rate(d[5m] offset 1h)) > 1e3",
            &["d"],
        ),
    ];
    for (expr, want) in cases {
        let want: BTreeSet<String> = want.iter().map(|s| (*s).to_owned()).collect();
        assert_eq!(metric_names(expr), want, "{expr}");
    }
}

#[test]
fn the_rules_pass_promtool_check_and_their_unit_tests() {
    let root = repo_root();
    let out = promtool_ok(&root, &["check", "rules", RULES]);
    assert!(out.contains("SUCCESS"), "{out}");
    let tests = root.join(RULE_TESTS);
    let out = promtool_ok(
        tests.parent().unwrap(),
        &[
            "test",
            "rules",
            tests.file_name().unwrap().to_str().unwrap(),
        ],
    );
    assert!(out.contains("SUCCESS"), "{out}");
}

/// `promtool test rules` itself fails on a wrong expectation: a rule test that cannot fail
/// proves nothing.
#[test]
fn promtool_test_rules_fails_when_an_alert_does_not_fire_as_expected() {
    let scratch = testkit::Scratch::new("alert-rules-broken");
    let text = std::fs::read_to_string(repo_root().join(RULE_TESTS))
        .unwrap()
        .replace(
            "../../../charts/ipkeep/files/ipkeep-rules.yaml",
            &repo_root().join(RULES).display().to_string(),
        )
        .replacen("node: node-a", "node: node-z", 1);
    std::fs::write(scratch.join("broken.test.yaml"), text).unwrap();
    let mut cmd = Command::new(promtool());
    cmd.args(["test", "rules", "broken.test.yaml"])
        .current_dir(scratch.path());
    let out = testkit::run(cmd, None);
    assert!(
        !out.status.success(),
        "promtool passed a test expecting node-z: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Every `alert_rule_test` case of the unit tests `tests`.
fn alert_cases(tests: &Value) -> Vec<&Value> {
    tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap())
        .collect()
}

#[test]
fn every_alert_is_tested_firing_and_silent() {
    let tests = yaml(RULE_TESTS);
    let cases = alert_cases(&tests);
    for alert in alerts() {
        let name = alert["alert"].as_str().unwrap();
        let of_it: Vec<&&Value> = cases.iter().filter(|c| c["alertname"] == name).collect();
        let fires = of_it
            .iter()
            .any(|c| c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()));
        let silent = of_it
            .iter()
            .any(|c| c["exp_alerts"].as_array().is_some_and(Vec::is_empty));
        assert!(fires, "no unit test in {RULE_TESTS} where {name} fires");
        assert!(
            silent,
            "no unit test in {RULE_TESTS} where {name} stays silent"
        );
    }
}

/// Each alert has a severity, a summary, a description and a runbook in docs/operator.md (the
/// docs check holds the anchor to a heading); where its series name a node or a network (the
/// labels its firing test expects), the summary or the description says which.
#[test]
fn every_alert_says_what_where_and_what_to_do() {
    let tests = yaml(RULE_TESTS);
    let cases = alert_cases(&tests);
    let all = alerts();
    assert!(all.len() >= 10, "{} alerts", all.len());
    for alert in &all {
        let name = alert["alert"].as_str().unwrap();
        assert!(name.starts_with("Ipkeep"), "{name}");
        let severity = alert["labels"]["severity"].as_str().unwrap_or_default();
        assert!(
            ["warning", "critical"].contains(&severity),
            "{name}: severity {severity:?}"
        );
        let a = &alert["annotations"];
        for key in ["summary", "description", "runbook_url"] {
            assert!(
                a[key].as_str().is_some_and(|s| !s.is_empty()),
                "{name} has no {key}"
            );
        }
        let runbook = a["runbook_url"].as_str().unwrap();
        assert_eq!(
            runbook,
            format!("docs/operator.md#{}", name.to_ascii_lowercase()),
            "{name}'s runbook is its own heading in docs/operator.md"
        );
        let text = format!("{} {}", a["summary"], a["description"]);
        // The labels its series carry: those its firing tests expect.
        let labels: BTreeSet<&str> = cases
            .iter()
            .filter(|c| c["alertname"] == name)
            .flat_map(|c| c["exp_alerts"].as_array().unwrap())
            .flat_map(|e| e["exp_labels"].as_object().unwrap().keys())
            .map(String::as_str)
            .collect();
        for label in ["node", "network"] {
            if labels.contains(label) {
                assert!(
                    text.contains(&format!("{{{{ $labels.{label} }}}}")),
                    "{name}'s series have a {label} label, but its summary and description do not name it: {text}"
                );
            }
        }
    }
}

#[test]
fn the_rules_name_only_metrics_that_exist() {
    let alerts = alerts();
    let exprs: Vec<&str> = alerts.iter().map(|a| a["expr"].as_str().unwrap()).collect();
    assert_metrics_exist(RULES, exprs);
}

fn dashboard() -> Value {
    let text = std::fs::read_to_string(repo_root().join(DASHBOARD)).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{DASHBOARD} is not JSON: {e}"))
}

/// Every panel that queries (not the rows), with its targets.
fn query_panels(d: &Value) -> Vec<&Value> {
    d["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] != "row")
        .collect()
}

/// A query as Prometheus gets it once Grafana has replaced its variables.
fn as_sent(expr: &str) -> String {
    GRAFANA_VARIABLES
        .iter()
        .fold(expr.to_owned(), |e, (var, value)| e.replace(var, value))
}

#[test]
fn the_dashboard_is_laid_out_as_its_schema_version_wants() {
    let d = dashboard();
    assert_eq!(d["schemaVersion"], DASHBOARD_SCHEMA_VERSION, "{DASHBOARD}");
    assert_eq!(d["uid"], "ipkeep");
    assert!(d["title"].is_string());
    let variables: BTreeSet<&str> = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(variables, BTreeSet::from(["datasource", "node"]));
    let panels = d["panels"].as_array().unwrap();
    let mut ids = BTreeSet::new();
    let mut cells: BTreeSet<(u64, u64)> = BTreeSet::new();
    for p in panels {
        let title = p["title"].as_str().unwrap();
        assert!(
            ids.insert(p["id"].as_u64().unwrap()),
            "panel id of {title} twice"
        );
        let kind = p["type"].as_str().unwrap();
        assert!(PANEL_TYPES.contains(&kind), "{title}: panel type {kind}");
        let g = &p["gridPos"];
        let (x, y, w, h) = ["x", "y", "w", "h"]
            .map(|k| {
                g[k].as_u64()
                    .unwrap_or_else(|| panic!("{title}: gridPos.{k}"))
            })
            .into();
        assert!(w > 0 && h > 0 && x + w <= 24, "{title}: gridPos {g}");
        for cx in x..x + w {
            for cy in y..y + h {
                assert!(
                    cells.insert((cx, cy)),
                    "{title} overlaps another panel at {cx},{cy}"
                );
            }
        }
        if kind == "row" {
            continue;
        }
        assert!(
            p["description"].as_str().is_some_and(|s| !s.is_empty()),
            "{title} has no description"
        );
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title} has no query");
        let mut refs = BTreeSet::new();
        for t in targets {
            assert!(
                refs.insert(t["refId"].as_str().unwrap()),
                "{title}: refId twice"
            );
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{title}");
            let expr = t["expr"].as_str().unwrap();
            for var in expr.split('$').skip(1) {
                let name: String = var
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                assert!(
                    GRAFANA_VARIABLES.iter().any(|(v, _)| v[1..] == name),
                    "{title}: ${name} is no variable the dashboard has"
                );
            }
        }
    }
}

/// Every query parses as PromQL: each becomes a recording rule of a scratch rules file that
/// `promtool check rules` reads; a broken query is seen to fail it.
#[test]
fn every_dashboard_query_parses_and_names_only_metrics_that_exist() {
    let d = dashboard();
    let mut exprs = Vec::new();
    for p in query_panels(&d) {
        for t in p["targets"].as_array().unwrap() {
            exprs.push(as_sent(t["expr"].as_str().unwrap()));
        }
    }
    assert!(exprs.len() >= 20, "{} queries", exprs.len());
    let rules_of = |exprs: &[String]| -> String {
        let rules: Vec<Value> = exprs
            .iter()
            .enumerate()
            .map(|(i, e)| serde_json::json!({"record": format!("ipkeep:panel_query_{i}"), "expr": e}))
            .collect();
        serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]}).to_string()
    };
    let scratch = testkit::Scratch::new("dashboard-queries");
    std::fs::write(scratch.join("queries.yaml"), rules_of(&exprs)).unwrap();
    let out = promtool_ok(scratch.path(), &["check", "rules", "queries.yaml"]);
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", exprs.len())),
        "{out}"
    );
    // The check can fail: one parenthesis short.
    let broken = vec![format!("sum(rate({}[5m])", "ipkeep_agent_reservations")];
    std::fs::write(scratch.join("broken.yaml"), rules_of(&broken)).unwrap();
    let mut cmd = Command::new(promtool());
    cmd.args(["check", "rules", "broken.yaml"])
        .current_dir(scratch.path());
    assert!(!testkit::run(cmd, None).status.success());
    assert_metrics_exist(DASHBOARD, exprs.iter().map(String::as_str));
}
