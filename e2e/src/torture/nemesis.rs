//! The torture run's nemesis: each [`FaultKind`] made real on the cluster, and healed. A fault
//! on a node strikes the node's daemons or files; one on the API goes through the fault proxy
//! every in-cluster client reaches the API server by (the `kubernetes` Service's endpoints point
//! at it), or kills the real component.

use std::{path::Path, time::Duration};

use crate::{
    cluster::realnode::{Cluster, RealNode, host::DEBIAN_CNI_DIR},
    proxy::{Fault as ProxyFault, FaultProxy, Rule, RuleId},
    testkit::{
        chart_dir,
        commands::kubectl,
        realnode::{RELEASE, RELEASE_NS, network_dir, wipe},
    },
};

use super::schedule::{Fault, FaultKind};

/// What undoes a held fault.
#[derive(Debug)]
pub enum Heal {
    /// Remove this proxy rule.
    Rule(RuleId),
    /// Give the webhook's Service its selector back.
    Webhook(String),
    /// Uncordon this node.
    Uncordon(String),
}

/// The label a Service selector gains while the webhook is made unreachable.
const UNREACHABLE: &str = "ipkeep-torture/unreachable";

/// Where the fault strikes, for the report.
pub fn target(c: &Cluster, f: &Fault) -> Option<String> {
    f.node.and_then(|i| c.nodes().get(i)).map(RealNode::name)
}

/// Makes `fault`; returns what heals it (for a held fault), or why it could not be made.
pub async fn strike(
    c: &Cluster,
    proxy: &FaultProxy,
    log_level: &mut bool,
    fault: &Fault,
) -> Result<Option<Heal>, String> {
    let node = fault.node.and_then(|i| c.nodes().get(i));
    let on_node = || node.ok_or_else(|| format!("{} needs a node", fault.kind));
    let plane = c.plane();
    match fault.kind {
        FaultKind::RuntimeRestart => on_node()?.restart_runtime().map_err(err)?,
        FaultKind::KubeletRestart => on_node()?.restart_kubelet().map_err(err)?,
        FaultKind::Reboot => on_node()?.reboot().map_err(err)?,
        FaultKind::AgentKill => {
            let n = on_node()?;
            until_it_works(|| {
                let uid = pod_uid(c, "app.kubernetes.io/component=agent", Some(&n.name()))?;
                kill_container_process(&uid, "agent")
            })?;
        }
        FaultKind::LeaderKill => until_it_works(|| {
            let uid = pod_uid_by_name(c, &leader(c)?)?;
            kill_container_process(&uid, "controller")
        })?,
        FaultKind::WebhookDown => {
            let service = format!("{RELEASE}-webhook");
            ok(kubectl(
                plane,
                &[
                    "-n",
                    RELEASE_NS,
                    "patch",
                    "service",
                    &service,
                    "--type=merge",
                    "-p",
                    &format!(r#"{{"spec":{{"selector":{{"{UNREACHABLE}":"true"}}}}}}"#),
                ],
                None,
            ))?;
            return Ok(Some(Heal::Webhook(service)));
        }
        FaultKind::ApiLatency => {
            return Ok(Some(Heal::Rule(
                proxy.add(Rule::new(ProxyFault::delay(Duration::from_millis(1_500)))),
            )));
        }
        FaultKind::ApiErrors => {
            return Ok(Some(Heal::Rule(
                proxy.add(Rule::new(ProxyFault::status(503))),
            )));
        }
        FaultKind::WatchDrop => proxy.close_watches(),
        FaultKind::AgentPartition => {
            let ip = std::net::IpAddr::V4(on_node()?.ip());
            return Ok(Some(Heal::Rule(
                proxy.add(Rule::new(ProxyFault::Hang).client(ip)),
            )));
        }
        FaultKind::ApiServerKill => plane
            .restart_component("kube-apiserver", Duration::from_secs(1))
            .await
            .map_err(err)?,
        FaultKind::EtcdKill => plane
            .restart_component("etcd", Duration::from_secs(1))
            .await
            .map_err(err)?,
        FaultKind::WipeNetworkDir => {
            let dir = network_dir(on_node()?);
            wipe(&dir).map_err(|e| format!("remove {}: {e}", dir.display()))?;
        }
        FaultKind::HostLocalOverwrite => {
            let n = on_node()?;
            let bin = n
                .host_path(n.dirs().cni_bin_dir())
                .ok_or("the CNI bin directory is not the node's own")?;
            overwrite(
                &Path::new(DEBIAN_CNI_DIR).join("host-local"),
                &bin.join("host-local"),
            )?;
        }
        FaultKind::HelmUpgrade => {
            *log_level = !*log_level;
            let level = if *log_level { "debug" } else { "info" };
            let chart = chart_dir();
            let out = c
                .plane()
                .helm()
                .args([
                    "upgrade",
                    RELEASE,
                    chart.to_str().unwrap_or("charts/ipkeep"),
                    "--namespace",
                    RELEASE_NS,
                    "--reuse-values",
                    "--set",
                    &format!("logging.level={level}"),
                ])
                .output()
                .map_err(|e| format!("helm: {e}"))?;
            ok(out)?;
        }
        FaultKind::Cordon => {
            let name = on_node()?.name();
            ok(kubectl(plane, &["cordon", &name], None))?;
            return Ok(Some(Heal::Uncordon(name)));
        }
    }
    Ok(None)
}

/// Undoes a held fault.
pub fn heal(c: &Cluster, proxy: &FaultProxy, heal: Heal) -> Result<(), String> {
    match heal {
        Heal::Rule(id) => {
            proxy.remove(id);
            Ok(())
        }
        Heal::Webhook(service) => ok(kubectl(
            c.plane(),
            &[
                "-n",
                RELEASE_NS,
                "patch",
                "service",
                &service,
                "--type=json",
                "-p",
                &format!(
                    r#"[{{"op":"remove","path":"/spec/selector/{}"}}]"#,
                    UNREACHABLE.replace('/', "~1")
                ),
            ],
            None,
        )),
        Heal::Uncordon(node) => ok(kubectl(c.plane(), &["uncordon", &node], None)),
    }
}

/// `kill` retried for up to a minute: the process it looks for may not run yet (an agent pod
/// restarting after a reboot, a controller rolled by an upgrade), and the fault is made once it
/// does, as a nemesis that waits for its moment.
fn until_it_works(mut kill: impl FnMut() -> Result<(), String>) -> Result<(), String> {
    let mut last = String::new();
    for _ in 0..30 {
        match kill() {
            Ok(()) => return Ok(()),
            Err(why) => last = why,
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    Err(last)
}

fn err(e: impl std::error::Error) -> String {
    crate::error_chain(&e)
}

fn ok(out: std::process::Output) -> Result<(), String> {
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// Copies `from` over `to` as a package manager does: a new file renamed into place.
fn overwrite(from: &Path, to: &Path) -> Result<(), String> {
    let tmp = to.with_extension("dpkg-new");
    std::fs::copy(from, &tmp).map_err(|e| format!("copy {}: {e}", from.display()))?;
    std::fs::rename(&tmp, to).map_err(|e| format!("rename to {}: {e}", to.display()))
}

/// The UID of the release's pod with `labels` (on `node`).
fn pod_uid(c: &Cluster, labels: &str, node: Option<&str>) -> Result<String, String> {
    let selector = node.map(|n| format!("spec.nodeName={n}"));
    let mut args = vec!["-n", RELEASE_NS, "get", "pods", "-l", labels];
    if let Some(s) = &selector {
        args.extend(["--field-selector", s.as_str()]);
    }
    args.extend(["-o", "jsonpath={.items[0].metadata.uid}"]);
    let out = kubectl(c.plane(), &args, None);
    let uid = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if out.status.success() && !uid.is_empty() {
        Ok(uid)
    } else {
        Err(format!(
            "no pod {labels} on {node:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn pod_uid_by_name(c: &Cluster, name: &str) -> Result<String, String> {
    let out = kubectl(
        c.plane(),
        &[
            "-n",
            RELEASE_NS,
            "get",
            "pod",
            name,
            "-o",
            "jsonpath={.metadata.uid}",
        ],
        None,
    );
    let uid = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if out.status.success() && !uid.is_empty() {
        Ok(uid)
    } else {
        Err(format!("no pod {name}"))
    }
}

/// The controller pod holding the release's Lease.
fn leader(c: &Cluster) -> Result<String, String> {
    let out = kubectl(
        c.plane(),
        &[
            "-n",
            RELEASE_NS,
            "get",
            "lease",
            "-o",
            "jsonpath={range .items[*]}{.spec.holderIdentity}{\"\\n\"}{end}",
        ],
        None,
    );
    let holders = String::from_utf8_lossy(&out.stdout).into_owned();
    let pods = kubectl(
        c.plane(),
        &[
            "-n",
            RELEASE_NS,
            "get",
            "pods",
            "-l",
            "app.kubernetes.io/component=controller",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}{\"\\n\"}{end}",
        ],
        None,
    );
    let pods = String::from_utf8_lossy(&pods.stdout).into_owned();
    pods.lines()
        .find(|p| !p.is_empty() && holders.lines().any(|h| h.contains(p)))
        .map(str::to_owned)
        .ok_or_else(|| format!("no controller pod holds a Lease (holders {holders:?})"))
}

/// SIGKILLs the `ipkeep-operator <subcommand>` process of the pod `uid` (found by its cgroup,
/// `…/pod<uid>/…`, as the kubelet's cgroupfs driver names it).
fn kill_container_process(uid: &str, subcommand: &str) -> Result<(), String> {
    let needle = format!("pod{uid}/");
    let mut killed = 0;
    for entry in std::fs::read_dir("/proc")
        .map_err(|e| format!("/proc: {e}"))?
        .flatten()
    {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let cgroup = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
        if !cgroup.contains(&needle) {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_operator = args
            .first()
            .is_some_and(|a| a.ends_with(b"ipkeep-operator"));
        if is_operator
            && args.get(1) == Some(&subcommand.as_bytes())
            && let Some(p) = rustix::process::Pid::from_raw(pid)
        {
            rustix::process::kill_process(p, rustix::process::Signal::KILL)
                .map_err(|e| format!("kill {pid}: {e}"))?;
            killed += 1;
        }
    }
    if killed == 0 {
        return Err(format!(
            "no ipkeep-operator {subcommand} process in pod {uid}"
        ));
    }
    Ok(())
}
