//! What the oracle is fed: the cluster's pods, reservations, Events, Nodes and the audit log
//! (read straight from the API server, not through the fault proxy), and each node's files.

use std::{collections::BTreeMap, net::IpAddr, path::Path};

use jiff::Timestamp;
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Event, Node, Pod},
};
use kube::{Api, Client, api::ListParams};

use ipkeep_operator::api::{IPReservation, Phase};

use crate::cluster::realnode::{Cluster, RealNode};
use crate::testkit::realnode::{RELEASE_NS, network_dir};

use super::{
    oracle::{Deletion, EventSeen, NodeFiles, PodView, ReservationView, Sample},
    workload::OUTSIDE_NS,
};

/// A sample of the cluster and the nodes now; `Err` when the API server could not be read
/// (a fault in force: the sample is skipped).
pub async fn sample(client: &Client, c: &Cluster) -> Result<Sample, kube::Error> {
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    let reservations = Api::<IPReservation>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    let lease = Api::<Lease>::namespaced(client.clone(), RELEASE_NS)
        .get_opt(LEASE)
        .await?;
    let at = Timestamp::now();
    Ok(Sample {
        at,
        pods: pods.items.iter().filter_map(pod_view).collect(),
        reservations: reservations
            .items
            .iter()
            .filter_map(reservation_view)
            .collect(),
        nodes: c
            .nodes()
            .iter()
            .map(|n| (n.name(), node_files(n)))
            .collect(),
        budgets: nodes.items.iter().filter_map(budget).collect(),
        led: lease.as_ref().is_some_and(|l| leads(l, at)),
    })
}

/// The release's Lease (the chart's default name).
const LEASE: &str = "ipkeep-controller";

/// Whether `lease` is held at `at`: a holder, renewed within its duration.
fn leads(lease: &Lease, at: Timestamp) -> bool {
    let Some(spec) = lease.spec.as_ref() else {
        return false;
    };
    let held = spec
        .holder_identity
        .as_deref()
        .is_some_and(|h| !h.is_empty());
    let renewed = spec.renew_time.as_ref().map(|t| t.0);
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(0));
    held && renewed.is_some_and(|r| at <= r + jiff::SignedDuration::from_secs(duration))
}

fn pod_view(p: &Pod) -> Option<PodView> {
    let meta = &p.metadata;
    let spec = p.spec.as_ref()?;
    let status = p.status.clone().unwrap_or_default();
    let ns = meta.namespace.clone()?;
    let retained = ns != OUTSIDE_NS
        && meta
            .annotations
            .as_ref()
            .and_then(|a| a.get("ipkeep.dev/retain"))
            .is_some_and(|v| v == "true");
    Some(PodView {
        name: meta.name.clone()?,
        uid: meta.uid.clone()?,
        node: spec.node_name.clone(),
        ips: status
            .pod_ips
            .unwrap_or_default()
            .iter()
            .filter_map(|i| i.ip.parse().ok())
            .collect(),
        phase: status.phase.unwrap_or_default(),
        deleting: meta.deletion_timestamp.is_some(),
        ready_since: status
            .conditions
            .unwrap_or_default()
            .iter()
            .find(|c| c.type_ == "Ready" && c.status == "True")
            .and_then(|c| c.last_transition_time.as_ref().map(|t| t.0)),
        created: meta.creation_timestamp.as_ref()?.0,
        retained,
        host_network: spec.host_network.unwrap_or(false),
        ns,
    })
}

fn reservation_view(r: &IPReservation) -> Option<ReservationView> {
    let status = r.status.as_ref();
    Some(ReservationView {
        ns: r.metadata.namespace.clone()?,
        name: r.metadata.name.clone()?,
        uid: r.metadata.uid.clone()?,
        node: r.spec.node_name.clone(),
        ips: r.spec.ips.iter().filter_map(|i| i.0.parse().ok()).collect(),
        released: status.and_then(|s| s.phase) == Some(Phase::Released),
        release_time: status.and_then(|s| s.release_time.as_ref().map(|t| t.0)),
        conflict: r.in_conflict(),
    })
}

/// A node's budget of Released reservations, as docs/operator.md says the controller computes
/// it: the Node's `ipkeep.dev/node-budget`, else the IPv4 pod CIDR's host-local addresses
/// (network, gateway and broadcast excluded) minus the pods the kubelet admits.
fn budget(n: &Node) -> Option<(String, u32)> {
    let name = n.metadata.name.clone()?;
    if let Some(b) = n
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("ipkeep.dev/node-budget"))
        .and_then(|v| v.parse().ok())
    {
        return Some((name, b));
    }
    let cidr = n.spec.as_ref()?.pod_cidr.clone()?;
    let prefix: u32 = cidr.split_once('/')?.1.parse().ok()?;
    let addresses = (1u32 << (32 - prefix.min(30))).saturating_sub(3);
    let pods: u32 = n
        .status
        .as_ref()?
        .allocatable
        .as_ref()?
        .get("pods")?
        .0
        .parse()
        .ok()?;
    Some((name, addresses.saturating_sub(pods)))
}

/// What `node`'s network directory holds (empty when it is gone: a wiped directory).
pub fn node_files(node: &RealNode) -> NodeFiles {
    let dir = network_dir(node);
    let mut files = NodeFiles::default();
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let Some(ip) = e
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<IpAddr>().ok())
        else {
            continue;
        };
        let since = e
            .metadata()
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| Timestamp::try_from(t).ok())
            .unwrap_or_else(Timestamp::now);
        files.allocations.push((ip, since));
    }
    let reserved = dir.join("reserved");
    for ns in std::fs::read_dir(&reserved).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(ns.path()).into_iter().flatten().flatten() {
            if let Some(r) = reservation_file(&f.path()) {
                files.reserved.push(r);
            }
        }
    }
    files
}

/// A reservation file's pod, addresses and UID, read loosely (any version of the format).
fn reservation_file(path: &Path) -> Option<((String, String), Vec<IpAddr>, String)> {
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let s = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_owned);
    let ips = v
        .get("ips")?
        .as_array()?
        .iter()
        .filter_map(|i| i.as_str()?.parse().ok())
        .collect();
    Some((
        (s("namespace")?, s("pod")?),
        ips,
        s("uid").unwrap_or_default(),
    ))
}

/// Every Event of the cluster.
pub async fn events(client: &Client) -> Result<Vec<EventSeen>, kube::Error> {
    let list = Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    Ok(list
        .items
        .iter()
        .filter_map(|e| {
            let at = e
                .last_timestamp
                .as_ref()
                .map(|t| t.0)
                .or(e.event_time.as_ref().map(|t| t.0))
                .or(e.first_timestamp.as_ref().map(|t| t.0))
                .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0))?;
            Some(EventSeen {
                about: (
                    e.involved_object.namespace.clone().unwrap_or_default(),
                    e.involved_object.name.clone()?,
                ),
                reason: e.reason.clone()?,
                at,
            })
        })
        .collect())
}

/// The reservation deletions the API server's audit log recorded (completed, successful).
pub fn deletions(audit_log: &Path) -> Vec<Deletion> {
    use std::io::BufRead;
    let Ok(file) = std::fs::File::open(audit_log) else {
        return Vec::new();
    };
    std::io::BufReader::new(file)
        .lines()
        .map_while(Result::ok)
        .filter(|l| l.contains("\"ipreservations\"") && l.contains("\"delete\""))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
        .filter(|v| {
            v["verb"] == "delete"
                && v["stage"] == "ResponseComplete"
                && v["objectRef"]["resource"] == "ipreservations"
                && v["objectRef"]["subresource"].is_null()
                && v["responseStatus"]["code"]
                    .as_u64()
                    .is_some_and(|c| (200..300).contains(&c))
        })
        .filter_map(|v| {
            Some(Deletion {
                at: v["requestReceivedTimestamp"].as_str()?.parse().ok()?,
                key: (
                    v["objectRef"]["namespace"].as_str()?.to_owned(),
                    v["objectRef"]["name"].as_str()?.to_owned(),
                ),
                user: v["user"]["username"].as_str()?.to_owned(),
            })
        })
        .collect()
}

/// Each node's name by its index, for the report.
pub fn node_names(c: &Cluster) -> BTreeMap<usize, String> {
    c.nodes()
        .iter()
        .enumerate()
        .map(|(i, n)| (i, n.name()))
        .collect()
}
