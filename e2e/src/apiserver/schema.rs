//! Structural OpenAPI v3 schemas of custom resources: validation, pruning and defaulting shaped like
//! kube-apiserver's, so a client sees the same 422 `Status` (paths, messages, cause reasons).
//!
//! Emulated: `type` (with `nullable`), `required`, `properties`, `additionalProperties`, `items`,
//! `enum`, `format` (`date-time`, `date`, `ipv4`, `ipv6`, `cidr`, `uuid`, `byte`; every other format
//! is accepted unchecked, as kube-apiserver does for formats it does not know), `minimum`/`maximum`
//! (and their `exclusive*` flags), `multipleOf`, `minLength`/`maxLength`, `pattern`,
//! `minItems`/`maxItems`, `minProperties`/`maxProperties`, `x-kubernetes-int-or-string`,
//! `x-kubernetes-preserve-unknown-fields`, `x-kubernetes-embedded-resource`, and duplicate entries of
//! `x-kubernetes-list-type: set|map` lists.
//! Not emulated: CEL rules (`x-kubernetes-validations`) are NOT evaluated (a rule that would reject an
//! object on a real server is accepted here), nor are `allOf`/`anyOf`/`oneOf`/`not`, validation
//! ratcheting on update, or `metadata` rules beyond what the caller checks.

use std::net::{Ipv4Addr, Ipv6Addr};

use serde_json::{Map, Value, json};

/// The kind of a field error, as kube-apiserver's `field.ErrorType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldErrorKind {
    /// A required field is missing.
    Required,
    /// A value is malformed or out of range.
    Invalid,
    /// A value has the wrong JSON type (or string format).
    TypeInvalid,
    /// A value is not one of the allowed `enum` values.
    NotSupported,
    /// A string is longer than `maxLength`.
    TooLong,
    /// A list or map has more entries than allowed.
    TooMany,
    /// A value is not allowed here.
    Forbidden,
    /// A set or map list holds the same entry twice.
    Duplicate,
}

impl FieldErrorKind {
    /// The `reason` of a `details.causes[]` entry.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Required => "FieldValueRequired",
            Self::Invalid => "FieldValueInvalid",
            Self::TypeInvalid => "FieldValueTypeInvalid",
            Self::NotSupported => "FieldValueNotSupported",
            Self::TooLong => "FieldValueTooLong",
            Self::TooMany => "FieldValueTooMany",
            Self::Forbidden => "FieldValueForbidden",
            Self::Duplicate => "FieldValueDuplicate",
        }
    }

    /// The human label that starts the error text ("Required value", "Invalid value", ...).
    pub fn label(self) -> &'static str {
        match self {
            Self::Required => "Required value",
            Self::Invalid | Self::TypeInvalid => "Invalid value",
            Self::NotSupported => "Unsupported value",
            Self::TooLong => "Too long",
            Self::TooMany => "Too many",
            Self::Forbidden => "Forbidden",
            Self::Duplicate => "Duplicate value",
        }
    }
}

/// One validation error at a field path, like kube-apiserver's `field.Error`.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// What is wrong.
    pub kind: FieldErrorKind,
    /// The field path, e.g. `spec.ips[0]`.
    pub field: String,
    /// The offending value; `None` leaves it out of the message.
    pub value: Option<Value>,
    /// Extra explanation appended after the value.
    pub detail: String,
}

impl FieldError {
    /// A missing required field.
    pub fn required(field: &str, detail: &str) -> Self {
        Self::new(FieldErrorKind::Required, field, None, detail)
    }

    /// A malformed or out-of-range value.
    pub fn invalid(field: &str, value: Value, detail: &str) -> Self {
        Self::new(FieldErrorKind::Invalid, field, Some(value), detail)
    }

    /// A value of the wrong type or string format.
    pub fn type_invalid(field: &str, value: Value, detail: &str) -> Self {
        Self::new(FieldErrorKind::TypeInvalid, field, Some(value), detail)
    }

    /// A value outside an `enum`.
    pub fn not_supported(field: &str, value: Value, supported: &[String]) -> Self {
        let quoted: Vec<String> = supported.iter().map(|s| go_quote(s)).collect();
        let detail = if quoted.is_empty() {
            String::new()
        } else {
            format!("supported values: {}", quoted.join(", "))
        };
        Self::new(FieldErrorKind::NotSupported, field, Some(value), &detail)
    }

    /// A string longer than `max` characters.
    pub fn too_long(field: &str, max: u64) -> Self {
        let detail = format!("may not be more than {max} bytes");
        Self::new(FieldErrorKind::TooLong, field, None, &detail)
    }

    /// A list or map with `actual` entries where at most `max` are allowed.
    pub fn too_many(field: &str, actual: usize, max: u64) -> Self {
        let detail = format!("must have at most {max} items");
        Self::new(FieldErrorKind::TooMany, field, Some(json!(actual)), &detail)
    }

    /// A value that is not allowed at all.
    pub fn forbidden(field: &str, detail: &str) -> Self {
        Self::new(FieldErrorKind::Forbidden, field, None, detail)
    }

    /// The same entry twice in a set or map list.
    pub fn duplicate(field: &str, value: Value) -> Self {
        Self::new(FieldErrorKind::Duplicate, field, Some(value), "")
    }

    fn new(kind: FieldErrorKind, field: &str, value: Option<Value>, detail: &str) -> Self {
        Self {
            kind,
            field: field.to_string(),
            value,
            detail: detail.to_string(),
        }
    }

    /// The message without the field path (what `details.causes[].message` carries).
    pub fn body(&self) -> String {
        let mut s = self.kind.label().to_string();
        let omit_value = matches!(
            self.kind,
            FieldErrorKind::Required | FieldErrorKind::Forbidden | FieldErrorKind::TooLong
        );
        if let (false, Some(v)) = (omit_value, &self.value) {
            s.push_str(": ");
            s.push_str(&render_value(v));
        }
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

/// Renders a bad value the way Go's `field.Error` does: strings quoted, numbers and booleans bare,
/// everything else as JSON.
fn render_value(v: &Value) -> String {
    match v {
        Value::String(s) => go_quote(s),
        Value::Number(n) => render_number(n),
        other => other.to_string(),
    }
}

/// Go prints a float64 holding an integral value without a fractional part (`%v` of `2.0` is `2`).
fn render_number(n: &serde_json::Number) -> String {
    match n.as_f64() {
        Some(f) if !n.is_i64() && !n.is_u64() && f.fract() == 0.0 && f.abs() < 1e21 => {
            format!("{f:.0}")
        }
        _ => n.to_string(),
    }
}

/// Close enough to Go's `strconv.Quote` for the values a test writes (JSON escaping differs only
/// for exotic control characters).
fn go_quote(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// The JSON type name kube-apiserver reports for a value.
fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn flag(s: &Map<String, Value>, key: &str) -> bool {
    s.get(key).and_then(Value::as_bool).unwrap_or(false)
}

/// Validates `obj` against a structural schema (a CRD version's `openAPIV3Schema`).
pub fn validate(schema: &Value, obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    walk(schema, obj, "", &mut errs);
    errs
}

fn walk(schema: &Value, v: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let Some(s) = schema.as_object() else { return };
    let types: Vec<&str> = if flag(s, "x-kubernetes-int-or-string") {
        vec!["integer", "string"]
    } else {
        s.get("type").and_then(Value::as_str).into_iter().collect()
    };
    if v.is_null() {
        if !types.is_empty() && !flag(s, "nullable") {
            errs.push(type_error(path, &types, "null"));
        }
        return;
    }
    let actual = json_type(v);
    // kube-apiserver accepts an integral float for `integer` and an integer for `number`.
    let type_ok = types.is_empty()
        || types.contains(&actual)
        || (actual == "integer" && types.contains(&"number"))
        || (actual == "number"
            && types.contains(&"integer")
            && v.as_f64().is_some_and(|f| f.fract() == 0.0));
    if !type_ok {
        errs.push(type_error(path, &types, actual));
        return;
    }
    match v {
        Value::String(text) => check_string(s, text, v, path, errs),
        Value::Number(_) => check_number(s, v, path, errs),
        _ => {}
    }
    check_enum(s, v, path, errs);
    match v {
        Value::Array(items) => check_array(s, items, path, errs),
        Value::Object(map) => check_object(s, map, path, errs),
        _ => {}
    }
}

fn type_error(path: &str, types: &[&str], actual: &str) -> FieldError {
    let detail = format!(
        "{path} in body must be of type {}: \"{actual}\"",
        types.join(",")
    );
    FieldError::type_invalid(path, Value::String(actual.to_string()), &detail)
}

fn check_string(
    s: &Map<String, Value>,
    text: &str,
    v: &Value,
    path: &str,
    errs: &mut Vec<FieldError>,
) {
    let len = text.chars().count() as u64;
    if let Some(max) = s.get("maxLength").and_then(Value::as_u64)
        && len > max
    {
        errs.push(FieldError::too_long(path, max));
    }
    if let Some(min) = s.get("minLength").and_then(Value::as_u64)
        && len < min
    {
        let detail = format!("{path} in body should be at least {min} chars long");
        errs.push(FieldError::invalid(path, v.clone(), &detail));
    }
    if let Some(pattern) = s.get("pattern").and_then(Value::as_str)
        // kube-apiserver rejects a CRD with an invalid pattern; here such a pattern is ignored.
        && let Ok(re) = regex::Regex::new(pattern)
        && !re.is_match(text)
    {
        let detail = format!("{path} in body should match '{pattern}'");
        errs.push(FieldError::invalid(path, v.clone(), &detail));
    }
    if let Some(format) = s.get("format").and_then(Value::as_str)
        && !format_ok(format, text)
    {
        let detail = format!(
            "{path} in body must be of type {format}: {}",
            go_quote(text)
        );
        errs.push(FieldError::type_invalid(path, v.clone(), &detail));
    }
}

/// String formats kube-apiserver checks; unknown formats (and `int32`, `int64`, ... which only
/// describe numbers) pass, as on the real server.
fn format_ok(format: &str, text: &str) -> bool {
    match format {
        "date-time" | "datetime" => parse_date_time(text).is_some(),
        "date" => text.parse::<jiff::civil::Date>().is_ok() && text.len() == 10,
        "ipv4" => text.parse::<Ipv4Addr>().is_ok(),
        "ipv6" => text.parse::<Ipv6Addr>().is_ok(),
        "cidr" => cidr_ok(text),
        "uuid" => uuid_ok(text),
        "byte" => base64_ok(text),
        _ => true,
    }
}

/// Parses an RFC 3339 timestamp (`2024-05-01T10:00:00Z`, with optional fraction and offset),
/// returning the Unix seconds.
pub fn parse_date_time(text: &str) -> Option<i64> {
    text.parse::<jiff::Timestamp>().ok().map(|t| t.as_second())
}

fn cidr_ok(text: &str) -> bool {
    let Some((ip, bits)) = text.split_once('/') else {
        return false;
    };
    let Ok(bits) = bits.parse::<u8>() else {
        return false;
    };
    if ip.parse::<Ipv4Addr>().is_ok() {
        bits <= 32
    } else {
        ip.parse::<Ipv6Addr>().is_ok() && bits <= 128
    }
}

fn uuid_ok(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    let lens = [8, 4, 4, 4, 12];
    groups.len() == lens.len()
        && groups
            .iter()
            .zip(lens)
            .all(|(g, n)| g.len() == n && g.chars().all(|c| c.is_ascii_hexdigit()))
}

fn base64_ok(text: &str) -> bool {
    let body = text.trim_end_matches('=');
    text.len().is_multiple_of(4)
        && text.len() - body.len() <= 2
        && body
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '+' || c == '/')
}

fn check_number(s: &Map<String, Value>, v: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let Some(x) = v.as_f64() else { return };
    if let Some(m) = s.get("multipleOf").and_then(Value::as_f64)
        && m > 0.0
        && (x / m).fract() != 0.0
    {
        let detail = format!("{path} in body should be a multiple of {}", fmt_num(m));
        errs.push(FieldError::invalid(path, v.clone(), &detail));
    }
    if let Some(max) = s.get("maximum").and_then(Value::as_f64) {
        let exclusive = flag(s, "exclusiveMaximum");
        if x > max || (exclusive && x == max) {
            let rel = if exclusive {
                "less than"
            } else {
                "less than or equal to"
            };
            let detail = format!("{path} in body should be {rel} {}", fmt_num(max));
            errs.push(FieldError::invalid(path, v.clone(), &detail));
        }
    }
    if let Some(min) = s.get("minimum").and_then(Value::as_f64) {
        let exclusive = flag(s, "exclusiveMinimum");
        if x < min || (exclusive && x == min) {
            let rel = if exclusive {
                "greater than"
            } else {
                "greater than or equal to"
            };
            let detail = format!("{path} in body should be {rel} {}", fmt_num(min));
            errs.push(FieldError::invalid(path, v.clone(), &detail));
        }
    }
}

/// Go's `%v` of a float64: no trailing `.0`.
fn fmt_num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e21 {
        format!("{x:.0}")
    } else {
        x.to_string()
    }
}

fn check_enum(s: &Map<String, Value>, v: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let Some(allowed) = s.get("enum").and_then(Value::as_array) else {
        return;
    };
    if allowed.iter().any(|a| json_equal(a, v)) {
        return;
    }
    let names: Vec<String> = allowed
        .iter()
        .map(|a| match a {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect();
    errs.push(FieldError::not_supported(path, v.clone(), &names));
}

/// JSON equality where `1` and `1.0` are the same number.
fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_equal(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, p)| y.get(k).is_some_and(|q| json_equal(p, q)))
        }
        _ => a == b,
    }
}

fn check_array(s: &Map<String, Value>, items: &[Value], path: &str, errs: &mut Vec<FieldError>) {
    if let Some(item_schema) = s.get("items") {
        for (i, item) in items.iter().enumerate() {
            walk(item_schema, item, &format!("{path}[{i}]"), errs);
        }
    }
    let len = items.len();
    if let Some(min) = s.get("minItems").and_then(Value::as_u64)
        && (len as u64) < min
    {
        let detail = format!("{path} in body should have at least {min} items");
        errs.push(FieldError::invalid(path, json!(len), &detail));
    }
    if let Some(max) = s.get("maxItems").and_then(Value::as_u64)
        && len as u64 > max
    {
        errs.push(FieldError::too_many(path, len, max));
    }
    check_list_type(s, items, path, errs);
}

/// `x-kubernetes-list-type: set` entries and `map` keys must be unique.
fn check_list_type(
    s: &Map<String, Value>,
    items: &[Value],
    path: &str,
    errs: &mut Vec<FieldError>,
) {
    let keyed: Vec<Value> = match s.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("set") => items.to_vec(),
        Some("map") => {
            let keys: Vec<&str> = s
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|ks| ks.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            items
                .iter()
                .map(|item| {
                    let mut m = Map::new();
                    for k in &keys {
                        if let Some(x) = item.get(*k) {
                            m.insert((*k).to_string(), x.clone());
                        }
                    }
                    Value::Object(m)
                })
                .collect()
        }
        _ => return,
    };
    for (i, key) in keyed.iter().enumerate() {
        if keyed[..i].iter().any(|earlier| json_equal(earlier, key)) {
            errs.push(FieldError::duplicate(&format!("{path}[{i}]"), key.clone()));
        }
    }
}

fn check_object(
    s: &Map<String, Value>,
    map: &Map<String, Value>,
    path: &str,
    errs: &mut Vec<FieldError>,
) {
    if let Some(max) = s.get("maxProperties").and_then(Value::as_u64)
        && map.len() as u64 > max
    {
        errs.push(FieldError::too_many(path, map.len(), max));
    }
    if let Some(min) = s.get("minProperties").and_then(Value::as_u64)
        && (map.len() as u64) < min
    {
        let detail = format!("{path} in body should have at least {min} properties");
        errs.push(FieldError::invalid(path, json!(map.len()), &detail));
    }
    if let Some(required) = s.get("required").and_then(Value::as_array) {
        for name in required.iter().filter_map(Value::as_str) {
            if !map.contains_key(name) {
                errs.push(FieldError::required(&child(path, name), ""));
            }
        }
    }
    if flag(s, "x-kubernetes-embedded-resource") {
        for name in ["apiVersion", "kind"] {
            if map
                .get(name)
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                errs.push(FieldError::required(
                    &child(path, name),
                    "must not be empty",
                ));
            }
        }
    }
    let props = s.get("properties").and_then(Value::as_object);
    let additional = s.get("additionalProperties").filter(|a| a.is_object());
    for (key, value) in map {
        match props.and_then(|p| p.get(key)) {
            Some(prop) => walk(prop, value, &child(path, key), errs),
            None => {
                if let Some(a) = additional {
                    walk(a, value, &child(path, key), errs);
                }
            }
        }
    }
}

/// Drops every field the schema does not specify (unless `x-kubernetes-preserve-unknown-fields`),
/// keeping `apiVersion`, `kind` and `metadata` of the object and of embedded resources.
/// Returns the paths it dropped (kube-apiserver reports them as `unknown field "spec.foo"` warnings).
pub fn prune(schema: &Value, obj: &mut Value) -> Vec<String> {
    let mut pruned = Vec::new();
    prune_at(schema, obj, "", true, &mut pruned);
    pruned
}

fn prune_at(schema: &Value, v: &mut Value, path: &str, resource_root: bool, out: &mut Vec<String>) {
    let Some(s) = schema.as_object() else { return };
    match v {
        Value::Object(map) => {
            let preserve = flag(s, "x-kubernetes-preserve-unknown-fields");
            let props = s.get("properties").and_then(Value::as_object);
            let additional = s.get("additionalProperties");
            let mut drop = Vec::new();
            for (key, value) in map.iter_mut() {
                if resource_root && matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                let at = child(path, key);
                if let Some(prop) = props.and_then(|p| p.get(key)) {
                    let embedded = prop
                        .get("x-kubernetes-embedded-resource")
                        .and_then(Value::as_bool)
                        .unwrap_or(false);
                    prune_at(prop, value, &at, embedded, out);
                } else if let Some(a) = additional.filter(|a| a.is_object()) {
                    let embedded = a
                        .get("x-kubernetes-embedded-resource")
                        .and_then(Value::as_bool)
                        .unwrap_or(false);
                    prune_at(a, value, &at, embedded, out);
                } else if !preserve && additional.and_then(Value::as_bool) != Some(true) {
                    drop.push(key.clone());
                    out.push(at);
                }
            }
            for key in drop {
                map.remove(&key);
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = s.get("items") {
                let embedded = item_schema
                    .get("x-kubernetes-embedded-resource")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                for (i, item) in items.iter_mut().enumerate() {
                    prune_at(item_schema, item, &format!("{path}[{i}]"), embedded, out);
                }
            }
        }
        _ => {}
    }
}

/// Fills in `default` values of missing (or non-nullable null) fields, recursively, and drops
/// non-nullable nulls that have no default, as kube-apiserver's structural defaulting does.
pub fn apply_defaults(schema: &Value, obj: &mut Value) {
    let Some(s) = schema.as_object() else { return };
    match obj {
        Value::Object(map) => {
            let props = s.get("properties").and_then(Value::as_object);
            if let Some(props) = props {
                for (key, prop) in props {
                    let Some(default) = prop.get("default") else {
                        continue;
                    };
                    let missing = map.get(key).is_none_or(|v| v.is_null() && !nullable(prop));
                    if missing {
                        map.insert(key.clone(), default.clone());
                    }
                }
            }
            let additional = s.get("additionalProperties").filter(|a| a.is_object());
            map.retain(|key, value| {
                let prop = props.and_then(|p| p.get(key)).or(additional);
                !(value.is_null() && prop.is_some_and(|p| !nullable(p)))
            });
            for (key, value) in map.iter_mut() {
                if let Some(prop) = props.and_then(|p| p.get(key)).or(additional) {
                    apply_defaults(prop, value);
                }
            }
        }
        Value::Array(items) => {
            let Some(item_schema) = s.get("items") else {
                return;
            };
            for item in items.iter_mut() {
                if item.is_null()
                    && !nullable(item_schema)
                    && let Some(default) = item_schema.get("default")
                {
                    *item = default.clone();
                }
                apply_defaults(item_schema, item);
            }
        }
        _ => {}
    }
}

fn nullable(schema: &Value) -> bool {
    schema
        .get("nullable")
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// The 422 `Status` kube-apiserver answers for an invalid object; `group_kind` is `Kind.group`
/// (`IPReservation.ipkeep.dev`) or just `Kind` for the core group.
pub fn invalid_status(group_kind: &str, name: &str, errs: &[FieldError]) -> Value {
    let (kind, group) = group_kind.split_once('.').unwrap_or((group_kind, ""));
    let causes: Vec<Value> = errs
        .iter()
        .map(|e| json!({"reason": e.kind.reason(), "message": e.body(), "field": e.field}))
        .collect();
    // Go's aggregate error: one message alone, several deduplicated inside brackets.
    let mut seen: Vec<String> = Vec::new();
    for e in errs {
        let text = e.to_string();
        if !seen.contains(&text) {
            seen.push(text);
        }
    }
    let message = match seen.len() {
        0 => format!("{group_kind} {} is invalid", go_quote(name)),
        1 => format!("{group_kind} {} is invalid: {}", go_quote(name), seen[0]),
        _ => format!(
            "{group_kind} {} is invalid: [{}]",
            go_quote(name),
            seen.join(", ")
        ),
    };
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Invalid",
        "details": {"name": name, "group": group, "kind": kind, "causes": causes},
        "code": 422,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn reservation_schema() -> Value {
        json!({
            "type": "object",
            "required": ["spec"],
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["ips", "nodeName"],
                    "properties": {
                        "ips": {"type": "array", "minItems": 1, "maxItems": 2,
                                "x-kubernetes-list-type": "set", "items": {"type": "string"}},
                        "nodeName": {"type": "string", "minLength": 1, "maxLength": 8,
                                     "pattern": "^[a-z0-9-]+$"},
                        "retainFor": {"type": "string", "default": "24h"},
                        "port": {"type": "integer", "format": "int32", "minimum": 1, "maximum": 65535},
                        "weight": {"type": "number", "exclusiveMinimum": true, "minimum": 0},
                        "target": {"x-kubernetes-int-or-string": true},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                                     "x-kubernetes-preserve-unknown-fields": true},
                        "note": {"type": "string", "nullable": true},
                        "mode": {"type": "string", "enum": ["Fast", "Safe"]},
                    },
                },
                "status": {
                    "type": "object",
                    "properties": {
                        "phase": {"type": "string", "enum": ["Bound", "Released"]},
                        "releaseTime": {"type": "string", "format": "date-time"},
                    },
                },
            },
        })
    }

    fn valid() -> Value {
        json!({"apiVersion": "ipkeep.dev/v1alpha1", "kind": "IPReservation",
               "metadata": {"name": "web-0", "namespace": "default"},
               "spec": {"ips": ["10.0.0.1"], "nodeName": "node-a"}})
    }

    fn with(path: &[&str], value: Value) -> Value {
        let mut obj = valid();
        let mut cur = &mut obj;
        for key in &path[..path.len() - 1] {
            cur = cur
                .as_object_mut()
                .unwrap()
                .entry(key.to_string())
                .or_insert(json!({}));
        }
        cur[path[path.len() - 1]] = value;
        obj
    }

    #[test]
    fn validation_messages_match_kube_apiserver() {
        let cases: Vec<(Value, Vec<&str>)> = vec![
            (valid(), vec![]),
            (
                with(&["spec", "ips"], json!([1])),
                vec![
                    "spec.ips[0]: Invalid value: \"integer\": spec.ips[0] in body must be of type string: \"integer\"",
                ],
            ),
            (
                json!({"spec": {"ips": ["a"]}}),
                vec!["spec.nodeName: Required value"],
            ),
            (json!({"metadata": {}}), vec!["spec: Required value"]),
            (
                with(&["status", "phase"], json!("Lost")),
                vec![
                    "status.phase: Unsupported value: \"Lost\": supported values: \"Bound\", \"Released\"",
                ],
            ),
            (
                with(&["spec", "nodeName"], json!("node-a-very-long")),
                vec!["spec.nodeName: Too long: may not be more than 8 bytes"],
            ),
            (
                with(&["spec", "nodeName"], json!("")),
                vec![
                    "spec.nodeName: Invalid value: \"\": spec.nodeName in body should be at least 1 chars long",
                    "spec.nodeName: Invalid value: \"\": spec.nodeName in body should match '^[a-z0-9-]+$'",
                ],
            ),
            (
                with(&["spec", "nodeName"], json!("Node_A")),
                vec![
                    "spec.nodeName: Invalid value: \"Node_A\": spec.nodeName in body should match '^[a-z0-9-]+$'",
                ],
            ),
            (
                with(&["spec", "ips"], json!([])),
                vec!["spec.ips: Invalid value: 0: spec.ips in body should have at least 1 items"],
            ),
            (
                with(&["spec", "ips"], json!(["a", "b", "c"])),
                vec!["spec.ips: Too many: 3: must have at most 2 items"],
            ),
            (
                with(&["spec", "ips"], json!(["a", "a"])),
                vec!["spec.ips[1]: Duplicate value: \"a\""],
            ),
            (
                with(&["spec", "port"], json!(0)),
                vec![
                    "spec.port: Invalid value: 0: spec.port in body should be greater than or equal to 1",
                ],
            ),
            (
                with(&["spec", "port"], json!(70000)),
                vec![
                    "spec.port: Invalid value: 70000: spec.port in body should be less than or equal to 65535",
                ],
            ),
            (with(&["spec", "port"], json!(80.0)), vec![]),
            (
                with(&["spec", "port"], json!(80.5)),
                vec![
                    "spec.port: Invalid value: \"number\": spec.port in body must be of type integer: \"number\"",
                ],
            ),
            (
                with(&["spec", "weight"], json!(0)),
                vec!["spec.weight: Invalid value: 0: spec.weight in body should be greater than 0"],
            ),
            (with(&["spec", "weight"], json!(3)), vec![]),
            (with(&["spec", "target"], json!(8080)), vec![]),
            (with(&["spec", "target"], json!("http")), vec![]),
            (
                with(&["spec", "target"], json!(true)),
                vec![
                    "spec.target: Invalid value: \"boolean\": spec.target in body must be of type integer,string: \"boolean\"",
                ],
            ),
            (
                with(&["spec", "labels"], json!({"a": "x", "b": 2})),
                vec![
                    "spec.labels.b: Invalid value: \"integer\": spec.labels.b in body must be of type string: \"integer\"",
                ],
            ),
            (
                with(&["spec", "extra"], json!({"anything": [1, {"x": null}]})),
                vec![],
            ),
            (
                with(&["spec", "template"], json!({"metadata": {}})),
                vec![
                    "spec.template.apiVersion: Required value: must not be empty",
                    "spec.template.kind: Required value: must not be empty",
                ],
            ),
            (with(&["spec", "note"], Value::Null), vec![]),
            (
                with(&["spec", "nodeName"], Value::Null),
                vec![
                    "spec.nodeName: Invalid value: \"null\": spec.nodeName in body must be of type string: \"null\"",
                ],
            ),
            (
                with(&["status", "releaseTime"], json!("2024-05-01T10:00:00Z")),
                vec![],
            ),
            (
                with(
                    &["status", "releaseTime"],
                    json!("2024-05-01T10:00:00.123+02:00"),
                ),
                vec![],
            ),
            (
                with(&["status", "releaseTime"], json!("tomorrow")),
                vec![
                    "status.releaseTime: Invalid value: \"tomorrow\": status.releaseTime in body must be of type date-time: \"tomorrow\"",
                ],
            ),
            (
                with(&["spec"], json!("x")),
                vec![
                    "spec: Invalid value: \"string\": spec in body must be of type object: \"string\"",
                ],
            ),
            // Unknown fields are not errors: they are pruned.
            (with(&["spec", "unknown"], json!(1)), vec![]),
        ];
        for (obj, want) in cases {
            let got: Vec<String> = validate(&reservation_schema(), &obj)
                .iter()
                .map(ToString::to_string)
                .collect();
            assert_eq!(got, want, "object {obj}");
        }
    }

    #[test]
    fn formats() {
        let cases = [
            ("date-time", "2024-02-29T23:59:59Z", true),
            ("date-time", "2024-02-29 23:59:59", false),
            ("date", "2024-02-29", true),
            ("date", "2024-2-29", false),
            ("ipv4", "10.0.0.1", true),
            ("ipv4", "10.0.0.256", false),
            ("ipv6", "fd00::1", true),
            ("cidr", "10.0.0.0/8", true),
            ("cidr", "fd00::/129", false),
            ("uuid", "0b8e1a3c-8d6f-4c3e-9f1a-2b3c4d5e6f70", true),
            ("uuid", "0b8e1a3c", false),
            ("byte", "aGVsbG8=", true),
            ("byte", "a", false),
            ("int32", "whatever", true),
            ("something-else", "x", true),
        ];
        for (format, text, ok) in cases {
            assert_eq!(format_ok(format, text), ok, "{format} {text}");
        }
    }

    #[test]
    fn prune_drops_unknown_fields_and_keeps_preserved_ones() {
        let mut obj = valid();
        obj["spec"]["bogus"] = json!(1);
        obj["spec"]["labels"] = json!({"a": "b"});
        obj["spec"]["extra"] = json!({"free": {"form": true}});
        obj["spec"]["template"] =
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "x": 1});
        obj["status"] = json!({"phase": "Bound", "junk": "x"});
        obj["topLevel"] = json!("x");
        let pruned = prune(&reservation_schema(), &mut obj);
        assert_eq!(pruned, vec!["spec.bogus", "status.junk", "topLevel"]);
        assert_eq!(obj["spec"]["labels"], json!({"a": "b"}));
        assert_eq!(obj["spec"]["extra"], json!({"free": {"form": true}}));
        assert_eq!(obj["spec"]["template"]["metadata"], json!({"name": "p"}));
        assert_eq!(obj["spec"]["template"]["x"], json!(1));
        assert_eq!(obj["status"], json!({"phase": "Bound"}));
        assert_eq!(obj["metadata"]["name"], json!("web-0"));
        assert_eq!(obj["apiVersion"], json!("ipkeep.dev/v1alpha1"));
    }

    #[test]
    fn prune_inside_arrays() {
        let schema = json!({"type": "object", "properties": {"items": {"type": "array",
            "items": {"type": "object", "properties": {"a": {"type": "string"}}}}}});
        let mut obj = json!({"items": [{"a": "x", "b": 1}, {"c": 2}]});
        let pruned = prune(&schema, &mut obj);
        assert_eq!(obj, json!({"items": [{"a": "x"}, {}]}));
        assert_eq!(pruned, vec!["items[0].b", "items[1].c"]);
    }

    #[test]
    fn defaults() {
        let schema = json!({"type": "object", "properties": {
            "spec": {"type": "object", "default": {}, "properties": {
                "retainFor": {"type": "string", "default": "24h"},
                "mode": {"type": "string", "default": "Safe"},
                "note": {"type": "string"},
                "opt": {"type": "string", "nullable": true, "default": "d"},
                "list": {"type": "array", "items": {"type": "object",
                    "properties": {"w": {"type": "integer", "default": 1}}}},
            }},
        }});
        let cases = [
            (
                json!({}),
                json!({"spec": {"retainFor": "24h", "mode": "Safe", "opt": "d"}}),
            ),
            (
                json!({"spec": {"retainFor": "1h", "note": null, "opt": null}}),
                json!({"spec": {"retainFor": "1h", "opt": null, "mode": "Safe"}}),
            ),
            (
                json!({"spec": {"mode": null, "list": [{}, {"w": 5}]}}),
                json!({"spec": {"mode": "Safe", "list": [{"w": 1}, {"w": 5}], "retainFor": "24h", "opt": "d"}}),
            ),
        ];
        for (mut obj, want) in cases {
            apply_defaults(&schema, &mut obj);
            assert_eq!(obj, want);
        }
    }

    #[test]
    fn invalid_status_shape() {
        let errs = vec![
            FieldError::required("spec.nodeName", ""),
            FieldError::type_invalid(
                "spec.ips[0]",
                json!("integer"),
                "spec.ips[0] in body must be of type string: \"integer\"",
            ),
        ];
        let status = invalid_status("IPReservation.ipkeep.dev", "web-0", &errs);
        assert_eq!(
            status,
            json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "IPReservation.ipkeep.dev \"web-0\" is invalid: [spec.nodeName: Required value, spec.ips[0]: Invalid value: \"integer\": spec.ips[0] in body must be of type string: \"integer\"]",
                "reason": "Invalid",
                "details": {"name": "web-0", "group": "ipkeep.dev", "kind": "IPReservation", "causes": [
                    {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.nodeName"},
                    {"reason": "FieldValueTypeInvalid", "message": "Invalid value: \"integer\": spec.ips[0] in body must be of type string: \"integer\"", "field": "spec.ips[0]"},
                ]},
                "code": 422,
            })
        );
        let one = invalid_status("Pod", "p", &errs[..1]);
        assert_eq!(
            one["message"],
            json!("Pod \"p\" is invalid: spec.nodeName: Required value")
        );
        assert_eq!(one["details"]["group"], json!(""));
    }

    #[test]
    fn value_rendering() {
        let cases = [
            (json!("a\"b"), "\"a\\\"b\""),
            (json!(3), "3"),
            (json!(2.0), "2"),
            (json!(2.5), "2.5"),
            (json!(true), "true"),
            (json!(null), "null"),
            (json!(["x", 1]), "[\"x\",1]"),
        ];
        for (v, want) in cases {
            assert_eq!(render_value(&v), want);
        }
    }
}
