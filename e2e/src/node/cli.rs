//! `ipkeep-e2e node`: the command-line face of [`super::run`].

use std::{net::IpAddr, path::PathBuf, process::ExitCode, time::Duration};

use super::{AgentConfig, DEFAULT_NETWORK, NodeConfig, NodeError};

/// Flags of `ipkeep-e2e node`.
#[derive(Debug, clap::Args)]
pub struct NodeArgs {
    /// The Node's name.
    #[arg(long)]
    pub name: String,
    /// A pod CIDR (repeat once for dual-stack: `--pod-cidr 10.244.1.0/24 --pod-cidr fd00:10:244:1::/64`).
    #[arg(long = "pod-cidr", required = true)]
    pub pod_cidrs: Vec<String>,
    /// The node's own directory (absolute; created if missing).
    #[arg(long)]
    pub data_dir: PathBuf,
    /// A directory holding `bridge` and `ipkeep` (repeatable; searched in order, as `CNI_PATH`).
    #[arg(long = "cni-bin-dir", required = true)]
    pub cni_bin_dirs: Vec<PathBuf>,
    /// The CNI network name.
    #[arg(long, default_value = DEFAULT_NETWORK)]
    pub network: String,
    /// The address the node reports and pods get as `hostIP`.
    #[arg(long, default_value = "127.0.0.1")]
    pub host_ip: IpAddr,
    /// Seconds between Node status and Lease renewals.
    #[arg(long, default_value_t = 10)]
    pub heartbeat_seconds: u64,
    /// Milliseconds a sandbox's teardown waits once due (reproduces the force-delete order: a
    /// re-created pod's ADD before the old sandbox's DEL).
    #[arg(long, default_value_t = 0)]
    pub teardown_delay_ms: u64,
    /// `ipkeep-operator` binary: when given, `ipkeep-operator agent` runs as a supervised child.
    #[arg(long)]
    pub agent_bin: Option<PathBuf>,
    /// kubeconfig to use (default: `KUBECONFIG`, then in-cluster); also given to the agent.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

impl NodeArgs {
    /// The node configuration these flags describe.
    pub fn config(&self) -> NodeConfig {
        let mut config = NodeConfig::new(
            &self.name,
            self.pod_cidrs.clone(),
            self.data_dir.clone(),
            self.cni_bin_dirs.clone(),
        );
        config.network = self.network.clone();
        config.host_ip = self.host_ip;
        config.heartbeat = Duration::from_secs(self.heartbeat_seconds.max(1));
        config.teardown_delay = Duration::from_millis(self.teardown_delay_ms);
        config.agent = self.agent_bin.clone().map(|bin| AgentConfig {
            bin,
            kubeconfig: self.kubeconfig.clone(),
            extra_args: Vec::new(),
        });
        config
    }
}

/// A kube client from `--kubeconfig`, else from the environment.
pub async fn client(kubeconfig: Option<&PathBuf>) -> Result<kube::Client, NodeError> {
    let boxed = |name: String| {
        move |e: Box<dyn std::error::Error + Send + Sync>| NodeError::Client {
            source_name: name,
            source: e,
        }
    };
    let config = match kubeconfig {
        Some(path) => {
            let name = path.display().to_string();
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| boxed(name.clone())(Box::new(e)))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| boxed(name.clone())(Box::new(e)))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| boxed("the environment".into())(Box::new(e)))?,
    };
    let name = config.cluster_url.to_string();
    kube::Client::try_from(config).map_err(|e| boxed(name)(Box::new(e)))
}

/// Runs the node until SIGINT or SIGTERM; the exit code says whether it ran cleanly.
pub async fn main(args: NodeArgs) -> ExitCode {
    let config = args.config();
    let name = config.name.clone();
    let result = async {
        config.validate()?;
        if !super::host::is_root() {
            return Err(NodeError::Config(
                "the stand-in needs root: it makes network namespaces and a bridge".into(),
            ));
        }
        let client = client(args.kubeconfig.as_ref()).await?;
        super::run(client, config, shutdown_signal()).await
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                text.push_str(&format!(": {s}"));
                source = s.source();
            }
            eprintln!("ipkeep-e2e node {name}: {text}");
            ExitCode::FAILURE
        }
    }
}

/// Completes on Ctrl-C or SIGTERM (or at once if the handlers cannot be installed, so the node
/// still shuts down cleanly rather than running unstoppable).
async fn shutdown_signal() {
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
