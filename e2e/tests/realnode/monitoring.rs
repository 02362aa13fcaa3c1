//! ipkeep's alerts and dashboard on a real Prometheus (issue 46): Debian's `prometheus` on this
//! machine loads `charts/ipkeep/files/ipkeep-rules.yaml` and scrapes the agents (on
//! their nodes' addresses) and the controllers (their pods' addresses) with the labels the
//! chart's ServiceMonitor sets (`job`, `node`), and the API server.
//!
//! On the tiny node's /29 (five addresses):
//! 1. three annotated pods (retained for 1 minute) and one unannotated pod leave one address
//!    free: `IpkeepRangeNearlyFull` fires for the tiny node and its network, its `for:` after
//!    the evaluation that first saw the sample (the delays are printed);
//! 2. the retained pods deleted, their reservations hold the addresses and the alert goes on
//!    firing until they expire; then it resolves;
//! 3. the tiny node's conflist given another IPAM: `IpkeepNotInCharge` fires for it; the conflist
//!    put back, it resolves;
//! 4. every query of the Grafana dashboard returns data, and no rule failed to evaluate.
//!
//! With `IPKEEP_MONITORING_CSV=FILE` it also writes what Prometheus saw of the tiny node during
//! the scenario (free, allocated and held addresses, the two alerts' states, every scrape) as CSV:
//! `make monitoring-picture` draws docs/monitoring-fill.png from it.
//!
//! Under `make test` every alert's `for:` is [`SHORT_FOR`] in the copy Prometheus loads (the
//! expressions, labels and annotations are the shipped ones; the shipped `for:` durations are held
//! by the promtool unit tests, `e2e/tests/plain/monitoring.rs`): about 3½ minutes. With
//! `IPKEEP_MONITORING_CSV` (the picture) it loads the file as it ships: about 13 minutes, two
//! alerts waiting their 5 minutes. Needs root, `make cluster-bins`, `make node-bins`,
//! `make image` and Debian's `prometheus` (`make deps`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{collections::BTreeMap, time::Duration};

use ipkeep_e2e::cluster::prometheus::{ApiServer, Prometheus, Target};
use ipkeep_e2e::cluster::realnode::{
    Cluster, NodeCni, NodeDirs, PodNetwork, RealNode,
    layout::{CNI_CONFLIST_FILE, CNI_NETWORK},
};
use ipkeep_e2e::testkit::realnode::{RELEASE_NS, apply_on_tiny};
use ipkeep_e2e::testkit::system::{Options, System, retain};
use ipkeep_e2e::testkit::{realnode, repo_root};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::ListParams};
use serde_json::Value;

const NETWORK: PodNetwork = PodNetwork {
    dual_stack: false,
    tiny_nodes: 1,
    cni: NodeCni::Bridge,
    dirs: NodeDirs::Standard,
    crio_nodes: 0,
    k3s_nodes: 0,
};

/// Every alert's `for:` in the rules `make test` loads.
const SHORT_FOR: &str = "15s";

/// The variable that writes the scenario's CSV (and loads the rules as they ship).
const CSV_ENV: &str = "IPKEEP_MONITORING_CSV";

/// The rules file `text` with every `for:` set to [`SHORT_FOR`], all else as it is.
fn with_short_for(text: &str) -> String {
    let mut changed = 0;
    let lines: Vec<String> = text
        .lines()
        .map(|line| {
            let rest = line.trim_start();
            if rest.starts_with("for: ") {
                changed += 1;
                format!("{}for: {SHORT_FOR}", &line[..line.len() - rest.len()])
            } else {
                line.to_owned()
            }
        })
        .collect();
    assert!(changed > 0, "no `for:` in the rules file");
    lines.join("\n") + "\n"
}

/// Prometheus scrapes and evaluates this often.
const INTERVAL: Duration = Duration::from_secs(2);
/// The longest `for:` of the alerts the scenario waits for, plus the agent's count (10 s), a
/// scrape and an evaluation, with room for a busy machine.
const ALERT_DEADLINE: Duration = Duration::from_secs(8 * 60);
/// Grafana's variables in the dashboard's queries, and what stands for them here.
const GRAFANA_VARIABLES: &[(&str, &str)] = &[("$__rate_interval", "5m"), ("$node", ".*")];

/// The agents' and controllers' pods, as targets with the ServiceMonitor's labels.
async fn targets(c: &Cluster) -> Vec<Target> {
    let pods: Api<Pod> = Api::namespaced(c.plane().client().unwrap(), RELEASE_NS);
    let mut out = Vec::new();
    for pod in pods.list(&ListParams::default()).await.unwrap() {
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let component = labels
            .get("app.kubernetes.io/component")
            .cloned()
            .unwrap_or_default();
        let port = match component.as_str() {
            "agent" => 9725,
            "controller" => 8080,
            _ => continue,
        };
        let (Some(ip), Some(node)) = (
            pod.status.as_ref().and_then(|s| s.pod_ip.clone()),
            pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        ) else {
            continue;
        };
        out.push(Target {
            addr: format!("{ip}:{port}"),
            labels: BTreeMap::from([
                ("job".to_owned(), format!("ipkeep-{component}")),
                ("node".to_owned(), node),
                (
                    "pod".to_owned(),
                    pod.metadata.name.clone().unwrap_or_default(),
                ),
            ]),
        });
    }
    out
}

/// The alert `name` in `state` (`pending`, `firing`) whose labels include `labels`, if any; the
/// targets are refreshed first (another test may have rolled the release's pods).
async fn alert(
    c: &Cluster,
    prom: &Prometheus,
    name: &str,
    state: &str,
    labels: &[(&str, &str)],
) -> Option<Value> {
    prom.set_targets(&targets(c).await).unwrap();
    prom.alerts().await.ok()?.into_iter().find(|a| {
        a["labels"]["alertname"] == name
            && a["state"] == state
            && labels.iter().all(|(k, v)| a["labels"][*k] == *v)
    })
}

/// Waits up to [`ALERT_DEADLINE`] for `what`.
async fn wait_long<T, Fut: std::future::Future<Output = Option<T>>>(
    what: &str,
    check: impl FnMut() -> Fut,
) -> T {
    ipkeep_e2e::wait::wait_for(what, ALERT_DEADLINE, check)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Rewrites the node's conflist with its first plugin's IPAM type `ipam`, atomically.
fn set_conflist_ipam(node: &RealNode, ipam: &str) {
    let dir = node.host_path("/etc/cni/net.d").unwrap();
    let path = dir.join(CNI_CONFLIST_FILE);
    let mut conf: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    conf["plugins"][0]["ipam"]["type"] = ipam.into();
    let tmp = dir.join(".monitoring.conflist.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&conf).unwrap()).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
}

/// The newest sample of `expr` (one series) as Prometheus holds it: its timestamp and value.
async fn sample(prom: &Prometheus, expr: &str) -> Option<(f64, f64)> {
    let result = prom.query(&format!("timestamp({expr})")).await.ok()?;
    let at = result.first()?["value"][1].as_str()?.parse().ok()?;
    let value = prom.query(expr).await.ok()?;
    let value = value.first()?["value"][1].as_str()?.parse().ok()?;
    Some((at, value))
}

/// An RFC 3339 time of Prometheus' API as Unix seconds.
fn unix(rfc3339: &Value) -> f64 {
    let t: jiff::Timestamp = rfc3339.as_str().unwrap().parse().unwrap();
    t.as_millisecond() as f64 / 1000.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_alerts_fire_and_clear_and_every_dashboard_query_has_data_on_a_real_prometheus() {
    let _nodes = realnode::use_nodes(2, NETWORK).await;
    let (_tiny, node) = realnode::tiny_alone().await;
    let c = realnode::own().expect("this binary's own nodes");
    let tiny = node.name();
    let plane = c.plane();
    let api_server = ApiServer {
        addr: plane.server().trim_start_matches("https://").to_owned(),
        ca: plane.ca_path().to_owned(),
        cert: plane.pki().admin.cert.clone(),
        key: plane.pki().admin.key.clone(),
    };
    let shipped = repo_root().join("charts/ipkeep/files/ipkeep-rules.yaml");
    let scratch = ipkeep_e2e::testkit::Scratch::new("monitoring-rules");
    let (rules, held_for) = if std::env::var_os(CSV_ENV).is_some() {
        (shipped, "as shipped")
    } else {
        let short = scratch.join("ipkeep-rules.yaml");
        std::fs::write(
            &short,
            with_short_for(&std::fs::read_to_string(&shipped).unwrap()),
        )
        .unwrap();
        (short, SHORT_FOR)
    };
    let prom = Prometheus::start(&[rules], INTERVAL, Some(&api_server))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let prom = &prom;
    prom.set_targets(&targets(c).await).unwrap();
    let free = format!("ipkeep_agent_range_free_addresses{{node=\"{tiny}\"}}");
    wait_long("the tiny node's range, empty, in Prometheus", || async {
        let (_, v) = sample(prom, &free).await?;
        (v == f64::from(realnode::TINY_ADDRESSES)).then_some(())
    })
    .await;
    let began = now();
    let sys = System::start(
        "monitoring",
        Options {
            nodes: 1,
            ..Options::default()
        },
    )
    .await;

    // 1. Four of five addresses taken: three retained pods, one unannotated.
    apply_on_tiny(&sys, &tiny, "keep", 3, &retain(Some("1m")));
    apply_on_tiny(&sys, &tiny, "plain", 1, &[]);
    sys.wait_running("app=keep", &["keep-0", "keep-1", "keep-2"])
        .await;
    sys.wait_running("app=plain", &["plain-0"]).await;
    let (crossed, _) = wait_long(
        "one free address on the tiny node in Prometheus",
        || async { sample(prom, &free).await.filter(|(_, v)| *v == 1.0) },
    )
    .await;
    let network = CNI_NETWORK;
    let firing = wait_long("IpkeepRangeNearlyFull firing for the tiny node", || {
        let labels = [("node", tiny.as_str()), ("network", network)];
        async move { alert(c, prom, "IpkeepRangeNearlyFull", "firing", &labels).await }
    })
    .await;
    let seen = now();
    let active = unix(&firing["activeAt"]);
    eprintln!(
        "IpkeepRangeNearlyFull: active {:.1} s after the sample that crossed, seen firing {:.1} s after it (for: {held_for}, scrape and evaluation every {} s)",
        active - crossed,
        seen - crossed,
        INTERVAL.as_secs()
    );
    assert!(
        active >= crossed - INTERVAL.as_secs_f64(),
        "active before the sample that crossed: {firing}"
    );
    let description = firing["annotations"]["description"].as_str().unwrap();
    assert!(
        description.contains(&tiny)
            && description.contains(network)
            && description.contains(": 1."),
        "{description}"
    );
    assert!(
        firing["annotations"]["runbook_url"]
            .as_str()
            .unwrap()
            .ends_with("#ipkeeprangenearlyfull")
    );
    sys.check("IpkeepRangeNearlyFull fired for the tiny node's network");

    // 2. The retained pods gone: their three Released reservations hold the addresses, and the
    // alert goes on firing, until they expire.
    sys.kubectl(&["delete", "statefulset", "keep", "--wait=false"]);
    for pod in ["keep-0", "keep-1", "keep-2"] {
        sys.wait_reservation(pod, "Released", |r| {
            ipkeep_e2e::testkit::system::phase(r) == Some(ipkeep_operator::api::Phase::Released)
        })
        .await;
    }
    assert!(
        alert(
            c,
            prom,
            "IpkeepRangeNearlyFull",
            "firing",
            &[("node", &tiny)]
        )
        .await
        .is_some(),
        "the alert stopped while the Released reservations held the addresses"
    );
    sys.check("the pods gone, their reservations hold the range: still firing");
    wait_long(
        "IpkeepRangeNearlyFull resolved once the reservations expired",
        || async {
            let still = alert(
                c,
                prom,
                "IpkeepRangeNearlyFull",
                "firing",
                &[("node", &tiny)],
            )
            .await;
            let pending = alert(
                c,
                prom,
                "IpkeepRangeNearlyFull",
                "pending",
                &[("node", &tiny)],
            )
            .await;
            let (_, v) = sample(prom, &free).await?;
            (still.is_none() && pending.is_none() && v == f64::from(realnode::TINY_ADDRESSES - 1))
                .then_some(())
        },
    )
    .await;
    let expired = prom
        .query("sum(increase(ipkeep_controller_expirations_total[10m]))")
        .await
        .unwrap();
    eprintln!("expirations in the last 10 minutes: {expired:?}");
    sys.check("the alert resolved once the reservations expired and freed the range");
    // The unannotated pod's DEL must run before the conflist changes: with another IPAM named
    // there, the runtime's DEL calls that one and host-local's allocation file stays behind.
    sys.kubectl(&["delete", "statefulset", "plain", "--wait=false"]);
    let allocated = format!("ipkeep_agent_range_allocated_addresses{{node=\"{tiny}\"}}");
    wait_long(
        "the tiny node's range empty again in Prometheus",
        || async {
            let (_, f) = sample(prom, &free).await?;
            let (_, a) = sample(prom, &allocated).await?;
            (f == f64::from(realnode::TINY_ADDRESSES) && a == 0.0).then_some(())
        },
    )
    .await;

    // 3. The tiny node's conflist with another IPAM: ipkeep is not in charge there.
    set_conflist_ipam(node, "static");
    let restore = scopeguard(node);
    let firing = wait_long("IpkeepNotInCharge firing for the tiny node", || {
        let labels = [("node", tiny.as_str()), ("network", network)];
        async move { alert(c, prom, "IpkeepNotInCharge", "firing", &labels).await }
    })
    .await;
    eprintln!(
        "IpkeepNotInCharge: {}",
        firing["annotations"]["summary"]
            .as_str()
            .unwrap_or_default()
    );
    drop(restore);
    wait_long(
        "IpkeepNotInCharge resolved once the conflist was put back",
        || async {
            let firing = alert(c, prom, "IpkeepNotInCharge", "firing", &[("node", &tiny)]).await;
            let pending = alert(c, prom, "IpkeepNotInCharge", "pending", &[("node", &tiny)]).await;
            (firing.is_none() && pending.is_none()).then_some(())
        },
    )
    .await;
    sys.check("IpkeepNotInCharge fired while the conflist named another IPAM, and resolved");

    // 4. Every dashboard query has data; every rule evaluated.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("charts/ipkeep/files/ipkeep-dashboard.json"))
            .unwrap(),
    )
    .unwrap();
    let mut empty = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = GRAFANA_VARIABLES
                .iter()
                .fold(target["expr"].as_str().unwrap().to_owned(), |e, (v, x)| {
                    e.replace(v, x)
                });
            let result = prom.query(&expr).await.unwrap();
            eprintln!("{}: {} series", panel["title"], result.len());
            if result.is_empty() {
                empty.push(format!("{}: {expr}", panel["title"]));
            }
        }
    }
    assert!(
        empty.is_empty(),
        "dashboard queries without data: {empty:#?}"
    );
    for rule in prom.rules().await.unwrap() {
        assert_eq!(rule["health"], "ok", "{rule}");
    }
    sys.check("every dashboard query returned data, every rule evaluated");
    if let Some(path) = std::env::var_os(CSV_ENV) {
        let csv = history(prom, &tiny, began, now()).await;
        std::fs::write(&path, csv).unwrap();
        eprintln!("wrote {}", std::path::Path::new(&path).display());
    }
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// What Prometheus saw of `node` from `start` to `end`, every scrape, as CSV: seconds since
/// `start`, its free, allocated, Bound- and Released-held addresses, and the states of
/// `IpkeepRangeNearlyFull` and `IpkeepNotInCharge` (0 inactive, 1 pending, 2 firing).
async fn history(prom: &Prometheus, node: &str, start: f64, end: f64) -> String {
    let of = |m: &str| format!("sum({m}{{node=\"{node}\"}})");
    let state = |alert: &str| {
        format!(
            "max(ALERTS{{alertname=\"{alert}\",node=\"{node}\",alertstate=\"firing\"}}) * 2 \
             or max(ALERTS{{alertname=\"{alert}\",node=\"{node}\",alertstate=\"pending\"}}) \
             or vector(0)"
        )
    };
    let columns = [
        ("free", of("ipkeep_agent_range_free_addresses")),
        ("allocated", of("ipkeep_agent_range_allocated_addresses")),
        (
            "bound",
            format!(
                "sum(ipkeep_agent_range_reserved_addresses{{node=\"{node}\",phase=\"Bound\"}})"
            ),
        ),
        (
            "released",
            format!(
                "sum(ipkeep_agent_range_reserved_addresses{{node=\"{node}\",phase=\"Released\"}})"
            ),
        ),
        ("nearly_full", state("IpkeepRangeNearlyFull")),
        ("not_in_charge", state("IpkeepNotInCharge")),
    ];
    let step = INTERVAL;
    let mut rows: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for (i, (_, expr)) in columns.iter().enumerate() {
        let result = prom.query_range(expr, start, end, step).await.unwrap();
        for point in result
            .first()
            .and_then(|s| s["values"].as_array())
            .into_iter()
            .flatten()
        {
            let at = point[0].as_f64().unwrap();
            let row = rows
                .entry((at - start).round() as i64)
                .or_insert_with(|| vec![String::new(); columns.len()]);
            row[i] = point[1].as_str().unwrap().to_owned();
        }
    }
    let mut out = format!(
        "seconds,{}\n",
        columns
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(",")
    );
    for (at, row) in rows {
        out.push_str(&format!("{at},{}\n", row.join(",")));
    }
    out
}

/// Puts the tiny node's conflist back (`host-local`, which the chart replaced with ipkeep) when
/// dropped, also when the test fails before it does.
fn scopeguard(node: &RealNode) -> impl Drop + '_ {
    struct Restore<'a>(&'a RealNode);
    impl Drop for Restore<'_> {
        fn drop(&mut self) {
            set_conflist_ipam(self.0, "host-local");
        }
    }
    Restore(node)
}
