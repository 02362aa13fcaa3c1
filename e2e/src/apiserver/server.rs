//! HTTP plumbing: the accept loop, one hyper connection per client, and request routing.

use std::{convert::Infallible, sync::Arc};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::{Response, body::Incoming, header, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::{net::TcpListener, task::JoinSet};

use super::{
    admin,
    api::{self, Ctx, Reply, Request},
    body::ReplyBody,
    discovery,
    faults::Verb,
    status::ApiError,
    watch, write,
};

/// Accept connections until the task is aborted; aborting drops the JoinSet, which ends every
/// connection (and with it every watch stream) at once.
pub async fn accept_loop(listener: TcpListener, ctx: Arc<Ctx>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let ctx = ctx.clone();
                let address = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
                connections.spawn(async move {
                    let service = service_fn(move |req| {
                        let ctx = ctx.clone();
                        let address = address.clone();
                        async move { Ok::<_, Infallible>(serve(&ctx, req, &address).await) }
                    });
                    // A client that goes away mid-request is not an error worth reporting.
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Serve one request (after the injected delay, if any).
async fn serve(ctx: &Ctx, req: hyper::Request<Incoming>, address: &str) -> Response<ReplyBody> {
    let delay = ctx.faults.delay();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let (parts, body) = req.into_parts();
    let header_text = |name: header::HeaderName| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            return respond(Reply::Error(ApiError::bad_request(format!(
                "failed to read the request body: {e}"
            ))));
        }
    };
    let request = Request {
        method: parts.method.as_str().to_string(),
        path: parts.uri.path().to_string(),
        query: api::parse_query(parts.uri.query().unwrap_or_default()),
        accept: header_text(header::ACCEPT),
        content_type: header_text(header::CONTENT_TYPE),
        body,
    };
    respond(route(ctx, &request, address).unwrap_or_else(Reply::Error))
}

fn route(ctx: &Ctx, req: &Request, address: &str) -> Result<Reply, ApiError> {
    if req.path.starts_with("/admin/") {
        return admin::admin(&ctx.faults, req);
    }
    match req.path.as_str() {
        "/healthz" | "/livez" | "/readyz" => return Ok(Reply::Text(200, "ok".into())),
        _ => {}
    }
    let target = {
        let store = ctx.store();
        if req.method == "GET"
            && let Some(doc) = discovery::discover(&store, &req.path, address)
        {
            return Ok(Reply::Json(200, doc));
        }
        if req.method == "GET"
            && let Some(doc) = discovery::openapi_v3(&store, &req.path)
        {
            return Ok(Reply::Json(200, doc));
        }
        api::parse_target(&store, &req.path)?
    };
    let Some(target) = target else {
        return Err(ApiError::path_not_found(&req.path));
    };
    let verb = api::verb_of(req, &target)?;
    if let Some(code) = ctx.faults.take_failure(verb, &target.rt.plural) {
        return Err(ApiError::injected(code));
    }
    match verb {
        Verb::Get => api::get(ctx, req, &target),
        Verb::List => api::list(ctx, req, &target),
        Verb::Watch => watch::watch(ctx, req, &target),
        Verb::Create => write::create(ctx, req, &target),
        Verb::Update => write::update(ctx, req, &target),
        Verb::Patch => write::patch(ctx, req, &target),
        Verb::Delete => write::delete(ctx, req, &target),
    }
}

fn respond(reply: Reply) -> Response<ReplyBody> {
    let (code, content_type, body, retry_after) = match reply {
        Reply::Json(code, value) => (
            code,
            "application/json",
            ReplyBody::Full(Some(Bytes::from(value.to_string()))),
            false,
        ),
        Reply::Text(code, text) => (
            code,
            "text/plain; charset=utf-8",
            ReplyBody::Full(Some(Bytes::from(text))),
            false,
        ),
        Reply::Stream(rx) => (200, "application/json", ReplyBody::Stream(rx), false),
        Reply::Error(e) => (
            e.code,
            "application/json",
            ReplyBody::Full(Some(Bytes::from(e.to_status().to_string()))),
            e.code == 429,
        ),
    };
    let mut builder = Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, content_type);
    if retry_after {
        builder = builder.header(header::RETRY_AFTER, "1");
    }
    builder.body(body).unwrap_or_else(|_| {
        let mut fallback = Response::new(ReplyBody::Full(Some(Bytes::from(
            json!({"kind": "Status"}).to_string(),
        ))));
        *fallback.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
        fallback
    })
}
