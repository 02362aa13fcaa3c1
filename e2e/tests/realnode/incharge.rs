//! ipkeep not in charge on a node, made the way a user makes it, detected and said where users
//! look, and cleared by the fix — on real nodes with the chart installed as the README says
//! (`cni.replaceHostLocal=true`: the nodes' conflist is an unedited bridge + host-local):
//!
//! | misconfiguration (helm upgrade --reuse-values …) | reason |
//! |---|---|
//! | `cni.replaceHostLocal=false`: the conflist never switched, plain host-local is the IPAM | `HostLocalNotReplaced` |
//! | `agent.networks={mynet}`: a network the nodes do not have | `NetworkNotConfigured` |
//! | `agent.dataDir=/var/lib/cni/elsewhere`: not the IPAM's `dataDir` | `DataDirMismatch` |
//!
//! For each: a Warning Event `NotInCharge` on every Node naming the network, the agent pod's
//! condition `ipkeep.dev/InCharge=False` with the reason, `ipkeep_agent_in_charge{network} 0` and
//! `ipkeep_agent_not_in_charge{network,reason} 1` on the agent's `/metrics`, the reservation of a
//! running annotated pod marked `Unprotected` (its reason in `kubectl get ipr`), before the pod
//! loses anything; `ipkeep-operator check` exits non-zero naming each node. Then the upgrade
//! back: every one of them clears by itself and `check` exits 0. The detection times are printed
//! (`--nocapture`).
//!
//! Then the README's own fix made by hand while the agents run: each node's conflist switched to
//! `"type": "ipkeep"` (in charge, cleared, `check` exits 0); the plugin then removed from a node's
//! bin directory (`PluginMissing`, cleared by a new agent pod whose install-cni puts it back); the
//! conflist switched back (detected again). The delay from each change to the agent's Event is
//! printed.
//!
//! One test, its steps in order: they act on the release every test of a binary shares.
//! Needs root, `make cluster-bins`, `make node-bins` and `make image`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::testkit;
use std::time::SystemTime;

use ipkeep_e2e::cluster::realnode::{Cluster, RealNode, layout::CNI_CONFLIST_FILE};
use ipkeep_e2e::testkit::realnode::{RELEASE, RELEASE_NS, agent_pod, wait_pod_condition};
use ipkeep_e2e::testkit::{kubectl, kubectl_ok, operator_binary, realnode, system, wait_for};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::{Api, api::ListParams};

/// The agent's metrics port (the chart's default).
const METRICS_PORT: u16 = 9725;

/// A misconfiguration made with the chart's values, and its fix.
struct Misconfiguration {
    /// What it is.
    what: &'static str,
    /// The `--set` that makes it.
    broken: &'static str,
    /// The `--set` that fixes it.
    fixed: &'static str,
    /// The network the agent names.
    network: &'static str,
    /// The reason it is detected as.
    reason: &'static str,
}

/// `helm upgrade --reuse-values` of the release with `sets`, then every pod of it Ready.
async fn upgrade(c: &Cluster, sets: &[&str]) {
    let chart = testkit::chart_dir();
    let mut args = vec![
        "upgrade",
        RELEASE,
        chart.to_str().unwrap(),
        "--namespace",
        RELEASE_NS,
        "--reuse-values",
        "--wait",
        "--timeout",
        "3m",
    ];
    for s in sets {
        args.extend(["--set", s]);
    }
    realnode::helm(c, &args);
    realnode::release_ready(c).await;
}

/// The agent's `/metrics` on `node`, through the API server's pod proxy.
fn agent_metrics(c: &Cluster, pod: &str) -> String {
    kubectl_ok(
        c.plane(),
        &[
            "get",
            "--raw",
            &format!("/api/v1/namespaces/{RELEASE_NS}/pods/{pod}:{METRICS_PORT}/proxy/metrics"),
        ],
        None,
    )
}

/// The newest Event of `reason` on Node `node` from the agent, newer than `since`.
async fn node_event(c: &Cluster, node: &str, reason: &str, since: SystemTime) -> Event {
    let events: Api<Event> = Api::all(c.plane().client().unwrap());
    wait_for(&format!("an Event {reason} on Node {node}"), || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Node")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node)
                    && e.event_time
                        .as_ref()
                        .is_some_and(|t| SystemTime::from(t.0) > since)
            })
            .max_by_key(|e| e.event_time.as_ref().map(|t| t.0))
    })
    .await
}

/// When the agent container of `pod` started.
fn agent_started(pod: &Pod) -> SystemTime {
    let status = pod.status.as_ref().unwrap();
    let started = status
        .container_statuses
        .as_ref()
        .unwrap()
        .iter()
        .find(|s| s.name == "agent")
        .and_then(|s| s.state.as_ref()?.running.as_ref()?.started_at.as_ref())
        .unwrap_or_else(|| {
            panic!(
                "the agent container of {:?} is not running",
                pod.metadata.name
            )
        });
    SystemTime::from(started.0)
}

/// The reservation's `Unprotected` reason, if it carries one.
fn unprotected(r: &ipkeep_operator::api::IPReservation) -> Option<String> {
    r.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Unprotected" && c.status == "True")
        .map(|c| c.reason.clone())
}

/// Rewrites the node's conflist with its first plugin's IPAM type `ipam`, atomically (a
/// temporary the runtime and the agent skip, renamed over it); returns when it was written.
fn set_conflist_ipam(node: &RealNode, ipam: &str) -> SystemTime {
    let dir = node.host_path("/etc/cni/net.d").unwrap();
    let path = dir.join(CNI_CONFLIST_FILE);
    let mut conf: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    conf["plugins"][0]["ipam"]["type"] = ipam.into();
    let tmp = dir.join(".10-cbr0.conflist.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&conf).unwrap()).unwrap();
    let written = SystemTime::now();
    std::fs::rename(&tmp, &path).unwrap();
    written
}

/// `ipkeep-operator check` inside the controller's pod, as the README's users without a local
/// install run it (`kubectl exec`, the controller's ServiceAccount): its exit status and output.
fn check_in_cluster(c: &Cluster) -> (bool, String) {
    let out = kubectl(
        c.plane(),
        &[
            "-n",
            RELEASE_NS,
            "exec",
            &format!("deploy/{RELEASE}-controller"),
            "--",
            "/ipkeep-operator",
            "check",
        ],
        None,
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// `ipkeep-operator check` of the release against the cluster, with `args`; whatever its exit
/// status.
fn operator_check(c: &Cluster, args: &[&str]) -> std::process::Output {
    let mut command = std::process::Command::new(operator_binary());
    command
        .args(["check", "--namespace", RELEASE_NS, "--release", RELEASE])
        .args(args)
        .env("KUBECONFIG", c.plane().kubeconfig_path());
    ipkeep_e2e::command::run(&mut command, None)
        .unwrap_or_else(|e| panic!("{}", ipkeep_e2e::error_chain(&e)))
}

/// `ipkeep-operator check --output json` against the cluster: its exit status and document.
fn check_json(c: &Cluster) -> (bool, serde_json::Value) {
    let out = operator_check(c, &["--output", "json"]);
    let doc = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("check --output json printed no JSON ({e}): {out:?}"));
    (out.status.success(), doc)
}

/// `ipkeep-operator check` against the cluster: its exit status and its output.
fn check(c: &Cluster) -> (bool, String) {
    let out = operator_check(c, &[]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_misconfiguration_is_detected_named_and_cleared_by_its_fix() {
    // It breaks the install on purpose (conflists, the chart's values): no other test meanwhile.
    let _nodes = realnode::use_real_nodes_alone().await;
    let (sys, c) = realnode::system("rn-incharge").await;
    let nodes: Vec<String> = (0..2).map(|i| sys.node_name(i).to_owned()).collect();
    let pods = sys.run_retained("nu", 1, &nodes[0]).await;
    let nu = &pods["nu-0"];

    // A correct install: in charge everywhere, nothing marked, check passes.
    for node in &nodes {
        wait_pod_condition(c, node, "True", "InCharge").await;
    }
    let r = sys.wait_bound(nu).await;
    assert_eq!(unprotected(&r), None, "marked on a correct install");
    let (ok, said) = check(c);
    assert!(ok, "check fails on a correct install:\n{said}");
    let (ok, said) = check_in_cluster(c);
    assert!(
        ok,
        "check in the controller's pod fails on a correct install:\n{said}"
    );
    let (ok, doc) = check_json(c);
    assert!(
        ok && doc["ok"] == true,
        "check --output json on a correct install: {doc}"
    );

    let rows = [
        Misconfiguration {
            what: "the conflist never switched (plain host-local is the IPAM)",
            broken: "cni.replaceHostLocal=false",
            fixed: "cni.replaceHostLocal=true",
            network: "cbr0",
            reason: "HostLocalNotReplaced",
        },
        Misconfiguration {
            what: "agent.networks names a network the nodes do not have",
            broken: "agent.networks={mynet}",
            fixed: "agent.networks={cbr0}",
            network: "mynet",
            reason: "NetworkNotConfigured",
        },
        Misconfiguration {
            what: "agent.dataDir is not the IPAM's dataDir",
            broken: "agent.dataDir=/var/lib/cni/elsewhere",
            fixed: "agent.dataDir=/var/lib/cni/networks",
            network: "cbr0",
            reason: "DataDirMismatch",
        },
    ];
    let mut times = Vec::new();
    for row in rows {
        let Misconfiguration {
            what,
            broken,
            fixed,
            network,
            reason,
        } = row;
        eprintln!("in-charge: {what}");
        let before = SystemTime::now();
        upgrade(c, &[broken]).await;
        for node in &nodes {
            let pod = wait_pod_condition(c, node, "False", reason).await;
            let event = node_event(c, node, "NotInCharge", before).await;
            let note = event.note.clone().unwrap_or_default();
            assert!(
                note.contains(&format!("network {network}")) && note.contains("set "),
                "the Event on {node} does not name {network} and a fix: {note}"
            );
            let at = SystemTime::from(event.event_time.as_ref().unwrap().0);
            let after_start = at.duration_since(agent_started(&pod)).unwrap_or_default();
            eprintln!(
                "in-charge: {reason} on {node}: {after_start:?} after the agent started: {note}"
            );
            times.push((reason, node.clone(), after_start));
            let metrics = agent_metrics(c, pod.metadata.name.as_deref().unwrap());
            for line in [
                format!("ipkeep_agent_in_charge{{network=\"{network}\"}} 0"),
                format!(
                    "ipkeep_agent_not_in_charge{{network=\"{network}\",reason=\"{reason}\"}} 1"
                ),
            ] {
                assert!(metrics.contains(&line), "no `{line}` on {node}:\n{metrics}");
            }
        }
        let r = sys
            .wait_reservation("nu-0", &format!("Unprotected ({reason})"), |r| {
                unprotected(r).as_deref() == Some(reason)
            })
            .await;
        assert_eq!(
            system::ips(&r),
            nu.ips.iter().map(|i| i.to_string()).collect::<Vec<_>>()
        );
        let shown = sys.kubectl(&["get", "ipr", "nu-0"]);
        assert!(
            shown.contains("UNPROTECTED") && shown.contains(reason),
            "kubectl get ipr does not show {reason}:\n{shown}"
        );
        let (ok, said) = check(c);
        assert!(!ok, "check passes while {what}:\n{said}");
        eprintln!("in-charge: ipkeep-operator check said:\n{said}");
        let (ok, said) = check_in_cluster(c);
        assert!(
            !ok,
            "check in the controller's pod passes while {what}:\n{said}"
        );
        let (ok, doc) = check_json(c);
        assert!(
            !ok && doc["ok"] == false,
            "check --output json while {what}: {doc}"
        );
        for node in &nodes {
            let named = doc["checks"].as_array().unwrap().iter().any(|l| {
                l["ok"] == false && l["check"] == "in-charge" && l["node"] == node.as_str()
            });
            assert!(named, "check --output json does not name {node}: {doc}");
            assert!(
                said.contains(node.as_str()) && said.contains(reason),
                "check in the controller's pod does not name {node} and {reason}:\n{said}"
            );
        }
        for node in &nodes {
            assert!(
                said.contains(node.as_str()) && said.contains(reason),
                "check does not name {node} and {reason}:\n{said}"
            );
        }

        eprintln!("in-charge: fixed");
        upgrade(c, &[fixed]).await;
        for node in &nodes {
            let pod = wait_pod_condition(c, node, "True", "InCharge").await;
            let metrics = agent_metrics(c, pod.metadata.name.as_deref().unwrap());
            let line = "ipkeep_agent_in_charge{network=\"cbr0\"} 1";
            assert!(metrics.contains(line), "no `{line}` on {node}:\n{metrics}");
        }
        sys.wait_reservation("nu-0", "no longer Unprotected", |r| {
            unprotected(r).is_none()
        })
        .await;
        let (ok, said) = check(c);
        assert!(ok, "check still fails after the fix of {what}:\n{said}");
    }
    eprintln!("in-charge: detection times (Event after the agent's start):");
    for (reason, node, t) in &times {
        eprintln!("  {reason} on {node}: {t:?}");
    }

    // The README's own fix, made while the agents run: the conflist's IPAM switched to ipkeep
    // by hand on each node (no cni.replaceHostLocal), then switched back (as kube-flannel's
    // install-cni or a k3s restart would rewrite it). Each edit is seen at the agent's next read.
    upgrade(c, &["cni.replaceHostLocal=false"]).await;
    for node in &nodes {
        wait_pod_condition(c, node, "False", "HostLocalNotReplaced").await;
    }
    let mut live = Vec::new();
    for (ipam, event, status, reason) in [
        ("ipkeep", "InCharge", "True", "InCharge"),
        ("host-local", "NotInCharge", "False", "HostLocalNotReplaced"),
    ] {
        for node in &nodes {
            let written = set_conflist_ipam(realnode::node(c, node), ipam);
            let e = node_event(c, node, event, written).await;
            let at = SystemTime::from(e.event_time.as_ref().unwrap().0);
            let took = at.duration_since(written).unwrap_or_default();
            eprintln!(
                "in-charge: conflist IPAM {ipam} on {node}: {event} {took:?} after the write"
            );
            live.push((ipam, node.clone(), took));
            wait_pod_condition(c, node, status, reason).await;
        }
        if ipam == "ipkeep" {
            sys.wait_reservation("nu-0", "no longer Unprotected", |r| {
                unprotected(r).is_none()
            })
            .await;
            let (ok, said) = check(c);
            assert!(ok, "check fails with the conflist switched:\n{said}");

            // The plugin removed from node-0's bin directory (an admin's cleanup, a package
            // purge): PluginMissing at the agent's next read; a new agent pod's install-cni puts
            // it back.
            let node = &nodes[0];
            let plugin = realnode::node(c, node)
                .host_path("/opt/cni/bin")
                .unwrap()
                .join("ipkeep");
            let removed = SystemTime::now();
            std::fs::remove_file(&plugin).unwrap();
            let e = node_event(c, node, "NotInCharge", removed).await;
            let took = SystemTime::from(e.event_time.as_ref().unwrap().0)
                .duration_since(removed)
                .unwrap_or_default();
            eprintln!(
                "in-charge: ipkeep removed from {node}'s bin directory: NotInCharge {took:?} after the unlink"
            );
            live.push(("ipkeep (binary removed)", node.clone(), took));
            wait_pod_condition(c, node, "False", "PluginMissing").await;
            sys.wait_reservation("nu-0", "Unprotected (PluginMissing)", |r| {
                unprotected(r).as_deref() == Some("PluginMissing")
            })
            .await;
            let agent = agent_pod(c, node).await.metadata.name.unwrap();
            kubectl_ok(
                c.plane(),
                &["-n", RELEASE_NS, "delete", "pod", &agent],
                None,
            );
            realnode::release_ready(c).await;
            wait_pod_condition(c, node, "True", "InCharge").await;
            assert!(
                plugin.is_file(),
                "install-cni did not put {} back",
                plugin.display()
            );
            sys.wait_reservation("nu-0", "no longer Unprotected", |r| {
                unprotected(r).is_none()
            })
            .await;
        } else {
            sys.wait_reservation("nu-0", "Unprotected again", |r| {
                unprotected(r).as_deref() == Some("HostLocalNotReplaced")
            })
            .await;
        }
    }
    upgrade(c, &["cni.replaceHostLocal=true"]).await;
    for node in &nodes {
        wait_pod_condition(c, node, "True", "InCharge").await;
    }
    eprintln!(
        "in-charge: detection times of an edit while the agent runs (Event after the write):"
    );
    for (ipam, node, t) in &live {
        eprintln!("  IPAM {ipam} on {node}: {t:?}");
    }
    eprintln!("{}", sys.summary());
}
