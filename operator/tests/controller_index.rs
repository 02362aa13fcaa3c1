//! The address index behind conflict detection: the older claim holds an address on a node,
//! changes report which other reservations must be looked at again.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_operator::{
    api::IPReservation,
    api::PodKey,
    controller::{index::AddressIndex, view},
    rules::lifecycle::ReservationView,
};
use serde_json::json;

fn key(name: &str) -> PodKey {
    PodKey::new("ns", name).unwrap()
}

fn reservation(name: &str, node: &str, ips: &[&str], created: &str) -> ReservationView {
    let r: IPReservation = serde_json::from_value(json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "IPReservation",
        "metadata": {"name": name, "namespace": "ns", "creationTimestamp": created},
        "spec": {"ips": ips, "nodeName": node},
    }))
    .unwrap();
    view::reservation_view(&r)
}

#[test]
fn the_older_claim_holds_and_changes_touch_the_other_claimants() {
    let index = AddressIndex::default();
    let a = reservation("a", "node-a", &["10.0.0.1"], "2026-01-01T00:00:00Z");
    let b = reservation(
        "b",
        "node-a",
        &["10.0.0.1", "fd00::1"],
        "2026-01-02T00:00:00Z",
    );
    let other_node = reservation("c", "node-b", &["10.0.0.1"], "2025-01-01T00:00:00Z");
    assert!(index.upsert(key("a"), &a).is_empty());
    assert_eq!(
        index.upsert(key("b"), &b),
        vec![key("a")],
        "a shares 10.0.0.1"
    );
    assert!(
        index.upsert(key("c"), &other_node).is_empty(),
        "another node's address is another address"
    );
    assert_eq!(index.conflict(&key("a")), None);
    assert_eq!(
        index.conflict(&key("b")),
        Some(("10.0.0.1".parse().unwrap(), key("a")))
    );
    assert_eq!(index.conflict(&key("c")), None);
    // Unchanged: nothing to look at again.
    assert!(index.upsert(key("b"), &b).is_empty());
    // a moves away: b is touched and no longer in conflict.
    let a_moved = reservation("a", "node-a", &["10.0.0.9"], "2026-01-01T00:00:00Z");
    assert_eq!(index.upsert(key("a"), &a_moved), vec![key("b")]);
    assert_eq!(index.conflict(&key("b")), None);
    // Back again, then deleted.
    index.upsert(key("a"), &a);
    assert_eq!(index.remove(&key("a")), vec![key("b")]);
    assert_eq!(index.conflict(&key("b")), None);
    // A rebuild replaces everything.
    index.rebuild([(key("a"), &a), (key("b"), &b)]);
    assert!(index.conflict(&key("b")).is_some());
    assert_eq!(
        index.conflict(&key("c")),
        None,
        "c is not in the rebuilt index"
    );
}
