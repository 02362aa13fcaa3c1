//! What can go wrong starting or running a control plane, each failure saying what to do next,
//! and the component report (its log's last lines) the failures of a component carry.

use std::{path::PathBuf, process::ExitStatus, time::Duration};

use super::super::{
    kubeconfig::KubeconfigWriteError,
    pki::PkiError,
    process::{Component, LOG_TAIL_LINES, ProcessError, log_tail},
};

/// Failures of the control plane harness. Each says what to do next.
#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    /// The binaries are not built.
    #[error(
        "failed to find the control plane binaries: {dir} has no {missing}; run: make cluster-bins (or set IPKEEP_CLUSTER_BIN_DIR)"
    )]
    BinariesMissing {
        /// Where they were looked for.
        dir: PathBuf,
        /// The first missing one.
        missing: String,
    },
    /// `build.sh --print-bin-dir` could not be run.
    #[error(
        "failed to locate the control plane binaries with {script} --print-bin-dir; run: make cluster-bins"
    )]
    BinDir {
        /// The script.
        script: PathBuf,
        /// Why.
        #[source]
        source: crate::command::CommandError,
    },
    /// etcdctl or etcdutl are not built.
    #[error(
        "failed to find etcd's tools: {dir} has no {missing}; run: make etcd-tools-bins (or set IPKEEP_ETCD_TOOLS_BIN_DIR)"
    )]
    EtcdToolsMissing {
        /// Where they were looked for.
        dir: PathBuf,
        /// The first missing one.
        missing: String,
    },
    /// etcdctl or etcdutl failed.
    #[error("failed to run etcd's {what}")]
    EtcdTool {
        /// Which command.
        what: &'static str,
        /// Why.
        #[source]
        source: crate::command::CommandError,
    },
    /// A port asked for is in use.
    #[error(
        "failed to start the control plane: port 127.0.0.1:{port} for {what} is already taken by another process"
    )]
    PortTaken {
        /// The port.
        port: u16,
        /// Which component wanted it.
        what: String,
    },
    /// No free port could be found.
    #[error("failed to find a free port on 127.0.0.1")]
    NoFreePort(#[source] std::io::Error),
    /// The state directory could not be prepared or removed.
    #[error("failed to {action} the state directory {path}")]
    StateDir {
        /// What was attempted.
        action: &'static str,
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Certificates.
    #[error("failed to generate the control plane's certificates")]
    Pki(#[from] PkiError),
    /// Starting a process.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// Writing a kubeconfig.
    #[error(transparent)]
    Kubeconfig(#[from] KubeconfigWriteError),
    /// A component exited while starting.
    #[error("failed to start {}: it exited ({status}) before it was ready; {report}", report.name)]
    Exited {
        /// Which component, and its log.
        report: Box<ComponentReport>,
        /// How it exited.
        status: ExitStatus,
    },
    /// A component did not become ready in time.
    #[error("failed to start {}: {why}; {report}", report.name)]
    NotReady {
        /// Which component, and its log.
        report: Box<ComponentReport>,
        /// What the readiness probe last saw.
        why: String,
    },
    /// A component died after the control plane was ready.
    #[error("{} (pid {pid}) died while the control plane was running ({status}); {report}", report.name)]
    Died {
        /// Which component, and its log.
        report: Box<ComponentReport>,
        /// Its pid.
        pid: u32,
        /// How it exited.
        status: ExitStatus,
    },
    /// The control plane was stopped already.
    #[error("the control plane at {0} was stopped")]
    Stopped(PathBuf),
    /// Building a client from the admin kubeconfig.
    #[error("failed to build a client from {path}")]
    ClientConfig {
        /// The kubeconfig.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// Reading the admin kubeconfig.
    #[error("failed to read {path}")]
    ReadKubeconfig {
        /// The kubeconfig.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// An API call the harness makes failed.
    #[error("failed to {what}")]
    Api {
        /// What the harness was doing.
        what: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// A condition the harness waits for did not come true.
    #[error("failed to {what}: still not true after {}s", waited.as_secs())]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        waited: Duration,
    },
    /// An argument was not acceptable.
    #[error("invalid {what}: {value:?} ({why})")]
    Invalid {
        /// Which argument.
        what: &'static str,
        /// Its value.
        value: String,
        /// The rule it breaks.
        why: &'static str,
    },
    /// The shared control plane of this test binary failed to start earlier.
    #[error("the shared control plane of this test binary failed to start: {0}")]
    Shared(String),
}

/// A component's name, its log file and the end of that log, for error messages.
#[derive(Debug)]
pub struct ComponentReport {
    /// The component (`etcd`, `kube-apiserver`, ...).
    pub name: String,
    /// Its log file.
    pub log: PathBuf,
    /// Its last lines.
    pub tail: String,
}

impl ComponentReport {
    pub(super) fn of(c: &Component) -> Box<ComponentReport> {
        Box::new(ComponentReport {
            name: c.name().to_owned(),
            log: c.log().to_owned(),
            tail: log_tail(c.log(), LOG_TAIL_LINES),
        })
    }
}

impl std::fmt::Display for ComponentReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "last lines of {}:\n{}", self.log.display(), self.tail)
    }
}
