//! Discovery: `/version`, `/api`, `/apis` and the per-group-version resource lists (the plain,
//! non-aggregated forms; kubectl falls back to them).

use serde_json::{Value, json};

use super::store::Store;

/// The Kubernetes version this server claims to be (kube 5 is tested against 1.33 and later).
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-ipkeep-e2e",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

/// The answer for a discovery path, or None if the path is not one.
pub fn discover(store: &Store, path: &str, server_address: &str) -> Option<Value> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let groups = store.registry.groups();
    let group_entry = |name: &str, versions: &[String]| {
        let versions: Vec<Value> = versions
            .iter()
            .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
            .collect();
        json!({"name": name, "versions": versions, "preferredVersion": versions.first().cloned().unwrap_or(Value::Null)})
    };
    match segments.as_slice() {
        ["version"] => Some(version()),
        ["api"] => Some(json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]
        })),
        ["api", "v1"] => Some(resource_list(store, "", "v1")),
        ["apis"] => {
            let entries: Vec<Value> = groups
                .iter()
                .filter(|(g, _)| !g.is_empty())
                .map(|(g, versions)| group_entry(g, versions))
                .collect();
            Some(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": entries}))
        }
        ["apis", group] => groups
            .iter()
            .find(|(g, _)| g == group)
            .map(|(g, versions)| {
                let mut entry = group_entry(g, versions);
                if let Some(map) = entry.as_object_mut() {
                    map.insert("kind".into(), json!("APIGroup"));
                    map.insert("apiVersion".into(), json!("v1"));
                }
                entry
            }),
        ["apis", group, version] => groups
            .iter()
            .any(|(g, versions)| g == group && versions.iter().any(|v| v == version))
            .then(|| resource_list(store, group, version)),
        _ => None,
    }
}

/// A minimal OpenAPI v3 service: the root lists every group-version, and each group-version document
/// holds one PATCH operation per kind that declares the `fieldValidation` query parameter. That is
/// what kubectl looks for before it relies on server-side field validation (so `kubectl apply` works
/// without `--validate=false`); no schemas are published.
pub fn openapi_v3(store: &Store, path: &str) -> Option<Value> {
    let rest = path.strip_prefix("/openapi/v3")?.trim_matches('/');
    let groups = store.registry.groups();
    let gv_paths: Vec<String> = groups
        .iter()
        .flat_map(|(g, versions)| {
            versions.iter().map(move |v| {
                if g.is_empty() {
                    format!("api/{v}")
                } else {
                    format!("apis/{g}/{v}")
                }
            })
        })
        .collect();
    if rest.is_empty() {
        let paths: serde_json::Map<String, Value> = gv_paths
            .iter()
            .map(|p| {
                (
                    p.clone(),
                    json!({"serverRelativeURL": format!("/openapi/v3/{p}")}),
                )
            })
            .collect();
        return Some(json!({"paths": paths}));
    }
    if !gv_paths.iter().any(|p| p == rest) {
        return None;
    }
    let mut paths = serde_json::Map::new();
    for t in store.registry.all() {
        for v in &t.versions {
            let gv = if t.group.is_empty() {
                format!("api/{v}")
            } else {
                format!("apis/{}/{v}", t.group)
            };
            if gv != rest {
                continue;
            }
            let scope = if t.namespaced {
                "namespaces/{namespace}/"
            } else {
                ""
            };
            let operation = json!({
                "patch": {
                    "operationId": format!("patch{}", t.kind),
                    "parameters": [
                        {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                        {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                        {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                        {"name": "force", "in": "query", "schema": {"type": "boolean", "uniqueItems": true}}
                    ],
                    "responses": {"200": {"description": "OK"}},
                    "x-kubernetes-action": "patch",
                    "x-kubernetes-group-version-kind": {"group": t.group, "version": v, "kind": t.kind}
                }
            });
            paths.insert(format!("/{gv}/{scope}{}/{{name}}", t.plural), operation);
        }
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": paths,
        "components": {}
    }))
}

fn resource_list(store: &Store, group: &str, version: &str) -> Value {
    let resources: Vec<Value> = store
        .registry
        .all()
        .iter()
        .filter(|t| t.group == group && t.versions.iter().any(|v| v == version))
        .flat_map(|t| t.discovery_entries())
        .collect();
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_documents() {
        let store = Store::new();
        let api = discover(&store, "/api", "127.0.0.1:1").unwrap();
        assert_eq!(api["versions"], json!(["v1"]));
        let core = discover(&store, "/api/v1", "x").unwrap();
        let names: Vec<&str> = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["name"].as_str())
            .collect();
        assert!(
            names.contains(&"pods")
                && names.contains(&"pods/status")
                && names.contains(&"namespaces")
        );
        let apis = discover(&store, "/apis", "x").unwrap();
        let groups: Vec<&str> = apis["groups"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|g| g["name"].as_str())
            .collect();
        assert!(groups.contains(&"coordination.k8s.io") && groups.contains(&"events.k8s.io"));
        assert_eq!(
            discover(&store, "/apis/coordination.k8s.io", "x").unwrap()["preferredVersion"]["version"],
            "v1"
        );
        assert!(discover(&store, "/apis/coordination.k8s.io/v2", "x").is_none());
        assert!(discover(&store, "/apis/nope", "x").is_none());
    }

    #[test]
    fn openapi_v3_declares_field_validation() {
        let store = Store::new();
        let root = openapi_v3(&store, "/openapi/v3").unwrap();
        assert_eq!(
            root["paths"]["api/v1"]["serverRelativeURL"],
            "/openapi/v3/api/v1"
        );
        let core = openapi_v3(&store, "/openapi/v3/api/v1").unwrap();
        let patch = &core["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"];
        assert_eq!(patch["x-kubernetes-group-version-kind"]["kind"], "Pod");
        assert_eq!(patch["parameters"][0]["name"], "fieldValidation");
        assert!(openapi_v3(&store, "/openapi/v3/apis/nope/v1").is_none());
        assert!(openapi_v3(&store, "/openapi/v2").is_none());
    }
}
