//! A node that is taken touches only its own (docs/chart.md#what-a-node-can-do), on real nodes
//! with the chart: the token the kubelet gave node-0's agent pod, read where the kubelet mounted
//! it, is refused by the chart's node policy (403, the policy by name) when it writes node-1's
//! reservation's status, moves that reservation to node-0, or posts an Event about node-1; a token
//! of the same ServiceAccount bound to no pod is refused anything. Then the API server's audit log
//! of the cluster: every write the agents made, in this test and the ones before it on these
//! nodes, was allowed, and each forged one was refused. (Every row of the policy, each way, is
//! proven on the plane: e2e/tests/plane/chart_node_policy.rs.)

use ipkeep_e2e::testkit::{kubectl_ok, realnode};
use serde_json::Value;

/// The user agent of the forged requests, which finds them in the audit log.
const FORGER: &str = "ipkeep-e2e-node-trust";

/// The path where the kubelet mounts a pod's ServiceAccount token, in the agent's container.
const TOKEN_FILE: &str = "token";

/// A forged write: what it tries, its method, path, content type and body, and the text the
/// refusal must hold.
struct Forged {
    what: &'static str,
    method: http::Method,
    path: String,
    content_type: &'static str,
    body: String,
    refusal: String,
}

/// The status of an `http::Request` sent with `token`: `None` when admitted, else (code, message).
async fn send(client: &kube::Client, forged: &Forged) -> Option<(u16, String)> {
    let request = http::Request::builder()
        .method(forged.method.clone())
        .uri(&forged.path)
        .header(http::header::CONTENT_TYPE, forged.content_type)
        .header(http::header::USER_AGENT, FORGER)
        .body(forged.body.clone().into_bytes())
        .unwrap();
    match client.request_text(request).await {
        Ok(_) => None,
        Err(kube::Error::Api(status)) => Some((status.code, status.message)),
        Err(e) => panic!("{}: {e}", forged.what),
    }
}

/// A client of the cluster's API server authenticating with `token`.
fn client_with(c: &ipkeep_e2e::cluster::realnode::Cluster, token: &str) -> kube::Client {
    let mut config = c.plane().config();
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.to_owned().into()),
        ..Default::default()
    };
    kube::Client::try_from(config).unwrap()
}

/// The token the kubelet mounted into `pod`'s container `container`, read inside its node.
fn mounted_token(
    node: &ipkeep_e2e::cluster::realnode::RealNode,
    pod: &k8s_openapi::api::core::v1::Pod,
) -> String {
    let uid = pod.metadata.uid.as_deref().unwrap();
    let spec = pod.spec.as_ref().unwrap();
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| {
            v.projected.as_ref().is_some_and(|p| {
                p.sources
                    .iter()
                    .flatten()
                    .any(|s| s.service_account_token.is_some())
            })
        })
        .expect("the agent pod mounts a ServiceAccount token");
    let path = format!(
        "/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~projected/{}/{TOKEN_FILE}",
        volume.name
    );
    node.exec(&["cat", &path])
        .unwrap_or_else(|e| panic!("read {path}: {}", ipkeep_e2e::error_chain(&e)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_nodes_agent_token_writes_nothing_of_another_node() {
    let _nodes = realnode::use_real_nodes().await;
    let (sys, c) = realnode::system("node-trust").await;
    let (node0, node1) = (sys.node_name(0).to_owned(), sys.node_name(1).to_owned());
    let audit_log = c
        .plane()
        .audit_log_path()
        .expect("the real nodes' control plane writes an audit log")
        .to_path_buf();

    // A reservation of node-1's: a retained pod placed there.
    let pods = sys.run_retained("trust", 1, &node1).await;
    let web = &pods["trust-0"];
    let ns = &sys.ns;
    let name = &web.name;

    let agent = realnode::agent_pod(c, &node0).await;
    let token = mounted_token(realnode::node(c, &node0), &agent);
    let taken = client_with(c, &token);
    let unbound_token = kubectl_ok(
        c.plane(),
        &[
            "-n",
            realnode::RELEASE_NS,
            "create",
            "token",
            "ipkeep-agent",
        ],
        None,
    );
    let unbound = client_with(c, unbound_token.trim());

    let status = format!("/apis/ipkeep.dev/v1alpha1/namespaces/{ns}/ipreservations/{name}/status");
    let condition = r#"{"type":"Unprotected","status":"True","reason":"NotInCharge","message":"forged","lastTransitionTime":"2026-11-29T00:00:00Z"}"#;
    let event = |about: &str| {
        serde_json::json!({
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"generateName": "forged-", "namespace": "default"},
            "eventTime": "2026-11-29T00:00:00.000000Z",
            "reportingController": "ipkeep.dev/agent",
            "reportingInstance": node0,
            "action": "CheckInCharge",
            "reason": "NotInCharge",
            "type": "Warning",
            "note": "forged",
            "regarding": {"kind": "Node", "apiVersion": "v1", "name": about},
        })
        .to_string()
    };
    let policy = "ValidatingAdmissionPolicy 'ipkeep-agent-node' with binding 'ipkeep-agent-node' denied request";
    let merge = "application/merge-patch+json";
    let forged_by_node0 = [
        Forged {
            what: "node-1's reservation's status",
            method: http::Method::PATCH,
            path: status.clone(),
            content_type: merge,
            body: format!(r#"{{"status":{{"conditions":[{condition}]}}}}"#),
            refusal: format!("the reservation is on node {node1}"),
        },
        Forged {
            what: "node-1's reservation moved to node-0",
            method: http::Method::PATCH,
            path: status.clone(),
            content_type: merge,
            body: format!(
                r#"{{"spec":{{"nodeName":"{node0}"}},"status":{{"conditions":[{condition}]}}}}"#
            ),
            refusal: format!("the reservation is on node {node1}"),
        },
        Forged {
            what: "an Event about node-1",
            method: http::Method::POST,
            path: "/apis/events.k8s.io/v1/namespaces/default/events".to_owned(),
            content_type: "application/json",
            body: event(&node1),
            refusal: format!("about Node {node1} reported as {node0}"),
        },
    ];
    let forged_unbound = Forged {
        what: "an Event about node-0 with a token bound to no pod",
        method: http::Method::POST,
        path: "/apis/events.k8s.io/v1/namespaces/default/events".to_owned(),
        content_type: "application/json",
        body: event(&node0),
        refusal: "its token names no node".to_owned(),
    };
    let mut failures = Vec::new();
    let tries = forged_by_node0
        .iter()
        .map(|f| (&taken, f))
        .chain([(&unbound, &forged_unbound)]);
    for (client, forged) in tries {
        match send(client, forged).await {
            Some((403, message))
                if message.contains(policy) && message.contains(&forged.refusal) => {}
            other => failures.push(format!(
                "{}: want 403 from the policy ({}), got {other:?}",
                forged.what, forged.refusal
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let kept = kubectl_ok(
        c.plane(),
        &[
            "get",
            "ipreservation",
            name,
            "-n",
            ns,
            "-o",
            "jsonpath={.spec.nodeName}",
        ],
        None,
    );
    assert_eq!(kept, node1, "the reservation moved");

    // The audit log: each write of the agents' ServiceAccount, who sent it and what it got.
    let account = format!(
        "system:serviceaccount:{}:ipkeep-agent",
        realnode::RELEASE_NS
    );
    let text = std::fs::read_to_string(&audit_log).unwrap();
    let (mut allowed, mut refused_forged, mut refused_real) = (0, 0, Vec::new());
    for line in text.lines() {
        let entry: Value = serde_json::from_str(line).unwrap();
        if entry["stage"] != "ResponseComplete"
            || entry["user"]["username"] != account.as_str()
            || !["create", "update", "patch", "delete"]
                .contains(&entry["verb"].as_str().unwrap_or(""))
        {
            continue;
        }
        let code = entry["responseStatus"]["code"].as_u64().unwrap_or(0);
        let forged = entry["userAgent"] == FORGER;
        match (forged, code) {
            (true, 403) => refused_forged += 1,
            (true, _) => panic!("a forged write was not refused: {line}"),
            (false, 403) => refused_real.push(line.to_owned()),
            (false, _) => allowed += 1,
        }
    }
    eprintln!(
        "node_trust: the agents' writes in the audit log: {allowed} allowed, {} refused; {refused_forged} forged, refused",
        refused_real.len()
    );
    assert!(
        refused_real.is_empty(),
        "the policy refused the agents' own writes:\n{}",
        refused_real.join("\n")
    );
    assert!(
        allowed > 0,
        "no write of the agents in the audit log: the check above proved nothing"
    );
    assert_eq!(refused_forged, 4, "each forged write once in the audit log");
}
