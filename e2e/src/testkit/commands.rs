//! Running the tools a test drives (kubectl, helm, …) and failing the test with their output when
//! they fail.

use std::process::{Command, Output};

use crate::command::{self, CommandError};

/// Runs `cmd` with `stdin` (none: an empty one) and returns what it did; the test fails only
/// when it cannot be run at all.
pub fn run(mut cmd: Command, stdin: Option<&str>) -> Output {
    command::run(&mut cmd, stdin).unwrap_or_else(|e| panic!("{}", crate::error_chain(&e)))
}

/// Runs `cmd` with `stdin` and returns what it did, or the test fails with the command and what
/// it printed.
pub fn checked(mut cmd: Command, stdin: Option<&str>) -> Output {
    command::checked(&mut cmd, stdin)
        .unwrap_or_else(|e: CommandError| panic!("{}", crate::error_chain(&e)))
}

/// The stdout of a command the test ran itself; the test fails, naming `what` (which can say
/// what to install) with the output, unless it succeeded.
pub fn ok(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `cmd` with `args` and `stdin`; its stdout, or the test fails with its output.
pub fn run_ok(mut cmd: Command, args: &[&str], stdin: Option<&str>) -> String {
    cmd.args(args);
    String::from_utf8_lossy(&checked(cmd, stdin).stdout).into_owned()
}

/// Where kubectl runs: the test's own control plane, or a cluster named by a kubeconfig.
pub trait KubectlTarget {
    /// A kubectl command aimed at it.
    fn kubectl_command(&self) -> Command;
}

impl KubectlTarget for crate::cluster::ControlPlane {
    fn kubectl_command(&self) -> Command {
        self.kubectl()
    }
}

/// kubectl against `target` with `args` and `stdin`.
pub fn kubectl(target: &impl KubectlTarget, args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = target.kubectl_command();
    cmd.args(args);
    run(cmd, stdin)
}

/// kubectl against `target` with `args` and `stdin`; its stdout, or the test fails with its
/// output.
pub fn kubectl_ok(target: &impl KubectlTarget, args: &[&str], stdin: Option<&str>) -> String {
    run_ok(target.kubectl_command(), args, stdin)
}

/// `kubectl_ok` with `-o json`, parsed.
pub fn kubectl_json(target: &impl KubectlTarget, args: &[&str]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&kubectl_ok(target, &all, None)).expect("kubectl printed JSON")
}
