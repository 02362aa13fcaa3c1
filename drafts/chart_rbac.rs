//! Least privilege, checked against the real API server's audit log: the chart installed with
//! `helm`, then the real `ipkeep-operator controller` and `agent` run as the chart's
//! ServiceAccounts (tokens minted for them) through a reservation's whole life — the agent writes
//! its file, the controller releases and deletes it at expiry, the agent removes the file — and
//! the audit log shows every request each ServiceAccount made allowed (no 403), and that each
//! component really ran as its account.
//!
//! Needs the control plane binaries (`make cluster-bins`) and the operator binary
//! (`IPKEEP_OPERATOR_BIN`, else `target/debug/ipkeep-operator`, which `cargo test --workspace`
//! builds); fails loudly without them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    collections::{BTreeMap, BTreeSet},
    io::Write,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use ipkeep_e2e::cluster::{Cluster, shared};
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn operator_binary() -> PathBuf {
    let bin = std::env::var_os("IPKEEP_OPERATOR_BIN")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/debug/ipkeep-operator"));
    assert!(
        bin.is_file(),
        "{} missing: run: cargo build -p ipkeep-operator (or set IPKEEP_OPERATOR_BIN)",
        bin.display()
    );
    bin
}

fn ok(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn kubectl_apply(cluster: &Cluster, yaml: &str) {
    let mut child = cluster
        .kubectl()
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(yaml.as_bytes()).unwrap();
    ok("kubectl apply", child.wait_with_output().unwrap());
}

/// A component process, stopped with SIGTERM (so it releases its Lease) when dropped.
struct Component {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Component {
    fn start(name: &'static str, kubeconfig: &Path, args: &[String], log: PathBuf) -> Self {
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(operator_binary())
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        Component { name, child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("the {} exited ({status}):\n{}", self.name, self.log());
        }
    }
}

impl Drop for Component {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

/// Polls `check` until true, failing with `what` (and the components' logs) after 90 s.
async fn eventually(what: &str, components: &mut [&mut Component], mut check: impl FnMut() -> bool) {
    let started = Instant::now();
    loop {
        if check() {
            return;
        }
        for c in components.iter_mut() {
            c.assert_running();
        }
        if started.elapsed() > Duration::from_secs(90) {
            let logs: Vec<String> = components
                .iter()
                .map(|c| format!("--- {}:\n{}", c.name, c.log()))
                .collect();
            panic!("gave up after 90 s waiting for {what}\n{}", logs.join("\n"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

type Request = (String, String, String, String);

/// Every request `user` made, from the audit log: (verb, group, resource/subresource) → codes.
fn requests_of(audit_log: &Path, user: &str) -> BTreeMap<Request, BTreeSet<i64>> {
    let mut out: BTreeMap<Request, BTreeSet<i64>> = BTreeMap::new();
    for line in std::fs::read_to_string(audit_log).unwrap().lines() {
        let event: Value = serde_json::from_str(line).unwrap();
        if event["user"]["username"] != user || event["stage"] != "ResponseComplete" {
            continue;
        }
        let o = &event["objectRef"];
        let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let key = (
            s(&event["verb"]),
            s(&o["apiGroup"]),
            s(&o["resource"]),
            s(&o["subresource"]),
        );
        let code = event["responseStatus"]["code"].as_i64().unwrap_or_default();
        out.entry(key).or_default().insert(code);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_components_need_nothing_the_chart_does_not_grant() {
    let cluster = shared().await.unwrap();
    let audit_log = cluster
        .audit_log_path()
        .expect("the shared control plane writes an audit log")
        .to_path_buf();
    let ns = cluster.fresh_namespace("rbac").await.unwrap();
    let work = cluster.fresh_namespace("rbac-work").await.unwrap();
    let scratch = std::env::temp_dir().join(format!("ipkeep-chart-rbac-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(scratch.join("data/cbr0")).unwrap();

    let release = "rbac";
    let mut helm = Command::new(cluster.bin("helm"));
    helm.args(["install", release])
        .arg(root().join("charts/ipkeep"))
        .args(["-n", &ns])
        .env("KUBECONFIG", cluster.kubeconfig_path())
        .env("HELM_CACHE_HOME", scratch.join("helm-cache"))
        .env("HELM_CONFIG_HOME", scratch.join("helm-config"))
        .env("HELM_DATA_HOME", scratch.join("helm-data"));
    ok("helm install", helm.output().unwrap());

    // Each component as its own ServiceAccount, with the flags the chart gives it.
    let controller_sa = format!("{release}-ipkeep-controller");
    let agent_sa = format!("{release}-ipkeep-agent");
    let controller_kc = scratch.join("controller.kubeconfig");
    let agent_kc = scratch.join("agent.kubeconfig");
    cluster
        .write_service_account_kubeconfig(&ns, &controller_sa, &controller_kc)
        .await
        .unwrap();
    cluster
        .write_service_account_kubeconfig(&ns, &agent_sa, &agent_kc)
        .await
        .unwrap();
    let data_dir = scratch.join("data");
    let mut agent = Component::start(
        "agent",
        &agent_kc,
        &[
            "agent".into(),
            "--node-name=node-a".into(),
            format!("--data-dir={}", data_dir.display()),
            "--network=cbr0".into(),
            "--probe-addr=127.0.0.1:0".into(),
        ],
        scratch.join("agent.log"),
    );
    let mut controller = Component::start(
        "controller",
        &controller_kc,
        &[
            "controller".into(),
            "--metrics-addr=127.0.0.1:0".into(),
            format!("--lease-name={controller_sa}"),
            format!("--lease-namespace={ns}"),
            "--identity=rbac-test".into(),
        ],
        scratch.join("controller.log"),
    );

    // A reservation's whole life: written to the node, released, expired, removed.
    kubectl_apply(
        cluster,
        &format!(
            "apiVersion: ipkeep.dev/v1alpha1\nkind: IPReservation\nmetadata: {{name: web-0, namespace: {work}}}\n\
             spec: {{ips: [\"10.244.1.17\"], nodeName: node-a, retainFor: 3s}}\n"
        ),
    );
    let file = data_dir.join(format!("cbr0/reserved/{work}/web-0"));
    eventually("the agent to write the reservation file", &mut [&mut agent, &mut controller], || {
        file.exists()
    })
    .await;
    eventually(
        "the controller to delete the expired reservation",
        &mut [&mut agent, &mut controller],
        || {
            let out = cluster
                .kubectl()
                .args(["get", "ipreservations", "-n", &work, "-o", "name"])
                .output()
                .unwrap();
            out.status.success() && out.stdout.is_empty()
        },
    )
    .await;
    eventually("the agent to remove the reservation file", &mut [&mut agent, &mut controller], || {
        !file.exists()
    })
    .await;
    drop(controller);
    drop(agent);

    for (sa, must_have) in [
        (
            &controller_sa,
            vec![
                ("watch", "", "pods", ""),
                ("watch", "ipkeep.dev", "ipreservations", ""),
                ("patch", "ipkeep.dev", "ipreservations", "status"),
                ("delete", "ipkeep.dev", "ipreservations", ""),
                ("patch", "coordination.k8s.io", "leases", ""),
            ],
        ),
        (
            &agent_sa,
            vec![
                ("list", "ipkeep.dev", "ipreservations", ""),
                ("watch", "ipkeep.dev", "ipreservations", ""),
            ],
        ),
    ] {
        let user = format!("system:serviceaccount:{ns}:{sa}");
        let requests = requests_of(&audit_log, &user);
        let denied: Vec<&Request> = requests
            .iter()
            .filter(|(_, codes)| codes.contains(&403))
            .map(|(k, _)| k)
            .collect();
        assert!(denied.is_empty(), "{sa} was denied {denied:?}; all its requests: {requests:?}");
        for (verb, group, resource, sub) in must_have {
            let key = (verb.into(), group.into(), resource.into(), sub.into());
            assert!(
                requests.contains_key(&key),
                "{sa} never made {key:?} (did it run as its ServiceAccount?): {requests:?}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
}
