//! The README's quick starts, word for word, on real nodes of each kind (issue 43): the test reads
//! each block out of README.md (`<!-- quick start: KIND -->` before it) and runs it as a user
//! would, so the README cannot drift from what is tested:
//!
//! - `k3s`: two nodes in k3s's layout with real flannel (k3s's conflist and plugin directory);
//! - `kube-flannel`: two standard nodes with real flannel and kube-flannel's conflist;
//! - `bridge`: two standard nodes with their own `bridge` + `host-local` conflist.
//!
//! Before each block, what the quick start asks the user to have: ipkeep's image and chart on a
//! registry (`make publish`, here the harness's private one: TLS with its own CA, a login), its
//! address in `REGISTRY`, `helm registry login` done (`HELM_REGISTRY_CONFIG`), the CA trusted by
//! helm (`SSL_CERT_FILE`) and by the nodes, which log in themselves (containerd's `hosts.toml`),
//! and `kubectl`/`helm` on the `PATH` talking to the cluster. The StatefulSet's `busybox:1.36`
//! is the nodes' workload image (Debian's busybox-static) under that name: the nodes pull nothing
//! from outside. A line ending in `# on every node` runs inside each node; the others run in one
//! `bash` from the repository's root, as a user's shell in their clone.
//!
//! Then the verify block, with the test's own check that web-0 came back on its address and
//! node and its reservation is Bound with it, `check` passing; then the README's uninstall block
//! for that route, and what stays: host-local back (replaced: the original again; edited: the
//! conflist back), the CRD and every reservation gone, and web-0's address free once it goes.
//! Needs root, `make cluster-bins node-bins flannel-bins image registry-bin packaging-deps`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use ipkeep_e2e::cluster::Registry;
use ipkeep_e2e::cluster::realnode::{
    Cluster, PodNetwork, RealNode, layout::WORKLOAD_IMAGE, normalized_image_name,
};
use ipkeep_e2e::testkit::realnode::{self, RELEASE_NS, registry};
use ipkeep_e2e::testkit::{kubectl, kubectl_json, repo_root, wait_for};

/// The image `examples/web.yaml` runs.
const EXAMPLE_IMAGE: &str = "busybox:1.36";

/// Which way the quick start put ipkeep in charge, and so which uninstall block undoes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// `cni.replaceHostLocal=true`: ipkeep installed as `host-local`.
    Replaced,
    /// The conflist's IPAM switched to `ipkeep` by hand.
    Edited,
}

impl Route {
    fn uninstall_marker(self) -> &'static str {
        match self {
            Route::Replaced => "uninstall: replaced",
            Route::Edited => "uninstall: edited",
        }
    }
}

/// The shell block after `<!-- MARKER -->` in `text` (the fenced block that follows it).
fn block(text: &str, marker: &str) -> String {
    let comment = format!("<!-- {marker} -->");
    let mut lines = text.lines().skip_while(|l| l.trim() != comment).skip(1);
    assert_eq!(
        lines.next().map(str::trim),
        Some("```sh"),
        "README.md: no ```sh block right after {comment}"
    );
    let body: Vec<&str> = lines.take_while(|l| l.trim() != "```").collect();
    assert!(
        !body.is_empty(),
        "README.md: the block after {comment} is empty"
    );
    body.join("\n")
}

/// One step of a block: shell text for the user's machine, or a line for every node.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    Here(String),
    OnEveryNode(String),
}

/// The block's steps: consecutive lines for the user's machine stay one script (a variable set on
/// one line is read on the next), a line ending in `# on every node` is its own step.
fn steps(block: &str) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::new();
    for line in block.lines() {
        if line.trim_end().ends_with("# on every node") {
            out.push(Step::OnEveryNode(line.to_owned()));
        } else if let Some(Step::Here(text)) = out.last_mut() {
            text.push('\n');
            text.push_str(line);
        } else {
            out.push(Step::Here(line.to_owned()));
        }
    }
    out
}

#[test]
fn steps_keep_the_users_lines_together_and_split_out_the_nodes_lines() {
    let b = "helm install a \\\n  --wait\nsed -i x /f   # on every node\nip=$(x)\necho $ip";
    assert_eq!(
        steps(b),
        vec![
            Step::Here("helm install a \\\n  --wait".into()),
            Step::OnEveryNode("sed -i x /f   # on every node".into()),
            Step::Here("ip=$(x)\necho $ip".into()),
        ]
    );
    let readme = "x\n<!-- quick start: a -->\n```sh\none\ntwo\n```\n";
    assert_eq!(block(readme, "quick start: a"), "one\ntwo");
}

/// What the quick start asks the user to have: the registry with ipkeep on it, its address, the
/// logins, the cluster's kubectl and helm.
struct UserMachine {
    registry: Registry,
    env: Vec<(String, String)>,
}

impl UserMachine {
    /// Publishes ipkeep to a registry of its own and readies the nodes and the user's shell.
    async fn ready(c: &Cluster) -> UserMachine {
        let registry = Registry::start()
            .await
            .unwrap_or_else(|e| panic!("{}", ipkeep_e2e::error_chain(&e)));
        let published = registry::publish(
            c,
            &registry,
            &realnode::image_archive(),
            &ipkeep_e2e::testkit::chart_dir(),
        );
        let ca = std::fs::read_to_string(registry.ca_file()).unwrap();
        let login = base64::engine::general_purpose::STANDARD.encode(format!(
            "{}:{}",
            registry.username(),
            registry.password()
        ));
        let example = normalized_image_name(EXAMPLE_IMAGE).unwrap();
        for n in c.nodes() {
            n.trust_registry_with_login(&published.registry, &ca, &login)
                .unwrap_or_else(|e| panic!("{}", ipkeep_e2e::error_chain(&e)));
            n.tag_image(WORKLOAD_IMAGE, &example)
                .unwrap_or_else(|e| panic!("{}", ipkeep_e2e::error_chain(&e)));
        }
        // The user's shell: helm's own environment for this cluster (kubeconfig, helm's homes),
        // kubectl and helm first on the PATH, the registry's address, login and CA.
        let helm = c.plane().helm();
        let mut env: Vec<(String, String)> = helm
            .get_envs()
            .filter_map(|(k, v)| Some((k.to_str()?.to_owned(), v?.to_str()?.to_owned())))
            .collect();
        let bin = c.plane().bin("helm");
        let path = format!(
            "{}:{}",
            bin.parent().unwrap().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        env.extend([
            ("PATH".to_owned(), path),
            ("REGISTRY".to_owned(), published.registry.clone()),
            (
                "HELM_REGISTRY_CONFIG".to_owned(),
                registry.auth_file().display().to_string(),
            ),
            (
                "SSL_CERT_FILE".to_owned(),
                registry.ca_file().display().to_string(),
            ),
        ]);
        UserMachine { registry, env }
    }

    /// Runs the README's block after `<!-- marker -->` as the user would; its output.
    fn run(&self, c: &Cluster, marker: &str) -> String {
        let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
        let text = block(&readme, marker);
        eprintln!("README.md, {marker}:\n{text}");
        let mut said = String::new();
        for step in steps(&text) {
            match step {
                Step::Here(script) => {
                    let mut bash = Command::new("bash");
                    bash.args(["-euo", "pipefail", "-c", &script])
                        .current_dir(repo_root())
                        .envs(self.env.iter().map(|(k, v)| (k, v)));
                    let out = bash.output().unwrap();
                    let text = format!(
                        "{}{}",
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    );
                    eprint!("{text}");
                    assert!(
                        out.status.success(),
                        "README.md, {marker}: `{script}` failed ({}):\n{text}",
                        out.status
                    );
                    said.push_str(&text);
                }
                Step::OnEveryNode(line) => {
                    for n in c.nodes() {
                        n.exec(&["sh", "-c", &line]).unwrap_or_else(|e| {
                            panic!(
                                "README.md, {marker}: `{line}` on {}: {}",
                                n.name(),
                                ipkeep_e2e::error_chain(&e)
                            )
                        });
                    }
                }
            }
        }
        said
    }
}

impl Drop for UserMachine {
    fn drop(&mut self) {
        self.registry.stop();
    }
}

/// web-0 as the API has it: (address, node, uid); empty while there is none.
fn web_0(c: &Cluster) -> (String, String, String) {
    let out = kubectl(c.plane(), &["get", "pod", "web-0", "-o", "json"], None);
    let pod: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    (
        pod["status"]["podIP"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        pod["spec"]["nodeName"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        pod["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

/// `ipkeep-operator check` inside the controller's pod, as the quick start runs it; passes.
fn check_passes(c: &Cluster) {
    let out = kubectl(
        c.plane(),
        &[
            "-n",
            RELEASE_NS,
            "exec",
            "deploy/ipkeep-controller",
            "--",
            "/ipkeep-operator",
            "check",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "check failed:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The node's CNI plugin directory as the machine sees it.
fn bin_dir(n: &RealNode) -> PathBuf {
    n.host_path(n.dirs().cni_bin_dir()).unwrap()
}

/// What `host-local` in `dir` is: a symlink's target (k3s's, absolute: never followed from the
/// machine) or a file's bytes.
fn host_local(dir: &Path) -> Result<PathBuf, Vec<u8>> {
    let path = dir.join("host-local");
    std::fs::read_link(&path).map_err(|_| std::fs::read(&path).unwrap())
}

/// The files of a node's network directory that name `ip` (allocations; `reserved/` apart).
fn allocation_of(n: &RealNode, ip: &str) -> bool {
    realnode::network_dir(n).join(ip).exists()
}

/// The quick start of `kind` on fresh nodes of `network`, the verify block, `check`, and the
/// uninstall of `route`.
async fn quick_start(kind: &str, network: PodNetwork, route: Route) {
    let held =
        realnode::use_shape(realnode::Shape::bare(2, network), realnode::Access::Spoils).await;
    let c = held.cluster().expect("this binary's own nodes");
    let user = UserMachine::ready(c).await;
    // Before: host-local is each node's own.
    let originals: Vec<_> = c.nodes().iter().map(|n| host_local(&bin_dir(n))).collect();

    user.run(c, &format!("quick start: {kind}"));
    let (ip, node, uid) = wait_for("web-0 to run with an address", || async {
        let (ip, node, uid) = web_0(c);
        (!ip.is_empty()).then_some((ip, node, uid))
    })
    .await;
    let said = user.run(c, "quick start: verify");
    assert!(said.contains(&format!("web-0 is back on {ip}")), "{said}");
    let (ip_after, node_after, uid_after) = web_0(c);
    assert_ne!(uid_after, uid, "web-0 was re-created");
    assert_eq!(
        (ip_after.as_str(), node_after.as_str()),
        (ip.as_str(), node.as_str()),
        "web-0 came back on its address and node"
    );
    let ipr = kubectl_json(c.plane(), &["get", "ipr", "web-0"]);
    assert_eq!(ipr["status"]["phase"], "Bound", "{ipr}");
    assert_eq!(ipr["spec"]["nodeName"], node.as_str(), "{ipr}");
    assert!(ipr.to_string().contains(&format!("\"{ip}\"")), "{ipr}");
    check_passes(c);

    user.run(c, route.uninstall_marker());
    for (n, original) in c.nodes().iter().zip(&originals) {
        let dir = bin_dir(n);
        match route {
            Route::Replaced => {
                assert_eq!(
                    &host_local(&dir),
                    original,
                    "{}: host-local is the original again",
                    n.name()
                );
                assert!(!dir.join("host-local.ipkeep-orig").exists(), "{}", n.name());
            }
            Route::Edited => {
                let conf = n.host_path(n.dirs().cni_conf_dir()).unwrap();
                for entry in std::fs::read_dir(conf).unwrap() {
                    let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
                    assert!(!text.contains("\"ipkeep\""), "{}: {text}", n.name());
                }
            }
        }
    }
    assert!(
        !kubectl(
            c.plane(),
            &["get", "crd", "ipreservations.ipkeep.dev"],
            None
        )
        .status
        .success(),
        "the CRD, and every reservation with it, is gone"
    );
    // web-0 keeps running on its address; when it goes, host-local frees it: nothing holds it.
    let holder = realnode::node(c, &node);
    assert!(
        allocation_of(holder, &ip),
        "web-0's allocation stays while it runs"
    );
    ipkeep_e2e::testkit::kubectl_ok(c.plane(), &["delete", "statefulset", "web", "--wait"], None);
    wait_for(&format!("{ip} freed on {node}"), || async {
        (!allocation_of(holder, &ip)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_bridge_quick_start_keeps_web_0s_address_and_its_uninstall_frees_it() {
    quick_start("bridge", realnode::PLAIN, Route::Edited).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_k3s_quick_start_keeps_web_0s_address_and_its_uninstall_frees_it() {
    quick_start("k3s", realnode::K3S_FLANNEL, Route::Replaced).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_kube_flannel_quick_start_keeps_web_0s_address_and_its_uninstall_frees_it() {
    quick_start("kube-flannel", realnode::FLANNEL, Route::Replaced).await;
}
