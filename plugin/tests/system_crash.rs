//! ipkeep processes SIGKILLed at random instants during ADD, DEL and CHECK, round after round,
//! on a dual-stack network. After every round the state on disk must still be one a runtime (and
//! host-local) can live with, and at the end GC, CHECK, DEL and ADD must recover it completely.
//!
//! Only ipkeep runs here: host-local creates an IP file with O_EXCL and then writes its content, so
//! a kill between the two leaves an empty file that blocks its address forever; ipkeep promises
//! not to. A second test does the same with pods that have reservations (`K8S_POD_*`, a
//! `reserved/` tree, the force-delete order) so pod records, wait markers and the reservation
//! snapshot are killed mid-write too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
mod system_support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{CniCall, CniOutcome};
use system_support::{
    Holder, Rng, Scratch, allocations, describe, nested_ip_named, net_config, release, result_ips,
};

const NETWORK: &str = "crashnet";
const POOL: usize = 24;
const PER_ROUND: usize = 8;
const ROUNDS: usize = 120;

/// What the test knows about one container of the pool from the processes that finished.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Known {
    /// No address: a DEL finished (or nothing ran yet).
    Free,
    /// An ADD finished and returned these addresses, and nothing ran for it since.
    Holds(Vec<IpAddr>),
    /// A process was killed, or an ADD found an address left by a killed one.
    Unknown,
}

struct Pool {
    ids: Vec<String>,
    ifnames: Vec<&'static str>,
    known: Vec<Known>,
}

impl Pool {
    fn new() -> Self {
        Self {
            ids: (0..POOL).map(|i| format!("crash{i:02}")).collect(),
            // Two interface names, so a plugin that matched on the ID alone would be caught.
            ifnames: (0..POOL)
                .map(|i| if i % 4 == 0 { "net1" } else { "eth0" })
                .collect(),
            known: vec![Known::Free; POOL],
        }
    }

    fn holder(&self, i: usize) -> Holder {
        Holder::attachment(&self.ids[i], self.ifnames[i])
    }

    fn call(&self, i: usize, command: &str, config: &str) -> CniCall {
        CniCall::new(command, &self.ids[i], config).ifname(self.ifnames[i])
    }

    /// The invariants that hold whatever instant the processes were killed at.
    fn check_disk(&self, net_dir: &Path, when: &str) {
        let on_disk = allocations(net_dir);
        let nested = nested_ip_named(net_dir);
        assert!(
            nested.is_empty(),
            "{when}: files named like addresses below the network directory (host-local would count them): {nested:?}"
        );
        let mut per_holder: BTreeMap<&Holder, Vec<IpAddr>> = BTreeMap::new();
        for (ip, holder) in &on_disk {
            per_holder.entry(holder).or_default().push(*ip);
        }
        for (holder, ips) in &per_holder {
            let i = self
                .ids
                .iter()
                .position(|id| id == holder.id())
                .unwrap_or_else(|| {
                    panic!("{when}: {ips:?} held by {holder:?}, not a container of this test")
                });
            assert_eq!(
                **holder,
                self.holder(i),
                "{when}: {ips:?} held under the wrong key"
            );
            let families: BTreeSet<bool> = ips.iter().map(IpAddr::is_ipv4).collect();
            assert_eq!(
                families.len(),
                ips.len(),
                "{when}: {holder:?} holds more than one address per range set: {ips:?}"
            );
        }
        for (i, known) in self.known.iter().enumerate() {
            let held = per_holder.get(&self.holder(i)).cloned().unwrap_or_default();
            match known {
                Known::Free => assert!(
                    held.is_empty(),
                    "{when}: {} was deleted but still holds {held:?}",
                    self.ids[i]
                ),
                Known::Holds(ips) => {
                    let mut ips = ips.clone();
                    ips.sort();
                    assert_eq!(
                        held, ips,
                        "{when}: {} must hold what its ADD returned",
                        self.ids[i]
                    );
                }
                Known::Unknown => {}
            }
        }
    }
}

/// Median wall time of an uncontended ADD, so kill instants spread over a process's whole life.
fn typical_add(binary: &Path, config: &str) -> Duration {
    let mut samples: Vec<Duration> = (0..7)
        .map(|_| {
            let start = Instant::now();
            CniCall::new("ADD", "calibrate", config).run(binary).ok();
            let took = start.elapsed();
            CniCall::new("DEL", "calibrate", config).run(binary).ok();
            took
        })
        .collect();
    samples.sort();
    samples[samples.len() / 2]
}

/// Runs one round: `calls` start together and each is SIGKILLed `delay` after the start (a process
/// that finished before its instant is not affected). Returns each outcome, `None` when killed.
fn run_and_kill(binary: &Path, calls: &[CniCall], delays: &[Duration]) -> Vec<Option<CniOutcome>> {
    let mut children: Vec<_> = calls.iter().map(|call| call.spawn_held(binary)).collect();
    let start = Instant::now();
    for (child, call) in children.iter_mut().zip(calls) {
        release(child, &call.stdin);
    }
    let mut order: Vec<usize> = (0..calls.len()).collect();
    order.sort_by_key(|&i| delays[i]);
    for i in order {
        // Not waiting for anything: this sleep *is* the random instant the kill lands at.
        std::thread::sleep(delays[i].saturating_sub(start.elapsed()));
        // An exited but unreaped child is a zombie; killing it is harmless.
        children[i].kill().unwrap();
    }
    children
        .into_iter()
        .map(|child| {
            let output = child.wait_with_output().unwrap();
            // Any other signal (an abort, a segfault) is a plugin bug, not one of our kills.
            match output.status.signal() {
                Some(9) => None,
                Some(signal) => panic!(
                    "plugin died of signal {signal}: {}",
                    String::from_utf8_lossy(&output.stderr)
                ),
                None => Some(CniOutcome::from(output)),
            }
        })
        .collect()
}

#[test]
fn sigkill_at_random_instants_never_corrupts_state_ipkeep() {
    let binary = common::ipkeep();
    let scratch = Scratch::new();
    let net_dir = scratch.path().join(NETWORK);
    let ipam = serde_json::json!({ "ranges": [[{ "subnet": "198.18.3.0/24" }], [{ "subnet": "2001:db8:3::/120" }]] });
    let config = net_config("1.0.0", NETWORK, scratch.path(), ipam.clone());
    let max_delay = typical_add(&binary, &config) * PER_ROUND as u32;
    let mut rng = Rng::new(0xc4a5_0001);
    let mut pool = Pool::new();
    let (mut killed, mut finished) = (0, 0);

    for round in 0..ROUNDS {
        let mut members: Vec<usize> = (0..POOL).collect();
        rng.shuffle(&mut members);
        members.truncate(PER_ROUND);
        let ops: Vec<&str> = members
            .iter()
            .map(|&i| match &pool.known[i] {
                Known::Free => "ADD",
                Known::Holds(_) if rng.chance(15) => "CHECK",
                Known::Holds(_) => "DEL",
                Known::Unknown if rng.chance(50) => "ADD",
                Known::Unknown => "DEL",
            })
            .collect();
        let calls: Vec<_> = members
            .iter()
            .zip(&ops)
            .map(|(&i, op)| pool.call(i, op, &config))
            .collect();
        let delays: Vec<_> = (0..calls.len())
            .map(|_| Duration::from_micros(rng.below(max_delay.as_micros() as u64 + 1)))
            .collect();

        let outcomes = run_and_kill(&binary, &calls, &delays);

        for ((&i, op), outcome) in members.iter().zip(&ops).zip(&outcomes) {
            let when = format!("round {round}, {op} {}", pool.ids[i]);
            let Some(outcome) = outcome else {
                killed += 1;
                if *op != "CHECK" {
                    pool.known[i] = Known::Unknown;
                }
                continue;
            };
            finished += 1;
            match (*op, outcome.code) {
                ("ADD", Some(0)) => pool.known[i] = Known::Holds(result_ips(&outcome.ok())),
                ("ADD", _) => {
                    // The only legitimate failure: a killed ADD already gave this attachment an
                    // address, and ADD is not idempotent (host-local behaviour).
                    let msg = outcome.err(999);
                    assert!(
                        msg.contains("duplicate allocation is not allowed"),
                        "{when}: {}",
                        describe(outcome)
                    );
                    assert_eq!(
                        pool.known[i],
                        Known::Unknown,
                        "{when}: duplicate for a container known to hold nothing"
                    );
                }
                ("DEL", _) => {
                    outcome.ok();
                    pool.known[i] = Known::Free;
                }
                ("CHECK", _) => {
                    assert_eq!(
                        outcome.code,
                        Some(0),
                        "{when}: CHECK of a held address failed: {}",
                        describe(outcome)
                    );
                }
                _ => unreachable!(),
            }
        }
        pool.check_disk(&net_dir, &format!("after round {round}"));
    }
    assert!(
        killed > 0 && finished > 0,
        "the kill instants (up to {max_delay:?}) must hit some processes and miss others: {killed} killed, {finished} finished"
    );

    // Recovery 1: GC keeps exactly the attachments it is told are valid.
    let valid: Vec<usize> = (0..POOL)
        .filter(|&i| matches!(pool.known[i], Known::Holds(_)))
        .collect();
    let gc_config = {
        let mut v: serde_json::Value =
            serde_json::from_str(&net_config("1.1.0", NETWORK, scratch.path(), ipam)).unwrap();
        v["cni.dev/valid-attachments"] = valid
            .iter()
            .map(|&i| serde_json::json!({ "containerID": pool.ids[i], "ifname": pool.ifnames[i] }))
            .collect();
        v.to_string()
    };
    let mut gc = CniCall::new("GC", "unused", &gc_config);
    (gc.container_id, gc.ifname, gc.netns) = (None, None, None);
    gc.run(&binary).ok();
    for known in &mut pool.known {
        if *known == Known::Unknown {
            *known = Known::Free;
        }
    }
    pool.check_disk(&net_dir, "after GC");

    // Recovery 2: the survivors are intact for CHECK, and DEL frees every container.
    for &i in &valid {
        let outcome = pool.call(i, "CHECK", &config).run(&binary);
        assert_eq!(
            outcome.code,
            Some(0),
            "CHECK {} after recovery: {}",
            pool.ids[i],
            describe(&outcome)
        );
    }
    for i in 0..POOL {
        pool.call(i, "DEL", &config).run(&binary).ok();
        pool.known[i] = Known::Free;
    }
    pool.check_disk(&net_dir, "after DEL of every container");
    assert!(allocations(&net_dir).is_empty());

    // Recovery 3: old and new containers are all served, each once, and DEL leaves nothing.
    let mut adds: Vec<CniCall> = (0..POOL).map(|i| pool.call(i, "ADD", &config)).collect();
    adds.extend((0..10).map(|i| CniCall::new("ADD", &format!("fresh{i}"), &config)));
    let mut expected = BTreeMap::new();
    for call in &adds {
        let holder = Holder::attachment(
            call.container_id.as_deref().unwrap(),
            call.ifname.as_deref().unwrap(),
        );
        for ip in result_ips(&call.run(&binary).ok()) {
            assert!(
                expected.insert(ip, holder.clone()).is_none(),
                "{ip} handed out twice after recovery"
            );
        }
    }
    assert_eq!(
        allocations(&net_dir),
        expected,
        "after recovery the files are exactly the results"
    );
    for call in &adds {
        let mut del = call.clone();
        del.command = Some("DEL".to_owned());
        del.run(&binary).ok();
    }
    assert!(
        allocations(&net_dir).is_empty(),
        "DEL of every container leaves no allocation"
    );
    let mut temps = Vec::new();
    find_temps(&net_dir, &mut temps);
    assert!(
        temps.is_empty(),
        "temporary files of killed processes survive recovery: {temps:?}"
    );
}

/// Every entry below `dir` whose name carries ipkeep's temporary-file prefix.
fn find_temps(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(ipkeep_netdir::TEMP_PREFIX)
        {
            out.push(entry.path());
        }
        if entry.file_type().unwrap().is_dir() {
            find_temps(&entry.path(), out);
        }
    }
}

/// The deterministic form of the crash test's last check: temporaries that killed processes left
/// in any of ipkeep's private directories are gone once ipkeep has re-read the directory (here
/// because host-local changed it, as after a kill that left the index unsealed).
#[test]
fn temporaries_of_killed_processes_are_removed_ipkeep() {
    let (ipkeep, host_local) = (common::ipkeep(), common::host_local());
    let scratch = Scratch::new();
    let net_dir = scratch.path().join(NETWORK);
    let config = net_config(
        "1.0.0",
        NETWORK,
        scratch.path(),
        serde_json::json!({ "subnet": "198.18.7.0/24" }),
    );
    CniCall::new("ADD", "first", &config).run(&ipkeep).ok();
    let mut planted = Vec::new();
    plant_temps(&net_dir, &mut planted);
    assert!(
        planted.len() > 1,
        "ipkeep keeps private directories below the network directory: {planted:?}"
    );
    CniCall::new("ADD", "other", &config).run(&host_local).ok();

    CniCall::new("ADD", "second", &config).run(&ipkeep).ok();

    let mut left = Vec::new();
    find_temps(&net_dir, &mut left);
    assert!(
        left.is_empty(),
        "stale temporaries survive a rebuild (planted {planted:?}): {left:?}"
    );
}

/// Puts a temporary named like one of a process that no longer exists into `dir` and every
/// directory below it.
fn plant_temps(dir: &Path, planted: &mut Vec<std::path::PathBuf>) {
    let temp = dir.join(format!("{}999999-0", ipkeep_netdir::TEMP_PREFIX));
    std::fs::write(&temp, "c1\r\neth0").unwrap();
    planted.push(temp);
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            plant_temps(&entry.path(), planted);
        }
    }
}

const RES_NETWORK: &str = "crashres";
const RESERVED_PODS: usize = 5;
const PLAIN_PODS: usize = 8;
const RES_ROUNDS: usize = 100;
/// At most this many sandboxes of one pod at a time (the force-delete order stacks them up).
const MAX_SANDBOXES: usize = 3;

/// One sandbox (container) of a pod and what the finished processes say about it.
#[derive(Clone, Debug)]
struct Sandbox {
    id: String,
    known: Known,
}

/// A pod whose sandboxes are created and deleted in the order a runtime may use, including the
/// force-delete order (a new sandbox's ADD before the old one's DEL).
#[derive(Debug)]
struct PodModel {
    namespace: &'static str,
    name: String,
    /// Its reservation's addresses (empty for a pod without one).
    reserved: Vec<IpAddr>,
    sandboxes: Vec<Sandbox>,
    created: usize,
}

impl PodModel {
    fn args(&self) -> String {
        format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={}",
            self.namespace, self.name
        )
    }

    fn new_sandbox(&mut self) -> String {
        self.created += 1;
        format!("{}-s{}", self.name, self.created)
    }

    /// The pod a container ID of this test belongs to.
    fn owns(&self, container_id: &str) -> bool {
        container_id
            .strip_prefix(self.name.as_str())
            .is_some_and(|rest| rest.starts_with("-s"))
    }
}

/// Which of the pods' calls a round makes for one pod.
#[derive(Clone, Debug)]
enum PodOp {
    /// ADD of a new sandbox (while older ones may still hold addresses).
    Add { id: String, zero_grace: bool },
    /// DEL of this sandbox.
    Del(String),
    /// CHECK of this sandbox, known to hold addresses.
    Check(String),
}

fn reservation_file(pod: &PodModel, uid: usize) -> ipkeep_reservation::ReservationFile {
    ipkeep_reservation::ReservationFile {
        version: ipkeep_reservation::FORMAT_VERSION,
        namespace: pod.namespace.to_owned(),
        pod: pod.name.clone(),
        ips: pod.reserved.clone(),
        release_time: None,
        uid: format!("uid-{}-{uid}", pod.name),
        node_name: Some("node-crash".to_owned()),
        generation: None,
        retain_for_seconds: None,
    }
}

/// The invariants of the reservation crash test that hold whatever instant processes died at.
fn check_reservation_disk(dir: &ipkeep_netdir::NetworkDir, pods: &[PodModel], when: &str) {
    use ipkeep_reservation::add::{ReservationLookup, read_wait_marker};
    use ipkeep_reservation::{PodKey, Timestamp, load_reservations_cached};
    let net_dir = dir.path();
    // Every IP file parses (allocations() panics otherwise) and belongs to a pod of the test.
    let on_disk = allocations(net_dir);
    assert!(
        nested_ip_named(net_dir).is_empty(),
        "{when}: files named like addresses below the network directory"
    );
    let mut per_container: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
    for (ip, holder) in &on_disk {
        let pod = pods
            .iter()
            .find(|p| p.owns(holder.id()))
            .unwrap_or_else(|| panic!("{when}: {ip} held by {holder:?}, no pod of this test"));
        assert_eq!(
            *holder,
            Holder::attachment(holder.id(), "eth0"),
            "{when}: {ip} held under the wrong key"
        );
        // Nobody holds another pod's reserved address.
        if let Some(owner) = pods.iter().find(|p| p.reserved.contains(ip)) {
            assert_eq!(
                owner.name,
                pod.name,
                "{when}: reserved address {ip} of pod {} is held by {} of pod {}",
                owner.name,
                holder.id(),
                pod.name
            );
        }
        per_container
            .entry(holder.id().to_owned())
            .or_default()
            .push(*ip);
    }
    for (id, ips) in &per_container {
        let families: BTreeSet<bool> = ips.iter().map(IpAddr::is_ipv4).collect();
        assert_eq!(
            families.len(),
            ips.len(),
            "{when}: {id} holds more than one address per range set: {ips:?}"
        );
    }
    for pod in pods {
        for sandbox in &pod.sandboxes {
            let mut held = per_container.get(&sandbox.id).cloned().unwrap_or_default();
            held.sort();
            match &sandbox.known {
                Known::Free => assert!(held.is_empty(), "{when}: {} holds {held:?}", sandbox.id),
                Known::Holds(ips) => {
                    let mut ips = ips.clone();
                    ips.sort();
                    assert_eq!(
                        held, ips,
                        "{when}: {} must hold what ADD returned",
                        sandbox.id
                    );
                }
                Known::Unknown => {}
            }
        }
    }
    // The snapshot is either valid or rebuilt from the files, and either way says what they say.
    let lock = dir.lock().unwrap();
    let (snapshot, _) = load_reservations_cached(dir, &lock);
    assert!(
        snapshot.skipped().is_empty(),
        "{when}: reserved/ holds garbage: {:?}",
        snapshot.skipped()
    );
    let now = Timestamp::from_system_time(std::time::SystemTime::now());
    let lookup = snapshot.lookup(now);
    for pod in pods.iter().filter(|p| !p.reserved.is_empty()) {
        let key = PodKey::new(pod.namespace, &pod.name).unwrap();
        for ip in &pod.reserved {
            assert_eq!(
                lookup.held_for_other(*ip, None),
                Some(key.clone()),
                "{when}: the snapshot lost {ip} of {key}"
            );
        }
        // A marker is either readable or treated as absent; one that names a container must name
        // one of this pod's.
        if let Some(marker) = read_wait_marker(dir, &key, &mut Vec::new()) {
            assert!(
                pod.owns(&marker.holder),
                "{when}: wait marker of {key} names {marker:?}"
            );
        }
    }
    drop(lock);
}

#[test]
fn sigkill_during_reservation_adds_never_leaks_a_reserved_address_ipkeep() {
    use ipkeep_netdir::NetworkDir;
    use ipkeep_reservation::add::{TRY_AGAIN_LATER_CODE, read_wait_marker};
    use ipkeep_reservation::{PodKey, ReservationWriter, write_reservation};
    let binary = common::ipkeep();
    let scratch = Scratch::new();
    let ipam = serde_json::json!({ "ranges": [[{ "subnet": "198.18.4.0/24" }], [{ "subnet": "2001:db8:4::/120" }]] });
    let config = net_config("1.0.0", RES_NETWORK, scratch.path(), ipam.clone());
    let mut zero = ipam.clone();
    zero["reservationGraceSeconds"] = 0.into();
    let zero_config = net_config("1.0.0", RES_NETWORK, scratch.path(), zero);
    let max_delay = typical_add(&binary, &config) * PER_ROUND as u32;
    let dir = NetworkDir::open(scratch.path(), RES_NETWORK).unwrap();
    let net_dir = dir.path().to_owned();

    // Reserved addresses spread over the range, including ones round robin reaches early.
    let mut pods: Vec<PodModel> = (0..RESERVED_PODS)
        .map(|k| PodModel {
            namespace: "db",
            name: format!("keep-{k}"),
            reserved: vec![
                format!("198.18.4.{}", 3 + 7 * k).parse().unwrap(),
                format!("2001:db8:4::{:x}", 3 + 7 * k).parse().unwrap(),
            ],
            sandboxes: Vec::new(),
            created: 0,
        })
        .collect();
    pods.extend((0..PLAIN_PODS).map(|k| PodModel {
        namespace: "web",
        name: format!("plain-{k}"),
        reserved: Vec::new(),
        sandboxes: Vec::new(),
        created: 0,
    }));
    let files: Vec<_> = pods
        .iter()
        .filter(|p| !p.reserved.is_empty())
        .map(|p| reservation_file(p, 0).validate().unwrap())
        .collect();
    let report = ReservationWriter::new().apply(&dir, &files).unwrap();
    assert_eq!(report.written.len(), RESERVED_PODS, "{report:?}");

    let all_reserved: Vec<IpAddr> = files.iter().flat_map(|f| f.ips.clone()).collect();
    let mut rng = Rng::new(0xc4a5_0002);
    let (mut killed, mut finished, mut retries) = (0, 0, 0);
    for round in 0..RES_ROUNDS {
        // The writer changes a reservation (new uid, same addresses) or drops the snapshot now and
        // then, so plugin processes rebuild `.ipkeep/reserved.index` while they are being killed.
        if rng.chance(10) {
            let k = rng.below(RESERVED_PODS as u64) as usize;
            let file = reservation_file(&pods[k], round + 1).validate().unwrap();
            write_reservation(&dir, &file).unwrap();
        }
        if rng.chance(15) {
            let _ = std::fs::remove_file(net_dir.join(".ipkeep").join("reserved.index"));
        }
        let mut members: Vec<usize> = (0..pods.len()).collect();
        rng.shuffle(&mut members);
        members.truncate(PER_ROUND);
        let mut ops = Vec::new();
        for &p in &members {
            let pod = &mut pods[p];
            let busy: Vec<&Sandbox> = pod
                .sandboxes
                .iter()
                .filter(|s| s.known != Known::Free)
                .collect();
            let op = if busy.is_empty()
                || (busy.len() < MAX_SANDBOXES
                    && rng.chance(if pod.reserved.is_empty() { 10 } else { 40 }))
            {
                PodOp::Add {
                    id: pod.new_sandbox(),
                    zero_grace: rng.chance(10),
                }
            } else {
                let s = busy[rng.below(busy.len() as u64) as usize];
                if matches!(s.known, Known::Holds(_)) && rng.chance(15) {
                    PodOp::Check(s.id.clone())
                } else {
                    PodOp::Del(s.id.clone())
                }
            };
            ops.push(op);
        }
        let calls: Vec<CniCall> = members
            .iter()
            .zip(&ops)
            .map(|(&p, op)| {
                let (command, id, conf) = match op {
                    PodOp::Add { id, zero_grace } => {
                        ("ADD", id, if *zero_grace { &zero_config } else { &config })
                    }
                    PodOp::Del(id) => ("DEL", id, &config),
                    PodOp::Check(id) => ("CHECK", id, &config),
                };
                CniCall::new(command, id, conf).args(&pods[p].args())
            })
            .collect();
        let delays: Vec<_> = (0..calls.len())
            .map(|_| Duration::from_micros(rng.below(max_delay.as_micros() as u64 + 1)))
            .collect();

        let outcomes = run_and_kill(&binary, &calls, &delays);

        for ((&p, op), outcome) in members.iter().zip(&ops).zip(&outcomes) {
            let when = format!("round {round}, {op:?} of pod {}", pods[p].name);
            let pod = &mut pods[p];
            if let PodOp::Add { id, .. } = op {
                pod.sandboxes.push(Sandbox {
                    id: id.clone(),
                    known: Known::Free,
                });
            }
            let id = match op {
                PodOp::Add { id, .. } | PodOp::Del(id) | PodOp::Check(id) => id.clone(),
            };
            let Some(outcome) = outcome else {
                killed += 1;
                if !matches!(op, PodOp::Check(_)) {
                    let s = pod.sandboxes.iter_mut().find(|s| s.id == id).unwrap();
                    s.known = Known::Unknown;
                }
                continue;
            };
            finished += 1;
            let stderr = outcome.stderr_str();
            assert!(
                !stderr.contains("failed to") && !stderr.contains("skipped"),
                "{when}: state left by killed processes is reported as broken: {stderr}"
            );
            let others_busy = pod
                .sandboxes
                .iter()
                .any(|s| s.id != id && s.known != Known::Free);
            let s = pod.sandboxes.iter().position(|s| s.id == id).unwrap();
            match (op, outcome.code) {
                (PodOp::Add { .. }, Some(0)) => {
                    let ips = result_ips(&outcome.ok());
                    assert!(
                        ips.iter()
                            .all(|ip| pod.reserved.contains(ip) || !all_reserved.contains(ip)),
                        "{when}: got another pod's reserved address: {ips:?}"
                    );
                    if !others_busy && !pod.reserved.is_empty() {
                        let (mut got, mut want) = (ips.clone(), pod.reserved.clone());
                        got.sort();
                        want.sort();
                        assert_eq!(
                            got, want,
                            "{when}: no older sandbox, so exactly the reserved addresses"
                        );
                    }
                    pod.sandboxes[s].known = Known::Holds(ips);
                }
                (PodOp::Add { .. }, Some(_)) => {
                    let code = outcome.json()["code"].as_u64();
                    assert_eq!(
                        code,
                        Some(u64::from(TRY_AGAIN_LATER_CODE)),
                        "{when}: {}",
                        describe(outcome)
                    );
                    assert!(
                        others_busy && !pod.reserved.is_empty(),
                        "{when}: try again later without an older sandbox holding anything"
                    );
                    retries += 1;
                    let key = PodKey::new(pod.namespace, &pod.name).unwrap();
                    let marker = read_wait_marker(&dir, &key, &mut Vec::new())
                        .unwrap_or_else(|| panic!("{when}: code 11 left no wait marker"));
                    assert!(pod.owns(&marker.holder), "{when}: {marker:?}");
                    // A runtime gives up on this sandbox; nothing of it is on disk.
                    pod.sandboxes[s].known = Known::Free;
                }
                (PodOp::Del(_), _) => {
                    outcome.ok();
                    pod.sandboxes[s].known = Known::Free;
                }
                (PodOp::Check(_), code) => {
                    assert_eq!(code, Some(0), "{when}: CHECK failed: {}", describe(outcome));
                }
                (PodOp::Add { .. }, None) => panic!("{when}: no exit code: {}", describe(outcome)),
            }
        }
        check_reservation_disk(&dir, &pods, &format!("after round {round}"));
        for pod in &mut pods {
            pod.sandboxes.retain(|s| s.known != Known::Free);
        }
    }
    assert!(
        killed > 0 && finished > 0 && retries > 0,
        "the rounds must kill some processes, let others finish and hit the force-delete order: \
         {killed} killed, {finished} finished, {retries} answered try-again-later"
    );

    // Recovery 1: GC keeps exactly the attachments it is told are valid.
    let valid: Vec<(usize, String)> = pods
        .iter()
        .enumerate()
        .flat_map(|(p, pod)| {
            pod.sandboxes
                .iter()
                .filter(|s| matches!(s.known, Known::Holds(_)))
                .map(move |s| (p, s.id.clone()))
        })
        .collect();
    let gc_config = {
        let mut v: serde_json::Value =
            serde_json::from_str(&net_config("1.1.0", RES_NETWORK, scratch.path(), ipam)).unwrap();
        v["cni.dev/valid-attachments"] = valid
            .iter()
            .map(|(_, id)| serde_json::json!({ "containerID": id, "ifname": "eth0" }))
            .collect();
        v.to_string()
    };
    let mut gc = CniCall::new("GC", "unused", &gc_config);
    (gc.container_id, gc.ifname, gc.netns) = (None, None, None);
    gc.run(&binary).ok();
    for pod in &mut pods {
        for s in &mut pod.sandboxes {
            if s.known == Known::Unknown {
                s.known = Known::Free;
            }
        }
    }
    check_reservation_disk(&dir, &pods, "after GC");

    // Recovery 2: the survivors pass CHECK, and DEL frees every sandbox.
    for (p, id) in &valid {
        let outcome = CniCall::new("CHECK", id, &config)
            .args(&pods[*p].args())
            .run(&binary);
        assert_eq!(outcome.code, Some(0), "CHECK {id}: {}", describe(&outcome));
    }
    for pod in &mut pods {
        let args = pod.args();
        for s in &mut pod.sandboxes {
            CniCall::new("DEL", &s.id, &config)
                .args(&args)
                .run(&binary)
                .ok();
            s.known = Known::Free;
        }
    }
    check_reservation_disk(&dir, &pods, "after DEL of every sandbox");
    assert!(allocations(&net_dir).is_empty());

    // Recovery 3: every reserved pod's next sandbox gets exactly its reserved addresses (and its
    // wait marker goes), every other pod gets addresses nobody reserved.
    let mut adds = Vec::new();
    for pod in &mut pods {
        let id = pod.new_sandbox();
        let outcome = CniCall::new("ADD", &id, &config)
            .args(&pod.args())
            .run(&binary);
        let mut got = result_ips(&outcome.ok());
        got.sort();
        if pod.reserved.is_empty() {
            assert!(
                got.iter().all(|ip| !all_reserved.contains(ip)),
                "{} got a reserved address: {got:?}",
                pod.name
            );
        } else {
            let mut want = pod.reserved.clone();
            want.sort();
            assert_eq!(got, want, "pod {} after recovery", pod.name);
            let key = PodKey::new(pod.namespace, &pod.name).unwrap();
            assert_eq!(
                read_wait_marker(&dir, &key, &mut Vec::new()),
                None,
                "{key}: marker left"
            );
        }
        adds.push((id, pod.args()));
    }
    for (id, args) in &adds {
        CniCall::new("DEL", id, &config)
            .args(args)
            .run(&binary)
            .ok();
    }
    assert!(allocations(&net_dir).is_empty(), "DEL leaves no allocation");
    let mut temps = Vec::new();
    find_temps(&net_dir, &mut temps);
    assert!(
        temps.is_empty(),
        "temporary files of killed processes survive recovery: {temps:?}"
    );
}
