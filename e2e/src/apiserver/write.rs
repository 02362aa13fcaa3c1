//! Writes: create, update, patch (merge, JSON, server-side apply), delete and delete-collection,
//! with the metadata rules kube-apiserver enforces (uid, generation, finalizers, preconditions).

use std::{sync::Arc, time::Duration};

use serde_json::{Map, Value, json};

use super::{
    api::{Ctx, Reply, Request, Selection, Target},
    convert, ids,
    patch::{self, FieldPath},
    registry::{self, CRD_GROUP, ResourceType},
    schema,
    status::{ApiError, success_status},
    store::Store,
};

/// How long the emulated kubelet takes to confirm a graceful pod deletion (capped by the grace period).
const POD_TERMINATION: Duration = Duration::from_millis(300);

/// Default `terminationGracePeriodSeconds` of a pod.
const POD_DEFAULT_GRACE: i64 = 30;

fn meta(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

fn meta_mut(obj: &mut Value) -> Option<&mut Map<String, Value>> {
    obj.get_mut("metadata").and_then(Value::as_object_mut)
}

fn meta_str<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    meta(obj)?.get(key).and_then(Value::as_str)
}

fn finalizers(obj: &Value) -> Vec<String> {
    meta(obj)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// How a request body is encoded.
#[derive(Debug, PartialEq, Eq)]
enum Media {
    Json,
    Yaml,
}

/// The encoding a request's `Content-Type` names. Anything but JSON/YAML (kubectl's imperative
/// commands send protobuf) is answered as kube-apiserver answers a type it cannot decode: 415
/// `UnsupportedMediaType`, with the same message plus why this server refuses it.
fn body_media(req: &Request) -> Result<Media, ApiError> {
    let media = req
        .content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    // As in kube-apiserver, a body without a Content-Type is read as the first supported type.
    match media.as_str() {
        "" | "application/json" => Ok(Media::Json),
        "application/yaml" | "application/apply-patch+yaml" => Ok(Media::Yaml),
        m if m.starts_with("application/") && m.ends_with("+json") => Ok(Media::Json),
        other => Err(ApiError::unsupported_media_type(format!(
            "the body of the request was in an unknown format - accepted media types include: \
             application/json, application/yaml (this test server speaks JSON only; \
             {other:?} is not decoded, use JSON, e.g. `kubectl create ... -o yaml --dry-run=client \
             | kubectl apply -f -`)"
        ))),
    }
}

/// Parse a request body as JSON (or YAML, which kubectl's server-side apply sends).
fn parse_body(req: &Request) -> Result<Value, ApiError> {
    if req.body.is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    let parsed = if body_media(req)? == Media::Yaml {
        let text = std::str::from_utf8(&req.body)
            .map_err(|e| ApiError::bad_request(format!("body is not UTF-8: {e}")))?;
        serde_saphyr::from_str::<Value>(text)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?
    } else {
        serde_json::from_slice::<Value>(&req.body)
            .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))?
    };
    Ok(parsed)
}

/// Check and fill `apiVersion`/`kind`, make sure `metadata` is an object.
fn check_type(target: &Target, obj: &mut Value) -> Result<(), ApiError> {
    let expected_version = target.rt.api_version(&target.version);
    let map = obj
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("the request body must be a JSON object"))?;
    if let Some(v) = map
        .get("apiVersion")
        .and_then(Value::as_str)
        .filter(|v| !v.is_empty())
        && v != expected_version
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({v}) does not match the expected API version ({expected_version})"
        )));
    }
    if let Some(k) = map
        .get("kind")
        .and_then(Value::as_str)
        .filter(|k| !k.is_empty())
        && k != target.rt.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({k}) does not match the expected kind ({})",
            target.rt.kind
        )));
    }
    map.insert("apiVersion".into(), json!(expected_version));
    map.insert("kind".into(), json!(target.rt.kind));
    if !map.get("metadata").is_some_and(Value::is_object) {
        map.insert("metadata".into(), json!({}));
    }
    Ok(())
}

/// The namespace in the body must match the URL's; it is then filled in (or removed when cluster-scoped).
fn check_namespace(target: &Target, obj: &mut Value) -> Result<(), ApiError> {
    let url_ns = target.ns().to_string();
    let Some(m) = meta_mut(obj) else {
        return Ok(());
    };
    if target.rt.namespaced {
        if let Some(ns) = m
            .get("namespace")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            && ns != url_ns
        {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        m.insert("namespace".into(), json!(url_ns));
    } else {
        m.remove("namespace");
    }
    Ok(())
}

/// RFC 1123 subdomain (most kinds) or label (namespaces) name rules.
/// A Kubernetes qualified name: `[prefix/]name`, the prefix a DNS subdomain of at most 253
/// characters, the name at most 63 alphanumerics, `-`, `_` or `.`, alphanumeric at both ends.
fn qualified_name_error(key: &str) -> Option<&'static str> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let part_ok = |p: &str| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !p.starts_with('-')
                && !p.ends_with('-')
        };
        if prefix.len() > 253 || !prefix.split('.').all(part_ok) {
            return Some(
                "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
            );
        }
    }
    if name.is_empty() {
        return Some("name part must be non-empty");
    }
    if name.len() > 63 {
        return Some("name part must be no more than 63 characters");
    }
    if !label_value_ok(name) {
        return Some(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
        );
    }
    None
}

/// A label value: empty, or at most 63 alphanumerics, `-`, `_` or `.`, alphanumeric at both ends.
fn label_value_ok(v: &str) -> bool {
    v.is_empty()
        || v.len() <= 63
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && v.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && v.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

/// kube-apiserver's metadata validation of labels, annotation keys and finalizer names (422):
/// keys and finalizers are qualified names; on built-in kinds a finalizer without a `/` must be
/// a standard one (custom resources only draw a warning there).
fn validate_metadata(target: &Target, obj: &Value, name: &str) -> Result<(), ApiError> {
    let gk = target.rt.group_kind();
    let invalid = |field: &str, value: &str, why: &str| {
        ApiError::invalid(
            &gk,
            name,
            field,
            "FieldValueInvalid",
            &format!("Invalid value: {value:?}: {why}"),
        )
    };
    let Some(m) = meta(obj) else {
        return Ok(());
    };
    for (key, value) in m
        .get("labels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        if let Some(why) = qualified_name_error(key) {
            return Err(invalid("metadata.labels", key, why));
        }
        let v = value.as_str().unwrap_or_default();
        if !label_value_ok(v) {
            return Err(invalid(
                "metadata.labels",
                v,
                "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (at most 63 characters)",
            ));
        }
    }
    for key in m
        .get("annotations")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, _)| k)
    {
        if let Some(why) = qualified_name_error(&key.to_lowercase()) {
            return Err(invalid("metadata.annotations", key, why));
        }
    }
    for (i, f) in m
        .get("finalizers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .enumerate()
    {
        let field = format!("metadata.finalizers[{i}]");
        if let Some(why) = qualified_name_error(f) {
            return Err(invalid(&field, f, why));
        }
        let standard = matches!(f, "kubernetes" | "orphan" | "foregroundDeletion");
        if target.rt.crd_name.is_none() && !f.contains('/') && !standard {
            return Err(invalid(
                &field,
                f,
                "name is neither a standard finalizer name nor is it fully qualified",
            ));
        }
    }
    Ok(())
}

fn check_name(rt: &ResourceType, name: &str) -> Result<(), ApiError> {
    let label = rt.plural == "namespaces";
    let max = if label { 63 } else { 253 };
    let part_ok = |p: &str| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !p.starts_with('-')
            && !p.ends_with('-')
    };
    let ok = name.len() <= max
        && if label {
            part_ok(name)
        } else {
            name.split('.').all(part_ok)
        };
    // Events are named `<object>.<hex>` and leases freely; the subdomain rule covers both.
    if ok {
        return Ok(());
    }
    let what = if label {
        "RFC 1123 label"
    } else {
        "RFC 1123 subdomain"
    };
    Err(ApiError::invalid(
        &rt.group_kind(),
        name,
        "metadata.name",
        "FieldValueInvalid",
        &format!(
            "Invalid value: \"{name}\": a lowercase {what} must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
        ),
    ))
}

/// The part of an object whose change bumps `metadata.generation` (everything but metadata and status).
fn spec_part(obj: &Value) -> Value {
    let mut out = obj.clone();
    if let Some(map) = out.as_object_mut() {
        for k in ["metadata", "status", "apiVersion", "kind"] {
            map.remove(k);
        }
    }
    out
}

/// Request options every write honours.
#[derive(Debug, Clone, Copy, Default)]
struct WriteOptions {
    /// `dryRun=All`: validate and answer, store nothing.
    dry_run: bool,
    /// `fieldValidation=Strict`: unknown fields of a custom resource are a 400, not dropped.
    strict: bool,
}

fn write_options(req: &Request) -> WriteOptions {
    WriteOptions {
        dry_run: req.param("dryRun").is_some_and(|d| d == "All"),
        strict: req.param("fieldValidation").is_some_and(|v| v == "Strict"),
    }
}

/// Schema defaults, pruning and validation of a custom resource (422 on violations).
fn validate_custom(
    target: &Target,
    obj: &mut Value,
    name: &str,
    opts: WriteOptions,
) -> Result<(), ApiError> {
    let Some(s) = target.rt.schema(&target.version) else {
        return Ok(());
    };
    schema::apply_defaults(s, obj);
    let kept: Vec<(String, Value)> = ["apiVersion", "kind", "metadata"]
        .iter()
        .filter_map(|k| obj.get(*k).map(|v| (k.to_string(), v.clone())))
        .collect();
    let unknown = schema::prune(s, obj);
    if opts.strict && !unknown.is_empty() {
        let fields: Vec<String> = unknown
            .iter()
            .map(|f| format!("unknown field \"{f}\""))
            .collect();
        return Err(ApiError::bad_request(format!(
            "strict decoding error: {}",
            fields.join(", ")
        )));
    }
    if let Some(map) = obj.as_object_mut() {
        map.extend(kept);
    }
    let errs = schema::validate(s, obj);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid_body(schema::invalid_status(
            &target.rt.group_kind(),
            name,
            &errs,
        )))
    }
}

/// Kind-specific defaults applied on create, as kube-apiserver's strategies do.
fn create_defaults(
    target: &Target,
    obj: &mut Value,
    name: &str,
    now: &str,
) -> Result<(), ApiError> {
    let Some(map) = obj.as_object_mut() else {
        return Ok(());
    };
    match (target.rt.group.as_str(), target.rt.plural.as_str()) {
        ("", "pods") => {
            let spec = map.entry("spec").or_insert_with(|| json!({}));
            if let Some(spec) = spec.as_object_mut() {
                spec.entry("restartPolicy").or_insert(json!("Always"));
                spec.entry("terminationGracePeriodSeconds")
                    .or_insert(json!(POD_DEFAULT_GRACE));
                spec.entry("dnsPolicy").or_insert(json!("ClusterFirst"));
                spec.entry("schedulerName")
                    .or_insert(json!("default-scheduler"));
            }
            map.insert(
                "status".into(),
                json!({"phase": "Pending", "qosClass": "BestEffort"}),
            );
        }
        ("", "namespaces") => {
            map.insert("spec".into(), json!({"finalizers": ["kubernetes"]}));
            map.insert("status".into(), json!({"phase": "Active"}));
            if let Some(m) = map.get_mut("metadata").and_then(Value::as_object_mut) {
                let labels = m.entry("labels").or_insert_with(|| json!({}));
                if let Some(labels) = labels.as_object_mut() {
                    labels.insert("kubernetes.io/metadata.name".into(), json!(name));
                }
            }
        }
        (CRD_GROUP, "customresourcedefinitions") => {
            let status = registry::crd_status(obj, now);
            if let Some(map) = obj.as_object_mut() {
                map.insert("status".into(), status);
            }
        }
        _ if target.rt.status_subresource => {
            map.remove("status");
        }
        _ => {}
    }
    Ok(())
}

/// POST: create an object.
/// A 500 as kube-apiserver gives for some refusals: the bare message, no reason.
fn bare_500(message: impl Into<String>) -> ApiError {
    let mut e = ApiError::internal("");
    e.reason = "";
    e.message = message.into();
    e
}

pub fn create(ctx: &Ctx, req: &Request, target: &Target) -> Result<Reply, ApiError> {
    let mut obj = parse_body(req)?;
    check_type(target, &mut obj)?;
    // kube-apiserver refuses this with a 500 (an apply that creates ignores it instead).
    if meta_str(&obj, "resourceVersion").is_some_and(|rv| !rv.is_empty()) {
        return Err(bare_500(
            "resourceVersion should not be set on objects to be created",
        ));
    }
    let mut obj = convert::to_storage(&target.rt, obj);
    record_update(req, target, None, &mut obj);
    let mut store = ctx.store();
    let created = create_object(&mut store, target, obj, write_options(req))?;
    Ok(Reply::Json(201, target.present(&created)))
}

fn create_object(
    store: &mut Store,
    target: &Target,
    mut obj: Value,
    opts: WriteOptions,
) -> Result<Value, ApiError> {
    check_namespace(target, &mut obj)?;
    let now = ids::now();
    let name = match meta_str(&obj, "name").filter(|n| !n.is_empty()) {
        Some(n) => n.to_string(),
        None => match meta_str(&obj, "generateName").filter(|n| !n.is_empty()) {
            Some(prefix) => format!("{prefix}{}", ids::name_suffix()),
            None => {
                return Err(ApiError::invalid(
                    &target.rt.group_kind(),
                    "",
                    "metadata.name",
                    "FieldValueRequired",
                    "Required value: name or generateName is required",
                ));
            }
        },
    };
    check_name(&target.rt, &name)?;
    validate_metadata(target, &obj, &name)?;
    if target.rt.namespaced {
        let ns = target.ns();
        let namespace = store
            .get("/namespaces", "", ns)
            .ok_or_else(|| ApiError::not_found("", "namespaces", ns))?;
        if namespace.pointer("/metadata/deletionTimestamp").is_some() {
            let mut e = ApiError::injected(403);
            e.reason = "Forbidden";
            e.message = format!(
                "{} \"{name}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                target.rt.plural
            );
            return Err(e);
        }
    }
    if store.get(&target.rt.key(), target.ns(), &name).is_some() {
        return Err(ApiError::already_exists(
            &target.rt.group,
            &target.rt.plural,
            &name,
        ));
    }
    create_defaults(target, &mut obj, &name, &now)?;
    if let Some(m) = meta_mut(&mut obj) {
        m.insert("name".into(), json!(name));
        m.insert("uid".into(), json!(ids::new_uid()));
        m.insert("creationTimestamp".into(), json!(now));
        m.insert("generation".into(), json!(1));
        for k in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ] {
            m.remove(k);
        }
    }
    if target.rt.crd_name.is_some() {
        validate_custom(target, &mut obj, &name, opts)?;
    }
    let crd_type = crd_type_of(target, &obj, &name)?;
    if opts.dry_run {
        return Ok(obj);
    }
    let stored = store.put(&target.rt.key(), target.ns(), &name, obj);
    if let Some(t) = crd_type {
        store.registry.register(t);
    }
    Ok(stored)
}

/// For writes of a CustomResourceDefinition: the type it defines (422 if it is not valid).
fn crd_type_of(target: &Target, obj: &Value, name: &str) -> Result<Option<ResourceType>, ApiError> {
    if !(target.rt.group == CRD_GROUP && target.rt.plural == "customresourcedefinitions") {
        return Ok(None);
    }
    registry::from_crd(obj).map(Some).map_err(|e| {
        ApiError::invalid(
            &target.rt.group_kind(),
            name,
            "spec",
            "FieldValueInvalid",
            &e.0,
        )
    })
}

/// Build the object an update stores from the old one and the request's (subresource rules,
/// server-owned metadata preserved).
fn merge_for_update(target: &Target, old: &Value, new: Value) -> Value {
    let mut result = match target.sub.as_deref() {
        Some(_) => {
            let mut r = old.clone();
            if let Some(map) = r.as_object_mut() {
                match new.get("status") {
                    Some(s) => map.insert("status".into(), s.clone()),
                    None => map.remove("status"),
                };
            }
            if let (Some(m), Some(fields)) = (
                meta_mut(&mut r),
                meta(&new).and_then(|m| m.get("managedFields")),
            ) {
                m.insert("managedFields".into(), fields.clone());
            }
            r
        }
        None => {
            let mut r = new;
            if target.rt.status_subresource
                && let Some(map) = r.as_object_mut()
            {
                match old.get("status") {
                    Some(s) => map.insert("status".into(), s.clone()),
                    None => map.remove("status"),
                };
            }
            r
        }
    };
    let old_meta = meta(old).cloned().unwrap_or_default();
    if let Some(m) = meta_mut(&mut result) {
        for k in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "namespace",
            "name",
        ] {
            match old_meta.get(k) {
                Some(v) => m.insert(k.into(), v.clone()),
                None => m.remove(k),
            };
        }
        if !m.get("managedFields").is_some_and(Value::is_array)
            && let Some(mf) = old_meta.get("managedFields")
        {
            m.insert("managedFields".into(), mf.clone());
        }
    }
    result
}

/// Store an update: validation, generation, finalizer rules, no-op detection, deletion completion.
fn commit_update(
    store: &mut Store,
    target: &Target,
    old: &Value,
    mut new: Value,
    opts: WriteOptions,
) -> Result<Value, ApiError> {
    let name = meta_str(old, "name").unwrap_or_default().to_string();
    validate_metadata(target, &new, &name)?;
    if target.rt.crd_name.is_some() {
        validate_custom(target, &mut new, &name, opts)?;
    }
    let crd_type = crd_type_of(target, &new, &name)?;
    if meta(old).is_some_and(|m| m.contains_key("deletionTimestamp")) {
        let before = finalizers(old);
        let added: Vec<String> = finalizers(&new)
            .into_iter()
            .filter(|f| !before.contains(f))
            .collect();
        if !added.is_empty() {
            return Err(ApiError::invalid(
                &target.rt.group_kind(),
                &name,
                "metadata.finalizers",
                "FieldValueForbidden",
                &format!(
                    "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                ),
            ));
        }
    }
    let old_generation = meta(old)
        .and_then(|m| m.get("generation"))
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let generation = if spec_part(old) == spec_part(&new) {
        old_generation
    } else {
        old_generation + 1
    };
    if let Some(m) = meta_mut(&mut new) {
        m.insert("generation".into(), json!(generation));
        if let Some(rv) = meta(old).and_then(|o| o.get("resourceVersion")) {
            m.insert("resourceVersion".into(), rv.clone());
        }
    }
    if new == *old || opts.dry_run {
        return Ok(new);
    }
    let deleting = meta(&new).is_some_and(|m| m.contains_key("deletionTimestamp"));
    let grace_done = meta(&new)
        .and_then(|m| m.get("deletionGracePeriodSeconds"))
        .and_then(Value::as_i64)
        .unwrap_or(0)
        == 0;
    if deleting && grace_done && finalizers(&new).is_empty() {
        store.put(&target.rt.key(), target.ns(), &name, new);
        return Ok(remove_object(store, &target.rt, target.ns(), &name).unwrap_or(Value::Null));
    }
    let stored = store.put(&target.rt.key(), target.ns(), &name, new);
    if let Some(t) = crd_type {
        store.registry.register(t);
    }
    Ok(stored)
}

/// PUT: replace an object (409 when the body's resourceVersion is stale).
pub fn update(ctx: &Ctx, req: &Request, target: &Target) -> Result<Reply, ApiError> {
    let mut obj = parse_body(req)?;
    check_type(target, &mut obj)?;
    let mut obj = convert::to_storage(&target.rt, obj);
    check_namespace(target, &mut obj)?;
    let name = target.name.clone().unwrap_or_default();
    if let Some(body_name) = meta_str(&obj, "name").filter(|n| !n.is_empty())
        && body_name != name
    {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let mut store = ctx.store();
    let old = store
        .get(&target.rt.key(), target.ns(), &name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(&target.rt.group, &target.rt.plural, &name))?;
    check_rv(target, &old, &obj, &name)?;
    if !target.rt.allows_unconditional_update()
        && meta_str(&obj, "resourceVersion").is_none_or(str::is_empty)
    {
        return Err(ApiError::invalid(
            &target.rt.group_resource(),
            &name,
            "metadata.resourceVersion",
            "FieldValueInvalid",
            "Invalid value: 0: must be specified for an update",
        ));
    }
    let mut new = merge_for_update(target, &old, obj);
    record_update(req, target, Some(&old), &mut new);
    let stored = commit_update(&mut store, target, &old, new, write_options(req))?;
    Ok(Reply::Json(200, target.present(&stored)))
}

/// A write carrying a resourceVersion is conditional on it.
fn check_rv(target: &Target, old: &Value, new: &Value, name: &str) -> Result<(), ApiError> {
    match meta_str(new, "resourceVersion").filter(|rv| !rv.is_empty()) {
        Some(rv) if Some(rv) != meta_str(old, "resourceVersion") => Err(ApiError::conflict(
            &target.rt.group,
            &target.rt.plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )),
        _ => Ok(()),
    }
}

/// PATCH: JSON merge, strategic merge (built-in kinds only, as kube-apiserver: 415 for custom
/// resources), JSON patch, or server-side apply.
pub fn patch(ctx: &Ctx, req: &Request, target: &Target) -> Result<Reply, ApiError> {
    let name = target.name.clone().unwrap_or_default();
    let content_type = req
        .content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    let body = parse_body(req)?;
    let mut store = ctx.store();
    let current = store.get(&target.rt.key(), target.ns(), &name).cloned();
    if content_type == "application/apply-patch+yaml" {
        return apply(&mut store, req, target, current, body);
    }
    let old =
        current.ok_or_else(|| ApiError::not_found(&target.rt.group, &target.rt.plural, &name))?;
    let mut doc = target.present(&old);
    match content_type.as_str() {
        "application/merge-patch+json" => patch::merge_patch(&mut doc, &body),
        "application/strategic-merge-patch+json" if target.rt.crd_name.is_none() => {
            patch::strategic_merge_patch(&mut doc, &body).map_err(bare_500)?
        }
        "application/json-patch+json" => patch::json_patch(&mut doc, &body).map_err(|e| {
            let mut err = ApiError::invalid(
                &target.rt.group_kind(),
                &name,
                "",
                "FieldValueInvalid",
                &e.to_string(),
            );
            err.message =
                format!("the server rejected our request due to an error in our request: {e}");
            err
        })?,
        other => {
            return Err(ApiError::unsupported_media_type(format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {other:?})"
            )));
        }
    }
    check_type(target, &mut doc)?;
    let doc = convert::to_storage(&target.rt, doc);
    check_rv(target, &old, &doc, &name)?;
    let mut new = merge_for_update(target, &old, doc);
    record_update(req, target, Some(&old), &mut new);
    let stored = commit_update(&mut store, target, &old, new, write_options(req))?;
    Ok(Reply::Json(200, target.present(&stored)))
}

/// Orders `managedFields` as kube-apiserver does: by operation (`Apply` before `Update`), then
/// time (to the second), manager, apiVersion and subresource.
fn sort_managed(entries: &mut [Value]) {
    let key = |e: &Value| {
        let text = |k: &str| {
            e.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let time = text("time");
        (
            text("operation"),
            time.get(..19).unwrap_or(&time).to_string(),
            text("manager"),
            text("apiVersion"),
            text("subresource"),
        )
    };
    entries.sort_by_key(key);
}

/// The field manager of a write: `fieldManager`, else the `User-Agent` up to its first `/`.
fn write_manager(req: &Request) -> String {
    match req.param("fieldManager").filter(|m| !m.is_empty()) {
        Some(m) => m.to_string(),
        None => {
            let ua = req.user_agent.split('/').next().unwrap_or_default();
            if ua.is_empty() {
                "unknown".into()
            } else {
                ua.to_string()
            }
        }
    }
}

/// An ordinary write (create, update, a patch that is not an apply) takes ownership as in
/// kube-apiserver: every leaf field it sets or changes becomes its manager's (an `Update` entry),
/// leaves every other manager (appliers included), and fields the object no longer has are owned
/// by nobody. Ordinary writes never conflict.
fn record_update(req: &Request, target: &Target, old: Option<&Value>, new: &mut Value) {
    let manager = write_manager(req);
    let subresource = target.sub.clone();
    let in_scope = |p: &FieldPath| match subresource.as_deref() {
        Some(_) => p.first().is_some_and(|f| f == "status"),
        None => !(target.rt.status_subresource && p.first().is_some_and(|f| f == "status")),
    };
    let changed: Vec<FieldPath> = patch::applied_paths(new)
        .into_iter()
        .filter(|p| in_scope(p))
        .filter(|p| old.is_none_or(|o| patch::get_path(o, p) != patch::get_path(new, p)))
        .collect();
    let entries = match old {
        Some(o) => managed_entries(o),
        None => Vec::new(),
    };
    let mine = |e: &ManagedEntry| {
        e.manager == manager && e.operation == "Update" && e.subresource == subresource
    };
    let mut out: Vec<Value> = Vec::new();
    let mut placed = false;
    let mine_entry = |paths: Vec<FieldPath>| {
        let mut e = json!({
            "manager": manager,
            "operation": "Update",
            "apiVersion": target.rt.api_version(&target.version),
            "time": ids::now(),
            "fieldsType": "FieldsV1",
            "fieldsV1": patch::to_fields_v1(&paths),
        });
        if let (Some(sub), Some(map)) = (&subresource, e.as_object_mut()) {
            map.insert("subresource".into(), json!(sub));
        }
        e
    };
    for e in &entries {
        let mut paths: Vec<FieldPath> = e
            .paths
            .iter()
            .filter(|q| patch::get_path(new, q).is_some())
            .cloned()
            .collect();
        if mine(e) {
            if placed {
                continue;
            }
            placed = true;
            for p in &changed {
                paths.retain(|q| !overlaps(p, q));
                paths.push(p.clone());
            }
            if changed.is_empty() && paths == e.paths {
                out.push(e.raw.clone());
            } else if !paths.is_empty() {
                out.push(mine_entry(paths));
            }
            continue;
        }
        paths.retain(|q| !changed.iter().any(|p| overlaps(p, q)));
        if paths.is_empty() {
            continue;
        }
        let mut raw = e.raw.clone();
        if paths != e.paths
            && let Some(map) = raw.as_object_mut()
        {
            map.insert("fieldsV1".into(), patch::to_fields_v1(&paths));
        }
        out.push(raw);
    }
    if !placed && !changed.is_empty() {
        out.push(mine_entry(changed));
    }
    sort_managed(&mut out);
    if let Some(m) = meta_mut(new) {
        if out.is_empty() {
            m.remove("managedFields");
        } else {
            m.insert("managedFields".into(), Value::Array(out));
        }
    }
}

/// One `managedFields` entry as stored.
#[derive(Debug, Clone)]
struct ManagedEntry {
    manager: String,
    operation: String,
    subresource: Option<String>,
    paths: Vec<FieldPath>,
    raw: Value,
}

fn managed_entries(obj: &Value) -> Vec<ManagedEntry> {
    meta(obj)
        .and_then(|m| m.get("managedFields"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|e| ManagedEntry {
            manager: e
                .get("manager")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            operation: e
                .get("operation")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            subresource: e
                .get("subresource")
                .and_then(Value::as_str)
                .map(str::to_string),
            paths: e
                .get("fieldsV1")
                .map(patch::from_fields_v1)
                .unwrap_or_default(),
            raw: e.clone(),
        })
        .collect()
}

fn overlaps(a: &[String], b: &[String]) -> bool {
    a.iter().zip(b).all(|(x, y)| x == y)
}

/// Server-side apply, approximated: the applied fields are merged in (lists replaced whole), fields
/// this manager applied before and no longer applies are removed unless another manager owns them,
/// and without `force` a field another applier owns with a different value is a 409 conflict.
fn apply(
    store: &mut Store,
    req: &Request,
    target: &Target,
    current: Option<Value>,
    mut config: Value,
) -> Result<Reply, ApiError> {
    let name = target.name.clone().unwrap_or_default();
    let manager = req
        .param("fieldManager")
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiError::bad_request("PATCH request with apply must specify a fieldManager (fieldManager is required for apply requests)"))?
        .to_string();
    let force = req.flag("force");
    for field in ["apiVersion", "kind"] {
        if config
            .get(field)
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            return Err(ApiError::bad_request(format!("{field} must be set")));
        }
    }
    check_type(target, &mut config)?;
    let mut config = convert::to_storage(&target.rt, config);
    let subresource = target.sub.clone();
    let in_scope = |p: &FieldPath| match subresource.as_deref() {
        Some(_) => p.first().is_some_and(|f| f == "status"),
        None => !(target.rt.status_subresource && p.first().is_some_and(|f| f == "status")),
    };
    let paths: Vec<FieldPath> = patch::applied_paths(&config)
        .into_iter()
        .filter(|p| in_scope(p))
        .collect();
    let entry = |paths: &[FieldPath]| {
        let mut e = json!({
            "manager": manager,
            "operation": "Apply",
            "apiVersion": target.rt.api_version(&target.version),
            "time": ids::now(),
            "fieldsType": "FieldsV1",
            "fieldsV1": patch::to_fields_v1(paths),
        });
        if let (Some(sub), Some(map)) = (&subresource, e.as_object_mut()) {
            map.insert("subresource".into(), json!(sub));
        }
        e
    };
    let Some(old) = current else {
        if subresource.is_some() {
            return Err(ApiError::not_found(
                &target.rt.group,
                &target.rt.plural,
                &name,
            ));
        }
        if let Some(m) = meta_mut(&mut config) {
            m.insert("name".into(), json!(name));
            m.insert("managedFields".into(), json!([entry(&paths)]));
        }
        let created = create_object(store, target, config, write_options(req))?;
        return Ok(Reply::Json(201, target.present(&created)));
    };
    // Preconditions carried in the applied configuration, as kube-apiserver: a resourceVersion
    // must be the current one (409), a uid must be the object's (422: metadata.uid is immutable).
    check_rv(target, &old, &config, &name)?;
    if let Some(uid) = meta_str(&config, "uid").filter(|u| !u.is_empty())
        && Some(uid) != meta_str(&old, "uid")
    {
        return Err(ApiError::invalid(
            &target.rt.group_kind(),
            &name,
            "metadata.uid",
            "FieldValueInvalid",
            &format!("Invalid value: {uid:?}: field is immutable"),
        ));
    }
    let entries = managed_entries(&old);
    let mine = |e: &ManagedEntry| {
        e.manager == manager && e.operation == "Apply" && e.subresource == subresource
    };
    let previously: Vec<FieldPath> = entries
        .iter()
        .filter(|e| mine(e))
        .flat_map(|e| e.paths.clone())
        .collect();
    let others: Vec<&ManagedEntry> = entries.iter().filter(|e| !mine(e)).collect();
    let mut conflicts: Vec<(String, FieldPath)> = Vec::new();
    for p in &paths {
        for other in &others {
            if other.paths.iter().any(|q| overlaps(p, q))
                && patch::get_path(&old, p) != patch::get_path(&config, p)
            {
                conflicts.push((other.manager.clone(), p.clone()));
            }
        }
    }
    if !conflicts.is_empty() && !force {
        let causes: Vec<Value> = conflicts
            .iter()
            .map(|(m, p)| {
                let field = format!(".{}", p.join("."));
                json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{m}\""), "field": field})
            })
            .collect();
        let list: Vec<String> = conflicts
            .iter()
            .map(|(m, p)| format!("conflict with \"{m}\": .{}", p.join(".")))
            .collect();
        let mut e = ApiError::conflict(&target.rt.group, &target.rt.plural, &name, "");
        e.message = format!(
            "Apply failed with {} conflict{}: {}",
            conflicts.len(),
            if conflicts.len() == 1 { "" } else { "s" },
            list.join("\n")
        );
        e.details = Some(Box::new(
            json!({"name": name, "group": target.rt.group, "kind": target.rt.plural, "causes": causes}),
        ));
        return Err(e);
    }
    let mut doc = old.clone();
    for gone in previously.iter().filter(|p| !paths.contains(p)) {
        let owned_elsewhere = others
            .iter()
            .any(|e| e.paths.iter().any(|q| overlaps(gone, q)));
        if !owned_elsewhere {
            patch::remove_path(&mut doc, gone);
        }
    }
    for p in &paths {
        if let Some(v) = patch::get_path(&config, p) {
            patch::set_path(&mut doc, p, v.clone());
        }
    }
    // This manager's entry keeps its place and, when neither its fields nor the object change,
    // its time too: a no-op apply leaves the object (and its resourceVersion) alone.
    let mut mine_entry = entry(&paths);
    let mut without_managed = doc.clone();
    if let Some(m) = meta_mut(&mut without_managed) {
        m.remove("managedFields");
    }
    let mut old_without_managed = old.clone();
    if let Some(m) = meta_mut(&mut old_without_managed) {
        m.remove("managedFields");
    }
    if let Some(previous) = entries.iter().find(|e| mine(e))
        && without_managed == old_without_managed
        && previous.raw.get("fieldsV1") == mine_entry.get("fieldsV1")
        && previous.raw.get("apiVersion") == mine_entry.get("apiVersion")
    {
        mine_entry = previous.raw.clone();
    }
    let mut new_entries: Vec<Value> = Vec::new();
    let mut mine_placed = false;
    for e in &entries {
        if mine(e) {
            if !mine_placed {
                new_entries.push(mine_entry.clone());
                mine_placed = true;
            }
            continue;
        }
        let mut e = e.clone();
        if force {
            let taken: Vec<&FieldPath> = conflicts
                .iter()
                .filter(|(m, _)| *m == e.manager)
                .map(|(_, p)| p)
                .collect();
            if !taken.is_empty() {
                e.paths.retain(|q| !taken.iter().any(|p| overlaps(p, q)));
                if let Some(map) = e.raw.as_object_mut() {
                    map.insert("fieldsV1".into(), patch::to_fields_v1(&e.paths));
                }
            }
        }
        if !e.paths.is_empty() {
            new_entries.push(e.raw);
        }
    }
    if !mine_placed {
        new_entries.push(mine_entry);
    }
    sort_managed(&mut new_entries);
    if let Some(m) = meta_mut(&mut doc) {
        m.insert("managedFields".into(), Value::Array(new_entries));
    }
    let new = merge_for_update(target, &old, doc);
    let stored = commit_update(store, target, &old, new, write_options(req))?;
    Ok(Reply::Json(200, target.present(&stored)))
}

/// The parts of `DeleteOptions` this server honours.
#[derive(Debug, Default)]
struct DeleteOptions {
    grace: Option<i64>,
    uid: Option<String>,
    resource_version: Option<String>,
    dry_run: bool,
}

fn delete_options(req: &Request) -> Result<DeleteOptions, ApiError> {
    let body: Value = if req.body.is_empty() {
        json!({})
    } else if body_media(req)? == Media::Yaml {
        let text = std::str::from_utf8(&req.body)
            .map_err(|e| ApiError::bad_request(format!("body is not UTF-8: {e}")))?;
        serde_saphyr::from_str::<Value>(text)
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?
    } else {
        serde_json::from_slice(&req.body)
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?
    };
    let grace = match req.param("gracePeriodSeconds") {
        Some(g) => Some(
            g.parse::<i64>()
                .map_err(|_| ApiError::bad_request(format!("invalid gracePeriodSeconds {g:?}")))?,
        ),
        None => body.get("gracePeriodSeconds").and_then(Value::as_i64),
    };
    let text = |p: &str| body.pointer(p).and_then(Value::as_str).map(str::to_string);
    let dry_run = req.param("dryRun") == Some("All")
        || body
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|d| d == "All"));
    Ok(DeleteOptions {
        grace,
        uid: text("/preconditions/uid"),
        resource_version: text("/preconditions/resourceVersion"),
        dry_run,
    })
}

/// DELETE of one object, or of every selected object when no name is given.
pub fn delete(ctx: &Ctx, req: &Request, target: &Target) -> Result<Reply, ApiError> {
    let opts = delete_options(req)?;
    let Some(name) = target.name.clone() else {
        let selection = Selection::from_request(req, target)?;
        let mut store = ctx.store();
        let keys: Vec<(String, String)> = store
            .keys(&target.rt.key(), target.namespace.as_deref())
            .into_iter()
            .filter(|(ns, n)| {
                store
                    .get(&target.rt.key(), ns, n)
                    .is_some_and(|o| selection.matches(o))
            })
            .collect();
        let mut items = Vec::new();
        for (ns, n) in keys {
            let t = Target {
                namespace: if ns.is_empty() {
                    None
                } else {
                    Some(ns.clone())
                },
                name: Some(n.clone()),
                ..target.clone()
            };
            let opts = DeleteOptions {
                grace: opts.grace,
                dry_run: opts.dry_run,
                ..DeleteOptions::default()
            };
            if let Some(obj) = delete_one(ctx, &mut store, &t, &n, &opts)?.0 {
                items.push(target.present(&obj));
            }
        }
        let list = json!({
            "kind": format!("{}List", target.rt.kind),
            "apiVersion": target.rt.api_version(&target.version),
            "metadata": {"resourceVersion": store.rv().to_string()},
            "items": items,
        });
        return Ok(Reply::Json(200, list));
    };
    let mut store = ctx.store();
    let (obj, removed) = delete_one(ctx, &mut store, target, &name, &opts)?;
    let obj = obj.unwrap_or(Value::Null);
    // As kube-apiserver: an object still present (finalizers, grace) is returned; one removed
    // outright is answered with a Status of Success, except for pods (their registry returns
    // the deleted object). Custom resources are answered with a Status too.
    let returns_object = !removed || target.rt.plural == "pods" && target.rt.group.is_empty();
    if returns_object {
        Ok(Reply::Json(200, target.present(&obj)))
    } else {
        let uid = meta_str(&obj, "uid").unwrap_or_default();
        Ok(Reply::Json(
            200,
            success_status(&target.rt.group, &target.rt.plural, &name, uid),
        ))
    }
}

/// Delete one object; returns its last state and whether it is gone (false: deletion pending on
/// finalizers or a pod's grace period).
fn delete_one(
    ctx: &Ctx,
    store: &mut Store,
    target: &Target,
    name: &str,
    opts: &DeleteOptions,
) -> Result<(Option<Value>, bool), ApiError> {
    let rt = &target.rt;
    let ns = target.ns().to_string();
    let old = store
        .get(&rt.key(), &ns, name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))?;
    let precondition = |what: &str,
                        want: &Option<String>,
                        have: Option<&str>|
     -> Result<(), ApiError> {
        match want {
            Some(w) if Some(w.as_str()) != have => Err(ApiError::conflict(
                &rt.group,
                &rt.plural,
                name,
                &format!(
                    "Precondition failed: {what} in precondition: {w}, {what} in object meta: {}",
                    have.unwrap_or_default()
                ),
            )),
            _ => Ok(()),
        }
    };
    precondition("UID", &opts.uid, meta_str(&old, "uid"))?;
    precondition(
        "ResourceVersion",
        &opts.resource_version,
        meta_str(&old, "resourceVersion"),
    )?;
    if opts.dry_run {
        return Ok((Some(old), false));
    }
    let deleting = meta(&old).is_some_and(|m| m.contains_key("deletionTimestamp"));
    let is_pod = rt.group.is_empty() && rt.plural == "pods";
    let pod_grace = if is_pod
        && old
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty())
    {
        opts.grace
            .or_else(|| {
                old.pointer("/spec/terminationGracePeriodSeconds")
                    .and_then(Value::as_i64)
            })
            .unwrap_or(POD_DEFAULT_GRACE)
    } else {
        0
    };
    if rt.group.is_empty() && rt.plural == "namespaces" {
        return delete_namespace(ctx, store, name, old).map(|(o, gone)| (Some(o), gone));
    }
    if rt.group == CRD_GROUP && rt.plural == "customresourcedefinitions" {
        if let Some(crt) = store.registry.find_crd(name) {
            for (ns, n) in store.keys(&crt.key(), None) {
                store.remove(&crt.key(), &ns, &n);
            }
        }
        store.registry.unregister(name);
        return Ok((remove_object(store, rt, &ns, name), true));
    }
    let pending_finalizers = !finalizers(&old).is_empty();
    if !pending_finalizers && (pod_grace <= 0 || deleting && opts.grace == Some(0)) {
        return Ok((remove_object(store, rt, &ns, name), true));
    }
    if deleting && !(is_pod && opts.grace == Some(0)) {
        return Ok((Some(old), false));
    }
    let mut new = old.clone();
    if let Some(m) = meta_mut(&mut new) {
        let grace = pod_grace.max(0);
        if !deleting {
            m.insert(
                "deletionTimestamp".into(),
                json!(ids::now_plus(Duration::from_secs(grace as u64))),
            );
            // kube-apiserver bumps generation when it marks an object for deletion, so
            // controllers that filter events on generation still see the deletion.
            if let Some(generation) = m.get("generation").and_then(Value::as_i64)
                && generation > 0
            {
                m.insert("generation".into(), json!(generation + 1));
            }
        }
        m.insert("deletionGracePeriodSeconds".into(), json!(grace));
    }
    let stored = store.put(&rt.key(), &ns, name, new);
    if pod_grace > 0 {
        let uid = meta_str(&old, "uid").unwrap_or_default().to_string();
        let delay = POD_TERMINATION.min(Duration::from_secs(pod_grace as u64));
        finish_pod_later(
            ctx.store.clone(),
            rt.clone(),
            ns,
            name.to_string(),
            uid,
            delay,
        );
    }
    Ok((Some(stored), false))
}

/// The emulated kubelet: after `delay`, a gracefully deleted pod is confirmed gone (grace 0), and
/// removed unless finalizers still hold it.
fn finish_pod_later(
    store: Arc<std::sync::Mutex<Store>>,
    rt: Arc<ResourceType>,
    ns: String,
    name: String,
    uid: String,
    delay: Duration,
) {
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        let mut store = store.lock().unwrap_or_else(|e| e.into_inner());
        let Some(pod) = store.get(&rt.key(), &ns, &name).cloned() else {
            return;
        };
        if meta_str(&pod, "uid") != Some(uid.as_str())
            || meta_str(&pod, "deletionTimestamp").is_none()
        {
            return;
        }
        if finalizers(&pod).is_empty() {
            remove_object(&mut store, &rt, &ns, &name);
        } else {
            let mut new = pod;
            if let Some(m) = meta_mut(&mut new) {
                m.insert("deletionGracePeriodSeconds".into(), json!(0));
            }
            store.put(&rt.key(), &ns, &name, new);
        }
    });
}

/// Namespace deletion: mark it Terminating, delete everything in it, and remove it once empty.
fn delete_namespace(
    ctx: &Ctx,
    store: &mut Store,
    name: &str,
    old: Value,
) -> Result<(Value, bool), ApiError> {
    let mut ns_obj = old;
    if meta(&ns_obj).is_some_and(|m| !m.contains_key("deletionTimestamp")) {
        if let Some(m) = meta_mut(&mut ns_obj) {
            m.insert("deletionTimestamp".into(), json!(ids::now()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
        }
        if let Some(map) = ns_obj.as_object_mut() {
            map.insert("status".into(), json!({"phase": "Terminating"}));
        }
        ns_obj = store.put("/namespaces", "", name, ns_obj);
    }
    let types: Vec<Arc<ResourceType>> = store
        .registry
        .all()
        .iter()
        .filter(|t| t.namespaced)
        .cloned()
        .collect();
    for rt in types {
        for (ns, n) in store.keys(&rt.key(), Some(name)) {
            let t = Target {
                rt: rt.clone(),
                version: rt.versions.first().cloned().unwrap_or_default(),
                namespace: Some(ns),
                name: Some(n.clone()),
                sub: None,
            };
            let opts = DeleteOptions {
                grace: Some(0),
                ..DeleteOptions::default()
            };
            delete_one(ctx, store, &t, &n, &opts)?;
        }
    }
    if namespace_is_empty(store, name) {
        let gone = store.remove("/namespaces", "", name).unwrap_or(ns_obj);
        return Ok((gone, true));
    }
    Ok((ns_obj, false))
}

fn namespace_is_empty(store: &Store, ns: &str) -> bool {
    store
        .registry
        .all()
        .iter()
        .filter(|t| t.namespaced)
        .all(|t| store.keys(&t.key(), Some(ns)).is_empty())
}

/// Remove an object for good; a terminating namespace left empty by that goes too.
fn remove_object(store: &mut Store, rt: &ResourceType, ns: &str, name: &str) -> Option<Value> {
    let gone = store.remove(&rt.key(), ns, name);
    if rt.namespaced
        && store
            .get("/namespaces", "", ns)
            .is_some_and(|n| n.pointer("/metadata/deletionTimestamp").is_some())
        && namespace_is_empty(store, ns)
    {
        store.remove("/namespaces", "", ns);
    }
    gone
}

/// The `v1` collection of a built-in cluster-scoped type, as a create at start-up addresses it.
fn collection_target(store: &Store, group: &str, plural: &str) -> Result<Target, ApiError> {
    let rt = store
        .registry
        .find(group, "v1", plural)
        .ok_or_else(|| ApiError::internal(format!("{plural} are not served")))?;
    Ok(Target {
        rt,
        version: "v1".into(),
        namespace: None,
        name: None,
        sub: None,
    })
}

/// Register (create) a CRD loaded from disk at start-up.
pub fn install_crd(store: &mut Store, crd: Value) -> Result<(), ApiError> {
    let target = collection_target(store, CRD_GROUP, "customresourcedefinitions")?;
    let mut crd = crd;
    check_type(&target, &mut crd)?;
    create_object(store, &target, crd, WriteOptions::default()).map(|_| ())
}

/// Create the namespaces every cluster starts with.
pub fn install_namespaces(store: &mut Store) -> Result<(), ApiError> {
    let target = collection_target(store, "", "namespaces")?;
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let mut obj = json!({"metadata": {"name": ns}});
        check_type(&target, &mut obj)?;
        create_object(store, &target, obj, WriteOptions::default())?;
    }
    Ok(())
}
