//! Starting the components in order, each with its flags and once the one it needs is ready:
//! etcd, kube-apiserver, then kube-controller-manager and kube-scheduler.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Instant,
};

use kube::config::{KubeConfigOptions, Kubeconfig};

use super::{
    ControlPlaneError, ControlPlaneOptions, Ports, SERVICE_CIDR,
    audit::audit_log_flags,
    credentials::Credentials,
    processes::{Launch, Running},
    readiness::wait_ready,
};
use crate::cluster::process::{Component, Spawner};

/// What every step of [`ControlPlane::boot`] starts its component with.
pub(super) struct Boot<'a> {
    pub(super) options: &'a ControlPlaneOptions,
    pub(super) bin_dir: &'a Path,
    /// The state directory.
    pub(super) dir: &'a Path,
    pub(super) ports: Ports,
    pub(super) spawner: &'a Spawner,
    /// Where each component's log goes (`<name>.log`).
    pub(super) logs: PathBuf,
    /// The process groups file the watchdog reads.
    pub(super) pgids: PathBuf,
    /// When the first step began: each component's readiness is reported from here.
    pub(super) started: Instant,
}

pub(super) fn arg(name: &str, value: impl std::fmt::Display) -> String {
    format!("--{name}={value}")
}

pub(super) fn path_arg(name: &str, value: &Path) -> String {
    format!("--{name}={}", value.display())
}

/// Pod Security admission as a hardened cluster (a CIS-hardened k3s) configures it: every
/// namespace without a `pod-security.kubernetes.io/enforce` label enforces `baseline`, so a pod
/// with a hostPath, host networking or privilege is refused there. ipkeep's agent is such a pod:
/// its namespace carries the label the README's install commands give it, or nothing runs.
const POD_SECURITY: &str = "apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: PodSecurity
  configuration:
    apiVersion: pod-security.admission.config.k8s.io/v1
    kind: PodSecurityConfiguration
    defaults:
      enforce: baseline
      enforce-version: latest
";

/// Writes [`POD_SECURITY`] into the state directory `dir`; its path.
fn pod_security_config(dir: &Path) -> Result<PathBuf, ControlPlaneError> {
    let path = dir.join("admission-config.yaml");
    std::fs::write(&path, POD_SECURITY).map_err(super::state_dir::state_err(
        "write the admission configuration in",
        dir,
    ))?;
    Ok(path)
}

impl Boot<'_> {
    /// The options' extra arguments for component `name`.
    fn extra(&self, name: &str) -> Vec<String> {
        self.options
            .extra_args
            .get(name)
            .cloned()
            .unwrap_or_default()
    }

    /// Starts component `name` (the binary of that name) with `args`, its log in `logs/`.
    fn start(
        &self,
        name: &str,
        args: Vec<String>,
        running: &mut Running,
    ) -> Result<(), ControlPlaneError> {
        let launch = Launch {
            program: self.bin_dir.join(name),
            args,
            log: self.logs.join(format!("{name}.log")),
            probe: None,
        };
        let c = Component::start(
            self.spawner,
            name,
            &launch.program,
            &launch.args,
            &launch.log,
            &self.pgids,
        )?;
        running.components.push(Arc::new(c));
        running.launches.insert(name.to_owned(), launch);
        Ok(())
    }

    /// Waits until component `name` answers `path` at `config`'s address, and records when.
    async fn wait_until_ready(
        &self,
        running: &mut Running,
        name: &str,
        config: kube::Config,
        path: &'static str,
    ) -> Result<(), ControlPlaneError> {
        wait_ready(running, name, config, path).await?;
        running
            .ready_after
            .push((name.into(), self.started.elapsed().as_secs_f64()));
        Ok(())
    }

    /// Starts etcd and waits until it is ready; its client URL.
    pub(super) async fn start_etcd(
        &self,
        running: &mut Running,
    ) -> Result<String, ControlPlaneError> {
        let (dir, ports) = (self.dir, self.ports);
        let etcd_client = format!("http://127.0.0.1:{}", ports.etcd_client);
        let etcd_peer = format!("http://127.0.0.1:{}", ports.etcd_peer);
        let mut args = vec![
            arg("name", "ipkeep"),
            path_arg("data-dir", &dir.join("etcd")),
            arg("listen-client-urls", &etcd_client),
            arg("advertise-client-urls", &etcd_client),
            arg("listen-peer-urls", &etcd_peer),
            arg("initial-advertise-peer-urls", &etcd_peer),
            arg("initial-cluster", format!("ipkeep={etcd_peer}")),
            // Test data: durability buys nothing and fsync costs seconds on a busy disk.
            arg("unsafe-no-fsync", true),
            arg("auto-compaction-retention", 1),
            arg("log-level", "warn"),
        ];
        args.extend(self.extra("etcd"));
        self.start("etcd", args, running)?;
        let mut etcd_config =
            kube::Config::new(
                etcd_client
                    .parse()
                    .map_err(|e| ControlPlaneError::Invalid {
                        what: "etcd URL",
                        value: format!("{etcd_client} ({e})"),
                        why: "not a URL",
                    })?,
            );
        etcd_config.auth_info = Default::default();
        self.wait_until_ready(running, "etcd", etcd_config, "/readyz")
            .await?;
        Ok(etcd_client)
    }

    /// Starts kube-apiserver on `etcd_client` (with the audit log when asked for) and waits
    /// until it is ready; the admin's client configuration and the audit log's path.
    pub(super) async fn start_apiserver(
        &self,
        running: &mut Running,
        credentials: &Credentials,
        etcd_client: &str,
    ) -> Result<(kube::Config, Option<PathBuf>), ControlPlaneError> {
        let (options, dir, ports, pki) = (self.options, self.dir, self.ports, &credentials.pki);
        let admin_kc = &credentials.admin;
        let mut args = vec![
            arg("etcd-servers", etcd_client),
            arg("secure-port", ports.apiserver),
            path_arg("tls-cert-file", &pki.serving.cert),
            path_arg("tls-private-key-file", &pki.serving.key),
            path_arg("client-ca-file", &pki.ca_cert),
            arg("authorization-mode", "Node,RBAC"),
            arg("enable-admission-plugins", "NodeRestriction"),
            path_arg("admission-control-config-file", &pod_security_config(dir)?),
            arg(
                "service-account-issuer",
                "https://kubernetes.default.svc.cluster.local",
            ),
            path_arg("service-account-key-file", &pki.sa_pub),
            path_arg("service-account-signing-key-file", &pki.sa_key),
            arg("service-cluster-ip-range", SERVICE_CIDR),
            arg("allow-privileged", true),
            // /debug/pprof, for the controller bench's profiles (admin only, on loopback).
            arg("profiling", true),
            path_arg("cert-dir", &dir.join("apiserver-certs")),
            // The API server reaches admission webhooks (ipkeep's placement webhook) at their
            // Service's endpoints, not its ClusterIP: this host is the control plane and runs no
            // kube-proxy, as on clusters whose control plane is not a node. Without endpoints (a
            // chart installed on a plane without nodes) a call fails at once, never dials out.
            arg("enable-aggregator-routing", true),
        ];
        match &options.node_access {
            Some(access) => {
                let kubelet_client = pki.client_cert(
                    "apiserver-kubelet-client",
                    "kube-apiserver-kubelet-client",
                    Some("system:masters"),
                )?;
                args.extend([
                    arg("bind-address", access.address),
                    arg("advertise-address", access.address),
                    path_arg("kubelet-client-certificate", &kubelet_client.cert),
                    path_arg("kubelet-client-key", &kubelet_client.key),
                    path_arg("kubelet-certificate-authority", &pki.ca_cert),
                    arg("kubelet-preferred-address-types", "InternalIP"),
                ]);
            }
            None => args.extend([
                arg("bind-address", "127.0.0.1"),
                arg("advertise-address", "127.0.0.1"),
                // The apiserver's own address is loopback: nothing in-cluster could use it.
                arg("endpoint-reconciler-type", "none"),
            ]),
        }
        let audit_log = match audit_log_flags(options, dir)? {
            Some((log, flags)) => {
                args.extend(flags);
                Some(log)
            }
            None => None,
        };
        args.extend(self.extra("kube-apiserver"));
        self.start("kube-apiserver", args, running)?;
        let config = kube::Config::from_custom_kubeconfig(
            Kubeconfig::read_from(admin_kc).map_err(|source| {
                ControlPlaneError::ReadKubeconfig {
                    path: admin_kc.clone(),
                    source,
                }
            })?,
            &KubeConfigOptions::default(),
        )
        .await
        .map_err(|source| ControlPlaneError::ReadKubeconfig {
            path: admin_kc.clone(),
            source,
        })?;
        self.wait_until_ready(running, "kube-apiserver", config.clone(), "/readyz")
            .await?;
        Ok((config, audit_log))
    }

    /// Starts kube-controller-manager and kube-scheduler together and waits until both are
    /// ready (`config`: the admin's, aimed at each in turn).
    pub(super) async fn start_controller_manager_and_scheduler(
        &self,
        running: &mut Running,
        credentials: &Credentials,
        config: &kube::Config,
    ) -> Result<(), ControlPlaneError> {
        let (options, ports, pki) = (self.options, self.ports, &credentials.pki);
        let (kcm_kc, sched_kc, sched_config) = (
            &credentials.controller_manager,
            &credentials.scheduler,
            &credentials.scheduler_config,
        );
        let common = |port: u16, kc: &Path| {
            vec![
                path_arg("authentication-kubeconfig", kc),
                path_arg("authorization-kubeconfig", kc),
                arg("bind-address", "127.0.0.1"),
                arg("secure-port", port),
                path_arg("tls-cert-file", &pki.serving.cert),
                path_arg("tls-private-key-file", &pki.serving.key),
                path_arg("client-ca-file", &pki.ca_cert),
                arg(
                    "authorization-always-allow-paths",
                    "/healthz,/readyz,/livez,/metrics",
                ),
                arg("profiling", false),
            ]
        };
        let mut args = common(ports.controller_manager, kcm_kc);
        args.extend([
            path_arg("kubeconfig", kcm_kc),
            arg("leader-elect", false),
            arg(
                "controllers",
                if options.fixture_nodes {
                    "*,-node-lifecycle-controller"
                } else {
                    "*"
                },
            ),
            // Each controller acts as its own ServiceAccount with its bootstrap role.
            arg("use-service-account-credentials", true),
            path_arg("service-account-private-key-file", &pki.sa_key),
            path_arg("root-ca-file", &pki.ca_cert),
            path_arg("cluster-signing-cert-file", &pki.ca_cert),
            path_arg("cluster-signing-key-file", &pki.ca_key),
            arg("service-cluster-ip-range", SERVICE_CIDR),
            // Notice a registered node's Ready condition (and lift its not-ready taint) sooner.
            arg("node-monitor-period", "1s"),
            // A ResourceQuota on a custom resource (count/ipreservations.ipkeep.dev) created before
            // the quota controller's discovery (every 30 s) found the CRD gets no usage for it
            // until the next full resync: 5 minutes by default, which a loaded machine reached
            // (the quota test gave up after 120 s). 10 s here.
            arg("resource-quota-sync-period", "10s"),
        ]);
        args.extend(self.extra("kube-controller-manager"));
        self.start("kube-controller-manager", args, running)?;
        let mut args = common(ports.scheduler, sched_kc);
        args.push(path_arg("config", sched_config));
        args.extend(self.extra("kube-scheduler"));
        self.start("kube-scheduler", args, running)?;
        // kube-controller-manager serves no /readyz (404); its /healthz covers its controllers.
        for (name, port, path) in [
            (
                "kube-controller-manager",
                ports.controller_manager,
                "/healthz",
            ),
            ("kube-scheduler", ports.scheduler, "/readyz"),
        ] {
            let mut c = config.clone();
            c.cluster_url = format!("https://127.0.0.1:{port}").parse().map_err(|e| {
                ControlPlaneError::Invalid {
                    what: "component URL",
                    value: format!("{port} ({e})"),
                    why: "not a URL",
                }
            })?;
            self.wait_until_ready(running, name, c, path).await?;
        }
        Ok(())
    }
}
