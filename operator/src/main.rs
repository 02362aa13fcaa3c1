//! `ipkeep-operator`: parses the command line and hands over to the library.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ipkeep_operator::{agent, api, check, controller, install_cni, recover};

#[derive(Debug, Parser)]
#[command(
    name = "ipkeep-operator",
    version,
    about = "ipkeep's operator: keeps IPReservations in step with annotated pods (controller) and mirrors each node's reservations to disk (agent)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start: the size of the flag structs does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Reconcile IPReservations from annotated pods and delete expired ones (a Deployment).
    Controller(controller::Args),
    /// Keep this node's reservation files equal to its IPReservations (a DaemonSet).
    Agent(agent::Args),
    /// Print the IPReservation CustomResourceDefinition as YAML.
    Crd,
    /// Check an install: the CRD, the controller, an agent on every node, ipkeep in charge of
    /// each node's networks, reservations in conflict or unprotected (exit status 1 on any ✗).
    Check(check::Args),
    /// Install the plugin binary into the node's CNI bin directory, atomically (init container).
    InstallCni(install_cni::Args),
    /// Re-create the IPReservations the agents keep as lost (a deleted CRD, an etcd restore)
    /// from their nodes' files: a dry run unless --apply (exit status 1 if any is refused).
    Recover(recover::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Controller(args) => controller::main(args),
        Command::Agent(args) => agent::main(args),
        Command::Crd => api::crd_yaml()
            .map(|yaml| print!("{yaml}"))
            .map_err(anyhow::Error::from),
        Command::InstallCni(args) => install_cni::main(args),
        Command::Check(args) => match check::main(args) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::FAILURE,
            Err(e) => Err(e),
        },
        Command::Recover(args) => match recover::main(args) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::FAILURE,
            Err(e) => Err(e),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ipkeep-operator: {e:#}");
            ExitCode::FAILURE
        }
    }
}
