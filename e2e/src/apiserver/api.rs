//! Resource requests: the URL grammar, query parameters, reads (get, list) and the selection filter
//! shared by list and watch. Writes live in `write.rs`, watches in `watch.rs`.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::{
    convert,
    faults::{Faults, Verb},
    format::{self, Representation},
    registry::ResourceType,
    selector::{FieldSelector, LabelSelector},
    status::ApiError,
    store::Store,
    table::{self},
};

/// State shared by every request handler of one server.
#[derive(Debug)]
pub struct Ctx {
    /// All objects, under one lock (writes are serialised, as one etcd would order them).
    pub store: Arc<Mutex<Store>>,
    /// The fault-injection controls.
    pub faults: Arc<Faults>,
    /// How often a watch that allows bookmarks gets one ([`Duration::ZERO`]: never).
    pub bookmark_interval: Duration,
}

impl Ctx {
    /// The locked store (a poisoned lock still holds consistent data: writes are not split across awaits).
    pub fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A parsed HTTP request.
#[derive(Debug)]
pub struct Request {
    /// Upper-case method.
    pub method: String,
    /// Path without the query.
    pub path: String,
    /// Decoded query pairs (empty pairs, as kube's `?&` produces, are dropped).
    pub query: Vec<(String, String)>,
    /// Accept header.
    pub accept: String,
    /// Content-Type header.
    pub content_type: String,
    /// The `User-Agent` header ("" without one): names the field manager of a write without
    /// `fieldManager`, as in kube-apiserver.
    pub user_agent: String,
    /// The request body.
    pub body: Bytes,
}

impl Request {
    /// The value of a query parameter.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// A query parameter that is a boolean flag (`watch=true`, `watch=1`).
    pub fn flag(&self, key: &str) -> bool {
        matches!(self.param(key), Some("true" | "1"))
    }
}

/// What a handler answers.
#[derive(Debug)]
pub enum Reply {
    /// A JSON body with a status code.
    Json(u16, Value),
    /// A streaming body of newline-delimited JSON (watch).
    Stream(tokio::sync::mpsc::Receiver<Bytes>),
    /// Plain text (health endpoints).
    Text(u16, String),
    /// A Kubernetes `Status` failure.
    Error(ApiError),
}

impl From<ApiError> for Reply {
    fn from(e: ApiError) -> Self {
        Reply::Error(e)
    }
}

/// Decode `application/x-www-form-urlencoded` text.
pub fn decode_component(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 3 <= bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Split a query string into decoded pairs, skipping empty ones.
pub fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode_component(k), decode_component(v))
        })
        .collect()
}

/// The resource a request addresses.
#[derive(Debug, Clone)]
pub struct Target {
    /// The resource type.
    pub rt: Arc<ResourceType>,
    /// The API version in the URL.
    pub version: String,
    /// The namespace in the URL (None for cluster-scoped or all-namespaces requests).
    pub namespace: Option<String>,
    /// The object name, for single-object requests.
    pub name: Option<String>,
    /// The subresource (`status`).
    pub sub: Option<String>,
}

impl Target {
    /// The storage namespace of a single object (empty for cluster-scoped types).
    pub fn ns(&self) -> &str {
        self.namespace.as_deref().unwrap_or_default()
    }

    /// The object with `apiVersion`/`kind` of the requested version (storage is version-agnostic).
    pub fn present(&self, obj: &Value) -> Value {
        let obj = &convert::from_storage(&self.rt, obj);
        let mut out = Map::new();
        out.insert(
            "apiVersion".into(),
            json!(self.rt.api_version(&self.version)),
        );
        out.insert("kind".into(), json!(self.rt.kind));
        for (k, v) in obj.as_object().into_iter().flatten() {
            if k != "apiVersion" && k != "kind" {
                out.insert(k.clone(), v.clone());
            }
        }
        Value::Object(out)
    }
}

/// Parse `/api/v1/...` or `/apis/{group}/{version}/...` into a target; `Ok(None)` when the path is
/// not a resource path (discovery and friends).
pub fn parse_target(store: &Store, path: &str) -> Result<Option<Target>, ApiError> {
    let segments: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(decode_component)
        .collect();
    let (group, version, rest) = match segments.as_slice() {
        [api, version, rest @ ..] if api == "api" && !rest.is_empty() => {
            (String::new(), version.clone(), rest)
        }
        [apis, group, version, rest @ ..] if apis == "apis" && !rest.is_empty() => {
            (group.clone(), version.clone(), rest)
        }
        _ => return Ok(None),
    };
    let not_found = || ApiError::path_not_found(path);
    let (namespace, rest) = match rest {
        [ns, _, sub] if ns == "namespaces" && (sub == "status" || sub == "finalize") => {
            (None, rest)
        }
        [ns, namespace, rest @ ..] if ns == "namespaces" && !rest.is_empty() => {
            (Some(namespace.clone()), rest)
        }
        _ => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [plural] => (plural, None, None),
        [plural, name] => (plural, Some(name.clone()), None),
        [plural, name, sub] => (plural, Some(name.clone()), Some(sub.clone())),
        _ => return Err(not_found()),
    };
    let rt = store
        .registry
        .find(&group, &version, plural)
        .ok_or_else(not_found)?;
    if namespace.is_some() && !rt.namespaced {
        return Err(not_found());
    }
    if rt.namespaced && namespace.is_none() && name.is_some() {
        return Err(not_found());
    }
    match sub.as_deref() {
        None => {}
        Some("status") if rt.status_subresource => {}
        Some(_) => return Err(not_found()),
    }
    Ok(Some(Target {
        rt,
        version,
        namespace,
        name,
        sub,
    }))
}

/// The verb a request on a target performs.
pub fn verb_of(req: &Request, target: &Target) -> Result<Verb, ApiError> {
    let single = target.name.is_some();
    Ok(match (req.method.as_str(), single) {
        ("GET", true) => Verb::Get,
        ("GET", false) if req.flag("watch") => Verb::Watch,
        ("GET", false) => Verb::List,
        ("POST", false) => Verb::Create,
        ("PUT", true) => Verb::Update,
        ("PATCH", true) => Verb::Patch,
        ("DELETE", _) => Verb::Delete,
        (m, _) => {
            return Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({m} {})",
                req.path
            )));
        }
    })
}

/// The value of a field path (`spec.nodeName`) as field selectors compare it: missing fields read
/// as the empty string (booleans as `false` where Kubernetes defaults them), scalars as text.
pub fn field_value(obj: &Value, path: &str) -> String {
    let found = path.split('.').try_fold(obj, |cur, key| cur.get(key));
    match found {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::Null) | None => match path {
            "spec.hostNetwork" | "spec.unschedulable" => "false".into(),
            _ => String::new(),
        },
        Some(other) => other.to_string(),
    }
}

/// The label/field/namespace filter of a list or watch.
#[derive(Debug)]
pub struct Selection {
    rt: Arc<ResourceType>,
    namespace: Option<String>,
    labels: Option<LabelSelector>,
    fields: Option<FieldSelector>,
}

impl Selection {
    /// Parse the selectors of a request; unsupported field labels are a 400 as in kube-apiserver.
    pub fn from_request(req: &Request, target: &Target) -> Result<Selection, ApiError> {
        let labels =
            match req.param("labelSelector").filter(|s| !s.is_empty()) {
                Some(s) => Some(LabelSelector::parse(s).map_err(|e| {
                    ApiError::bad_request(format!("unable to parse requirement: {e}"))
                })?),
                None => None,
            };
        let fields = match req.param("fieldSelector").filter(|s| !s.is_empty()) {
            Some(s) => {
                let sel =
                    FieldSelector::parse(s).map_err(|e| ApiError::bad_request(e.to_string()))?;
                let mut supported: Vec<&str> = vec!["metadata.name"];
                if target.rt.namespaced {
                    supported.push("metadata.namespace");
                }
                supported.extend(target.rt.selectable_fields.iter().map(String::as_str));
                sel.check_supported(&supported)
                    .map_err(|e| ApiError::bad_request(e.to_string()))?;
                Some(sel)
            }
            None => None,
        };
        Ok(Selection {
            rt: target.rt.clone(),
            namespace: target.namespace.clone(),
            labels,
            fields,
        })
    }

    /// A selection of exactly one object (watch of a single name, as `kubectl get x -w` does).
    pub fn with_name(mut self, name: &str) -> Result<Selection, ApiError> {
        let by_name = FieldSelector::parse(&format!("metadata.name={name}"))
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        self.fields = Some(by_name);
        Ok(self)
    }

    /// Whether an object is selected.
    pub fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace
            && obj.pointer("/metadata/namespace").and_then(Value::as_str) != Some(ns.as_str())
        {
            return false;
        }
        if let Some(labels) = &self.labels {
            let map: BTreeMap<String, String> = obj
                .pointer("/metadata/labels")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                .collect();
            if !labels.matches(&map) {
                return false;
            }
        }
        if let Some(fields) = &self.fields {
            let lookup =
                |path: &str| Some(field_value(obj, &convert::storage_field(&self.rt, path)));
            if !fields.matches(&lookup) {
                return false;
            }
        }
        true
    }
}

/// The printer columns of a target: a CRD's `additionalPrinterColumns`, or the built-in defaults.
pub fn columns(target: &Target) -> Vec<table::PrinterColumn> {
    if target.rt.crd_name.is_some() {
        table::crd_columns(&Value::Array(target.rt.columns(&target.version).to_vec()))
    } else {
        table::default_columns(&target.rt.kind)
    }
}

/// Render objects in the requested representation (a list when `list_meta` is given).
pub fn render(
    target: &Target,
    rep: Representation,
    objects: &[Value],
    list_meta: Option<Value>,
) -> Value {
    match (rep, list_meta) {
        (Representation::Table(include), meta) => {
            let rows: Vec<&Value> = objects.iter().collect();
            let mut t = table::table(&columns(target), &rows, include);
            if let (Some(meta), Some(map)) = (meta, t.as_object_mut()) {
                map.insert("metadata".into(), meta);
            }
            t
        }
        (Representation::PartialMetadata, Some(meta)) => json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": meta,
            "items": objects.iter().map(format::partial_metadata).collect::<Vec<_>>(),
        }),
        (Representation::PartialMetadata, None) => objects
            .first()
            .map(format::partial_metadata)
            .unwrap_or(Value::Null),
        (Representation::Object, Some(meta)) => json!({
            "kind": format!("{}List", target.rt.kind),
            "apiVersion": target.rt.api_version(&target.version),
            "metadata": meta,
            "items": objects,
        }),
        (Representation::Object, None) => objects.first().cloned().unwrap_or(Value::Null),
    }
}

/// GET of one object.
pub fn get(ctx: &Ctx, req: &Request, target: &Target) -> Result<Reply, ApiError> {
    let store = ctx.store();
    let name = target.name.as_deref().unwrap_or_default();
    let obj = store
        .get(&target.rt.key(), target.ns(), name)
        .ok_or_else(|| ApiError::not_found(&target.rt.group, &target.rt.plural, name))?;
    let rep = format::negotiate(&req.accept, req.param("includeObject"));
    Ok(Reply::Json(
        200,
        render(target, rep, &[target.present(obj)], None),
    ))
}

/// Continue tokens: opaque hex of `rv/namespace/name` of the last item returned.
fn encode_continue(rv: u64, ns: &str, name: &str) -> String {
    format!("{rv}/{ns}/{name}")
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn decode_continue(token: &str) -> Option<(u64, String, String)> {
    let bytes: Option<Vec<u8>> = (0..token.len())
        .step_by(2)
        .map(|i| {
            token
                .get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        })
        .collect();
    let text = String::from_utf8(bytes?).ok()?;
    let mut parts = text.splitn(3, '/');
    Some((
        parts.next()?.parse().ok()?,
        parts.next()?.to_string(),
        parts.next()?.to_string(),
    ))
}

/// The `resourceVersion` of a list must be a version, not newer than the store's, and, with
/// `resourceVersionMatch=Exact`, still in the history. Any accepted version is served from the
/// current state (no snapshots are kept).
fn check_list_version(req: &Request, store: &Store) -> Result<(), ApiError> {
    let Some(text) = req.param("resourceVersion").filter(|v| !v.is_empty()) else {
        return Ok(());
    };
    let rv = text
        .parse::<u64>()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: {text:?}")))?;
    if rv > store.rv() {
        return Err(ApiError::too_large_resource_version(rv, store.rv()));
    }
    if req.param("resourceVersionMatch") == Some("Exact") && rv < store.oldest() {
        return Err(ApiError::gone(format!(
            "too old resource version: {rv} ({})",
            store.oldest()
        )));
    }
    Ok(())
}

/// kube-apiserver's checks of list and watch parameters: numbers that are not numbers are 400;
/// `resourceVersionMatch` and `sendInitialEvents` used where they are forbidden are 422.
pub fn check_list_options(req: &Request, watch: bool) -> Result<(), ApiError> {
    for key in ["limit", "timeoutSeconds"] {
        if let Some(v) = req.param(key).filter(|v| !v.is_empty())
            && v.parse::<i64>().is_err()
        {
            return Err(ApiError::bad_request(format!(
                "invalid {key} {v:?}: strconv.ParseInt: parsing {v:?}: invalid syntax"
            )));
        }
    }
    let invalid = |field: &str, reason: &str, detail: &str| {
        ApiError::invalid("ListOptions.meta.k8s.io", "", field, reason, detail)
    };
    let rv = req.param("resourceVersion").unwrap_or_default();
    let send_initial = req.param("sendInitialEvents").filter(|v| !v.is_empty());
    if let Some(m) = req.param("resourceVersionMatch").filter(|v| !v.is_empty()) {
        if watch && send_initial.is_none() {
            return Err(invalid(
                "resourceVersionMatch",
                "FieldValueForbidden",
                "Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
            ));
        }
        if !matches!(m, "NotOlderThan" | "Exact") {
            return Err(invalid(
                "resourceVersionMatch",
                "FieldValueNotSupported",
                &format!(
                    "Unsupported value: {m:?}: supported values: \"Exact\", \"NotOlderThan\", \"\""
                ),
            ));
        }
        if rv.is_empty() && send_initial.is_none() {
            return Err(invalid(
                "resourceVersionMatch",
                "FieldValueForbidden",
                "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        if m == "Exact" && rv == "0" {
            return Err(invalid(
                "resourceVersionMatch",
                "FieldValueForbidden",
                "Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
            ));
        }
    }
    if send_initial.is_some() {
        if !watch {
            return Err(invalid(
                "sendInitialEvents",
                "FieldValueForbidden",
                "Forbidden: sendInitialEvents is forbidden for list",
            ));
        }
        if req.param("resourceVersionMatch") != Some("NotOlderThan") {
            return Err(invalid(
                "resourceVersionMatch",
                "FieldValueForbidden",
                "Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
    }
    Ok(())
}

/// LIST with selectors and `limit`/`continue` paging (a negative `limit` means none).
pub fn list(ctx: &Ctx, req: &Request, target: &Target) -> Result<Reply, ApiError> {
    check_list_options(req, false)?;
    let selection = Selection::from_request(req, target)?;
    let limit = match req.param("limit").filter(|l| !l.is_empty()) {
        Some(l) => usize::try_from(
            l.parse::<i64>()
                .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
        )
        .unwrap_or(0),
        None => 0,
    };
    let store = ctx.store();
    check_list_version(req, &store)?;
    let (list_rv, after) = match req.param("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let (rv, ns, name) = decode_continue(token)
                .ok_or_else(|| ApiError::bad_request("continue key is not valid"))?;
            if rv < store.oldest() {
                return Err(ApiError::gone(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                ));
            }
            (rv, Some((ns, name)))
        }
        None => (store.rv(), None),
    };
    let mut items = Vec::new();
    let mut next = None;
    for obj in store.list(&target.rt.key(), target.namespace.as_deref()) {
        let key = (
            obj.pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or_default(),
            obj.pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default(),
        );
        if let Some((ns, name)) = &after
            && key <= (ns.as_str(), name.as_str())
        {
            continue;
        }
        if !selection.matches(obj) {
            continue;
        }
        if limit > 0 && items.len() == limit {
            next = Some(encode_continue(list_rv, key.0, key.1));
            break;
        }
        items.push(target.present(obj));
    }
    if let Some(token) = &mut next {
        // The token marks the last item returned, so the next page starts right after it.
        let last = items.last().map(|o| {
            (
                o.pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                o.pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
            )
        });
        if let Some((ns, name)) = last {
            *token = encode_continue(list_rv, &ns, &name);
        }
    }
    let mut meta = json!({"resourceVersion": list_rv.to_string()});
    if let (Some(token), Some(map)) = (next, meta.as_object_mut()) {
        map.insert("continue".into(), json!(token));
    }
    let rep = format::negotiate(&req.accept, req.param("includeObject"));
    Ok(Reply::Json(200, render(target, rep, &items, Some(meta))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_decoding() {
        let q = parse_query(
            "&fieldSelector=spec.nodeName%3Dnode-a&limit=500&&labelSelector=a+in+(x%2Cy)",
        );
        assert_eq!(
            q,
            vec![
                (
                    "fieldSelector".to_string(),
                    "spec.nodeName=node-a".to_string()
                ),
                ("limit".to_string(), "500".to_string()),
                ("labelSelector".to_string(), "a in (x,y)".to_string()),
            ]
        );
        assert_eq!(decode_component("100%"), "100%");
        assert_eq!(decode_component("%zz"), "%zz");
    }

    #[test]
    fn continue_tokens_round_trip() {
        let t = encode_continue(42, "default", "a/b");
        assert_eq!(
            decode_continue(&t),
            Some((42, "default".into(), "a/b".into()))
        );
        assert_eq!(decode_continue("zz"), None);
    }

    #[test]
    fn targets() {
        let store = Store::new();
        let t = parse_target(&store, "/api/v1/namespaces/default/pods/a/status")
            .unwrap()
            .unwrap();
        assert_eq!(
            (
                t.rt.plural.as_str(),
                t.ns(),
                t.name.as_deref(),
                t.sub.as_deref()
            ),
            ("pods", "default", Some("a"), Some("status"))
        );
        let t = parse_target(&store, "/api/v1/namespaces/default")
            .unwrap()
            .unwrap();
        assert_eq!(
            (
                t.rt.plural.as_str(),
                t.namespace.as_deref(),
                t.name.as_deref()
            ),
            ("namespaces", None, Some("default"))
        );
        let t = parse_target(&store, "/api/v1/namespaces/x/status")
            .unwrap()
            .unwrap();
        assert_eq!(
            (t.rt.plural.as_str(), t.name.as_deref(), t.sub.as_deref()),
            ("namespaces", Some("x"), Some("status"))
        );
        let t = parse_target(&store, "/apis/coordination.k8s.io/v1/leases")
            .unwrap()
            .unwrap();
        assert!(t.namespace.is_none() && t.name.is_none());
        assert!(
            parse_target(&store, "/api/v1/nodes/a/status")
                .unwrap()
                .is_some()
        );
        assert!(parse_target(&store, "/api/v1/namespaces/x/nodes").is_err());
        assert!(parse_target(&store, "/api/v1/pods/a").is_err());
        assert!(parse_target(&store, "/api/v1/namespaces/d/events/a/status").is_err());
        assert!(parse_target(&store, "/apis/nope/v1/things").is_err());
        assert!(parse_target(&store, "/api/v1").unwrap().is_none());
    }

    #[test]
    fn field_values() {
        let pod = json!({"spec": {"nodeName": "n1", "hostNetwork": true}, "status": {}});
        assert_eq!(field_value(&pod, "spec.nodeName"), "n1");
        assert_eq!(field_value(&pod, "spec.hostNetwork"), "true");
        assert_eq!(field_value(&pod, "status.phase"), "");
        assert_eq!(field_value(&json!({}), "spec.hostNetwork"), "false");
    }
}
