//! HTTP plumbing: the accept loop, one hyper connection per client, and request routing.

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::{Response, body::Incoming, header, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::{
    net::TcpListener,
    task::{AbortHandle, JoinSet},
};

use super::{
    admin,
    api::{self, Ctx, Reply, Request},
    body::ReplyBody,
    discovery,
    faults::Verb,
    status::ApiError,
    watch, write,
};

/// The largest request body accepted (kube-apiserver's limit: 3 MiB); larger ones get a 413
/// before anything is decoded, so no request can make the server buffer without bound.
const MAX_BODY: usize = 3 * 1024 * 1024;

/// How often a restarted server tries to get its port back.
const REBIND_RETRY: Duration = Duration::from_millis(50);

/// Accept connections until the task is aborted; aborting drops the JoinSet, which ends every
/// connection (and with it every watch stream) at once. A restart request (admin endpoint) drops
/// the listener and the connections, waits, and listens again on `addr`.
pub async fn accept_loop(mut listener: TcpListener, addr: SocketAddr, ctx: Arc<Ctx>) {
    let address = addr.to_string();
    let mut restarts = ctx.faults.restarts();
    let mut connections = JoinSet::new();
    let mut handles: Vec<AbortHandle> = Vec::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let ctx = ctx.clone();
                let address = address.clone();
                handles.retain(|h| !h.is_finished());
                handles.push(connections.spawn(async move {
                    let service = service_fn(move |req| {
                        let ctx = ctx.clone();
                        let address = address.clone();
                        async move { Ok::<_, Infallible>(serve(&ctx, req, &address).await) }
                    });
                    // A client that goes away mid-request is not an error worth reporting.
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                }));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            // The sender lives in `ctx`, so this branch never sees a closed channel.
            Ok(()) = restarts.changed() => {
                let Some(restart) = *restarts.borrow_and_update() else { continue };
                drop(listener);
                for handle in handles.drain(..) {
                    if Some(handle.id()) != restart.keep {
                        handle.abort();
                    }
                }
                ctx.store().close_watches();
                tokio::time::sleep(restart.down).await;
                listener = rebind(addr).await;
            }
        }
    }
}

/// Listen on `addr` again, retrying while the port is still held (it was ours a moment ago).
async fn rebind(addr: SocketAddr) -> TcpListener {
    let mut reported = false;
    loop {
        match TcpListener::bind(addr).await {
            Ok(listener) => return listener,
            Err(e) => {
                if !reported {
                    eprintln!("ipkeep-e2e: failed to listen on {addr} again (retrying): {e}");
                    reported = true;
                }
                tokio::time::sleep(REBIND_RETRY).await;
            }
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
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => {
            return respond(Reply::Error(ApiError::too_large(MAX_BODY)));
        }
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
        user_agent: header_text(header::USER_AGENT),
        body,
    };
    let mut response = respond(route(ctx, &request, address).unwrap_or_else(Reply::Error));
    if request.path.trim_end_matches('/') == "/admin/restart" {
        // The one connection a restart spares ends with this reply.
        response.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
    }
    response
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
