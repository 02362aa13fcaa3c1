//! The cross-check's rule as a table: one clean node, then each thing that goes wrong on it
//! (or looks wrong and is not), and what `check --ipam` says.

use std::path::PathBuf;

use super::*;
use crate::agent::ipam::{Allocation, NetworkView, NodeView, ReservedFile};
use crate::api::Phase;

/// "Now" in every case: 2026-11-21T12:00:00Z.
const NOW: i64 = 1_795_262_400;
const OLD: i64 = NOW - 3_600;

fn key(name: &str) -> PodKey {
    PodKey::new("db", name).unwrap()
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn alloc(addr: &str, at: i64) -> Allocation {
    Allocation {
        ip: ip(addr),
        container_id: Some(format!("c-{addr}")),
        ifname: Some("eth0".into()),
        pod: None,
        modified: Timestamp::from_unix_secs(at),
    }
}

fn file(pod: &str, addr: &str, release: Option<i64>, at: i64) -> ReservedFile {
    ReservedFile {
        pod: key(pod),
        ips: vec![ip(addr)],
        release_time: release.map(Timestamp::from_unix_secs),
        uid: format!("uid-{pod}"),
        modified: Some(Timestamp::from_unix_secs(at)),
    }
}

fn ipr(pod: &str, node: &str, addr: &str, created: i64) -> Result<Reservation, Refusal> {
    Ok(Reservation {
        key: key(pod),
        uid: Some(format!("uid-{pod}")),
        created: Some(jiff::Timestamp::from_second(created).unwrap()),
        node_name: node.into(),
        ips: vec![addr.into()],
        retain_for: None,
        phase: Some(Phase::Bound),
        released_at: None,
        release_time: None,
        in_conflict: false,
        generation: None,
    })
}

fn pod(name: &str, node: &str, addr: &str) -> LivePod {
    LivePod {
        key: key(name),
        node: node.into(),
        ips: vec![ip(addr)],
    }
}

/// node-a: web-0 running on .5 with its reservation (allocation, file, IPReservation), and
/// api-0 running on .6 without retention.
fn clean() -> IpamObserved {
    let reservations = vec![ipr("web-0", "node-a", "10.1.0.5", OLD)];
    IpamObserved {
        nodes: vec![NodeReport {
            node: "node-a".into(),
            agent: "ipkeep-agent-x".into(),
            view: Ok(NodeView {
                node: "node-a".into(),
                data_dir: PathBuf::from("/var/lib/cni/networks"),
                networks: vec![NetworkView {
                    network: "pods".into(),
                    error: None,
                    allocations: vec![alloc("10.1.0.5", OLD), alloc("10.1.0.6", OLD)],
                    reservations: vec![file("web-0", "10.1.0.5", None, OLD)],
                }],
            }),
            lost: BTreeSet::new(),
            lost_unlisted: false,
            restored: BTreeSet::new(),
        }],
        before: reservations.clone(),
        after: reservations,
        pods: vec![
            pod("web-0", "node-a", "10.1.0.5"),
            pod("api-0", "node-a", "10.1.0.6"),
        ],
    }
}

fn network(o: &mut IpamObserved) -> &mut NetworkView {
    &mut o.nodes[0].view.as_mut().unwrap().networks[0]
}

/// What a finding says in a table row: its check and a word of its subject.
fn said(f: &Finding) -> String {
    match f {
        Finding::Leak { ip, .. } => format!("leak {ip}"),
        Finding::OrphanFile { pod, .. } => format!("orphan file {pod}"),
        Finding::OrphanReservation { pod, .. } => format!("orphan ipr {pod}"),
        Finding::Conflict { ip, holders, .. } => format!(
            "conflict {ip} {}",
            holders
                .iter()
                .map(|h| match h {
                    Holder::File(p) => format!("file:{}", p.name()),
                    Holder::Pod(p) => format!("pod:{}", p.name()),
                    Holder::Reservation(p) => format!("ipr:{}", p.name()),
                })
                .collect::<Vec<_>>()
                .join(",")
        ),
    }
}

type Case = (&'static str, fn(&mut IpamObserved), &'static [&'static str]);

const CASES: &[Case] = &[
    ("a clean node", |_| {}, &[]),
    (
        "an allocation no pod and no reservation holds is a leak",
        |o| network(o).allocations.push(alloc("10.1.0.9", OLD)),
        &["leak 10.1.0.9"],
    ),
    (
        "a young allocation is not judged (its pod's status has no address yet)",
        |o| network(o).allocations.push(alloc("10.1.0.9", NOW - 10)),
        &[],
    ),
    (
        "an allocation a reservation file holds (the pod away) is no leak",
        |o| {
            network(o).allocations.push(alloc("10.1.0.9", OLD));
            network(o)
                .reservations
                .push(file("db-0", "10.1.0.9", Some(NOW + 60), OLD));
            o.before.push(ipr("db-0", "node-a", "10.1.0.9", OLD));
            o.after.push(ipr("db-0", "node-a", "10.1.0.9", OLD));
        },
        &[],
    ),
    (
        "an allocation of a second network, in no pod's status, is held by the pod its ADD recorded",
        |o| {
            let mut a = alloc("10.9.0.2", OLD);
            a.pod = Some(key("api-0"));
            network(o).allocations.push(a);
        },
        &[],
    ),
    (
        "an allocation whose recorded pod is gone is a leak",
        |o| {
            let mut a = alloc("10.9.0.2", OLD);
            a.pod = Some(key("gone-0"));
            network(o).allocations.push(a);
        },
        &["leak 10.9.0.2"],
    ),
    (
        "a pod's address on another node holds nothing here",
        |o| {
            network(o).allocations.push(alloc("10.1.0.9", OLD));
            o.pods.push(pod("far-0", "node-b", "10.1.0.9"));
        },
        &["leak 10.1.0.9"],
    ),
    (
        "a file without IPReservation, not reported lost, is an orphan",
        |o| {
            network(o)
                .reservations
                .push(file("ghost", "10.1.0.20", Some(NOW + 600), OLD))
        },
        &["orphan file db/ghost"],
    ),
    (
        "a file whose IPReservation names another node is an orphan here",
        |o| {
            network(o)
                .reservations
                .push(file("moved", "10.1.0.20", None, OLD));
            o.before.push(ipr("moved", "node-b", "10.2.0.20", OLD));
            o.after.push(ipr("moved", "node-b", "10.2.0.20", OLD));
        },
        &["orphan file db/moved"],
    ),
    (
        "a file the agent reports lost is not an orphan (check's lost line says it)",
        |o| {
            network(o)
                .reservations
                .push(file("ghost", "10.1.0.20", None, OLD));
            o.nodes[0].lost.insert(key("ghost"));
        },
        &[],
    ),
    (
        "nor when the agent keeps more lost than it lists",
        |o| {
            network(o)
                .reservations
                .push(file("ghost", "10.1.0.20", None, OLD));
            o.nodes[0].lost_unlisted = true;
        },
        &[],
    ),
    (
        "a file whose IPReservation was deleted while check read is not an orphan",
        |o| {
            network(o)
                .reservations
                .push(file("going", "10.1.0.20", None, OLD));
            o.before.push(ipr("going", "node-a", "10.1.0.20", OLD));
        },
        &[],
    ),
    (
        "an expired file holds nothing: no orphan",
        |o| {
            network(o)
                .reservations
                .push(file("ghost", "10.1.0.20", Some(NOW - 1), OLD))
        },
        &[],
    ),
    (
        "a young file is not judged",
        |o| {
            network(o)
                .reservations
                .push(file("ghost", "10.1.0.20", None, NOW - 5))
        },
        &[],
    ),
    (
        "an IPReservation of the node without its file is an orphan",
        |o| {
            o.before.push(ipr("db-1", "node-a", "10.1.0.30", OLD));
            o.after.push(ipr("db-1", "node-a", "10.1.0.30", OLD));
        },
        &["orphan ipr db/db-1"],
    ),
    (
        "not when the agent reports it restored (released by the node: no file on purpose)",
        |o| {
            o.before.push(ipr("db-1", "node-a", "10.1.0.30", OLD));
            o.after.push(ipr("db-1", "node-a", "10.1.0.30", OLD));
            o.nodes[0]
                .restored
                .insert(PodKey::new("db", "db-1").unwrap());
        },
        &[],
    ),
    (
        "not when it is young, created while check read, or in conflict",
        |o| {
            o.before.push(ipr("young", "node-a", "10.1.0.30", NOW - 5));
            o.after.push(ipr("young", "node-a", "10.1.0.30", NOW - 5));
            o.after.push(ipr("new", "node-a", "10.1.0.31", OLD));
            let Ok(mut c) = ipr("loser", "node-a", "10.1.0.5", OLD) else {
                unreachable!()
            };
            c.in_conflict = true;
            o.before.push(Ok(c.clone()));
            o.after.push(Ok(c));
        },
        &[],
    ),
    (
        "an IPReservation of another node without a file here is not this node's",
        |o| {
            o.before.push(ipr("db-1", "node-b", "10.2.0.30", OLD));
            o.after.push(ipr("db-1", "node-b", "10.2.0.30", OLD));
        },
        &[],
    ),
    (
        "two reservation files holding one address are a conflict (one of them an orphan too)",
        |o| {
            network(o)
                .reservations
                .push(file("twin", "10.1.0.5", None, OLD))
        },
        &[
            "orphan file db/twin",
            "conflict 10.1.0.5 file:twin,file:web-0,pod:web-0",
        ],
    ),
    (
        "a reservation holding a live pod's address of another name is a conflict",
        |o| {
            network(o)
                .reservations
                .push(file("ghost", "10.1.0.6", Some(NOW + 600), OLD));
            o.before.push(ipr("ghost", "node-a", "10.1.0.6", OLD));
            o.after.push(ipr("ghost", "node-a", "10.1.0.6", OLD));
        },
        &["conflict 10.1.0.6 file:ghost,pod:api-0"],
    ),
    (
        "an expired file and a pod on its address are no conflict",
        |o| {
            network(o)
                .reservations
                .push(file("ghost", "10.1.0.6", Some(NOW - 1), OLD));
            o.before.push(ipr("ghost", "node-a", "10.1.0.6", OLD));
            o.after.push(ipr("ghost", "node-a", "10.1.0.6", OLD));
        },
        &[],
    ),
    (
        "an IPReservation the agent refuses for a kept file's address is a conflict, not an orphan",
        |o| {
            network(o)
                .reservations
                .push(file("kept", "10.1.0.40", None, OLD));
            o.nodes[0].lost.insert(key("kept"));
            o.before.push(ipr("back", "node-a", "10.1.0.40", OLD));
            o.after.push(ipr("back", "node-a", "10.1.0.40", OLD));
        },
        &["conflict 10.1.0.40 file:kept,ipr:back"],
    ),
    (
        "a node whose view cannot be read is not judged",
        |o| o.nodes[0].view = Err("forbidden".into()),
        &[],
    ),
];

#[test]
fn the_cross_check_finds_leaks_orphans_and_conflicts() {
    for (name, change, expected) in CASES {
        let mut o = clean();
        change(&mut o);
        let found: Vec<String> = cross_check(&o, Timestamp::from_unix_secs(NOW), GRACE)
            .iter()
            .map(said)
            .collect();
        assert_eq!(found, *expected, "{name}");
    }
}

#[test]
fn each_finding_is_a_failed_line_with_its_fix_and_a_clean_node_passes() {
    let o = clean();
    let now = Timestamp::from_unix_secs(NOW);
    let ok = lines(&o, "ipkeep-system", now, GRACE);
    assert_eq!(ok.len(), 1);
    assert!(ok[0].ok, "{ok:?}");
    assert_eq!(
        ok[0].message,
        "2 allocations, 1 reservation files: no leak, orphan or conflict"
    );

    let mut o = clean();
    network(&mut o).allocations.push(alloc("10.1.0.9", OLD));
    network(&mut o)
        .reservations
        .push(file("ghost", "10.1.0.6", None, OLD));
    let found = lines(&o, "ipkeep-system", now, GRACE);
    let checks: Vec<(&str, bool)> = found.iter().map(|l| (l.check, l.ok)).collect();
    assert_eq!(
        checks,
        [("leak", false), ("orphan", false), ("conflict", false)]
    );
    assert!(
        found[0]
            .fix
            .as_deref()
            .unwrap()
            .ends_with("rm /var/lib/cni/networks/pods/10.1.0.9"),
        "{found:?}"
    );
    assert!(
        found[1]
            .fix
            .as_deref()
            .unwrap()
            .contains("rm /var/lib/cni/networks/pods/reserved/db/ghost"),
        "{found:?}"
    );

    let mut o = clean();
    o.nodes[0].view = Err("403 forbidden".into());
    let unread = lines(&o, "ipkeep-system", now, GRACE);
    assert!(!unread[0].ok && unread[0].message.contains("403 forbidden"));
}
