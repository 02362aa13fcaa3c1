//! `docs/chart.md`'s values table and the chart's `files/defaults.json`, generated from
//! `charts/ipkeep/values.yaml`, so none can drift. The convention is helm-docs': a `# --` comment right above a key documents it (further
//! `#` lines continue it), the default is the value in the file. Done here in a few lines of Rust
//! instead of a new tool: the test generates the table and fails when `docs/chart.md` holds another
//! one between its markers, or when a value has no comment. `IPKEEP_UPDATE_DOCS=1` rewrites the
//! table in `docs/chart.md` and `files/defaults.json` instead of failing.
//!
//! Rows: every documented key. A documented key whose map holds documented keys is a section (its
//! row has no default; its keys follow); any other documented key is a value, whose default is its
//! whole content as JSON, keys in the order written (e.g. `controller.resources`). Keys inside a
//! list, or inside a map with no documented key, are part of that value.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The line before the generated table in `docs/chart.md`.
const BEGIN: &str =
    "<!-- values-table: begin (generated from charts/ipkeep/values.yaml; do not edit by hand) -->";
/// The line after it.
const END: &str = "<!-- values-table: end -->";
/// Set to rewrite the table instead of failing.
const UPDATE_ENV: &str = "IPKEEP_UPDATE_DOCS";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the e2e crate lives in the workspace")
        .to_path_buf()
}

/// A key of the values file, as written: its dotted path, its `# --` comment, its line.
#[derive(Debug)]
struct Key {
    path: String,
    doc: Option<String>,
    line: usize,
}

/// The keys of a values file in file order, with the `# --` comment right above each.
fn scan(yaml: &str) -> Vec<Key> {
    let mut keys = Vec::new();
    let mut parents: Vec<(usize, String)> = Vec::new();
    let mut doc: Option<String> = None;
    for (index, line) in yaml.lines().enumerate() {
        let text = line.trim_start();
        let indent = line.len() - text.len();
        if let Some(rest) = text.strip_prefix("# --") {
            doc = Some(rest.trim().to_owned());
        } else if let Some(rest) = text.strip_prefix('#') {
            if let Some(d) = doc.as_mut() {
                d.push(' ');
                d.push_str(rest.trim());
            }
        } else if let Some(name) = key_name(text) {
            while parents.last().is_some_and(|(i, _)| *i >= indent) {
                parents.pop();
            }
            let path = parents
                .iter()
                .map(|(_, n)| n.as_str())
                .chain([name])
                .collect::<Vec<_>>()
                .join(".");
            parents.push((indent, name.to_owned()));
            keys.push(Key {
                path,
                doc: doc.take(),
                line: index + 1,
            });
        } else {
            // A blank line, a list item or anything else ends a comment: it documents nothing.
            doc = None;
        }
    }
    keys
}

/// `name` when the line starts a mapping key `name:`.
fn key_name(text: &str) -> Option<&str> {
    let (name, rest) = text.split_once(':')?;
    let plain = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    (plain && (rest.is_empty() || rest.starts_with(' '))).then_some(name)
}

/// The value at a dotted path of maps; `None` inside a list.
fn lookup<'a>(values: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(values, |v, name| v.as_object()?.get(name))
}

/// helm-docs' type names.
fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "object",
    }
}

/// Text safe in a Markdown table cell: `|` escaped, `<` shown rather than read as an HTML tag.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('<', "&lt;")
}

/// One row of the values table: a section (a documented map of documented keys) or a value.
enum Row<'a> {
    Section {
        path: &'a str,
        doc: &'a str,
    },
    Value {
        path: &'a str,
        doc: &'a str,
        value: &'a Value,
    },
}

/// The rows of a values file in file order, or the keys that have no comment (`path (line N)`).
fn rows<'a>(values: &'a Value, keys: &'a [Key]) -> Result<Vec<Row<'a>>, Vec<String>> {
    let under = |key: &Key, parent: &Key| key.path.starts_with(&format!("{}.", parent.path));
    let is_section = |key: &Key| keys.iter().any(|k| k.doc.is_some() && under(k, key));
    let mut rows = Vec::new();
    let mut undocumented = Vec::new();
    for key in keys {
        // Inside a value (documented or not, reported once): part of that value's default.
        let inside_a_value = keys.iter().any(|k| !is_section(k) && under(key, k));
        if inside_a_value {
            continue;
        }
        let value = lookup(values, &key.path).expect("kept keys have a value");
        match (&key.doc, is_section(key)) {
            (Some(doc), true) => rows.push(Row::Section {
                path: &key.path,
                doc,
            }),
            (Some(doc), false) => rows.push(Row::Value {
                path: &key.path,
                doc,
                value,
            }),
            (None, true) => {}
            (None, false) => undocumented.push(format!("{} (line {})", key.path, key.line)),
        }
    }
    if undocumented.is_empty() {
        Ok(rows)
    } else {
        Err(undocumented)
    }
}

/// The values file parsed, and its keys that hold a value.
fn parse(yaml: &str) -> (Value, Vec<Key>) {
    let values: Value = serde_saphyr::from_str(yaml).expect("the values file is YAML");
    let keys = scan(yaml)
        .into_iter()
        .filter(|k| lookup(&values, &k.path).is_some())
        .collect();
    (values, keys)
}

/// The generated table, or the keys that have no comment (`path (line N)`).
fn table(yaml: &str) -> Result<String, Vec<String>> {
    let (values, keys) = parse(yaml);
    let mut lines = vec![
        "| value | type | default | description |".to_owned(),
        "|---|---|---|---|".to_owned(),
    ];
    for row in rows(&values, &keys)? {
        lines.push(match row {
            Row::Section { path, doc } => format!("| `{path}` | object | | {} |", cell(doc)),
            Row::Value { path, doc, value } => format!(
                "| `{path}` | {} | `{}` | {} |",
                type_name(value),
                cell(&value.to_string()),
                cell(doc)
            ),
        });
    }
    Ok(lines.join("\n") + "\n")
}

/// The chart's `files/defaults.json`: each value's dotted path and its default, in file order.
/// The templates lay these under any value Helm passes without (`ipkeep.defaults` in
/// `_helpers.tpl`: `helm upgrade --reuse-values` passes the previous release's defaults).
fn defaults(yaml: &str) -> Result<String, Vec<String>> {
    let (values, keys) = parse(yaml);
    let map: serde_json::Map<String, Value> = rows(&values, &keys)?
        .into_iter()
        .filter_map(|row| match row {
            Row::Value { path, value, .. } => Some((path.to_owned(), value.clone())),
            Row::Section { .. } => None,
        })
        .collect();
    Ok(serde_json::to_string_pretty(&map).expect("JSON values print") + "\n")
}

/// `doc` with the text between the markers replaced by `generated`; `None` without both markers.
fn with_table(doc: &str, generated: &str) -> Option<String> {
    let (before, rest) = doc.split_once(&format!("{BEGIN}\n"))?;
    let (_, after) = rest.split_once(&format!("{END}\n"))?;
    Some(format!("{before}{BEGIN}\n{generated}{END}\n{after}"))
}

/// The first line where two texts differ, for the failure message.
fn first_difference(expected: &str, found: &str) -> String {
    let (e, f): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), found.lines().collect());
    let at = (0..e.len().max(f.len()))
        .find(|&i| e.get(i) != f.get(i))
        .unwrap_or(0);
    format!(
        "line {} of the table:\n  values.yaml says: {}\n  docs/chart.md has: {}",
        at + 1,
        e.get(at).unwrap_or(&"(nothing)"),
        f.get(at).unwrap_or(&"(nothing)")
    )
}

#[test]
fn docs_chart_md_holds_the_table_generated_from_values_yaml() {
    let yaml = std::fs::read_to_string(root().join("charts/ipkeep/values.yaml")).unwrap();
    let doc_path = root().join("docs/chart.md");
    let doc = std::fs::read_to_string(&doc_path).unwrap();
    let generated = table(&yaml).unwrap_or_else(|missing| {
        panic!("values without a `# --` comment in charts/ipkeep/values.yaml: {missing:?}")
    });
    let expected = with_table(&doc, &generated)
        .unwrap_or_else(|| panic!("docs/chart.md lacks the lines {BEGIN:?} and {END:?}"));
    if expected == doc {
        return;
    }
    if std::env::var_os(UPDATE_ENV).is_some() {
        std::fs::write(&doc_path, expected).unwrap();
        eprintln!("{UPDATE_ENV} is set: rewrote the values table in docs/chart.md");
        return;
    }
    let found = doc
        .split_once(&format!("{BEGIN}\n"))
        .and_then(|(_, rest)| rest.split_once(END))
        .map_or("", |(table, _)| table);
    panic!(
        "docs/chart.md's values table differs from charts/ipkeep/values.yaml at {}\n\
         regenerate it: {UPDATE_ENV}=1 cargo test -p ipkeep-e2e --test plain chart_values_doc::",
        first_difference(&generated, found)
    );
}

#[test]
fn the_chart_holds_its_defaults_generated_from_values_yaml() {
    let yaml = std::fs::read_to_string(root().join("charts/ipkeep/values.yaml")).unwrap();
    let path = root().join("charts/ipkeep/files/defaults.json");
    let generated = defaults(&yaml).unwrap_or_else(|missing| {
        panic!("values without a `# --` comment in charts/ipkeep/values.yaml: {missing:?}")
    });
    if std::fs::read_to_string(&path).ok().as_deref() == Some(generated.as_str()) {
        return;
    }
    if std::env::var_os(UPDATE_ENV).is_some() {
        std::fs::write(&path, generated).unwrap();
        eprintln!("{UPDATE_ENV} is set: rewrote {}", path.display());
        return;
    }
    panic!(
        "{} is not generated from charts/ipkeep/values.yaml\n\
         regenerate it: {UPDATE_ENV}=1 cargo test -p ipkeep-e2e --test plain chart_values_doc::",
        path.display()
    );
}

#[test]
fn the_defaults_are_each_values_path_and_default() {
    let yaml = "# -- The image.\nimage:\n  # -- Repository.\n  repository: \"\"\n# -- Resources.\nresources:\n  limits:\n    memory: 1Gi\nmetrics:\n  service:\n    # -- Create it.\n    enabled: true\n";
    assert_eq!(
        defaults(yaml).unwrap(),
        "{\n  \"image.repository\": \"\",\n  \"resources\": {\n    \"limits\": {\n      \"memory\": \"1Gi\"\n    }\n  },\n  \"metrics.service.enabled\": true\n}\n"
    );
}

#[test]
fn the_table_is_made_from_comments_and_defaults() {
    let header = "| value | type | default | description |\n|---|---|---|---|\n";
    let cases: &[(&str, &str, &str)] = &[
        (
            "scalars of every type, a multi-line comment",
            "# -- A name.\nname: web\n# -- How many;\n# at least one.\nreplicas: 2\n# -- Enabled?\nenabled: true\n# -- Tag.\ntag: \"\"\n",
            "| `name` | string | `\"web\"` | A name. |\n| `replicas` | int | `2` | How many; at least one. |\n| `enabled` | bool | `true` | Enabled? |\n| `tag` | string | `\"\"` | Tag. |\n",
        ),
        (
            "a section and its values; an undocumented map holding documented keys is a grouping",
            "# -- The image.\nimage:\n  # -- Repository.\n  repository: ipkeep\nmetrics:\n  service:\n    # -- Create it.\n    enabled: true\n",
            "| `image` | object | | The image. |\n| `image.repository` | string | `\"ipkeep\"` | Repository. |\n| `metrics.service.enabled` | bool | `true` | Create it. |\n",
        ),
        (
            "a documented map without documented keys is one value; lists are values, keys inside them too",
            "# -- Resources.\nresources:\n  requests:\n    cpu: 10m\n# -- Tolerations.\ntolerations:\n  - operator: Exists\n    effect: NoSchedule\n# -- Names.\nnetworks:\n  - cbr0\n",
            "| `resources` | object | `{\"requests\":{\"cpu\":\"10m\"}}` | Resources. |\n| `tolerations` | list | `[{\"operator\":\"Exists\",\"effect\":\"NoSchedule\"}]` | Tolerations. |\n| `networks` | list | `[\"cbr0\"]` | Names. |\n",
        ),
        (
            "a blank line or a plain comment between a `# --` comment and its key, pipes and angle brackets",
            "# Header of the file.\n\n# -- Secrets: [{name: a}] | none.\nsecrets: []\n# -- Default <fullname>-x.\nlease: \"\"\n",
            "| `secrets` | list | `[]` | Secrets: [{name: a}] \\| none. |\n| `lease` | string | `\"\"` | Default &lt;fullname>-x. |\n",
        ),
    ];
    for (what, yaml, rows) in cases {
        assert_eq!(
            table(yaml).as_deref(),
            Ok(format!("{header}{rows}").as_str()),
            "{what}"
        );
    }
}

#[test]
fn a_value_without_a_comment_is_reported_with_its_line() {
    let cases: &[(&str, &str, &[&str])] = &[
        ("a scalar", "# -- A.\na: 1\nb: 2\n", &["b (line 3)"]),
        (
            "a comment cut off by a blank line",
            "# -- A.\n\na: 1\n",
            &["a (line 3)"],
        ),
        (
            "a map whose keys have none",
            "# -- S.\ns:\n  # -- X.\n  x: 1\nm:\n  y: 2\n",
            &["m (line 5)"],
        ),
        (
            "a plain comment is not documentation",
            "# A.\na: 1\n",
            &["a (line 2)"],
        ),
    ];
    for (what, yaml, missing) in cases {
        assert_eq!(
            table(yaml),
            Err(missing.iter().map(|m| m.to_string()).collect()),
            "{what}"
        );
    }
}

#[test]
fn the_table_is_replaced_between_the_markers_only() {
    let doc = format!("intro\n{BEGIN}\nold\n{END}\nafter\n");
    assert_eq!(
        with_table(&doc, "new\n").as_deref(),
        Some(format!("intro\n{BEGIN}\nnew\n{END}\nafter\n").as_str())
    );
    assert_eq!(with_table("no markers\n", "new\n"), None);
}
