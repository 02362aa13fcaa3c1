//! The placement webhook: a mutating admission webhook for pods, served over HTTPS by every
//! controller replica (leader and standbys alike, so a failover never stops admission) from the
//! same caches the reconciles read. For a pod that asks for retention and has a reservation, it adds
//! a node affinity term for the reservation's node ([`placement::decide`]) and records what it did
//! on the pod (annotation [`crate::rules::placement::PLACED`]); the controller reads that record back to say when
//! a returning pod was not placed (Warning `PlacementMissed` / `PlacementSkipped`).
//!
//! It never refuses a pod: any failure answers "allowed, unchanged" (and the chart registers it
//! with `failurePolicy: Ignore`, so an unreachable webhook never blocks a pod's creation either).

use std::{
    convert::Infallible,
    future::Future,
    net::SocketAddr,
    sync::{Arc, RwLock},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::{
    HeaderMap, Method, Request, Response, StatusCode,
    body::Incoming,
    header::{CONNECTION, CONTENT_LENGTH, HeaderValue},
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use k8s_openapi::api::{
    apps::v1::StatefulSet,
    core::v1::{Node, Pod},
};
use kube::Client;
use kube::{
    core::{
        PartialObjectMeta,
        admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation},
    },
    runtime::reflector::{ObjectRef, Store},
};
use prometheus::{IntCounterVec, IntGauge, Opts, Registry};
use tokio::{
    net::TcpListener,
    sync::{Semaphore, watch},
    task::JoinSet,
};
use tokio_rustls::{
    TlsAcceptor,
    rustls::{
        ServerConfig, SupportedCipherSuite, SupportedProtocolVersion,
        crypto::{
            CryptoProvider,
            ring::{cipher_suite as suites, default_provider},
        },
        server::{ClientHello, ResolvesServerCert},
        sign::CertifiedKey,
        version,
    },
};

use super::{
    ControllerError, Settings, WebhookSettings,
    metrics::MetricsError,
    webhook_tls::{TlsSource, keep},
};
use super::{
    cache::CachedReservation,
    placement::{self, Decision, PodScheduling, Request as PlacementRequest},
    view,
};
use crate::rules::{optin, optin::Mode, placement::NodeFacts};
use crate::runtime::probes::{Gate, Readiness, accept_until, reply};
use crate::runtime::shutdown::stopped;

/// The path the chart registers.
pub const PATH: &str = "/mutate-pods";

/// The limits that keep a client on the pod network from holding the webhook open or making it
/// allocate without bound. Constants, not flags: each follows from what the API server (the only
/// client the webhook serves) does, not from the cluster it runs in; see [`Limits::STANDARD`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// How long a connection may take to finish its TLS handshake, and then to send a request's
    /// whole head. hyper starts the same timer when a kept-alive connection waits for its next
    /// request, so it is also the idle timeout.
    pub head_timeout: Duration,
    /// How long a request may take from its head to the answer: reading the body, waiting for a
    /// review slot, answering. Past it the client gets 408 and the connection is closed.
    pub request_deadline: Duration,
    /// Connections served at once; more wait in the kernel's listen queue.
    pub max_connections: usize,
    /// Reviews whose body is read and answered at once; more wait (within the deadline).
    pub max_reviews_in_flight: usize,
    /// The largest request body read; a larger one gets 413.
    pub max_body: usize,
    /// The largest request head (request line and headers); a larger one gets 431.
    pub max_head: usize,
}

impl Limits {
    /// The limits every controller serves with.
    pub const STANDARD: Limits = Limits {
        // The API server writes a request's head at once on a connection it has just opened or
        // kept; ten seconds is far beyond any network it runs on, and a slow sender (slowloris)
        // holds a slot no longer than that. Closing a kept-alive connection idle that long costs
        // the API server one TLS handshake (milliseconds) on its next review.
        head_timeout: Duration::from_secs(10),
        // The API server waits at most `timeoutSeconds`, which it caps at 30: an answer later
        // than that goes to nobody.
        request_deadline: Duration::from_secs(30),
        // Above the 1 000 slow connections issue 44's test holds while a pod is still placed. A
        // connection waiting for its head holds at most one TLS record (16 KiB) and `max_head`:
        // about 64 MiB at the cap, within the chart's memory limit (512 MiB). The process needs
        // as many file descriptors: under a lower `nofile` limit accepts fail, which is logged
        // and paused on, never spun on.
        max_connections: 2048,
        // Reviews take microseconds (cache reads), so 16 at once keeps up with any burst of pod
        // creations, and bounds what bodies hold to 16 x `max_body` = 48 MiB.
        max_reviews_in_flight: 16,
        // The API server refuses a request body over 3 MiB (its `MaxRequestBodyBytes` default)
        // and etcd stores at most 1.5 MiB (`--max-request-bytes`): any pod that can exist fits,
        // with over 1 MiB left for the review around it.
        max_body: 3 * 1024 * 1024,
        // The API server's request line and headers are a few hundred bytes.
        max_head: 16 * 1024,
    };
}

/// TLS 1.3 and 1.2 only, said here rather than left to rustls' default (the same two versions
/// today): rustls implements nothing older. A TLS 1.1 or 1.0 ClientHello is refused with a fatal
/// alert: `protocol_version`, or `handshake_failure` when it lacks `signature_algorithms` (as
/// OpenSSL's does), which rustls checks first.
const PROTOCOL_VERSIONS: &[&SupportedProtocolVersion] = &[&version::TLS13, &version::TLS12];

/// The cipher suites offered, pinned so a rustls upgrade cannot widen them unnoticed: ring's
/// defaults, all AEAD with forward secrecy (ECDHE); the TLS 1.2 ones for the controller's own
/// ECDSA certificate and for an RSA one from cert-manager.
const CIPHER_SUITES: &[SupportedCipherSuite] = &[
    suites::TLS13_AES_256_GCM_SHA384,
    suites::TLS13_AES_128_GCM_SHA256,
    suites::TLS13_CHACHA20_POLY1305_SHA256,
    suites::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    suites::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    suites::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    suites::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    suites::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    suites::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
];

/// What a request's declared `Content-Length` allows: `Ok` to read the body (none declared:
/// chunked, cut off at `max_body` while reading), else the status to answer without reading it.
pub fn declared_length(headers: &HeaderMap, max_body: usize) -> Result<(), StatusCode> {
    let Some(value) = headers.get(CONTENT_LENGTH) else {
        return Ok(());
    };
    match value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        Some(n) if n > max_body as u64 => Err(StatusCode::PAYLOAD_TOO_LARGE),
        Some(_) => Ok(()),
        None => Err(StatusCode::BAD_REQUEST),
    }
}

/// What the webhook reads: the controller's caches and its default.
#[derive(Clone)]
pub struct Caches {
    /// Every IPReservation in the watched scope, projected.
    pub reservations: Store<CachedReservation>,
    /// StatefulSets' metadata (their own ipkeep annotations).
    pub statefulsets: Store<PartialObjectMeta<StatefulSet>>,
    /// Nodes, trimmed to their labels and pod CIDRs.
    pub nodes: Store<Node>,
    /// `--default-placement`.
    pub default_mode: Mode,
}

impl std::fmt::Debug for Caches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caches")
            .field("default_mode", &self.default_mode)
            .finish_non_exhaustive()
    }
}

/// The webhook's metrics.
#[derive(Debug, Clone)]
pub struct WebhookMetrics {
    /// Admission reviews answered, by result: `preferred`, `required` (a term added), `skipped`
    /// (asked, nothing added), `pass` (nothing asked), `error` (unreadable review, answered unchanged).
    pub admissions: IntCounterVec,
    /// Connections being served (at most [`Limits::max_connections`]).
    pub connections: IntGauge,
}

impl WebhookMetrics {
    /// Creates and registers the metrics.
    pub fn register(registry: &Registry) -> Result<WebhookMetrics, prometheus::Error> {
        let admissions = IntCounterVec::new(
            Opts::new(
                "ipkeep_webhook_admissions_total",
                "Pod admission reviews the placement webhook answered, by result.",
            ),
            &["result"],
        )?;
        registry.register(Box::new(admissions.clone()))?;
        let connections = IntGauge::new(
            "ipkeep_webhook_connections",
            "Connections the placement webhook is serving.",
        )?;
        registry.register(Box::new(connections.clone()))?;
        Ok(WebhookMetrics {
            admissions,
            connections,
        })
    }
}

/// The serving certificate, swapped in place when it is renewed.
#[derive(Debug, Default)]
pub struct CertSlot(RwLock<Option<Arc<CertifiedKey>>>);

impl CertSlot {
    /// Serves `key` from now on.
    pub fn set(&self, key: Arc<CertifiedKey>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Some(key);
    }

    /// Whether a certificate is loaded.
    pub fn is_loaded(&self) -> bool {
        self.0.read().unwrap_or_else(|e| e.into_inner()).is_some()
    }
}

/// The controller is Ready only once the webhook can answer.
impl Gate for CertSlot {
    fn open(&self) -> bool {
        self.is_loaded()
    }
}

impl ResolvesServerCert for CertSlot {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Errors of the webhook server.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// The listen address could not be bound.
    #[error("failed to listen on {addr} for the placement webhook")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// rustls refused the configuration.
    #[error("failed to set up TLS for the placement webhook")]
    Tls(#[source] tokio_rustls::rustls::Error),
}

/// A bound webhook server; [`WebhookServer::run`] serves until `shutdown` completes.
pub struct WebhookServer {
    listener: TcpListener,
    acceptor: TlsAcceptor,
    limits: Limits,
}

impl std::fmt::Debug for WebhookServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookServer")
            .field("listener", &self.listener)
            .finish_non_exhaustive()
    }
}

/// The webhook bound and not yet serving: what [`super::run`] starts once the probes are bound.
pub(super) struct Serving {
    server: WebhookServer,
    slot: Arc<CertSlot>,
    metrics: WebhookMetrics,
    tls: TlsSource,
    caches: Caches,
}

impl Serving {
    /// Binds the webhook's address and registers its metrics; `/readyz` waits for its
    /// certificate.
    pub(super) async fn bind(
        settings: &WebhookSettings,
        caches: &super::watches::Caches,
        controller: &Settings,
        registry: &Registry,
        readiness: &Readiness,
    ) -> Result<Serving, ControllerError> {
        let slot = Arc::new(CertSlot::default());
        let server = WebhookServer::bind(settings.addr, slot.clone()).await?;
        let metrics = WebhookMetrics::register(registry).map_err(MetricsError)?;
        readiness.require(slot.clone());
        Ok(Serving {
            server,
            slot,
            metrics,
            tls: settings.tls.clone(),
            caches: Caches {
                reservations: caches.reservations.clone(),
                statefulsets: caches.statefulsets.clone(),
                nodes: caches.nodes.clone(),
                default_mode: controller.defaults.placement,
            },
        })
    }

    /// The address bound.
    pub(super) fn local_addr(&self) -> Option<SocketAddr> {
        self.server.local_addr()
    }

    /// Serves reviews, and keeps the certificate, on `tasks` until `stop` turns true.
    pub(super) fn spawn(
        self,
        tasks: &mut JoinSet<()>,
        client: &Client,
        stop: &watch::Receiver<bool>,
    ) {
        let run = self
            .server
            .run(self.caches, self.metrics, stopped(stop.clone()));
        tasks.spawn(run);
        tasks.spawn(keep(
            client.clone(),
            self.tls,
            self.slot,
            stopped(stop.clone()),
        ));
    }
}

impl WebhookServer {
    /// Binds `addr`; connections are served with whatever certificate `certs` holds at the time,
    /// within [`Limits::STANDARD`].
    pub async fn bind(
        addr: SocketAddr,
        certs: Arc<CertSlot>,
    ) -> Result<WebhookServer, WebhookError> {
        WebhookServer::bind_with(addr, certs, Limits::STANDARD).await
    }

    /// [`WebhookServer::bind`] with other limits (tests use short ones).
    pub async fn bind_with(
        addr: SocketAddr,
        certs: Arc<CertSlot>,
        limits: Limits,
    ) -> Result<WebhookServer, WebhookError> {
        let provider = Arc::new(CryptoProvider {
            cipher_suites: CIPHER_SUITES.to_vec(),
            ..default_provider()
        });
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(PROTOCOL_VERSIONS)
            .map_err(WebhookError::Tls)?
            .with_no_client_auth()
            .with_cert_resolver(certs);
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| WebhookError::Bind { addr, source })?;
        Ok(WebhookServer {
            listener,
            acceptor: TlsAcceptor::from(Arc::new(config)),
            limits,
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serves admission reviews until `shutdown` completes; connection errors are logged.
    pub async fn run(
        self,
        caches: Caches,
        metrics: WebhookMetrics,
        shutdown: impl Future<Output = ()>,
    ) {
        let limits = self.limits;
        let shared = Arc::new(Shared {
            caches,
            metrics,
            limits,
            reviews: Semaphore::new(limits.max_reviews_in_flight),
        });
        let acceptor = self.acceptor;
        accept_until(
            &self.listener,
            "webhook",
            shutdown,
            Some(limits.max_connections),
            |stream| {
                let acceptor = acceptor.clone();
                let shared = shared.clone();
                async move {
                    let _open = OpenConnection::count(&shared.metrics.connections);
                    // The handshake is the first thing a slow client can drag out.
                    let tls = match tokio::time::timeout(
                        shared.limits.head_timeout,
                        acceptor.accept(stream),
                    )
                    .await
                    {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, "webhook TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!("webhook TLS handshake timed out");
                            return;
                        }
                    };
                    let served = shared.clone();
                    let service = service_fn(move |req: Request<Incoming>| {
                        let shared = served.clone();
                        async move { Ok::<_, Infallible>(serve_within_deadline(req, &shared).await) }
                    });
                    if let Err(e) = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(shared.limits.head_timeout)
                        .max_buf_size(shared.limits.max_head)
                        .serve_connection(TokioIo::new(tls), service)
                        .await
                    {
                        tracing::debug!(error = %e, "webhook connection ended with an error");
                    }
                }
            },
        )
        .await;
    }
}

/// What every connection's requests share.
struct Shared {
    caches: Caches,
    metrics: WebhookMetrics,
    limits: Limits,
    /// Permits to read and answer a review: [`Limits::max_reviews_in_flight`].
    reviews: Semaphore,
}

/// Counts a connection in [`WebhookMetrics::connections`] while it lives.
struct OpenConnection(IntGauge);

impl OpenConnection {
    fn count(gauge: &IntGauge) -> OpenConnection {
        gauge.inc();
        OpenConnection(gauge.clone())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// [`serve`] within [`Limits::request_deadline`]; past it, 408 and the connection closed.
async fn serve_within_deadline(req: Request<Incoming>, shared: &Shared) -> Response<Full<Bytes>> {
    match tokio::time::timeout(shared.limits.request_deadline, serve(req, shared)).await {
        Ok(response) => response,
        Err(_) => {
            shared
                .metrics
                .admissions
                .with_label_values(&["error"])
                .inc();
            closing(reply(
                StatusCode::REQUEST_TIMEOUT,
                TEXT,
                b"the request took longer than the webhook's deadline\n".to_vec(),
            ))
        }
    }
}

/// `response` with `Connection: close`: after a body left unread, the connection cannot carry
/// another request, and hyper then closes it instead of reading the rest.
fn closing(mut response: Response<Full<Bytes>>) -> Response<Full<Bytes>> {
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

async fn serve(req: Request<Incoming>, shared: &Shared) -> Response<Full<Bytes>> {
    let (caches, metrics, max_body) = (&shared.caches, &shared.metrics, shared.limits.max_body);
    if req.uri().path() != PATH {
        return reply(
            StatusCode::NOT_FOUND,
            TEXT,
            b"not found: the webhook serves POST /mutate-pods\n".to_vec(),
        );
    }
    if req.method() != Method::POST {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            TEXT,
            b"only POST\n".to_vec(),
        );
    }
    if let Err(status) = declared_length(req.headers(), max_body) {
        metrics.admissions.with_label_values(&["error"]).inc();
        return too_large_or_bad(status, max_body);
    }
    // The semaphore is never closed; holding the permit bounds the bodies held at once.
    let Ok(_permit) = shared.reviews.acquire().await else {
        return closing(reply(
            StatusCode::SERVICE_UNAVAILABLE,
            TEXT,
            b"the webhook is shutting down\n".to_vec(),
        ));
    };
    let body = match Limited::new(req.into_body(), max_body).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            metrics.admissions.with_label_values(&["error"]).inc();
            if e.is::<LengthLimitError>() {
                return too_large_or_bad(StatusCode::PAYLOAD_TOO_LARGE, max_body);
            }
            return closing(reply(
                StatusCode::BAD_REQUEST,
                TEXT,
                format!("failed to read the body: {e}\n").into_bytes(),
            ));
        }
    };
    let (answer, result) = review(&body, caches);
    metrics.admissions.with_label_values(&[result]).inc();
    match serde_json::to_vec(&answer) {
        Ok(json) => reply(StatusCode::OK, "application/json", json),
        Err(e) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            TEXT,
            format!("failed to encode the review: {e}\n").into_bytes(),
        ),
    }
}

const TEXT: &str = "text/plain";

/// The answer to a body refused unread: 413 naming the limit, or 400 for a length that is no
/// number.
fn too_large_or_bad(status: StatusCode, max_body: usize) -> Response<Full<Bytes>> {
    let text = if status == StatusCode::PAYLOAD_TOO_LARGE {
        format!("the body is larger than the webhook reads ({max_body} bytes)\n")
    } else {
        "the Content-Length is not a number\n".to_string()
    };
    closing(reply(status, TEXT, text.into_bytes()))
}

/// Answers one AdmissionReview (JSON) and says which result it counts as.
pub fn review(
    body: &[u8],
    caches: &Caches,
) -> (AdmissionReview<kube::core::DynamicObject>, &'static str) {
    let request: AdmissionRequest<Pod> = match serde_json::from_slice::<AdmissionReview<Pod>>(body)
        .map_err(|e| e.to_string())
        .and_then(|r| {
            r.try_into()
                .map_err(|e: kube::core::admission::ConvertAdmissionReviewError| e.to_string())
        }) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "unreadable admission review");
            return (AdmissionResponse::invalid(e).into_review(), "error");
        }
    };
    let allowed = AdmissionResponse::from(&request);
    let pod = match (&request.operation, &request.object) {
        (Operation::Create, Some(pod)) => pod,
        _ => return (allowed.into_review(), "pass"),
    };
    let decision = decide(&request, pod, caches);
    let result = match &decision {
        Decision::Pass => "pass",
        Decision::Place {
            mode: Mode::Required,
            ..
        } => "required",
        Decision::Place { .. } => "preferred",
        Decision::Skip(_) => "skipped",
    };
    if let Decision::Skip(why) = &decision {
        tracing::info!(namespace = request.namespace.as_deref().unwrap_or(""), pod = %request.name, %why, "placement skipped");
    }
    let ops = placement::patch(&decision, pod.metadata.annotations.is_some());
    if ops.is_empty() {
        return (allowed.into_review(), result);
    }
    let patched = serde_json::from_value::<json_patch::Patch>(serde_json::Value::Array(ops))
        .map_err(|e| e.to_string())
        .and_then(|p| allowed.clone().with_patch(p).map_err(|e| e.to_string()));
    match patched {
        Ok(r) => (r.into_review(), result),
        Err(e) => {
            tracing::warn!(error = %e, "failed to build the placement patch; the pod is admitted unchanged");
            (allowed.into_review(), "error")
        }
    }
}

fn decide(request: &AdmissionRequest<Pod>, pod: &Pod, caches: &Caches) -> Decision {
    // A generated name (generateName) is empty here, and a name that never returns has nothing
    // to return to.
    let name = pod
        .metadata
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .unwrap_or(request.name.as_str());
    let namespace = request
        .namespace
        .as_deref()
        .or(pod.metadata.namespace.as_deref())
        .unwrap_or("default");
    if name.is_empty() {
        return Decision::Pass;
    }
    let owner = view::pod_owner_statefulset(pod).and_then(|sts| {
        caches
            .statefulsets
            .get(&ObjectRef::new(&sts).within(namespace))
    });
    let empty = Default::default();
    let opt_in = optin::opt_in(
        pod.metadata.annotations.as_ref().unwrap_or(&empty),
        owner.as_ref().and_then(|o| o.metadata.annotations.as_ref()),
    );
    let reservation = caches
        .reservations
        .get(&ObjectRef::new(name).within(namespace));
    let reservation_view = reservation.as_ref().map(|r| &r.view);
    let node = reservation_view.and_then(|r| caches.nodes.get(&ObjectRef::new(&r.node_name)));
    let spec = pod.spec.as_ref();
    placement::decide(&PlacementRequest {
        retain: opt_in.retain,
        mode: opt_in.placement_or(caches.default_mode),
        reservation_node: reservation_view.map(|r| r.node_name.as_str()),
        reservation_by_hand: reservation_view.is_some_and(|r| !r.managed),
        node: node.as_ref().map(|n| NodeFacts {
            name: n.metadata.name.as_deref().unwrap_or(""),
            labels: n.metadata.labels.as_ref().unwrap_or(&empty),
        }),
        pod: PodScheduling {
            node_name: spec.and_then(|s| s.node_name.as_deref()),
            node_selector: spec.and_then(|s| s.node_selector.as_ref()),
            affinity: spec.and_then(|s| s.affinity.as_ref()),
        },
    })
}
