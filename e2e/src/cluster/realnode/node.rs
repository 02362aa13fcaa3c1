//! One real node: its files, its container runtime (containerd or CRI-O), kubelet and kube-proxy
//! in its own namespaces and cgroup, and what tests do to it (exec, restarts, a reboot).

use std::{
    io::Read as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use super::{
    RealNodeError, crio, flannel,
    host::{self, HostError},
    layout::{self, NodeCni, NodeDirs, NodeLayout, NodeRuntime},
    registries,
};
use crate::cluster::{
    ControlPlane,
    kubeconfig::{KubeUser, kubeconfig, write_kubeconfig},
    process::{Component, LOG_TAIL_LINES, log_tail, rss_kib},
};
use crate::command::{self, Stdin};

/// How long a node's container runtime may take to answer.
const RUNTIME_READY: Duration = Duration::from_secs(60);
/// How long flanneld may take to write the node's lease.
const FLANNEL_READY: Duration = Duration::from_secs(60);

/// The node's processes that run now.
#[derive(Debug, Default)]
struct Daemons {
    /// containerd or crio.
    runtime: Option<Component>,
    flanneld: Option<Component>,
    kubelet: Option<Component>,
    kube_proxy: Option<Component>,
}

impl Daemons {
    /// Each daemon by name (the runtime's is `runtime`'s), in start order.
    fn all(&self, runtime: NodeRuntime) -> [(&'static str, &Option<Component>); 4] {
        [
            (runtime.daemon(), &self.runtime),
            ("flanneld", &self.flanneld),
            ("kubelet", &self.kubelet),
            ("kube-proxy", &self.kube_proxy),
        ]
    }
}

/// What a user (or a test) does to a node by hand: `ipkeep-e2e cluster reboot NODE` and
/// `cluster restart NODE DAEMON`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", tag = "strike", content = "daemon")]
pub enum Strike {
    /// [`RealNode::reboot`].
    Reboot,
    /// Stop one daemon and start it again: its runtime (`containerd` or `crio`), `kubelet`, or
    /// `flanneld`.
    Restart(String),
}

/// What a node is made of besides its place ([`NodeLayout`]): its pod CIDRs, the size of its
/// cluster, its CNI network and where the binaries are.
#[derive(Debug, Clone)]
pub(super) struct NodeSpec {
    /// Its pod CIDRs, IPv4 first.
    pub pod_cidrs: Vec<String>,
    /// How many nodes its cluster has.
    pub nodes_in_cluster: u8,
    /// Its CNI network.
    pub cni: NodeCni,
    /// Whether the cluster is dual-stack.
    pub dual_stack: bool,
    /// Where it keeps its CNI plugins and configuration.
    pub dirs: NodeDirs,
    /// The node binaries.
    pub bin_dir: PathBuf,
    /// flannel's binaries, with [`NodeCni::Flannel`].
    pub flannel_dir: Option<PathBuf>,
    /// Its container runtime.
    pub runtime: NodeRuntime,
    /// CRI-O's binaries and CNI plugins, with [`NodeRuntime::CriO`].
    pub crio_dir: Option<PathBuf>,
}

/// A real node: containerd, kubelet and kube-proxy in the node's own network namespace, mount
/// namespace and cgroup, registered with the control plane under [`RealNode::name`].
#[derive(Debug)]
pub struct RealNode {
    layout: NodeLayout,
    node_ipv6: bool,
    dirs: NodeDirs,
    flannel_plugin: Option<PathBuf>,
    pod_cidrs: Vec<String>,
    nodes_in_cluster: u8,
    cni: NodeCni,
    bin_dir: PathBuf,
    flannel_dir: Option<PathBuf>,
    runtime: NodeRuntime,
    crio_dir: Option<PathBuf>,
    config_dir: PathBuf,
    logs: PathBuf,
    plane: Arc<ControlPlane>,
    daemons: Mutex<Daemons>,
}

/// Runs `stage` and wraps its error as the named node's.
fn at<T>(node: &str, stage: &str, r: Result<T, HostError>) -> Result<T, RealNodeError> {
    r.map_err(|source| RealNodeError::Host {
        node: node.to_owned(),
        stage: stage.to_owned(),
        source,
    })
}

/// The shell that puts a node's daemon into its cgroup in every hierarchy, then becomes it:
/// `sh -c SCRIPT sh PROCS_FILE... -- PROGRAM ARGS...`.
const JOIN_CGROUP: &str = r#"while [ "$1" != "--" ]; do echo $$ > "$1"; shift; done
shift
exec "$@""#;

impl RealNode {
    /// Writes the node's files (configuration, certificates, kubeconfigs, CNI plugins and
    /// conflist over its pod CIDRs; flannel's configuration) and creates its cgroups and
    /// namespaces. Starts nothing.
    pub(super) fn prepare(
        layout: NodeLayout,
        spec: NodeSpec,
        plane: Arc<ControlPlane>,
    ) -> Result<RealNode, RealNodeError> {
        let name = layout.name();
        let config_dir = plane.state_dir().join("nodes").join(&name);
        let logs = plane.state_dir().join("logs");
        let io = |what: &str, path: &Path| {
            let what = format!("{what} {}", path.display());
            let node = name.clone();
            move |source| RealNodeError::Io { node, what, source }
        };
        std::fs::create_dir_all(&config_dir).map_err(io("create", &config_dir))?;
        std::fs::create_dir_all(&logs).map_err(io("create", &logs))?;
        for p in layout::NODE_PATHS {
            let dir = layout.host_dir(p);
            std::fs::create_dir_all(&dir).map_err(io("create", &dir))?;
        }
        // A CRI-O node runs the upstream plugins (Debian's refuse cniVersion 1.1.0).
        let mut plugins = match &spec.crio_dir {
            Some(dir) => crio::CNI_PLUGINS.iter().map(|p| dir.join(p)).collect(),
            None => at(
                &name,
                "list the CNI plugins",
                host::plugin_files(Path::new(host::DEBIAN_CNI_DIR)),
            )?,
        };
        plugins.extend(spec.flannel_dir.iter().map(|d| d.join("flannel")));
        match spec.dirs {
            NodeDirs::Standard => {
                let bin = layout.host_dir("/opt/cni/bin");
                for from in &plugins {
                    let to = bin.join(from.file_name().unwrap_or_default());
                    at(
                        &name,
                        "copy the CNI plugins",
                        host::copy_cni_plugin(from, &to),
                    )?;
                }
            }
            NodeDirs::K3s => {
                at(
                    &name,
                    "lay out k3s's CNI directories",
                    host::extract_k3s_release(layout, layout::K3S_FIRST_RELEASE, &plugins),
                )?;
            }
        }
        let (file, conflist) = spec.cni.conflist(&spec.pod_cidrs, spec.dirs, spec.runtime);
        let conf_dir = layout
            .host_path(spec.dirs.cni_conf_dir())
            .unwrap_or_else(|| layout.host_dir("/etc/cni/net.d"));
        std::fs::create_dir_all(&conf_dir).map_err(io("create", &conf_dir))?;
        let conflist_path = conf_dir.join(file);
        std::fs::write(
            &conflist_path,
            serde_json::to_string_pretty(&conflist).unwrap_or_default(),
        )
        .map_err(io("write", &conflist_path))?;

        // Identities: the kubelet as system:node:<name> (Node authorizer), kube-proxy as
        // system:kube-proxy (bootstrap role system:node-proxier), and the kubelet's serving
        // certificate for the API server's exec/logs connections.
        let pki = plane.pki();
        let cert_err = |source| RealNodeError::Pki {
            node: name.clone(),
            source,
        };
        let kubelet_client = pki
            .client_cert(
                &format!("{name}-kubelet-client"),
                &format!("system:node:{name}"),
                Some("system:nodes"),
            )
            .map_err(cert_err)?;
        let kubelet_serving = pki
            .serving_cert(
                &format!("{name}-kubelet-serving"),
                &name,
                vec![layout.ip().to_string(), name.clone()],
            )
            .map_err(cert_err)?;
        let proxy_client = pki
            .client_cert(&format!("{name}-kube-proxy"), "system:kube-proxy", None)
            .map_err(cert_err)?;
        let flannel_client = match spec.cni {
            NodeCni::Flannel => Some(
                pki.client_cert(&format!("{name}-flanneld"), flannel::USER, None)
                    .map_err(cert_err)?,
            ),
            NodeCni::Bridge => None,
        };
        let kc = |file: &str, user: &str, cert: &crate::cluster::pki::ClientCert| {
            let path = config_dir.join(file);
            let doc = kubeconfig(
                plane.server(),
                plane.ca_path(),
                user,
                &KubeUser::Cert {
                    cert: cert.cert.clone(),
                    key: cert.key.clone(),
                },
                None,
            );
            write_kubeconfig(&path, &doc)
                .map(|()| path)
                .map_err(|e| RealNodeError::Io {
                    node: name.clone(),
                    what: format!("write {}", e.path.display()),
                    source: e.source,
                })
        };
        kc(
            "kubelet.kubeconfig",
            &format!("system:node:{name}"),
            &kubelet_client,
        )?;
        let proxy_kc = kc("kube-proxy.kubeconfig", "system:kube-proxy", &proxy_client)?;
        if let Some(cert) = &flannel_client {
            kc("flanneld.kubeconfig", flannel::USER, cert)?;
            let path = config_dir.join("net-conf.json");
            let conf = flannel::net_conf(layout.slot(), spec.dual_stack);
            std::fs::write(&path, conf.to_string()).map_err(io("write", &path))?;
        }
        let files = layout::KubeletFiles {
            client_ca: plane.ca_path().to_owned(),
            tls_cert: kubelet_serving.cert,
            tls_key: kubelet_serving.key,
        };
        // The runtime's configuration where a real node keeps it, inside the node (the agent
        // reads it through its mount of the node's `/` to find the CNI directories).
        let (config_in_node, config_text) = match (&spec.crio_dir, spec.runtime) {
            (Some(dir), NodeRuntime::CriO) => {
                let programs = crio::programs(dir, &config_dir, &super::e2e_exe()?)
                    .map_err(io("write CRI-O's files in", &config_dir))?;
                // CRI-O's registries drop-in directory: an empty one of ours.
                let drop_ins = config_dir.join("crio.conf.d");
                std::fs::create_dir_all(&drop_ins).map_err(io("create", &drop_ins))?;
                (
                    layout::CRIO_CONFIG_PATH,
                    layout::crio_config(&programs, spec.dirs),
                )
            }
            _ => (
                layout::containerd_config_path(spec.dirs),
                layout::containerd_config(
                    Path::new(host::RUNC),
                    spec.dirs,
                    &config_dir.join(registries::CONTAINERD_HOSTS_DIR),
                ),
            ),
        };
        let node_file = |node_path: &str| {
            layout
                .host_path(node_path)
                .ok_or_else(|| RealNodeError::Invalid {
                    what: "runtime configuration path",
                    value: node_path.to_owned(),
                    why: "not under one of the node's own paths",
                })
        };
        let config_file = node_file(config_in_node)?;
        if let Some(parent) = config_file.parent() {
            std::fs::create_dir_all(parent).map_err(io("create", parent))?;
        }
        std::fs::write(&config_file, config_text).map_err(io("write", &config_file))?;
        if spec.runtime == NodeRuntime::CriO {
            let drop_ins = node_file(layout::CRIO_DROP_IN_DIR)?;
            std::fs::create_dir_all(&drop_ins).map_err(io("create", &drop_ins))?;
        }
        let writes = [
            (
                "kubelet.json",
                layout::kubelet_config(layout, &files, spec.runtime).to_string(),
            ),
            (
                "kube-proxy.json",
                layout::kube_proxy_config(layout, &proxy_kc).to_string(),
            ),
        ];
        for (file, text) in writes {
            let path = config_dir.join(file);
            std::fs::write(&path, text).map_err(io("write", &path))?;
        }

        let node = RealNode {
            layout,
            node_ipv6: spec.dual_stack && spec.cni == NodeCni::Flannel,
            dirs: spec.dirs,
            flannel_plugin: spec.flannel_dir.as_ref().map(|d| d.join("flannel")),
            pod_cidrs: spec.pod_cidrs,
            nodes_in_cluster: spec.nodes_in_cluster,
            cni: spec.cni,
            bin_dir: spec.bin_dir,
            flannel_dir: spec.flannel_dir,
            runtime: spec.runtime,
            crio_dir: spec.crio_dir,
            config_dir,
            logs,
            plane,
            daemons: Mutex::new(Daemons::default()),
        };
        node.create_namespaces()?;
        Ok(node)
    }

    fn create_namespaces(&self) -> Result<(), RealNodeError> {
        let name = self.name();
        at(
            &name,
            "create its cgroups",
            host::create_cgroup(&self.layout.daemons_cgroup()),
        )?;
        at(
            &name,
            "create its cgroups",
            host::create_cgroup(&self.layout.pods_cgroup()),
        )?;
        let routes = layout::node_routes(self.layout, self.nodes_in_cluster, self.cni);
        at(
            &name,
            "create its network namespace",
            host::create_node_netns(self.layout, &routes, self.node_ipv6),
        )?;
        at(
            &name,
            "create its mount namespace",
            host::create_mount_ns(self.layout),
        )
    }

    /// The Kubernetes node name.
    pub fn name(&self) -> String {
        self.layout.name()
    }

    /// Its address (the `InternalIP` the API server reaches its kubelet at).
    pub fn ip(&self) -> std::net::Ipv4Addr {
        self.layout.ip()
    }

    /// Its IPv4 pod CIDR (`spec.podCIDR` of its Node, and the first range of its CNI network).
    pub fn pod_cidr(&self) -> String {
        self.pod_cidrs.first().cloned().unwrap_or_default()
    }

    /// Its pod CIDRs, IPv4 first (`spec.podCIDRs` of its Node, the ranges of its CNI network).
    pub fn pod_cidrs(&self) -> &[String] {
        &self.pod_cidrs
    }

    /// Where everything about it is on the machine.
    pub fn layout(&self) -> NodeLayout {
        self.layout
    }

    /// The host directory behind a path the node sees (`/var/lib/cni`, `/opt/cni/bin`,
    /// `/etc/cni/net.d`, `/var/lib/kubelet`, ...); `None` for a path not private to the node.
    pub fn host_path(&self, node_path: &str) -> Option<PathBuf> {
        self.layout.host_path(node_path)
    }

    /// A command that runs `program` inside the node (its network and mount namespaces, its
    /// `PATH` with the node binaries first); the caller adds arguments and runs it.
    pub fn command(&self, program: &str) -> Command {
        host::node_command(self.layout, &self.bin_dir, program)
    }

    /// Runs `args` inside the node; its stdout, or an error with what it said.
    pub fn exec(&self, args: &[&str]) -> Result<String, RealNodeError> {
        let Some((program, rest)) = args.split_first() else {
            return Err(RealNodeError::Invalid {
                what: "command",
                value: String::new(),
                why: "empty",
            });
        };
        let mut command = self.command(program);
        command.args(rest);
        at(
            &self.name(),
            "run a command in it",
            command::stdout_of(&mut command, Stdin::Empty).map_err(HostError::from),
        )
    }

    /// The log file of one of its daemons (`containerd` or `crio`, `kubelet`, `kube-proxy`).
    pub fn log(&self, daemon: &str) -> PathBuf {
        self.logs.join(format!("{}-{daemon}.log", self.name()))
    }

    /// Its container runtime's log, which holds what CNI plugins write to stderr.
    pub fn runtime_log(&self) -> PathBuf {
        self.log(self.runtime.daemon())
    }

    /// Its container runtime.
    pub fn runtime(&self) -> NodeRuntime {
        self.runtime
    }

    /// Its CNI network.
    pub fn cni(&self) -> NodeCni {
        self.cni
    }

    /// Where it keeps its CNI plugins and configuration.
    pub fn dirs(&self) -> NodeDirs {
        self.dirs
    }

    /// What a k3s upgrade does to a k3s-layout node's CNI binaries: release `release` extracted
    /// into `data/<release>/bin` and every plugin name in `data/cni` re-linked there (whatever
    /// held the name removed first). Returns the names re-linked.
    pub fn upgrade_k3s(&self, release: &str) -> Result<Vec<String>, RealNodeError> {
        let mut plugins = at(
            &self.name(),
            "list the CNI plugins",
            host::plugin_files(Path::new(host::DEBIAN_CNI_DIR)),
        )?;
        plugins.extend(self.flannel_plugin.iter().cloned());
        at(
            &self.name(),
            "extract a k3s release",
            host::extract_k3s_release(self.layout, release, &plugins),
        )
    }

    fn start_daemon(&self, daemon: &str, args: Vec<String>) -> Result<Component, RealNodeError> {
        let program = self.bin_dir.join(daemon);
        self.start_program(daemon, &program, &[], args)
    }

    /// Starts `program` as the node's daemon `daemon`, in its namespaces and daemons' cgroup,
    /// with `env` added to its environment.
    fn start_program(
        &self,
        daemon: &str,
        program: &Path,
        env: &[(&str, String)],
        args: Vec<String>,
    ) -> Result<Component, RealNodeError> {
        let mut full = vec!["-c".to_owned(), JOIN_CGROUP.to_owned(), "sh".to_owned()];
        full.extend(
            host::cgroup_procs_files(&self.layout.daemons_cgroup())
                .into_iter()
                .map(|p| p.to_string_lossy().into_owned()),
        );
        full.push("--".into());
        full.extend(host::enter_args(self.layout));
        full.extend([
            "env".to_owned(),
            format!("PATH={}", host::node_path_env(&self.bin_dir)),
        ]);
        full.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        full.push(program.to_string_lossy().into_owned());
        full.extend(args);
        self.plane
            .start_process(
                &format!("{}/{daemon}", self.name()),
                Path::new("/bin/sh"),
                &full,
                &self.log(daemon),
            )
            .map_err(|source| RealNodeError::Start {
                node: self.name(),
                daemon: daemon.to_owned(),
                source: Box::new(source),
            })
    }

    /// Starts its container runtime and waits until it answers.
    pub(super) fn start_runtime(&self) -> Result<(), RealNodeError> {
        let daemon = self.runtime.daemon();
        let (c, mut probe) = match (self.runtime, &self.crio_dir) {
            (NodeRuntime::CriO, Some(dir)) => {
                // The kubelet then finds no hugepage sizes and asks for no hugetlb limit, which
                // runc cannot set where /proc/cgroups lists a hugetlb hierarchy nothing mounts
                // (CRI-O has no disable_hugetlb_controller, as containerd has). In the node's
                // own mount namespace only; again after a reboot, which makes a new one.
                self.exec(&[
                    "mount",
                    "-t",
                    "tmpfs",
                    "-o",
                    "ro,mode=0755",
                    "ipkeep-no-hugepages",
                    "/sys/kernel/mm/hugepages",
                ])?;
                // Where CRI-O looks for a registry's CA, the node's own (again after a reboot).
                registries::overlay_containers_etc(self)?;
                // Its whole configuration is the node's own /etc/crio/crio.conf (with its empty
                // crio.conf.d, node-private, never the machine's) and registries.conf: the
                // registries drop-in directory is an empty one of ours, never the machine's
                // /etc/containers/registries.conf.d.
                let args = vec![
                    "--config".to_owned(),
                    layout::CRIO_CONFIG_PATH.to_owned(),
                    "--config-dir".to_owned(),
                    layout::CRIO_DROP_IN_DIR.to_owned(),
                ];
                let crio = dir.join("crio");
                let mut daemon_args = args.clone();
                daemon_args.extend([
                    "--registries-conf".to_owned(),
                    self.config_dir
                        .join("registries.conf")
                        .to_string_lossy()
                        .into_owned(),
                    "--registries-conf-dir".to_owned(),
                    self.config_dir
                        .join("crio.conf.d")
                        .to_string_lossy()
                        .into_owned(),
                ]);
                let c = self.start_program(daemon, &crio, &[], daemon_args)?;
                let mut probe = self.command(&crio.to_string_lossy());
                probe.args(&args);
                probe.args(["status", "--socket", self.runtime.socket(), "info"]);
                (c, probe)
            }
            _ => {
                let config = layout::containerd_config_path(self.dirs);
                let c = self.start_daemon(daemon, vec!["--config".into(), config.to_owned()])?;
                let mut probe = self.command("ctr");
                probe.args(["--address", self.runtime.socket(), "version"]);
                (c, probe)
            }
        };
        let started = Instant::now();
        loop {
            if probe
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
            {
                break;
            }
            if let Some(status) = c.exit_status() {
                return Err(self.died(daemon, &c, &status.to_string()));
            }
            if started.elapsed() > RUNTIME_READY {
                return Err(self.died(daemon, &c, "it did not answer within 60 s"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.lock().runtime = Some(c);
        Ok(())
    }

    fn died(&self, daemon: &str, c: &Component, how: &str) -> RealNodeError {
        RealNodeError::Daemon {
            node: self.name(),
            daemon: daemon.to_owned(),
            how: how.to_owned(),
            log: c.log().to_owned(),
            tail: log_tail(c.log(), LOG_TAIL_LINES),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Daemons> {
        self.daemons.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts the node's network daemon, if its CNI network has one (flanneld), and waits until
    /// it has written the node's lease for the CNI plugin.
    pub(super) fn start_network(&self) -> Result<(), RealNodeError> {
        let (NodeCni::Flannel, Some(dir)) = (self.cni, &self.flannel_dir) else {
            return Ok(());
        };
        let c = self.start_program(
            "flanneld",
            &dir.join("flanneld"),
            &[("NODE_NAME", self.name())],
            flannel::flanneld_args(self.layout, &self.config_dir, self.node_ipv6),
        )?;
        let started = Instant::now();
        loop {
            let lease = self.exec(&["cat", flannel::SUBNET_FILE]).ok();
            if lease.as_deref().and_then(flannel::leased_subnet).is_some() {
                break;
            }
            if let Some(status) = c.exit_status() {
                return Err(self.died("flanneld", &c, &status.to_string()));
            }
            if started.elapsed() > FLANNEL_READY {
                return Err(self.died(
                    "flanneld",
                    &c,
                    &format!("it wrote no lease to {} within 60 s", flannel::SUBNET_FILE),
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.lock().flanneld = Some(c);
        Ok(())
    }

    /// Starts the kubelet.
    pub(super) fn start_kubelet(&self) -> Result<(), RealNodeError> {
        let c = self.start_daemon(
            "kubelet",
            vec![
                format!(
                    "--config={}",
                    self.config_dir.join("kubelet.json").display()
                ),
                format!(
                    "--kubeconfig={}",
                    self.config_dir.join("kubelet.kubeconfig").display()
                ),
                format!("--hostname-override={}", self.name()),
                format!("--node-ip={}", self.ip()),
            ],
        )?;
        self.lock().kubelet = Some(c);
        Ok(())
    }

    /// Starts kube-proxy.
    pub(super) fn start_kube_proxy(&self) -> Result<(), RealNodeError> {
        let c = self.start_daemon(
            "kube-proxy",
            vec![format!(
                "--config={}",
                self.config_dir.join("kube-proxy.json").display()
            )],
        )?;
        self.lock().kube_proxy = Some(c);
        Ok(())
    }

    /// Ok while its daemons run; else which one died, and the end of its log.
    pub fn check(&self) -> Result<(), RealNodeError> {
        let d = self.lock();
        for (daemon, c) in d.all(self.runtime) {
            if let Some(c) = c
                && let Some(status) = c.exit_status()
            {
                return Err(self.died(daemon, c, &status.to_string()));
            }
        }
        Ok(())
    }

    /// Process ids of its daemons that run now.
    pub fn pids(&self) -> Vec<(String, u32)> {
        let d = self.lock();
        d.all(self.runtime)
            .into_iter()
            .filter_map(|(n, c)| c.as_ref().map(|c| (n.to_owned(), c.pid())))
            .collect()
    }

    /// Imports an OCI archive into the node's container runtime under the names it carries and
    /// each `also` (from, to) name (see [`import_image`] and [`crio::import_image`]).
    pub fn import_image(
        &self,
        archive: &Path,
        pinned: bool,
        also: &[(String, String)],
    ) -> Result<(), RealNodeError> {
        import_image(self.running(), archive, pinned, also)
    }

    /// Makes the node trust the registry at `host_port` (`host:port`) whose certificates `ca_pem`
    /// signs, as its runtime's users configure a private registry ([`registries`]): containerd's
    /// `hosts.toml`, CRI-O's `certs.d`. Read at each pull: nothing restarts.
    pub fn trust_registry(&self, host_port: &str, ca_pem: &str) -> Result<(), RealNodeError> {
        registries::trust(self, self.runtime, &self.config_dir, host_port, ca_pem)
    }

    /// Makes the node trust the registry at `host_port` and log in to it with its own login
    /// `basic` (base64 of `user:password`), so that pods need no pull secret
    /// ([`registries::trust_with_login`]; containerd only). Read at each pull: nothing restarts.
    pub fn trust_registry_with_login(
        &self,
        host_port: &str,
        ca_pem: &str,
        basic: &str,
    ) -> Result<(), RealNodeError> {
        registries::trust_with_login(
            self,
            self.runtime,
            &self.config_dir,
            host_port,
            ca_pem,
            basic,
        )
    }

    /// Gives the image `from` in its containerd the name `to` too (containerd nodes).
    pub fn tag_image(&self, from: &str, to: &str) -> Result<(), RealNodeError> {
        tag_image(self.layout, &self.bin_dir, from, to)
    }

    /// The names of the images in its runtime's store (containerd's namespace `k8s.io`, CRI-O's
    /// storage), as the runtime lists them: `REPOSITORY:TAG`, and containerd's
    /// `REPOSITORY@sha256:…` of a pulled image too.
    pub fn image_names(&self) -> Result<Vec<String>, RealNodeError> {
        match self.runtime {
            NodeRuntime::CriO => crio::image_names(self.layout, &self.bin_dir),
            NodeRuntime::Containerd => Ok(self
                .exec(&[
                    "ctr",
                    "--address",
                    layout::CONTAINERD_SOCKET,
                    "-n",
                    "k8s.io",
                    "images",
                    "ls",
                    "-q",
                ])?
                .lines()
                .map(str::to_owned)
                .collect()),
        }
    }

    /// This node as [`RunningNode`] (what [`import_image`] needs).
    pub fn running(&self) -> RunningNode {
        RunningNode {
            node: self.layout,
            runtime: self.runtime,
            bin_dir: self.bin_dir.clone(),
            config_dir: self.config_dir.clone(),
        }
    }

    /// Stops one daemon (SIGTERM, then SIGKILL after `grace`); containers keep running.
    fn stop_daemon(&self, which: fn(&mut Daemons) -> &mut Option<Component>, grace: Duration) {
        let c = which(&mut self.lock()).take();
        if let Some(c) = c {
            c.stop(grace);
        }
    }

    /// Stops its container runtime and starts it again; the containers (their shims or
    /// conmons) keep running.
    pub fn restart_runtime(&self) -> Result<(), RealNodeError> {
        self.stop_daemon(|d| &mut d.runtime, Duration::from_secs(10));
        self.start_runtime()
    }

    /// Stops the kubelet and starts it again; the pods keep running.
    pub fn restart_kubelet(&self) -> Result<(), RealNodeError> {
        self.stop_daemon(|d| &mut d.kubelet, Duration::from_secs(10));
        self.start_kubelet()
    }

    /// Stops flanneld and starts it again (the node's lease and routes stay meanwhile).
    pub fn restart_flanneld(&self) -> Result<(), RealNodeError> {
        self.stop_daemon(|d| &mut d.flanneld, Duration::from_secs(10));
        self.start_network()
    }

    /// Suffers `strike`; restarting a daemon the node does not run is refused.
    pub fn strike(&self, strike: &Strike) -> Result<(), RealNodeError> {
        match strike {
            Strike::Reboot => self.reboot(),
            Strike::Restart(d) if d == self.runtime.daemon() => self.restart_runtime(),
            Strike::Restart(d) if d == "kubelet" => self.restart_kubelet(),
            Strike::Restart(d) if d == "flanneld" && self.cni == NodeCni::Flannel => {
                self.restart_flanneld()
            }
            Strike::Restart(d) => Err(RealNodeError::Invalid {
                what: "daemon to restart",
                value: format!("{d} on {} ({})", self.name(), self.runtime.name()),
                why: "the node's runtime (containerd or crio), kubelet, or flanneld on a flannel node",
            }),
        }
    }

    /// Stops the daemons (kube-proxy, kubelet, flanneld, the runtime; containers keep running).
    pub(super) fn stop_daemons(&self) {
        self.stop_daemon(|d| &mut d.kube_proxy, Duration::from_secs(5));
        self.stop_daemon(|d| &mut d.kubelet, Duration::from_secs(5));
        self.stop_daemon(|d| &mut d.flanneld, Duration::from_secs(5));
        self.stop_daemon(|d| &mut d.runtime, Duration::from_secs(5));
    }

    /// Powers the node off and on: its daemons stop, every container is killed, its network
    /// namespace (pods' veths, kube-proxy's rules) and its `/run` go, `/var/lib` stays; then its
    /// namespaces are made again and its daemons start, as after a real reboot.
    pub fn reboot(&self) -> Result<(), RealNodeError> {
        self.stop_daemons();
        self.tear_down()?;
        self.create_namespaces()?;
        self.start_runtime()?;
        self.start_kubelet()?;
        self.start_kube_proxy()?;
        self.start_network()
    }

    /// Kills everything in the node's cgroups and removes its namespaces (not its data).
    pub(super) fn tear_down(&self) -> Result<(), RealNodeError> {
        let name = self.name();
        at(
            &name,
            "kill its processes",
            host::kill_cgroup(&self.layout.cgroup()),
        )?;
        at(
            &name,
            "remove its mount namespace",
            host::delete_mount_ns(self.layout),
        )?;
        at(
            &name,
            "remove its network namespace",
            host::delete_node_netns(self.layout),
        )
    }

    /// Resident memory of its daemons (KiB), and of its containers (the pods' cgroups' usage).
    pub fn memory_kib(&self) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = self
            .pids()
            .into_iter()
            .filter_map(|(name, pid)| Some((name, rss_kib(pid)?)))
            .collect();
        let usage = Path::new("/sys/fs/cgroup/memory")
            .join(self.layout.pods_cgroup())
            .join("memory.usage_in_bytes");
        if let Ok(mut f) = std::fs::File::open(&usage) {
            let mut text = String::new();
            if f.read_to_string(&mut text).is_ok()
                && let Ok(bytes) = text.trim().parse::<u64>()
            {
                out.push(("pods".into(), bytes / 1024));
            }
        }
        out
    }
}

/// What reaches a running node from outside its owner (`cluster exec`, `load-image`): which
/// node, its runtime, the node binaries, and its configuration directory
/// (`<state>/nodes/<name>`, with CRI-O's signature policy).
#[derive(Debug, Clone)]
pub struct RunningNode {
    /// The node.
    pub node: NodeLayout,
    /// Its runtime.
    pub runtime: NodeRuntime,
    /// The node binaries (ctr).
    pub bin_dir: PathBuf,
    /// Its configuration directory.
    pub config_dir: PathBuf,
}

/// Imports an OCI archive into a node's runtime under the names it carries and each `also`
/// (from, to) name; in containerd `pinned` ones are labelled so the kubelet's image GC keeps
/// them (CRI-O keeps what its `pinned_images` names: the pause image).
pub fn import_image(
    target: RunningNode,
    archive: &Path,
    pinned: bool,
    also: &[(String, String)],
) -> Result<(), RealNodeError> {
    match target.runtime {
        NodeRuntime::Containerd => {
            import_into_containerd(target.node, &target.bin_dir, archive, pinned)?;
            for (from, to) in also {
                tag_image(target.node, &target.bin_dir, from, to)?;
            }
            Ok(())
        }
        NodeRuntime::CriO => crio::import_image(
            target.node,
            &target.bin_dir,
            &target.config_dir.join("policy.json"),
            archive,
            also,
        ),
    }
}

/// Imports an OCI archive into a node's containerd (namespace `k8s.io`); the archive is read by
/// us, so any path works.
fn import_into_containerd(
    node: NodeLayout,
    bin_dir: &Path,
    archive: &Path,
    pinned: bool,
) -> Result<(), RealNodeError> {
    let name = node.name();
    let file = std::fs::File::open(archive).map_err(|source| RealNodeError::Io {
        node: name.clone(),
        what: format!("open {}", archive.display()),
        source,
    })?;
    let mut command = host::node_command(node, bin_dir, "ctr");
    command.args(["--address", layout::CONTAINERD_SOCKET, "-n", "k8s.io"]);
    command.args(["images", "import", "--digests"]);
    if pinned {
        command.args(["--label", "io.cri-containerd.pinned=pinned"]);
    }
    command.arg("-");
    at(
        &name,
        "import an image",
        command::checked(&mut command, Stdin::File(file))
            .map(drop)
            .map_err(HostError::from),
    )
}

/// Gives an image in a node's containerd a second name.
fn tag_image(node: NodeLayout, bin_dir: &Path, from: &str, to: &str) -> Result<(), RealNodeError> {
    let mut command = host::node_command(node, bin_dir, "ctr");
    command.args(["--address", layout::CONTAINERD_SOCKET, "-n", "k8s.io"]);
    command.args(["images", "tag", "--force", from, to]);
    at(
        &node.name(),
        "tag an image",
        command::checked(&mut command, Stdin::Empty)
            .map(drop)
            .map_err(HostError::from),
    )
}
