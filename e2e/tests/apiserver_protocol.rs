//! The API test server at the HTTP level: bodies in a media type it does not decode (415 as
//! kube-apiserver answers), malformed admin bodies (400, nothing armed), and periodic watch
//! bookmarks at the interval set in `ServerOptions`.
//!
//! For the test server alone (not held against the real control plane): each test checks this
//! server's own handling — its JSON-only refusal, its `/admin` endpoints, its configurable
//! bookmark interval (kube-apiserver's is fixed at about a minute).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "fixtures/shared.rs"]
mod shared;

#[path = "fixtures/harness.rs"]
mod harness;

use std::time::Duration;

use futures::{Stream, StreamExt};
use harness::{DEADLINE, api_error, start};
use ipkeep_e2e::apiserver::{ServerOptions, TestServer};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::{
    Api, ResourceExt,
    api::{ListParams, PostParams, WatchEvent, WatchParams},
};
use serde_json::{Value, json};

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": {"k": "v"}
    }))
    .unwrap()
}

fn post(path: &str, content_type: Option<&str>, body: Vec<u8>) -> hyper::http::Request<Vec<u8>> {
    let mut request = hyper::http::Request::post(path.to_string());
    if let Some(ct) = content_type {
        request = request.header("Content-Type", ct);
    }
    request.body(body).unwrap()
}

#[tokio::test]
async fn a_body_in_protobuf_is_refused_with_415_and_json_is_accepted() {
    let server = start().await;
    let client = server.client();
    let path = "/api/v1/namespaces/default/configmaps";
    // The first bytes kubectl sends for a protobuf body (the "k8s\0" magic prefix).
    let protobuf = b"k8s\x00\x0a\x0f\x0a\x02v1\x12\x09ConfigMap".to_vec();
    let status = api_error(
        client
            .request_text(post(
                path,
                Some("application/vnd.kubernetes.protobuf"),
                protobuf,
            ))
            .await,
    );
    assert_eq!(
        (status.code, status.reason.as_str()),
        (415, "UnsupportedMediaType"),
        "{status:?}"
    );
    for expected in [
        "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml",
        "this test server speaks JSON only",
        "\"application/vnd.kubernetes.protobuf\"",
    ] {
        assert!(
            status.message.contains(expected),
            "message lacks {expected:?}: {}",
            status.message
        );
    }
    let status = api_error(
        client
            .request_text(post(path, Some("application/cbor"), vec![0xa0]))
            .await,
    );
    assert_eq!(status.code, 415, "{status:?}");

    // JSON with parameters, and a body without any Content-Type (read as JSON, as the real server
    // does), are still accepted; only the refused bodies created nothing.
    let json_body = |name: &str| serde_json::to_vec(&config_map(name)).unwrap();
    client
        .request_text(post(
            path,
            Some("application/json; charset=utf-8"),
            json_body("with-charset"),
        ))
        .await
        .unwrap();
    client
        .request_text(post(path, None, json_body("untyped")))
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let mut names: Vec<String> = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|c| c.name_any())
        .collect();
    names.sort();
    assert_eq!(names, ["untyped", "with-charset"]);
}

#[tokio::test]
async fn malformed_admin_bodies_are_refused_and_arm_nothing() {
    let server = start().await;
    let client = server.client();
    let admin = |path: &str, body: Value| post(path, None, body.to_string().into_bytes());
    let cases: &[(&str, Value, &str)] = &[
        (
            "/admin/fail-next",
            json!({"n": "x"}),
            "fail-next: \"n\" must be a non-negative integer, got \"x\"",
        ),
        (
            "/admin/fail-next",
            json!({"n": 0}),
            "fail-next \"n\" must be at least 1",
        ),
        (
            "/admin/fail-next",
            json!({"status": "500"}),
            "fail-next: \"status\" must be a non-negative integer, got \"500\"",
        ),
        (
            "/admin/fail-next",
            json!({"verb": 3}),
            "fail-next: \"verb\" must be a string, got 3",
        ),
        (
            "/admin/fail-next",
            json!({"resource": ["pods"]}),
            "fail-next: \"resource\" must be a string, got [\"pods\"]",
        ),
        (
            "/admin/fail-next",
            json!({"resources": "pods"}),
            "fail-next: unknown field \"resources\" (accepted: n, status, verb, resource)",
        ),
        (
            "/admin/fail-next",
            json!([1]),
            "fail-next: the body must be a JSON object",
        ),
        (
            "/admin/delay",
            json!({"ms": -1}),
            "delay: \"ms\" must be a non-negative integer, got -1",
        ),
        (
            "/admin/delay",
            json!({}),
            "delay needs \"ms\" (milliseconds)",
        ),
        (
            "/admin/restart",
            json!({"ms": 1.5}),
            "restart: \"ms\" must be a non-negative integer, got 1.5",
        ),
        (
            "/admin/compact",
            json!({"now": true}),
            "compact: unknown field \"now\" (accepted: none)",
        ),
    ];
    for (path, body, message) in cases {
        let status = api_error(client.request_text(admin(path, body.clone())).await);
        assert_eq!(
            (status.code, status.reason.as_str(), status.message.as_str()),
            (400, "BadRequest", *message),
            "POST {path} {body}"
        );
    }
    // Nothing above armed a failure or a delay: ordinary requests succeed.
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    for _ in 0..3 {
        pods.list(&ListParams::default())
            .await
            .expect("a refused admin body must not arm a fault");
    }
    // A well-formed body is still accepted and armed.
    let reply = client
        .request_text(admin(
            "/admin/fail-next",
            json!({"n": 1, "status": 429, "verb": "list", "resource": "pods"}),
        ))
        .await
        .unwrap();
    assert_eq!(reply, r#"{"ok":true}"#);
    let status = api_error(pods.list(&ListParams::default()).await);
    assert_eq!(status.code, 429, "{status:?}");
}

/// The next event of a watch, failing the test after [`DEADLINE`] naming what was awaited.
async fn next_event<S>(stream: &mut S, what: &str) -> WatchEvent<ConfigMap>
where
    S: Stream<Item = Result<WatchEvent<ConfigMap>, kube::Error>> + Unpin,
{
    match tokio::time::timeout(DEADLINE, stream.next()).await {
        Ok(Some(event)) => event.unwrap(),
        Ok(None) => panic!("the watch ended while waiting for {what}"),
        Err(_) => panic!("gave up after {DEADLINE:?} waiting for {what}"),
    }
}

#[tokio::test]
async fn periodic_bookmarks_carry_type_and_the_current_resource_version() {
    let server = TestServer::start(ServerOptions {
        bookmark_interval: Duration::from_millis(20),
        ..ServerOptions::default()
    })
    .await
    .unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(server.client());
    let first = cms
        .create(&PostParams::default(), &config_map("first"))
        .await
        .unwrap();
    let first_rv = first.resource_version().unwrap();

    // kube's default WatchParams ask for bookmarks.
    let with_bookmarks = WatchParams::default();
    let without_bookmarks = WatchParams::default().disable_bookmarks();
    let mut plain = cms
        .watch(&without_bookmarks, &first_rv)
        .await
        .unwrap()
        .boxed();
    let mut marked = cms.watch(&with_bookmarks, &first_rv).await.unwrap().boxed();

    // Nothing changed since `first`: the watch's first event is a bookmark at its version.
    match next_event(&mut marked, "a periodic BOOKMARK").await {
        WatchEvent::Bookmark(b) => {
            assert_eq!(
                (b.types.api_version.as_str(), b.types.kind.as_str()),
                ("v1", "ConfigMap")
            );
            assert_eq!(b.metadata.resource_version, first_rv);
            assert!(
                b.metadata.annotations.is_empty(),
                "{:?}",
                b.metadata.annotations
            );
        }
        other => panic!("expected a BOOKMARK first, got {other:?}"),
    }

    let second = cms
        .create(&PostParams::default(), &config_map("second"))
        .await
        .unwrap();
    let second_rv: u64 = second.resource_version().unwrap().parse().unwrap();
    // Bookmarks sent before the change is delivered may not claim its version; the first one
    // after it must.
    loop {
        match next_event(&mut marked, "ADDED second").await {
            WatchEvent::Bookmark(b) => {
                let rv: u64 = b.metadata.resource_version.parse().unwrap();
                assert!(
                    rv < second_rv,
                    "a bookmark at {rv} came before the change at {second_rv}"
                );
            }
            WatchEvent::Added(cm) => {
                assert_eq!(cm.name_any(), "second");
                break;
            }
            other => panic!("unexpected event {other:?}"),
        }
    }
    match next_event(&mut marked, "a BOOKMARK after ADDED second").await {
        WatchEvent::Bookmark(b) => {
            assert_eq!(b.metadata.resource_version, second_rv.to_string());
            assert_eq!(b.types.kind, "ConfigMap");
        }
        other => panic!("expected a BOOKMARK, got {other:?}"),
    }

    // By now many bookmark periods have passed; a watch that did not ask for bookmarks got none.
    match next_event(&mut plain, "ADDED second on the watch without bookmarks").await {
        WatchEvent::Added(cm) => assert_eq!(cm.name_any(), "second"),
        other => panic!("a watch without allowWatchBookmarks got {other:?}"),
    }
}
