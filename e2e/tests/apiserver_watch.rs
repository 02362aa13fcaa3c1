//! `kube_runtime::watcher` + `reflector` against the API test server: the store must end up equal
//! to the server's state after every injected fault (closed watches, 500/429 on list and watch,
//! delays, compaction → 410 → relist, pause + resume), with field and label selectors, and with
//! streaming lists.
//!
//! `selected_watches_and_relists` runs twice from one body (`both!`): against the API test server
//! and the real control plane (needs `make cluster-bins`). The others inject faults through the
//! test server's `/admin` endpoints (closed watches, failures, compaction, pause/resume), which a
//! real server has no way to do, so they are for the test server alone.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "fixtures/shared.rs"]
mod shared;

#[path = "fixtures/harness.rs"]
mod harness;

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use harness::{Backend, ipr, ipr_resource, iprs, start, wait_for};
use ipkeep_e2e::apiserver::{RequestFilter, Verb};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams},
    runtime::{
        WatchStreamExt,
        reflector::{self, Store, store::Writer},
        utils::Backoff,
        watcher,
    },
};
use serde_json::json;
use tokio::task::JoinHandle;

/// A short constant backoff: the default one (800 ms doubling) would only slow the tests down.
#[derive(Debug, Clone)]
struct QuickBackoff;

impl Iterator for QuickBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        Some(Duration::from_millis(50))
    }
}

impl Backoff for QuickBackoff {
    fn reset(&mut self) {}
}

/// A running reflector: its store, how many errors its watcher yielded, and its task.
struct Reflector<K: kube::Resource + Clone + 'static>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    store: Store<K>,
    errors: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl<K> Reflector<K>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    fn errors(&self) -> usize {
        self.errors.load(Ordering::SeqCst)
    }
}

fn spawn<K>(api: Api<K>, cfg: watcher::Config, writer: Writer<K>) -> Reflector<K>
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Send + Sync,
{
    let store = writer.as_reader();
    let errors = Arc::new(AtomicUsize::new(0));
    let counted = errors.clone();
    let task = tokio::spawn(async move {
        watcher(api, cfg)
            .backoff(QuickBackoff)
            .inspect(move |ev| {
                if ev.is_err() {
                    counted.fetch_add(1, Ordering::SeqCst);
                }
            })
            .reflect(writer)
            .for_each(|_| async {})
            .await;
    });
    Reflector {
        store,
        errors,
        task,
    }
}

fn spawn_iprs(api: Api<DynamicObject>, cfg: watcher::Config) -> Reflector<DynamicObject> {
    spawn(api, cfg, Writer::new(ipr_resource()))
}

/// name → resourceVersion of what a store holds.
fn snapshot<K: kube::Resource + Clone>(store: &Store<K>) -> BTreeMap<String, String>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    store
        .state()
        .iter()
        .map(|o| {
            (
                o.meta().name.clone().unwrap_or_default(),
                o.meta().resource_version.clone().unwrap_or_default(),
            )
        })
        .collect()
}

/// Waits until the store holds exactly `expected` (name → resourceVersion of the last write).
async fn wait_synced<K: kube::Resource + Clone>(
    what: &str,
    store: &Store<K>,
    expected: &BTreeMap<String, String>,
) where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    let what = format!("the reflector to be in sync {what}: expected {expected:?}");
    wait_for(&what, || {
        let ok = snapshot(store) == *expected;
        async move { ok.then_some(()) }
    })
    .await;
}

/// Waits until the watcher has reported more errors than `before` (proof that a fault was hit).
async fn wait_errors<K>(what: &str, r: &Reflector<K>, before: usize)
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    let what = format!("the watcher to report an error after {what}");
    wait_for(&what, || {
        let n = r.errors();
        async move { (n > before).then_some(()) }
    })
    .await;
}

/// Creates an IPReservation and records its resourceVersion in `expected`.
async fn create(
    api: &Api<DynamicObject>,
    expected: &mut BTreeMap<String, String>,
    name: &str,
    node: &str,
) {
    let o = api
        .create(&PostParams::default(), &ipr(name, node, &["10.0.0.1"]))
        .await
        .unwrap();
    expected.insert(name.to_string(), o.resource_version().unwrap());
}

async fn relabel(
    api: &Api<DynamicObject>,
    expected: &mut BTreeMap<String, String>,
    name: &str,
    value: &str,
) {
    let patch = Patch::Merge(json!({"metadata": {"labels": {"step": value}}}));
    let o = api
        .patch(name, &PatchParams::default(), &patch)
        .await
        .unwrap();
    expected.insert(name.to_string(), o.resource_version().unwrap());
}

fn filter(verb: Verb) -> RequestFilter {
    RequestFilter {
        verb: Some(verb),
        resource: Some("ipreservations".into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflector_stays_in_sync_across_every_fault() {
    let server = start().await;
    let api = iprs(&server.client(), "default");
    let mut expected = BTreeMap::new();
    create(&api, &mut expected, "a", "node-a").await;
    let r = spawn_iprs(api.clone(), watcher::Config::default());
    wait_synced("after the initial list", &r.store, &expected).await;
    create(&api, &mut expected, "b", "node-a").await;
    wait_synced("after a create", &r.store, &expected).await;

    // Every open watch closed: the watcher re-watches from its last resourceVersion.
    server.faults().close_watches();
    create(&api, &mut expected, "c", "node-b").await;
    wait_synced("after closed watches", &r.store, &expected).await;

    // Watch requests answered 500 then 429 (a 429 carries Retry-After).
    for status in [500, 429] {
        let before = r.errors();
        server.faults().fail_next(3, filter(Verb::Watch), status);
        server.faults().close_watches();
        wait_errors(&format!("{status} on watch"), &r, before).await;
        relabel(&api, &mut expected, "a", &format!("watch-{status}")).await;
        wait_synced(&format!("after {status} on watch"), &r.store, &expected).await;
    }

    // Compaction: resuming gets an in-stream 410 Expired; the watcher relists, and that list
    // first fails with 500 or 429.
    for status in [500, 429] {
        let before = r.errors();
        server.faults().compact();
        server.faults().fail_next(2, filter(Verb::List), status);
        server.faults().close_watches();
        wait_errors(&format!("compaction and {status} on list"), &r, before).await;
        relabel(&api, &mut expected, "b", &format!("list-{status}")).await;
        wait_synced(
            &format!("after 410 and {status} on list"),
            &r.store,
            &expected,
        )
        .await;
    }

    // A delete right after compaction, then a resume that must relist.
    server.faults().compact();
    api.delete("c", &DeleteParams::default()).await.unwrap();
    expected.remove("c");
    server.faults().close_watches();
    wait_synced("after a delete hidden by compaction", &r.store, &expected).await;

    // Slow responses.
    server.faults().set_delay(Duration::from_millis(300));
    relabel(&api, &mut expected, "a", "slow").await;
    server.faults().close_watches();
    create(&api, &mut expected, "d", "node-b").await;
    wait_synced("with delayed responses", &r.store, &expected).await;
    server.faults().set_delay(Duration::ZERO);

    // The server paused (connections dropped, nothing listening), then resumed on the same port
    // with its data.
    let before = r.errors();
    server.pause().await;
    wait_errors("the server paused", &r, before).await;
    server.resume().await.unwrap();
    relabel(&api, &mut expected, "d", "resumed").await;
    create(&api, &mut expected, "e", "node-a").await;
    wait_synced("after pause and resume", &r.store, &expected).await;

    r.task.abort();
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn field_and_label_selected_watches() {
    let server = start().await;
    let api = iprs(&server.client(), "default");
    let mut all = BTreeMap::new();
    create(&api, &mut all, "a", "node-a").await;
    create(&api, &mut all, "b", "node-b").await;
    relabel(&api, &mut all, "a", "web").await;

    let by_node = spawn_iprs(
        api.clone(),
        watcher::Config::default().fields("spec.nodeName=node-a"),
    );
    let by_label = spawn_iprs(api.clone(), watcher::Config::default().labels("step=web"));
    let only = |names: &[&str], all: &BTreeMap<String, String>| -> BTreeMap<String, String> {
        all.iter()
            .filter(|(k, _)| names.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    wait_synced("for node-a", &by_node.store, &only(&["a"], &all)).await;
    wait_synced("for step=web", &by_label.store, &only(&["a"], &all)).await;

    create(&api, &mut all, "c", "node-a").await;
    relabel(&api, &mut all, "b", "web").await;
    wait_synced(
        "for node-a after a create",
        &by_node.store,
        &only(&["a", "c"], &all),
    )
    .await;
    wait_synced(
        "for step=web after a relabel",
        &by_label.store,
        &only(&["a", "b"], &all),
    )
    .await;

    // Objects that stop matching leave the selected stores (the server sends DELETED).
    let moved = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"nodeName": "node-b"}})),
        )
        .await
        .unwrap();
    all.insert("a".into(), moved.resource_version().unwrap());
    relabel(&api, &mut all, "b", "other").await;
    wait_synced(
        "for node-a after a move away",
        &by_node.store,
        &only(&["c"], &all),
    )
    .await;
    wait_synced(
        "for step=web after a relabel away",
        &by_label.store,
        &only(&["a"], &all),
    )
    .await;

    // And a relist after compaction honours the selector too.
    server.faults().compact();
    server.faults().close_watches();
    let back = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"nodeName": "node-a"}})),
        )
        .await
        .unwrap();
    all.insert("a".into(), back.resource_version().unwrap());
    wait_synced(
        "for node-a after compaction",
        &by_node.store,
        &only(&["a", "c"], &all),
    )
    .await;

    // Pods selected by node, as the node agent's pod watch does.
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let (pod_store, pod_writer) = reflector::store::<Pod>();
    let pod_reflector = spawn(
        Api::<Pod>::all(server.client()),
        watcher::Config::default().fields("spec.nodeName=node-a"),
        pod_writer,
    );
    let mut on_a = BTreeMap::new();
    for (name, node) in [("p-a", "node-a"), ("p-b", "node-b")] {
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}}))
        .unwrap();
        let created = pods.create(&PostParams::default(), &p).await.unwrap();
        if node == "node-a" {
            on_a.insert(name.to_string(), created.resource_version().unwrap());
        }
    }
    wait_synced("for pods on node-a", &pod_store, &on_a).await;

    for r in [by_node.task, by_label.task, pod_reflector.task] {
        r.abort();
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_lists_sync_and_recover() {
    let server = start().await;
    let api = iprs(&server.client(), "default");
    let mut expected = BTreeMap::new();
    for name in ["a", "b", "c"] {
        create(&api, &mut expected, name, "node-a").await;
    }
    let r = spawn_iprs(api.clone(), watcher::Config::default().streaming_lists());
    wait_synced("after the initial streamed events", &r.store, &expected).await;
    create(&api, &mut expected, "d", "node-b").await;
    api.delete("a", &DeleteParams::default()).await.unwrap();
    expected.remove("a");
    wait_synced("after changes", &r.store, &expected).await;

    let before = r.errors();
    server.faults().compact();
    server.faults().close_watches();
    wait_errors("compaction", &r, before).await;
    relabel(&api, &mut expected, "b", "after-410").await;
    wait_synced("after 410 and a new streaming list", &r.store, &expected).await;

    r.task.abort();
    server.shutdown().await;
}

/// Field- and label-selected watchers, a streaming-list watcher, and a relist (a new watcher
/// started after the fact) all converge on the server's state through creates, moves in and out
/// of a selector, and deletes — held against both servers.
async fn selected_watches_and_relists(b: &Backend) {
    let ns = b.namespace("watch").await;
    let api = iprs(&b.client(), &ns);
    let only = |names: &[&str], all: &BTreeMap<String, String>| -> BTreeMap<String, String> {
        all.iter()
            .filter(|(k, _)| names.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let mut all = BTreeMap::new();
    create(&api, &mut all, "a", "node-a").await;
    create(&api, &mut all, "b", "node-b").await;
    relabel(&api, &mut all, "a", "web").await;

    let by_node = spawn_iprs(
        api.clone(),
        watcher::Config::default().fields("spec.nodeName=node-a"),
    );
    let by_label = spawn_iprs(api.clone(), watcher::Config::default().labels("step=web"));
    let streaming = spawn_iprs(api.clone(), watcher::Config::default().streaming_lists());
    wait_synced("for node-a", &by_node.store, &only(&["a"], &all)).await;
    wait_synced("for step=web", &by_label.store, &only(&["a"], &all)).await;
    wait_synced("with a streaming list", &streaming.store, &all).await;

    create(&api, &mut all, "c", "node-a").await;
    relabel(&api, &mut all, "b", "web").await;
    let moved = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"nodeName": "node-b"}})),
        )
        .await
        .unwrap();
    all.insert("a".into(), moved.resource_version().unwrap());
    wait_synced(
        "for node-a after a move away",
        &by_node.store,
        &only(&["c"], &all),
    )
    .await;
    wait_synced(
        "for step=web after a relabel",
        &by_label.store,
        &only(&["a", "b"], &all),
    )
    .await;
    wait_synced("with a streaming list after writes", &streaming.store, &all).await;

    api.delete("b", &DeleteParams::default()).await.unwrap();
    all.remove("b");
    wait_synced(
        "for step=web after a delete",
        &by_label.store,
        &only(&["a"], &all),
    )
    .await;
    wait_synced(
        "with a streaming list after a delete",
        &streaming.store,
        &all,
    )
    .await;

    // A relist: a watcher started now lists what is there and then follows.
    by_node.task.abort();
    let relisted = spawn_iprs(
        api.clone(),
        watcher::Config::default().fields("spec.nodeName=node-b"),
    );
    wait_synced(
        "for node-b after a relist",
        &relisted.store,
        &only(&["a"], &all),
    )
    .await;
    create(&api, &mut all, "d", "node-b").await;
    wait_synced(
        "for node-b after a relist and a create",
        &relisted.store,
        &only(&["a", "d"], &all),
    )
    .await;
    for r in [&by_label, &streaming, &relisted] {
        assert_eq!(
            r.errors(),
            0,
            "{}: no watcher errors without faults",
            b.label()
        );
        r.task.abort();
    }
}

both!(
    selected_watches_and_relists,
    super::selected_watches_and_relists
);
