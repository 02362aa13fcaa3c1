//! The webhook's certificates without cert-manager: when each is renewed, and that what is issued
//! is what the API server will trust for the Service's names, across a renewal of either.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{collections::BTreeMap, sync::Arc};

use ipkeep_operator::controller::webhook_tls::{
    Lifetimes, Material, Recorded, Renewal, certified_key, issue, renewal, service_dns_names,
};
use jiff::{Timestamp, ToSpan};
use k8s_openapi::ByteString;
use tokio_rustls::rustls::{
    RootCertStore,
    client::WebPkiServerVerifier,
    client::danger::ServerCertVerifier,
    crypto::ring::default_provider,
    pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject},
};

fn t(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn names() -> Vec<String> {
    service_dns_names("ipkeep-webhook", "ipkeep-system")
}

#[test]
fn what_is_renewed_when() {
    let now = t("2027-01-01T00:00:00Z");
    let life = Lifetimes::standard();
    let healthy = Recorded {
        complete: true,
        serving_not_after: Some(t("2027-10-01T00:00:00Z")),
        ca_not_after: Some(t("2036-01-01T00:00:00Z")),
        dns_names: names(),
    };
    let cases = [
        ("healthy", healthy.clone(), Renewal::Keep),
        (
            "empty Secret (as the chart creates it)",
            Recorded::default(),
            Renewal::Fresh,
        ),
        (
            "a key missing",
            Recorded {
                complete: false,
                ..healthy.clone()
            },
            Renewal::Fresh,
        ),
        (
            "no record of the CA",
            Recorded {
                ca_not_after: None,
                ..healthy.clone()
            },
            Renewal::Fresh,
        ),
        (
            "the CA expired",
            Recorded {
                ca_not_after: Some(now),
                ..healthy.clone()
            },
            Renewal::Fresh,
        ),
        (
            "the CA within a year of expiry",
            Recorded {
                ca_not_after: Some(t("2027-12-01T00:00:00Z")),
                ..healthy.clone()
            },
            Renewal::Ca,
        ),
        (
            "serving within 90 days",
            Recorded {
                serving_not_after: Some(t("2027-03-01T00:00:00Z")),
                ..healthy.clone()
            },
            Renewal::Serving,
        ),
        (
            "serving expired",
            Recorded {
                serving_not_after: Some(t("2026-12-01T00:00:00Z")),
                ..healthy.clone()
            },
            Renewal::Serving,
        ),
        (
            "the Service was renamed",
            Recorded {
                dns_names: vec!["other.ipkeep-system.svc".into()],
                ..healthy.clone()
            },
            Renewal::Serving,
        ),
    ];
    for (name, recorded, want) in cases {
        assert_eq!(renewal(&recorded, &names(), now, &life), want, "{name}");
    }
}

fn data(m: &Material) -> BTreeMap<String, ByteString> {
    [
        ("tls.crt", &m.cert),
        ("tls.key", &m.key),
        ("ca.crt", &m.ca_bundle),
        ("ca.key", &m.ca_key),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), ByteString(v.clone().into_bytes())))
    .collect()
}

/// Whether a client trusting `bundle` accepts `cert` for `name` at `at`, as the API server would.
fn trusted(bundle: &str, cert: &str, name: &str, at: Timestamp) -> Result<(), String> {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(bundle.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let verifier =
        WebPkiServerVerifier::builder_with_provider(Arc::new(roots), Arc::new(default_provider()))
            .build()
            .unwrap();
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<_, _>>()
        .unwrap();
    let secs = u64::try_from(at.as_second()).unwrap();
    verifier
        .verify_server_cert(
            &chain[0],
            &chain[1..],
            &ServerName::try_from(name.to_string()).unwrap(),
            &[],
            UnixTime::since_unix_epoch(std::time::Duration::from_secs(secs)),
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[test]
fn issued_certificates_are_trusted_for_the_service_across_renewals() {
    let life = Lifetimes::standard();
    let now = t("2027-01-01T12:00:00Z");
    let first = issue(Renewal::Fresh, &BTreeMap::new(), None, &names(), now, &life).unwrap();
    let svc = "ipkeep-webhook.ipkeep-system.svc";
    trusted(&first.ca_bundle, &first.cert, svc, now).unwrap();
    trusted(
        &first.ca_bundle,
        &first.cert,
        "ipkeep-webhook.ipkeep-system.svc.cluster.local",
        now,
    )
    .unwrap();
    assert!(trusted(&first.ca_bundle, &first.cert, "evil.example", now).is_err());
    assert_eq!(
        first.serving_not_after,
        t("2028-01-01T00:00:00Z"),
        "whole days"
    );
    certified_key(first.cert.as_bytes(), first.key.as_bytes()).expect("rustls loads it");

    // A serving renewal keeps the CA: the bundle the API server holds still trusts both the new
    // certificate and the one a replica that has not reloaded yet still serves.
    let later = now.checked_add((300 * 24).hours()).unwrap();
    let serving = issue(
        Renewal::Serving,
        &data(&first),
        Some(first.ca_not_after),
        &names(),
        later,
        &life,
    )
    .unwrap();
    assert_eq!(serving.ca_bundle, first.ca_bundle);
    assert_eq!(serving.ca_not_after, first.ca_not_after);
    assert_ne!(serving.cert, first.cert);
    trusted(&first.ca_bundle, &serving.cert, svc, later).unwrap();

    // A CA renewal puts the new CA beside the old one: old and new serving certificates verify.
    let ca = issue(
        Renewal::Ca,
        &data(&serving),
        Some(serving.ca_not_after),
        &names(),
        later,
        &life,
    )
    .unwrap();
    assert_eq!(ca.ca_bundle.matches("BEGIN CERTIFICATE").count(), 2);
    trusted(&ca.ca_bundle, &ca.cert, svc, later).unwrap();
    trusted(&ca.ca_bundle, &serving.cert, svc, later).unwrap();
    // The next CA renewal keeps only the newest previous CA.
    let again = issue(
        Renewal::Ca,
        &data(&ca),
        Some(ca.ca_not_after),
        &names(),
        later,
        &life,
    )
    .unwrap();
    assert_eq!(again.ca_bundle.matches("BEGIN CERTIFICATE").count(), 2);
    trusted(&again.ca_bundle, &ca.cert, svc, later).unwrap();
    assert!(
        trusted(&again.ca_bundle, &first.cert, svc, later).is_err(),
        "the oldest CA is dropped"
    );
}
