//! Keeping the replaced `host-local` replaced (`--guard-host-local`, the chart's
//! `cni.replaceHostLocal`): the CNI bin directory is not ipkeep's. A Debian or RPM
//! `containernetworking-plugins` / `kubernetes-cni` upgrade, an admin's `cp`, or k3s re-linking its
//! multi-call binary writes `host-local` again, and from then on the node's real host-local hands a
//! reserved address to the next pod while everything looks protected.
//!
//! The agent watches the directory (inotify on the directory, through `rustix` as the data
//! directory's watch does) and, whenever an event names `host-local` (or the kernel dropped events),
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
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use tokio::sync::mpsc;

use crate::install_cni::{self, HOST_LOCAL, Reclaim};
use crate::runtime::events::{EventType, Notice, Publisher, node_ref};
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

/// Watches and reclaims until the process ends.
pub async fn run(guard: Guard, events: Publisher, reclaimed: IntCounterVec) {
    for how in [Reclaim::Overwritten, Reclaim::Relinked, Reclaim::Removed] {
        reclaimed.with_label_values(&[how.label()]).reset();
    }
    loop {
        let (tx, mut rx) = mpsc::unbounded_channel::<()>();
        let watching = match watch(&guard.dir, tx) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(dir = %guard.dir.display(), error = %e, "cannot watch the CNI bin directory; checking it every {}s only", CHECK_EVERY.as_secs());
                false
            }
        };
        loop {
            check(&guard, &events, &reclaimed);
            let woke = tokio::time::timeout(CHECK_EVERY, rx.recv()).await;
            match woke {
                Ok(Some(())) => {
                    tokio::time::sleep(SETTLE).await;
                    while rx.try_recv().is_ok() {}
                }
                // The reader thread ended (the watch failed): set it up again.
                Ok(None) if watching => break,
                Ok(None) | Err(_) => {}
            }
        }
        tokio::time::sleep(REARM).await;
    }
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
                type_: EventType::Warning,
                reason: "HostLocalReplaced",
                action: "ReclaimHostLocal",
                note: &note,
            });
        }
        Err(e) => {
            tracing::warn!(dir = %guard.dir.display(), error = %error_chain(&e), "failed to check host-local");
        }
    }
}

/// Starts a thread that sends `()` for every event naming `host-local` in `dir` (or a queue
/// overflow); it ends when reading fails or the receiver is gone.
fn watch(dir: &Path, tx: mpsc::UnboundedSender<()>) -> std::io::Result<()> {
    let fd = inotify::init(CreateFlags::CLOEXEC)?;
    inotify::add_watch(
        &fd,
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
    std::thread::Builder::new()
        .name("host-local-watch".into())
        .spawn(move || {
            let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
            let mut reader = inotify::Reader::new(&fd, &mut buf);
            loop {
                match reader.next() {
                    Ok(event) => {
                        let ours = event
                            .file_name()
                            .is_none_or(|n| n.to_bytes() == HOST_LOCAL.as_bytes())
                            || event.events().intersects(ReadFlags::QUEUE_OVERFLOW);
                        if ours && tx.send(()).is_err() {
                            return;
                        }
                    }
                    Err(e) if e == rustix::io::Errno::INTR => {}
                    Err(_) => return,
                }
            }
        })?;
    Ok(())
}
