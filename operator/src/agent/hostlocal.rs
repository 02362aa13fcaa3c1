//! Keeping the replaced `host-local` replaced (`--guard-host-local`, the chart's
//! `cni.replaceHostLocal`): the CNI bin directory is not ipkeep's. A Debian or RPM
//! `containernetworking-plugins` / `kubernetes-cni` upgrade, an admin's `cp`, or k3s re-linking its
//! multi-call binary writes `host-local` again, and from then on the node's real host-local hands a
//! reserved address to the next pod while everything looks protected.
//!
//! The agent watches the directory (inotify on the directory, the runtime's [`FileWatch`] as the
//! data directory's watch uses) and, whenever an event names `host-local` (or the kernel dropped events),
//! and every [`CHECK_EVERY`] as a safety net, runs [`install_cni::reclaim_host_local`]: what was
//! written becomes the new `host-local.ipkeep-orig` (so an uninstall puts back the newest
//! original) and ipkeep is renamed over `host-local` again, each step a link or a rename, never a
//! moment without a working `host-local`, never following a symlink. Only while an original is kept:
//! the agent's own `preStop` renaming the original back as ipkeep leaves the node (the guard still
//! runs then) is never undone. Each reclaim is a Warning
//! Event `HostLocalReplaced` on the Node and counted in
//! `ipkeep_agent_host_local_reclaimed_total{how}`.
//!
//! The window in which the other host-local is in place is the time from its rename to the
//! agent's (an inotify event and one rename): measured on real nodes (docs/operator.md).

use std::path::{Path, PathBuf};
use std::time::Duration;

use prometheus::IntCounterVec;
use rustix::fs::inotify::{ReadFlags, WatchFlags};
use tokio::time::Instant;

use crate::install_cni::{self, HOST_LOCAL, Reclaim};
use crate::runtime::events::{Notice, Publisher, node_ref};
use crate::runtime::filewatch::{FileEvent, FileWatch};
use crate::runtime::logging::error_chain;

/// How often the directory is checked even without an event (a watch lost, a bind mount
/// replaced under the agent).
pub const CHECK_EVERY: Duration = Duration::from_secs(10);
/// An event starts a check this long after it, so a burst (write, chmod, rename) is one check.
const SETTLE: Duration = Duration::from_millis(20);
/// How long to wait before setting the watch up again after it failed.
const REARM: Duration = Duration::from_secs(1);

/// What the guard needs.
#[derive(Debug, Clone)]
pub struct Guard {
    /// The node's CNI bin directory, as mounted.
    pub dir: PathBuf,
    /// The plugin binary in the image (what `host-local` must be).
    pub plugin: PathBuf,
    /// This node's name (the Events are about its Node).
    pub node: String,
}

/// What a reclaim is told as, for people.
pub fn describe(how: Reclaim, dir: &Path) -> Option<String> {
    let what = match how {
        Reclaim::Intact | Reclaim::NotReplaced => return None,
        Reclaim::Overwritten => "was overwritten by another binary (a package upgrade or a copy?)",
        Reclaim::Relinked => {
            "was replaced by a symlink (k3s re-linking its CNI binaries on an upgrade?)"
        }
        Reclaim::Removed => "was removed",
    };
    Some(format!(
        "{HOST_LOCAL} in {} {what}: reserved addresses were not protected on this node until the agent installed ipkeep as {HOST_LOCAL} again; what was there is kept as {} and is put back when ipkeep is uninstalled",
        dir.display(),
        install_cni::HOST_LOCAL_ORIG
    ))
}

/// The CNI bin directory the node's container runtime's configuration names, under the node's
/// root mounted at `root`: asked again every [`CHECK_EVERY`] until it is known and exists
/// (install-cni, which follows the same rule, created it before the agent started; until then the
/// in-charge check says why on the Node). Found once: a runtime given another directory later is
/// followed by the next agent pod, whose install-cni installs ipkeep there first.
pub async fn discovered_dir(root: &Path) -> PathBuf {
    loop {
        match crate::host_root::HostRoot::open(root).and_then(|r| r.locate()) {
            Ok(found) => match found.bin_dir {
                Some(dir) => {
                    tracing::info!(bin_dir = %found.dirs.bin_dir, source = %found.dirs.source, "guarding host-local in the runtime's CNI bin directory");
                    return dir;
                }
                None => {
                    tracing::warn!(bin_dir = %found.dirs.bin_dir, "the runtime's CNI bin directory does not exist; asking again in {}s", CHECK_EVERY.as_secs())
                }
            },
            Err(e) => {
                tracing::warn!(error = %error_chain(&e), "cannot tell which CNI bin directory to guard; asking again in {}s", CHECK_EVERY.as_secs())
            }
        }
        tokio::time::sleep(CHECK_EVERY).await;
    }
}

/// Watches and reclaims until the process ends.
pub async fn run(guard: Guard, events: Publisher, reclaimed: IntCounterVec) {
    for how in [Reclaim::Overwritten, Reclaim::Relinked, Reclaim::Removed] {
        reclaimed.with_label_values(&[how.label()]).reset();
    }
    loop {
        let mut watching = match watch(&guard.dir) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(dir = %guard.dir.display(), error = %e, "cannot watch the CNI bin directory; checking it every {}s only", CHECK_EVERY.as_secs());
                None
            }
        };
        loop {
            check(&guard, &events, &reclaimed);
            match &mut watching {
                Some(watch) => {
                    // The watch failed: set it up again.
                    if !woken(watch).await {
                        break;
                    }
                }
                None => tokio::time::sleep(CHECK_EVERY).await,
            }
        }
        tokio::time::sleep(REARM).await;
    }
}

/// Waits until an event names `host-local` (or the kernel dropped events), then lets the burst
/// settle, or until [`CHECK_EVERY`] passed; `false` when the watch failed.
async fn woken(watch: &mut FileWatch) -> bool {
    let deadline = Instant::now() + CHECK_EVERY;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match watch.next(Some(left)).await {
            Ok(Some(batch)) if batch.iter().any(names_host_local) => {
                tokio::time::sleep(SETTLE).await;
                watch.drain();
                return true;
            }
            Ok(Some(_)) => {}
            Ok(None) => return true,
            Err(_) => return false,
        }
    }
}

/// Whether an event may be about `host-local`: it names it, names nothing (the directory itself),
/// or says the kernel dropped events.
fn names_host_local(event: &FileEvent) -> bool {
    event
        .name
        .as_deref()
        .is_none_or(|n| n.as_bytes() == HOST_LOCAL.as_bytes())
        || event.flags.intersects(ReadFlags::QUEUE_OVERFLOW)
}

fn check(guard: &Guard, events: &Publisher, reclaimed: &IntCounterVec) {
    match install_cni::reclaim_host_local(&guard.plugin, &guard.dir) {
        Ok(how) => {
            let Some(note) = describe(how, &guard.dir) else {
                return;
            };
            reclaimed.with_label_values(&[how.label()]).inc();
            tracing::warn!(how = how.label(), "{note}");
            events.publish(Notice {
                regarding: node_ref(&guard.node),
                reason: crate::api::reason::HOST_LOCAL_REPLACED,
                action: "ReclaimHostLocal",
                note: &note,
            });
        }
        Err(e) => {
            tracing::warn!(dir = %guard.dir.display(), error = %error_chain(&e), "failed to check host-local");
        }
    }
}

/// Watches `dir` for anything that can replace, change or remove an entry, or the directory.
fn watch(dir: &Path) -> std::io::Result<FileWatch> {
    let watch = FileWatch::new("host-local-watch")?;
    watch.add(
        dir,
        WatchFlags::CLOSE_WRITE
            | WatchFlags::MOVED_TO
            | WatchFlags::MOVED_FROM
            | WatchFlags::CREATE
            | WatchFlags::DELETE
            | WatchFlags::ATTRIB
            | WatchFlags::DELETE_SELF
            | WatchFlags::MOVE_SELF,
    )?;
    Ok(watch)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write of another entry does not wake the guard; one of `host-local` does, well before
    /// the periodic check.
    #[tokio::test]
    async fn a_write_of_host_local_wakes_the_guard() {
        let dir = tempfile::tempdir().unwrap();
        let mut watch = watch(dir.path()).unwrap();
        std::fs::write(dir.path().join("bridge"), b"x").unwrap();
        let other = tokio::time::timeout(Duration::from_millis(700), woken(&mut watch)).await;
        assert!(other.is_err(), "woken by another entry: {other:?}");
        let started = Instant::now();
        std::fs::write(dir.path().join(HOST_LOCAL), b"x").unwrap();
        assert!(woken(&mut watch).await, "the watch failed");
        assert!(
            started.elapsed() < CHECK_EVERY / 2,
            "{:?}",
            started.elapsed()
        );
    }
}
