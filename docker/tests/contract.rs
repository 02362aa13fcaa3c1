//! The driver against the requests Docker Engine 29 sends, byte for byte (moby
//! `libnetwork/ipams/remote`: POST, no Content-Type, Go's JSON with a trailing newline, an empty
//! body for calls without arguments, `Options` null when the engine has none), in the order the
//! engine sends them for `docker network create`, `docker run`/`stop`/`start`, a Compose
//! recreate, `docker network rm`, and a driver restart the engine knows nothing of.
//!
//! Docker 20.10 (the engine the real-dockerd test runs) sends no endpoint name: stickiness by
//! name is proven here, by replaying what Engine ≥ 29 sends.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use support::{Driver, address_of, scratch, snapshot, wait_for};

const SPACES: &str = "/IpamDriver.GetDefaultAddressSpaces";
const REQUEST_POOL: &str = "/IpamDriver.RequestPool";
const RELEASE_POOL: &str = "/IpamDriver.ReleasePool";
const REQUEST_ADDRESS: &str = "/IpamDriver.RequestAddress";
const RELEASE_ADDRESS: &str = "/IpamDriver.ReleaseAddress";

/// `RequestPool` as the engine encodes it (`--subnet`, `--ip-range`, `--ipam-opt`).
fn request_pool(pool: &str, sub_pool: &str, options: &str) -> String {
    format!(
        r#"{{"AddressSpace":"ipkeep-local","Pool":"{pool}","SubPool":"{sub_pool}","Options":{options},"V6":false}}"#
    )
}

/// `RequestAddress` for the gateway (`--gateway`, or empty for the driver's choice).
fn request_gateway(pool_id: &str, address: &str) -> String {
    format!(
        r#"{{"PoolID":"{pool_id}","Address":"{address}","Options":{{"RequestAddressType":"com.docker.network.gateway"}}}}"#
    )
}

/// `RequestAddress` for an aux address (`--aux-address`): no options.
fn request_aux(pool_id: &str, address: &str) -> String {
    format!(r#"{{"PoolID":"{pool_id}","Address":"{address}","Options":null}}"#)
}

/// `RequestAddress` for a container (Engine ≥ 29: its name; `--ip` in `address`).
fn request_container(pool_id: &str, name: &str, address: &str) -> String {
    format!(
        r#"{{"PoolID":"{pool_id}","Address":"{address}","Options":{{"com.docker.network.endpoint.name":"{name}"}}}}"#
    )
}

/// `ReleaseAddress`.
fn release(pool_id: &str, address: &str) -> String {
    format!(r#"{{"PoolID":"{pool_id}","Address":"{address}"}}"#)
}

/// `docker network create --subnet … --gateway … --aux-address …`: the pool's ID.
fn network_create(d: &Driver, subnet: &str, options: &str, gateway: &str, aux: &[&str]) -> String {
    d.ok(SPACES, "");
    let pool = d.ok(REQUEST_POOL, &request_pool(subnet, "", options));
    assert_eq!(pool["Pool"], subnet);
    assert_eq!(pool["Data"], serde_json::json!({}));
    let id = pool["PoolID"].as_str().unwrap().to_owned();
    let gw = d.ok(REQUEST_ADDRESS, &request_gateway(&id, gateway));
    if !gateway.is_empty() {
        assert_eq!(address_of(&gw), gateway);
    }
    for a in aux {
        assert_eq!(address_of(&d.ok(REQUEST_ADDRESS, &request_aux(&id, a))), *a);
    }
    id
}

#[test]
fn calls_without_arguments_answer_json() {
    let dir = scratch("noargs");
    let d = Driver::start(dir.path(), &[]);
    assert_eq!(
        d.ok("/Plugin.Activate", ""),
        serde_json::json!({"Implements": ["IpamDriver"]})
    );
    assert_eq!(
        d.ok("/IpamDriver.GetCapabilities", ""),
        serde_json::json!({"RequiresMACAddress": false, "RequiresRequestReplay": false})
    );
    assert_eq!(
        d.ok(SPACES, ""),
        serde_json::json!({"LocalDefaultAddressSpace": "ipkeep-local", "GlobalDefaultAddressSpace": "ipkeep-global"})
    );
    // Releases answer an empty object, not an empty body.
    let id = network_create(&d, "198.18.3.0/24", "null", "", &[]);
    assert_eq!(
        d.ok(RELEASE_ADDRESS, &release(&id, "198.18.3.1")),
        serde_json::json!({})
    );
    assert_eq!(
        d.ok(RELEASE_POOL, &format!(r#"{{"PoolID":"{id}"}}"#)),
        serde_json::json!({})
    );
}

#[test]
fn a_container_gets_its_address_back_through_stop_recreate_network_rm_and_driver_restart() {
    let dir = scratch("lifecycle");
    let mut d = Driver::start(dir.path(), &[]);
    // docker network create --ipam-driver ipkeep --subnet 198.18.7.0/24 --gateway 198.18.7.254
    //   --aux-address router=198.18.7.250 --ipam-opt ipkeep.dev/retain-for=1h
    let opts = r#"{"ipkeep.dev/retain-for":"1h"}"#;
    let id = network_create(&d, "198.18.7.0/24", opts, "198.18.7.254", &["198.18.7.250"]);
    assert_eq!(
        id, "ipkeep-local_198.18.7.0-24",
        "pool IDs are deterministic"
    );

    // docker run --name web … ; docker run --name db …
    let web = address_of(&d.ok(REQUEST_ADDRESS, &request_container(&id, "web", "")));
    let db = address_of(&d.ok(REQUEST_ADDRESS, &request_container(&id, "db", "")));
    assert_eq!(
        (web.as_str(), db.as_str()),
        ("198.18.7.1", "198.18.7.2"),
        "gateway .254 leaves .1 free"
    );

    // docker stop web: released, retained for "web"; others never get it meanwhile.
    d.ok(RELEASE_ADDRESS, &release(&id, &web));
    for n in 0..5 {
        let other = address_of(&d.ok(
            REQUEST_ADDRESS,
            &request_container(&id, &format!("other{n}"), ""),
        ));
        assert_ne!(other, web, "a retained address went to another name");
    }
    let refused = d.err(REQUEST_ADDRESS, &request_container(&id, "intruder", &web));
    assert!(
        refused.starts_with("failed to give 198.18.7.1: it is retained for container web until "),
        "{refused}"
    );
    // docker start web
    assert_eq!(
        address_of(&d.ok(REQUEST_ADDRESS, &request_container(&id, "web", ""))),
        web
    );

    // docker compose up --force-recreate: the old container is stopped (released) and the new one
    // requests under the final name.
    d.ok(RELEASE_ADDRESS, &release(&id, &db));
    assert_eq!(
        address_of(&d.ok(REQUEST_ADDRESS, &request_container(&id, "db", ""))),
        db
    );

    // --ip: honoured when free, refused when another name holds it, given back to its holder.
    assert_eq!(
        address_of(&d.ok(
            REQUEST_ADDRESS,
            &request_container(&id, "pinned", "198.18.7.100")
        )),
        "198.18.7.100"
    );
    let refused = d.err(REQUEST_ADDRESS, &request_container(&id, "pinned2", &db));
    assert_eq!(
        refused,
        "failed to give 198.18.7.2: it is in use by container db"
    );
    assert_eq!(
        address_of(&d.ok(REQUEST_ADDRESS, &request_container(&id, "db", &db))),
        db
    );

    // docker network rm (containers stopped first): every address released, then the pool.
    for a in [
        web.as_str(),
        db.as_str(),
        "198.18.7.100",
        "198.18.7.250",
        "198.18.7.254",
    ] {
        d.ok(RELEASE_ADDRESS, &release(&id, a));
    }
    d.ok(RELEASE_POOL, &format!(r#"{{"PoolID":"{id}"}}"#));

    // The driver restarts (an upgrade, a crash): the engine replays nothing.
    d.kill();
    d.restart();

    // docker network create again with the same subnet (compose down / up): same pool, and every
    // name gets its address back.
    let again = network_create(&d, "198.18.7.0/24", opts, "198.18.7.254", &["198.18.7.250"]);
    assert_eq!(again, id);
    for (name, want) in [
        ("db", db.as_str()),
        ("web", web.as_str()),
        ("pinned", "198.18.7.100"),
    ] {
        assert_eq!(
            address_of(&d.ok(REQUEST_ADDRESS, &request_container(&id, name, ""))),
            want,
            "{name}"
        );
    }

    // A crash that lost the release: the same name asks again while its lease is still in use.
    d.kill();
    d.restart();
    assert_eq!(
        address_of(&d.ok(REQUEST_ADDRESS, &request_container(&id, "web", ""))),
        web
    );

    let listed = list(&d.data_dir);
    for line in [
        "ipkeep-local_198.18.7.0-24  198.18.7.1    web",
        "ipkeep-local_198.18.7.0-24  198.18.7.254  (gateway)",
        "ipkeep-local_198.18.7.0-24  198.18.7.250  (no name)",
    ] {
        assert!(listed.contains(line), "{line:?} missing from:\n{listed}");
    }
}

#[test]
fn retention_ends_and_the_address_is_free_again() {
    let dir = scratch("expiry");
    let d = Driver::start(dir.path(), &[]);
    let id = network_create(
        &d,
        "198.18.8.0/24",
        r#"{"ipkeep.dev/retain-for":"1s"}"#,
        "",
        &[],
    );
    let web = address_of(&d.ok(REQUEST_ADDRESS, &request_container(&id, "web", "")));
    d.ok(RELEASE_ADDRESS, &release(&id, &web));
    wait_for(
        "web's one-second retention to end",
        Duration::from_secs(30),
        || {
            support::call(
                &d.socket,
                REQUEST_ADDRESS,
                &request_container(&id, "next", &web),
            )
            .is_ok_and(|(status, _)| status == 200)
        },
    );
    assert_eq!(
        address_of(&d.ok(REQUEST_ADDRESS, &request_container(&id, "web", ""))),
        "198.18.8.3",
        "after its retention web is a new container"
    );
}

#[test]
fn pools_of_the_drivers_choosing_are_distinct_and_run_out_clearly() {
    let dir = scratch("auto");
    let d = Driver::start(dir.path(), &["--auto-pools", "198.19.4.0/23:24"]);
    let auto =
        r#"{"AddressSpace":"ipkeep-local","Pool":"","SubPool":"","Options":null,"V6":false}"#;
    // The engine keeps asking (holding each answer) while answers overlap its other networks.
    let first = d.ok(REQUEST_POOL, auto);
    let second = d.ok(REQUEST_POOL, auto);
    assert_eq!(first["Pool"], "198.19.4.0/24");
    assert_eq!(second["Pool"], "198.19.5.0/24");
    let refused = d.err(REQUEST_POOL, auto);
    assert_eq!(
        refused,
        "failed to choose a pool: every candidate in 198.19.4.0/23:24 is in use; give the network a --subnet"
    );
    d.ok(
        RELEASE_POOL,
        &format!(r#"{{"PoolID":"{}"}}"#, first["PoolID"].as_str().unwrap()),
    );
    assert_eq!(d.ok(REQUEST_POOL, auto)["Pool"], "198.19.4.0/24");
    let v6 = r#"{"AddressSpace":"ipkeep-local","Pool":"","SubPool":"","Options":null,"V6":true}"#;
    assert!(d.err(REQUEST_POOL, v6).contains("IPv6"));
}

#[test]
fn sub_pools_keep_the_gateway_and_aux_addresses_outside_the_range() {
    let dir = scratch("subpool");
    let d = Driver::start(dir.path(), &[]);
    // --subnet 198.18.16.0/22 --ip-range 198.18.17.0/24, default gateway, aux outside the range.
    let pool = d.ok(
        REQUEST_POOL,
        &request_pool("198.18.16.0/22", "198.18.17.0/24", "null"),
    );
    let id = pool["PoolID"].as_str().unwrap();
    assert_eq!(id, "ipkeep-local_198.18.16.0-22_198.18.17.0-24");
    assert_eq!(
        d.ok(REQUEST_ADDRESS, &request_gateway(id, ""))["Address"],
        "198.18.16.1/22"
    );
    assert_eq!(
        d.ok(REQUEST_ADDRESS, &request_aux(id, "198.18.18.9"))["Address"],
        "198.18.18.9/22"
    );
    assert_eq!(
        d.ok(REQUEST_ADDRESS, &request_container(id, "web", ""))["Address"],
        "198.18.17.0/22"
    );
    let outside = d.err(
        REQUEST_ADDRESS,
        &request_container(id, "db", "198.18.18.10"),
    );
    assert!(
        outside.contains("outside the container range 198.18.17.0-198.18.17.255"),
        "{outside}"
    );
}

/// Hostile input: each is refused with a clear error, the driver stays up, nothing changes.
#[test]
fn hostile_input_is_refused_and_changes_nothing() {
    let dir = scratch("hostile");
    let mut d = Driver::start(dir.path(), &[]);
    let id = network_create(&d, "198.18.9.0/24", "null", "", &[]);
    d.ok(REQUEST_ADDRESS, &request_container(&id, "web", ""));
    let db = address_of(&d.ok(REQUEST_ADDRESS, &request_container(&id, "db", "")));
    d.ok(RELEASE_ADDRESS, &release(&id, &db));
    // A host-local file and a symlink planted in the pool: never the driver's to release.
    let pool_dir = d.data_dir.join("pools").join(&id);
    std::fs::write(pool_dir.join("198.18.9.77"), "c1\r\neth0").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", pool_dir.join("198.18.9.78")).unwrap();
    let before = snapshot(&d.data_dir);
    assert!(before.len() >= 5, "{before:?}");

    let unknown = "ipkeep-local_198.19.99.0-24";
    let cases: Vec<(&str, String, &str)> = vec![
        (
            REQUEST_ADDRESS,
            r#"{"PoolID":"#.into(),
            "failed to parse the body of /IpamDriver.RequestAddress: EOF",
        ),
        (
            REQUEST_ADDRESS,
            r#"{"PoolID":5,"Address":""}"#.into(),
            "failed to parse the body",
        ),
        (REQUEST_ADDRESS, "".into(), "failed to parse the body"),
        (RELEASE_ADDRESS, "[]".into(), "failed to parse the body"),
        (
            REQUEST_ADDRESS,
            request_container(unknown, "web", ""),
            "failed to find pool ipkeep-local_198.19.99.0-24: it was never requested",
        ),
        (
            RELEASE_POOL,
            format!(r#"{{"PoolID":"{unknown}"}}"#),
            "it was never requested",
        ),
        (
            REQUEST_ADDRESS,
            request_container("../../etc", "web", ""),
            "failed to find pool \"../../etc\": not a pool ID",
        ),
        (
            REQUEST_ADDRESS,
            request_container(&format!("{id}/../x"), "web", ""),
            "not a pool ID",
        ),
        (
            RELEASE_ADDRESS,
            release("..", "198.18.9.1"),
            "not a pool ID",
        ),
        (
            REQUEST_ADDRESS,
            request_container(&id, "web2", "192.0.2.9"),
            "failed to use address 192.0.2.9: it is outside pool 198.18.9.0/24",
        ),
        (
            RELEASE_ADDRESS,
            release(&id, "192.0.2.9"),
            "it is outside pool 198.18.9.0/24",
        ),
        (
            RELEASE_ADDRESS,
            release(&id, "not-an-ip"),
            "failed to parse address \"not-an-ip\"",
        ),
        (
            REQUEST_ADDRESS,
            request_container(&id, "web2", "198.18.9.999"),
            "failed to parse address",
        ),
        (
            REQUEST_ADDRESS,
            request_container(&id, "a/b", ""),
            "failed to use endpoint name \"a/b\"",
        ),
        (
            REQUEST_ADDRESS,
            request_container(&id, "..", ""),
            "failed to use endpoint name \"..\"",
        ),
        (
            REQUEST_ADDRESS,
            request_container(&id, "../../etc/passwd", ""),
            "failed to use endpoint name",
        ),
        (
            REQUEST_ADDRESS,
            request_container(&id, &"x".repeat(300), ""),
            "failed to use endpoint name",
        ),
        (
            REQUEST_ADDRESS,
            request_container(&id, "intruder", &db),
            "it is retained for container db",
        ),
        (
            REQUEST_POOL,
            request_pool("198.18.9.1/24", "", "null"),
            "Network has host bits set",
        ),
        (
            REQUEST_POOL,
            request_pool(
                "198.18.9.0/24",
                "",
                r#"{"ipkeep.dev/retain-for":"forever"}"#,
            ),
            "failed to use option ipkeep.dev/retain-for: failed to parse retention \"forever\"",
        ),
        (
            REQUEST_POOL,
            r#"{"AddressSpace":"../x","Pool":"198.18.9.0/24"}"#.into(),
            "failed to use address space \"../x\"",
        ),
        (
            "/IpamDriver.Nope",
            "{}".into(),
            "ipkeep-docker does not serve /IpamDriver.Nope",
        ),
        (
            RELEASE_ADDRESS,
            release(&id, "198.18.9.77"),
            "failed to release 198.18.9.77 in pool ipkeep-local_198.18.9.0-24: its allocation file was not written by ipkeep-docker",
        ),
        (
            RELEASE_ADDRESS,
            release(&id, "198.18.9.78"),
            "was not written by ipkeep-docker",
        ),
        (
            REQUEST_ADDRESS,
            request_container(&id, "web3", "198.18.9.77"),
            "requested IP address 198.18.9.77 is not available",
        ),
        (
            REQUEST_ADDRESS,
            request_container(&id, "web3", "198.18.9.78"),
            "requested IP address 198.18.9.78 is not available",
        ),
    ];
    for (path, body, want) in &cases {
        let err = d.err(path, body);
        assert!(err.contains(want), "{path} {body}: {err:?} lacks {want:?}");
        assert!(d.alive(), "the driver died on {path} {body}");
        assert_eq!(
            snapshot(&d.data_dir),
            before,
            "{path} {body} changed the data directory"
        );
    }
    assert!(
        !d.data_dir.join("pools").join(unknown).exists(),
        "an unknown pool got a directory"
    );

    // A huge body is refused from its Content-Length, before a byte of it is read.
    let huge = format!(
        "POST {REQUEST_ADDRESS} HTTP/1.1\r\nHost: plugin\r\nContent-Length: {}\r\n\r\n{{\"PoolID\":",
        1u64 << 30
    );
    let (status, answer) = support::send_raw(&d.socket, huge.as_bytes()).unwrap();
    assert_eq!(status, 413, "{answer}");
    assert!(
        answer["Err"]
            .as_str()
            .unwrap()
            .contains("larger than the 65536 bytes"),
        "{answer}"
    );
    // So is a chunked body that grows past the cap: cut off at the cap (hyper does not show the
    // chunk-size line, so what is refused is the 65537th byte, not the declared chunk), answered
    // with the same JSON error.
    let chunked = format!(
        "POST {REQUEST_ADDRESS} HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n20000\r\n{}",
        "{".repeat(70_000)
    );
    let (status, answer) = support::send_raw_bytes(&d.socket, chunked.as_bytes()).unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert_eq!(status, 413, "{answer}");
    assert!(answer.contains("larger than the 65536 bytes"), "{answer}");
    // A GET where POST is expected: routed, so a JSON error.
    assert_eq!(
        support::send_raw(
            &d.socket,
            format!("GET {REQUEST_ADDRESS} HTTP/1.1\r\n\r\n").as_bytes()
        )
        .unwrap()
        .0,
        405
    );
    // What is not HTTP never reaches the routing: hyper answers it as HTTP says (RFC 9112 §3:
    // 400 for a request line that does not parse; RFC 6585 §5: 431 for headers over the cap),
    // with an empty body, and closes. The engine's plugin client (moby pkg/plugins) only ever
    // sends well-formed POSTs, so no `Err` body is owed here; the status is.
    let header = format!(
        "POST {REQUEST_ADDRESS} HTTP/1.1\r\nX-Junk: {}\r\n\r\n",
        "j".repeat(1 << 20)
    );
    assert_eq!(
        support::send_raw_bytes(&d.socket, header.as_bytes())
            .unwrap()
            .0,
        431
    );
    assert_eq!(
        support::send_raw_bytes(&d.socket, b"\x00\x01garbage\r\n\r\n")
            .unwrap()
            .0,
        400
    );

    assert!(d.alive(), "the driver died");
    assert_eq!(
        snapshot(&d.data_dir),
        before,
        "hostile input changed the data directory"
    );
    // And it still works: db gets its retained address back.
    assert_eq!(
        address_of(&d.ok(REQUEST_ADDRESS, &request_container(&id, "db", ""))),
        db
    );
    d.kill();
}

/// `--key-by-mac`: the engine (before 29) sends every endpoint's MAC; a pinned MAC gets its
/// address back, and a name (Engine ≥ 29) still wins over a MAC.
#[test]
fn with_key_by_mac_a_pinned_mac_gets_its_address_back() {
    let dir = scratch("mac");
    let d = Driver::start(dir.path(), &["--key-by-mac"]);
    assert_eq!(
        d.ok("/IpamDriver.GetCapabilities", ""),
        serde_json::json!({"RequiresMACAddress": true, "RequiresRequestReplay": false})
    );
    let id = network_create(&d, "198.18.10.0/24", "null", "", &[]);
    let by_mac = |mac: &str| {
        format!(
            r#"{{"PoolID":"{id}","Address":"","Options":{{"com.docker.network.endpoint.macaddress":"{mac}"}}}}"#
        )
    };
    let pinned = address_of(&d.ok(REQUEST_ADDRESS, &by_mac("02:42:c6:12:0a:05")));
    d.ok(RELEASE_ADDRESS, &release(&id, &pinned));
    let other = address_of(&d.ok(REQUEST_ADDRESS, &by_mac("02:42:c6:12:0a:06")));
    assert_ne!(other, pinned);
    let refused = d.err(REQUEST_ADDRESS, &request_container(&id, "web", &pinned));
    assert!(
        refused.starts_with(&format!("failed to give {pinned}: it is retained for container with MAC 02:42:c6:12:0a:05 until ")),
        "{refused}"
    );
    assert_eq!(
        address_of(&d.ok(REQUEST_ADDRESS, &by_mac("02:42:c6:12:0a:05"))),
        pinned
    );
    let bad = d.err(REQUEST_ADDRESS, &by_mac("../../x"));
    assert!(
        bad.starts_with("failed to use MAC address \"../../x\""),
        "{bad}"
    );
}

/// `GET /metrics` is Prometheus text that `promtool check metrics` accepts (Debian package
/// prometheus, installed by scripts/install-deps.sh), counting what was answered.
#[test]
fn metrics_pass_promtool() {
    use std::io::{Read, Write};
    let dir = scratch("metrics");
    let d = Driver::start(dir.path(), &[]);
    let id = network_create(&d, "198.18.11.0/24", "null", "", &[]);
    let web = address_of(&d.ok(REQUEST_ADDRESS, &request_container(&id, "web", "")));
    d.ok(RELEASE_ADDRESS, &release(&id, &web));
    d.err(REQUEST_ADDRESS, &request_container(&id, "a/b", ""));
    let mut stream = std::os::unix::net::UnixStream::connect(&d.socket).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    for line in [
        "ipkeep_docker_requests_total{endpoint=\"IpamDriver.RequestAddress\",outcome=\"success\"} 2",
        "ipkeep_docker_requests_total{endpoint=\"IpamDriver.RequestAddress\",outcome=\"error\"} 1",
        "ipkeep_docker_addresses{pool=\"ipkeep-local_198.18.11.0-24\",state=\"retained\"} 1",
        "ipkeep_docker_addresses{pool=\"ipkeep-local_198.18.11.0-24\",state=\"in_use\"} 1",
    ] {
        assert!(body.contains(line), "{line} missing from:\n{body}");
    }
    let mut promtool = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("failed to run promtool (Debian package prometheus; scripts/install-deps.sh installs it): {e}"));
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn list_prints_only_the_header_and_creates_nothing_without_data() {
    let dir = scratch("emptylist");
    let data = dir.path().join("never");
    assert_eq!(list(&data), "POOL  ADDRESS  NAME  STATE\n");
    assert!(!data.exists(), "list created {}", data.display());
}

/// `ipkeep-docker list --data-dir <data_dir>`, which must succeed: what it printed.
fn list(data_dir: &std::path::Path) -> String {
    let out = std::process::Command::new(support::driver_binary())
        .args(["list", "--data-dir"])
        .arg(data_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "list --data-dir {}: {}",
        data_dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}
