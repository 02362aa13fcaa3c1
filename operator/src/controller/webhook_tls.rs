//! The placement webhook's TLS, the way operators do it without cert-manager: the controller keeps
//! a CA and a serving certificate in one Secret the chart creates empty, and the CA in the
//! MutatingWebhookConfiguration's `caBundle`. Every replica runs the same loop: read the Secret,
//! renew what is due (an optimistic-concurrency `replace`, so two replicas racing write once and
//! the loser reads the winner's), serve what the Secret holds, and put the Secret's CAs in the
//! `caBundle` when they differ.
//!
//! Rotation never leaves the webhook unreachable: the CA lives ten years and signs every serving
//! certificate, so renewing a serving certificate changes nothing the API server checks; a renewed
//! CA is added to the bundle beside the old one, which stays until the next CA renewal, so
//! replicas still serving a certificate of the old CA stay trusted.
//!
//! With cert-manager (`--webhook-cert-dir`), the files of its Secret are served and re-read when
//! they change; its CA injector keeps the `caBundle`.

use std::{collections::BTreeMap, path::PathBuf, sync::Arc, time::Duration};

use jiff::{Span, Timestamp, ToSpan};
use k8s_openapi::{
    ByteString,
    api::{admissionregistration::v1::MutatingWebhookConfiguration, core::v1::Secret},
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use tokio_rustls::rustls::{
    crypto::ring::default_provider,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    sign::CertifiedKey,
};

use super::webhook::CertSlot;
use crate::runtime::backoff::Backoff;

/// Secret keys: the serving pair, as `kubernetes.io/tls` and cert-manager name them, the CAs to
/// trust (`ca.crt`, one or two PEM certificates) and the newest CA's key (`ca.key`).
const TLS_CRT: &str = "tls.crt";
const TLS_KEY: &str = "tls.key";
const CA_CRT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
/// Secret annotations recording what the certificates are, so no certificate needs parsing.
pub const SERVING_NOT_AFTER: &str = "ipkeep.dev/serving-not-after";
/// When the newest CA expires.
pub const CA_NOT_AFTER: &str = "ipkeep.dev/ca-not-after";
/// The serving certificate's DNS names, comma-separated.
pub const DNS_NAMES: &str = "ipkeep.dev/dns-names";
/// The CA's common name; a renewed serving certificate is issued under the same name.
const CA_NAME: &str = "ipkeep-webhook-ca";

/// How long certificates live and when they are renewed.
#[derive(Debug, Clone, Copy)]
pub struct Lifetimes {
    /// The CA's validity.
    pub ca: Span,
    /// Renew the CA when less than this is left.
    pub ca_renew_before: Span,
    /// A serving certificate's validity.
    pub serving: Span,
    /// Renew the serving certificate when less than this is left.
    pub serving_renew_before: Span,
}

impl Lifetimes {
    /// Ten years for the CA (renewed with a year left), one year for serving certificates
    /// (renewed with 90 days left).
    pub fn standard() -> Lifetimes {
        // In hours: a Timestamp takes no calendar units (a day is 24 hours here, in UTC).
        Lifetimes {
            ca: (3650 * 24).hours(),
            ca_renew_before: (365 * 24).hours(),
            serving: (365 * 24).hours(),
            serving_renew_before: (90 * 24).hours(),
        }
    }
}

/// What the Secret holds, as the renewal rule reads it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Recorded {
    /// All four keys are present.
    pub complete: bool,
    /// [`SERVING_NOT_AFTER`].
    pub serving_not_after: Option<Timestamp>,
    /// [`CA_NOT_AFTER`].
    pub ca_not_after: Option<Timestamp>,
    /// [`DNS_NAMES`].
    pub dns_names: Vec<String>,
}

/// What must be renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Nothing.
    Keep,
    /// A new serving certificate from the same CA.
    Serving,
    /// A new CA (added to the bundle beside the old one) and a serving certificate from it.
    Ca,
    /// Nothing usable is there: a new CA alone in the bundle, and a serving certificate.
    Fresh,
}

/// Decides what to renew; `dns_names` are the names the Service is reached by.
pub fn renewal(
    recorded: &Recorded,
    dns_names: &[String],
    now: Timestamp,
    life: &Lifetimes,
) -> Renewal {
    let (Some(ca_until), Some(serving_until)) = (recorded.ca_not_after, recorded.serving_not_after)
    else {
        return Renewal::Fresh;
    };
    if !recorded.complete || ca_until <= now {
        return Renewal::Fresh;
    }
    let due = |until: Timestamp, before: Span| now.checked_add(before).map_or(true, |t| t >= until);
    if due(ca_until, life.ca_renew_before) {
        return Renewal::Ca;
    }
    if due(serving_until, life.serving_renew_before) || recorded.dns_names != dns_names {
        return Renewal::Serving;
    }
    Renewal::Keep
}

/// Errors of keeping the certificate.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// rcgen refused a key or certificate.
    #[error("failed to generate the webhook's {what}")]
    Generate {
        /// Which one.
        what: &'static str,
        /// rcgen's reason.
        #[source]
        source: rcgen::Error,
    },
    /// A validity did not fit the calendar.
    #[error("failed to compute the certificate validity")]
    Validity(#[source] jiff::Error),
    /// The Secret the chart creates is missing.
    #[error(
        "Secret {namespace}/{name} does not exist: the chart creates it (empty) and the controller fills it; re-install the chart or create it with `kubectl -n {namespace} create secret generic {name}`"
    )]
    SecretMissing {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// An API request failed.
    #[error("failed to {what}")]
    Api {
        /// What was asked.
        what: String,
        /// kube's error.
        #[source]
        source: kube::Error,
    },
    /// The Secret's or the files' serving pair is unreadable.
    #[error("failed to read the serving certificate and key from {from}")]
    Unreadable {
        /// Where from.
        from: String,
        /// What was wrong.
        why: String,
    },
    /// A certificate file could not be read.
    #[error("failed to read {path}")]
    File {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

/// Where the serving certificate comes from.
#[derive(Debug, Clone)]
pub enum TlsSource {
    /// The controller keeps it in a Secret and the CA in the webhook configuration.
    Managed {
        /// The Secret's namespace (the controller's own).
        namespace: String,
        /// The Secret's name.
        secret: String,
        /// The MutatingWebhookConfiguration whose `caBundle` it keeps, if any.
        configuration: Option<String>,
        /// The names the API server reaches the webhook by (`<service>.<namespace>.svc`, ...).
        dns_names: Vec<String>,
    },
    /// `tls.crt` and `tls.key` in this directory (cert-manager's Secret, mounted).
    Files(PathBuf),
}

/// The DNS names of a Service, as the API server dials it.
pub fn service_dns_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

/// Keeps `slot` filled with a valid certificate until `stop` completes: checks at once, then
/// hourly (a minute apart for files, which cert-manager may rotate at any time), and after a
/// failure with [`Backoff::PASS`].
pub async fn keep(
    client: Client,
    source: TlsSource,
    slot: Arc<CertSlot>,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    let mut failures = 0u32;
    let period = match source {
        TlsSource::Managed { .. } => Duration::from_secs(3600),
        TlsSource::Files(_) => Duration::from_secs(60),
    };
    loop {
        let result = match &source {
            TlsSource::Managed {
                namespace,
                secret,
                configuration,
                dns_names,
            } => {
                sync_managed(
                    &client,
                    namespace,
                    secret,
                    configuration.as_deref(),
                    dns_names,
                    &slot,
                )
                .await
            }
            TlsSource::Files(dir) => load_files(dir, &slot),
        };
        let wait = match result {
            Ok(()) => {
                failures = 0;
                period
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                let delay = Backoff::PASS.delay(failures);
                tracing::warn!(error = %crate::runtime::logging::error_chain(&e), retry_in_ms = delay.as_millis() as u64, "placement webhook certificate not ready");
                delay
            }
        };
        tokio::select! {
            () = &mut stop => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

fn api_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> TlsError {
    let what = what.into();
    move |source| TlsError::Api { what, source }
}

async fn sync_managed(
    client: &Client,
    namespace: &str,
    name: &str,
    configuration: Option<&str>,
    dns_names: &[String],
    slot: &CertSlot,
) -> Result<(), TlsError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    // Two replicas renewing at once: one replace wins, the other gets 409 and reads it back.
    let mut secret = None;
    for _ in 0..3 {
        let current = secrets
            .get_opt(name)
            .await
            .map_err(api_err(format!("read Secret {namespace}/{name}")))?
            .ok_or_else(|| TlsError::SecretMissing {
                namespace: namespace.into(),
                name: name.into(),
            })?;
        let recorded = recorded(&current);
        let now = Timestamp::now();
        let renew = renewal(&recorded, dns_names, now, &Lifetimes::standard());
        if renew == Renewal::Keep {
            secret = Some(current);
            break;
        }
        let data = current.data.clone().unwrap_or_default();
        let material = issue(
            renew,
            &data,
            recorded.ca_not_after,
            dns_names,
            now,
            &Lifetimes::standard(),
        )?;
        let mut next = current.clone();
        material.write_into(&mut next);
        match secrets.replace(name, &PostParams::default(), &next).await {
            Ok(written) => {
                tracing::info!(secret = %name, renewal = ?renew, serving_not_after = %material.serving_not_after, "placement webhook certificate issued");
                secret = Some(written);
                break;
            }
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(api_err(format!("write Secret {namespace}/{name}"))(e)),
        }
    }
    let Some(secret) = secret else {
        return Err(TlsError::Unreadable {
            from: format!("Secret {namespace}/{name}"),
            why: "it kept changing under three renewals in a row".into(),
        });
    };
    let data = secret.data.unwrap_or_default();
    let get = |k: &str| data.get(k).map(|b| b.0.as_slice()).unwrap_or_default();
    slot.set(
        certified_key(get(TLS_CRT), get(TLS_KEY)).map_err(|why| TlsError::Unreadable {
            from: format!("Secret {namespace}/{name}"),
            why,
        })?,
    );
    if let Some(configuration) = configuration {
        inject_ca_bundle(client, configuration, get(CA_CRT)).await?;
    }
    Ok(())
}

/// Puts `bundle` into every webhook of the configuration whose `caBundle` differs.
async fn inject_ca_bundle(client: &Client, name: &str, bundle: &[u8]) -> Result<(), TlsError> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let current = api
        .get(name)
        .await
        .map_err(api_err(format!("read MutatingWebhookConfiguration {name}")))?;
    let stale: Vec<String> = current
        .webhooks
        .iter()
        .flatten()
        .filter(|w| w.client_config.ca_bundle.as_ref().map(|b| b.0.as_slice()) != Some(bundle))
        .map(|w| w.name.clone())
        .collect();
    if stale.is_empty() {
        return Ok(());
    }
    // A strategic merge patch: `webhooks` merges by name, so only `caBundle` changes, and the
    // chart's own fields stay Helm's.
    let webhooks: Vec<serde_json::Value> = stale
        .iter()
        .map(|n| serde_json::json!({"name": n, "clientConfig": {"caBundle": ByteString(bundle.to_vec())}}))
        .collect();
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Strategic(serde_json::json!({"webhooks": webhooks})),
    )
    .await
    .map_err(api_err(format!(
        "set the caBundle of MutatingWebhookConfiguration {name}"
    )))?;
    tracing::info!(configuration = %name, webhooks = ?stale, "placement webhook caBundle set");
    Ok(())
}

fn recorded(secret: &Secret) -> Recorded {
    let data = secret.data.as_ref();
    let annotations = secret.metadata.annotations.as_ref();
    let at = |k: &str| {
        annotations
            .and_then(|a| a.get(k))
            .and_then(|v| v.parse::<Timestamp>().ok())
    };
    Recorded {
        complete: [TLS_CRT, TLS_KEY, CA_CRT, CA_KEY].iter().all(|k| {
            data.and_then(|d| d.get(*k))
                .is_some_and(|v| !v.0.is_empty())
        }),
        serving_not_after: at(SERVING_NOT_AFTER),
        ca_not_after: at(CA_NOT_AFTER),
        dns_names: annotations
            .and_then(|a| a.get(DNS_NAMES))
            .map(|v| v.split(',').map(str::to_string).collect())
            .unwrap_or_default(),
    }
}

/// A CA and serving certificate to store.
#[derive(Debug, Clone)]
pub struct Material {
    /// The CAs to trust, PEM (the newest first).
    pub ca_bundle: String,
    /// The newest CA's key, PEM.
    pub ca_key: String,
    /// The serving certificate, PEM.
    pub cert: String,
    /// Its key, PEM.
    pub key: String,
    /// When the serving certificate expires.
    pub serving_not_after: Timestamp,
    /// When the newest CA expires.
    pub ca_not_after: Timestamp,
    /// The serving certificate's names.
    pub dns_names: Vec<String>,
}

impl Material {
    fn write_into(&self, secret: &mut Secret) {
        let data = secret.data.get_or_insert_with(BTreeMap::new);
        for (k, v) in [
            (TLS_CRT, &self.cert),
            (TLS_KEY, &self.key),
            (CA_CRT, &self.ca_bundle),
            (CA_KEY, &self.ca_key),
        ] {
            data.insert(k.into(), ByteString(v.clone().into_bytes()));
        }
        let annotations = secret
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new);
        annotations.insert(SERVING_NOT_AFTER.into(), self.serving_not_after.to_string());
        annotations.insert(CA_NOT_AFTER.into(), self.ca_not_after.to_string());
        annotations.insert(DNS_NAMES.into(), self.dns_names.join(","));
    }
}

/// Issues what `renew` asks for, from what `data` (the Secret's) holds; `ca_not_after` is the
/// recorded expiry of the CA kept by a serving-only renewal.
pub fn issue(
    renew: Renewal,
    data: &BTreeMap<String, ByteString>,
    ca_not_after: Option<Timestamp>,
    dns_names: &[String],
    now: Timestamp,
    life: &Lifetimes,
) -> Result<Material, TlsError> {
    let text = |k: &str| {
        data.get(k)
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
            .unwrap_or_default()
    };
    // Certificates carry whole days: what is recorded is the day the certificate names.
    let until = |span: Span| {
        now.checked_add(span)
            .and_then(|t| {
                t.to_zoned(jiff::tz::TimeZone::UTC)
                    .date()
                    .to_zoned(jiff::tz::TimeZone::UTC)
            })
            .map(|z| z.timestamp())
            .map_err(TlsError::Validity)
    };
    let gen_err = |what| move |source| TlsError::Generate { what, source };
    let existing_ca_key = KeyPair::from_pem(&text(CA_KEY)).ok();
    let kept = match (renew, existing_ca_key, ca_not_after) {
        (Renewal::Serving | Renewal::Keep, Some(key), Some(until)) => Some((key, until)),
        _ => None,
    };
    let (ca_key, ca_bundle, ca_not_after) = match kept {
        Some((key, until)) => (key, text(CA_CRT), until),
        None => {
            let key = KeyPair::generate().map_err(gen_err("CA key"))?;
            let ca_not_after = until(life.ca)?;
            let cert = ca_params(now, ca_not_after)
                .self_signed(&key)
                .map_err(gen_err("CA certificate"))?;
            // A renewed CA keeps the previous one trusted beside it (only the newest previous:
            // the bundle never grows beyond two).
            let previous = text(CA_CRT);
            let previous = previous
                .split_inclusive("-----END CERTIFICATE-----")
                .next()
                .filter(|_| renew == Renewal::Ca)
                .map(|c| c.trim().to_string());
            let mut bundle = cert.pem();
            if let Some(previous) = previous.filter(|p| !p.is_empty()) {
                bundle.push_str(&previous);
                bundle.push('\n');
            }
            (key, bundle, ca_not_after)
        }
    };
    let serving_not_after = until(life.serving)?;
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(ca_params(now, ca_not_after), ca_key);
    let key = KeyPair::generate().map_err(gen_err("serving key"))?;
    let mut params =
        CertificateParams::new(dns_names.to_vec()).map_err(gen_err("serving certificate"))?;
    params.distinguished_name = common_name(dns_names.first().map_or("ipkeep-webhook", |n| n));
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params, now, serving_not_after);
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(gen_err("serving certificate"))?;
    Ok(Material {
        ca_bundle,
        ca_key: ca_key_pem,
        cert: cert.pem(),
        key: key.serialize_pem(),
        serving_not_after,
        ca_not_after,
        dns_names: dns_names.to_vec(),
    })
}

fn ca_params(from: Timestamp, until: Timestamp) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = common_name(CA_NAME);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    set_validity(&mut params, from, until);
    params
}

fn common_name(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn
}

/// Validity in whole days (UTC): from the start of `from`'s day to the start of `until`'s.
fn set_validity(params: &mut CertificateParams, from: Timestamp, until: Timestamp) {
    let day = |t: Timestamp| t.to_zoned(jiff::tz::TimeZone::UTC).date();
    let (a, b) = (day(from), day(until));
    params.not_before = rcgen::date_time_ymd(
        i32::from(a.year()),
        a.month().unsigned_abs(),
        a.day().unsigned_abs(),
    );
    params.not_after = rcgen::date_time_ymd(
        i32::from(b.year()),
        b.month().unsigned_abs(),
        b.day().unsigned_abs(),
    );
}

/// Loads a PEM certificate chain and key for rustls.
pub fn certified_key(cert_pem: &[u8], key_pem: &[u8]) -> Result<Arc<CertifiedKey>, String> {
    let certs = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the certificate is not PEM: {e}"))?;
    if certs.is_empty() {
        return Err("no certificate".into());
    }
    let key =
        PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| format!("the key is not PEM: {e}"))?;
    let signing = default_provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| format!("the key is unusable: {e}"))?;
    Ok(Arc::new(CertifiedKey::new(certs, signing)))
}

fn load_files(dir: &std::path::Path, slot: &CertSlot) -> Result<(), TlsError> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read(&path).map_err(|source| TlsError::File { path, source })
    };
    let key =
        certified_key(&read(TLS_CRT)?, &read(TLS_KEY)?).map_err(|why| TlsError::Unreadable {
            from: dir.display().to_string(),
            why,
        })?;
    slot.set(key);
    Ok(())
}
