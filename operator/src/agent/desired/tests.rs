use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use ipkeep_plugin::reservation::{
    FORMAT_VERSION, PodKey, ReservationFile, ReservationSet, Skipped, Timestamp,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::*;
use crate::agent::view;
use crate::crd::{IPReservation, IPReservationSpec, IPReservationStatus, IpString};

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

fn conflicted(mut r: IPReservation, status: &str) -> IPReservation {
    let st = r.status.get_or_insert_with(Default::default);
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

fn file(ns: &str, pod: &str, ips: &[&str], release: Option<i64>) -> ReservationFile {
    ReservationFile {
        version: FORMAT_VERSION,
        namespace: ns.into(),
        pod: pod.into(),
        ips: ips.iter().map(|s| s.parse().unwrap()).collect(),
        release_time: release.map(Timestamp::from_unix_secs),
        uid: format!("uid-{pod}"),
        node_name: Some("node-a".into()),
    }
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
    let cases: Vec<(&str, IPReservation, Option<i64>)> = vec![
        ("bound: null", bound(base()), None),
        (
            "released: the controller's releaseTime, exactly",
            released(base(), Some(CREATED + 100), Some(CREATED)),
            Some(CREATED + 100),
        ),
        (
            "released, releaseTime already passed: still written as set",
            released(base(), Some(1), Some(0)),
            Some(1),
        ),
        (
            "released without releaseTime: releasedAt + retainFor",
            released(with_retain(base(), "30m"), None, Some(CREATED + 10)),
            Some(CREATED + 10 + 1_800),
        ),
        (
            "released without any time: creation + retainFor",
            released(with_retain(base(), "2h"), None, None),
            Some(CREATED + 7_200),
        ),
        (
            "hand-made (no status): creation + default retainFor",
            base(),
            Some(CREATED + 86_400),
        ),
        (
            "hand-made with retainFor 7d",
            with_retain(base(), "7d"),
            Some(CREATED + 7 * 86_400),
        ),
        (
            "status without phase counts as hand-made",
            {
                let mut r = with_retain(base(), "45s");
                r.status = Some(IPReservationStatus::default());
                r
            },
            Some(CREATED + 45),
        ),
    ];
    for (what, r, want) in cases {
        let got = reservation_file(&view::reservation(&r), "node-a", DAY).unwrap();
        let FileDecision::Write(f) = got else {
            panic!("{what}: expected a file, got {got:?}");
        };
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
    let mut bad_retain = ipr("db", "badretain", "node-a", &["10.0.0.1"]);
    bad_retain.spec.retain_for = Some("05m".into());
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
        (
            "bad retainFor when the release time must be computed",
            bad_retain.clone(),
            "failed to parse retention \"05m\"",
        ),
        (
            "bad retainFor is not read once the controller set the status",
            released(bad_retain, Some(CREATED + 100), Some(CREATED)),
            "write",
        ),
    ];
    for (what, r, want) in cases {
        match (
            reservation_file(&view::reservation(&r), "node-a", DAY),
            want,
        ) {
            (Ok(FileDecision::OtherNode), "other")
            | (Ok(FileDecision::Conflict), "conflict")
            | (Ok(FileDecision::Write(_)), "write") => {}
            (Err(e), _) if !["other", "conflict", "write"].contains(&want) => {
                let text = crate::logging::error_chain(&e);
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
    let FileDecision::Write(f) = reservation_file(
        &view::reservation(&bound(ipr("db", "v6", "node-a", &["::ffff:10.0.0.9"]))),
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
    assert_eq!(d.conflicts, vec![Key::new("db", "c")]);
    assert_eq!(d.refused.len(), 1);
    assert_eq!(d.refused[0].0, Key::new("db", "D"));
}

fn found(files: &[ReservationFile], skipped: &[&str]) -> ReservationSet {
    ReservationSet {
        files: files.iter().map(|f| (f.pod_key(), f.clone())).collect(),
        skipped: skipped
            .iter()
            .map(|p| Skipped {
                path: PathBuf::from(p),
                reason: "garbage".into(),
            })
            .collect(),
    }
}

/// The file-set decision, one row per situation the issue names.
#[test]
fn plan_table() {
    let a = file("db", "a", &["10.0.0.1"], None);
    let a_released = file("db", "a", &["10.0.0.1"], Some(CREATED));
    let a_moved_ip = file("db", "a", &["10.0.0.7"], None);
    let b = file("db", "b", &["10.0.0.2"], None);
    let mut a_new_uid = a.clone();
    a_new_uid.uid = "uid-recreated".into();

    struct Row {
        what: &'static str,
        desired: Vec<ReservationFile>,
        found: ReservationSet,
        create: Vec<PodKey>,
        update: Vec<PodKey>,
        remove: Vec<PodKey>,
        garbage: Vec<&'static str>,
    }
    let rows = vec![
        Row {
            what: "create: a new reservation, no file",
            desired: vec![a.clone()],
            found: found(&[], &[]),
            create: vec![key("db", "a")],
            update: vec![],
            remove: vec![],
            garbage: vec![],
        },
        Row {
            what: "unchanged: nothing to touch",
            desired: vec![a.clone(), b.clone()],
            found: found(&[a.clone(), b.clone()], &[]),
            create: vec![],
            update: vec![],
            remove: vec![],
            garbage: vec![],
        },
        Row {
            what: "update: released",
            desired: vec![a_released.clone()],
            found: found(std::slice::from_ref(&a), &[]),
            create: vec![],
            update: vec![key("db", "a")],
            remove: vec![],
            garbage: vec![],
        },
        Row {
            what: "update: other address",
            desired: vec![a_moved_ip.clone()],
            found: found(std::slice::from_ref(&a), &[]),
            create: vec![],
            update: vec![key("db", "a")],
            remove: vec![],
            garbage: vec![],
        },
        Row {
            what: "update: re-created reservation (new uid)",
            desired: vec![a_new_uid.clone()],
            found: found(std::slice::from_ref(&a), &[]),
            create: vec![],
            update: vec![key("db", "a")],
            remove: vec![],
            garbage: vec![],
        },
        Row {
            what: "move away / delete / conflict: the file without a desired reservation goes",
            desired: vec![b.clone()],
            found: found(&[a.clone(), b.clone()], &[]),
            create: vec![],
            update: vec![],
            remove: vec![key("db", "a")],
            garbage: vec![],
        },
        Row {
            what: "everything deleted",
            desired: vec![],
            found: found(&[a.clone(), b.clone()], &[]),
            create: vec![],
            update: vec![],
            remove: vec![key("db", "a"), key("db", "b")],
            garbage: vec![],
        },
        Row {
            what: "stale leftovers and garbage are cleaned, valid files kept",
            desired: vec![a.clone()],
            found: found(
                std::slice::from_ref(&a),
                &[
                    "/d/net/reserved/db/.ipkeep-tmp-12-0",
                    "/d/net/reserved/db/Bad_Name",
                    "/d/net/reserved/link",
                ],
            ),
            create: vec![],
            update: vec![],
            remove: vec![],
            garbage: vec![
                "/d/net/reserved/db/.ipkeep-tmp-12-0",
                "/d/net/reserved/db/Bad_Name",
                "/d/net/reserved/link",
            ],
        },
        Row {
            what: "garbage squatting where a wanted file belongs: cleaned and the file created",
            desired: vec![a.clone()],
            found: found(&[], &["/d/net/reserved/db/a"]),
            create: vec![key("db", "a")],
            update: vec![],
            remove: vec![],
            garbage: vec!["/d/net/reserved/db/a"],
        },
    ];
    for row in rows {
        let desired: BTreeMap<_, _> = row
            .desired
            .iter()
            .map(|f| (f.pod_key(), f.clone()))
            .collect();
        let p = plan(&desired, &row.found);
        let keys =
            |v: &[ReservationFile]| v.iter().map(ReservationFile::pod_key).collect::<Vec<_>>();
        assert_eq!(keys(&p.create), row.create, "{}: create", row.what);
        assert_eq!(keys(&p.update), row.update, "{}: update", row.what);
        assert_eq!(p.remove, row.remove, "{}: remove", row.what);
        assert_eq!(
            p.garbage,
            row.garbage.iter().map(PathBuf::from).collect::<Vec<_>>(),
            "{}: garbage",
            row.what
        );
        let touched = row.create.len() + row.update.len() + row.remove.len() + row.garbage.len();
        assert_eq!(p.len(), touched, "{}", row.what);
        // The written content is the desired one.
        for f in p.create.iter().chain(&p.update) {
            assert_eq!(Some(f), desired.get(&f.pod_key()), "{}", row.what);
        }
    }
}

/// From IPReservations to the plan in one go: the conflicting and moved reservations' files go.
#[test]
fn reservations_to_plan() {
    let on_disk = found(
        &[
            file("db", "a", &["10.0.0.1"], None),
            file("db", "moved", &["10.0.0.2"], None),
            file("db", "c", &["10.0.0.3"], None),
        ],
        &[],
    );
    let reservations = vec![
        released(
            ipr("db", "a", "node-a", &["10.0.0.1"]),
            Some(CREATED + 5),
            Some(CREATED),
        ),
        bound(ipr("db", "moved", "node-b", &["10.0.0.2"])),
        conflicted(bound(ipr("db", "c", "node-a", &["10.0.0.3"])), "True"),
        bound(ipr("db", "new", "node-a", &["10.0.0.4"])),
    ];
    let d = desired_files("node-a", &view::reservations(&reservations), DAY);
    let p = plan(&d.files, &on_disk);
    assert_eq!(
        p.create.iter().map(|f| f.pod.as_str()).collect::<Vec<_>>(),
        ["new"]
    );
    assert_eq!(
        p.update.iter().map(|f| f.pod.as_str()).collect::<Vec<_>>(),
        ["a"]
    );
    assert_eq!(
        p.update[0].release_time,
        Some(Timestamp::from_unix_secs(CREATED + 5))
    );
    assert_eq!(p.remove, vec![key("db", "c"), key("db", "moved")]);
}
