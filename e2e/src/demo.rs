//! `ipkeep-e2e demo`: the whole system on this machine, and the story told in plain output.
//!
//! On real nodes ([`nodes`]): the control plane and two nodes running kubelet,
//! containerd, runc and kube-proxy, ipkeep installed with `helm install` from the chart and
//! `make image`'s archive, and a busybox StatefulSet: its pods and addresses, `web-1` deleted and
//! back with the same address (on `eth0` inside the pod, answering a pod on the other node),
//! `kubectl get ipr -A`, and one reservation expiring. With `--keep` it then waits for Ctrl-C,
//! printing the `KUBECONFIG` to explore with. Whatever happens (an error, Ctrl-C, SIGTERM)
//! everything it started is stopped and removed.

use std::{
    future::Future,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use kube::{
    Api,
    api::{ApiResource, DynamicObject},
};

use crate::cluster::{
    ClusterError,
    realnode::{RealCluster, RealNodeError},
};

mod nodes;

/// What the demo runs with.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// `make image`'s archive, loaded into every real node.
    pub image_archive: PathBuf,
    /// The Helm chart installed on the real nodes.
    pub chart: PathBuf,
    /// Keep everything running after the story until Ctrl-C.
    pub keep: bool,
}

/// Failures of the demo; each names the step.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// Something the demo needs is missing.
    #[error("failed to find {what} at {path}: {hint}")]
    Missing {
        /// What is missing.
        what: &'static str,
        /// Where it was looked for.
        path: PathBuf,
        /// What to do.
        hint: &'static str,
    },
    /// Not root.
    #[error(
        "failed to start: the demo creates network namespaces and bridges, run it as root (make demo does not sudo for you)"
    )]
    NotRoot,
    /// The control plane failed.
    #[error("failed to run the control plane")]
    Cluster(#[from] ClusterError),
    /// The real nodes failed.
    #[error("failed to run the real nodes")]
    RealNodes(#[from] RealNodeError),
    /// A command failed.
    #[error("failed to run `{command}`: {detail}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status and output, or the spawn error.
        detail: String,
    },
    /// A Kubernetes API call failed.
    #[error("failed to {what}")]
    Api {
        /// What was asked.
        what: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// A condition did not come true in time.
    #[error("failed to see {what} within {secs} s")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long it waited.
        secs: u64,
    },
    /// A local file operation failed.
    #[error("failed to {what}")]
    Io {
        /// What was done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A node failed.
    #[error("failed to run node {node}: {detail}")]
    Node {
        /// The node.
        node: String,
        /// Why.
        detail: String,
    },
    /// Interrupted by Ctrl-C or SIGTERM (everything was cleaned up).
    #[error("interrupted; everything was stopped and removed")]
    Interrupted,
}

/// How long one step of the story may take before the demo gives up.
const STEP_DEADLINE: Duration = Duration::from_secs(120);

/// Runs the demo; everything it started is gone when it returns, whatever it returns.
pub async fn run(options: DemoOptions) -> Result<(), DemoError> {
    preflight(&options)?;
    let t0 = Instant::now();
    let work = std::env::temp_dir().join(format!("ipkeep-demo-{}", std::process::id()));
    let mut real: Option<RealCluster> = None;
    let mut told = false;
    let result = {
        let story = nodes::story(&options, &work, &mut real, &mut told, t0);
        tokio::pin!(story);
        tokio::select! {
            r = &mut story => r,
            () = interrupted() => Err(DemoError::Interrupted),
        }
    };
    // With --keep, Ctrl-C after the story is the normal end.
    let result = match result {
        Err(DemoError::Interrupted) if told && options.keep => Ok(()),
        other => other,
    };
    say(
        "Cleaning up: pods, containers, node daemons, their namespaces, mounts, cgroups and firewall rules, the control plane",
    );
    if let Some(cluster) = real.take()
        && let Err(e) = cluster.stop()
    {
        eprintln!("demo: cleanup incomplete: {}", crate::error_chain(&e));
    }
    let _ = std::fs::remove_dir_all(&work);
    if result.is_ok() {
        say(&format!(
            "Done in {:.0} s; nothing is left running.",
            t0.elapsed().as_secs_f64()
        ));
    }
    result
}

fn preflight(options: &DemoOptions) -> Result<(), DemoError> {
    if !rustix::process::geteuid().is_root() {
        return Err(DemoError::NotRoot);
    }
    if !options.image_archive.is_file() {
        return Err(DemoError::Missing {
            what: "the ipkeep image archive",
            path: options.image_archive.clone(),
            hint: "run: make image",
        });
    }
    if !options.chart.join("Chart.yaml").is_file() {
        return Err(DemoError::Missing {
            what: "the Helm chart",
            path: options.chart.clone(),
            hint: "run from the repository root",
        });
    }
    Ok(())
}

async fn interrupted() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

fn say(text: &str) {
    println!("\n==> {text}");
}

fn note(text: &str) {
    println!("    {text}");
}

/// The control plane's kubectl as admin.
struct Kubectl {
    /// The built kubectl.
    bin: PathBuf,
    /// The admin kubeconfig.
    kubeconfig: PathBuf,
}

/// Runs the built kubectl, printing the command line and its output.
fn show(k: &Kubectl, args: &[&str]) -> Result<String, DemoError> {
    println!("\n$ kubectl {}", args.join(" "));
    let out = kubectl(k, args)?;
    print!("{out}");
    Ok(out)
}

fn kubectl(k: &Kubectl, args: &[&str]) -> Result<String, DemoError> {
    let mut cmd = Command::new(&k.bin);
    cmd.env("KUBECONFIG", &k.kubeconfig).args(args);
    run_command(format!("kubectl {}", args.join(" ")), &mut cmd)
}

/// Runs `cmd` (named `command` in errors) without input and returns its stdout; a failure to
/// start or a non-zero exit is a [`DemoError::Command`] carrying its output.
fn run_command(command: String, cmd: &mut Command) -> Result<String, DemoError> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| DemoError::Command {
            command: command.clone(),
            detail: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(DemoError::Command {
            command,
            detail: format!(
                "{}: {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Waits for one step of the story, giving up after [`STEP_DEADLINE`].
async fn wait_for<T, F, Fut>(what: &str, check: F) -> Result<T, DemoError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    crate::wait::wait_for(what, STEP_DEADLINE, check)
        .await
        .map_err(|e| DemoError::Timeout {
            what: e.what,
            secs: e.deadline.as_secs(),
        })
}

fn io_error(what: String) -> impl FnOnce(std::io::Error) -> DemoError {
    move |source| DemoError::Io { what, source }
}

fn ipr_resource() -> ApiResource {
    ApiResource {
        group: "ipkeep.dev".into(),
        version: "v1alpha1".into(),
        api_version: "ipkeep.dev/v1alpha1".into(),
        kind: "IPReservation".into(),
        plural: "ipreservations".into(),
    }
}

async fn reservation_phase(api: &Api<DynamicObject>, name: &str) -> Option<String> {
    let r = api.get_opt(name).await.ok()??;
    r.data["status"]["phase"].as_str().map(str::to_owned)
}

/// The story's StatefulSet: `replicas` pods wherever the scheduler puts them, annotated to keep
/// their addresses for `retain_for`, with the container list items `container` (YAML at six
/// spaces).
fn statefulset(name: &str, replicas: u32, retain_for: &str, container: &str) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {name}
spec:
  serviceName: {name}
  replicas: {replicas}
  podManagementPolicy: Parallel
  selector:
    matchLabels: {{app: {name}}}
  template:
    metadata:
      labels: {{app: {name}}}
      annotations:
        ipkeep.dev/retain: "true"        # keep this pod's IP when it is deleted
        ipkeep.dev/retain-for: "{retain_for}"      # ... for this long after it is gone
    spec:
      # No node named: addresses are node-local, and ipkeep's placement webhook brings a
      # returning pod back to the node that holds its address.
      terminationGracePeriodSeconds: 1
      containers:
{container}"#
    )
}
