//! The controller (being built; see the operator issues).

/// Command-line flags of `ipkeep-operator controller`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs the controller until shutdown.
pub fn main(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("the controller is not part of this build yet")
}
