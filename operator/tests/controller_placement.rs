//! Placement, rule by rule: which pods get a node affinity term for their reservation's node,
//! which term, what the webhook records, and the admission review it answers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use ipkeep_operator::{
    api::IPReservation,
    controller::{
        cache::CachedReservation,
        placement::{self, Decision, PodScheduling, Request, decide, term_matches},
        webhook::{self, Caches},
    },
    rules::{
        optin::{Mode, Retain},
        placement::{NodeFacts, PLACED, Placed},
    },
};
use k8s_openapi::api::{
    apps::v1::StatefulSet,
    core::v1::{Affinity, Node, NodeSelectorTerm},
};
use kube::{
    core::PartialObjectMeta,
    runtime::{reflector, watcher},
};
use serde_json::{Value, json};

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn affinity(v: Value) -> Affinity {
    serde_json::from_value(v).expect("an Affinity")
}

fn term(v: Value) -> NodeSelectorTerm {
    serde_json::from_value(v).expect("a NodeSelectorTerm")
}

fn request<'a>(
    node_labels: &'a BTreeMap<String, String>,
    pod: PodScheduling<'a>,
    mode: Mode,
) -> Request<'a> {
    Request {
        retain: Retain::Yes,
        mode,
        reservation_node: Some("node-1"),
        reservation_by_hand: false,
        node: Some(NodeFacts {
            name: "node-1",
            labels: node_labels,
        }),
        pod,
    }
}

#[test]
fn modes_parse_as_written_and_the_record_reads_back() {
    for (text, want) in [
        ("preferred", Some(Mode::Preferred)),
        ("Required", Some(Mode::Required)),
        (" none ", Some(Mode::None)),
        ("always", None),
        ("", None),
    ] {
        assert_eq!(Mode::parse(text), want, "{text:?}");
    }
    for placed in [
        Placed::On {
            mode: Mode::Preferred,
            node: "node-1".into(),
        },
        Placed::On {
            mode: Mode::Required,
            node: "n".into(),
        },
        Placed::Skipped("node node-1 no longer exists".into()),
    ] {
        assert_eq!(Placed::parse(Some(&placed.to_string())), placed);
    }
    assert_eq!(Placed::parse(None), Placed::Unseen);
    assert!(matches!(
        Placed::parse(Some("none node-1")),
        Placed::Skipped(_)
    ));
}

#[test]
fn node_selector_terms_match_as_the_scheduler_reads_them() {
    let node_labels = labels(&[
        ("zone", "a"),
        ("gen", "5"),
        ("kubernetes.io/hostname", "host-1"),
    ]);
    let node = NodeFacts {
        name: "node-1",
        labels: &node_labels,
    };
    let cases = [
        (
            json!({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}),
            true,
        ),
        (
            json!({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}),
            false,
        ),
        (
            json!({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["b"]}]}),
            true,
        ),
        (
            json!({"matchExpressions": [{"key": "absent", "operator": "NotIn", "values": ["b"]}]}),
            true,
        ),
        (
            json!({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}),
            true,
        ),
        (
            json!({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}),
            false,
        ),
        (
            json!({"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["4"]}]}),
            true,
        ),
        (
            json!({"matchExpressions": [{"key": "gen", "operator": "Lt", "values": ["4"]}]}),
            false,
        ),
        (
            json!({"matchExpressions": [{"key": "zone", "operator": "Gt", "values": ["4"]}]}),
            false,
        ),
        (
            json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}),
            true,
        ),
        (
            json!({"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-1"]}]}),
            false,
        ),
        // Requirements in one term are ANDed.
        (
            json!({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}],
                "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-2"]}]}),
            false,
        ),
        // An empty term selects nothing.
        (json!({}), false),
        (json!({"matchExpressions": []}), false),
    ];
    for (t, want) in cases {
        assert_eq!(term_matches(&term(t.clone()), &node), want, "{t}");
    }
}

#[test]
fn who_gets_what() {
    let node_labels = labels(&[("zone", "a")]);
    let no_constraints = PodScheduling::default();
    let cases: Vec<(&str, Request<'_>, &str)> = vec![
        (
            "preferred by default",
            request(&node_labels, no_constraints, Mode::Preferred),
            "preferred",
        ),
        (
            "required when asked",
            request(&node_labels, no_constraints, Mode::Required),
            "required",
        ),
        (
            "none when asked",
            request(&node_labels, no_constraints, Mode::None),
            "pass",
        ),
        (
            "not opted in",
            Request {
                retain: Retain::No,
                ..request(&node_labels, no_constraints, Mode::Preferred)
            },
            "pass",
        ),
        (
            "a hand-made reservation opts its pod in",
            Request {
                retain: Retain::No,
                reservation_by_hand: true,
                ..request(&node_labels, no_constraints, Mode::Preferred)
            },
            "preferred",
        ),
        (
            "no reservation: a first pod",
            Request {
                reservation_node: None,
                ..request(&node_labels, no_constraints, Mode::Preferred)
            },
            "pass",
        ),
        (
            "the reservation's node is gone",
            Request {
                node: None,
                ..request(&node_labels, no_constraints, Mode::Required)
            },
            "skip: no longer exists",
        ),
        (
            "already bound to that node",
            request(
                &node_labels,
                PodScheduling {
                    node_name: Some("node-1"),
                    ..no_constraints
                },
                Mode::Required,
            ),
            "pass",
        ),
        (
            "bound to another node",
            request(
                &node_labels,
                PodScheduling {
                    node_name: Some("node-2"),
                    ..no_constraints
                },
                Mode::Preferred,
            ),
            "skip: spec.nodeName",
        ),
    ];
    for (name, req, want) in cases {
        let got = match decide(&req) {
            Decision::Pass => "pass".to_string(),
            Decision::Place { mode, node, .. } => {
                assert_eq!(node, "node-1", "{name}");
                mode.to_string()
            }
            Decision::Skip(why) => format!("skip: {why}"),
        };
        let want_prefix = want.split(": ").next().unwrap_or(want);
        assert!(
            got.starts_with(want_prefix),
            "{name}: got {got:?}, want {want:?}"
        );
        if let Some(fragment) = want.strip_prefix("skip: ") {
            assert!(
                got.contains(fragment),
                "{name}: {got:?} should say {fragment:?}"
            );
        }
    }
}

#[test]
fn the_pods_own_constraints_are_kept_and_one_that_excludes_the_node_gets_nothing() {
    let node_labels = labels(&[("zone", "a")]);
    // Excluded by its own nodeSelector or required affinity: nothing added, and why.
    let selector = labels(&[("zone", "b")]);
    let by_selector = PodScheduling {
        node_selector: Some(&selector),
        ..PodScheduling::default()
    };
    let Decision::Skip(why) = decide(&request(&node_labels, by_selector, Mode::Preferred)) else {
        panic!("a nodeSelector excluding the node must skip");
    };
    assert!(why.contains("nodeSelector"), "{why}");
    let excluding = affinity(
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}}}),
    );
    let by_affinity = PodScheduling {
        affinity: Some(&excluding),
        ..PodScheduling::default()
    };
    let Decision::Skip(why) = decide(&request(&node_labels, by_affinity, Mode::Required)) else {
        panic!("a required affinity excluding the node must skip");
    };
    assert!(why.contains("required node affinity"), "{why}");

    // Admitting: preferred appends a weight-100 term beside the pod's own; everything else kept.
    let own = affinity(json!({
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["c"]}]},
                {}
            ]},
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 5, "preference": {"matchExpressions": [{"key": "disk", "operator": "Exists"}]}}
            ]
        },
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}
        ]}
    }));
    let with_own = PodScheduling {
        affinity: Some(&own),
        ..PodScheduling::default()
    };
    let name_term =
        json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]});
    let Decision::Place { affinity: got, .. } =
        decide(&request(&node_labels, with_own, Mode::Preferred))
    else {
        panic!("must place");
    };
    let got = serde_json::to_value(&got).unwrap();
    let mut want = serde_json::to_value(&own).unwrap();
    want["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        .as_array_mut()
        .unwrap()
        .push(json!({"weight": placement::PREFERRED_WEIGHT, "preference": name_term}));
    assert_eq!(
        got, want,
        "preferred: one term appended, the rest as it was"
    );

    // Required narrows every term that can match (ANDed), leaves an empty term empty.
    let Decision::Place { affinity: got, .. } =
        decide(&request(&node_labels, with_own, Mode::Required))
    else {
        panic!("must place");
    };
    let terms = serde_json::to_value(&got).unwrap()["nodeAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        .clone();
    assert_eq!(
        terms,
        json!([
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}],
             "matchFields": name_term["matchFields"]},
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["c"]}],
             "matchFields": name_term["matchFields"]},
            {}
        ])
    );
    // Without terms of its own, required is exactly one term for the node.
    let Decision::Place { affinity: got, .. } = decide(&request(
        &node_labels,
        PodScheduling::default(),
        Mode::Required,
    )) else {
        panic!("must place");
    };
    assert_eq!(
        serde_json::to_value(&got).unwrap(),
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [name_term]}}})
    );
}

#[test]
fn the_patch_sets_the_affinity_and_records_what_was_done() {
    let node_labels = labels(&[]);
    let d = decide(&request(
        &node_labels,
        PodScheduling::default(),
        Mode::Preferred,
    ));
    let with = placement::patch(&d, true);
    assert_eq!(with.len(), 2);
    assert_eq!(with[0]["path"], "/spec/affinity");
    assert_eq!(
        with[1],
        json!({"op": "add", "path": "/metadata/annotations/ipkeep.dev~1placed", "value": "preferred node-1"})
    );
    let without = placement::patch(&d, false);
    assert_eq!(
        without[1],
        json!({"op": "add", "path": "/metadata/annotations", "value": {PLACED: "preferred node-1"}})
    );
    let skip = Decision::Skip("why".into());
    assert_eq!(
        placement::patch(&skip, true).len(),
        1,
        "a skip is recorded, no affinity"
    );
    assert!(placement::patch(&Decision::Pass, true).is_empty());
}

/// Caches filled as the controller's watches fill them.
fn caches(reservations: &[Value], statefulsets: &[Value], nodes: &[Value]) -> Caches {
    /// As a watch fills it: each object through `project`, as the controller's watch does.
    fn fill<K, C>(objects: &[Value], project: impl Fn(K) -> C) -> reflector::Store<C>
    where
        K: serde::de::DeserializeOwned,
        C: reflector::Lookup + Clone + 'static,
        C::DynamicType: Default + Eq + std::hash::Hash + Clone,
    {
        let (store, mut writer) = reflector::store::<C>();
        writer.apply_watcher_event(&watcher::Event::Init);
        for o in objects {
            writer.apply_watcher_event(&watcher::Event::InitApply(project(
                serde_json::from_value(o.clone()).expect("an object"),
            )));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        store
    }
    Caches {
        reservations: fill(reservations, |r: IPReservation| {
            CachedReservation::project(&r)
        }),
        statefulsets: fill(statefulsets, |s: PartialObjectMeta<StatefulSet>| s),
        nodes: fill(nodes, |n: Node| n),
        default_mode: Mode::Preferred,
    }
}

/// An AdmissionReview as kube-apiserver sends it for a pod CREATE (name set, no uid yet).
fn admission(pod: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": pod["metadata"]["name"].as_str().unwrap_or(""),
            "namespace": "apps",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:statefulset-controller"},
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    }))
    .unwrap()
}

fn sts_pod(name: &str, annotations: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": "apps", "annotations": annotations,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db",
                                 "uid": "u-sts", "controller": true}]
        },
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    })
}

fn reservation(name: &str, node: &str) -> Value {
    json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "IPReservation",
        "metadata": {"name": name, "namespace": "apps", "uid": format!("u-{name}"),
                     "labels": {"app.kubernetes.io/managed-by": "ipkeep"}},
        "spec": {"ips": ["10.244.1.7"], "nodeName": node}
    })
}

fn node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"zone": "a"}}})
}

/// The response's JSON patch, decoded (none: empty).
fn answered_patch(
    review: &kube::core::admission::AdmissionReview<kube::core::DynamicObject>,
) -> Vec<Value> {
    let response = review.response.as_ref().expect("a response");
    assert!(response.allowed, "the webhook never refuses a pod");
    response
        .patch
        .as_ref()
        .map(|p| serde_json::from_slice(p).expect("a JSON patch"))
        .unwrap_or_default()
}

#[test]
fn the_webhook_answers_a_review_from_its_caches() {
    let caches = caches(
        &[
            reservation("db-0", "node-1"),
            reservation("db-1", "node-gone"),
        ],
        &[json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
                  "metadata": {"name": "db", "namespace": "apps",
                               "annotations": {"ipkeep.dev/retain": "true"}}})],
        &[node("node-1")],
    );
    // Opted in through its StatefulSet, with a reservation on node-1: a preferred term.
    let (review, result) = webhook::review(&admission(sts_pod("db-0", json!({}))), &caches);
    assert_eq!(result, "preferred");
    let patch = answered_patch(&review);
    assert_eq!(
        patch[0]["value"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["preference"]
            ["matchFields"][0]["values"],
        json!(["node-1"])
    );
    assert_eq!(
        review.response.as_ref().unwrap().uid,
        "705ab4f5-6393-11e8-b7cc-42010a800002"
    );

    // The pod's own annotation wins: required.
    let (_, result) = webhook::review(
        &admission(sts_pod("db-0", json!({"ipkeep.dev/placement": "required"}))),
        &caches,
    );
    assert_eq!(result, "required");
    // Its reservation's node is gone: recorded as skipped, no affinity.
    let (review, result) = webhook::review(&admission(sts_pod("db-1", json!({}))), &caches);
    assert_eq!(result, "skipped");
    let patch = answered_patch(&review);
    assert_eq!(patch.len(), 1);
    assert_eq!(patch[0]["path"], "/metadata/annotations/ipkeep.dev~1placed");
    assert!(
        patch[0]["value"]
            .as_str()
            .unwrap()
            .contains("no longer exists"),
        "{patch:?}"
    );
    // No reservation (a first pod), or a generated name: nothing.
    let (review, result) = webhook::review(&admission(sts_pod("db-2", json!({}))), &caches);
    assert_eq!((result, answered_patch(&review).len()), ("pass", 0));
    let mut generated = sts_pod("", json!({}));
    generated["metadata"]["generateName"] = json!("db-");
    let (_, result) = webhook::review(&admission(generated), &caches);
    assert_eq!(result, "pass");
    // Garbage is answered "invalid", never a crash.
    let (review, result) = webhook::review(b"{not json", &caches);
    assert_eq!(result, "error");
    assert!(!review.response.unwrap().allowed);
}

/// Sends `body` to the webhook at `addr` over TLS as the API server would (trusting `ca`, naming
/// the Service), and returns the served certificate and the response's JSON body.
async fn post_review(addr: std::net::SocketAddr, ca: &str, body: &[u8]) -> (Vec<u8>, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::{
        TlsConnector,
        rustls::{
            ClientConfig, RootCertStore,
            pki_types::{CertificateDer, ServerName, pem::PemObject},
        },
    };
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let config = ClientConfig::builder_with_provider(std::sync::Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("ipkeep-webhook.ipkeep-system.svc").unwrap();
    let mut tls = TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("the TLS handshake with the webhook");
    let served = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: ipkeep-webhook.ipkeep-system.svc\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        webhook::PATH,
        body.len()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.write_all(body).await.unwrap();
    let mut response = Vec::new();
    let _ = tls.read_to_end(&mut response).await;
    let text = String::from_utf8_lossy(&response);
    let (status, json) = text.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    (
        served,
        serde_json::from_str(json).expect("a JSON AdmissionReview"),
    )
}

#[tokio::test]
async fn the_webhook_serves_reviews_over_tls_and_takes_a_renewed_certificate_without_a_restart() {
    use ipkeep_operator::controller::webhook_tls::{
        Lifetimes, Renewal, TlsSource, certified_key, issue, keep, service_dns_names,
    };
    let names = service_dns_names("ipkeep-webhook", "ipkeep-system");
    let now = jiff::Timestamp::now();
    let life = Lifetimes::standard();
    let first = issue(Renewal::Fresh, &BTreeMap::new(), None, &names, now, &life).unwrap();
    // Served from files, as with cert-manager's Secret mounted (`--webhook-cert-dir`).
    let tmp = tempfile::Builder::new()
        .prefix("ipkeep-webhook-serve-")
        .tempdir()
        .unwrap();
    let dir = tmp.path().to_path_buf();
    std::fs::write(dir.join("tls.crt"), &first.cert).unwrap();
    std::fs::write(dir.join("tls.key"), &first.key).unwrap();
    let slot = std::sync::Arc::new(webhook::CertSlot::default());
    let server = webhook::WebhookServer::bind("127.0.0.1:0".parse().unwrap(), slot.clone())
        .await
        .unwrap();
    let addr = server.local_addr().unwrap();
    let registry = prometheus::Registry::new();
    let metrics = webhook::WebhookMetrics::register(&registry).unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let stopped = async move {
        let _ = stop_rx.await;
    };
    let caches = caches(&[reservation("db-0", "node-1")], &[], &[node("node-1")]);
    let serving = tokio::spawn(server.run(caches, metrics.clone(), stopped));
    // A client that cannot build a connection: the files need none.
    let client =
        kube::Client::try_from(kube::Config::new("https://127.0.0.1:1".parse().unwrap())).unwrap();
    let loader = tokio::spawn(keep(
        client,
        TlsSource::Files(dir.clone()),
        slot.clone(),
        std::future::pending(),
    ));
    for _ in 0..200 {
        if slot.is_loaded() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(slot.is_loaded(), "the certificate files were not loaded");

    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "db-0", "namespace": "apps", "annotations": {"ipkeep.dev/retain": "true"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    });
    let (served, review) = post_review(addr, &first.ca_bundle, &admission(pod.clone())).await;
    assert_eq!(review["kind"], "AdmissionReview");
    assert_eq!(review["response"]["allowed"], true);
    assert_eq!(review["response"]["patchType"], "JSONPatch");
    assert_eq!(served, first_der(&first.cert));

    // A renewed serving certificate is swapped in: the next connection gets it, no restart.
    let renewed = issue(
        Renewal::Serving,
        &[
            ("tls.crt", &first.cert),
            ("tls.key", &first.key),
            ("ca.crt", &first.ca_bundle),
            ("ca.key", &first.ca_key),
        ]
        .into_iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                k8s_openapi::ByteString(v.clone().into_bytes()),
            )
        })
        .collect(),
        Some(first.ca_not_after),
        &names,
        now,
        &life,
    )
    .unwrap();
    slot.set(certified_key(renewed.cert.as_bytes(), renewed.key.as_bytes()).unwrap());
    let (served, review) = post_review(addr, &first.ca_bundle, &admission(pod)).await;
    assert_eq!(
        served,
        first_der(&renewed.cert),
        "the renewed certificate is served"
    );
    assert_eq!(review["response"]["allowed"], true);
    assert_eq!(
        metrics.admissions.with_label_values(&["preferred"]).get(),
        2,
        "both reviews counted"
    );
    loader.abort();
    let _ = stop_tx.send(());
    serving.await.unwrap();
}

/// The DER of the first certificate of a PEM chain.
fn first_der(pem: &str) -> Vec<u8> {
    use tokio_rustls::rustls::pki_types::{CertificateDer, pem::PemObject};
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .unwrap()
        .unwrap()
        .to_vec()
}
