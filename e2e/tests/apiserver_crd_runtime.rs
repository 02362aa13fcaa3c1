//! A CustomResourceDefinition created at run time through the kube client: it becomes Established,
//! discovery serves it, its resource takes CRUD, schema violations get 422, its printer columns are
//! served as a Table, and deleting the CRD takes the resource away (404). Held against both the
//! API test server and the real control plane (`both!`; the real half needs `make cluster-bins`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "fixtures/shared.rs"]
mod shared;

#[path = "fixtures/harness.rs"]
mod harness;

use harness::{Backend, api_error, wait_for};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Discovery, ResourceExt,
    api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

const GROUP: &str = "runtime.ipkeep.dev";

fn widget_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{GROUP}")},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "plural": "widgets",
                "singular": "widget",
                "kind": "Widget",
                "listKind": "WidgetList",
                "shortNames": ["wdg"]
            },
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Color", "type": "string", "jsonPath": ".spec.color"},
                    {"name": "Size", "type": "integer", "jsonPath": ".spec.size"}
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": ["color"],
                            "properties": {
                                "color": {"type": "string", "enum": ["red", "blue"]},
                                "size": {"type": "integer", "minimum": 1, "default": 1}
                            }
                        },
                        "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}}
                    }
                }}
            }]
        }
    }))
    .unwrap()
}

fn widget_resource() -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: "v1".into(),
        api_version: format!("{GROUP}/v1"),
        kind: "Widget".into(),
        plural: "widgets".into(),
    }
}

fn widget(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": format!("{GROUP}/v1"),
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": spec
    }))
    .unwrap()
}

fn established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
}

async fn a_crd_created_at_run_time_serves_its_resource_until_deleted(b: &Backend) {
    let ns = b.namespace("crd-runtime").await;
    let server = b;
    let client = server.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &widget_resource());

    // Before: the group is unknown.
    assert_eq!(
        api_error(widgets.list(&ListParams::default()).await).code,
        404
    );

    crds.create(&PostParams::default(), &widget_crd())
        .await
        .unwrap();
    wait_for("the Widget CRD to be Established", || async {
        crds.get_opt(&format!("widgets.{GROUP}"))
            .await
            .unwrap()
            .filter(established)
    })
    .await;
    let (resource, caps) = wait_for("discovery to serve widgets", || async {
        let discovery = Discovery::new(client.clone())
            .filter(&[GROUP])
            .run()
            .await
            .ok()?;
        discovery
            .get(GROUP)?
            .recommended_resources()
            .into_iter()
            .find(|(r, _)| r.plural == "widgets")
    })
    .await;
    assert_eq!(
        (resource.kind.as_str(), resource.api_version.as_str()),
        ("Widget", "runtime.ipkeep.dev/v1")
    );
    assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);
    assert!(
        caps.subresources.iter().any(|(r, _)| r.plural == "status"),
        "{:?}",
        caps.subresources
    );

    // CRUD, with the schema's default filled in.
    let created = widgets
        .create(
            &PostParams::default(),
            &widget("w1", json!({"color": "red"})),
        )
        .await
        .unwrap();
    assert_eq!(created.data.pointer("/spec/size"), Some(&json!(1)));
    let patched = widgets
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 3}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.data.pointer("/spec/size"), Some(&json!(3)));
    assert_eq!(patched.metadata.generation, Some(2));
    let got = widgets.get("w1").await.unwrap();
    assert_eq!(got.resource_version(), patched.resource_version());
    widgets
        .create(
            &PostParams::default(),
            &widget("w2", json!({"color": "blue", "size": 7})),
        )
        .await
        .unwrap();
    let names: Vec<String> = widgets
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|w| w.name_any())
        .collect();
    assert_eq!(names, ["w1", "w2"]);

    // Schema violations: 422 Invalid naming each field.
    let status = api_error(
        widgets
            .create(
                &PostParams::default(),
                &widget("bad", json!({"color": "green", "size": 0})),
            )
            .await,
    );
    assert_eq!(
        (status.code, status.reason.as_str()),
        (422, "Invalid"),
        "{status:?}"
    );
    for field in ["spec.color", "spec.size"] {
        assert!(
            status.message.contains(field),
            "422 message lacks {field}: {}",
            status.message
        );
    }
    assert!(
        status
            .message
            .starts_with("Widget.runtime.ipkeep.dev \"bad\" is invalid"),
        "{}",
        status.message
    );
    assert!(widgets.get_opt("bad").await.unwrap().is_none());

    // Printer columns, as kubectl asks for them.
    let request = hyper::http::Request::get(format!("/apis/{GROUP}/v1/namespaces/{ns}/widgets"))
        .header(
            "Accept",
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        )
        .body(Vec::new())
        .unwrap();
    let table: Value = client.request(request).await.unwrap();
    assert_eq!(table["kind"], "Table", "{table}");
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    // As kube-apiserver: Age is added only to a CRD that declares no columns.
    assert_eq!(columns, ["Name", "Color", "Size"]);
    let rows: Vec<Vec<Value>> = table["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["cells"].as_array().unwrap()[..3].to_vec())
        .collect();
    assert_eq!(
        rows,
        [
            vec![json!("w1"), json!("red"), json!(3)],
            vec![json!("w2"), json!("blue"), json!(7)]
        ]
    );

    // Deleting the CRD takes its resource (and objects) away.
    crds.delete(&format!("widgets.{GROUP}"), &DeleteParams::default())
        .await
        .unwrap();
    wait_for("widgets to answer 404 after the CRD is deleted", || async {
        match widgets.get("w1").await {
            Err(kube::Error::Api(s)) if s.code == 404 => Some(()),
            _ => None,
        }
    })
    .await;
    // kube-apiserver first deletes the objects (the CRD's customresourcecleanup finalizer), then
    // the CRD; the test server does both at once.
    wait_for("the CRD to be gone", || async {
        crds.get_opt(&format!("widgets.{GROUP}"))
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    assert_eq!(
        api_error(widgets.list(&ListParams::default()).await).code,
        404
    );
    let discovery = wait_for("discovery to drop the group", || async {
        let d = Discovery::new(client.clone())
            .filter(&[GROUP])
            .run()
            .await
            .unwrap();
        (!d.has_group(GROUP)).then_some(d)
    })
    .await;
    assert!(!discovery.has_group(GROUP), "discovery still lists {GROUP}");
}

both!(
    a_crd_created_at_run_time_serves_its_resource_until_deleted,
    super::a_crd_created_at_run_time_serves_its_resource_until_deleted
);
