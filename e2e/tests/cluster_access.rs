//! The helpers other suites build on, against the real control plane: a ServiceAccount token
//! and kubeconfig that carry exactly the RBAC granted to the account, the audit log that records
//! who did what, and a stand-in node's Lease.
//!
//! Needs the binaries: `make cluster-bins` (or `IPKEEP_CLUSTER_BIN_DIR`); fails loudly without.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use ipkeep_e2e::{
    apiserver::{ServerOptions, TestServer},
    cluster::{KubeApi, NodeAgent, shared},
};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{ConfigMap, Secret, ServiceAccount},
    rbac::v1::{Role, RoleBinding},
};
use kube::{
    Api,
    api::{ListParams, PostParams},
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_account_credentials_carry_exactly_their_rbac_and_are_audited() {
    let cluster = shared().await.expect("the shared control plane");
    let ns = cluster.fresh_namespace("rbac").await.expect("namespace");
    let admin = cluster.client().expect("client");
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
    let reader = cluster
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
    let kubeconfig = cluster.state_dir().join(format!("reader-{ns}.kubeconfig"));
    cluster
        .write_service_account_kubeconfig(&ns, "reader", &kubeconfig)
        .await
        .expect("write the token kubeconfig");
    let can_i = |verb: &str, resource: &str| {
        let out = std::process::Command::new(cluster.bin("kubectl"))
            .env("KUBECONFIG", &kubeconfig)
            .args(["auth", "can-i", verb, resource])
            .output()
            .expect("run kubectl");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(can_i("list", "configmaps"), "yes");
    assert_eq!(can_i("list", "secrets"), "no");
    assert_eq!(can_i("delete", "configmaps"), "no");

    // The audit log names the account, its verb and the denial.
    let audit = cluster
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stand_in_node_is_ready_and_holds_its_lease() {
    let cluster = shared().await.expect("the shared control plane");
    let node = NodeAgent::start(cluster, "lease-node")
        .await
        .expect("stand-in node");
    let leases: Api<Lease> = Api::namespaced(cluster.client().expect("client"), "kube-node-lease");
    let lease = leases.get(node.name()).await.expect("the node's Lease");
    let spec = lease.spec.expect("lease spec");
    assert_eq!(spec.holder_identity.as_deref(), Some("lease-node"));
    assert_eq!(spec.lease_duration_seconds, Some(40));
    assert!(spec.renew_time.is_some());
    let owner = &lease.metadata.owner_references.expect("owned by the Node")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Node", "lease-node")
    );
    assert!(NodeAgent::start(cluster, "Bad_Name").await.is_err());

    // The agent acts as system:node:lease-node: it may not create another Node, nor list secrets.
    let as_node = kube::Client::try_from(cluster.node_config("lease-node").expect("node config"))
        .expect("node client");
    let other: k8s_openapi::api::core::v1::Node =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "other-node"}})).unwrap();
    match Api::<k8s_openapi::api::core::v1::Node>::all(as_node.clone())
        .create(&PostParams::default(), &other)
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{s:?}"),
        other => panic!("a node created another Node: {other:?}"),
    }
    match Api::<Secret>::all(as_node)
        .list(&ListParams::default())
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{s:?}"),
        other => panic!("a node listed every secret: {other:?}"),
    }
}

/// One body, held against both servers through `KubeApi`.
async fn namespaces_are_listed(api: &impl KubeApi) -> Vec<String> {
    let client = api.kube_client().expect("client");
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client)
        .list(&ListParams::default())
        .await
        .expect("list namespaces")
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_test_body_runs_against_either_server() {
    let real = shared().await.expect("the shared control plane");
    assert!(real.server_url().starts_with("https://127.0.0.1:"));
    let names = namespaces_are_listed(real).await;
    assert!(names.iter().any(|n| n == "kube-system"), "{names:?}");

    // The built helm reaches the real control plane, with its state inside the state directory.
    let helm = real
        .helm()
        .args(["list", "-A", "-o", "json"])
        .output()
        .expect("run helm");
    assert!(
        helm.status.success(),
        "{}",
        String::from_utf8_lossy(&helm.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&helm.stdout).trim(), "[]");

    let fake = TestServer::start(ServerOptions::default())
        .await
        .expect("API test server");
    assert!(fake.server_url().starts_with("http://127.0.0.1:"));
    let names = namespaces_are_listed(&fake).await;
    assert!(names.iter().any(|n| n == "default"), "{names:?}");
    fake.shutdown().await;
}
