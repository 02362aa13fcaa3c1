//! The demo's story on real nodes: the control plane and two nodes running kubelet, containerd,
//! runc and kube-proxy ([`Cluster`]), the chart installed with `helm install` as a user
//! installs it (`make image`'s archive loaded into each node, `cni.replaceHostLocal=true`), then
//! the scenarios' own steps told to a newcomer ([`keep_ip::keep_address`]: `web-1` deleted and
//! back with the same address, on its `eth0` and answering a client pod; [`retention::expires`]:
//! a reservation expiring). Everything is removed by the real-node harness when the cluster is
//! stopped or dropped.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use super::{
    error::DemoError,
    narrate::{Kubectl, Story, kubectl, note, say, show},
};
use crate::cluster::realnode::{Cluster, ClusterOptions};
use crate::scenarios::{Narrator, keep_ip, retention};
use crate::testkit::system::{ChartCluster, Options, System, retain, statefulset};

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

/// The namespace of the story.
const NS: &str = "demo";

/// The namespace the chart is installed in.
const SYSTEM_NS: &str = "ipkeep-system";

/// How long the expiring reservation is kept, as the annotation says it and as a duration.
const CACHE_RETAIN_FOR: (&str, Duration) = ("5s", Duration::from_secs(5));

/// Starts the control plane and the nodes into `slot`, where the caller stops them whatever
/// happens, then tells the story.
pub(super) async fn story(
    options: &DemoOptions,
    slot: &mut Option<Cluster>,
    told: &mut bool,
    t0: Instant,
) -> Result<(), DemoError> {
    say(
        "Starting a real Kubernetes control plane on 127.0.0.1 (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) and two real nodes (kubelet, containerd, runc, kube-proxy; each in its own network and mount namespace, CNI: bridge + host-local like a flannel node)",
    );
    let c: &Cluster = slot.insert(Cluster::start(ClusterOptions::default()).await?);
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
    let image = names.first().ok_or_else(|| DemoError::Missing {
        what: "an image in the archive",
        path: options.image_archive.clone(),
        hint: "run: make image",
    })?;
    let (repository, tag) = image.rsplit_once(':').unwrap_or((image.as_str(), "latest"));
    // As the README: the agent needs a namespace Pod Security lets privileged pods into (the
    // demo's control plane enforces `baseline` elsewhere, as a hardened cluster does).
    show(&k, &["create", "namespace", SYSTEM_NS])?;
    show(
        &k,
        &[
            "label",
            "namespace",
            SYSTEM_NS,
            crate::testkit::realnode::PRIVILEGED,
        ],
    )?;
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

    // From here on the story is the scenarios' own steps, told as they happen.
    let cluster = ChartCluster {
        kubeconfig: k.kubeconfig.clone(),
        kubectl: k.bin.clone(),
    };
    let options_ns = Options {
        namespace: Some(NS.to_owned()),
        ..Options::default()
    };
    let sys = System::try_on(NS, options_ns, cluster).await?;
    let mut n = Story::default();
    keep_ip::keep_address(&sys, &mut n).await?;
    let (retain_for, held) = CACHE_RETAIN_FOR;
    n.step(&format!(
        "A reservation expires: a StatefulSet `cache` with retain-for {retain_for}, scaled to 0"
    ));
    let yaml = statefulset("cache", 1, true, &[], &retain(Some(retain_for)));
    let cache = retention::kept_for(&sys, &mut n, &yaml, "cache").await?;
    retention::expires(&sys, &mut n, &cache, held).await?;

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
            k.bin
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
    c: &Cluster,
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
    ];
    for s in &sets {
        args.push("--set".into());
        args.push(s.clone());
    }
    args.extend(["--wait".into(), "--timeout".into(), "3m".into()]);
    println!("\n$ helm {}", args.join(" "));
    let mut helm = c.plane().helm();
    helm.args(&args);
    print!("{}", crate::command::stdout_of(&mut helm, None)?);
    Ok(())
}
