//! The admin endpoint of the binary: fault injection over plain JSON HTTP under `/admin/`.
//!
//! - `POST /admin/close-watches`
//! - `POST /admin/fail-next` `{"n":3,"status":500,"verb":"list","resource":"pods"}` (verb/resource optional)
//! - `POST /admin/delay` `{"ms":200}` (0 turns it off)
//! - `POST /admin/compact`
//! - `POST /admin/restart` `{"ms":500}` (drop every connection, refuse connections for that long,
//!   listen again on the same port; data kept)
//!
//! A body that is not a JSON object, names an unknown field or gives a field the wrong type is
//! answered 400 with a message, and arms nothing.

use std::time::Duration;

use serde_json::{Map, Value, json};

use super::{
    api::{Reply, Request},
    faults::{Faults, RequestFilter, Verb},
    status::ApiError,
};

/// Serve one admin request.
pub fn admin(faults: &Faults, req: &Request) -> Result<Reply, ApiError> {
    if req.method != "POST" {
        return Err(ApiError::method_not_allowed(
            "admin endpoints accept POST only",
        ));
    }
    let body: Value = if req.body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(&req.body)
            .map_err(|e| ApiError::bad_request(format!("admin body is not JSON: {e}")))?
    };
    let path = req.path.trim_end_matches('/');
    let endpoint = path.trim_start_matches("/admin/");
    // A typo in a fault must not arm a different fault (or none) silently.
    let body = Body::new(endpoint, &body)?;
    match path {
        "/admin/close-watches" => {
            body.only(&[])?;
            faults.close_watches();
        }
        "/admin/compact" => {
            body.only(&[])?;
            faults.compact();
        }
        "/admin/restart" => {
            body.only(&["ms"])?;
            let ms = body.number("ms")?.unwrap_or(0);
            // The connection carrying this request is spared so that its reply arrives.
            faults.restart_keeping(Duration::from_millis(ms), tokio::task::try_id());
        }
        "/admin/delay" => {
            body.only(&["ms"])?;
            let ms = body
                .number("ms")?
                .ok_or_else(|| ApiError::bad_request("delay needs \"ms\" (milliseconds)"))?;
            faults.set_delay(Duration::from_millis(ms));
        }
        "/admin/fail-next" => {
            body.only(&["n", "status", "verb", "resource"])?;
            let n = body.number("n")?.unwrap_or(1);
            let n = usize::try_from(n)
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| ApiError::bad_request("fail-next \"n\" must be at least 1"))?;
            let status = body.number("status")?.unwrap_or(500);
            let status = u16::try_from(status)
                .ok()
                .filter(|s| (400..600).contains(s))
                .ok_or_else(|| {
                    ApiError::bad_request("status must be an HTTP error code (400-599)")
                })?;
            let verb = match body.string("verb")? {
                Some(v) => Some(
                    Verb::parse(v)
                        .ok_or_else(|| ApiError::bad_request(format!("unknown verb {v:?}")))?,
                ),
                None => None,
            };
            let resource = body.string("resource")?.map(str::to_string);
            faults.fail_next(n, RequestFilter { verb, resource }, status);
        }
        other => return Err(ApiError::path_not_found(other)),
    }
    Ok(Reply::Json(200, json!({"ok": true})))
}

/// The JSON object an admin endpoint received, checked field by field.
struct Body<'a> {
    endpoint: &'a str,
    fields: &'a Map<String, Value>,
}

impl<'a> Body<'a> {
    fn new(endpoint: &'a str, body: &'a Value) -> Result<Self, ApiError> {
        let fields = body.as_object().ok_or_else(|| {
            ApiError::bad_request(format!("{endpoint}: the body must be a JSON object"))
        })?;
        Ok(Body { endpoint, fields })
    }

    /// Refuse any field outside `allowed`.
    fn only(&self, allowed: &[&str]) -> Result<(), ApiError> {
        match self.fields.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(k) => Err(ApiError::bad_request(format!(
                "{}: unknown field {k:?} (accepted: {})",
                self.endpoint,
                if allowed.is_empty() {
                    "none".to_string()
                } else {
                    allowed.join(", ")
                }
            ))),
            None => Ok(()),
        }
    }

    /// A non-negative integer field (None when absent).
    fn number(&self, key: &str) -> Result<Option<u64>, ApiError> {
        match self.fields.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "{}: {key:?} must be a non-negative integer, got {v}",
                    self.endpoint
                ))
            }),
        }
    }

    /// A string field (None when absent).
    fn string(&self, key: &str) -> Result<Option<&'a str>, ApiError> {
        match self.fields.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "{}: {key:?} must be a string, got {v}",
                    self.endpoint
                ))
            }),
        }
    }
}
