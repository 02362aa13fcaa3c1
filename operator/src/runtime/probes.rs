//! The HTTP endpoints both components serve: `/metrics` (Prometheus text format), `/healthz`
//! (the process answers) and `/readyz` (the component has done what makes it useful).

use std::{
    convert::Infallible,
    future::Future,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use prometheus::{Encoder, Registry, TextEncoder};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::Semaphore,
};

/// Something else a component needs before it is ready (the controller's webhook certificate).
pub trait Gate: Send + Sync + std::fmt::Debug {
    /// Whether it is satisfied.
    fn open(&self) -> bool;
}

/// Readiness shared between a component and its `/readyz` endpoint.
#[derive(Debug, Default)]
pub struct Readiness {
    ready: AtomicBool,
    gates: std::sync::RwLock<Vec<Arc<dyn Gate>>>,
}

impl Readiness {
    /// Marks the component ready (or not).
    pub fn set(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    /// Makes readiness also wait for `gate`.
    pub fn require(&self, gate: Arc<dyn Gate>) {
        self.gates
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(gate);
    }

    /// Whether the component is ready.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
            && self
                .gates
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .all(|g| g.open())
    }
}

/// Errors of the probe server.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The listen address could not be bound.
    #[error("failed to listen on {addr} for /metrics, /healthz and /readyz")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

/// A JSON document served beside the probes, made anew for every GET (the agent's node view,
/// `crate::agent::ipam`).
pub type Document =
    Arc<dyn Fn() -> std::pin::Pin<Box<dyn Future<Output = Vec<u8>> + Send>> + Send + Sync>;

/// A bound probe server; [`ProbeServer::run`] serves until `shutdown` completes.
pub struct ProbeServer {
    listener: TcpListener,
    registry: Registry,
    readiness: Arc<Readiness>,
    /// The documents served besides, by path.
    documents: Vec<(&'static str, Document)>,
}

impl std::fmt::Debug for ProbeServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let paths: Vec<&str> = self.documents.iter().map(|(p, _)| *p).collect();
        f.debug_struct("ProbeServer")
            .field("listener", &self.listener)
            .field("documents", &paths)
            .finish_non_exhaustive()
    }
}

impl ProbeServer {
    /// Binds `addr` (port 0 picks a free port; see [`ProbeServer::local_addr`]).
    pub async fn bind(
        addr: SocketAddr,
        registry: Registry,
        readiness: Arc<Readiness>,
    ) -> Result<ProbeServer, ProbeError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ProbeError::Bind { addr, source })?;
        Ok(ProbeServer {
            listener,
            registry,
            readiness,
            documents: Vec::new(),
        })
    }

    /// Also serves `document` as JSON at `path` (GET).
    pub fn with_document(mut self, path: &'static str, document: Document) -> Self {
        self.documents.push((path, document));
        self
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serves requests until `shutdown` completes; connection errors are logged, never fatal.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let registry = Arc::new(self.registry);
        let readiness = self.readiness;
        let documents = Arc::new(self.documents);
        accept_until(&self.listener, "probe server", shutdown, None, |stream| {
            let registry = registry.clone();
            let readiness = readiness.clone();
            let documents = documents.clone();
            async move {
                let service = service_fn(move |req: Request<Incoming>| {
                    let document = (req.method() == Method::GET)
                        .then(|| documents.iter().find(|(p, _)| *p == req.uri().path()))
                        .flatten()
                        .map(|(_, d)| d());
                    let answered = match document {
                        Some(document) => Err(document),
                        None => Ok(answer(&req, &registry, &readiness)),
                    };
                    async move {
                        Ok::<_, Infallible>(match answered {
                            Ok(answer) => answer,
                            Err(document) => {
                                reply(StatusCode::OK, "application/json", document.await)
                            }
                        })
                    }
                });
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    tracing::debug!(error = %e, "probe connection ended with an error");
                }
            }
        })
        .await;
    }
}

/// Accepts connections on `listener` until `shutdown` completes, each served by `serve` in a task
/// of its own; a failed accept is logged (as `what`'s), never fatal. The probe server's and the
/// placement webhook's loop.
///
/// With `max_connections`, a connection is accepted only while fewer than that many are being
/// served: the rest wait in the kernel's listen queue (and beyond it the kernel refuses them), so
/// no task, buffer or TLS state is spent on them until a slot frees.
pub(crate) async fn accept_until<F, Fut>(
    listener: &TcpListener,
    what: &'static str,
    shutdown: impl Future<Output = ()>,
    max_connections: Option<usize>,
    mut serve: F,
) where
    F: FnMut(TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::pin!(shutdown);
    let slots = max_connections.map(|n| Arc::new(Semaphore::new(n)));
    loop {
        let slot = match &slots {
            Some(slots) => tokio::select! {
                () = &mut shutdown => return,
                // The semaphore is never closed, so acquiring only fails if it were.
                slot = slots.clone().acquire_owned() => slot.ok(),
            },
            None => None,
        };
        let accepted = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => {
                let served = serve(stream);
                tokio::spawn(async move {
                    served.await;
                    drop(slot);
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "{what} failed to accept a connection");
                // Out of file descriptors (EMFILE) fails every accept at once: pause instead of
                // spinning on it until a connection closes.
                tokio::select! {
                    () = &mut shutdown => return,
                    () = tokio::time::sleep(ACCEPT_ERROR_PAUSE) => {}
                }
            }
        }
    }
}

/// How long the accept loop pauses after a failed accept: long enough not to spin, short enough
/// that a freed descriptor is used at once for all a client can tell.
const ACCEPT_ERROR_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

fn answer(
    req: &Request<Incoming>,
    registry: &Registry,
    readiness: &Readiness,
) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "only GET and HEAD\n".into(),
        );
    }
    match req.uri().path() {
        "/metrics" => {
            let mut text = Vec::new();
            match TextEncoder::new().encode(&registry.gather(), &mut text) {
                Ok(()) => reply(StatusCode::OK, prometheus::TEXT_FORMAT, text),
                Err(e) => reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    format!("failed to encode metrics: {e}\n").into_bytes(),
                ),
            }
        }
        "/healthz" | "/livez" => reply(StatusCode::OK, "text/plain", b"ok\n".to_vec()),
        "/readyz" if readiness.is_ready() => reply(StatusCode::OK, "text/plain", b"ok\n".to_vec()),
        "/readyz" => reply(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            b"not ready\n".to_vec(),
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            b"not found: try /metrics, /healthz or /readyz\n".to_vec(),
        ),
    }
}

/// A response with `status`, `content_type` and `body`.
pub(crate) fn reply(
    status: StatusCode,
    content_type: &str,
    body: Vec<u8>,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = hyper::header::HeaderValue::from_str(content_type) {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// The status line and body of `method path` asked of `addr`.
    async fn ask(addr: SocketAddr, method: &str, path: &str) -> (String, String) {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let request = format!("{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).await.unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        (head.lines().next().unwrap().to_owned(), body.to_owned())
    }

    #[tokio::test]
    async fn a_document_is_served_as_json_on_get_beside_the_probes() {
        let server = ProbeServer::bind(
            "127.0.0.1:0".parse().unwrap(),
            Registry::new(),
            Arc::new(Readiness::default()),
        )
        .await
        .unwrap()
        .with_document(
            "/doc",
            Arc::new(|| Box::pin(async { b"{\"a\":1}".to_vec() })),
        );
        let addr = server.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        let (status, body) = ask(addr, "GET", "/doc").await;
        assert_eq!(
            (status.as_str(), body.as_str()),
            ("HTTP/1.1 200 OK", "{\"a\":1}")
        );
        let (status, _) = ask(addr, "POST", "/doc").await;
        assert_eq!(status, "HTTP/1.1 405 Method Not Allowed");
        let (status, _) = ask(addr, "GET", "/healthz").await;
        assert_eq!(status, "HTTP/1.1 200 OK");
        let (status, _) = ask(addr, "GET", "/other").await;
        assert_eq!(status, "HTTP/1.1 404 Not Found");
        let _ = stop.send(());
        serving.await.unwrap();
    }
}
