//! The checks' lines for what a correct install and each broken one look like.

use super::*;

fn agent(node: &str, ready: bool, in_charge: Option<(bool, &str)>) -> AgentView {
    AgentView {
        pod: format!("ipkeep-agent-{node}"),
        node: node.into(),
        ready,
        in_charge: in_charge.map(|(ok, reason)| (ok, reason.into(), format!("{reason} on {node}"))),
        lost: None,
        port: Some(9725),
    }
}

/// An agent that reports `n` lost reservations (`Err`: a report it cannot read).
fn losing(node: &str, report: Result<usize, &str>) -> AgentView {
    let lost = report
        .map(|n| {
            LostReport::of(
                (0..n)
                    .map(|i| crate::api::lost::LostReservation {
                        pod: PodKey::new("db", &format!("web-{i}")).unwrap(),
                        ips: vec![format!("10.1.0.{i}").parse().unwrap()],
                        release_time: None,
                        uid: format!("u{i}"),
                    })
                    .collect(),
            )
        })
        .map_err(str::to_owned);
    AgentView {
        lost: Some(lost),
        ..agent(node, true, Some((true, "InCharge")))
    }
}

fn reservation(
    name: &str,
    node: &str,
    conflict: bool,
    unprotected: Option<&str>,
) -> ReservationView {
    ReservationView {
        key: PodKey::new("default", name).unwrap(),
        node: node.into(),
        conflict,
        unprotected: unprotected.map(Into::into),
    }
}

fn correct() -> Observed {
    Observed {
        crd: Read::Found(vec!["v1alpha1".into()]),
        leader: Ok(Some(("ipkeep-controller-abc".into(), Some(3), 15))),
        daemonset: Read::Found((2, 2)),
        agents: Ok(vec![
            agent("node-0", true, Some((true, "InCharge"))),
            agent("node-1", true, Some((true, "InCharge"))),
        ]),
        reservations: Ok(vec![reservation("web-0", "node-0", false, None)]),
        last_status_write: Some(40),
    }
}

/// A failed line: (check, node).
type Failed = (&'static str, Option<String>);

/// One case: what it is, how it breaks a correct install, the lines that fail.
type Case = (&'static str, Box<dyn Fn(&mut Observed)>, Vec<Failed>);

/// The failed lines: (check, node).
fn failed(o: &Observed) -> Vec<Failed> {
    lines(o, "ipkeep-system", &Names::of("ipkeep", None, None))
        .into_iter()
        .filter(|l| !l.ok)
        .inspect(|l| {
            assert!(
                l.fix.is_some() || l.message.contains("cannot"),
                "{l:?} has no fix"
            )
        })
        .map(|l| (l.check, l.node))
        .collect()
}

#[test]
fn each_broken_install_fails_its_check_and_names_the_node() {
    let node0 = || Some("node-0".to_owned());
    let cases: Vec<Case> = vec![
        ("a correct install", Box::new(|_| {}), vec![]),
        (
            "no CRD",
            Box::new(|o| o.crd = Read::Absent),
            vec![("crd", None)],
        ),
        (
            "the CRD without our version",
            Box::new(|o| o.crd = Read::Found(vec!["v1beta9".into()])),
            vec![("crd", None)],
        ),
        (
            "no leader",
            Box::new(|o| o.leader = Ok(None)),
            vec![("controller", None)],
        ),
        (
            "a leader that stopped renewing",
            Box::new(|o| o.leader = Ok(Some(("x".into(), Some(31), 15)))),
            vec![("controller", None)],
        ),
        (
            "an agent not Ready",
            Box::new(|o| {
                o.daemonset = Read::Found((2, 1));
                o.agents = Ok(vec![
                    agent("node-0", false, Some((true, "InCharge"))),
                    agent("node-1", true, Some((true, "InCharge"))),
                ]);
            }),
            vec![("agent", None), ("agent", node0())],
        ),
        (
            "ipkeep not in charge on node-0, its reservation unprotected",
            Box::new(|o| {
                o.agents = Ok(vec![
                    agent("node-0", true, Some((false, "HostLocalNotReplaced"))),
                    agent("node-1", true, Some((true, "InCharge"))),
                ]);
                o.reservations = Ok(vec![reservation(
                    "web-0",
                    "node-0",
                    false,
                    Some("HostLocalNotReplaced"),
                )]);
            }),
            vec![("in-charge", node0()), ("reservations", node0())],
        ),
        (
            "an agent that does not say",
            Box::new(|o| {
                o.agents = Ok(vec![
                    agent("node-0", true, None),
                    agent("node-1", true, Some((true, "InCharge"))),
                ]);
            }),
            vec![("in-charge", node0())],
        ),
        (
            "lost reservations kept on node-0, none on node-1",
            Box::new(|o| o.agents = Ok(vec![losing("node-0", Ok(2)), losing("node-1", Ok(0))])),
            vec![("lost", node0())],
        ),
        (
            "a lost report that cannot be read",
            Box::new(|o| {
                o.agents = Ok(vec![
                    losing("node-0", Err("expected value")),
                    agent("node-1", true, Some((true, "InCharge"))),
                ])
            }),
            vec![("lost", node0())],
        ),
        (
            "a reservation in conflict",
            Box::new(|o| o.reservations = Ok(vec![reservation("web-0", "node-0", true, None)])),
            vec![("reservations", None)],
        ),
        (
            "as the controller (kubectl exec): CRD and DaemonSet forbidden, the rest readable",
            Box::new(|o| {
                o.crd = Read::Forbidden;
                o.daemonset = Read::Forbidden;
            }),
            vec![],
        ),
        (
            "as the controller, an agent pod not Ready",
            Box::new(|o| {
                o.daemonset = Read::Forbidden;
                o.agents = Ok(vec![
                    agent("node-0", false, Some((true, "InCharge"))),
                    agent("node-1", true, Some((true, "InCharge"))),
                ]);
            }),
            vec![("agent", None), ("agent", node0())],
        ),
        (
            "CRDs forbidden and reservations not readable either",
            Box::new(|o| {
                o.crd = Read::Forbidden;
                o.reservations = Err("forbidden".into());
            }),
            vec![("crd", None), ("reservations", None)],
        ),
        (
            "reservations not readable",
            Box::new(|o| o.reservations = Err("forbidden".into())),
            vec![("reservations", None)],
        ),
    ];
    for (what, break_it, want) in cases {
        let mut o = correct();
        break_it(&mut o);
        assert_eq!(failed(&o), want, "{what}");
    }
}

#[test]
fn text_marks_each_line_and_json_says_ok() {
    let mut o = correct();
    o.agents = Ok(vec![agent(
        "node-0",
        true,
        Some((false, "NetworkNotConfigured")),
    )]);
    let l = lines(&o, "ipkeep-system", &Names::of("ipkeep", None, None));
    let t = text(&l);
    assert!(
        t.contains("✗ in-charge [node-0]: NetworkNotConfigured: NetworkNotConfigured on node-0"),
        "{t}"
    );
    assert!(
        t.contains("✓ crd: ipreservations.ipkeep.dev serves v1alpha1"),
        "{t}"
    );
    assert!(t.ends_with("1 of 6 checks failed\n"), "{t}");
    let j: serde_json::Value = serde_json::from_str(&json(&l)).unwrap();
    assert_eq!(j["ok"], false);
    assert_eq!(j["checks"].as_array().unwrap().len(), 6);
    assert_eq!(j["checks"][3]["node"], "node-0");
    let ok = lines(
        &correct(),
        "ipkeep-system",
        &Names::of("ipkeep", None, None),
    );
    assert!(text(&ok).ends_with("all checks passed\n"));
}

#[test]
fn names_follow_the_charts_fullname_rule_and_its_overrides() {
    // (release, --fullname, --lease-name) → (fullname, lease)
    type Case<'a> = (&'a str, Option<&'a str>, Option<&'a str>, &'a str, &'a str);
    let cases: &[Case] = &[
        ("ipkeep", None, None, "ipkeep", "ipkeep-controller"),
        (
            "prod-ipkeep",
            None,
            None,
            "prod-ipkeep",
            "prod-ipkeep-controller",
        ),
        ("net", None, None, "net-ipkeep", "net-ipkeep-controller"),
        ("net", Some("keeper"), None, "keeper", "keeper-controller"),
        (
            "net",
            Some(""),
            Some(""),
            "net-ipkeep",
            "net-ipkeep-controller",
        ),
        ("ipkeep", None, Some("my-lease"), "ipkeep", "my-lease"),
        (
            "a-release-name-of-sixty-characters-which-helm-cuts-to-63-abc",
            None,
            None,
            "a-release-name-of-sixty-characters-which-helm-cuts-to-63-abc-ip",
            "a-release-name-of-sixty-characters-which-helm-cuts-to-63-abc-ip-controller",
        ),
    ];
    for (release, fullname, lease, want_fullname, want_lease) in cases {
        let n = Names::of(release, *fullname, *lease);
        assert_eq!(
            (n.fullname.as_str(), n.lease.as_str()),
            (*want_fullname, *want_lease),
            "{release} {fullname:?} {lease:?}"
        );
    }
}

#[test]
fn the_wait_summary_names_each_failed_check_and_its_node() {
    let mut o = correct();
    o.agents = Ok(vec![
        agent("node-0", true, Some((true, "InCharge"))),
        agent("node-1", true, Some((false, "NetworkNotFound"))),
    ]);
    o.leader = Ok(None);
    let l = lines(&o, "ipkeep-system", &Names::of("ipkeep", None, None));
    assert_eq!(failed_summary(&l), "controller, in-charge [node-1]");
}

#[test]
fn the_lost_line_lists_the_restored_ones_with_their_kind() {
    let mut o = correct();
    let mut a = losing("node-0", Ok(1));
    if let Some(Ok(report)) = a.lost.as_mut() {
        report.restored.push(crate::api::lost::RestoredReservation {
            pod: PodKey::new("db", "moved-0").unwrap(),
            kind: crate::api::lost::RestoredKind::Older,
            uid: "u9".into(),
            ips: vec!["10.1.0.9".parse().unwrap()],
            generation: 4,
            api_generation: Some(2),
        });
    }
    o.agents = Ok(vec![a]);
    let t = text(&lines(
        &o,
        "ipkeep-system",
        &Names::of("ipkeep", None, None),
    ));
    assert!(t.contains("✗ lost [node-0]: 2 reservations"), "{t}");
    assert!(
        t.contains(
            "db/web-0 (10.1.0.0), db/moved-0 (10.1.0.9; restored older than the node's file)"
        ),
        "{t}"
    );
}

#[test]
fn the_lost_line_lists_the_pods_and_their_addresses() {
    let mut o = correct();
    o.agents = Ok(vec![losing("node-0", Ok(7))]);
    let t = text(&lines(
        &o,
        "ipkeep-system",
        &Names::of("ipkeep", None, None),
    ));
    assert!(
        t.contains("✗ lost [node-0]: 7 reservations lost or restored from an older copy"),
        "{t}"
    );
    assert!(
        t.contains("db/web-0 (10.1.0.0), db/web-1 (10.1.0.1)"),
        "{t}"
    );
    assert!(t.contains("and 2 more"), "{t}");
    assert!(t.contains("fix: ipkeep-operator recover"), "{t}");
}
