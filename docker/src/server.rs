//! The plugin endpoint: Docker's remote IPAM protocol on a Unix socket, served by hyper's HTTP/1
//! server on a tokio runtime, one task per connection (keep-alive as the engine's Go client uses
//! it), every answer a JSON body, every error this endpoint produces `{"Err": "..."}` with a
//! non-200 status (what the engine's plugin client reads), and `GET /metrics` in the Prometheus
//! text format. A request hyper cannot parse (no valid request line, headers over the cap) is
//! answered by hyper itself: 400 or 431 with an empty body, then closed.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Body, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus::{CounterVec, Encoder, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{UnixListener, UnixStream};

use crate::decide::Holder;
use crate::driver::{Driver, DriverError};
use crate::pool::{GLOBAL_SPACE, LOCAL_SPACE};
use crate::protocol::{
    ActivateResponse, AddressSpacesResponse, CapabilitiesResponse, ErrorResponse,
    ReleaseAddressRequest, ReleasePoolRequest, RequestAddressRequest, RequestAddressResponse,
    RequestPoolRequest, RequestPoolResponse,
};

/// The plugin protocol's content type.
pub const PLUGIN_CONTENT_TYPE: &str = "application/vnd.docker.plugins.v1+json";
const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4";
/// Connections served at once; more are answered 503 and closed.
const MAX_CONNECTIONS: usize = 512;
/// A connection idle this long (or this slow to send a request's head) is closed (the engine
/// reconnects).
const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// A request body not complete this long after its head is answered 408.
const BODY_TIMEOUT: Duration = Duration::from_secs(120);
/// hyper's smallest accepted read buffer (`max_buf_size` panics below it).
const MIN_BUF_SIZE: usize = 8192;

/// The caps on one request: a hostile peer costs at most these many bytes of memory per
/// connection, and a body declared larger than the cap is refused without being read.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Request line plus headers (hyper's read buffer; 431 beyond).
    pub max_head: usize,
    /// The body (413 beyond).
    pub max_body: usize,
}

impl Default for Limits {
    /// Docker's requests are a few hundred bytes: 16 KiB of headers, 64 KiB of body.
    fn default() -> Self {
        Self {
            max_head: 16 << 10,
            max_body: 64 << 10,
        }
    }
}

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Another process answers on the socket.
    #[error("failed to listen on {0}: another process is serving it")]
    InUse(String),
    /// Something that is not a socket is at the path: never removed.
    #[error("failed to listen on {0}: something that is not a socket is there")]
    NotSocket(String),
    /// The socket could not be created.
    #[error("failed to listen on {path}")]
    Bind {
        /// The socket.
        path: String,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// One routed answer.
#[derive(Debug, PartialEq, Eq)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// Content type.
    pub content_type: &'static str,
    /// Body.
    pub body: Vec<u8>,
}

/// A call's failure: its status and message.
#[derive(Debug)]
struct CallError {
    status: u16,
    message: String,
}

impl From<DriverError> for CallError {
    fn from(e: DriverError) -> Self {
        Self {
            status: 500,
            message: error_chain(&e),
        }
    }
}

pub use ipkeep_reservation::error_chain;

fn json<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec())
}

fn parse_body<'a, T: serde::Deserialize<'a>>(path: &str, body: &'a [u8]) -> Result<T, CallError> {
    serde_json::from_slice(body).map_err(|e| CallError {
        status: 400,
        message: format!("failed to parse the body of {path}: {e}"),
    })
}

/// The driver's metrics, in a registry of the `prometheus` crate (as the operator's).
#[derive(Debug)]
struct Metrics {
    registry: Registry,
    /// `ipkeep_docker_requests_total`: plugin calls answered, by endpoint and outcome.
    requests: IntCounterVec,
    /// `ipkeep_docker_request_seconds_total`: time spent answering them.
    seconds: CounterVec,
    /// `ipkeep_docker_addresses`: addresses held, by pool and state, counted at each scrape.
    addresses: IntGaugeVec,
}

impl Metrics {
    fn new() -> Result<Self, prometheus::Error> {
        let by_call = ["endpoint", "outcome"];
        let requests = IntCounterVec::new(
            Opts::new(
                "ipkeep_docker_requests_total",
                "Plugin calls answered, by endpoint and outcome.",
            ),
            &by_call,
        )?;
        let seconds = CounterVec::new(
            Opts::new(
                "ipkeep_docker_request_seconds_total",
                "Time spent answering plugin calls, by endpoint and outcome.",
            ),
            &by_call,
        )?;
        let addresses = IntGaugeVec::new(
            Opts::new(
                "ipkeep_docker_addresses",
                "Addresses held, by pool and state (in_use, retained).",
            ),
            &["pool", "state"],
        )?;
        let registry = Registry::new();
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(seconds.clone()))?;
        registry.register(Box::new(addresses.clone()))?;
        Ok(Self {
            registry,
            requests,
            seconds,
            addresses,
        })
    }

    fn record(&self, endpoint: &'static str, ok: bool, elapsed: Duration) {
        let labels = [
            endpoint.trim_start_matches('/'),
            if ok { "success" } else { "error" },
        ];
        self.requests.with_label_values(&labels).inc();
        self.seconds
            .with_label_values(&labels)
            .inc_by(elapsed.as_secs_f64());
    }
}

/// The endpoints the engine calls, by path.
const ENDPOINTS: [&str; 7] = [
    "/Plugin.Activate",
    "/IpamDriver.GetCapabilities",
    "/IpamDriver.GetDefaultAddressSpaces",
    "/IpamDriver.RequestPool",
    "/IpamDriver.ReleasePool",
    "/IpamDriver.RequestAddress",
    "/IpamDriver.ReleaseAddress",
];

/// The plugin endpoint over a driver.
#[derive(Debug)]
pub struct Server {
    driver: Driver,
    limits: Limits,
    metrics: Metrics,
    connections: AtomicUsize,
}

impl Server {
    /// An endpoint over `driver`.
    pub fn new(driver: Driver, limits: Limits) -> Result<Self, prometheus::Error> {
        Ok(Self {
            driver,
            limits,
            metrics: Metrics::new()?,
            connections: AtomicUsize::new(0),
        })
    }

    /// Answers one request.
    pub fn route(&self, method: &str, path: &str, body: &[u8], now: SystemTime) -> Answer {
        if path == "/metrics" {
            return match method {
                "GET" => Answer {
                    status: 200,
                    content_type: METRICS_CONTENT_TYPE,
                    body: self.metrics_text().into_bytes(),
                },
                _ => error_answer(405, format!("{path} answers GET only")),
            };
        }
        let Some(endpoint) = ENDPOINTS.iter().copied().find(|e| *e == path) else {
            return error_answer(404, format!("ipkeep-docker does not serve {path}"));
        };
        if method != "POST" {
            return error_answer(405, format!("{path} answers POST only"));
        }
        let started = Instant::now();
        let result = self.call(endpoint, body, now);
        self.metrics
            .record(endpoint, result.is_ok(), started.elapsed());
        match result {
            Ok(body) => Answer {
                status: 200,
                content_type: PLUGIN_CONTENT_TYPE,
                body,
            },
            Err(e) => {
                eprintln!("ipkeep-docker: {endpoint}: {}", e.message);
                error_answer(e.status, e.message)
            }
        }
    }

    fn call(&self, endpoint: &str, body: &[u8], now: SystemTime) -> Result<Vec<u8>, CallError> {
        let empty = BTreeMap::new;
        Ok(match endpoint {
            "/Plugin.Activate" => json(&ActivateResponse {
                implements: vec!["IpamDriver"],
            }),
            "/IpamDriver.GetCapabilities" => json(&CapabilitiesResponse {
                requires_mac_address: self.driver.requires_mac(),
                requires_request_replay: false,
            }),
            "/IpamDriver.GetDefaultAddressSpaces" => json(&AddressSpacesResponse {
                local: LOCAL_SPACE,
                global: GLOBAL_SPACE,
            }),
            "/IpamDriver.RequestPool" => {
                let req: RequestPoolRequest = parse_body(endpoint, body)?;
                let (pool_id, pool) = self.driver.request_pool(&req)?;
                json(&RequestPoolResponse {
                    pool_id,
                    pool,
                    data: empty(),
                })
            }
            "/IpamDriver.ReleasePool" => {
                let req: ReleasePoolRequest = parse_body(endpoint, body)?;
                self.driver.release_pool(&req)?;
                b"{}".to_vec()
            }
            "/IpamDriver.RequestAddress" => {
                let req: RequestAddressRequest = parse_body(endpoint, body)?;
                let address = self.driver.request_address(&req, now)?;
                json(&RequestAddressResponse {
                    address,
                    data: empty(),
                })
            }
            "/IpamDriver.ReleaseAddress" => {
                let req: ReleaseAddressRequest = parse_body(endpoint, body)?;
                self.driver.release_address(&req, now)?;
                b"{}".to_vec()
            }
            _ => {
                return Err(CallError {
                    status: 404,
                    message: format!("ipkeep-docker does not serve {endpoint}"),
                });
            }
        })
    }

    /// The Prometheus text: calls by endpoint and outcome, addresses by pool and state.
    fn metrics_text(&self) -> String {
        let mut counts: BTreeMap<(String, &str), i64> = BTreeMap::new();
        if let Ok(listed) = self.driver.list() {
            for a in listed {
                let state = match (&a.holder, a.retained_until) {
                    (_, Some(_)) => "retained",
                    (Holder::Foreign, None) => "foreign",
                    _ => "in_use",
                };
                *counts.entry((a.pool_id, state)).or_default() += 1;
            }
        }
        // A pool or state no longer held leaves the series, as the hand-written text did.
        self.metrics.addresses.reset();
        for ((pool, state), n) in counts {
            self.metrics
                .addresses
                .with_label_values(&[pool.as_str(), state])
                .set(n);
        }
        let mut text = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.metrics.registry.gather(), &mut text) {
            eprintln!("ipkeep-docker: failed to encode the metrics: {e}");
        }
        String::from_utf8(text).unwrap_or_default()
    }

    /// Answers one request read by hyper: the body is read only when its declared length fits
    /// [`Limits::max_body`], at most that many bytes of it (a chunked body is cut off there), and
    /// within [`BODY_TIMEOUT`].
    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let (parts, body) = req.into_parts();
        let max = self.limits.max_body;
        let too_large = || {
            let message = format!(
                "failed to read the request body: it is larger than the {max} bytes ipkeep-docker accepts"
            );
            eprintln!("ipkeep-docker: {message}");
            let mut res = response(error_answer(413, message));
            // The rest of the body is never read: the connection cannot carry another request.
            res.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            res
        };
        if body.size_hint().lower() > u64::try_from(max).unwrap_or(u64::MAX) {
            return too_large();
        }
        let read = tokio::time::timeout(BODY_TIMEOUT, Limited::new(body, max).collect()).await;
        let bytes = match read {
            Ok(Ok(collected)) => collected.to_bytes(),
            Ok(Err(e)) if e.is::<LengthLimitError>() => return too_large(),
            Ok(Err(e)) => {
                let message = format!("failed to read the request body: {e}");
                eprintln!("ipkeep-docker: {message}");
                return response(error_answer(400, message));
            }
            Err(_) => {
                let message = format!(
                    "failed to read the request body: not all of it arrived within {}s",
                    BODY_TIMEOUT.as_secs()
                );
                eprintln!("ipkeep-docker: {message}");
                let mut res = response(error_answer(408, message));
                res.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                return res;
            }
        };
        // A call does blocking disk work under its pool's lock (fsyncs, and a wait for the lock
        // while `ipkeep-docker list` or another call holds it): on the blocking pool, so one
        // call never holds up the others' connections, as when each connection had its thread.
        let server = Arc::clone(&self);
        let answer = tokio::task::spawn_blocking(move || {
            server.route(
                parts.method.as_str(),
                parts.uri.path(),
                &bytes,
                SystemTime::now(),
            )
        })
        .await
        .unwrap_or_else(|e| error_answer(500, format!("failed to answer the request: {e}")));
        response(answer)
    }

    /// Serves one connection (keep-alive, as the engine's Go client uses it) until the peer
    /// closes it, asks to, sends something hyper cannot read, or stays idle [`IDLE_TIMEOUT`].
    pub async fn serve_connection<I>(self: Arc<Self>, io: I)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let server = Arc::clone(&self);
        let service = service_fn(move |req| {
            let server = Arc::clone(&server);
            async move { Ok::<_, Infallible>(server.handle(req).await) }
        });
        if let Err(e) = self
            .http1()
            .serve_connection(TokioIo::new(io), service)
            .await
        {
            // A peer that closed mid-request or went idle: nothing to answer, nothing to log.
            if !(e.is_incomplete_message() || e.is_timeout() || is_closed(&e)) {
                eprintln!("ipkeep-docker: connection: {e}");
            }
        }
    }

    /// hyper's HTTP/1 server as this endpoint wants it: the request line and headers capped at
    /// [`Limits::max_head`] (431 beyond), and a connection that sends no complete head for
    /// [`IDLE_TIMEOUT`] closed — hyper's header-read timer runs while a keep-alive connection
    /// waits for its next request too.
    fn http1(&self) -> http1::Builder {
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(IDLE_TIMEOUT)
            .max_buf_size(self.limits.max_head.max(MIN_BUF_SIZE));
        builder
    }

    /// Accepts connections on `listener` (from [`bind`]) forever, one task each on the caller's
    /// runtime; returns only if the listener cannot be registered with the runtime.
    pub async fn serve(
        self: Arc<Self>,
        listener: std::os::unix::net::UnixListener,
    ) -> io::Result<()> {
        listener.set_nonblocking(true)?;
        let listener = UnixListener::from_std(listener)?;
        loop {
            let stream = match listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    eprintln!("ipkeep-docker: failed to accept a connection: {e}");
                    // EMFILE and the like: do not spin.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            if self.connections.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
                self.connections.fetch_sub(1, Ordering::AcqRel);
                tokio::spawn(refuse(self.http1(), stream));
                continue;
            }
            let server = Arc::clone(&self);
            tokio::spawn(async move {
                Arc::clone(&server).serve_connection(stream).await;
                server.connections.fetch_sub(1, Ordering::AcqRel);
            });
        }
    }
}

/// Whether hyper's error is the peer going away (a reset or a broken pipe).
fn is_closed(e: &hyper::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<io::Error>() {
            return matches!(
                io.kind(),
                io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
            );
        }
        source = s.source();
    }
    false
}

/// Answers a connection over [`MAX_CONNECTIONS`] with a 503 and closes it.
async fn refuse(mut builder: http1::Builder, stream: UnixStream) {
    let service = service_fn(|_req: Request<Incoming>| async {
        let a = error_answer(
            503,
            format!("ipkeep-docker serves at most {MAX_CONNECTIONS} connections at once"),
        );
        Ok::<_, Infallible>(response(a))
    });
    let _ = builder
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

fn response(a: Answer) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(Bytes::from(a.body)));
    *res.status_mut() = StatusCode::from_u16(a.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(a.content_type),
    );
    res
}

fn error_answer(status: u16, message: String) -> Answer {
    Answer {
        status,
        content_type: PLUGIN_CONTENT_TYPE,
        body: json(&ErrorResponse { err: message }),
    }
}

/// Binds the socket at `path`: creates its directory, replaces a stale socket, refuses to take
/// over one another process still serves. The socket is `0660` (root and the docker group).
pub fn bind(path: &Path) -> Result<std::os::unix::net::UnixListener, ServeError> {
    let shown = path.display().to_string();
    let bind_err = |source| ServeError::Bind {
        path: shown.clone(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(bind_err)?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(ServeError::NotSocket(shown));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(ServeError::InUse(shown));
        }
        std::fs::remove_file(path).map_err(bind_err)?;
    }
    let listener = std::os::unix::net::UnixListener::bind(path).map_err(bind_err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(bind_err)?;
    Ok(listener)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::driver::DriverConfig;
    use crate::pool::AutoPools;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The status and body of the one answer the endpoint gives to `raw` on a fresh connection
    /// (`None`: it closed without answering).
    async fn answer(server: &Arc<Server>, raw: &[u8]) -> Option<(u16, String)> {
        let (mut client, conn) = UnixStream::pair().unwrap();
        tokio::spawn(Arc::clone(server).serve_connection(conn));
        // The endpoint may answer and close before reading everything.
        let _ = client.write_all(raw).await;
        let mut got = Vec::new();
        let mut buf = [0; 4096];
        let read = async {
            loop {
                let n = client.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    return;
                }
                got.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&got).into_owned();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let len = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap())
                        })
                        .unwrap_or(0);
                    if body.len() >= len {
                        return;
                    }
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(5), read)
            .await
            .expect("no answer within 5 s");
        let text = String::from_utf8_lossy(&got).into_owned();
        let (head, body) = text.split_once("\r\n\r\n")?;
        let status = head.split(' ').nth(1)?.parse().ok()?;
        Some((status, body.to_owned()))
    }

    fn server(dir: &Path) -> Arc<Server> {
        let driver = Driver::new(DriverConfig {
            data_dir: dir.to_path_buf(),
            default_retain_for: Duration::from_secs(60),
            auto_pools: AutoPools::parse("198.19.0.0/16:24").unwrap(),
            key_by_mac: false,
        });
        let limits = Limits {
            max_head: MIN_BUF_SIZE,
            max_body: 32,
        };
        Arc::new(Server::new(driver, limits).unwrap())
    }

    /// What the hand-written HTTP reader refused, through hyper: a JSON `Err` wherever this
    /// endpoint answers (routing, the body), hyper's own empty 400/431 for what is not HTTP.
    #[tokio::test(flavor = "current_thread")]
    async fn hostile_requests_table() {
        let dir = tempfile::tempdir().unwrap();
        let server = server(dir.path());
        let long_header = format!(
            "POST /x HTTP/1.1\r\nX: {}\r\n\r\n",
            "a".repeat(MIN_BUF_SIZE)
        );
        let over_cap = format!(
            "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n21\r\n{}\r\n0\r\n\r\n",
            "a".repeat(33)
        );
        // (request, status, what the JSON `Err` contains; "" for hyper's empty body)
        let cases: Vec<(&[u8], u16, &str)> = vec![
            (b"GARBAGE\r\n\r\n", 400, ""),
            (b"\x00\x01garbage\r\n\r\n", 400, ""),
            // An authority-form target parses as HTTP: routed, and no endpoint is there.
            (b"POST x HTTP/1.1\r\n\r\n", 404, "does not serve"),
            (b"POST /x HTTP/1.1\r\nno colon\r\n\r\n", 400, ""),
            (b"POST /x HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, ""),
            (
                b"POST /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                400,
                "",
            ),
            (
                b"POST /x HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n",
                400,
                "",
            ),
            (
                b"POST /x HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
                400,
                "",
            ),
            (long_header.as_bytes(), 431, ""),
            (
                b"POST /x HTTP/1.1\r\nContent-Length: 33\r\n\r\n",
                413,
                "larger than the 32 bytes",
            ),
            (over_cap.as_bytes(), 413, "larger than the 32 bytes"),
            (
                b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n\r\n",
                400,
                "failed to read the request body",
            ),
            (
                b"POST /x HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
                404,
                "does not serve /x",
            ),
            (
                b"GET /IpamDriver.RequestAddress HTTP/1.1\r\n\r\n",
                405,
                "answers POST only",
            ),
            (
                b"POST /IpamDriver.RequestAddress HTTP/1.1\r\nContent-Length: 1\r\n\r\n{",
                400,
                "failed to parse the body",
            ),
        ];
        for (raw, status, err) in cases {
            let shown = String::from_utf8_lossy(raw);
            let (got, body) = answer(&server, raw)
                .await
                .unwrap_or_else(|| panic!("{shown:?}: no answer"));
            assert_eq!(got, status, "{shown:?}: {body}");
            if err.is_empty() {
                assert_eq!(body, "", "{shown:?}");
            } else {
                let value: serde_json::Value = serde_json::from_str(&body).unwrap();
                assert!(
                    value["Err"].as_str().unwrap().contains(err),
                    "{shown:?}: {body}"
                );
            }
        }
    }

    /// A stalled body is answered 408 after [`BODY_TIMEOUT`], and a connection that sends
    /// nothing is closed after [`IDLE_TIMEOUT`], also after a first request (tokio's clock is
    /// paused and jumps ahead when everything waits).
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn stalled_bodies_and_idle_connections_time_out() {
        let dir = tempfile::tempdir().unwrap();
        let server = server(dir.path());
        let cases: [(&[u8], &str, Duration); 2] = [
            (
                b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nab",
                "HTTP/1.1 408 ",
                BODY_TIMEOUT,
            ),
            (
                b"POST /Plugin.Activate HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
                "HTTP/1.1 200 OK",
                IDLE_TIMEOUT,
            ),
        ];
        for (raw, status_line, after) in cases {
            let started = tokio::time::Instant::now();
            let all = until_closed(&server, raw).await;
            assert!(all.starts_with(status_line), "{all}");
            assert!(started.elapsed() >= after, "{:?}: {all}", started.elapsed());
        }
        let all = until_closed(&server, cases[0].0).await;
        assert!(all.contains("not all of it arrived within 120s"), "{all}");
    }

    /// Everything the endpoint writes to a fresh connection after `raw`, until it closes it.
    async fn until_closed(server: &Arc<Server>, raw: &[u8]) -> String {
        let (mut client, conn) = UnixStream::pair().unwrap();
        tokio::spawn(Arc::clone(server).serve_connection(conn));
        client.write_all(raw).await.unwrap();
        let mut all = String::new();
        client.read_to_string(&mut all).await.unwrap();
        all
    }

    /// Keep-alive as the engine uses it, `Connection: close` and HTTP/1.0 honoured.
    #[tokio::test(flavor = "current_thread")]
    async fn keep_alive_and_close() {
        let dir = tempfile::tempdir().unwrap();
        let server = server(dir.path());
        let (mut client, conn) = UnixStream::pair().unwrap();
        tokio::spawn(Arc::clone(&server).serve_connection(conn));
        let call = b"POST /Plugin.Activate HTTP/1.1\r\nContent-Length: 0\r\n\r\n";
        client.write_all(call).await.unwrap();
        client
            .write_all(b"POST /Plugin.Activate HTTP/1.1\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut all = String::new();
        tokio::time::timeout(Duration::from_secs(5), client.read_to_string(&mut all))
            .await
            .expect("the connection was not closed after Connection: close")
            .unwrap();
        assert_eq!(all.matches("HTTP/1.1 200 OK").count(), 2, "{all}");
        assert_eq!(
            all.matches(r#"{"Implements":["IpamDriver"]}"#).count(),
            2,
            "{all}"
        );
        assert!(
            all.contains("content-type: application/vnd.docker.plugins.v1+json"),
            "{all}"
        );
        let (status, _) = answer(&server, b"POST /Plugin.Activate HTTP/1.0\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(status, 200);
    }
}
