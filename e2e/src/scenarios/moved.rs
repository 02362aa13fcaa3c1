//! Scenarios 6 and 8, one `pub async fn` each (`tests/realnode/` runs them on its real nodes with the chart installed, or on
//! a user's cluster with `IPKEEP_E2E_KUBECONFIG`).

use std::{net::IpAddr, time::Instant};

use crate::testkit::realnode;
use crate::testkit::system::{Options, System, phase, retain, statefulset};
use crate::testkit::{kubectl_ok, wait_for};
use ipkeep_operator::api::Phase;

fn in_cidr(ip: IpAddr, cidr: &str) -> bool {
    let net: ipnet_lite::Net = cidr.parse().unwrap();
    net.contains(ip)
}

mod ipnet_lite {
    //! Just enough CIDR parsing for the IPv4 /24s of these tests.
    use std::net::IpAddr;
    pub struct Net(IpAddr, u8);
    impl std::str::FromStr for Net {
        type Err = String;
        fn from_str(s: &str) -> Result<Net, String> {
            let (a, p) = s.split_once('/').ok_or("no /")?;
            Ok(Net(
                a.parse().map_err(|e| format!("{e}"))?,
                p.parse().map_err(|e| format!("{e}"))?,
            ))
        }
    }
    impl Net {
        pub fn contains(&self, ip: IpAddr) -> bool {
            match (self.0, ip) {
                (IpAddr::V4(n), IpAddr::V4(i)) => {
                    let mask = u32::MAX.checked_shl(32 - u32::from(self.1)).unwrap_or(0);
                    u32::from(n) & mask == u32::from(i) & mask
                }
                (IpAddr::V6(n), IpAddr::V6(i)) => {
                    let mask = u128::MAX.checked_shl(128 - u32::from(self.1)).unwrap_or(0);
                    u128::from(n) & mask == u128::from(i) & mask
                }
                _ => false,
            }
        }
    }
}

pub async fn pod_drained_to_another_node_gets_its_address_and_the_reservation_follows() {
    let sys = System::start("move", Options::default()).await;
    let names: Vec<String> = sys.node_names.clone();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    sys.apply(&statefulset("mv", 1, true, &refs, &retain(Some("1h"))));
    let before = sys.wait_running("app=mv", &["mv-0"]).await["mv-0"].clone();
    sys.wait_bound(&before).await;
    sys.check("mv-0 Running and its reservation Bound");
    let to_name = names.iter().find(|n| **n != before.node).unwrap().clone();
    let reserved = |node: &str| {
        realnode::node_dir(&sys, "reservation files on both nodes", node)
            .map(|d| d.join("reserved").join(&sys.ns).join("mv-0"))
    };
    let old_file = reserved(&before.node);
    if let Some(file) = &old_file {
        sys.wait_file(file, true).await;
    }

    // A real node runs other pods: evict only the test's.
    let drain = [
        "drain",
        before.node.as_str(),
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--force",
        "--timeout=120s",
        "--pod-selector=app=mv",
    ];
    let out = kubectl_ok(&sys.target, &drain, None);
    eprintln!("kubectl drain:\n{out}");
    assert!(
        out.contains("evicting pod") || out.contains("evicted"),
        "{out}"
    );

    let after = sys.wait_recreated("mv-0", &before.uid).await;
    assert_eq!(after.node, to_name, "mv-0 did not move");
    let to_cidr = node_cidr(&sys, &to_name).await;
    assert!(
        in_cidr(after.ips[0], &to_cidr),
        "{:?} is not in {to_name}'s range {to_cidr}",
        after.ips,
    );
    assert_ne!(after.ips, before.ips);
    sys.check("mv-0 moved with an address of the new node's range");
    let r = sys.wait_bound(&after).await;
    assert_eq!(r.spec.node_name, to_name);
    sys.check("the reservation followed (nodeName, ips, Bound)");
    if let (Some(new_file), Some(old_file)) = (reserved(&to_name), &old_file) {
        sys.wait_file(&new_file, true).await;
        sys.wait_file(old_file, false).await;
    }
    for kind in ["Pod", "IPReservation"] {
        let event = wait_for(
            &format!("a Warning AddressesChanged Event on {kind} mv-0"),
            || async {
                sys.events(kind, "mv-0").await.into_iter().find(|e| {
                    e.type_.as_deref() == Some("Warning")
                        && e.reason.as_deref() == Some("AddressesChanged")
                })
            },
        )
        .await;
        eprintln!("{kind} event: {}", event.message.unwrap_or_default());
    }
    sys.check("Warning AddressesChanged Events on the pod and the reservation");
    assert_eq!(phase(&r), Some(Phase::Bound));
    kubectl_ok(&sys.target, &["uncordon", &before.node], None);
}

/// The first pod CIDR of node `name`, as the API server has it.
async fn node_cidr(sys: &System, name: &str) -> String {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(sys.client.clone());
    let node = nodes.get(name).await.expect("read the node");
    node.spec
        .and_then(|s| s.pod_cidr)
        .unwrap_or_else(|| panic!("node {name} has no podCIDR"))
}

/// How many rolling restarts scenario 8 runs.
const RESTARTS: usize = 10;

pub async fn rolling_restart_ten_times_keeps_every_address_every_time() {
    let sys = System::start("roll", Options::default()).await;
    let node_a = sys.node_name(0).to_owned();
    // OrderedReady: the rolling update replaces one pod at a time, as in production.
    sys.apply(&statefulset(
        "roll",
        5,
        false,
        &[&node_a],
        &retain(Some("1h")),
    ));
    let names = ["roll-0", "roll-1", "roll-2", "roll-3", "roll-4"];
    let first = sys.wait_running("app=roll", &names).await;
    for p in first.values() {
        sys.wait_bound(p).await;
    }
    let history = sys.record_reservations();
    let mut current = first.clone();
    for round in 1..=RESTARTS {
        let r0 = Instant::now();
        sys.kubectl(&["rollout", "restart", "statefulset/roll"]);
        sys.kubectl(&["rollout", "status", "statefulset/roll", "--timeout=180s"]);
        let next = wait_for(
            &format!("round {round}: every pod replaced and Running"),
            || async {
                let now = sys.running("app=roll").await;
                (now.len() == 5 && names.iter().all(|n| now[*n].uid != current[*n].uid))
                    .then_some(now)
            },
        )
        .await;
        for n in names {
            assert_eq!(
                next[n].ips, first[n].ips,
                "round {round}: {n} has other addresses"
            );
        }
        eprintln!("restart {round} took {:.1}s", r0.elapsed().as_secs_f64());
        current = next;
    }
    sys.check("every pod replaced every round with its first addresses");
    for p in current.values() {
        sys.wait_bound(p).await;
    }
    assert!(!history.any_deleted(), "a reservation was deleted");
    sys.check("every reservation Bound, none deleted");
}
