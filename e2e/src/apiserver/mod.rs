//! An in-memory Kubernetes API server for tests: plain HTTP on loopback, the kinds ipkeep touches
//! plus any CustomResourceDefinition, watches with resume/410/bookmarks, and fault injection.
//!
//! ```no_run
//! # async fn demo() -> Result<(), ipkeep_e2e::apiserver::ServerError> {
//! use ipkeep_e2e::apiserver::{ServerOptions, TestServer};
//! let server = TestServer::start(ServerOptions { crd_dirs: vec!["crds".into()], ..Default::default() }).await?;
//! let client = server.client();
//! server.faults().close_watches();
//! # drop(client);
//! server.shutdown().await;
//! # Ok(()) }
//! ```

mod admin;
mod api;
mod body;
mod convert;
mod discovery;
mod faults;
mod format;
mod ids;
mod patch;
mod registry;
pub mod schema;
pub mod selector;
mod server;
mod status;
mod store;
pub mod table;
mod watch;
mod write;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

pub use faults::{Faults, RequestFilter, Verb};
use serde_json::{Value, json};
use tokio::{net::TcpListener, task::JoinHandle};

use self::{api::Ctx, store::Store};

/// Why the test server could not start (or write its kubeconfig).
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The listen address could not be bound.
    #[error("failed to listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A CRD directory or file could not be read.
    #[error("failed to read CRDs from {path}")]
    ReadCrds {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A CRD file is not a valid CustomResourceDefinition.
    #[error("failed to load CRD from {path}: {reason}")]
    BadCrd {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The kube client for the server could not be built.
    #[error("failed to build a kube client for {url}")]
    Client {
        /// The server URL.
        url: String,
        /// kube's error.
        #[source]
        source: Box<kube::Error>,
    },
    /// The server URL is not a valid URI (cannot happen for a socket address, but is not unwrapped).
    #[error("failed to parse server URL {url}: {reason}")]
    Url {
        /// The URL.
        url: String,
        /// The parse error.
        reason: String,
    },
    /// The kubeconfig could not be written.
    #[error("failed to write kubeconfig {path}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// The default of [`ServerOptions::bookmark_interval`].
pub const DEFAULT_BOOKMARK_INTERVAL: Duration = Duration::from_secs(5);

/// How to start a [`TestServer`].
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Where to listen (`127.0.0.1:0`, the default, picks a free port).
    pub listen: SocketAddr,
    /// Directories whose `*.yaml`/`*.yml`/`*.json` CustomResourceDefinitions are loaded at start.
    pub crd_dirs: Vec<PathBuf>,
    /// How often a watch with `allowWatchBookmarks` gets a periodic BOOKMARK (5 s by default;
    /// kube-apiserver sends one about every minute); [`Duration::ZERO`] sends none.
    pub bookmark_interval: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            crd_dirs: Vec::new(),
            bookmark_interval: DEFAULT_BOOKMARK_INTERVAL,
        }
    }
}

/// A running API test server; dropping it stops it.
pub struct TestServer {
    addr: SocketAddr,
    ctx: Arc<Ctx>,
    client: kube::Client,
    accept: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for TestServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl TestServer {
    /// Load the CRDs, bind the address and start serving.
    pub async fn start(opts: ServerOptions) -> Result<TestServer, ServerError> {
        let mut store = Store::new();
        write::install_namespaces(&mut store).map_err(|e| ServerError::BadCrd {
            path: PathBuf::new(),
            reason: e.message,
        })?;
        for dir in &opts.crd_dirs {
            for (path, crd) in read_crds(dir)? {
                write::install_crd(&mut store, crd).map_err(|e| ServerError::BadCrd {
                    path: path.clone(),
                    reason: e.message,
                })?;
            }
        }
        let store = Arc::new(Mutex::new(store));
        let faults = Arc::new(Faults::new(store.clone()));
        let ctx = Arc::new(Ctx {
            store,
            faults,
            bookmark_interval: opts.bookmark_interval,
        });
        let listener =
            TcpListener::bind(opts.listen)
                .await
                .map_err(|source| ServerError::Bind {
                    addr: opts.listen,
                    source,
                })?;
        let addr = listener.local_addr().map_err(|source| ServerError::Bind {
            addr: opts.listen,
            source,
        })?;
        let url = format!("http://{addr}");
        let client = make_client(&url)?;
        let accept = tokio::spawn(server::accept_loop(listener, addr, ctx.clone()));
        Ok(TestServer {
            addr,
            ctx,
            client,
            accept: Mutex::new(Some(accept)),
        })
    }

    /// The base URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A `kube::Client` for this server (no retries, default namespace `default`).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// Write a kubeconfig pointing at this server (for kubectl), with namespace `default`.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), ServerError> {
        // JSON is valid YAML, and kubectl reads it as a kubeconfig.
        let config = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "ipkeep-e2e", "cluster": {"server": self.url()}}],
            "users": [{"name": "ipkeep-e2e", "user": {}}],
            "contexts": [{"name": "ipkeep-e2e", "context": {"cluster": "ipkeep-e2e", "user": "ipkeep-e2e", "namespace": "default"}}],
            "current-context": "ipkeep-e2e",
            "preferences": {}
        });
        std::fs::write(path, format!("{config:#}\n")).map_err(|source| ServerError::Kubeconfig {
            path: path.to_path_buf(),
            source,
        })
    }

    /// The fault-injection controls.
    pub fn faults(&self) -> &Faults {
        &self.ctx.faults
    }

    /// Stop listening and drop every connection (and watch), keeping all data.
    pub async fn pause(&self) {
        let handle = self.accept.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(handle) = handle {
            handle.abort();
            // The task was aborted on purpose; its JoinError says only that.
            let _ = handle.await;
        }
        self.ctx.store().close_watches();
    }

    /// Listen again on the same port after [`TestServer::pause`].
    pub async fn resume(&self) -> Result<(), ServerError> {
        let mut slot = self.accept.lock().unwrap_or_else(|e| e.into_inner()).take();
        if slot.is_none() {
            let listener =
                TcpListener::bind(self.addr)
                    .await
                    .map_err(|source| ServerError::Bind {
                        addr: self.addr,
                        source,
                    })?;
            slot = Some(tokio::spawn(server::accept_loop(
                listener,
                self.addr,
                self.ctx.clone(),
            )));
        }
        *self.accept.lock().unwrap_or_else(|e| e.into_inner()) = slot;
        Ok(())
    }

    /// Stop the server.
    pub async fn shutdown(self) {
        self.pause().await;
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(handle) = self.accept.lock().unwrap_or_else(|e| e.into_inner()).take() {
            handle.abort();
        }
        self.ctx.store().close_watches();
    }
}

fn make_client(url: &str) -> Result<kube::Client, ServerError> {
    let client_error = |source: kube::Error| ServerError::Client {
        url: url.to_string(),
        source: Box::new(source),
    };
    let uri = url
        .parse()
        .map_err(|e: hyper::http::uri::InvalidUri| ServerError::Url {
            url: url.to_string(),
            reason: e.to_string(),
        })?;
    let mut config = kube::Config::new(uri);
    config.default_namespace = "default".into();
    config.default_retry = false;
    kube::Client::try_from(config).map_err(client_error)
}

/// Every CustomResourceDefinition document in the files of a directory (sorted by file name).
fn read_crds(dir: &Path) -> Result<Vec<(PathBuf, Value)>, ServerError> {
    let read_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ServerError::ReadCrds { path, source }
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(read_err(dir))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
        })
        .collect();
    files.sort();
    let mut crds = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).map_err(read_err(&path))?;
        for doc in split_documents(&text) {
            let value: Value = serde_saphyr::from_str(doc).map_err(|e| ServerError::BadCrd {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            if value.is_null() {
                continue;
            }
            if value.get("kind").and_then(Value::as_str) != Some("CustomResourceDefinition") {
                return Err(ServerError::BadCrd {
                    path: path.clone(),
                    reason: "not a CustomResourceDefinition".into(),
                });
            }
            crds.push((path.clone(), value));
        }
    }
    Ok(crds)
}

/// Split a multi-document YAML stream on `---` separator lines.
fn split_documents(text: &str) -> Vec<&str> {
    let mut docs = Vec::new();
    let mut start = 0;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if line.trim_end() == "---" || line.starts_with("--- ") {
            docs.push(&text[start..offset]);
            start = offset + line.len();
        }
        offset += line.len();
    }
    docs.push(&text[start..]);
    docs.into_iter()
        .filter(|d| {
            d.lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_streams_split_into_documents() {
        let docs = split_documents("a: 1\n---\nb: 2\n--- \n# only a comment\n---\nc: 3");
        assert_eq!(docs, vec!["a: 1\n", "b: 2\n", "c: 3"]);
    }
}
