//! The plugin's files as attack surface: the plugin runs as root on every node and reads a data
//! directory an unprivileged user may have written into. Each row plants one thing (a symlink
//! owned by another user on the way to the data directory, a symlinked network or `reserved/<ns>`
//! directory, a FIFO, device node, socket or `/proc` link where a reservation or allocation file
//! belongs) and asserts the plugin's file layer refuses it with an error naming the path and what
//! is wrong, without blocking, reading or changing anything: the tree is the same, byte for byte,
//! before and after.
//!
//! Needs root (mknod, chown to another uid): run as root, as `make test` and CI do.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, lchown, symlink};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use ipkeep_netdir::NetworkDir;
use ipkeep_reservation::read_reservation;
use rustix::fs::{FileType, Mode};

/// The uid of the unprivileged user planting things.
const OTHER_UID: u32 = 1000;

/// What one entry of a tree is: kind, mode, owner, and its bytes, link target or device number.
type Snapshot = BTreeMap<PathBuf, String>;

/// Every entry below `root` (never following a symlink, never opening a special file).
fn snapshot(root: &Path) -> Snapshot {
    let mut out = Snapshot::new();
    let mut todo = vec![root.to_owned()];
    while let Some(path) = todo.pop() {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let kind = meta.file_type();
        let what = if kind.is_symlink() {
            format!("-> {}", std::fs::read_link(&path).unwrap().display())
        } else if kind.is_file() {
            format!("{:?}", std::fs::read(&path).unwrap())
        } else if kind.is_dir() {
            for entry in std::fs::read_dir(&path).unwrap() {
                todo.push(entry.unwrap().path());
            }
            "dir".to_owned()
        } else {
            format!("special rdev {}", meta.rdev())
        };
        let rel = path.strip_prefix(root).unwrap().to_owned();
        out.insert(
            rel,
            format!(
                "mode {:o} uid {} gid {} {what}",
                meta.mode(),
                meta.uid(),
                meta.gid()
            ),
        );
    }
    out
}

fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test plants device nodes and other users' symlinks: run it as root (sudo cargo test -p ipkeep-plugin --test attack_surface)"
    );
}

/// Plants what a row attacks with below `root` (which holds `data/net1/reserved/ns/`).
type Plant = fn(&Path);

/// What the plugin does that the row attacks.
#[derive(Clone, Copy)]
enum Step {
    /// Opens the network directory `net1` under this data directory (relative to the root).
    OpenNetwork(&'static str),
    /// Reads the reservation `reserved/ns/pod`.
    ReadReservation,
    /// Reads the allocation file `10.1.0.3` of `net1`.
    ReadAllocation,
}

/// Where the reservation `ns/pod` of `net1` is.
fn reservation(root: &Path) -> PathBuf {
    root.join("data/net1/reserved/ns/pod")
}

/// Where the allocation file of 10.1.0.3 in `net1` is.
fn allocation(root: &Path) -> PathBuf {
    root.join("data/net1/10.1.0.3")
}

fn fifo(path: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        FileType::Fifo,
        Mode::from_raw_mode(0o666),
        0,
    )
    .unwrap();
}

/// /dev/null's major and minor, in the scratch directory.
fn char_device(path: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        FileType::CharacterDevice,
        Mode::from_raw_mode(0o666),
        rustix::fs::makedev(1, 3),
    )
    .unwrap();
}

fn socket(path: &Path) {
    // The socket file stays after the listener is dropped.
    drop(UnixListener::bind(path).unwrap());
}

/// A symlink owned by the unprivileged user.
fn users_symlink(target: &Path, link: &Path) {
    symlink(target, link).unwrap();
    lchown(link, Some(OTHER_UID), Some(OTHER_UID)).unwrap();
}

#[test]
fn planted_files_and_links_are_refused_and_nothing_changes() {
    require_root();
    let rows: Vec<(&str, Plant, Step, String)> = vec![
        (
            "a data directory that is another user's symlink",
            |root| users_symlink(&root.join("data"), &root.join("userlink")),
            Step::OpenNetwork("userlink"),
            "failed to use the data directory {root}/userlink: {root}/userlink is a symbolic link owned by uid 1000, not root; ipkeep follows only root's links there (replace it with root's own or set dataDir to the real directory)".into(),
        ),
        (
            "a data directory below another user's symlink",
            |root| users_symlink(root, &root.join("userlink")),
            Step::OpenNetwork("userlink/data"),
            "failed to use the data directory {root}/userlink/data: {root}/userlink is a symbolic link owned by uid 1000, not root; ipkeep follows only root's links there (replace it with root's own or set dataDir to the real directory)".into(),
        ),
        (
            "another user's symlink inside root's symlink's target",
            |root| {
                std::fs::create_dir(root.join("home")).unwrap();
                users_symlink(&root.join("data"), &root.join("home/planted"));
                symlink(root.join("home"), root.join("rootlink")).unwrap();
            },
            Step::OpenNetwork("rootlink/planted"),
            "failed to use the data directory {root}/rootlink/planted: {root}/home/planted is a symbolic link owned by uid 1000, not root; ipkeep follows only root's links there (replace it with root's own or set dataDir to the real directory)".into(),
        ),
        (
            "a network directory that is a symlink",
            |root| {
                std::fs::create_dir(root.join("data2")).unwrap();
                users_symlink(&root.join("data/net1"), &root.join("data2/net1"));
            },
            Step::OpenNetwork("data2"),
            "failed to open {root}/data2/net1: it is a symbolic link, which ipkeep never follows"
                .into(),
        ),
        (
            "reserved/<ns> that is a symlink",
            |root| {
                std::fs::remove_dir_all(root.join("data/net1/reserved/ns")).unwrap();
                users_symlink(Path::new("/etc"), &root.join("data/net1/reserved/ns"));
            },
            Step::ReadReservation,
            "failed to open {root}/data/net1/reserved/ns: it is a symbolic link, which ipkeep never follows".into(),
        ),
        (
            "a reservation file that is a FIFO",
            |root| fifo(&reservation(root)),
            Step::ReadReservation,
            "failed to read {root}/data/net1/reserved/ns/pod: not a regular file".into(),
        ),
        (
            "a reservation file that is a character device",
            |root| char_device(&reservation(root)),
            Step::ReadReservation,
            "failed to read {root}/data/net1/reserved/ns/pod: not a regular file".into(),
        ),
        (
            "a reservation file that is a socket",
            |root| socket(&reservation(root)),
            Step::ReadReservation,
            "failed to read {root}/data/net1/reserved/ns/pod: not a regular file".into(),
        ),
        (
            "a reservation file that is a symlink to /proc/self/environ",
            |root| users_symlink(Path::new("/proc/self/environ"), &reservation(root)),
            Step::ReadReservation,
            "failed to open {root}/data/net1/reserved/ns/pod: it is a symbolic link, which ipkeep never follows".into(),
        ),
        (
            "an allocation file that is a FIFO",
            |root| fifo(&allocation(root)),
            Step::ReadAllocation,
            "failed to read {root}/data/net1/10.1.0.3: not a regular file".into(),
        ),
        (
            "an allocation file that is a character device",
            |root| char_device(&allocation(root)),
            Step::ReadAllocation,
            "failed to read {root}/data/net1/10.1.0.3: not a regular file".into(),
        ),
        (
            "an allocation file that is a socket",
            |root| socket(&allocation(root)),
            Step::ReadAllocation,
            "failed to read {root}/data/net1/10.1.0.3: not a regular file".into(),
        ),
        (
            "an allocation file that is a symlink to /proc/self/mem",
            |root| users_symlink(Path::new("/proc/self/mem"), &allocation(root)),
            Step::ReadAllocation,
            "failed to open {root}/data/net1/10.1.0.3: it is a symbolic link, which ipkeep never follows".into(),
        ),
    ];
    for (what, plant, step, expected) in rows {
        let tmp = tempfile::Builder::new()
            .prefix("ipkeep-attack-")
            .tempdir()
            .unwrap();
        let root = tmp.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("data/net1/reserved/ns")).unwrap();
        std::fs::write(root.join("data/net1/lock"), b"").unwrap();
        plant(&root);
        let before = snapshot(&root);
        let net = || NetworkDir::open(&root.join("data"), "net1").unwrap();
        let err = match step {
            Step::OpenNetwork(data) => NetworkDir::open(&root.join(data), "net1")
                .map(|_| ())
                .unwrap_err()
                .to_string(),
            Step::ReadReservation => read_reservation(&net(), "ns", "pod")
                .map(|_| ())
                .unwrap_err()
                .to_string(),
            Step::ReadAllocation => net()
                .read_file("10.1.0.3", 256)
                .map(|_| ())
                .unwrap_err()
                .to_string(),
        };
        let expected = expected.replace("{root}", &root.display().to_string());
        assert_eq!(err, expected, "{what}");
        assert_eq!(snapshot(&root), before, "{what}: the tree changed");
    }
}
