//! The agent's Prometheus metrics, registered in the registry `/metrics` serves.

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use super::{capacity::CapacityMetrics, incharge::report::InChargeMetrics};

/// Errors of registering the metrics.
#[derive(Debug, thiserror::Error)]
#[error("failed to register the agent's metrics")]
pub struct MetricsError(#[source] prometheus::Error);

/// Every metric the agent exports.
#[derive(Debug, Clone)]
pub struct AgentMetrics {
    /// `ipkeep_agent_files_written_total`: reservation files created or rewritten.
    pub files_written: IntCounter,
    /// `ipkeep_agent_files_removed_total`: reservation files removed (gone, moved, conflict).
    pub files_removed: IntCounter,
    /// `ipkeep_agent_garbage_cleaned_total`: leftover temporaries and other garbage deleted.
    pub garbage_cleaned: IntCounter,
    /// `ipkeep_agent_sync_errors_total{kind}`: failed disk steps (`file`) and passes (`pass`, once
    /// per network).
    pub sync_errors: IntCounterVec,
    /// `ipkeep_agent_watch_errors_total`: errors of the reservation watch (it recovers by itself).
    pub watch_errors: IntCounter,
    /// `ipkeep_agent_full_syncs_total`: completed full resyncs.
    pub full_syncs: IntCounter,
    /// `ipkeep_agent_directory_resyncs_total{reason}`: passes the data directory's watch asked
    /// for (a network directory or `reserved/` removed or replaced), done.
    pub directory_resyncs: IntCounterVec,
    /// `ipkeep_agent_last_full_sync_timestamp_seconds`: when the last full resync completed.
    pub last_full_sync: IntGauge,
    /// `ipkeep_agent_seconds_since_last_full_sync`: refreshed every second by the agent.
    pub seconds_since_full_sync: IntGauge,
    /// `ipkeep_agent_reservations`: reservations written on this node (per network).
    pub reservations: IntGauge,
    /// `ipkeep_agent_refused_reservations`: this node's reservations refused (invalid names…).
    pub refused: IntGauge,
    /// `ipkeep_agent_change_to_file_seconds`: from the watch event's arrival to the file on disk.
    pub change_to_file: Histogram,
    /// `ipkeep_agent_host_local_reclaimed_total{how}`: times `host-local` was found not to be ipkeep
    /// (`overwritten`, `relinked`, `removed`) and ipkeep was installed again (`--guard-host-local`).
    pub host_local_reclaimed: IntCounterVec,
    /// `ipkeep_agent_in_charge{network}` and `ipkeep_agent_not_in_charge{network,reason}`.
    pub in_charge: InChargeMetrics,
    /// `ipkeep_agent_lost_reservations`: files kept because their reservation is lost.
    pub lost_reservations: IntGauge,
    /// How full the node's ranges are (`ipkeep_agent_range_*`, `ipkeep_agent_budget_headroom`).
    pub capacity: CapacityMetrics,
}

impl AgentMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> Result<Self, MetricsError> {
        let m = Self {
            files_written: IntCounter::new(
                "ipkeep_agent_files_written_total",
                "Reservation files created or rewritten",
            )
            .map_err(MetricsError)?,
            files_removed: IntCounter::new(
                "ipkeep_agent_files_removed_total",
                "Reservation files removed (reservation gone, moved to another node, in conflict)",
            )
            .map_err(MetricsError)?,
            garbage_cleaned: IntCounter::new(
                "ipkeep_agent_garbage_cleaned_total",
                "Leftover temporaries and other garbage deleted from reserved/",
            )
            .map_err(MetricsError)?,
            sync_errors: IntCounterVec::new(
                Opts::new(
                    "ipkeep_agent_sync_errors_total",
                    "Failed disk steps (kind=file) and failed passes, counted per network (kind=pass)",
                ),
                &["kind"],
            )
            .map_err(MetricsError)?,
            watch_errors: IntCounter::new(
                "ipkeep_agent_watch_errors_total",
                "Errors of the IPReservation watch (it retries with backoff)",
            )
            .map_err(MetricsError)?,
            full_syncs: IntCounter::new(
                "ipkeep_agent_full_syncs_total",
                "Completed full resyncs (start, watch gaps, periodic)",
            )
            .map_err(MetricsError)?,
            directory_resyncs: IntCounterVec::new(
                Opts::new(
                    "ipkeep_agent_directory_resyncs_total",
                    "Resyncs run at once because a network directory or its reserved/ was removed or replaced on the node, by cause",
                ),
                &["reason"],
            )
            .map_err(MetricsError)?,
            last_full_sync: IntGauge::new(
                "ipkeep_agent_last_full_sync_timestamp_seconds",
                "Unix time of the last completed full resync",
            )
            .map_err(MetricsError)?,
            seconds_since_full_sync: IntGauge::new(
                "ipkeep_agent_seconds_since_last_full_sync",
                "Seconds since the last completed full resync (-1 before the first)",
            )
            .map_err(MetricsError)?,
            reservations: IntGauge::new(
                "ipkeep_agent_reservations",
                "Reservations of this node that have a file (the same set in every network)",
            )
            .map_err(MetricsError)?,
            refused: IntGauge::new(
                "ipkeep_agent_refused_reservations",
                "Reservations of this node refused as invalid (never written)",
            )
            .map_err(MetricsError)?,
            change_to_file: Histogram::with_opts(
                HistogramOpts::new(
                    "ipkeep_agent_change_to_file_seconds",
                    "Time from a reservation change arriving on the watch to its file being on disk",
                )
                .buckets(vec![
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                ]),
            )
            .map_err(MetricsError)?,
            host_local_reclaimed: IntCounterVec::new(
                Opts::new(
                    "ipkeep_agent_host_local_reclaimed_total",
                    "Times host-local in the guarded CNI bin directory was not ipkeep and ipkeep was installed again, by what was found",
                ),
                &["how"],
            )
            .map_err(MetricsError)?,
            in_charge: InChargeMetrics {
                in_charge: IntGaugeVec::new(
                    Opts::new(
                        "ipkeep_agent_in_charge",
                        "1 while ipkeep is the IPAM the node's runtime calls for the network (with the agent's data directory), 0 while it is not: its reservations are then not protected",
                    ),
                    &["network"],
                )
                .map_err(MetricsError)?,
                not_in_charge: IntGaugeVec::new(
                    Opts::new(
                        "ipkeep_agent_not_in_charge",
                        "1 for the reason ipkeep is not in charge of the network on this node (NetworkNotConfigured, HostLocalNotReplaced, ...), 0 for the others",
                    ),
                    &["network", "reason"],
                )
                .map_err(MetricsError)?,
            },
            lost_reservations: lost_reservations()?,
            capacity: CapacityMetrics::register(registry).map_err(MetricsError)?,
        };
        m.seconds_since_full_sync.set(-1);
        for kind in ["file", "pass"] {
            m.sync_errors.with_label_values(&[kind]).reset();
        }
        for trigger in crate::rules::schedule::Trigger::ALL {
            m.directory_resyncs
                .with_label_values(&[trigger.label()])
                .reset();
        }
        for c in [
            Box::new(m.files_written.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(m.files_removed.clone()),
            Box::new(m.garbage_cleaned.clone()),
            Box::new(m.sync_errors.clone()),
            Box::new(m.watch_errors.clone()),
            Box::new(m.full_syncs.clone()),
            Box::new(m.directory_resyncs.clone()),
            Box::new(m.last_full_sync.clone()),
            Box::new(m.seconds_since_full_sync.clone()),
            Box::new(m.reservations.clone()),
            Box::new(m.refused.clone()),
            Box::new(m.change_to_file.clone()),
            Box::new(m.host_local_reclaimed.clone()),
            Box::new(m.in_charge.in_charge.clone()),
            Box::new(m.in_charge.not_in_charge.clone()),
            Box::new(m.lost_reservations.clone()),
        ] {
            registry.register(c).map_err(MetricsError)?;
        }
        Ok(m)
    }
}

/// `ipkeep_agent_lost_reservations` (issue 45: `rules::loss`).
fn lost_reservations() -> Result<IntGauge, MetricsError> {
    IntGauge::new(
        "ipkeep_agent_lost_reservations",
        "Reservation files this agent keeps because their IPReservation vanished before its release time by nobody's decision (CRD deleted, etcd restore): run ipkeep-operator recover",
    )
    .map_err(MetricsError)
}
