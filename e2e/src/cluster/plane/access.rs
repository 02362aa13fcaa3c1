//! Reaching a running control plane: its URL, the admin's kubeconfig and client, its
//! certificates, and `kubectl` and `helm` commands aimed at it.

use std::path::{Path, PathBuf};

use kube::Client;

use super::{ControlPlane, ControlPlaneError, Ports};
use crate::cluster::pki::Pki;

impl ControlPlane {
    /// The API server's URL (`https://127.0.0.1:PORT`).
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The admin kubeconfig (user `admin` in `system:masters`).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The CA certificate the API server's serving certificate chains to.
    pub fn ca_path(&self) -> &Path {
        &self.ca
    }

    /// Every certificate and key of this run.
    pub fn pki(&self) -> &Pki {
        &self.pki
    }

    /// The state directory (removed when the control plane stops).
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// The ports in use.
    pub fn ports(&self) -> Ports {
        self.ports
    }

    /// The API server's audit log, when started with [`ControlPlaneOptions::audit_log`].
    pub fn audit_log_path(&self) -> Option<&Path> {
        self.audit_log.as_deref()
    }

    /// The path of one of the built binaries (`kubectl`, `helm`, ...).
    pub fn bin(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }

    /// A `kubectl` command with `KUBECONFIG` set to the admin kubeconfig.
    pub fn kubectl(&self) -> std::process::Command {
        let mut c = std::process::Command::new(self.bin("kubectl"));
        c.env("KUBECONFIG", &self.kubeconfig);
        c
    }

    /// A `helm` command with `KUBECONFIG` set to the admin kubeconfig and Helm's cache, config
    /// and data directories inside the state directory, so no test reads or writes `~/.cache/helm`.
    pub fn helm(&self) -> std::process::Command {
        let mut c = std::process::Command::new(self.bin("helm"));
        let home = self.state_dir.join("helm");
        c.env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"));
        c
    }

    /// The admin client configuration; build a [`Client`] from it in the runtime that uses it.
    pub fn config(&self) -> kube::Config {
        self.config.clone()
    }

    /// A new admin client, bound to the calling tokio runtime (a client must not outlive the
    /// runtime that made it, so each test makes its own).
    pub fn client(&self) -> Result<Client, ControlPlaneError> {
        Client::try_from(self.config()).map_err(|source| ControlPlaneError::ClientConfig {
            path: self.kubeconfig.clone(),
            source,
        })
    }
}
