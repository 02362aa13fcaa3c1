//! Running a CNI plugin binary exactly as a container runtime does: a complete, explicit
//! environment (nothing inherited), the network configuration on stdin, the reply on stdout.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// The `ipkeep` binary under test: `$IPKEEP_TEST_BIN` when set (`make test` runs the plugin's
/// suites a second time against the static release binary that ships), else the one cargo built
/// for this test run.
pub fn ipkeep() -> PathBuf {
    match std::env::var_os("IPKEEP_TEST_BIN") {
        Some(path) => {
            let path = PathBuf::from(path);
            assert!(
                path.is_file(),
                "IPKEEP_TEST_BIN={} does not exist: run `make plugin`",
                path.display()
            );
            path
        }
        None => PathBuf::from(env!("CARGO_BIN_EXE_ipkeep")),
    }
}

/// Debian's reference `host-local` (package `containernetworking-plugins`), our differential oracle.
/// Panics with an actionable message when it is missing: a test that needs it must not pass without it.
pub fn host_local() -> PathBuf {
    let p = PathBuf::from(
        std::env::var("REFERENCE_CNI_DIR").unwrap_or_else(|_| "/usr/lib/cni".to_owned()),
    )
    .join("host-local");
    assert!(
        p.exists(),
        "reference plugin {} is missing: run `make deps` (Debian package containernetworking-plugins)",
        p.display()
    );
    p
}

/// One CNI invocation: the `CNI_*` variables and the configuration given on stdin.
#[derive(Clone, Debug)]
pub struct CniCall {
    pub command: Option<String>,
    pub container_id: Option<String>,
    pub netns: Option<String>,
    pub ifname: Option<String>,
    pub args: Option<String>,
    pub path: Option<String>,
    pub extra_env: Vec<(String, String)>,
    pub stdin: Vec<u8>,
}

impl CniCall {
    /// A call with every variable a runtime sets for `command`.
    pub fn new(command: &str, container_id: &str, config: &str) -> Self {
        Self {
            command: Some(command.to_owned()),
            container_id: Some(container_id.to_owned()),
            netns: Some("/var/run/netns/ipkeep-test".to_owned()),
            ifname: Some("eth0".to_owned()),
            args: None,
            path: Some("/usr/lib/cni".to_owned()),
            extra_env: Vec::new(),
            stdin: config.as_bytes().to_vec(),
        }
    }

    pub fn ifname(mut self, ifname: &str) -> Self {
        self.ifname = Some(ifname.to_owned());
        self
    }

    pub fn args(mut self, args: &str) -> Self {
        self.args = Some(args.to_owned());
        self
    }

    /// A command for `binary` with exactly these variables (plus a fixed PATH) and nothing else
    /// inherited; its standard streams are left for the caller to choose.
    pub fn command(&self, binary: &Path) -> Command {
        let mut cmd = Command::new(binary);
        cmd.env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        for (key, value) in [
            ("CNI_COMMAND", &self.command),
            ("CNI_CONTAINERID", &self.container_id),
            ("CNI_NETNS", &self.netns),
            ("CNI_IFNAME", &self.ifname),
            ("CNI_ARGS", &self.args),
            ("CNI_PATH", &self.path),
        ] {
            if let Some(value) = value {
                cmd.env(key, value);
            }
        }
        for (key, value) in &self.extra_env {
            cmd.env(key, value);
        }
        cmd
    }

    /// Starts `binary` as [`CniCall::command`] sets it up, all three standard streams piped,
    /// without writing its stdin yet: the plugin blocks reading it, so a batch of processes started
    /// this way can be released together.
    pub fn spawn_held(&self, binary: &Path) -> Child {
        spawn_piped(self.command(binary))
    }

    /// Runs `binary` with exactly these variables and returns its output.
    pub fn run(&self, binary: &Path) -> CniOutcome {
        self.run_command(self.command(binary))
    }

    /// Runs `cmd` (made by [`CniCall::command`], perhaps for a wrapper such as `setpriv` that
    /// takes the plugin as an argument) with this call's stdin and returns its output.
    pub fn run_command(&self, cmd: Command) -> CniOutcome {
        let program = cmd.get_program().to_string_lossy().into_owned();
        let mut child = spawn_piped(cmd);
        // A plugin may exit before reading stdin (VERSION): a broken pipe is not an error here.
        let _ = child.stdin.take().map(|mut s| s.write_all(&self.stdin));
        let out = child
            .wait_with_output()
            .unwrap_or_else(|e| panic!("failed to wait for {program}: {e}"));
        CniOutcome::from(out)
    }
}

/// Starts `cmd` with all three standard streams piped.
fn spawn_piped(mut cmd: Command) -> Child {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("failed to start {}: {e}", cmd.get_program().display()))
}

/// What a plugin process did: exit code, stdout, stderr.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CniOutcome {
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl From<Output> for CniOutcome {
    fn from(o: Output) -> Self {
        Self {
            code: o.status.code(),
            stdout: o.stdout,
            stderr: o.stderr,
        }
    }
}

impl CniOutcome {
    pub fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    pub fn stderr_str(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    /// The stdout parsed as JSON; panics with the raw output when it is not JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {:?}", self.stdout_str()))
    }

    /// Asserts success and returns the result JSON.
    pub fn ok(&self) -> serde_json::Value {
        assert_eq!(
            self.code,
            Some(0),
            "plugin failed: stdout={} stderr={}",
            self.stdout_str(),
            self.stderr_str()
        );
        if self.stdout.is_empty() {
            serde_json::Value::Null
        } else {
            self.json()
        }
    }

    /// Asserts a CNI error with `code` and returns its `msg`.
    pub fn err(&self, code: u64) -> String {
        assert_eq!(
            self.code,
            Some(1),
            "expected failure: stdout={} stderr={}",
            self.stdout_str(),
            self.stderr_str()
        );
        let v = self.json();
        assert_eq!(v["code"].as_u64(), Some(code), "unexpected error: {v}");
        v["msg"].as_str().unwrap_or_default().to_owned()
    }
}

/// A fresh temporary directory for one test (`tempfile`), removed on drop; the suites' network
/// is `net1` under `data/`.
#[derive(Debug)]
pub struct Scratch(tempfile::TempDir);

impl Scratch {
    pub fn new() -> Self {
        Self(
            tempfile::Builder::new()
                .prefix("ipkeep-test-")
                .tempdir()
                .unwrap(),
        )
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// The `dataDir` of the suites' configurations.
    pub fn data(&self) -> PathBuf {
        self.path().join("data")
    }

    /// `<dataDir>/net1`.
    pub fn net(&self) -> PathBuf {
        self.data().join("net1")
    }

    /// `<dataDir>/net1` opened as the agent and the plugin open it.
    pub fn dir(&self) -> ipkeep_netdir::NetworkDir {
        ipkeep_netdir::NetworkDir::open(&self.data(), "net1").unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Give directories a test made unreadable their permissions back, so they can be removed.
        let _ = Command::new("chmod")
            .args(["-R", "u+rwx"])
            .arg(self.path())
            .status();
    }
}
