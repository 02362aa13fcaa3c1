//! A private OCI registry on this machine, as a user's private registry is: the distribution
//! project's `registry` (`make registry-bin`) serving HTTPS with a certificate from a CA of its
//! own, and one htpasswd login (bcrypt: the only hash it accepts). `make publish` is tested
//! against it, and the real nodes pull ipkeep's image and chart from it.
//!
//! ```text
//! let registry = Registry::start().await?;            // ready: GET /v2/ answers 401
//! registry.addr();                                    // "127.0.0.1:<port>", for pushes from here
//! registry.addr_at(slot.host_ip());                   // "198.18.<s>.1:<port>", for the nodes
//! registry.ca_file();                                 // the CA its certificate chains to
//! registry.username(); registry.password();           // the login
//! registry.auth_file();                               // REGISTRY_AUTH_FILE / HELM_REGISTRY_CONFIG
//! ```
//!
//! It listens on every address of the host (`0.0.0.0`): the nodes of any slot reach it at their
//! bridge's host address, which its certificate names for every slot, beside `127.0.0.1`, `::1`
//! and `localhost`. Its storage, keys and login live in a private state directory; dropping the
//! [`Registry`] stops it and removes that directory, the death of its owner does too (the
//! watchdog of [`super::process`]), and a directory left by an owner killed with its watchdog is
//! removed, its process killed, by the next start ([`super::plane::reap_stale`]: the directory is
//! named like a control plane's).

use std::{
    io::Read as _,
    net::{Ipv4Addr, SocketAddrV4, TcpListener},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_rustls::{
    TlsConnector,
    rustls::{
        self, ClientConfig, RootCertStore,
        pki_types::{CertificateDer, ServerName, pem::PemObject as _},
    },
};

use super::{
    pki::{Pki, PkiError},
    plane::{STATE_DIR_PREFIX, reap_stale},
    process::{Component, LOG_TAIL_LINES, ProcessError, Spawner, Watchdog, log_tail},
    realnode::layout::{MAX_SLOTS, Slot},
};
use crate::command::{self, CommandError, Stdin};

/// The binaries `make registry-bin` builds.
pub const REGISTRY_BINARIES: [&str; 2] = ["registry", "registry-htpasswd"];
/// The login's user name.
pub const USERNAME: &str = "ipkeep-e2e";
/// How long the registry may take to answer `/v2/` (a busy 2-core machine, a cold page cache).
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Failures of the registry.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The script that names the binaries' directory failed.
    #[error("failed to find the registry's binaries with {script}")]
    BinDir {
        /// `e2e/cluster/build.sh`.
        script: PathBuf,
        /// Why.
        #[source]
        source: CommandError,
    },
    /// A binary is missing.
    #[error(
        "failed to find the registry: {dir} has no {missing}; run: make registry-bin (or set IPKEEP_REGISTRY_BIN_DIR)"
    )]
    BinariesMissing {
        /// The directory looked in.
        dir: PathBuf,
        /// The first binary missing.
        missing: String,
    },
    /// The state directory or a file in it could not be made.
    #[error("failed to {action} {path}")]
    StateDir {
        /// What was attempted.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The CA or the serving certificate.
    #[error("failed to make the registry's certificates")]
    Pki(#[from] PkiError),
    /// Starting the process or its watchdog.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// `registry-htpasswd` failed.
    #[error("failed to hash the registry's login")]
    Htpasswd(#[source] CommandError),
    /// No port could be found.
    #[error("failed to find a free port for the registry")]
    NoFreePort(#[source] std::io::Error),
    /// It exited before it answered.
    #[error("the registry exited ({status}) before it answered; last lines of {log}:\n{tail}")]
    Exited {
        /// How it exited.
        status: std::process::ExitStatus,
        /// Its log.
        log: PathBuf,
        /// The end of its log.
        tail: String,
    },
    /// It did not answer `/v2/` with 401 in time.
    #[error(
        "the registry did not answer GET /v2/ with 401 within {}s (last: {last}); last lines of {log}:\n{tail}",
        waited.as_secs()
    )]
    NotReady {
        /// How long it was waited for.
        waited: Duration,
        /// The last answer or error.
        last: String,
        /// Its log.
        log: PathBuf,
        /// The end of its log.
        tail: String,
    },
    /// The CA file could not be read as PEM certificates.
    #[error("failed to read the CA certificate {path}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// rustls refused the CA.
    #[error("failed to trust the CA certificate {path}")]
    Tls {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: rustls::Error,
    },
    /// The connection or the TLS handshake failed.
    #[error("failed to connect to the registry at {addr}")]
    Connect {
        /// `host:port`.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP exchange failed.
    #[error("failed to GET {path} from the registry")]
    Request {
        /// The request's path.
        path: String,
        /// Why.
        #[source]
        source: hyper::Error,
    },
    /// The request could not be built (a path that is no URI path).
    #[error("failed to build the request GET {path}")]
    BadRequest {
        /// The request's path.
        path: String,
        /// Why.
        #[source]
        source: http::Error,
    },
}

fn state_err(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> RegistryError {
    let path = path.to_owned();
    move |source| RegistryError::StateDir {
        action,
        path,
        source,
    }
}

/// The directory of the registry's binaries: `IPKEEP_REGISTRY_BIN_DIR`, else what
/// `e2e/cluster/build.sh --print-registry-bin-dir` names; checked to hold both binaries.
pub fn bin_dir() -> Result<PathBuf, RegistryError> {
    let dir = match std::env::var_os("IPKEEP_REGISTRY_BIN_DIR").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("cluster/build.sh");
            let out = command::stdout_of(
                std::process::Command::new(&script).arg("--print-registry-bin-dir"),
                Stdin::Empty,
            )
            .map_err(|source| RegistryError::BinDir { script, source })?;
            PathBuf::from(out.trim())
        }
    };
    match REGISTRY_BINARIES.iter().find(|b| !dir.join(b).is_file()) {
        Some(b) => Err(RegistryError::BinariesMissing {
            dir,
            missing: (*b).to_owned(),
        }),
        None => Ok(dir),
    }
}

/// A running registry; dropping it stops it and removes its state (see the module docs).
pub struct Registry {
    state_dir: PathBuf,
    port: u16,
    ca_file: PathBuf,
    password: String,
    auth_file: PathBuf,
    tls: TlsConnector,
    process: Option<Component>,
    watchdog: Watchdog,
    // Dropped last: the parent-death signal of the registry is tied to this thread.
    spawner: Spawner,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("addr", &self.addr())
            .field("state_dir", &self.state_dir)
            .finish_non_exhaustive()
    }
}

static STATE_DIR_SEQ: AtomicU64 = AtomicU64::new(0);

/// Free ports are found by binding port 0 and letting go, so another process can take one
/// before the registry binds it: a start that then fails with "address already in use" is
/// tried again on a new port, this many times in all.
const START_ATTEMPTS: u32 = 3;

impl Registry {
    /// Starts a registry with a new CA, certificate, login and empty storage, and returns once
    /// `GET /v2/` answers 401 (the login is asked for).
    pub async fn start() -> Result<Registry, RegistryError> {
        let bin_dir = bin_dir()?;
        let parent = std::env::temp_dir();
        for line in reap_stale(&parent) {
            eprintln!("ipkeep-e2e registry: {line}");
        }
        let mut attempt = 1;
        loop {
            match Self::start_once(&bin_dir, &parent).await {
                Err(RegistryError::Exited { tail, .. })
                    if attempt < START_ATTEMPTS && tail.contains("address already in use") =>
                {
                    eprintln!(
                        "ipkeep-e2e registry: another process took the port picked for it (attempt {attempt}); retrying on a new port"
                    );
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn start_once(bin_dir: &Path, parent: &Path) -> Result<Registry, RegistryError> {
        let state_dir = parent.join(format!(
            "{STATE_DIR_PREFIX}registry-{}-{}",
            std::process::id(),
            STATE_DIR_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        // Private: it holds the CA key and the login. create (not _all): an existing directory,
        // or a symlink planted in its place, is refused rather than reused.
        std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
            .create(&state_dir)
            .map_err(state_err("create", &state_dir))?;
        let port = free_port()?;
        // Until the watchdog runs, a failure removes the directory here.
        let prepared = write_state(&state_dir, bin_dir, port).and_then(|state| {
            let spawner =
                Spawner::new().map_err(state_err("start the spawner thread for", &state_dir))?;
            let watchdog = Watchdog::start(&spawner, &state_dir, &[])?;
            Ok((state, spawner, watchdog))
        });
        let (state, spawner, watchdog) = match prepared {
            Ok(prepared) => prepared,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&state_dir);
                return Err(e);
            }
        };
        let mut registry = Registry {
            state_dir,
            port,
            ca_file: state.ca_file,
            password: state.password,
            auth_file: state.auth_file,
            tls: state.tls,
            process: None,
            watchdog,
            spawner,
        };
        // From here on, a failure drops `registry`: whatever started is stopped and removed.
        let log = registry.log();
        // OTEL_TRACES_EXPORTER=none: registry v3 otherwise exports traces to localhost:4318 and
        // logs every failure to (distribution issue #4270).
        let process = Component::start(
            &registry.spawner,
            "registry",
            Path::new("/usr/bin/env"),
            &[
                "OTEL_TRACES_EXPORTER=none".to_owned(),
                bin_dir.join("registry").display().to_string(),
                "serve".to_owned(),
                state.config.display().to_string(),
            ],
            &log,
            &registry.state_dir.join("pgids"),
        )?;
        registry.process = Some(process);
        registry.wait_ready(&log).await?;
        if let Some(p) = &registry.process {
            p.announce_death();
        }
        Ok(registry)
    }

    async fn wait_ready(&self, log: &Path) -> Result<(), RegistryError> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.process.as_ref().and_then(Component::exit_status) {
                return Err(RegistryError::Exited {
                    status,
                    log: log.to_owned(),
                    tail: log_tail(log, LOG_TAIL_LINES),
                });
            }
            let last = match self.get("/v2/", "application/json", None).await {
                Ok(r) if r.status() == http::StatusCode::UNAUTHORIZED => return Ok(()),
                Ok(r) => format!("HTTP {}", r.status()),
                Err(e) => crate::error_chain(&e),
            };
            if started.elapsed() > READY_TIMEOUT {
                return Err(RegistryError::NotReady {
                    waited: started.elapsed(),
                    last,
                    log: log.to_owned(),
                    tail: log_tail(log, LOG_TAIL_LINES),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Where this machine reaches it: `127.0.0.1:<port>` (pushes, the tests' reads).
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Where a node reaches it: `<host>:<port>`, `host` being its bridge's host address
    /// (`Slot::host_ip`); the certificate names every slot's.
    pub fn addr_at(&self, host: Ipv4Addr) -> String {
        format!("{host}:{}", self.port)
    }

    /// The CA certificate (PEM) the registry's certificate chains to: what a client trusts.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// The login's user name.
    pub fn username(&self) -> &str {
        USERNAME
    }

    /// The login's password (random, new for every registry).
    pub fn password(&self) -> &str {
        &self.password
    }

    /// The login as a containers auth file (`{"auths": {"<addr>": {"auth": ...}}}` for every
    /// address it is reached at), the format `buildah login` and `helm registry login` write:
    /// give it as `REGISTRY_AUTH_FILE` (buildah, skopeo) or `HELM_REGISTRY_CONFIG` (helm).
    pub fn auth_file(&self) -> &Path {
        &self.auth_file
    }

    /// Its log (the registry's own, one line per request).
    pub fn log(&self) -> PathBuf {
        self.state_dir.join("registry.log")
    }

    /// `GET <path>` on the registry's HTTP API (`/v2/...`) over TLS trusting its CA, with
    /// `Accept: <accept>` and, given a `(user, password)`, basic authentication; the whole
    /// answer, whatever its status.
    pub async fn get(
        &self,
        path: &str,
        accept: &str,
        login: Option<(&str, &str)>,
    ) -> Result<http::Response<Bytes>, RegistryError> {
        let addr = self.addr();
        let connect = |source| RegistryError::Connect {
            addr: addr.clone(),
            source,
        };
        let tcp = TcpStream::connect(SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port))
            .await
            .map_err(connect)?;
        let name = ServerName::from(std::net::IpAddr::from(Ipv4Addr::LOCALHOST));
        let tls = self.tls.connect(name, tcp).await.map_err(connect)?;
        let request_err = |source| RegistryError::Request {
            path: path.to_owned(),
            source,
        };
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(request_err)?;
        let driver = tokio::spawn(connection);
        let mut request = http::Request::get(path)
            .header(http::header::HOST, &addr)
            .header(http::header::ACCEPT, accept);
        if let Some((user, password)) = login {
            let token =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            request = request.header(http::header::AUTHORIZATION, format!("Basic {token}"));
        }
        let request =
            request
                .body(Empty::<Bytes>::new())
                .map_err(|source| RegistryError::BadRequest {
                    path: path.to_owned(),
                    source,
                })?;
        let response = sender.send_request(request).await.map_err(request_err)?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.map_err(request_err)?.to_bytes();
        driver.abort();
        Ok(http::Response::from_parts(parts, body))
    }

    /// Stops the registry and removes its state directory. Idempotent.
    pub fn stop(&mut self) {
        if let Some(p) = self.process.take() {
            p.stop(Duration::from_secs(5));
        }
        let _ = std::fs::remove_dir_all(&self.state_dir);
        self.watchdog.finish();
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What [`write_state`] wrote and the registry starts with.
struct State {
    ca_file: PathBuf,
    password: String,
    auth_file: PathBuf,
    tls: TlsConnector,
    config: PathBuf,
}

/// Writes the owner file, the CA and serving certificate, the login (htpasswd and auth file)
/// and the configuration into the state directory `dir`.
fn write_state(dir: &Path, bin_dir: &Path, port: u16) -> Result<State, RegistryError> {
    std::fs::write(dir.join("owner"), format!("{}\n", std::process::id()))
        .map_err(state_err("write the owner file of", dir))?;
    let pki_dir = dir.join("pki");
    std::fs::create_dir(&pki_dir).map_err(state_err("create", &pki_dir))?;
    let pki = Pki::generate_with_sans(&pki_dir, &node_addresses())?;
    let tls = tls_connector(&pki.ca_cert)?;

    let password = random_hex(16).map_err(state_err("read random bytes for", dir))?;
    let htpasswd = command::stdout_of(
        std::process::Command::new(bin_dir.join("registry-htpasswd")).arg(USERNAME),
        Stdin::Text(&format!("{password}\n")),
    )
    .map_err(RegistryError::Htpasswd)?;
    let htpasswd_file = dir.join("htpasswd");
    std::fs::write(&htpasswd_file, htpasswd).map_err(state_err("write", &htpasswd_file))?;
    let auth_file = dir.join("auth.json");
    let auth = auth_file_json(&hosts(port), USERNAME, &password);
    std::fs::write(&auth_file, auth.to_string()).map_err(state_err("write", &auth_file))?;

    let secret = random_hex(16).map_err(state_err("read random bytes for", dir))?;
    let config = dir.join("config.yml");
    let text = config_yaml(port, dir, &pki, &htpasswd_file, &secret);
    std::fs::write(&config, text).map_err(state_err("write", &config))?;
    Ok(State {
        ca_file: pki.ca_cert,
        password,
        auth_file,
        tls,
        config,
    })
}

/// Every `host:port` the registry on `port` is reached at: loopback by address and by name, and
/// each slot's bridge address.
fn hosts(port: u16) -> Vec<String> {
    let mut hosts = vec![format!("127.0.0.1:{port}"), format!("localhost:{port}")];
    hosts.extend(node_addresses().into_iter().map(|a| format!("{a}:{port}")));
    hosts
}

/// Every slot's host address on its bridge: where the nodes of any real-node cluster reach it.
fn node_addresses() -> Vec<String> {
    (0..MAX_SLOTS)
        .filter_map(Slot::new)
        .map(|s| s.host_ip().to_string())
        .collect()
}

fn free_port() -> Result<u16, RegistryError> {
    let l = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0))
        .map_err(RegistryError::NoFreePort)?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(RegistryError::NoFreePort)
}

/// `bytes` random bytes from the kernel, as hex.
fn random_hex(bytes: usize) -> std::io::Result<String> {
    let mut raw = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut raw)?;
    Ok(raw.iter().map(|b| format!("{b:02x}")).collect())
}

fn tls_connector(ca_file: &Path) -> Result<TlsConnector, RegistryError> {
    let pem = |source| RegistryError::Pem {
        path: ca_file.to_owned(),
        source,
    };
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca_file).map_err(pem)? {
        roots
            .add(cert.map_err(pem)?)
            .map_err(|source| RegistryError::Tls {
                path: ca_file.to_owned(),
                source,
            })?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|source| RegistryError::Tls {
            path: ca_file.to_owned(),
            source,
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}

/// The containers auth file (and Helm registry configuration) logging `user` in at every host.
fn auth_file_json(hosts: &[String], user: &str, password: &str) -> serde_json::Value {
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let auths: serde_json::Map<String, serde_json::Value> = hosts
        .iter()
        .map(|h| (h.clone(), serde_json::json!({ "auth": auth })))
        .collect();
    serde_json::json!({ "auths": auths })
}

/// The registry's configuration: filesystem storage in the state directory, HTTPS on every
/// address at `port`, htpasswd authentication.
fn config_yaml(port: u16, dir: &Path, pki: &Pki, htpasswd: &Path, secret: &str) -> String {
    format!(
        "version: 0.1\n\
         log:\n  level: info\n  fields:\n    service: ipkeep-e2e-registry\n\
         storage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: true\n\
         http:\n  addr: 0.0.0.0:{port}\n  secret: {secret}\n  tls:\n    certificate: {cert}\n    key: {key}\n\
         auth:\n  htpasswd:\n    realm: ipkeep-e2e-registry\n    path: {htpasswd}\n",
        storage = dir.join("storage").display(),
        cert = pki.serving.cert.display(),
        key = pki.serving.key.display(),
        htpasswd = htpasswd.display(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_auth_file_logs_in_at_every_host_as_buildah_and_helm_read_it() {
        let hosts = vec!["127.0.0.1:5000".to_owned(), "198.18.3.1:5000".to_owned()];
        let auth = auth_file_json(&hosts, "ipkeep-e2e", "secret");
        // base64("ipkeep-e2e:secret")
        let want = "aXBrZWVwLWUyZTpzZWNyZXQ=";
        for h in &hosts {
            assert_eq!(auth["auths"][h]["auth"], want, "{auth}");
        }
        assert_eq!(auth["auths"].as_object().map(|m| m.len()), Some(2));
    }

    #[test]
    fn the_certificate_names_every_slots_host_address() {
        let addresses = node_addresses();
        assert_eq!(addresses.len(), usize::from(MAX_SLOTS));
        assert_eq!(addresses[0], "198.18.0.1");
        assert!(addresses.contains(&format!("198.18.{}.1", MAX_SLOTS - 1)));
    }
}
