//! Real flannel on the real nodes ([`super::NodeCni::Flannel`]): `flanneld` with the Kubernetes
//! subnet manager on every node (each node's lease is its Node's `spec.podCIDRs`, as flannel's
//! own functional test does it), the vxlan backend between the nodes' `eth0`s, and flannel's CNI
//! plugin under kube-flannel's own conflist, written where kube-flannel's init container writes
//! it. The files and flags are plain data here; the node starts the daemon.
//!
//! Built by `e2e/cluster/build.sh --flannel` (`make flannel-bins`); versions in
//! `e2e/cluster/versions.env`.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::{
    RealNodeError,
    layout::{NodeLayout, Slot},
};

/// The binaries `build.sh --flannel` builds: the daemon and the CNI plugin.
pub const BINARIES: [&str; 2] = ["flanneld", "flannel"];

/// Where flanneld writes the node's lease for the CNI plugin (its default; `/run` is private
/// to each node).
pub const SUBNET_FILE: &str = "/run/flannel/subnet.env";

/// The user flanneld's client certificate names; [`rbac`] grants it kube-flannel's ClusterRole.
pub const USER: &str = "ipkeep-e2e:flannel";

/// The vxlan device flanneld makes on every node (`flannel.<VNI>`, VNI 1 by default).
pub const VXLAN_DEVICE: &str = "flannel.1";
/// Its IPv6 twin, on a dual-stack node.
pub const VXLAN_DEVICE_V6: &str = "flannel-v6.1";

/// flanneld's `net-conf.json` for the nodes of `slot`: the slot's pod range (every node's
/// `spec.podCIDR` lies in it, which the subnet manager checks), the IPv6 one when dual-stack,
/// and the vxlan backend.
pub fn net_conf(slot: Slot, dual_stack: bool) -> serde_json::Value {
    let mut conf = json!({
        "Network": slot.cluster_cidr(),
        "EnableNFTables": false,
        "Backend": {"Type": "vxlan"},
    });
    if dual_stack {
        conf["EnableIPv6"] = json!(true);
        conf["IPv6Network"] = json!(slot.cluster_cidr_v6());
    }
    conf
}

/// flanneld's arguments on `node`, its configuration in `config_dir`: the Kubernetes subnet
/// manager, the node's `eth0` for the tunnels (and its IPv6 address, when dual-stack),
/// masquerading of traffic leaving the pod network (kube-flannel's `--ip-masq`); the node's name
/// comes from `NODE_NAME`.
pub fn flanneld_args(node: NodeLayout, config_dir: &Path, dual_stack: bool) -> Vec<String> {
    let mut args = vec![
        "--kube-subnet-mgr".into(),
        format!(
            "--kubeconfig-file={}",
            config_dir.join("flanneld.kubeconfig").display()
        ),
        format!(
            "--net-config-path={}",
            config_dir.join("net-conf.json").display()
        ),
        "--iface=eth0".into(),
        format!("--public-ip={}", node.ip()),
        "--ip-masq".into(),
        format!("--subnet-file={SUBNET_FILE}"),
    ];
    if dual_stack {
        args.push(format!("--public-ipv6={}", node.ip_v6()));
    }
    args
}

/// kube-flannel's ClusterRole, bound to [`USER`].
pub fn rbac() -> String {
    format!(
        r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: flannel
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [get]
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [nodes/status]
  verbs: [patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: flannel
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: flannel
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: {USER}
"#
    )
}

/// The directory of flannel's binaries: `IPKEEP_FLANNEL_BIN_DIR`, else what
/// `e2e/cluster/build.sh --print-flannel-bin-dir` names; checked to hold both.
pub fn bin_dir() -> Result<PathBuf, RealNodeError> {
    let dir = super::built_dir("IPKEEP_FLANNEL_BIN_DIR", "--print-flannel-bin-dir")?;
    match BINARIES.iter().find(|b| !dir.join(b).is_file()) {
        Some(b) => Err(RealNodeError::FlannelMissing {
            dir,
            missing: (*b).to_owned(),
        }),
        None => Ok(dir),
    }
}

/// The lease flanneld wrote on a node (`subnet.env`): its `FLANNEL_SUBNET` (the node's first
/// pod address with the lease's prefix), if the file says one.
pub fn leased_subnet(subnet_env: &str) -> Option<&str> {
    subnet_env
        .lines()
        .find_map(|l| l.trim().strip_prefix("FLANNEL_SUBNET="))
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_conf_covers_every_node_of_the_slot_in_each_family() {
        let slot = Slot::new(2).unwrap();
        let v4 = net_conf(slot, false);
        assert_eq!(v4["Network"], "198.19.144.0/21");
        assert_eq!(v4["Backend"]["Type"], "vxlan");
        assert!(v4.get("EnableIPv6").is_none());
        let dual = net_conf(slot, true);
        assert_eq!(dual["EnableIPv6"], true);
        assert_eq!(dual["IPv6Network"], "fd19:198:2::/48");
        // 198.19.144.0/21 holds the third octets 144 to 151; fd19:198:2::/48 every fd19:198:2:*.
        for i in 0..super::super::layout::MAX_NODES {
            let node = slot.node(i).unwrap();
            let third: u8 = node.pod_cidr().split('.').nth(2).unwrap().parse().unwrap();
            assert!((144..152).contains(&third), "{}", node.pod_cidr());
            assert!(
                node.pod_cidr_v6().starts_with("fd19:198:2:"),
                "{}",
                node.pod_cidr_v6()
            );
        }
    }

    #[test]
    fn the_lease_is_read_from_subnet_env() {
        let env = "FLANNEL_NETWORK=198.19.128.0/21\nFLANNEL_SUBNET=198.19.129.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n";
        assert_eq!(leased_subnet(env), Some("198.19.129.1/24"));
        assert_eq!(leased_subnet("FLANNEL_SUBNET=\n"), None);
        assert_eq!(leased_subnet(""), None);
    }
}
