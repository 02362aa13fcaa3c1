//! Conversion between the two Event APIs: `events.k8s.io/v1` objects are stored as core/v1 Events
//! (as kube-apiserver does), so `kubectl get events` and `describe` show what kube's Recorder wrote.

use serde_json::{Map, Value};

use super::registry::ResourceType;

/// Top-level field names: (`events.k8s.io/v1`, core/v1).
const EVENT_FIELDS: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

fn rename(obj: &Value, from_v1: bool) -> Value {
    let Some(map) = obj.as_object() else {
        return obj.clone();
    };
    let mut out = Map::new();
    for (k, v) in map {
        let renamed = EVENT_FIELDS
            .iter()
            .find(|(v1, core)| if from_v1 { v1 == k } else { core == k })
            .map(|(v1, core)| if from_v1 { *core } else { *v1 })
            .unwrap_or(k);
        out.insert(renamed.to_string(), v.clone());
    }
    Value::Object(out)
}

/// The stored form of an object written through `rt`.
pub fn to_storage(rt: &ResourceType, obj: Value) -> Value {
    if rt.is_events_v1() {
        rename(&obj, true)
    } else {
        obj
    }
}

/// The form of a stored object served through `rt`.
pub fn from_storage(rt: &ResourceType, obj: &Value) -> Value {
    if rt.is_events_v1() {
        rename(obj, false)
    } else {
        obj.clone()
    }
}

/// The stored field path a field selector on `rt` names (`regarding.name` → `involvedObject.name`).
pub fn storage_field(rt: &ResourceType, path: &str) -> String {
    if !rt.is_events_v1() {
        return path.to_string();
    }
    let (head, rest) = path
        .split_once('.')
        .map_or((path, None), |(h, r)| (h, Some(r)));
    let head = EVENT_FIELDS
        .iter()
        .find(|(v1, _)| *v1 == head)
        .map_or(head, |(_, core)| *core);
    match rest {
        Some(r) => format!("{head}.{r}"),
        None => head.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::apiserver::registry::Registry;

    #[test]
    fn events_round_trip_between_apis() {
        let r = Registry::with_builtins();
        let v1 = r.find("events.k8s.io", "v1", "events").unwrap();
        let core = r.find("", "v1", "events").unwrap();
        let event = json!({"regarding": {"name": "p"}, "note": "hi", "reportingController": "ipkeep", "reason": "R"});
        let stored = to_storage(&v1, event.clone());
        assert_eq!(
            stored,
            json!({"involvedObject": {"name": "p"}, "message": "hi", "reportingComponent": "ipkeep", "reason": "R"})
        );
        assert_eq!(from_storage(&v1, &stored), event);
        assert_eq!(from_storage(&core, &stored), stored);
        assert_eq!(storage_field(&v1, "regarding.name"), "involvedObject.name");
        assert_eq!(storage_field(&v1, "reason"), "reason");
        assert_eq!(
            storage_field(&core, "involvedObject.name"),
            "involvedObject.name"
        );
        assert_eq!(v1.key(), core.key());
    }
}
