//! What the system tests share beyond `common` (whose `Scratch` it re-exports): a seeded RNG, network
//! configurations, spawning plugin processes without waiting for them, and reading the on-disk
//! state back in host-local's format (`<dataDir>/<net>/<ip>` holding `<id>\r\n<ifname>`).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Child;

use crate::common::{CniCall, CniOutcome};

pub use crate::common::Scratch;

/// splitmix64: a tiny seeded generator, so every random choice a test makes can be replayed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0); the modulo bias is irrelevant at test sizes.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

/// The plugins under test. ipkeep is what these tests are for; host-local runs the same scenario
/// where its behaviour is the reference.
pub fn plugins() -> Vec<(&'static str, PathBuf)> {
    vec![
        ("ipkeep", crate::common::ipkeep()),
        ("host-local", crate::common::host_local()),
    ]
}

/// A network configuration for `cni_version` with `ipam` (plus `dataDir`) as given.
pub fn net_config(
    cni_version: &str,
    network: &str,
    data_dir: &Path,
    mut ipam: serde_json::Value,
) -> String {
    ipam["type"] = "ipkeep".into();
    ipam["dataDir"] = data_dir.to_str().unwrap().into();
    serde_json::json!({ "cniVersion": cni_version, "name": network, "ipam": ipam }).to_string()
}

/// Gives a child from [`CniCall::spawn_held`] its configuration and closes its stdin.
pub fn release(child: &mut Child, stdin: &[u8]) {
    // The configuration is far below a pipe buffer, so this never blocks on the child.
    if let Some(mut pipe) = child.stdin.take() {
        let _ = pipe.write_all(stdin);
    }
}

/// Starts `binary` for `call` and lets it run.
pub fn spawn(call: &CniCall, binary: &Path) -> Child {
    let mut child = call.spawn_held(binary);
    release(&mut child, &call.stdin);
    child
}

/// Waits for a child started by [`spawn`].
pub fn finish(child: Child) -> CniOutcome {
    CniOutcome::from(child.wait_with_output().unwrap())
}

/// The addresses named in an ADD result (0.3.0 and later: `ips[].address`).
pub fn result_ips(result: &serde_json::Value) -> Vec<IpAddr> {
    result["ips"]
        .as_array()
        .unwrap_or_else(|| panic!("result has no ips: {result}"))
        .iter()
        .map(|ip| {
            let cidr = ip["address"]
                .as_str()
                .unwrap_or_else(|| panic!("ips entry without address: {ip}"));
            cidr.split('/')
                .next()
                .unwrap()
                .parse()
                .unwrap_or_else(|e| panic!("bad address {cidr}: {e}"))
        })
        .collect()
}

/// Who an IP file says holds its address.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Holder {
    /// `<id>\r\n<ifname>`, what host-local and ipkeep write.
    Attachment { id: String, ifname: String },
    /// `<id>` alone, what host-local before 0.7 wrote.
    Legacy { id: String },
}

impl Holder {
    pub fn attachment(id: &str, ifname: &str) -> Self {
        Self::Attachment {
            id: id.to_owned(),
            ifname: ifname.to_owned(),
        }
    }

    pub fn id(&self) -> &str {
        match self {
            Self::Attachment { id, .. } | Self::Legacy { id } => id,
        }
    }

    /// Parses IP file content; `None` when it is not something host-local would have written.
    pub fn parse(content: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(content).ok()?;
        let valid_id = |id: &str| {
            let mut chars = id.chars();
            chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
                && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        };
        match text.split_once("\r\n") {
            Some((id, ifname)) if valid_id(id) && !ifname.is_empty() && ifname.len() < 16 => {
                Some(Self::attachment(id, ifname))
            }
            Some(_) => None,
            None if valid_id(text.trim()) => Some(Self::Legacy {
                id: text.trim().to_owned(),
            }),
            None => None,
        }
    }
}

/// Every entry directly in the network directory whose name parses as an IP address, with its
/// raw content (`None` for an entry that is not a regular file).
pub fn ip_entries(net_dir: &Path) -> BTreeMap<IpAddr, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(net_dir) else {
        return out;
    };
    for entry in entries {
        let entry = entry.unwrap();
        let Some(ip) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<IpAddr>().ok())
        else {
            continue;
        };
        let meta = std::fs::symlink_metadata(entry.path()).unwrap();
        out.insert(
            ip,
            meta.is_file().then(|| std::fs::read(entry.path()).unwrap()),
        );
    }
    out
}

/// The allocations on disk, asserting that every IP-named entry is a well-formed IP file.
pub fn allocations(net_dir: &Path) -> BTreeMap<IpAddr, Holder> {
    ip_entries(net_dir)
        .into_iter()
        .map(|(ip, content)| {
            let content = content
                .unwrap_or_else(|| panic!("{ip} in {} is not a regular file", net_dir.display()));
            let holder = Holder::parse(&content).unwrap_or_else(|| {
                panic!(
                    "IP file {ip} in {} is not parseable: {:?}",
                    net_dir.display(),
                    String::from_utf8_lossy(&content)
                )
            });
            (ip, holder)
        })
        .collect()
}

/// Every path below `dir` (recursively, relative to it) whose last component parses as an IP
/// address but that is not directly in `dir`: host-local counts such files as allocations, so a
/// plugin must never leave one behind (for example a temp file named after its address).
pub fn nested_ip_named(dir: &Path) -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries {
            let entry = entry.unwrap();
            let path = entry.path();
            let is_ip = entry
                .file_name()
                .to_str()
                .is_some_and(|n| n.parse::<IpAddr>().is_ok());
            if depth > 0 && is_ip {
                out.push(path.strip_prefix(root).unwrap().to_owned());
            }
            if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
                walk(root, &path, depth + 1, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, 0, &mut out);
    out
}

/// A CNI error JSON's `msg`, for assertion messages.
pub fn describe(outcome: &CniOutcome) -> String {
    format!(
        "exit {:?}, stdout {}, stderr {}",
        outcome.code,
        outcome.stdout_str(),
        outcome.stderr_str()
    )
}
