//! Reservations through the built `ipkeep` binary: reservation files written with the library's
//! writer exactly as the agent writes them, the plugin exec'd exactly as a runtime does.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::IpAddr;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::SystemTime;

use common::{CniCall, CniOutcome, Scratch, ipkeep};
use ipkeep_reservation::add::{WaitMarker, read_wait_marker, write_wait_marker};
use ipkeep_reservation::{FORMAT_VERSION, PodKey, ReservationFile, Timestamp, write_reservation};

/// What this suite's tests ask of their scratch directory beyond the shared paths.
trait ReservationScratch {
    fn conf_with(&self, ranges: &str, extra: &str) -> String;
    fn conf(&self, ranges: &str) -> String;
    fn reserve(&self, ns: &str, pod: &str, ips: &[&str], release: Option<i64>);
    fn holder(&self, ip: &str) -> Option<String>;
}

impl ReservationScratch for Scratch {
    /// A 1.1.0 configuration with `ranges` and extra `ipam` members (`extra` starts with `,`).
    fn conf_with(&self, ranges: &str, extra: &str) -> String {
        format!(
            r#"{{"cniVersion":"1.1.0","name":"net1","type":"ipkeep","ipam":{{"type":"ipkeep","dataDir":"{}","ranges":{ranges}{extra}}}}}"#,
            self.data().display()
        )
    }

    fn conf(&self, ranges: &str) -> String {
        self.conf_with(ranges, "")
    }

    /// The agent's write of a reservation.
    fn reserve(&self, ns: &str, pod: &str, ips: &[&str], release: Option<i64>) {
        let file = reservation(ns, pod, ips, release).validate().unwrap();
        write_reservation(&self.dir(), &file).unwrap();
    }

    fn holder(&self, ip: &str) -> Option<String> {
        std::fs::read_to_string(self.net().join(ip)).ok()
    }
}

const V4: &str = r#"[[{"subnet":"10.1.0.0/24"}]]"#;
const DUAL: &str = r#"[[{"subnet":"10.1.0.0/24"}],[{"subnet":"fd00::/120"}]]"#;
/// Five usable addresses, .2 to .6.
const SMALL: &str = r#"[[{"subnet":"10.1.0.0/29"}]]"#;

/// Seconds since the epoch, now.
fn now_secs() -> i64 {
    Timestamp::from_system_time(SystemTime::now()).unix_secs()
}

/// A reservation file; `release` is relative to now, in seconds (`None`: bound).
fn reservation(ns: &str, pod: &str, ips: &[&str], release: Option<i64>) -> ReservationFile {
    ReservationFile {
        version: FORMAT_VERSION,
        namespace: ns.into(),
        pod: pod.into(),
        ips: ips.iter().map(|s| s.parse::<IpAddr>().unwrap()).collect(),
        release_time: release.map(|off| Timestamp::from_unix_secs(now_secs() + off)),
        uid: format!("uid-{ns}-{pod}"),
        node_name: Some("node-a".into()),
        generation: None,
        retain_for_seconds: None,
    }
}

/// `CNI_ARGS` as the kubelet's runtime sends them.
fn pod_args(ns: &str, pod: &str, sandbox: &str) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID={sandbox};K8S_POD_UID=u-{pod}"
    )
}

fn add(conf: &str, ns: &str, pod: &str, sandbox: &str) -> CniOutcome {
    CniCall::new("ADD", sandbox, conf)
        .args(&pod_args(ns, pod, sandbox))
        .run(&ipkeep())
}

fn del(conf: &str, ns: &str, pod: &str, sandbox: &str) -> CniOutcome {
    CniCall::new("DEL", sandbox, conf)
        .args(&pod_args(ns, pod, sandbox))
        .run(&ipkeep())
}

/// The addresses of a successful ADD, without prefixes.
fn addresses(out: &CniOutcome) -> Vec<String> {
    let result = out.ok();
    result["ips"]
        .as_array()
        .unwrap_or_else(|| panic!("no ips in {result}"))
        .iter()
        .map(|ip| {
            let text = ip["address"].as_str().unwrap();
            text.split('/').next().unwrap().to_owned()
        })
        .collect()
}

fn assert_stderr_has(out: &CniOutcome, parts: &[&str]) {
    let stderr = out.stderr_str();
    let line = stderr
        .lines()
        .find(|l| parts.iter().all(|p| l.contains(p)))
        .unwrap_or_else(|| panic!("no stderr line with {parts:?} in:\n{stderr}"));
    assert!(line.starts_with("ipkeep: net1: "), "{line}");
}

/// Points the round robin of range set 0 so that `next` is its next candidate.
fn make_next_candidate(s: &Scratch, before_next: &str) {
    std::fs::write(s.net().join("last_reserved_ip.0"), before_next).unwrap();
}

#[test]
fn returning_pod_gets_its_dual_stack_addresses_back() {
    // The reservation written while the pod is bound (null releaseTime), and after its release
    // (releaseTime in the future): either way the re-created pod gets both addresses.
    for release in [None, Some(3600)] {
        let s = Scratch::new();
        let conf = s.conf(DUAL);
        let first = add(&conf, "db", "web-0", "sandbox-1");
        let ips = addresses(&first);
        assert_eq!(ips, ["10.1.0.2", "fd00::2"]);
        assert!(
            first.stderr.is_empty(),
            "no reservations, nothing to say: {}",
            first.stderr_str()
        );
        s.reserve("db", "web-0", &["10.1.0.2", "fd00::2"], None);
        del(&conf, "db", "web-0", "sandbox-1").ok();
        if release.is_some() {
            s.reserve("db", "web-0", &["10.1.0.2", "fd00::2"], release);
        }
        assert_eq!(s.holder("10.1.0.2"), None, "DEL frees the files");
        // Another pod, with the reserved addresses as its next round-robin candidates.
        make_next_candidate(&s, "10.1.0.1");
        std::fs::write(s.net().join("last_reserved_ip.1"), "fd00::1").unwrap();
        let other = add(&conf, "db", "web-1", "sandbox-9");
        assert_eq!(addresses(&other), ["10.1.0.3", "fd00::3"], "{release:?}");
        assert!(
            other.stderr.is_empty(),
            "a pod without a reservation: {}",
            other.stderr_str()
        );
        // The pod comes back under a new sandbox ID.
        let back = add(&conf, "db", "web-0", "sandbox-2");
        assert_eq!(addresses(&back), ["10.1.0.2", "fd00::2"], "{release:?}");
        assert_stderr_has(&back, &["pod db/web-0", "reserved address 10.1.0.2"]);
        assert_stderr_has(&back, &["pod db/web-0", "reserved address fd00::2"]);
        assert_eq!(s.holder("10.1.0.2").unwrap(), "sandbox-2\r\neth0");
        assert_eq!(s.holder("fd00::2").unwrap(), "sandbox-2\r\neth0");
    }
}

#[test]
fn force_delete_order_waits_for_the_old_sandbox() {
    let s = Scratch::new();
    let conf = s.conf(V4);
    assert_eq!(addresses(&add(&conf, "db", "web-0", "old")), ["10.1.0.2"]);
    s.reserve("db", "web-0", &["10.1.0.2"], None);
    // The pod is force-deleted and re-created: the new sandbox's ADD comes before the old DEL.
    let early = add(&conf, "db", "web-0", "new");
    let msg = early.err(11);
    assert!(
        msg.contains("10.1.0.2") && msg.contains("old") && msg.contains("of 120s"),
        "{msg}"
    );
    assert_stderr_has(&early, &["still held by its previous container old"]);
    assert_eq!(s.holder("10.1.0.2").unwrap(), "old\r\neth0");
    let again = add(&conf, "db", "web-0", "new");
    again.err(11);
    // The runtime runs the old DEL; the retried ADD gets the address.
    del(&conf, "db", "web-0", "old").ok();
    assert_eq!(addresses(&add(&conf, "db", "web-0", "new")), ["10.1.0.2"]);
    let pod = PodKey::new("db", "web-0").unwrap();
    assert_eq!(
        read_wait_marker(&s.dir(), &pod, &mut Vec::new()),
        None,
        "the wait is over and forgotten"
    );
}

#[test]
fn past_the_grace_period_the_pod_takes_a_fresh_address() {
    let s = Scratch::new();
    let conf = s.conf(V4);
    add(&conf, "db", "web-0", "old").ok();
    s.reserve("db", "web-0", &["10.1.0.2"], None);
    add(&conf, "db", "web-0", "new").err(11);
    // Ten minutes pass without the old DEL (the wait marker is moved back instead of waiting).
    let pod = PodKey::new("db", "web-0").unwrap();
    let marker =
        read_wait_marker(&s.dir(), &pod, &mut Vec::new()).expect("the first ADD starts the wait");
    assert_eq!(marker.holder, "old");
    let since = Timestamp::from_unix_secs(marker.since.unix_secs() - 600);
    write_wait_marker(
        &s.dir(),
        &pod,
        &WaitMarker {
            holder: "old".into(),
            since,
        },
        &mut Vec::new(),
    )
    .unwrap();
    let late = add(&conf, "db", "web-0", "new");
    assert_eq!(addresses(&late), ["10.1.0.3"]);
    assert_stderr_has(
        &late,
        &[
            "pod db/web-0",
            "still held by the pod's previous container old",
            "allocating a fresh address",
        ],
    );
    assert_eq!(
        s.holder("10.1.0.2").unwrap(),
        "old\r\neth0",
        "never taken away"
    );

    // The marker stays (later ADDs do not wait for the same stale container again) until GC
    // finds the pod without an active reservation; GC never follows what is planted there.
    assert!(read_wait_marker(&s.dir(), &pod, &mut Vec::new()).is_some());
    let gc_conf = conf.replacen(
        '{',
        r#"{"cni.dev/valid-attachments":[{"containerID":"old","ifname":"eth0"},{"containerID":"new","ifname":"eth0"}],"#,
        1,
    );
    let outside = s.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("web-5"), "x 2026-01-01T00:00:00Z\n").unwrap();
    symlink(&outside, s.net().join(".ipkeep/wait/planted")).unwrap();
    let kept = CniCall::new("GC", "", &gc_conf).run(&ipkeep());
    kept.ok();
    // The planted link is not ipkeep's: removed (never followed) and said, nothing else.
    assert_eq!(
        kept.stderr_str(),
        format!(
            "ipkeep: net1: found a symbolic link at {}, which ipkeep did not write: removed it, to be rebuilt\n",
            s.net().join(".ipkeep/wait/planted").display()
        )
    );
    assert!(std::fs::symlink_metadata(s.net().join(".ipkeep/wait/planted")).is_err());
    assert!(
        read_wait_marker(&s.dir(), &pod, &mut Vec::new()).is_some(),
        "still reserved"
    );
    ipkeep_reservation::remove_reservation(&s.dir(), "db", "web-0").unwrap();
    let pruned = CniCall::new("GC", "", &gc_conf).run(&ipkeep());
    pruned.ok();
    assert_stderr_has(&pruned, &["GC removed the wait marker of pod db/web-0"]);
    assert_eq!(read_wait_marker(&s.dir(), &pod, &mut Vec::new()), None);
    assert!(!s.net().join(".ipkeep/wait/db").exists());
    assert!(outside.join("web-5").exists(), "nothing outside touched");
    assert_eq!(s.holder("10.1.0.2").unwrap(), "old\r\neth0");
    assert_eq!(s.holder("10.1.0.3").unwrap(), "new\r\neth0");
}

#[test]
fn grace_period_is_configurable() {
    let s = Scratch::new();
    let conf = s.conf_with(V4, r#","reservationGraceSeconds":0"#);
    add(&conf, "db", "web-0", "old").ok();
    s.reserve("db", "web-0", &["10.1.0.2"], None);
    let out = add(&conf, "db", "web-0", "new");
    assert_eq!(
        addresses(&out),
        ["10.1.0.3"],
        "no wait at all with a grace of 0"
    );
    assert_stderr_has(&out, &["previous container old", "fresh address"]);

    let s = Scratch::new();
    let conf = s.conf_with(V4, r#","reservationGraceSeconds":45"#);
    add(&conf, "db", "web-0", "old").ok();
    s.reserve("db", "web-0", &["10.1.0.2"], None);
    let msg = add(&conf, "db", "web-0", "new").err(11);
    assert!(msg.contains("of 45s"), "{msg}");

    let bad = s.conf_with(V4, r#","reservationGraceSeconds":"2m""#);
    let msg = add(&bad, "db", "web-0", "new").err(999);
    assert!(
        msg.starts_with("failed to read ipam.reservationGraceSeconds:"),
        "{msg}"
    );
}

#[test]
fn another_pod_never_gets_a_reserved_address() {
    let s = Scratch::new();
    let conf = s.conf(SMALL);
    s.reserve("db", "web-0", &["10.1.0.2"], Some(3600));
    // .2 is the first candidate; pods with and without pod arguments skip it.
    assert_eq!(addresses(&add(&conf, "db", "web-1", "c1")), ["10.1.0.3"]);
    let anonymous = CniCall::new("ADD", "c2", &conf).run(&ipkeep());
    assert_eq!(addresses(&anonymous), ["10.1.0.4"]);
    assert!(anonymous.stderr.is_empty(), "{}", anonymous.stderr_str());
    add(&conf, "db", "web-2", "c3").ok();
    add(&conf, "db", "web-3", "c4").ok();
    // Only the reserved address is free now: the normal range-full error, STATUS still ready.
    let full = add(&conf, "db", "web-4", "c5");
    assert_eq!(
        full.err(999),
        "failed to allocate for range 0: no IP addresses available in range set: 10.1.0.1-10.1.0.6"
    );
    assert_eq!(s.holder("10.1.0.2"), None);
    let status = CniCall::new("STATUS", "", &conf).run(&ipkeep());
    status.ok();
    assert_stderr_has(&status, &["range set 0", "every one is reserved"]);
    // The pod it is reserved for still gets it; then the range is exhausted for real.
    assert_eq!(addresses(&add(&conf, "db", "web-0", "c6")), ["10.1.0.2"]);
    let status = CniCall::new("STATUS", "", &conf).run(&ipkeep());
    assert!(status.err(50).contains("exhausted"));
}

#[test]
fn an_expired_reservation_holds_nothing() {
    let s = Scratch::new();
    let conf = s.conf(V4);
    s.reserve("db", "web-0", &["10.1.0.2"], Some(-1));
    let other = add(&conf, "db", "web-1", "c1");
    assert_eq!(addresses(&other), ["10.1.0.2"]);
    assert!(other.stderr.is_empty(), "{}", other.stderr_str());
    // The owner, coming back too late, allocates normally and is told why.
    let late = add(&conf, "db", "web-0", "c2");
    assert_eq!(addresses(&late), ["10.1.0.3"]);
    assert_stderr_has(&late, &["pod db/web-0", "expired"]);
}

#[test]
fn requested_addresses_and_reservations() {
    let s = Scratch::new();
    let conf = s.conf(V4);
    s.reserve("db", "web-0", &["10.1.0.7"], None);
    // Another pod asking for the reserved address, in each of the three ways, is refused.
    let ways = [
        CniCall::new("ADD", "c1", &conf)
            .args(&format!("{};IP=10.1.0.7", pod_args("db", "web-1", "c1"))),
        CniCall::new(
            "ADD",
            "c1",
            &s.conf(V4)
                .replacen('{', r#"{"args":{"cni":{"ips":["10.1.0.7"]}},"#, 1),
        )
        .args(&pod_args("db", "web-1", "c1")),
        CniCall::new(
            "ADD",
            "c1",
            &s.conf(V4)
                .replacen('{', r#"{"runtimeConfig":{"ips":["10.1.0.7/24"]},"#, 1),
        )
        .args(&pod_args("db", "web-1", "c1")),
    ];
    for call in &ways {
        let msg = call.run(&ipkeep()).err(999);
        assert!(
            msg.contains("requested IP 10.1.0.7")
                && msg.contains("db/web-0")
                && msg.contains(&format!("{}", s.net().join("reserved/db/web-0").display())),
            "{msg}"
        );
        assert_eq!(s.holder("10.1.0.7"), None);
    }
    // The pod itself may request its reserved address…
    let own = CniCall::new("ADD", "c2", &conf)
        .args(&format!("{};IP=10.1.0.7", pod_args("db", "web-0", "c2")))
        .run(&ipkeep());
    assert_eq!(addresses(&own), ["10.1.0.7"]);
    del(&conf, "db", "web-0", "c2").ok();
    // …or another one: the request wins, and the log says the reservation was not used.
    let other = CniCall::new("ADD", "c3", &conf)
        .args(&format!("{};IP=10.1.0.9", pod_args("db", "web-0", "c3")))
        .run(&ipkeep());
    assert_eq!(addresses(&other), ["10.1.0.9"]);
    assert_stderr_has(&other, &["pod db/web-0", "10.1.0.7"]);
}

#[test]
fn unusable_reservations_are_ignored_and_logged() {
    let s = Scratch::new();
    let conf = s.conf(V4);
    // Outside every range (the pod moved here from a node with another range).
    s.reserve("db", "moved", &["10.9.0.7"], None);
    let out = add(&conf, "db", "moved", "c1");
    assert_eq!(addresses(&out), ["10.1.0.2"]);
    assert_stderr_has(
        &out,
        &["pod db/moved", "10.9.0.7", "outside every configured range"],
    );
    // A hand-made reservation of an address another pod's container holds: never taken away.
    add(&conf, "db", "busy", "c2").ok();
    assert_eq!(s.holder("10.1.0.3").unwrap(), "c2\r\neth0");
    s.reserve("db", "late", &["10.1.0.3"], None);
    let out = add(&conf, "db", "late", "c3");
    assert_eq!(addresses(&out), ["10.1.0.4"]);
    assert_stderr_has(&out, &["pod db/late", "10.1.0.3", "c2", "db/busy"]);
    assert_eq!(s.holder("10.1.0.3").unwrap(), "c2\r\neth0");
    // A host-local allocation (no pod recorded) counts as another pod's too.
    std::fs::write(s.net().join("10.1.0.9"), "hl-1\r\neth0").unwrap();
    s.reserve("db", "hl", &["10.1.0.9"], None);
    let out = add(&conf, "db", "hl", "c4");
    assert_eq!(addresses(&out), ["10.1.0.5"]);
    assert_stderr_has(&out, &["pod db/hl", "10.1.0.9", "hl-1"]);
    assert_eq!(s.holder("10.1.0.9").unwrap(), "hl-1\r\neth0");
}

/// Every path below `root` with its kind and size (symlinks listed, never followed).
fn tree(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path.clone());
            }
            out.push(format!(
                "{} {:?} {}",
                path.display(),
                meta.file_type(),
                meta.len()
            ));
        }
    }
    out.sort();
    out
}

#[test]
fn garbage_in_reserved_never_breaks_anyone() {
    let s = Scratch::new();
    let conf = s.conf(V4);
    let outside = s.path().join("outside");
    std::fs::create_dir_all(outside.join("ns")).unwrap();
    std::fs::write(outside.join("ns/victim"), b"{\"not\":\"a reservation\"}").unwrap();
    std::fs::write(outside.join("target"), b"secret").unwrap();
    let outside_before = tree(&outside);

    let reserved = s.net().join("reserved");
    std::fs::create_dir_all(reserved.join("db")).unwrap();
    std::fs::write(reserved.join("db/badjson"), b"{not json").unwrap();
    std::fs::write(reserved.join("db/Bad_Name"), b"{}").unwrap();
    std::fs::write(reserved.join("NotANamespace"), b"{}").unwrap();
    symlink(outside.join("target"), reserved.join("db/linked")).unwrap();
    std::fs::create_dir_all(reserved.join("db/adir/deeper")).unwrap();
    symlink(outside.join("ns"), reserved.join("evil")).unwrap();
    // A file for one pod sitting at another pod's path.
    std::fs::write(
        reserved.join("db/impostor"),
        serde_json::to_vec(&reservation("db", "web-0", &["10.1.0.2"], None)).unwrap(),
    )
    .unwrap();
    // The agent's next write rebuilds the plugin's snapshot, garbage included.
    s.reserve("db", "web-0", &["10.1.0.9"], None);

    let other = add(&conf, "db", "web-1", "c1");
    assert_eq!(
        addresses(&other),
        ["10.1.0.2"],
        "the impostor file holds nothing"
    );
    for name in ["badjson", "Bad_Name", "linked", "adir", "impostor"] {
        assert_stderr_has(&other, &["skipped", &format!("reserved/db/{name}")]);
    }
    assert_stderr_has(&other, &["skipped", "reserved/NotANamespace"]);
    assert_stderr_has(&other, &["skipped", "reserved/evil"]);
    // The owner of the valid reservation still gets its address; a pod whose file is garbage,
    // or whose namespace is a planted link, allocates normally and is told why.
    assert_eq!(addresses(&add(&conf, "db", "web-0", "c2")), ["10.1.0.9"]);
    // (Handing out a reserved address moves the round-robin cursor, as a requested one does.)
    let bad = add(&conf, "db", "badjson", "c3");
    assert_eq!(addresses(&bad), ["10.1.0.10"]);
    assert_stderr_has(&bad, &["ignoring the reservation of pod db/badjson"]);
    let linked = add(&conf, "evil", "victim", "c4");
    assert_eq!(addresses(&linked), ["10.1.0.11"]);
    assert_stderr_has(&linked, &["ignoring the reservation of pod evil/victim"]);
    let invalid = add(&conf, "db", "Bad_Name", "c5");
    assert_eq!(addresses(&invalid), ["10.1.0.12"]);
    assert_stderr_has(&invalid, &["db/Bad_Name", "not consulted"]);
    for (pod, sandbox) in [
        ("web-1", "c1"),
        ("web-0", "c2"),
        ("badjson", "c3"),
        ("Bad_Name", "c5"),
    ] {
        del(&conf, "db", pod, sandbox).ok();
    }
    del(&conf, "evil", "victim", "c4").ok();
    let leftovers: Vec<String> = std::fs::read_dir(s.net())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("10."))
        .collect();
    assert!(leftovers.is_empty(), "DEL freed everything: {leftovers:?}");
    assert_eq!(
        tree(&outside),
        outside_before,
        "nothing outside was touched"
    );
    assert_eq!(std::fs::read(outside.join("target")).unwrap(), b"secret");
}

#[test]
fn check_accepts_the_reserved_address_and_gc_keeps_it_blocked() {
    let s = Scratch::new();
    let conf = s.conf(V4);
    s.reserve("db", "web-0", &["10.1.0.5"], None);
    assert_eq!(addresses(&add(&conf, "db", "web-0", "c1")), ["10.1.0.5"]);
    CniCall::new("CHECK", "c1", &conf)
        .args(&pod_args("db", "web-0", "c1"))
        .run(&ipkeep())
        .ok();
    // The node restarts: the runtime's GC knows no valid attachment, so it frees c1's file.
    let gc_conf = conf.replacen('{', r#"{"cni.dev/valid-attachments":[],"#, 1);
    let gc = CniCall::new("GC", "", &gc_conf).run(&ipkeep());
    gc.ok();
    assert_eq!(s.holder("10.1.0.5"), None, "GC freed the stale file");
    // The reservation still holds the address for its pod: another pod whose next round-robin
    // candidate it is does not get it; the pod does.
    make_next_candidate(&s, "10.1.0.4");
    assert_eq!(addresses(&add(&conf, "db", "web-1", "c2")), ["10.1.0.6"]);
    assert_eq!(addresses(&add(&conf, "db", "web-0", "c3")), ["10.1.0.5"]);
    CniCall::new("CHECK", "c3", &conf).run(&ipkeep()).ok();
}

#[test]
fn reservations_of_others_leave_stderr_empty() {
    let s = Scratch::new();
    let conf = s.conf(DUAL);
    s.reserve("db", "web-0", &["10.1.0.2", "fd00::2"], None);
    s.reserve("db", "web-9", &["10.1.0.99"], Some(-10));
    for (pod, sandbox) in [("web-1", "c1"), ("web-2", "c2")] {
        let out = add(&conf, "db", pod, sandbox);
        out.ok();
        assert!(out.stderr.is_empty(), "{pod}: {}", out.stderr_str());
        let out = del(&conf, "db", pod, sandbox);
        out.ok();
        assert!(out.stderr.is_empty(), "{pod}: {}", out.stderr_str());
    }
}

#[test]
fn a_planted_reserved_link_is_never_followed() {
    let s = Scratch::new();
    let conf = s.conf(V4);
    let outside = s.path().join("outside");
    std::fs::create_dir_all(outside.join("db")).unwrap();
    std::fs::write(
        outside.join("db/web-0"),
        serde_json::to_vec(&reservation("db", "web-0", &["10.1.0.2"], None)).unwrap(),
    )
    .unwrap();
    std::fs::create_dir_all(s.net()).unwrap();
    symlink(&outside, s.net().join("reserved")).unwrap();
    let before = tree(&outside);
    let other = add(&conf, "db", "web-1", "c1");
    assert_eq!(
        addresses(&other),
        ["10.1.0.2"],
        "a linked tree reserves nothing"
    );
    assert_stderr_has(&other, &["skipped", "reserved"]);
    let owner = add(&conf, "db", "web-0", "c2");
    assert_eq!(addresses(&owner), ["10.1.0.3"]);
    assert_stderr_has(&owner, &["ignoring the reservation of pod db/web-0"]);
    del(&conf, "db", "web-1", "c1").ok();
    del(&conf, "db", "web-0", "c2").ok();
    assert_eq!(tree(&outside), before, "nothing outside was touched");
}

#[test]
fn reservations_of_unusable_addresses_name_the_reason() {
    // (ranges, reserved address, the reason the log must give)
    let cases = [
        (
            V4,
            "10.1.0.0",
            "is the network address of subnet 10.1.0.0/24",
        ),
        (
            V4,
            "10.1.0.255",
            "is the broadcast address of subnet 10.1.0.0/24",
        ),
        (
            V4,
            "10.1.0.1",
            "is the gateway of range 10.1.0.1-10.1.0.254",
        ),
        (
            r#"[[{"subnet":"10.1.0.0/24","rangeStart":"10.1.0.10","rangeEnd":"10.1.0.20"}]]"#,
            "10.1.0.30",
            "is not between rangeStart 10.1.0.10 and rangeEnd 10.1.0.20 of subnet 10.1.0.0/24",
        ),
    ];
    for (ranges, ip, reason) in cases {
        let s = Scratch::new();
        let conf = s.conf(ranges);
        s.reserve("db", "web-0", &[ip], None);
        let out = add(&conf, "db", "web-0", "c1");
        assert_ne!(addresses(&out), [ip], "{ip} must not be handed out");
        assert_stderr_has(
            &out,
            &[
                "pod db/web-0",
                &format!("reserved address {ip} {reason}; ignored"),
            ],
        );
        let stderr = out.stderr_str();
        assert!(
            !stderr.contains("outside every configured range")
                && !stderr.contains("could not be taken"),
            "{ip}: a vague reason is logged: {stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "{ip}: one line: {stderr}");
    }
}
