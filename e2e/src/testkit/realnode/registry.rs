//! ipkeep installed from a registry, as a user takes it (issue 48): the image and the chart
//! pushed to the harness's private registry ([`crate::cluster::Registry`]: TLS with its own CA,
//! a login) by `scripts/publish.sh` (`make publish`), every node trusting that CA as its runtime's users configure it
//! ([`crate::cluster::realnode::registries`]), the login only in a pull secret the chart's
//! `imagePullSecrets` names, and `helm install ipkeep oci://<registry>/charts/ipkeep --version
//! <v>` with the chart's own pull policy: the kubelet pulls the image on every node.
//!
//! The registry's address is the one the nodes reach it at (the bridge's host address), for
//! the image and the chart alike, as a user's cluster and laptop name one registry; pushes go
//! to `127.0.0.1`, the same registry.

use std::{collections::BTreeMap, path::Path};

use crate::cluster::{Registry, realnode::Cluster};

use super::{RELEASE, RELEASE_NS, REPLACE_HOST_LOCAL, release_ready};
use crate::testkit::{Scratch, kubectl, kubectl_json, kubectl_ok, run_ok, wait_for};

/// The pull secret (`kubernetes.io/dockerconfigjson`) in the release's namespace that an
/// install from the registry names in `imagePullSecrets`.
pub const PULL_SECRET: &str = "ipkeep-registry";

/// A release of ipkeep on the registry, as the cluster reaches it.
#[derive(Debug, Clone)]
pub struct Published {
    /// The registry's address as the nodes reach it: `<host>:<port>`.
    pub registry: String,
    /// The chart's `version`.
    pub version: String,
    /// The image's tag: the chart's `appVersion`, the tag it defaults to.
    pub tag: String,
    /// The digest of the image's manifest: the archive's, which `scripts/publish.sh` keeps.
    pub digest: String,
}

impl Published {
    /// The image repository (the chart's `image.repository`).
    pub fn repository(&self) -> String {
        format!("{}/ipkeep", self.registry)
    }

    /// The image as the chart names it by default: `<repository>:<appVersion>`.
    pub fn image(&self) -> String {
        format!("{}:{}", self.repository(), self.tag)
    }

    /// The chart's address for helm.
    pub fn chart(&self) -> String {
        format!("oci://{}/charts/ipkeep", self.registry)
    }
}

/// A field of a chart's `Chart.yaml` (`version`, `appVersion`).
pub fn chart_field(chart: &Path, field: &str) -> String {
    let file = chart.join("Chart.yaml");
    let text =
        std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .unwrap_or_else(|| panic!("no {field} in {}", file.display()))
}

/// helm against the cluster with the registry's login (`HELM_REGISTRY_CONFIG`, what `helm
/// registry login` writes) and its CA (`--ca-file`, appended); its stdout, or the test fails
/// with its output.
pub fn helm(c: &Cluster, registry: &Registry, args: &[&str]) -> String {
    let mut command = c.plane().helm();
    command.env("HELM_REGISTRY_CONFIG", registry.auth_file());
    let ca = registry.ca_file().to_string_lossy().into_owned();
    let mut all = args.to_vec();
    all.extend(["--ca-file", ca.as_str()]);
    run_ok(command, &all, None)
}

/// The digest of the one image (or index) an OCI archive holds: its `index.json`'s only
/// manifest, which `scripts/publish.sh` pushes with its digest preserved.
pub fn archive_digest(archive: &Path) -> String {
    let mut tar = std::process::Command::new("tar");
    tar.arg("-xOf").arg(archive).arg("index.json");
    let index: serde_json::Value =
        serde_json::from_slice(&crate::testkit::checked(tar, None).stdout)
            .unwrap_or_else(|e| panic!("{}: index.json: {e}", archive.display()));
    let manifests = index["manifests"].as_array().cloned().unwrap_or_default();
    assert_eq!(manifests.len(), 1, "{}: {index}", archive.display());
    manifests[0]["digest"]
        .as_str()
        .unwrap_or_else(|| panic!("{}: no digest in {index}", archive.display()))
        .to_owned()
}

/// Publishes the image of `archive` (an OCI archive named `ipkeep:<version>`: `make image`'s,
/// or the previous release's) and the chart directory `chart` to `registry` with
/// `scripts/publish.sh`, as `make publish` does, the registry's login and CA given as a user
/// gives them; returns the release as the cluster `c` pulls it.
pub fn publish(c: &Cluster, registry: &Registry, archive: &Path, chart: &Path) -> Published {
    let version = chart_field(chart, "version");
    let tag = chart_field(chart, "appVersion");
    let helm_home = Scratch::new(&format!("publish-{version}"));
    let mut script =
        std::process::Command::new(crate::testkit::repo_root().join("scripts/publish.sh"));
    script
        .env("REGISTRY_AUTH_FILE", registry.auth_file())
        .env("HELM_REGISTRY_CONFIG", registry.auth_file())
        .env("HELM", c.plane().bin("helm"))
        .env("HELM_CONFIG_HOME", helm_home.join("config"))
        .env("HELM_CACHE_HOME", helm_home.join("cache"))
        .env("HELM_DATA_HOME", helm_home.join("data"))
        .arg(registry.addr())
        .arg("--image")
        .arg(archive)
        .arg("--chart")
        .arg(chart)
        .arg("--ca-file")
        .arg(registry.ca_file());
    crate::testkit::checked(script, None);
    Published {
        registry: registry.addr_at(c.slot().host_ip()),
        version,
        tag,
        digest: archive_digest(archive),
    }
}

/// Makes the cluster ready to pull from `registry` as a user's is: every node trusts its CA
/// (containerd's `hosts.toml`, CRI-O's `certs.d`) and the release's namespace holds the pull
/// secret with its login. Nothing of the login reaches the nodes.
pub fn use_registry(c: &Cluster, registry: &Registry) {
    let addr = registry.addr_at(c.slot().host_ip());
    let ca = std::fs::read_to_string(registry.ca_file()).unwrap();
    c.trust_registry(&addr, &ca)
        .unwrap_or_else(|e| panic!("{}", crate::error_chain(&e)));
    super::release_namespace(c);
    kubectl_ok(
        c.plane(),
        &[
            "-n",
            RELEASE_NS,
            "create",
            "secret",
            "docker-registry",
            PULL_SECRET,
            &format!("--docker-server={addr}"),
            &format!("--docker-username={}", registry.username()),
            &format!("--docker-password={}", registry.password()),
        ],
        None,
    );
}

/// The values an install from the registry sets besides the README's: the image repository on
/// the registry and the pull secret. No tag (the chart's `appVersion`) and no pull policy (the
/// chart's `IfNotPresent`).
pub fn values(release: &Published) -> Vec<String> {
    vec![
        format!("image.repository={}", release.repository()),
        format!("imagePullSecrets[0].name={PULL_SECRET}"),
    ]
}

/// `helm install ipkeep oci://<registry>/charts/ipkeep --version <v>` with [`values`], the
/// README's `cni.replaceHostLocal=true` and `extra`; then every pod of the release Ready.
pub async fn install(c: &Cluster, registry: &Registry, release: &Published, extra: &[&str]) {
    let chart = release.chart();
    let values = values(release);
    let mut args = vec![
        "install",
        RELEASE,
        chart.as_str(),
        "--version",
        release.version.as_str(),
        "--namespace",
        RELEASE_NS,
        "--wait",
        "--timeout",
        "3m",
    ];
    for v in &values {
        args.extend(["--set", v.as_str()]);
    }
    args.extend(REPLACE_HOST_LOCAL);
    args.extend(extra);
    helm(c, registry, &args);
    release_ready(c).await;
}

/// The images in each node's runtime store, by node name.
pub fn node_images(c: &Cluster) -> BTreeMap<String, Vec<String>> {
    c.nodes()
        .iter()
        .map(|n| {
            let names = n
                .image_names()
                .unwrap_or_else(|e| panic!("{}", crate::error_chain(&e)));
            (n.name(), names)
        })
        .collect()
}

/// Whether `names` (a node's store) holds `release`'s image, by its name or its digest.
fn holds(names: &[String], release: &Published) -> bool {
    let image = release.image();
    names
        .iter()
        .any(|n| *n == image || n.ends_with(&format!("@{}", release.digest)))
}

/// Asserts no node's store in `images` holds `release`'s image: a pull to come is the
/// kubelet's.
pub fn assert_absent(images: &BTreeMap<String, Vec<String>>, release: &Published) {
    for (node, names) in images {
        assert!(
            !holds(names, release),
            "{node} holds {} ({}) before any pull: {names:?}",
            release.image(),
            release.digest
        );
    }
}

/// The agent pods of the release, by node name.
fn agent_pods(c: &Cluster) -> BTreeMap<String, serde_json::Value> {
    let list = kubectl_json(
        c.plane(),
        &[
            "-n",
            RELEASE_NS,
            "get",
            "pods",
            "-l",
            "app.kubernetes.io/component=agent",
        ],
    );
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter_map(|p| Some((p["spec"]["nodeName"].as_str()?.to_owned(), p.clone())))
        .collect()
}

/// Asserts the kubelet of every node pulled `release`'s image from the registry: no node held
/// it before (`before`, the stores then: see [`assert_absent`]); now every node's store holds
/// it, the agent's containers on every node run it with an image ID naming the digest the
/// archive holds, and the node's kubelet reported the pull (an Event `Pulled` "Successfully
/// pulled image" in the release's namespace). Returns each node's image ID, for the test to
/// print.
pub async fn assert_pulled(
    c: &Cluster,
    release: &Published,
    before: &BTreeMap<String, Vec<String>>,
) -> BTreeMap<String, String> {
    assert_absent(before, release);
    let image = release.image();
    let mut ids = BTreeMap::new();
    let agents = agent_pods(c);
    let events = kubectl_json(c.plane(), &["-n", RELEASE_NS, "get", "events"]);
    for node in c.nodes() {
        let name = node.name();
        let pod = agents
            .get(&name)
            .unwrap_or_else(|| panic!("no agent pod on {name}"));
        let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default();
        let statuses: Vec<&serde_json::Value> = ["initContainerStatuses", "containerStatuses"]
            .iter()
            .filter_map(|k| pod["status"][k].as_array())
            .flatten()
            .collect();
        assert!(!statuses.is_empty(), "{pod_name}: no container status");
        for s in &statuses {
            assert_eq!(s["image"].as_str(), Some(image.as_str()), "{pod_name}: {s}");
            let id = s["imageID"].as_str().unwrap_or_default();
            assert!(
                id.contains(&release.digest),
                "{pod_name} on {name} runs {id}, not the pushed {} ({})",
                release.digest,
                release.repository()
            );
            ids.insert(name.clone(), id.to_owned());
        }
        // The first of the release's pods to start on the node pulls (the controller's, during
        // an upgrade, as often as the agent's); the others find the image "already present".
        let pulled = format!("Successfully pulled image \"{image}\"");
        let reported = events["items"].as_array().into_iter().flatten().any(|e| {
            e["source"]["host"].as_str() == Some(name.as_str())
                && e["reason"].as_str() == Some("Pulled")
                && e["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with(&pulled))
        });
        assert!(
            reported,
            "the kubelet of {name} reported no pull of {image} (no Event Pulled \"{pulled} …\" from it in {RELEASE_NS})"
        );
        let names = node
            .image_names()
            .unwrap_or_else(|e| panic!("{}", crate::error_chain(&e)));
        assert!(
            holds(&names, release),
            "{name}'s runtime does not hold {image} after the install: {names:?}"
        );
    }
    ids
}

/// A pod of `release`'s image on `node` in the namespace `default`, with no pull secret, waits
/// with `ErrImagePull` (or `ImagePullBackOff` between the kubelet's tries): the registry asks
/// for its login, and the node has none of its own. The refusal is not about TLS (the node
/// trusts the CA). Returns the kubelet's message; the pod is deleted.
pub async fn assert_refused_without_pull_secret(
    c: &Cluster,
    node: &str,
    release: &Published,
) -> String {
    let pod = "ipkeep-no-pull-secret";
    let image = release.image();
    kubectl_ok(
        c.plane(),
        &["apply", "-f", "-"],
        Some(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {pod}\n  namespace: default\nspec:\n  nodeName: {node}\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: c\n    image: {image}\n"
        )),
    );
    let message = wait_for(
        &format!("{pod} on {node} waiting with ErrImagePull for {image}"),
        || async {
            let p = kubectl_json(c.plane(), &["-n", "default", "get", "pod", pod]);
            let waiting = &p["status"]["containerStatuses"][0]["state"]["waiting"];
            let reason = waiting["reason"].as_str()?;
            ["ErrImagePull", "ImagePullBackOff"]
                .contains(&reason)
                .then(|| format!("{reason}: {}", waiting["message"].as_str().unwrap_or("")))
        },
    )
    .await;
    let _ = kubectl(
        c.plane(),
        &[
            "-n",
            "default",
            "delete",
            "pod",
            pod,
            "--force",
            "--grace-period=0",
        ],
        None,
    );
    let lower = message.to_lowercase();
    assert!(
        !lower.contains("x509") && !lower.contains("certificate"),
        "{node} did not trust the registry's CA: {message}"
    );
    message
}

/// `helm upgrade ipkeep oci://<registry>/charts/ipkeep --version <v>` to `release` as a user
/// types it: the last release's values as `values` says (`--reuse-values` or
/// `--reset-then-reuse-values`) and the new image tag; then every pod of the release updated
/// and Ready.
pub async fn upgrade(c: &Cluster, registry: &Registry, release: &Published, values: &str) {
    let chart = release.chart();
    let tag = format!("image.tag={}", release.tag);
    helm(
        c,
        registry,
        &[
            "upgrade",
            RELEASE,
            chart.as_str(),
            "--version",
            release.version.as_str(),
            values,
            "--set",
            tag.as_str(),
            "--namespace",
            RELEASE_NS,
            "--wait",
            "--timeout",
            "3m",
        ],
    );
    release_ready(c).await;
}
