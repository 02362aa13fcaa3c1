//! The real CNI chain: Debian's `bridge` plugin delegating IPAM to `ipkeep` (found through
//! `CNI_PATH`, as a runtime arranges it), attaching network namespaces made with `ip netns add`.
//! The address must really end up on the pod's interface, and DEL must take it away again.
//!
//! Needs root (CI runs as root): without it, or when namespaces cannot be made, these tests FAIL
//! with a message saying so. The bridge gets no address and no uplink, and the subnets are from
//! the benchmarking/documentation ranges, so nothing can leave the machine.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod chain_support;
mod common;
mod system_support;

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use chain_support::{
    BRIDGE_PLUGIN, Cleanup, addresses_in, ip, require_root_and_bridge, result_cidrs, try_ip, unique,
};
use common::CniCall;
use system_support::{Holder, Scratch, allocations};

const NETWORK: &str = "chainnet";

/// One run of the chain: two pods (namespaces) attached to one fresh bridge through `ipam_plugin`,
/// each checked after ADD and after DEL. Returns the addresses each pod got.
fn bridge_chain(ipam_plugin: &Path, ranges: serde_json::Value) -> Vec<Vec<(IpAddr, u64)>> {
    require_root_and_bridge("bridge chain tests");
    let mut cleanup = Cleanup::default();
    let bridge = format!("ikb{}-{}", std::process::id() % 1_000_000, unique());
    cleanup.links.push(bridge.clone());
    let scratch = Scratch::new();
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
