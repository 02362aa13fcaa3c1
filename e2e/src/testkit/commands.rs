//! Running the tools a test drives (kubectl, helm, …) and failing the test with their output when
//! they fail.

use std::{
    io::Write,
    process::{Command, Output, Stdio},
};

/// Runs `cmd` with `stdin` (none: an empty one) and returns what it did.
pub fn run(mut cmd: Command, stdin: Option<&str>) -> Output {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let program = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("failed to run {program}: {e}"));
    let mut pipe = child.stdin.take().expect("a piped stdin");
    if let Some(text) = stdin {
        pipe.write_all(text.as_bytes())
            .unwrap_or_else(|e| panic!("failed to write {program}'s stdin: {e}"));
    }
    drop(pipe);
    child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("failed to wait for {program}: {e}"))
}

/// Its stdout; fails the test, naming `what` with the output, unless it succeeded.
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
    let program = cmd.get_program().to_string_lossy().into_owned();
    let program = program.rsplit('/').next().unwrap_or_default().to_owned();
    cmd.args(args);
    ok(&format!("{program} {args:?}"), run(cmd, stdin))
}

/// Where kubectl runs: the test's own control plane, or a cluster named by a kubeconfig.
pub trait KubectlTarget {
    /// A kubectl command aimed at it.
    fn kubectl_command(&self) -> Command;
}

impl KubectlTarget for crate::cluster::Cluster {
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
