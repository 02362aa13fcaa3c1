//! Scenarios 3, 4 and 5, one `pub async fn` each (`tests/realnode/` runs them on its real nodes with the chart installed, or on
//! a user's cluster with `IPKEEP_E2E_KUBECONFIG`). Scenarios 3 and 4 fill a range: they run on the
//! tiny node (a /29) of this binary's own nodes, one at a time.

use std::{
    collections::BTreeSet,
    time::{Duration, SystemTime},
};

use super::{Narrator, ScenarioError, TestLog, apply, ensure, or_fail, show};
use crate::testkit::realnode::{self, TINY_ADDRESSES, apply_on_tiny};
use crate::testkit::system::{
    Change, Options, RunningPod, System, phase, retain, skipped_on_users_cluster, statefulset,
};
use crate::testkit::{DEADLINE, wait_for};
use ipkeep_operator::api::Phase;
use kube::ResourceExt;

pub async fn released_address_is_never_handed_to_another_pod_even_when_the_range_is_full() {
    if skipped_on_users_cluster(
        "released_address_is_never_handed_to_another_pod_even_when_the_range_is_full",
        "a node with a /29 and its data directory",
    ) {
        return;
    }
    let (_tiny, node) = realnode::tiny_alone().await;
    let sys = System::start("held", Options::default()).await;
    let node_a = node.name();
    apply_on_tiny(&sys, &node_a, "held", 1, &retain(Some("1h")));
    let held = sys.wait_running("app=held", &["held-0"]).await["held-0"].clone();
    sys.wait_bound(&held).await;
    sys.kubectl(&["scale", "statefulset", "held", "--replicas=0"]);
    sys.wait_reservation("held-0", "Released", |r| phase(r) == Some(Phase::Released))
        .await;
    sys.wait_file(&realnode::reserved_file(node, &sys.ns, "held-0"), true)
        .await;
    sys.check("held-0 Released, its file on the node");

    // Five pods for the four addresses left: the held one is next in line for the round-robin
    // cursor at some point, and is skipped every time.
    apply_on_tiny(&sys, &node_a, "fill", TINY_ADDRESSES, &[]);
    let fill = wait_for("four of the five fill pods Running", || async {
        let r = sys.running("app=fill").await;
        (r.len() as u32 == TINY_ADDRESSES - 1).then_some(r)
    })
    .await;
    for pod in fill.values() {
        assert_ne!(pod.ips[0], held.ips[0], "{} got the held address", pod.name);
    }
    let distinct: BTreeSet<_> = fill.values().map(|p| p.ips[0]).collect();
    assert_eq!(distinct.len() as u32, TINY_ADDRESSES - 1);
    sys.check("four fill pods Running, none with the held address");
    let pending = (0..TINY_ADDRESSES)
        .map(|i| format!("fill-{i}"))
        .find(|n| !fill.contains_key(n))
        .unwrap();
    let event = wait_for(
        &format!("a FailedCreatePodSandBox Event on {pending} with the plugin's message"),
        || async {
            sys.events("Pod", &pending).await.into_iter().find(|e| {
                e.reason.as_deref() == Some("FailedCreatePodSandBox")
                    && e.message
                        .as_deref()
                        .is_some_and(|m| m.contains("no IP addresses available"))
            })
        },
    )
    .await;
    eprintln!("{pending}: {}", event.message.unwrap_or_default());
    let p = sys.pods().get(&pending).await.unwrap();
    assert_eq!(
        p.status.and_then(|s| s.phase).as_deref(),
        Some("Pending"),
        "{pending} is not Pending"
    );
    sys.check("the fifth Pending with the plugin's error");
    // The held address's owner comes back and gets it, range full or not.
    sys.kubectl(&["scale", "statefulset", "held", "--replicas=1"]);
    let back = sys.wait_recreated("held-0", &held.uid).await;
    assert_eq!(back.ips, held.ips, "held-0 did not get its address back");
    sys.wait_bound(&back).await;
    // Nobody got it meanwhile, and the fifth fill pod is still waiting.
    let fill_now = sys.running("app=fill").await;
    assert!(fill_now.values().all(|p| p.ips[0] != held.ips[0]));
    assert!(!fill_now.contains_key(&pending));
    sys.check("held-0 back with its address on the full range, the fifth still Pending");
}

pub async fn retain_for_3s_expires_at_its_release_time_and_the_address_is_allocated_again() {
    if skipped_on_users_cluster(
        "retain_for_3s_expires_at_its_release_time_and_the_address_is_allocated_again",
        "a node with a /29 and its data directory",
    ) {
        return;
    }
    let (_tiny, node) = realnode::tiny_alone().await;
    let sys = System::start("expiry", Options::default()).await;
    let node_a = node.name();
    let n = &mut TestLog;
    let yaml = realnode::tolerating_tiny(&statefulset(
        "short",
        1,
        true,
        &[&node_a],
        &retain(Some("3s")),
    ));
    let short = or_fail(kept_for(&sys, n, &yaml, "short").await);
    let file = realnode::reserved_file(node, &sys.ns, "short-0");
    sys.wait_file(&file, true).await;
    let late = or_fail(expires(&sys, n, &short, Duration::from_secs(3)).await);
    // How late is printed, not asserted (no wall-clock bounds in tests: a loaded machine is not
    // the controller's fault); `make bench-controller` holds the 1 s target over 1 000 expiries.
    eprintln!(
        "short-0 expired {:.3}s after its release time",
        late.as_secs_f64()
    );
    sys.wait_file(&file, false).await;
    sys.check("its file gone from the node");

    // The address is allocated again: five pods fill the five addresses.
    apply_on_tiny(&sys, &node_a, "fill", TINY_ADDRESSES, &[]);
    let names: Vec<String> = (0..TINY_ADDRESSES).map(|i| format!("fill-{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let fill = sys.wait_running("app=fill", &names).await;
    assert!(
        fill.values().any(|p| p.ips[0] == short.ips[0]),
        "the expired address {} was not allocated again: {fill:?}",
        short.ips[0]
    );
    sys.check("the address allocated again on the full range");
}

/// Applies `yaml`, the StatefulSet `name` of one pod with a retention, and waits until its pod
/// runs with its reservation Bound; the pod.
pub async fn kept_for(
    sys: &System,
    n: &mut dyn Narrator,
    yaml: &str,
    name: &str,
) -> Result<RunningPod, ScenarioError> {
    apply(sys, n, yaml)?;
    let pod = format!("{name}-0");
    let running = sys
        .try_wait_running(&format!("app={name}"), &[&pod])
        .await?;
    let kept = running[&pod].clone();
    sys.try_wait_bound(&kept).await?;
    Ok(kept)
}

/// Scenario 4's expiry, the demo's third step: `pod`'s StatefulSet scaled to 0, its reservation
/// Released with a release time `retain_for` after it was released, and deleted at or after that
/// time; how late.
pub async fn expires(
    sys: &System,
    n: &mut dyn Narrator,
    pod: &RunningPod,
    retain_for: Duration,
) -> Result<Duration, ScenarioError> {
    let history = sys.record_reservations();
    let set = pod
        .name
        .rsplit_once('-')
        .map_or(pod.name.as_str(), |(s, _)| s);
    show(sys, n, &["scale", "statefulset", set, "--replicas=0"])?;
    let released = sys
        .try_wait_reservation(&pod.name, "Released with a release time", |r| {
            phase(r) == Some(Phase::Released)
                && r.status
                    .as_ref()
                    .and_then(|s| s.release_time.as_ref())
                    .is_some()
        })
        .await?;
    let (released_at, release_time) = released
        .status
        .as_ref()
        .and_then(|s| Some((s.released_at.as_ref()?.0, s.release_time.as_ref()?.0)))
        .ok_or_else(|| ScenarioError::Check(format!("{} Released without releasedAt", pod.name)))?;
    let held = release_time.duration_since(released_at).as_secs_f64();
    ensure(held == retain_for.as_secs_f64(), || {
        format!(
            "{}: releaseTime is releasedAt + {held}s, not + {}s",
            pod.name,
            retain_for.as_secs_f64()
        )
    })?;
    sys.check("Released with releaseTime = releasedAt + retain-for");
    n.note(&format!(
        "{} is gone; its address {} stays reserved (nobody else gets it) until RELEASE-TIME:",
        pod.name, pod.ips[0]
    ));
    show(sys, n, &["get", "ipr", &pod.name])?;
    let deleted_at = crate::wait::wait_for(
        &format!("{}'s reservation deleted", pod.name),
        DEADLINE,
        || async {
            history.changes().iter().find_map(|c| match c {
                (at, Change::Deleted(r)) if r.name_any() == pod.name => Some(*at),
                _ => None,
            })
        },
    )
    .await?;
    let release = SystemTime::UNIX_EPOCH
        + Duration::from_nanos(u64::try_from(release_time.as_nanosecond()).unwrap_or_default());
    let late = deleted_at.duration_since(release).map_err(|e| {
        ScenarioError::Check(format!(
            "{} deleted {:?} before its release time",
            pod.name,
            e.duration()
        ))
    })?;
    sys.check("deleted at or after its release time");
    n.note(&format!(
        "{} s later the controller deleted it, the agent removed the node's file, and the address is free again:",
        retain_for.as_secs()
    ));
    show(sys, n, &["get", "ipr"])?;
    Ok(late)
}

pub async fn scaled_to_zero_and_back_every_ordinal_gets_its_address_back() {
    let sys = System::start("scale", Options::default()).await;
    let node_a = sys.node_name(0).to_owned();
    let annotations = [
        ("ipkeep.dev/retain", "true"),
        ("ipkeep.dev/retain-for", "1h"),
    ];
    sys.apply(&statefulset("db", 4, true, &[&node_a], &annotations));
    let names = ["db-0", "db-1", "db-2", "db-3"];
    let before = sys.wait_running("app=db", &names).await;
    for p in before.values() {
        sys.wait_bound(p).await;
    }
    let history = sys.record_reservations();
    sys.kubectl(&["scale", "statefulset", "db", "--replicas=0"]);
    for n in names {
        sys.wait_reservation(n, "Released", |r| phase(r) == Some(Phase::Released))
            .await;
    }
    // Other pods come and go meanwhile (round-robin moves on past the held addresses).
    sys.apply(&statefulset("other", 3, true, &[&node_a], &[]));
    let others = sys
        .wait_running("app=other", &["other-0", "other-1", "other-2"])
        .await;
    let held: BTreeSet<_> = before.values().map(|p| p.ips[0]).collect();
    assert!(others.values().all(|p| !held.contains(&p.ips[0])));

    sys.kubectl(&["scale", "statefulset", "db", "--replicas=4"]);
    let after = sys.wait_running("app=db", &names).await;
    for n in names {
        assert_eq!(
            after[n].ips, before[n].ips,
            "{n} came back with other addresses"
        );
        assert_ne!(after[n].uid, before[n].uid);
        sys.wait_bound(&after[n]).await;
    }
    assert!(
        !history
            .changes()
            .iter()
            .any(|c| matches!(c, (_, Change::Deleted(_)))),
        "a reservation was deleted within its retention"
    );
    sys.check("every ordinal has its addresses back, no reservation deleted");
}
