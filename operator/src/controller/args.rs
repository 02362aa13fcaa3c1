//! The controller's flags (`ipkeep-operator controller`, each also read from the environment) and
//! the [`Settings`] they become; tests build [`Settings`] directly.

use std::{net::SocketAddr, time::Duration};

use super::webhook_tls;
use crate::{
    api::retention::RetainFor,
    rules::{lifecycle::Defaults, namespaces::NamespaceSelector, optin},
    runtime::{events::Policy, leader::LeaseSettings, logging::LogArgs},
};

/// Command-line flags of `ipkeep-operator controller` (each also read from the environment).
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Logging.
    #[command(flatten)]
    pub log: LogArgs,
    /// Retention after a pod is gone when neither its `ipkeep.dev/retain-for` annotation nor the
    /// reservation's `spec.retainFor` says (a positive number followed by s, m, h or d; at most 366d).
    #[arg(long, env = "IPKEEP_DEFAULT_RETAIN_FOR", default_value = "24h", value_parser = RetainFor::parse)]
    pub default_retain_for: RetainFor,
    /// The longest retention anyone gets: a longer `ipkeep.dev/retain-for` (on a pod or a
    /// StatefulSet) or `spec.retainFor` is held to it, with a Warning Event `RetentionCapped` on
    /// the object that asked. At least `--default-retain-for`.
    #[arg(long, env = "IPKEEP_MAX_RETAIN_FOR", default_value = "7d", value_parser = RetainFor::parse)]
    pub max_retain_for: RetainFor,
    /// How many Released reservations may hold addresses on a node, for every node without an
    /// `ipkeep.dev/node-budget` annotation (default: its pod CIDRs' usable addresses minus its
    /// allocatable pods). When more do, the earliest released yield (are deleted early).
    #[arg(long, env = "IPKEEP_NODE_BUDGET")]
    pub node_budget: Option<u64>,
    /// Watch pods and reservations of this namespace only (default: every namespace).
    #[arg(long, env = "IPKEEP_NAMESPACE")]
    pub namespace: Option<String>,
    /// Watch only pods matching this label selector (e.g. `ipkeep.dev/enabled=true`); a pod outside
    /// it looks gone, so its reservation is released (but never deleted while the pod lives).
    #[arg(long, env = "IPKEEP_POD_SELECTOR")]
    pub pod_selector: Option<String>,
    /// Reserve only in namespaces whose labels match this label selector (e.g.
    /// `ipkeep.dev/reserve=true`; `a=b`, `a!=b`, `a in (x,y)`, `a notin (x,y)`, `a`, `!a`): an
    /// annotated pod elsewhere gets a Warning Event `NotReserved`, and a namespace relabelled out
    /// releases its reservations (never deleted while their pods live). Default: every namespace,
    /// and Namespaces are not watched.
    #[arg(long, env = "IPKEEP_NAMESPACE_SELECTOR", value_parser = NamespaceSelector::parse)]
    pub namespace_selector: Option<NamespaceSelector>,
    /// Where to serve /metrics, /healthz and /readyz.
    #[arg(long, env = "IPKEEP_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Elect a leader through a Lease so that only one replica reconciles (turn off only when a
    /// single replica runs).
    #[arg(long, env = "IPKEEP_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// The Lease's name.
    #[arg(long, env = "IPKEEP_LEASE_NAME", default_value = "ipkeep-controller")]
    pub lease_name: String,
    /// The Lease's namespace (the chart passes the controller's own namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// How long a lease holds without renewal, in seconds: a standby takes over at most this long
    /// after the leader dies or is cut off.
    #[arg(long, env = "IPKEEP_LEASE_DURATION", default_value_t = 15, value_parser = clap::value_parser!(u64).range(2..=600))]
    pub lease_duration: u64,
    /// This replica's identity in the Lease (default: `POD_NAME`, else host name and process id).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Reconcile workers (one name is never reconciled by two at once).
    #[arg(long, env = "IPKEEP_WORKERS", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub workers: u16,
    /// Also post Normal Events (`Reserved`, `Released`, `Rebound`, `Expired`, …), one write to the
    /// API server per transition the reservation's status already shows; Warnings are always posted.
    #[arg(long, env = "IPKEEP_NORMAL_EVENTS", default_value_t = false, action = clap::ArgAction::Set)]
    pub normal_events: bool,
    /// Where a returning pod goes when neither it nor its StatefulSet says (annotation
    /// `ipkeep.dev/placement`): `preferred` (its reservation's node when that node can take it),
    /// `required` (only that node: the pod waits for it) or `none` (the scheduler decides alone).
    #[arg(long, env = "IPKEEP_DEFAULT_PLACEMENT", default_value = "preferred", value_parser = parse_mode)]
    pub default_placement: optin::Mode,
    /// Serve the placement webhook (HTTPS, POST /mutate-pods) on this address; without it no
    /// webhook is served.
    #[arg(long, env = "IPKEEP_WEBHOOK_ADDR")]
    pub webhook_addr: Option<SocketAddr>,
    /// The Service the API server reaches the webhook through (its DNS names go on the serving
    /// certificate), in the controller's namespace.
    #[arg(long, env = "IPKEEP_WEBHOOK_SERVICE", default_value = "ipkeep-webhook")]
    pub webhook_service: String,
    /// The Secret (in the controller's namespace) where the controller keeps the webhook's CA and
    /// serving certificate.
    #[arg(
        long,
        env = "IPKEEP_WEBHOOK_SECRET",
        default_value = "ipkeep-webhook-tls"
    )]
    pub webhook_secret: String,
    /// The MutatingWebhookConfiguration whose `caBundle` the controller keeps (empty: someone
    /// else keeps it).
    #[arg(
        long,
        env = "IPKEEP_WEBHOOK_CONFIGURATION",
        default_value = "ipkeep-placement"
    )]
    pub webhook_configuration: String,
    /// Serve `tls.crt` and `tls.key` from this directory (cert-manager's Secret, mounted) instead
    /// of keeping a certificate in the Secret.
    #[arg(long, env = "IPKEEP_WEBHOOK_CERT_DIR")]
    pub webhook_cert_dir: Option<std::path::PathBuf>,
}

fn parse_mode(text: &str) -> Result<optin::Mode, String> {
    optin::Mode::parse(text).ok_or_else(|| format!("{text:?} is none of preferred, required, none"))
}

/// The placement webhook's settings.
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    /// Where to serve it (port 0 picks one).
    pub addr: SocketAddr,
    /// Where its certificate comes from.
    pub tls: webhook_tls::TlsSource,
}

/// What [`super::run`] needs besides a client.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Lifecycle defaults.
    pub defaults: Defaults,
    /// `--node-budget`: every node's budget unless its annotation says.
    pub node_budget: Option<u64>,
    /// Only this namespace (else all).
    pub namespace: Option<String>,
    /// Only pods matching this label selector.
    pub pod_selector: Option<String>,
    /// Only namespaces matching this selector keep addresses (`None`: every namespace, none
    /// watched).
    pub namespace_selector: Option<NamespaceSelector>,
    /// Probe server address (port 0 picks one).
    pub metrics_addr: SocketAddr,
    /// Leader election, or none (a single replica).
    pub lease: Option<LeaseSettings>,
    /// Number of reconcile workers.
    pub workers: usize,
    /// Which Events are posted.
    pub events: Policy,
    /// The placement webhook, if served.
    pub webhook: Option<WebhookSettings>,
}

impl Settings {
    /// Settings for one replica without leader election, probes on a free loopback port.
    pub fn single(default_retain_for: Duration) -> Settings {
        Settings {
            defaults: Defaults {
                retain_for: default_retain_for,
                placement: optin::Mode::Preferred,
                max_retain_for: RetainFor::MAX,
            },
            node_budget: None,
            namespace: None,
            pod_selector: None,
            namespace_selector: None,
            metrics_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            lease: None,
            workers: 4,
            events: Policy::default(),
            webhook: None,
        }
    }

    /// The settings `args` give; `identity` is this replica's name in the Lease.
    pub(super) fn from_args(args: &Args, identity: String) -> Settings {
        Settings {
            defaults: Defaults {
                retain_for: args.default_retain_for.duration(),
                placement: args.default_placement,
                max_retain_for: args.max_retain_for,
            },
            node_budget: args.node_budget,
            namespace: args.namespace.clone(),
            pod_selector: args.pod_selector.clone(),
            // An empty selector selects every namespace: as unset, nothing to watch.
            namespace_selector: args.namespace_selector.clone().filter(|s| !s.selects_all()),
            metrics_addr: args.metrics_addr,
            lease: args.leader_elect.then(|| LeaseSettings {
                name: args.lease_name.clone(),
                namespace: args.lease_namespace.clone(),
                identity,
                duration_secs: args.lease_duration,
            }),
            workers: usize::from(args.workers),
            events: Policy {
                normal: args.normal_events,
            },
            webhook: args.webhook_addr.map(|addr| WebhookSettings {
                addr,
                tls: match &args.webhook_cert_dir {
                    Some(dir) => webhook_tls::TlsSource::Files(dir.clone()),
                    None => webhook_tls::TlsSource::Managed {
                        namespace: args.lease_namespace.clone(),
                        secret: args.webhook_secret.clone(),
                        configuration: Some(args.webhook_configuration.clone())
                            .filter(|c| !c.is_empty()),
                        dns_names: webhook_tls::service_dns_names(
                            &args.webhook_service,
                            &args.lease_namespace,
                        ),
                    },
                },
            }),
        }
    }
}

/// This replica's name when `POD_NAME` is not set: host name and process id.
pub(super) fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "ipkeep-controller".into());
    format!("{host}-{}", std::process::id())
}
