//! Kubernetes `Status` objects: the error shape every kube-apiserver reply uses.

use serde_json::{Value, json};

/// An API error as kube-apiserver reports it: an HTTP code, a machine-readable reason and a message.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code (404, 409, 422, ...).
    pub code: u16,
    /// `Status.reason` (`NotFound`, `AlreadyExists`, `Conflict`, `Invalid`, ...).
    pub reason: &'static str,
    /// Human-readable message, worded like the real server's.
    pub message: String,
    /// Optional `Status.details` (name, group, kind, causes).
    pub details: Option<Box<Value>>,
    /// A complete pre-built `Status` body (used for 422s built by the schema module).
    pub body: Option<Box<Value>>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            body: None,
        }
    }

    /// 404 for an object that does not exist.
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        let resource = qualified(plural, group);
        let mut e = Self::new(404, "NotFound", format!("{resource} \"{name}\" not found"));
        e.details = Some(Box::new(
            json!({"name": name, "group": group, "kind": plural}),
        ));
        e
    }

    /// 404 for a path that names no resource.
    pub fn path_not_found(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    /// 409 for a create whose name is taken.
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        let resource = qualified(plural, group);
        let mut e = Self::new(
            409,
            "AlreadyExists",
            format!("{resource} \"{name}\" already exists"),
        );
        e.details = Some(Box::new(
            json!({"name": name, "group": group, "kind": plural}),
        ));
        e
    }

    /// 409 for a write whose precondition (resourceVersion or uid) does not hold.
    pub fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        let resource = qualified(plural, group);
        let mut e = Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {resource} \"{name}\": {why}"),
        );
        e.details = Some(Box::new(
            json!({"name": name, "group": group, "kind": plural}),
        ));
        e
    }

    /// 422 with a pre-built `Status` body.
    pub fn invalid_body(body: Value) -> Self {
        let message = body
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("invalid")
            .to_string();
        let mut e = Self::new(422, "Invalid", message);
        e.body = Some(Box::new(body));
        e
    }

    /// 422 for a single invalid field of a built-in or a metadata rule.
    pub fn invalid(
        kind_group: &str,
        name: &str,
        field: &str,
        cause_reason: &str,
        detail: &str,
    ) -> Self {
        let message = format!("{kind_group} \"{name}\" is invalid: {field}: {detail}");
        let mut e = Self::new(422, "Invalid", message);
        let (kind, group) = kind_group.split_once('.').unwrap_or((kind_group, ""));
        e.details = Some(Box::new(json!({
            "name": name, "group": group, "kind": kind,
            "causes": [{"reason": cause_reason, "message": detail, "field": field}]
        })));
        e
    }

    /// 400 for a malformed request.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 413 for a request body over the size limit.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            format!("the request body is larger than the {limit} bytes the server accepts"),
        )
    }

    /// 405 for a verb the resource does not support.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// 415 for a patch type the server does not know.
    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    /// 410 for a resourceVersion older than the retained history.
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 504 for a read at a resourceVersion the server has not reached.
    pub fn too_large_resource_version(requested: u64, current: u64) -> Self {
        let mut e = Self::new(
            504,
            "Timeout",
            format!("Too large resource version: {requested}, current: {current}"),
        );
        e.details = Some(Box::new(json!({
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1
        })));
        e
    }

    /// An injected or internal failure with an arbitrary code; the reason follows the code.
    pub fn injected(code: u16) -> Self {
        let (reason, message) = match code {
            409 => (
                "Conflict",
                "Operation cannot be fulfilled: injected conflict",
            ),
            410 => ("Expired", "injected: resource version too old"),
            429 => (
                "TooManyRequests",
                "injected: too many requests, please try again later",
            ),
            500 => ("InternalError", "Internal error occurred: injected failure"),
            503 => (
                "ServiceUnavailable",
                "injected: the server is currently unable to handle the request",
            ),
            504 => (
                "Timeout",
                "injected: the server was unable to return a response in the time allotted",
            ),
            400 => ("BadRequest", "injected: bad request"),
            403 => ("Forbidden", "injected: forbidden"),
            404 => ("NotFound", "injected: not found"),
            _ => ("InternalError", "Internal error occurred: injected failure"),
        };
        let mut e = Self::new(code, reason, message);
        if code == 429 {
            e.details = Some(Box::new(json!({"retryAfterSeconds": 1})));
        }
        e
    }

    /// 500 for a server bug (a stored object that is not an object, ...).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }

    /// The `Status` object sent as the body (and inside watch `ERROR` events).
    pub fn to_status(&self) -> Value {
        if let Some(body) = &self.body {
            return (**body).clone();
        }
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let (Some(details), Some(map)) = (&self.details, status.as_object_mut()) {
            map.insert("details".into(), (**details).clone());
        }
        status
    }
}

/// `plural.group` as the real server names a resource in messages (`pods`, `ipreservations.ipkeep.dev`).
fn qualified(plural: &str, group: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

/// The `Status` a successful delete of an object without finalizers may return.
pub fn success_status(group: &str, plural: &str, name: &str, uid: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": name, "group": group, "kind": plural, "uid": uid}
    })
}
