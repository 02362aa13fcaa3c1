//! Patch formats: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and the server-side-apply merge.

use serde_json::{Map, Value};

/// Apply an RFC 7386 merge patch: objects merge recursively, `null` deletes, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(target_map) = target {
        for (key, value) in patch_map {
            if value.is_null() {
                target_map.remove(key);
            } else {
                merge_patch(target_map.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

/// The merge key of a list in a built-in kind's strategic merge patch, by the list's field name
/// (kube-apiserver reads it from the Go types; the lists ipkeep and its tests touch are here).
fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaims" => "name",
        "ports" => "containerPort",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "conditions" => "type",
        "ownerReferences" => "uid",
        "hostAliases" => "ip",
        "topologySpreadConstraints" => "topologyKey",
        "taints" => "key",
        _ => return None,
    })
}

/// Lists of scalars whose patch strategy is `merge` (a patch adds to them instead of replacing).
fn merges_primitives(field: &str) -> bool {
    field == "finalizers"
}

/// A strategic merge patch of a built-in kind (kube-apiserver refuses them for custom
/// resources). Directives: `$patch: replace|delete|merge` in maps and list items,
/// `$retainKeys`, `$deleteFromPrimitiveList/<field>`, `$setElementOrder/<field>` (order is not
/// kept: ignored). Lists with a merge key merge item by item; `finalizers` merge as a set; any
/// other list is replaced. An unknown `$patch` value is an error (kube-apiserver: 500).
pub fn strategic_merge_patch(target: &mut Value, patch: &Value) -> Result<(), String> {
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return Ok(());
    };
    let directive = patch_map.get("$patch").and_then(Value::as_str);
    match directive {
        None | Some("merge") => {}
        Some("replace") => {
            let mut fresh = Value::Object(Map::new());
            let mut rest = patch_map.clone();
            rest.remove("$patch");
            strategic_merge_patch(&mut fresh, &Value::Object(rest))?;
            *target = fresh;
            return Ok(());
        }
        Some("delete") => {
            *target = Value::Object(Map::new());
            return Ok(());
        }
        Some(other) => {
            return Err(format!(
                "unknown patch type: {other} in map: {}",
                go_map(patch_map)
            ));
        }
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(target_map) = target else {
        return Ok(());
    };
    for (key, value) in patch_map {
        if key == "$patch" || key == "$retainKeys" || key.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(items)), Value::Array(gone)) =
                (target_map.get_mut(field), value)
            {
                items.retain(|i| !gone.contains(i));
            }
            continue;
        }
        if value.is_null() {
            target_map.remove(key);
            continue;
        }
        if value.get("$patch").and_then(Value::as_str) == Some("delete") {
            target_map.remove(key);
            continue;
        }
        match (target_map.get_mut(key), value) {
            (Some(Value::Array(current)), Value::Array(items)) => {
                merge_list(key, current, items)?;
            }
            (Some(current @ Value::Object(_)), Value::Object(_)) => {
                strategic_merge_patch(current, value)?;
            }
            _ => {
                let mut fresh = Value::Null;
                match value {
                    Value::Object(_) => strategic_merge_patch(&mut fresh, value)?,
                    Value::Array(items) => {
                        let mut list = Vec::new();
                        merge_list(key, &mut list, items)?;
                        fresh = Value::Array(list);
                    }
                    other => fresh = other.clone(),
                }
                target_map.insert(key.clone(), fresh);
            }
        }
    }
    if let Some(Value::Array(keep)) = patch_map.get("$retainKeys") {
        target_map.retain(|k, _| keep.iter().any(|x| x.as_str() == Some(k)));
    }
    Ok(())
}

fn merge_list(field: &str, current: &mut Vec<Value>, items: &[Value]) -> Result<(), String> {
    if let Some(key) = merge_key(field) {
        for item in items {
            let id = item.get(key);
            let at = id.and_then(|id| current.iter().position(|c| c.get(key) == Some(id)));
            let deleting = item.get("$patch").and_then(Value::as_str) == Some("delete");
            match (at, deleting) {
                (Some(i), true) => {
                    current.remove(i);
                }
                (None, true) => {}
                (Some(i), false) => strategic_merge_patch(&mut current[i], item)?,
                (None, false) => {
                    let mut fresh = Value::Null;
                    strategic_merge_patch(&mut fresh, item)?;
                    current.push(fresh);
                }
            }
        }
    } else if merges_primitives(field) {
        for item in items {
            if !current.contains(item) {
                current.push(item.clone());
            }
        }
    } else {
        *current = items.to_vec();
    }
    Ok(())
}

/// A map as Go's `%v` prints it (for the messages kube-apiserver gives).
fn go_map(map: &Map<String, Value>) -> String {
    let parts: Vec<String> = map
        .iter()
        .map(|(k, v)| match v {
            Value::String(s) => format!("{k}:{s}"),
            other => format!("{k}:{other}"),
        })
        .collect();
    format!("map[{}]", parts.join(" "))
}

/// Why a JSON patch could not be applied (the server answers 422 or 409 as kube-apiserver does).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JsonPatchError {
    /// The patch document is not an array of operations.
    #[error("failed to parse JSON patch: {0}")]
    Malformed(String),
    /// A `test` operation did not match.
    #[error("failed to apply JSON patch: testing value {path} failed")]
    TestFailed {
        /// The tested JSON pointer.
        path: String,
    },
    /// An operation named a path that does not exist (or cannot exist).
    #[error("failed to apply JSON patch: {0}")]
    BadPath(String),
}

/// Apply an RFC 6902 JSON patch. As kube-apiserver does, `test` of a missing path compares with `null`
/// (kube's finalizer helper relies on that for `test /metadata/finalizers null`).
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), JsonPatchError> {
    let ops = patch
        .as_array()
        .ok_or_else(|| JsonPatchError::Malformed("expected an array".into()))?;
    let mut doc = target.clone();
    for op in ops {
        let name = op
            .get("op")
            .and_then(Value::as_str)
            .ok_or_else(|| JsonPatchError::Malformed("op missing".into()))?;
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| JsonPatchError::Malformed("path missing".into()))?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| JsonPatchError::Malformed(format!("{name} needs a value")))
        };
        let from = || {
            op.get("from")
                .and_then(Value::as_str)
                .ok_or_else(|| JsonPatchError::Malformed(format!("{name} needs from")))
        };
        match name {
            "add" => add(&mut doc, path, value()?)?,
            "remove" => {
                remove(&mut doc, path)?;
            }
            "replace" => {
                remove(&mut doc, path)?;
                add(&mut doc, path, value()?)?;
            }
            "move" => {
                let v = remove(&mut doc, from()?)?;
                add(&mut doc, path, v)?;
            }
            "copy" => {
                let v = doc
                    .pointer(from()?)
                    .cloned()
                    .ok_or_else(|| JsonPatchError::BadPath(format!("missing {path}")))?;
                add(&mut doc, path, v)?;
            }
            "test" => {
                let actual = doc.pointer(path).cloned().unwrap_or(Value::Null);
                if actual != value()? {
                    return Err(JsonPatchError::TestFailed {
                        path: path.to_string(),
                    });
                }
            }
            other => return Err(JsonPatchError::Malformed(format!("unknown op {other:?}"))),
        }
    }
    *target = doc;
    Ok(())
}

/// Split a JSON pointer into its parent pointer and unescaped last token.
fn split(path: &str) -> Result<(&str, String), JsonPatchError> {
    let idx = path
        .rfind('/')
        .ok_or_else(|| JsonPatchError::BadPath(format!("invalid pointer {path:?}")))?;
    let token = path[idx + 1..].replace("~1", "/").replace("~0", "~");
    Ok((&path[..idx], token))
}

fn add(doc: &mut Value, path: &str, value: Value) -> Result<(), JsonPatchError> {
    if path.is_empty() {
        *doc = value;
        return Ok(());
    }
    let (parent, token) = split(path)?;
    let missing = || JsonPatchError::BadPath(format!("doc is missing path: {path:?}"));
    match doc.pointer_mut(parent).ok_or_else(missing)? {
        Value::Object(map) => {
            map.insert(token, value);
            Ok(())
        }
        Value::Array(items) => {
            let idx = if token == "-" {
                items.len()
            } else {
                token.parse::<usize>().map_err(|_| missing())?
            };
            if idx > items.len() {
                return Err(missing());
            }
            items.insert(idx, value);
            Ok(())
        }
        _ => Err(missing()),
    }
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, JsonPatchError> {
    let (parent, token) = split(path)?;
    let missing = || JsonPatchError::BadPath(format!("doc is missing path: {path:?}"));
    match doc.pointer_mut(parent).ok_or_else(missing)? {
        Value::Object(map) => map.remove(&token).ok_or_else(missing),
        Value::Array(items) => {
            let idx = token.parse::<usize>().map_err(|_| missing())?;
            if idx >= items.len() {
                return Err(missing());
            }
            Ok(items.remove(idx))
        }
        _ => Err(missing()),
    }
}

/// A field path owned by a manager: object keys from the root; lists are owned whole (atomic).
pub type FieldPath = Vec<String>;

/// The leaf field paths an applied configuration sets (lists and scalars are leaves).
pub fn applied_paths(config: &Value) -> Vec<FieldPath> {
    fn walk(v: &Value, prefix: &mut FieldPath, out: &mut Vec<FieldPath>) {
        match v {
            Value::Object(map) if !map.is_empty() => {
                for (k, child) in map {
                    prefix.push(k.clone());
                    walk(child, prefix, out);
                    prefix.pop();
                }
            }
            _ => out.push(prefix.clone()),
        }
    }
    let mut out = Vec::new();
    let mut prefix = Vec::new();
    if let Value::Object(map) = config {
        for (k, child) in map {
            // Identity fields are not owned by anyone, as in kube-apiserver's managedFields.
            if matches!(k.as_str(), "apiVersion" | "kind") {
                continue;
            }
            if k == "metadata" {
                for (mk, mv) in child.as_object().into_iter().flatten() {
                    if matches!(mk.as_str(), "labels" | "annotations") {
                        prefix.extend(["metadata".to_string(), mk.clone()]);
                        walk(mv, &mut prefix, &mut out);
                        prefix.clear();
                    } else if mk == "finalizers" {
                        out.push(vec!["metadata".into(), "finalizers".into()]);
                    }
                }
                continue;
            }
            prefix.push(k.clone());
            walk(child, &mut prefix, &mut out);
            prefix.clear();
        }
    }
    out
}

/// Encode owned paths in the `fieldsV1` shape (`{"f:spec":{"f:ips":{}}}`).
pub fn to_fields_v1(paths: &[FieldPath]) -> Value {
    let mut root = Map::new();
    for path in paths {
        let mut cur = &mut root;
        for segment in path {
            let entry = cur
                .entry(format!("f:{segment}"))
                .or_insert_with(|| Value::Object(Map::new()));
            let Value::Object(next) = entry else { break };
            cur = next;
        }
    }
    Value::Object(root)
}

/// Decode `fieldsV1` back into owned leaf paths.
pub fn from_fields_v1(fields: &Value) -> Vec<FieldPath> {
    fn walk(v: &Value, prefix: &mut FieldPath, out: &mut Vec<FieldPath>) {
        let children: Vec<(&String, &Value)> = v
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| k.starts_with("f:"))
            .collect();
        if children.is_empty() {
            if !prefix.is_empty() {
                out.push(prefix.clone());
            }
            return;
        }
        for (k, child) in children {
            prefix.push(k[2..].to_string());
            walk(child, prefix, out);
            prefix.pop();
        }
    }
    let mut out = Vec::new();
    walk(fields, &mut Vec::new(), &mut out);
    out
}

/// The value at a field path, if present.
pub fn get_path<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |cur, key| cur.get(key))
}

/// Set a value at a field path, creating objects on the way.
pub fn set_path(v: &mut Value, path: &[String], value: Value) {
    let Some((last, parents)) = path.split_last() else {
        *v = value;
        return;
    };
    let mut cur = v;
    for key in parents {
        if !cur.get(key).is_some_and(Value::is_object) {
            if let Value::Object(map) = cur {
                map.insert(key.clone(), Value::Object(Map::new()));
            } else {
                return;
            }
        }
        let Some(next) = cur.get_mut(key) else { return };
        cur = next;
    }
    if let Value::Object(map) = cur {
        map.insert(last.clone(), value);
    }
}

/// Remove the value at a field path, then any objects left empty by that on the way up.
pub fn remove_path(v: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    if let Some(Value::Object(map)) = parents
        .iter()
        .try_fold(&mut *v, |cur, key| cur.get_mut(key))
    {
        map.remove(last);
    }
    for depth in (1..parents.len()).rev() {
        let (prefix, key) = (&parents[..depth], &parents[depth]);
        let Some(Value::Object(map)) = prefix.iter().try_fold(&mut *v, |cur, k| cur.get_mut(k))
        else {
            return;
        };
        if map
            .get(key)
            .and_then(Value::as_object)
            .is_some_and(Map::is_empty)
        {
            map.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn strategic_merge_patch_cases() {
        let pod = json!({"metadata": {"labels": {"a": "1", "b": "1"}, "finalizers": ["x/a", "x/b"]},
            "spec": {"containers": [{"name": "app", "image": "1"}, {"name": "side", "image": "1"}],
                     "tolerations": [{"key": "k1"}]}});
        let cases = [
            // Lists with a merge key merge item by item; others are replaced.
            (
                json!({"spec": {"containers": [{"name": "app", "image": "2"}], "tolerations": [{"key": "k2"}]}}),
                Ok(
                    json!({"metadata": {"labels": {"a": "1", "b": "1"}, "finalizers": ["x/a", "x/b"]},
                "spec": {"containers": [{"name": "app", "image": "2"}, {"name": "side", "image": "1"}],
                         "tolerations": [{"key": "k2"}]}}),
                ),
            ),
            // $patch: delete in a list item, $patch: replace in a map, finalizers merge as a set.
            (
                json!({"metadata": {"labels": {"$patch": "replace", "c": "1"}, "finalizers": ["x/b", "x/c"]},
                    "spec": {"containers": [{"name": "side", "$patch": "delete"}]}}),
                Ok(
                    json!({"metadata": {"labels": {"c": "1"}, "finalizers": ["x/a", "x/b", "x/c"]},
                "spec": {"containers": [{"name": "app", "image": "1"}], "tolerations": [{"key": "k1"}]}}),
                ),
            ),
            // $deleteFromPrimitiveList, $retainKeys, null deletes.
            (
                json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["x/a"], "labels": {"a": null}},
                    "spec": {"$retainKeys": ["containers"]}}),
                Ok(
                    json!({"metadata": {"labels": {"b": "1"}, "finalizers": ["x/b"]},
                "spec": {"containers": [{"name": "app", "image": "1"}, {"name": "side", "image": "1"}]}}),
                ),
            ),
            (
                json!({"metadata": {"labels": {"$patch": "bogus"}}}),
                Err("unknown patch type: bogus in map: map[$patch:bogus]".to_string()),
            ),
        ];
        for (patch, want) in cases {
            let mut doc = pod.clone();
            let got = strategic_merge_patch(&mut doc, &patch).map(|()| doc);
            assert_eq!(got, want, "patch {patch}");
        }
    }

    #[test]
    fn merge_patch_cases() {
        let cases = [
            (
                json!({"a": 1, "b": {"c": 2}}),
                json!({"b": {"c": null, "d": 3}}),
                json!({"a": 1, "b": {"d": 3}}),
            ),
            (json!({"a": [1, 2]}), json!({"a": [3]}), json!({"a": [3]})),
            (
                json!({"a": 1}),
                json!({"a": {"x": 1}}),
                json!({"a": {"x": 1}}),
            ),
            (
                json!({}),
                json!({"metadata": {"labels": {"x": "y"}}}),
                json!({"metadata": {"labels": {"x": "y"}}}),
            ),
        ];
        for (mut target, patch, want) in cases {
            merge_patch(&mut target, &patch);
            assert_eq!(target, want, "patch {patch}");
        }
    }

    #[test]
    fn json_patch_as_the_finalizer_helper_sends_it() {
        let mut obj = json!({"metadata": {"name": "a"}});
        let add = json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": ["x"]}
        ]);
        json_patch(&mut obj, &add).unwrap();
        assert_eq!(obj["metadata"]["finalizers"], json!(["x"]));
        let again = json_patch(&mut obj, &add).unwrap_err();
        assert_eq!(
            again,
            JsonPatchError::TestFailed {
                path: "/metadata/finalizers".into()
            }
        );
        let remove = json!([
            {"op": "test", "path": "/metadata/finalizers", "value": ["x"]},
            {"op": "remove", "path": "/metadata/finalizers/0"}
        ]);
        json_patch(&mut obj, &remove).unwrap();
        assert_eq!(obj["metadata"]["finalizers"], json!([]));
    }

    #[test]
    fn json_patch_ops_and_errors() {
        let mut obj = json!({"a": {"b": [1, 2]}, "c~d": 1});
        json_patch(
            &mut obj,
            &json!([{"op": "add", "path": "/a/b/-", "value": 3}]),
        )
        .unwrap();
        json_patch(
            &mut obj,
            &json!([{"op": "replace", "path": "/a/b/0", "value": 0}]),
        )
        .unwrap();
        json_patch(
            &mut obj,
            &json!([{"op": "move", "from": "/c~0d", "path": "/e"}]),
        )
        .unwrap();
        json_patch(
            &mut obj,
            &json!([{"op": "copy", "from": "/e", "path": "/f"}]),
        )
        .unwrap();
        assert_eq!(obj, json!({"a": {"b": [0, 2, 3]}, "e": 1, "f": 1}));
        let before = obj.clone();
        let bad =
            json!([{"op": "add", "path": "/z", "value": 1}, {"op": "remove", "path": "/nope/x"}]);
        assert!(matches!(
            json_patch(&mut obj, &bad),
            Err(JsonPatchError::BadPath(_))
        ));
        assert_eq!(obj, before, "a failed patch changes nothing");
        assert!(matches!(
            json_patch(&mut obj, &json!({"op": "add"})),
            Err(JsonPatchError::Malformed(_))
        ));
    }

    #[test]
    fn field_paths_round_trip_through_fields_v1() {
        let config = json!({
            "apiVersion": "v1", "kind": "X",
            "metadata": {"name": "a", "labels": {"l": "1"}},
            "status": {"phase": "Bound", "ips": ["1.2.3.4"], "c": {"d": true}}
        });
        let paths = applied_paths(&config);
        let fields = to_fields_v1(&paths);
        assert_eq!(
            fields,
            json!({"f:metadata": {"f:labels": {"f:l": {}}}, "f:status": {"f:phase": {}, "f:ips": {}, "f:c": {"f:d": {}}}})
        );
        assert_eq!(from_fields_v1(&fields), paths);
    }

    #[test]
    fn path_helpers() {
        let mut v = json!({});
        let p: FieldPath = vec!["status".into(), "x".into(), "y".into()];
        set_path(&mut v, &p, json!(1));
        assert_eq!(get_path(&v, &p), Some(&json!(1)));
        remove_path(&mut v, &p);
        assert_eq!(v, json!({"status": {}}));
    }
}
