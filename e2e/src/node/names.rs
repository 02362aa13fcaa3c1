//! Names the stand-in gives to host objects: the bridge, the network namespaces, sandbox
//! (container) IDs. Interfaces and network namespaces are global to the machine, and several
//! stand-ins share one machine, so every name carries a short tag derived from the node's name.

use std::fmt::Write as _;

/// The longest node name Kubernetes accepts (a DNS-1123 subdomain).
const MAX_NODE_NAME: usize = 253;

/// The longest network name: it becomes a directory under the data directory.
const MAX_NETWORK_NAME: usize = 63;

/// Why a name given to the stand-in is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Not a DNS-1123 subdomain (lowercase letters, digits, `-`, `.`; at most 253 characters).
    #[error("failed to accept node name {0:?}: not a DNS-1123 subdomain")]
    NodeName(String),
    /// Not a DNS-1123 label (it becomes a directory name under the data directory).
    #[error(
        "failed to accept network name {0:?}: not a DNS-1123 label (it becomes a directory name)"
    )]
    NetworkName(String),
}

/// Checks that `name` is a valid Kubernetes node name.
pub fn validate_node_name(name: &str) -> Result<(), NameError> {
    let ok = !name.is_empty() && name.len() <= MAX_NODE_NAME && name.split('.').all(is_dns_label);
    if ok {
        Ok(())
    } else {
        Err(NameError::NodeName(name.to_owned()))
    }
}

/// Checks that `name` is usable as the CNI network name (a DNS-1123 label, so a safe directory
/// name: no `/`, no `..`).
pub fn validate_network_name(name: &str) -> Result<(), NameError> {
    if name.len() <= MAX_NETWORK_NAME && is_dns_label(name) {
        Ok(())
    } else {
        Err(NameError::NetworkName(name.to_owned()))
    }
}

fn is_dns_label(part: &str) -> bool {
    !part.is_empty()
        && part.len() <= 63
        && part
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !part.starts_with('-')
        && !part.ends_with('-')
}

/// The node's tag: 8 hex digits of a FNV-1a hash of its name, the same on every start.
pub fn node_tag(node: &str) -> String {
    let mut hash: u32 = 0x811c_9dc5;
    for b in node.bytes() {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    format!("{hash:08x}")
}

/// The node's bridge: `ipk-<tag>` (12 characters, within the kernel's 15).
pub fn bridge_name(tag: &str) -> String {
    format!("ipk-{tag}")
}

/// What every network namespace of this node starts with: `ipk-<tag>-`.
pub fn netns_prefix(tag: &str) -> String {
    format!("ipk-{tag}-")
}

/// A sandbox ID as a runtime makes one: 64 lowercase hex digits, built from a per-attempt nonce,
/// the pod's UID and the node tag, so that every attempt for every pod on every node differs.
pub fn container_id(pod_uid: &str, tag: &str, nonce: u64) -> String {
    let mut id = format!("{nonce:016x}");
    let uid_hex: String = pod_uid
        .chars()
        .filter(char::is_ascii_hexdigit)
        .map(|c| c.to_ascii_lowercase())
        .take(32)
        .collect();
    let _ = write!(id, "{uid_hex:0<32}");
    let tag_hex: String = tag
        .chars()
        .filter(char::is_ascii_hexdigit)
        .take(8)
        .collect();
    let _ = write!(id, "{tag_hex:0<8}");
    format!("{id:0<64}")
}

/// The network namespace of one sandbox: the node's prefix and the sandbox ID's first 24 digits
/// (the nonce and the start of the pod UID).
pub fn netns_name(tag: &str, container_id: &str) -> String {
    let short: String = container_id.chars().take(24).collect();
    format!("{}{short}", netns_prefix(tag))
}

/// Whether `name` is a well-formed sandbox ID of this stand-in (64 lowercase hex digits); only
/// such names become file names under the data directory.
pub fn is_container_id(name: &str) -> bool {
    name.len() == 64
        && name
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_follow_dns_1123_subdomains() {
        for good in ["node-a", "n1", "worker-1.example", "a"] {
            assert_eq!(validate_node_name(good), Ok(()), "{good}");
        }
        let long = "a".repeat(254);
        for bad in [
            "",
            "Node",
            "-a",
            "a-",
            "a..b",
            "a/b",
            "../x",
            long.as_str(),
            "a_b",
        ] {
            assert!(validate_node_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn network_names_are_single_labels() {
        assert_eq!(validate_network_name("podnet"), Ok(()));
        for bad in ["", "a.b", "..", "a/b", "Pod"] {
            assert!(validate_network_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn tags_are_stable_and_differ_between_nodes() {
        assert_eq!(node_tag("node-a"), node_tag("node-a"));
        assert_ne!(node_tag("node-a"), node_tag("node-b"));
        assert_eq!(node_tag("node-a").len(), 8);
        assert!(bridge_name(&node_tag("a-very-long-node-name.example.com")).len() <= 15);
    }

    #[test]
    fn container_ids_are_64_hex_digits_and_differ_per_attempt() {
        let uid = "5B0C7A3E-1d2f-4c1a-9b7e-0d7c2f4e9a11";
        let a = container_id(uid, "0a1b2c3d", 1);
        let b = container_id(uid, "0a1b2c3d", 2);
        assert!(is_container_id(&a), "{a}");
        assert_ne!(a, b);
        assert!(a.contains("5b0c7a3e1d2f4c1a9b7e0d7c2f4e9a11"), "{a}");
        assert_ne!(netns_name("0a1b2c3d", &a), netns_name("0a1b2c3d", &b));
        assert!(netns_name("0a1b2c3d", &a).starts_with(&netns_prefix("0a1b2c3d")));
        // A UID that is not hex still gives a well-formed ID.
        assert!(is_container_id(&container_id("not-a-uid", "zz", 7)));
        assert!(!is_container_id("../../etc"));
    }
}
