//! Kubeconfig files the harness writes: JSON (a subset of YAML every client reads), with file
//! references to the run's CA and client certificates, or an inline bearer token.

use std::path::{Path, PathBuf};

use serde_json::json;

/// Who a kubeconfig authenticates as.
#[derive(Debug, Clone)]
pub enum KubeUser {
    /// A client certificate and its key.
    Cert {
        /// PEM certificate file.
        cert: PathBuf,
        /// PEM key file.
        key: PathBuf,
    },
    /// A bearer token (a ServiceAccount token from the TokenRequest API).
    Token(String),
}

/// Failure to write a kubeconfig.
#[derive(Debug, thiserror::Error)]
#[error("failed to write the kubeconfig {path}")]
pub struct KubeconfigWriteError {
    /// The file.
    pub path: PathBuf,
    /// The I/O error.
    #[source]
    pub source: std::io::Error,
}

/// The kubeconfig document for `server` trusting `ca`, as `user` named `user_name`.
pub fn kubeconfig(
    server: &str,
    ca: &Path,
    user_name: &str,
    user: &KubeUser,
    namespace: Option<&str>,
) -> serde_json::Value {
    let user = match user {
        KubeUser::Cert { cert, key } => json!({
            "client-certificate": cert,
            "client-key": key,
        }),
        KubeUser::Token(token) => json!({ "token": token }),
    };
    let mut context = json!({ "cluster": "ipkeep-e2e", "user": user_name });
    if let Some(ns) = namespace {
        context["namespace"] = json!(ns);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "ipkeep-e2e", "cluster": { "server": server, "certificate-authority": ca } }],
        "users": [{ "name": user_name, "user": user }],
        "contexts": [{ "name": "ipkeep-e2e", "context": context }],
        "current-context": "ipkeep-e2e",
    })
}

/// Writes `doc` to `path` with mode 0600 (it may hold a token), replacing any older file.
pub fn write_kubeconfig(path: &Path, doc: &serde_json::Value) -> Result<(), KubeconfigWriteError> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    let err = |source| KubeconfigWriteError {
        path: path.to_owned(),
        source,
    };
    let text = serde_json::to_string_pretty(doc).map_err(|e| err(std::io::Error::other(e)))?;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(err)?;
    f.write_all(text.as_bytes()).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}
