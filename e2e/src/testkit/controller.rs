//! A controller in this process and what its tests check on the API server: starting it (alone in
//! a namespace of the shared control plane, as the chart's controller ServiceAccount), pods as
//! a kubelet would report them, reservations awaited by phase, deletions and Events observed,
//! `/metrics` scraped. The scenarios themselves are in `tests/plane/controller_scenarios.rs`.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::cluster::force_delete_pod;
use futures::StreamExt;
use ipkeep_operator::{
    api::{IPReservation, Phase},
    controller::{self, Settings, Started},
};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;
use tokio::{sync::oneshot, task::JoinHandle};

use super::{plane, wait_for};

/// A controller running in this process.
pub struct RunningController {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), controller::ControllerError>>,
    /// Where its probes listen.
    pub probe_addr: SocketAddr,
}

impl RunningController {
    /// Stops it (as SIGTERM would), waits until it has, and fails the test if it had failed.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let result = (&mut self.task).await.expect("the controller task ended");
        result.expect("the controller ran without error");
    }
}

/// Starts a controller in this process (no leader election), default retention one day.
pub async fn start_controller(client: Client) -> RunningController {
    start_controller_in(client, None).await
}

/// As [`start_controller`], watching only `namespace` when given, so that the tests of one
/// binary sharing one control plane each have their own.
pub async fn start_controller_in(client: Client, namespace: Option<&str>) -> RunningController {
    let mut settings = Settings::single(Duration::from_secs(86_400));
    settings.namespace = namespace.map(str::to_owned);
    start_controller_with(client, settings).await
}

/// Starts a controller in this process with `settings`.
pub async fn start_controller_with(client: Client, settings: Settings) -> RunningController {
    let (stop, stopped) = oneshot::channel::<()>();
    let (started_tx, started_rx) = oneshot::channel::<Started>();
    let task = tokio::spawn(controller::run(
        client,
        settings,
        async move {
            let _ = stopped.await;
        },
        move |s| {
            let _ = started_tx.send(s);
        },
    ));
    let started = started_rx.await.expect("the controller started");
    RunningController {
        stop: Some(stop),
        task,
        probe_addr: started.probe_addr.expect("a probe address"),
    }
}

/// Annotations asking for retention.
pub fn retain(retain_for: Option<&str>) -> BTreeMap<String, String> {
    let mut a = BTreeMap::from([("ipkeep.dev/retain".to_string(), "true".to_string())]);
    if let Some(r) = retain_for {
        a.insert("ipkeep.dev/retain-for".into(), r.into());
    }
    a
}

/// Creates a pod on `node` and marks it Running with `ips` (what the kubelet would report).
pub async fn create_running_pod(
    client: &Client,
    ns: &str,
    name: &str,
    node: &str,
    ips: &[&str],
    annotations: &BTreeMap<String, String>,
) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "registry.invalid/app:1"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("failed to create pod {ns}/{name}: {e}"));
    let ip_list: Vec<_> = ips.iter().map(|ip| json!({"ip": ip})).collect();
    let status = json!({"status": {"phase": "Running", "podIP": ips.first(), "podIPs": ip_list}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap_or_else(|e| panic!("failed to set the status of pod {ns}/{name}: {e}"))
}

/// Deletes a pod at once, as `kubectl delete --grace-period=0 --force` does (no kubelet would
/// finish a graceful delete), and waits until it is gone.
pub async fn delete_pod(client: &Client, ns: &str, name: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    force_delete_pod(&pods, name, None)
        .await
        .unwrap_or_else(|e| panic!("failed to delete pod {ns}/{name}: {e}"));
    wait_for(&format!("pod {ns}/{name} to be gone"), || {
        let pods = pods.clone();
        async move {
            pods.get_opt(name)
                .await
                .ok()
                .and_then(|p| p.is_none().then_some(()))
        }
    })
    .await;
}

/// Waits until the reservation `ns/name` satisfies `check`, and returns it.
pub async fn wait_reservation(
    client: &Client,
    ns: &str,
    name: &str,
    what: &str,
    check: impl Fn(&IPReservation) -> bool,
) -> IPReservation {
    let api: Api<IPReservation> = Api::namespaced(client.clone(), ns);
    let check = &check;
    wait_for(&format!("IPReservation {ns}/{name} {what}"), || {
        let api = api.clone();
        async move { api.get_opt(name).await.ok().flatten().filter(|r| check(r)) }
    })
    .await
}

/// Waits until the reservation `ns/name` no longer exists; returns when that was seen.
pub async fn wait_reservation_gone(client: &Client, ns: &str, name: &str) -> Timestamp {
    let api: Api<IPReservation> = Api::namespaced(client.clone(), ns);
    wait_for(&format!("IPReservation {ns}/{name} to be deleted"), || {
        let api = api.clone();
        async move {
            match api.get_opt(name).await {
                Ok(None) => Some(Timestamp::now()),
                _ => None,
            }
        }
    })
    .await
}

/// The phase of a reservation.
pub fn phase(r: &IPReservation) -> Option<Phase> {
    r.status.as_ref().and_then(|s| s.phase)
}

/// Whether a reservation is Bound to `uid`.
pub fn bound_to(r: &IPReservation, uid: &str) -> bool {
    let s = r.status.as_ref();
    phase(r) == Some(Phase::Bound)
        && s.and_then(|s| s.pod_uid.as_deref()) == Some(uid)
        && s.is_some_and(|s| s.release_time.is_none())
}

/// One observed deletion: `namespace/name`, when it was seen, the release time it carried.
pub type Deletion = (String, Timestamp, Option<Timestamp>);

/// Records every deletion of a reservation with the time it was seen and the release time the
/// last version of it carried.
#[derive(Clone, Default)]
pub struct DeletionLog {
    entries: Arc<Mutex<Vec<Deletion>>>,
}

impl DeletionLog {
    /// Starts watching the reservations of namespace `ns`.
    pub fn watch(client: &Client, ns: &str) -> (DeletionLog, JoinHandle<()>) {
        let log = DeletionLog::default();
        let entries = log.entries.clone();
        let api: Api<IPReservation> = Api::namespaced(client.clone(), ns);
        let task = tokio::spawn(async move {
            let mut events =
                std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
            while let Some(event) = events.next().await {
                if let Ok(watcher::Event::Delete(r)) = event {
                    let release = r
                        .status
                        .as_ref()
                        .and_then(|s| s.release_time.as_ref())
                        .map(|t| t.0);
                    entries.lock().unwrap().push((
                        format!("{}/{}", r.namespace().unwrap_or_default(), r.name_any()),
                        Timestamp::now(),
                        release,
                    ));
                }
            }
        });
        (log, task)
    }

    /// The deletions seen so far.
    pub fn entries(&self) -> Vec<Deletion> {
        self.entries.lock().unwrap().clone()
    }
}

/// Reads the controller's /metrics.
pub async fn scrape(addr: SocketAddr) -> String {
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).unwrap();
        let (_, body) = text.split_once("\r\n\r\n").expect("an HTTP reply");
        body.to_string()
    })
    .await
    .unwrap()
}

/// Waits for an Event with `reason` about the object `name` (events.k8s.io/v1) and returns its note.
pub async fn wait_event(client: &Client, ns: &str, kind: &str, name: &str, reason: &str) -> String {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    wait_for(&format!("an Event {reason} on {kind} {ns}/{name}"), || {
        let events = events.clone();
        async move {
            let list = events.list(&Default::default()).await.ok()?;
            list.items.into_iter().find_map(|e| {
                let about = e.regarding.as_ref()?;
                (e.reason.as_deref() == Some(reason)
                    && about.kind.as_deref() == Some(kind)
                    && about.name.as_deref() == Some(name))
                .then(|| e.note.clone().unwrap_or_default())
            })
        }
    })
    .await
}

/// Runs `scenario` (as admin) in a fresh namespace of the real control plane with a controller of
/// its own (one day's default retention, `adjust`ed), which runs as the chart's controller
/// ServiceAccount: exactly the chart's RBAC. The scenario is also given the controller's probe
/// address (`/metrics`).
pub async fn with_controller_settings<F, Fut>(
    prefix: &str,
    adjust: impl FnOnce(&mut Settings),
    scenario: F,
) where
    F: FnOnce(Client, String, std::net::SocketAddr) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let plane = plane::control_plane().await;
    plane::node_a(plane).await;
    let ns = plane
        .fresh_namespace(prefix)
        .await
        .expect("a fresh namespace");
    let client = plane.client().expect("an admin client");
    let mut settings = Settings::single(Duration::from_secs(86_400));
    settings.namespace = Some(ns.clone());
    adjust(&mut settings);
    let running = start_controller_with(plane::controller_client(plane).await, settings).await;
    scenario(client, ns, running.probe_addr).await;
    running.stop().await;
    plane
        .check()
        .expect("every control plane component still runs");
}
