//! `ipkeep-e2e`: command-line entry to the end-to-end infrastructure.
//!
//! `ipkeep-e2e apiserver --listen 127.0.0.1:PORT --crds crds/` runs the Kubernetes API test server
//! until interrupted.
//!
//! `ipkeep-e2e node --name N --pod-cidr CIDR --data-dir DIR --cni-bin-dir DIR` runs a kubelet
//! stand-in (see `ipkeep_e2e::node`) until SIGINT/SIGTERM.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use ipkeep_e2e::apiserver::{ServerOptions, TestServer};

#[derive(Debug, Parser)]
#[command(name = "ipkeep-e2e", about = "ipkeep's end-to-end test infrastructure")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the in-memory Kubernetes API test server (plain HTTP) until Ctrl-C.
    Apiserver {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        /// Directory of CustomResourceDefinition YAML files to load (repeatable).
        #[arg(long = "crds")]
        crds: Vec<PathBuf>,
        /// Also write a kubeconfig for this server to this file.
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
    },
    /// Run a kubelet stand-in: one simulated node running the real CNI chain for its pods.
    Node(ipkeep_e2e::node::cli::NodeArgs),
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
        Command::Apiserver {
            listen,
            crds,
            kubeconfig,
        } => runtime.block_on(async move {
            let server = match TestServer::start(ServerOptions {
                listen,
                crd_dirs: crds,
                ..ServerOptions::default()
            })
            .await
            {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("ipkeep-e2e: {}", error_chain(&e));
                    return ExitCode::FAILURE;
                }
            };
            if let Some(path) = kubeconfig
                && let Err(e) = server.write_kubeconfig(&path)
            {
                eprintln!("ipkeep-e2e: {}", error_chain(&e));
                return ExitCode::FAILURE;
            }
            println!("{}", server.url());
            if let Err(e) = tokio::signal::ctrl_c().await {
                eprintln!("ipkeep-e2e: failed to wait for Ctrl-C: {e}");
            }
            server.shutdown().await;
            ExitCode::SUCCESS
        }),
        Command::Node(args) => runtime.block_on(ipkeep_e2e::node::cli::main(args)),
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}
