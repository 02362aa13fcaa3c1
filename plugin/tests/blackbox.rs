//! The built `ipkeep` binary exec'd exactly as a runtime does: round trips for every cniVersion,
//! interoperation with host-local's files, and hostile state on disk.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::fs::File;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::Stdio;

use common::{CniCall, Scratch, host_local, ipkeep};

/// What this suite's tests ask of their scratch directory beyond the shared paths.
trait BlackboxScratch {
    fn conf(&self, version: &str, ranges: &str) -> String;
    fn tree(&self) -> Vec<String>;
}

impl BlackboxScratch for Scratch {
    fn conf(&self, version: &str, ranges: &str) -> String {
        format!(
            r#"{{"cniVersion":"{version}","name":"net1","type":"ipkeep","ipam":{{"type":"ipkeep","dataDir":"{}","ranges":{ranges}}}}}"#,
            self.data().display()
        )
    }

    /// Every path under the scratch directory (for "nothing written elsewhere" checks).
    fn tree(&self) -> Vec<String> {
        fn walk(dir: &Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let e = e.unwrap();
                out.push(e.path().display().to_string());
                if e.file_type().unwrap().is_dir() {
                    walk(&e.path(), out);
                }
            }
        }
        let mut out = Vec::new();
        walk(self.path(), &mut out);
        out.sort();
        out
    }
}

const V4: &str = r#"[[{"subnet":"10.1.0.0/24"}]]"#;
const DUAL: &str = r#"[[{"subnet":"10.1.0.0/24"}],[{"subnet":"fd00::/120"}]]"#;
const VERSIONS: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

#[test]
fn round_trip_for_every_version() {
    for version in VERSIONS {
        let s = Scratch::new();
        let ranges = if version < "0.3.0" { V4 } else { DUAL };
        let conf = s.conf(version, ranges);
        let result = CniCall::new("ADD", "c1", &conf).run(&ipkeep()).ok();
        assert_eq!(result["cniVersion"], version);
        if version < "0.3.0" {
            assert_eq!(result["ip4"]["ip"], "10.1.0.2/24", "{version}: {result}");
        } else {
            assert_eq!(
                result["ips"][0]["address"], "10.1.0.2/24",
                "{version}: {result}"
            );
            assert_eq!(
                result["ips"][1]["address"], "fd00::2/120",
                "{version}: {result}"
            );
        }
        assert_eq!(
            std::fs::read(s.net().join("10.1.0.2")).unwrap(),
            b"c1\r\neth0"
        );
        if version >= "0.4.0" {
            CniCall::new("CHECK", "c1", &conf).run(&ipkeep()).ok();
            let msg = CniCall::new("CHECK", "c2", &conf).run(&ipkeep()).err(999);
            assert_eq!(
                msg,
                "host-local: Failed to find address added by container c2"
            );
        }
        CniCall::new("DEL", "c1", &conf).run(&ipkeep()).ok();
        assert!(!s.net().join("10.1.0.2").exists(), "{version}");
        CniCall::new("DEL", "c1", &conf).run(&ipkeep()).ok();
        if version == "1.1.0" {
            CniCall::new("STATUS", "c1", &conf).run(&ipkeep()).ok();
            CniCall::new("GC", "c1", &conf).run(&ipkeep()).ok();
        } else {
            assert_eq!(
                CniCall::new("GC", "c1", &conf).run(&ipkeep()).err(1),
                "config version does not allow GC"
            );
            assert_eq!(
                CniCall::new("STATUS", "c1", &conf).run(&ipkeep()).err(1),
                "config version does not allow STATUS"
            );
        }
    }
}

#[test]
fn version_command() {
    let out = CniCall::new("VERSION", "c1", "garbage").run(&ipkeep());
    assert_eq!(out.code, Some(0));
    assert_eq!(
        out.stdout_str(),
        "{\"cniVersion\":\"1.1.0\",\"supportedVersions\":[\"0.1.0\",\"0.2.0\",\"0.3.0\",\"0.3.1\",\"0.4.0\",\"1.0.0\",\"1.1.0\"]}\n"
    );
}

#[test]
fn legacy_id_only_files_are_found_and_freed() {
    let s = Scratch::new();
    let conf = s.conf("1.0.0", V4);
    std::fs::create_dir_all(s.net()).unwrap();
    std::fs::write(s.net().join("10.1.0.7"), b"c1").unwrap();
    CniCall::new("CHECK", "c1", &conf)
        .ifname("eth7")
        .run(&ipkeep())
        .ok();
    let msg = CniCall::new("ADD", "c1", &conf).run(&ipkeep()).err(999);
    assert_eq!(
        msg,
        "failed to allocate for range 0: 10.1.0.7 has been allocated to c1, duplicate allocation is not allowed"
    );
    CniCall::new("DEL", "c1", &conf).run(&ipkeep()).ok();
    assert!(!s.net().join("10.1.0.7").exists());
}

#[test]
fn host_local_and_ipkeep_share_state_both_ways() {
    let s = Scratch::new();
    let conf = s.conf("0.3.1", DUAL);
    // host-local allocates, ipkeep sees it (duplicate check, CHECK) and frees it.
    CniCall::new("ADD", "hl1", &conf).run(&host_local()).ok();
    let r = CniCall::new("ADD", "ip1", &conf).run(&ipkeep()).ok();
    assert_eq!(
        r["ips"][0]["address"], "10.1.0.3/24",
        "round robin continues host-local's cursor"
    );
    let conf04 = s.conf("0.4.0", DUAL);
    CniCall::new("CHECK", "hl1", &conf04).run(&ipkeep()).ok();
    CniCall::new("DEL", "hl1", &conf).run(&ipkeep()).ok();
    assert!(!s.net().join("10.1.0.2").exists());
    assert!(!s.net().join("fd00::2").exists());
    // ipkeep's allocation is seen and freed by host-local.
    CniCall::new("CHECK", "ip1", &conf04)
        .run(&host_local())
        .ok();
    CniCall::new("DEL", "ip1", &conf).run(&host_local()).ok();
    assert!(!s.net().join("10.1.0.3").exists());
    // And ipkeep notices host-local's changes (index rebuilt): ip1 is gone for it too.
    assert_eq!(
        CniCall::new("CHECK", "ip1", &conf04)
            .run(&ipkeep())
            .err(999),
        "host-local: Failed to find address added by container ip1"
    );
    let r = CniCall::new("ADD", "ip2", &conf).run(&ipkeep()).ok();
    assert_eq!(r["ips"][0]["address"], "10.1.0.4/24");
}

#[test]
fn failed_add_frees_only_its_own_reservations() {
    let s = Scratch::new();
    let conf = s.conf(
        "1.0.0",
        r#"[[{"subnet":"10.1.0.0/24"}],[{"subnet":"10.2.0.0/24"}]]"#,
    );
    CniCall::new("ADD", "c1", &conf).run(&ipkeep()).ok();
    let msg = CniCall::new("ADD", "c1", &conf)
        .args("IP=10.1.0.50")
        .run(&ipkeep())
        .err(999);
    assert_eq!(
        msg,
        "failed to allocate for range 1: 10.2.0.2 has been allocated to c1, duplicate allocation is not allowed"
    );
    assert!(
        s.net().join("10.1.0.2").exists(),
        "the earlier allocation survives (host-local would delete it)"
    );
    assert!(s.net().join("10.2.0.2").exists());
    assert!(
        !s.net().join("10.1.0.50").exists(),
        "this ADD's own reservation is undone"
    );
}

#[test]
fn gc_and_status() {
    let s = Scratch::new();
    let conf = s.conf("1.1.0", r#"[[{"subnet":"10.1.0.0/30"}]]"#);
    CniCall::new("ADD", "c1", &conf).run(&ipkeep()).ok();
    let msg = CniCall::new("STATUS", "c1", &conf).run(&ipkeep()).err(50);
    assert_eq!(
        msg,
        "range set 0 is exhausted: no IP addresses available in range set: 10.1.0.1-10.1.0.2"
    );
    let keep = format!(
        r#"{{"cniVersion":"1.1.0","name":"net1","cni.dev/valid-attachments":[{{"containerID":"c1","ifname":"eth0"}}],"ipam":{{"dataDir":"{}","ranges":[[{{"subnet":"10.1.0.0/30"}}]]}}}}"#,
        s.data().display()
    );
    CniCall::new("GC", "x", &keep).run(&ipkeep()).ok();
    assert!(
        s.net().join("10.1.0.2").exists(),
        "a valid attachment is kept"
    );
    // Without the list a GC frees nothing (and says so); with an empty one, everything.
    let out = CniCall::new("GC", "x", &conf).run(&ipkeep());
    out.ok();
    assert!(
        s.net().join("10.1.0.2").exists(),
        "a GC request without cni.dev/valid-attachments freed an allocation"
    );
    assert!(
        out.stderr_str().contains("GC freed nothing"),
        "{}",
        out.stderr_str()
    );
    let none_valid = conf.replacen('{', r#"{"cni.dev/valid-attachments":[],"#, 1);
    CniCall::new("GC", "x", &none_valid).run(&ipkeep()).ok();
    assert!(
        !s.net().join("10.1.0.2").exists(),
        "an attachment not listed is freed"
    );
    CniCall::new("STATUS", "c1", &conf).run(&ipkeep()).ok();
}

/// A malformed or hostile `cni.dev/valid-attachments` list is a CNI error, and the data directory
/// is as it was: no allocation freed, nothing written.
#[test]
fn gc_with_a_malformed_or_hostile_attachment_list_changes_nothing() {
    let s = Scratch::new();
    let conf = s.conf("1.1.0", r#"[[{"subnet":"10.1.0.0/29"}]]"#);
    CniCall::new("ADD", "c1", &conf).run(&ipkeep()).ok();
    CniCall::new("ADD", "c2", &conf).run(&ipkeep()).ok();
    let before = listing(&s.net());
    // (the list, what is wrong with it, the CNI error code: a list that does not decode is an
    // internal error as every other undecodable field; a container ID no runtime writes is an
    // invalid network configuration)
    let lists = [
        (r#""c1""#, "not a list", 999),
        (r#"[1, 2]"#, "not attachments", 999),
        (
            r#"[{"containerID": 5}]"#,
            "a container ID that is not a string",
            999,
        ),
        (
            r#"[{"containerID": "../../etc", "ifname": "eth0"}]"#,
            "a path for a container ID",
            7,
        ),
        (
            r#"[{"containerID": "", "ifname": "eth0"}]"#,
            "an empty container ID",
            7,
        ),
        (
            r#"[{"containerID": "c1", "ifname": "eth0"}, {"containerID": "c2 c3"}]"#,
            "one bad entry among good ones",
            7,
        ),
    ];
    for (list, what, code) in lists {
        let request = conf.replacen('{', &format!(r#"{{"cni.dev/valid-attachments":{list},"#), 1);
        let msg = CniCall::new("GC", "x", &request).run(&ipkeep()).err(code);
        assert!(
            !msg.is_empty(),
            "GC with {what}: an error without a message"
        );
        assert_eq!(
            listing(&s.net()),
            before,
            "GC with {what} changed the data directory"
        );
    }
}

/// Every file under `dir` with its content, in name order.
fn listing(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap_or_default(),
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn hostile_names_are_rejected() {
    let s = Scratch::new();
    let before = s.tree();
    let bad_net = format!(
        r#"{{"cniVersion":"1.0.0","name":"../x","ipam":{{"dataDir":"{}","subnet":"10.1.0.0/24"}}}}"#,
        s.data().display()
    );
    assert_eq!(
        CniCall::new("ADD", "c1", &bad_net).run(&ipkeep()).err(7),
        "invalid characters found in network name"
    );
    let conf = s.conf("1.0.0", V4);
    assert_eq!(
        CniCall::new("ADD", "../c1", &conf).run(&ipkeep()).err(4),
        "invalid characters in containerID"
    );
    assert_eq!(
        CniCall::new("ADD", "c1", &conf)
            .ifname("../e")
            .run(&ipkeep())
            .err(4),
        "interface name contains / or : or whitespace characters"
    );
    assert_eq!(s.tree(), before, "nothing was created");
}

#[test]
fn symlinks_are_never_followed() {
    let s = Scratch::new();
    let outside = s.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::create_dir_all(s.data()).unwrap();
    let conf = s.conf("1.0.0", V4);

    // <net> itself.
    symlink(&outside, s.net()).unwrap();
    let msg = CniCall::new("ADD", "c1", &conf).run(&ipkeep()).err(999);
    assert!(msg.contains("symbolic link"), "{msg}");
    std::fs::remove_file(s.net()).unwrap();

    // lock.
    std::fs::create_dir_all(s.net()).unwrap();
    symlink(outside.join("lock"), s.net().join("lock")).unwrap();
    let msg = CniCall::new("ADD", "c1", &conf).run(&ipkeep()).err(999);
    assert!(msg.contains("symbolic link"), "{msg}");
    std::fs::remove_file(s.net().join("lock")).unwrap();

    // An address name, .ipkeep and last_reserved_ip.0.
    symlink(outside.join("victim"), s.net().join("10.1.0.2")).unwrap();
    symlink(&outside, s.net().join(".ipkeep")).unwrap();
    symlink(outside.join("cursor"), s.net().join("last_reserved_ip.0")).unwrap();
    let r = CniCall::new("ADD", "c1", &conf).run(&ipkeep()).ok();
    assert_eq!(
        r["ips"][0]["address"], "10.1.0.3/24",
        "the symlinked address is blocked, not taken"
    );
    assert!(
        std::fs::read_dir(&outside).unwrap().next().is_none(),
        "nothing written through a link"
    );
    assert!(
        std::fs::symlink_metadata(s.net().join("10.1.0.2"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    CniCall::new("DEL", "c1", &conf).run(&ipkeep()).ok();
    assert!(std::fs::read_dir(&outside).unwrap().next().is_none());
}

#[test]
fn garbage_and_odd_entries_are_skipped() {
    let s = Scratch::new();
    let conf = s.conf("1.0.0", r#"[[{"subnet":"10.1.0.0/29"}]]"#);
    std::fs::create_dir_all(s.net().join("10.1.0.2")).unwrap();
    std::fs::write(s.net().join("10.1.0.3"), b"\xff\xfe not a container").unwrap();
    std::fs::write(s.net().join("10.1.0.4"), vec![b'x'; 100_000]).unwrap();
    std::fs::create_dir_all(s.net().join("sub")).unwrap();
    std::fs::write(s.net().join("sub/10.1.0.5"), b"c1\r\neth0").unwrap();
    std::fs::write(s.net().join("unrelated"), b"c1\r\neth0").unwrap();
    let before = s.tree();
    let r = CniCall::new("ADD", "c1", &conf).run(&ipkeep()).ok();
    assert_eq!(
        r["ips"][0]["address"], "10.1.0.5/29",
        "sub-directory files are not allocations"
    );
    CniCall::new("DEL", "c1", &conf).run(&ipkeep()).ok();
    assert!(s.net().join("sub/10.1.0.5").exists() && s.net().join("unrelated").exists());
    let after: Vec<String> = s
        .tree()
        .into_iter()
        .filter(|p| {
            !p.contains("/.ipkeep") && !p.ends_with("/lock") && !p.contains("last_reserved")
        })
        .collect();
    let before: Vec<String> = before
        .into_iter()
        .filter(|p| !p.contains("/.ipkeep") && !p.ends_with("/lock"))
        .collect();
    assert_eq!(after, before, "garbage is left alone");
}

#[test]
fn nothing_is_written_outside_the_network_directory() {
    let s = Scratch::new();
    std::fs::create_dir_all(s.data()).unwrap();
    std::fs::write(s.data().join("marker"), b"x").unwrap();
    let conf = s.conf("1.0.0", DUAL);
    for id in ["c1", "c2", "c3"] {
        CniCall::new("ADD", id, &conf).run(&ipkeep()).ok();
    }
    CniCall::new("DEL", "c2", &conf).run(&ipkeep()).ok();
    let outside: Vec<String> = s
        .tree()
        .into_iter()
        .filter(|p| !p.starts_with(&format!("{}/", s.net().display())))
        .collect();
    assert_eq!(
        outside,
        vec![
            s.data().display().to_string(),
            s.data().join("marker").display().to_string(),
            s.net().display().to_string()
        ]
    );
}

#[test]
fn a_container_id_too_long_for_its_file_is_refused() {
    let s = Scratch::new();
    let conf = s.conf("1.0.0", V4);
    // Far longer than any runtime uses (64 hex digits), but valid. Allocation files over 4 KiB
    // are skipped as garbage, so CHECK and DEL could never find such an allocation: ADD must
    // refuse it and leave no allocation behind.
    let id = "a".repeat(5000);
    let msg = CniCall::new("ADD", &id, &conf).run(&ipkeep()).err(999);
    assert!(msg.contains("container ID of 5000 bytes"), "{msg}");
    assert!(!s.net().join("10.1.0.2").exists(), "nothing was allocated");
    // An ID that fits is found and freed.
    let id = "b".repeat(4000);
    CniCall::new("ADD", &id, &conf).run(&ipkeep()).ok();
    CniCall::new("CHECK", &id, &conf).run(&ipkeep()).ok();
    CniCall::new("DEL", &id, &conf).run(&ipkeep()).ok();
    assert!(!s.net().join("10.1.0.2").exists(), "DEL freed the address");
}

/// The reply to any stdin over ipkeep's 1 MiB limit.
const STDIN_TOO_LARGE: &str =
    "error reading from stdin: network configuration is larger than 1048576 bytes";

#[test]
fn a_huge_stdin_is_refused_with_code_5() {
    let s = Scratch::new();
    let mut call = CniCall::new("ADD", "c1", &s.conf("1.0.0", V4));
    // A valid configuration followed by 3 MiB of whitespace, which JSON allows: only the size
    // is wrong. ipkeep stops reading after the limit; the harness ignores the broken pipe.
    call.stdin.resize(3 << 20, b' ');
    let out = call.run(&ipkeep());
    assert_eq!(out.err(5), STDIN_TOO_LARGE);
    assert!(s.tree().is_empty(), "wrote {:?}", s.tree());
}

#[test]
fn an_endless_stdin_is_refused_with_code_5() {
    // Run in an empty scratch directory: zeros carry no dataDir, so the one place a stray write
    // could land is the working directory.
    let s = Scratch::new();
    // /dev/zero itself as stdin, as a runtime could pass any file: reads never end and never
    // block, so only ipkeep's limit stops it. The same variables a runtime sets (CniCall's).
    let out = CniCall::new("ADD", "c1", "")
        .command(&ipkeep())
        .current_dir(s.path())
        .stdin(Stdio::from(File::open("/dev/zero").unwrap()))
        .output()
        .unwrap();
    assert_eq!(common::CniOutcome::from(out).err(5), STDIN_TOO_LARGE);
    assert!(s.tree().is_empty(), "wrote {:?}", s.tree());
}
