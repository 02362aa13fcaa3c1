//! The upgrade from the previous release to the working tree, the rollback to it, and the
//! upgrade again, on two real nodes, as a user does them, from a registry: both releases (the
//! previous one's chart and image built from its git commit by
//! `scripts/build-previous-release.sh`, `make previous-release`; `charts/ipkeep` and `make
//! image`'s image) pushed to the harness's registry (TLS, a login), the nodes trusting its CA,
//! the login in the pull secret `imagePullSecrets` names. `helm install ipkeep
//! oci://…/charts/ipkeep --version <previous>` with `cni.replaceHostLocal=true`: the kubelets pull
//! its image; annotated StatefulSets with Bound reservations (`web`, node A) and Released ones
//! (`db`, node B, scaled to 0); `helm upgrade ipkeep oci://… --version <new> --reuse-values --set
//! image.tag=<new>` (what users type, docs/chart.md) while `web-0` is deleted: the kubelets pull
//! the new image; `helm rollback` to the previous release while `web-1` is; then `helm upgrade …
//! --reset-then-reuse-values --set image.tag=<new>` while `web-0` is again.
//!
//! After each: every reservation is still there with its addresses, node, phase, pod UID and
//! release time (none rewritten; the churned pod's Bound to its successor with the same
//! addresses), each with its file on its node's disk; the deleted pod and the Released `db` pods
//! (scaled back) return with their addresses. After the upgrade the cluster's CRD is the working
//! tree's (the controller applied it: nothing lacking, the release annotation, its field
//! manager, `kubectl get ipr`'s `UNPROTECTED` column); after the rollback it is still that newer
//! CRD, which the previous release's controller and agents serve (they bind, release and write
//! files through it). A watch from the start sees no reservation deleted and no reservation's
//! addresses or node ever change. All along, a thread per node reads the node's
//! `/opt/cni/bin/host-local` every 10 ms (the stand-in for an ADD at any instant): every read is
//! one of the two releases' `ipkeep` plugins, byte for byte, never anything else, never missing;
//! the counts of each are printed.
//!
//! One test: its steps act on the one release in order. Needs root, `make cluster-bins`,
//! `make node-bins`, `make registry-bin`, `make image` and `make previous-release`; fails
//! loudly, naming what to run.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::testkit;
use std::{
    collections::{BTreeMap, BTreeSet},
    hash::{DefaultHasher, Hash, Hasher},
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use ipkeep_e2e::cluster::{
    Registry,
    realnode::{Cluster, RealNode},
};
use ipkeep_e2e::testkit::realnode::{RELEASE, RELEASE_NS, assert_on_eth0, registry};
use ipkeep_e2e::testkit::system::{Change, ChartCluster, Options, RunningPod, System, ips, phase};
use ipkeep_e2e::testkit::{kubectl_ok, realnode, wait_for};
use ipkeep_operator::{
    api::{IPReservation, Phase},
    crd_apply::{self, RELEASE_ANNOTATION},
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, CustomResourceExt};

/// The previous release's build (`scripts/build-previous-release.sh --print-dir`): its image
/// archive and chart, or the test fails naming what to run.
fn previous_release() -> PathBuf {
    let script = testkit::repo_root().join("scripts/build-previous-release.sh");
    let printed = ipkeep_e2e::command::stdout_of(
        std::process::Command::new(&script).arg("--print-dir"),
        None,
    )
    .unwrap_or_else(|e| panic!("{}", ipkeep_e2e::error_chain(&e)));
    let dir = PathBuf::from(printed.trim());
    for part in ["ipkeep.oci.tar", "chart/Chart.yaml"] {
        assert!(
            dir.join(part).is_file(),
            "the previous release is not built ({} is missing): run `make previous-release` (scripts/build-previous-release.sh)",
            dir.join(part).display()
        );
    }
    dir
}

/// `helm rollback` of the release to revision `revision` (its values and chart: nothing is
/// fetched), waiting for its workloads; then every pod of the release updated and Ready.
async fn rollback(c: &Cluster, revision: &str) {
    realnode::helm(
        c,
        &[
            "rollback",
            RELEASE,
            revision,
            "--namespace",
            RELEASE_NS,
            "--wait",
            "--timeout",
            "3m",
        ],
    );
    realnode::release_ready(c).await;
}

/// What the upgrade and the rollback must not change about a reservation.
#[derive(Debug, Clone, PartialEq)]
struct Kept {
    ips: Vec<String>,
    node: String,
    phase: Option<Phase>,
    pod_uid: Option<String>,
    release_time: Option<String>,
}

/// The namespace's reservations, by name.
async fn reservations(sys: &System) -> BTreeMap<String, Kept> {
    sys.reservations()
        .list(&Default::default())
        .await
        .expect("list reservations")
        .items
        .into_iter()
        .map(|r| {
            let status = r.status.clone().unwrap_or_default();
            (
                r.metadata.name.clone().unwrap_or_default(),
                Kept {
                    ips: ips(&r),
                    node: r.spec.node_name.clone(),
                    phase: status.phase,
                    pod_uid: status.pod_uid,
                    release_time: status.release_time.map(|t| t.0.to_string()),
                },
            )
        })
        .collect()
}

/// Every reservation of `before` is there unchanged, but `churned`'s, which holds the same
/// addresses on the same node for its successor `back`.
async fn assert_kept(
    sys: &System,
    before: &BTreeMap<String, Kept>,
    churned: &RunningPod,
    during: &str,
) {
    let after = reservations(sys).await;
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>(),
        "the reservations after {during}"
    );
    for (name, kept) in before {
        let now = &after[name];
        if *name == churned.name {
            let want = Kept {
                phase: Some(Phase::Bound),
                pod_uid: Some(churned.uid.clone()),
                release_time: None,
                ..kept.clone()
            };
            assert_eq!(now, &want, "{name} after {during} (its pod re-created)");
        } else {
            assert_eq!(now, kept, "{name} after {during}");
        }
    }
}

/// After `during`, in which `deleted` was deleted: its successor runs with its addresses and
/// Bound, every other reservation of `before` is unchanged, and every file is on its node.
async fn returned_and_kept(
    sys: &System,
    c: &Cluster,
    before: &BTreeMap<String, Kept>,
    deleted: &RunningPod,
    during: &str,
) {
    let back = sys.wait_recreated(&deleted.name, &deleted.uid).await;
    assert_eq!(
        back.ips, deleted.ips,
        "{}'s addresses after {during}",
        deleted.name
    );
    sys.wait_bound(&back).await;
    assert_on_eth0(sys, &back).await;
    assert_kept(sys, before, &back, during).await;
    assert_files(sys, c, during).await;
}

/// Every reservation of the namespace has its file on its node's disk, naming its addresses.
async fn assert_files(sys: &System, c: &Cluster, during: &str) {
    for (name, kept) in reservations(sys).await {
        let file = realnode::reserved_file(realnode::node(c, &kept.node), &sys.ns, &name);
        let text = wait_for(
            &format!("{}'s file {} after {during}", name, file.display()),
            || async { std::fs::read_to_string(&file).ok() },
        )
        .await;
        for ip in &kept.ips {
            assert!(text.contains(ip.as_str()), "{}: {text}", file.display());
        }
    }
}

/// Scales `db` back to `pods.len()`: each returns with its addresses, Bound to it; then to 0
/// again: each Released. Returns the pods as they came back.
async fn db_returns_then_leaves(sys: &System, pods: &BTreeMap<String, RunningPod>, during: &str) {
    sys.kubectl(&[
        "scale",
        "statefulset",
        "db",
        &format!("--replicas={}", pods.len()),
    ]);
    let names: Vec<&str> = pods.keys().map(String::as_str).collect();
    let back = sys.wait_running("app=db", &names).await;
    for (name, pod) in &back {
        assert_eq!(
            pod.ips, pods[name].ips,
            "{name} returned with other addresses after {during}"
        );
        assert_ne!(pod.uid, pods[name].uid);
        sys.wait_bound(pod).await;
        assert_on_eth0(sys, pod).await;
    }
    released(sys, "db", &names).await;
}

/// Scales `set` to 0 and waits until the reservations of `names` are Released.
async fn released(sys: &System, set: &str, names: &[&str]) {
    sys.kubectl(&["scale", "statefulset", set, "--replicas=0"]);
    for name in names {
        sys.wait_reservation(name, "Released", |r| phase(r) == Some(Phase::Released))
            .await;
    }
}

/// The cluster's IPReservation CRD.
async fn cluster_crd(c: &Cluster) -> CustomResourceDefinition {
    let crds: Api<CustomResourceDefinition> = Api::all(c.plane().client().unwrap());
    crds.get(IPReservation::crd_name()).await.expect("the CRD")
}

/// What the working tree's CRD has that the cluster's lacks.
async fn crd_lacks(c: &Cluster) -> Vec<String> {
    let ours = serde_json::to_value(IPReservation::crd()).unwrap();
    let theirs = serde_json::to_value(cluster_crd(c).await).unwrap();
    crd_apply::missing(&ours, &theirs)
}

/// The release annotation of the cluster's CRD.
async fn crd_release(c: &Cluster) -> Option<String> {
    cluster_crd(c)
        .await
        .metadata
        .annotations
        .and_then(|a| a.get(RELEASE_ANNOTATION).cloned())
}

/// One node's `host-local`, read every 10 ms by a thread of its own until stopped.
struct HostLocalWatch {
    node: String,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Looks>,
}

/// What a [`HostLocalWatch`] read: how many times each content (by hash) was seen, and the reads
/// that failed.
#[derive(Debug, Default)]
struct Looks {
    seen: BTreeMap<u64, u64>,
    failed: Vec<String>,
}

fn content_hash(bytes: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

impl HostLocalWatch {
    fn start(node: &RealNode) -> HostLocalWatch {
        let path = node.host_path("/opt/cni/bin/host-local").unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut looks = Looks::default();
            while !stopped.load(Ordering::Relaxed) {
                match std::fs::read(&path) {
                    Ok(bytes) => *looks.seen.entry(content_hash(&bytes)).or_default() += 1,
                    Err(e) => looks.failed.push(e.to_string()),
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            looks
        });
        HostLocalWatch {
            node: node.name().to_owned(),
            stop,
            thread,
        }
    }

    /// Stops it; asserts every read was one of `plugins` (name → bytes' hash) and prints how
    /// many of each.
    fn finish(self, plugins: &BTreeMap<&str, u64>) {
        self.stop.store(true, Ordering::Relaxed);
        let looks = self.thread.join().unwrap();
        assert!(
            looks.failed.is_empty(),
            "{}: host-local could not be read {} times: {:?}",
            self.node,
            looks.failed.len(),
            looks.failed.first()
        );
        let known: BTreeSet<u64> = plugins.values().copied().collect();
        let others: Vec<(&u64, &u64)> = looks
            .seen
            .iter()
            .filter(|(h, _)| !known.contains(h))
            .collect();
        assert!(
            others.is_empty(),
            "{}: host-local was something else than ipkeep ({} contents, read this many times: {others:?})",
            self.node,
            others.len()
        );
        let counts: Vec<String> = plugins
            .iter()
            .map(|(name, h)| format!("{name} {}", looks.seen.get(h).copied().unwrap_or(0)))
            .collect();
        eprintln!(
            "{}: host-local read {} times every 10 ms: {}; nothing else",
            self.node,
            looks.seen.values().sum::<u64>(),
            counts.join(", ")
        );
    }
}

/// The `ipkeep` plugin a node's `/opt/cni/bin` holds now, once `host-local` is the same.
async fn installed_plugin(node: &RealNode, other_than: Option<u64>) -> u64 {
    let bin = node.host_path("/opt/cni/bin").unwrap();
    wait_for(
        &format!(
            "{}: host-local and ipkeep the same plugin{}",
            node.name(),
            if other_than.is_some() {
                ", the other release's"
            } else {
                ""
            }
        ),
        || async {
            let ipkeep = std::fs::read(bin.join("ipkeep")).ok()?;
            let host_local = std::fs::read(bin.join("host-local")).ok()?;
            let h = content_hash(&ipkeep);
            (ipkeep == host_local && Some(h) != other_than).then_some(h)
        },
    )
    .await
}

/// The controller Deployment's image.
fn controller_image(c: &Cluster) -> String {
    kubectl_ok(
        c.plane(),
        &[
            "-n",
            RELEASE_NS,
            "get",
            "deployment/ipkeep-controller",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ],
        None,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_from_the_previous_release_and_rollback_keep_every_reservation() {
    let t0 = Instant::now();
    let previous = previous_release();
    let previous_chart = previous.join("chart");
    let previous_version = registry::chart_field(&previous_chart, "version");
    let version = registry::chart_field(&testkit::chart_dir(), "version");
    assert_ne!(previous_version, version, "the previous release is another");
    // Two plain nodes with nothing installed, to this test alone: it installs the releases
    // itself, and the cluster goes with it.
    let held = realnode::use_shape(
        realnode::Shape::bare(2, realnode::PLAIN),
        realnode::Access::Spoils,
    )
    .await;
    let c = held.cluster().expect("this binary's own nodes");
    // Both releases on the registry, the nodes trusting it, the login in the pull secret.
    let registry_server = Registry::start()
        .await
        .unwrap_or_else(|e| panic!("{}", ipkeep_e2e::error_chain(&e)));
    let old = registry::publish(
        c,
        &registry_server,
        &previous.join("ipkeep.oci.tar"),
        &previous_chart,
    );
    let new = registry::publish(
        c,
        &registry_server,
        &realnode::image_archive(),
        &testkit::chart_dir(),
    );
    assert_ne!(old.image(), new.image(), "each release its own image tag");
    registry::use_registry(c, &registry_server);
    let started = t0.elapsed();

    // The previous release, as a user installs it from a registry.
    let t = Instant::now();
    let images = registry::node_images(c);
    registry::install(c, &registry_server, &old, &[]).await;
    let installed = t.elapsed();
    registry::assert_pulled(c, &old, &images).await;
    let lacked = crd_lacks(c).await;
    eprintln!("the previous release's CRD lacks: {lacked:?}");
    assert_eq!(crd_release(c).await, None, "no controller applied it yet");
    let sys = System::on(
        "upgrade",
        Options::default(),
        ChartCluster {
            kubeconfig: c.plane().kubeconfig_path().to_path_buf(),
            kubectl: c.plane().bin("kubectl"),
        },
    )
    .await;
    let (node_a, node_b) = (sys.node_name(0).to_owned(), sys.node_name(1).to_owned());
    let history = sys.record_reservations();
    let web = sys.run_retained("web", 2, &node_a).await;
    let db = sys.run_retained("db", 2, &node_b).await;
    released(&sys, "db", &["db-0", "db-1"]).await;
    let mut plugins = BTreeMap::new();
    for n in c.nodes() {
        let h = installed_plugin(n, None).await;
        assert_eq!(*plugins.entry("previous").or_insert(h), h, "one plugin");
    }
    let watches: Vec<HostLocalWatch> = c.nodes().iter().map(HostLocalWatch::start).collect();
    let before = reservations(&sys).await;
    assert_files(&sys, c, "the install").await;

    // The upgrade users type, web-0 deleted as it starts.
    let images = registry::node_images(c);
    let t = Instant::now();
    sys.kubectl(&["delete", "pod", "web-0", "--wait=false"]);
    registry::upgrade(c, &registry_server, &new, "--reuse-values").await;
    let upgraded = t.elapsed();
    registry::assert_pulled(c, &new, &images).await;
    returned_and_kept(&sys, c, &before, &web["web-0"], "the upgrade").await;
    for n in c.nodes() {
        let h = installed_plugin(n, Some(plugins["previous"])).await;
        assert_eq!(*plugins.entry("new").or_insert(h), h, "one plugin");
    }
    // The CRD is this release's, applied by its controller.
    assert_eq!(
        crd_lacks(c).await,
        Vec::<String>::new(),
        "after the upgrade"
    );
    assert_eq!(crd_release(c).await.as_deref(), Some(version.as_str()));
    let managers: Vec<String> = cluster_crd(c)
        .await
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.operation.as_deref() == Some("Apply"))
        .filter_map(|m| m.manager)
        .collect();
    assert_eq!(managers, [crd_apply::FIELD_MANAGER], "who applied the CRD");
    let table = sys.kubectl(&["get", "ipr"]);
    assert!(
        table.lines().next().unwrap().contains("UNPROTECTED"),
        "{table}"
    );
    db_returns_then_leaves(&sys, &db, "the upgrade").await;

    // The rollback, web-1 deleted as it starts.
    let before = reservations(&sys).await;
    let t = Instant::now();
    sys.kubectl(&["delete", "pod", "web-1", "--wait=false"]);
    rollback(c, "1").await;
    let rolled_back = t.elapsed();
    assert!(
        controller_image(c).ends_with(&format!(":{previous_version}")),
        "the previous release's controller after the rollback: {}",
        controller_image(c)
    );
    returned_and_kept(&sys, c, &before, &web["web-1"], "the rollback").await;
    for n in c.nodes() {
        let h = installed_plugin(n, Some(plugins["new"])).await;
        assert_eq!(
            h,
            plugins["previous"],
            "{}: the previous plugin back",
            n.name()
        );
    }
    // The newer CRD stays, and the previous release works through it.
    assert_eq!(
        crd_lacks(c).await,
        Vec::<String>::new(),
        "after the rollback"
    );
    assert_eq!(crd_release(c).await.as_deref(), Some(version.as_str()));
    db_returns_then_leaves(&sys, &db, "the rollback").await;
    assert_files(&sys, c, "the rollback, db released again").await;

    // The upgrade again, the new chart's defaults under the last release's values, web-0
    // deleted as it starts.
    let web_now = sys.wait_running("app=web", &["web-0", "web-1"]).await;
    let before = reservations(&sys).await;
    let t = Instant::now();
    sys.kubectl(&["delete", "pod", "web-0", "--wait=false"]);
    registry::upgrade(c, &registry_server, &new, "--reset-then-reuse-values").await;
    let upgraded_again = t.elapsed();
    assert_eq!(
        controller_image(c),
        new.image(),
        "the new release's controller after the second upgrade"
    );
    let reset = "the upgrade with --reset-then-reuse-values";
    returned_and_kept(&sys, c, &before, &web_now["web-0"], reset).await;
    for n in c.nodes() {
        let h = installed_plugin(n, Some(plugins["previous"])).await;
        assert_eq!(h, plugins["new"], "{}: the new plugin back", n.name());
    }
    db_returns_then_leaves(&sys, &db, reset).await;

    for w in watches {
        w.finish(&plugins);
    }
    assert!(!history.any_deleted(), "a reservation was deleted");
    let mut placed: BTreeMap<String, BTreeSet<(Vec<String>, String)>> = BTreeMap::new();
    for (_, change) in history.changes() {
        if let Change::Applied(r) = change {
            placed
                .entry(r.metadata.name.clone().unwrap_or_default())
                .or_default()
                .insert((ips(&r), r.spec.node_name.clone()));
        }
    }
    for (name, seen) in &placed {
        assert_eq!(
            seen.len(),
            1,
            "{name}'s addresses or node changed: {seen:?}"
        );
    }
    eprintln!(
        "realnode upgrade from the registry: {previous_version} → {version} → {previous_version} → {version}: nodes, registry and pushes {:.1}s, install {:.1}s, upgrade (--reuse-values) {:.1}s, rollback {:.1}s, upgrade (--reset-then-reuse-values) {:.1}s, total {:.1}s",
        started.as_secs_f64(),
        installed.as_secs_f64(),
        upgraded.as_secs_f64(),
        rolled_back.as_secs_f64(),
        upgraded_again.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
}
