//! One inotify watcher for the agent's directory watches (the data directory's, `agent::dirwatch`,
//! and the CNI bin directory's, `agent::hostlocal`): an inotify instance through `rustix`'s safe
//! API (already the plugin's system-call layer, so no new dependency), and a thread of its own
//! that waits for events (`poll` with a timeout, so it ends soon after the watcher is dropped) and
//! hands them to the async side in batches: registering a descriptor with the runtime needs
//! `unsafe`, which the workspace forbids.

use std::{
    io,
    mem::MaybeUninit,
    os::fd::{AsFd, OwnedFd},
    path::Path,
    sync::Arc,
    time::Duration,
};

use rustix::{
    event::{PollFd, PollFlags, Timespec},
    fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags},
};
use tokio::sync::mpsc;

/// How long the reader thread waits for events before it checks whether the watcher was dropped.
const READER_POLL: Timespec = Timespec {
    tv_sec: 0,
    tv_nsec: 500_000_000,
};

/// One event as read, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEvent {
    /// The watch descriptor it came from (-1 for a queue overflow).
    pub wd: i32,
    /// What happened.
    pub flags: ReadFlags,
    /// The entry it is about, for events on a directory's entries.
    pub name: Option<String>,
}

/// What the reader thread hands over: a batch of events, or the error that stopped it.
type Batch = io::Result<Vec<FileEvent>>;

/// An inotify instance, its watches and its reader thread.
#[derive(Debug)]
pub struct FileWatch {
    fd: Arc<OwnedFd>,
    /// Batches from the reader thread, which ends once this is dropped.
    batches: mpsc::UnboundedReceiver<Batch>,
}

impl FileWatch {
    /// Creates the inotify instance and its reader thread (named `thread`).
    pub fn new(thread: &str) -> io::Result<FileWatch> {
        let fd = Arc::new(inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC)?);
        let (tx, batches) = mpsc::unbounded_channel();
        let reader_fd = fd.clone();
        std::thread::Builder::new()
            .name(thread.to_owned())
            .spawn(move || read_loop(&reader_fd, &tx))?;
        Ok(FileWatch { fd, batches })
    }

    /// Watches `path` for `flags`; its watch descriptor.
    pub fn add(&self, path: &Path, flags: WatchFlags) -> rustix::io::Result<i32> {
        inotify::add_watch(&*self.fd, path, flags)
    }

    /// Stops watching `wd` (an error, for a watch already gone, is of no use to the caller).
    pub fn remove(&self, wd: i32) {
        let _ = inotify::remove_watch(&*self.fd, wd);
    }

    /// Waits for the next batch of events (at most `wait`, if given: `None` when none came).
    pub async fn next(&mut self, wait: Option<Duration>) -> io::Result<Option<Vec<FileEvent>>> {
        let batch = match wait {
            Some(d) => match tokio::time::timeout(d, self.batches.recv()).await {
                Ok(b) => b,
                Err(_) => return Ok(None),
            },
            None => self.batches.recv().await,
        };
        batch
            .unwrap_or_else(|| Err(io::Error::other("the reader thread stopped")))
            .map(Some)
    }

    /// Drops the batches already handed over and not read.
    pub fn drain(&mut self) {
        while self.batches.try_recv().is_ok() {}
    }
}

/// Reads the events the kernel holds now; `WouldBlock` when there are none.
fn read_ready(fd: &OwnedFd) -> Batch {
    let mut buf = [MaybeUninit::<u8>::uninit(); 4096];
    let mut reader = inotify::Reader::new(fd.as_fd(), &mut buf);
    let mut events = Vec::new();
    loop {
        match reader.next() {
            Ok(e) => events.push(FileEvent {
                wd: e.wd(),
                flags: e.events(),
                name: e
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .filter(|n| !n.is_empty()),
            }),
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => break,
            Err(e) => return Err(e.into()),
        }
    }
    if events.is_empty() {
        return Err(io::ErrorKind::WouldBlock.into());
    }
    Ok(events)
}

/// The reader thread: waits for events and hands each batch over, until the watcher is dropped
/// or reading fails.
fn read_loop(fd: &OwnedFd, tx: &mpsc::UnboundedSender<Batch>) {
    while !tx.is_closed() {
        let mut fds = [PollFd::new(fd, PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&READER_POLL)) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(e) if e == rustix::io::Errno::INTR => continue,
            Err(e) => {
                let _ = tx.send(Err(e.into()));
                return;
            }
        }
        match read_ready(fd) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            batch => {
                let failed = batch.is_err();
                if tx.send(batch).is_err() || failed {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file created in a watched directory arrives as one event naming it; nothing else does
    /// within the wait.
    #[tokio::test]
    async fn an_entry_created_arrives_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut watch = FileWatch::new("filewatch-test").unwrap();
        let wd = watch.add(dir.path(), WatchFlags::CREATE).unwrap();
        assert_eq!(
            watch.next(Some(Duration::from_millis(50))).await.unwrap(),
            None
        );
        std::fs::write(dir.path().join("host-local"), b"x").unwrap();
        let events = watch
            .next(Some(Duration::from_secs(5)))
            .await
            .unwrap()
            .expect("an event within 5 s");
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].wd, wd);
        assert!(events[0].flags.contains(ReadFlags::CREATE));
        assert_eq!(events[0].name.as_deref(), Some("host-local"));
    }
}
