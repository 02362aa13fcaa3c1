//! `ipkeep-e2e`: command-line entry to the end-to-end infrastructure.
//!
//! `ipkeep-e2e cluster up|down|env` manages a real control plane, and `ipkeep-e2e cluster
//! fault-proxy` serves a fault-injecting proxy in front of its API server.
//!
//! `ipkeep-e2e demo [--keep]` runs the whole system and tells the story (`make demo`; see
//! `ipkeep_e2e::demo`).

use std::{net::SocketAddr, path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use ipkeep_e2e::{
    cluster::{
        cli::{self, UpOptions},
        realnode::{NodeCni, NodeDirs, NodeRuntime, node::Strike},
    },
    error_chain,
};

#[derive(Debug, Parser)]
#[command(name = "ipkeep-e2e", about = "ipkeep's end-to-end test infrastructure")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The whole system on this machine and the story of a pod keeping its IP, told step by step
    /// (root; cleans up after itself, also on Ctrl-C).
    Demo(DemoArgs),
    /// The torture run: random faults and churn on three real nodes from a seed, an oracle
    /// checking every promise every second; prints the schedule first and the report last
    /// (root; exits 1 on a violation; cleans up after itself, also on Ctrl-C).
    Torture(TortureArgs),
    /// A real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)
    /// on 127.0.0.1, from the binaries `make cluster-bins` builds.
    Cluster {
        #[command(subcommand)]
        action: ClusterAction,
        /// The state directory (certificates, etcd data, logs, kubeconfig).
        #[arg(long, global = true, default_value_os_t = cli::default_state_dir())]
        state_dir: PathBuf,
    },
}

/// Flags of `ipkeep-e2e demo`.
#[derive(Debug, clap::Args)]
struct DemoArgs {
    /// Keep everything running after the story, until Ctrl-C, and print the KUBECONFIG.
    #[arg(long)]
    keep: bool,
    /// `make image`'s archive, loaded into the real nodes.
    #[arg(long, default_value = "target/image/ipkeep.oci.tar")]
    image_archive: PathBuf,
    /// The Helm chart installed on the real nodes.
    #[arg(long, default_value = "charts/ipkeep")]
    chart: PathBuf,
}

/// Flags of `ipkeep-e2e torture`.
#[derive(Debug, clap::Args)]
struct TortureArgs {
    /// The seed of the schedule: the same seed replays the same schedule.
    #[arg(long)]
    seed: u64,
    /// How long faults and churn go on (`300s`, `5m`, `1h`); the quiet end comes after.
    #[arg(long, default_value = "5m", value_parser = duration_arg)]
    duration: std::time::Duration,
    /// The nodes' CNI network: `bridge` (the conflist with host-local) or real `flannel`.
    #[arg(long, default_value = "bridge")]
    cni: NodeCni,
    /// Also write the report to this file.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Print the schedule and stop: no cluster (to read what a seed does, or pick one).
    #[arg(long)]
    dry_run: bool,
    /// Leave this fault kind out of the nemesis's deck (repeatable; a name as the report prints
    /// it, such as `WipeNetworkDir`).
    #[arg(long)]
    without: Vec<ipkeep_e2e::torture::schedule::FaultKind>,
}

/// Every fault kind but those left out.
fn fault_kinds(
    without: &[ipkeep_e2e::torture::schedule::FaultKind],
) -> Vec<ipkeep_e2e::torture::schedule::FaultKind> {
    ipkeep_e2e::torture::schedule::FaultKind::ALL
        .into_iter()
        .filter(|k| !without.contains(k))
        .collect()
}

/// A duration in `retainFor`'s grammar (`90s`, `30m`, `2h`).
fn duration_arg(text: &str) -> Result<std::time::Duration, String> {
    ipkeep_reservation::RetainFor::parse(text)
        .map(|r| r.duration())
        .map_err(|e| e.to_string())
}

#[derive(Debug, Subcommand)]
enum ClusterAction {
    /// Start it and return once every component is ready; prints the `env` lines.
    Up {
        /// Stay in the foreground until Ctrl-C or SIGTERM instead of detaching.
        #[arg(long)]
        foreground: bool,
        /// Serve the API on this port instead of a free one.
        #[arg(long)]
        apiserver_port: Option<u16>,
        /// Write the API server's audit log (level Metadata) to audit.log in the state dir.
        #[arg(long)]
        audit_log: bool,
        /// Also start this many real nodes (kubelet, containerd, kube-proxy; root; see
        /// docs/real-nodes.md); 0 for the control plane alone.
        #[arg(long, default_value_t = 0)]
        nodes: u8,
        /// The nodes' CNI network: bridge or flannel.
        ///
        /// `bridge`: a conflist with bridge + host-local over each node's pod CIDR, routes
        /// between the nodes set by us. `flannel`: real flanneld
        /// with the Kubernetes subnet manager and the vxlan backend on every node, flannel's CNI
        /// plugin under kube-flannel's own conflist (`make flannel-bins` builds them).
        #[arg(long, default_value = "bridge")]
        cni: NodeCni,
        /// Where the nodes keep their CNI plugins and configuration: standard or k3s.
        ///
        /// `standard`: /opt/cni/bin and /etc/cni/net.d. `k3s`: k3s's directories — containerd's
        /// bin_dir /var/lib/rancher/k3s/data/cni holding absolute symlinks into the release's
        /// data/<release>/bin, its conf_dir /var/lib/rancher/k3s/agent/etc/cni/net.d, and with
        /// `--cni flannel` k3s's own flannel conflist. (k3s links every plugin name to one
        /// multi-call binary; the plugins here are Debian's and flannel's, each its own.)
        #[arg(long, default_value = "standard")]
        layout: NodeDirs,
        /// The nodes' container runtime: containerd or cri-o.
        ///
        /// `cri-o`: CRI-O (`make crio-bins` builds it, with the upstream CNI plugins its nodes
        /// run) with Debian's conmon and runc, and a conflist of cniVersion 1.1.0, so that CRI-O's
        /// start-up CNI GC reaches the network (bridge network, standard layout only).
        #[arg(long, default_value = "containerd")]
        runtime: NodeRuntime,
        /// Of the nodes, how many (the first ones) run CRI-O, the others containerd: a mixed
        /// cluster. Default: all of them with `--runtime cri-o`, none otherwise.
        #[arg(long)]
        crio_nodes: Option<u8>,
    },
    /// Run a command inside a real node, as `docker exec` reaches into a kind node.
    ///
    /// It runs in the node's network namespace (its eth0, routes, iptables, the pods' bridge) and mount
    /// namespace (its own /etc/cni/net.d, /opt/cni/bin, /var/lib/cni, /var/lib/kubelet, /run),
    /// with the node binaries first on PATH. Not its PID, UTS or cgroup namespaces: a node
    /// has none of its own (`ps` shows every process of the machine). Exits with the command's
    /// status.
    Exec {
        /// The node (`node-0`, as `kubectl get nodes` names it).
        node: String,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Power a real node off and on, as the tests do: its daemons stop, every container is
    /// killed, its network namespace and /run go, /var/lib stays; then its daemons start again.
    Reboot {
        /// The node (`node-0`).
        node: String,
    },
    /// Stop one daemon of a real node and start it again (the containers keep running).
    Restart {
        /// The node (`node-0`).
        node: String,
        /// The daemon: the node's runtime (containerd or crio), kubelet, or flanneld.
        daemon: String,
    },
    /// Stop it and remove its state, whatever state a crash left it in (real nodes included).
    Down,
    /// Import an OCI archive into every real node's runtime (containerd or CRI-O); prints each
    /// REPOSITORY:TAG.
    LoadImage {
        /// The OCI archive (e.g. target/image/ipkeep.oci.tar from `make image`).
        archive: PathBuf,
    },
    /// Remove the real nodes of runs whose owner is gone (the watchdog runs this after a crash).
    ReapNodes,
    /// Run Debian's runc with these arguments, a container's `oom_score_adj` raised to this
    /// process's own first (what CRI-O nodes run as runc: no CAP_SYS_RESOURCE here).
    #[command(hide = true)]
    Runc {
        /// runc's arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Print the shell lines (KUBECONFIG, PATH) that point clients at it.
    Env,
    /// Serve a fault-injecting proxy in front of its API server until Ctrl-C: prints the
    /// proxy's URL, then its control endpoint's (`POST /rules` with a JSON rule; see
    /// `ipkeep_e2e::proxy`).
    FaultProxy {
        /// Where the proxy listens.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// Where its control endpoint (plain HTTP) listens.
        #[arg(long, default_value = "127.0.0.1:0")]
        admin: SocketAddr,
        /// A kubeconfig (a ServiceAccount token's: the proxy passes tokens on) to rewrite so
        /// that it points through the proxy...
        #[arg(long, requires = "kubeconfig_out")]
        kubeconfig: Option<PathBuf>,
        /// ...written here.
        #[arg(long, requires = "kubeconfig")]
        kubeconfig_out: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ipkeep-e2e: failed to start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::Cluster { action, state_dir } => {
            // Absolute, so that `down` recognises the supervisor `up` started by its command line.
            let state_dir = match std::path::absolute(&state_dir) {
                Ok(dir) => dir,
                Err(e) => {
                    eprintln!(
                        "ipkeep-e2e cluster: failed to resolve --state-dir {}: {e}",
                        state_dir.display()
                    );
                    return ExitCode::FAILURE;
                }
            };
            let result = match action {
                ClusterAction::Up {
                    foreground,
                    apiserver_port,
                    audit_log,
                    nodes,
                    cni,
                    layout,
                    runtime: node_runtime,
                    crio_nodes,
                } => {
                    let options = UpOptions {
                        state_dir,
                        apiserver_port,
                        audit_log,
                        nodes,
                        cni,
                        dirs: layout,
                        crio_nodes: crio_nodes.unwrap_or(match node_runtime {
                            NodeRuntime::CriO => nodes,
                            NodeRuntime::Containerd => 0,
                        }),
                    };
                    if foreground {
                        runtime.block_on(cli::run_foreground(options))
                    } else {
                        runtime.block_on(cli::up(options))
                    }
                }
                ClusterAction::Down => {
                    cli::down(&state_dir).map(|line| eprintln!("ipkeep-e2e cluster: {line}"))
                }
                ClusterAction::Env => cli::env(&state_dir).map(|text| print!("{text}")),
                ClusterAction::FaultProxy {
                    listen,
                    admin,
                    kubeconfig,
                    kubeconfig_out,
                } => runtime.block_on(cli::fault_proxy(
                    &state_dir,
                    cli::FaultProxyOptions {
                        listen,
                        admin,
                        kubeconfig: kubeconfig.zip(kubeconfig_out),
                    },
                )),
                ClusterAction::Exec { node, command } => {
                    match cli::exec(&state_dir, &node, &command) {
                        Ok(status) => {
                            return ExitCode::from(
                                status
                                    .code()
                                    .and_then(|c| u8::try_from(c).ok())
                                    .unwrap_or(1),
                            );
                        }
                        Err(e) => Err(e),
                    }
                }
                ClusterAction::Reboot { node } => cli::strike(&state_dir, &node, Strike::Reboot),
                ClusterAction::Restart { node, daemon } => {
                    cli::strike(&state_dir, &node, Strike::Restart(daemon))
                }
                ClusterAction::LoadImage { archive } => cli::load_image(&state_dir, &archive)
                    .map(|names| names.iter().for_each(|n| println!("{n}"))),
                ClusterAction::Runc { args } => {
                    let e = ipkeep_e2e::cluster::realnode::crio::runc_clamped(&args);
                    eprintln!("ipkeep-e2e cluster runc: {e}");
                    return ExitCode::FAILURE;
                }
                ClusterAction::ReapNodes => {
                    for line in ipkeep_e2e::cluster::realnode::cleanup_stale() {
                        eprintln!("ipkeep-e2e cluster: {line}");
                    }
                    Ok(())
                }
            };
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("ipkeep-e2e cluster: {}", error_chain(&e));
                    ExitCode::FAILURE
                }
            }
        }
        Command::Torture(args) if args.dry_run => {
            use std::io::Write as _;
            let schedule = ipkeep_e2e::torture::schedule::Schedule::draw(
                args.seed,
                args.duration,
                ipkeep_e2e::torture::NODES,
                &fault_kinds(&args.without),
            );
            // Written, not print!: a reader that stops early (`| head`) ends the printing quietly.
            let _ = std::io::stdout()
                .lock()
                .write_all(ipkeep_e2e::torture::schedule_text(&schedule).as_bytes());
            ExitCode::SUCCESS
        }
        Command::Torture(args) => {
            let options = ipkeep_e2e::torture::Options {
                seed: args.seed,
                duration: args.duration,
                cni: args.cni,
                faults: fault_kinds(&args.without),
            };
            let result = runtime.block_on(ipkeep_e2e::torture::run(options));
            // Its workload's kubectl calls may still be running against the stopped cluster:
            // they are not waited for.
            runtime.shutdown_timeout(std::time::Duration::from_secs(5));
            match result {
                Ok(report) => {
                    let text = report.text();
                    println!("{text}");
                    if let Some(path) = &args.report
                        && let Err(e) = std::fs::write(path, &text)
                    {
                        eprintln!("ipkeep-e2e torture: writing {}: {e}", path.display());
                    }
                    if report.violations.is_empty() {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::FAILURE
                    }
                }
                Err(e) => {
                    eprintln!("ipkeep-e2e torture: {}", error_chain(&e));
                    ExitCode::from(2)
                }
            }
        }
        Command::Demo(args) => {
            let options = ipkeep_e2e::demo::DemoOptions {
                image_archive: args.image_archive,
                chart: args.chart,
                keep: args.keep,
            };
            match runtime.block_on(ipkeep_e2e::demo::run(options)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e @ ipkeep_e2e::demo::DemoError::Interrupted) => {
                    eprintln!("ipkeep-e2e demo: {e}");
                    ExitCode::from(130)
                }
                Err(e) => {
                    eprintln!("ipkeep-e2e demo: {}", error_chain(&e));
                    ExitCode::FAILURE
                }
            }
        }
    }
}
