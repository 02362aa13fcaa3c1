//! The agent (being built; see the operator issues).

/// Command-line flags of `ipkeep-operator agent`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs the agent until shutdown.
pub fn main(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("the agent is not part of this build yet")
}
