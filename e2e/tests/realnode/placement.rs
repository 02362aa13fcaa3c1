//! Placement on real nodes: a returning pod goes back to the node whose range holds its reserved
//! addresses because the chart's webhook told the real kube-scheduler so, not because the test
//! pinned it. No StatefulSet here names a node; the scheduler chooses.
//!
//! - Three replicas on two schedulable nodes (the third cordoned), 10 deletes of random pods,
//!   graceful and forced: how often the pod returns to its node and address with
//!   `ipkeep.dev/placement: none` (the scheduler alone) beside the default placement, which must
//!   bring it back every time.
//! - Two replicas on three nodes while another workload takes room on each pod's node (a filler
//!   pod requesting most of its CPU), so the scheduler's resource scores pull a returning pod to
//!   the node without one.
//! - `required` with its node cordoned waits Pending (unschedulable, and why), and gets its address
//!   after `uncordon`; `preferred` goes elsewhere with a new address and a Warning.
//! - The webhook down (the controller scaled to 0): pods are still created, without the term, and
//!   the controller says so when it is back (Warning `PlacementMissed`).
//!
//! The figures are printed (`--nocapture` shows them); what is asserted is the default placement's
//! promise. One cluster of three plain real nodes serves every test of this binary; each test takes
//! the nodes alone (they cordon nodes and scale the controller). Needs root, `make cluster-bins`,
//! `make node-bins` and `make image`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Instant;

use ipkeep_e2e::cluster::realnode::PodNetwork;
use ipkeep_e2e::testkit::system::{System, WORKLOAD_IMAGE};
use ipkeep_e2e::testkit::{kubectl_ok, realnode, rng::Rng, wait_for};
use k8s_openapi::api::core::v1::Pod;

/// This binary's nodes: three plain ones.
const NODES: u8 = 3;
/// How many deletes each measurement makes: 10, not 20, to keep `make test` in CI's hour (the
/// four measurements were its longest test after the real-Prometheus scenario).
const DELETES: usize = 10;

/// The dice of the deletes, seeded and printed so a run can be replayed.
struct Dice(Rng);

impl Dice {
    fn new() -> Dice {
        let seed = std::env::var("IPKEEP_E2E_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        eprintln!("placement: dice seed {seed} (IPKEEP_E2E_SEED={seed} replays it)");
        Dice(Rng::new(seed))
    }

    fn below(&mut self, n: usize) -> usize {
        self.0.between(0, n as u64 - 1) as usize
    }
}

/// What one delete came to.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    deletes: usize,
    /// Same node, same addresses.
    returned: usize,
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} returned to their node and address",
            self.returned, self.deletes
        )
    }
}

/// Deletes one pod of each StatefulSet in `sets` at once (the same kind of delete for all: graceful
/// or forced), waits until each is back Running and Bound, and counts who returned.
async fn delete_and_count(
    sys: &System,
    sets: &mut [(&str, u32, Tally)],
    dice: &mut Dice,
    forced: bool,
) {
    let mut before = Vec::new();
    for (name, replicas, _) in sets.iter() {
        let pod = format!("{name}-{}", dice.below(*replicas as usize));
        let running = sys.running(&format!("app={name}")).await;
        let old = running
            .get(&pod)
            .unwrap_or_else(|| panic!("{pod} is not running: {running:?}"))
            .clone();
        before.push(old);
    }
    for old in &before {
        let mut args = vec!["delete", "pod", old.name.as_str(), "--wait=false"];
        if forced {
            args.extend(["--grace-period=0", "--force"]);
        }
        sys.kubectl(&args);
    }
    for ((_, _, tally), old) in sets.iter_mut().zip(&before) {
        let new = sys.wait_recreated(&old.name, &old.uid).await;
        sys.wait_bound(&new).await;
        tally.deletes += 1;
        if new.node == old.node && new.ips == old.ips {
            tally.returned += 1;
        } else {
            eprintln!(
                "placement: {} moved {} {:?} -> {} {:?}",
                old.name, old.node, old.ips, new.node, new.ips
            );
        }
    }
}

/// The pod's node affinity as the API server stored it (JSON, `null` when none).
async fn node_affinity(sys: &System, pod: &str) -> serde_json::Value {
    let p: Pod = sys.pods().get(pod).await.unwrap();
    serde_json::to_value(
        p.spec
            .and_then(|s| s.affinity)
            .and_then(|a| a.node_affinity),
    )
    .unwrap()
}

async fn placed(sys: &System, pod: &str) -> Option<String> {
    let p: Pod = sys.pods().get(pod).await.unwrap();
    p.metadata
        .annotations
        .and_then(|a| a.get("ipkeep.dev/placed").cloned())
}

/// Where a measurement's StatefulSet runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Room {
    /// Idle nodes.
    Idle,
    /// Once its pods run, a filler pod requesting most of a node's CPU joins each node that
    /// holds one: another workload took room on the pod's node, so the scheduler's resource
    /// scores favour a node without it when the pod returns.
    Filled,
}

/// Runs `DELETES` rounds (graceful and forced in turn) over a StatefulSet `name` of `replicas`
/// whose pods ask for `mode`, alone in the namespace; then deletes it (and its fillers) so the next
/// measurement starts from the same nodes. Returns its tally.
async fn measure(
    sys: &System,
    label: &str,
    name: &str,
    replicas: u32,
    mode: &str,
    room: Room,
) -> Tally {
    let pods = sys
        .run_annotated(name, replicas, &[], &[("ipkeep.dev/placement", mode)])
        .await;
    let mut fillers = Vec::new();
    if room == Room::Filled {
        let nodes: std::collections::BTreeSet<&str> =
            pods.values().map(|p| p.node.as_str()).collect();
        for node in nodes {
            let filler = format!("filler-{name}-{node}");
            sys.apply(&format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {filler}\nspec:\n  terminationGracePeriodSeconds: 1\n  \
                 nodeSelector: {{kubernetes.io/hostname: {node}}}\n  containers:\n  - name: c\n    image: {WORKLOAD_IMAGE}\n    \
                 imagePullPolicy: Never\n    command: [sleep, \"3600\"]\n    resources: {{requests: {{cpu: 1200m, memory: 64Mi}}}}\n"
            ));
            fillers.push(filler);
        }
        let names: Vec<&str> = fillers.iter().map(String::as_str).collect();
        let running = sys.running("").await;
        let mut want: Vec<&str> = running.keys().map(String::as_str).collect();
        want.extend(&names);
        want.sort();
        want.dedup();
        sys.wait_running("", &want).await;
    }
    let mut sets = [(name, replicas, Tally::default())];
    let mut dice = Dice::new();
    let started = Instant::now();
    for round in 0..DELETES {
        delete_and_count(sys, &mut sets, &mut dice, round % 2 == 1).await;
    }
    let tally = sets[0].2;
    eprintln!(
        "placement [{label}] {name} ({replicas} replicas, placement {mode}): {tally}, {DELETES} rounds in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    sys.kubectl(&["delete", "statefulset", name, "--wait=true"]);
    for f in &fillers {
        sys.kubectl(&["delete", "pod", f, "--grace-period=0", "--force"]);
    }
    wait_for(
        &format!("the pods of {name} and its fillers gone"),
        || async {
            sys.running("")
                .await
                .keys()
                .all(|p| !p.starts_with(name) && !p.starts_with(&format!("filler-{name}")))
                .then_some(())
        },
    )
    .await;
    tally
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_on_two_nodes_return_to_their_node_every_time() {
    let _alone = realnode::use_nodes_alone(NODES, PodNetwork::default()).await;
    let (sys, c) = realnode::system("place2").await;
    // Two schedulable nodes: the smallest ordinary case, where the scheduler's spreading ties
    // whenever each node is left with one pod.
    let third = c.nodes()[2].name().to_owned();
    sys.kubectl(&["cordon", &third]);
    let alone = measure(&sys, "2 nodes", "alone", 3, "none", Room::Idle).await;
    let placed = measure(&sys, "2 nodes", "placed", 3, "preferred", Room::Idle).await;
    sys.kubectl(&["uncordon", &third]);
    assert_eq!(
        placed.returned, placed.deletes,
        "with the default placement every pod returns to its node and address ({placed}; the scheduler alone: {alone})"
    );
    sys.check("10 deletes: every pod back on its node with its address (default placement)");
    eprintln!("{}", sys.summary());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_workload_on_the_node_pulls_pods_away_unless_placed() {
    let _alone = realnode::use_nodes_alone(NODES, PodNetwork::default()).await;
    let (sys, _c) = realnode::system("placefill").await;
    // Two replicas on three nodes: a returning pod's node ties on spreading with the node that
    // has none, and the filler on its own node tips the scheduler's resource scores the other way.
    let alone = measure(&sys, "3 nodes, filled", "solo", 2, "none", Room::Filled).await;
    let placed = measure(
        &sys,
        "3 nodes, filled",
        "kept",
        2,
        "preferred",
        Room::Filled,
    )
    .await;
    assert_eq!(
        placed.returned, placed.deletes,
        "with the default placement every pod returns while its node has room ({placed}; the scheduler alone: {alone})"
    );
    sys.check("10 deletes beside another workload: every pod back on its node with its address");
    // The term the webhook added, as the API server stored it.
    let probe = sys.run_annotated("probe", 1, &[], &[]).await;
    sys.kubectl(&["delete", "pod", "probe-0", "--wait=false"]);
    sys.wait_recreated("probe-0", &probe["probe-0"].uid).await;
    let hook = node_affinity(&sys, "probe-0").await;
    assert_eq!(
        hook["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"], 100,
        "{hook}"
    );
    eprintln!("{}", sys.summary());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cordoned_node_makes_required_wait_and_preferred_move() {
    let _alone = realnode::use_nodes_alone(NODES, PodNetwork::default()).await;
    let (sys, _c) = realnode::system("placecord").await;
    let must = sys
        .run_annotated("must", 1, &[], &[("ipkeep.dev/placement", "required")])
        .await;
    let may = sys.run_annotated("may", 1, &[], &[]).await;

    // required: Pending while the node is cordoned, with the scheduler's reason; back with its
    // address once the node takes pods again.
    let before = must["must-0"].clone();
    sys.kubectl(&["cordon", &before.node]);
    sys.kubectl(&["delete", "pod", "must-0", "--wait=false"]);
    let reason = wait_for("must-0 re-created and unschedulable", || async {
        let p = sys.pods().get_opt("must-0").await.ok()??;
        if p.metadata.uid.as_deref() == Some(before.uid.as_str()) {
            return None;
        }
        let status = p.status?;
        let cond = status
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
        (cond.reason.as_deref() == Some("Unschedulable")).then(|| cond.message.unwrap_or_default())
    })
    .await;
    eprintln!("placement: required on a cordoned node: {reason}");
    assert!(
        reason.contains("node affinity") || reason.contains("unschedulable"),
        "{reason}"
    );
    let hook = node_affinity(&sys, "must-0").await;
    assert_eq!(
        hook["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchFields"]
            [0]["values"][0],
        before.node.as_str(),
        "{hook}"
    );
    sys.check("required placement on a cordoned node: Pending, Unschedulable, with the reason");
    sys.kubectl(&["uncordon", &before.node]);
    let after = sys.wait_recreated("must-0", &before.uid).await;
    assert_eq!((&after.node, &after.ips), (&before.node, &before.ips));
    sys.check("after uncordon the required pod runs on its node with its address");

    // preferred: placed elsewhere, with new addresses and the Warning that says so.
    let before = may["may-0"].clone();
    sys.kubectl(&["cordon", &before.node]);
    sys.kubectl(&["delete", "pod", "may-0", "--wait=false"]);
    let after = sys.wait_recreated("may-0", &before.uid).await;
    sys.kubectl(&["uncordon", &before.node]);
    assert_ne!(after.node, before.node);
    assert_ne!(after.ips, before.ips);
    assert_eq!(
        placed(&sys, "may-0").await.as_deref(),
        Some(format!("preferred {}", before.node).as_str())
    );
    let r = sys.wait_bound(&after).await;
    assert_eq!(
        r.spec.node_name, after.node,
        "the reservation follows the pod"
    );
    let warned = wait_for("a Warning AddressesChanged on may-0", || async {
        sys.events("Pod", "may-0")
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("AddressesChanged"))
    })
    .await;
    eprintln!(
        "placement: preferred on a cordoned node: {:?}",
        warned.message
    );
    sys.check("preferred placement on a cordoned node: elsewhere, new address, AddressesChanged");
    eprintln!("{}", sys.summary());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_webhook_down_pods_are_still_created_and_the_miss_is_reported() {
    let _alone = realnode::use_nodes_alone(NODES, PodNetwork::default()).await;
    let (sys, c) = realnode::system("placedown").await;
    let before = sys.run_annotated("db", 1, &[], &[]).await["db-0"].clone();
    let scale = |n: &str| {
        kubectl_ok(
            c.plane(),
            &[
                "-n",
                realnode::RELEASE_NS,
                "scale",
                "deployment/ipkeep-controller",
                &format!("--replicas={n}"),
            ],
            None,
        )
    };
    scale("0");
    wait_for("no controller pod left", || async {
        controllers(c).is_empty().then_some(())
    })
    .await;
    sys.kubectl(&["delete", "pod", "db-0", "--wait=false"]);
    let after = sys.wait_recreated("db-0", &before.uid).await;
    assert!(
        node_affinity(&sys, "db-0").await.is_null(),
        "no term without the webhook"
    );
    assert_eq!(placed(&sys, "db-0").await, None);
    sys.check("webhook down: the pod is created, without a term");
    scale("2");
    realnode::release_ready(c).await;
    let note = wait_for("a Warning PlacementMissed on db-0", || async {
        sys.events("Pod", "db-0")
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("PlacementMissed"))
            .and_then(|e| e.message)
    })
    .await;
    assert!(note.contains(&before.node), "{note}");
    eprintln!(
        "placement: webhook down, {} -> {} {:?}: {note}",
        before.node, after.node, after.ips
    );
    sys.check("the controller, back, reports the missed placement");
    eprintln!("{}", sys.summary());
}

/// How many slow clients hold a connection to each controller's webhook at once.
const SLOW_CLIENTS: usize = 1000;

/// The controllers' pods: (name, address, "" before it has one).
fn controllers(c: &ipkeep_e2e::cluster::realnode::Cluster) -> Vec<(String, String)> {
    let out = kubectl_ok(
        c.plane(),
        &[
            "-n",
            realnode::RELEASE_NS,
            "get",
            "pods",
            "-l",
            "app.kubernetes.io/component=controller",
            "-o",
            r#"jsonpath={range .items[*]}{.metadata.name} {.status.podIP}{"\n"}{end}"#,
        ],
        None,
    );
    out.lines()
        .map(|l| {
            let (name, ip) = l.split_once(' ').unwrap();
            (name.to_owned(), ip.to_owned())
        })
        .collect()
}

/// The gauge `ipkeep_webhook_connections` of controller pod `pod`, read through the API server.
fn webhook_connections(c: &ipkeep_e2e::cluster::realnode::Cluster, pod: &str) -> u64 {
    let metrics = kubectl_ok(
        c.plane(),
        &[
            "get",
            "--raw",
            &format!(
                "/api/v1/namespaces/{}/pods/{pod}:8080/proxy/metrics",
                realnode::RELEASE_NS
            ),
        ],
        None,
    );
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("ipkeep_webhook_connections "))
        .unwrap_or_else(|| panic!("no ipkeep_webhook_connections in {pod}'s metrics"))
        .trim()
        .parse::<f64>()
        .unwrap() as u64
}

/// A client on the pod network that connects to the webhook at `addr` and sends nothing, for
/// as long as `stop` is unset: the server closes it when its head timeout passes, and it
/// connects again. `connected` counts the clients connected now (accepted by the server, or
/// waiting in its listen queue: to a client, both are connected).
async fn slow_client(
    addr: std::net::SocketAddr,
    connected: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    use std::sync::atomic::Ordering::Relaxed;
    use tokio::io::AsyncReadExt;
    while !stop.load(Relaxed) {
        let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        };
        connected.fetch_add(1, Relaxed);
        let mut byte = [0u8; 1];
        tokio::select! {
            _ = stream.read(&mut byte) => {}
            _ = async {
                while !stop.load(Relaxed) {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
            } => {}
        }
        connected.fetch_sub(1, Relaxed);
    }
}

/// Issue 44's slow-client test: a thousand clients on the pod network hold connections to each
/// controller's webhook, sending nothing (the head timeout closes them, and they connect again),
/// and a returning pod still gets its placement: the webhook answered the API server within its
/// `timeoutSeconds` (with `failurePolicy: Ignore`, a late answer leaves the pod without its term).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_slow_clients_on_each_webhook_do_not_keep_a_pod_from_its_placement() {
    let _alone = realnode::use_nodes_alone(NODES, PodNetwork::default()).await;
    let (sys, c) = realnode::system("slowpeers").await;
    let before = sys.run_annotated("db", 1, &[], &[]).await["db-0"].clone();
    use std::sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed},
    };
    let stop = Arc::new(AtomicBool::new(false));
    let controllers = controllers(c);
    assert_eq!(controllers.len(), 2, "{controllers:?}");
    let mut clients = Vec::new();
    let mut connected = Vec::new();
    for (_, ip) in &controllers {
        let addr: std::net::SocketAddr = format!("{ip}:9443").parse().unwrap();
        let count = Arc::new(AtomicUsize::new(0));
        for _ in 0..SLOW_CLIENTS {
            clients.push(tokio::spawn(slow_client(addr, count.clone(), stop.clone())));
        }
        connected.push(count);
    }
    let counts = || -> Vec<usize> { connected.iter().map(|n| n.load(Relaxed)).collect() };
    wait_for(
        &format!("{SLOW_CLIENTS} slow clients connected to each webhook"),
        || {
            let now = counts();
            std::future::ready(now.iter().all(|n| *n >= SLOW_CLIENTS).then_some(()))
        },
    )
    .await;
    let served = |c| -> Vec<u64> {
        controllers
            .iter()
            .map(|(pod, _)| webhook_connections(c, pod))
            .collect()
    };
    let served_before = served(c);
    let t0 = Instant::now();
    sys.kubectl(&["delete", "pod", "db-0", "--wait=false"]);
    let after = sys.wait_recreated("db-0", &before.uid).await;
    let recreated = t0.elapsed();
    let (connected_after, served_after) = (counts(), served(c));
    stop.store(true, Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    eprintln!(
        "placement: {SLOW_CLIENTS} slow clients per controller; the pod came back in {:.1}s on {} \
         with {connected_after:?} of them connected; the webhooks served {served_before:?} \
         connections before and {served_after:?} after (the rest in their listen queues)",
        recreated.as_secs_f64(),
        after.node
    );
    assert!(
        connected_after.iter().all(|n| *n >= SLOW_CLIENTS * 9 / 10),
        "the slow clients were not holding the webhooks while the pod was created: {connected_after:?}"
    );
    let record = placed(&sys, "db-0").await;
    assert!(
        record
            .as_deref()
            .is_some_and(|r| !r.starts_with("skipped") && r.ends_with(&before.node)),
        "no placement on {} ({record:?}): the webhook did not answer the API server in time",
        before.node
    );
    assert!(!node_affinity(&sys, "db-0").await.is_null());
    sys.check("a thousand slow clients per webhook: the returning pod still placed");
    eprintln!("{}", sys.summary());
}
