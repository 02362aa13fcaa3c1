//! ipkeep's private state (`<net>/.ipkeep/`) is its own and rebuildable: whatever damage is
//! planted at any of its paths, the built binary's ADD, CHECK, DEL, GC and STATUS all succeed
//! with host-local's answers, say on stderr what they found, and leave a clean state behind.
//! Also: a reservation file put into `reserved/` by hand counts at the next ADD, and a killed
//! writer's temporary there is removed once it is a few seconds old.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::IpAddr;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime};

use common::{CniCall, CniOutcome, Scratch, host_local, ipkeep};
use ipkeep_netdir::{SPARE_PREFIX, SPARES};
use ipkeep_reservation::add::{WaitMarker, write_wait_marker};
use ipkeep_reservation::{
    FORMAT_VERSION, PodKey, ReservationFile, Timestamp, ValidReservation, write_reservation,
};

/// A scratch directory with `outside/`, where a symlink planted in the network directory points.
fn scratch() -> Scratch {
    let s = Scratch::new();
    std::fs::create_dir_all(s.path().join("outside")).unwrap();
    s
}

/// The suite's network configuration, for `version`.
fn net_conf(s: &Scratch, version: &str) -> String {
    format!(
        r#"{{"cniVersion":"{version}","name":"net1","type":"ipkeep","ipam":{{"type":"ipkeep","dataDir":"{}","ranges":[[{{"subnet":"10.1.0.0/24"}}]]}}}}"#,
        s.data().display()
    )
}

fn reservation(ns: &str, pod: &str, ip: &str) -> ReservationFile {
    ReservationFile {
        version: FORMAT_VERSION,
        namespace: ns.into(),
        pod: pod.into(),
        ips: vec![ip.parse::<IpAddr>().unwrap()],
        release_time: None,
        uid: format!("uid-{ns}-{pod}"),
        node_name: Some("node-a".into()),
        generation: None,
        retain_for_seconds: None,
    }
}

/// [`reservation`], validated as the agent's writer takes it.
fn valid_reservation(ns: &str, pod: &str, ip: &str) -> ValidReservation {
    reservation(ns, pod, ip).validate().unwrap()
}

fn pod_args(ns: &str, pod: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={pod}")
}

/// The pod whose ADD follows the damage (it has a wait marker on disk, so the ADD reads it).
const POD: (&str, &str) = ("db", "web-9");

/// The state every case starts from: c1 allocated through ipkeep (index, stamp), another pod's
/// reservation far from the round robin (`reserved/`, the snapshot) and a wait marker.
fn seed(s: &Scratch) {
    let out = CniCall::new("ADD", "c1", &net_conf(s, "1.0.0"))
        .args(&pod_args("db", "web-0"))
        .run(&ipkeep());
    out.ok();
    write_reservation(&s.dir(), &valid_reservation("db", "other", "10.1.0.200")).unwrap();
    let pod = PodKey::new(POD.0, POD.1).unwrap();
    let marker = WaitMarker {
        holder: "gone".into(),
        since: Timestamp::from_system_time(SystemTime::now()),
    };
    write_wait_marker(&s.dir(), &pod, &marker, &mut Vec::new()).unwrap();
    for rel in [
        ".ipkeep/stamp",
        ".ipkeep/containers/c1",
        ".ipkeep/reserved.index",
    ] {
        assert!(s.net().join(rel).is_file(), "{rel} seeded");
    }
}

/// Every private path ipkeep uses, relative to `<net>/`, and whether it is a directory.
const PRIVATE_PATHS: [(&str, bool); 11] = [
    (".ipkeep", true),
    (".ipkeep/stamp", false),
    (".ipkeep/tmp", true),
    (".ipkeep/tmp/.ipkeep-tmp-999999-0", false),
    (".ipkeep/containers", true),
    (".ipkeep/containers/c1", false),
    (".ipkeep/containers/c2", false),
    (".ipkeep/reserved.index", false),
    (".ipkeep/wait", true),
    (".ipkeep/wait/db", true),
    (".ipkeep/wait/db/web-9", false),
];

/// The kinds of damage planted at each path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Damage {
    Directory,
    Fifo,
    Device,
    SymlinkIn,
    SymlinkOut,
    Garbage,
    Empty,
    Huge,
    Unreadable,
}

const DAMAGES: [Damage; 9] = [
    Damage::Directory,
    Damage::Fifo,
    Damage::Device,
    Damage::SymlinkIn,
    Damage::SymlinkOut,
    Damage::Garbage,
    Damage::Empty,
    Damage::Huge,
    Damage::Unreadable,
];

fn run_ok(cmd: &mut Command) {
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("failed to run {cmd:?}: {e}"));
    assert!(
        status.success(),
        "{cmd:?} failed: this test needs root (mknod) and coreutils"
    );
}

/// Plants `damage` at `path` (whatever was there is removed first).
fn plant(s: &Scratch, rel: &str, is_dir: bool, damage: Damage) {
    let path = s.net().join(rel);
    if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
        std::fs::remove_dir_all(&path).unwrap();
    } else {
        let _ = std::fs::remove_file(&path);
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    match damage {
        Damage::Directory if is_dir => {
            // A directory where one belongs, but with foreign content and world-writable.
            std::fs::create_dir(&path).unwrap();
            std::fs::write(path.join("junk"), b"junk").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        Damage::Directory => {
            std::fs::create_dir_all(path.join("sub/deeper")).unwrap();
            std::fs::write(path.join("sub/file"), b"x").unwrap();
        }
        Damage::Fifo => run_ok(Command::new("mkfifo").arg(&path)),
        Damage::Device => run_ok(Command::new("mknod").arg(&path).args(["c", "1", "3"])),
        Damage::SymlinkIn => symlink(
            if is_dir {
                s.net().join("sentinel-dir")
            } else {
                s.net().join("sentinel")
            },
            &path,
        )
        .unwrap(),
        Damage::SymlinkOut => symlink(
            if is_dir {
                s.path().join("outside")
            } else {
                s.path().join("outside/sentinel")
            },
            &path,
        )
        .unwrap(),
        Damage::Garbage => std::fs::write(&path, b"\xff\x00garbage{\"not\": ipkeep's}\n").unwrap(),
        Damage::Empty => std::fs::write(&path, b"").unwrap(),
        Damage::Huge => std::fs::write(&path, vec![b'7'; 2 << 20]).unwrap(),
        Damage::Unreadable if is_dir => {
            std::fs::create_dir(&path).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o000)).unwrap();
        }
        Damage::Unreadable => {
            std::fs::write(&path, b"ipkeep-stamp 2 1 2 3 4\n").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o000)).unwrap();
        }
    }
}

/// The sentinels the symlinks point at, inside and outside the network directory.
fn plant_sentinels(s: &Scratch) {
    std::fs::write(s.net().join("sentinel"), b"inside").unwrap();
    std::fs::create_dir_all(s.net().join("sentinel-dir")).unwrap();
    std::fs::write(s.net().join("sentinel-dir/keep"), b"inside").unwrap();
    std::fs::write(s.path().join("outside/sentinel"), b"outside").unwrap();
}

fn assert_sentinels_untouched(s: &Scratch, case: &str) {
    assert_eq!(
        std::fs::read(s.net().join("sentinel")).unwrap(),
        b"inside",
        "{case}"
    );
    let inside: Vec<_> = std::fs::read_dir(s.net().join("sentinel-dir"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(inside, ["keep"], "{case}: written through a symlink");
    let outside: Vec<_> = std::fs::read_dir(s.path().join("outside"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(outside, ["sentinel"], "{case}: written through a symlink");
    assert_eq!(
        std::fs::read(s.path().join("outside/sentinel")).unwrap(),
        b"outside",
        "{case}"
    );
}

/// What ipkeep itself would have left: only directories it can use and others cannot write,
/// and `0600` regular files with one link and content of the expected form; in `tmp/` only empty
/// spares (`spare.N`, N below `SPARES`), which host-local reads past.
fn assert_private_state_clean(s: &Scratch, case: &str) {
    fn walk(dir: &Path, rel: &str, out: &mut Vec<(String, std::fs::Metadata)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let name = format!("{rel}/{}", e.file_name().to_string_lossy());
            let meta = std::fs::symlink_metadata(e.path()).unwrap();
            if meta.is_dir() {
                walk(&e.path(), &name, out);
            }
            out.push((name, meta));
        }
    }
    let mut entries = Vec::new();
    walk(&s.net().join(".ipkeep"), ".ipkeep", &mut entries);
    for (rel, meta) in &entries {
        let mode = meta.permissions().mode() & 0o7777;
        if meta.is_dir() {
            assert_eq!(mode & 0o7022, 0, "{case}: {rel} has mode {mode:o}");
            assert_eq!(mode & 0o700, 0o700, "{case}: {rel} has mode {mode:o}");
            continue;
        }
        assert!(meta.is_file(), "{case}: {rel} is not a regular file");
        assert_eq!(mode, 0o600, "{case}: {rel} has mode {mode:o}");
        assert_eq!(meta.nlink(), 1, "{case}: {rel}");
        let content = std::fs::read(s.net().join(rel)).unwrap();
        if let Some(name) = rel.strip_prefix(".ipkeep/tmp/") {
            let spare = name
                .strip_prefix(SPARE_PREFIX)
                .and_then(|n| n.parse::<usize>().ok())
                .is_some_and(|n| n < SPARES);
            assert!(spare && content.is_empty(), "{case}: {rel} left in tmp/");
            continue;
        }
        if rel == ".ipkeep/stamp" {
            assert!(content.starts_with(b"ipkeep-stamp "), "{case}: {rel}");
        } else if rel == ".ipkeep/reserved.index" {
            assert!(content.starts_with(b"IPKSNAP"), "{case}: {rel}");
        } else if let Some(id) = rel.strip_prefix(".ipkeep/containers/") {
            let json: serde_json::Value = serde_json::from_slice(&content)
                .unwrap_or_else(|e| panic!("{case}: {rel} is not JSON: {e}"));
            assert_eq!(json["containerID"], id, "{case}: {rel}");
        } else if rel.starts_with(".ipkeep/wait/") {
            let text = String::from_utf8(content).unwrap();
            assert!(
                text.ends_with('\n') && text.split(' ').count() == 2,
                "{case}: {rel}: {text:?}"
            );
        } else {
            panic!("{case}: unexpected private file {rel}");
        }
    }
}

/// The commands after the damage, in an order that starts with `first` (each command must
/// cope with the damage when it is the first to meet it); their outcomes in order.
fn commands(s: &Scratch, first: &str) -> Vec<(&'static str, CniOutcome)> {
    let conf = net_conf(s, "1.0.0");
    let conf11 = net_conf(s, "1.1.0");
    let gc = conf11.replacen(
        '{',
        r#"{"cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"},{"containerID":"c2","ifname":"eth0"}],"#,
        1,
    );
    let order: [&str; 5] = match first {
        "ADD" => ["ADD", "CHECK", "DEL", "GC", "STATUS"],
        "CHECK" => ["CHECK", "ADD", "DEL", "GC", "STATUS"],
        "DEL" => ["DEL", "ADD", "CHECK", "GC", "STATUS"],
        "GC" => ["GC", "ADD", "CHECK", "DEL", "STATUS"],
        "STATUS" => ["STATUS", "ADD", "CHECK", "DEL", "GC"],
        other => panic!("no order for {other}"),
    };
    let mut deleted = false;
    order
        .into_iter()
        .map(|name| {
            let out = match name {
                "ADD" => CniCall::new("ADD", "c2", &conf)
                    .args(&pod_args(POD.0, POD.1))
                    .run(&ipkeep()),
                // CHECK the container that is still there.
                "CHECK" => {
                    CniCall::new("CHECK", if deleted { "c2" } else { "c1" }, &conf).run(&ipkeep())
                }
                "DEL" => {
                    deleted = true;
                    CniCall::new("DEL", "c1", &conf).run(&ipkeep())
                }
                "GC" => CniCall::new("GC", "x", &gc).run(&ipkeep()),
                _ => CniCall::new("STATUS", "x", &conf11).run(&ipkeep()),
            };
            (name, out)
        })
        .collect()
}

/// host-local's answer to the ADD of c2 after c1's (ADD is the only command of the sequence
/// with an answer on stdout; host-local 1.1.1 has neither GC nor STATUS), from a fresh directory
/// with `<data>` in place of its path.
fn host_local_add() -> String {
    let s = scratch();
    let conf = net_conf(&s, "1.0.0");
    let hl = host_local();
    CniCall::new("ADD", "c1", &conf)
        .args(&pod_args("db", "web-0"))
        .run(&hl)
        .ok();
    let out = CniCall::new("ADD", "c2", &conf)
        .args(&pod_args(POD.0, POD.1))
        .run(&hl);
    out.ok();
    out.stdout_str()
        .replace(&s.data().display().to_string(), "<data>")
}

#[test]
fn every_damage_at_every_private_path_is_healed() {
    let reference = host_local_add();
    let mut cases = 0;
    for (rel, is_dir) in PRIVATE_PATHS {
        for damage in DAMAGES {
            for first in ["ADD", "CHECK", "DEL", "GC", "STATUS"] {
                let case = format!("{damage:?} at {rel}, {first} first");
                let s = scratch();
                seed(&s);
                plant_sentinels(&s);
                plant(&s, rel, is_dir, damage);
                cases += 1;
                let outcomes = commands(&s, first);
                for (name, out) in &outcomes {
                    assert_eq!(
                        out.code,
                        Some(0),
                        "{case}: {name} failed: stdout={} stderr={}",
                        out.stdout_str(),
                        out.stderr_str()
                    );
                    if *name == "ADD" {
                        assert_eq!(
                            out.stdout_str()
                                .replace(&s.data().display().to_string(), "<data>"),
                            reference,
                            "{case}: ADD answers differently from host-local"
                        );
                    } else {
                        assert_eq!(out.stdout_str(), "", "{case}: {name}");
                    }
                }
                assert!(!s.net().join("10.1.0.2").exists(), "{case}: c1 freed");
                assert_eq!(
                    std::fs::read(s.net().join("10.1.0.3")).unwrap(),
                    b"c2\r\neth0",
                    "{case}: c2 allocated"
                );
                // One line names what was found, except for temporaries (removed silently, as
                // every killed command's are).
                let stderr: String = outcomes.iter().map(|(_, o)| o.stderr_str()).collect();
                if !rel.contains(".ipkeep-tmp-") {
                    let last = rel.rsplit('/').next().unwrap();
                    assert!(
                        stderr
                            .lines()
                            .any(|l| l.starts_with("ipkeep: net1: found ") && l.contains(last)),
                        "{case}: no line says what was found:\n{stderr}"
                    );
                }
                assert_sentinels_untouched(&s, &case);
                assert_private_state_clean(&s, &case);
                // Healed for good: the next command finds nothing more to say.
                let again = CniCall::new("CHECK", "c2", &net_conf(&s, "1.0.0"))
                    .args(&pod_args(POD.0, POD.1))
                    .run(&ipkeep());
                again.ok();
                assert_eq!(again.stderr_str(), "", "{case}: still damaged");
            }
        }
    }
    assert_eq!(cases, PRIVATE_PATHS.len() * DAMAGES.len() * 5);
}

/// The defects the issue reported, one test each (they failed before the general fix).
#[test]
fn a_directory_at_the_stamp_blocks_nothing() {
    let s = scratch();
    seed(&s);
    std::fs::remove_file(s.net().join(".ipkeep/stamp")).unwrap();
    std::fs::create_dir(s.net().join(".ipkeep/stamp")).unwrap();
    for (name, out) in commands(&s, "ADD") {
        assert_eq!(out.code, Some(0), "{name}: {}", out.stdout_str());
    }
    assert!(s.net().join(".ipkeep/stamp").is_file());
}

#[test]
fn a_directory_at_a_containers_index_file_blocks_nothing() {
    let s = scratch();
    seed(&s);
    let index = s.net().join(".ipkeep/containers/c1");
    std::fs::remove_file(&index).unwrap();
    std::fs::create_dir_all(index.join("x")).unwrap();
    let conf = net_conf(&s, "1.0.0");
    let check = CniCall::new("CHECK", "c1", &conf).run(&ipkeep());
    assert_eq!(check.code, Some(0), "CHECK: {}", check.stdout_str());
    assert!(
        check
            .stderr_str()
            .contains(&format!("found a directory at {}", index.display())),
        "{}",
        check.stderr_str()
    );
    std::fs::remove_file(&index).unwrap();
    std::fs::create_dir_all(index.join("x")).unwrap();
    let del = CniCall::new("DEL", "c1", &conf).run(&ipkeep());
    assert_eq!(del.code, Some(0), "DEL: {}", del.stdout_str());
    assert!(!s.net().join("10.1.0.2").exists(), "DEL freed c1");
    std::fs::create_dir_all(s.net().join(".ipkeep/containers/c3/x")).unwrap();
    let add = CniCall::new("ADD", "c3", &conf).run(&ipkeep());
    assert_eq!(add.code, Some(0), "ADD: {}", add.stdout_str());
    assert!(s.net().join(".ipkeep/containers/c3").is_file());
}

#[test]
fn a_reservation_copied_in_by_hand_counts_at_the_next_add() {
    let s = scratch();
    let conf = net_conf(&s, "1.0.0");
    write_reservation(&s.dir(), &valid_reservation("db", "a", "10.1.0.200")).unwrap();
    let first = CniCall::new("ADD", "c1", &conf)
        .args(&pod_args("db", "x"))
        .run(&ipkeep());
    first.ok();
    assert!(s.net().join("10.1.0.2").exists());
    // The agent is down; an administrator copies a file into an existing namespace directory
    // and another into a new one, as `cp` does (no writer, no generation bump).
    let copy = |ns: &str, pod: &str, ip: &str| {
        std::fs::create_dir_all(s.net().join("reserved").join(ns)).unwrap();
        std::fs::write(
            s.net().join("reserved").join(ns).join(pod),
            reservation(ns, pod, ip).to_json(),
        )
        .unwrap();
    };
    copy("db", "b", "10.1.0.3");
    let second = CniCall::new("ADD", "c2", &conf)
        .args(&pod_args("db", "y"))
        .run(&ipkeep());
    assert_eq!(
        second.ok()["ips"][0]["address"],
        "10.1.0.4/24",
        "10.1.0.3 is db/b's"
    );
    copy("cache", "c", "10.1.0.5");
    let third = CniCall::new("ADD", "c3", &conf)
        .args(&pod_args("db", "z"))
        .run(&ipkeep());
    assert_eq!(third.ok()["ips"][0]["address"], "10.1.0.6/24");
    // The pods themselves get their addresses.
    let b = CniCall::new("ADD", "c4", &conf)
        .args(&pod_args("db", "b"))
        .run(&ipkeep());
    assert_eq!(b.ok()["ips"][0]["address"], "10.1.0.3/24");
}

#[test]
fn a_hand_copy_still_in_progress_is_read_again_when_it_ends() {
    let s = scratch();
    let conf = net_conf(&s, "1.0.0");
    write_reservation(&s.dir(), &valid_reservation("db", "a", "10.1.0.200")).unwrap();
    let path = s.net().join("reserved/db/b");
    let json = reservation("db", "b", "10.1.0.3").to_json();
    // The ADD runs while `cp` has written half of the file.
    std::fs::write(&path, &json[..json.len() / 2]).unwrap();
    let first = CniCall::new("ADD", "c1", &conf)
        .args(&pod_args("db", "x"))
        .run(&ipkeep());
    assert_eq!(first.ok()["ips"][0]["address"], "10.1.0.2/24");
    assert!(
        first.stderr_str().contains("skipped"),
        "{}",
        first.stderr_str()
    );
    CniCall::new("DEL", "c1", &conf).run(&ipkeep()).ok();
    // The copy ends: the same file, now complete, changes only itself, not its directory.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, &json[json.len() / 2..]))
        .unwrap();
    let second = CniCall::new("ADD", "c2", &conf)
        .args(&pod_args("db", "y"))
        .run(&ipkeep());
    assert_eq!(
        second.ok()["ips"][0]["address"],
        "10.1.0.4/24",
        "10.1.0.3, the next in round robin, is db/b's now"
    );
}

/// Sets a file's modification time `age` into the past (`touch -d @<secs>`).
fn age(path: &Path, age: Duration) {
    let when = SystemTime::now() - age;
    let secs = when
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    run_ok(
        Command::new("touch")
            .arg("-h")
            .arg("-d")
            .arg(format!("@{secs}"))
            .arg(path),
    );
}

#[test]
fn a_killed_writers_temporaries_are_removed_once_a_few_seconds_old() {
    let s = scratch();
    let conf = net_conf(&s, "1.0.0");
    write_reservation(&s.dir(), &valid_reservation("db", "a", "10.1.0.200")).unwrap();
    // What a writer killed between its temporary and the rename leaves (under `reserved/` for
    // the generation counter, under a namespace for a file).
    let young = s.net().join("reserved/db/.ipkeep-tmp-4242-0");
    let old_ns = s.net().join("reserved/db/.ipkeep-tmp-4242-1");
    let old_top = s.net().join("reserved/.ipkeep-tmp-4242-2");
    for p in [&young, &old_ns, &old_top] {
        std::fs::write(p, b"{\"version\":1,").unwrap();
    }
    age(&old_ns, Duration::from_secs(60));
    age(&old_top, Duration::from_secs(60));
    let out = CniCall::new("ADD", "c1", &conf)
        .args(&pod_args("db", "x"))
        .run(&ipkeep());
    out.ok();
    let stderr = out.stderr_str();
    for p in [&old_ns, &old_top] {
        assert!(!p.exists(), "{} removed", p.display());
        assert!(
            stderr.contains(&format!(
                "removed {}: a temporary file left by a killed reservation writer",
                p.display()
            )),
            "{stderr}"
        );
    }
    assert!(
        young.exists(),
        "a temporary that may still be written is kept"
    );
    assert!(
        stderr.contains(".ipkeep-tmp-4242-0: leftover temporary"),
        "{stderr}"
    );
    // Once it is old enough the next ADD removes it, and the one after says nothing.
    age(&young, Duration::from_secs(60));
    let out = CniCall::new("ADD", "c2", &conf)
        .args(&pod_args("db", "y"))
        .run(&ipkeep());
    out.ok();
    assert!(!young.exists());
    let out = CniCall::new("ADD", "c3", &conf)
        .args(&pod_args("db", "z"))
        .run(&ipkeep());
    out.ok();
    assert_eq!(out.stderr_str(), "");
}

/// A cache entry of libcni's shape for `container` holding `ip` on net1.
fn cached_result(container: &str, ip: &str) -> String {
    format!(
        r#"{{"kind":"cniCacheV1","containerId":"{container}","ifName":"eth0","networkName":"net1","cniArgs":[["K8S_POD_NAMESPACE","shop"],["K8S_POD_NAME","{container}"]],"result":{{"cniVersion":"1.0.0","ips":[{{"address":"{ip}/24"}}]}}}}"#
    )
}

/// A wiped network directory (or one only host-local used) takes back, before anything else, the
/// addresses the runtime's result cache says running containers hold: the next pod does not get
/// a running pod's address, and the running pod's DEL frees it. Once the directory has ipkeep's
/// index, the cache is not read again: a file an admin removed by hand stays removed.
#[test]
fn a_wiped_directory_takes_back_the_cached_attachments_first() {
    let s = scratch();
    let cache = s.path().join("cache");
    std::fs::create_dir_all(cache.join("results")).unwrap();
    let conf = format!(
        r#"{{"cniVersion":"1.0.0","name":"net1","type":"ipkeep","ipam":{{"type":"ipkeep","dataDir":"{}","cniCacheDir":"{}","ranges":[[{{"subnet":"10.1.0.0/24"}}]]}}}}"#,
        s.data().display(),
        cache.display()
    );
    let add = |id: &str| {
        let out = CniCall::new("ADD", id, &conf).run(&ipkeep());
        let ip = out.ok()["ips"][0]["address"].as_str().unwrap().to_owned();
        (ip, out.stderr_str())
    };
    // Two pods run; the directory is wiped; the cache still names them.
    assert_eq!(add("run-a").0, "10.1.0.2/24");
    assert_eq!(add("run-b").0, "10.1.0.3/24");
    for (id, ip) in [("run-a", "10.1.0.2"), ("run-b", "10.1.0.3")] {
        std::fs::write(
            cache.join(format!("results/net1-{id}-eth0")),
            cached_result(id, ip),
        )
        .unwrap();
    }
    std::fs::write(cache.join("results/net1-junk-eth0"), "junk").unwrap();
    std::fs::write(
        cache.join("results/other-x-eth0"),
        cached_result("x", "10.1.0.9"),
    )
    .unwrap();
    std::fs::remove_dir_all(s.net()).unwrap();

    let (ip, stderr) = add("new-c");
    assert_eq!(
        ip, "10.1.0.4/24",
        "the new pod gets neither running pod's address"
    );
    for line in [
        "10.1.0.2 taken back for container run-a eth0 (pod shop/run-a)",
        "10.1.0.3 taken back for container run-b eth0 (pod shop/run-b)",
        "a cached result skipped:",
    ] {
        assert!(stderr.contains(line), "{line:?} not in {stderr}");
    }
    assert!(
        !stderr.contains("10.1.0.9"),
        "another network's entry: {stderr}"
    );
    assert_eq!(
        std::fs::read(s.net().join("10.1.0.2")).unwrap(),
        b"run-a\r\neth0"
    );
    assert_eq!(
        std::fs::read(s.net().join("10.1.0.3")).unwrap(),
        b"run-b\r\neth0"
    );

    // The running pod's DEL frees its address as if nothing had happened.
    CniCall::new("DEL", "run-a", &conf).run(&ipkeep()).ok();
    assert!(!s.net().join("10.1.0.2").exists());
    std::fs::remove_file(cache.join("results/net1-run-a-eth0")).unwrap();

    // With the index in place the cache is not read: a file removed by hand stays removed.
    std::fs::remove_file(s.net().join("10.1.0.3")).unwrap();
    let (ip, stderr) = add("new-d");
    assert_eq!(
        ip, "10.1.0.5/24",
        "round robin after the last address handed out"
    );
    assert!(!stderr.contains("taken back"), "{stderr}");
    assert!(!s.net().join("10.1.0.3").exists());
}
