//! The API server's audit log: every request at level Metadata (or the options' policy), written
//! before the request returns, for the tests that read who did what.

use std::path::{Path, PathBuf};

use super::{
    ControlPlaneError, ControlPlaneOptions,
    boot::{arg, path_arg},
    state_dir::state_err,
};

const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n";

/// When the options ask for an audit log: writes its policy into the state directory `dir` and
/// returns the log's path and the API server flags that write it.
pub(super) fn audit_log_flags(
    options: &ControlPlaneOptions,
    dir: &Path,
) -> Result<Option<(PathBuf, Vec<String>)>, ControlPlaneError> {
    if !options.audit_log {
        return Ok(None);
    }
    let policy = dir.join("audit-policy.yaml");
    std::fs::write(
        &policy,
        options.audit_policy.as_deref().unwrap_or(AUDIT_POLICY),
    )
    .map_err(state_err("write the audit policy in", dir))?;
    let log = dir.join("audit.log");
    let flags = vec![
        path_arg("audit-policy-file", &policy),
        path_arg("audit-log-path", &log),
        // Every event is on disk before the request returns: tests read it right after.
        arg("audit-log-mode", "blocking"),
        arg("audit-log-format", "json"),
    ];
    Ok(Some((log, flags)))
}
