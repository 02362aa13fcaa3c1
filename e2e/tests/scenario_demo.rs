//! `make demo`'s program, `ipkeep-e2e demo`, run as a newcomer runs it, on real nodes (kubelet,
//! containerd, runc; the chart installed with helm from `make image`'s archive): the story is told
//! and checked (web-1 back with the same address, on its eth0 and answering a pod on the other
//! node; a reservation expiring), it exits 0 and leaves nothing behind — nothing of its nodes'
//! slot (processes, cgroups, namespaces, veths, bridge, mounts, firewall rules, data directory),
//! no process, state or work directory; interrupted with Ctrl-C (SIGINT) in the middle it cleans
//! up just as well and exits 130, and the next run works.
//!
//! Needs root, `make cluster-bins`, `make node-bins` and `make image` (the archive
//! `target/image/ipkeep.oci.tar`, or `IPKEEP_IMAGE_ARCHIVE`); fails loudly without them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    time::Instant,
};

use ipkeep_e2e::cluster::realnode::{self, Slot};
use ipkeep_e2e::testkit::system::skipped_on_users_cluster;

fn image_archive() -> std::path::PathBuf {
    let path = std::env::var_os("IPKEEP_IMAGE_ARCHIVE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/image/ipkeep.oci.tar")
        });
    assert!(
        path.is_file(),
        "{} is missing: run `make image` (or set IPKEEP_IMAGE_ARCHIVE)",
        path.display()
    );
    path
}

/// The demo with `extra` arguments; its stdout piped, its stderr (where its error goes) as asked.
fn demo(extra: &[&str], stderr: Stdio) -> Child {
    let bin_dir = ipkeep_e2e::cluster::bin_dir()
        .unwrap_or_else(|e| panic!("{}", ipkeep_e2e::error_chain(&e)));
    Command::new(env!("CARGO_BIN_EXE_ipkeep-e2e"))
        .arg("demo")
        .args(extra)
        .arg("--image-archive")
        .arg(image_archive())
        .arg("--chart")
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/ipkeep"))
        .env("IPKEEP_CLUSTER_BIN_DIR", bin_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("start ipkeep-e2e demo")
}

/// The real nodes' slot the demo names in its output (`(slot N)`).
fn slot_of(text: &str) -> Slot {
    let n = text
        .split("(slot ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the demo named no slot:\n{text}"));
    Slot::new(n).unwrap_or_else(|| panic!("slot {n} out of range"))
}

/// Fails if anything of the real nodes' slot is left.
fn assert_slot_empty(slot: Slot) {
    let left = realnode::leftovers(slot);
    assert!(left.is_empty(), "the demo's nodes left: {left:?}");
}

/// Fails if any process or state directory of a demo run with that pid is left.
fn assert_nothing_left(pid: u32) {
    let tmp = std::env::temp_dir();
    for entry in std::fs::read_dir(&tmp).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        assert!(
            !name.starts_with(&format!("ipkeep-cluster-{pid}-")),
            "{} left behind",
            entry.path().display()
        );
    }
    // No process whose parent was the demo (agents, controller, control plane components).
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .unwrap_or("");
        assert_ne!(
            ppid,
            pid.to_string(),
            "process {:?} of the demo left behind",
            entry.file_name()
        );
    }
}

#[test]
fn make_demo_tells_the_story_cleans_up_after_itself_and_after_ctrl_c() {
    if skipped_on_users_cluster(
        "make_demo_tells_the_story_cleans_up_after_itself_and_after_ctrl_c",
        "the demo starts its own control plane and nodes",
    ) {
        return;
    }
    realnode::host::check_prerequisites()
        .unwrap_or_else(|e| panic!("{}", ipkeep_e2e::error_chain(&e)));
    // Interrupted once the StatefulSet is running.
    let t0 = Instant::now();
    let mut child = demo(&[], Stdio::null());
    let pid = child.id();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut seen = String::new();
    let mut line = String::new();
    while out.read_line(&mut line).unwrap() > 0 {
        seen.push_str(&line);
        if line.contains("ipkeep's controller made one IPReservation per pod") {
            break;
        }
        line.clear();
    }
    assert!(
        seen.contains("web-1"),
        "the story did not get to the pods:\n{seen}"
    );
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::Signal::INT,
    )
    .unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(130),
        "interrupted demo: {status}\n{rest}"
    );
    assert!(rest.contains("Cleaning up"), "{rest}");
    assert_slot_empty(slot_of(&seen));
    assert_nothing_left(pid);
    eprintln!("interrupted demo took {:.1}s", t0.elapsed().as_secs_f64());

    // The next run works, to the end.
    let t0 = Instant::now();
    let child = demo(&[], Stdio::piped());
    let pid = child.id();
    let output = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "demo failed ({}):\n{text}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    for step in [
        "1. An annotated StatefulSet with 3 replicas",
        "$ helm install ipkeep",
        "$ kubectl -n demo get pods -o wide",
        "2. Delete web-1",
        "the same address",
        "$ kubectl -n demo apply -f - <<EOF",
        "$ kubectl -n demo exec web-1 -- ip addr show eth0",
        "ipkeep-e2e workload",
        "3. A reservation expires",
        "Released",
        "nothing is left running",
    ] {
        assert!(text.contains(step), "the story lacks {step:?}:\n{text}");
    }
    assert!(!text.contains("A DIFFERENT ADDRESS"), "{text}");
    // The last `kubectl get ipr` no longer lists the expired cache-0.
    let last = text.rsplit("$ kubectl -n demo get ipr\n").next().unwrap();
    assert!(!last.contains("cache-0"), "cache-0 did not expire:\n{last}");
    // The kept address is the one on eth0 inside the new pod.
    let kept = text
        .split("(a new pod), IP ")
        .nth(1)
        .and_then(|rest| rest.split([' ', ',']).next())
        .unwrap_or_else(|| panic!("no address of the new web-1:\n{text}"));
    assert!(
        text.contains(&format!("inet {kept}/")),
        "{kept} is not on web-1's eth0:\n{text}"
    );
    assert_slot_empty(slot_of(&text));
    assert_nothing_left(pid);
    eprintln!("demo took {:.1}s", t0.elapsed().as_secs_f64());
}
