//! `ipkeep-e2e demo`: the whole system on this machine, and the story told in plain output.
//!
//! By default on real nodes ([`nodes`]): the control plane and two nodes running kubelet,
//! containerd, runc and kube-proxy, ipkeep installed with `helm install` from the chart and
//! `make image`'s archive, and a busybox StatefulSet: its pods and addresses, `web-1` deleted and
//! back with the same address (on `eth0` inside the pod, answering a pod on the other node),
//! `kubectl get ipr -A`, and one reservation expiring. With `--fast` the same story on the API
//! test server, with two simulated nodes (the kubelet stand-in running Debian's `bridge` with
//! `ipkeep` in network namespaces, each with its agent) and the controller process. With
//! `--keep` it then waits for Ctrl-C, printing the `KUBECONFIG` to explore with. Whatever
//! happens (an error, Ctrl-C, SIGTERM) everything it started is stopped and removed.

use std::{
    future::Future,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{ApiResource, DynamicObject, ListParams},
};

use crate::{
    cluster::{
        ClusterError,
        realnode::{RealCluster, RealNodeError},
    },
    node::{AgentConfig, NodeConfig, host},
};

mod nodes;

/// What the demo runs with.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// The built `ipkeep` plugin.
    pub plugin_bin: PathBuf,
    /// The built `ipkeep-operator` (controller and agent).
    pub operator_bin: PathBuf,
    /// Debian's `bridge` CNI plugin.
    pub bridge_bin: PathBuf,
    /// The IPReservation CRD manifest.
    pub crd: PathBuf,
    /// `make image`'s archive, loaded into every real node.
    pub image_archive: PathBuf,
    /// The Helm chart installed on the real nodes.
    pub chart: PathBuf,
    /// Keep everything running after the story until Ctrl-C.
    pub keep: bool,
    /// Run on the in-memory API test server (with a StatefulSet stand-in, no scheduler, no
    /// kubectl) instead of the real control plane: no Go build, a first look in seconds.
    pub fast: bool,
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
    /// A simulated node failed.
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

/// The two simulated nodes: name and pod CIDR.
const NODES: [(&str, &str); 2] = [("node-a", "10.244.1.0/24"), ("node-b", "10.244.2.0/24")];

/// Runs the demo; everything it started is gone when it returns, whatever it returns.
pub async fn run(options: DemoOptions) -> Result<(), DemoError> {
    preflight(&options)?;
    let t0 = Instant::now();
    let work = std::env::temp_dir().join(format!("ipkeep-demo-{}", std::process::id()));
    let mut stack = Stack::default();
    let mut real: Option<RealCluster> = None;
    let mut told = false;
    let result = {
        let story = async {
            if options.fast {
                story(&options, &work, &mut stack, &mut told, t0).await
            } else {
                nodes::story(&options, &work, &mut real, &mut told, t0).await
            }
        };
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
    if options.fast {
        say(
            "Cleaning up: nodes (sandboxes, network namespaces, bridges, agents), controller, control plane",
        );
        stack.stop().await;
    } else {
        say(
            "Cleaning up: pods, containers, node daemons, their namespaces, mounts, cgroups and firewall rules, the control plane",
        );
        if let Some(cluster) = real.take()
            && let Err(e) = cluster.stop()
        {
            eprintln!("demo: cleanup incomplete: {}", crate::error_chain(&e));
        }
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
    if !host::is_root() {
        return Err(DemoError::NotRoot);
    }
    if !options.fast {
        return preflight_real(options);
    }
    let checks = [
        (
            "the ipkeep plugin",
            &options.plugin_bin,
            "run: cargo build -p ipkeep-plugin",
        ),
        (
            "ipkeep-operator",
            &options.operator_bin,
            "run: cargo build -p ipkeep-operator",
        ),
        (
            "Debian's bridge plugin",
            &options.bridge_bin,
            "run: make deps",
        ),
        (
            "the IPReservation CRD",
            &options.crd,
            "run from the repository root",
        ),
    ];
    for (what, path, hint) in checks {
        if !path.is_file() {
            return Err(DemoError::Missing {
                what,
                path: path.clone(),
                hint,
            });
        }
    }
    Ok(())
}

fn preflight_real(options: &DemoOptions) -> Result<(), DemoError> {
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

/// A simulated node running as a task: its name, its stop signal, the task.
type RunningNode = (
    String,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), crate::node::NodeError>>,
);

/// What has been started, stopped in reverse order.
#[derive(Default)]
struct Stack {
    server: Option<crate::apiserver::TestServer>,
    standin: Option<tokio::task::JoinHandle<()>>,
    nodes: Vec<RunningNode>,
    controller: Option<Child>,
}

impl Stack {
    async fn stop(&mut self) {
        if let Some(mut c) = self.controller.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for (name, stop, task) in self.nodes.drain(..) {
            let _ = stop.send(());
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => eprintln!("demo: node {name}: {}", crate::error_chain(&e)),
                Err(e) => eprintln!("demo: node {name}: {e}"),
            }
        }
        if let Some(task) = self.standin.take() {
            task.abort();
        }
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
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

/// A running pod's (uid, podIPs).
fn running(p: &Pod) -> Option<(String, Vec<String>)> {
    if p.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = p.status.as_ref()?;
    if status.phase.as_deref() != Some("Running") {
        return None;
    }
    let ips: Vec<String> = status
        .pod_ips
        .as_ref()?
        .iter()
        .map(|i| i.ip.clone())
        .collect();
    (!ips.is_empty()).then(|| (p.metadata.uid.clone().unwrap_or_default(), ips))
}

async fn reservation_phase(api: &Api<DynamicObject>, name: &str) -> Option<String> {
    let r = api.get_opt(name).await.ok()??;
    r.data["status"]["phase"].as_str().map(str::to_owned)
}

/// The FAST story's container: nothing runs it, the stand-in only does networking.
const STANDIN_CONTAINER: &str = "      - name: app
        image: registry.invalid/demo:1   # no container runs: the stand-in only does networking
";

/// The story's StatefulSet: `replicas` pods on `node`, annotated to keep their addresses for
/// `retain_for`, with the container list items `container` (YAML at six spaces).
fn statefulset(name: &str, replicas: u32, retain_for: &str, node: &str, container: &str) -> String {
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
      nodeSelector:
        kubernetes.io/hostname: {node}   # addresses are node-local: a pod keeps its IP on its node
      terminationGracePeriodSeconds: 1
      containers:
{container}"#
    )
}

/// Starts the two simulated nodes, each with its agent talking to the API server of
/// `kubeconfig`, as tasks on this runtime.
fn start_nodes(
    options: &DemoOptions,
    work: &Path,
    stack: &mut Stack,
    client: &kube::Client,
    kubeconfig: &Path,
) -> Result<(), DemoError> {
    let bin_dir = work.join("cni-bin");
    std::fs::create_dir_all(&bin_dir).map_err(io_error(format!("create {}", bin_dir.display())))?;
    host::link_cni_bin_dir(&bin_dir, &options.bridge_bin, &options.plugin_bin).map_err(
        io_error(format!("link the CNI plugins into {}", bin_dir.display())),
    )?;
    for (name, cidr) in NODES {
        let mut config = NodeConfig::new(
            name,
            vec![cidr.to_owned()],
            work.join(name),
            vec![bin_dir.clone()],
        );
        config.agent = Some(AgentConfig::on_own_port(
            options.operator_bin.clone(),
            kubeconfig.to_path_buf(),
        ));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(crate::node::run(client.clone(), config, async {
            let _ = rx.await;
        }));
        stack.nodes.push((name.to_owned(), tx, task));
        note(&format!("{name}: pod CIDR {cidr}"));
    }
    Ok(())
}

/// Starts the ipkeep controller (the built binary) against the API server of `kubeconfig`.
fn start_controller(
    options: &DemoOptions,
    work: &Path,
    stack: &mut Stack,
    kubeconfig: &Path,
) -> Result<PathBuf, DemoError> {
    let log = work.join("controller.log");
    let log_file =
        std::fs::File::create(&log).map_err(io_error(format!("create {}", log.display())))?;
    let controller = Command::new("setpriv")
        .args(["--pdeathsig", "KILL", "--"])
        .arg(&options.operator_bin)
        .args([
            "controller",
            "--metrics-addr",
            "127.0.0.1:0",
            "--identity",
            "demo-controller",
        ])
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .map_err(|e| DemoError::Command {
            command: format!("{} controller", options.operator_bin.display()),
            detail: e.to_string(),
        })?;
    stack.controller = Some(controller);
    Ok(log)
}

/// The FAST story: the API test server, simulated nodes and the controller process.
async fn story(
    options: &DemoOptions,
    work: &Path,
    stack: &mut Stack,
    told: &mut bool,
    t0: Instant,
) -> Result<(), DemoError> {
    let _ = std::fs::remove_dir_all(work);
    std::fs::create_dir_all(work).map_err(io_error(format!("create {}", work.display())))?;
    let (sets, client, kubeconfig) = fast::start(options, work, stack, t0).await?;
    start_nodes(options, work, stack, &client, &kubeconfig)?;
    say("Starting the ipkeep controller");
    start_controller(options, work, stack, &kubeconfig)?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), fast::FAST_NS);
    let iprs: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), fast::FAST_NS, &ipr_resource());
    let bound = |name: String| {
        let iprs = iprs.clone();
        async move { (reservation_phase(&iprs, &name).await.as_deref() == Some("Bound")).then_some(()) }
    };

    say("1. An annotated StatefulSet with 3 replicas");
    fast::create_set(
        &sets,
        &statefulset("web", 3, "10m", "node-a", STANDIN_CONTAINER),
    )
    .await?;
    for i in 0..3 {
        let name = format!("web-{i}");
        wait_for(&format!("{name} Running with an IP"), || async {
            running(&pods.get_opt(&name).await.ok()??)
        })
        .await?;
        wait_for(&format!("the reservation of {name} Bound"), || {
            bound(name.clone())
        })
        .await?;
    }
    fast::show_pods(&pods).await?;
    fast::show_iprs(&iprs).await?;

    say("2. Delete web-1: it is re-created, and ipkeep gives it its address back");
    let Some((old_uid, old_ips)) = pods
        .get_opt("web-1")
        .await
        .ok()
        .flatten()
        .as_ref()
        .and_then(running)
    else {
        return Err(DemoError::Timeout {
            what: "web-1 running".into(),
            secs: 0,
        });
    };
    println!("\n~ kubectl delete pod web-1");
    pods.delete("web-1", &kube::api::DeleteParams::default())
        .await
        .map_err(|source| DemoError::Api {
            what: "delete web-1".into(),
            source,
        })?;
    let (new_uid, new_ips) = wait_for("web-1 back and Running", || async {
        let got = running(&pods.get_opt("web-1").await.ok()??)?;
        (got.0 != old_uid).then_some(got)
    })
    .await?;
    wait_for("web-1's reservation Bound again", || {
        bound("web-1".to_owned())
    })
    .await?;
    note(&format!(
        "web-1 again: uid {new_uid} (a new pod), IP {} — {}",
        new_ips.join(", "),
        if new_ips == old_ips {
            "the same address"
        } else {
            "A DIFFERENT ADDRESS (this is a bug)"
        }
    ));
    fast::show_iprs(&iprs).await?;
    if new_ips != old_ips {
        return Err(DemoError::Command {
            command: "the demo's check".into(),
            detail: format!("web-1 came back with {new_ips:?}, not {old_ips:?}"),
        });
    }

    say("3. A reservation expires: a StatefulSet `cache` with retain-for 5s, scaled to 0");
    fast::create_set(
        &sets,
        &statefulset("cache", 1, "5s", "node-b", STANDIN_CONTAINER),
    )
    .await?;
    wait_for("cache-0 Running", || async {
        running(&pods.get_opt("cache-0").await.ok()??)
    })
    .await?;
    wait_for("cache-0's reservation Bound", || {
        bound("cache-0".to_owned())
    })
    .await?;
    fast::scale(&sets, "cache", 0).await?;
    wait_for("cache-0's reservation Released", || async {
        (reservation_phase(&iprs, "cache-0").await.as_deref() == Some("Released")).then_some(())
    })
    .await?;
    fast::show_iprs(&iprs).await?;
    wait_for(
        "cache-0's reservation deleted at its release time",
        || async { iprs.get_opt("cache-0").await.ok()?.is_none().then_some(()) },
    )
    .await?;
    note("At its release time the controller deleted it and the address is free again:");
    fast::show_iprs(&iprs).await?;

    say(&format!(
        "The story took {:.0} s from nothing.",
        t0.elapsed().as_secs_f64()
    ));
    *told = true;
    if options.keep {
        say("Everything keeps running until you press Ctrl-C. In another terminal:");
        println!("\n    export KUBECONFIG={}\n", kubeconfig.display());
        std::future::pending::<()>().await;
    }
    Ok(())
}

/// `--fast`: the same story on the API test server, with a StatefulSet stand-in.
mod fast {
    use std::collections::BTreeMap;

    use k8s_openapi::api::apps::v1::StatefulSet;
    use kube::{
        ResourceExt,
        api::{DeleteParams, Patch, PatchParams, PostParams},
    };

    use super::*;
    use crate::apiserver::{ServerOptions, TestServer};

    /// The namespace of the FAST story.
    pub(super) const FAST_NS: &str = "default";

    /// Keeps each StatefulSet's pods `<name>-0..replicas-1` existing, placed on the node its
    /// template's `kubernetes.io/hostname` node selector names (there is no scheduler), and
    /// deletes the ordinals beyond `replicas`: what the StatefulSet controller does, no more.
    async fn statefulset_standin(client: kube::Client) {
        let sets: Api<StatefulSet> = Api::namespaced(client.clone(), FAST_NS);
        let pods: Api<Pod> = Api::namespaced(client, FAST_NS);
        loop {
            if let (Ok(sets), Ok(existing)) = (
                sets.list(&ListParams::default()).await,
                pods.list(&ListParams::default()).await,
            ) {
                let names: BTreeMap<String, bool> = existing
                    .items
                    .iter()
                    .map(|p| (p.name_any(), p.metadata.deletion_timestamp.is_some()))
                    .collect();
                for set in sets.items {
                    let name = set.name_any();
                    let Some(spec) = set.spec else { continue };
                    let replicas = spec.replicas.unwrap_or(1).max(0);
                    for i in 0..replicas {
                        let pod_name = format!("{name}-{i}");
                        if names.contains_key(&pod_name) {
                            continue;
                        }
                        let mut pod_spec = spec.template.spec.clone().unwrap_or_default();
                        pod_spec.node_name = pod_spec
                            .node_selector
                            .as_ref()
                            .and_then(|s| s.get("kubernetes.io/hostname").cloned());
                        let template = spec.template.metadata.clone().unwrap_or_default();
                        let pod = Pod {
                            metadata: kube::api::ObjectMeta {
                                name: Some(pod_name),
                                labels: template.labels,
                                annotations: template.annotations,
                                ..Default::default()
                            },
                            spec: Some(pod_spec),
                            status: None,
                        };
                        let _ = pods.create(&PostParams::default(), &pod).await;
                    }
                    for (pod_name, deleting) in &names {
                        let ordinal = pod_name
                            .strip_prefix(&format!("{name}-"))
                            .and_then(|o| o.parse::<i32>().ok());
                        if !deleting && ordinal.is_some_and(|o| o >= replicas) {
                            let _ = pods.delete(pod_name, &DeleteParams::default()).await;
                        }
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// One line of `kubectl get pods` as the FAST story prints it.
    fn pod_row(p: &Pod) -> String {
        let status = p.status.as_ref();
        format!(
            "{:<9} {:<10} {:<13} {:<9} {}",
            p.name_any(),
            status.and_then(|s| s.phase.clone()).unwrap_or_default(),
            status.and_then(|s| s.pod_ip.clone()).unwrap_or_default(),
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default(),
            p.metadata.uid.clone().unwrap_or_default()
        )
    }

    /// One line of `kubectl get ipr` as the FAST story prints it.
    fn ipr_row(r: &DynamicObject) -> String {
        format!(
            "{:<9} {:<18} {:<9} {:<10} {}",
            r.name_any(),
            r.data["spec"]["ips"].to_string(),
            r.data["spec"]["nodeName"].as_str().unwrap_or_default(),
            r.data["status"]["phase"].as_str().unwrap_or_default(),
            r.data["status"]["releaseTime"].as_str().unwrap_or_default()
        )
    }

    /// Lists `api` and prints it like `kubectl get <kind>`: the header, then a row each.
    async fn show_list<K>(
        api: &Api<K>,
        kind: &str,
        header: &str,
        row: fn(&K) -> String,
    ) -> Result<(), DemoError>
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        println!("\n~ kubectl get {kind}\n{header}");
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(|source| DemoError::Api {
                what: format!("list {kind}"),
                source,
            })?;
        for item in &list.items {
            println!("{}", row(item));
        }
        Ok(())
    }

    pub(super) async fn show_pods(pods: &Api<Pod>) -> Result<(), DemoError> {
        let header = "NAME      STATUS     IP            NODE      UID";
        show_list(pods, "pods", header, pod_row).await
    }

    pub(super) async fn show_iprs(iprs: &Api<DynamicObject>) -> Result<(), DemoError> {
        let header = "NAME      IPS                NODE      PHASE      RELEASE-TIME";
        show_list(iprs, "ipr", header, ipr_row).await
    }

    pub(super) async fn create_set(sets: &Api<StatefulSet>, yaml: &str) -> Result<(), DemoError> {
        println!("\n~ kubectl apply -f - <<EOF\n{yaml}EOF");
        let set: StatefulSet = serde_saphyr::from_str(yaml).map_err(|e| DemoError::Command {
            command: "parse the StatefulSet".into(),
            detail: e.to_string(),
        })?;
        sets.create(&PostParams::default(), &set)
            .await
            .map_err(|source| DemoError::Api {
                what: "create the StatefulSet".into(),
                source,
            })?;
        Ok(())
    }

    /// `kubectl scale statefulset <set> --replicas=<n>`, through the API.
    pub(super) async fn scale(
        sets: &Api<StatefulSet>,
        set: &str,
        replicas: u32,
    ) -> Result<(), DemoError> {
        println!("\n~ kubectl scale statefulset {set} --replicas={replicas}");
        sets.patch(
            set,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": replicas}})),
        )
        .await
        .map(|_| ())
        .map_err(|source| DemoError::Api {
            what: format!("scale {set} to {replicas}"),
            source,
        })
    }

    /// Starts the API test server with the CRD and the StatefulSet stand-in.
    pub(super) async fn start(
        options: &DemoOptions,
        work: &Path,
        stack: &mut Stack,
        t0: Instant,
    ) -> Result<(Api<StatefulSet>, kube::Client, PathBuf), DemoError> {
        say(
            "Starting the API test server (in memory, plain HTTP on 127.0.0.1). FAST mode: a small StatefulSet stand-in replaces the StatefulSet controller and the scheduler, and there is no kubectl: lines starting with `~ kubectl` are done through the API, their output printed like kubectl's",
        );
        let crd_dir = options
            .crd
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let server = TestServer::start(ServerOptions {
            crd_dirs: vec![crd_dir],
            ..ServerOptions::default()
        })
        .await
        .map_err(|e| DemoError::Command {
            command: "start the API test server".into(),
            detail: crate::error_chain(&e),
        })?;
        let kubeconfig = work.join("kubeconfig");
        server
            .write_kubeconfig(&kubeconfig)
            .map_err(|e| DemoError::Command {
                command: "write the kubeconfig".into(),
                detail: crate::error_chain(&e),
            })?;
        let url = server.url();
        let client = server.client();
        stack.server = Some(server);
        note(&format!(
            "ready after {:.1} s at {url}",
            t0.elapsed().as_secs_f64()
        ));
        stack.standin = Some(tokio::spawn(statefulset_standin(client.clone())));
        say(
            "Starting two simulated nodes (kubelet stand-ins running the CNI bridge plugin with ipkeep in network namespaces, each with its ipkeep agent)",
        );
        let sets = Api::namespaced(client.clone(), FAST_NS);
        Ok((sets, client, kubeconfig))
    }
}
