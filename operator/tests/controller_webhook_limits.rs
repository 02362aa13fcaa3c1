//! The placement webhook's limits against a client on the pod network, each proven on the real
//! server over a real socket on 127.0.0.1: a slow or idle client is dropped, an oversized body is
//! refused before it is read, connections beyond the cap wait unserved, and only TLS 1.2 and 1.3
//! are spoken. Short limits ([`WebhookServer::bind_with`]) keep the waits short; every wait has a
//! deadline and says what it waited for.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{collections::BTreeMap, net::SocketAddr, sync::Arc, time::Duration};

use hyper::{HeaderMap, StatusCode, header::CONTENT_LENGTH};
use ipkeep_operator::{
    controller::{
        cache::CachedReservation,
        webhook::{self, Caches, CertSlot, Limits, WebhookMetrics, WebhookServer},
        webhook_tls::{Lifetimes, Renewal, certified_key, issue, service_dns_names},
    },
    rules::optin::Mode,
};
use k8s_openapi::api::{apps::v1::StatefulSet, core::v1::Node};
use kube::{core::PartialObjectMeta, runtime::reflector};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};
use tokio_rustls::{
    TlsConnector,
    client::TlsStream,
    rustls::{
        ClientConfig, RootCertStore, SupportedProtocolVersion,
        pki_types::{CertificateDer, ServerName, pem::PemObject},
        version,
    },
};

/// How long any wait in these tests may take before it fails, saying what it waited for: far
/// beyond the short limits the servers run with, so only a missing limit reaches it.
const DEADLINE: Duration = Duration::from_secs(20);
const HOST: &str = "ipkeep-webhook.ipkeep-system.svc";

/// A webhook served on 127.0.0.1 with `limits`, stopped when dropped.
struct Served {
    addr: SocketAddr,
    ca: String,
    metrics: WebhookMetrics,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn serve(limits: Limits) -> Served {
    let names = service_dns_names("ipkeep-webhook", "ipkeep-system");
    let material = issue(
        Renewal::Fresh,
        &BTreeMap::new(),
        None,
        &names,
        jiff::Timestamp::now(),
        &Lifetimes::standard(),
    )
    .unwrap();
    let slot = Arc::new(CertSlot::default());
    slot.set(certified_key(material.cert.as_bytes(), material.key.as_bytes()).unwrap());
    let server = WebhookServer::bind_with("127.0.0.1:0".parse().unwrap(), slot, limits)
        .await
        .unwrap();
    let addr = server.local_addr().unwrap();
    let metrics = WebhookMetrics::register(&prometheus::Registry::new()).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(empty_caches(), metrics.clone(), async move {
        let _ = stopped.await;
    }));
    Served {
        addr,
        ca: material.ca_bundle,
        metrics,
        _stop: stop,
    }
}

fn empty_caches() -> Caches {
    Caches {
        reservations: reflector::store::<CachedReservation>().0,
        statefulsets: reflector::store::<PartialObjectMeta<StatefulSet>>().0,
        nodes: reflector::store::<Node>().0,
        default_mode: Mode::Preferred,
    }
}

/// Limits short enough to wait out in a test.
fn short() -> Limits {
    Limits {
        head_timeout: Duration::from_millis(300),
        request_deadline: Duration::from_secs(5),
        max_connections: 64,
        max_reviews_in_flight: 4,
        max_body: 64 * 1024,
        max_head: 16 * 1024,
    }
}

fn client_config(ca: &str, versions: &[&'static SupportedProtocolVersion]) -> ClientConfig {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    ClientConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(versions)
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth()
}

async fn connect_with(
    addr: SocketAddr,
    config: ClientConfig,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(HOST).unwrap(), tcp)
        .await
}

async fn connect(served: &Served) -> TlsStream<TcpStream> {
    connect_with(
        served.addr,
        client_config(&served.ca, &[&version::TLS13, &version::TLS12]),
    )
    .await
    .expect("the TLS handshake with the webhook")
}

/// Reads until the server closes the connection (EOF or reset), failing after [`DEADLINE`];
/// returns what was read.
async fn until_closed(stream: &mut (impl AsyncRead + Unpin), what: &str) -> Vec<u8> {
    let mut read = Vec::new();
    match tokio::time::timeout(DEADLINE, stream.read_to_end(&mut read)).await {
        Ok(_) => read,
        Err(_) => panic!("{what}: the webhook still held the connection after {DEADLINE:?}"),
    }
}

/// Reads one HTTP response (head and a `Content-Length` body), failing after [`DEADLINE`].
async fn one_response(stream: &mut (impl AsyncRead + Unpin), what: &str) -> (String, Vec<u8>) {
    let read = async {
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        while !buf.ends_with(b"\r\n\r\n") {
            if stream.read(&mut byte).await? == 0 {
                return Err(std::io::Error::other(format!(
                    "closed after {:?}",
                    String::from_utf8_lossy(&buf)
                )));
            }
            buf.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&buf).into_owned();
        let length = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse::<usize>().ok())?
            })
            .unwrap_or(0);
        let mut body = vec![0u8; length];
        stream.read_exact(&mut body).await?;
        Ok((head, body))
    };
    match tokio::time::timeout(DEADLINE, read).await {
        Ok(Ok(response)) => response,
        Ok(Err(e)) => panic!("{what}: no response: {e}"),
        Err(_) => panic!("{what}: no response within {DEADLINE:?}"),
    }
}

/// A pod CREATE review, as kube-apiserver sends it.
fn review() -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "r-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "db-0", "namespace": "apps", "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:statefulset-controller"},
            "object": {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "db-0", "namespace": "apps"},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
            "dryRun": false
        }
    }))
    .unwrap()
}

fn post_head(extra: &str) -> String {
    format!(
        "POST {} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n{extra}\r\n",
        webhook::PATH
    )
}

#[test]
fn a_declared_length_is_read_only_within_the_cap() {
    let cases: [(Option<&str>, Result<(), StatusCode>); 6] = [
        (None, Ok(())),
        (Some("0"), Ok(())),
        (Some("1024"), Ok(())),
        (Some("1025"), Err(StatusCode::PAYLOAD_TOO_LARGE)),
        (Some("99999999999999999999"), Err(StatusCode::BAD_REQUEST)),
        (Some("twelve"), Err(StatusCode::BAD_REQUEST)),
    ];
    for (declared, want) in cases {
        let mut headers = HeaderMap::new();
        if let Some(d) = declared {
            headers.insert(CONTENT_LENGTH, d.parse().unwrap());
        }
        assert_eq!(
            webhook::declared_length(&headers, 1024),
            want,
            "Content-Length {declared:?}"
        );
    }
}

#[test]
fn the_standard_limits_fit_what_the_api_server_sends_and_waits_for() {
    let l = Limits::STANDARD;
    // The API server's own request body cap (3 MiB) bounds any pod in a review.
    assert_eq!(l.max_body, 3 * 1024 * 1024);
    // It waits at most 30 s (timeoutSeconds' maximum): a longer deadline answers nobody.
    assert!(l.request_deadline <= Duration::from_secs(30));
    assert!(l.head_timeout < l.request_deadline);
    // Issue 44: 1 000 slow connections held must still leave the API server a slot.
    assert!(l.max_connections > 1000);
    assert!(l.max_reviews_in_flight >= 1 && l.max_reviews_in_flight <= l.max_connections);
}

#[tokio::test]
async fn a_slow_or_idle_client_is_disconnected_after_the_head_timeout() {
    let served = serve(short()).await;

    // Connected, never starting the TLS handshake.
    let mut tcp = TcpStream::connect(served.addr).await.unwrap();
    until_closed(&mut tcp, "no TLS handshake").await;

    // Half a request head, then nothing (slowloris).
    let mut tls = connect(&served).await;
    tls.write_all(
        format!(
            "POST {} HTTP/1.1\r\nHost: {HOST}\r\nContent-Ty",
            webhook::PATH
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    tls.flush().await.unwrap();
    let read = until_closed(&mut tls, "half a head").await;
    assert!(
        !String::from_utf8_lossy(&read).contains(" 200 "),
        "a half head was answered: {}",
        String::from_utf8_lossy(&read)
    );

    // A whole request answered on a kept-alive connection, which then stays idle.
    let mut tls = connect(&served).await;
    let body = review();
    let head = post_head(&format!("Content-Length: {}\r\n", body.len()));
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.write_all(&body).await.unwrap();
    tls.flush().await.unwrap();
    let (status, answer) = one_response(&mut tls, "a review").await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(answer["response"]["allowed"], true);
    until_closed(&mut tls, "idle after a review").await;

    // Every connection closed is counted as closed.
    wait_for(
        || served.metrics.connections.get() == 0,
        "no connection open",
    )
    .await;
}

#[tokio::test]
async fn a_body_sent_slower_than_the_deadline_gets_408_and_the_connection_closed() {
    let served = serve(Limits {
        request_deadline: Duration::from_millis(300),
        ..short()
    })
    .await;
    let mut tls = connect(&served).await;
    tls.write_all(post_head("Content-Length: 100\r\n").as_bytes())
        .await
        .unwrap();
    tls.write_all(b"{\"apiVersion\"").await.unwrap();
    tls.flush().await.unwrap();
    let (status, _) = one_response(&mut tls, "a body that stalls").await;
    assert!(status.starts_with("HTTP/1.1 408"), "{status}");
    until_closed(&mut tls, "after 408").await;
}

#[tokio::test]
async fn an_oversized_body_gets_413_before_the_client_has_sent_it_and_a_long_head_431() {
    let served = serve(short()).await;
    let max = short().max_body;

    // Declared too large: refused from the head alone; the client sends none of the body.
    let mut tls = connect(&served).await;
    tls.write_all(post_head(&format!("Content-Length: {}\r\n", 1u64 << 30)).as_bytes())
        .await
        .unwrap();
    tls.flush().await.unwrap();
    let (status, _) = one_response(&mut tls, "a declared 1 GiB body").await;
    assert!(status.starts_with("HTTP/1.1 413"), "{status}");
    until_closed(&mut tls, "after 413").await;

    // Chunked, no length said: cut off once past the cap, while the client has not finished
    // (the last chunk is never sent), so the server did not wait for, or hold, the whole body.
    let mut tls = connect(&served).await;
    tls.write_all(post_head("Transfer-Encoding: chunked\r\n").as_bytes())
        .await
        .unwrap();
    let chunk = vec![b'x'; 16 * 1024];
    for _ in 0..(max / chunk.len() + 2) {
        tls.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
            .await
            .unwrap();
        tls.write_all(&chunk).await.unwrap();
        tls.write_all(b"\r\n").await.unwrap();
    }
    tls.flush().await.unwrap();
    let (status, text) = one_response(&mut tls, "a chunked body past the cap").await;
    assert!(status.starts_with("HTTP/1.1 413"), "{status}");
    assert!(
        String::from_utf8_lossy(&text).contains(&max.to_string()),
        "the answer names the cap: {}",
        String::from_utf8_lossy(&text)
    );
    assert_eq!(
        served
            .metrics
            .admissions
            .with_label_values(&["error"])
            .get(),
        2,
        "both refusals counted"
    );

    // A head past `max_head`: hyper refuses it (431) without buffering more.
    let mut tls = connect(&served).await;
    let padding = "x".repeat(short().max_head);
    tls.write_all(post_head(&format!("X-Padding: {padding}\r\n")).as_bytes())
        .await
        .unwrap();
    tls.flush().await.unwrap();
    let (status, _) = one_response(&mut tls, "a head past the cap").await;
    assert!(status.starts_with("HTTP/1.1 431"), "{status}");
}

#[tokio::test]
async fn connections_beyond_the_cap_wait_until_one_is_closed() {
    let served = serve(Limits {
        // Held connections must outlive the test's waits.
        head_timeout: Duration::from_secs(60),
        max_connections: 2,
        ..short()
    })
    .await;
    let first = connect(&served).await;
    let _second = connect(&served).await;
    wait_for(
        || served.metrics.connections.get() == 2,
        "two connections open",
    )
    .await;

    // The third is queued by the kernel (its TCP connect succeeds) but never accepted, so its
    // ClientHello goes unanswered while both slots are held.
    let config = client_config(&served.ca, &[&version::TLS13, &version::TLS12]);
    let addr = served.addr;
    let mut third = tokio::spawn(connect_with(addr, config));
    let waited = tokio::time::timeout(Duration::from_millis(500), &mut third).await;
    assert!(
        waited.is_err(),
        "a third connection was served beyond the cap of 2"
    );
    assert_eq!(
        served.metrics.connections.get(),
        2,
        "never more than the cap"
    );

    // A slot freed: the waiting connection is served.
    drop(first);
    let third = tokio::time::timeout(DEADLINE, third)
        .await
        .expect("the third connection served once a slot freed")
        .unwrap();
    assert!(third.is_ok(), "{third:?}");
    assert!(served.metrics.connections.get() <= 2);
}

#[tokio::test]
async fn only_tls_1_2_and_1_3_are_spoken() {
    let served = serve(short()).await;
    for v in [&version::TLS13, &version::TLS12] {
        let tls = connect_with(served.addr, client_config(&served.ca, &[v]))
            .await
            .unwrap_or_else(|e| panic!("{v:?}: {e}"));
        assert_eq!(tls.get_ref().1.protocol_version(), Some(v.version));
    }
    // rustls cannot offer TLS 1.1 or 1.0: ClientHellos by hand. One without
    // `signature_algorithms` (a TLS 1.2 extension; OpenSSL's `s_client -tls1_1` sends none) is
    // refused for lacking it before its version is looked at: handshake_failure (40). One with
    // it reaches the version check: protocol_version (70).
    let cases = [
        ("TLS 1.1", [3u8, 2u8], true, 70u8),
        ("TLS 1.0", [3, 1], true, 70),
        ("TLS 1.1 without signature_algorithms", [3, 2], false, 40),
    ];
    for (name, legacy, signature_algorithms, alert) in cases {
        let mut tcp = TcpStream::connect(served.addr).await.unwrap();
        tcp.write_all(&client_hello(legacy, signature_algorithms))
            .await
            .unwrap();
        let reply = until_closed(&mut tcp, name).await;
        // An alert record (21), fatal (2), and which: never a ServerHello (22).
        assert!(
            reply.len() >= 7 && reply[0] == 21 && reply[5] == 2 && reply[6] == alert,
            "{name}: expected fatal alert {alert}, got {reply:?}"
        );
    }
}

/// A ClientHello of a client that speaks at most `version` (`[3, 2]` is TLS 1.1): no
/// `supported_versions` extension, suites any TLS 1.0 server has, and `signature_algorithms`
/// if asked (some such clients send it; without it rustls refuses the hello before looking at
/// the version).
fn client_hello(version: [u8; 2], signature_algorithms: bool) -> Vec<u8> {
    let mut hello = Vec::new();
    hello.extend_from_slice(&version);
    hello.extend_from_slice(&[7u8; 32]); // random
    hello.push(0); // no session id
    // TLS_RSA_WITH_AES_128_CBC_SHA, TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA,
    // TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA.
    hello.extend_from_slice(&[0, 6, 0x00, 0x2f, 0xc0, 0x13, 0xc0, 0x09]);
    hello.extend_from_slice(&[1, 0]); // compression: null
    // signature_algorithms (13): ecdsa_secp256r1_sha256, rsa_pkcs1_sha256.
    if signature_algorithms {
        let extension = [0u8, 13, 0, 6, 0, 4, 0x04, 0x03, 0x04, 0x01];
        hello.extend_from_slice(&(extension.len() as u16).to_be_bytes());
        hello.extend_from_slice(&extension);
    }
    let mut handshake = vec![1u8]; // ClientHello
    handshake.extend_from_slice(&(hello.len() as u32).to_be_bytes()[1..]);
    handshake.extend_from_slice(&hello);
    let mut record = vec![22u8, 3, 1]; // handshake record, as old clients label it
    record.extend_from_slice(&(handshake.len() as u16).to_be_bytes());
    record.extend_from_slice(&handshake);
    record
}

async fn wait_for(condition: impl Fn() -> bool, what: &str) {
    let waiting = async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    if tokio::time::timeout(DEADLINE, waiting).await.is_err() {
        panic!("waited {DEADLINE:?} for {what}");
    }
}
