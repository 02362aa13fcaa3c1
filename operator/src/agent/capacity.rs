//! Saying how full the node's ranges are, so the on-call person sees a node filling up before a
//! pod is Pending with "no IP addresses available in range set": every [`EVERY`] the agent counts,
//! per network and pod CIDR, the allocation files in `<dataDir>/<network>/` and the addresses its
//! node's reservations hold, and reports [`crate::rules::capacity`]'s figures
//! * as metrics ([`CapacityMetrics`]), and
//! * on its own Node, for those without Prometheus: the annotations
//!   [`FREE_ADDRESSES`](crate::rules::capacity::FREE_ADDRESSES) and
//!   [`CAPACITY`](crate::rules::capacity::CAPACITY), written with a merge patch under
//!   [`FIELD_MANAGER`] (the agent's one field manager) only when their text changes, at most every
//!   [`ANNOTATE_EVERY`], and only once the watch has seen the Node.
//!
//! The ranges are the Node's `spec.podCIDRs` with host-local's default range (what flannel and a
//! per-node `subnet` configure); the budget is the Node's annotation or its pod CIDRs, as the
//! controller computes it without `--node-budget`. The Node is watched (its own, by field selector),
//! not read every time.

use std::{collections::BTreeSet, net::IpAddr, path::Path, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use prometheus::{GaugeVec, IntGauge, IntGaugeVec, Opts, Registry};
use serde_json::json;

use super::{AgentConfig, incharge::report::FIELD_MANAGER, view};
use crate::{
    api::IPReservation,
    controller::view::{node_facts, trim_node},
    rules::{
        capacity::{Holder, NodeCapacity, allocated, holdings, node_capacity},
        desired::desired_files,
    },
    runtime::logging::error_chain,
};

/// How often the figures are counted (a directory listing per network and the reservations in
/// memory).
pub const EVERY: Duration = Duration::from_secs(10);
/// How often the first count looks for the Node until the watch has seen it.
const FIRST_LOOK: Duration = Duration::from_millis(200);
/// The Node is written at most this often: every write of a Node goes to every Node watcher
/// (scheduler, controller-manager, each DaemonSet controller...), and a busy node's count changes
/// with every pod. The metrics follow every [`EVERY`].
pub const ANNOTATE_EVERY: Duration = Duration::from_secs(30);

/// The capacity metrics (every one labelled with the network and, but the headroom, the pod CIDR).
#[derive(Debug, Clone)]
pub struct CapacityMetrics {
    /// `ipkeep_agent_range_addresses{network,range}`.
    pub addresses: GaugeVec,
    /// `ipkeep_agent_range_allocated_addresses{network,range}`.
    pub allocated: GaugeVec,
    /// `ipkeep_agent_range_reserved_addresses{network,range,phase}`.
    pub reserved: GaugeVec,
    /// `ipkeep_agent_range_free_addresses{network,range}`.
    pub free: GaugeVec,
    /// `ipkeep_agent_budget_headroom{source}`.
    pub headroom: IntGaugeVec,
    /// `ipkeep_agent_conflicting_reservations`: counted with the rest, since the same pass
    /// plans them.
    pub conflicting: IntGauge,
}

impl CapacityMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let range =
            |name: &str, help: &str| GaugeVec::new(Opts::new(name, help), &["network", "range"]);
        let m = Self {
            addresses: range(
                "ipkeep_agent_range_addresses",
                "Addresses host-local hands out of the node's pod CIDR in the network (the gateway excluded)",
            )?,
            allocated: range(
                "ipkeep_agent_range_allocated_addresses",
                "Addresses of the range with an allocation file (a container holds them)",
            )?,
            reserved: GaugeVec::new(
                Opts::new(
                    "ipkeep_agent_range_reserved_addresses",
                    "Addresses of the range the node's active reservations hold, by phase (Bound: the pod exists; Released: only the pod may take it back)",
                ),
                &["network", "range", "phase"],
            )?,
            free: range(
                "ipkeep_agent_range_free_addresses",
                "Addresses of the range an ADD can take: neither allocated nor held by a reservation",
            )?,
            headroom: IntGaugeVec::new(
                Opts::new(
                    "ipkeep_agent_budget_headroom",
                    "Released reservations the node may still hold before the oldest yields (its budget minus those it holds; negative until the controller deletes the excess), and where the budget came from",
                ),
                &["source"],
            )?,
            conflicting: IntGauge::new(
                "ipkeep_agent_conflicting_reservations",
                "Reservations of this node the controller marked Conflict: no file is written for them, the older reservation keeps the address",
            )?,
        };
        registry.register(Box::new(m.addresses.clone()))?;
        registry.register(Box::new(m.allocated.clone()))?;
        registry.register(Box::new(m.reserved.clone()))?;
        registry.register(Box::new(m.free.clone()))?;
        registry.register(Box::new(m.headroom.clone()))?;
        registry.register(Box::new(m.conflicting.clone()))?;
        Ok(m)
    }

    /// Sets every figure and drops the series of ranges and budget sources no longer there.
    fn set(&self, c: &NodeCapacity, shown: &mut BTreeSet<(String, String)>) {
        let mut now = BTreeSet::new();
        for n in &c.networks {
            for r in &n.ranges {
                let labels = [n.network.as_str(), r.cidr.as_str()];
                self.addresses
                    .with_label_values(&labels)
                    .set(r.addresses as f64);
                self.allocated
                    .with_label_values(&labels)
                    .set(r.allocated as f64);
                self.free.with_label_values(&labels).set(r.free as f64);
                for (holder, count) in [(Holder::Bound, r.bound), (Holder::Released, r.released)] {
                    self.reserved
                        .with_label_values(&[labels[0], labels[1], holder.label()])
                        .set(count as f64);
                }
                now.insert((n.network.clone(), r.cidr.clone()));
            }
        }
        for (network, cidr) in shown.difference(&now) {
            let labels = [network.as_str(), cidr.as_str()];
            let _ = self.addresses.remove_label_values(&labels);
            let _ = self.allocated.remove_label_values(&labels);
            let _ = self.free.remove_label_values(&labels);
            for holder in [Holder::Bound, Holder::Released] {
                let _ = self
                    .reserved
                    .remove_label_values(&[labels[0], labels[1], holder.label()]);
            }
        }
        *shown = now;
        self.headroom.reset();
        if let (Some(b), Some(h)) = (c.budget, c.headroom()) {
            self.headroom
                .with_label_values(&[b.source.as_str()])
                .set(i64::try_from(h).unwrap_or(i64::MIN));
        }
    }
}

/// Counts and reports until the task is aborted.
pub async fn run(
    config: AgentConfig,
    client: Client,
    reservations: Store<IPReservation>,
    metrics: CapacityMetrics,
) {
    let nodes: Api<Node> = Api::all(client);
    let (node_store, writer) = reflector::store::<Node>();
    let cfg = watcher::Config::default().fields(&format!("metadata.name={}", config.node_name));
    let watch = async {
        let mut stream = std::pin::pin!(
            watcher::watcher(nodes.clone(), cfg)
                .default_backoff()
                .modify(trim_node)
                .reflect(writer)
        );
        while let Some(event) = stream.next().await {
            if let Err(e) = event {
                tracing::warn!(error = %e, "Node watch failed; retrying");
            }
        }
    };
    let report = async {
        let mut shown = BTreeSet::new();
        let mut written = None;
        let mut last_write: Option<tokio::time::Instant> = None;
        let mut first = true;
        loop {
            if !first {
                tokio::time::sleep(EVERY).await;
            }
            // Until the watch has seen the Node there is nothing to count ranges in, and nothing
            // to annotate: look again shortly, and count as soon as it is there.
            let Some(node) = node_store.get(&ObjectRef::new(&config.node_name)) else {
                tokio::time::sleep(FIRST_LOOK).await;
                continue;
            };
            first = false;
            let (capacity, conflicting) = count(&config, &node, &reservations);
            metrics.set(&capacity, &mut shown);
            metrics
                .conflicting
                .set(i64::try_from(conflicting).unwrap_or(i64::MAX));
            let annotations = capacity.annotations();
            let too_soon = last_write.is_some_and(|t| t.elapsed() < ANNOTATE_EVERY);
            if written.as_ref() == Some(&annotations) || too_soon {
                continue;
            }
            last_write = Some(tokio::time::Instant::now());
            written = match annotate(&nodes, &config.node_name, &annotations).await {
                Ok(()) => Some(annotations),
                Err(e) => {
                    tracing::warn!(error = %error_chain(&e), "failed to write the Node's capacity annotations; retrying");
                    None
                }
            };
        }
    };
    tokio::select! {
        () = watch => {}
        () = report => {}
    }
}

/// The node's figures now (its reservations as the files the agent writes, its networks'
/// allocation files, its Node), and how many of its reservations are in conflict.
fn count(
    config: &AgentConfig,
    node: &Node,
    reservations: &Store<IPReservation>,
) -> (NodeCapacity, usize) {
    let desired = desired_files(
        &config.node_name,
        &view::reservations(reservations.state().iter().map(AsRef::as_ref)),
        config.default_retain_for,
    );
    let now = ipkeep_reservation::Timestamp::from_system_time(std::time::SystemTime::now());
    let held = holdings(desired.files.values().map(|f| &**f), now);
    let allocations: Vec<(String, Vec<IpAddr>)> = config
        .networks
        .iter()
        .map(|n| (n.clone(), allocation_files(&config.data_dir.join(n))))
        .collect();
    (
        node_capacity(&node_facts(node), &allocations, &held),
        desired.conflicts.len(),
    )
}

/// The names of the regular files directly in a network directory, made addresses
/// ([`allocated`]); none when it cannot be listed (not created yet: no pod has had an address).
fn allocation_files(dir: &Path) -> Vec<IpAddr> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    allocated(names.iter().map(String::as_str))
}

/// Writes the annotations with a JSON merge patch under [`FIELD_MANAGER`] (`null` removes a
/// key): a patch, unlike an apply, never creates a Node that was deleted meanwhile.
async fn annotate(
    nodes: &Api<Node>,
    node: &str,
    annotations: &[(&'static str, Option<String>)],
) -> Result<(), kube::Error> {
    let annotations: serde_json::Map<String, serde_json::Value> = annotations
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    nodes
        .patch(
            node,
            &params,
            &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
        )
        .await
        .map(drop)
}
