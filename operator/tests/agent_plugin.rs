//! The agent's writer and the plugin on one network directory: while the agent's
//! [`NetworkWriter`] keeps rewriting the reservation files (single-file passes and full resyncs
//! alternately, uids and release times changing, churn reservations created and removed), 100
//! concurrent `ipkeep` ADD processes and then 100 concurrent DELs run on the same network.
//!
//! Checked: every process succeeds; no plugin ever reports a file it could not decode (a torn
//! file); a reader scanning `reserved/` throughout never finds anything but valid reservations and
//! the writer's in-flight temporaries; pods without reservation never get an address a stable
//! (always active) reservation holds; reserved pods get exactly their reserved address.
//!
//! The plugin binary is `$IPKEEP_TEST_BIN` when set, else built with cargo into this target dir.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use ipkeep_operator::agent::writer::NetworkWriter;
use ipkeep_reservation::{
    FORMAT_VERSION, PodKey, ReservationFile, Timestamp, ValidReservation, load_reservations,
};
use ipkeep_reservation::{NetworkDir, TEMP_PREFIX};

const NETWORK: &str = "cbr0";
const PROCESSES: usize = 100;
const STABLE: u8 = 40;
const RESERVED_PODS_RUNNING: u8 = 10;
const CHURN: u8 = 20;

fn plugin_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("IPKEEP_TEST_BIN") {
        return PathBuf::from(bin);
    }
    let status = Command::new(env!("CARGO"))
        .args(["build", "-p", "ipkeep-plugin", "--bin", "ipkeep"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("failed to run cargo to build the ipkeep plugin");
    assert!(status.success(), "cargo build -p ipkeep-plugin failed");
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().and_then(Path::parent).unwrap().join("ipkeep");
    assert!(bin.exists(), "{} was not built", bin.display());
    bin
}

fn stable_ip(i: u8) -> IpAddr {
    IpAddr::from([10, 99, 0, 10 + i])
}

fn churn_ip(i: u8) -> IpAddr {
    IpAddr::from([10, 99, 0, 100 + i])
}

fn file(
    ns: &str,
    pod: &str,
    ip: IpAddr,
    release: Option<Timestamp>,
    uid: String,
) -> ValidReservation {
    ReservationFile {
        version: FORMAT_VERSION,
        namespace: ns.into(),
        pod: pod.into(),
        ips: vec![ip],
        release_time: release,
        uid,
        node_name: Some("node-a".into()),
        generation: None,
        retain_for_seconds: None,
    }
    .validate()
    .unwrap()
}

/// The desired set at writer step `step`: every stable reservation always active (release time
/// null or far in the future), one of them changing (uid and release time) per step, and one
/// churn reservation created or removed per step; so steps are single-file passes, and every
/// fifth one is a full resync.
fn desired_at(step: u64) -> BTreeMap<PodKey, ValidReservation> {
    let future = Timestamp::from_unix_secs(4_102_444_800); // 2100-01-01
    let mut out = BTreeMap::new();
    for i in 0..STABLE {
        let generation = (step + u64::from(STABLE) - u64::from(i)) / u64::from(STABLE);
        let release = generation.is_multiple_of(2).then_some(future);
        let f = file(
            "stable",
            &format!("db-{i}"),
            stable_ip(i),
            release,
            format!("s{i}-{generation}"),
        );
        out.insert(f.key(), f);
    }
    for i in 0..CHURN {
        let generation = (step + u64::from(CHURN) - u64::from(i)) / u64::from(CHURN);
        if generation.is_multiple_of(2) {
            let f = file(
                "churn",
                &format!("cache-{i}"),
                churn_ip(i),
                None,
                format!("c{i}-{generation}"),
            );
            out.insert(f.key(), f);
        }
    }
    out
}

fn config(data_dir: &Path) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "bridge",
        "ipam": {
            "type": "ipkeep",
            "ranges": [[{"subnet": "10.99.0.0/24"}]],
            "dataDir": data_dir,
        }
    })
    .to_string()
}

fn spawn(bin: &Path, command: &str, container: &str, ns: &str, pod: &str) -> Child {
    Command::new(bin)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", container)
        .env("CNI_NETNS", "/var/run/netns/ipkeep-test")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", "/usr/lib/cni")
        .env(
            "CNI_ARGS",
            format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID={container}"),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("failed to start the plugin")
}

struct Pod {
    ns: &'static str,
    name: String,
    container: String,
    reserved: Option<IpAddr>,
}

/// Runs one command for every pod at once (all started, then all released), returning each
/// process's stdout.
fn run_all(bin: &Path, conf: &str, command: &str, pods: &[Pod]) -> Vec<String> {
    let mut children: Vec<Child> = pods
        .iter()
        .map(|p| spawn(bin, command, &p.container, p.ns, &p.name))
        .collect();
    for child in &mut children {
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(conf.as_bytes()).unwrap();
    }
    children
        .into_iter()
        .zip(pods)
        .map(|(child, pod)| {
            let out = child.wait_with_output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(
                out.status.success(),
                "{command} of {}/{} failed: {}\nstdout: {}\nstderr: {stderr}",
                pod.ns,
                pod.name,
                out.status,
                String::from_utf8_lossy(&out.stdout)
            );
            for bad in ["failed to decode", "failed to read reservation", "skipped"] {
                assert!(
                    !stderr.contains(bad),
                    "{command} of {}/{} saw a bad file: {stderr}",
                    pod.ns,
                    pod.name
                );
            }
            String::from_utf8(out.stdout).unwrap()
        })
        .collect()
}

fn result_ip(stdout: &str) -> IpAddr {
    let v: serde_json::Value = serde_json::from_str(stdout).unwrap();
    let addr = v["ips"][0]["address"].as_str().unwrap();
    addr.split('/').next().unwrap().parse().unwrap()
}

#[test]
fn plugins_never_see_a_torn_file_nor_get_a_reserved_address_while_the_agent_rewrites() {
    let bin = plugin_binary();
    let tmp = tempfile::Builder::new()
        .prefix("ipkeep-agent-plugin-")
        .tempdir()
        .unwrap();
    let data_dir = tmp.path().join("data");
    let mut writer = NetworkWriter::new(&data_dir, NETWORK);
    writer.full_sync(&desired_at(0)).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let steps = Arc::new(AtomicU64::new(0));
    let writer_thread = {
        let (stop, steps) = (stop.clone(), steps.clone());
        std::thread::spawn(move || {
            let mut step = 1u64;
            while !stop.load(Ordering::Relaxed) {
                let desired = desired_at(step);
                let report = if step.is_multiple_of(5) {
                    writer.full_sync(&desired)
                } else {
                    writer.apply(&desired)
                }
                .unwrap();
                assert!(report.failed.is_empty(), "{report:?}");
                steps.store(step, Ordering::Relaxed);
                step += 1;
            }
            step
        })
    };
    let reader_thread = {
        let (stop, data_dir) = (stop.clone(), data_dir.clone());
        std::thread::spawn(move || {
            let dir = NetworkDir::open(&data_dir, NETWORK).unwrap();
            let mut scans = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let set = load_reservations(&dir);
                for s in &set.skipped {
                    let name = s.path.file_name().unwrap().to_string_lossy();
                    assert!(
                        name.starts_with(TEMP_PREFIX),
                        "a torn or foreign entry: {s:?}"
                    );
                }
                for i in 0..STABLE {
                    let key = PodKey::new("stable", &format!("db-{i}")).unwrap();
                    assert!(
                        set.files.contains_key(&key),
                        "stable reservation {key} missing from a scan"
                    );
                }
                scans += 1;
            }
            scans
        })
    };

    let conf = config(&data_dir);
    let mut pods: Vec<Pod> = (0..PROCESSES - usize::from(RESERVED_PODS_RUNNING))
        .map(|i| Pod {
            ns: "apps",
            name: format!("web-{i}"),
            container: format!("web{i:04}"),
            reserved: None,
        })
        .collect();
    for i in 0..RESERVED_PODS_RUNNING {
        pods.push(Pod {
            ns: "stable",
            name: format!("db-{i}"),
            container: format!("db{i:04}"),
            reserved: Some(stable_ip(i)),
        });
    }
    let steps_before = steps.load(Ordering::Relaxed);
    let added = run_all(&bin, &conf, "ADD", &pods);
    let steps_between = steps.load(Ordering::Relaxed);
    let stable: BTreeSet<IpAddr> = (0..STABLE).map(stable_ip).collect();
    let mut seen = BTreeSet::new();
    for (pod, stdout) in pods.iter().zip(&added) {
        let ip = result_ip(stdout);
        assert!(seen.insert(ip), "{ip} handed out twice");
        match pod.reserved {
            Some(want) => assert_eq!(
                ip, want,
                "{}/{} did not get its reserved address",
                pod.ns, pod.name
            ),
            None => assert!(
                !stable.contains(&ip),
                "{}/{} got {ip}, held by a reservation",
                pod.ns,
                pod.name
            ),
        }
    }
    run_all(&bin, &conf, "DEL", &pods);
    let steps_after = steps.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    let total_steps = writer_thread.join().unwrap();
    let scans = reader_thread.join().unwrap();
    eprintln!(
        "writer steps: {steps_before} before, {steps_between} after the ADDs, {steps_after} after the DELs ({total_steps} in all); reader scans: {scans}"
    );
    assert!(
        steps_between > steps_before,
        "the writer made no change during the ADDs"
    );
    assert!(
        steps_after > steps_between,
        "the writer made no change during the DELs"
    );
    assert!(scans > 0);
    // Every container is gone: no IP file is left.
    let left: Vec<_> = std::fs::read_dir(data_dir.join(NETWORK))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.parse::<IpAddr>().is_ok())
        .collect();
    assert!(left.is_empty(), "IP files left after every DEL: {left:?}");
}
