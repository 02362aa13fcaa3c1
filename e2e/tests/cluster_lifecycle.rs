//! Starting and stopping the real control plane, and its faults: `cluster up|env|down`, a
//! supervisor killed with SIGKILL (nothing may survive it), a taken port, a component that fails
//! to start or dies mid-run, and a stale state directory from a killed run. Each test has its own
//! control plane in its own directory.
//!
//! Needs the binaries: `make cluster-bins` (or `IPKEEP_CLUSTER_BIN_DIR`); fails loudly without.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::command;
use ipkeep_e2e::testkit::scratch;
use std::{
    collections::BTreeMap,
    os::unix::process::CommandExt,
    path::Path,
    process::{Command, Output},
    time::{Duration, Instant},
};

use ipkeep_e2e::cluster::{
    ControlPlane, ControlPlaneError, ControlPlaneOptions,
    plane::{process_alive, reap_stale},
};
use scratch::Scratch;

const E2E: &str = env!("CARGO_BIN_EXE_ipkeep-e2e");

/// Sends `sig` (`-INT`, `-KILL`) to `pid` with kill(1); the test fails if kill does.
fn signal(sig: &str, pid: u32) {
    command::checked(Command::new("kill").args([sig, &pid.to_string()]), None)
        .unwrap_or_else(|e| panic!("{}", ipkeep_e2e::error_chain(&e)));
}

fn e2e(args: &[&str], state_dir: &Path) -> Output {
    let mut command = Command::new(E2E);
    command
        .args(["cluster"])
        .args(args)
        .arg("--state-dir")
        .arg(state_dir);
    command::run(&mut command, None).unwrap_or_else(|e| panic!("{}", ipkeep_e2e::error_chain(&e)))
}

fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn ready_pids(state_dir: &Path) -> BTreeMap<String, u32> {
    let ready: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(state_dir.join("ready")).expect("ready file"),
    )
    .expect("ready json");
    serde_json::from_value(ready["pids"].clone()).expect("pids")
}

/// Every process whose command line mentions `dir`.
fn processes_mentioning(dir: &Path) -> Vec<(u32, String)> {
    let needle = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| *pid != std::process::id() && process_alive(*pid))
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
            cmd.contains(&needle).then_some((pid, cmd))
        })
        .collect()
}

/// Waits until no process of `pids` runs, no process mentions `dir` and `dir` is gone.
fn wait_all_gone(what: &str, pids: &BTreeMap<String, u32>, dir: &Path) {
    let started = Instant::now();
    loop {
        let alive: Vec<_> = pids.iter().filter(|(_, p)| process_alive(**p)).collect();
        let mentioning = processes_mentioning(dir);
        if alive.is_empty() && mentioning.is_empty() && !dir.exists() {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{what}: after 30 s still running: {alive:?}, processes naming {}: {mentioning:?}, directory exists: {}",
            dir.display(),
            dir.exists()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn cluster_up_env_and_down_leave_nothing_behind() {
    let parent = Scratch::new("e2e-cli");
    let dir = parent.join("ipkeep-cluster-cli");
    let t0 = Instant::now();
    let up = e2e(&["up"], &dir);
    let up_secs = t0.elapsed().as_secs_f64();
    assert!(up.status.success(), "{}", text(&up));
    let printed = String::from_utf8_lossy(&up.stdout);
    assert!(printed.contains("export KUBECONFIG="), "{}", text(&up));
    let env = e2e(&["env"], &dir);
    assert!(env.status.success(), "{}", text(&env));
    assert_eq!(String::from_utf8_lossy(&env.stdout), printed);
    let pids = ready_pids(&dir);
    for name in [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "watchdog",
    ] {
        assert!(
            pids.get(name).is_some_and(|p| process_alive(*p)),
            "{name} in {pids:?}"
        );
    }

    // The built kubectl reaches it with the admin kubeconfig.
    let bin_dir = ipkeep_e2e::cluster::bin_dir().expect("binaries");
    let readyz = command::run(
        Command::new(bin_dir.join("kubectl"))
            .env("KUBECONFIG", dir.join("admin.kubeconfig"))
            .args(["get", "--raw", "/readyz"]),
        None,
    )
    .unwrap_or_else(|e| panic!("{}", ipkeep_e2e::error_chain(&e)));
    assert_eq!(
        String::from_utf8_lossy(&readyz.stdout).trim(),
        "ok",
        "{}",
        text(&readyz)
    );

    // A second `up` on the same directory refuses, naming the running one.
    let again = e2e(&["up"], &dir);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already running"),
        "{}",
        text(&again)
    );

    let t1 = Instant::now();
    let down = e2e(&["down"], &dir);
    let down_secs = t1.elapsed().as_secs_f64();
    assert!(down.status.success(), "{}", text(&down));
    wait_all_gone("after cluster down", &pids, &dir);
    assert!(
        !parent.join("ipkeep-cluster-cli.log").exists(),
        "the supervisor log is removed"
    );
    let env = e2e(&["env"], &dir);
    assert!(!env.status.success(), "env after down: {}", text(&env));
    assert!(String::from_utf8_lossy(&env.stderr).contains("run: ipkeep-e2e cluster up"));
    eprintln!("timing: cluster up {up_secs:.1}s, cluster down {down_secs:.1}s");
}

#[test]
fn ctrl_c_stops_a_foreground_control_plane() {
    let parent = Scratch::new("e2e-sigint");
    let dir = parent.join("ipkeep-cluster-cli");
    let mut child = Command::new(E2E)
        .args(["cluster", "up", "--foreground", "--state-dir"])
        .arg(&dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start cluster up --foreground");
    let started = Instant::now();
    while !dir.join("ready").is_file() {
        if let Some(status) = child.try_wait().expect("try_wait") {
            panic!("cluster up --foreground exited early: {status}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "the control plane never got ready"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let pids = ready_pids(&dir);
    signal("-INT", child.id());
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {stderr}", out.status);
    assert!(stderr.contains("stopped in"), "{stderr}");
    wait_all_gone("after Ctrl-C", &pids, &dir);
}

#[test]
fn ctrl_c_while_cluster_up_waits_stops_the_half_started_control_plane() {
    let parent = Scratch::new("e2e-sigint-up");
    let dir = parent.join("ipkeep-cluster-cli");
    let child = Command::new(E2E)
        .args(["cluster", "up", "--state-dir"])
        .arg(&dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start cluster up");
    // Interrupt once the supervisor has begun (its state directory exists), before it is ready.
    let started = Instant::now();
    while !dir.join("owner").is_file() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the supervisor never started"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    signal("-INT", child.id());
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        // The control plane won the race and got ready first: then `down` must still clean up.
        let down = e2e(&["down"], &dir);
        assert!(down.status.success(), "{}", text(&down));
    } else {
        assert!(stderr.contains("interrupted"), "{stderr}");
    }
    wait_all_gone("after Ctrl-C of cluster up", &BTreeMap::new(), &dir);
    assert!(
        !parent.join("ipkeep-cluster-cli.log").exists(),
        "the supervisor log is removed"
    );
}

#[test]
fn a_supervisor_killed_with_sigkill_takes_every_component_with_it() {
    let parent = Scratch::new("e2e-sigkill");
    let dir = parent.join("ipkeep-cluster-cli");
    let up = e2e(&["up"], &dir);
    assert!(up.status.success(), "{}", text(&up));
    let pids = ready_pids(&dir);
    let owner: u32 = std::fs::read_to_string(dir.join("owner"))
        .expect("owner")
        .trim()
        .parse()
        .expect("owner pid");
    signal("-KILL", owner);
    let mut all = pids.clone();
    all.insert("supervisor".into(), owner);
    wait_all_gone("after SIGKILL of the supervisor", &all, &dir);
    let down = e2e(&["down"], &dir);
    assert!(down.status.success(), "{}", text(&down));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_port_is_named() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let parent = Scratch::new("e2e-port");
    let err = ControlPlane::start(ControlPlaneOptions {
        state_parent: Some(parent.path().to_path_buf()),
        apiserver_port: Some(port),
        ..ControlPlaneOptions::default()
    })
    .await
    .expect_err("a taken port must fail");
    assert!(
        matches!(err, ControlPlaneError::PortTaken { port: p, .. } if p == port),
        "{err}"
    );
    let message = err.to_string();
    assert!(
        message.contains(&format!("127.0.0.1:{port}")) && message.contains("already taken"),
        "{message}"
    );
    assert_eq!(
        std::fs::read_dir(parent.path()).expect("read").count(),
        0,
        "nothing was created"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_that_cannot_bind_its_port_says_so() {
    // Another process holds the port etcd is told to serve on (flags given last win).
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let parent = Scratch::new("e2e-bind");
    let url = format!("http://127.0.0.1:{port}");
    let err = ControlPlane::start(ControlPlaneOptions {
        state_parent: Some(parent.path().to_path_buf()),
        extra_args: [(
            "etcd".to_owned(),
            vec![
                format!("--listen-client-urls={url}"),
                format!("--advertise-client-urls={url}"),
            ],
        )]
        .into(),
        ..ControlPlaneOptions::default()
    })
    .await
    .expect_err("etcd cannot bind a taken port");
    let message = ipkeep_e2e::error_chain(&err);
    assert!(
        matches!(&err, ControlPlaneError::Exited { report, .. } if report.name == "etcd"),
        "{message}"
    );
    assert!(message.contains("failed to start etcd"), "{message}");
    assert!(
        message.contains(&format!("127.0.0.1:{port}"))
            && message.contains("address already in use"),
        "the log tail names the port: {message}"
    );
    assert_eq!(
        std::fs::read_dir(parent.path()).expect("read").count(),
        0,
        "every attempt cleaned up"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_that_fails_to_start_is_named_with_its_log() {
    let parent = Scratch::new("e2e-badflag");
    let dir = parent.join("ipkeep-cluster-badflag");
    let err = ControlPlane::start(ControlPlaneOptions {
        state_dir: Some(dir.clone()),
        state_parent: Some(parent.path().to_path_buf()),
        extra_args: [(
            "kube-scheduler".to_owned(),
            vec!["--no-such-flag".to_owned()],
        )]
        .into(),
        ..ControlPlaneOptions::default()
    })
    .await
    .expect_err("an unknown flag must fail");
    let message = ipkeep_e2e::error_chain(&err);
    assert!(
        matches!(&err, ControlPlaneError::Exited { report, .. } if report.name == "kube-scheduler"),
        "{message}"
    );
    assert!(
        message.contains("failed to start kube-scheduler"),
        "{message}"
    );
    assert!(
        message.contains("unknown flag: --no-such-flag"),
        "the log tail is shown: {message}"
    );
    wait_all_gone("after a failed start", &BTreeMap::new(), &dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_that_dies_mid_run_is_named() {
    let parent = Scratch::new("e2e-dies");
    let plane = ControlPlane::start(ControlPlaneOptions {
        state_parent: Some(parent.path().to_path_buf()),
        ..ControlPlaneOptions::default()
    })
    .await
    .expect("start");
    plane.check().expect("all running");
    let rss = plane.rss_kib();
    eprintln!("rss (KiB) right after start: {rss:?}");
    assert_eq!(rss.len(), 4, "{rss:?}");
    let pids = plane.pids();
    let scheduler = pids["kube-scheduler"];
    signal("-KILL", scheduler);
    let started = Instant::now();
    let err = loop {
        if let Err(e) = plane.check() {
            break e;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "check() never noticed the dead scheduler"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        matches!(&err, ControlPlaneError::Died { report, pid, .. } if report.name == "kube-scheduler" && *pid == scheduler),
        "{err}"
    );
    assert!(err.to_string().contains("kube-scheduler (pid"), "{err}");
    let dir = plane.state_dir().to_owned();
    drop(plane);
    wait_all_gone("after dropping the cluster", &pids, &dir);
}

#[test]
fn a_stale_state_dir_of_a_killed_run_is_reaped() {
    let parent = Scratch::new("e2e-stale");
    let dir = parent.join("ipkeep-cluster-424242-0");
    std::fs::create_dir(&dir).expect("mkdir");
    // The owner: a process that has exited.
    let mut gone = Command::new("true").spawn().expect("spawn true");
    let dead_pid = gone.id();
    gone.wait().expect("wait");
    std::fs::write(dir.join("owner"), format!("{dead_pid}\n")).expect("owner");
    // A leftover component: its own process group, the directory on its command line.
    let mut leftover = Command::new("sh")
        .args([
            "-c",
            "sleep 600; : \"$0\"",
            dir.to_str().expect("utf-8 path"),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .expect("spawn leftover");
    std::fs::write(dir.join("pgids"), format!("{}\n", leftover.id())).expect("pgids");
    let started = Instant::now();
    while processes_mentioning(&dir).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the leftover never ran"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // A symlink named like a state directory is neither followed nor removed.
    let outside = parent.join("outside");
    std::fs::create_dir(&outside).expect("mkdir outside");
    std::os::unix::fs::symlink(&outside, parent.join("ipkeep-cluster-link")).expect("symlink");

    // A directory that is not a state directory (no owner file) is never touched.
    let foreign = parent.join("ipkeep-cluster-foreign");
    std::fs::create_dir(&foreign).expect("mkdir foreign");
    let not_ours = e2e(&["up"], &foreign);
    assert!(!not_ours.status.success());
    assert!(
        String::from_utf8_lossy(&not_ours.stderr).contains("refusing to touch"),
        "{}",
        text(&not_ours)
    );
    let not_ours = e2e(&["down"], &foreign);
    assert!(!not_ours.status.success());
    assert!(foreign.exists());

    let removed = reap_stale(parent.path());
    assert_eq!(removed.len(), 1, "{removed:?}");
    assert!(
        removed[0].contains("ipkeep-cluster-424242-0") && removed[0].contains("1 leftover"),
        "{removed:?}"
    );
    assert!(!dir.exists());
    let status = leftover.wait().expect("wait leftover");
    assert!(!status.success(), "the leftover was killed: {status}");
    assert!(outside.exists() && parent.join("ipkeep-cluster-link").exists());

    // `cluster down` on a stale directory cleans it up too.
    let cli_dir = parent.join("ipkeep-cluster-cli");
    std::fs::create_dir(&cli_dir).expect("mkdir");
    std::fs::write(cli_dir.join("owner"), format!("{dead_pid}\n")).expect("owner");
    let down = e2e(&["down"], &cli_dir);
    assert!(down.status.success(), "{}", text(&down));
    assert!(
        String::from_utf8_lossy(&down.stderr).contains("already gone"),
        "{}",
        text(&down)
    );
    assert!(!cli_dir.exists());
}

/// The harness's etcd backup and restore, as an operator does them (`e2e/src/cluster/plane/
/// backup.rs`): `etcdctl snapshot save`, then a write, then `etcdutl snapshot restore
/// --bump-revision --mark-compacted` and kube-apiserver restarted. The write is gone, the
/// revision went up rather than back, and a watch from a revision before the restore ends with
/// 410 Gone (so every informer lists again: what restarting the kubelets did by hand). Needs
/// `make etcd-tools-bins` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_snapshot_restore_goes_back_and_its_revisions_go_on_up() {
    use futures::StreamExt;
    use ipkeep_e2e::cluster::plane::backup::Revisions;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
    let parent = Scratch::new("e2e-etcd-restore");
    let plane = ControlPlane::start(ControlPlaneOptions {
        state_parent: Some(parent.path().to_path_buf()),
        ..ControlPlaneOptions::default()
    })
    .await
    .expect("start");
    let maps: Api<ConfigMap> = Api::namespaced(plane.client().unwrap(), "default");
    let map = |name: &str| -> ConfigMap {
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap()
    };
    maps.create(&PostParams::default(), &map("before"))
        .await
        .unwrap();
    let snapshot = parent.path().join("snapshot.db");
    plane.etcd_snapshot_save(&snapshot).expect("snapshot save");
    maps.create(&PostParams::default(), &map("after"))
        .await
        .unwrap();
    let seen: u64 = maps
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
        .parse()
        .unwrap();

    plane
        .etcd_snapshot_restore(&snapshot, Revisions::Bumped)
        .await
        .expect("snapshot restore");
    plane
        .restart_component("kube-apiserver", Duration::from_millis(100))
        .await
        .expect("kube-apiserver restarted");
    let maps: Api<ConfigMap> = Api::namespaced(plane.client().unwrap(), "default");
    let names: Vec<String> = maps
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|m| m.metadata.name)
        .filter(|n| n == "before" || n == "after")
        .collect();
    assert_eq!(
        names,
        ["before"],
        "the restore did not go back to the snapshot"
    );
    let now: u64 = maps
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
        .parse()
        .unwrap();
    eprintln!("list resourceVersion {seen} before the restore, {now} after");
    assert!(now > seen, "the revision went back: {seen} → {now}");
    let events = maps
        .watch(&WatchParams::default(), &seen.to_string())
        .await
        .expect("a watch request");
    let mut events = std::pin::pin!(events);
    let first = events
        .next()
        .await
        .expect("a watch event")
        .expect("an event");
    assert!(
        matches!(&first, WatchEvent::Error(e) if e.code == 410),
        "a watch from before the restore did not end with 410 Gone: {first:?}"
    );
}
