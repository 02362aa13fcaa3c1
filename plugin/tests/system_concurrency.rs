//! Many plugin processes at once on one network: the flock must serialise them so that no address
//! is handed out twice, every result matches the files, and nothing is lost or left behind.
//! Each scenario runs against ipkeep and, as the reference, against host-local.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
mod system_support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::{Arc, Barrier};

use common::CniCall;
use system_support::{
    Holder, Rng, Scratch, allocations, describe, finish, net_config, release, result_ips,
};

const NETWORK: &str = "sysnet";

/// Starts every call held, then releases them all, so they really run at the same time.
fn run_at_once(calls: &[CniCall], binary: &Path) -> Vec<common::CniOutcome> {
    let mut children: Vec<_> = calls.iter().map(|call| call.spawn_held(binary)).collect();
    for (child, call) in children.iter_mut().zip(calls) {
        release(child, &call.stdin);
    }
    children.into_iter().map(finish).collect()
}

fn hundred_adds_on_a_24(binary: &Path) {
    let scratch = Scratch::new();
    let config = net_config(
        "1.0.0",
        NETWORK,
        scratch.path(),
        serde_json::json!({ "subnet": "198.18.0.0/24" }),
    );
    let calls: Vec<_> = (0..100)
        .map(|i| CniCall::new("ADD", &format!("c{i:03}"), &config))
        .collect();

    let outcomes = run_at_once(&calls, binary);

    let mut handed_out = BTreeMap::new();
    for (call, outcome) in calls.iter().zip(&outcomes) {
        let ips = result_ips(&outcome.ok());
        assert_eq!(
            ips.len(),
            1,
            "one range set, one address: {}",
            describe(outcome)
        );
        let id = call.container_id.clone().unwrap();
        if let Some(other) = handed_out.insert(ips[0], id.clone()) {
            panic!("{} handed out to both {other} and {id}", ips[0]);
        }
    }
    assert_eq!(handed_out.len(), 100);
    let on_disk: BTreeMap<_, _> = allocations(&scratch.path().join(NETWORK))
        .into_iter()
        .map(|(ip, holder)| {
            assert_eq!(
                holder,
                Holder::attachment(holder.id(), "eth0"),
                "file {ip} has the wrong format"
            );
            (ip, holder.id().to_owned())
        })
        .collect();
    assert_eq!(
        on_disk, handed_out,
        "the IP files must be exactly the results"
    );
}

#[test]
fn hundred_concurrent_adds_get_distinct_addresses_ipkeep() {
    hundred_adds_on_a_24(&common::ipkeep());
}

#[test]
fn hundred_concurrent_adds_get_distinct_addresses_host_local() {
    hundred_adds_on_a_24(&common::host_local());
}

fn hundred_adds_on_a_nearly_full_range(binary: &Path) {
    // 198.18.1.10 ..= 198.18.1.119: 110 addresses; the gateway (.1) lies outside the range.
    let range: Vec<IpAddr> = (10..=119)
        .map(|last| IpAddr::V4(Ipv4Addr::new(198, 18, 1, last)))
        .collect();
    let scratch = Scratch::new();
    let net_dir = scratch.path().join(NETWORK);
    std::fs::create_dir_all(&net_dir).unwrap();
    let mut rng = Rng::new(0x1f_u64);
    let mut shuffled = range.clone();
    rng.shuffle(&mut shuffled);
    let preallocated: BTreeMap<IpAddr, Holder> = shuffled[..20]
        .iter()
        .enumerate()
        .map(|(i, ip)| (*ip, Holder::attachment(&format!("pre{i}"), "eth0")))
        .collect();
    for (ip, holder) in &preallocated {
        // Exactly what host-local writes, so ipkeep must pick these up from the files alone.
        std::fs::write(
            net_dir.join(ip.to_string()),
            format!("{}\r\neth0", holder.id()),
        )
        .unwrap();
    }
    let config = net_config(
        "1.0.0",
        NETWORK,
        scratch.path(),
        serde_json::json!({ "ranges": [[{ "subnet": "198.18.1.0/24", "rangeStart": "198.18.1.10", "rangeEnd": "198.18.1.119" }]] }),
    );
    let calls: Vec<_> = (0..100)
        .map(|i| CniCall::new("ADD", &format!("c{i:03}"), &config))
        .collect();

    let outcomes = run_at_once(&calls, binary);

    let mut handed_out = BTreeMap::new();
    let mut full = 0;
    for (call, outcome) in calls.iter().zip(&outcomes) {
        if outcome.code == Some(0) {
            let ips = result_ips(&outcome.ok());
            assert_eq!(ips.len(), 1, "{}", describe(outcome));
            let holder = Holder::attachment(call.container_id.as_deref().unwrap(), "eth0");
            assert!(
                handed_out.insert(ips[0], holder).is_none(),
                "{} handed out twice",
                ips[0]
            );
        } else {
            let msg = outcome.err(999);
            assert_eq!(
                msg,
                "failed to allocate for range 0: no IP addresses available in range set: 198.18.1.10-198.18.1.119",
                "the only acceptable failure is a full range"
            );
            full += 1;
        }
    }
    let free: BTreeSet<IpAddr> = range
        .iter()
        .copied()
        .filter(|ip| !preallocated.contains_key(ip))
        .collect();
    assert_eq!(
        handed_out.keys().copied().collect::<BTreeSet<_>>(),
        free,
        "exactly the free addresses are handed out"
    );
    assert_eq!(
        full, 10,
        "every ADD beyond the free addresses gets the range-full error"
    );
    let mut expected = preallocated;
    expected.extend(handed_out);
    assert_eq!(
        allocations(&net_dir),
        expected,
        "pre-allocated files untouched, one file per successful ADD"
    );
}

#[test]
fn hundred_concurrent_adds_on_a_nearly_full_range_ipkeep() {
    hundred_adds_on_a_nearly_full_range(&common::ipkeep());
}

#[test]
fn hundred_concurrent_adds_on_a_nearly_full_range_host_local() {
    hundred_adds_on_a_nearly_full_range(&common::host_local());
}

/// One container's life in the storm: ADD, then alternately DEL/ADD; sometimes a repeated DEL
/// (runtimes retry DEL, and it must succeed).
fn life(rng: &mut Rng) -> Vec<&'static str> {
    let mut ops = vec!["ADD"];
    for step in 0..rng.below(4) {
        ops.push(if step % 2 == 0 { "DEL" } else { "ADD" });
    }
    if ops.last() == Some(&"DEL") && rng.chance(20) {
        ops.push("DEL");
    }
    ops
}

fn add_del_storm(binary: &Path, seed: u64) {
    let scratch = Scratch::new();
    let config = net_config(
        "0.4.0",
        NETWORK,
        scratch.path(),
        serde_json::json!({ "subnet": "198.18.2.0/24" }),
    );
    let mut rng = Rng::new(seed);
    let lives: Vec<_> = (0..100).map(|_| life(&mut rng)).collect();
    let processes: usize = lives.iter().map(Vec::len).sum();
    assert!(
        processes >= 200,
        "seed {seed} gives only {processes} processes"
    );

    let barrier = Arc::new(Barrier::new(lives.len()));
    let threads: Vec<_> = lives
        .into_iter()
        .enumerate()
        .map(|(i, ops)| {
            let (barrier, config, binary) = (barrier.clone(), config.clone(), binary.to_owned());
            std::thread::spawn(move || {
                let id = format!("storm{i:03}");
                // Two interface names, so files are told apart by ifname as well as by ID.
                let ifname = if i % 3 == 0 { "net1" } else { "eth0" };
                barrier.wait();
                let mut held = None;
                for op in ops {
                    let outcome = CniCall::new(op, &id, &config).ifname(ifname).run(&binary);
                    let result = outcome.ok();
                    held = (op == "ADD").then(|| result_ips(&result)[0]);
                }
                (id, ifname, held)
            })
        })
        .collect();
    let mut expected = BTreeMap::new();
    for thread in threads {
        let (id, ifname, held) = thread.join().unwrap();
        if let Some(ip) = held {
            assert!(
                expected
                    .insert(ip, Holder::attachment(&id, ifname))
                    .is_none(),
                "{ip} handed out to two live containers"
            );
        }
    }
    assert!(
        !expected.is_empty() && expected.len() < 100,
        "seed {seed} must leave some but not all containers"
    );
    assert_eq!(
        allocations(&scratch.path().join(NETWORK)),
        expected,
        "exactly one file per live container, naming it"
    );
}

#[test]
fn add_del_storm_leaves_one_file_per_live_container_ipkeep() {
    add_del_storm(&common::ipkeep(), 0x5eed_0001);
}

#[test]
fn add_del_storm_leaves_one_file_per_live_container_host_local() {
    add_del_storm(&common::host_local(), 0x5eed_0001);
}

/// A node in the middle of switching plugins: ipkeep and host-local processes work on the same
/// network directory at the same time (they share the flock), then each container is deleted by
/// the *other* plugin. ipkeep must notice host-local's changes (its index is only a cache).
#[test]
fn ipkeep_and_host_local_side_by_side_on_one_network() {
    let (ipkeep, host_local) = (common::ipkeep(), common::host_local());
    let scratch = Scratch::new();
    let net_dir = scratch.path().join(NETWORK);
    let config = net_config(
        "1.0.0",
        NETWORK,
        scratch.path(),
        serde_json::json!({ "subnet": "198.18.6.0/24" }),
    );
    let plugin_for = |i: usize| {
        if i.is_multiple_of(2) {
            &ipkeep
        } else {
            &host_local
        }
    };
    let calls: Vec<_> = (0..100)
        .map(|i| CniCall::new("ADD", &format!("m{i:03}"), &config))
        .collect();

    let mut children: Vec<_> = calls
        .iter()
        .enumerate()
        .map(|(i, call)| call.spawn_held(plugin_for(i)))
        .collect();
    for (child, call) in children.iter_mut().zip(&calls) {
        release(child, &call.stdin);
    }
    let mut expected = BTreeMap::new();
    for (call, child) in calls.iter().zip(children) {
        let outcome = finish(child);
        let ips = result_ips(&outcome.ok());
        let holder = Holder::attachment(call.container_id.as_deref().unwrap(), "eth0");
        assert!(
            expected.insert(ips[0], holder).is_none(),
            "{} handed out twice",
            ips[0]
        );
    }
    assert_eq!(
        allocations(&net_dir),
        expected,
        "the files are exactly the results of both plugins"
    );

    let dels: Vec<_> = calls
        .iter()
        .map(|call| {
            let mut del = call.clone();
            del.command = Some("DEL".to_owned());
            del
        })
        .collect();
    let mut children: Vec<_> = dels
        .iter()
        .enumerate()
        .map(|(i, call)| call.spawn_held(plugin_for(i + 1)))
        .collect();
    for (child, call) in children.iter_mut().zip(&dels) {
        release(child, &call.stdin);
    }
    for child in children {
        finish(child).ok();
    }
    assert!(
        allocations(&net_dir).is_empty(),
        "each plugin frees what the other allocated"
    );

    // And ipkeep keeps working on the directory host-local last touched.
    let add = CniCall::new("ADD", "after", &config).run(&ipkeep).ok();
    assert_eq!(
        allocations(&net_dir),
        BTreeMap::from([(result_ips(&add)[0], Holder::attachment("after", "eth0"))])
    );
}
