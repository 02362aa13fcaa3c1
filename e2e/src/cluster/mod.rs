//! A real Kubernetes control plane on one machine: etcd, kube-apiserver, kube-controller-manager
//! and kube-scheduler built from their Go modules (`make cluster-bins`), started on 127.0.0.1
//! with fresh state, generated certificates and real RBAC.
//!
//! Tests share one control plane per test binary ([`shared`]) and isolate themselves with
//! namespaces ([`ControlPlane::fresh_namespace`]) and inject API faults through a
//! [`crate::proxy::FaultProxy`] of their own. Its Nodes are objects the tests write
//! ([`ControlPlane::add_node`]), with no kubelet behind them (see [`nodes`]). Nothing outlives the process that started it: see
//! [`process`].
//!
//! Beside it, a private OCI registry on the host with TLS and a login ([`registry`]), which
//! `make publish` is tested against and the real nodes pull from; and a Prometheus server
//! ([`prometheus`]) that runs ipkeep's alerting rules against real nodes.

pub mod cli;
pub mod kubeconfig;
pub mod nodes;
pub mod pki;
pub mod plane;
pub mod process;
pub mod prometheus;
pub mod realnode;
pub mod registry;
pub mod token;

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use kube::{Api, api::PostParams};

pub use nodes::force_delete_pod;
pub use plane::{ControlPlane, ControlPlaneError, ControlPlaneOptions, NodeAccess, bin_dir};
pub use registry::{Registry, RegistryError};

static SHARED: tokio::sync::OnceCell<Result<ControlPlane, String>> =
    tokio::sync::OnceCell::const_new();

/// The control plane shared by every test of this test binary, started on first use (with the
/// audit log on, for fixture Nodes: [`ControlPlaneOptions::fixture_nodes`]) and stopped when the process exits, however it exits. Fails if it could not
/// start, or if one of its components has died since (the error names it).
pub async fn shared() -> Result<&'static ControlPlane, ControlPlaneError> {
    let started = SHARED
        .get_or_init(|| async {
            let t0 = Instant::now();
            let options = ControlPlaneOptions {
                audit_log: true,
                fixture_nodes: true,
                ..ControlPlaneOptions::default()
            };
            match ControlPlane::start(options).await {
                Ok(c) => {
                    eprintln!(
                        "ipkeep-e2e cluster: shared control plane ready in {:.1}s at {} (state {})",
                        t0.elapsed().as_secs_f64(),
                        c.server(),
                        c.state_dir().display()
                    );
                    Ok(c)
                }
                Err(e) => Err(crate::error_chain(&e)),
            }
        })
        .await;
    match started {
        Ok(plane) => {
            plane.check()?;
            Ok(plane)
        }
        Err(e) => Err(ControlPlaneError::Shared(e.clone())),
    }
}

static NAMESPACE_SEQ: AtomicU64 = AtomicU64::new(0);

impl ControlPlane {
    /// Creates a namespace `<prefix>-<n>` unique in this process and returns its name once the
    /// controller-manager has filled it as in any cluster: its `default` ServiceAccount (pods
    /// cannot be created before it exists) and the `kube-root-ca.crt` ConfigMap.
    pub async fn fresh_namespace(&self, prefix: &str) -> Result<String, ControlPlaneError> {
        let ok = !prefix.is_empty()
            && prefix.len() <= 40
            && prefix
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !prefix.starts_with('-');
        if !ok {
            return Err(ControlPlaneError::Invalid {
                what: "namespace prefix",
                value: prefix.to_owned(),
                why: "at most 40 lowercase letters, digits and '-', not starting with '-'",
            });
        }
        let name = format!("{prefix}-{}", NAMESPACE_SEQ.fetch_add(1, Ordering::Relaxed));
        let client = self.client()?;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .map_err(|source| ControlPlaneError::Api {
                what: format!("create namespace {name}"),
                source,
            })?;
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
        let config_maps: Api<ConfigMap> = Api::namespaced(client, &name);
        let started = Instant::now();
        loop {
            let account =
                accounts
                    .get_opt("default")
                    .await
                    .map_err(|source| ControlPlaneError::Api {
                        what: format!("read ServiceAccount {name}/default"),
                        source,
                    })?;
            let root_ca = config_maps
                .get_opt("kube-root-ca.crt")
                .await
                .map_err(|source| ControlPlaneError::Api {
                    what: format!("read ConfigMap {name}/kube-root-ca.crt"),
                    source,
                })?;
            if account.is_some() && root_ca.is_some() {
                return Ok(name);
            }
            self.check()?;
            if started.elapsed() > Duration::from_secs(60) {
                return Err(ControlPlaneError::Timeout {
                    what: format!(
                        "wait for the controller-manager to create ServiceAccount {name}/default and ConfigMap {name}/kube-root-ca.crt"
                    ),
                    waited: started.elapsed(),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
