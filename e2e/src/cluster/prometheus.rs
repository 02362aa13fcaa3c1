//! A Prometheus server on this machine, as an on-call person's is: Debian's `prometheus` (the
//! package `promtool` comes with, `make deps`), loading rule files and scraping the targets a test
//! gives it, its HTTP API on `127.0.0.1`. The real-node monitoring scenario runs ipkeep's alerting
//! rules and the dashboard's queries on it.
//!
//! ```text
//! let prom = Prometheus::start(&[rules], Duration::from_secs(2), &[ca_and_client]).await?;
//! prom.set_targets(&targets)?;                // file_sd: rewritten whenever pods move
//! prom.query("up").await?;                    // the `result` of /api/v1/query
//! prom.alerts().await?;                       // /api/v1/alerts: pending and firing
//! ```
//!
//! Debian's build (2.42.0+ds) has no Kubernetes service discovery (`kubernetes_sd_configs` is
//! refused as an unknown field), so the targets are a `file_sd` file the test writes from the API,
//! with the labels the chart's ServiceMonitor gives them (`job`, `node`). One more job scrapes the
//! API server with the admin's client certificate, for its `apiserver_admission_webhook_*`
//! metrics.
//!
//! Its configuration and data live in a private state directory named like a control plane's;
//! dropping the [`Prometheus`] stops it and removes that directory, the death of its owner does
//! too (the watchdog of [`super::process`]), and a directory left by an owner killed with its
//! watchdog is removed, its process killed, by the next start ([`super::plane::reap_stale`]).

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddrV4, TcpListener},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;

use super::{
    plane::{STATE_DIR_PREFIX, reap_stale},
    process::{Component, ProcessError, Spawner, Watchdog, log_tail},
};

/// How long the server may take to answer `/-/ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

static STATE_DIR_SEQ: AtomicU64 = AtomicU64::new(0);

/// Errors of starting or asking the server.
#[derive(Debug, thiserror::Error)]
pub enum PrometheusError {
    /// The binary is not installed.
    #[error(
        "failed to find prometheus in /usr/bin: install Debian's `prometheus` package (make deps does)"
    )]
    NotInstalled,
    /// Writing its state.
    #[error("failed to {what} {}", path.display())]
    State {
        /// What was done.
        what: String,
        /// The path.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// Starting the process or its watchdog.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// It exited, or never became ready.
    #[error("prometheus {what}; last lines of its log:\n{tail}")]
    NotRunning {
        /// What happened.
        what: String,
        /// Its log's last lines.
        tail: String,
    },
    /// An API request failed.
    #[error("failed to GET {path} from prometheus")]
    Request {
        /// The request's path.
        path: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The API answered something else than success.
    #[error("prometheus answered GET {path} with {status}: {body}")]
    Answer {
        /// The request's path.
        path: String,
        /// The HTTP status.
        status: u16,
        /// The body.
        body: String,
    },
}

/// One scrape target and its labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `host:port`.
    pub addr: String,
    /// The labels its series get (`job`, `node`, ...).
    pub labels: BTreeMap<String, String>,
}

/// A running Prometheus server (see the module docs).
pub struct Prometheus {
    state_dir: PathBuf,
    port: u16,
    process: Option<Component>,
    watchdog: Watchdog,
    spawner: Spawner,
}

impl std::fmt::Debug for Prometheus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prometheus")
            .field("port", &self.port)
            .field("state_dir", &self.state_dir)
            .finish_non_exhaustive()
    }
}

/// The API server scraped beside the targets: its URL and the client identity to use.
#[derive(Debug, Clone)]
pub struct ApiServer {
    /// `host:port`.
    pub addr: String,
    /// The CA its serving certificate chains to.
    pub ca: PathBuf,
    /// A client certificate allowed to GET `/metrics`.
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
}

impl Prometheus {
    /// Starts a server that loads `rule_files`, scrapes and evaluates every `interval`, and
    /// scrapes `api_server` (job `apiserver`) and the targets of [`Prometheus::set_targets`]
    /// (none yet); returns once `/-/ready` answers.
    pub async fn start(
        rule_files: &[PathBuf],
        interval: Duration,
        api_server: Option<&ApiServer>,
    ) -> Result<Prometheus, PrometheusError> {
        let program = Path::new("/usr/bin/prometheus");
        if !program.is_file() {
            return Err(PrometheusError::NotInstalled);
        }
        let parent = std::env::temp_dir();
        for line in reap_stale(&parent) {
            eprintln!("ipkeep-e2e prometheus: {line}");
        }
        let state_dir = parent.join(format!(
            "{STATE_DIR_PREFIX}prometheus-{}-{}",
            std::process::id(),
            STATE_DIR_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&state_dir).map_err(state_err("create", &state_dir))?;
        let port = match free_port(&state_dir) {
            Ok(p) => p,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&state_dir);
                return Err(e);
            }
        };
        let prepared = write_state(&state_dir, rule_files, interval, api_server).and_then(|()| {
            let spawner =
                Spawner::new().map_err(state_err("start the spawner thread for", &state_dir))?;
            let watchdog = Watchdog::start(&spawner, &state_dir, &[])?;
            Ok((spawner, watchdog))
        });
        let (spawner, watchdog) = match prepared {
            Ok(p) => p,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&state_dir);
                return Err(e);
            }
        };
        let mut prom = Prometheus {
            state_dir,
            port,
            process: None,
            watchdog,
            spawner,
        };
        // From here on, a failure drops `prom`: whatever started is stopped and removed.
        let args = vec![
            format!(
                "--config.file={}",
                prom.state_dir.join("prometheus.yml").display()
            ),
            format!(
                "--storage.tsdb.path={}",
                prom.state_dir.join("data").display()
            ),
            format!("--web.listen-address=127.0.0.1:{port}"),
        ];
        let process = Component::start(
            &prom.spawner,
            "prometheus",
            program,
            &args,
            &prom.log(),
            &prom.state_dir.join("pgids"),
        )?;
        prom.process = Some(process);
        prom.wait_ready().await?;
        Ok(prom)
    }

    /// Its log file.
    pub fn log(&self) -> PathBuf {
        self.state_dir.join("prometheus.log")
    }

    /// Replaces the scrape targets (the file its `file_sd` watches, renamed into place).
    pub fn set_targets(&self, targets: &[Target]) -> Result<(), PrometheusError> {
        let groups: Vec<Value> = targets
            .iter()
            .map(|t| json!({"targets": [t.addr], "labels": t.labels}))
            .collect();
        let tmp = self.state_dir.join("targets.json.tmp");
        let path = self.state_dir.join("targets.json");
        std::fs::write(&tmp, Value::Array(groups).to_string()).map_err(state_err("write", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(state_err("rename into", &path))
    }

    /// `GET path` of its HTTP API: the `data` of a successful answer.
    pub async fn get(&self, path: &str) -> Result<Value, PrometheusError> {
        let request_err =
            |source: Box<dyn std::error::Error + Send + Sync>| PrometheusError::Request {
                path: path.to_owned(),
                source,
            };
        let tcp = TcpStream::connect(SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port))
            .await
            .map_err(|e| request_err(Box::new(e)))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| request_err(Box::new(e)))?;
        let driver = tokio::spawn(connection);
        let request = http::Request::get(path)
            .header(http::header::HOST, format!("127.0.0.1:{}", self.port))
            .body(Empty::<Bytes>::new())
            .map_err(|e| request_err(Box::new(e)))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| request_err(Box::new(e)))?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| request_err(Box::new(e)))?
            .to_bytes();
        driver.abort();
        let answer: Option<Value> = serde_json::from_slice(&body).ok();
        match answer {
            Some(a) if status == 200 && a["status"] == "success" => Ok(a["data"].clone()),
            _ => Err(PrometheusError::Answer {
                path: path.to_owned(),
                status,
                body: String::from_utf8_lossy(&body).into_owned(),
            }),
        }
    }

    /// The instant query `expr` now: its `result` (one entry per series).
    pub async fn query(&self, expr: &str) -> Result<Vec<Value>, PrometheusError> {
        let data = self
            .get(&format!("/api/v1/query?query={}", url_encode(expr)))
            .await?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// The range query `expr` from `start` to `end` (Unix seconds) every `step`: its `result`
    /// (one entry per series, each with its `values`).
    pub async fn query_range(
        &self,
        expr: &str,
        start: f64,
        end: f64,
        step: Duration,
    ) -> Result<Vec<Value>, PrometheusError> {
        let data = self
            .get(&format!(
                "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step={}",
                url_encode(expr),
                step.as_secs_f64()
            ))
            .await?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// Every alert pending or firing now.
    pub async fn alerts(&self) -> Result<Vec<Value>, PrometheusError> {
        let data = self.get("/api/v1/alerts").await?;
        Ok(data["alerts"].as_array().cloned().unwrap_or_default())
    }

    /// Every loaded rule's health and last error (`/api/v1/rules`).
    pub async fn rules(&self) -> Result<Vec<Value>, PrometheusError> {
        let data = self.get("/api/v1/rules").await?;
        Ok(data["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect())
    }

    async fn wait_ready(&self) -> Result<(), PrometheusError> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.process.as_ref().and_then(Component::exit_status) {
                return Err(PrometheusError::NotRunning {
                    what: format!("exited ({status})"),
                    tail: log_tail(&self.log(), 20),
                });
            }
            if self.get("/api/v1/status/buildinfo").await.is_ok() {
                return Ok(());
            }
            if started.elapsed() > READY_TIMEOUT {
                return Err(PrometheusError::NotRunning {
                    what: format!("did not answer within {READY_TIMEOUT:?}"),
                    tail: log_tail(&self.log(), 20),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Stops the server and removes its state directory. Idempotent.
    pub fn stop(&mut self) {
        if let Some(p) = self.process.take() {
            p.stop(Duration::from_secs(5));
        }
        let _ = std::fs::remove_dir_all(&self.state_dir);
        self.watchdog.finish();
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.stop();
    }
}

fn state_err(what: &str, path: &Path) -> impl FnOnce(std::io::Error) -> PrometheusError {
    let (what, path) = (what.to_owned(), path.to_owned());
    move |source| PrometheusError::State { what, path, source }
}

/// A port free now (another process may take it before the server binds it: a start then fails
/// saying so).
fn free_port(state_dir: &Path) -> Result<u16, PrometheusError> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(state_err("find a free port for the server of", state_dir))
}

/// The owner file (what [`reap_stale`] reads), the configuration and an empty targets file.
fn write_state(
    dir: &Path,
    rule_files: &[PathBuf],
    interval: Duration,
    api_server: Option<&ApiServer>,
) -> Result<(), PrometheusError> {
    std::fs::write(dir.join("owner"), format!("{}\n", std::process::id()))
        .map_err(state_err("write the owner file of", dir))?;
    std::fs::write(dir.join("targets.json"), "[]")
        .map_err(state_err("write the targets of", dir))?;
    let every = format!("{}ms", interval.as_millis());
    let mut scrape = vec![json!({
        "job_name": "ipkeep",
        "file_sd_configs": [{"files": [dir.join("targets.json")], "refresh_interval": every}],
    })];
    if let Some(a) = api_server {
        scrape.push(json!({
            "job_name": "apiserver",
            "scheme": "https",
            "static_configs": [{"targets": [a.addr]}],
            "tls_config": {"ca_file": a.ca, "cert_file": a.cert, "key_file": a.key},
        }));
    }
    let config = json!({
        "global": {"scrape_interval": every, "evaluation_interval": every},
        "rule_files": rule_files,
        "scrape_configs": scrape,
    });
    // JSON is YAML.
    let path = dir.join("prometheus.yml");
    std::fs::write(&path, config.to_string()).map_err(state_err("write", &path))
}

/// Percent-encodes a query parameter's value.
fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_is_percent_encoded() {
        assert_eq!(
            url_encode("up{job=\"a b\"} == 0"),
            "up%7Bjob%3D%22a%20b%22%7D%20%3D%3D%200"
        );
    }
}
