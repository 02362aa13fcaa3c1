//! The plugin endpoint: Docker's remote IPAM protocol on a Unix socket, one thread per
//! connection (keep-alive as the engine's Go client uses it), every answer a JSON body, every
//! error `{"Err": "..."}` with a non-200 status (what the engine's plugin client reads), and
//! `GET /metrics` in the Prometheus text format.

use std::collections::BTreeMap;
use std::io::{self, BufReader};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use prometheus::{CounterVec, Encoder, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};
use serde::Serialize;

use crate::decide::Holder;
use crate::driver::{Driver, DriverError};
use crate::http::{self, HttpError, Limits};
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
/// A connection idle this long is closed (the engine reconnects).
const IDLE_TIMEOUT: Duration = Duration::from_secs(120);

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

    /// Serves one connection until the peer closes it, asks to, or sends something unreadable.
    pub fn serve_connection(&self, stream: UnixStream) {
        let _ = stream.set_read_timeout(Some(IDLE_TIMEOUT));
        let Ok(read_half) = stream.try_clone() else {
            return;
        };
        let mut reader = BufReader::new(read_half);
        let mut writer = stream;
        loop {
            match http::read_request(&mut reader, self.limits) {
                Ok(None) => return,
                Ok(Some(req)) => {
                    let answer = self.route(&req.method, &req.path, &req.body, SystemTime::now());
                    let written = http::write_response(
                        &mut writer,
                        answer.status,
                        answer.content_type,
                        &answer.body,
                        req.close,
                    );
                    if written.is_err() || req.close {
                        return;
                    }
                }
                Err(e) => {
                    answer_unreadable(&mut writer, &e);
                    return;
                }
            }
        }
    }

    /// Accepts connections forever, one thread each.
    pub fn serve(self: Arc<Self>, listener: UnixListener) {
        for stream in listener.incoming() {
            let mut stream = match stream {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("ipkeep-docker: failed to accept a connection: {e}");
                    continue;
                }
            };
            if self.connections.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
                self.connections.fetch_sub(1, Ordering::AcqRel);
                let a = error_answer(
                    503,
                    format!("ipkeep-docker serves at most {MAX_CONNECTIONS} connections at once"),
                );
                let _ = http::write_response(&mut stream, a.status, a.content_type, &a.body, true);
                continue;
            }
            let server = Arc::clone(&self);
            let spawned = std::thread::Builder::new()
                .name("connection".into())
                .spawn(move || {
                    server.serve_connection(stream);
                    server.connections.fetch_sub(1, Ordering::AcqRel);
                });
            if let Err(e) = spawned {
                self.connections.fetch_sub(1, Ordering::AcqRel);
                eprintln!("ipkeep-docker: failed to start a connection thread: {e}");
            }
        }
    }
}

fn error_answer(status: u16, message: String) -> Answer {
    Answer {
        status,
        content_type: PLUGIN_CONTENT_TYPE,
        body: json(&ErrorResponse { err: message }),
    }
}

/// Answers a request that could not be read (when there is anything to answer) and logs it.
fn answer_unreadable(writer: &mut UnixStream, e: &HttpError) {
    if let Some(status) = e.status() {
        eprintln!("ipkeep-docker: {}", error_chain(e));
        let a = error_answer(status, error_chain(e));
        let _ = http::write_response(writer, a.status, a.content_type, &a.body, true);
    }
}

/// Binds the socket at `path`: creates its directory, replaces a stale socket, refuses to take
/// over one another process still serves. The socket is `0660` (root and the docker group).
pub fn bind(path: &Path) -> Result<UnixListener, ServeError> {
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
        if UnixStream::connect(path).is_ok() {
            return Err(ServeError::InUse(shown));
        }
        std::fs::remove_file(path).map_err(bind_err)?;
    }
    let listener = UnixListener::bind(path).map_err(bind_err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(bind_err)?;
    Ok(listener)
}
