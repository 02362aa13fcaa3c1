//! A fault-injecting proxy between Kubernetes clients and the real kube-apiserver, as
//! controller-runtime's envtest users put one: our components talk to it through a kubeconfig
//! that points at it, and the test adds and clears [`Rule`]s while they run — an HTTP error with a
//! `Status` body (500, 409, 429 with `Retry-After`, 503), a watch answered with `410 Expired`, a
//! watch stream ended after N events, added latency, a request that hangs — and can close every
//! watch, drop every connection, or refuse connections for a while (what a client sees of an API
//! server restart; [`crate::cluster::ControlPlane::restart_component`] restarts the real one).
//!
//! TLS on both sides: clients get a certificate signed by the plane's CA (the API server's own
//! serving certificate, so whatever trusts the plane trusts the proxy); the proxy trusts the same
//! CA upstream. It passes each request's `Authorization` header on unchanged, so a bearer-token
//! client (a ServiceAccount token kubeconfig, see [`FaultProxy::kubeconfig_through`]) keeps its
//! identity and exactly its RBAC. A client-certificate identity cannot be passed on: such a
//! client reaches the API server anonymous.

mod admin;
mod forward;
pub mod rules;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use tokio::{net::TcpListener, sync::watch, task::JoinHandle};
use tokio_rustls::{
    TlsAcceptor, TlsConnector,
    rustls::{
        self, ClientConfig, RootCertStore, ServerConfig,
        pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject},
    },
};

pub use admin::AdminServer;
pub use rules::{Fault, Match, RequestInfo, Rule, RuleEntry, RuleId, RuleSet, Verb};

use crate::cluster::{
    ControlPlane,
    kubeconfig::{KubeconfigWriteError, write_kubeconfig},
};
use forward::Upstream;

/// Failures to start the proxy or to point a kubeconfig through it.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// A certificate or key file could not be read.
    #[error("failed to read the PEM file {path}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// The TLS configuration was refused.
    #[error("failed to configure TLS with {what}")]
    Tls {
        /// Which certificates.
        what: String,
        /// Why.
        #[source]
        source: rustls::Error,
    },
    /// The upstream URL is not `https://HOST:PORT`.
    #[error("invalid kube-apiserver URL {0:?}: want https://HOST:PORT")]
    Upstream(String),
    /// The listening socket.
    #[error("failed to listen on {addr}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A kubeconfig to rewrite could not be read or parsed.
    #[error("failed to read the kubeconfig {path}: {why}")]
    ReadKubeconfig {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        why: String,
    },
    /// Writing the rewritten kubeconfig.
    #[error(transparent)]
    WriteKubeconfig(#[from] KubeconfigWriteError),
}

/// Where the proxy listens, what it forwards to and with which certificates.
#[derive(Debug, Clone)]
pub struct ProxyOptions {
    /// The address to listen on (port 0: a free one).
    pub listen: SocketAddr,
    /// kube-apiserver's URL, `https://HOST:PORT`.
    pub upstream: String,
    /// The CA kube-apiserver's certificate chains to.
    pub upstream_ca: PathBuf,
    /// The certificate the proxy shows its clients (PEM, chain first).
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
}

/// What the accept loop, the connections and the handle share.
#[derive(Debug)]
struct Shared {
    rules: Mutex<RuleSet>,
    /// Bumped on every removal, so hanging requests look again.
    rules_changed: watch::Sender<u64>,
    /// Bumped to end every open watch stream cleanly.
    close_watches: watch::Sender<u64>,
    /// Bumped to drop every client connection.
    drop_connections: watch::Sender<u64>,
    upstream: Upstream,
}

impl Shared {
    fn rules(&self) -> MutexGuard<'_, RuleSet> {
        // A poisoned lock only means a test thread panicked; the rules are still usable.
        self.rules.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take_fault(&self, info: &RequestInfo) -> Option<(RuleId, Fault)> {
        self.rules().take(info)
    }

    fn has_rule(&self, id: RuleId) -> bool {
        self.rules().contains(id)
    }

    fn bump(sender: &watch::Sender<u64>) {
        sender.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// A request to the accept loop: refuse connections for `down`, then say so on `done`.
#[derive(Debug)]
struct Outage {
    down: Duration,
    done: tokio::sync::oneshot::Sender<()>,
}

/// A running fault proxy. Dropping it closes its port and every connection through it.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    url: String,
    shared: Arc<Shared>,
    outages: tokio::sync::mpsc::Sender<Outage>,
    accept: JoinHandle<()>,
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, ProxyError> {
    let pem = |source| ProxyError::Pem {
        path: path.to_owned(),
        source,
    };
    CertificateDer::pem_file_iter(path)
        .map_err(pem)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem)
}

fn tls_configs(options: &ProxyOptions) -> Result<(ServerConfig, ClientConfig), ProxyError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls_err = |what: &Path| {
        let what = what.display().to_string();
        move |source| ProxyError::Tls { what, source }
    };
    let key = PrivateKeyDer::from_pem_file(&options.key).map_err(|source| ProxyError::Pem {
        path: options.key.clone(),
        source,
    })?;
    let mut server = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(tls_err(&options.cert))?
        .with_no_client_auth()
        .with_single_cert(load_certs(&options.cert)?, key)
        .map_err(tls_err(&options.cert))?;
    // HTTP/1.1 only: one request at a time per connection, so a connection maps onto one
    // upstream connection and a watch onto one response.
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    let mut roots = RootCertStore::empty();
    for cert in load_certs(&options.upstream_ca)? {
        roots.add(cert).map_err(tls_err(&options.upstream_ca))?;
    }
    let mut client = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(tls_err(&options.upstream_ca))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((server, client))
}

fn upstream(options: &ProxyOptions, tls: ClientConfig) -> Result<Upstream, ProxyError> {
    let bad = || ProxyError::Upstream(options.upstream.clone());
    let authority = options
        .upstream
        .strip_prefix("https://")
        .map(|a| a.trim_end_matches('/'))
        .filter(|a| !a.is_empty() && !a.contains('/'))
        .ok_or_else(bad)?;
    let (host, _port) = authority.rsplit_once(':').ok_or_else(bad)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let server_name = ServerName::try_from(host.to_owned()).map_err(|_| bad())?;
    Ok(Upstream {
        authority: authority.to_owned(),
        server_name,
        tls: TlsConnector::from(Arc::new(tls)),
    })
}

impl FaultProxy {
    /// Starts a proxy with `options`; it serves until dropped.
    pub async fn start(options: ProxyOptions) -> Result<FaultProxy, ProxyError> {
        let (server_tls, client_tls) = tls_configs(&options)?;
        let upstream = upstream(&options, client_tls)?;
        let listener =
            TcpListener::bind(options.listen)
                .await
                .map_err(|source| ProxyError::Listen {
                    addr: options.listen,
                    source,
                })?;
        let addr = listener.local_addr().map_err(|source| ProxyError::Listen {
            addr: options.listen,
            source,
        })?;
        let shared = Arc::new(Shared {
            rules: Mutex::default(),
            rules_changed: watch::Sender::new(0),
            close_watches: watch::Sender::new(0),
            drop_connections: watch::Sender::new(0),
            upstream,
        });
        let (outages, requests) = tokio::sync::mpsc::channel(4);
        let accept = tokio::spawn(accept_loop(
            Arc::clone(&shared),
            listener,
            TlsAcceptor::from(Arc::new(server_tls)),
            requests,
        ));
        Ok(FaultProxy {
            addr,
            url: format!("https://{addr}"),
            shared,
            outages,
            accept,
        })
    }

    /// Starts a proxy on a free loopback port in front of `plane`'s API server, showing
    /// clients the API server's own certificate.
    pub async fn in_front_of(plane: &ControlPlane) -> Result<FaultProxy, ProxyError> {
        let pki = plane.pki();
        FaultProxy::start(ProxyOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            upstream: plane.server().to_owned(),
            upstream_ca: pki.ca_cert.clone(),
            cert: pki.serving.cert.clone(),
            key: pki.serving.key.clone(),
        })
        .await
    }

    /// The proxy's URL (`https://127.0.0.1:PORT`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Puts `rule` in place after the rules already there.
    pub fn add(&self, rule: Rule) -> RuleId {
        self.shared.rules().add(rule)
    }

    /// Removes one rule (a request it holds hanging is let go: its connection drops).
    pub fn remove(&self, id: RuleId) {
        self.shared.rules().remove(id);
        Shared::bump(&self.shared.rules_changed);
    }

    /// Removes every rule.
    pub fn clear(&self) {
        self.shared.rules().clear();
        Shared::bump(&self.shared.rules_changed);
    }

    /// How many requests rule `id` applied to so far (0 once removed).
    pub fn hits(&self, id: RuleId) -> usize {
        self.shared.rules().hits(id)
    }

    /// The rules in place, with their hits.
    pub fn rules(&self) -> Vec<RuleEntry> {
        self.shared.rules().entries().to_vec()
    }

    /// Ends every open watch stream cleanly now (clients see the stream end and watch again
    /// from their last resourceVersion).
    pub fn close_watches(&self) {
        Shared::bump(&self.shared.close_watches);
    }

    /// Drops every client connection now, mid-request or not.
    pub fn drop_connections(&self) {
        Shared::bump(&self.shared.drop_connections);
    }

    /// What clients see of an API server restart: every connection dropped, the port closed for
    /// `down`, then open again on the same address. Returns once it listens again.
    pub async fn outage(&self, down: Duration) {
        let (done, finished) = tokio::sync::oneshot::channel();
        if self.outages.send(Outage { down, done }).await.is_ok() {
            let _ = finished.await;
        }
    }

    /// `config` (a kube client configuration for the proxied API server) pointed at the proxy.
    pub fn config_through(&self, mut config: kube::Config) -> kube::Config {
        if let Ok(url) = self.url.parse() {
            config.cluster_url = url;
        }
        config
    }

    /// Writes to `to` the kubeconfig `from` with every cluster's server pointed at the proxy
    /// (its CA stays right: the proxy shows a certificate of the same CA).
    pub fn kubeconfig_through(&self, from: &Path, to: &Path) -> Result<(), ProxyError> {
        let read_err = |why: String| ProxyError::ReadKubeconfig {
            path: from.to_owned(),
            why,
        };
        let text = std::fs::read_to_string(from).map_err(|e| read_err(e.to_string()))?;
        let mut doc: serde_json::Value =
            serde_saphyr::from_str(&text).map_err(|e| read_err(e.to_string()))?;
        let clusters = doc
            .get_mut("clusters")
            .and_then(|c| c.as_array_mut())
            .ok_or_else(|| read_err("it has no clusters".into()))?;
        for c in clusters {
            if let Some(cluster) = c.get_mut("cluster").and_then(|c| c.as_object_mut()) {
                cluster.insert("server".into(), self.url.clone().into());
            }
        }
        write_kubeconfig(to, &doc)?;
        Ok(())
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.drop_connections();
        self.clear();
    }
}

async fn accept_loop(
    shared: Arc<Shared>,
    mut listener: TcpListener,
    tls: TlsAcceptor,
    mut outages: tokio::sync::mpsc::Receiver<Outage>,
) {
    let addr = listener.local_addr().ok();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((tcp, _)) = accepted {
                    tokio::spawn(forward::serve_connection(Arc::clone(&shared), tcp, tls.clone()));
                }
            }
            outage = outages.recv() => {
                let Some(outage) = outage else { return };
                let Some(addr) = addr else { return };
                drop(listener);
                Shared::bump(&shared.drop_connections);
                tokio::time::sleep(outage.down).await;
                // The port was ours a moment ago; another process taking it meanwhile is
                // retried for a while before the proxy gives up.
                let mut tries = 0;
                listener = loop {
                    match TcpListener::bind(addr).await {
                        Ok(l) => break l,
                        Err(e) if tries < 50 => {
                            tries += 1;
                            if tries == 1 {
                                eprintln!("ipkeep-e2e fault proxy: failed to listen on {addr} again after an outage ({e}); retrying");
                            }
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Err(e) => {
                            eprintln!("ipkeep-e2e fault proxy: failed to listen on {addr} again after an outage: {e}");
                            return;
                        }
                    }
                };
                let _ = outage.done.send(());
            }
        }
    }
}
