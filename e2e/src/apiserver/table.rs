//! The `meta.k8s.io/v1` `Table` form of lists and objects (what `kubectl get` asks for), with the
//! columns kube-apiserver prints: a CRD's `additionalPrinterColumns`, and for the built-in kinds we
//! serve the columns of kube-apiserver's own printers.
//!
//! Copied behaviour of kube-apiserver's CRD table converter: a printer column's JSONPath takes only
//! its FIRST match (`.spec.ips[*]` shows the first address; `.spec.ips` shows the whole list as
//! JSON); `date` columns are turned into an age (`5m`, `3h10m`) on the server; a value of the wrong
//! type for its column becomes an empty (`null`) cell; a CRD without printer columns gets `Age`.

use serde_json::{Value, json};

/// `metav1.ObjectMeta`'s description of `name`, which kube-apiserver puts on the Name column.
const NAME_DESCRIPTION: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
/// `metav1.ObjectMeta`'s description of `creationTimestamp` (the Age / Created At columns).
const CREATED_DESCRIPTION: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";

/// What each row carries besides its cells (`?includeObject=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IncludeObject {
    /// No object (`"object": null`).
    None,
    /// A `PartialObjectMetadata` with the object's metadata (kube-apiserver's default).
    #[default]
    Metadata,
    /// The whole object.
    Object,
}

impl IncludeObject {
    /// Reads the `includeObject` query parameter value; unknown values give the default.
    pub fn parse(value: &str) -> Self {
        match value {
            "None" => Self::None,
            "Object" => Self::Object,
            _ => Self::Metadata,
        }
    }
}

/// Computes a cell from the whole object and the current time (Unix seconds).
pub type CellFn = fn(&Value, i64) -> Value;

/// Where a column's cells come from.
#[derive(Debug, Clone)]
pub enum CellSource {
    /// `metadata.name`.
    Name,
    /// A printer column JSONPath such as `.spec.ips[0]`.
    JsonPath(String),
    /// The creation timestamp in RFC 3339, UTC (kube-apiserver's default "Created At").
    CreatedAt,
    /// A built-in printer's computed cell (e.g. a pod's `1/2` Ready).
    Computed(CellFn),
}

/// One column of a Table.
#[derive(Debug, Clone)]
pub struct PrinterColumn {
    /// Header, e.g. `Node` (kubectl upper-cases it).
    pub name: String,
    /// `string`, `integer`, `number`, `boolean` or `date`.
    pub type_: String,
    /// Format hint, e.g. `name`.
    pub format: String,
    /// Column description.
    pub description: String,
    /// 0 = shown by default, higher = only with `-o wide`.
    pub priority: i64,
    /// How cells are computed.
    pub source: CellSource,
}

impl PrinterColumn {
    /// A column from a CRD version's `additionalPrinterColumns[]` entry.
    pub fn from_crd(entry: &Value) -> Option<Self> {
        let text = |key: &str| {
            entry
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        Some(Self {
            name: entry.get("name")?.as_str()?.to_string(),
            type_: text("type"),
            format: text("format"),
            description: text("description"),
            priority: entry.get("priority").and_then(Value::as_i64).unwrap_or(0),
            source: CellSource::JsonPath(entry.get("jsonPath")?.as_str()?.to_string()),
        })
    }

    fn new(name: &str, type_: &str, description: &str, priority: i64, source: CellSource) -> Self {
        Self {
            name: name.to_string(),
            type_: type_.to_string(),
            format: String::new(),
            description: description.to_string(),
            priority,
            source,
        }
    }

    fn name_column() -> Self {
        Self {
            format: "name".to_string(),
            ..Self::new("Name", "string", NAME_DESCRIPTION, 0, CellSource::Name)
        }
    }

    fn computed(name: &str, description: &str, priority: i64, f: CellFn) -> Self {
        Self::new(
            name,
            "string",
            description,
            priority,
            CellSource::Computed(f),
        )
    }

    fn definition(&self) -> Value {
        json!({
            "name": self.name,
            "type": self.type_,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        })
    }
}

/// The columns of a CRD version: Name, then its `additionalPrinterColumns` (or Age when it has none).
pub fn crd_columns(additional_printer_columns: &Value) -> Vec<PrinterColumn> {
    let mut columns = vec![PrinterColumn::name_column()];
    let extra: Vec<PrinterColumn> = additional_printer_columns
        .as_array()
        .map(|cols| cols.iter().filter_map(PrinterColumn::from_crd).collect())
        .unwrap_or_default();
    if extra.is_empty() {
        columns.push(PrinterColumn::new(
            "Age",
            "date",
            CREATED_DESCRIPTION,
            0,
            CellSource::JsonPath(".metadata.creationTimestamp".to_string()),
        ));
    } else {
        columns.extend(extra);
    }
    columns
}

/// The columns kube-apiserver prints for a built-in kind; any other kind gets Name + Created At.
pub fn default_columns(kind: &str) -> Vec<PrinterColumn> {
    let name = PrinterColumn::name_column();
    let age = || PrinterColumn::computed("Age", CREATED_DESCRIPTION, 0, age_cell);
    match kind {
        "Pod" => vec![
            name,
            PrinterColumn::computed(
                "Ready",
                "The aggregate readiness state of this pod for accepting traffic.",
                0,
                pod_ready,
            ),
            PrinterColumn::computed(
                "Status",
                "The aggregate status of the containers in this pod.",
                0,
                pod_status,
            ),
            PrinterColumn::computed(
                "Restarts",
                "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
                0,
                pod_restarts,
            ),
            age(),
            PrinterColumn::computed("IP", "podIP address allocated to the pod.", 1, pod_ip),
            PrinterColumn::computed(
                "Node",
                "NodeName indicates in which node this pod is scheduled.",
                1,
                pod_node,
            ),
            PrinterColumn::computed(
                "Nominated Node",
                "nominatedNodeName is set only when this pod preempts other pods on the node.",
                1,
                pod_nominated_node,
            ),
            PrinterColumn::computed(
                "Readiness Gates",
                "If specified, all readiness gates will be evaluated for pod readiness.",
                1,
                pod_readiness_gates,
            ),
        ],
        "Namespace" => vec![
            name,
            PrinterColumn::computed("Status", "The status of the namespace", 0, namespace_status),
            age(),
        ],
        "Node" => vec![
            name,
            PrinterColumn::computed("Status", "The status of the node", 0, node_status),
            PrinterColumn::computed("Roles", "The roles of the node", 0, node_roles),
            age(),
            PrinterColumn::computed(
                "Version",
                "Kubelet Version reported by the node.",
                0,
                |o, _| text_or(o.pointer("/status/nodeInfo/kubeletVersion"), ""),
            ),
            PrinterColumn::computed(
                "Internal-IP",
                "List of addresses reachable to the node.",
                1,
                |o, _| node_address(o, "InternalIP"),
            ),
            PrinterColumn::computed(
                "External-IP",
                "List of addresses reachable to the node.",
                1,
                |o, _| node_address(o, "ExternalIP"),
            ),
            PrinterColumn::computed(
                "OS-Image",
                "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).",
                1,
                |o, _| text_or(o.pointer("/status/nodeInfo/osImage"), "<unknown>"),
            ),
            PrinterColumn::computed(
                "Kernel-Version",
                "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).",
                1,
                |o, _| text_or(o.pointer("/status/nodeInfo/kernelVersion"), "<unknown>"),
            ),
            PrinterColumn::computed(
                "Container-Runtime",
                "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).",
                1,
                |o, _| {
                    text_or(
                        o.pointer("/status/nodeInfo/containerRuntimeVersion"),
                        "<unknown>",
                    )
                },
            ),
        ],
        "Lease" => vec![
            name,
            PrinterColumn::computed(
                "Holder",
                "holderIdentity contains the identity of the holder of a current lease.",
                0,
                |o, _| text_or(o.pointer("/spec/holderIdentity"), ""),
            ),
            age(),
        ],
        "Event" => vec![
            PrinterColumn::computed(
                "Last Seen",
                "Time when this Event was last observed.",
                0,
                event_last_seen,
            ),
            PrinterColumn::computed(
                "Type",
                "Type of this event (Normal, Warning), new types could be added in the future.",
                0,
                |o, _| text_or(o.get("type"), ""),
            ),
            PrinterColumn::computed(
                "Reason",
                "This should be a short, machine understandable string that gives the reason for the transition into the object's current status.",
                0,
                |o, _| text_or(o.get("reason"), ""),
            ),
            PrinterColumn::computed(
                "Object",
                "The object that this event is about.",
                0,
                event_object,
            ),
            PrinterColumn::computed(
                "Subobject",
                "The field of the object that this event is about.",
                1,
                |o, _| text_or(event_regarding(o).and_then(|r| r.get("fieldPath")), ""),
            ),
            PrinterColumn::computed(
                "Source",
                "The component reporting this event.",
                1,
                event_source,
            ),
            PrinterColumn::computed(
                "Message",
                "A human-readable description of the status of this operation.",
                0,
                |o, _| text_or(o.get("message").or_else(|| o.get("note")), ""),
            ),
            PrinterColumn::computed(
                "First Seen",
                "The time at which the event was first recorded.",
                1,
                event_first_seen,
            ),
            PrinterColumn::computed(
                "Count",
                "The number of times this event has occurred.",
                1,
                event_count,
            ),
            PrinterColumn::computed("Name", NAME_DESCRIPTION, 1, |o, _| {
                text_or(o.pointer("/metadata/name"), "")
            }),
        ],
        _ => vec![
            name,
            PrinterColumn::new(
                "Created At",
                "date",
                CREATED_DESCRIPTION,
                0,
                CellSource::CreatedAt,
            ),
        ],
    }
}

/// Builds the Table for `rows` (full stored objects) with the wall clock for ages.
/// The caller fills `metadata.resourceVersion` / `metadata.continue`.
pub fn table(columns: &[PrinterColumn], rows: &[&Value], include_object: IncludeObject) -> Value {
    table_at(
        columns,
        rows,
        include_object,
        jiff::Timestamp::now().as_second(),
    )
}

/// [`table`] with the current time (Unix seconds) passed in.
pub fn table_at(
    columns: &[PrinterColumn],
    rows: &[&Value],
    include_object: IncludeObject,
    now: i64,
) -> Value {
    let definitions: Vec<Value> = columns.iter().map(PrinterColumn::definition).collect();
    let rows: Vec<Value> = rows
        .iter()
        .map(|obj| {
            let cells: Vec<Value> = columns.iter().map(|c| cell(c, obj, now)).collect();
            let object = match include_object {
                IncludeObject::None => Value::Null,
                IncludeObject::Metadata => json!({
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
                }),
                IncludeObject::Object => (*obj).clone(),
            };
            json!({"cells": cells, "object": object})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {},
        "columnDefinitions": definitions,
        "rows": rows,
    })
}

fn cell(column: &PrinterColumn, obj: &Value, now: i64) -> Value {
    match &column.source {
        CellSource::Name => obj
            .pointer("/metadata/name")
            .cloned()
            .unwrap_or(Value::Null),
        CellSource::CreatedAt => obj
            .pointer("/metadata/creationTimestamp")
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            .map(|t| Value::String(t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()))
            .unwrap_or(Value::Null),
        CellSource::Computed(f) => f(obj, now),
        CellSource::JsonPath(path) => {
            let Some(value) = json_path(path, obj).into_iter().next() else {
                return Value::Null;
            };
            cell_for_json_value(&column.type_, value, now)
        }
    }
}

/// kube-apiserver's `cellForJSONValue` (plus its string printing for `string` columns).
fn cell_for_json_value(type_: &str, value: &Value, now: i64) -> Value {
    match (type_, value) {
        (_, Value::Null) => Value::Null,
        ("string", Value::String(_)) => value.clone(),
        // A string column prints any value: scalars as text, lists and maps as JSON.
        ("string", Value::Number(n)) => Value::String(n.to_string()),
        ("string", Value::Bool(b)) => Value::String(b.to_string()),
        ("string", other) => Value::String(other.to_string()),
        ("integer", Value::Number(n)) => n
            .as_i64()
            .or_else(|| n.as_f64().map(|f| f as i64))
            .map_or(Value::Null, |i| json!(i)),
        ("number", Value::Number(n)) => n.as_f64().map_or(Value::Null, |f| json!(f)),
        ("boolean", Value::Bool(_)) => value.clone(),
        ("date", Value::String(s)) => match s.parse::<jiff::Timestamp>() {
            Ok(t) => Value::String(human_duration(now - t.as_second())),
            Err(_) => Value::String("<invalid>".to_string()),
        },
        _ => Value::Null,
    }
}

/// One step of a printer column JSONPath.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    Key(String),
    Index(i64),
    All,
}

/// Parses the JSONPath subset printer columns use: `.a.b`, `.a[0]`, `.a[-1]`, `.a[*]`,
/// `.a['dotted.key']`, optionally wrapped in `{}`.
fn parse_path(path: &str) -> Option<Vec<Step>> {
    let path = path.trim();
    let path = path
        .strip_prefix('{')
        .and_then(|p| p.strip_suffix('}'))
        .unwrap_or(path);
    let chars: Vec<char> = path.chars().collect();
    let mut steps = Vec::new();
    let mut i = 0;
    // A leading key without a dot (`spec.x`) is accepted like `.spec.x`.
    if chars.first().is_some_and(|c| *c != '.' && *c != '[') {
        i = read_key(&chars, 0, &mut steps);
    }
    while i < chars.len() {
        match chars[i] {
            '.' => i = read_key(&chars, i + 1, &mut steps),
            '[' => {
                let end = chars[i..].iter().position(|c| *c == ']')? + i;
                let inner: String = chars[i + 1..end].iter().collect();
                let inner = inner.trim();
                if inner == "*" {
                    steps.push(Step::All);
                } else if let Some(q) = inner
                    .strip_prefix('\'')
                    .and_then(|s| s.strip_suffix('\''))
                    .or_else(|| inner.strip_prefix('"').and_then(|s| s.strip_suffix('"')))
                {
                    steps.push(Step::Key(q.to_string()));
                } else {
                    steps.push(Step::Index(inner.parse().ok()?));
                }
                i = end + 1;
            }
            _ => return None,
        }
    }
    Some(steps)
}

fn read_key(chars: &[char], start: usize, steps: &mut Vec<Step>) -> usize {
    let mut end = start;
    while end < chars.len() && chars[end] != '.' && chars[end] != '[' {
        end += 1;
    }
    if end > start {
        steps.push(Step::Key(chars[start..end].iter().collect()));
    }
    end
}

/// Every value `path` selects in `obj`, in document order (empty when nothing matches or the
/// path is outside the supported subset).
pub fn json_path<'a>(path: &str, obj: &'a Value) -> Vec<&'a Value> {
    let Some(steps) = parse_path(path) else {
        return Vec::new();
    };
    let mut current = vec![obj];
    for step in &steps {
        let mut next = Vec::new();
        for v in current {
            match (step, v) {
                (Step::Key(k), Value::Object(m)) => next.extend(m.get(k)),
                (Step::Index(i), Value::Array(a)) => {
                    let len = a.len() as i64;
                    let idx = if *i < 0 { len + i } else { *i };
                    if (0..len).contains(&idx) {
                        next.extend(a.get(idx as usize));
                    }
                }
                (Step::All, Value::Array(a)) => next.extend(a.iter()),
                (Step::All, Value::Object(m)) => next.extend(m.values()),
                _ => {}
            }
        }
        current = next;
    }
    current
}

/// kube's `duration.HumanDuration`: the short age format of `kubectl get` (`45s`, `3m20s`, `5h`, `2d3h`).
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".to_string();
    }
    if seconds < 0 {
        return "0s".to_string();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let days = (hours / 24) % 365;
        let years = hours / 24 / 365;
        return if days == 0 {
            format!("{years}y")
        } else {
            format!("{years}y{days}d")
        };
    }
    format!("{}y", hours / 24 / 365)
}

fn text_or(v: Option<&Value>, fallback: &str) -> Value {
    match v.and_then(Value::as_str) {
        Some(s) if !s.is_empty() => Value::String(s.to_string()),
        _ => Value::String(fallback.to_string()),
    }
}

/// The age of a timestamp field, `<unknown>` when it is missing.
fn since(v: Option<&Value>, now: i64) -> String {
    v.and_then(Value::as_str)
        .and_then(|s| s.parse::<jiff::Timestamp>().ok())
        .map_or_else(
            || "<unknown>".to_string(),
            |t| human_duration(now - t.as_second()),
        )
}

fn age_cell(obj: &Value, now: i64) -> Value {
    Value::String(since(obj.pointer("/metadata/creationTimestamp"), now))
}

fn array(v: Option<&Value>) -> &[Value] {
    v.and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

fn pod_ready(obj: &Value, _now: i64) -> Value {
    let total = array(obj.pointer("/spec/containers")).len();
    let ready = array(obj.pointer("/status/containerStatuses"))
        .iter()
        .filter(|c| {
            c.get("ready") == Some(&Value::Bool(true)) && c.pointer("/state/running").is_some()
        })
        .count();
    Value::String(format!("{ready}/{total}"))
}

/// kube-apiserver's pod Status column, without init-container and sidecar details.
fn pod_status(obj: &Value, _now: i64) -> Value {
    let mut reason = obj
        .pointer("/status/reason")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .or_else(|| obj.pointer("/status/phase").and_then(Value::as_str))
        .unwrap_or("Pending")
        .to_string();
    let mut has_running = false;
    for c in array(obj.pointer("/status/containerStatuses")).iter().rev() {
        let waiting = c
            .pointer("/state/waiting/reason")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        let terminated = c.pointer("/state/terminated");
        if let Some(w) = waiting {
            reason = w.to_string();
        } else if let Some(t) = terminated {
            reason = match t
                .get("reason")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
            {
                Some(r) => r.to_string(),
                None => match t.get("signal").and_then(Value::as_i64).filter(|s| *s != 0) {
                    Some(sig) => format!("Signal:{sig}"),
                    None => format!(
                        "ExitCode:{}",
                        t.get("exitCode").and_then(Value::as_i64).unwrap_or(0)
                    ),
                },
            };
        } else if c.get("ready") == Some(&Value::Bool(true))
            && c.pointer("/state/running").is_some()
        {
            has_running = true;
        }
    }
    if reason == "Completed" && has_running {
        reason = "Running".to_string();
    }
    if obj
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|d| !d.is_null())
    {
        reason = if obj.pointer("/status/reason").and_then(Value::as_str) == Some("NodeLost") {
            "Unknown".to_string()
        } else {
            "Terminating".to_string()
        };
    }
    Value::String(reason)
}

fn pod_restarts(obj: &Value, _now: i64) -> Value {
    let restarts: i64 = array(obj.pointer("/status/containerStatuses"))
        .iter()
        .filter_map(|c| c.get("restartCount").and_then(Value::as_i64))
        .sum();
    Value::String(restarts.to_string())
}

fn pod_ip(obj: &Value, _now: i64) -> Value {
    let first = array(obj.pointer("/status/podIPs"))
        .first()
        .and_then(|ip| ip.get("ip"));
    text_or(first.or_else(|| obj.pointer("/status/podIP")), "<none>")
}

fn pod_node(obj: &Value, _now: i64) -> Value {
    text_or(obj.pointer("/spec/nodeName"), "<none>")
}

fn pod_nominated_node(obj: &Value, _now: i64) -> Value {
    text_or(obj.pointer("/status/nominatedNodeName"), "<none>")
}

fn pod_readiness_gates(obj: &Value, _now: i64) -> Value {
    let gates = array(obj.pointer("/spec/readinessGates"));
    if gates.is_empty() {
        return Value::String("<none>".to_string());
    }
    let conditions = array(obj.pointer("/status/conditions"));
    let true_gates = gates
        .iter()
        .filter(|g| {
            conditions.iter().any(|c| {
                c.get("type") == g.get("conditionType") && c.get("status") == Some(&json!("True"))
            })
        })
        .count();
    Value::String(format!("{true_gates}/{}", gates.len()))
}

fn namespace_status(obj: &Value, _now: i64) -> Value {
    text_or(obj.pointer("/status/phase"), "Active")
}

fn node_status(obj: &Value, _now: i64) -> Value {
    let ready = array(obj.pointer("/status/conditions"))
        .iter()
        .find(|c| c.get("type") == Some(&json!("Ready")))
        .and_then(|c| c.get("status").and_then(Value::as_str));
    let mut status = match ready {
        Some("True") => "Ready".to_string(),
        Some(_) => "NotReady".to_string(),
        None => "Unknown".to_string(),
    };
    if obj.pointer("/spec/unschedulable") == Some(&Value::Bool(true)) {
        status.push_str(",SchedulingDisabled");
    }
    Value::String(status)
}

fn node_roles(obj: &Value, _now: i64) -> Value {
    let mut roles: Vec<String> = Vec::new();
    if let Some(labels) = obj.pointer("/metadata/labels").and_then(Value::as_object) {
        for (key, value) in labels {
            if let Some(role) = key.strip_prefix("node-role.kubernetes.io/") {
                roles.push(role.to_string());
            } else if key == "kubernetes.io/role"
                && let Some(v) = value.as_str()
            {
                roles.push(v.to_string());
            }
        }
    }
    roles.retain(|r| !r.is_empty());
    roles.sort();
    roles.dedup();
    Value::String(if roles.is_empty() {
        "<none>".to_string()
    } else {
        roles.join(",")
    })
}

fn node_address(obj: &Value, kind: &str) -> Value {
    let address = array(obj.pointer("/status/addresses"))
        .iter()
        .find(|a| a.get("type").and_then(Value::as_str) == Some(kind))
        .and_then(|a| a.get("address"));
    text_or(address, "<none>")
}

/// The involved object of a core event or the `regarding` object of an events.k8s.io event.
fn event_regarding(obj: &Value) -> Option<&Value> {
    obj.get("involvedObject").or_else(|| obj.get("regarding"))
}

fn event_object(obj: &Value, _now: i64) -> Value {
    let r = event_regarding(obj);
    let kind = r
        .and_then(|r| r.get("kind"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let name = r
        .and_then(|r| r.get("name"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    Value::String(format!("{}/{name}", kind.to_lowercase()))
}

fn event_source(obj: &Value, _now: i64) -> Value {
    let component = obj
        .pointer("/source/component")
        .or_else(|| obj.get("reportingController"))
        .or_else(|| obj.get("reportingComponent"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let host = obj
        .pointer("/source/host")
        .or_else(|| obj.pointer("/deprecatedSource/host"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    Value::String(if host.is_empty() {
        component.to_string()
    } else {
        format!("{component}, {host}")
    })
}

fn non_null<'a>(obj: &'a Value, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

fn event_first_seen(obj: &Value, now: i64) -> Value {
    let first = non_null(obj, "firstTimestamp")
        .or_else(|| non_null(obj, "deprecatedFirstTimestamp"))
        .or_else(|| non_null(obj, "eventTime"));
    Value::String(since(first, now))
}

fn event_last_seen(obj: &Value, now: i64) -> Value {
    if let Some(t) = obj.pointer("/series/lastObservedTime") {
        return Value::String(since(Some(t), now));
    }
    match non_null(obj, "lastTimestamp").or_else(|| non_null(obj, "deprecatedLastTimestamp")) {
        Some(t) => Value::String(since(Some(t), now)),
        None => event_first_seen(obj, now),
    }
}

fn event_count(obj: &Value, _now: i64) -> Value {
    let count = obj
        .pointer("/series/count")
        .or_else(|| obj.get("count"))
        .or_else(|| obj.get("deprecatedCount"))
        .and_then(Value::as_i64)
        .filter(|c| *c != 0)
        .unwrap_or(1);
    json!(count)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    /// 2024-05-01T12:00:00Z
    const NOW: i64 = 1_714_564_800;

    fn reservation() -> Value {
        json!({
            "apiVersion": "ipkeep.dev/v1alpha1", "kind": "IPReservation",
            "metadata": {"name": "web-0", "namespace": "default", "resourceVersion": "7",
                         "creationTimestamp": "2024-05-01T11:55:00Z"},
            "spec": {"ips": ["10.244.1.17", "fd00::11"], "nodeName": "node-a", "port": 8080,
                     "weight": 1.5, "on": true},
            "status": {"phase": "Bound", "releaseTime": "2024-05-01T10:00:00Z"},
        })
    }

    fn crd_printer_columns() -> Value {
        json!([
            {"name": "IPs", "type": "string", "jsonPath": ".spec.ips"},
            {"name": "First", "type": "string", "jsonPath": ".spec.ips[*]"},
            {"name": "Last", "type": "string", "jsonPath": ".spec.ips[-1]"},
            {"name": "Node", "type": "string", "jsonPath": ".spec.nodeName", "priority": 1},
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Released", "type": "date", "jsonPath": ".status.releaseTime"},
            {"name": "Missing", "type": "string", "jsonPath": ".status.nothing"},
            {"name": "Port", "type": "integer", "jsonPath": ".spec.port"},
            {"name": "PortText", "type": "string", "jsonPath": ".spec.port"},
            {"name": "Weight", "type": "number", "jsonPath": ".spec.weight"},
            {"name": "On", "type": "boolean", "jsonPath": ".spec.on"},
            {"name": "WrongType", "type": "integer", "jsonPath": ".spec.nodeName"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ])
    }

    #[test]
    fn crd_table_cells_and_definitions() {
        let columns = crd_columns(&crd_printer_columns());
        let obj = reservation();
        let t = table_at(&columns, &[&obj], IncludeObject::Metadata, NOW);
        assert_eq!(t["kind"], "Table");
        assert_eq!(t["apiVersion"], "meta.k8s.io/v1");
        let defs = t["columnDefinitions"].as_array().unwrap();
        assert_eq!(defs[0]["name"], "Name");
        assert_eq!(defs[0]["format"], "name");
        assert_eq!(defs[4]["name"], "Node");
        assert_eq!(defs[4]["priority"], 1);
        assert_eq!(
            t["rows"][0]["cells"],
            json!([
                "web-0",
                "[\"10.244.1.17\",\"fd00::11\"]",
                "10.244.1.17",
                "fd00::11",
                "node-a",
                "Bound",
                "120m",
                null,
                8080,
                "8080",
                1.5,
                true,
                null,
                "5m",
            ])
        );
        assert_eq!(
            t["rows"][0]["object"],
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                   "metadata": obj["metadata"]})
        );
    }

    #[test]
    fn include_object_variants() {
        let obj = reservation();
        let cols = crd_columns(&Value::Null);
        let none = table_at(&cols, &[&obj], IncludeObject::None, NOW);
        assert_eq!(none["rows"][0]["object"], Value::Null);
        let full = table_at(&cols, &[&obj], IncludeObject::Object, NOW);
        assert_eq!(full["rows"][0]["object"], obj);
        assert_eq!(IncludeObject::parse("Object"), IncludeObject::Object);
        assert_eq!(IncludeObject::parse("None"), IncludeObject::None);
        assert_eq!(IncludeObject::parse(""), IncludeObject::Metadata);
    }

    #[test]
    fn crd_without_printer_columns_gets_age() {
        let cols = crd_columns(&json!([]));
        let names: Vec<&str> = cols.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["Name", "Age"]);
        let obj = reservation();
        let t = table_at(&cols, &[&obj], IncludeObject::None, NOW);
        assert_eq!(t["rows"][0]["cells"], json!(["web-0", "5m"]));
    }

    #[test]
    fn invalid_date_cell() {
        let cols =
            crd_columns(&json!([{"name": "T", "type": "date", "jsonPath": ".spec.nodeName"}]));
        let obj = reservation();
        let t = table_at(&cols, &[&obj], IncludeObject::None, NOW);
        assert_eq!(t["rows"][0]["cells"][1], "<invalid>");
    }

    #[test]
    fn json_path_subset() {
        let obj = json!({"a": {"b": [1, 2, 3], "c.d": "x", "m": {"k": "v"}}});
        let cases: Vec<(&str, Vec<Value>)> = vec![
            (".a.b[0]", vec![json!(1)]),
            (".a.b[-1]", vec![json!(3)]),
            (".a.b[*]", vec![json!(1), json!(2), json!(3)]),
            (".a.b[7]", vec![]),
            ("{.a['c.d']}", vec![json!("x")]),
            (".a[\"c.d\"]", vec![json!("x")]),
            ("a.m.k", vec![json!("v")]),
            (".a.m[*]", vec![json!("v")]),
            (".a.nope.deeper", vec![]),
            (".a.b[x]", vec![]),
        ];
        for (path, want) in cases {
            let got: Vec<Value> = json_path(path, &obj).into_iter().cloned().collect();
            assert_eq!(got, want, "{path}");
        }
    }

    #[test]
    fn human_durations() {
        let cases = [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (200, "3m20s"),
            (600, "10m"),
            (179 * 60, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 600, "3h10m"),
            (8 * 3600, "8h"),
            (47 * 3600, "47h"),
            (48 * 3600, "2d"),
            (51 * 3600, "2d3h"),
            (8 * 86400, "8d"),
            (730 * 86400, "2y"),
            (731 * 86400, "2y1d"),
            (9 * 365 * 86400, "9y"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(secs), want, "{secs}");
        }
    }

    fn row(kind: &str, obj: &Value) -> Value {
        let cols = default_columns(kind);
        let t = table_at(&cols, &[obj], IncludeObject::None, NOW);
        let cells = t["rows"][0]["cells"].as_array().unwrap();
        assert_eq!(cells.len(), cols.len());
        t["rows"][0]["cells"].clone()
    }

    #[test]
    fn pod_columns() {
        let names: Vec<String> = default_columns("Pod")
            .iter()
            .map(|c| c.name.clone())
            .collect();
        assert_eq!(
            names,
            [
                "Name",
                "Ready",
                "Status",
                "Restarts",
                "Age",
                "IP",
                "Node",
                "Nominated Node",
                "Readiness Gates"
            ]
        );
        let running = json!({
            "metadata": {"name": "web-0", "creationTimestamp": "2024-05-01T11:00:00Z"},
            "spec": {"nodeName": "node-a", "containers": [{"name": "a"}, {"name": "b"}]},
            "status": {"phase": "Running", "podIPs": [{"ip": "10.244.1.17"}],
                "containerStatuses": [
                    {"name": "a", "ready": true, "restartCount": 2, "state": {"running": {}}},
                    {"name": "b", "ready": false, "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
                ]},
        });
        assert_eq!(
            row("Pod", &running),
            json!([
                "web-0",
                "1/2",
                "CrashLoopBackOff",
                "3",
                "60m",
                "10.244.1.17",
                "node-a",
                "<none>",
                "<none>"
            ])
        );
        let pending = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]}});
        assert_eq!(
            row("Pod", &pending),
            json!([
                "p",
                "0/1",
                "Pending",
                "0",
                "<unknown>",
                "<none>",
                "<none>",
                "<none>",
                "<none>"
            ])
        );
        let deleting = json!({"metadata": {"name": "d", "deletionTimestamp": "2024-05-01T11:59:00Z"},
                              "spec": {"containers": []}, "status": {"phase": "Running"}});
        assert_eq!(row("Pod", &deleting)[2], "Terminating");
    }

    #[test]
    fn node_namespace_lease_event_columns() {
        let node = json!({
            "metadata": {"name": "node-a", "creationTimestamp": "2024-04-29T12:00:00Z",
                         "labels": {"node-role.kubernetes.io/control-plane": "", "kubernetes.io/role": "worker"}},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "addresses": [{"type": "InternalIP", "address": "192.0.2.10"}],
                       "nodeInfo": {"kubeletVersion": "v1.33.0"}},
        });
        assert_eq!(
            row("Node", &node),
            json!([
                "node-a",
                "Ready,SchedulingDisabled",
                "control-plane,worker",
                "2d",
                "v1.33.0",
                "192.0.2.10",
                "<none>",
                "<unknown>",
                "<unknown>",
                "<unknown>"
            ])
        );
        let ns = json!({"metadata": {"name": "default", "creationTimestamp": "2024-05-01T11:59:30Z"},
                        "status": {"phase": "Active"}});
        assert_eq!(row("Namespace", &ns), json!(["default", "Active", "30s"]));
        let lease = json!({"metadata": {"name": "ipkeep"}, "spec": {"holderIdentity": "ctrl-1"}});
        assert_eq!(
            row("Lease", &lease),
            json!(["ipkeep", "ctrl-1", "<unknown>"])
        );
        let core_event = json!({
            "metadata": {"name": "web-0.17"}, "type": "Warning", "reason": "BadAnnotation",
            "involvedObject": {"kind": "Pod", "name": "web-0"}, "message": "bad retain-for",
            "source": {"component": "ipkeep"}, "count": 3,
            "firstTimestamp": "2024-05-01T11:00:00Z", "lastTimestamp": "2024-05-01T11:58:00Z",
        });
        assert_eq!(
            row("Event", &core_event),
            json!([
                "2m",
                "Warning",
                "BadAnnotation",
                "pod/web-0",
                "",
                "ipkeep",
                "bad retain-for",
                "60m",
                3,
                "web-0.17"
            ])
        );
        let new_event = json!({
            "metadata": {"name": "e"}, "type": "Normal", "reason": "Bound",
            "regarding": {"kind": "IPReservation", "name": "web-0"}, "note": "bound",
            "reportingController": "ipkeep", "eventTime": "2024-05-01T11:59:00.000000Z",
        });
        assert_eq!(
            row("Event", &new_event),
            json!([
                "60s",
                "Normal",
                "Bound",
                "ipreservation/web-0",
                "",
                "ipkeep",
                "bound",
                "60s",
                1,
                "e"
            ])
        );
    }

    #[test]
    fn default_table_has_created_at() {
        let crd = json!({"metadata": {"name": "ipreservations.ipkeep.dev",
                                      "creationTimestamp": "2024-05-01T10:00:00Z"}});
        let cols = default_columns("CustomResourceDefinition");
        let t = table_at(&cols, &[&crd], IncludeObject::None, NOW);
        assert_eq!(t["columnDefinitions"][1]["name"], "Created At");
        assert_eq!(t["columnDefinitions"][1]["type"], "date");
        assert_eq!(
            t["rows"][0]["cells"],
            json!(["ipreservations.ipkeep.dev", "2024-05-01T10:00:00Z"])
        );
    }
}
