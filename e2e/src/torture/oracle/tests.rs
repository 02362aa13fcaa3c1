#![allow(clippy::type_complexity)] // the tables' rows

use super::*;

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn pod(name: &str, uid: &str, ips: &[&str], created: i64) -> PodView {
    PodView {
        ns: "t".into(),
        name: name.into(),
        uid: uid.into(),
        node: Some("n0".into()),
        ips: ips.iter().map(|s| ip(s)).collect(),
        phase: if ips.is_empty() { "Pending" } else { "Running" }.into(),
        deleting: false,
        ready_since: (!ips.is_empty()).then(|| t(created + 2)),
        created: t(created),
        retained: true,
        host_network: false,
    }
}

fn reservation(name: &str, uid: &str, ips: &[&str], release: Option<i64>) -> ReservationView {
    ReservationView {
        ns: "t".into(),
        name: name.into(),
        uid: uid.into(),
        node: "n0".into(),
        ips: ips.iter().map(|s| ip(s)).collect(),
        released: release.is_some(),
        release_time: release.map(t),
        conflict: false,
    }
}

fn sample(at: i64, pods: Vec<PodView>, reservations: Vec<ReservationView>) -> Sample {
    Sample {
        at: t(at),
        pods,
        reservations,
        led: true,
        ..Sample::default()
    }
}

/// The controller's deletion of `t/web-0` at `at`.
fn deletion(at: i64) -> Deletion {
    Deletion {
        at: t(at),
        key: ("t".into(), "web-0".into()),
        user: "ctrl".into(),
    }
}

fn promises(v: &[Violation]) -> Vec<u8> {
    v.iter().map(|v| v.promise.number()).collect()
}

#[test]
fn two_live_pods_on_one_address_break_promise_1_only_once_they_last_the_grace() {
    let a = pod("a", "ua", &["10.0.0.5"], 0);
    let b = pod("b", "ub", &["10.0.0.5"], 0);
    let mut deleting = b.clone();
    deleting.deleting = true;
    // (case, the pods of each sample one second apart, violations expected in all)
    let cases: [(&str, Vec<Vec<PodView>>, usize); 4] = [
        (
            "distinct addresses",
            vec![vec![a.clone(), pod("b", "ub", &["10.0.0.6"], 0)]; 12],
            0,
        ),
        (
            "a double hold for 12 s",
            vec![vec![a.clone(), b.clone()]; 12],
            1,
        ),
        (
            "a double hold for 5 s",
            vec![vec![a.clone(), b.clone()]; 5],
            0,
        ),
        (
            "one of them is being deleted",
            vec![vec![a.clone(), deleting]; 12],
            0,
        ),
    ];
    for (case, samples, want) in cases {
        let mut o = Oracle::default();
        let found: Vec<Violation> = samples
            .into_iter()
            .enumerate()
            .flat_map(|(i, pods)| o.observe(&sample(10 + i as i64, pods, vec![]), &[]))
            .collect();
        assert_eq!(found.len(), want, "{case}: {found:?}");
        assert!(
            found.iter().all(|v| v.promise == Promise::OneHolder),
            "{case}"
        );
    }
}

#[test]
fn a_deletion_while_the_pod_lives_or_early_or_late_breaks_promise_2() {
    let kept = reservation("web-0", "r1", &["10.0.0.5"], Some(100));
    let ctrl = "system:serviceaccount:ipkeep-system:ipkeep-controller";
    let latency = FaultWindow {
        kind: FaultKind::ApiLatency,
        node: None,
        from: t(95),
        until: Some(t(200)),
        whole_node: false,
    };
    let partition = |whole_node| FaultWindow {
        kind: FaultKind::AgentPartition,
        node: Some("node-0".into()),
        from: t(95),
        until: Some(t(200)),
        whole_node,
    };
    // (case, the pod lives until, deleted at, faults, events, expected count)
    let cases: [(&str, i64, i64, Vec<FaultWindow>, Vec<EventSeen>, usize); 8] = [
        ("on time after the pod", 50, 101, vec![], vec![], 0),
        ("while the pod lives", 150, 101, vec![], vec![], 1),
        ("early, not yielded", 50, 80, vec![], vec![], 1),
        (
            "early, yielded",
            50,
            80,
            vec![],
            vec![EventSeen {
                about: ("t".into(), "web-0".into()),
                reason: "Yielded".into(),
                at: t(80),
            }],
            0,
        ),
        ("late", 50, 160, vec![], vec![], 1),
        ("late under an API fault", 50, 160, vec![latency], vec![], 0),
        (
            "late, an agent cut off",
            50,
            160,
            vec![partition(false)],
            vec![],
            1,
        ),
        (
            "late, a whole node cut off",
            50,
            160,
            vec![partition(true)],
            vec![],
            0,
        ),
    ];
    for (case, lives_until, deleted, faults, events, want) in cases {
        let mut o = Oracle::default();
        o.events(events);
        let p = pod("web-0", "p1", &["10.0.0.5"], 0);
        let mut at = 1;
        while at <= lives_until {
            o.observe(&sample(at, vec![p.clone()], vec![kept.clone()]), &[]);
            at += 10;
        }
        o.observe(&sample(lives_until + 1, vec![], vec![kept.clone()]), &[]);
        // The next look after the deletion finds it gone.
        o.observe(&sample(deleted.max(lives_until) + 2, vec![], vec![]), &[]);
        let d = Deletion {
            at: t(deleted),
            key: ("t".into(), "web-0".into()),
            user: ctrl.into(),
        };
        let found = o.deletions(std::slice::from_ref(&d), &[], &faults);
        assert_eq!(found.len(), want, "{case}: {found:?}");
        assert!(promises(&found).iter().all(|n| *n == 2), "{case}");
        assert!(
            o.deletions(&[d], &[ctrl], &faults).is_empty(),
            "{case}: ours"
        );
    }
}

#[test]
fn a_returning_pod_with_other_addresses_breaks_promise_3_unless_told_or_its_reservation_ended() {
    let told = |reason: &str, at: i64| EventSeen {
        about: ("t".into(), "web-0".into()),
        reason: reason.into(),
        at: t(at),
    };
    // (case, the returning pod's addresses, its reservation's release time, events, expected)
    let cases: [(&str, &str, Option<i64>, Vec<EventSeen>, usize); 6] = [
        ("its addresses back", "10.0.0.5", Some(1_000), vec![], 0),
        (
            "other addresses, nothing said",
            "10.0.0.9",
            Some(1_000),
            vec![],
            1,
        ),
        (
            "other addresses, AddressesChanged",
            "10.0.0.9",
            Some(1_000),
            vec![told("AddressesChanged", 21)],
            0,
        ),
        (
            "other addresses, an Event before it came",
            "10.0.0.9",
            Some(1_000),
            vec![told("AddressesChanged", 5)],
            1,
        ),
        (
            "other addresses, a routine Event",
            "10.0.0.9",
            Some(1_000),
            vec![told("Rebound", 21)],
            1,
        ),
        (
            "other addresses after the release time",
            "10.0.0.9",
            Some(15),
            vec![],
            0,
        ),
    ];
    for (case, got, release, events, want) in cases {
        let mut o = Oracle::default();
        o.events(events);
        let r = reservation("web-0", "r1", &["10.0.0.5"], release);
        o.observe(&sample(10, vec![], vec![r.clone()]), &[]);
        let mut back = pod("web-0", "p2", &[], 20);
        o.observe(&sample(20, vec![back.clone()], vec![r.clone()]), &[]);
        back = pod("web-0", "p2", &[got], 20);
        let mut found = o.observe(&sample(23, vec![back.clone()], vec![r.clone()]), &[]);
        found.extend(o.observe(&sample(100, vec![back], vec![r]), &[]));
        found.extend(o.unexplained_at_end(t(101), &[]));
        assert_eq!(found.len(), want, "{case}: {found:?}");
        assert!(promises(&found).iter().all(|n| *n == 3), "{case}");
        assert_eq!(
            o.latencies.returning.len(),
            usize::from(want == 0 && got == "10.0.0.5"),
            "{case}"
        );
    }
}

/// A stray file is said with its uid and every deletion of its name the audit log recorded.
#[test]
fn a_stray_file_names_its_uid_and_the_audit_logs_deletions_of_its_name() {
    let mut s = sample(1_000, vec![], vec![]);
    let key = ("t".to_owned(), "web-0".to_owned());
    s.nodes.insert(
        "n0".into(),
        NodeFiles {
            allocations: vec![],
            reserved: vec![(key.clone(), vec![ip("10.0.0.5")], "r1".to_owned())],
        },
    );
    let deletion = |at: i64, name: &str| Deletion {
        at: t(at),
        key: ("t".to_owned(), name.to_owned()),
        user: "controller".to_owned(),
    };
    let said = |deletions: &[Deletion]| {
        let found = settled(&s, deletions);
        assert_eq!(found.len(), 1, "{found:?}");
        found[0].what.clone()
    };
    let none = said(&[deletion(900, "web-1")]);
    assert!(
        none.contains("uid r1") && none.ends_with("of that name: none"),
        "{none}"
    );
    let one = said(&[deletion(900, "web-0"), deletion(950, "web-1")]);
    assert!(
        one.ends_with(&format!("of that name: {} by controller", t(900))),
        "{one}"
    );
}

#[test]
fn the_quiet_end_breaks_promise_4_on_a_missing_or_stray_file_or_a_leak() {
    let r = reservation("web-0", "r1", &["10.0.0.5"], None);
    let file = (
        ("t".to_owned(), "web-0".to_owned()),
        vec![ip("10.0.0.5")],
        "r1".to_owned(),
    );
    let old = t(0);
    // (case, reservations, reservation files, allocations, expected)
    let cases: [(
        &str,
        Vec<ReservationView>,
        Vec<_>,
        Vec<(IpAddr, Timestamp)>,
        usize,
    ); 6] = [
        (
            "equal, the reserved address allocated",
            vec![r.clone()],
            vec![file.clone()],
            vec![(ip("10.0.0.5"), old)],
            0,
        ),
        ("no file", vec![r.clone()], vec![], vec![], 1),
        ("a stray file", vec![], vec![file.clone()], vec![], 1),
        (
            "a file of another address",
            vec![reservation("web-0", "r1", &["10.0.0.6"], None)],
            vec![file.clone()],
            vec![],
            1,
        ),
        (
            "an old allocation nobody holds",
            vec![r.clone()],
            vec![file.clone()],
            vec![(ip("10.0.0.7"), old)],
            1,
        ),
        (
            "a young allocation nobody holds yet",
            vec![r.clone()],
            vec![file.clone()],
            vec![(ip("10.0.0.7"), t(990))],
            0,
        ),
    ];
    for (case, reservations, reserved, allocations, want) in cases {
        let mut s = sample(
            1_000,
            vec![pod("other", "p9", &["10.0.0.8"], 0)],
            reservations,
        );
        s.nodes.insert(
            "n0".into(),
            NodeFiles {
                allocations: [allocations, vec![(ip("10.0.0.8"), old)]].concat(),
                reserved,
            },
        );
        let found = settled(&s, &[]);
        assert_eq!(found.len(), want, "{case}: {found:?}");
        assert!(promises(&found).iter().all(|n| *n == 4), "{case}");
    }
}

#[test]
fn an_unannotated_pod_waiting_on_a_node_over_its_budget_breaks_promise_5() {
    let mut waiting = pod("churn-x", "c1", &[], 0);
    waiting.retained = false;
    let released = |n: usize| -> Vec<ReservationView> {
        (0..n)
            .map(|i| {
                reservation(
                    &format!("r{i}"),
                    &format!("u{i}"),
                    &["10.0.0.5"],
                    Some(10_000),
                )
            })
            .collect()
    };
    // A replacement of r0 without addresses yet: r0 is not the budget's to yield.
    let mut back = pod("r0", "b0", &[], 0);
    back.retained = true;
    // (case, Released reservations on the node, its budget, seconds waited, r0's pod back, expected)
    let cases = [
        ("under its budget", 2, 2, 120, false, 0),
        ("over its budget, briefly", 3, 2, 30, false, 0),
        ("over its budget for long", 3, 2, 120, false, 1),
        ("over only by one whose pod is back", 3, 2, 120, true, 0),
    ];
    for (case, n, budget, waited, is_back, want) in cases {
        let mut o = Oracle::default();
        let mut found = Vec::new();
        let pods = if is_back {
            vec![waiting.clone(), back.clone()]
        } else {
            vec![waiting.clone()]
        };
        for at in (0..=waited).step_by(10) {
            let mut s = sample(at, pods.clone(), released(n));
            s.budgets.insert("n0".into(), budget);
            found.extend(o.observe(&s, &[]));
        }
        assert_eq!(found.len(), want, "{case}: {found:?}");
        assert!(promises(&found).iter().all(|n| *n == 5), "{case}");
    }
}

#[test]
fn a_new_uid_under_a_known_name_counts_as_a_re_creation() {
    let mut o = Oracle::default();
    o.observe(&sample(1, vec![pod("a", "1", &[], 0)], vec![]), &[]);
    o.observe(&sample(2, vec![pod("a", "1", &[], 0)], vec![]), &[]);
    o.observe(
        &sample(
            3,
            vec![pod("a", "2", &[], 2), pod("b", "3", &[], 2)],
            vec![],
        ),
        &[],
    );
    assert_eq!(o.recreations, 1);
}

#[test]
fn a_pod_created_within_the_race_of_a_deletion_is_not_one_it_deleted_under() {
    let kept = reservation("web-0", "r1", &["10.0.0.5"], Some(100));
    // (case, the new pod's creation, expected)
    let cases = [
        ("created a second before", 100, 0),
        ("created 6 s before", 95, 1),
    ];
    for (case, created, want) in cases {
        let mut o = Oracle::default();
        let p = pod("web-0", "p2", &[], created);
        for at in [created, 110, 150] {
            o.observe(&sample(at, vec![p.clone()], vec![kept.clone()]), &[]);
        }
        let d = deletion(101);
        let found = o.deletions(&[d], &[], &[]);
        assert_eq!(found.len(), want, "{case}: {found:?}");
    }
}

#[test]
fn a_returning_pod_unexplained_while_no_controller_led_is_the_documented_limitation() {
    // (case, a controller led while the pod lived, violations, limitations)
    let cases = [("a leader", true, 1, 0), ("no leader", false, 0, 1)];
    for (case, led, violations, limitations) in cases {
        let mut o = Oracle::default();
        let r = reservation("web-0", "r1", &["10.0.0.5"], Some(1_000));
        o.observe(&sample(10, vec![], vec![r.clone()]), &[]);
        let mut found = Vec::new();
        for (at, ips) in [(20, vec![]), (23, vec!["10.0.0.9"])] {
            let mut s = sample(at, vec![pod("web-0", "p2", &ips, 20)], vec![r.clone()]);
            s.led = led;
            found.extend(o.observe(&s, &[]));
        }
        // Gone before a leader came back.
        found.extend(o.observe(&sample(100, vec![], vec![r.clone()]), &[]));
        found.extend(o.unexplained_at_end(t(101), &[]));
        assert_eq!(found.len(), violations, "{case}: {found:?}");
        assert_eq!(
            o.limitations.len(),
            limitations,
            "{case}: {:?}",
            o.limitations
        );
    }
}

#[test]
fn the_time_no_controller_led_does_not_count_as_lateness() {
    let kept = reservation("web-0", "r1", &["10.0.0.5"], Some(100));
    // (case, seconds without a leader after the release time, expected)
    let cases = [("a leader all along", 0, 1), ("no leader for 40 s", 40, 0)];
    for (case, gap, want) in cases {
        let mut o = Oracle::default();
        for at in (90..=170).step_by(5) {
            let mut s = sample(at, vec![], vec![kept.clone()]);
            s.led = !(100..100 + gap).contains(&at);
            o.observe(&s, &[]);
        }
        o.observe(&sample(175, vec![], vec![]), &[]);
        let d = deletion(160);
        let found = o.deletions(&[d], &[], &[]);
        assert_eq!(found.len(), want, "{case}: {found:?}");
    }
}

#[test]
fn a_deletion_is_judged_by_the_object_it_removed_not_a_later_one_of_its_name() {
    let old = reservation("web-0", "r1", &["10.0.0.5"], Some(100));
    let new = reservation("web-0", "r2", &["10.0.0.5"], Some(300));
    let mut o = Oracle::default();
    o.observe(&sample(95, vec![], vec![old]), &[]);
    // Deleted at 101 (on time) and made again at once for a pod of that name, gone since.
    o.observe(&sample(102, vec![], vec![new]), &[]);
    let d = deletion(101);
    let found = o.deletions(&[d], &[], &[]);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn a_pod_waiting_on_a_node_whose_every_address_is_held_is_settled() {
    let running = pod("keep-1", "u1", &["10.0.0.2"], 0);
    let waiting = pod("keep-0", "u0", &[], 0);
    let files = |allocated: &[&str], reserved: &[&str]| NodeFiles {
        allocations: allocated.iter().map(|a| (ip(a), t(0))).collect(),
        reserved: reserved
            .iter()
            .map(|a| (("t".into(), format!("r-{a}")), vec![ip(a)], "uid".into()))
            .collect(),
    };
    let capacity = BTreeMap::from([("n0".to_owned(), 3)]);
    // (case, the node's files, its capacity known, the pods not settled)
    let cases: [(&str, NodeFiles, bool, Vec<&str>); 5] = [
        (
            "every address allocated",
            files(&["10.0.0.2", "10.0.0.3", "10.0.0.4"], &[]),
            true,
            vec![],
        ),
        (
            "allocated and reserved",
            files(&["10.0.0.2", "10.0.0.3"], &["10.0.0.4"]),
            true,
            vec![],
        ),
        (
            "one address free",
            files(&["10.0.0.2", "10.0.0.3"], &["10.0.0.2"]),
            true,
            vec!["t/keep-0 Pending"],
        ),
        (
            "a node of unknown capacity",
            files(&["10.0.0.2", "10.0.0.3", "10.0.0.4"], &[]),
            false,
            vec!["t/keep-0 Pending"],
        ),
        (
            "nothing read from the node",
            NodeFiles::default(),
            true,
            vec!["t/keep-0 Pending"],
        ),
    ];
    for (case, node, known, want) in cases {
        let mut s = sample(10, vec![running.clone(), waiting.clone()], vec![]);
        if case != "nothing read from the node" {
            s.nodes.insert("n0".into(), node);
        }
        let cap = if known {
            capacity.clone()
        } else {
            BTreeMap::new()
        };
        assert_eq!(unsettled(&s, "t", &cap), want, "{case}");
    }
    let mut deleting = waiting.clone();
    deleting.deleting = true;
    let mut s = sample(10, vec![deleting], vec![]);
    s.nodes.insert(
        "n0".into(),
        files(&["10.0.0.2", "10.0.0.3", "10.0.0.4"], &[]),
    );
    assert_eq!(
        unsettled(&s, "t", &capacity),
        ["t/keep-0 Pending"],
        "a pod being deleted is never settled"
    );
}
