//! The controller's Prometheus metrics. Reservation counts and the time to the next expiry are
//! computed from the reservation cache when scraped, so they are never stale.

use std::{collections::HashMap, sync::Arc};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::{ResourceExt, runtime::reflector::Store};
use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    core::{Collector, Desc},
    proto::MetricFamily,
};

use super::{cache::CachedReservation, view};
use crate::api::Phase;
use crate::rules::budget;

/// The metrics the controller updates as it works.
#[derive(Debug, Clone)]
pub struct Metrics {
    /// Reservations deleted at their release time.
    pub expirations: IntCounter,
    /// How late each expiry fired after its release time, in seconds.
    pub expiry_lateness: Histogram,
    /// Reconciles that failed, by kind of failure.
    pub reconcile_errors: IntCounterVec,
    /// How long reconciles took, in seconds.
    pub reconcile_duration: Histogram,
    /// 1 while this replica is the leader, else 0.
    pub leader: IntGauge,
    /// Events queued for posting, by reason and type.
    pub events: IntCounterVec,
    /// Events dropped because the queue was full (or the controller was stopping).
    pub events_dropped: IntCounter,
    /// Reservations deleted early because their node was over its budget, by node.
    pub yielded: IntCounterVec,
}

/// Errors of registering metrics.
#[derive(Debug, thiserror::Error)]
#[error("failed to register the controller's metrics")]
pub struct MetricsError(#[source] pub prometheus::Error);

impl Metrics {
    /// Creates the metrics and registers them, plus the cache-derived ones, in `registry`.
    pub fn register(
        registry: &Registry,
        reservations: Store<CachedReservation>,
        nodes: Store<Node>,
        node_budget: Option<u64>,
    ) -> Result<Metrics, MetricsError> {
        let m = Metrics::new().map_err(MetricsError)?;
        let collectors: Vec<Box<dyn Collector>> = vec![
            Box::new(m.expirations.clone()),
            Box::new(m.expiry_lateness.clone()),
            Box::new(m.reconcile_errors.clone()),
            Box::new(m.reconcile_duration.clone()),
            Box::new(m.leader.clone()),
            Box::new(m.events.clone()),
            Box::new(m.events_dropped.clone()),
            Box::new(m.yielded.clone()),
            Box::new(CacheCollector::new(reservations, nodes, node_budget).map_err(MetricsError)?),
        ];
        for c in collectors {
            registry.register(c).map_err(MetricsError)?;
        }
        Ok(m)
    }

    fn new() -> Result<Metrics, prometheus::Error> {
        Ok(Metrics {
            expirations: IntCounter::new(
                "ipkeep_controller_expirations_total",
                "Reservations deleted because their release time came.",
            )?,
            expiry_lateness: Histogram::with_opts(
                HistogramOpts::new(
                    "ipkeep_controller_expiry_lateness_seconds",
                    "How long after its release time each expired reservation was deleted.",
                )
                .buckets(vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 30.0, 300.0]),
            )?,
            reconcile_errors: IntCounterVec::new(
                Opts::new(
                    "ipkeep_controller_reconcile_errors_total",
                    "Reconciles that failed, by kind of failure.",
                ),
                &["kind"],
            )?,
            reconcile_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "ipkeep_controller_reconcile_duration_seconds",
                    "How long one reconcile of a pod's reservation took.",
                )
                .buckets(vec![0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0]),
            )?,
            leader: IntGauge::new(
                "ipkeep_controller_leader",
                "1 while this replica holds the leader lease and reconciles, else 0.",
            )?,
            events: IntCounterVec::new(
                Opts::new(
                    "ipkeep_controller_events_total",
                    "Kubernetes Events queued for posting, by reason and type (Normal ones only with --normal-events).",
                ),
                &["reason", "type"],
            )?,
            events_dropped: IntCounter::new(
                "ipkeep_controller_events_dropped_total",
                "Kubernetes Events not posted because their queue was full or the controller was stopping.",
            )?,
            yielded: IntCounterVec::new(
                Opts::new(
                    "ipkeep_controller_yielded_total",
                    "Released reservations deleted before their release time because their node held more than its budget.",
                ),
                &["node"],
            )?,
        })
    }
}

/// Reservations by phase, seconds until the next expiry, and each node's held addresses and
/// budget, computed from the caches on scrape.
struct CacheCollector {
    store: Store<CachedReservation>,
    nodes: Store<Node>,
    node_budget: Option<u64>,
    phases: prometheus::IntGaugeVec,
    next_expiry: prometheus::Gauge,
    node_held: prometheus::IntGaugeVec,
    node_budgets: prometheus::IntGaugeVec,
    descs: Vec<Desc>,
}

impl CacheCollector {
    fn new(
        store: Store<CachedReservation>,
        nodes: Store<Node>,
        node_budget: Option<u64>,
    ) -> Result<CacheCollector, prometheus::Error> {
        let phases = prometheus::IntGaugeVec::new(
            Opts::new(
                "ipkeep_controller_reservations",
                "IPReservations the controller sees, by status.phase (None: not yet written).",
            ),
            &["phase"],
        )?;
        let next_expiry = prometheus::Gauge::new(
            "ipkeep_controller_next_expiry_seconds",
            "Seconds until the earliest release time of a Released reservation (0 when overdue, -1 when none is due).",
        )?;
        let node_held = prometheus::IntGaugeVec::new(
            Opts::new(
                "ipkeep_controller_node_released_reservations",
                "Released reservations holding addresses on each node (one address per family each).",
            ),
            &["node"],
        )?;
        let node_budgets = prometheus::IntGaugeVec::new(
            Opts::new(
                "ipkeep_controller_node_budget",
                "How many Released reservations each node may hold, and where that came from (annotation, flag, podCIDRs).",
            ),
            &["node", "source"],
        )?;
        let mut descs: Vec<Desc> = phases.desc().into_iter().cloned().collect();
        descs.extend(next_expiry.desc().into_iter().cloned());
        descs.extend(node_held.desc().into_iter().cloned());
        descs.extend(node_budgets.desc().into_iter().cloned());
        Ok(CacheCollector {
            store,
            nodes,
            node_budget,
            phases,
            next_expiry,
            node_held,
            node_budgets,
            descs,
        })
    }
}

impl Collector for CacheCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let (mut bound, mut released, mut none) = (0, 0, 0);
        let mut earliest: Option<Timestamp> = None;
        let mut held: HashMap<String, i64> = HashMap::new();
        for r in self.store.state() {
            let status = &r.view.status;
            match status.phase {
                Some(Phase::Bound) => bound += 1,
                Some(Phase::Released) => {
                    released += 1;
                    *held.entry(r.view.node_name.clone()).or_default() += 1;
                    if let Some(t) = status.release_time {
                        earliest = Some(earliest.map_or(t, |e| e.min(t)));
                    }
                }
                None => none += 1,
            }
        }
        self.phases.with_label_values(&["Bound"]).set(bound);
        self.phases.with_label_values(&["Released"]).set(released);
        self.phases.with_label_values(&["None"]).set(none);
        let seconds = earliest.map_or(-1.0, |t| {
            let d = t.duration_since(Timestamp::now()).as_secs_f64();
            d.max(0.0)
        });
        self.next_expiry.set(seconds);
        self.node_held.reset();
        self.node_budgets.reset();
        for node in self.nodes.state() {
            let name = node.name_any();
            self.node_held
                .with_label_values(&[name.as_str()])
                .set(held.get(&name).copied().unwrap_or(0));
            if let Some(b) = budget::node_budget(&view::node_facts(&node), self.node_budget) {
                self.node_budgets
                    .with_label_values(&[name.as_str(), b.source.as_str()])
                    .set(i64::try_from(b.held).unwrap_or(i64::MAX));
            }
        }
        let mut families = self.phases.collect();
        families.extend(self.next_expiry.collect());
        families.extend(self.node_held.collect());
        families.extend(self.node_budgets.collect());
        families
    }
}

/// Shared handle.
pub type SharedMetrics = Arc<Metrics>;
