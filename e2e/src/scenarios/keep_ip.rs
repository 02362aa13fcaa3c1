//! Scenarios 1 and 2, one `pub async fn` each (`tests/realnode/` runs them on its real nodes with the chart installed, or on
//! a user's cluster with `IPKEEP_E2E_KUBECONFIG`).

use super::{Narrator, ScenarioError, TestLog, apply, ensure, or_fail, show};
use crate::cluster::realnode::layout::client_pod;
use crate::testkit::realnode;
use crate::testkit::system::{Options, RunningPod, System, retain, statefulset};
use crate::testkit::{DEADLINE, wait_for};
use ipkeep_operator::api::Phase;

pub async fn statefulset_pod_deleted_and_recreated_keeps_its_ipv4_and_ipv6_addresses() {
    let sys = System::start(
        "keep",
        Options {
            dual_stack: true,
            ..Options::default()
        },
    )
    .await;
    or_fail(keep_address(&sys, &mut TestLog).await);
}

/// Scenario 1, the demo's first two steps: a StatefulSet `web` of three annotated pods placed by
/// the scheduler, `web-1` deleted and back with the same addresses on the same node (on its
/// `eth0`, answering a client pod), its reservation Bound → Released → Bound and never deleted,
/// the other pods untouched, and `kubectl get ipr` showing it.
pub async fn keep_address(sys: &System, n: &mut dyn Narrator) -> Result<(), ScenarioError> {
    let client_node = sys.node_name(0).to_owned();
    n.step(&format!(
        "An annotated StatefulSet with 3 replicas of busybox httpd, placed by the scheduler, and a client pod on {client_node}"
    ));
    // No node named: the scheduler places the pods, and brings a returning one back to the node
    // holding its addresses only because the placement webhook tells it to.
    apply(
        sys,
        n,
        &statefulset("web", 3, true, &[], &retain(Some("1h"))),
    )?;
    apply(sys, n, &client_pod(&client_node))?;
    let pods = sys
        .try_wait_running("app=web", &["web-0", "web-1", "web-2"])
        .await?;
    sys.check("three pods Running where the scheduler put them");
    let dual = sys.dual_stack;
    if dual {
        sys.check("IPv4 and IPv6 addresses");
    } else {
        sys.skip(
            "IPv4 and IPv6 addresses",
            "dual-stack nodes (the cluster's nodes have one pod CIDR)",
        );
    }
    for pod in pods.values() {
        if dual {
            ensure(
                pod.ips.len() == 2 && pod.ips[0].is_ipv4() && pod.ips[1].is_ipv6(),
                || format!("dual-stack: {pod:?}"),
            )?;
        }
        sys.try_wait_bound(pod).await?;
        if let Some(dir) = realnode::node_dir(sys, "reservation files on the node", &pod.node) {
            sys.wait_file(&dir.join("reserved").join(&sys.ns).join(&pod.name), true)
                .await;
        }
    }
    sys.check("every reservation Bound to its pod");
    sys.try_wait_recreated("client", "").await?;
    n.note(
        "The pods got their addresses from the CNI chain, where ipkeep stands in host-local's place:",
    );
    show(sys, n, &["get", "pods", "-o", "wide"])?;
    n.note(
        "ipkeep's controller made one IPReservation per pod, named like the pod; the agents wrote them to each node's disk:",
    );
    show(sys, n, &["get", "ipr"])?;

    n.step("Delete web-1: the StatefulSet re-creates it, and ipkeep gives it its address back");
    let before = pods["web-1"].clone();
    n.note(&format!(
        "web-1 now: uid {}, IP {}, on {}",
        before.uid,
        addresses(&before),
        before.node
    ));
    let history = sys.record_reservations();
    show(sys, n, &["delete", "pod", "web-1", "--wait=false"])?;
    let after = sys.try_wait_recreated("web-1", &before.uid).await?;
    n.note(&format!(
        "The scheduler put it on {} because ipkeep's placement webhook told it where the address lives:",
        after.node
    ));
    show(
        sys,
        n,
        &[
            "get",
            "pod",
            "web-1",
            "-o",
            "jsonpath={.metadata.annotations.ipkeep\\.dev/placed}{\"\\n\"}{.spec.affinity.nodeAffinity}{\"\\n\"}",
        ],
    )?;
    let same = after.ips == before.ips;
    n.note(&format!(
        "web-1 again: uid {} (a new pod), IP {} — {}",
        after.uid,
        addresses(&after),
        if same {
            "the same address"
        } else {
            "A DIFFERENT ADDRESS (this is a bug)"
        }
    ));
    ensure(same, || {
        format!("web-1 came back with {after:?}, not the addresses of {before:?}")
    })?;
    ensure(after.node == before.node, || {
        format!("web-1 came back to {}, not {}", after.node, before.node)
    })?;
    sys.check("web-1 re-created with the same addresses on its node, unpinned");
    let r = sys.try_wait_bound(&after).await?;
    ensure(
        r.status.as_ref().is_some_and(|s| s.release_time.is_none()),
        || format!("a Bound reservation has no release time: {r:?}"),
    )?;
    // Bound to the old pod, Released once it is gone (a replacement without addresses yet does
    // not hold them), Bound to the new one: what `kubectl get ipr` shows along the way.
    let bindings = history.bindings("web-1");
    let steps: Vec<(Option<Phase>, Option<&str>)> =
        bindings.iter().map(|(p, u)| (*p, u.as_deref())).collect();
    ensure(
        steps
            == [
                (Some(Phase::Bound), Some(before.uid.as_str())),
                (Some(Phase::Released), Some(before.uid.as_str())),
                (Some(Phase::Bound), Some(after.uid.as_str())),
            ],
        || {
            format!(
                "web-1's reservation did not go Bound -> Released -> Bound (nor was it deleted on the way): {bindings:?}"
            )
        },
    )?;
    sys.check("reservation Bound -> Released -> Bound, never deleted");
    let now = sys.try_running("app=web").await?;
    for name in ["web-0", "web-2"] {
        ensure(now.get(name) == pods.get(name), || {
            format!("{name} changed")
        })?;
    }
    sys.check("the other pods untouched");
    show(sys, n, &["get", "pods", "-o", "wide"])?;

    n.note("From inside the new pod: the kept address is on its eth0");
    let eth0 = show(
        sys,
        n,
        &["exec", "web-1", "--", "ip", "addr", "show", "eth0"],
    )?;
    for ip in &after.ips {
        let inet = if ip.is_ipv4() { "inet" } else { "inet6" };
        ensure(eth0.contains(&format!("{inet} {ip}/")), || {
            format!("{ip} is not on web-1's eth0:\n{eth0}")
        })?;
    }
    sys.check("the kept addresses on the new pod's eth0");
    n.note(&format!(
        "From the client pod on {client_node}: web-1 answers at that address"
    ));
    let url = format!("http://{}/", std::net::SocketAddr::new(after.ips[0], 8080));
    let wget = ["exec", "client", "--", "wget", "-qO-", url.as_str()];
    // httpd may not listen yet the moment the pod runs: until it answers.
    crate::wait::wait_for(&format!("web-1 answering {url}"), DEADLINE, || async {
        sys.try_kubectl(&wget, None).ok()
    })
    .await?;
    show(sys, n, &wget)?;
    sys.check("the kept address answers a client pod");

    let table = show(sys, n, &["get", "ipr"])?;
    let header = table.lines().next().unwrap_or_default();
    for column in ["NAME", "IPS", "NODE", "PHASE", "RELEASE-TIME", "AGE"] {
        ensure(header.contains(column), || {
            format!("no {column} column in:\n{table}")
        })?;
    }
    let row = table
        .lines()
        .find(|l| l.starts_with("web-1 "))
        .unwrap_or_default();
    ensure(
        row.contains(&before.ips[0].to_string())
            && row.contains(&before.node)
            && row.contains("Bound"),
        || format!("no Bound web-1 row with {before:?} in:\n{table}"),
    )?;
    sys.check("kubectl get ipr columns and row");
    Ok(())
}

/// A pod's addresses, comma-separated.
fn addresses(pod: &RunningPod) -> String {
    pod.ips
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

pub async fn unannotated_pod_gets_no_reservation_and_its_address_returns_to_the_pool() {
    // On this binary's own nodes the pods go to the tiny node, whose /29 the last step fills; on
    // a user's cluster to its first node, and that step is skipped.
    let tiny = match realnode::own() {
        Some(_) => Some(realnode::tiny_alone().await),
        None => None,
    };
    let sys = System::start("plain", Options::default()).await;
    let node_a = match &tiny {
        Some((_, node)) => node.name(),
        None => sys.node_name(0).to_owned(),
    };
    let on_tiny = tiny.is_some();
    let place = |yaml: String| {
        if on_tiny {
            realnode::tolerating_tiny(&yaml)
        } else {
            yaml
        }
    };
    // An annotated pod next to it proves the controller is at work in this namespace.
    sys.apply(&place(statefulset(
        "kept",
        1,
        true,
        &[&node_a],
        &retain(None),
    )));
    sys.apply(&place(statefulset("plain", 1, true, &[&node_a], &[])));
    let kept = sys.wait_running("app=kept", &["kept-0"]).await;
    sys.wait_bound(&kept["kept-0"]).await;
    let plain = sys.wait_running("app=plain", &["plain-0"]).await["plain-0"].clone();
    assert!(
        sys.reservations()
            .get_opt("plain-0")
            .await
            .unwrap()
            .is_none(),
        "an unannotated pod got a reservation"
    );
    sys.check("the annotated pod Bound, the unannotated one without a reservation");
    let dir = realnode::node_dir(&sys, "allocation and reservation files", &node_a);
    if let Some(dir) = &dir {
        let allocation = dir.join(plain.ips[0].to_string());
        assert!(allocation.is_file(), "no allocation file {allocation:?}");
    }

    // Deleted: its address file goes (the address is back in the pool), no reservation appears.
    sys.kubectl(&["scale", "statefulset", "plain", "--replicas=0"]);
    wait_for("plain-0 gone", || async {
        sys.pods()
            .get_opt("plain-0")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    if let Some(dir) = &dir {
        sys.wait_file(&dir.join(plain.ips[0].to_string()), false)
            .await;
        assert!(
            !dir.join("reserved").join(&sys.ns).join("plain-0").exists(),
            "a reservation file for an unannotated pod"
        );
    }
    assert!(
        sys.reservations()
            .get_opt("plain-0")
            .await
            .unwrap()
            .is_none()
    );
    sys.check("deleted, still no reservation");
    if !on_tiny {
        sys.skip(
            "the address handed out again on a full /29",
            "own nodes (a tiny node with a /29)",
        );
        return;
    }

    // The address is handed out again: kept-0 holds one of the /29's addresses, so four pods
    // fill the rest, and one of them must get plain-0's.
    let fill = realnode::TINY_ADDRESSES - 1;
    sys.apply(&place(statefulset("fill", fill, true, &[&node_a], &[])));
    let names: Vec<String> = (0..fill).map(|i| format!("fill-{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let fill = sys.wait_running("app=fill", &names).await;
    assert!(
        fill.values().any(|p| p.ips[0] == plain.ips[0]),
        "plain-0's address {} was not handed out again: {fill:?}",
        plain.ips[0]
    );
    sys.check("the address handed out again");
}
