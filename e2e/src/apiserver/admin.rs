//! The admin endpoint of the binary: fault injection over plain JSON HTTP under `/admin/`.
//!
//! - `POST /admin/close-watches`
//! - `POST /admin/fail-next` `{"n":3,"status":500,"verb":"list","resource":"pods"}` (verb/resource optional)
//! - `POST /admin/delay` `{"ms":200}` (0 turns it off)
//! - `POST /admin/compact`
//! - `POST /admin/restart` `{"ms":500}` (drop every connection, refuse connections for that long,
//!   listen again on the same port; data kept)

use std::time::Duration;

use serde_json::{Value, json};

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
    match req.path.trim_end_matches('/') {
        "/admin/close-watches" => faults.close_watches(),
        "/admin/compact" => faults.compact(),
        "/admin/restart" => {
            let ms = match body.get("ms") {
                None => 0,
                Some(ms) => ms
                    .as_u64()
                    .ok_or_else(|| ApiError::bad_request("restart \"ms\" must be a number"))?,
            };
            // The connection carrying this request is spared so that its reply arrives.
            faults.restart_keeping(Duration::from_millis(ms), tokio::task::try_id());
        }
        "/admin/delay" => {
            let ms = body
                .get("ms")
                .and_then(Value::as_u64)
                .ok_or_else(|| ApiError::bad_request("delay needs \"ms\""))?;
            faults.set_delay(Duration::from_millis(ms));
        }
        "/admin/fail-next" => {
            let n = body.get("n").and_then(Value::as_u64).unwrap_or(1) as usize;
            let status = body.get("status").and_then(Value::as_u64).unwrap_or(500);
            let status = u16::try_from(status)
                .ok()
                .filter(|s| (400..600).contains(s))
                .ok_or_else(|| {
                    ApiError::bad_request("status must be an HTTP error code (400-599)")
                })?;
            let verb = match body.get("verb").and_then(Value::as_str) {
                Some(v) => Some(
                    Verb::parse(v)
                        .ok_or_else(|| ApiError::bad_request(format!("unknown verb {v:?}")))?,
                ),
                None => None,
            };
            let resource = body
                .get("resource")
                .and_then(Value::as_str)
                .map(str::to_string);
            faults.fail_next(n, RequestFilter { verb, resource }, status);
        }
        other => return Err(ApiError::path_not_found(other)),
    }
    Ok(Reply::Json(200, json!({"ok": true})))
}
