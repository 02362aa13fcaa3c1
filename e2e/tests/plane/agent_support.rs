//! The agent's end-to-end tests' support: nodes (an in-process agent
//! with its own temporary data directory), unique names, reading the files the agent wrote, and
//! waiting on conditions with a deadline.
//!
//! Every scenario is an `async fn(kube::Client, …)`: the admin client writes, the agents use
//! theirs (the chart's agent ServiceAccount, perhaps through a fault proxy).

pub mod scenarios;
use ipkeep_e2e::testkit::{Scratch, wait_for};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ipkeep_operator::agent::{AgentConfig, AgentMetrics, run};
use ipkeep_operator::api::{IPReservation, IPReservationSpec, IpString};
use ipkeep_operator::runtime::probes::Readiness;
use ipkeep_reservation::NetworkDir;
use ipkeep_reservation::{PodKey, ReservationFile, load_reservations};
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The networks every test node keeps (two, so the agent is seen to keep each).
pub const NETWORKS: [&str; 2] = ["cbr0", "second"];

/// A name unique in this process and across runs (`prefix-<pid>-<n>`).
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Creates a namespace with a unique name and returns the name.
pub async fn namespace(client: &Client, prefix: &str) -> String {
    let name = unique(prefix);
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("failed to create a test namespace");
    name
}

/// An IPReservation object (no status: the way a hand-made one starts).
pub fn reservation(
    name: &str,
    node: &str,
    ips: &[&str],
    retain_for: Option<&str>,
) -> IPReservation {
    IPReservation::new(
        name,
        IPReservationSpec {
            ips: ips.iter().map(|s| IpString((*s).to_owned())).collect(),
            node_name: node.to_owned(),
            retain_for: retain_for.map(str::to_owned),
        },
    )
}

/// One node as its agent sees it: an agent running in this process on its own data directory.
pub struct Node {
    /// The node's name.
    pub name: String,
    /// Its data directory (what `--data-dir` would be).
    pub data_dir: PathBuf,
    /// The agent's metrics.
    pub metrics: AgentMetrics,
    /// The agent's registry (for `/metrics`).
    pub registry: prometheus::Registry,
    /// The agent's readiness.
    pub readiness: Arc<Readiness>,
    /// The data directory when the node made it (removed with the node).
    scratch: Option<Scratch>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Node {
    /// Starts an agent for a new uniquely named node.
    pub fn start(client: &Client, prefix: &str) -> Node {
        let name = unique(prefix);
        let scratch = Scratch::new(&format!("agent-{name}"));
        let mut node = Node::start_named(client, &name, scratch.path());
        node.scratch = Some(scratch);
        node
    }

    /// Starts an agent for `name` on `data_dir`.
    pub fn start_named(client: &Client, name: &str, data_dir: &Path) -> Node {
        Node::start_with(client, name, data_dir, Duration::from_secs(3_600))
    }

    /// Starts an agent for `name` on `data_dir` with a full resync every `resync_interval`.
    pub fn start_with(
        client: &Client,
        name: &str,
        data_dir: &Path,
        resync_interval: Duration,
    ) -> Node {
        let registry = prometheus::Registry::new();
        let metrics = AgentMetrics::register(&registry).expect("failed to register metrics");
        let readiness = Arc::new(Readiness::default());
        let config = AgentConfig {
            node_name: name.to_owned(),
            data_dir: data_dir.to_owned(),
            networks: NETWORKS.iter().map(|s| (*s).to_owned()).collect(),
            default_retain_for: Duration::from_secs(86_400),
            resync_interval,
            in_charge: None,
            watch_data_dir: true,
            report_capacity: true,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn({
            let client = client.clone();
            let metrics = metrics.clone();
            let readiness = readiness.clone();
            async move {
                run(client, config, metrics, readiness, async move {
                    let _ = stopped.await;
                })
                .await
                .expect("the agent failed");
            }
        });
        Node {
            name: name.to_owned(),
            data_dir: data_dir.to_owned(),
            metrics,
            registry,
            readiness,
            scratch: None,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Waits until the agent has done its first full sync.
    pub async fn ready(&self) {
        let r = self.readiness.clone();
        wait_for(&format!("agent of {} to be ready", self.name), || {
            let r = r.clone();
            async move { r.is_ready().then_some(()) }
        })
        .await;
    }

    /// Stops the agent gracefully and waits for it.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("the agent task panicked");
        }
    }

    /// Every valid file of `network`, and fails the test on garbage.
    pub fn files(&self, network: &str) -> BTreeMap<PodKey, ReservationFile> {
        files_of(&self.data_dir, network)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Reads `<data_dir>/<network>/reserved/<ns>/<pod>`.
pub fn read_file(data_dir: &Path, network: &str, ns: &str, pod: &str) -> Option<ReservationFile> {
    let path = data_dir.join(network).join("reserved").join(ns).join(pod);
    match std::fs::read(&path) {
        Ok(bytes) => Some(
            ReservationFile::from_json(&bytes)
                .unwrap_or_else(|e| panic!("{} is not a valid reservation: {e}", path.display())),
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => panic!("failed to read {}: {e}", path.display()),
    }
}

/// Every reservation file of `<data_dir>/<network>` (none when the directory does not exist).
/// Entries that are not reservations are ignored here: while the agent writes, its in-flight
/// temporaries are visible; see [`garbage_of`] once it stopped.
pub fn files_of(data_dir: &Path, network: &str) -> BTreeMap<PodKey, ReservationFile> {
    if !data_dir.join(network).exists() {
        return BTreeMap::new();
    }
    let dir = NetworkDir::open(data_dir, network).expect("failed to open the network directory");
    load_reservations(&dir).files
}

/// The entries of `<data_dir>/<network>/reserved/` that are not valid reservations.
pub fn garbage_of(data_dir: &Path, network: &str) -> Vec<String> {
    if !data_dir.join(network).exists() {
        return Vec::new();
    }
    let dir = NetworkDir::open(data_dir, network).expect("failed to open the network directory");
    load_reservations(&dir)
        .skipped
        .into_iter()
        .map(|s| format!("{}: {}", s.path.display(), s.reason))
        .collect()
}

/// Waits until `pred` holds for the file of `ns/pod` in every network of `node`'s data
/// directory; returns the file of the first network (if any) and how long it took.
pub async fn wait_file<P>(
    data_dir: &Path,
    ns: &str,
    pod: &str,
    what: &str,
    pred: P,
) -> (Option<ReservationFile>, Duration)
where
    P: Fn(Option<&ReservationFile>) -> bool,
{
    let start = tokio::time::Instant::now();
    let file = wait_for(what, || {
        let files: Vec<_> = NETWORKS
            .iter()
            .map(|n| read_file(data_dir, n, ns, pod))
            .collect();
        let ok = files.iter().all(|f| pred(f.as_ref()));
        let first = files.into_iter().next().flatten();
        async move { ok.then_some(first) }
    })
    .await;
    (file, start.elapsed())
}

/// A plain HTTP GET (status code and body) against the probe server.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("failed to connect to the probe server");
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .expect("failed to send the request");
    let mut reply = String::new();
    stream
        .read_to_string(&mut reply)
        .await
        .expect("failed to read the reply");
    let code = reply
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP reply: {reply:?}"));
    let body = reply
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (code, body)
}
