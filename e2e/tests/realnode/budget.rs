//! A node is never starved (issue 26, part 2), on real nodes: the tiny node's /29 (five
//! addresses) with a budget of two Released reservations (its `ipkeep.dev/node-budget`
//! annotation: with the kubelet's 110 pods its default budget is 0). A StatefulSet of four
//! annotated pods is scaled down one pod at a time; the third release puts three over the budget
//! of two, and the earliest released yields — deleted before its release time, with a Warning
//! `Yielded`. Then two unannotated pods the scheduler puts there both get an address (without
//! the budget, only one of them would), and the pod that stayed Bound was never touched. The
//! tiny Node's annotations say how full it is all along (issue 46): one address free with the
//! four pods running, none once the two unannotated ones are, the budget's headroom spent.
//!
//! One cluster of two real nodes (the second tiny) with the chart installed. Needs root,
//! `make cluster-bins`, `make node-bins` and `make image`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::cluster::realnode::{NodeCni, NodeDirs, PodNetwork};
use ipkeep_e2e::testkit::realnode::{TINY_ADDRESSES, apply_on_tiny};
use ipkeep_e2e::testkit::system::{Options, System, phase, retain};
use ipkeep_e2e::testkit::{realnode, wait_for};
use ipkeep_operator::api::Phase;
use ipkeep_operator::rules::capacity::{CAPACITY, FREE_ADDRESSES};
use kube::ResourceExt;

const NETWORK: PodNetwork = PodNetwork {
    dual_stack: false,
    tiny_nodes: 1,
    cni: NodeCni::Bridge,
    dirs: NodeDirs::Standard,
    crio_nodes: 0,
    k3s_nodes: 0,
};

/// The budget this test gives the tiny node.
const BUDGET: u32 = 2;

/// Waits until the agent's annotations on `node` say `free` addresses are left and its
/// capacity text holds `said`; returns that text.
async fn wait_capacity(sys: &System, node: &str, free: u32, said: &str) -> String {
    let path = |key: &str| {
        format!(
            "jsonpath={{.metadata.annotations.{}}}",
            key.replace('.', "\\.")
        )
    };
    wait_for(
        &format!("{node}'s annotations to say {free} free and `{said}`"),
        || async {
            let got = sys.kubectl(&["get", "node", node, "-o", &path(FREE_ADDRESSES)]);
            let text = sys.kubectl(&["get", "node", node, "-o", &path(CAPACITY)]);
            (got == free.to_string() && text.contains(said)).then_some(text)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_earliest_released_yield_so_that_every_pod_the_node_admits_gets_an_address() {
    let _nodes = realnode::use_nodes(2, NETWORK).await;
    let (_tiny, node) = realnode::tiny_alone().await;
    let c = realnode::own().expect("this binary's own nodes");
    let tiny = node.name();
    realnode::set_node_budget(c, &tiny, BUDGET);
    let sys = System::start(
        "budget",
        Options {
            nodes: 1,
            ..Options::default()
        },
    )
    .await;

    apply_on_tiny(&sys, &tiny, "keep", 4, &retain(Some("1h")));
    let names = ["keep-0", "keep-1", "keep-2", "keep-3"];
    let pods = sys.wait_running("app=keep", &names).await;
    for name in names {
        sys.wait_bound(&pods[name]).await;
    }
    sys.check("four annotated pods Bound on the tiny node");
    let text = wait_capacity(
        &sys,
        &tiny,
        1,
        &format!(
            "1 of {TINY_ADDRESSES} free (4 allocated, held by reservations: 4 Bound, 0 Released)"
        ),
    )
    .await;
    eprintln!("{tiny}: {text}");
    sys.check("the tiny Node's annotations: one address free");

    // One at a time, so the release order is known: keep-3, then keep-2, then keep-1.
    for (replicas, gone) in [(3, "keep-3"), (2, "keep-2"), (1, "keep-1")] {
        sys.kubectl(&[
            "scale",
            "statefulset",
            "keep",
            &format!("--replicas={replicas}"),
        ]);
        if gone == "keep-1" {
            break;
        }
        sys.wait_reservation(gone, "Released", |r| phase(r) == Some(Phase::Released))
            .await;
    }
    // Three Released over a budget of two: keep-3, released earliest, yields.
    let event = wait_for("a Yielded Event on keep-3's reservation", || async {
        sys.events("IPReservation", "keep-3")
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("Yielded"))
    })
    .await;
    let note = event.message.unwrap_or_default();
    eprintln!("keep-3: {note}");
    assert!(
        note.contains(&tiny) && note.contains("budget of 2") && note.contains("keep-1"),
        "{note}"
    );
    wait_for("keep-3's reservation deleted", || async {
        sys.reservations()
            .get_opt("keep-3")
            .await
            .ok()
            .and_then(|r| r.is_none().then_some(()))
    })
    .await;
    for name in ["keep-2", "keep-1"] {
        sys.wait_reservation(name, "Released", |r| phase(r) == Some(Phase::Released))
            .await;
    }
    sys.check("keep-3, released earliest, yielded; keep-2 and keep-1 still held");
    let kept = sys.reservations().get("keep-0").await.unwrap();
    assert_eq!(phase(&kept), Some(Phase::Bound));
    assert_eq!(
        kept.status.as_ref().and_then(|s| s.pod_uid.as_deref()),
        Some(pods["keep-0"].uid.as_str()),
        "the Bound reservation is still its pod's"
    );
    sys.check("keep-0 Bound, untouched");

    // Five addresses: keep-0 has one, two are held; the two left go to two unannotated pods.
    let free = TINY_ADDRESSES - 1 - BUDGET;
    apply_on_tiny(&sys, &tiny, "plain", free, &[]);
    let plain: Vec<String> = (0..free).map(|i| format!("plain-{i}")).collect();
    let plain: Vec<&str> = plain.iter().map(String::as_str).collect();
    let running = sys.wait_running("app=plain", &plain).await;
    let held: Vec<String> = sys
        .reservations()
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|r| r.name_any() != "keep-0")
        .flat_map(|r| r.spec.ips.iter().map(|ip| ip.0.clone()).collect::<Vec<_>>())
        .collect();
    for pod in running.values() {
        assert!(
            !held.contains(&pod.ips[0].to_string()),
            "{} got the held address {}",
            pod.name,
            pod.ips[0]
        );
    }
    sys.check("every unannotated pod the scheduler put there got an address");
    let text = wait_capacity(
        &sys,
        &tiny,
        0,
        &format!(
            "0 of {TINY_ADDRESSES} free (3 allocated, held by reservations: 1 Bound, 2 Released); budget headroom 0 of {BUDGET} (annotation)"
        ),
    )
    .await;
    eprintln!("{tiny}: {text}");
    sys.check("the tiny Node's annotations: full, the budget spent");
    let kept_now = sys.reservations().get("keep-0").await.unwrap();
    assert_eq!(
        kept_now.metadata.uid, kept.metadata.uid,
        "keep-0's reservation was never replaced"
    );
    sys.kubectl(&["delete", "statefulset", "keep", "plain", "--wait=false"]);
}
