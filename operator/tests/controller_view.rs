//! The boundary between the CRD's status and the lifecycle's view: a conflict travels as typed
//! data (which address, which older reservation), the Condition is for people only.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_operator::{
    api::{IPReservation, Phase, PodKey},
    controller::view,
    rules::lifecycle::{Conflict, StatusView},
};
use serde_json::json;

fn with_status(status: serde_json::Value) -> IPReservation {
    serde_json::from_value(json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "IPReservation",
        "metadata": {"name": "web-1", "namespace": "db", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"ips": ["10.244.1.5"], "nodeName": "node-a"},
        "status": status,
    }))
    .unwrap()
}

#[test]
fn a_conflict_is_written_as_typed_data_and_read_back_from_it() {
    let conflict = Conflict {
        ip: "10.244.1.5".parse().unwrap(),
        holder: PodKey::new("other", "web-0").unwrap(),
        since: "2026-01-02T00:00:00Z".parse().unwrap(),
    };
    let status = StatusView {
        phase: Some(Phase::Bound),
        pod_uid: Some("uid-1".into()),
        conflict: Some(conflict.clone()),
        ..StatusView::default()
    };
    let written = serde_json::to_value(view::status_object(&status, Some(3))).unwrap();
    assert_eq!(
        written["conflict"],
        json!({"ip": "10.244.1.5", "heldBy": {"namespace": "other", "name": "web-0"}})
    );
    let condition = &written["conditions"][0];
    assert_eq!(condition["type"], "Conflict");
    assert_eq!(condition["status"], "True");
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .contains("other/web-0"),
        "{condition}"
    );

    // Read back: the same conflict, whatever a person made of the message.
    let mut read = written.clone();
    read["conditions"][0]["message"] = json!("someone rewrote this");
    let back = view::reservation_view(&with_status(read));
    assert_eq!(back.status.conflict, Some(conflict));
    assert_eq!(back.status, status);

    // Without the condition the conflict counts as not recorded (both are written again).
    let mut no_condition = written;
    no_condition["conditions"] = json!([]);
    let back = view::reservation_view(&with_status(no_condition));
    assert_eq!(back.status.conflict, None);
}
