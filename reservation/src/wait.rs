//! The on-disk [`WaitMarker`] of a pod: `<net>/.ipkeep/wait/<namespace>/<pod>`, one line
//! `<containerID> <RFC 3339 time>`, written by the plugin (under the network's lock) when an ADD
//! first finds the pod's reserved address held by the pod's previous container. Like the rest of
//! `.ipkeep/` it is the plugin's own: host-local ignores it, and losing it only restarts a wait.

use crate::private_state::{self, Found};
use ipkeep_netdir::{NetDirError, NetworkDir};

use super::decision::WaitMarker;
use super::schema::PodKey;
use super::timestamp::Timestamp;
use crate::private_state::PRIVATE_DIR;

/// The sub-directory of [`PRIVATE_DIR`] holding the wait markers.
pub const WAIT_DIR: &str = "wait";
/// Far more than a container ID and a timestamp need.
const MAX_MARKER_LEN: usize = 1024;

/// Reads the pod's wait marker; `None` if absent or unusable (an unusable marker is as good as
/// none: the wait restarts). Anything at the marker's path that ipkeep did not write (a
/// directory, a FIFO, garbage) is removed and `found` says what it was. Needs the network's lock.
pub fn read_wait_marker(
    dir: &NetworkDir,
    pod: &PodKey,
    found: &mut Vec<String>,
) -> Option<WaitMarker> {
    let private = dir.subdir(&[PRIVATE_DIR], false).ok()??;
    let wait_dir = private_state::open_dir(&private, WAIT_DIR, false, found).ok()??;
    let ns_dir = private_state::open_dir(&wait_dir, pod.namespace(), false, found).ok()??;
    let bytes = private_state::read_file(&ns_dir, pod.name(), MAX_MARKER_LEN, found).ok()??;
    let marker = parse_marker(&bytes);
    if marker.is_none() {
        private_state::discard(
            &ns_dir,
            pod.name(),
            "content that is not a wait marker",
            found,
        );
    }
    marker
}

/// Writes the pod's wait marker (temp + rename; no fsync: losing it only restarts the wait).
/// Whatever is in the way (a file at a directory's name, a directory at the marker's) is
/// removed and `found` says what it was.
pub fn write_wait_marker(
    dir: &NetworkDir,
    pod: &PodKey,
    marker: &WaitMarker,
    found: &mut Vec<String>,
) -> Result<(), NetDirError> {
    let mut parent: Option<ipkeep_netdir::SubDir> = None;
    for name in [PRIVATE_DIR, WAIT_DIR, pod.namespace()] {
        let next = match &parent {
            None => private_state::open_dir(dir, name, true, found)?,
            Some(p) => private_state::open_dir(p, name, true, found)?,
        };
        parent = next;
    }
    let Some(ns_dir) = parent else {
        return Ok(());
    };
    // A killed writer's temporary would otherwise stay forever (markers are written rarely,
    // always under the network's lock, so no live writer's temporary is here).
    ns_dir.remove_stale_temps()?;
    if let Found::Damaged(what) = private_state::inspect_file(&ns_dir, pod.name(), MAX_MARKER_LEN)?
    {
        private_state::discard(&ns_dir, pod.name(), &what, found);
    }
    let line = format!("{} {}\n", marker.holder, marker.since);
    ns_dir.write_atomic(pod.name(), line.as_bytes(), private_state::FILE_MODE, false)
}

/// Removes the pod's wait marker (and its namespace directory when empty).
pub fn remove_wait_marker(dir: &NetworkDir, pod: &PodKey) -> Result<(), NetDirError> {
    let Some(wait_dir) = dir.subdir(&[PRIVATE_DIR, WAIT_DIR], false)? else {
        return Ok(());
    };
    let Some(ns_dir) = wait_dir.subdir(&[pod.namespace()], false)? else {
        return Ok(());
    };
    ns_dir.remove(pod.name())?;
    if ns_dir.list()?.is_empty() {
        // Another pod's marker may appear meanwhile only under the lock the caller holds.
        let _ = wait_dir.remove_dir(pod.namespace());
    }
    Ok(())
}

/// Removes every wait marker whose pod `keep` rejects (GC's cleanup: a marker only matters
/// while its pod has an active reservation) and the namespace directories left empty; returns
/// the pods whose markers went. Needs the network's lock. Entries that are not markers (links,
/// directories, FIFOs, invalid names, garbage) are removed too, and `found` says what they were.
pub fn prune_wait_markers(
    dir: &NetworkDir,
    keep: &dyn Fn(&PodKey) -> bool,
    found: &mut Vec<String>,
) -> Result<Vec<PodKey>, NetDirError> {
    let Some(private) = dir.subdir(&[PRIVATE_DIR], false)? else {
        return Ok(Vec::new());
    };
    let Some(wait_dir) = private_state::open_dir(&private, WAIT_DIR, false, found)? else {
        return Ok(Vec::new());
    };
    wait_dir.remove_stale_temps()?;
    let mut removed = Vec::new();
    for ns in wait_dir.entries()? {
        // Not a directory at a namespace's name (a link, never followed; a file; a FIFO):
        // removed, and said.
        let Some(ns_dir) = private_state::open_dir(&wait_dir, &ns.name, false, found)? else {
            continue;
        };
        ns_dir.remove_stale_temps()?;
        for entry in ns_dir.entries()? {
            let pod = PodKey::new(&ns.name, &entry.name).ok();
            // Whatever ipkeep did not write there (a directory, a FIFO, garbage) is damage.
            let marker = private_state::read_file(&ns_dir, &entry.name, MAX_MARKER_LEN, found)?;
            let Some(bytes) = marker else {
                continue;
            };
            if pod.is_none() || parse_marker(&bytes).is_none() {
                private_state::discard(
                    &ns_dir,
                    &entry.name,
                    "content that is not a wait marker",
                    found,
                );
                continue;
            }
            if pod.as_ref().is_some_and(keep) {
                continue;
            }
            if ns_dir.remove(&entry.name)?
                && let Some(pod) = pod
            {
                removed.push(pod);
            }
        }
        if ns_dir.list()?.is_empty() {
            wait_dir.remove_dir(&ns.name)?;
        }
    }
    Ok(removed)
}

fn parse_marker(bytes: &[u8]) -> Option<WaitMarker> {
    let text = std::str::from_utf8(bytes).ok()?;
    let (holder, since) = text.strip_suffix('\n')?.split_once(' ')?;
    if holder.is_empty() || holder.contains(char::is_whitespace) {
        return None;
    }
    Some(WaitMarker {
        holder: holder.to_owned(),
        since: Timestamp::parse_rfc3339(since).ok()?,
    })
}
