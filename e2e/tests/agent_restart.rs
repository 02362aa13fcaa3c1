//! The built `ipkeep-operator agent` binary as a DaemonSet runs it: killed with SIGKILL while the
//! reservations change (the files stay as they were meanwhile), restarted, and the files equal
//! the reservations again — including a leftover temporary of an interrupted write removed.
//! SIGTERM stops it gracefully (exit 0).
//!
//! The binary is `$IPKEEP_OPERATOR_BIN` when set, else built with cargo into this target dir.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "agent_support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use ipkeep_operator::crd::IPReservation;
use ipkeep_plugin::reservation::Timestamp;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::*;

/// The `ipkeep-operator` binary: `$IPKEEP_OPERATOR_BIN`, else `cargo build` of it (the test
/// fails loudly if that fails).
fn operator_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("IPKEEP_OPERATOR_BIN") {
        let bin = PathBuf::from(bin);
        assert!(
            bin.exists(),
            "IPKEEP_OPERATOR_BIN={} does not exist",
            bin.display()
        );
        return bin;
    }
    let status = Command::new(env!("CARGO"))
        .args(["build", "-p", "ipkeep-operator", "--bin", "ipkeep-operator"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("failed to run cargo to build ipkeep-operator");
    assert!(status.success(), "cargo build -p ipkeep-operator failed");
    // <target>/debug/deps/<this test> → <target>/debug/ipkeep-operator
    let exe = std::env::current_exe().expect("the test's own path");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test runs from <target>/<profile>/deps")
        .join("ipkeep-operator");
    assert!(bin.exists(), "{} was not built", bin.display());
    bin
}

fn spawn_agent(bin: &Path, kubeconfig: &Path, node: &str, data_dir: &Path) -> Child {
    let mut cmd = Command::new(bin);
    cmd.arg("agent")
        .args(["--node-name", node])
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--probe-addr", "127.0.0.1:0", "--log-level", "info"])
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    for n in NETWORKS {
        cmd.args(["--network", n]);
    }
    cmd.spawn().expect("failed to start the agent binary")
}

/// Pod → (addresses, releaseTime) of every network's files; all networks must agree.
fn summary(data_dir: &Path) -> BTreeMap<String, (Vec<String>, Option<Timestamp>)> {
    let per_net: Vec<_> = NETWORKS
        .iter()
        .map(|n| {
            files_of(data_dir, n)
                .into_iter()
                .map(|(k, f)| {
                    (
                        k.to_string(),
                        (
                            f.ips.iter().map(ToString::to_string).collect(),
                            f.release_time,
                        ),
                    )
                })
                .collect::<BTreeMap<_, _>>()
        })
        .collect();
    if per_net.iter().all(|m| *m == per_net[0]) {
        per_net[0].clone()
    } else {
        BTreeMap::from([("<networks differ>".to_owned(), (Vec::new(), None))])
    }
}

async fn wait_summary(
    data_dir: &Path,
    want: &BTreeMap<String, (Vec<String>, Option<Timestamp>)>,
    what: &str,
) {
    wait_for(what, || {
        let ok = summary(data_dir) == *want;
        async move { ok.then_some(()) }
    })
    .await;
}

fn entry(
    ns: &str,
    pod: &str,
    ip: &str,
    release: Option<i64>,
) -> (String, (Vec<String>, Option<Timestamp>)) {
    (
        format!("{ns}/{pod}"),
        (vec![ip.to_owned()], release.map(Timestamp::from_unix_secs)),
    )
}

/// The scenario, for any API server reachable through `client` and `kubeconfig`.
pub async fn killed_agent_catches_up(client: Client, kubeconfig: &Path) {
    let bin = operator_binary();
    let ns = namespace(&client, "agent-kill").await;
    let node = unique("node-k");
    let data_dir = scratch(&node);
    let api: Api<IPReservation> = Api::namespaced(client.clone(), &ns);
    let bound = json!({"status": {"phase": "Bound"}});
    for (name, ip) in [("r1", "10.1.0.1"), ("r2", "10.1.0.2"), ("r3", "10.1.0.3")] {
        api.create(
            &PostParams::default(),
            &reservation(name, &node, &[ip], None),
        )
        .await
        .expect("failed to create");
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&bound))
            .await
            .expect("failed to set Bound");
    }
    let mut agent = spawn_agent(&bin, kubeconfig, &node, &data_dir);
    let first = BTreeMap::from([
        entry(&ns, "r1", "10.1.0.1", None),
        entry(&ns, "r2", "10.1.0.2", None),
        entry(&ns, "r3", "10.1.0.3", None),
    ]);
    wait_summary(&data_dir, &first, "the agent binary's first sync").await;

    agent.kill().expect("failed to SIGKILL the agent");
    agent.wait().expect("failed to reap the agent");
    // Changes while the agent is down.
    api.delete("r1", &DeleteParams::default())
        .await
        .expect("failed to delete r1");
    api.patch_status(
        "r2",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"status": {"phase": "Released", "releaseTime": "2026-11-21T12:00:00Z"}}),
        ),
    )
    .await
    .expect("failed to release r2");
    api.patch(
        "r3",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"nodeName": unique("elsewhere")}})),
    )
    .await
    .expect("failed to move r3");
    api.create(
        &PostParams::default(),
        &reservation("r4", &node, &["10.1.0.4"], None),
    )
    .await
    .expect("failed to create r4");
    api.patch_status("r4", &PatchParams::default(), &Patch::Merge(&bound))
        .await
        .expect("failed to set Bound");
    // A write the kill interrupted.
    let ns_dir = data_dir.join(NETWORKS[1]).join("reserved").join(&ns);
    std::fs::write(ns_dir.join(".ipkeep-tmp-77-0"), b"{\"vers").unwrap();
    // Nobody is harmed while it is down: the files are exactly as it left them.
    assert_eq!(
        summary(&data_dir),
        first,
        "the files changed while the agent was down"
    );

    let mut agent = spawn_agent(&bin, kubeconfig, &node, &data_dir);
    let after = BTreeMap::from([
        entry(&ns, "r2", "10.1.0.2", Some(1_795_262_400)),
        entry(&ns, "r4", "10.1.0.4", None),
    ]);
    wait_summary(&data_dir, &after, "the restarted agent to catch up").await;
    wait_for("the leftover temporary to be removed", || {
        let gone = !ns_dir.join(".ipkeep-tmp-77-0").exists();
        async move { gone.then_some(()) }
    })
    .await;

    // SIGTERM: a graceful stop with exit status 0.
    let status = Command::new("kill")
        .args(["-TERM", &agent.id().to_string()])
        .status()
        .expect("failed to run kill");
    assert!(status.success());
    let exit = agent.wait().expect("failed to reap the agent");
    assert!(
        exit.success(),
        "the agent did not stop gracefully on SIGTERM: {exit}"
    );
    for n in NETWORKS {
        assert_eq!(
            garbage_of(&data_dir, n),
            Vec::<String>::new(),
            "garbage left in {n}"
        );
    }
    std::fs::remove_dir_all(&data_dir).unwrap();
}

#[tokio::test]
async fn killed_agent_catches_up_on_the_test_server() {
    let server = start_server().await;
    let kubeconfig = scratch("kubeconfig").join("config");
    server
        .write_kubeconfig(&kubeconfig)
        .expect("failed to write the kubeconfig");
    killed_agent_catches_up(server.client(), &kubeconfig).await;
}
