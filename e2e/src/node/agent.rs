//! Supervision of the node's ipkeep agent (`ipkeep-operator agent`) as a child process:
//! started with the node's name, data directory and network, restarted with back-off when it
//! exits, stopped with SIGTERM (then SIGKILL) when the stand-in stops.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use tokio::sync::watch;

/// How to run the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentConfig {
    /// The `ipkeep-operator` binary.
    pub bin: PathBuf,
    /// Given to the agent as `KUBECONFIG` (else it inherits the stand-in's environment).
    pub kubeconfig: Option<PathBuf>,
    /// More arguments after the stand-in's own, e.g. `--probe-addr 127.0.0.1:0` where several
    /// agents share one machine and the default port would collide.
    pub extra_args: Vec<String>,
}

impl AgentConfig {
    /// `bin` with `KUBECONFIG=kubeconfig` and its probes on a port of its own (several agents
    /// share this machine): how the tests and the demo run their nodes' agents.
    pub fn on_own_port(bin: PathBuf, kubeconfig: PathBuf) -> AgentConfig {
        AgentConfig {
            bin,
            kubeconfig: Some(kubeconfig),
            extra_args: vec!["--probe-addr".into(), "127.0.0.1:0".into()],
        }
    }
}

/// The agent's command line: `agent --node-name N --data-dir DIR --network NAME`.
pub fn agent_args(node: &str, ipam_data_dir: &std::path::Path, network: &str) -> Vec<String> {
    vec![
        "agent".into(),
        "--node-name".into(),
        node.into(),
        "--data-dir".into(),
        ipam_data_dir.display().to_string(),
        "--network".into(),
        network.into(),
    ]
}

/// How long the agent gets to exit after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// How often the child is checked for having exited.
const POLL: Duration = Duration::from_millis(100);

/// Runs the agent until `stop` turns true, restarting it (1 s doubling to 30 s; back to 1 s
/// after a run of a minute) whenever it exits.
pub async fn supervise(
    config: AgentConfig,
    args: Vec<String>,
    node: String,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_secs(1);
    loop {
        if *stop.borrow() {
            return;
        }
        let mut command = Command::new(&config.bin);
        command
            .args(&args)
            .args(&config.extra_args)
            .stdin(Stdio::null());
        if let Some(kubeconfig) = &config.kubeconfig {
            command.env("KUBECONFIG", kubeconfig);
        }
        let started = tokio::time::Instant::now();
        match command.spawn() {
            Ok(mut child) => {
                eprintln!(
                    "ipkeep-e2e node {node}: started agent {} (pid {})",
                    config.bin.display(),
                    child.id()
                );
                loop {
                    tokio::select! {
                        _ = stop.changed() => {
                            terminate(&mut child, &node).await;
                            return;
                        }
                        () = tokio::time::sleep(POLL) => {}
                    }
                    match child.try_wait() {
                        Ok(Some(status)) => {
                            eprintln!(
                                "ipkeep-e2e node {node}: agent exited ({status}); restarting in {backoff:?}"
                            );
                            break;
                        }
                        Ok(None) => {}
                        Err(e) => {
                            eprintln!("ipkeep-e2e node {node}: failed to check on the agent: {e}");
                        }
                    }
                }
            }
            Err(e) => eprintln!(
                "ipkeep-e2e node {node}: failed to start agent {}: {e}; retrying in {backoff:?}",
                config.bin.display()
            ),
        }
        if started.elapsed() > Duration::from_secs(60) {
            backoff = Duration::from_secs(1);
        }
        tokio::select! {
            _ = stop.changed() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

/// SIGTERM (through `kill`, the workspace forbids `unsafe`), then SIGKILL after [`STOP_GRACE`].
async fn terminate(child: &mut Child, node: &str) {
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .is_ok_and(|s| s.success());
    if sent {
        let deadline = tokio::time::Instant::now() + STOP_GRACE;
        while tokio::time::Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                eprintln!("ipkeep-e2e node {node}: agent stopped");
                return;
            }
            tokio::time::sleep(POLL).await;
        }
    }
    if let Err(e) = child.kill() {
        eprintln!("ipkeep-e2e node {node}: failed to kill the agent: {e}");
    }
    let _ = child.wait();
}
