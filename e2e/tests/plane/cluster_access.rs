//! The helpers other suites build on, against the real control plane: a ServiceAccount token
//! and kubeconfig that carry exactly the RBAC granted to the account, the audit log that records
//! who did what, a node's own identity held to its own Node and Lease, and the fault proxy (`ipkeep_e2e::proxy`) that the
//! component suites inject API faults with: each fault it injects, as a client sees it, with the
//! client's identity passed through to the real API server.
//!
//! Needs the binaries: `make cluster-bins` (or `IPKEEP_CLUSTER_BIN_DIR`); fails loudly without.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::testkit;

use std::time::{Duration, Instant};

use ipkeep_e2e::{
    cluster::ControlPlane,
    proxy::{Fault, FaultProxy, Rule, Verb},
};
use k8s_openapi::api::{
    authentication::v1::SelfSubjectReview,
    coordination::v1::Lease,
    core::v1::{ConfigMap, Node, Secret, ServiceAccount},
    rbac::v1::{Role, RoleBinding},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::{
    Api,
    api::{ListParams, PostParams},
};
use testkit::{wait_for, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_account_credentials_carry_exactly_their_rbac_and_are_audited() {
    let _plane = testkit::plane::use_plane().await;
    let plane = ipkeep_e2e::cluster::shared()
        .await
        .expect("the shared control plane");
    let ns = plane.fresh_namespace("rbac").await.expect("namespace");
    let admin = plane.client().expect("client");
    let pp = PostParams::default();
    let sa: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "reader"}})).unwrap();
    Api::<ServiceAccount>::namespaced(admin.clone(), &ns)
        .create(&pp, &sa)
        .await
        .unwrap();
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "configmap-reader"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]
    }))
    .unwrap();
    Api::<Role>::namespaced(admin.clone(), &ns)
        .create(&pp, &role)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "configmap-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}]
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), &ns)
        .create(&pp, &binding)
        .await
        .unwrap();

    // Through a client with the token: configmaps yes, secrets no, other namespaces no.
    let reader = plane
        .service_account_client(&ns, "reader")
        .await
        .expect("token client");
    let listed = Api::<ConfigMap>::namespaced(reader.clone(), &ns)
        .list(&ListParams::default())
        .await
        .expect("the reader may list configmaps");
    assert!(
        listed
            .items
            .iter()
            .any(|c| c.metadata.name.as_deref() == Some("kube-root-ca.crt")),
        "the controller-manager publishes kube-root-ca.crt in every namespace"
    );
    for denied in [
        Api::<Secret>::namespaced(reader.clone(), &ns)
            .list(&ListParams::default())
            .await
            .map(|_| ()),
        Api::<ConfigMap>::namespaced(reader.clone(), "kube-system")
            .list(&ListParams::default())
            .await
            .map(|_| ()),
    ] {
        match denied {
            Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{s:?}"),
            other => panic!("expected 403 Forbidden, got {other:?}"),
        }
    }

    // Through the built kubectl with the written kubeconfig.
    let kubeconfig = plane.state_dir().join(format!("reader-{ns}.kubeconfig"));
    plane
        .write_service_account_kubeconfig(&ns, "reader", &kubeconfig)
        .await
        .expect("write the token kubeconfig");
    // `can-i` exits 1 when the answer is "no": its exit status is not checked, its answer is.
    let can_i = |verb: &str, resource: &str| {
        let mut cmd = std::process::Command::new(plane.bin("kubectl"));
        cmd.env("KUBECONFIG", &kubeconfig)
            .args(["auth", "can-i", verb, resource]);
        let out = testkit::run(cmd, None);
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(can_i("list", "configmaps"), "yes");
    assert_eq!(can_i("list", "secrets"), "no");
    assert_eq!(can_i("delete", "configmaps"), "no");

    // The audit log names the account, its verb and the denial.
    let audit = plane
        .audit_log_path()
        .expect("the shared control plane audits");
    let user = format!("system:serviceaccount:{ns}:reader");
    let started = Instant::now();
    loop {
        let text = std::fs::read_to_string(audit).unwrap_or_default();
        let events: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .filter(|e: &serde_json::Value| e["user"]["username"] == user.as_str())
            .collect();
        let secret_denied = events.iter().any(|e| {
            e["objectRef"]["resource"] == "secrets"
                && e["verb"] == "list"
                && e["annotations"]["authorization.k8s.io/decision"] == "forbid"
        });
        let configmaps_allowed = events.iter().any(|e| {
            e["objectRef"]["resource"] == "configmaps"
                && e["verb"] == "list"
                && e["annotations"]["authorization.k8s.io/decision"] == "allow"
        });
        if secret_denied && configmaps_allowed {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the audit log {} has no allowed configmaps list and denied secrets list by {user}; its events: {events:#?}",
            audit.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The code of a refused request, or what happened instead.
fn refused<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> Result<u16, String> {
    match result {
        Err(kube::Error::Api(s)) => Ok(s.code),
        other => Err(format!("{other:?}")),
    }
}

/// A node's own identity (`system:node:<name>`, what a kubelet holds) under the Node authorizer
/// and the NodeRestriction admission plugin: it registers its own Node and writes its own Lease,
/// as a kubelet does, but may not create another Node, write another node's Lease, nor list
/// secrets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_identity_writes_its_own_node_and_lease_and_no_other() {
    let _plane = testkit::plane::use_plane().await;
    let plane = ipkeep_e2e::cluster::shared()
        .await
        .expect("the shared control plane");
    assert!(plane.node_config("Bad_Name").is_err());
    let as_node = kube::Client::try_from(plane.node_config("lease-node").expect("node config"))
        .expect("node client");
    let node_named = |name: &str| -> Node {
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap()
    };
    let nodes = Api::<Node>::all(as_node.clone());
    let pp = PostParams::default();
    let own = nodes
        .create(&pp, &node_named("lease-node"))
        .await
        .expect("a node registers its own Node");
    assert_eq!(
        refused(nodes.create(&pp, &node_named("other-node")).await),
        Ok(403),
        "a node created another Node"
    );

    let lease = |name: &str| -> Lease {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name,
                "ownerReferences": [{
                    "apiVersion": "v1", "kind": "Node", "name": "lease-node",
                    "uid": own.metadata.uid.clone().unwrap_or_default(),
                }],
            },
            "spec": {
                "holderIdentity": name, "leaseDurationSeconds": 40,
                "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now()),
            },
        }))
        .unwrap()
    };
    let leases: Api<Lease> = Api::namespaced(as_node.clone(), "kube-node-lease");
    let written = leases
        .create(&pp, &lease("lease-node"))
        .await
        .expect("a node writes its own Lease");
    let read: Api<Lease> = Api::namespaced(plane.client().expect("client"), "kube-node-lease");
    let stored = read.get("lease-node").await.expect("the node's Lease");
    assert_eq!(stored.metadata.uid, written.metadata.uid);
    let spec = stored.spec.expect("lease spec");
    assert_eq!(spec.holder_identity.as_deref(), Some("lease-node"));
    assert_eq!(spec.lease_duration_seconds, Some(40));
    // Renewed, as a kubelet renews it.
    leases
        .replace("lease-node", &pp, &written)
        .await
        .expect("a node renews its own Lease");

    // Another node's Lease: neither created (NodeRestriction) nor, once there, written or read
    // (the Node authorizer).
    assert_eq!(
        refused(leases.create(&pp, &lease("other-node")).await),
        Ok(403),
        "a node created another node's Lease"
    );
    let other = read
        .create(&pp, &lease("other-node"))
        .await
        .expect("admin writes another node's Lease");
    assert_eq!(
        refused(leases.replace("other-node", &pp, &other).await),
        Ok(403),
        "a node renewed another node's Lease"
    );
    assert_eq!(
        refused(leases.get("other-node").await),
        Ok(403),
        "a node read another node's Lease"
    );
    assert_eq!(
        refused(
            Api::<Secret>::all(as_node)
                .list(&ListParams::default())
                .await
        ),
        Ok(403),
        "a node listed every secret"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_built_helm_reaches_the_control_plane_with_its_state_inside() {
    let _plane = testkit::plane::use_plane().await;
    let real = ipkeep_e2e::cluster::shared()
        .await
        .expect("the shared control plane");
    assert!(real.server().starts_with("https://127.0.0.1:"));
    let mut list = real.helm();
    list.args(["list", "-A", "-o", "json"]);
    let helm = testkit::checked(list, None);
    // Other suites of this plane may have installed releases: each is in a namespace of this
    // control plane, so the list came from it and from no other cluster.
    let releases: serde_json::Value =
        serde_json::from_slice(&helm.stdout).expect("helm list printed JSON");
    let releases = releases.as_array().expect("helm list printed a list");
    for release in releases {
        let ns = release["namespace"]
            .as_str()
            .expect("a release's namespace");
        testkit::kubectl_ok(real, &["get", "namespace", ns], None);
    }
}

/// A ServiceAccount `proxied` in `ns` that may do anything with configmaps there, and a client of
/// it through `proxy`.
async fn proxied_client(plane: &ControlPlane, proxy: &FaultProxy, ns: &str) -> kube::Client {
    let admin = plane.client().expect("client");
    let pp = PostParams::default();
    let objects = [
        serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "proxied"}}),
        serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "configmaps"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}]
        }),
        serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "proxied"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "configmaps"},
            "subjects": [{"kind": "ServiceAccount", "name": "proxied", "namespace": ns}]
        }),
    ];
    Api::<ServiceAccount>::namespaced(admin.clone(), ns)
        .create(&pp, &serde_json::from_value(objects[0].clone()).unwrap())
        .await
        .unwrap();
    Api::<Role>::namespaced(admin.clone(), ns)
        .create(&pp, &serde_json::from_value(objects[1].clone()).unwrap())
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(admin, ns)
        .create(&pp, &serde_json::from_value(objects[2].clone()).unwrap())
        .await
        .unwrap();
    let config = plane
        .service_account_config(ns, "proxied")
        .await
        .expect("a token client configuration");
    kube::Client::try_from(proxy.config_through(config)).expect("a client through the proxy")
}

/// The shared control plane, a fresh namespace `prefix-…`, a fault proxy of the test's own, and a
/// client of the ServiceAccount `proxied` of that namespace through it ([`proxied_client`]).
async fn through_a_proxy(
    prefix: &str,
) -> (&'static ControlPlane, String, FaultProxy, kube::Client) {
    let plane = ipkeep_e2e::cluster::shared()
        .await
        .expect("the shared control plane");
    let ns = plane.fresh_namespace(prefix).await.expect("namespace");
    let proxy = FaultProxy::in_front_of(plane).await.expect("a fault proxy");
    let client = proxied_client(plane, &proxy, &ns).await;
    (plane, ns, proxy, client)
}

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "data": {"k": "v"}}))
        .unwrap()
}

fn api_code<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(s)) => (s.code, s.reason),
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// The proxy passes the token on (the API server sees the ServiceAccount and applies its RBAC),
/// and each rule does what it says to exactly the requests it matches, for as many as it says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fault_proxy_keeps_the_identity_and_injects_http_errors() {
    let _plane = testkit::plane::use_plane().await;
    let (plane, ns, proxy, client) = through_a_proxy("proxy-http").await;
    let pp = PostParams::default();

    // Who the API server sees, through the proxy.
    let review: SelfSubjectReview = serde_json::from_value(serde_json::json!({})).unwrap();
    let review = Api::<SelfSubjectReview>::all(client.clone())
        .create(&pp, &review)
        .await
        .expect("a SelfSubjectReview through the proxy");
    let user = review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username);
    assert_eq!(user, Some(format!("system:serviceaccount:{ns}:proxied")));
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let (code, _) = api_code(
        Api::<Secret>::namespaced(client.clone(), &ns)
            .list(&ListParams::default())
            .await,
    );
    assert_eq!(code, 403, "the account's RBAC holds through the proxy");
    for name in ["cm-a", "cm-b"] {
        maps.create(&pp, &config_map(name)).await.expect("create");
    }

    // 500 on the next list of configmaps only.
    let list_500 = proxy.add(
        Rule::new(Fault::status(500))
            .verb(Verb::List)
            .resource("configmaps")
            .times(1),
    );
    assert_eq!(
        api_code(maps.list(&ListParams::default()).await),
        (500, "InternalError".into())
    );
    assert_eq!(
        maps.list(&ListParams::default()).await.unwrap().items.len(),
        3
    );
    assert_eq!(proxy.hits(list_500), 1);

    // 409 on updates of cm-a alone, twice.
    let conflict = proxy.add(
        Rule::new(Fault::status(409))
            .verb(Verb::Update)
            .namespace(&ns)
            .name("cm-a")
            .times(2),
    );
    for _ in 0..2 {
        let current = maps.get("cm-a").await.unwrap();
        assert_eq!(
            api_code(maps.replace("cm-a", &PostParams::default(), &current).await),
            (409, "Conflict".into())
        );
    }
    let current = maps.get("cm-b").await.unwrap();
    maps.replace("cm-b", &pp, &current)
        .await
        .expect("cm-b is not matched");
    let current = maps.get("cm-a").await.unwrap();
    maps.replace("cm-a", &pp, &current)
        .await
        .expect("the rule is used up");
    assert_eq!(proxy.hits(conflict), 2);

    // 429 and 503 carry Retry-After and a Status body. kube's client retries both by itself
    // (`Config::default_retry`): one injected 429 is absorbed, the call succeeds.
    let once = proxy.add(Rule::new(Fault::status(429)).name("cm-b").times(1));
    maps.get("cm-b").await.expect("kube's client retries a 429");
    assert_eq!(proxy.hits(once), 1, "the 429 was answered, then retried");
    let mut config = plane
        .service_account_config(&ns, "proxied")
        .await
        .expect("a token client configuration");
    config.default_retry = false;
    let raw = kube::Client::try_from(proxy.config_through(config)).unwrap();
    for code in [429u16, 503] {
        let id = proxy.add(Rule::new(Fault::status(code)).name("cm-b").times(1));
        let request = http::Request::get(format!("/api/v1/namespaces/{ns}/configmaps/cm-b"))
            .body(Vec::new())
            .unwrap();
        let response = raw
            .send(request.map(kube::client::Body::from))
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), code);
        assert_eq!(
            response
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok()),
            Some("1")
        );
        let body = http_body_util::BodyExt::collect(response.into_body())
            .await
            .unwrap()
            .to_bytes();
        let status: kube::core::Status = serde_json::from_slice(&body).unwrap();
        assert_eq!(status.code, code);
        proxy.remove(id);
    }

    // Added latency: the answer comes no sooner than the delay.
    proxy.add(
        Rule::new(Fault::delay(Duration::from_millis(300)))
            .name("cm-a")
            .times(1),
    );
    let t0 = Instant::now();
    maps.get("cm-a").await.expect("a delayed get");
    assert!(
        t0.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t0.elapsed()
    );

    // A hanging request: held until its rule goes, then its connection drops.
    let hang = proxy.add(Rule::new(Fault::Hang).name("cm-b"));
    let held = tokio::spawn({
        let maps = maps.clone();
        async move { maps.get("cm-b").await }
    });
    wait_for("the proxy to hold the get of cm-b", || {
        let hit = proxy.hits(hang) == 1;
        async move { hit.then_some(()) }
    })
    .await;
    assert!(!held.is_finished(), "a hanging request was answered");
    proxy.remove(hang);
    match held.await.unwrap() {
        Err(kube::Error::Api(s)) => panic!("a hanging request got an answer: {s:?}"),
        Err(_) => {}
        Ok(cm) => panic!("a hanging request got an answer: {cm:?}"),
    }
    maps.get("cm-b").await.expect("requests pass again");
}

/// Watches: `410 Expired` as an ERROR event, a stream cut after N events, every watch closed at
/// once, every connection dropped, and an outage with the port closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fault_proxy_expires_cuts_and_closes_watches() {
    let _plane = testkit::plane::use_plane().await;
    use futures::{StreamExt, TryStreamExt};
    use kube::api::{WatchEvent, WatchParams};
    let (_, ns, proxy, client) = through_a_proxy("proxy-watch").await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for name in ["w-0", "w-1", "w-2"] {
        maps.create(&PostParams::default(), &config_map(name))
            .await
            .expect("create");
    }
    let wp = WatchParams::default();

    // 410 Expired, as kube-apiserver answers a watch from a compacted resourceVersion.
    proxy.add(
        Rule::new(Fault::Expired)
            .verb(Verb::Watch)
            .resource("configmaps")
            .times(1),
    );
    let events: Vec<_> = within(
        "the expired watch to end",
        maps.watch(&wp, "0").await.unwrap().collect::<Vec<_>>(),
    )
    .await;
    match &events[..] {
        [Ok(WatchEvent::Error(e))] => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected one 410 ERROR event, got {other:?}"),
    }
    // A list with the same rule gets an HTTP 410.
    proxy.add(Rule::new(Fault::Expired).verb(Verb::List).times(1));
    assert_eq!(api_code(maps.list(&ListParams::default()).await).0, 410);

    // From resourceVersion 0 the API server sends the three objects as ADDED: cut after two.
    proxy.add(
        Rule::new(Fault::CutWatch { events: 2 })
            .verb(Verb::Watch)
            .times(1),
    );
    let events: Vec<_> = within(
        "the cut watch to end",
        maps.watch(&wp, "0").await.unwrap().try_collect::<Vec<_>>(),
    )
    .await
    .unwrap();
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(
        events.iter().all(|e| matches!(e, WatchEvent::Added(_))),
        "{events:?}"
    );

    // Every watch closed cleanly at once, from outside: the stream ends. (The namespace also
    // holds the controller-manager's kube-root-ca.crt.)
    let present = maps.list(&ListParams::default()).await.unwrap().items.len();
    let mut open = maps.watch(&wp, "0").await.unwrap().boxed();
    for _ in 0..present {
        within("an ADDED event", open.next())
            .await
            .unwrap()
            .unwrap();
    }
    proxy.close_watches();
    let rest: Vec<_> = within("the closed watch to end", open.collect::<Vec<_>>()).await;
    assert!(
        rest.iter().all(Result::is_ok),
        "a closed watch ends cleanly: {rest:?}"
    );

    // Every connection dropped: an open watch ends.
    let mut open = maps.watch(&wp, "0").await.unwrap().boxed();
    within("an ADDED event", open.next())
        .await
        .unwrap()
        .unwrap();
    proxy.drop_connections();
    within("the dropped watch to end", open.collect::<Vec<_>>()).await;

    // An outage: the port refuses connections, then serves again.
    let addr = proxy.addr();
    let outage = proxy.outage(Duration::from_millis(500));
    let refused = wait_for("the proxy's port to refuse connections", || async move {
        tokio::net::TcpStream::connect(addr)
            .await
            .is_err()
            .then_some(())
    });
    tokio::join!(outage, refused);
    maps.list(&ListParams::default())
        .await
        .expect("a list after the outage");
}

/// Kubectl (Go's TLS and HTTP client) through a kubeconfig rewritten to point through the proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_runs_through_the_fault_proxy() {
    let _plane = testkit::plane::use_plane().await;
    let (plane, ns, proxy, _) = through_a_proxy("proxy-kubectl").await;
    let direct = plane.state_dir().join(format!("proxied-{ns}.kubeconfig"));
    let through = plane
        .state_dir()
        .join(format!("proxied-{ns}-through.kubeconfig"));
    plane
        .write_service_account_kubeconfig(&ns, "proxied", &direct)
        .await
        .expect("write the token kubeconfig");
    proxy
        .kubeconfig_through(&direct, &through)
        .expect("rewrite it");
    let kubectl = |args: &[&str]| {
        let mut cmd = std::process::Command::new(plane.bin("kubectl"));
        cmd.env("KUBECONFIG", &through).args(args);
        testkit::run(cmd, None)
    };
    let ok = kubectl(&["get", "configmaps", "-o", "name"]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("configmap/kube-root-ca.crt"));
    proxy.add(
        Rule::new(Fault::status(500))
            .verb(Verb::List)
            .resource("configmaps")
            .times(1),
    );
    let failed = kubectl(&["get", "configmaps"]);
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(
        !failed.status.success()
            && stderr.contains("InternalError")
            && stderr.contains("fault proxy"),
        "{stderr}"
    );
}

/// `ipkeep-e2e cluster fault-proxy`: the subcommand in front of the shared control plane, its
/// rules set through the control endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fault_proxy_subcommand_takes_rules_over_http() {
    let _plane = testkit::plane::use_plane().await;
    use std::io::{BufRead, BufReader, Read, Write};
    // The account and its token, made through a throwaway in-process proxy.
    let (plane, ns, _setup, _) = through_a_proxy("proxy-cli").await;
    let direct = plane.state_dir().join(format!("proxied-{ns}.kubeconfig"));
    let through = plane
        .state_dir()
        .join(format!("proxied-{ns}-through.kubeconfig"));
    plane
        .write_service_account_kubeconfig(&ns, "proxied", &direct)
        .await
        .expect("write the token kubeconfig");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ipkeep-e2e"))
        .args(["cluster", "fault-proxy", "--kubeconfig"])
        .arg(&direct)
        .arg("--kubeconfig-out")
        .arg(&through)
        .arg("--state-dir")
        .arg(plane.state_dir())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start ipkeep-e2e cluster fault-proxy");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = lines.next().unwrap().unwrap();
    let admin = lines.next().unwrap().unwrap();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let admin = admin
        .strip_prefix("http://")
        .expect("an http URL")
        .to_owned();
    let post = |path: &str, body: &str| {
        let mut s = std::net::TcpStream::connect(&admin).unwrap();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        reply
    };
    let reply = post(
        "/rules",
        r#"{"match": {"verb": "list", "resource": "configmaps"}, "fault": {"kind": "status", "code": 500}, "times": 1}"#,
    );
    assert!(
        reply.starts_with("HTTP/1.1 201") && reply.contains(r#"{"id":1}"#),
        "{reply}"
    );
    assert!(post("/rules", r#"{"fault": {"kind": "nap"}}"#).starts_with("HTTP/1.1 400"));
    let kubectl = || {
        let mut cmd = std::process::Command::new(plane.bin("kubectl"));
        cmd.env("KUBECONFIG", &through).args(["get", "configmaps"]);
        testkit::run(cmd, None)
    };
    let failed = kubectl();
    assert!(!failed.status.success(), "the rule did not apply");
    let ok = kubectl();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    child.kill().unwrap();
    child.wait().unwrap();
}
