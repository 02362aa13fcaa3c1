use std::time::Duration;

use ipkeep_reservation::{PodKey, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::agent::view;
use crate::api::retention::RetainForError;
use crate::api::{
    ConflictStatus, IPReservation, IPReservationSpec, IPReservationStatus, IpString, Phase,
};
use crate::rules::desired::*;

const DAY: Duration = Duration::from_secs(86_400);
/// 2026-11-21T12:00:00Z
const CREATED: i64 = 1_795_262_400;

fn time(secs: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
}

fn ipr(ns: &str, name: &str, node: &str, ips: &[&str]) -> IPReservation {
    let mut r = IPReservation::new(
        name,
        IPReservationSpec {
            ips: ips.iter().map(|s| IpString((*s).to_owned())).collect(),
            node_name: node.to_owned(),
            retain_for: None,
        },
    );
    r.metadata.namespace = Some(ns.to_owned());
    r.metadata.uid = Some(format!("uid-{name}"));
    r.metadata.creation_timestamp = Some(time(CREATED));
    r
}

fn bound(mut r: IPReservation) -> IPReservation {
    r.status = Some(IPReservationStatus {
        phase: Some(Phase::Bound),
        ..Default::default()
    });
    r
}

fn released(mut r: IPReservation, release: Option<i64>, released_at: Option<i64>) -> IPReservation {
    r.status = Some(IPReservationStatus {
        phase: Some(Phase::Released),
        release_time: release.map(time),
        released_at: released_at.map(time),
        ..Default::default()
    });
    r
}

/// As the controller writes a conflict: `status.conflict` and a `Conflict` condition `True`;
/// with another condition status, the condition only.
fn conflicted(mut r: IPReservation, status: &str) -> IPReservation {
    let st = r.status.get_or_insert_with(Default::default);
    if status == "True" {
        st.conflict = Some(ConflictStatus {
            ip: IpString("10.0.0.5".into()),
            held_by: PodKey::new("db", "older").unwrap(),
        });
    }
    st.conditions.push(Condition {
        type_: "Conflict".into(),
        status: status.into(),
        reason: "AddressClaimedByOlderReservation".into(),
        message: "10.0.0.5 is held by db/older".into(),
        last_transition_time: time(CREATED),
        observed_generation: None,
    });
    r
}

fn key(ns: &str, pod: &str) -> PodKey {
    PodKey::new(ns, pod).unwrap()
}

#[test]
fn release_time_rules() {
    let base = || ipr("db", "pg-0", "node-a", &["10.0.0.5"]);
    let with_retain = |mut r: IPReservation, v: &str| {
        r.spec.retain_for = Some(v.into());
        r
    };
    let cases: Vec<(&str, IPReservation, Option<i64>, Option<&str>)> = vec![
        ("bound: null", bound(base()), None, None),
        (
            "released: the controller's releaseTime, exactly",
            released(base(), Some(CREATED + 100), Some(CREATED)),
            Some(CREATED + 100),
            None,
        ),
        (
            "released, releaseTime already passed: still written as set",
            released(base(), Some(1), Some(0)),
            Some(1),
            None,
        ),
        (
            "released without releaseTime: releasedAt + retainFor",
            released(with_retain(base(), "30m"), None, Some(CREATED + 10)),
            Some(CREATED + 10 + 1_800),
            None,
        ),
        (
            "released without any time: creation + retainFor",
            released(with_retain(base(), "2h"), None, None),
            Some(CREATED + 7_200),
            None,
        ),
        (
            "hand-made (no status): creation + default retainFor",
            base(),
            Some(CREATED + 86_400),
            None,
        ),
        (
            "hand-made with retainFor 7d",
            with_retain(base(), "7d"),
            Some(CREATED + 7 * 86_400),
            None,
        ),
        (
            "status without phase counts as hand-made",
            {
                let mut r = with_retain(base(), "45s");
                r.status = Some(IPReservationStatus::default());
                r
            },
            Some(CREATED + 45),
            None,
        ),
        (
            "hand-made with a malformed retainFor: creation + the default, as the controller does",
            with_retain(base(), "05m"),
            Some(CREATED + 86_400),
            Some("05m"),
        ),
        (
            "released without releaseTime, retainFor over the grammar's maximum: the default",
            released(with_retain(base(), "367d"), None, Some(CREATED + 10)),
            Some(CREATED + 10 + 86_400),
            Some("367d"),
        ),
        (
            "a malformed retainFor is not read once the controller set releaseTime",
            released(
                with_retain(base(), "05m"),
                Some(CREATED + 100),
                Some(CREATED),
            ),
            Some(CREATED + 100),
            None,
        ),
    ];
    for (what, r, want, want_defaulted) in cases {
        let got = reservation_file(&view::reservation(&r).unwrap(), "node-a", DAY).unwrap();
        let FileDecision::Write { file: f, defaulted } = got else {
            panic!("{what}: expected a file, got {got:?}");
        };
        assert_eq!(
            defaulted.as_ref().map(RetainForError::written),
            want_defaulted,
            "{what}"
        );
        assert_eq!(
            f.release_time,
            want.map(Timestamp::from_unix_secs),
            "{what}"
        );
        assert_eq!(f.uid, "uid-pg-0", "{what}");
        assert_eq!(f.node_name.as_deref(), Some("node-a"), "{what}");
    }
}

#[test]
fn decisions_and_refusals() {
    let mut ipv6_mapped = bound(ipr("db", "v6", "node-a", &["::ffff:10.0.0.9"]));
    ipv6_mapped.metadata.uid = Some("u".into());
    let mut no_uid = bound(ipr("db", "nouid", "node-a", &["10.0.0.1"]));
    no_uid.metadata.uid = None;
    let mut no_created = ipr("db", "nocreated", "node-a", &["10.0.0.1"]);
    no_created.metadata.creation_timestamp = None;
    let cases: Vec<(&str, IPReservation, &str)> = vec![
        (
            "other node",
            bound(ipr("db", "a", "node-b", &["10.0.0.1"])),
            "other",
        ),
        (
            "conflict",
            conflicted(bound(ipr("db", "a", "node-a", &["10.0.0.1"])), "True"),
            "conflict",
        ),
        (
            "a resolved conflict is written",
            conflicted(bound(ipr("db", "a", "node-a", &["10.0.0.1"])), "False"),
            "write",
        ),
        (
            "a Conflict condition without status.conflict is written: the typed field decides",
            {
                let mut r = conflicted(bound(ipr("db", "a", "node-a", &["10.0.0.1"])), "True");
                r.status.as_mut().unwrap().conflict = None;
                r
            },
            "write",
        ),
        (
            "dual stack",
            bound(ipr("db", "a", "node-a", &["10.0.0.1", "fd00::1"])),
            "write",
        ),
        ("mapped IPv6 becomes IPv4", ipv6_mapped, "write"),
        (
            "dotted pod name",
            bound(ipr("db", "web.example", "node-a", &["10.0.0.1"])),
            "write",
        ),
        (
            "upper-case name",
            bound(ipr("db", "Pod", "node-a", &["10.0.0.1"])),
            "failed to use reservation db/Pod",
        ),
        (
            "path in name",
            bound(ipr("db", "../etc", "node-a", &["10.0.0.1"])),
            "failed to use reservation",
        ),
        (
            "dot namespace",
            bound(ipr("..", "a", "node-a", &["10.0.0.1"])),
            "invalid namespace",
        ),
        (
            "bad address",
            bound(ipr("db", "a", "node-a", &["10.0.0.300"])),
            "failed to parse address \"10.0.0.300\"",
        ),
        (
            "no address",
            bound(ipr("db", "a", "node-a", &[])),
            "lists no address",
        ),
        (
            "address twice",
            bound(ipr("db", "a", "node-a", &["10.0.0.1", "::ffff:10.0.0.1"])),
            "twice",
        ),
        ("no uid", no_uid, "no metadata.uid"),
        (
            "no creationTimestamp",
            no_created,
            "no metadata.creationTimestamp",
        ),
    ];
    for (what, r, want) in cases {
        match (
            view::reservation(&r).and_then(|r| reservation_file(&r, "node-a", DAY)),
            want,
        ) {
            (Ok(FileDecision::OtherNode), "other")
            | (Ok(FileDecision::Conflict), "conflict")
            | (Ok(FileDecision::Write { .. }), "write") => {}
            (Err(e), _) if !["other", "conflict", "write"].contains(&want) => {
                let text = crate::runtime::logging::error_chain(&e);
                assert!(text.contains(want), "{what}: {text:?} lacks {want:?}");
                if let Some(source) = std::error::Error::source(&e) {
                    assert!(
                        !e.to_string().contains(&source.to_string()),
                        "{what}: {e} repeats its source"
                    );
                }
            }
            (got, _) => panic!("{what}: got {got:?}, wanted {want}"),
        }
    }
    let FileDecision::Write { file: f, .. } = reservation_file(
        &view::reservation(&bound(ipr("db", "v6", "node-a", &["::ffff:10.0.0.9"]))).unwrap(),
        "node-a",
        DAY,
    )
    .unwrap() else {
        panic!("expected a file");
    };
    assert_eq!(f.ips, vec!["10.0.0.9".parse::<std::net::IpAddr>().unwrap()]);
}

#[test]
fn desired_files_of_a_node() {
    let reservations = vec![
        bound(ipr("db", "a", "node-a", &["10.0.0.1"])),
        bound(ipr("db", "b", "node-b", &["10.0.0.2"])),
        conflicted(bound(ipr("db", "c", "node-a", &["10.0.0.1"])), "True"),
        bound(ipr("db", "D", "node-a", &["10.0.0.4"])),
        bound(ipr("web", "a", "node-a", &["10.0.0.5"])),
    ];
    let d = desired_files("node-a", &view::reservations(&reservations), DAY);
    assert_eq!(
        d.files.keys().cloned().collect::<Vec<_>>(),
        vec![key("db", "a"), key("web", "a")]
    );
    assert_eq!(d.conflicts, vec![key("db", "c")]);
    assert_eq!(d.refused.len(), 1);
    assert_eq!(d.refused[0].names(), ("db", "D"));
}

#[test]
fn invalid_names_are_refused_as_found() {
    let refusal = view::reservation(&bound(ipr("db", "D", "node-a", &["10.0.0.4"]))).unwrap_err();
    assert_eq!(refusal.names(), ("db", "D"));
    assert_eq!(
        refusal.to_string(),
        "failed to use reservation db/D as a file name"
    );
    assert!(matches!(
        refusal,
        Refusal::InvalidName {
            source: ipkeep_reservation::SchemaError::InvalidPodName { .. },
            ..
        }
    ));
}
