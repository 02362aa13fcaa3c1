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
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, Response, StatusCode, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
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
use prometheus::{IntCounterVec, Opts, Registry};
use tokio::{net::TcpListener, sync::watch, task::JoinSet};
use tokio_rustls::{
    TlsAcceptor,
    rustls::{
        ServerConfig,
        server::{ClientHello, ResolvesServerCert},
        sign::CertifiedKey,
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
/// The largest AdmissionReview read (a pod is at most about 1.5 MiB in etcd).
const MAX_BODY: usize = 3 * 1024 * 1024;

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
        Ok(WebhookMetrics { admissions })
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
    /// Binds `addr`; connections are served with whatever certificate `certs` holds at the time.
    pub async fn bind(
        addr: SocketAddr,
        certs: Arc<CertSlot>,
    ) -> Result<WebhookServer, WebhookError> {
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
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
        let shared = Arc::new((caches, metrics));
        let acceptor = self.acceptor;
        accept_until(&self.listener, "webhook", shutdown, |stream| {
            let acceptor = acceptor.clone();
            let shared = shared.clone();
            async move {
                let tls = match acceptor.accept(stream).await {
                    Ok(tls) => tls,
                    Err(e) => {
                        tracing::debug!(error = %e, "webhook TLS handshake failed");
                        return;
                    }
                };
                let service = service_fn(move |req: Request<Incoming>| {
                    let shared = shared.clone();
                    async move { Ok::<_, Infallible>(serve(req, &shared.0, &shared.1).await) }
                });
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await
                {
                    tracing::debug!(error = %e, "webhook connection ended with an error");
                }
            }
        })
        .await;
    }
}

async fn serve(
    req: Request<Incoming>,
    caches: &Caches,
    metrics: &WebhookMetrics,
) -> Response<Full<Bytes>> {
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
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            metrics.admissions.with_label_values(&["error"]).inc();
            return reply(
                StatusCode::BAD_REQUEST,
                TEXT,
                format!("failed to read the body: {e}\n").into_bytes(),
            );
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
