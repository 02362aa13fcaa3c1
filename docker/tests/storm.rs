//! 200 containers asking one pool for addresses at once, with the driver SIGKILLed in the middle
//! of the storm and started again: no address is given twice, every name that had an address
//! retained gets exactly that one back, and a request whose answer was lost with the driver is
//! answered with the same address when the engine asks again.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::{Driver, address_of, scratch, wait_for};

const STORM: usize = 200;
const RETAINED: usize = 50;
/// Retained names that do not come back during the storm.
const IDLE: usize = 20;
/// The driver is killed once this many answers have arrived.
const KILL_AFTER: usize = 60;

fn request(pool_id: &str, name: &str) -> String {
    format!(
        r#"{{"PoolID":"{pool_id}","Address":"","Options":{{"com.docker.network.endpoint.name":"{name}"}}}}"#
    )
}

#[test]
fn two_hundred_requests_with_the_driver_killed_mid_storm() {
    let dir = scratch("storm");
    let mut d = Driver::start(dir.path(), &[]);
    let pool = d.ok(
        "/IpamDriver.RequestPool",
        r#"{"AddressSpace":"ipkeep-local","Pool":"198.18.20.0/24","SubPool":"","Options":null,"V6":false}"#,
    );
    let id = pool["PoolID"].as_str().unwrap().to_owned();
    d.ok("/IpamDriver.RequestAddress", &format!(r#"{{"PoolID":"{id}","Address":"","Options":{{"RequestAddressType":"com.docker.network.gateway"}}}}"#));
    // Fifty containers ran and were stopped: their addresses are retained for their names.
    let mut retained = BTreeMap::new();
    for i in 0..RETAINED {
        let name = format!("keep-{i}");
        let ip = address_of(&d.ok("/IpamDriver.RequestAddress", &request(&id, &name)));
        d.ok(
            "/IpamDriver.ReleaseAddress",
            &format!(r#"{{"PoolID":"{id}","Address":"{ip}"}}"#),
        );
        retained.insert(name, ip);
    }
    let mut idle = BTreeMap::new();
    for i in 0..IDLE {
        let name = format!("idle-{i}");
        let ip = address_of(&d.ok("/IpamDriver.RequestAddress", &request(&id, &name)));
        d.ok(
            "/IpamDriver.ReleaseAddress",
            &format!(r#"{{"PoolID":"{id}","Address":"{ip}"}}"#),
        );
        idle.insert(name, ip);
    }

    let answered = Arc::new(AtomicUsize::new(0));
    let answers = Arc::new(Mutex::new(BTreeMap::<String, Vec<String>>::new()));
    let lost = Arc::new(AtomicUsize::new(0));
    let socket = d.socket.clone();
    let threads: Vec<_> = (0..STORM)
        .map(|i| {
            let name = if i < RETAINED {
                format!("keep-{i}")
            } else {
                format!("new-{i}")
            };
            let (answered, answers, lost) = (answered.clone(), answers.clone(), lost.clone());
            let (socket, body) = (socket.clone(), request(&id, &name));
            std::thread::spawn(move || {
                let start = Instant::now();
                // The engine's plugin client retries a request whose connection failed.
                loop {
                    match support::call(&socket, "/IpamDriver.RequestAddress", &body) {
                        Ok((200, answer)) => {
                            answers
                                .lock()
                                .unwrap()
                                .entry(name)
                                .or_default()
                                .push(address_of(&answer));
                            answered.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                        Ok((status, answer)) => panic!("{name}: {status} {answer}"),
                        Err(_) => {
                            lost.fetch_add(1, Ordering::SeqCst);
                            assert!(
                                start.elapsed() < Duration::from_secs(120),
                                "{name}: no answer in 120 s"
                            );
                            std::thread::sleep(Duration::from_millis(20));
                        }
                    }
                }
            })
        })
        .collect();
    wait_for(
        "the first answers of the storm",
        Duration::from_secs(60),
        || answered.load(Ordering::SeqCst) >= KILL_AFTER,
    );
    d.kill();
    let at_kill = answered.load(Ordering::SeqCst);
    d.restart();
    for t in threads {
        t.join().unwrap();
    }
    eprintln!(
        "storm: {at_kill} answers before SIGKILL, {} after; {} requests failed and were retried",
        STORM - at_kill,
        lost.load(Ordering::SeqCst)
    );
    assert!(
        at_kill < STORM,
        "the driver was killed after the storm, not in it"
    );

    let answers = answers.lock().unwrap();
    assert_eq!(answers.len(), STORM);
    let mut given = BTreeMap::new();
    for (name, ips) in answers.iter() {
        assert_eq!(ips.len(), 1, "{name} was answered {ips:?}");
        if let Some(other) = given.insert(ips[0].clone(), name.clone()) {
            panic!("{} given to both {other} and {name}", ips[0]);
        }
    }
    for (name, ip) in &retained {
        assert_eq!(&answers[name][0], ip, "{name} lost its retained address");
    }

    // The files agree: one allocation per name, each holding the address it was answered, and
    // the names that stayed away still hold theirs.
    let pool_dir = d.data_dir.join("pools").join(&id);
    let mut on_disk = BTreeMap::new();
    for entry in std::fs::read_dir(&pool_dir).unwrap() {
        let entry = entry.unwrap();
        let file = entry.file_name().into_string().unwrap();
        if file.parse::<std::net::IpAddr>().is_ok() {
            let content = std::fs::read_to_string(entry.path()).unwrap();
            let (owner, kind) = content.split_once("\r\n").unwrap();
            if kind == "endpoint" {
                assert!(
                    on_disk.insert(owner.to_owned(), file.clone()).is_none(),
                    "{owner} holds two files"
                );
            }
        }
    }
    let mut want: BTreeMap<String, String> = answers
        .iter()
        .map(|(n, ips)| (n.clone(), ips[0].clone()))
        .collect();
    want.extend(idle.clone());
    assert_eq!(
        on_disk, want,
        "the allocation files differ from the answers and the retentions"
    );
    let distinct: BTreeSet<&String> = on_disk.values().collect();
    assert_eq!(distinct.len(), STORM + IDLE);
    let state: serde_json::Value = serde_json::from_slice(
        &std::fs::read(d.data_dir.join("state").join(format!("{id}.json"))).unwrap(),
    )
    .unwrap();
    let still: BTreeMap<String, String> = state["retained"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(n, r)| (n.clone(), r["ip"].as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(
        still, idle,
        "the retentions of the names that stayed away changed"
    );
}
