//! `ipkeep-e2e demo`: the whole system on this machine, and the story told in plain output.
//!
//! It starts the real control plane (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler on 127.0.0.1), installs the IPReservation CRD, starts two simulated nodes (the
//! kubelet stand-in running Debian's `bridge` with `ipkeep` in network namespaces, each with its
//! ipkeep agent) and the ipkeep controller, then walks through: an annotated 3-replica
//! StatefulSet, its pods and addresses, `web-1` deleted and back with the same address, `kubectl
//! get ipr -A`, and one reservation expiring. With `--keep` it then waits for Ctrl-C, printing
//! the `KUBECONFIG` to explore with. Whatever happens (an error, Ctrl-C, SIGTERM) everything it
//! started is stopped and removed: sandboxes, namespaces, bridges, agents, the controller and the
//! control plane with its state directory.

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
    cluster::{Cluster, ClusterError, ClusterOptions},
    node::{AgentConfig, NodeConfig, host},
};

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

/// The namespace of the story.
const NS: &str = "demo";

/// Runs the demo; everything it started is gone when it returns, whatever it returns.
pub async fn run(options: DemoOptions) -> Result<(), DemoError> {
    preflight(&options)?;
    let t0 = Instant::now();
    let work = std::env::temp_dir().join(format!("ipkeep-demo-{}", std::process::id()));
    let mut stack = Stack::default();
    let mut told = false;
    let result = {
        let story = story(&options, &work, &mut stack, &mut told, t0);
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
        "Cleaning up: nodes (sandboxes, network namespaces, bridges, agents), controller, control plane",
    );
    stack.stop().await;
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
    cluster: Option<Cluster>,
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
        if let Some(cluster) = self.cluster.take() {
            cluster.stop();
        }
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
    }
}

/// Several agents share this machine: a wrapper gives each a probe port of its own.
fn write_agent_wrapper(work: &Path, operator: &Path) -> Result<PathBuf, DemoError> {
    let agent = work.join("ipkeep-operator-agent");
    std::fs::write(
        &agent,
        format!(
            "#!/bin/sh\nexec '{}' \"$@\" --probe-addr 127.0.0.1:0\n",
            operator.display()
        ),
    )
    .and_then(|()| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755))
    })
    .map_err(|source| DemoError::Io {
        what: format!("write {}", agent.display()),
        source,
    })?;
    Ok(agent)
}

fn say(text: &str) {
    println!("\n==> {text}");
}

fn note(text: &str) {
    println!("    {text}");
}

/// Runs the built kubectl, printing the command line and its output.
fn show(cluster: &Cluster, args: &[&str]) -> Result<String, DemoError> {
    println!("\n$ kubectl {}", args.join(" "));
    let out = kubectl(cluster, args)?;
    print!("{out}");
    Ok(out)
}

fn kubectl(cluster: &Cluster, args: &[&str]) -> Result<String, DemoError> {
    let command = format!("kubectl {}", args.join(" "));
    let out = cluster
        .kubectl()
        .args(args)
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

fn kubectl_apply(cluster: &Cluster, yaml: &str, work: &Path, name: &str) -> Result<(), DemoError> {
    let path = work.join(name);
    std::fs::write(&path, yaml).map_err(|source| DemoError::Io {
        what: format!("write {}", path.display()),
        source,
    })?;
    println!("\n$ cat {name}\n{yaml}");
    let p = path.display().to_string();
    show(cluster, &["-n", NS, "apply", "-f", &p]).map(|_| ())
}

async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> Result<T, DemoError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if started.elapsed() > STEP_DEADLINE {
            return Err(DemoError::Timeout {
                what: what.to_owned(),
                secs: STEP_DEADLINE.as_secs(),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
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

fn statefulset(name: &str, replicas: u32, retain_for: &str, node: &str) -> String {
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
      - name: app
        image: registry.invalid/demo:1   # no container runs: the stand-in only does networking
"#
    )
}

async fn story(
    options: &DemoOptions,
    work: &Path,
    stack: &mut Stack,
    told: &mut bool,
    t0: Instant,
) -> Result<(), DemoError> {
    let mkdir = |p: &Path| {
        std::fs::create_dir_all(p).map_err(|source| DemoError::Io {
            what: format!("create {}", p.display()),
            source,
        })
    };
    let _ = std::fs::remove_dir_all(work);
    mkdir(work)?;
    if options.fast {
        return fast::story(options, work, stack, told, t0).await;
    }

    say(
        "Starting a real Kubernetes control plane on 127.0.0.1 (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)",
    );
    let cluster = Cluster::start(ClusterOptions::default()).await?;
    note(&format!(
        "ready after {:.1} s; API server {}",
        t0.elapsed().as_secs_f64(),
        cluster.server()
    ));
    let cluster = stack.cluster.insert(cluster);
    let crd = options.crd.display().to_string();
    say("Installing the IPReservation custom resource (kubectl get ipr)");
    show(cluster, &["apply", "-f", &crd])?;
    kubectl(
        cluster,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/ipreservations.ipkeep.dev",
        ],
    )?;
    kubectl(cluster, &["create", "namespace", NS])?;

    say(
        "Starting two simulated nodes: each is a kubelet stand-in that gives pods real network namespaces through the CNI bridge plugin with ipkeep as its IPAM, plus the ipkeep agent of that node",
    );
    let bin_dir = work.join("cni-bin");
    mkdir(&bin_dir)?;
    host::link_cni_bin_dir(&bin_dir, &options.bridge_bin, &options.plugin_bin).map_err(
        |source| DemoError::Io {
            what: format!("link the CNI plugins into {}", bin_dir.display()),
            source,
        },
    )?;
    let agent = write_agent_wrapper(work, &options.operator_bin)?;
    for (name, cidr) in NODES {
        let mut config = NodeConfig::new(
            name,
            vec![cidr.to_owned()],
            work.join(name),
            vec![bin_dir.clone()],
        );
        config.agent = Some(AgentConfig {
            bin: agent.clone(),
            kubeconfig: Some(cluster.kubeconfig_path().to_path_buf()),
        });
        let client = cluster.client()?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(crate::node::run(client, config, async {
            let _ = rx.await;
        }));
        stack.nodes.push((name.to_owned(), tx, task));
        note(&format!("{name}: pod CIDR {cidr}"));
    }
    let client = cluster.client()?;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    for (name, _) in NODES {
        wait_for(&format!("node {name} Ready and schedulable"), || {
            let nodes = nodes.clone();
            async move {
                let n = nodes.get_opt(name).await.ok()??;
                let ready = n
                    .status
                    .as_ref()?
                    .conditions
                    .as_ref()?
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                let tainted = n
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|t| !t.is_empty());
                (ready && !tainted).then_some(())
            }
        })
        .await?;
    }
    for (name, task) in stack.nodes.iter().map(|(n, _, t)| (n, t)) {
        if task.is_finished() {
            return Err(DemoError::Node {
                node: name.clone(),
                detail: "its stand-in stopped (see the lines above)".into(),
            });
        }
    }
    show(cluster, &["get", "nodes", "-o", "wide"])?;

    say("Starting the ipkeep controller (leader-elected through a Lease)");
    let log = work.join("controller.log");
    let log_file = std::fs::File::create(&log).map_err(|source| DemoError::Io {
        what: format!("create {}", log.display()),
        source,
    })?;
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
        .env("KUBECONFIG", cluster.kubeconfig_path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .map_err(|e| DemoError::Command {
            command: format!("{} controller", options.operator_bin.display()),
            detail: e.to_string(),
        })?;
    stack.controller = Some(controller);
    note(&format!("its log: {}", log.display()));

    say("1. An annotated StatefulSet with 3 replicas");
    kubectl_apply(
        cluster,
        &statefulset("web", 3, "10m", "node-a"),
        work,
        "web.yaml",
    )?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let iprs: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &ipr_resource());
    for i in 0..3 {
        let name = format!("web-{i}");
        wait_for(&format!("{name} Running with an IP"), || async {
            running(&pods.get_opt(&name).await.ok()??)
        })
        .await?;
        wait_for(&format!("the reservation of {name} Bound"), || async {
            (reservation_phase(&iprs, &name).await.as_deref() == Some("Bound")).then_some(())
        })
        .await?;
    }
    note(
        "The scheduler placed the pods; each node's CNI chain gave them addresses from that node's range:",
    );
    show(cluster, &["-n", NS, "get", "pods", "-o", "wide"])?;
    note(
        "ipkeep's controller made one IPReservation per pod, named like the pod; the agents wrote them to each node's disk:",
    );
    show(cluster, &["-n", NS, "get", "ipr"])?;

    say("2. Delete web-1: the StatefulSet re-creates it, and ipkeep gives it its address back");
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
    note(&format!(
        "web-1 now: uid {old_uid}, IP {}",
        old_ips.join(", ")
    ));
    show(cluster, &["-n", NS, "delete", "pod", "web-1"])?;
    let (new_uid, new_ips) = wait_for("web-1 back and Running", || async {
        let got = running(&pods.get_opt("web-1").await.ok()??)?;
        (got.0 != old_uid).then_some(got)
    })
    .await?;
    wait_for("web-1's reservation Bound again", || async {
        (reservation_phase(&iprs, "web-1").await.as_deref() == Some("Bound")).then_some(())
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
    show(cluster, &["-n", NS, "get", "pods", "-o", "wide"])?;
    show(cluster, &["get", "ipr", "-A", "-o", "wide"])?;
    if new_ips != old_ips {
        return Err(DemoError::Command {
            command: "the demo's check".into(),
            detail: format!("web-1 came back with {new_ips:?}, not {old_ips:?}"),
        });
    }

    say("3. A reservation expires: a StatefulSet `cache` with retain-for 5s, scaled to 0");
    kubectl_apply(
        cluster,
        &statefulset("cache", 1, "5s", "node-b"),
        work,
        "cache.yaml",
    )?;
    let (_, cache_ips) = wait_for("cache-0 Running", || async {
        running(&pods.get_opt("cache-0").await.ok()??)
    })
    .await?;
    wait_for("cache-0's reservation Bound", || async {
        (reservation_phase(&iprs, "cache-0").await.as_deref() == Some("Bound")).then_some(())
    })
    .await?;
    show(
        cluster,
        &["-n", NS, "scale", "statefulset", "cache", "--replicas=0"],
    )?;
    wait_for("cache-0's reservation Released", || async {
        (reservation_phase(&iprs, "cache-0").await.as_deref() == Some("Released")).then_some(())
    })
    .await?;
    note(&format!(
        "cache-0 is gone; its address {} stays reserved (nobody else gets it) until RELEASE-TIME:",
        cache_ips.join(", ")
    ));
    show(cluster, &["-n", NS, "get", "ipr", "cache-0"])?;
    wait_for(
        "cache-0's reservation deleted at its release time",
        || async { iprs.get_opt("cache-0").await.ok()?.is_none().then_some(()) },
    )
    .await?;
    note(
        "Five seconds later the controller deleted it, the agent removed the node's file, and the address is free again:",
    );
    show(cluster, &["get", "ipr", "-A"])?;

    let listed = pods
        .list(&ListParams::default())
        .await
        .map_err(|source| DemoError::Api {
            what: "list the demo's pods".into(),
            source,
        })?;
    say(&format!(
        "The story took {:.0} s from nothing; {} pods are running.",
        t0.elapsed().as_secs_f64(),
        listed.items.len()
    ));
    *told = true;
    if options.keep {
        say("Everything keeps running until you press Ctrl-C. In another terminal:");
        println!(
            "\n    export KUBECONFIG={}\n    export PATH={}:$PATH   # the kubectl of this control plane\n    kubectl -n {NS} get pods,ipr -o wide\n    kubectl -n {NS} delete pod web-0   # and watch it come back with its IP\n",
            cluster.kubeconfig_path().display(),
            cluster
                .bin("kubectl")
                .parent()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        );
        std::future::pending::<()>().await;
    }
    Ok(())
}

/// `--fast`: the same story on the API test server, with a StatefulSet stand-in.
mod fast {
    use std::{collections::BTreeMap, path::Path, process::Command, time::Instant};

    use k8s_openapi::api::{apps::v1::StatefulSet, core::v1::Pod};
    use kube::{
        Api, ResourceExt,
        api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
    };

    use super::*;
    use crate::apiserver::{ServerOptions, TestServer};

    const FAST_NS: &str = "default";

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

    fn print_pods(list: &[Pod]) {
        println!("NAME      STATUS     IP            NODE      UID");
        for p in list {
            let status = p.status.as_ref();
            println!(
                "{:<9} {:<10} {:<13} {:<9} {}",
                p.name_any(),
                status.and_then(|s| s.phase.clone()).unwrap_or_default(),
                status.and_then(|s| s.pod_ip.clone()).unwrap_or_default(),
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default(),
                p.metadata.uid.clone().unwrap_or_default()
            );
        }
    }

    fn print_iprs(list: &[DynamicObject]) {
        println!("NAME      IPS                NODE      PHASE      RELEASE-TIME");
        for r in list {
            let ips = r.data["spec"]["ips"].to_string();
            println!(
                "{:<9} {:<18} {:<9} {:<10} {}",
                r.name_any(),
                ips,
                r.data["spec"]["nodeName"].as_str().unwrap_or_default(),
                r.data["status"]["phase"].as_str().unwrap_or_default(),
                r.data["status"]["releaseTime"].as_str().unwrap_or_default()
            );
        }
    }

    async fn show_pods(pods: &Api<Pod>) -> Result<(), DemoError> {
        println!("\n~ kubectl get pods");
        let list = pods
            .list(&ListParams::default())
            .await
            .map_err(|source| DemoError::Api {
                what: "list pods".into(),
                source,
            })?;
        print_pods(&list.items);
        Ok(())
    }

    async fn show_iprs(iprs: &Api<DynamicObject>) -> Result<(), DemoError> {
        println!("\n~ kubectl get ipr");
        let list = iprs
            .list(&ListParams::default())
            .await
            .map_err(|source| DemoError::Api {
                what: "list reservations".into(),
                source,
            })?;
        print_iprs(&list.items);
        Ok(())
    }

    async fn create_set(sets: &Api<StatefulSet>, yaml: &str) -> Result<(), DemoError> {
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

    pub(super) async fn story(
        options: &DemoOptions,
        work: &Path,
        stack: &mut Stack,
        told: &mut bool,
        t0: Instant,
    ) -> Result<(), DemoError> {
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
        let server = stack.server.insert(server);
        note(&format!(
            "ready after {:.1} s at {url}",
            t0.elapsed().as_secs_f64()
        ));
        stack.standin = Some(tokio::spawn(statefulset_standin(client.clone())));

        say(
            "Starting two simulated nodes (kubelet stand-ins running the CNI bridge plugin with ipkeep in network namespaces, each with its ipkeep agent)",
        );
        let agent = write_agent_wrapper(work, &options.operator_bin)?;
        let bin_dir = work.join("cni-bin");
        std::fs::create_dir_all(&bin_dir).map_err(|source| DemoError::Io {
            what: format!("create {}", bin_dir.display()),
            source,
        })?;
        host::link_cni_bin_dir(&bin_dir, &options.bridge_bin, &options.plugin_bin).map_err(
            |source| DemoError::Io {
                what: format!("link the CNI plugins into {}", bin_dir.display()),
                source,
            },
        )?;
        for (name, cidr) in NODES {
            let mut config = NodeConfig::new(
                name,
                vec![cidr.to_owned()],
                work.join(name),
                vec![bin_dir.clone()],
            );
            config.agent = Some(AgentConfig {
                bin: agent.clone(),
                kubeconfig: Some(kubeconfig.clone()),
            });
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(crate::node::run(server.client(), config, async {
                let _ = rx.await;
            }));
            stack.nodes.push((name.to_owned(), tx, task));
            note(&format!("{name}: pod CIDR {cidr}"));
        }

        say("Starting the ipkeep controller");
        let log = work.join("controller.log");
        let log_file = std::fs::File::create(&log).map_err(|source| DemoError::Io {
            what: format!("create {}", log.display()),
            source,
        })?;
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
            .env("KUBECONFIG", &kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .map_err(|e| DemoError::Command {
                command: format!("{} controller", options.operator_bin.display()),
                detail: e.to_string(),
            })?;
        stack.controller = Some(controller);

        let pods: Api<Pod> = Api::namespaced(client.clone(), FAST_NS);
        let iprs: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), FAST_NS, &ipr_resource());
        let sets: Api<StatefulSet> = Api::namespaced(client.clone(), FAST_NS);

        say("1. An annotated StatefulSet with 3 replicas");
        create_set(&sets, &statefulset("web", 3, "10m", "node-a")).await?;
        for i in 0..3 {
            let name = format!("web-{i}");
            wait_for(&format!("{name} Running with an IP"), || async {
                running(&pods.get_opt(&name).await.ok()??)
            })
            .await?;
            wait_for(&format!("the reservation of {name} Bound"), || async {
                (reservation_phase(&iprs, &name).await.as_deref() == Some("Bound")).then_some(())
            })
            .await?;
        }
        show_pods(&pods).await?;
        show_iprs(&iprs).await?;

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
        pods.delete("web-1", &DeleteParams::default())
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
        wait_for("web-1's reservation Bound again", || async {
            (reservation_phase(&iprs, "web-1").await.as_deref() == Some("Bound")).then_some(())
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
        show_iprs(&iprs).await?;
        if new_ips != old_ips {
            return Err(DemoError::Command {
                command: "the demo's check".into(),
                detail: format!("web-1 came back with {new_ips:?}, not {old_ips:?}"),
            });
        }

        say("3. A reservation expires: a StatefulSet `cache` with retain-for 5s, scaled to 0");
        create_set(&sets, &statefulset("cache", 1, "5s", "node-b")).await?;
        wait_for("cache-0 Running", || async {
            running(&pods.get_opt("cache-0").await.ok()??)
        })
        .await?;
        wait_for("cache-0's reservation Bound", || async {
            (reservation_phase(&iprs, "cache-0").await.as_deref() == Some("Bound")).then_some(())
        })
        .await?;
        println!("\n~ kubectl scale statefulset cache --replicas=0");
        sets.patch(
            "cache",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 0}})),
        )
        .await
        .map_err(|source| DemoError::Api {
            what: "scale cache to 0".into(),
            source,
        })?;
        wait_for("cache-0's reservation Released", || async {
            (reservation_phase(&iprs, "cache-0").await.as_deref() == Some("Released")).then_some(())
        })
        .await?;
        show_iprs(&iprs).await?;
        wait_for(
            "cache-0's reservation deleted at its release time",
            || async { iprs.get_opt("cache-0").await.ok()?.is_none().then_some(()) },
        )
        .await?;
        note("At its release time the controller deleted it and the address is free again:");
        show_iprs(&iprs).await?;
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
}
