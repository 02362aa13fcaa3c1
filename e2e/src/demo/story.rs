//! The demo's story on real nodes: the control plane and two nodes running kubelet, containerd, runc and
//! kube-proxy ([`RealCluster`]), the chart installed with `helm install` as a user installs it
//! (`make image`'s archive loaded into each node, `cni.replaceHostLocal=true`), and the story
//! told with busybox pods: `web-1` deleted and back with the same address, shown from inside the
//! pod and answered over the network from a pod on the other node, then a reservation expiring.
//! Everything is removed by the real-node harness when the cluster is stopped or dropped.

use std::{
    future::Future,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::DynamicObject};

use super::{
    error::DemoError,
    narrate::{
        Kubectl, io_error, ipr_resource, kubectl, note, reservation_phase, run_command, say, show,
        statefulset,
    },
};
use crate::cluster::realnode::{RealCluster, RealClusterOptions, WORKLOAD_IMAGE};

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

/// How long one step of the story may take before the demo gives up.
const STEP_DEADLINE: Duration = Duration::from_secs(120);

/// Waits for one step of the story, giving up after [`STEP_DEADLINE`] (the library's one poll
/// loop, [`crate::wait::wait_for`]).
async fn wait_for<T, F, Fut>(what: &str, check: F) -> Result<T, DemoError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    Ok(crate::wait::wait_for(what, STEP_DEADLINE, check).await?)
}

/// The namespace of the story.
const NS: &str = "demo";

/// The namespace the chart is installed in.
const SYSTEM_NS: &str = "ipkeep-system";

/// The story's container: the busybox workload serving HTTP on port 8080.
fn web_container() -> String {
    format!(
        r#"      - name: web
        image: {WORKLOAD_IMAGE}   # busybox, imported into every node (no registry)
        imagePullPolicy: Never
        command: [httpd, -f, -p, "8080", -h, /www]
        readinessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 1}}
"#
    )
}

/// The first address of a pod.
fn pod_ip(pod: &Pod) -> Option<String> {
    pod.status.as_ref()?.pod_ip.clone()
}

/// The node a pod runs on.
fn pod_node(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

/// Writes `yaml` to `work/file`, prints it, and applies it.
fn apply(k: &Kubectl, work: &Path, file: &str, yaml: &str) -> Result<(), DemoError> {
    let path = work.join(file);
    std::fs::write(&path, yaml).map_err(io_error(format!("write {}", path.display())))?;
    println!("\n$ cat {file}\n{yaml}");
    let p = path.display().to_string();
    show(k, &["-n", NS, "apply", "-f", &p]).map(|_| ())
}

/// Starts the control plane and the nodes into `slot`, where the caller stops them whatever
/// happens, then tells the story.
pub(super) async fn story(
    options: &DemoOptions,
    work: &Path,
    slot: &mut Option<RealCluster>,
    told: &mut bool,
    t0: Instant,
) -> Result<(), DemoError> {
    let _ = std::fs::remove_dir_all(work);
    std::fs::create_dir_all(work).map_err(io_error(format!("create {}", work.display())))?;
    say(
        "Starting a real Kubernetes control plane on 127.0.0.1 (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) and two real nodes (kubelet, containerd, runc, kube-proxy; each in its own network and mount namespace, CNI: bridge + host-local like a flannel node)",
    );
    let c: &RealCluster = slot.insert(RealCluster::start(RealClusterOptions::default()).await?);
    note(&format!(
        "ready after {:.1} s; API server {} (slot {})",
        t0.elapsed().as_secs_f64(),
        c.plane().server(),
        c.slot().number()
    ));
    let k = Kubectl {
        bin: c.plane().bin("kubectl"),
        kubeconfig: c.plane().kubeconfig_path().to_path_buf(),
    };
    show(&k, &["get", "nodes", "-o", "wide"])?;

    say("Installing ipkeep as a user without a registry does: load the image, helm install");
    println!(
        "\n$ ipkeep-e2e cluster load-image {}",
        options.image_archive.display()
    );
    let names = c.load_image(&options.image_archive)?;
    for n in &names {
        println!("{n}");
    }
    let image = names.first().ok_or_else(|| {
        DemoError::Story(format!(
            "{} holds no image to load",
            options.image_archive.display()
        ))
    })?;
    let (repository, tag) = image.rsplit_once(':').unwrap_or((image.as_str(), "latest"));
    helm_install(c, options, repository, tag)?;
    // helm's --wait counts a DaemonSet's pods once Running; the story shows them Ready.
    kubectl(
        &k,
        &[
            "-n",
            SYSTEM_NS,
            "wait",
            "--for=condition=Ready",
            "pods",
            "--all",
            "--timeout=120s",
        ],
    )?;
    show(&k, &["-n", SYSTEM_NS, "get", "pods", "-o", "wide"])?;

    let client_node = match c.nodes() {
        [a, _, ..] => a.name(),
        _ => {
            return Err(DemoError::Node {
                node: "-".into(),
                detail: "the cluster has fewer than two nodes".into(),
            });
        }
    };
    let client = c.plane().client()?;
    let iprs: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &ipr_resource());
    let bound = |name: String| {
        let iprs = iprs.clone();
        async move { (reservation_phase(&iprs, &name).await.as_deref() == Some("Bound")).then_some(()) }
    };
    kubectl(&k, &["create", "namespace", NS])?;

    say(&format!(
        "1. An annotated StatefulSet with 3 replicas of busybox httpd, placed by the scheduler, and a client pod on {client_node}"
    ));
    apply(
        &k,
        work,
        "web.yaml",
        &statefulset("web", 3, "10m", &web_container()),
    )?;
    apply(
        &k,
        work,
        "client.yaml",
        &crate::cluster::realnode::layout::client_pod(&client_node),
    )?;
    for name in ["web-0", "web-1", "web-2"] {
        c.wait_pod_ready(NS, name, STEP_DEADLINE).await?;
        wait_for(&format!("the reservation of {name} Bound"), || {
            bound(name.to_owned())
        })
        .await?;
    }
    c.wait_pod_ready(NS, "client", STEP_DEADLINE).await?;
    note(
        "kubelet and containerd started the pods; the CNI chain (bridge + ipkeep in host-local's place) gave them addresses:",
    );
    show(&k, &["-n", NS, "get", "pods", "-o", "wide"])?;
    note(
        "ipkeep's controller made one IPReservation per pod, named like the pod; the agents wrote them to each node's disk:",
    );
    show(&k, &["-n", NS, "get", "ipr"])?;

    say("2. Delete web-1: the StatefulSet re-creates it, and ipkeep gives it its address back");
    let before = c.wait_pod_ready(NS, "web-1", STEP_DEADLINE).await?;
    let old_uid = before.metadata.uid.clone().unwrap_or_default();
    let old_ip = pod_ip(&before).unwrap_or_default();
    let old_node = pod_node(&before);
    note(&format!(
        "web-1 now: uid {old_uid}, IP {old_ip}, on {old_node}"
    ));
    show(&k, &["-n", NS, "delete", "pod", "web-1"])?;
    let pods: Api<Pod> = Api::namespaced(client, NS);
    wait_for("web-1 re-created", || async {
        let p = pods.get_opt("web-1").await.ok()??;
        (p.metadata.uid.as_deref() != Some(old_uid.as_str())).then_some(())
    })
    .await?;
    let after = c.wait_pod_ready(NS, "web-1", STEP_DEADLINE).await?;
    let new_ip = pod_ip(&after).unwrap_or_default();
    note(&format!(
        "The scheduler put it back on {} because ipkeep's placement webhook told it where the address lives:",
        pod_node(&after)
    ));
    show(
        &k,
        &[
            "-n",
            NS,
            "get",
            "pod",
            "web-1",
            "-o",
            "jsonpath={.metadata.annotations.ipkeep\\.dev/placed}{\"\\n\"}{.spec.affinity.nodeAffinity}{\"\\n\"}",
        ],
    )?;
    wait_for("web-1's reservation Bound again", || {
        bound("web-1".to_owned())
    })
    .await?;
    note(&format!(
        "web-1 again: uid {} (a new pod), IP {new_ip} — {}",
        after.metadata.uid.clone().unwrap_or_default(),
        if new_ip == old_ip {
            "the same address"
        } else {
            "A DIFFERENT ADDRESS (this is a bug)"
        }
    ));
    show(&k, &["-n", NS, "get", "pods", "-o", "wide"])?;
    note("From inside the new pod: the kept address is on its eth0");
    show(
        &k,
        &[
            "-n", NS, "exec", "web-1", "--", "ip", "-4", "addr", "show", "eth0",
        ],
    )?;
    note(&format!(
        "From the client pod on {client_node}: web-1 answers at that address"
    ));
    let url = format!("http://{new_ip}:8080/");
    show(
        &k,
        &["-n", NS, "exec", "client", "--", "wget", "-qO-", &url],
    )?;
    show(&k, &["get", "ipr", "-A", "-o", "wide"])?;
    if new_ip != old_ip {
        return Err(DemoError::Story(format!(
            "web-1 came back with {new_ip}, not {old_ip}"
        )));
    }

    say("3. A reservation expires: a StatefulSet `cache` with retain-for 5s, scaled to 0");
    apply(
        &k,
        work,
        "cache.yaml",
        &statefulset("cache", 1, "5s", &web_container()),
    )?;
    let cache = c.wait_pod_ready(NS, "cache-0", STEP_DEADLINE).await?;
    wait_for("cache-0's reservation Bound", || {
        bound("cache-0".to_owned())
    })
    .await?;
    show(
        &k,
        &["-n", NS, "scale", "statefulset", "cache", "--replicas=0"],
    )?;
    wait_for("cache-0's reservation Released", || async {
        (reservation_phase(&iprs, "cache-0").await.as_deref() == Some("Released")).then_some(())
    })
    .await?;
    note(&format!(
        "cache-0 is gone; its address {} stays reserved (nobody else gets it) until RELEASE-TIME:",
        pod_ip(&cache).unwrap_or_default()
    ));
    show(&k, &["-n", NS, "get", "ipr", "cache-0"])?;
    wait_for(
        "cache-0's reservation deleted at its release time",
        || async { iprs.get_opt("cache-0").await.ok()?.is_none().then_some(()) },
    )
    .await?;
    note(
        "Five seconds later the controller deleted it, the agent removed the node's file, and the address is free again:",
    );
    show(&k, &["get", "ipr", "-A"])?;

    say(&format!(
        "The story took {:.0} s from nothing, on real nodes.",
        t0.elapsed().as_secs_f64()
    ));
    *told = true;
    if options.keep {
        say("Everything keeps running until you press Ctrl-C. In another terminal:");
        println!(
            "\n    export KUBECONFIG={}\n    export PATH={}:$PATH   # the kubectl of this control plane\n    kubectl -n {NS} get pods,ipr -o wide\n    kubectl -n {NS} delete pod web-0   # and watch it come back with its IP\n",
            k.kubeconfig.display(),
            c.plane()
                .bin("kubectl")
                .parent()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        );
        std::future::pending::<()>().await;
    }
    Ok(())
}

/// `helm install ipkeep charts/ipkeep` with the loaded image and `cni.replaceHostLocal=true`,
/// printed as a user types it.
fn helm_install(
    c: &RealCluster,
    options: &DemoOptions,
    repository: &str,
    tag: &str,
) -> Result<(), DemoError> {
    let sets = [
        format!("image.repository={repository}"),
        format!("image.tag={tag}"),
        "image.pullPolicy=Never".to_owned(),
        "cni.replaceHostLocal=true".to_owned(),
    ];
    let mut args: Vec<String> = vec![
        "install".into(),
        "ipkeep".into(),
        options.chart.display().to_string(),
        "--namespace".into(),
        SYSTEM_NS.into(),
        "--create-namespace".into(),
    ];
    for s in &sets {
        args.push("--set".into());
        args.push(s.clone());
    }
    args.extend(["--wait".into(), "--timeout".into(), "3m".into()]);
    println!("\n$ helm {}", args.join(" "));
    let mut helm = c.plane().helm();
    helm.args(&args);
    print!("{}", run_command(&mut helm)?);
    Ok(())
}
