//! The stand-in's I/O: registration and heartbeats through the kube client, the pod watch, and
//! the execution of the planner's actions on the host. Every decision is made in [`super::plan`].

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::StreamExt as _;
use jiff::Timestamp;
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Event, Node, Pod},
};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions},
    runtime::{WatchStreamExt as _, reflector, watcher},
};
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};

use super::{
    NodeConfig, NodeError, agent,
    cni::{self, Attachment, CniFailure, PodRef},
    host::{self, CniExec},
    names, objects,
    plan::{self, Action, PodState},
    records::{self, Records, SandboxRecord},
};

/// How often the pods are re-synced even without a watch event (retries are due, etc.).
const RESYNC: Duration = Duration::from_millis(500);

/// Everything one running stand-in needs.
struct StandIn {
    /// The node's locks, held while the stand-in lives.
    _locks: Vec<std::fs::File>,
    client: Client,
    config: NodeConfig,
    tag: String,
    bridge: String,
    netns_prefix: String,
    records: Records,
    cni: Arc<CniExec>,
    nonce: AtomicU64,
    /// Per pod UID: consecutive failures and the last plugin message reported as an Event.
    failures: HashMap<String, (u32, String)>,
    /// Per pod UID: no new sandbox before this instant.
    not_before: BTreeMap<String, Timestamp>,
    /// Per sandbox ID: when its teardown was first planned (for [`NodeConfig::teardown_delay`]).
    teardown_planned: BTreeMap<String, Timestamp>,
}

fn log(node: &str, message: impl std::fmt::Display) {
    eprintln!("ipkeep-e2e node {node}: {message}");
}

fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> NodeError {
    let what = what.into();
    move |source| NodeError::Kube {
        what,
        source: Box::new(source),
    }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

fn typed<T: serde::de::DeserializeOwned>(value: Value, what: &str) -> Result<T, NodeError> {
    serde_json::from_value(value).map_err(|e| NodeError::Object {
        what: what.to_owned(),
        reason: e.to_string(),
    })
}

/// Runs a blocking host operation off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

/// Runs the stand-in until `shutdown` completes; see [`super::run`].
pub async fn run(
    client: Client,
    config: NodeConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), NodeError> {
    let mut node = StandIn::prepare(client, config)?;
    let mut shutdown = std::pin::pin!(shutdown);
    let Some(node_uid) = register_until_done(&node.client, &node.config, &mut shutdown).await
    else {
        return Ok(());
    };
    node.log(format!(
        "registered Node (uid {node_uid}), pod CIDRs {}, bridge {}, namespaces {}*",
        node.config.pod_cidrs.join(","),
        node.bridge,
        node.netns_prefix
    ));
    let (stop_tx, stop_rx) = watch::channel(false);
    let heartbeat = tokio::spawn(heartbeats(
        node.client.clone(),
        node.config.clone(),
        node_uid,
        stop_rx.clone(),
    ));
    let agent = node.config.agent.clone().map(|cfg| {
        let args = agent::agent_args(
            &node.config.name,
            &node.config.ipam_data_dir(),
            &node.config.network,
        );
        tokio::spawn(agent::supervise(
            cfg,
            args,
            node.config.name.clone(),
            stop_rx.clone(),
        ))
    });

    let (store, writer) = reflector::store::<Pod>();
    let notify = Arc::new(Notify::new());
    let pods: Api<Pod> = Api::all(node.client.clone());
    let selector = format!("spec.nodeName={}", node.config.name);
    let stream = watcher(pods, watcher::Config::default().fields(&selector))
        .default_backoff()
        .reflect(writer);
    let wake = notify.clone();
    let name = node.config.name.clone();
    let watch_task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            if let Err(e) = event {
                log(&name, format!("pod watch: {e}"));
            }
            wake.notify_one();
        }
    });

    let result = async {
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            ready = store.wait_until_ready() => ready.map_err(|e| NodeError::Watch(e.to_string()))?,
        }
        node.start_reconcile(&store.state()).await;
        log(&node.config.name, "ready");
        loop {
            tokio::select! {
                () = &mut shutdown => return Ok(()),
                () = notify.notified() => {}
                () = tokio::time::sleep(RESYNC) => {}
            }
            node.sync(&store.state(), true).await;
        }
    }
    .await;

    watch_task.abort();
    let _ = stop_tx.send(true);
    node.teardown_everything().await;
    if let Some(agent) = agent {
        let _ = agent.await;
    }
    heartbeat.abort();
    result
}

impl StandIn {
    fn prepare(client: Client, config: NodeConfig) -> Result<StandIn, NodeError> {
        config.validate()?;
        if !host::is_root() {
            return Err(NodeError::Config(
                "the stand-in needs root: it makes network namespaces and a bridge".into(),
            ));
        }
        let tag = names::node_tag(&config.name);
        let netns_prefix = names::netns_prefix(&tag);
        let bridge = names::bridge_name(&tag);
        // The data directory itself is the caller's choice (it may be a symlink); what the
        // stand-in makes inside it must be real directories.
        std::fs::create_dir_all(&config.data_dir).map_err(|source| NodeError::DataDir {
            path: config.data_dir.clone(),
            source,
        })?;
        let locks = host::lock_node(&config.data_dir, &tag).map_err(NodeError::Host)?;
        for dir in [config.ipam_data_dir(), config.data_dir.join("cni")] {
            records::ensure_real_dir(&dir).map_err(|source| NodeError::DataDir {
                path: dir.clone(),
                source,
            })?;
        }
        let network = cni::network_config(
            &config.network,
            &bridge,
            &config.pod_cidrs,
            &config.ipam_data_dir(),
        );
        let conf_path = config.cni_config_path();
        records::write_file_atomically(&conf_path, format!("{network:#}\n").as_bytes()).map_err(
            |source| NodeError::DataDir {
                path: conf_path.clone(),
                source,
            },
        )?;
        let records = Records::open(config.data_dir.join("sandboxes"), netns_prefix.clone())
            .map_err(NodeError::Record)?;
        let cni = Arc::new(CniExec {
            bin_dirs: config.cni_bin_dirs.clone(),
            config: network,
        });
        let seed = u64::try_from(Timestamp::now().as_nanosecond()).unwrap_or_default();
        Ok(StandIn {
            _locks: locks,
            client,
            config,
            tag,
            bridge,
            netns_prefix,
            records,
            cni,
            nonce: AtomicU64::new(seed),
            failures: HashMap::new(),
            not_before: BTreeMap::new(),
            teardown_planned: BTreeMap::new(),
        })
    }

    fn log(&self, message: impl std::fmt::Display) {
        log(&self.config.name, message);
    }

    fn next_nonce(&self) -> u64 {
        self.nonce.fetch_add(1, Ordering::Relaxed)
    }

    fn pod_states(&self, pods: &[Arc<Pod>]) -> Vec<PodState> {
        pods.iter()
            .filter(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref())
                    == Some(self.config.name.as_str())
            })
            .filter_map(|p| pod_state(p))
            .collect()
    }

    /// The first sync after a (re)start: sandboxes of pods that are gone are torn down with DEL,
    /// namespaces of this node without a record are removed, and the IPAM plugin's GC frees
    /// every allocation that no remaining sandbox holds.
    async fn start_reconcile(&mut self, pods: &[Arc<Pod>]) {
        self.sync(pods, false).await;
        let records = self.load_records();
        let known: Vec<&str> = records.iter().map(|r| r.netns.as_str()).collect();
        let prefix = self.netns_prefix.clone();
        let stale = blocking(move || host::list_netns(&prefix)).await;
        match stale {
            Some(Ok(all)) => {
                for ns in all.iter().filter(|n| !known.contains(&n.as_str())) {
                    self.log(format!("removing stale network namespace {ns}"));
                    let name = ns.clone();
                    if let Some(Err(e)) = blocking(move || host::delete_netns(&name)).await {
                        self.log(e);
                    }
                }
            }
            Some(Err(e)) => self.log(e),
            None => {}
        }
        if records.is_empty() {
            let bridge = self.bridge.clone();
            if let Some(Err(e)) = blocking(move || host::delete_link(&bridge)).await {
                self.log(e);
            }
        }
        let valid: Vec<(String, String)> = records
            .iter()
            .filter(|r| r.established)
            .map(|r| (r.container_id.clone(), cni::POD_IFNAME.to_owned()))
            .collect();
        let exec = self.cni.clone();
        match blocking(move || exec.gc(&valid)).await {
            Some(Err(e)) => self.log(format!("CNI GC: {e}")),
            Some(Ok(())) => self.log(format!("CNI GC done, {} valid attachments", records.len())),
            None => {}
        }
    }

    fn load_records(&self) -> Vec<SandboxRecord> {
        self.records.load().unwrap_or_else(|e| {
            self.log(e);
            Vec::new()
        })
    }

    /// One pass of the planner over the watched pods and the records, and its actions.
    /// With `hold`, teardowns wait for [`NodeConfig::teardown_delay`] (not at start-up: what a
    /// previous run left is cleaned at once).
    async fn sync(&mut self, pods: &[Arc<Pod>], hold: bool) {
        let states = self.pod_states(pods);
        let records = self.load_records();
        let sandboxes: Vec<_> = records.iter().map(SandboxRecord::state).collect();
        let now = Timestamp::now();
        self.not_before
            .retain(|uid, _| states.iter().any(|s| s.pod.uid == *uid));
        self.failures
            .retain(|uid, _| states.iter().any(|s| s.pod.uid == *uid));
        let mut actions = plan::plan(&states, &sandboxes, &self.not_before, now);
        if hold {
            let delay = jiff::SignedDuration::try_from(self.config.teardown_delay)
                .unwrap_or(jiff::SignedDuration::ZERO);
            actions = plan::hold_teardowns(actions, &mut self.teardown_planned, delay, now);
        }
        for action in actions {
            match action {
                Action::Teardown { container_id, .. } => {
                    if let Some(record) = records.iter().find(|r| r.container_id == container_id) {
                        self.teardown(record).await;
                    }
                }
                Action::ConfirmDeletion(pod) => self.confirm_deletion(&pod).await,
                Action::CreateSandbox(pod) => {
                    if let Some(p) = pods
                        .iter()
                        .find(|p| p.metadata.uid.as_deref() == Some(pod.uid.as_str()))
                    {
                        let p = p.clone();
                        self.create_sandbox(&pod, &p).await;
                    }
                }
                Action::HostNetworkRunning(pod) => {
                    if let Some(p) = pods
                        .iter()
                        .find(|p| p.metadata.uid.as_deref() == Some(pod.uid.as_str()))
                    {
                        let status = objects::pod_running_status(
                            &containers(p),
                            &[self.config.host_ip],
                            self.config.host_ip,
                            "host-network",
                            Timestamp::now(),
                        );
                        self.patch_pod_status(&pod, &status).await;
                    }
                }
            }
        }
    }

    /// CNI DEL, namespace removal, record removal (each step logged, none stops the next).
    async fn teardown(&self, record: &SandboxRecord) {
        let attachment = Attachment {
            container_id: record.container_id.clone(),
            netns_path: host::netns_path(&record.netns),
            pod: record.pod(),
        };
        let exec = self.cni.clone();
        let netns = record.netns.clone();
        let outcome = blocking(move || (exec.del(&attachment), host::delete_netns(&netns))).await;
        if let Some((del, netns)) = outcome {
            if let Err(e) = del {
                self.log(format!("CNI DEL of sandbox {}: {e}", record.container_id));
            }
            if let Err(e) = netns {
                self.log(e);
            }
        }
        if let Err(e) = self.records.remove(&record.container_id) {
            self.log(e);
        }
        self.log(format!(
            "tore down sandbox {} of pod {}/{} (namespace {})",
            &record.container_id[..16.min(record.container_id.len())],
            record.namespace,
            record.name,
            record.netns
        ));
    }

    /// Deletes the pod with grace period 0, preconditioned on its UID, as a kubelet confirms a
    /// terminated pod.
    async fn confirm_deletion(&self, pod: &PodRef) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(pod.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&pod.name, &params).await {
            Ok(_) => self.log(format!(
                "pod {}/{} deleted (grace period 0)",
                pod.namespace, pod.name
            )),
            Err(e) if is_status(&e, 404) || is_status(&e, 409) => {}
            Err(e) => self.log(format!(
                "failed to delete pod {}/{}: {e}",
                pod.namespace, pod.name
            )),
        }
    }

    /// Namespace, CNI ADD (retried later on failure), the addresses read back from the
    /// namespace, the pod's status.
    async fn create_sandbox(&mut self, pod: &PodRef, object: &Pod) {
        let container_id = names::container_id(&pod.uid, &self.tag, self.next_nonce());
        let netns = names::netns_name(&self.tag, &container_id);
        let mut record = SandboxRecord {
            container_id: container_id.clone(),
            netns: netns.clone(),
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            established: false,
            ips: Vec::new(),
        };
        if let Err(e) = self.records.write(&record) {
            self.log(e);
            return;
        }
        let attachment = Attachment {
            container_id: container_id.clone(),
            netns_path: host::netns_path(&netns),
            pod: pod.clone(),
        };
        let exec = self.cni.clone();
        let ns = netns.clone();
        let outcome = blocking(move || -> Result<Vec<IpAddr>, CniFailure> {
            host::add_netns(&ns).map_err(|e| CniFailure {
                code: 999,
                msg: e.to_string(),
                details: String::new(),
            })?;
            let result = exec.add(&attachment)?;
            let in_netns = host::pod_addresses(&ns).map_err(|e| CniFailure {
                code: 999,
                msg: e.to_string(),
                details: String::new(),
            })?;
            let ips = cni::configured_pod_ips(&result, &in_netns);
            if ips.is_empty() {
                return Err(CniFailure {
                    code: 999,
                    msg: format!(
                        "none of the result's addresses {result:?} is configured on {} in {ns} (found {in_netns:?})",
                        cni::POD_IFNAME
                    ),
                    details: String::new(),
                });
            }
            Ok(ips)
        })
        .await;
        let outcome = outcome.unwrap_or_else(|| {
            Err(CniFailure {
                code: 999,
                msg: "the sandbox task panicked".into(),
                details: String::new(),
            })
        });
        match outcome {
            Ok(ips) => {
                let status = objects::pod_running_status(
                    &containers(object),
                    &ips,
                    self.config.host_ip,
                    &container_id,
                    Timestamp::now(),
                );
                if !self.patch_pod_status(pod, &status).await {
                    self.teardown(&record).await;
                    self.retry_later(pod, false);
                    return;
                }
                record.established = true;
                record.ips = ips.iter().map(ToString::to_string).collect();
                if let Err(e) = self.records.write(&record) {
                    self.log(e);
                }
                self.failures.remove(&pod.uid);
                self.not_before.remove(&pod.uid);
                self.log(format!(
                    "pod {}/{} running with {} in {netns}",
                    pod.namespace,
                    pod.name,
                    record.ips.join(",")
                ));
            }
            Err(failure) => {
                self.sandbox_failed(pod, object, &container_id, &failure)
                    .await;
                self.teardown(&record).await;
            }
        }
    }

    /// A failed ADD: a Warning Event with the plugin's message (once per distinct message, as
    /// the kubelet's event aggregation would fold repeats), Pending status, a retry later.
    async fn sandbox_failed(
        &mut self,
        pod: &PodRef,
        object: &Pod,
        container_id: &str,
        failure: &CniFailure,
    ) {
        let plugin_message = if failure.details.is_empty() {
            failure.msg.clone()
        } else {
            format!("{}; {}", failure.msg, failure.details)
        };
        self.log(format!(
            "sandbox for pod {}/{} failed (CNI code {}): {plugin_message}",
            pod.namespace, pod.name, failure.code
        ));
        let first = !self.failures.contains_key(&pod.uid);
        let entry = self
            .failures
            .entry(pod.uid.clone())
            .or_insert((0, String::new()));
        entry.0 += 1;
        let new_message = entry.1 != plugin_message;
        entry.1 = plugin_message.clone();
        let now = Timestamp::now();
        if new_message {
            let message = objects::failed_sandbox_message(container_id, &plugin_message);
            let event = objects::pod_warning_event(
                pod,
                &self.config.name,
                objects::REASON_FAILED_SANDBOX,
                &message,
                self.next_nonce(),
                now,
            );
            let events: Api<Event> = Api::namespaced(self.client.clone(), &pod.namespace);
            match typed::<Event>(event, "Event") {
                Ok(event) => {
                    if let Err(e) = events.create(&PostParams::default(), &event).await {
                        self.log(format!(
                            "failed to record an Event on {}/{}: {e}",
                            pod.namespace, pod.name
                        ));
                    }
                }
                Err(e) => self.log(e),
            }
        }
        if first {
            let status = objects::pod_pending_status(&containers(object), self.config.host_ip, now);
            self.patch_pod_status(pod, &status).await;
        }
        self.retry_later(pod, failure.is_try_again_later());
    }

    fn retry_later(&mut self, pod: &PodRef, try_again_later: bool) {
        let failures = self.failures.get(&pod.uid).map_or(1, |f| f.0);
        let delay = plan::retry_delay(try_again_later, failures);
        let at = Timestamp::now()
            + jiff::SignedDuration::try_from(delay).unwrap_or(jiff::SignedDuration::from_secs(1));
        self.not_before.insert(pod.uid.clone(), at);
    }

    /// Merge-patches `status`; whether it was written.
    async fn patch_pod_status(&self, pod: &PodRef, status: &Value) -> bool {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        match api
            .patch_status(&pod.name, &PatchParams::default(), &Patch::Merge(status))
            .await
        {
            Ok(_) => true,
            Err(e) => {
                self.log(format!(
                    "failed to write the status of pod {}/{}: {e}",
                    pod.namespace, pod.name
                ));
                false
            }
        }
    }

    /// On exit: every sandbox torn down with DEL, the bridge removed.
    async fn teardown_everything(&self) {
        for record in self.load_records() {
            self.teardown(&record).await;
        }
        let bridge = self.bridge.clone();
        if let Some(Err(e)) = blocking(move || host::delete_link(&bridge)).await {
            self.log(e);
        }
        self.log("stopped; sandboxes and bridge removed");
    }
}

fn pod_state(p: &Pod) -> Option<PodState> {
    let meta = &p.metadata;
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    Some(PodState {
        pod: PodRef {
            namespace: meta.namespace.clone()?,
            name: meta.name.clone()?,
            uid: meta.uid.clone()?,
        },
        deleting: meta.deletion_timestamp.is_some(),
        host_network: p.spec.as_ref().and_then(|s| s.host_network) == Some(true),
        terminal: matches!(phase, Some("Succeeded" | "Failed")),
        running: phase == Some("Running"),
    })
}

fn containers(p: &Pod) -> Vec<objects::ContainerSpec> {
    p.spec
        .as_ref()
        .map(|s| {
            s.containers
                .iter()
                .map(|c| objects::ContainerSpec {
                    name: c.name.clone(),
                    image: c.image.clone().unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Creates the Node (or brings an existing one's labels and pod CIDRs in line), writes its
/// status and its Lease; its UID.
async fn register(client: &Client, config: &NodeConfig) -> Result<String, NodeError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let desired = objects::node(&config.name, &config.pod_cidrs);
    let created = match nodes
        .create(
            &PostParams::default(),
            &typed::<Node>(desired.clone(), "Node")?,
        )
        .await
    {
        Ok(node) => node,
        Err(e) if is_status(&e, 409) => {
            let patch = json!({"metadata": {"labels": desired["metadata"]["labels"]}, "spec": desired["spec"]});
            nodes
                .patch(&config.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(kube_err(format!("update Node {}", config.name)))?
        }
        Err(e) => return Err(kube_err(format!("create Node {}", config.name))(e)),
    };
    let uid = created.metadata.uid.unwrap_or_default();
    let now = Timestamp::now();
    write_node_status(client, config, now, now).await?;
    renew_lease(client, &config.name, &uid, now).await?;
    Ok(uid)
}

/// [`register`], retried every second (a kubelet keeps trying to register) until it succeeds or
/// `shutdown` completes (then `None`).
async fn register_until_done(
    client: &Client,
    config: &NodeConfig,
    shutdown: &mut (impl std::future::Future<Output = ()> + Unpin),
) -> Option<String> {
    loop {
        match register(client, config).await {
            Ok(uid) => return Some(uid),
            Err(e) => log(&config.name, format!("{e}; retrying in 1s")),
        }
        tokio::select! {
            () = &mut *shutdown => return None,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

async fn write_node_status(
    client: &Client,
    config: &NodeConfig,
    ready_since: Timestamp,
    now: Timestamp,
) -> Result<(), NodeError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let status = objects::node_status(&config.name, config.host_ip, ready_since, now);
    nodes
        .patch_status(
            &config.name,
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await
        .map(drop)
        .map_err(kube_err(format!(
            "write the status of Node {}",
            config.name
        )))
}

async fn renew_lease(
    client: &Client,
    node: &str,
    node_uid: &str,
    now: Timestamp,
) -> Result<(), NodeError> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), objects::LEASE_NAMESPACE);
    let lease = objects::lease(node, node_uid, now);
    match leases
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": lease["spec"]})),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, 404) => leases
            .create(&PostParams::default(), &typed::<Lease>(lease, "Lease")?)
            .await
            .map(drop)
            .map_err(kube_err(format!(
                "create Lease {}/{node}",
                objects::LEASE_NAMESPACE
            ))),
        Err(e) => Err(kube_err(format!(
            "renew Lease {}/{node}",
            objects::LEASE_NAMESPACE
        ))(e)),
    }
}

/// Every heartbeat interval: the Node's Ready condition and the Lease renewed.
async fn heartbeats(
    client: Client,
    config: NodeConfig,
    node_uid: String,
    mut stop: watch::Receiver<bool>,
) {
    let ready_since = Timestamp::now();
    let mut node_uid = node_uid;
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            () = tokio::time::sleep(config.heartbeat) => {}
        }
        let now = Timestamp::now();
        match write_node_status(&client, &config, ready_since, now).await {
            // The Node was deleted: register again, as a kubelet does.
            Err(NodeError::Kube { source, .. }) if is_status(&source, 404) => {
                match register(&client, &config).await {
                    Ok(uid) => {
                        log(
                            &config.name,
                            format!("the Node was deleted; registered it again (uid {uid})"),
                        );
                        node_uid = uid;
                    }
                    Err(e) => log(&config.name, e),
                }
            }
            Err(e) => log(&config.name, e),
            Ok(()) => {}
        }
        if let Err(e) = renew_lease(&client, &config.name, &node_uid, now).await {
            log(&config.name, e);
        }
    }
}
