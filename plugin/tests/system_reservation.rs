//! Reservations under concurrency: a writer process rewrites the reservation files continuously
//! (through the library writer, exactly as the node agent does) while well over a hundred ADD/DEL
//! plugin processes run for reserved and unreserved pods on the same network.
//!
//! # The pods
//! * `stable/db-N`: reservations that hold their addresses for the whole run. The writer keeps
//!   rewriting them (new uid, releaseTime flipping between null and the future) but never
//!   removes or expires them, so their addresses give a crisp invariant: in no snapshot and in
//!   no ADD result does one of them belong to a container of another pod. Two of them never run
//!   a container at all (pods that are away); their addresses must never appear in an IP file.
//! * `churn/cache-N`: reservations the writer creates, updates (releaseTime null / future /
//!   past) and removes at random. Their addresses may legitimately go to another pod while the
//!   reservation is removed or expired, and stay with that container when the reservation comes
//!   back (a reservation never takes an address from a live container). So they are checked per
//!   allocation, against a logical clock (below): an ADD of another pod must not return such an
//!   address if the reservation was surely active during the whole life of that ADD process.
//! * `apps/web-N`: pods without reservation.
//!
//! # The logical clock
//! One atomic counter orders every event the test can observe: a plugin process is stamped
//! before it is spawned and after it has exited; a writer operation is stamped after the writer
//! announced it and before the test lets it go on (the writer waits for the test's "go"), and
//! again after the writer reported it done. So "op done < process spawned" and "process exited <
//! op begun" are real-time facts, and a reservation whose every operation either finished
//! before the process started or began after it ended was in one known state throughout.
//!
//! Writer and plugins are paced against each other with the same counters (the writer's op `k`
//! waits until about `k/N` of the plugin processes have started and vice versa, with a little
//! slack), so the writer's work really overlaps the plugins' whatever the machine's speed; no
//! sleeps, and the waits have a deadline only as a guard against a dead peer.
//!
//! # Snapshots
//! After every process exit and every writer operation, a snapshot thread reads the directory:
//! every IP file and every reservation file must parse, the stable reservations must be there,
//! and no stable address may be in an IP file of another pod's container. At the end: every
//! process succeeded, stable pods got exactly their addresses, the IP files are exactly the live
//! containers, the reservation files are exactly the writer's final model, and no temporary
//! file is left anywhere under the network directory (nor any nested IP-named file host-local
//! could mistake for an allocation).
//!
//! The writer is this test binary itself, re-executed with [`WRITER_ENV`] set so that
//! [`reservation_writer_process`] runs the writer loop; run without it, that test applies the
//! same plan in-process and checks the files after every operation.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
mod system_support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::{Duration, Instant, SystemTime};

use common::{CniCall, CniOutcome};
use ipkeep_netdir::{NetworkDir, TEMP_PREFIX};
use ipkeep_reservation::{
    FORMAT_VERSION, PodKey, ReservationFile, ReservationWriter, Timestamp, ValidReservation,
    load_reservations, remove_reservation, write_reservation,
};
use system_support::{
    Holder, Rng, Scratch, describe, finish, nested_ip_named, net_config, result_ips, spawn,
};

const NETWORK: &str = "resvsys";
/// Set (to the data directory) in the re-executed writer process.
const WRITER_ENV: &str = "IPKEEP_TEST_RESERVATION_WRITER_DATA_DIR";
/// The test that becomes the writer when [`WRITER_ENV`] is set.
const WRITER_TEST: &str = "reservation_writer_process";
/// Prefix of the writer's protocol lines on its stdout (the test harness prints other lines).
const WRITER_LINE: &str = "ipkeep-writer:";
const WRITER_SEED: u64 = 0x7e5e_0003;
const LIFE_SEED: u64 = 0x7e5e_0004;
/// Operations the writer performs before it stops by itself.
const WRITER_OPS: usize = 240;
/// Slack of the pacing: how many processes / writer ops one side may lag behind the other.
const PROCESS_SLACK: usize = 8;
const OP_SLACK: usize = 4;
/// Guard against a dead peer only; a healthy run never comes near it.
const PEER_DEADLINE: Duration = Duration::from_secs(600);
/// releaseTime values: 2100-01-01 and 2000-01-01, surely in the future and the past.
const FUTURE: i64 = 4_102_444_800;
const PAST: i64 = 946_684_800;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Stable,
    Churn,
    Plain,
}

#[derive(Clone, Debug)]
struct Pod {
    key: PodKey,
    kind: Kind,
    /// The reserved addresses (IPv4, IPv6); empty for pods without reservation.
    reserved: Vec<IpAddr>,
    /// Whether the pod runs containers at all.
    runs: bool,
}

fn v4(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(198, 18, 20, last))
}

fn v6(last: u16) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0x20, 0, 0, 0, 0, last))
}

/// Reserved addresses sit at the start of the range, where round-robin allocation begins.
fn pods() -> Vec<Pod> {
    let mut pods = Vec::new();
    for i in 0..6u8 {
        pods.push(Pod {
            key: PodKey::new("stable", &format!("db-{i}")).unwrap(),
            kind: Kind::Stable,
            reserved: vec![v4(2 + 2 * i), v6(2 + 2 * u16::from(i))],
            runs: i < 4,
        });
    }
    for i in 0..8u8 {
        pods.push(Pod {
            key: PodKey::new("churn", &format!("cache-{i}")).unwrap(),
            kind: Kind::Churn,
            reserved: vec![v4(3 + 2 * i), v6(3 + 2 * u16::from(i))],
            runs: true,
        });
    }
    for i in 0..26 {
        pods.push(Pod {
            key: PodKey::new("apps", &format!("web-{i}")).unwrap(),
            kind: Kind::Plain,
            reserved: Vec::new(),
            runs: true,
        });
    }
    pods
}

fn config(data_dir: &Path) -> String {
    net_config(
        "1.0.0",
        NETWORK,
        data_dir,
        serde_json::json!({ "ranges": [
            [{ "subnet": "198.18.20.0/24" }],
            [{ "subnet": "2001:db8:20::/64" }],
        ] }),
    )
}

fn reservation(pod: &Pod, release: Option<i64>, uid: String) -> ReservationFile {
    ReservationFile {
        version: FORMAT_VERSION,
        namespace: pod.key.namespace().to_owned(),
        pod: pod.key.name().to_owned(),
        ips: pod.reserved.clone(),
        release_time: release.map(Timestamp::from_unix_secs),
        uid,
        node_name: Some("system-node".to_owned()),
        generation: None,
        retain_for_seconds: None,
    }
}

type Model = BTreeMap<PodKey, ReservationFile>;

/// Every reserved pod starts with a bound reservation.
fn initial_model() -> Model {
    pods()
        .iter()
        .filter(|p| p.kind != Kind::Plain)
        .map(|p| {
            (
                p.key.clone(),
                reservation(p, None, "uid-initial".to_owned()),
            )
        })
        .collect()
}

#[derive(Clone, Debug)]
enum WriterOp {
    Write(ReservationFile),
    Remove(PodKey),
    /// The whole desired set, as the agent's resync passes it.
    Sync(Vec<ReservationFile>),
}

/// One planned writer operation and the files it leaves.
#[derive(Clone, Debug)]
struct PlannedOp {
    op: WriterOp,
    /// The pods whose file the operation may change while it runs.
    touches: BTreeSet<PodKey>,
    after: Model,
}

/// A churn pod's next state: bound, released, expired or gone.
fn churn_state(rng: &mut Rng, pod: &Pod, uid: String) -> Option<ReservationFile> {
    // Mostly active, so that the owner's own ADDs often find their reservation in force.
    match rng.below(20) {
        0..7 => Some(reservation(pod, None, uid)),
        7..14 => Some(reservation(pod, Some(FUTURE), uid)),
        14..17 => Some(reservation(pod, Some(PAST), uid)),
        _ => None,
    }
}

/// The writer's operations, the same in the writer process and in the test that checks them.
fn writer_plan() -> Vec<PlannedOp> {
    let pods = pods();
    let stable: Vec<&Pod> = pods.iter().filter(|p| p.kind == Kind::Stable).collect();
    let churn: Vec<&Pod> = pods.iter().filter(|p| p.kind == Kind::Churn).collect();
    let mut rng = Rng::new(WRITER_SEED);
    let mut model = initial_model();
    let mut plan = Vec::with_capacity(WRITER_OPS);
    // A stable reservation flips between bound and released-until-the-future: always active.
    let flip_stable = |model: &Model, pod: &Pod, uid: String| {
        let release = match model.get(&pod.key).map(|f| f.release_time) {
            Some(None) => Some(FUTURE),
            _ => None,
        };
        reservation(pod, release, uid)
    };
    for k in 0..WRITER_OPS {
        let uid = format!("uid-{k}");
        let before = model.clone();
        let op = if k % 20 == 19 {
            for pod in &stable {
                if rng.chance(50) {
                    let file = flip_stable(&model, pod, uid.clone());
                    model.insert(pod.key.clone(), file);
                }
            }
            for _ in 0..3 {
                let pod = churn[rng.below(churn.len() as u64) as usize];
                match churn_state(&mut rng, pod, uid.clone()) {
                    Some(file) => model.insert(pod.key.clone(), file),
                    None => model.remove(&pod.key),
                };
            }
            WriterOp::Sync(model.values().cloned().collect())
        } else if rng.chance(30) {
            let pod = stable[rng.below(stable.len() as u64) as usize];
            let file = flip_stable(&model, pod, uid);
            model.insert(pod.key.clone(), file.clone());
            WriterOp::Write(file)
        } else {
            let pod = churn[rng.below(churn.len() as u64) as usize];
            match churn_state(&mut rng, pod, uid) {
                Some(file) => {
                    model.insert(pod.key.clone(), file.clone());
                    WriterOp::Write(file)
                }
                None => {
                    model.remove(&pod.key);
                    WriterOp::Remove(pod.key.clone())
                }
            }
        };
        let touches = match &op {
            WriterOp::Write(file) => BTreeSet::from([file.pod_key().unwrap()]),
            WriterOp::Remove(key) => BTreeSet::from([key.clone()]),
            // Sync leaves a file whose content is already the desired one alone.
            WriterOp::Sync(_) => before
                .keys()
                .chain(model.keys())
                .filter(|key| before.get(*key) != model.get(*key))
                .cloned()
                .collect(),
        };
        plan.push(PlannedOp {
            op,
            touches,
            after: model.clone(),
        });
    }
    plan
}

/// `file`, validated as the agent's writer takes it.
fn valid(file: &ReservationFile) -> ValidReservation {
    file.clone().validate().unwrap()
}

/// Applies one operation with the library writer; any failure fails the writer.
fn apply(dir: &NetworkDir, op: &WriterOp) {
    match op {
        WriterOp::Write(file) => write_reservation(dir, &valid(file)).unwrap(),
        WriterOp::Remove(key) => {
            remove_reservation(dir, key.namespace(), key.name()).unwrap();
        }
        WriterOp::Sync(desired) => {
            // A writer that reads the tree, as the Write and Remove ops changed it behind its back.
            let desired: Vec<_> = desired.iter().map(valid).collect();
            let report = ReservationWriter::new().apply(dir, &desired).unwrap();
            assert!(
                report.is_complete() && report.cleaned.is_empty(),
                "sync must do exactly the planned changes: {report:?}"
            );
        }
    }
}

/// Whether `file` holds its addresses (the release times are decades away from any clock).
fn holds(file: Option<&ReservationFile>) -> bool {
    file.is_some_and(|f| f.is_active(Timestamp::from_system_time(SystemTime::now())))
}

/// The writer. In the re-executed process it announces each operation on stdout, waits for the
/// test's "go" on stdin, applies it and reports it done; otherwise it applies the plan to a
/// scratch directory and checks the files after every operation.
#[test]
fn reservation_writer_process() {
    let plan = writer_plan();
    if let Ok(data_dir) = std::env::var(WRITER_ENV) {
        let dir = NetworkDir::open(Path::new(&data_dir), NETWORK).unwrap();
        let stdin = std::io::stdin();
        for (k, planned) in plan.iter().enumerate() {
            println!("{WRITER_LINE} begin {k}");
            let mut go = String::new();
            stdin.lock().read_line(&mut go).unwrap();
            assert_eq!(go.trim(), "go", "the test did not let op {k} go on");
            apply(&dir, &planned.op);
            println!("{WRITER_LINE} done {k}");
        }
        println!("{WRITER_LINE} finished");
        return;
    }
    let scratch = Scratch::new();
    let dir = NetworkDir::open(scratch.path(), NETWORK).unwrap();
    let initial: Vec<_> = initial_model().into_values().collect();
    let initial: Vec<_> = initial.iter().map(valid).collect();
    ReservationWriter::new().apply(&dir, &initial).unwrap();
    let (mut writes, mut removes, mut syncs, mut expired) = (0, 0, 0, 0);
    for (k, planned) in plan.iter().enumerate() {
        apply(&dir, &planned.op);
        let loaded = load_reservations(&dir);
        assert!(loaded.skipped.is_empty(), "op {k}: {:?}", loaded.skipped);
        assert_eq!(
            loaded.files, planned.after,
            "op {k} ({:?}) must leave exactly the planned files",
            planned.op
        );
        match &planned.op {
            WriterOp::Write(f) if f.release_time == Some(Timestamp::from_unix_secs(PAST)) => {
                expired += 1;
            }
            WriterOp::Write(_) => writes += 1,
            WriterOp::Remove(_) => removes += 1,
            WriterOp::Sync(_) => syncs += 1,
        }
    }
    assert!(
        writes > 50 && removes > 10 && syncs > 5 && expired > 10,
        "the plan must mix every kind of change: {writes} writes, {removes} removes, {syncs} syncs, {expired} expiries"
    );
}

/// One plugin process a pod's thread runs.
#[derive(Clone, Debug)]
struct LifeOp {
    command: &'static str,
    container: String,
    /// For an ADD made while the pod's previous sandbox (this one) is still there, as after a
    /// force delete: the runtime has not run its DEL yet.
    force_over: Option<String>,
}

impl LifeOp {
    fn new(command: &'static str, container: &str) -> Self {
        Self {
            command,
            container: container.to_owned(),
            force_over: None,
        }
    }
}

/// One pod's life: ADD, then DEL / ADD (every ADD a new sandbox, as when the pod is deleted and
/// re-created); it may end bound or not. A reserved pod is sometimes re-created before its old
/// sandbox's DEL: that early ADD (answered "try again later" while the old sandbox holds the
/// reserved address) is followed by its own DEL, the old DEL and the retried ADD, as a runtime
/// does it.
fn life(rng: &mut Rng, pod: &Pod) -> Vec<LifeOp> {
    // Reserved pods come back more often: their ADDs are what the reservation checks look at.
    let adds = if pod.kind != Kind::Plain {
        2 + rng.below(3)
    } else {
        1 + rng.below(3)
    };
    let id = |n: u64| format!("{}-{}-{n}", pod.key.namespace(), pod.key.name());
    let mut ops = vec![LifeOp::new("ADD", &id(0))];
    for n in 1..adds {
        let (old, new) = (id(n - 1), id(n));
        if pod.kind != Kind::Plain && rng.chance(50) {
            let early = format!("{new}-early");
            ops.push(LifeOp {
                force_over: Some(old.clone()),
                ..LifeOp::new("ADD", &early)
            });
            ops.push(LifeOp::new("DEL", &early));
        }
        ops.push(LifeOp::new("DEL", &old));
        ops.push(LifeOp::new("ADD", &new));
    }
    if rng.chance(50) {
        ops.push(LifeOp::new("DEL", &id(adds - 1)));
    }
    ops
}

/// The logical clock (see the module docs).
#[derive(Debug, Default)]
struct Clock(AtomicU64);

impl Clock {
    fn tick(&self) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst)
    }
}

#[derive(Debug, Default)]
struct Counts {
    /// Plugin processes started.
    spawned: usize,
    /// Writer operations let go.
    ops_begun: usize,
    /// The writer's stdout closed: plugins no longer wait for it.
    writer_gone: bool,
}

/// The pacing between the writer and the plugin processes.
#[derive(Debug, Default)]
struct Progress {
    counts: Mutex<Counts>,
    changed: Condvar,
}

impl Progress {
    fn wait_until(&self, what: &dyn Fn() -> String, ready: &dyn Fn(&Counts) -> bool) {
        let deadline = Instant::now() + PEER_DEADLINE;
        let mut counts = self.counts.lock().unwrap();
        while !ready(&counts) {
            let left = deadline
                .checked_duration_since(Instant::now())
                .unwrap_or_else(|| {
                    panic!("gave up after {PEER_DEADLINE:?} waiting for {}", what())
                });
            counts = self.changed.wait_timeout(counts, left).unwrap().0;
        }
    }

    fn update(&self, change: impl FnOnce(&mut Counts)) {
        change(&mut self.counts.lock().unwrap());
        self.changed.notify_all();
    }
}

/// One plugin process as observed by the test.
#[derive(Debug)]
struct Process {
    pod: usize,
    command: &'static str,
    container: String,
    force_over: Option<String>,
    spawned_at: u64,
    exited_at: u64,
    outcome: CniOutcome,
}

/// What the test saw of the writer.
#[derive(Debug)]
struct WriterRun {
    begun: Vec<Option<u64>>,
    done: Vec<Option<u64>>,
    finished: bool,
    status: ExitStatus,
    other_output: Vec<String>,
}

/// Runs the writer process, answering its announcements with "go" when the pacing allows.
fn run_writer(
    data_dir: &Path,
    stderr_file: &Path,
    processes: usize,
    clock: &Clock,
    progress: &Progress,
    snapshots: &mpsc::Sender<()>,
) -> WriterRun {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([WRITER_TEST, "--exact", "--nocapture", "--test-threads", "1"])
        .env(WRITER_ENV, data_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(stderr_file).unwrap())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let mut run = WriterRun {
        begun: vec![None; WRITER_OPS],
        done: vec![None; WRITER_OPS],
        finished: false,
        status: ExitStatus::default(),
        other_output: Vec::new(),
    };
    for line in stdout.lines() {
        let line = line.unwrap();
        // The harness prints "test <name> ... " without a newline before the first line.
        let Some((_, message)) = line.split_once(WRITER_LINE) else {
            run.other_output.push(line);
            continue;
        };
        let words: Vec<&str> = message.split_whitespace().collect();
        match words[..] {
            ["begin", k] => {
                let k: usize = k.parse().unwrap();
                let needed = (k * processes / WRITER_OPS).saturating_sub(PROCESS_SLACK);
                progress.wait_until(
                    &|| format!("{needed} plugin processes to start before writer op {k}"),
                    &|c| c.spawned >= needed,
                );
                run.begun[k] = Some(clock.tick());
                progress.update(|c| c.ops_begun = k + 1);
                // The writer may have died meanwhile; its exit status tells why.
                let _ = stdin.write_all(b"go\n").and_then(|()| stdin.flush());
            }
            ["done", k] => {
                run.done[k.parse::<usize>().unwrap()] = Some(clock.tick());
                let _ = snapshots.send(());
            }
            ["finished"] => run.finished = true,
            _ => run.other_output.push(line),
        }
    }
    progress.update(|c| c.writer_gone = true);
    drop(stdin);
    run.status = child.wait().unwrap();
    run
}

/// What a snapshot of the directory showed that must never be.
fn check_snapshot(net_dir: &Path, pods: &[Pod], owner_of: &HashMap<String, usize>) -> Vec<String> {
    let mut problems = Vec::new();
    let stable_owner: HashMap<IpAddr, usize> = pods
        .iter()
        .enumerate()
        .filter(|(_, p)| p.kind == Kind::Stable)
        .flat_map(|(i, p)| p.reserved.iter().map(move |ip| (*ip, i)))
        .collect();
    for name in read_dir_names(net_dir) {
        let Ok(ip) = name.parse::<IpAddr>() else {
            continue;
        };
        let path = net_dir.join(&name);
        let content = match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_file() => match std::fs::read(&path) {
                Ok(content) => content,
                // Gone between listing and reading: a DEL ran meanwhile.
                Err(_) => continue,
            },
            Ok(_) => {
                problems.push(format!("{ip} is not a regular file"));
                continue;
            }
            Err(_) => continue,
        };
        let Some(holder @ Holder::Attachment { .. }) = Holder::parse(&content) else {
            problems.push(format!(
                "IP file {ip} is not parseable: {:?}",
                String::from_utf8_lossy(&content)
            ));
            continue;
        };
        let Some(&pod) = owner_of.get(holder.id()) else {
            problems.push(format!(
                "IP file {ip} names an unknown container {holder:?}"
            ));
            continue;
        };
        if let Some(&owner) = stable_owner.get(&ip)
            && owner != pod
        {
            problems.push(format!(
                "{ip}, reserved for {} all along, is in an IP file of {} (container {})",
                pods[owner].key,
                pods[pod].key,
                holder.id()
            ));
        }
    }
    let reserved = net_dir.join("reserved");
    let mut found: BTreeMap<PodKey, ReservationFile> = BTreeMap::new();
    for ns in read_dir_names(&reserved) {
        if ns.starts_with('.') {
            continue;
        }
        for pod in read_dir_names(&reserved.join(&ns)) {
            if pod.starts_with(TEMP_PREFIX) {
                continue;
            }
            let path = reserved.join(&ns).join(&pod);
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            match ReservationFile::from_json(&bytes) {
                Ok(file) if file.namespace == ns && file.pod == pod => {
                    found.insert(file.pod_key().unwrap(), file);
                }
                Ok(file) => problems.push(format!(
                    "{} holds the reservation of {}",
                    path.display(),
                    file.pod_key().unwrap()
                )),
                Err(e) => problems.push(format!("{} is not parseable: {e}", path.display())),
            }
        }
    }
    for pod in pods.iter().filter(|p| p.kind == Kind::Stable) {
        match found.get(&pod.key) {
            Some(file) if holds(Some(file)) && file.ips == pod.reserved => {}
            other => problems.push(format!(
                "the stable reservation of {} must always be there and active: {other:?}",
                pod.key
            )),
        }
    }
    problems
}

/// The names in `dir`; empty when it does not exist (it may vanish while being read).
fn read_dir_names(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect()
}

/// Every path below `dir` whose name starts with the temp prefix.
fn temp_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(dir) = todo.pop() {
        for name in read_dir_names(&dir) {
            let path = dir.join(&name);
            if name.starts_with(TEMP_PREFIX) {
                out.push(path.clone());
            }
            if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
                todo.push(path);
            }
        }
    }
    out
}

/// Whether the reservation of `pod` was active from `from` to `to` (clock ticks): `None` when
/// a writer operation on it may have run meanwhile, judging only by what the writer announced
/// and reported.
fn known_state(
    pod: &PodKey,
    plan: &[PlannedOp],
    writer: &WriterRun,
    initial: &Model,
    from: u64,
    to: u64,
) -> Option<bool> {
    let mut state = initial.get(pod);
    for (k, planned) in plan.iter().enumerate() {
        if !planned.touches.contains(pod) {
            continue;
        }
        match (writer.begun[k], writer.done[k]) {
            // Finished before the process started: the state it left is what the process saw.
            (Some(_), Some(done)) if done < from => state = planned.after.get(pod),
            // Began after the process ended, or never began: irrelevant.
            (Some(begun), _) if begun > to => {}
            (None, _) => {}
            // Ran (or may have run) while the process ran: the state is not known.
            _ => return None,
        }
    }
    Some(holds(state))
}

/// Whether the reservation of `pod` surely held its addresses from `from` to `to`.
fn surely_active(
    pod: &PodKey,
    plan: &[PlannedOp],
    writer: &WriterRun,
    initial: &Model,
    from: u64,
    to: u64,
) -> bool {
    known_state(pod, plan, writer, initial, from, to) == Some(true)
}

#[test]
fn reserved_addresses_stay_with_their_pods_while_a_writer_rewrites_reservations() {
    let scratch = Scratch::new();
    let data_dir = scratch.path().join("data");
    let net_dir = data_dir.join(NETWORK);
    let config = config(&data_dir);
    let pods = pods();
    let plan = writer_plan();
    let initial = initial_model();
    {
        let dir = NetworkDir::open(&data_dir, NETWORK).unwrap();
        let report = ReservationWriter::new()
            .apply(&dir, &initial.values().map(valid).collect::<Vec<_>>())
            .unwrap();
        assert_eq!(report.written.len(), initial.len(), "{report:?}");
    }

    let mut rng = Rng::new(LIFE_SEED);
    let lives: Vec<(usize, Vec<LifeOp>)> = pods
        .iter()
        .enumerate()
        .filter(|(_, p)| p.runs)
        .map(|(i, p)| (i, life(&mut rng, p)))
        .collect();
    let processes: usize = lives.iter().map(|(_, ops)| ops.len()).sum();
    assert!(
        processes >= 100,
        "seed {LIFE_SEED:#x} gives only {processes} processes"
    );
    let forced = |kind| {
        lives
            .iter()
            .filter(|(pod, ops)| {
                pods[*pod].kind == kind && ops.iter().any(|o| o.force_over.is_some())
            })
            .count()
    };
    assert!(
        forced(Kind::Stable) > 0 && forced(Kind::Churn) > 0,
        "seed {LIFE_SEED:#x} must re-create some stable and churn pods before their old DEL"
    );
    let owner_of: Arc<HashMap<String, usize>> = Arc::new(
        lives
            .iter()
            .flat_map(|(pod, ops)| ops.iter().map(|o| (o.container.clone(), *pod)))
            .collect(),
    );

    let clock = Arc::new(Clock::default());
    let progress = Arc::new(Progress::default());
    let (snap_tx, snap_rx) = mpsc::channel::<()>();
    let snapshotter = {
        let (net_dir, pods, owner_of) = (net_dir.clone(), pods.clone(), owner_of.clone());
        std::thread::spawn(move || {
            let (mut taken, mut problems) = (0usize, Vec::new());
            while snap_rx.recv().is_ok() {
                // Coalesce the requests that piled up while the last snapshot was read.
                while snap_rx.try_recv().is_ok() {}
                problems.extend(check_snapshot(&net_dir, &pods, &owner_of));
                taken += 1;
            }
            (taken, problems)
        })
    };
    let writer = {
        let (data_dir, stderr_file) = (data_dir.clone(), scratch.path().join("writer.stderr"));
        let (clock, progress, snap_tx) = (clock.clone(), progress.clone(), snap_tx.clone());
        std::thread::spawn(move || {
            run_writer(
                &data_dir,
                &stderr_file,
                processes,
                &clock,
                &progress,
                &snap_tx,
            )
        })
    };
    let next_spawn = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = lives
        .into_iter()
        .map(|(pod, ops)| {
            let (config, key) = (config.clone(), pods[pod].key.clone());
            let (clock, progress, snap_tx) = (clock.clone(), progress.clone(), snap_tx.clone());
            let next_spawn = next_spawn.clone();
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                for LifeOp {
                    command,
                    container,
                    force_over,
                } in ops
                {
                    let j = next_spawn.fetch_add(1, Ordering::SeqCst);
                    let needed = (j * WRITER_OPS / processes).saturating_sub(OP_SLACK);
                    progress.wait_until(
                        &|| format!("writer op {needed} to begin before plugin process {j}"),
                        &|c| c.writer_gone || c.ops_begun >= needed,
                    );
                    let call = CniCall::new(command, &container, &config).args(&format!(
                        "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={container}",
                        key.namespace(), key.name()
                    ));
                    let spawned_at = clock.tick();
                    let child = spawn(&call, &common::ipkeep());
                    progress.update(|c| c.spawned += 1);
                    let outcome = finish(child);
                    let exited_at = clock.tick();
                    let _ = snap_tx.send(());
                    seen.push(Process {
                        pod,
                        command,
                        container,
                        force_over,
                        spawned_at,
                        exited_at,
                        outcome,
                    });
                }
                seen
            })
        })
        .collect();
    drop(snap_tx);
    let mut runs: Vec<Process> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    runs.sort_by_key(|p| p.spawned_at);
    let writer = writer.join().unwrap();
    let (snapshots, mut problems) = snapshotter.join().unwrap();

    // The writer ran every operation, overlapping the plugins.
    let writer_stderr = std::fs::read_to_string(scratch.path().join("writer.stderr")).unwrap();
    assert!(
        writer.status.success() && writer.finished,
        "the writer process failed ({}): stdout {:?}, stderr {writer_stderr}",
        writer.status,
        writer.other_output
    );
    assert!(writer.done.iter().all(Option::is_some));
    let (first_spawn, last_exit) = (
        runs.iter().map(|p| p.spawned_at).min().unwrap(),
        runs.iter().map(|p| p.exited_at).max().unwrap(),
    );
    let overlapping = writer
        .begun
        .iter()
        .flatten()
        .filter(|t| (first_spawn..last_exit).contains(t))
        .count();
    assert!(
        overlapping >= WRITER_OPS / 2,
        "only {overlapping} of {WRITER_OPS} writer ops ran while plugin processes ran"
    );

    // Every process succeeded but early ADDs, which may be told to try again (checked below);
    // reserved addresses went only where they may.
    let refused = |p: &Process| p.force_over.is_some() && p.outcome.code != Some(0);
    let mut holders_of: HashMap<IpAddr, Vec<&Process>> = HashMap::new();
    for p in &runs {
        if refused(p) {
            continue;
        }
        let result = p.outcome.ok();
        if p.command == "ADD" {
            for ip in result_ips(&result) {
                holders_of.entry(ip).or_default().push(p);
            }
        }
    }
    // What the plugin logs: one prefixed line per decision note; nothing at all for a pod
    // without reservation (no garbage is ever visible under the lock) and for DEL.
    let prefix = format!("ipkeep: {NETWORK}: ");
    for p in &runs {
        let stderr = p.outcome.stderr_str();
        let quiet = p.command == "DEL" || pods[p.pod].kind == Kind::Plain;
        if (quiet && !stderr.is_empty()) || stderr.lines().any(|l| !l.starts_with(&prefix)) {
            problems.push(format!(
                "{} of {} logged {stderr:?}",
                p.command, p.container
            ));
        }
    }
    let got_of = |container: &str| {
        let add = runs
            .iter()
            .find(|p| p.command == "ADD" && p.container == container)
            .unwrap();
        result_ips(&add.outcome.ok())
    };
    let mut refusals = 0;
    for p in runs.iter().filter(|p| p.force_over.is_some()) {
        let me = &pods[p.pod];
        let old = p.force_over.as_deref().unwrap();
        // The old sandbox is still there: it holds whatever its ADD got.
        let old_holds_reserved = got_of(old).iter().any(|ip| me.reserved.contains(ip));
        let state = if me.kind == Kind::Stable {
            Some(true)
        } else {
            known_state(&me.key, &plan, &writer, &initial, p.spawned_at, p.exited_at)
        };
        if refused(p) {
            refusals += 1;
            p.outcome.err(11);
            let reply = p.outcome.stdout_str();
            if !old_holds_reserved || state == Some(false) {
                problems.push(format!(
                    "{} (early sandbox {}) was told to try again although its old sandbox {old} holds no address of an active reservation: {reply}",
                    me.key, p.container
                ));
            } else if !reply.contains(old) {
                problems.push(format!(
                    "the try-again answer to {} must name the old sandbox {old}: {reply}",
                    p.container
                ));
            }
        } else if old_holds_reserved && state == Some(true) {
            problems.push(format!(
                "{} (early sandbox {}) got {:?} while its old sandbox {old} still held its reserved addresses: it must be told to try again",
                me.key,
                p.container,
                result_ips(&p.outcome.ok())
            ));
        }
    }
    if refusals == 0 {
        problems.push("no early ADD was told to try again (stable pods always must be)".to_owned());
    }
    let del_exit: HashMap<&str, u64> = runs
        .iter()
        .filter(|p| p.command == "DEL")
        .map(|p| (p.container.as_str(), p.exited_at))
        .collect();
    let (mut decisive_others, mut decisive_own) = (0, 0);
    for p in runs.iter().filter(|p| p.command == "ADD" && !refused(p)) {
        let got = result_ips(&p.outcome.ok());
        let me = &pods[p.pod];
        assert_eq!(
            got.len(),
            2,
            "one address per family: {}",
            describe(&p.outcome)
        );
        if me.kind == Kind::Stable && got != me.reserved {
            problems.push(format!(
                "stable pod {} (container {}) got {got:?}, not exactly its reserved {:?}",
                me.key, p.container, me.reserved
            ));
        }
        for other in pods
            .iter()
            .filter(|o| o.key != me.key && o.kind != Kind::Plain)
        {
            let active = other.kind == Kind::Stable
                || surely_active(
                    &other.key,
                    &plan,
                    &writer,
                    &initial,
                    p.spawned_at,
                    p.exited_at,
                );
            if !active {
                continue;
            }
            decisive_others += usize::from(other.kind == Kind::Churn);
            for ip in got.iter().filter(|ip| other.reserved.contains(ip)) {
                problems.push(format!(
                    "{ip} went to {} (container {}, ticks {}..{}) while the reservation of {} held it",
                    me.key, p.container, p.spawned_at, p.exited_at, other.key
                ));
            }
        }
        // A churn pod whose reservation surely held its address, which no other container
        // could have held meanwhile, must get it (an early ADD is checked above).
        if me.kind == Kind::Churn
            && p.force_over.is_none()
            && surely_active(&me.key, &plan, &writer, &initial, p.spawned_at, p.exited_at)
        {
            let contested = me.reserved.iter().any(|ip| {
                holders_of.get(ip).into_iter().flatten().any(|h| {
                    h.pod != p.pod
                        && h.spawned_at < p.exited_at
                        && del_exit
                            .get(h.container.as_str())
                            .is_none_or(|&gone| gone > p.spawned_at)
                })
            });
            if !contested {
                decisive_own += 1;
                if got != me.reserved {
                    problems.push(format!(
                        "{} (container {}, ticks {}..{}) got {got:?}, not its reserved {:?}",
                        me.key, p.container, p.spawned_at, p.exited_at, me.reserved
                    ));
                }
            }
        }
    }
    assert!(
        decisive_others > 0 && decisive_own > 0,
        "the churn checks never applied ({decisive_others} (ADD, other pod's surely active reservation) pairs, {decisive_own} own ADDs during a surely active reservation)"
    );

    // The final state: one IP file per live container, the writer's final files, no leftovers.
    problems.extend(check_snapshot(&net_dir, &pods, &owner_of));
    let total = problems.len();
    // A broken invariant shows up in many snapshots alike: list each problem once.
    let mut seen = BTreeSet::new();
    problems.retain(|p| seen.insert(p.clone()));
    assert!(
        problems.is_empty(),
        "{total} problems ({} distinct) in {snapshots} snapshots and {} processes; the first ones:\n{}",
        problems.len(),
        runs.len(),
        problems[..problems.len().min(40)].join("\n")
    );
    let mut live: BTreeMap<IpAddr, Holder> = BTreeMap::new();
    let last_op: BTreeMap<&str, &Process> =
        runs.iter().map(|p| (p.container.as_str(), p)).collect();
    for p in last_op
        .values()
        .filter(|p| p.command == "ADD" && !refused(p))
    {
        for ip in result_ips(&p.outcome.ok()) {
            if let Some(other) = live.insert(ip, Holder::attachment(&p.container, "eth0")) {
                panic!(
                    "{ip} handed to two live containers: {other:?} and {}",
                    p.container
                );
            }
        }
    }
    assert_eq!(
        system_support::allocations(&net_dir),
        live,
        "exactly one IP file per address of a live container"
    );
    let dir = NetworkDir::open(&data_dir, NETWORK).unwrap();
    let loaded = load_reservations(&dir);
    assert!(loaded.skipped.is_empty(), "{:?}", loaded.skipped);
    assert_eq!(
        loaded.files,
        plan.last().unwrap().after,
        "the reservation files are exactly the writer's last state"
    );
    assert_eq!(
        temp_files(&net_dir),
        Vec::<PathBuf>::new(),
        "no temporary file may be left behind"
    );
    assert_eq!(
        nested_ip_named(&net_dir),
        Vec::<PathBuf>::new(),
        "no IP-named file below the network directory, which host-local would count"
    );
    let allowed = |name: &str| {
        name.parse::<IpAddr>().is_ok()
            || [
                "lock",
                "reserved",
                ".ipkeep",
                "last_reserved_ip.0",
                "last_reserved_ip.1",
            ]
            .contains(&name)
    };
    let strays: Vec<String> = read_dir_names(&net_dir)
        .into_iter()
        .filter(|n| !allowed(n))
        .collect();
    assert!(
        strays.is_empty(),
        "unexpected entries in the network directory: {strays:?}"
    );
    eprintln!(
        "{} processes, {WRITER_OPS} writer ops ({overlapping} overlapping), {snapshots} snapshots, {} early ADDs ({refusals} told to try again); churn checks that applied: {decisive_others} against other pods' ADDs, {decisive_own} on the owner's ADDs",
        runs.len(),
        runs.iter().filter(|p| p.force_over.is_some()).count()
    );
}
