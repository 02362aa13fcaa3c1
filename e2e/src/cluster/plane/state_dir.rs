//! A control plane's private state directory (keys, kubeconfigs, etcd's data, logs, the process
//! groups it started) and the reaping of the ones a killed run left behind.

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

use super::ControlPlaneError;

/// The prefix of every state directory the harness creates, so a later run can find stale ones.
pub const STATE_DIR_PREFIX: &str = "ipkeep-cluster-";

static STATE_DIR_SEQ: AtomicU64 = AtomicU64::new(0);

/// A new state directory's path under `parent`: `ipkeep-cluster-<pid>-<n>`, unique in this
/// process.
pub(super) fn new_state_dir(parent: &Path) -> PathBuf {
    parent.join(format!(
        "{STATE_DIR_PREFIX}{}-{}",
        std::process::id(),
        STATE_DIR_SEQ.fetch_add(1, Ordering::Relaxed)
    ))
}

pub(super) fn state_err(
    action: &'static str,
    path: &Path,
) -> impl FnOnce(std::io::Error) -> ControlPlaneError {
    let path = path.to_owned();
    move |source| ControlPlaneError::StateDir {
        action,
        path,
        source,
    }
}

/// Whether process `pid` runs (a zombie, dead but not yet reaped, does not).
pub fn process_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the parenthesised command name, which may itself hold ") ".
    stat.rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next())
        .is_some_and(|state| state != 'Z' && state != 'X')
}

/// Kills the process groups a state directory records whose leader still runs with that
/// directory on its command line (so a recycled pid is never hit); returns how many.
pub fn kill_recorded_groups(state_dir: &Path) -> usize {
    let Ok(text) = std::fs::read_to_string(state_dir.join("pgids")) else {
        return 0;
    };
    let needle = state_dir.to_string_lossy().into_owned();
    let mut killed = 0;
    for pid in text.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if !cmdline.contains(&needle) {
            continue;
        }
        if let Some(p) = rustix::process::Pid::from_raw(pid)
            && rustix::process::kill_process_group(p, rustix::process::Signal::KILL).is_ok()
        {
            killed += 1;
        }
    }
    killed
}

/// Removes the state directories under `parent` left by runs whose owner process is gone
/// (killed so hard that even the watchdog went with it), killing whatever they still run.
/// Returns what it removed, one line each.
pub fn reap_stale(parent: &Path) -> Vec<String> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(parent) else {
        return removed;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        // symlink_metadata: a link named like ours is never followed, nor removed.
        let is_dir = entry.path().symlink_metadata().is_ok_and(|m| m.is_dir());
        if !name.starts_with(STATE_DIR_PREFIX) || !is_dir {
            continue;
        }
        let dir = entry.path();
        let Some(owner) = std::fs::read_to_string(dir.join("owner"))
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
        else {
            continue;
        };
        if process_alive(owner) {
            continue;
        }
        let killed = kill_recorded_groups(&dir);
        if std::fs::remove_dir_all(&dir).is_ok() {
            removed.push(format!(
                "removed the stale state directory {} of a killed run (owner pid {owner} is gone; {killed} leftover process group(s) killed)",
                dir.display()
            ));
        }
    }
    removed
}
