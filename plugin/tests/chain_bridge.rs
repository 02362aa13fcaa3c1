//! The real CNI chain: Debian's `bridge` plugin delegating IPAM to `ipkeep` (found through
//! `CNI_PATH`, as a runtime arranges it), attaching network namespaces made with `ip netns add`.
//! The address must really end up on the pod's interface, and DEL must take it away again.
//!
//! Needs root (CI runs as root): without it, or when namespaces cannot be made, these tests FAIL
//! with a message saying so. The bridge gets no address and no uplink, and the subnets are from
//! the benchmarking/documentation ranges, so nothing can leave the machine.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
mod system_support;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::CniCall;
use system_support::{Holder, Scratch, allocations, result_ips};

const BRIDGE_PLUGIN: &str = "/usr/lib/cni/bridge";
const NETWORK: &str = "chainnet";

/// Runs `ip` and returns its stdout; panics with its stderr when it fails.
fn ip(args: &[&str]) -> String {
    try_ip(args).unwrap_or_else(|stderr| panic!("`ip {}` failed: {stderr}", args.join(" ")))
}

fn try_ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip").args(args).output().unwrap_or_else(|e| {
        panic!("failed to run `ip` (Debian package iproute2, installed by `make deps`): {e}")
    });
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The effective UID, from /proc (no libc call needed).
fn euid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(2).unwrap().parse().unwrap()
}

/// Namespaces and links this test made; removed on drop, also when an assertion failed.
#[derive(Debug, Default)]
struct Cleanup {
    namespaces: Vec<String>,
    links: Vec<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for ns in &self.namespaces {
            let _ = try_ip(&["netns", "del", ns]);
        }
        for link in &self.links {
            let _ = try_ip(&["link", "del", link]);
        }
    }
}

impl Cleanup {
    /// A fresh, uniquely named network namespace; fails the test when it cannot be made.
    fn netns(&mut self, tag: &str) -> String {
        let name = format!("ipkeep-{tag}-{}-{}", std::process::id(), unique());
        // Registered first, so a half-made namespace is still removed.
        self.namespaces.push(name.clone());
        if let Err(stderr) = try_ip(&["netns", "add", &name]) {
            panic!(
                "`ip netns add {name}` failed (the chain tests need root and network namespaces; CI runs as root): {stderr}"
            );
        }
        name
    }
}

fn unique() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn require_root() {
    assert!(
        Path::new(BRIDGE_PLUGIN).exists(),
        "{BRIDGE_PLUGIN} is missing: run `make deps` (Debian package containernetworking-plugins)"
    );
    assert_eq!(
        euid(),
        0,
        "the bridge chain tests must run as root (they create network namespaces and a bridge); CI runs as root"
    );
}

/// The addresses (`local`, prefix length) on `dev` inside `ns`, per `ip -j addr show`.
fn addresses_in(ns: &str, dev: &str) -> Vec<(IpAddr, u64)> {
    let json: serde_json::Value =
        serde_json::from_str(&ip(&["-n", ns, "-j", "addr", "show", "dev", dev])).unwrap();
    json.as_array()
        .unwrap()
        .iter()
        .flat_map(|link| link["addr_info"].as_array().cloned().unwrap_or_default())
        .filter(|a| a["scope"] == "global")
        .map(|a| {
            (
                a["local"].as_str().unwrap().parse().unwrap(),
                a["prefixlen"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// `(address, prefix length)` for every entry of a CNI result.
fn result_cidrs(result: &serde_json::Value) -> Vec<(IpAddr, u64)> {
    let ips = result_ips(result);
    let prefixes = result["ips"].as_array().unwrap().iter().map(|ip| {
        let cidr = ip["address"].as_str().unwrap();
        cidr.rsplit_once('/').unwrap().1.parse::<u64>().unwrap()
    });
    ips.into_iter().zip(prefixes).collect()
}

/// One run of the chain: two pods (namespaces) attached to one fresh bridge through `ipam_plugin`,
/// each checked after ADD and after DEL. Returns the addresses each pod got.
fn bridge_chain(ipam_plugin: &Path, ranges: serde_json::Value) -> Vec<Vec<(IpAddr, u64)>> {
    require_root();
    let mut cleanup = Cleanup::default();
    let bridge = format!("ikb{}-{}", std::process::id() % 1_000_000, unique());
    cleanup.links.push(bridge.clone());
    let scratch = Scratch::new("chain");
    // CNI_PATH holds only the IPAM plugin, under its own name, which `ipam.type` names.
    let ipam_type = ipam_plugin.file_name().unwrap().to_str().unwrap();
    let cni_dir = scratch.path().join("bin");
    std::fs::create_dir(&cni_dir).unwrap();
    std::os::unix::fs::symlink(ipam_plugin, cni_dir.join(ipam_type)).unwrap();
    let data_dir: PathBuf = scratch.path().join("data");
    let config = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "bridge",
        "bridge": bridge,
        "isGateway": false,
        "ipMasq": false,
        "ipam": { "type": ipam_type, "ranges": ranges, "dataDir": data_dir },
    })
    .to_string();
    let net_dir = data_dir.join(NETWORK);

    let pods: Vec<(String, String)> = (0..2)
        .map(|i| (cleanup.netns("chain"), format!("pod{i}-{}", unique())))
        .collect();
    let mut got = Vec::new();
    for (ns, container) in &pods {
        let mut add = CniCall::new("ADD", container, &config);
        add.netns = Some(format!("/var/run/netns/{ns}"));
        add.path = Some(cni_dir.to_str().unwrap().to_owned());
        let result = add.run(Path::new(BRIDGE_PLUGIN)).ok();
        let mut expected = result_cidrs(&result);
        expected.sort();
        let mut present = addresses_in(ns, "eth0");
        present.sort();
        assert_eq!(
            present, expected,
            "eth0 in {ns} must carry exactly the addresses of the result {result}"
        );
        for (addr, _) in &expected {
            assert_eq!(
                allocations(&net_dir).get(addr),
                Some(&Holder::attachment(container, "eth0")),
                "the IP file for {addr} must name {container}"
            );
        }
        got.push(expected);
    }
    let details: serde_json::Value =
        serde_json::from_str(&ip(&["-d", "-j", "link", "show", "dev", &bridge])).unwrap();
    assert_eq!(
        details[0]["linkinfo"]["info_kind"], "bridge",
        "{bridge} must be a bridge on the host: {details}"
    );
    let ports: serde_json::Value =
        serde_json::from_str(&ip(&["-j", "link", "show", "master", &bridge])).unwrap();
    assert_eq!(
        ports.as_array().unwrap().len(),
        2,
        "both pods' veths hang on {bridge}: {ports}"
    );

    for ((ns, container), addrs) in pods.iter().zip(&got) {
        let mut del = CniCall::new("DEL", container, &config);
        del.netns = Some(format!("/var/run/netns/{ns}"));
        del.path = Some(cni_dir.to_str().unwrap().to_owned());
        del.run(Path::new(BRIDGE_PLUGIN)).ok();
        assert!(
            try_ip(&["-n", ns, "link", "show", "dev", "eth0"]).is_err(),
            "eth0 must be gone from {ns} after DEL"
        );
        for (addr, _) in addrs {
            assert!(
                !allocations(&net_dir).contains_key(addr),
                "the IP file for {addr} must be removed by DEL"
            );
        }
    }
    assert!(
        allocations(&net_dir).is_empty(),
        "DEL of every pod leaves no allocation"
    );
    let ports: serde_json::Value =
        serde_json::from_str(&ip(&["-j", "link", "show", "master", &bridge])).unwrap();
    assert!(
        ports.as_array().unwrap().is_empty(),
        "no veth left on {bridge} after DEL: {ports}"
    );
    got
}

fn ipv4_ranges() -> serde_json::Value {
    serde_json::json!([[{ "subnet": "198.18.4.0/24" }]])
}

fn dual_stack_ranges() -> serde_json::Value {
    serde_json::json!([[{ "subnet": "198.18.4.0/24" }], [{ "subnet": "2001:db8:4::/64" }]])
}

#[test]
fn bridge_with_ipkeep_puts_the_ipv4_address_on_the_pod_interface() {
    let got = bridge_chain(&common::ipkeep(), ipv4_ranges());
    assert_eq!(
        got[0],
        vec![("198.18.4.2".parse().unwrap(), 24)],
        "the first pod gets the first free address"
    );
    assert_eq!(got[1], vec![("198.18.4.3".parse().unwrap(), 24)]);
}

#[test]
fn bridge_with_ipkeep_puts_both_addresses_on_the_pod_interface_dual_stack() {
    let got = bridge_chain(&common::ipkeep(), dual_stack_ranges());
    assert_eq!(
        got[0],
        vec![
            ("198.18.4.2".parse().unwrap(), 24),
            ("2001:db8:4::2".parse().unwrap(), 64)
        ],
        "the first pod gets the first free address of each family"
    );
}

#[test]
fn bridge_with_host_local_gives_the_same_addresses_as_with_ipkeep() {
    let with_host_local = bridge_chain(&common::host_local(), dual_stack_ranges());
    let with_ipkeep = bridge_chain(&common::ipkeep(), dual_stack_ranges());
    assert_eq!(
        with_ipkeep, with_host_local,
        "ipkeep must be a drop-in replacement in the chain"
    );
}
