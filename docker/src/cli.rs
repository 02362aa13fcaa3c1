//! The command line: `ipkeep-docker [serve] [--socket …] [--data-dir …] [--default-retain-for …]`
//! runs the driver; `ipkeep-docker list` prints every pool's addresses.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, Parser, Subcommand};

use crate::driver::{Driver, DriverConfig, DriverError};
use crate::pool::AutoPools;
use crate::server::{Limits, ServeError, Server, bind};

/// ipkeep for Docker: a remote IPAM driver that gives a container re-created under the same
/// name its address back (Docker Engine ≥ 29 sends the name).
#[derive(Debug, Parser)]
#[command(
    name = "ipkeep-docker",
    version,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// What to do (default: serve).
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The driver's flags when no subcommand is given.
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve Docker's remote IPAM protocol on a Unix socket.
    Serve(ServeArgs),
    /// Print every pool's addresses: name, in use or retained until when.
    List(ListArgs),
}

/// `serve`'s flags.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The socket the engine finds the plugin at (its name is the driver's name).
    #[arg(long, default_value = "/run/docker/plugins/ipkeep.sock")]
    pub socket: PathBuf,
    /// Where pools and retentions are kept.
    #[arg(long, default_value = "/var/lib/ipkeep-docker")]
    pub data_dir: PathBuf,
    /// How long a released container's address is held for its name (30m, 24h, 7d), unless the
    /// network says otherwise with --ipam-opt ipkeep.dev/retain-for=…
    #[arg(long, default_value = "24h", value_parser = parse_retain_for)]
    pub default_retain_for: Duration,
    /// Where pools come from when a network is created without --subnet: <IPv4 subnet>:<prefix>.
    #[arg(long, default_value = "172.16.0.0/12:16", value_parser = AutoPools::parse)]
    pub auto_pools: AutoPools,
    /// Keep the address of a container without a name (engines before 29) for its MAC address:
    /// the engine then sends every endpoint's MAC, random unless `--mac-address` pinned it, so
    /// unpinned containers' addresses are retained too (keep --default-retain-for short).
    #[arg(long)]
    pub key_by_mac: bool,
}

/// `list`'s flags.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Where pools and retentions are kept.
    #[arg(long, default_value = "/var/lib/ipkeep-docker")]
    pub data_dir: PathBuf,
}

fn parse_retain_for(text: &str) -> Result<Duration, String> {
    ipkeep_reservation::RetainFor::parse(text)
        .map(|r| r.duration())
        .map_err(|e| e.to_string())
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The endpoint could not start.
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// Listing failed.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// The metrics could not be registered (never with the fixed set the driver has).
    #[error("failed to register the metrics")]
    Metrics(#[source] prometheus::Error),
    /// The tokio runtime could not be built, or the socket registered with it.
    #[error("failed to start the runtime serving the socket")]
    Runtime(#[source] std::io::Error),
}

/// Runs the command (serving never returns unless the socket cannot be bound).
pub fn run(cli: Cli) -> Result<(), RunError> {
    match cli.command {
        Some(Command::List(args)) => {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            print!(
                "{}",
                crate::list::render(&crate::driver::list(&args.data_dir)?, now)
            );
            Ok(())
        }
        Some(Command::Serve(args)) => serve(args),
        None => serve(cli.serve),
    }
}

fn serve(args: ServeArgs) -> Result<(), RunError> {
    let listener = bind(&args.socket)?;
    eprintln!(
        "ipkeep-docker: serving {} (data in {}, default retention {}s, automatic pools from {})",
        args.socket.display(),
        args.data_dir.display(),
        args.default_retain_for.as_secs(),
        args.auto_pools
    );
    let driver = Driver::new(DriverConfig {
        data_dir: args.data_dir,
        default_retain_for: args.default_retain_for,
        auto_pools: args.auto_pools,
        key_by_mac: args.key_by_mac,
    });
    let server = Arc::new(Server::new(driver, Limits::default()).map_err(RunError::Metrics)?);
    // One thread, calls answered one at a time: each is a few file operations under its pool's
    // lock (which already serialised calls on one pool), about a millisecond (make bench-docker).
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(RunError::Runtime)?
        .block_on(server.serve(listener))
        .map_err(RunError::Runtime)
}
