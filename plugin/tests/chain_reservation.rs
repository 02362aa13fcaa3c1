//! Reservations through the real CNI chain: Debian's `bridge` plugin delegating IPAM to `ipkeep`
//! (found through `CNI_PATH`, as a runtime arranges it), network namespaces made with
//! `ip netns add` standing for a pod's old and new sandboxes, and the reservation written with
//! the library writer exactly as the node agent writes it.
//!
//! What must hold on the pod's real interface: a pod re-created under the same namespace/name
//! gets exactly its old IPv4 and IPv6 addresses; no other pod ever gets them, not even as the
//! next round-robin candidate or as the last free address; and when the new sandbox's ADD comes
//! before the old sandbox's DEL (a force-deleted pod), `bridge` passes ipkeep's CNI error 11
//! ("try again later") through unchanged, and the ADD succeeds once the old DEL has run. The
//! host's neighbour entries for an address naming another MAC are removed when the address
//! changes hands (ADD and DEL), and a failure to remove one does not fail the ADD.
//!
//! Needs root (CI runs as root): without it, or when namespaces cannot be made, these tests FAIL
//! with a message saying so. The bridge gets no address and no uplink, and the subnets are from
//! the benchmarking/documentation ranges, so nothing can leave the machine. Namespaces and the
//! bridge are removed by a drop guard, also when an assertion fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod chain_support;
mod common;
mod system_support;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use chain_support::{
    BRIDGE_PLUGIN, Cleanup, addresses_in, ip, require_root_and_bridge, result_cidrs, try_ip, unique,
};
use common::{CniCall, CniOutcome};
use ipkeep_netdir::NetworkDir;
use ipkeep_reservation::{
    FORMAT_VERSION, ReservationFile, Timestamp, read_reservation, write_reservation,
};
use system_support::{Holder, Scratch, allocations, describe};

const NETWORK: &str = "resvnet";
/// The pod that owns the reservation in both tests.
const OWNER: (&str, &str) = ("db", "web-0");

/// One bridge network with ipkeep as its IPAM, and the namespaces (sandboxes) attached to it.
struct Chain {
    /// Dropped first: the namespaces and the bridge go before the scratch directory.
    cleanup: Cleanup,
    _scratch: Scratch,
    /// The bridge's name.
    bridge: String,
    config: String,
    cni_dir: PathBuf,
    data_dir: PathBuf,
}

impl Chain {
    /// A fresh bridge (no address, no uplink) whose IPAM is ipkeep with `ranges`.
    fn new(ranges: serde_json::Value) -> Self {
        Self::with_ipam(ranges, serde_json::json!({}))
    }

    /// As [`Chain::new`], with `extra` keys added to the `ipam` section.
    fn with_ipam(ranges: serde_json::Value, extra: serde_json::Value) -> Self {
        require_root_and_bridge("reservation chain tests");
        let mut cleanup = Cleanup::default();
        let bridge = format!("ikr{}-{}", std::process::id() % 1_000_000, unique());
        cleanup.links.push(bridge.clone());
        let scratch = Scratch::new();
        // CNI_PATH holds only the IPAM plugin, under the name `ipam.type` gives.
        let cni_dir = scratch.path().join("bin");
        std::fs::create_dir(&cni_dir).unwrap();
        std::os::unix::fs::symlink(common::ipkeep(), cni_dir.join("ipkeep")).unwrap();
        let data_dir = scratch.path().join("data");
        let mut config = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": NETWORK,
            "type": "bridge",
            "bridge": &bridge,
            "isGateway": false,
            "ipMasq": false,
            "ipam": { "type": "ipkeep", "ranges": ranges, "dataDir": data_dir },
        });
        for (key, value) in extra.as_object().unwrap() {
            config["ipam"][key] = value.clone();
        }
        let config = config.to_string();
        Self {
            cleanup,
            _scratch: scratch,
            bridge,
            config,
            cni_dir,
            data_dir,
        }
    }

    /// A fresh, uniquely named network namespace; fails the test when it cannot be made.
    fn netns(&mut self, tag: &str) -> String {
        self.cleanup.netns(&format!("r{tag}"))
    }

    fn net_dir(&self) -> PathBuf {
        self.data_dir.join(NETWORK)
    }

    /// Runs `bridge` for `command` on the sandbox `container` in `ns`, with the `CNI_ARGS` a
    /// kubelet passes for pod `namespace/name`.
    fn bridge(&self, command: &str, container: &str, ns: &str, pod: (&str, &str)) -> CniOutcome {
        self.bridge_with(&self.config, command, container, ns, pod)
    }

    /// As [`Chain::bridge`] with `config` on stdin.
    fn bridge_with(
        &self,
        config: &str,
        command: &str,
        container: &str,
        ns: &str,
        pod: (&str, &str),
    ) -> CniOutcome {
        let mut call = CniCall::new(command, container, config).args(&format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={container};K8S_POD_UID=uid-{container}",
            pod.0, pod.1
        ));
        call.netns = Some(format!("/var/run/netns/{ns}"));
        call.path = Some(self.cni_dir.to_str().unwrap().to_owned());
        call.run(Path::new(BRIDGE_PLUGIN))
    }

    /// ADD that must succeed; returns the result's addresses after checking that `eth0` in `ns`
    /// carries exactly them and that the IP files name `container`.
    fn add(&self, container: &str, ns: &str, pod: (&str, &str)) -> Vec<(IpAddr, u64)> {
        self.add_outcome(container, ns, pod).1
    }

    /// As [`Chain::add`], also returning what `bridge` printed.
    fn add_outcome(
        &self,
        container: &str,
        ns: &str,
        pod: (&str, &str),
    ) -> (CniOutcome, Vec<(IpAddr, u64)>) {
        let outcome = self.bridge("ADD", container, ns, pod);
        let result = outcome.ok();
        let mut expected = result_cidrs(&result);
        expected.sort();
        let mut present = addresses_in(ns, "eth0");
        present.sort();
        assert_eq!(
            present, expected,
            "eth0 in {ns} must carry exactly the addresses of the result {result}"
        );
        let files = allocations(&self.net_dir());
        for (addr, _) in &expected {
            assert_eq!(
                files.get(addr),
                Some(&Holder::attachment(container, "eth0")),
                "the IP file for {addr} must name {container}"
            );
        }
        (outcome, expected)
    }

    /// CHECK of `container` with `prev_result` (what its ADD returned), as a runtime runs it.
    fn check(
        &self,
        container: &str,
        ns: &str,
        pod: (&str, &str),
        prev_result: &serde_json::Value,
    ) -> CniOutcome {
        let mut config: serde_json::Value = serde_json::from_str(&self.config).unwrap();
        config["prevResult"] = prev_result.clone();
        self.bridge_with(&config.to_string(), "CHECK", container, ns, pod)
    }

    /// DEL that must succeed and take `eth0` out of `ns`.
    fn del(&self, container: &str, ns: &str, pod: (&str, &str)) {
        self.bridge("DEL", container, ns, pod).ok();
        assert!(
            try_ip(&["-n", ns, "link", "show", "dev", "eth0"]).is_err(),
            "eth0 must be gone from {ns} after DEL of {container}"
        );
        assert!(
            allocations(&self.net_dir())
                .values()
                .all(|holder| holder.id() != container),
            "DEL of {container} must remove all its IP files"
        );
    }

    /// Writes the owner's reservation with the library writer, as the node agent does.
    fn reserve(&self, ips: &[IpAddr], release_time: Option<Timestamp>) {
        let ips = ips.to_vec();
        let dir = NetworkDir::open(&self.data_dir, NETWORK).unwrap();
        write_reservation(
            &dir,
            &ReservationFile {
                version: FORMAT_VERSION,
                namespace: OWNER.0.to_owned(),
                pod: OWNER.1.to_owned(),
                ips,
                release_time,
                uid: "6f1d2c3b-0a9e-4d8c-8b7a-112233445566".to_owned(),
                node_name: Some("chain-node".to_owned()),
                generation: None,
                retain_for_seconds: None,
            }
            .validate()
            .unwrap(),
        )
        .unwrap();
    }

    /// The owner's reservation as the plugin would read it.
    fn reservation(&self) -> Option<ReservationFile> {
        let dir = NetworkDir::open(&self.data_dir, NETWORK).unwrap();
        read_reservation(&dir, OWNER.0, OWNER.1).unwrap()
    }

    /// No IP file for a reserved address names a container outside `owner_containers`.
    fn assert_reserved_untouched(&self, reserved: &[IpAddr], owner_containers: &[&str]) {
        for (addr, holder) in allocations(&self.net_dir()) {
            assert!(
                !reserved.contains(&addr) || owner_containers.contains(&holder.id()),
                "reserved address {addr} is held by {holder:?}, which is not a sandbox of {}/{}",
                OWNER.0,
                OWNER.1
            );
        }
    }
}

/// Three addresses per family, so that "the reserved address is the next candidate" and "the
/// reserved address is the last free one" are both a handful of ADDs away.
fn tiny_dual_stack(third_octet: u8) -> serde_json::Value {
    let v4 = format!("198.18.{third_octet}");
    let v6 = format!("2001:db8:{third_octet}:");
    serde_json::json!([
        [{ "subnet": format!("{v4}.0/24"), "rangeStart": format!("{v4}.10"), "rangeEnd": format!("{v4}.12") }],
        [{ "subnet": format!("{v6}:/64"), "rangeStart": format!("{v6}:10"), "rangeEnd": format!("{v6}:12") }],
    ])
}

fn addr(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// When the agent marks a reservation released: now plus a retention of a day.
fn released_now() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now() + Duration::from_secs(24 * 3600))
}

#[test]
fn recreated_pod_gets_its_addresses_back_on_its_new_interface_and_nobody_else_does() {
    let mut chain = Chain::new(tiny_dual_stack(12));
    let (ns_a, ns_b, ns_c, ns_d, ns_e) = (
        chain.netns("a"),
        chain.netns("b"),
        chain.netns("c"),
        chain.netns("d"),
        chain.netns("e"),
    );
    let (v4, v6) = (addr("198.18.12.10"), addr("2001:db8:12::10"));
    let reserved = [v4, v6];
    let owner_sandboxes = ["web0-old", "web0-new"];

    // The pod's first sandbox gets the first address of each family.
    let first = chain.add("web0-old", &ns_a, OWNER);
    assert_eq!(first, vec![(v4, 24), (v6, 64)]);
    // The agent writes the reservation while the pod is bound, then marks it released.
    chain.reserve(&reserved, None);
    chain.reserve(&reserved, Some(released_now()));
    chain.del("web0-old", &ns_a, OWNER);
    assert!(
        chain.reservation().is_some(),
        "DEL must leave the reservation file alone"
    );

    // Other pods: the round-robin cursor moves past the reserved addresses.
    let other = ("db", "other-0");
    assert_eq!(
        chain.add("other-c", &ns_c, other),
        vec![(addr("198.18.12.11"), 24), (addr("2001:db8:12::11"), 64)]
    );
    let another = ("db", "another-0");
    assert_eq!(
        chain.add("another-d", &ns_d, another),
        vec![(addr("198.18.12.12"), 24), (addr("2001:db8:12::12"), 64)]
    );
    chain.assert_reserved_untouched(&reserved, &owner_sandboxes);

    // Only the reserved addresses are free now: a third pod finds the range full.
    let third = ("db", "third-0");
    let full = chain.bridge("ADD", "third-e1", &ns_e, third);
    let msg = full.err(999);
    assert_eq!(
        msg,
        "failed to allocate for range 0: no IP addresses available in range set: 198.18.12.10-198.18.12.12",
        "the last free address is reserved, so the range is full for others: {}",
        describe(&full)
    );
    assert!(
        addresses_in(&ns_e, "eth0").is_empty(),
        "the failed ADD leaves no address in {ns_e}"
    );
    chain.assert_reserved_untouched(&reserved, &owner_sandboxes);
    // The runtime tears down the failed sandbox.
    chain.del("third-e1", &ns_e, third);

    // Free .12 again: the cursor stands on .12, so the reserved .10 is the next candidate.
    chain.del("another-d", &ns_d, another);
    let cursor = std::fs::read_to_string(chain.net_dir().join("last_reserved_ip.0")).unwrap();
    assert_eq!(
        cursor, "198.18.12.12",
        "premise: the next round-robin candidate is the reserved address"
    );
    assert_eq!(
        chain.add("third-e2", &ns_e, third),
        vec![(addr("198.18.12.12"), 24), (addr("2001:db8:12::12"), 64)],
        "the reserved candidate is skipped"
    );
    chain.assert_reserved_untouched(&reserved, &owner_sandboxes);

    // The pod returns in a new sandbox (new container ID, new namespace): exactly its addresses.
    let (added, back) = chain.add_outcome("web0-new", &ns_b, OWNER);
    assert_eq!(
        back,
        vec![(v4, 24), (v6, 64)],
        "the re-created pod must get exactly its old addresses"
    );
    // The runtime's CHECK (bridge checks the interface, ipkeep the allocation) accepts it.
    let checked = chain.check("web0-new", &ns_b, OWNER, &added.json());
    assert_eq!(
        checked.code,
        Some(0),
        "CHECK of the sandbox holding its reserved addresses must pass: {}",
        describe(&checked)
    );

    for (container, ns, pod) in [
        ("web0-new", &ns_b, OWNER),
        ("other-c", &ns_c, other),
        ("third-e2", &ns_e, third),
    ] {
        chain.del(container, ns, pod);
    }
    assert!(
        allocations(&chain.net_dir()).is_empty(),
        "DEL of every sandbox leaves no allocation"
    );
    assert_eq!(
        chain.reservation().map(|r| r.ips),
        Some(reserved.to_vec()),
        "the reservation is the agent's to remove, never the plugin's"
    );
}

#[test]
fn force_deleted_pod_is_told_to_try_again_until_the_old_sandbox_is_deleted() {
    let mut chain = Chain::new(tiny_dual_stack(13));
    let (ns_old, ns_new) = (chain.netns("old"), chain.netns("new"));
    let (v4, v6) = (addr("198.18.13.10"), addr("2001:db8:13::10"));
    let reserved = [v4, v6];

    assert_eq!(
        chain.add("web0-old", &ns_old, OWNER),
        vec![(v4, 24), (v6, 64)]
    );
    chain.reserve(&reserved, None);
    // Force delete: the API object is gone at once (the agent marks the reservation released)
    // and the pod is re-created before the runtime has run the old sandbox's DEL.
    chain.reserve(&reserved, Some(released_now()));

    for attempt in ["web0-new1", "web0-new2"] {
        let outcome = chain.bridge("ADD", attempt, &ns_new, OWNER);
        outcome.err(11);
        let reply = outcome.json();
        assert!(
            reply.to_string().contains("web0-old"),
            "the try-again-later error must name the sandbox still holding the address: {reply}"
        );
        assert!(
            addresses_in(&ns_new, "eth0").is_empty(),
            "the refused ADD puts no address on {ns_new}"
        );
        let mut old = addresses_in(&ns_old, "eth0");
        old.sort();
        assert_eq!(
            old,
            vec![(v4, 24), (v6, 64)],
            "the old sandbox keeps its addresses until its own DEL"
        );
        // The runtime tears the failed sandbox down before it retries with a new one; that DEL
        // must not free the addresses the old sandbox holds.
        chain.del(attempt, &ns_new, OWNER);
        let files = allocations(&chain.net_dir());
        for ip in reserved {
            assert_eq!(
                files.get(&ip),
                Some(&Holder::attachment("web0-old", "eth0")),
                "DEL of the refused sandbox {attempt} must not free {ip}"
            );
        }
    }

    chain.del("web0-old", &ns_old, OWNER);
    assert_eq!(
        chain.add("web0-new3", &ns_new, OWNER),
        vec![(v4, 24), (v6, 64)],
        "after the old DEL the retried ADD gets exactly the reserved addresses"
    );
    chain.del("web0-new3", &ns_new, OWNER);
    assert!(allocations(&chain.net_dir()).is_empty());
}

#[test]
fn reasons_for_not_using_a_reservation_reach_the_runtime_through_bridge() {
    // A grace of zero: a force-deleted pod never waits for its old sandbox.
    let mut chain = Chain::with_ipam(
        tiny_dual_stack(14),
        serde_json::json!({ "reservationGraceSeconds": 0 }),
    );
    let (ns_old, ns_new, ns_other) = (chain.netns("old"), chain.netns("new"), chain.netns("other"));
    let (v4, v6) = (addr("198.18.14.10"), addr("2001:db8:14::10"));
    let prefix = format!("ipkeep: {NETWORK}: ");

    assert_eq!(
        chain.add("web0-old", &ns_old, OWNER),
        vec![(v4, 24), (v6, 64)]
    );
    chain.reserve(&[v4, v6], Some(released_now()));

    // The old sandbox still holds the addresses and the grace is zero: fresh addresses at once,
    // and the reason on bridge's stderr (bridge lets its IPAM plugin's stderr through).
    let (outcome, fresh) = chain.add_outcome("web0-new1", &ns_new, OWNER);
    assert_eq!(
        fresh,
        vec![(addr("198.18.14.11"), 24), (addr("2001:db8:14::11"), 64)]
    );
    let stderr = outcome.stderr_str();
    for ip in [v4, v6] {
        assert!(
            stderr.lines().any(|l| l.starts_with(&prefix)
                && l.contains(&format!("reserved address {ip} "))
                && l.contains("web0-old")
                && l.contains("fresh address")),
            "bridge's stderr must say why {ip} was not used: {stderr:?}"
        );
    }

    // The old DEL frees the addresses; they stay reserved: another pod does not get them, and
    // the pod gets them on its next return.
    chain.del("web0-old", &ns_old, OWNER);
    let other = ("db", "other-0");
    assert_eq!(
        chain.add("other-x", &ns_other, other),
        vec![(addr("198.18.14.12"), 24), (addr("2001:db8:14::12"), 64)]
    );
    chain.del("other-x", &ns_other, other);
    chain.del("web0-new1", &ns_new, OWNER);
    let cursor = std::fs::read_to_string(chain.net_dir().join("last_reserved_ip.0")).unwrap();
    assert_eq!(cursor, "198.18.14.12", "premise: the next candidate is .10");
    assert_eq!(
        chain.add("other-y", &ns_other, other),
        vec![(addr("198.18.14.11"), 24), (addr("2001:db8:14::11"), 64)],
        "the reserved .10 is skipped though it is free and the next candidate"
    );
    assert_eq!(
        chain.add("web0-new2", &ns_new, OWNER),
        vec![(v4, 24), (v6, 64)],
        "having given up on a stale sandbox once does not cost the pod its reservation"
    );
    chain.del("web0-new2", &ns_new, OWNER);

    // The pod moved here from another node: its IPv4 address is outside this node's ranges.
    // It gets a fresh IPv4 address and exactly its IPv6 one, and stderr says why.
    let foreign = addr("198.51.100.7");
    chain.reserve(&[foreign, v6], Some(released_now()));
    let (outcome, moved) = chain.add_outcome("web0-new3", &ns_new, OWNER);
    assert_eq!(moved, vec![(addr("198.18.14.12"), 24), (v6, 64)]);
    let stderr = outcome.stderr_str();
    assert!(
        stderr.lines().any(|l| l.starts_with(&prefix)
            && l.contains(&format!(
                "reserved address {foreign} is outside every configured range"
            ))),
        "bridge's stderr must say why {foreign} was not used: {stderr:?}"
    );
    for (container, ns, pod) in [("web0-new3", &ns_new, OWNER), ("other-y", &ns_other, other)] {
        chain.del(container, ns, pod);
    }
    assert!(allocations(&chain.net_dir()).is_empty());
}

/// A MAC no sandbox has (the documentation range of RFC 7042): a previous holder's, long gone.
const GONE_MAC: &str = "00:00:5e:00:53:01";

/// Plants the neighbour entry `dst lladdr mac nud state` on `dev`, as a previous holder's
/// traffic leaves it in the host's table.
fn plant(dst: IpAddr, dev: &str, mac: &str, state: &str) {
    ip(&[
        "neigh",
        "replace",
        &dst.to_string(),
        "lladdr",
        mac,
        "dev",
        dev,
        "nud",
        state,
    ]);
}

/// Gives `bridge` a MAC of its own. A bridge otherwise takes the lowest MAC of its ports, and the
/// kernel empties a link's neighbour table when its MAC changes: a sandbox's random veth MAC
/// coming or going would remove the planted entries instead of ipkeep.
fn pin_mac(bridge: &str) {
    ip(&["link", "set", "dev", bridge, "address", "02:00:5e:00:53:fe"]);
}

/// The host's neighbour entries for `dst`: `(device, lladdr)`.
fn neighbours(dst: IpAddr) -> Vec<(String, String)> {
    let json: serde_json::Value =
        serde_json::from_str(&ip(&["-j", "neigh", "show", "to", &dst.to_string()])).unwrap();
    json.as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["dev"].as_str().unwrap_or_default().to_owned(),
                n["lladdr"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[test]
fn the_host_forgets_the_previous_holders_mac_when_an_address_changes_hands() {
    let mut chain = Chain::new(tiny_dual_stack(16));
    let (ns_old, ns_new, ns_by) = (chain.netns("old"), chain.netns("new"), chain.netns("by"));
    let (v4, v6) = (addr("198.18.16.10"), addr("2001:db8:16::10"));
    let bridge = chain.bridge.clone();
    // A second link on the host with entries for the same addresses.
    let other = format!("ikn{}-{}", std::process::id() % 1_000_000, unique());
    chain.cleanup.links.push(other.clone());
    ip(&["link", "add", &other, "type", "bridge"]);
    ip(&["link", "set", &other, "up"]);
    let gone = |dev: &str| (dev.to_owned(), GONE_MAC.to_owned());

    assert_eq!(
        chain.add("web0-old", &ns_old, OWNER),
        vec![(v4, 24), (v6, 64)]
    );
    chain.reserve(&[v4, v6], Some(released_now()));
    let bystander = ("db", "bystander-0");
    chain.add("by", &ns_by, bystander);
    pin_mac(&bridge);

    // DEL: the addresses leave the pod; entries naming a MAC for them go with it. (The bystander
    // keeps the bridge's carrier up: a bridge whose last port goes flushes its whole table.)
    plant(v4, &bridge, GONE_MAC, "reachable");
    plant(v6, &bridge, GONE_MAC, "reachable");
    let deleted = chain.bridge("DEL", "web0-old", &ns_old, OWNER);
    deleted.ok();
    for dst in [v4, v6] {
        assert_eq!(neighbours(dst), vec![], "DEL leaves no entry for {dst}");
        assert!(
            deleted.stderr_str().contains(&format!(
                "ipkeep: {NETWORK}: removed the neighbour entry {dst} lladdr {GONE_MAC} REACHABLE on {bridge}"
            )),
            "DEL says which entry it removed: {}",
            describe(&deleted)
        );
    }

    // ADD of the returning pod: stale entries for its addresses (left because a DEL never ran,
    // or by another plugin) on every link go; a permanent one, and other addresses', stay.
    let neighbour_address = addr("198.18.16.12");
    plant(v4, &bridge, GONE_MAC, "reachable");
    plant(v6, &bridge, GONE_MAC, "stale");
    plant(v4, &other, GONE_MAC, "stale");
    plant(v6, &other, GONE_MAC, "permanent");
    plant(neighbour_address, &bridge, GONE_MAC, "reachable");
    let (added, back) = chain.add_outcome("web0-new", &ns_new, OWNER);
    assert_eq!(back, vec![(v4, 24), (v6, 64)]);
    assert_eq!(neighbours(v4), vec![], "no entry for {v4} is left");
    assert_eq!(
        neighbours(v6),
        vec![gone(&other)],
        "the permanent entry for {v6} stays, the stale one goes"
    );
    assert_eq!(
        neighbours(neighbour_address),
        vec![gone(&bridge)],
        "another address's entry stays"
    );
    let removed = added
        .stderr_str()
        .lines()
        .filter(|l| l.starts_with(&format!("ipkeep: {NETWORK}: removed the neighbour entry ")))
        .count();
    assert_eq!(
        removed,
        3,
        "one line per entry removed: {}",
        describe(&added)
    );
    chain.del("web0-new", &ns_new, OWNER);
    chain.del("by", &ns_by, bystander);
}

#[test]
fn a_neighbour_entry_that_cannot_be_removed_does_not_fail_the_add() {
    let mut chain = Chain::new(tiny_dual_stack(17));
    let (ns, ns_by) = (chain.netns("pod"), chain.netns("by"));
    let (v4, v6) = (addr("198.18.17.10"), addr("2001:db8:17::10"));
    let bridge = chain.bridge.clone();
    assert_eq!(chain.add("web0-old", &ns, OWNER), vec![(v4, 24), (v6, 64)]);
    let bystander = ("db", "bystander-0");
    chain.add("by", &ns_by, bystander);
    pin_mac(&bridge);
    chain.reserve(&[v4, v6], Some(released_now()));
    chain.del("web0-old", &ns, OWNER);
    plant(v4, &bridge, GONE_MAC, "reachable");

    // ipkeep as the bridge plugin runs it, in the host's namespace, but without CAP_NET_ADMIN:
    // the kernel lists the entry and refuses to delete it.
    let mut call = CniCall::new("ADD", "web0-new", &chain.config).args(&format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={}",
        OWNER.0, OWNER.1
    ));
    call.netns = Some(format!("/var/run/netns/{ns}"));
    call.path = Some(chain.cni_dir.to_str().unwrap().to_owned());
    let mut cmd = call.command(Path::new("/usr/bin/setpriv"));
    cmd.args(["--inh-caps=-net_admin", "--bounding-set=-net_admin"])
        .arg(common::ipkeep());
    let outcome = call.run_command(cmd);
    let result = outcome.ok();
    assert_eq!(result_cidrs(&result), vec![(v4, 24), (v6, 64)]);
    assert!(
        outcome.stderr_str().lines().any(|l| l.starts_with(&format!(
            "ipkeep: {NETWORK}: failed to remove the neighbour entry {v4} lladdr {GONE_MAC} REACHABLE on {bridge}: "
        ))),
        "the failure is one log line: {}",
        describe(&outcome)
    );
    assert_eq!(
        neighbours(v4),
        vec![(bridge.clone(), GONE_MAC.to_owned())],
        "premise: the kernel refused the delete"
    );

    // With the capability back, DEL removes it.
    let mut del = call.clone();
    del.command = Some("DEL".to_owned());
    del.run(&common::ipkeep()).ok();
    assert_eq!(neighbours(v4), vec![]);
    chain.del("by", &ns_by, bystander);
}
