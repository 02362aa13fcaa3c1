//! The reservation lifecycle, transition by transition, with `now` injected.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{collections::BTreeMap, net::IpAddr, time::Duration};

use ipkeep_operator::rules::{
    budget::{Budget, Source},
    lifecycle::{
        Conflict, Defaults, DeleteReason, DesiredSpec, Input, NameSource, OwnerState, Plan,
        PodView, ReservationView, StatusView, Subject, Yield, decide, reason,
    },
    namespaces::Verdict,
    optin::Mode,
    optin::{self, OptIn, Retain},
    placement::Placed,
};
use ipkeep_operator::{
    api::Phase,
    api::PodKey,
    api::reason::EventReason,
    api::retention::{FoundRetainFor, RetainFor},
};
use jiff::Timestamp;

const POD_UID: &str = "uid-1";
const DAY: Duration = Duration::from_secs(86_400);

fn t(s: &str) -> Timestamp {
    s.parse().expect("a valid timestamp")
}

fn now() -> Timestamp {
    t("2026-01-10T12:00:00Z")
}

fn defaults() -> Defaults {
    Defaults {
        retain_for: DAY,
        placement: Mode::Preferred,
        max_retain_for: RetainFor::parse("7d").unwrap(),
    }
}

/// A `spec.retainFor` as the view reads it.
fn rf(text: &str) -> Option<FoundRetainFor> {
    Some(RetainFor::parse(text))
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("an address")
}

fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn retained() -> OptIn {
    optin::opt_in(&annotations(&[(optin::RETAIN, "true")]), None)
}

/// An annotated pod running on node-a with 10.244.1.17 and fd00::11.
fn pod() -> PodView {
    PodView {
        uid: POD_UID.into(),
        node_name: Some("node-a".into()),
        ips: vec![ip("10.244.1.17"), ip("fd00::11")],
        running: true,
        finished: false,
        host_network: false,
        opt_in: retained(),
        owner_statefulset: None,
        placed: Placed::On {
            mode: Mode::Preferred,
            node: "node-a".into(),
        },
        name: NameSource::Stable,
    }
}

fn bound() -> ReservationView {
    ReservationView {
        ips: vec!["10.244.1.17".into(), "fd00::11".into()],
        node_name: "node-a".into(),
        retain_for: None,
        managed: true,
        created: t("2026-01-01T00:00:00Z"),
        owner_statefulset: None,
        release_with_owner: false,
        status: StatusView {
            phase: Some(Phase::Bound),
            pod_uid: Some(POD_UID.into()),
            released_at: None,
            release_time: None,
            conflict: None,
        },
    }
}

fn released(at: &str, until: &str) -> ReservationView {
    let mut r = bound();
    r.status.phase = Some(Phase::Released);
    r.status.released_at = Some(t(at));
    r.status.release_time = Some(t(until));
    r
}

fn input<'a>(pod: Option<&'a PodView>, r: Option<&'a ReservationView>) -> Input<'a> {
    Input {
        pod,
        reservation: r,
        owner: OwnerState::None,
        conflict: None,
        node_pod_cidrs: None,
        node_gone: false,
        yields: None,
        namespace: Verdict::Selected,
        told: false,
    }
}

fn decide_now(input: &Input<'_>) -> Plan {
    decide(input, now(), &defaults())
}

fn reasons(plan: &Plan) -> Vec<(EventReason, bool, Subject)> {
    plan.notices
        .iter()
        .map(|n| (n.reason, n.reason.warning, n.subject))
        .collect()
}

#[test]
fn annotations_on_the_pod_win_over_the_statefulsets() {
    let sts = annotations(&[
        (optin::RETAIN, "true"),
        (optin::RETAIN_FOR, "7d"),
        (optin::RELEASE_WITH_OWNER, "true"),
    ]);
    let from_owner = optin::opt_in(&BTreeMap::new(), Some(&sts));
    assert_eq!(from_owner.retain, Retain::Yes);
    assert_eq!(from_owner.retain_for, Some(RetainFor::parse("7d").unwrap()));
    assert!(from_owner.release_with_owner);

    let pod = annotations(&[(optin::RETAIN, "false"), (optin::RETAIN_FOR, "1h")]);
    let mixed = optin::opt_in(&pod, Some(&sts));
    assert_eq!(mixed.retain, Retain::No, "the pod's own retain wins");
    assert_eq!(mixed.retain_for, Some(RetainFor::parse("1h").unwrap()));
    assert!(
        mixed.release_with_owner,
        "unset on the pod: the StatefulSet's applies"
    );
    assert!(mixed.problems.is_empty());

    let bad = optin::opt_in(
        &annotations(&[(optin::RETAIN, "yes"), (optin::RETAIN_FOR, "forever")]),
        None,
    );
    assert_eq!(bad.retain, Retain::Malformed);
    assert!(bad.retain_for_malformed);
    assert_eq!(bad.problems.len(), 2, "{:?}", bad.problems);
}

#[test]
fn annotated_running_pod_with_ips_gets_a_bound_reservation() {
    let p = pod();
    let plan = decide_now(&input(Some(&p), None));
    assert_eq!(
        plan.spec,
        Some(DesiredSpec {
            ips: vec!["10.244.1.17".into(), "fd00::11".into()],
            node_name: "node-a".into(),
            retain_for: None,
            owner_statefulset: None,
            release_with_owner: false,
        })
    );
    let status = plan.status.clone().expect("a status");
    assert_eq!(status.phase, Some(Phase::Bound));
    assert_eq!(status.pod_uid.as_deref(), Some(POD_UID));
    assert_eq!(status.release_time, None);
    assert_eq!(plan.delete, None);
    assert_eq!(
        plan.requeue_at, None,
        "a Bound reservation waits for changes"
    );
    assert_eq!(
        reasons(&plan),
        vec![(reason::RESERVED, false, Subject::Pod)]
    );
}

#[test]
fn a_bound_reservation_in_step_writes_nothing() {
    let p = pod();
    let r = bound();
    let plan = decide_now(&input(Some(&p), Some(&r)));
    assert!(plan.writes_nothing(), "{plan:?}");
    assert!(plan.notices.is_empty(), "{plan:?}");
}

#[test]
fn retain_for_annotation_is_written_to_the_spec_and_a_change_applies() {
    let mut p = pod();
    p.opt_in = optin::opt_in(
        &annotations(&[(optin::RETAIN, "true"), (optin::RETAIN_FOR, "3s")]),
        None,
    );
    let r = bound();
    let plan = decide_now(&input(Some(&p), Some(&r)));
    assert_eq!(plan.spec.expect("spec update").retain_for, rf("3s"));
    assert_eq!(plan.status, None, "status already right");
}

#[test]
fn deleted_pod_releases_with_the_release_time_from_retain_for() {
    for (retain_for, want_until) in [
        (None, "2026-01-11T12:00:00Z"),
        (Some("30m"), "2026-01-10T12:30:00Z"),
        (Some("3s"), "2026-01-10T12:00:03Z"),
    ] {
        let mut r = bound();
        r.retain_for = retain_for.map(RetainFor::parse);
        let plan = decide_now(&input(None, Some(&r)));
        let status = plan.status.clone().expect("status written");
        assert_eq!(status.phase, Some(Phase::Released), "{retain_for:?}");
        assert_eq!(status.released_at, Some(now()));
        assert_eq!(status.release_time, Some(t(want_until)), "{retain_for:?}");
        assert_eq!(
            status.pod_uid.as_deref(),
            Some(POD_UID),
            "the last holder is kept"
        );
        assert_eq!(
            plan.requeue_at,
            Some(t(want_until)),
            "requeued for the release instant"
        );
        assert_eq!(plan.delete, None);
        assert_eq!(
            reasons(&plan),
            vec![(reason::RELEASED, false, Subject::Reservation)]
        );
    }
}

#[test]
fn a_spec_retain_for_over_the_maximum_warns_and_the_default_applies() {
    // Only an API server that skips the CRD's CEL rules lets 400d through.
    let mut r = bound();
    r.retain_for = rf("400d");
    let plan = decide_now(&input(None, Some(&r)));
    let status = plan.status.clone().expect("status written");
    assert_eq!(status.release_time, Some(t("2026-01-11T12:00:00Z")));
    assert_eq!(
        reasons(&plan),
        vec![
            (reason::INVALID_ANNOTATION, true, Subject::Reservation),
            (reason::RELEASED, false, Subject::Reservation)
        ]
    );
    assert!(
        plan.notices[0].message.contains("\"400d\""),
        "{:?}",
        plan.notices[0]
    );
}

#[test]
fn finished_pods_release_like_deleted_ones() {
    let mut p = pod();
    p.finished = true;
    let r = bound();
    let plan = decide_now(&input(Some(&p), Some(&r)));
    assert_eq!(plan.status.expect("status").phase, Some(Phase::Released));
}

#[test]
fn a_terminating_pod_still_holds_its_addresses() {
    // deletionTimestamp set, phase still Running: the view is an alive pod.
    let p = pod();
    let r = bound();
    let plan = decide_now(&input(Some(&p), Some(&r)));
    assert!(plan.writes_nothing());
}

#[test]
fn a_released_reservation_waits_until_its_release_time() {
    let mut r = released("2026-01-10T11:00:00Z", "2026-01-10T12:00:01Z");
    r.retain_for = rf("3601s");
    let plan = decide_now(&input(None, Some(&r)));
    assert!(plan.writes_nothing(), "{plan:?}");
    assert_eq!(plan.requeue_at, Some(t("2026-01-10T12:00:01Z")));
    assert!(plan.notices.is_empty());
}

#[test]
fn release_time_reached_without_a_pod_deletes() {
    for until in ["2026-01-10T12:00:00Z", "2026-01-10T11:59:00Z"] {
        let mut r = released("2026-01-09T12:00:00Z", until);
        // The stored release time is derived again from releasedAt + retainFor.
        r.retain_for = rf(if until.ends_with("12:00:00Z") {
            "1d"
        } else {
            "1439m"
        });
        let plan = decide_now(&input(None, Some(&r)));
        assert_eq!(
            plan.delete,
            Some(DeleteReason::Expired { due: t(until) }),
            "{until}"
        );
        assert_eq!(plan.status, None);
    }
}

#[test]
fn a_pod_of_that_name_alive_blocks_expiry() {
    // Release time long past, but a (pending) pod of the name exists: never deleted.
    let mut p = pod();
    p.uid = "uid-2".into();
    p.ips.clear();
    p.running = false;
    let r = released("2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z");
    let plan = decide_now(&input(Some(&p), Some(&r)));
    assert_eq!(plan.delete, None);
    assert!(plan.writes_nothing());
}

#[test]
fn a_replacement_pod_without_addresses_yet_releases_the_bound_reservation() {
    // A StatefulSet re-creates a deleted pod within milliseconds: the controller may never see
    // the name without a pod. The pod that held the addresses is gone, so the reservation reads
    // Released with its release time running, and is never deleted while the new pod lives.
    let mut p = pod();
    p.uid = "uid-2".into();
    p.ips.clear();
    p.running = false;
    let r = bound();
    let plan = decide_now(&input(Some(&p), Some(&r)));
    let status = plan.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Released));
    assert_eq!(
        status.pod_uid.as_deref(),
        Some(POD_UID),
        "the pod that last held them"
    );
    assert_eq!(status.released_at, Some(now()));
    assert_eq!(
        status.release_time,
        now().checked_add(defaults().retain_for).ok()
    );
    assert_eq!(plan.delete, None);
    assert_eq!(plan.spec, None);
    assert_eq!(
        reasons(&plan),
        vec![(reason::RELEASED, false, Subject::Reservation)]
    );

    // The same pod without addresses for a moment (not a replacement) changes nothing.
    let mut same = pod();
    same.ips.clear();
    assert!(decide_now(&input(Some(&same), Some(&r))).writes_nothing());

    // Released at once by release-with-owner: still never deleted while the new pod lives.
    let mut owned = bound();
    owned.release_with_owner = true;
    owned.owner_statefulset = Some("web".into());
    let mut i = input(Some(&p), Some(&owned));
    i.owner = OwnerState::Gone;
    assert_eq!(decide_now(&i).delete, None);
}

#[test]
fn returning_pod_with_the_reserved_addresses_is_bound_again() {
    let mut p = pod();
    p.uid = "uid-2".into();
    let r = released("2026-01-10T11:00:00Z", "2026-01-11T11:00:00Z");
    let plan = decide_now(&input(Some(&p), Some(&r)));
    let status = plan.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Bound));
    assert_eq!(status.pod_uid.as_deref(), Some("uid-2"));
    assert_eq!((status.released_at, status.release_time), (None, None));
    assert_eq!(plan.spec, None, "same addresses, same spec");
    assert_eq!(
        reasons(&plan),
        vec![(reason::REBOUND, false, Subject::Both)]
    );
}

#[test]
fn returning_pod_on_another_node_moves_the_reservation_and_warns() {
    let mut p = pod();
    p.uid = "uid-2".into();
    p.node_name = Some("node-b".into());
    p.ips = vec![ip("10.244.2.5")];
    let r = released("2026-01-10T11:00:00Z", "2026-01-11T11:00:00Z");
    let plan = decide_now(&input(Some(&p), Some(&r)));
    let spec = plan.spec.clone().expect("spec follows the pod");
    assert_eq!(
        (spec.ips, spec.node_name.as_str()),
        (vec!["10.244.2.5".to_string()], "node-b")
    );
    assert_eq!(
        plan.status.clone().expect("status").phase,
        Some(Phase::Bound)
    );
    assert_eq!(
        reasons(&plan),
        vec![(reason::ADDRESSES_CHANGED, true, Subject::Both)]
    );
    assert!(
        plan.notices[0].message.contains("node-b"),
        "{}",
        plan.notices[0].message
    );
}

#[test]
fn returning_pod_whose_addresses_left_the_nodes_ranges_is_told_why() {
    let mut p = pod();
    p.uid = "uid-2".into();
    p.ips = vec![ip("10.245.1.3")];
    let r = released("2026-01-10T11:00:00Z", "2026-01-11T11:00:00Z");
    let cidrs = ["10.245.1.0/24".parse().expect("cidr")];
    let mut i = input(Some(&p), Some(&r));
    i.node_pod_cidrs = Some(&cidrs);
    let plan = decide_now(&i);
    assert_eq!(
        plan.spec.clone().expect("spec").ips,
        vec!["10.245.1.3".to_string()]
    );
    let message = &plan.notices[0].message;
    assert!(
        message.contains("outside node node-a's podCIDRs 10.245.1.0/24"),
        "{message}"
    );
}

#[test]
fn removing_the_annotation_from_a_live_pod_ends_the_reservation() {
    let mut p = pod();
    p.opt_in = OptIn::none();
    let r = bound();
    let plan = decide_now(&input(Some(&p), Some(&r)));
    assert_eq!(plan.delete, Some(DeleteReason::OptedOut));
    assert_eq!(reasons(&plan), vec![(reason::ENDED, false, Subject::Pod)]);
}

#[test]
fn malformed_annotations_warn_and_change_nothing() {
    // retain malformed: an existing reservation stays as it is, none is created.
    let mut p = pod();
    p.opt_in = optin::opt_in(&annotations(&[(optin::RETAIN, "yes please")]), None);
    let r = bound();
    let plan = decide_now(&input(Some(&p), Some(&r)));
    assert!(plan.writes_nothing(), "{plan:?}");
    assert_eq!(
        reasons(&plan),
        vec![(reason::INVALID_ANNOTATION, true, Subject::Pod)]
    );
    let plan = decide_now(&input(Some(&p), None));
    assert!(plan.writes_nothing(), "{plan:?}");

    // retain-for malformed: the reservation keeps its current retention.
    let mut p = pod();
    p.opt_in = optin::opt_in(
        &annotations(&[(optin::RETAIN, "true"), (optin::RETAIN_FOR, "1 week")]),
        None,
    );
    let mut r = bound();
    r.retain_for = rf("2h");
    let plan = decide_now(&input(Some(&p), Some(&r)));
    assert!(plan.writes_nothing(), "{plan:?}");
    assert_eq!(
        reasons(&plan),
        vec![(reason::INVALID_ANNOTATION, true, Subject::Pod)]
    );
}

#[test]
fn a_hand_made_reservation_is_honoured_from_its_creation_until_its_release_time() {
    let mut r = bound();
    r.managed = false;
    r.retain_for = rf("1d");
    r.created = t("2026-01-10T06:00:00Z");
    r.status = StatusView::default();
    let plan = decide_now(&input(None, Some(&r)));
    let status = plan.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Released));
    assert_eq!(status.released_at, Some(t("2026-01-10T06:00:00Z")));
    assert_eq!(status.release_time, Some(t("2026-01-11T06:00:00Z")));
    assert_eq!(
        reasons(&plan),
        vec![(reason::HONOURED, false, Subject::Reservation)]
    );

    // Created long ago: expired at once.
    r.created = t("2026-01-01T00:00:00Z");
    let plan = decide_now(&input(None, Some(&r)));
    assert_eq!(
        plan.delete,
        Some(DeleteReason::Expired {
            due: t("2026-01-02T00:00:00Z")
        })
    );

    // The pod appears (even without the annotation): the reservation binds to it.
    let mut r = bound();
    r.managed = false;
    r.status = StatusView::default();
    let mut p = pod();
    p.opt_in = OptIn::none();
    let plan = decide_now(&input(Some(&p), Some(&r)));
    assert_eq!(plan.status.expect("status").phase, Some(Phase::Bound));
    assert_eq!(plan.delete, None);
}

#[test]
fn the_younger_of_two_reservations_claiming_an_address_gets_a_conflict() {
    let holder = PodKey::new("other", "db-0").unwrap();
    let p = pod();
    let r = bound();
    let mut i = input(Some(&p), Some(&r));
    i.conflict = Some((ip("10.244.1.17"), &holder));
    let plan = decide_now(&i);
    let conflict = plan
        .status
        .clone()
        .expect("status")
        .conflict
        .expect("conflict");
    assert_eq!(
        conflict,
        Conflict {
            ip: ip("10.244.1.17"),
            holder: holder.clone(),
            since: now()
        }
    );
    assert_eq!(
        reasons(&plan),
        vec![(reason::CONFLICT, true, Subject::Reservation)]
    );
    assert!(plan.notices[0].message.contains("other/db-0"));

    // Already recorded: nothing new, and the transition time is kept.
    let mut r2 = bound();
    r2.status.conflict = Some(Conflict {
        since: t("2026-01-05T00:00:00Z"),
        ..conflict
    });
    let mut i = input(Some(&p), Some(&r2));
    i.conflict = Some((ip("10.244.1.17"), &holder));
    let plan = decide_now(&i);
    assert!(plan.writes_nothing(), "{plan:?}");
    assert!(plan.notices.is_empty());

    // The holder went away: the condition is cleared.
    let plan = decide_now(&input(Some(&p), Some(&r2)));
    assert_eq!(plan.status.expect("status").conflict, None);
}

#[test]
fn conflict_holder_is_the_oldest_claim() {
    use ipkeep_operator::rules::lifecycle::{Claim, holder};
    let claim = |name: &str, created: &str| Claim {
        key: PodKey::new("ns", name).unwrap(),
        created: t(created),
        bound: false,
        yielded: false,
    };
    let a = claim("a", "2026-01-01T00:00:00Z");
    let b = claim("b", "2026-01-02T00:00:00Z");
    let c = claim("c", "2026-01-02T00:00:00Z");
    let all = [a.clone(), b.clone(), c.clone()];
    assert_eq!(holder(&a, &all), None, "the oldest holds");
    assert_eq!(holder(&b, &all), Some(&a));
    assert_eq!(
        holder(&c, &all).map(|h| h.key.to_string()).as_deref(),
        Some("ns/a")
    );
    assert_eq!(
        holder(&c, &[b.clone(), c.clone()]),
        Some(&b),
        "same age: by name"
    );
}

#[test]
fn conflict_the_live_pod_keeps_its_address_and_a_decision_stays() {
    use ipkeep_operator::rules::lifecycle::{Claim, holder};
    let claim = |name: &str, created: &str, bound: bool, yielded: bool| Claim {
        key: PodKey::new("ns", name).unwrap(),
        created: t(created),
        bound,
        yielded,
    };
    let old = "2026-01-01T00:00:00Z";
    let new = "2026-03-01T00:00:00Z";
    // (what happened, me, the other, whether the other holds against me)
    let cases = [
        (
            "restored: a reservation released since, older than the live pod's re-created one",
            claim("restored", old, false, false),
            claim("live", new, true, false),
            true,
        ),
        (
            "the live pod's, against the restored one",
            claim("live", new, true, false),
            claim("restored", old, false, false),
            false,
        ),
        (
            "the live pod went away: the restored one stays yielded",
            claim("restored", old, false, true),
            claim("live", new, false, false),
            true,
        ),
        (
            "both away, neither decided: the older",
            claim("young", new, false, false),
            claim("old", old, false, false),
            true,
        ),
        (
            "both bound: the older",
            claim("young", new, true, false),
            claim("old", old, true, false),
            true,
        ),
        (
            "a hand-made reservation cannot take a live pod's address",
            claim("by-hand", new, false, false),
            claim("live", old, true, false),
            true,
        ),
    ];
    for (what, me, other, held) in cases {
        let others = [me.clone(), other.clone()];
        assert_eq!(holder(&me, &others).is_some(), held, "{what}");
    }
}

#[test]
fn host_network_pods_and_pods_without_ips_get_no_reservation() {
    let mut p = pod();
    p.host_network = true;
    let plan = decide_now(&input(Some(&p), None));
    assert!(plan.writes_nothing());
    assert_eq!(
        reasons(&plan),
        vec![(reason::NOT_RESERVED, true, Subject::Pod)]
    );

    let mut p = pod();
    p.ips.clear();
    let plan = decide_now(&input(Some(&p), None));
    assert!(plan.writes_nothing());
    assert_eq!(
        reasons(&plan),
        vec![(reason::NOT_RESERVED, true, Subject::Pod)]
    );

    // Pending without an address yet: quietly wait.
    p.running = false;
    let plan = decide_now(&input(Some(&p), None));
    assert!(plan.writes_nothing() && plan.notices.is_empty());

    // Not annotated: nothing at all.
    let mut p = pod();
    p.opt_in = OptIn::none();
    let plan = decide_now(&input(Some(&p), None));
    assert_eq!(plan, Plan::default());
}

#[test]
fn statefulset_annotations_opt_existing_pods_in_and_record_the_owner() {
    let sts = annotations(&[(optin::RETAIN, "true"), (optin::RELEASE_WITH_OWNER, "true")]);
    let mut p = pod();
    p.opt_in = optin::opt_in(&BTreeMap::new(), Some(&sts));
    p.owner_statefulset = Some("db".into());
    let plan = decide_now(&input(Some(&p), None));
    let spec = plan
        .spec
        .expect("created from the StatefulSet's annotation");
    assert_eq!(spec.owner_statefulset.as_deref(), Some("db"));
    assert!(spec.release_with_owner);
}

#[test]
fn deleting_the_statefulset_keeps_the_release_time_unless_release_with_owner() {
    // Default: the pod is gone, the StatefulSet too: normal retention.
    let mut r = bound();
    r.owner_statefulset = Some("db".into());
    let mut i = input(None, Some(&r));
    i.owner = OwnerState::Gone;
    let plan = decide_now(&i);
    assert_eq!(
        plan.status.expect("status").release_time,
        Some(t("2026-01-11T12:00:00Z"))
    );

    // release-with-owner: the pod gone with its StatefulSet frees the addresses at once.
    r.release_with_owner = true;
    let mut i = input(None, Some(&r));
    i.owner = OwnerState::Gone;
    let plan = decide_now(&i);
    assert_eq!(plan.delete, Some(DeleteReason::Expired { due: now() }));

    // Already Released when the StatefulSet goes: the release time moves to now.
    let mut r = released("2026-01-10T11:00:00Z", "2026-01-11T11:00:00Z");
    r.owner_statefulset = Some("db".into());
    r.release_with_owner = true;
    let mut i = input(None, Some(&r));
    i.owner = OwnerState::Gone;
    let plan = decide_now(&i);
    assert_eq!(
        plan.delete,
        Some(DeleteReason::Expired {
            due: t("2026-01-10T11:00:00Z")
        })
    );

    // A scale-down (StatefulSet still there) never cascades.
    let mut i = input(None, Some(&r));
    i.owner = OwnerState::Present;
    let plan = decide_now(&i);
    assert_eq!(plan.delete, None);
    assert_eq!(plan.requeue_at, Some(t("2026-01-11T11:00:00Z")));
}

#[test]
fn dual_stack_pods_reserve_one_address_per_family() {
    let mut p = pod();
    p.ips = vec![ip("fd00::11"), ip("10.244.1.17"), ip("10.244.1.99")];
    let plan = decide_now(&input(Some(&p), None));
    assert_eq!(
        plan.spec.expect("spec").ips,
        vec!["10.244.1.17".to_string(), "fd00::11".to_string()]
    );
}

#[test]
fn a_live_pod_whose_statefulset_was_deleted_keeps_what_the_statefulset_said() {
    // Opted in by the StatefulSet's own annotations; the StatefulSet is gone, the pod not yet.
    let mut p = pod();
    p.opt_in = OptIn::none();
    p.owner_statefulset = Some("db".into());
    let mut r = bound();
    r.owner_statefulset = Some("db".into());
    r.retain_for = rf("1h");
    r.release_with_owner = true;
    let mut i = input(Some(&p), Some(&r));
    i.owner = OwnerState::Gone;
    let plan = decide_now(&i);
    assert!(plan.writes_nothing(), "{plan:?}");
    assert!(plan.notices.is_empty(), "{plan:?}");
}

/// A pod returning on node-b (new addresses) after the webhook recorded `placed`.
fn returned_elsewhere(placed: Placed) -> PodView {
    let mut p = pod();
    p.uid = "uid-2".into();
    p.node_name = Some("node-b".into());
    p.ips = vec![ip("10.244.2.5")];
    p.placed = placed;
    p
}

#[test]
fn a_returning_pod_the_webhook_never_saw_is_told_so_once() {
    let r = released("2026-01-10T11:00:00Z", "2026-01-11T11:00:00Z");
    let p = returned_elsewhere(Placed::Unseen);
    let plan = decide_now(&input(Some(&p), Some(&r)));
    assert_eq!(
        reasons(&plan),
        vec![
            (reason::PLACEMENT_MISSED, true, Subject::Pod),
            (reason::ADDRESSES_CHANGED, true, Subject::Both),
        ]
    );
    assert!(
        plan.notices[0].message.contains("node-a"),
        "{}",
        plan.notices[0].message
    );

    // Once bound to this pod, the same pod says nothing more.
    let mut bound_now = bound();
    bound_now.status.pod_uid = Some("uid-2".into());
    bound_now.node_name = "node-b".into();
    bound_now.ips = vec!["10.244.2.5".into()];
    let plan = decide_now(&input(Some(&p), Some(&bound_now)));
    assert!(reasons(&plan).is_empty(), "{:?}", plan.notices);
}

#[test]
fn placement_notices_follow_what_the_webhook_recorded_and_what_the_pod_asked() {
    let r = released("2026-01-10T11:00:00Z", "2026-01-11T11:00:00Z");
    let cases: &[(&str, Placed, Option<&str>, Option<EventReason>)] = &[
        (
            "placed: nothing to say",
            Placed::On {
                mode: Mode::Preferred,
                node: "node-a".into(),
            },
            None,
            None,
        ),
        (
            "skipped: why",
            Placed::Skipped("the pod's nodeSelector excludes node node-a".into()),
            None,
            Some(reason::PLACEMENT_SKIPPED),
        ),
        (
            "unseen",
            Placed::Unseen,
            None,
            Some(reason::PLACEMENT_MISSED),
        ),
        (
            "unseen but placement none",
            Placed::Unseen,
            Some("none"),
            None,
        ),
        (
            "unseen, required",
            Placed::Unseen,
            Some("required"),
            Some(reason::PLACEMENT_MISSED),
        ),
    ];
    for (name, placed, mode, want) in cases {
        let mut p = returned_elsewhere(placed.clone());
        let mut a = vec![(optin::RETAIN, "true")];
        if let Some(m) = mode {
            a.push(("ipkeep.dev/placement", m));
        }
        p.opt_in = optin::opt_in(&annotations(&a), None);
        let plan = decide_now(&input(Some(&p), Some(&r)));
        let got: Vec<EventReason> = plan
            .notices
            .iter()
            .map(|n| n.reason)
            .filter(|r| r.name.starts_with("Placement"))
            .collect();
        assert_eq!(got, want.iter().copied().collect::<Vec<_>>(), "{name}");
    }
}

#[test]
fn a_released_reservation_on_a_deleted_node_is_deleted_with_a_warning() {
    let r = released("2026-01-10T11:00:00Z", "2026-01-11T11:00:00Z");
    let mut i = input(None, Some(&r));
    i.node_gone = true;
    let plan = decide_now(&i);
    assert_eq!(plan.delete, Some(DeleteReason::NodeGone));
    assert_eq!(
        reasons(&plan),
        vec![(reason::NODE_GONE, true, Subject::Reservation)]
    );

    // While a pod of that name lives (on the deleted node, until the pod garbage collector
    // removes it) nothing is deleted.
    let b = bound();
    let p = pod();
    let mut i = input(Some(&p), Some(&b));
    i.node_gone = true;
    assert_eq!(decide_now(&i).delete, None);
}

#[test]
fn the_placement_annotation_is_read_from_the_pod_then_its_statefulset() {
    let sts = annotations(&[
        (optin::RETAIN, "true"),
        ("ipkeep.dev/placement", "required"),
    ]);
    assert_eq!(
        optin::opt_in(&BTreeMap::new(), Some(&sts)).placement,
        Some(Mode::Required)
    );
    let pod = annotations(&[("ipkeep.dev/placement", "None")]);
    assert_eq!(optin::opt_in(&pod, Some(&sts)).placement, Some(Mode::None));
    let bad = optin::opt_in(&annotations(&[("ipkeep.dev/placement", "sometimes")]), None);
    assert_eq!(bad.placement, None);
    assert_eq!(bad.placement_or(Mode::Preferred), Mode::Preferred);
    assert!(bad.problems[0].contains("sometimes"), "{:?}", bad.problems);
}

#[test]
fn the_name_source_follows_the_controller_owner_then_generate_name() {
    let owned = |kind: &str, name: &str| NameSource::OwnedBy {
        kind: kind.into(),
        name: name.into(),
    };
    /// (controller owner, generateName, name, expected)
    type Case<'a> = (
        Option<(&'a str, &'a str)>,
        Option<&'a str>,
        &'a str,
        NameSource,
    );
    let cases: [Case<'_>; 11] = [
        (None, None, "db", NameSource::Stable),
        (None, Some("job-"), "job-x7k2q", NameSource::Generated),
        // Not what the API server makes from the base: named by whoever created it.
        (None, Some("job-"), "job-1", NameSource::Stable),
        (None, Some("job-"), "job-aeiou", NameSource::Stable),
        (None, Some("job-"), "other-x7k2q", NameSource::Stable),
        // The StatefulSet controller writes generateName "db-" and names the pod db-0.
        (
            Some(("StatefulSet", "db")),
            Some("db-"),
            "db-0",
            NameSource::Stable,
        ),
        (
            Some(("PostgresCluster", "pg")),
            None,
            "pg-1",
            NameSource::Stable,
        ),
        (
            Some(("PostgresCluster", "pg")),
            Some("pg-"),
            "pg-4xz9b",
            NameSource::Generated,
        ),
        (
            Some(("ReplicaSet", "web-5d9")),
            Some("web-5d9-"),
            "web-5d9-q2w4r",
            owned("ReplicaSet", "web-5d9"),
        ),
        (
            Some(("Job", "backup")),
            Some("backup-"),
            "backup-v8n2m",
            owned("Job", "backup"),
        ),
        (
            Some(("DaemonSet", "agent")),
            Some("agent-"),
            "agent-7hx2c",
            owned("DaemonSet", "agent"),
        ),
    ];
    for (owner, base, name, want) in cases {
        assert_eq!(
            NameSource::of(owner, base, name),
            want,
            "{owner:?} {base:?} {name}"
        );
    }
    // A long base is cut to 58 characters before the 5 random ones.
    let base = "a".repeat(70);
    let name = format!("{}bcdfg", "a".repeat(58));
    assert_eq!(
        NameSource::of(None, Some(&base), &name),
        NameSource::Generated
    );
}

#[test]
fn a_pod_whose_name_never_returns_gets_no_reservation_and_is_told_why() {
    let cases = [
        (NameSource::Generated, "generateName"),
        (
            NameSource::OwnedBy {
                kind: "ReplicaSet".into(),
                name: "web-5d9".into(),
            },
            "ReplicaSet web-5d9",
        ),
    ];
    for (name, says) in cases {
        let mut p = pod();
        p.name = name;
        let plan = decide_now(&input(Some(&p), None));
        assert!(plan.writes_nothing(), "{plan:?}");
        assert_eq!(
            reasons(&plan),
            vec![(reason::NOT_RESERVED, true, Subject::Pod)]
        );
        assert!(
            plan.notices[0].message.contains(says)
                && plan.notices[0].message.contains("never come back"),
            "{:?}",
            plan.notices[0].message
        );
        // Before it runs with addresses there is nothing to say yet (one Event, not one per update).
        p.running = false;
        p.ips.clear();
        let plan = decide_now(&input(Some(&p), None));
        assert!(plan.writes_nothing() && plan.notices.is_empty(), "{plan:?}");
    }
}

#[test]
fn a_reservation_that_exists_for_a_name_that_never_returns_lives_out_its_lifecycle() {
    let mut p = pod();
    p.name = NameSource::Generated;
    let r = bound();
    let plan = decide_now(&input(Some(&p), Some(&r)));
    assert!(plan.writes_nothing() && plan.notices.is_empty(), "{plan:?}");
    // Gone: released like any other, never deleted early.
    let plan = decide_now(&input(None, Some(&r)));
    assert_eq!(plan.delete, None);
    assert_eq!(plan.status.and_then(|s| s.phase), Some(Phase::Released));
}

#[test]
fn a_retention_over_the_maximum_is_held_to_it_and_the_asker_is_told_once() {
    let cases = [
        // (on the pod, on the StatefulSet, written, Event on)
        (Some("30d"), None, "7d", Some(Subject::Pod)),
        (None, Some("366d"), "7d", Some(Subject::StatefulSet)),
        (Some("8d"), Some("366d"), "7d", Some(Subject::Pod)),
        (Some("7d"), None, "7d", None),
        (Some("167h"), None, "167h", None),
    ];
    for (on_pod, on_sts, want, told) in cases {
        let mut pod_annotations = vec![(optin::RETAIN, "true")];
        pod_annotations.extend(on_pod.map(|v| (optin::RETAIN_FOR, v)));
        let sts = on_sts.map(|v| annotations(&[(optin::RETAIN_FOR, v)]));
        let mut p = pod();
        p.opt_in = optin::opt_in(&annotations(&pod_annotations), sts.as_ref());
        let plan = decide_now(&input(Some(&p), None));
        let spec = plan.spec.clone().expect("a reservation");
        assert_eq!(spec.retain_for, rf(want), "{on_pod:?} {on_sts:?}");
        let capped: Vec<_> = plan
            .notices
            .iter()
            .filter(|n| n.reason == reason::RETENTION_CAPPED)
            .collect();
        assert_eq!(
            capped.iter().map(|n| n.subject).collect::<Vec<_>>(),
            told.into_iter().collect::<Vec<_>>(),
            "{on_pod:?} {on_sts:?}"
        );
        if let Some(n) = capped.first() {
            let asked = on_pod.or(on_sts).unwrap();
            assert!(
                n.reason.warning && n.message.contains(asked) && n.message.contains("7d"),
                "{}",
                n.message
            );
        }
        // Once the reservation holds the maximum, nothing more is said or written.
        let mut r = bound();
        r.retain_for = spec.retain_for.clone();
        let plan = decide_now(&input(Some(&p), Some(&r)));
        assert!(plan.writes_nothing() && plan.notices.is_empty(), "{plan:?}");
    }
}

#[test]
fn a_reservation_asking_more_than_the_maximum_is_released_for_the_maximum() {
    // Made by hand with 30d (or by an older controller): the release time uses 7d, said once.
    let mut r = bound();
    r.retain_for = rf("30d");
    let plan = decide_now(&input(None, Some(&r)));
    let status = plan.status.clone().expect("released");
    assert_eq!(status.release_time, Some(now() + 7 * DAY));
    assert!(
        reasons(&plan).contains(&(reason::RETENTION_CAPPED, true, Subject::Reservation)),
        "{plan:?}"
    );
    let mut again = r.clone();
    again.status = status;
    let plan = decide_now(&input(None, Some(&again)));
    assert!(plan.writes_nothing() && plan.notices.is_empty(), "{plan:?}");
    // Released earlier with the longer retention: the release time comes forward, and the
    // reservation is told.
    let mut old = released("2026-01-05T00:00:00Z", "2026-02-04T00:00:00Z");
    old.retain_for = rf("30d");
    let plan = decide_now(&input(None, Some(&old)));
    assert_eq!(
        plan.status.clone().and_then(|s| s.release_time),
        Some(t("2026-01-12T00:00:00Z"))
    );
    assert_eq!(
        reasons(&plan),
        vec![(reason::RETENTION_CAPPED, true, Subject::Reservation)]
    );
    // Released 10 days ago with 30d: the maximum has passed, it expires now.
    let mut late = released("2025-12-31T00:00:00Z", "2026-01-30T00:00:00Z");
    late.retain_for = rf("30d");
    let plan = decide_now(&input(None, Some(&late)));
    assert_eq!(
        plan.delete,
        Some(DeleteReason::Expired {
            due: t("2026-01-07T00:00:00Z")
        })
    );
}

#[test]
fn a_released_reservation_over_its_nodes_budget_yields_and_says_to_whom() {
    let y = Yield {
        budget: Budget {
            held: 2,
            source: Source::PodCidrs,
        },
        held: 3,
        kept: Some(PodKey::new("ns", "later-0").unwrap()),
    };
    let r = released("2026-01-10T10:00:00Z", "2026-01-11T10:00:00Z");
    let mut i = input(None, Some(&r));
    i.yields = Some(&y);
    let plan = decide_now(&i);
    assert_eq!(plan.delete, Some(DeleteReason::Yielded));
    assert_eq!(
        reasons(&plan),
        vec![(reason::YIELDED, true, Subject::Reservation)]
    );
    let note = &plan.notices[0].message;
    for says in [
        "node-a",
        "holds 3",
        "budget of 2",
        "10.244.1.17",
        "ns/later-0",
    ] {
        assert!(note.contains(says), "{says:?} in {note}");
    }
    // A pod of that name alive (Bound, or a replacement without addresses yet): never yields.
    let p = pod();
    let b = bound();
    for (pod, r) in [(&p, &b), (&p, &r)] {
        let mut i = input(Some(pod), Some(r));
        i.yields = Some(&y);
        let plan = decide_now(&i);
        assert_eq!(plan.delete, None, "{plan:?}");
        assert!(
            !reasons(&plan)
                .iter()
                .any(|(why, ..)| *why == reason::YIELDED)
        );
    }
    let mut waiting = pod();
    waiting.uid = "uid-2".into();
    waiting.ips.clear();
    waiting.running = false;
    let mut i = input(Some(&waiting), Some(&b));
    i.yields = Some(&y);
    let plan = decide_now(&i);
    assert_eq!(plan.delete, None);
    assert_eq!(
        reasons(&plan),
        vec![(reason::RELEASED, false, Subject::Reservation)]
    );
}

/// `--namespace-selector`: what a live annotated pod's reservation becomes when its namespace is
/// not selected (or not seen yet), and who is told.
#[test]
fn a_namespace_the_selector_leaves_out_reserves_nothing_and_releases_what_it_had() {
    const SELECTOR: &str = "ipkeep.dev/reserve=true";
    let not_selected = Verdict::NotSelected { selector: SELECTOR };
    let p = pod();
    let mut pending = pod();
    pending.running = false;
    pending.ips.clear();
    pending.node_name = None;
    let mut unannotated = pod();
    unannotated.opt_in = OptIn::none();
    let b = bound();
    let r = released("2026-01-10T11:00:00Z", "2026-01-11T11:00:00Z");
    let past = released("2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z");
    let released_now = StatusView {
        phase: Some(Phase::Released),
        pod_uid: Some(POD_UID.into()),
        released_at: Some(now()),
        release_time: Some(t("2026-01-11T12:00:00Z")),
        conflict: None,
    };
    let warn = (reason::NOT_RESERVED, true, Subject::Pod);
    let normal_released = (reason::RELEASED, false, Subject::Reservation);
    struct Case<'a> {
        case: &'a str,
        pod: &'a PodView,
        r: Option<&'a ReservationView>,
        verdict: Verdict<'a>,
        told: bool,
        /// The status written.
        status: Option<&'a StatusView>,
        notices: Vec<(EventReason, bool, Subject)>,
        /// Told now (not again).
        told_now: bool,
        /// Looked at again at.
        requeue: Option<Timestamp>,
    }
    let case = |case, pod, r, verdict, told| Case {
        case,
        pod,
        r,
        verdict,
        told,
        status: None,
        notices: vec![],
        told_now: false,
        requeue: None,
    };
    let cases = [
        Case {
            notices: vec![warn],
            told_now: true,
            ..case(
                "not selected, no reservation: told, nothing made",
                &p,
                None,
                not_selected,
                false,
            )
        },
        case("told already: quiet", &p, None, not_selected, true),
        case(
            "not running yet: told later, when it would be reserved",
            &pending,
            None,
            not_selected,
            false,
        ),
        Case {
            status: Some(&released_now),
            notices: vec![normal_released, warn],
            told_now: true,
            requeue: Some(t("2026-01-11T12:00:00Z")),
            ..case(
                "relabelled out: Bound becomes Released, the pod told",
                &p,
                Some(&b),
                not_selected,
                false,
            )
        },
        Case {
            requeue: Some(t("2026-01-11T11:00:00Z")),
            ..case(
                "Released already, told: nothing written",
                &p,
                Some(&r),
                not_selected,
                true,
            )
        },
        case(
            "its release time passed while the pod lives: never deleted",
            &p,
            Some(&past),
            not_selected,
            true,
        ),
        Case {
            status: Some(&b.status),
            notices: vec![(reason::REBOUND, false, Subject::Both)],
            ..case(
                "relabelled back in: bound again",
                &p,
                Some(&r),
                Verdict::Selected,
                false,
            )
        },
        case(
            "namespace not seen yet: nothing decided",
            &p,
            None,
            Verdict::NotSeen,
            false,
        ),
        case(
            "not seen yet, Bound: left as it is",
            &p,
            Some(&b),
            Verdict::NotSeen,
            false,
        ),
        case(
            "not annotated: the selector says nothing",
            &unannotated,
            None,
            not_selected,
            false,
        ),
    ];
    for Case {
        case,
        pod,
        r,
        verdict,
        told,
        status,
        notices,
        told_now,
        requeue,
    } in cases
    {
        let mut i = input(Some(pod), r);
        i.namespace = verdict;
        i.told = told;
        let plan = decide_now(&i);
        assert_eq!(plan.spec, None, "{case}: no spec written");
        assert_eq!(
            plan.delete, None,
            "{case}: never deleted while the pod lives"
        );
        assert_eq!(plan.status.as_ref(), status, "{case}");
        assert_eq!(reasons(&plan), notices, "{case}");
        assert_eq!(plan.told, told_now, "{case}");
        assert_eq!(plan.requeue_at, requeue, "{case}");
        if let Some(n) = plan
            .notices
            .iter()
            .find(|n| n.reason == reason::NOT_RESERVED)
        {
            assert!(n.message.contains(SELECTOR), "{case}: {}", n.message);
        }
    }

    // The pod gone: the ordinary Released lifecycle, whatever the namespace.
    let mut i = input(None, Some(&past));
    i.namespace = not_selected;
    assert!(matches!(
        decide_now(&i).delete,
        Some(DeleteReason::Expired { .. })
    ));
    // The message a relabelled-out pod reads.
    let mut i = input(Some(&p), Some(&b));
    i.namespace = not_selected;
    let plan = decide_now(&i);
    let told = &plan.notices[1].message;
    assert!(
        told.contains("held until 2026-01-11T12:00:00Z")
            && told.contains("never deleted while this pod lives"),
        "{told}"
    );
    assert!(
        plan.notices[0].message.contains("--namespace-selector"),
        "{:?}",
        plan.notices[0]
    );
}
