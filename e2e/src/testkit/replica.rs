//! A controller replica: the built `ipkeep-operator controller` in its own process.

use std::{
    path::Path,
    process::{Child, Command, ExitStatus, Stdio},
};

/// One replica; killed (SIGKILL) when dropped, and by the kernel if this test process dies
/// without dropping it.
pub struct Replica {
    /// Its identity in the Lease.
    pub identity: String,
    child: Child,
}

impl Replica {
    /// Starts the built controller as `identity` with `KUBECONFIG=kubeconfig`, its metrics on a
    /// port of its own, a 3 s Lease and `args` (namespace, Lease name and namespace); its stderr
    /// goes to `log` when given, else to the test's.
    pub fn spawn(kubeconfig: &Path, identity: &str, args: &[&str], log: Option<&Path>) -> Replica {
        let stderr = match log {
            Some(path) => Stdio::from(
                std::fs::File::create(path)
                    .unwrap_or_else(|e| panic!("failed to create {}: {e}", path.display())),
            ),
            None => Stdio::inherit(),
        };
        let child = Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--"])
            .arg(super::repo::operator_binary())
            .args(["controller", "--metrics-addr", "127.0.0.1:0"])
            .args(["--identity", identity, "--lease-duration", "3"])
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .envs(super::repo::CONTROLLER_ENV)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("failed to start ipkeep-operator controller");
        Replica {
            identity: identity.to_owned(),
            child,
        }
    }

    /// Kills it (SIGKILL: no chance to release its Lease) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether it still runs.
    pub fn is_running(&mut self) -> bool {
        self.child
            .try_wait()
            .expect("the replica's status")
            .is_none()
    }

    /// Stops it with SIGTERM (as the kubelet does) and waits for its exit (blocking).
    pub fn terminate(mut self) -> ExitStatus {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("failed to run kill");
        assert!(sent.success(), "kill -TERM {} failed", self.child.id());
        self.child.wait().expect("the replica's exit status")
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}
