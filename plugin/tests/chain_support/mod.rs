//! What the real-chain tests share: running `ip`, the root check, network namespaces and links
//! removed by a drop guard (also when an assertion failed), and reading addresses back.
#![allow(dead_code)]

use std::net::IpAddr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::system_support::result_ips;

/// Debian's reference `bridge` plugin (package containernetworking-plugins).
pub const BRIDGE_PLUGIN: &str = "/usr/lib/cni/bridge";

/// Runs `ip` and returns its stdout; panics with its stderr when it fails.
pub fn ip(args: &[&str]) -> String {
    try_ip(args).unwrap_or_else(|stderr| panic!("`ip {}` failed: {stderr}", args.join(" ")))
}

/// Runs `ip`: its stdout, or its stderr when it fails.
pub fn try_ip(args: &[&str]) -> Result<String, String> {
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

/// Fails the test, saying why, unless it runs as root and Debian's `bridge` is installed.
pub fn require_root_and_bridge(what: &str) {
    assert!(
        Path::new(BRIDGE_PLUGIN).exists(),
        "{BRIDGE_PLUGIN} is missing: run `make deps` (Debian package containernetworking-plugins)"
    );
    assert_eq!(
        euid(),
        0,
        "the {what} must run as root (they create network namespaces and a bridge); CI runs as root"
    );
}

/// A number not used before in this process, for unique names.
pub fn unique() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Namespaces and links a test made; removed on drop, also when an assertion failed.
#[derive(Debug, Default)]
pub struct Cleanup {
    pub namespaces: Vec<String>,
    pub links: Vec<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth ends inside it and with them their peers.
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
    pub fn netns(&mut self, tag: &str) -> String {
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

/// The addresses (`local`, prefix length) on `dev` inside `ns`, per `ip -j addr show`.
pub fn addresses_in(ns: &str, dev: &str) -> Vec<(IpAddr, u64)> {
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
pub fn result_cidrs(result: &serde_json::Value) -> Vec<(IpAddr, u64)> {
    let ips = result_ips(result);
    let prefixes = result["ips"].as_array().unwrap().iter().map(|ip| {
        let cidr = ip["address"].as_str().unwrap();
        cidr.rsplit_once('/').unwrap().1.parse::<u64>().unwrap()
    });
    ips.into_iter().zip(prefixes).collect()
}
