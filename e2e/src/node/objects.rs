//! The Kubernetes objects a kubelet writes, pure, with `now` passed in: the Node, its status and
//! Lease, a pod's status (running or still creating) and the Event of a failed sandbox.

use std::net::IpAddr;

use jiff::Timestamp;
use serde_json::{Value, json};

/// The namespace of node Leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";

/// `leaseDurationSeconds` of the node Lease (the kubelet's default).
pub const LEASE_DURATION_SECONDS: i64 = 40;

/// The version the stand-in reports as its kubelet version.
pub const KUBELET_VERSION: &str = "v1.34.4-ipkeep-standin";

/// The reason of the Event a failed sandbox creation gets (the kubelet's).
pub const REASON_FAILED_SANDBOX: &str = "FailedCreatePodSandBox";

/// A `Time` (whole seconds, UTC).
pub fn time(now: Timestamp) -> String {
    now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// A `MicroTime` (microseconds, UTC), as Lease `renewTime` and `events.k8s.io` use.
pub fn micro_time(now: Timestamp) -> String {
    now.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// The Node object a kubelet registers: labels, `podCIDR`/`podCIDRs`.
pub fn node(name: &str, pod_cidrs: &[String]) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": std::env::consts::ARCH.replace("x86_64", "amd64").replace("aarch64", "arm64"),
                "ipkeep.dev/stand-in": "true",
            },
        },
        "spec": {
            "podCIDR": pod_cidrs.first(),
            "podCIDRs": pod_cidrs,
        },
    })
}

/// The Node's status: Ready with a fresh heartbeat, the pressure conditions and
/// NetworkUnavailable False, the
/// capacity the scheduler fits pods into (1000 CPUs, 1 TiB, 250 pods), the node's address.
pub fn node_status(name: &str, host_ip: IpAddr, ready_since: Timestamp, now: Timestamp) -> Value {
    let condition = |kind: &str, status: &str, reason: &str, message: &str| {
        json!({
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": time(now),
            "lastTransitionTime": time(ready_since),
        })
    };
    let resources =
        json!({"cpu": "1k", "memory": "1Ti", "pods": "250", "ephemeral-storage": "1Ti"});
    json!({
        "status": {
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                condition("NetworkUnavailable", "False", "StandInNetwork", "the stand-in's bridge network is configured"),
                condition("Ready", "True", "KubeletReady", "kubelet is posting ready status (ipkeep stand-in)"),
            ],
            "capacity": resources,
            "allocatable": resources,
            "addresses": [
                {"type": "InternalIP", "address": host_ip.to_string()},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": "",
                "osImage": "ipkeep kubelet stand-in",
                "containerRuntimeVersion": "ipkeep-standin://0.1.0",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": std::env::consts::ARCH.replace("x86_64", "amd64").replace("aarch64", "arm64"),
            },
        },
    })
}

/// The node's Lease in `kube-node-lease`, owned by the Node (so it goes with it), renewed `now`.
pub fn lease(node: &str, node_uid: &str, now: Timestamp) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": node,
            "namespace": LEASE_NAMESPACE,
            "ownerReferences": [{
                "apiVersion": "v1",
                "kind": "Node",
                "name": node,
                "uid": node_uid,
            }],
        },
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": LEASE_DURATION_SECONDS,
            "renewTime": micro_time(now),
        },
    })
}

/// What a pod's containers are: their names and images, from `spec.containers`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerSpec {
    /// `name`.
    pub name: String,
    /// `image`.
    pub image: String,
}

/// Running pod status: phase Running, `podIP`/`podIPs` (`podIPs[0] == podIP`), host IPs, every
/// condition True and every container running and ready, as the StatefulSet controller needs.
pub fn pod_running_status(
    containers: &[ContainerSpec],
    pod_ips: &[IpAddr],
    host_ip: IpAddr,
    container_id: &str,
    now: Timestamp,
) -> Value {
    let conditions: Vec<Value> = [
        "PodReadyToStartContainers",
        "Initialized",
        "Ready",
        "ContainersReady",
        "PodScheduled",
    ]
    .iter()
    .map(|kind| json!({"type": kind, "status": "True", "lastProbeTime": null, "lastTransitionTime": time(now)}))
    .collect();
    let statuses: Vec<Value> = containers
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "image": c.image,
                "imageID": "",
                "containerID": format!("ipkeep-standin://{container_id}"),
                "ready": true,
                "started": true,
                "restartCount": 0,
                "state": {"running": {"startedAt": time(now)}},
            })
        })
        .collect();
    let ips: Vec<Value> = pod_ips
        .iter()
        .map(|ip| json!({"ip": ip.to_string()}))
        .collect();
    json!({
        "status": {
            "phase": "Running",
            "conditions": conditions,
            "hostIP": host_ip.to_string(),
            "hostIPs": [{"ip": host_ip.to_string()}],
            "podIP": pod_ips.first().map(ToString::to_string),
            "podIPs": ips,
            "startTime": time(now),
            "containerStatuses": statuses,
        },
    })
}

/// Pending pod status while its sandbox cannot be created: scheduled, not ready, every
/// container waiting in `ContainerCreating`, no pod IP.
pub fn pod_pending_status(containers: &[ContainerSpec], host_ip: IpAddr, now: Timestamp) -> Value {
    let condition = |kind: &str, status: &str, reason: Option<&str>| {
        let mut c = json!({"type": kind, "status": status, "lastProbeTime": null, "lastTransitionTime": time(now)});
        if let (Some(reason), Some(map)) = (reason, c.as_object_mut()) {
            map.insert("reason".into(), json!(reason));
        }
        c
    };
    let statuses: Vec<Value> = containers
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "image": c.image,
                "imageID": "",
                "ready": false,
                "started": false,
                "restartCount": 0,
                "state": {"waiting": {"reason": "ContainerCreating"}},
            })
        })
        .collect();
    json!({
        "status": {
            "phase": "Pending",
            "conditions": [
                condition("PodReadyToStartContainers", "False", None),
                condition("Initialized", "True", None),
                condition("Ready", "False", Some("ContainersNotReady")),
                condition("ContainersReady", "False", Some("ContainersNotReady")),
                condition("PodScheduled", "True", None),
            ],
            "hostIP": host_ip.to_string(),
            "hostIPs": [{"ip": host_ip.to_string()}],
            "podIP": null,
            "podIPs": null,
            "startTime": time(now),
            "containerStatuses": statuses,
        },
    })
}

/// The kubelet's message for a sandbox whose network setup failed.
pub fn failed_sandbox_message(container_id: &str, plugin_message: &str) -> String {
    format!(
        "Failed to create pod sandbox: failed to setup network for sandbox \"{container_id}\": plugin type=\"bridge\" failed (add): {plugin_message}"
    )
}

/// A core/v1 Warning Event on a pod, from the kubelet of `node` (named `<pod>.<nonce>`).
pub fn pod_warning_event(
    pod: &super::cni::PodRef,
    node: &str,
    reason: &str,
    message: &str,
    nonce: u64,
    now: Timestamp,
) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": format!("{}.{nonce:x}", pod.name),
            "namespace": pod.namespace,
        },
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": pod.namespace,
            "name": pod.name,
            "uid": pod.uid,
        },
        "reason": reason,
        "message": message,
        "type": "Warning",
        "source": {"component": "kubelet", "host": node},
        "reportingComponent": "kubelet",
        "reportingInstance": node,
        "firstTimestamp": time(now),
        "lastTimestamp": time(now),
        "count": 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        Timestamp::from_second(1_767_225_600).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn times_are_rfc3339_utc() {
        let t = now() + jiff::SignedDuration::from_micros(1_500);
        assert_eq!(time(t), "2026-01-01T00:00:00Z");
        assert_eq!(micro_time(t), "2026-01-01T00:00:00.001500Z");
    }

    #[test]
    fn the_node_carries_its_pod_cidrs_and_a_ready_heartbeat() {
        let n = node("node-a", &["10.244.1.0/24".into(), "fd00:1::/64".into()]);
        assert_eq!(n["spec"]["podCIDR"], "10.244.1.0/24");
        assert_eq!(n["spec"]["podCIDRs"][1], "fd00:1::/64");
        assert_eq!(n["metadata"]["labels"]["kubernetes.io/hostname"], "node-a");
        let later = now() + jiff::SignedDuration::from_secs(10);
        let s = node_status("node-a", IpAddr::from([127, 0, 0, 1]), now(), later);
        let ready = s["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
            .cloned()
            .unwrap_or_default();
        assert_eq!(ready["status"], "True");
        assert_eq!(ready["lastHeartbeatTime"], "2026-01-01T00:00:10Z");
        assert_eq!(ready["lastTransitionTime"], "2026-01-01T00:00:00Z");
        for c in s["status"]["conditions"].as_array().unwrap() {
            let want = if c["type"] == "Ready" {
                "True"
            } else {
                "False"
            };
            assert_eq!(c["status"], want, "{c}");
        }
        assert_eq!(s["status"]["allocatable"]["pods"], "250");
        assert_eq!(s["status"]["capacity"]["cpu"], "1k");
        assert_eq!(s["status"]["addresses"][0]["address"], "127.0.0.1");
    }

    #[test]
    fn the_lease_is_owned_by_the_node_and_renewed_now() {
        let l = lease("node-a", "uid-1", now());
        assert_eq!(l["metadata"]["namespace"], "kube-node-lease");
        assert_eq!(l["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        assert_eq!(l["spec"]["holderIdentity"], "node-a");
        assert_eq!(l["spec"]["renewTime"], "2026-01-01T00:00:00.000000Z");
    }

    #[test]
    fn running_status_is_ready_with_pod_ips_in_order() {
        let v4 = IpAddr::from([10, 244, 1, 2]);
        let v6: IpAddr = "fd00::2".parse().unwrap();
        let containers = [ContainerSpec {
            name: "app".into(),
            image: "busybox".into(),
        }];
        let s = pod_running_status(
            &containers,
            &[v4, v6],
            IpAddr::from([127, 0, 0, 1]),
            "cid",
            now(),
        );
        let s = &s["status"];
        assert_eq!(s["phase"], "Running");
        assert_eq!(s["podIP"], "10.244.1.2");
        assert_eq!(
            s["podIPs"],
            json!([{"ip": "10.244.1.2"}, {"ip": "fd00::2"}])
        );
        assert_eq!(s["podIPs"][0]["ip"], s["podIP"]);
        for c in s["conditions"].as_array().unwrap() {
            assert_eq!(c["status"], "True", "{c}");
        }
        assert_eq!(s["containerStatuses"][0]["ready"], true);
        assert!(s["containerStatuses"][0]["state"]["running"].is_object());
    }

    #[test]
    fn pending_status_is_not_ready_and_has_no_ip() {
        let containers = [ContainerSpec {
            name: "app".into(),
            image: "busybox".into(),
        }];
        let s = pod_pending_status(&containers, IpAddr::from([127, 0, 0, 1]), now());
        let s = &s["status"];
        assert_eq!(s["phase"], "Pending");
        assert!(s["podIP"].is_null());
        let ready = s["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap();
        assert_eq!(ready["status"], "False");
        assert_eq!(
            s["containerStatuses"][0]["state"]["waiting"]["reason"],
            "ContainerCreating"
        );
    }

    #[test]
    fn failed_sandbox_events_are_warnings_naming_the_pod() {
        let pod = super::super::cni::PodRef {
            namespace: "db".into(),
            name: "web-0".into(),
            uid: "u1".into(),
        };
        let msg = failed_sandbox_message("abc", "no IP addresses available");
        assert!(msg.contains("\"abc\"") && msg.ends_with("no IP addresses available"));
        let e = pod_warning_event(&pod, "node-a", REASON_FAILED_SANDBOX, &msg, 255, now());
        assert_eq!(e["metadata"]["name"], "web-0.ff");
        assert_eq!(e["type"], "Warning");
        assert_eq!(e["involvedObject"]["uid"], "u1");
        assert_eq!(e["source"]["host"], "node-a");
        assert_eq!(e["message"], msg);
    }
}
