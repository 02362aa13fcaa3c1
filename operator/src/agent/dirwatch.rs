//! Watching the data directory: a network directory or its `reserved/` part removed or replaced
//! behind the agent's back (`rm -rf /var/lib/cni/networks/cbr0` by a reset tool or a cleanup
//! script) makes the agent run its full resync at once, so the reservation files are back before
//! a returning pod needs them instead of at the next periodic resync.
//!
//! * Which event asks for a resync is pure ([`classify`], over plain values); the inotify
//!   descriptor and its reads are the I/O at the edge ([`DirWatch`], over the runtime's
//!   [`FileWatch`]).
//! * Three kinds of directory are watched, and only for what happens to them, never for the files
//!   the agent itself writes into `reserved/` (no feedback): the data directory (entries named
//!   after a configured network), each network directory (the entry `reserved`) and each
//!   `reserved/` (itself deleted or moved).
//! * An `rm -rf` is a burst of events: the first one that asks for a resync starts a quiet period
//!   ([`QUIET`], at most [`BURST`] in all) and the burst becomes one resync; a resync is a full
//!   restore and idempotent, so a second one after a late event is harmless.
//! * A watch disappears with its directory; the watches are set again after every burst and,
//!   while a directory is missing, every [`REARM`], so a directory re-created (by the resync or
//!   by the plugin's next ADD) is watched again.
//! * Events alone miss a directory removed before it was watched (made by the agent's first pass
//!   and removed within the [`REARM`] that follows). So once the agent has written its files
//!   once, a data or network directory found missing for a whole [`REARM`] asks for a resync too
//!   ([`missing_trigger`]); a resync that cannot make it again is asked for at most once per
//!   [`REARM`].
//! * The data directory itself deleted while it is the agent's `hostPath` mount leaves the agent
//!   holding a directory that no longer exists on the node: nothing it writes there reaches the
//!   plugin. [`DirWatch::next`] then says so ([`Wake::Orphaned`]) and the agent exits, so that the
//!   kubelet restarts it on a fresh mount.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::inotify::{ReadFlags, WatchFlags};

use crate::{rules::schedule::Trigger, runtime::filewatch::FileWatch};

/// How long a burst of events must pause before its resync runs.
pub const QUIET: Duration = Duration::from_millis(100);
/// The longest a burst delays its resync.
pub const BURST: Duration = Duration::from_secs(1);
/// How often the watches are set again while a watched directory is missing.
pub const REARM: Duration = Duration::from_secs(1);

/// The entry of a network directory that holds the reservation files.
const RESERVED: &str = "reserved";

/// Which directory a watch is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watched {
    /// The data directory (`--data-dir`).
    DataDir,
    /// The directory of the network with this index in the agent's `--network` list.
    Network(usize),
    /// That network's `reserved/`.
    Reserved(usize),
}

/// What one event means: `Some` when the reservation files may be gone.
///
/// `watched` is `None` for an event of no known watch (an overflow, or a watch already
/// forgotten); `name` is the entry the event is about, for events on a directory's entries.
pub fn classify(
    watched: Option<Watched>,
    flags: ReadFlags,
    name: Option<&str>,
    networks: &[String],
) -> Option<Trigger> {
    if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
        return Some(Trigger::Overflow);
    }
    let gone_self = flags.intersects(ReadFlags::DELETE_SELF | ReadFlags::MOVE_SELF);
    let entry_gone = flags.intersects(ReadFlags::DELETE | ReadFlags::MOVED_FROM);
    let entry_replaced = flags.contains(ReadFlags::MOVED_TO);
    match watched? {
        Watched::DataDir if gone_self || flags.contains(ReadFlags::UNMOUNT) => {
            Some(Trigger::DataDirGone)
        }
        Watched::DataDir => {
            let name = name?;
            if !networks.iter().any(|n| n == name) {
                None
            } else if entry_gone {
                Some(Trigger::NetworkGone)
            } else if entry_replaced {
                Some(Trigger::Replaced)
            } else {
                None
            }
        }
        Watched::Network(_) if gone_self => Some(Trigger::NetworkGone),
        Watched::Network(_) => match name {
            Some(RESERVED) if entry_gone => Some(Trigger::ReservedGone),
            Some(RESERVED) if entry_replaced => Some(Trigger::Replaced),
            _ => None,
        },
        Watched::Reserved(_) if gone_self => Some(Trigger::ReservedGone),
        Watched::Reserved(_) => None,
    }
}

/// What a watched directory found missing means (the most severe of them). Only the data and
/// network directories count: every pass makes them, while `reserved/` legitimately does not
/// exist on a node without reservations (its removal is seen as an event of its network
/// directory).
pub fn missing_trigger(missing: &[Watched]) -> Option<Trigger> {
    missing
        .iter()
        .filter_map(|w| match w {
            Watched::DataDir => Some(Trigger::DataDirGone),
            Watched::Network(_) => Some(Trigger::NetworkGone),
            Watched::Reserved(_) => None,
        })
        .max()
}

/// What the watch reports to the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wake {
    /// Run a full resync now: the most severe cause of the burst.
    Resync(Trigger),
    /// The data directory was deleted on the node while the agent still holds it (its mount):
    /// the agent cannot reach the node's data directory any more and must be restarted.
    Orphaned(PathBuf),
}

/// Errors of setting up or reading the watch.
#[derive(Debug, thiserror::Error)]
pub enum DirWatchError {
    /// inotify could not be initialised (`fs.inotify.max_user_instances` reached?), or its
    /// reader thread not started.
    #[error("failed to create an inotify instance")]
    Init(#[source] io::Error),
    /// A directory could not be watched for another reason than being absent.
    #[error("failed to watch {}", path.display())]
    Watch {
        /// The directory.
        path: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// Reading the events failed.
    #[error("failed to read directory events")]
    Read(#[source] io::Error),
}

/// The inotify watch of the data directory, its network directories and their `reserved/`.
#[derive(Debug)]
pub struct DirWatch {
    inotify: FileWatch,
    data_dir: PathBuf,
    networks: Vec<String>,
    /// Watch descriptor → what it watches.
    watches: HashMap<i32, Watched>,
}

impl DirWatch {
    /// Creates the inotify instance and its reader thread, and watches what exists now.
    pub fn new(data_dir: &Path, networks: &[String]) -> Result<Self, DirWatchError> {
        let inotify = FileWatch::new("ipkeep-dirwatch").map_err(DirWatchError::Init)?;
        let mut watch = Self {
            inotify,
            data_dir: data_dir.to_owned(),
            networks: networks.to_vec(),
            watches: HashMap::new(),
        };
        watch.arm()?;
        Ok(watch)
    }

    /// Every directory to watch, what it is and the events wanted from it.
    fn targets(&self) -> Vec<(PathBuf, Watched, WatchFlags)> {
        let selves = WatchFlags::DELETE_SELF | WatchFlags::MOVE_SELF | WatchFlags::ONLYDIR;
        let entries = WatchFlags::CREATE
            | WatchFlags::DELETE
            | WatchFlags::MOVED_FROM
            | WatchFlags::MOVED_TO
            | selves;
        let mut out = vec![(self.data_dir.clone(), Watched::DataDir, entries)];
        for (i, network) in self.networks.iter().enumerate() {
            let dir = self.data_dir.join(network);
            let nofollow = WatchFlags::DONT_FOLLOW;
            out.push((dir.join(RESERVED), Watched::Reserved(i), selves | nofollow));
            out.push((dir, Watched::Network(i), entries | nofollow));
        }
        out
    }

    /// Watches every target directory that exists (again: a directory re-created has a new
    /// inode and gets a new watch); the ones missing.
    fn arm(&mut self) -> Result<Vec<Watched>, DirWatchError> {
        let mut missing = Vec::new();
        for (path, watched, flags) in self.targets() {
            match self.inotify.add(&path, flags) {
                Ok(wd) => {
                    self.watches.insert(wd, watched);
                }
                Err(e) if e == rustix::io::Errno::NOENT || e == rustix::io::Errno::NOTDIR => {
                    missing.push(watched);
                }
                Err(e) => {
                    return Err(DirWatchError::Watch {
                        path,
                        source: e.into(),
                    });
                }
            }
        }
        Ok(missing)
    }

    /// Waits for events (at most `wait`, if given: `None` when none came); the triggers they
    /// hold.
    async fn events(
        &mut self,
        wait: Option<Duration>,
    ) -> Result<Option<Vec<Trigger>>, DirWatchError> {
        let Some(events) = self.inotify.next(wait).await.map_err(DirWatchError::Read)? else {
            return Ok(None);
        };
        let mut triggers = Vec::new();
        for e in events {
            let watched = self.watches.get(&e.wd).copied();
            if e.flags.contains(ReadFlags::IGNORED) {
                self.watches.remove(&e.wd);
            } else if e.flags.contains(ReadFlags::MOVE_SELF) && self.watches.remove(&e.wd).is_some()
            {
                // A directory moved away is no longer the one at its path: stop watching it
                // (its path is watched again, on whatever is there, by the next arm).
                self.inotify.remove(e.wd);
            }
            if let Some(t) = classify(watched, e.flags, e.name.as_deref(), &self.networks) {
                triggers.push(t);
            }
        }
        Ok(Some(triggers))
    }

    /// Waits until a burst of events asks for a resync, and returns when the burst is over.
    /// With `expect_all` (the agent has made every directory once), a directory missing for a
    /// whole [`REARM`] asks for one too.
    pub async fn next(&mut self, expect_all: impl Fn() -> bool) -> Result<Wake, DirWatchError> {
        let mut missing = self.arm()?;
        // Since when something has been missing (the events that keep coming on a busy node
        // must not postpone the check).
        let mut since = tokio::time::Instant::now();
        let first = loop {
            let wait = (!missing.is_empty()).then_some(REARM);
            let triggers = self.events(wait).await?.unwrap_or_default();
            if let Some(t) = triggers.into_iter().max() {
                break t;
            }
            let still = self.arm()?;
            if missing.is_empty() {
                since = tokio::time::Instant::now();
            }
            if since.elapsed() >= REARM
                && expect_all()
                && let Some(t) = missing_trigger(&still)
            {
                break t;
            }
            missing = still;
        };
        // Any event, asking for a resync or not (host-local's files going in an `rm -rf`),
        // prolongs the burst.
        let mut worst = first;
        let started = tokio::time::Instant::now();
        while started.elapsed() < BURST {
            let Some(more) = self.events(Some(QUIET)).await? else {
                break;
            };
            worst = more.into_iter().fold(worst, Trigger::max);
        }
        if orphaned(&self.data_dir) {
            return Ok(Wake::Orphaned(self.data_dir.clone()));
        }
        self.arm()?;
        Ok(Wake::Resync(worst))
    }
}

/// Whether `path` still opens but names a directory deleted from the filesystem (no links left):
/// what a bind mount shows once its source was removed on the host.
pub fn orphaned(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_dir() && m.nlink() == 0)
}

#[cfg(test)]
mod tests;
