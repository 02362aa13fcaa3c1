//! The control plane's PKI and the kubeconfigs made from it: the certificates (with the nodes'
//! names for the API server when nodes reach it), the admin's, kube-controller-manager's and
//! kube-scheduler's kubeconfigs, and the scheduler's configuration file.

use std::path::PathBuf;

use super::{ControlPlaneError, boot::Boot, ports::api_url, state_dir::state_err};
use crate::cluster::{
    kubeconfig::{KubeUser, kubeconfig, write_kubeconfig},
    pki::{ClientCert, Pki},
};

/// The control plane's certificates and the kubeconfigs made from them.
pub(super) struct Credentials {
    pub(super) pki: Pki,
    /// The admin's kubeconfig (what `ControlPlane::kubeconfig_path` names).
    pub(super) admin: PathBuf,
    pub(super) controller_manager: PathBuf,
    /// The scheduler's configuration file (it names the scheduler's kubeconfig).
    pub(super) scheduler_config: PathBuf,
    pub(super) scheduler: PathBuf,
}

impl Boot<'_> {
    /// The certificates (with the nodes' names for the API server when nodes reach it), the
    /// admin's, kube-controller-manager's and kube-scheduler's kubeconfigs, and the scheduler's
    /// configuration file.
    pub(super) fn write_credentials(&self) -> Result<Credentials, ControlPlaneError> {
        let (options, dir, ports) = (self.options, self.dir, self.ports);
        let pki_dir = dir.join("pki");
        for d in [&pki_dir, &self.logs] {
            std::fs::create_dir(d).map_err(state_err("create a directory in", dir))?;
        }
        let extra_sans: Vec<String> = match &options.node_access {
            Some(access) => vec![
                access.address.to_string(),
                access.service_ip.to_string(),
                "kubernetes".into(),
                "kubernetes.default".into(),
                "kubernetes.default.svc".into(),
                "kubernetes.default.svc.cluster.local".into(),
            ],
            None => Vec::new(),
        };
        let pki = Pki::generate_with_sans(&pki_dir, &extra_sans)?;
        let server = api_url(options, ports);
        let write_kc = |file: &str, user: &str, cert: &ClientCert| {
            let path = dir.join(file);
            let doc = kubeconfig(
                &server,
                &pki.ca_cert,
                user,
                &KubeUser::Cert {
                    cert: cert.cert.clone(),
                    key: cert.key.clone(),
                },
                None,
            );
            write_kubeconfig(&path, &doc).map(|()| path)
        };
        let admin_kc = write_kc("admin.kubeconfig", "admin", &pki.admin)?;
        let kcm_kc = write_kc(
            "kube-controller-manager.kubeconfig",
            "system:kube-controller-manager",
            &pki.controller_manager,
        )?;
        let sched_kc = write_kc(
            "kube-scheduler.kubeconfig",
            "system:kube-scheduler",
            &pki.scheduler,
        )?;
        let sched_config = dir.join("kube-scheduler-config.yaml");
        std::fs::write(
            &sched_config,
            format!(
                "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nclientConnection:\n  kubeconfig: {}\nleaderElection:\n  leaderElect: false\n",
                serde_json::to_string(&sched_kc).unwrap_or_default()
            ),
        )
        .map_err(state_err("write the scheduler configuration in", dir))?;

        Ok(Credentials {
            pki,
            admin: admin_kc,
            controller_manager: kcm_kc,
            scheduler_config: sched_config,
            scheduler: sched_kc,
        })
    }
}
