//! The end-to-end scenarios on a cluster with the chart installed, one `pub async fn` each, shared
//! by the real-node tests (`tests/realnode/`, on their own nodes or on a user's cluster with
//! `IPKEEP_E2E_KUBECONFIG`) and the demo ([`crate::demo`]).
//!
//! The story the demo tells is the scenarios' own code: [`keep_ip::keep_address`] and
//! [`retention::kept_for`] + [`retention::expires`] take a [`Narrator`] and return a
//! [`ScenarioError`]. The tests run them with [`TestLog`] and fail on the error
//! ([`or_fail`]); the demo runs them with a narrator that tells a newcomer each step and turns
//! the error into its own. The rest of the scenarios fail by panicking, as the testkit does.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod keep_ip;
pub mod moved;
pub mod retention;

use crate::testkit::system::System;
pub use crate::testkit::system::{ScenarioError, ensure, or_fail};

/// Who hears the story of a scenario as it happens.
pub trait Narrator {
    /// A new step begins.
    fn step(&mut self, heading: &str);
    /// A remark on what just happened or comes next.
    fn note(&mut self, text: &str);
    /// A kubectl command the scenario ran in its namespace (`args`), the manifest it was fed,
    /// and what it printed.
    fn ran(&mut self, namespace: &str, args: &[&str], manifest: Option<&str>, output: &str);
}

/// The tests' narrator: the story on stderr, beside the test's own output.
#[derive(Debug, Default)]
pub struct TestLog;

impl Narrator for TestLog {
    fn step(&mut self, heading: &str) {
        eprintln!("--- {heading}");
    }

    fn note(&mut self, text: &str) {
        eprintln!("{text}");
    }

    fn ran(&mut self, namespace: &str, args: &[&str], _manifest: Option<&str>, output: &str) {
        eprintln!("$ kubectl -n {namespace} {}\n{output}", args.join(" "));
    }
}

/// Runs kubectl in the scenario's namespace and tells `n`; its stdout.
pub fn show(sys: &System, n: &mut dyn Narrator, args: &[&str]) -> Result<String, ScenarioError> {
    let out = sys.try_kubectl(args, None)?;
    n.ran(&sys.ns, args, None, &out);
    Ok(out)
}

/// Applies `yaml` in the scenario's namespace and tells `n`.
pub fn apply(sys: &System, n: &mut dyn Narrator, yaml: &str) -> Result<(), ScenarioError> {
    let out = sys.try_apply(yaml)?;
    n.ran(&sys.ns, &["apply", "-f", "-"], Some(yaml), &out);
    Ok(())
}
