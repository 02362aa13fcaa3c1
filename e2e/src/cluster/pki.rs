//! The control plane's certificates and keys, generated fresh for every run.
//!
//! One CA signs everything: the serving certificate every component presents on 127.0.0.1
//! (SANs `127.0.0.1`, `::1`, `localhost`), and the client certificates of the identities the
//! components and the harness use (CN = user, O = group, as kubeadm names them). The
//! ServiceAccount token signing key is a separate ECDSA P-256 pair (ES256 tokens). All keys are
//! ECDSA P-256: `ring` generates them in microseconds, where RSA would need another crate.

use std::{
    fs::OpenOptions,
    io::Write,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    sync::Arc,
};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

/// Failures while generating or writing the certificates.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen refused a key or certificate.
    #[error("failed to generate the {what}")]
    Generate {
        /// Which key or certificate.
        what: String,
        /// rcgen's reason.
        #[source]
        source: rcgen::Error,
    },
    /// A file could not be written.
    #[error("failed to write {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// A client identity: certificate and key files for one user.
#[derive(Debug, Clone)]
pub struct ClientCert {
    /// The PEM certificate file.
    pub cert: PathBuf,
    /// The PEM private key file (mode 0600).
    pub key: PathBuf,
}

/// Every file of the run's PKI, and the CA to sign more client certificates with.
#[derive(Clone)]
pub struct Pki {
    /// The CA certificate every client trusts and every component uses as client CA.
    pub ca_cert: PathBuf,
    /// The CA key (the controller-manager signs CSRs with it).
    pub ca_key: PathBuf,
    /// The serving certificate and key all components present on 127.0.0.1.
    pub serving: ClientCert,
    /// `admin` in `system:masters`: the harness's and kubectl's identity.
    pub admin: ClientCert,
    /// `system:kube-controller-manager`.
    pub controller_manager: ClientCert,
    /// `system:kube-scheduler`.
    pub scheduler: ClientCert,
    /// The ServiceAccount token signing key (private, PKCS#8 PEM).
    pub sa_key: PathBuf,
    /// The ServiceAccount token verification key (public, SPKI PEM).
    pub sa_pub: PathBuf,
    dir: PathBuf,
    issuer: Arc<Issuer<'static, KeyPair>>,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki")
            .field("ca_cert", &self.ca_cert)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

fn leaf(
    dir: &Path,
    issuer: &Issuer<'static, KeyPair>,
    file: &str,
    cn: &str,
    org: Option<&str>,
    sans: Vec<String>,
    usage: ExtendedKeyUsagePurpose,
) -> Result<ClientCert, PkiError> {
    let key = generate(&format!("{cn} key"), KeyPair::generate())?;
    let mut params = generate(&format!("{cn} certificate"), CertificateParams::new(sans))?;
    params.distinguished_name = name(cn, org);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![usage];
    params.use_authority_key_identifier_extension = true;
    let cert = generate(&format!("{cn} certificate"), params.signed_by(&key, issuer))?;
    let out = ClientCert {
        cert: dir.join(format!("{file}.crt")),
        key: dir.join(format!("{file}.key")),
    };
    write_file(&out.cert, &cert.pem(), 0o644)?;
    write_file(&out.key, &key.serialize_pem(), 0o600)?;
    Ok(out)
}

fn generate<T>(what: &str, r: Result<T, rcgen::Error>) -> Result<T, PkiError> {
    r.map_err(|source| PkiError::Generate {
        what: what.to_owned(),
        source,
    })
}

fn write_file(path: &Path, text: &str, mode: u32) -> Result<(), PkiError> {
    let io = |source| PkiError::Write {
        path: path.to_owned(),
        source,
    };
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(io)?;
    f.write_all(text.as_bytes()).map_err(io)
}

fn name(cn: &str, org: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    if let Some(o) = org {
        dn.push(DnType::OrganizationName, o);
    }
    dn
}

impl Pki {
    /// Generates a new CA, the serving and client certificates and the ServiceAccount key pair
    /// into `dir` (which must exist and be private to this run).
    pub fn generate(dir: &Path) -> Result<Pki, PkiError> {
        Pki::generate_with_sans(dir, &[])
    }

    /// [`Pki::generate`] with more names and addresses on the serving certificate (an API
    /// server that nodes and pods reach: its bridge address, its Service IP, `kubernetes.default.svc`).
    pub fn generate_with_sans(dir: &Path, extra_sans: &[String]) -> Result<Pki, PkiError> {
        let ca_key = generate("CA key", KeyPair::generate())?;
        let mut ca_params = CertificateParams::default();
        ca_params.distinguished_name = name("ipkeep-e2e-ca", None);
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = generate("CA certificate", ca_params.self_signed(&ca_key))?;
        let ca_cert_path = dir.join("ca.crt");
        let ca_key_path = dir.join("ca.key");
        write_file(&ca_cert_path, &ca_cert.pem(), 0o644)?;
        write_file(&ca_key_path, &ca_key.serialize_pem(), 0o600)?;
        let issuer = Issuer::new(ca_params, ca_key);

        let issuer = Arc::new(issuer);
        let leaf = |file: &str,
                    cn: &str,
                    org: Option<&str>,
                    sans: Vec<String>,
                    usage: ExtendedKeyUsagePurpose| {
            leaf(dir, &issuer, file, cn, org, sans, usage)
        };
        let mut sans = ["127.0.0.1", "::1", "localhost"].map(String::from).to_vec();
        sans.extend(extra_sans.iter().cloned());
        let serving = leaf(
            "serving",
            "127.0.0.1",
            None,
            sans,
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        let client = ExtendedKeyUsagePurpose::ClientAuth;
        let admin = leaf(
            "admin",
            "admin",
            Some("system:masters"),
            vec![],
            client.clone(),
        )?;
        let controller_manager = leaf(
            "kube-controller-manager",
            "system:kube-controller-manager",
            None,
            vec![],
            client.clone(),
        )?;
        let scheduler = leaf(
            "kube-scheduler",
            "system:kube-scheduler",
            None,
            vec![],
            client,
        )?;

        let sa = generate("ServiceAccount signing key", KeyPair::generate())?;
        let sa_key = dir.join("sa.key");
        let sa_pub = dir.join("sa.pub");
        write_file(&sa_key, &sa.serialize_pem(), 0o600)?;
        write_file(&sa_pub, &sa.public_key_pem(), 0o644)?;
        Ok(Pki {
            ca_cert: ca_cert_path,
            ca_key: ca_key_path,
            serving,
            admin,
            controller_manager,
            scheduler,
            sa_key,
            sa_pub,
            dir: dir.to_owned(),
            issuer,
        })
    }

    /// Signs a new serving certificate for `cn` with the names and addresses `sans` into
    /// `<file>.crt`/`.key` in the PKI directory (a kubelet's; an existing file is an error).
    pub fn serving_cert(
        &self,
        file: &str,
        cn: &str,
        sans: Vec<String>,
    ) -> Result<ClientCert, PkiError> {
        leaf(
            &self.dir,
            &self.issuer,
            file,
            cn,
            None,
            sans,
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// Signs a new client certificate for user `cn` in group `org` into `<file>.crt`/`.key` in
    /// the PKI directory (`file` is the caller's validated name; an existing file is an error).
    pub fn client_cert(
        &self,
        file: &str,
        cn: &str,
        org: Option<&str>,
    ) -> Result<ClientCert, PkiError> {
        leaf(
            &self.dir,
            &self.issuer,
            file,
            cn,
            org,
            vec![],
            ExtendedKeyUsagePurpose::ClientAuth,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_every_file_with_private_keys_private() {
        let dir = std::env::temp_dir().join(format!("ipkeep-pki-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pki = Pki::generate(&dir).unwrap();
        for key in [&pki.ca_key, &pki.admin.key, &pki.serving.key, &pki.sa_key] {
            let mode = std::fs::metadata(key).unwrap().permissions();
            assert_eq!(
                std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
                0o600,
                "{key:?}"
            );
        }
        let ca = std::fs::read_to_string(&pki.ca_cert).unwrap();
        assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");
        let public = std::fs::read_to_string(&pki.sa_pub).unwrap();
        assert!(public.starts_with("-----BEGIN PUBLIC KEY-----"), "{public}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
