//! `make bench-docker`: the driver's `RequestAddress` latency through its socket (a new name, a
//! name getting its retained address back, a request without a name), then `docker run` on a
//! network of the driver beside `docker run` on a network of Docker's built-in IPAM, interleaved
//! on one dockerd started for the run (Debian's docker.io 20.10), so both see the same machine.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use support::dockerd::{Dockerd, IMAGE, legacy_plugin, require_docker};
use support::{address_of, scratch};

const NAMES: usize = 500;
const ROUNDS: usize = 4;
const DOCKER_RUNS: usize = 40;

/// The `q`-quantile of `samples` (nearest rank).
fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort();
    let rank = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
    samples[rank - 1]
}

fn row(what: &str, samples: &mut [Duration]) -> (Duration, Duration) {
    let (p50, p99) = (quantile(samples, 0.50), quantile(samples, 0.99));
    println!(
        "{what:<44} {:>6} {:>10.3} {:>10.3}",
        samples.len(),
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3
    );
    (p50, p99)
}

fn timed(f: impl FnOnce()) -> Duration {
    let start = Instant::now();
    f();
    start.elapsed()
}

fn main() {
    require_docker("make bench-docker");
    let dir = scratch("bench");
    let (name, _socket, driver) = legacy_plugin(dir.path(), "ipkeep-b", &[]);

    // 1. The socket: RequestAddress as Engine 29 sends it.
    let pool = driver.ok(
        "/IpamDriver.RequestPool",
        r#"{"AddressSpace":"ipkeep-local","Pool":"198.18.40.0/22","SubPool":"","Options":null,"V6":false}"#,
    );
    let id = pool["PoolID"].as_str().unwrap().to_owned();
    let request = |name: Option<&str>| match name {
        Some(n) => format!(
            r#"{{"PoolID":"{id}","Address":"","Options":{{"com.docker.network.endpoint.name":"{n}"}}}}"#
        ),
        None => format!(r#"{{"PoolID":"{id}","Address":"","Options":null}}"#),
    };
    let release = |ip: &str| format!(r#"{{"PoolID":"{id}","Address":"{ip}"}}"#);
    let (mut fresh, mut returning, mut unnamed, mut releases) = (vec![], vec![], vec![], vec![]);
    for round in 0..ROUNDS {
        for i in 0..NAMES {
            let body = request(Some(&format!("c{i}")));
            let mut answer = serde_json::Value::Null;
            let took = timed(|| answer = driver.ok("/IpamDriver.RequestAddress", &body));
            if round == 0 {
                fresh.push(took)
            } else {
                returning.push(took)
            }
            let ip = address_of(&answer);
            releases.push(timed(|| {
                driver.ok("/IpamDriver.ReleaseAddress", &release(&ip));
            }));
        }
        for _ in 0..NAMES / 4 {
            let mut answer = serde_json::Value::Null;
            unnamed.push(timed(|| {
                answer = driver.ok("/IpamDriver.RequestAddress", &request(None))
            }));
            driver.ok("/IpamDriver.ReleaseAddress", &release(&address_of(&answer)));
        }
    }
    println!(
        "ipkeep-docker {} through its socket, one request at a time (ms):",
        support::driver_binary().display()
    );
    println!("{:<44} {:>6} {:>10} {:>10}", "call", "n", "p50", "p99");
    row("RequestAddress, a new name", &mut fresh);
    row("RequestAddress, a name's retained address", &mut returning);
    row("RequestAddress, no name (engines before 29)", &mut unnamed);
    row("ReleaseAddress (a named address: retained)", &mut releases);

    // 2. docker run: the driver beside Docker's built-in IPAM, interleaved.
    let docker = Dockerd::start(dir.path(), "bench");
    docker.network_on(&name, "198.18.44.0/24", "viaipkeep", &[]);
    docker.ok(&["network", "create", "--subnet", "198.18.45.0/24", "builtin"]);
    let (mut with_ipkeep, mut with_builtin) = (vec![], vec![]);
    for i in 0..DOCKER_RUNS + 2 {
        for (network, samples) in [
            ("viaipkeep", &mut with_ipkeep),
            ("builtin", &mut with_builtin),
        ] {
            let container = format!("{network}-{i}");
            let took = timed(|| {
                docker.ok(&[
                    "run",
                    "-d",
                    "--name",
                    &container,
                    "--network",
                    network,
                    IMAGE,
                    "sleep",
                    "600",
                ]);
            });
            docker.ok(&["rm", "-f", &container]);
            if i >= 2 {
                samples.push(took); // the first two warm the daemon up
            }
        }
    }
    println!("\n`docker run -d` on dockerd 20.10, same run, interleaved (ms):");
    println!("{:<44} {:>6} {:>10} {:>10}", "network", "n", "p50", "p99");
    let (ip50, ip99) = row("--ipam-driver ipkeep-docker", &mut with_ipkeep);
    let (bp50, bp99) = row("Docker's built-in IPAM", &mut with_builtin);
    println!(
        "ratio ipkeep / built-in: p50 {:.2}, p99 {:.2}",
        ip50.as_secs_f64() / bp50.as_secs_f64(),
        ip99.as_secs_f64() / bp99.as_secs_f64()
    );
    drop(docker);
}
