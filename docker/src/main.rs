//! `ipkeep-docker`: parses the command line and runs it.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = ipkeep_docker::cli::Cli::parse();
    match ipkeep_docker::cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ipkeep-docker: {}", ipkeep_docker::server::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}
