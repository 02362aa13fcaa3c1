//! The API loses reservations, the nodes do not (issue 45, `operator/src/rules/loss.rs`): with the
//! chart installed and two retained pods away (their reservations Released), `kubectl delete crd
//! ipreservations.ipkeep.dev` deletes every reservation. The agent keeps both files and says so
//! (its pod's condition `ipkeep.dev/ReservationsLost`, a Warning `ReservationLost` on the Node);
//! a pod started meanwhile on that node, with host-local's cursor set right before the away pod's
//! address, does not get it. The CRD applied again, `ipkeep-operator recover` shows what it would
//! create, `--apply` creates both with their release time, a second run creates nothing; the
//! away pod comes back with its address; `kubectl delete ipr` of the other still frees its
//! address at once (the file gone, nothing reported lost).
//!
//! The second test restores etcd from an `etcdctl snapshot save` taken before a pod was
//! reserved: the reservation is absent from the restored API, its file kept, and `recover` brings
//! it back.
//!
//! The two tests share a cluster of their own ([`SHAPE`]): the first deletes the CRD, holding the
//! nodes alone, and leaves every reservation recovered; the second takes the control plane back
//! in time, and the cluster goes with it. Needs root, `make cluster-bins`, `make etcd-tools-bins`, `make node-bins` and `make image`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use ipkeep_e2e::cluster::plane::backup::Revisions;
use ipkeep_e2e::cluster::realnode::Cluster;
use ipkeep_e2e::testkit::realnode::{self, RELEASE_NS};
use ipkeep_e2e::testkit::system::{System, phase, retain, statefulset};
use ipkeep_e2e::testkit::{crd_file, kubectl_ok, operator_binary, wait_for};
use ipkeep_operator::api::Phase;
use ipkeep_operator::api::lost::{LostReport, POD_CONDITION, RestoredKind};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

const CRD: &str = "ipreservations.ipkeep.dev";

/// Two plain nodes with the chart as the README installs it, and its Normal Events on: a shape of
/// this module's own, so its cluster starts fresh. A CRD deletion and `recover` act on every
/// reservation of the cluster, so what the tests before left on a shared one (retained pods,
/// their reservations) would be lost and recovered with this test's, and its counts would be
/// theirs too.
const SHAPE: realnode::Shape = realnode::Shape {
    nodes: 2,
    network: realnode::PLAIN,
    chart: Some(&[
        "--set",
        "cni.replaceHostLocal=true",
        "--set",
        "controller.normalEvents=true",
    ]),
};

/// What the agent of `node` reports (none without the condition).
async fn reports(c: &Cluster, node: &str) -> Vec<LostReport> {
    let pods: Api<Pod> = Api::namespaced(c.plane().client().unwrap(), RELEASE_NS);
    let lp = ListParams::default()
        .labels("app.kubernetes.io/component=agent")
        .fields(&format!("spec.nodeName={node}"));
    let list = pods.list(&lp).await.map(|l| l.items).unwrap_or_default();
    list.iter()
        .filter_map(|p| p.status.as_ref()?.conditions.clone())
        .flatten()
        .filter(|c| c.type_ == POD_CONDITION)
        .filter_map(|c| serde_json::from_str::<LostReport>(c.message.as_deref()?).ok())
        .collect()
}

/// What the agent of `node` reports lost in namespace `ns`, by pod name.
async fn reported_lost(c: &Cluster, node: &str, ns: &str) -> Vec<String> {
    let mut names: Vec<String> = reports(c, node)
        .await
        .into_iter()
        .flat_map(|r| r.lost)
        .filter(|l| l.pod.namespace() == ns)
        .map(|l| l.pod.name().to_owned())
        .collect();
    names.sort();
    names
}

/// What the agent of `node` reports a restore brought back in namespace `ns`: pod name and kind.
async fn reported_restored(c: &Cluster, node: &str, ns: &str) -> Vec<(String, RestoredKind)> {
    let mut found: Vec<(String, RestoredKind)> = reports(c, node)
        .await
        .into_iter()
        .flat_map(|r| r.restored)
        .filter(|r| r.pod.namespace() == ns)
        .map(|r| (r.pod.name().to_owned(), r.kind))
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

/// `ipkeep-operator recover [--apply] --output json` as an admin: its outcomes of `ns`, as
/// (action, pod name), and its exit status.
fn recover(c: &Cluster, ns: &str, apply: bool) -> (Vec<(String, String)>, bool) {
    let mut args = vec!["recover", "--namespace", RELEASE_NS, "--output", "json"];
    if apply {
        args.push("--apply");
    }
    let out = Command::new(operator_binary())
        .args(&args)
        .env("KUBECONFIG", c.plane().kubeconfig_path())
        .output()
        .expect("failed to run ipkeep-operator recover");
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!(
        "recover{}: {text}{}",
        if apply { " --apply" } else { "" },
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("recover printed no JSON ({e}): {text}"));
    let prefix = format!("{ns}/");
    let mut mine: Vec<(String, String)> = doc["reservations"]
        .as_array()
        .expect("a reservations array")
        .iter()
        .filter_map(|o| {
            let name = o["reservation"].as_str()?.strip_prefix(&prefix)?;
            Some((o["action"].as_str()?.to_owned(), name.to_owned()))
        })
        .collect();
    mine.sort();
    (mine, out.status.success())
}

/// A reservation's file on its node.
fn file_of(dir: &Path, ns: &str, pod: &str) -> PathBuf {
    dir.join("reserved").join(ns).join(pod)
}

/// `status.releaseTime` of `pod`'s reservation once it is Released.
async fn released_until(sys: &System, pod: &str) -> jiff::Timestamp {
    let api = sys.reservations();
    wait_for(&format!("{pod}'s reservation Released"), || async {
        let r = api.get_opt(pod).await.ok()??;
        (phase(&r) == Some(Phase::Released)).then_some(())?;
        Some(r.status?.release_time?.0)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_crd_loses_no_address_and_recover_brings_the_reservations_back() {
    let _nodes = realnode::use_shape(SHAPE, realnode::Access::Alone).await;
    let t0 = Instant::now();
    let (sys, c) = realnode::system("rn-lost").await;
    let node_a = sys.node_name(0).to_owned();
    let ns = sys.ns.clone();
    let dir = realnode::network_dir(realnode::node(c, &node_a));
    let pods = sys.run_retained("db", 2, &node_a).await;
    let ip = |pod: &str| pods[pod].ips[0];

    // Both away: their reservations Released, held for an hour.
    sys.kubectl(&["scale", "statefulset", "db", "--replicas=0"]);
    let until = released_until(&sys, "db-0").await;
    released_until(&sys, "db-1").await;

    // The CRD deleted: kube-apiserver deletes every reservation while it terminates.
    kubectl_ok(c.plane(), &["delete", "crd", CRD, "--timeout=120s"], None);
    let lost = wait_for("the agent to report db-0 and db-1 lost", || async {
        let names = reported_lost(c, &node_a, &ns).await;
        (names == ["db-0", "db-1"]).then_some(names)
    })
    .await;
    eprintln!("reported lost after the CRD's deletion: {lost:?}");
    for pod in ["db-0", "db-1"] {
        assert!(
            file_of(&dir, &ns, pod).exists(),
            "{pod}'s file was removed with the CRD"
        );
    }
    let warned = wait_for("a Warning ReservationLost on the node for db-0", || async {
        realnode::node_event_notes(c, &node_a, "ReservationLost")
            .await
            .into_iter()
            .find(|n| n.contains(&format!("{ns}/db-0")))
    })
    .await;
    assert!(
        warned.contains("deleted with the IPReservation CRD"),
        "{warned}"
    );

    // A pod started meanwhile on the node, host-local's cursor right before db-0's address: the
    // plugin skips the address the kept file protects.
    let IpAddr::V4(v4) = ip("db-0") else {
        panic!("the default shape is IPv4");
    };
    let before = Ipv4Addr::from(u32::from(v4) - 1);
    std::fs::write(dir.join("last_reserved_ip.0"), before.to_string()).unwrap();
    sys.apply(&statefulset("filler", 1, true, &[&node_a], &[]));
    let filler = sys.wait_running("app=filler", &["filler-0"]).await;
    let got = &filler["filler-0"].ips;
    eprintln!("filler-0 got {got:?}, host-local's cursor at {before}");
    assert!(
        !got.contains(&ip("db-0")) && !got.contains(&ip("db-1")),
        "a new pod got a lost reservation's address: {got:?} (db-0 {}, db-1 {})",
        ip("db-0"),
        ip("db-1")
    );

    // The CRD back, then recover: a dry run, the apply, and a second run that creates nothing.
    let crd = crd_file();
    kubectl_ok(
        c.plane(),
        &["apply", "--server-side", "-f", crd.to_str().unwrap()],
        None,
    );
    kubectl_ok(
        c.plane(),
        &[
            "wait",
            "--for=condition=Established",
            &format!("crd/{CRD}"),
            "--timeout=60s",
        ],
        None,
    );
    let (dry, ok) = recover(c, &ns, false);
    assert_eq!(
        dry,
        [
            ("create".into(), "db-0".into()),
            ("create".into(), "db-1".into())
        ]
    );
    assert!(ok, "the dry run found something to refuse");
    assert!(
        sys.reservations().get_opt("db-0").await.unwrap().is_none(),
        "the dry run created a reservation"
    );
    let (applied, ok) = recover(c, &ns, true);
    assert_eq!(
        applied,
        [
            ("created".into(), "db-0".into()),
            ("created".into(), "db-1".into())
        ]
    );
    assert!(ok);
    let (again, ok) = recover(c, &ns, true);
    assert!(
        again.iter().all(|(action, _)| action == "present"),
        "a second run did more than find them present: {again:?}"
    );
    assert!(ok);
    let recovered = released_until(&sys, "db-0").await;
    let drift = recovered.duration_since(until).as_secs();
    assert!(
        (-2..=30).contains(&drift),
        "db-0's release time moved from {until} to {recovered}"
    );
    let r = sys.reservations().get("db-0").await.unwrap();
    assert!(
        r.annotations()
            .contains_key("ipkeep.dev/recovered-from-uid"),
        "{:?}",
        r.annotations()
    );
    wait_for("the agent to adopt the recovered reservations", || async {
        reported_lost(c, &node_a, &ns)
            .await
            .is_empty()
            .then_some(())
    })
    .await;

    // db-0 comes back with its address.
    sys.kubectl(&["scale", "statefulset", "db", "--replicas=1"]);
    let back = sys.wait_running("app=db", &["db-0"]).await;
    assert_eq!(
        back["db-0"].ips, pods["db-0"].ips,
        "db-0 came back with another address"
    );
    sys.wait_bound(&back["db-0"]).await;

    // kubectl delete ipr still frees an address at once: the file goes, nothing is kept.
    sys.kubectl(&["delete", "ipr", "db-1"]);
    sys.wait_file(&file_of(&dir, &ns, "db-1"), false).await;
    assert!(
        reported_lost(c, &node_a, &ns).await.is_empty(),
        "db-1, deleted on purpose, was reported lost"
    );
    eprintln!(
        "the deleted-CRD scenario took {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}

/// Where the snapshot goes: a directory removed when the test ends, failed or not (a snapshot
/// is a copy of the whole cluster's state, not a log worth keeping), after the ones a killed run
/// left are removed.
fn backup_dir() -> tempfile::TempDir {
    const PREFIX: &str = "ipkeep-rn-etcd-backup-";
    let tmp = std::env::temp_dir();
    for entry in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().starts_with(PREFIX) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    tempfile::Builder::new()
        .prefix(PREFIX)
        .tempdir_in(tmp)
        .expect("failed to create the backup directory")
}

/// Host-local's cursor on `dir` set right before `ip`, so the next address it gives is `ip`
/// if `ip` is free (how a test makes the plugin reach for an address).
fn cursor_before(dir: &Path, ip: IpAddr) {
    let IpAddr::V4(v4) = ip else {
        panic!("the default shape is IPv4");
    };
    let before = Ipv4Addr::from(u32::from(v4) - 1);
    std::fs::write(dir.join("last_reserved_ip.0"), before.to_string()).unwrap();
}

/// `kubectl rollout status` of `workload` in the release's namespace within `timeout`: whether
/// it completed.
fn rolled_out(c: &Cluster, workload: &str, timeout: &str) -> bool {
    Command::new(c.plane().bin("kubectl"))
        .args(["-n", RELEASE_NS, "rollout", "status", workload])
        .arg(format!("--timeout={timeout}"))
        .env("KUBECONFIG", c.plane().kubeconfig_path())
        .output()
        .is_ok_and(|o| o.status.success())
}

/// An etcd restored from a backup taken before the cluster moved on: `etcdctl snapshot save`
/// against the running etcd (docs/operator.md's "Backup and restore"), then, after it, a
/// reservation made and its pod taken away (`late`), a reservation deleted on purpose and its
/// address given to another pod that then went away (`freed`, `taker`), and a pod moved to the
/// other node with its reservation (`mover`). Restored as Kubernetes' docs say: `etcdutl
/// snapshot restore --bump-revision --mark-compacted` into a new data directory, etcd started on
/// it, kube-apiserver, kube-controller-manager, kube-scheduler and the kubelets restarted, and
/// ipkeep's agents and controller too.
///
/// The nodes keep every address: `late-0`'s and `taker-0`'s files are kept as lost; `freed-0`'s
/// restored reservation, released by the node, is not written (`RestoredReleased`); `mover-0`'s,
/// restored on its old node in its older version, is not written there and the new node keeps
/// its newer file (`RestoredOlder`). A pod started meanwhile with host-local's cursor right before
/// the kept addresses gets neither. `recover --apply` creates `late-0` and `taker-0`, deletes
/// `freed-0` and writes `mover-0`'s new node and address back; each pod comes back with its
/// address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_restored_from_an_older_backup_loses_no_address() {
    // The control plane goes back in time: the cluster goes with the test.
    let _nodes = realnode::use_shape(SHAPE, realnode::Access::Spoils).await;
    let t0 = Instant::now();
    let (sys, c) = realnode::system("rn-restore").await;
    let node_a = sys.node_name(0).to_owned();
    let node_b = sys.node_name(1).to_owned();
    let ns = sys.ns.clone();
    let dir_a = realnode::network_dir(realnode::node(c, &node_a));
    let dir_b = realnode::network_dir(realnode::node(c, &node_b));
    let plane = c.plane();
    let scratch = backup_dir();
    let backup = scratch.path().join("snapshot.db");

    // Before the backup: two pods on node a, away, their reservations Released.
    let freed = sys.run_retained("freed", 1, &node_a).await["freed-0"].ips[0];
    let moved_from = sys.run_retained("mover", 1, &node_a).await["mover-0"].ips[0];
    for name in ["freed", "mover"] {
        sys.kubectl(&["scale", "statefulset", name, "--replicas=0"]);
        released_until(&sys, &format!("{name}-0")).await;
    }

    // The backup: `etcdctl snapshot save` against the running etcd.
    plane
        .etcd_snapshot_save(&backup)
        .expect("failed to back etcd up");

    // After the backup. late: a pod reserved, then taken away.
    let late = sys.run_retained("late", 1, &node_a).await["late-0"].ips[0];
    sys.kubectl(&["scale", "statefulset", "late", "--replicas=0"]);
    released_until(&sys, "late-0").await;
    // freed-0's reservation deleted on purpose; its address goes to taker-0, which goes away.
    sys.kubectl(&["delete", "ipr", "freed-0"]);
    sys.wait_file(&file_of(&dir_a, &ns, "freed-0"), false).await;
    cursor_before(&dir_a, freed);
    let taken = sys.run_retained("taker", 1, &node_a).await["taker-0"].ips[0];
    assert_eq!(taken, freed, "taker-0 did not get freed-0's address");
    sys.kubectl(&["scale", "statefulset", "taker", "--replicas=0"]);
    released_until(&sys, "taker-0").await;
    // mover-0 moves to node b: its reservation follows it (a new node, a new address).
    sys.apply(&statefulset(
        "mover",
        1,
        true,
        &[&node_b],
        &retain(Some("1h")),
    ));
    let on_b = sys.wait_running("app=mover", &["mover-0"]).await;
    let moved_to = on_b["mover-0"].ips[0];
    sys.wait_bound(&on_b["mover-0"]).await;
    sys.kubectl(&["scale", "statefulset", "mover", "--replicas=0"]);
    released_until(&sys, "mover-0").await;
    sys.wait_file(&file_of(&dir_a, &ns, "mover-0"), false).await;
    assert!(
        file_of(&dir_b, &ns, "mover-0").exists(),
        "mover-0 has no file on {node_b}"
    );
    eprintln!(
        "after the backup: late-0 {late}, taker-0 {taken} (freed-0's, deleted), mover-0 {moved_from} on {node_a} → {moved_to} on {node_b}"
    );

    // The restore, then every component that watched the newer state restarted, as Kubernetes'
    // docs say: kube-apiserver, kube-controller-manager, kube-scheduler, the kubelets.
    plane
        .etcd_snapshot_restore(&backup, Revisions::Bumped)
        .await
        .expect("failed to restore etcd");
    for component in [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    ] {
        plane
            .restart_component(component, std::time::Duration::from_millis(100))
            .await
            .unwrap_or_else(|e| panic!("failed to restart {component}: {e}"));
    }
    // Before the kubelets: the agent DaemonSet rolls out. A restore without --bump-revision
    // --mark-compacted took the revision back below what the kubelets' informers held, and the
    // rollout did not progress until they were restarted (docs/operator.md).
    kubectl_ok(
        plane,
        &[
            "-n",
            RELEASE_NS,
            "rollout",
            "restart",
            "daemonset/ipkeep-agent",
            "deployment/ipkeep-controller",
        ],
        None,
    );
    assert!(
        rolled_out(c, "daemonset/ipkeep-agent", "120s"),
        "the agent DaemonSet did not roll out within 120 s of a restore with --bump-revision --mark-compacted before the kubelets were restarted"
    );
    // The rest of Kubernetes' procedure: the kubelets restarted too.
    for node in c.nodes() {
        node.restart_kubelet()
            .unwrap_or_else(|e| panic!("failed to restart a kubelet: {e}"));
    }
    realnode::release_ready(c).await;
    for pod in ["late-0", "taker-0"] {
        assert!(
            sys.reservations().get_opt(pod).await.unwrap().is_none(),
            "the restored API has {pod}'s reservation: the backup was taken after it"
        );
    }

    // What the nodes keep and say.
    wait_for("node a to report late-0 and taker-0 lost", || async {
        (reported_lost(c, &node_a, &ns).await == ["late-0", "taker-0"]).then_some(())
    })
    .await;
    wait_for(
        "node a to report freed-0 and mover-0 released before",
        || async {
            let want = [
                ("freed-0".to_owned(), RestoredKind::Released),
                ("mover-0".to_owned(), RestoredKind::Released),
            ];
            (reported_restored(c, &node_a, &ns).await == want).then_some(())
        },
    )
    .await;
    wait_for("node b to report mover-0 older in the API", || async {
        let want = [("mover-0".to_owned(), RestoredKind::Older)];
        (reported_restored(c, &node_b, &ns).await == want).then_some(())
    })
    .await;
    for (dir, pod, present) in [
        (&dir_a, "late-0", true),
        (&dir_a, "taker-0", true),
        (&dir_a, "freed-0", false),
        (&dir_a, "mover-0", false),
        (&dir_b, "mover-0", true),
    ] {
        assert_eq!(
            file_of(dir, &ns, pod).exists(),
            present,
            "{pod}'s file in {}",
            dir.display()
        );
    }
    let released = wait_for("a Warning RestoredReleased for freed-0", || async {
        realnode::node_event_notes(c, &node_a, "RestoredReleased")
            .await
            .into_iter()
            .find(|n| n.contains(&format!("{ns}/freed-0")))
    })
    .await;
    eprintln!("RestoredReleased: {released}");
    let older = wait_for("a Warning RestoredOlder for mover-0", || async {
        realnode::node_event_notes(c, &node_b, "RestoredOlder")
            .await
            .into_iter()
            .find(|n| n.contains(&format!("{ns}/mover-0")))
    })
    .await;
    eprintln!("RestoredOlder: {older}");
    assert!(older.contains(&moved_to.to_string()), "{older}");

    // A pod started meanwhile, host-local's cursor right before the kept addresses, gets none.
    cursor_before(&dir_a, late.min(freed));
    sys.apply(&statefulset("filler", 1, true, &[&node_a], &[]));
    let filler = sys.wait_running("app=filler", &["filler-0"]).await;
    let got = &filler["filler-0"].ips;
    eprintln!("filler-0 got {got:?}");
    assert!(
        !got.contains(&late) && !got.contains(&freed),
        "a new pod got a kept address: {got:?} (late-0 {late}, taker-0 {freed})"
    );

    // recover: a dry run, then --apply.
    let want = |create: &str, delete: &str, rewrite: &str| -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = [
            (create, "late-0"),
            (create, "taker-0"),
            (delete, "freed-0"),
            ("present", "mover-0"),
            (rewrite, "mover-0"),
        ]
        .into_iter()
        .map(|(a, p)| (a.to_owned(), p.to_owned()))
        .collect();
        v.sort();
        v
    };
    let (dry, ok) = recover(c, &ns, false);
    assert_eq!(dry, want("create", "delete", "rewrite"));
    assert!(ok, "the dry run found something to refuse");
    let (applied, ok) = recover(c, &ns, true);
    assert_eq!(applied, want("created", "deleted", "rewritten"));
    assert!(ok);
    assert!(
        sys.reservations()
            .get_opt("freed-0")
            .await
            .unwrap()
            .is_none(),
        "freed-0 was not deleted"
    );
    let mover = sys.reservations().get("mover-0").await.unwrap();
    assert_eq!(
        (mover.spec.node_name.as_str(), mover.spec.ips[0].0.as_str()),
        (node_b.as_str(), moved_to.to_string().as_str()),
        "mover-0 was not written back"
    );
    for node in [&node_a, &node_b] {
        wait_for(&format!("{node} to report nothing kept"), || async {
            (reported_lost(c, node, &ns).await.is_empty()
                && reported_restored(c, node, &ns).await.is_empty())
            .then_some(())
        })
        .await;
    }

    // Each comes back with its address (late and taker applied again: the restored API does not
    // have them; mover's restored StatefulSet still names node a).
    for (name, node) in [("late", &node_a), ("taker", &node_a), ("mover", &node_b)] {
        sys.apply(&statefulset(name, 1, true, &[node], &retain(Some("1h"))));
    }
    for (name, want) in [("late", late), ("taker", freed), ("mover", moved_to)] {
        let pod = format!("{name}-0");
        let back = sys.wait_running(&format!("app={name}"), &[&pod]).await;
        assert_eq!(
            back[&pod].ips,
            vec![want],
            "{pod} came back with another address"
        );
        sys.wait_bound(&back[&pod]).await;
    }
    eprintln!(
        "the etcd-restore scenario took {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}
