//! `ipkeep-operator check --ipam` on real nodes with the chart (issue 45, `operator/src/check/ipam.rs`):
//! each agent serves its node's allocation and reservation files (`/ipam` on its metrics port),
//! `check` reads them through the API server's pod proxy as an admin and cross-checks them with
//! the reservations and the pods. With a retained pod and a plain one on node-0, and every
//! allocation older than check's grace period, it passes; then each plant, one at a time, fails
//! it (exit status 1) with its own line, and it passes again once the plant is gone:
//! * a leak: an allocation file for a free address, an hour old, that no pod has;
//! * an orphan: a reservation file, an hour old, that no IPReservation has;
//! * a conflict: an IPReservation of another name holding the plain pod's address (the agent
//!   writes its file), then `kubectl delete ipr`.
//!
//! A shape of its own: a fresh cluster with nothing the suites before left (their lost or
//! retained reservations would be findings), and agents with a day between full resyncs, so
//! the planted reservation file stays an orphan while check runs rather than being judged lost
//! by a periodic resync in between. Needs root, `make cluster-bins`, `make node-bins` and
//! `make image`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use ipkeep_e2e::cluster::realnode::Cluster;
use ipkeep_e2e::testkit::realnode::{self, RELEASE, RELEASE_NS};
use ipkeep_e2e::testkit::system::statefulset;
use ipkeep_e2e::testkit::{operator_binary, wait_for};
use serde_json::Value;

/// Two plain nodes with the chart as the README installs it; the agents' full resync a day
/// apart (see the module docs).
const SHAPE: realnode::Shape = realnode::Shape {
    nodes: 2,
    network: realnode::PLAIN,
    chart: Some(&[
        "--set",
        "cni.replaceHostLocal=true",
        "--set",
        "agent.extraArgs[0]=--resync-interval=24h",
    ]),
};

/// check's grace period (`operator/src/check/ipam.rs`'s `GRACE`), and a second for the clocks.
const GRACE: Duration = Duration::from_secs(61);

/// `ipkeep-operator check --ipam --output json` as an admin (`extra` besides): its exit status,
/// its document and how long it took.
fn check_ipam(c: &Cluster, extra: &[&str]) -> (bool, Value, Duration) {
    let started = Instant::now();
    let out = Command::new(operator_binary())
        .args([
            "check",
            "--ipam",
            "--namespace",
            RELEASE_NS,
            "--release",
            RELEASE,
        ])
        .args(["--output", "json"])
        .args(extra)
        .env("KUBECONFIG", c.plane().kubeconfig_path())
        .output()
        .expect("failed to run ipkeep-operator check --ipam");
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!(
        "check --ipam ({} ms): {text}{}",
        took.as_millis(),
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("check --ipam printed no JSON ({e}): {text}"));
    (out.status.success(), doc, took)
}

/// The failed lines of a check document, as (check, node, message).
fn failed(doc: &Value) -> Vec<(String, String, String)> {
    doc["checks"]
        .as_array()
        .expect("a checks array")
        .iter()
        .filter(|l| l["ok"] == false)
        .map(|l| {
            (
                l["check"].as_str().unwrap_or_default().to_owned(),
                l["node"].as_str().unwrap_or_default().to_owned(),
                l["message"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// Asserts check passed, with a ✓ ipam line for each node; returns how long it took.
fn assert_passes(c: &Cluster, nodes: &[&str], after: &str) -> Duration {
    let (ok, doc, took) = check_ipam(c, &[]);
    assert!(
        ok && doc["ok"] == true,
        "check --ipam failed {after}: {:?}",
        failed(&doc)
    );
    for node in nodes {
        let passed = doc["checks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["check"] == "ipam" && l["ok"] == true && l["node"] == *node);
        assert!(passed, "no ✓ ipam line for {node} {after}: {doc}");
    }
    took
}

/// Asserts check failed (exit status 1) with exactly one failed line, `check` on `node`,
/// whose message holds each of `words`.
fn assert_finds(c: &Cluster, check: &str, node: &str, words: &[&str]) {
    let (ok, doc, _) = check_ipam(c, &[]);
    let failed = failed(&doc);
    assert!(
        !ok && doc["ok"] == false,
        "check --ipam passed with a {check} planted"
    );
    assert_eq!(failed.len(), 1, "one failed line expected: {failed:?}");
    let (got, on, message) = &failed[0];
    assert_eq!((got.as_str(), on.as_str()), (check, node), "{message}");
    for word in words {
        assert!(
            message.contains(word),
            "the {check} line does not say {word}: {message}"
        );
    }
}

/// Sets `path`'s modification time an hour back: older than check's grace period.
fn age(path: &Path) {
    let file = std::fs::File::options().write(true).open(path).unwrap();
    file.set_modified(SystemTime::now() - Duration::from_secs(3_600))
        .unwrap();
}

/// Whether any allocation file in `dir` is younger than check's grace period.
fn young_allocations(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().parse::<IpAddr>().is_ok())
        .filter(|e| {
            e.metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|m| m.elapsed().unwrap_or_default() < GRACE)
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// An address of the /24 of `near` that no file of `dir` names.
fn free_address(dir: &Path, near: IpAddr, last: u8) -> IpAddr {
    let IpAddr::V4(v4) = near else {
        panic!("the plain shape is IPv4");
    };
    let [a, b, c, _] = v4.octets();
    let ip = IpAddr::V4(Ipv4Addr::new(a, b, c, last));
    assert!(!dir.join(ip.to_string()).exists(), "{ip} is allocated");
    ip
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_ipam_passes_on_a_clean_cluster_and_finds_a_planted_leak_orphan_and_conflict() {
    let _nodes = realnode::use_shape(SHAPE, realnode::Access::Alone).await;
    let (sys, c) = realnode::system("rn-ipam").await;
    let (node_a, node_b) = (sys.node_name(0).to_owned(), sys.node_name(1).to_owned());
    let nodes = [node_a.as_str(), node_b.as_str()];
    let ns = sys.ns.clone();
    let dir = realnode::network_dir(realnode::node(c, &node_a));

    // A retained pod (allocation, reservation file, IPReservation) and a plain one on node-0.
    let db = sys.run_retained("db", 1, &node_a).await;
    sys.apply(&statefulset("api", 1, true, &[&node_a], &[]));
    let api = sys.wait_running("app=api", &["api-0"]).await;
    let api_ip = api["api-0"].ips[0];
    sys.wait_bound(&db["db-0"]).await;

    // Clean: passes once every agent is ready and in charge (--wait), and again once every
    // allocation is old enough to be judged.
    let (ok, doc, _) = check_ipam(c, &["--wait", "--timeout", "2m"]);
    assert!(
        ok,
        "check --ipam --wait failed on a clean cluster: {:?}",
        failed(&doc)
    );
    wait_for(
        "every allocation on node-0 older than check's grace period",
        || async { young_allocations(&dir).is_empty().then_some(()) },
    )
    .await;
    let took = assert_passes(c, &nodes, "on the clean cluster");
    eprintln!(
        "check --ipam on the clean two-node cluster took {} ms",
        took.as_millis()
    );

    // A leak: an allocation file for a free address, as a DEL that never ran leaves one.
    let leaked = free_address(&dir, db["db-0"].ips[0], 250);
    let leak_file = dir.join(leaked.to_string());
    std::fs::write(&leak_file, "0123456789abcdef\r\neth0").unwrap();
    age(&leak_file);
    assert_finds(
        c,
        "leak",
        &node_a,
        &[&leaked.to_string(), "container 0123456789abcdef"],
    );
    std::fs::remove_file(&leak_file).unwrap();
    assert_passes(c, &nodes, "after the leaked allocation was removed");

    // An orphan: a reservation file no IPReservation has (written by hand, or left by an agent
    // that was down when its reservation went).
    let orphaned = free_address(&dir, db["db-0"].ips[0], 251);
    let orphan_file = realnode::reserved_file(realnode::node(c, &node_a), &ns, "ghost-0");
    let release = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1);
    std::fs::write(
        &orphan_file,
        serde_json::json!({
            "version": 1,
            "namespace": ns,
            "pod": "ghost-0",
            "ips": [orphaned.to_string()],
            "releaseTime": release.to_string(),
            "uid": "e2e-orphan",
        })
        .to_string(),
    )
    .unwrap();
    age(&orphan_file);
    assert_finds(
        c,
        "orphan",
        &node_a,
        &[&format!("{ns}/ghost-0"), &orphaned.to_string()],
    );
    std::fs::remove_file(&orphan_file).unwrap();
    assert_passes(c, &nodes, "after the orphaned file was removed");

    // A conflict: an IPReservation of another name holding api-0's address on its node.
    sys.apply(&format!(
        "apiVersion: ipkeep.dev/v1alpha1\nkind: IPReservation\nmetadata:\n  name: ghost-1\n  namespace: {ns}\nspec:\n  nodeName: {node_a}\n  ips: [\"{api_ip}\"]\n"
    ));
    let ghost_file = realnode::reserved_file(realnode::node(c, &node_a), &ns, "ghost-1");
    sys.wait_file(&ghost_file, true).await;
    assert_finds(
        c,
        "conflict",
        &node_a,
        &[
            &api_ip.to_string(),
            &format!("{ns}/ghost-1"),
            &format!("{ns}/api-0"),
        ],
    );
    sys.kubectl(&["delete", "ipr", "ghost-1"]);
    sys.wait_file(&ghost_file, false).await;
    assert_passes(c, &nodes, "after the conflicting IPReservation was deleted");
}
