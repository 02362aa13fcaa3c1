//! The driver under a real `dockerd` (Debian's docker.io 20.10, started by hand in its own
//! network and mount namespaces, see `support/dockerd.rs`): `docker network create --ipam-driver`,
//! containers run, stopped, started, removed, `--ip`, a Compose project up / recreate / down,
//! and at every step no address given to two running containers, and the driver's allocation
//! files matching exactly the running containers.
//!
//! Docker 20.10 sends no endpoint name (only Engine ≥ 29 does): here allocation is host-local
//! style; stickiness by name is proven by `contract.rs`, which replays Engine 29's requests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::BTreeMap;
use std::path::Path;

use support::dockerd::{Dockerd, IMAGE, legacy_plugin, require_docker};
use support::{metric, scratch};

/// The allocation files of a pool: address → `(owner, kind)`.
fn allocations(data_dir: &Path, pool_id: &str) -> BTreeMap<String, (String, String)> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(data_dir.join("pools").join(pool_id)) else {
        return out;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().into_string().unwrap();
        if name.parse::<std::net::IpAddr>().is_ok() {
            let content = std::fs::read_to_string(entry.path()).unwrap();
            let (owner, kind) = content.split_once("\r\n").unwrap();
            out.insert(name, (owner.to_owned(), kind.to_owned()));
        }
    }
    out
}

/// Every running container's address on `network` is distinct, and the driver's files hold
/// exactly those addresses plus the gateway's.
fn assert_consistent(
    docker: &Dockerd,
    data_dir: &Path,
    network: &str,
    pool_id: &str,
    gateway: &str,
) {
    let ids = docker.ok(&["ps", "-q", "--filter", &format!("network={network}")]);
    let mut running = BTreeMap::new();
    for id in ids.split_whitespace() {
        let ip = docker.ip_of(id, network);
        if let Some(other) = running.insert(ip.clone(), id.to_owned()) {
            panic!("{ip} given to both {other} and {id}");
        }
    }
    let files = allocations(data_dir, pool_id);
    let mut want: Vec<&String> = running.keys().collect();
    let gw = gateway.to_owned();
    want.push(&gw);
    want.sort();
    let have: Vec<&String> = files.keys().collect();
    assert_eq!(
        have, want,
        "allocation files {files:?} against running containers {running:?}"
    );
    assert_eq!(files[gateway], ("gateway".into(), "gateway".into()));
}

#[test]
fn docker_run_stop_rm_and_compose_through_the_driver() {
    require_docker("the real-dockerd test");
    let dir = scratch("real");
    let (name, _socket, mut driver) = legacy_plugin(dir.path(), "ipkeep-t", &[]);
    let docker = Dockerd::start(dir.path(), "dk");

    // A network on the driver: the engine activates the plugin from its socket.
    let opts = [
        "--gateway",
        "198.18.30.254",
        "--ipam-opt",
        "ipkeep.dev/retain-for=1h",
    ];
    docker.network_on(&name, "198.18.30.0/24", "net1", &opts);
    let pool = "ipkeep-local_198.18.30.0-24";
    let gateway = "198.18.30.254";
    let state = std::fs::read_to_string(driver.data_dir.join("state").join(format!("{pool}.json")))
        .unwrap();
    assert!(state.contains("\"retainForSecs\":3600"), "{state}");

    let run = |n: &str, extra: &[&str]| {
        let mut args = vec!["run", "-d", "--name", n, "--network", "net1"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[IMAGE, "sleep", "600"]);
        docker.ok(&args);
    };
    run("c1", &[]);
    run("c2", &[]);
    run("c3", &["--ip", "198.18.30.50"]);
    assert_eq!(docker.ip_of("c3", "net1"), "198.18.30.50");
    // The container's interface really has the address the driver gave.
    let c1 = docker.ip_of("c1", "net1");
    let addr = docker.ok(&["exec", "c1", "ip", "-4", "addr", "show", "eth0"]);
    assert!(addr.contains(&format!("inet {c1}/24")), "{addr}");
    assert_consistent(&docker, &driver.data_dir, "net1", pool, gateway);
    // 20.10 sends no name: the files hold unnamed tokens.
    assert!(
        allocations(&driver.data_dir, pool)
            .values()
            .filter(|(_, k)| k == "unnamed")
            .count()
            == 3
    );

    // Stop / start / remove / run again, checking at every step.
    docker.ok(&["stop", "-t", "0", "c1"]);
    assert_consistent(&docker, &driver.data_dir, "net1", pool, gateway);
    run("c4", &[]);
    docker.ok(&["start", "c1"]);
    assert_consistent(&docker, &driver.data_dir, "net1", pool, gateway);
    docker.ok(&["rm", "-f", "c2"]);
    run("c5", &[]);
    run("c6", &[]);
    assert_consistent(&docker, &driver.data_dir, "net1", pool, gateway);
    // --ip on an address a running container holds is refused by the driver.
    let taken = docker.docker(&[
        "run",
        "-d",
        "--name",
        "c7",
        "--network",
        "net1",
        "--ip",
        "198.18.30.50",
        IMAGE,
        "sleep",
        "600",
    ]);
    assert!(
        !taken.status.success(),
        "a second container got 198.18.30.50"
    );
    let _ = docker.docker(&["rm", "-f", "c7"]);
    assert_consistent(&docker, &driver.data_dir, "net1", pool, gateway);

    // The driver is killed while the engine runs: a `docker run` meanwhile waits (the engine's
    // plugin client retries a plugin it cannot reach) and succeeds once the driver is back, with
    // nothing lost or given twice.
    driver.kill();
    let waiting = std::thread::scope(|scope| {
        let pending = scope.spawn(|| {
            docker.docker(&[
                "run",
                "-d",
                "--name",
                "c8",
                "--network",
                "net1",
                IMAGE,
                "sleep",
                "600",
            ])
        });
        support::wait_for(
            "the engine to retry the plugin it cannot reach",
            std::time::Duration::from_secs(60),
            || docker.log().contains("Unable to connect to plugin"),
        );
        driver.restart();
        pending.join().unwrap()
    });
    assert!(
        waiting.status.success(),
        "docker run across a driver restart: {}",
        String::from_utf8_lossy(&waiting.stderr)
    );
    assert_consistent(&docker, &driver.data_dir, "net1", pool, gateway);
    docker.ok(&["rm", "-f", "c8"]);

    // docker network rm after the containers: every address and the pool released.
    for c in ["c1", "c3", "c4", "c5", "c6"] {
        docker.ok(&["rm", "-f", c]);
    }
    docker.ok(&["network", "rm", "net1"]);
    assert!(
        allocations(&driver.data_dir, pool).is_empty(),
        "{:?}",
        allocations(&driver.data_dir, pool)
    );
    let state = std::fs::read_to_string(driver.data_dir.join("state").join(format!("{pool}.json")))
        .unwrap();
    assert!(state.contains("\"active\":false"), "{state}");

    // Compose: up, recreate, down, with the network's IPAM on the driver.
    let project = dir.path().join("compose");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(
        project.join("docker-compose.yml"),
        format!(
            "version: \"2.4\"\nservices:\n  web:\n    image: {IMAGE}\n    command: sleep 600\n    scale: 3\n  db:\n    image: {IMAGE}\n    command: sleep 600\nnetworks:\n  default:\n    ipam:\n      driver: {name}\n      config:\n        - subnet: 198.18.31.0/24\n      options:\n        ipkeep.dev/retain-for: 1h\n"
        ),
    )
    .unwrap();
    let proj = "ipk";
    let network = format!("{proj}_default");
    let pool = "ipkeep-local_198.18.31.0-24";
    docker.compose(&project, proj, &["up", "-d"]);
    let gateway = "198.18.31.1";
    assert_consistent(&docker, &driver.data_dir, &network, pool, gateway);
    docker.compose(&project, proj, &["up", "-d", "--force-recreate"]);
    assert_consistent(&docker, &driver.data_dir, &network, pool, gateway);
    docker.compose(&project, proj, &["up", "-d", "--scale", "web=5"]);
    assert_consistent(&docker, &driver.data_dir, &network, pool, gateway);
    docker.compose(&project, proj, &["down"]);

    // Networks without --subnet: the engine asks the driver for a pool (and again while an
    // answer overlaps one of its networks); each gets its own.
    let subnet_of = |network: &str| {
        docker.ok(&[
            "network",
            "inspect",
            "-f",
            "{{range .IPAM.Config}}{{.Subnet}}{{end}}",
            network,
        ])
    };
    docker.ok(&["network", "create", "--ipam-driver", &name, "auto1"]);
    docker.ok(&["network", "create", "--ipam-driver", &name, "auto2"]);
    let (auto1, auto2) = (subnet_of("auto1"), subnet_of("auto2"));
    assert!(
        auto1.starts_with("198.18.") && auto2.starts_with("198.18.") && auto1 != auto2,
        "{auto1} {auto2}"
    );
    docker.ok(&[
        "run",
        "-d",
        "--name",
        "a1",
        "--network",
        "auto1",
        IMAGE,
        "sleep",
        "600",
    ]);
    let auto_pool = format!("ipkeep-local_{}", auto1.replace('/', "-"));
    let gateway_of = docker.ok(&[
        "network",
        "inspect",
        "-f",
        "{{range .IPAM.Config}}{{.Gateway}}{{end}}",
        "auto1",
    ]);
    assert_consistent(&docker, &driver.data_dir, "auto1", &auto_pool, &gateway_of);
    docker.ok(&["rm", "-f", "a1"]);
    docker.ok(&["network", "rm", "auto1", "auto2"]);
    assert!(
        allocations(&driver.data_dir, pool).is_empty(),
        "{:?}",
        allocations(&driver.data_dir, pool)
    );
    let log = driver.log_text();
    assert!(!log.contains("panicked"), "{log}");
    drop(docker);
}

/// The managed plugin bundle (`make docker-plugin`: config.json + a rootfs holding the static
/// binary), from `IPKEEP_DOCKER_PLUGIN_DIR` or `target/docker-plugin`.
fn plugin_bundle() -> std::path::PathBuf {
    let dir = std::env::var_os("IPKEEP_DOCKER_PLUGIN_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/docker-plugin"));
    assert!(
        dir.join("config.json").is_file() && dir.join("rootfs/ipkeep-docker").is_file(),
        "{} holds no plugin bundle: run `make docker-plugin` (make test does)",
        dir.display()
    );
    dir
}

#[test]
fn the_managed_plugin_bundle_is_accepted_and_serves() {
    require_docker("the managed plugin test");
    let bundle = plugin_bundle();
    let dir = scratch("managed");
    let docker = Dockerd::start(dir.path(), "mp");
    let name = "ipkeep-managed:test";
    docker.ok(&["plugin", "create", name, &bundle.to_string_lossy()]);
    let data = dir.path().join("plugin-data");
    std::fs::create_dir_all(&data).unwrap();
    docker.ok(&[
        "plugin",
        "set",
        name,
        &format!("data.source={}", data.display()),
    ]);
    docker.ok(&["plugin", "enable", name]);
    docker.network_on(name, "198.18.33.0/24", "mnet", &[]);
    docker.ok(&[
        "run",
        "-d",
        "--name",
        "m1",
        "--network",
        "mnet",
        IMAGE,
        "sleep",
        "600",
    ]);
    docker.ok(&[
        "run",
        "-d",
        "--name",
        "m2",
        "--network",
        "mnet",
        IMAGE,
        "sleep",
        "600",
    ]);
    let (m1, m2) = (docker.ip_of("m1", "mnet"), docker.ip_of("m2", "mnet"));
    assert_ne!(m1, m2);
    // The plugin's state lands in the bind-mounted data directory.
    let files = allocations(&data, "ipkeep-local_198.18.33.0-24");
    assert!(
        files.contains_key(&m1) && files.contains_key(&m2),
        "{files:?}"
    );
    for c in ["m1", "m2"] {
        docker.ok(&["rm", "-f", c]);
    }
    docker.ok(&["network", "rm", "mnet"]);
    docker.ok(&["plugin", "disable", name]);
    docker.ok(&["plugin", "rm", name]);
    drop(docker);
}

/// `--key-by-mac` on Docker 20.10 (which sends no name): a container re-created with the same
/// `--mac-address` gets its address back — stickiness on an engine before 29.
#[test]
fn with_key_by_mac_a_container_recreated_with_its_mac_keeps_its_address() {
    require_docker("the real-dockerd --key-by-mac test");
    let dir = scratch("realmac");
    let (name, _socket, driver) = legacy_plugin(dir.path(), "ipkeep-m", &["--key-by-mac"]);
    let mut docker = Dockerd::start(dir.path(), "km");
    docker.network_on(&name, "198.18.34.0/24", "knet", &[]);
    let run = |n: &str, mac: &str| {
        docker.ok(&[
            "run",
            "-d",
            "--name",
            n,
            "--network",
            "knet",
            "--mac-address",
            mac,
            IMAGE,
            "sleep",
            "600",
        ]);
        docker.ip_of(n, "knet")
    };
    let first = run("ma", "02:42:c6:12:22:0a");
    docker.ok(&["rm", "-f", "ma"]);
    let other = run("mb", "02:42:c6:12:22:0b");
    assert_ne!(other, first, "a retained address went to another MAC");
    assert_eq!(
        run("ma", "02:42:c6:12:22:0a"),
        first,
        "the re-created container lost its address"
    );
    let files = allocations(&driver.data_dir, "ipkeep-local_198.18.34.0-24");
    assert_eq!(
        files[&first],
        ("mac-02-42-c6-12-22-0a".into(), "mac".into())
    );

    // The engine restarts (an upgrade, a reboot): it stops its containers, releasing their
    // addresses, and starts the `--restart always` ones again, which get theirs back.
    docker.ok(&[
        "run",
        "-d",
        "--name",
        "mc",
        "--restart",
        "always",
        "--network",
        "knet",
        "--mac-address",
        "02:42:c6:12:22:0c",
        IMAGE,
        "sleep",
        "600",
    ]);
    let kept = docker.ip_of("mc", "knet");
    let series = |call: &str| {
        format!(
            "ipkeep_docker_requests_total{{endpoint=\"IpamDriver.{call}\",outcome=\"success\"}}"
        )
    };
    let calls = || {
        (
            metric(&driver.socket, &series("ReleaseAddress")),
            metric(&driver.socket, &series("RequestAddress")),
        )
    };
    let before = calls();
    docker.restart();
    support::wait_for(
        "mc to run again after the engine's restart",
        std::time::Duration::from_secs(60),
        || {
            docker
                .docker(&["inspect", "-f", "{{.State.Running}}", "mc"])
                .stdout
                .starts_with(b"true")
        },
    );
    assert_eq!(
        docker.ip_of("mc", "knet"),
        kept,
        "mc lost its address across the engine's restart"
    );
    let after = calls();
    assert!(
        after.0 > before.0 && after.1 > before.1,
        "the engine did not release and ask again: {before:?} {after:?}"
    );
    drop(docker);
}
