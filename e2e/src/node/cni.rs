//! The CNI side of a runtime, pure: the node's network configuration, the environment and
//! `CNI_ARGS` a Kubernetes runtime passes, and the parsing of what plugins and `ip` answer.

use std::{net::IpAddr, path::Path};

use serde_json::{Value, json};

/// The interface name runtimes give a pod's network device.
pub const POD_IFNAME: &str = "eth0";

/// The cniVersion of ADD/DEL requests: the newest Debian's `bridge` (1.1.1) speaks.
pub const CNI_VERSION: &str = "1.0.0";

/// The cniVersion of GC requests (GC exists since CNI 1.1.0).
pub const GC_CNI_VERSION: &str = "1.1.0";

/// CNI error code 11: "try again later"; a runtime retries the sandbox.
pub const CODE_TRY_AGAIN_LATER: u64 = 11;

/// The pod a sandbox belongs to, as a runtime passes it in `CNI_ARGS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
}

/// The node's network configuration: Debian's `bridge` on the node's own bridge (the gateway is
/// the bridge, no masquerading: pods never reach outside), IPAM delegated to `ipkeep` with one
/// range set per pod CIDR and its data directory under the node's.
pub fn network_config(
    network: &str,
    bridge: &str,
    pod_cidrs: &[String],
    ipam_data_dir: &Path,
) -> Value {
    let ranges: Vec<Value> = pod_cidrs
        .iter()
        .map(|cidr| json!([{ "subnet": cidr }]))
        .collect();
    json!({
        "cniVersion": CNI_VERSION,
        "name": network,
        "type": "bridge",
        "bridge": bridge,
        "isGateway": true,
        "ipMasq": false,
        "ipam": {
            "type": "ipkeep",
            "ranges": ranges,
            "dataDir": ipam_data_dir,
        },
    })
}

/// The GC request for the IPAM plugin: the network's IPAM section as a network configuration
/// of cniVersion 1.1.0, with the attachments that are still valid.
///
/// Debian's `bridge` (1.1.1) predates GC; newer `bridge` plugins pass GC on to their IPAM plugin
/// with exactly this configuration, so the stand-in sends it to the IPAM plugin itself.
pub fn gc_config(network_config: &Value, valid: &[(String, String)]) -> Value {
    let attachments: Vec<Value> = valid
        .iter()
        .map(|(id, ifname)| json!({ "containerID": id, "ifname": ifname }))
        .collect();
    let mut config = network_config.clone();
    if let Some(map) = config.as_object_mut() {
        map.insert("cniVersion".into(), json!(GC_CNI_VERSION));
        if let Some(ipam_type) = map.get("ipam").and_then(|i| i.get("type")).cloned() {
            map.insert("type".into(), ipam_type);
        }
        map.insert("cni.dev/valid-attachments".into(), json!(attachments));
    }
    config
}

/// The IPAM plugin's name (`ipam.type`) of a network configuration.
pub fn ipam_type(network_config: &Value) -> Option<&str> {
    network_config.pointer("/ipam/type").and_then(Value::as_str)
}

/// `CNI_ARGS` as the kubelet's runtimes (containerd, CRI-O) pass them.
pub fn cni_args(pod: &PodRef, container_id: &str) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={container_id};K8S_POD_UID={}",
        pod.namespace, pod.name, pod.uid
    )
}

/// The CNI commands the stand-in sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CniCommand {
    /// Attach a sandbox.
    Add,
    /// Detach a sandbox.
    Del,
    /// Free allocations of attachments that are no longer valid.
    Gc,
}

impl CniCommand {
    /// The value of `CNI_COMMAND`.
    pub fn as_str(self) -> &'static str {
        match self {
            CniCommand::Add => "ADD",
            CniCommand::Del => "DEL",
            CniCommand::Gc => "GC",
        }
    }
}

/// One attachment's part of a request (absent for GC).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_NETNS`: the path of the network namespace.
    pub netns_path: String,
    /// The pod, for `CNI_ARGS`.
    pub pod: PodRef,
}

/// The environment of one plugin execution (the runtime's `PATH` is kept as well).
pub fn cni_env(
    command: CniCommand,
    attachment: Option<&Attachment>,
    cni_path: &str,
) -> Vec<(String, String)> {
    let mut env = vec![
        ("CNI_COMMAND".to_owned(), command.as_str().to_owned()),
        ("CNI_PATH".to_owned(), cni_path.to_owned()),
    ];
    if let Some(a) = attachment {
        env.push(("CNI_CONTAINERID".into(), a.container_id.clone()));
        env.push(("CNI_NETNS".into(), a.netns_path.clone()));
        env.push(("CNI_IFNAME".into(), POD_IFNAME.into()));
        env.push(("CNI_ARGS".into(), cni_args(&a.pod, &a.container_id)));
    }
    env
}

/// A plugin's error reply (or a reply that is not one, described as code 999).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("plugin failed with CNI code {code}: {msg}{}", if details.is_empty() { String::new() } else { format!(" ({details})") })]
pub struct CniFailure {
    /// The CNI error code (11: try again later).
    pub code: u64,
    /// `msg`.
    pub msg: String,
    /// `details`, empty when absent.
    pub details: String,
}

impl CniFailure {
    /// Whether the runtime should retry soon (code 11).
    pub fn is_try_again_later(&self) -> bool {
        self.code == CODE_TRY_AGAIN_LATER
    }
}

/// The addresses of a successful ADD's result, in the order the plugin gave them.
pub fn parse_add_result(stdout: &[u8]) -> Result<Vec<(IpAddr, u8)>, CniFailure> {
    let reply: Value = serde_json::from_slice(stdout).map_err(|e| CniFailure {
        code: 999,
        msg: format!("failed to decode the plugin's result: {e}"),
        details: String::from_utf8_lossy(stdout).into_owned(),
    })?;
    let ips = reply
        .get("ips")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    ips.iter()
        .filter_map(|ip| ip.get("address").and_then(Value::as_str))
        .map(|cidr| {
            parse_cidr(cidr).ok_or_else(|| CniFailure {
                code: 999,
                msg: format!("failed to parse address {cidr:?} in the plugin's result"),
                details: String::new(),
            })
        })
        .collect()
}

/// The error a failed plugin wrote to stdout (CNI spec: `code`, `msg`, `details`).
pub fn parse_error(stdout: &[u8], stderr: &[u8], exit: Option<i32>) -> CniFailure {
    match serde_json::from_slice::<Value>(stdout) {
        Ok(reply) if reply.get("code").is_some() => CniFailure {
            code: reply.get("code").and_then(Value::as_u64).unwrap_or(999),
            msg: reply
                .get("msg")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            details: reply
                .get("details")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        },
        _ => CniFailure {
            code: 999,
            msg: format!(
                "plugin exited with {} and no CNI error on stdout",
                exit.map_or_else(|| "a signal".to_owned(), |c| format!("status {c}"))
            ),
            details: String::from_utf8_lossy(stderr).trim().to_owned(),
        },
    }
}

/// The global addresses of `ifname` in the output of `ip -j addr show dev <ifname>`.
pub fn parse_ip_addr_json(text: &str, ifname: &str) -> Result<Vec<(IpAddr, u8)>, String> {
    let links: Value =
        serde_json::from_str(text).map_err(|e| format!("failed to decode `ip -j addr`: {e}"))?;
    let mut found = Vec::new();
    for link in links.as_array().map(Vec::as_slice).unwrap_or_default() {
        if link.get("ifname").and_then(Value::as_str) != Some(ifname) {
            continue;
        }
        for info in link
            .get("addr_info")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            if info.get("scope").and_then(Value::as_str) != Some("global") {
                continue;
            }
            let addr = info.get("local").and_then(Value::as_str);
            let prefix = info.get("prefixlen").and_then(Value::as_u64);
            if let (Some(addr), Some(prefix)) = (addr, prefix)
                && let (Ok(addr), Ok(prefix)) = (addr.parse::<IpAddr>(), u8::try_from(prefix))
            {
                found.push((addr, prefix));
            }
        }
    }
    Ok(found)
}

/// The pod's addresses: those of the plugin's result that are really configured in the
/// namespace, in the result's order (kubelet's `podIPs` order: the first is `podIP`).
pub fn configured_pod_ips(result: &[(IpAddr, u8)], in_netns: &[(IpAddr, u8)]) -> Vec<IpAddr> {
    result
        .iter()
        .filter(|r| in_netns.contains(r))
        .map(|(ip, _)| *ip)
        .collect()
}

/// `10.0.0.1/24` → (address, prefix).
pub fn parse_cidr(text: &str) -> Option<(IpAddr, u8)> {
    let (addr, prefix) = text.split_once('/')?;
    let addr: IpAddr = addr.parse().ok()?;
    let prefix: u8 = prefix.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    (prefix <= max).then_some((addr, prefix))
}

/// Whether `ip` lies in the network `cidr` (`10.244.1.0/24`).
pub fn cidr_contains(cidr: &str, ip: IpAddr) -> bool {
    let Some((net, prefix)) = parse_cidr(cidr) else {
        return false;
    };
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(n) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(n) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> PodRef {
        PodRef {
            namespace: "db".into(),
            name: "web-0".into(),
            uid: "u-1".into(),
        }
    }

    #[test]
    fn cni_args_are_what_kubernetes_runtimes_pass() {
        assert_eq!(
            cni_args(&pod(), "abc"),
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=db;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1"
        );
    }

    #[test]
    fn the_environment_names_the_attachment_for_add_and_only_the_path_for_gc() {
        let a = Attachment {
            container_id: "abc".into(),
            netns_path: "/run/netns/x".into(),
            pod: pod(),
        };
        let env = cni_env(CniCommand::Add, Some(&a), "/bin1:/bin2");
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("CNI_COMMAND"), Some("ADD"));
        assert_eq!(get("CNI_CONTAINERID"), Some("abc"));
        assert_eq!(get("CNI_NETNS"), Some("/run/netns/x"));
        assert_eq!(get("CNI_IFNAME"), Some("eth0"));
        assert_eq!(get("CNI_PATH"), Some("/bin1:/bin2"));
        assert!(get("CNI_ARGS").is_some_and(|v| v.contains("K8S_POD_NAME=web-0")));
        let gc = cni_env(CniCommand::Gc, None, "/b");
        assert_eq!(gc.len(), 2, "{gc:?}");
    }

    #[test]
    fn the_network_is_a_gateway_bridge_with_one_range_set_per_cidr() {
        let cfg = network_config(
            "podnet",
            "ipk-1",
            &["10.244.1.0/24".into(), "fd00:1::/64".into()],
            Path::new("/d/networks"),
        );
        assert_eq!(cfg["type"], "bridge");
        assert_eq!(cfg["bridge"], "ipk-1");
        assert_eq!(cfg["isGateway"], true);
        assert_eq!(cfg["ipam"]["type"], "ipkeep");
        assert_eq!(cfg["ipam"]["ranges"][1][0]["subnet"], "fd00:1::/64");
        assert_eq!(cfg["ipam"]["dataDir"], "/d/networks");
        let gc = gc_config(&cfg, &[("c1".into(), "eth0".into())]);
        assert_eq!(gc["cniVersion"], "1.1.0");
        assert_eq!(gc["type"], "ipkeep");
        assert_eq!(gc["name"], "podnet");
        assert_eq!(
            gc["cni.dev/valid-attachments"],
            json!([{"containerID": "c1", "ifname": "eth0"}])
        );
    }

    #[test]
    fn results_and_errors_parse() {
        let ok = br#"{"cniVersion":"1.0.0","interfaces":[],"ips":[{"address":"10.244.1.2/24","gateway":"10.244.1.1","interface":2},{"address":"fd00::2/64"}]}"#;
        assert_eq!(
            parse_add_result(ok),
            Ok(vec![
                ("10.244.1.2".parse().unwrap_or(IpAddr::from([0; 4])), 24),
                ("fd00::2".parse().unwrap_or(IpAddr::from([0; 4])), 64)
            ])
        );
        assert_eq!(parse_add_result(b"nope").map_err(|e| e.code), Err(999));
        let err = parse_error(
            br#"{"cniVersion":"1.0.0","code":11,"msg":"try again","details":"held by old"}"#,
            b"",
            Some(1),
        );
        assert!(err.is_try_again_later());
        assert_eq!(err.msg, "try again");
        assert_eq!(err.details, "held by old");
        let crash = parse_error(b"", b"boom\n", None);
        assert_eq!(crash.code, 999);
        assert_eq!(crash.details, "boom");
        assert!(crash.msg.contains("a signal"), "{}", crash.msg);
    }

    #[test]
    fn addresses_are_read_from_ip_json_and_ordered_as_the_result() {
        let text = r#"[{"ifindex":2,"ifname":"eth0","addr_info":[
            {"family":"inet6","local":"fe80::1","prefixlen":64,"scope":"link"},
            {"family":"inet6","local":"fd00::2","prefixlen":64,"scope":"global"},
            {"family":"inet","local":"10.244.1.2","prefixlen":24,"scope":"global"}]},
            {"ifname":"lo","addr_info":[{"local":"127.0.0.1","prefixlen":8,"scope":"global"}]}]"#;
        let found = parse_ip_addr_json(text, "eth0");
        let v4: IpAddr = "10.244.1.2".parse().unwrap_or(IpAddr::from([0; 4]));
        let v6: IpAddr = "fd00::2".parse().unwrap_or(IpAddr::from([0; 4]));
        assert_eq!(found, Ok(vec![(v6, 64), (v4, 24)]));
        let result = [(v4, 24), (v6, 64), ("10.9.9.9".parse().unwrap_or(v4), 24)];
        assert_eq!(
            configured_pod_ips(&result, &found.unwrap_or_default()),
            vec![v4, v6],
            "an address of the result that is not configured is not a pod IP"
        );
        assert!(parse_ip_addr_json("{", "eth0").is_err());
    }

    #[test]
    fn cidr_membership() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap_or(IpAddr::from([0; 4]));
        assert!(cidr_contains("10.244.1.0/24", ip("10.244.1.200")));
        assert!(!cidr_contains("10.244.1.0/24", ip("10.244.2.1")));
        assert!(cidr_contains("fd00:1::/64", ip("fd00:1::5")));
        assert!(!cidr_contains("fd00:1::/64", ip("10.244.1.1")));
        assert!(cidr_contains("0.0.0.0/0", ip("1.2.3.4")));
        assert!(!cidr_contains("garbage", ip("1.2.3.4")));
    }
}
