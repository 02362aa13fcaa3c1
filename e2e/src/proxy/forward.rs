//! One client connection: TLS with the client, one upstream TLS connection to kube-apiserver
//! opened on demand, and each request either forwarded (its watch stream perhaps ended early) or
//! answered by the fault its rule names.

use std::{convert::Infallible, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::{
    Request, Response,
    body::{Frame, Incoming},
    client::conn::http1::SendRequest,
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::{net::TcpStream, sync::watch};
use tokio_rustls::{TlsAcceptor, TlsConnector, rustls::pki_types::ServerName};

use super::{
    Shared,
    rules::{Fault, RequestInfo, RuleId, Verb},
};

/// A response body: a forwarded stream or the proxy's own answer.
pub(super) type ProxyBody = UnsyncBoxBody<Bytes, hyper::Error>;

/// Where and how to reach kube-apiserver.
#[derive(Clone)]
pub(super) struct Upstream {
    /// `host:port`.
    pub authority: String,
    /// The name its certificate must carry.
    pub server_name: ServerName<'static>,
    /// TLS trusting the plane's CA.
    pub tls: TlsConnector,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("authority", &self.authority)
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// Why a request got no answer; hyper then closes the client's connection, which is what the
/// client of a dead or unreachable API server sees.
#[derive(Debug, thiserror::Error)]
pub(super) enum ForwardError {
    /// kube-apiserver refused the connection or the TLS handshake failed.
    #[error("failed to connect to kube-apiserver at {authority}")]
    Connect {
        /// `host:port`.
        authority: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP exchange with kube-apiserver failed.
    #[error("failed to forward the request to kube-apiserver")]
    Http(#[source] hyper::Error),
    /// A hanging request's rule was removed.
    #[error("the hanging request's rule was removed")]
    Released,
}

/// Headers that belong to one hop, never forwarded.
const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Serves one accepted client connection until it closes or the proxy drops every connection.
pub(super) async fn serve_connection(shared: Arc<Shared>, tcp: TcpStream, tls: TlsAcceptor) {
    let mut dropped = shared.drop_connections.subscribe();
    let client = tcp.peer_addr().ok().map(|a| a.ip());
    let serve = async {
        let Ok(stream) = tls.accept(tcp).await else {
            return;
        };
        let upstream: Arc<tokio::sync::Mutex<Option<SendRequest<Incoming>>>> = Arc::default();
        let service =
            service_fn(move |req| handle(Arc::clone(&shared), Arc::clone(&upstream), client, req));
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), service)
            .await;
    };
    tokio::select! {
        () = serve => {}
        _ = dropped.changed() => {}
    }
}

async fn handle(
    shared: Arc<Shared>,
    upstream: Arc<tokio::sync::Mutex<Option<SendRequest<Incoming>>>>,
    client: Option<std::net::IpAddr>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, ForwardError> {
    let info = RequestInfo {
        client,
        ..RequestInfo::parse(req.method(), req.uri().path(), req.uri().query())
    };
    let fault = shared.take_fault(&info);
    let mut cut_after = None;
    match fault {
        Some((
            _,
            Fault::Status {
                code,
                retry_after_seconds,
            },
        )) => return Ok(status_response(code, retry_after_seconds, &info)),
        Some((_, Fault::Expired)) if info.verb == Verb::Watch => return Ok(expired_watch()),
        Some((_, Fault::Expired)) => return Ok(status_response(410, None, &info)),
        Some((id, Fault::Hang)) => {
            hang(&shared, id).await;
            return Err(ForwardError::Released);
        }
        Some((_, Fault::Delay { millis })) => {
            tokio::time::sleep(Duration::from_millis(millis)).await;
        }
        Some((_, Fault::CutWatch { events })) => cut_after = Some(events),
        None => {}
    }
    let mut sender = upstream.lock().await;
    if sender.as_ref().is_none_or(|s| s.is_closed()) {
        *sender = Some(connect(&shared.upstream).await?);
    }
    let Some(s) = sender.as_mut() else {
        return Err(ForwardError::Released);
    };
    s.ready().await.map_err(ForwardError::Http)?;
    let (mut parts, body) = req.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    if let Ok(host) = http::HeaderValue::from_str(&shared.upstream.authority) {
        parts.headers.insert(http::header::HOST, host);
    }
    let response = s
        .send_request(Request::from_parts(parts, body))
        .await
        .map_err(ForwardError::Http)?;
    drop(sender);
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let body = if info.verb == Verb::Watch && parts.status.is_success() {
        watch_stream(body, cut_after, shared.close_watches.subscribe())
    } else {
        body.boxed_unsync()
    };
    Ok(Response::from_parts(parts, body))
}

fn strip_hop_by_hop(headers: &mut http::HeaderMap) {
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

async fn connect(upstream: &Upstream) -> Result<SendRequest<Incoming>, ForwardError> {
    let err = |source| ForwardError::Connect {
        authority: upstream.authority.clone(),
        source,
    };
    let tcp = TcpStream::connect(&upstream.authority).await.map_err(err)?;
    let tls = upstream
        .tls
        .connect(upstream.server_name.clone(), tcp)
        .await
        .map_err(err)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(ForwardError::Http)?;
    // Ends when the sender and any response body in flight are gone.
    tokio::spawn(connection);
    Ok(sender)
}

/// Waits until rule `id` is removed.
async fn hang(shared: &Shared, id: RuleId) {
    let mut changed = shared.rules_changed.subscribe();
    while shared.has_rule(id) {
        if changed.changed().await.is_err() {
            // The proxy is gone: never answer.
            std::future::pending::<()>().await;
        }
    }
}

fn full(body: Vec<u8>) -> ProxyBody {
    Full::new(Bytes::from(body))
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

/// The reason kube-apiserver gives with each status.
fn reason(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        410 => "Expired",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "",
    }
}

fn status_body(code: u16, message: &str) -> serde_json::Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason(code),
        "code": code,
    })
}

fn status_response(code: u16, retry_after: Option<u32>, info: &RequestInfo) -> Response<ProxyBody> {
    let what = match (&info.resource, &info.name) {
        (Some(r), Some(n)) => format!("{:?} {r} {n}", info.verb),
        (Some(r), None) => format!("{:?} {r}", info.verb),
        _ => format!("{:?}", info.verb),
    };
    let message = format!("the fault proxy answered {what} with {code}");
    let body = serde_json::to_vec(&status_body(code, &message)).unwrap_or_default();
    let mut response = Response::new(full(body));
    *response.status_mut() =
        http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    if let Some(seconds) = retry_after {
        headers.insert(http::header::RETRY_AFTER, http::HeaderValue::from(seconds));
    }
    response
}

/// 200 and one `ERROR` event carrying `410 Expired`, as kube-apiserver answers a watch whose
/// resourceVersion was compacted away.
fn expired_watch() -> Response<ProxyBody> {
    let event = json!({
        "type": "ERROR",
        "object": status_body(410, "too old resource version (the fault proxy expired this watch)"),
    });
    let mut line = serde_json::to_vec(&event).unwrap_or_default();
    line.push(b'\n');
    let mut response = Response::new(full(line));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

struct WatchStream {
    body: Incoming,
    /// Events still passed before the stream is ended; `None`: no limit.
    left: Option<usize>,
    closed: watch::Receiver<u64>,
    done: bool,
}

/// A watch response passed through event by event (one JSON line each), ended cleanly after
/// `cut_after` events or when the proxy closes every watch.
fn watch_stream(
    body: Incoming,
    cut_after: Option<usize>,
    closed: watch::Receiver<u64>,
) -> ProxyBody {
    let state = WatchStream {
        body,
        done: cut_after == Some(0),
        left: cut_after,
        closed,
    };
    let stream = futures::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        let frame = tokio::select! {
            frame = st.body.frame() => frame?,
            _ = st.closed.changed() => return None,
        };
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => {
                st.done = true;
                return Some((Err(e), st));
            }
        };
        let frame = match (frame.into_data(), st.left.as_mut()) {
            (Ok(mut data), Some(left)) => {
                let mut end = None;
                for (i, b) in data.iter().enumerate() {
                    if *b == b'\n' {
                        *left -= 1;
                        if *left == 0 {
                            end = Some(i + 1);
                            break;
                        }
                    }
                }
                if let Some(end) = end {
                    data.truncate(end);
                    st.done = true;
                }
                Frame::data(data)
            }
            (Ok(data), None) => Frame::data(data),
            (Err(other), _) => other,
        };
        Some((Ok(frame), st))
    });
    StreamBody::new(stream).boxed_unsync()
}
