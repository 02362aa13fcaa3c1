//! The `ipkeep-e2e apiserver` binary as a user runs it: `--listen`, `--crds`, `--kubeconfig`, and
//! every fault of its admin endpoint (`/admin/fail-next`, `/admin/delay`, `/admin/close-watches`,
//! `/admin/compact`, `/admin/restart`), driven through the real kube client.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "fixtures/shared.rs"]
mod shared;

#[path = "fixtures/harness.rs"]
mod harness;

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
};

use futures::{StreamExt, TryStreamExt};
use harness::{DEADLINE, api_error, fixture_crds, ipr, iprs, wait_for};
use kube::{
    Client, Config, ResourceExt,
    api::{PostParams, WatchEvent, WatchParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::{Value, json};

/// The running binary; killed (and reaped) when the test ends, however it ends.
struct Binary {
    child: Child,
    url: String,
    dir: harness::Scratch,
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start `ipkeep-e2e apiserver` on a free port and wait (with a deadline) for the URL it prints
/// once it listens.
async fn spawn_binary(test: &str) -> Binary {
    let dir = harness::Scratch::new(&format!("e2e-bin-{test}"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_ipkeep-e2e"))
        .args(["apiserver", "--listen", "127.0.0.1:0", "--crds"])
        .arg(fixture_crds())
        .arg("--kubeconfig")
        .arg(dir.join("kubeconfig"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("failed to start ipkeep-e2e");
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut binary = Binary {
        child,
        url: String::new(),
        dir,
    };
    let first_line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    });
    let line = tokio::time::timeout(DEADLINE, first_line)
        .await
        .unwrap_or_else(|_| panic!("gave up after {DEADLINE:?} waiting for the binary's URL"))
        .unwrap()
        .unwrap();
    assert!(line.starts_with("http://127.0.0.1:"), "printed {line:?}");
    binary.url = line.trim().to_string();
    binary
}

/// A kube client built from the kubeconfig the binary wrote.
async fn client_from_kubeconfig(binary: &Binary) -> Client {
    let kubeconfig = Kubeconfig::read_from(binary.dir.join("kubeconfig")).unwrap();
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    assert_eq!(config.cluster_url.to_string(), format!("{}/", binary.url));
    config.default_retry = false;
    Client::try_from(config).unwrap()
}

async fn admin(client: &Client, path: &str, body: Value) -> String {
    let request = hyper::http::Request::post(path)
        .body(body.to_string().into_bytes())
        .unwrap();
    client.request_text(request).await.unwrap()
}

#[tokio::test]
async fn binary_serves_crds_and_obeys_its_admin_endpoint() {
    let binary = spawn_binary("admin").await;
    let client = client_from_kubeconfig(&binary).await;
    let api = iprs(&client, "default");
    let created = api
        .create(
            &PostParams::default(),
            &ipr("web-0", "node-a", &["10.0.0.1"]),
        )
        .await
        .expect("the CRD from --crds is served");

    // fail-next: exactly the next matching request fails, with the asked-for status.
    let ok = admin(
        &client,
        "/admin/fail-next",
        json!({"n": 1, "status": 429, "verb": "get", "resource": "ipreservations"}),
    )
    .await;
    assert_eq!(ok, r#"{"ok":true}"#);
    let status = api_error(api.get("web-0").await);
    assert_eq!(
        (status.code, status.reason.as_str()),
        (429, "TooManyRequests")
    );
    api.get("web-0").await.expect("only one failure injected");

    // delay: requests still succeed; turning it off is accepted.
    admin(&client, "/admin/delay", json!({"ms": 50})).await;
    api.get("web-0").await.unwrap();
    admin(&client, "/admin/delay", json!({"ms": 0})).await;

    // close-watches: an open watch ends cleanly.
    let events = api
        .watch(
            &WatchParams::default(),
            &created.resource_version().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    admin(&client, "/admin/close-watches", json!({})).await;
    let rest: Vec<WatchEvent<_>> = tokio::time::timeout(DEADLINE, events.try_collect())
        .await
        .expect("the watch stream ends after /admin/close-watches")
        .unwrap();
    assert!(rest.is_empty(), "{rest:?}");

    // compact: resuming from the old version gets an in-stream 410 Expired.
    admin(&client, "/admin/compact", json!({})).await;
    let events: Vec<WatchEvent<_>> = tokio::time::timeout(
        DEADLINE,
        api.watch(
            &WatchParams::default(),
            &created.resource_version().unwrap(),
        )
        .await
        .unwrap()
        .try_collect(),
    )
    .await
    .expect("a watch from a compacted version ends after its error")
    .unwrap();
    assert!(
        matches!(events.as_slice(), [WatchEvent::Error(e)] if e.code == 410 && e.reason == "Expired"),
        "{events:?}"
    );

    // restart: connections and watches drop, the port comes back, the data is kept.
    let mut watch = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    assert!(matches!(watch.next().await, Some(Ok(WatchEvent::Added(_)))));
    let ok = admin(&client, "/admin/restart", json!({"ms": 200})).await;
    assert_eq!(ok, r#"{"ok":true}"#);
    let end = tokio::time::timeout(DEADLINE, watch.next())
        .await
        .expect("the open watch ends when the server restarts");
    assert!(!matches!(end, Some(Ok(_))), "{end:?}");
    let again = wait_for("the restarted binary to serve web-0", || async {
        api.get("web-0").await.ok()
    })
    .await;
    assert_eq!(again.uid(), created.uid(), "data survives the restart");

    // Bad admin requests are answered as the API answers bad requests.
    let bad = hyper::http::Request::post("/admin/fail-next")
        .body(json!({"status": 200}).to_string().into_bytes())
        .unwrap();
    let status = api_error(client.request_text(bad).await);
    assert_eq!(status.code, 400);
}
