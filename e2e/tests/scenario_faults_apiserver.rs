//! Scenario 7's API faults, on the API test server (which can inject them) with a small
//! StatefulSet stand-in there (it keeps pods `<name>-0..N-1` existing, as the StatefulSet
//! controller does, bound to a simulated node): the real stand-in nodes with their agents and the
//! controller binary go through dropped watches, 500s on pod reads and reservation writes, a
//! compaction (410) and an API server restart while a pod is deleted and re-created and another
//! is added — and it still ends right: the pods keep their addresses, every reservation is Bound
//! with its file on the node, and no reservation was ever deleted (each keeps its object UID).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "fixtures/shared.rs"]
mod shared;

#[path = "system/mod.rs"]
mod system;

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use ipkeep_e2e::apiserver::{RequestFilter, ServerOptions, TestServer, Verb};
use ipkeep_operator::crd::{IPReservation, Phase};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, ResourceExt,
    api::{ListParams, PostParams},
};
use serde_json::json;
use system::*;

/// The StatefulSet stand-in: keeps `name-0..replicas-1` existing on `node`, annotated to be kept.
fn statefulset_standin(
    client: kube::Client,
    name: &'static str,
    replicas: Arc<AtomicU32>,
    node: String,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let pods: Api<Pod> = Api::namespaced(client, "default");
        loop {
            let n = replicas.load(Ordering::Relaxed);
            for i in 0..n {
                let pod_name = format!("{name}-{i}");
                if let Ok(None) = pods.get_opt(&pod_name).await {
                    let pod: Pod = serde_json::from_value(json!({
                        "apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": pod_name, "labels": {"app": name},
                            "annotations": {"ipkeep.dev/retain": "true", "ipkeep.dev/retain-for": "1h"}},
                        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                            "containers": [{"name": "app", "image": "registry.invalid/none:1"}]}
                    }))
                    .unwrap();
                    let _ = pods.create(&PostParams::default(), &pod).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

async fn reservation_uids(api: &Api<IPReservation>) -> BTreeMap<String, String> {
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|r| (r.name_any(), r.uid().unwrap_or_default()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_watches_500s_compaction_and_a_restart_still_end_right() {
    if skipped_on_real_cluster(
        "dropped_watches_500s_compaction_and_a_restart_still_end_right",
        "API test server (its fault injection)",
    ) {
        return;
    }
    require_root_and_tools();
    let server = TestServer::start(ServerOptions {
        crd_dirs: vec![repo_crds()],
        ..ServerOptions::default()
    })
    .await
    .expect("start the API test server");
    let pid = std::process::id();
    let dir = Scratch::new("e2e-apifaults");
    let bin_dir = cni_bin_dir(dir.path());
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let node_name = format!("apifaults-a-{pid}");
    let config = node_config(
        &node_name,
        vec![next_v4_cidr()],
        &dir.join("node-a"),
        &bin_dir,
        &kubeconfig,
    );
    let kube_config = kube::Config::new(server.url().parse().unwrap());
    let mut node = SimNode::new(config, kube_config);
    node.start();
    let mut controller =
        spawn_controller(&kubeconfig, "default", "ipkeep", "apifaults-1", dir.path());

    let client = server.client();
    let replicas = Arc::new(AtomicU32::new(3));
    let standin = statefulset_standin(client.clone(), "web", replicas.clone(), node_name.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let iprs: Api<IPReservation> = Api::namespaced(client.clone(), "default");
    let running = |names: &'static [&'static str]| {
        let pods = pods.clone();
        async move {
            let mut out = BTreeMap::new();
            for n in names {
                let p = pods.get_opt(n).await.ok()??;
                if p.metadata.deletion_timestamp.is_some() {
                    return None;
                }
                out.insert((*n).to_owned(), RunningPod::of(&p)?);
            }
            Some(out)
        }
    };
    let bound = |pods: BTreeMap<String, RunningPod>| {
        let iprs = iprs.clone();
        async move {
            for p in pods.values() {
                let r = iprs.get_opt(&p.name).await.ok()??;
                let ok = phase(&r) == Some(Phase::Bound)
                    && r.status.as_ref()?.pod_uid.as_deref() == Some(p.uid.as_str())
                    && ips(&r) == p.ips.iter().map(|i| i.to_string()).collect::<Vec<_>>();
                if !ok {
                    return None;
                }
            }
            Some(())
        }
    };
    let before = wait_for("web-0..2 Running", || running(&["web-0", "web-1", "web-2"])).await;
    wait_for("web-0..2 Bound", || bound(before.clone())).await;
    let uids = reservation_uids(&iprs).await;

    // The faults, while web-1 is deleted (and re-created by the stand-in) and web-3 added.
    let faults = server.faults();
    faults.close_watches();
    faults.fail_next(
        5,
        RequestFilter {
            verb: Some(Verb::Get),
            resource: Some("pods".into()),
        },
        500,
    );
    faults.fail_next(
        3,
        RequestFilter {
            verb: Some(Verb::Patch),
            resource: Some("ipreservations".into()),
        },
        500,
    );
    pods.delete("web-1", &Default::default()).await.unwrap();
    replicas.store(4, Ordering::Relaxed);
    faults.compact();
    faults.close_watches();
    faults.restart(Duration::from_secs(1));

    let after = wait_for("web-0..3 Running, web-1 re-created", || async {
        let a = running(&["web-0", "web-1", "web-2", "web-3"]).await?;
        (a["web-1"].uid != before["web-1"].uid).then_some(a)
    })
    .await;
    for n in ["web-0", "web-1", "web-2"] {
        assert_eq!(after[n].ips, before[n].ips, "{n} lost its addresses");
    }
    wait_for("web-0..3 Bound to their pods", || bound(after.clone())).await;
    for n in ["web-0", "web-1", "web-2", "web-3"] {
        let file = node.reserved_file("default", n);
        wait_for(&format!("{} on the node", file.display()), || async {
            file.exists().then_some(())
        })
        .await;
    }
    let now = reservation_uids(&iprs).await;
    for (name, uid) in &uids {
        assert_eq!(
            now.get(name),
            Some(uid),
            "reservation {name} was deleted and re-made"
        );
    }
    standin.abort();
    controller.kill();
    node.stop();
}
