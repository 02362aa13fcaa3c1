#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;

fn nets() -> Vec<String> {
    vec!["cbr0".to_owned(), "cbr0-v6".to_owned()]
}

#[test]
fn which_events_ask_for_a_resync() {
    use ReadFlags as F;
    let dir = F::ISDIR;
    /// What is watched, the event, the entry it names, and what it asks for.
    type Row<'a> = (Option<Watched>, ReadFlags, Option<&'a str>, Option<Trigger>);
    let rows: [Row; 18] = [
        // The data directory: entries named after a network, and itself.
        (
            Some(Watched::DataDir),
            F::DELETE | dir,
            Some("cbr0"),
            Some(Trigger::NetworkGone),
        ),
        (
            Some(Watched::DataDir),
            F::MOVED_FROM | dir,
            Some("cbr0-v6"),
            Some(Trigger::NetworkGone),
        ),
        (
            Some(Watched::DataDir),
            F::MOVED_TO | dir,
            Some("cbr0"),
            Some(Trigger::Replaced),
        ),
        (Some(Watched::DataDir), F::CREATE | dir, Some("cbr0"), None),
        (
            Some(Watched::DataDir),
            F::DELETE | dir,
            Some("other-net"),
            None,
        ),
        (
            Some(Watched::DataDir),
            F::DELETE_SELF,
            None,
            Some(Trigger::DataDirGone),
        ),
        (
            Some(Watched::DataDir),
            F::MOVE_SELF,
            None,
            Some(Trigger::DataDirGone),
        ),
        (
            Some(Watched::DataDir),
            F::UNMOUNT,
            None,
            Some(Trigger::DataDirGone),
        ),
        // A network directory: its `reserved` entry, and itself; host-local's files are not ours.
        (
            Some(Watched::Network(0)),
            F::DELETE | dir,
            Some("reserved"),
            Some(Trigger::ReservedGone),
        ),
        (
            Some(Watched::Network(0)),
            F::MOVED_FROM | dir,
            Some("reserved"),
            Some(Trigger::ReservedGone),
        ),
        (
            Some(Watched::Network(1)),
            F::MOVED_TO | dir,
            Some("reserved"),
            Some(Trigger::Replaced),
        ),
        (
            Some(Watched::Network(0)),
            F::CREATE | dir,
            Some("reserved"),
            None,
        ),
        (
            Some(Watched::Network(0)),
            F::DELETE,
            Some("10.244.1.7"),
            None,
        ),
        (
            Some(Watched::Network(0)),
            F::DELETE_SELF,
            None,
            Some(Trigger::NetworkGone),
        ),
        // reserved/ itself only.
        (
            Some(Watched::Reserved(1)),
            F::DELETE_SELF,
            None,
            Some(Trigger::ReservedGone),
        ),
        (Some(Watched::Reserved(0)), F::IGNORED, None, None),
        // The kernel's queue overflowed (no watch), and an event of a forgotten watch.
        (None, F::QUEUE_OVERFLOW, None, Some(Trigger::Overflow)),
        (None, F::DELETE_SELF, None, None),
    ];
    for (watched, flags, name, expected) in rows {
        assert_eq!(
            classify(watched, flags, name, &nets()),
            expected,
            "{watched:?} {flags:?} {name:?}"
        );
    }
    // Directories found missing.
    assert_eq!(missing_trigger(&[]), None);
    // reserved/ does not exist on a node without reservations: found missing, it asks nothing
    // (seen on real nodes: a resync every second on the node without pods).
    assert_eq!(missing_trigger(&[Watched::Reserved(0)]), None);
    assert_eq!(
        missing_trigger(&[Watched::Reserved(1), Watched::Network(0)]),
        Some(Trigger::NetworkGone)
    );
    assert_eq!(
        missing_trigger(&[Watched::Reserved(0), Watched::DataDir]),
        Some(Trigger::DataDirGone)
    );
    // A burst reports its most severe cause.
    assert_eq!(
        [
            Trigger::Replaced,
            Trigger::DataDirGone,
            Trigger::ReservedGone
        ]
        .into_iter()
        .max(),
        Some(Trigger::DataDirGone)
    );
}

/// A data directory with both networks' `reserved/`, in a fresh scratch directory (removed
/// when the guard drops), and that directory's path.
fn tree(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::Builder::new()
        .prefix(&format!("ipkeep-dirwatch-{name}-"))
        .tempdir()
        .unwrap();
    let root = tmp.path().to_path_buf();
    let data = root.join("data");
    for net in nets() {
        std::fs::create_dir_all(data.join(&net).join("reserved/ns")).unwrap();
    }
    (tmp, root)
}

/// The next wake, with the tests' deadline.
async fn next(watch: &mut DirWatch) -> Wake {
    tokio::time::timeout(Duration::from_secs(60), watch.next(|| true))
        .await
        .expect("no wake within 60 s")
        .unwrap()
}

#[tokio::test]
async fn removals_and_replacements_wake_the_agent_and_its_own_writes_do_not() {
    let (_tmp, root) = tree("wake");
    let data = root.join("data");
    let mut watch = DirWatch::new(&data, &nets()).unwrap();

    // What the agent and the plugin write all day wakes nothing: the first wake is the rm -rf.
    std::fs::write(data.join("cbr0/reserved/ns/web-0"), b"{}").unwrap();
    std::fs::rename(
        data.join("cbr0/reserved/ns/web-0"),
        data.join("cbr0/reserved/ns/web-1"),
    )
    .unwrap();
    std::fs::remove_file(data.join("cbr0/reserved/ns/web-1")).unwrap();
    std::fs::write(data.join("cbr0/10.244.1.7"), b"id").unwrap();
    std::fs::remove_file(data.join("cbr0/10.244.1.7")).unwrap();
    std::fs::remove_dir_all(data.join("cbr0")).unwrap();
    assert_eq!(next(&mut watch).await, Wake::Resync(Trigger::NetworkGone));

    // Re-created (as the resync does), then reserved/ moved away: watched again.
    std::fs::create_dir_all(data.join("cbr0/reserved")).unwrap();
    std::fs::rename(data.join("cbr0-v6/reserved"), root.join("kept")).unwrap();
    let wake = next(&mut watch).await;
    assert_eq!(wake, Wake::Resync(Trigger::ReservedGone));
    std::fs::create_dir_all(data.join("cbr0/reserved")).unwrap();
    std::fs::remove_dir_all(data.join("cbr0/reserved")).unwrap();
    assert_eq!(next(&mut watch).await, Wake::Resync(Trigger::ReservedGone));

    // A backup moved in over the network directory.
    std::fs::create_dir_all(root.join("backup/reserved")).unwrap();
    std::fs::remove_dir_all(data.join("cbr0-v6")).unwrap();
    assert_eq!(next(&mut watch).await, Wake::Resync(Trigger::NetworkGone));
    std::fs::rename(root.join("backup"), data.join("cbr0-v6")).unwrap();
    assert_eq!(next(&mut watch).await, Wake::Resync(Trigger::Replaced));

    // The whole data directory (not a mount here: it can simply be made again).
    std::fs::remove_dir_all(&data).unwrap();
    assert_eq!(next(&mut watch).await, Wake::Resync(Trigger::DataDirGone));
    std::fs::create_dir_all(data.join("cbr0/reserved")).unwrap();
    // What the watch does while a directory is missing (every REARM, and after any event).
    assert_eq!(
        watch.arm().unwrap(),
        [Watched::Reserved(1), Watched::Network(1)]
    );
    std::fs::remove_dir_all(data.join("cbr0")).unwrap();
    assert_eq!(
        next(&mut watch).await,
        Wake::Resync(Trigger::NetworkGone),
        "the re-created data directory is watched again"
    );
    // The directory moved away earlier is no longer watched: removing it wakes nothing, so the
    // next wake is the one for cbr0 removed again.
    std::fs::remove_dir_all(root.join("kept")).unwrap();
    std::fs::create_dir_all(data.join("cbr0/reserved")).unwrap();
    watch.arm().unwrap();
    std::fs::rename(data.join("cbr0"), root.join("cbr0.bak")).unwrap();
    assert_eq!(next(&mut watch).await, Wake::Resync(Trigger::NetworkGone));
}

#[test]
fn a_directory_deleted_while_still_held_is_orphaned() {
    let (_tmp, root) = tree("orphan");
    let dir = root.join("data");
    assert!(!orphaned(&dir));
    // Held open (as a bind mount holds its source), then deleted: /proc/self/fd/N still opens it.
    let held = std::fs::File::open(&dir).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let through = PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&held)
    ));
    assert!(orphaned(&through));
    assert!(
        !orphaned(&dir),
        "a missing directory is not orphaned: it can be made again"
    );
}

/// A directory removed before it was ever watched (made and removed between two arms) is found
/// missing, once the agent expects every directory, and not before.
#[tokio::test]
async fn a_directory_removed_before_it_was_watched_is_found_missing() {
    let (_tmp, root) = tree("missing");
    let data = root.join("data");
    std::fs::remove_dir_all(data.join("cbr0-v6")).unwrap();
    let mut watch = DirWatch::new(&data, &nets()).unwrap();
    let expect = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = expect.clone();
    let waiting = tokio::spawn(async move {
        let wake = tokio::time::timeout(
            Duration::from_secs(60),
            watch.next(move || flag.load(std::sync::atomic::Ordering::Relaxed)),
        )
        .await
        .expect("no wake within 60 s")
        .unwrap();
        (wake, watch)
    });
    // Not expected yet (the agent's first pass has not run): a missing directory wakes nothing
    // while the other directories' events come and go.
    for i in 0..3 {
        std::fs::write(data.join(format!("cbr0/10.0.0.{i}")), b"id").unwrap();
        tokio::time::sleep(REARM).await;
    }
    assert!(
        !waiting.is_finished(),
        "woke before the agent expected the directories"
    );
    expect.store(true, std::sync::atomic::Ordering::Relaxed);
    let (wake, _watch) = waiting.await.unwrap();
    assert_eq!(wake, Wake::Resync(Trigger::NetworkGone));
}
