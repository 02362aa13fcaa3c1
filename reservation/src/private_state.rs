//! ipkeep's private state below `<net>/.ipkeep/` — the container index, the stamp, the
//! reservation snapshot, the wait markers, their temporaries — is ipkeep's own and rebuildable
//! from host-local's files and `reserved/`. Whatever is found at one of its paths that is not
//! what ipkeep would have written there (another file type, a symlink, a file too large, with
//! other permission bits or more than one link, content that does not decode) is removed under
//! the network's lock, with one stderr line saying what was found, and rebuilt; it is never an
//! error for the runtime. A command that could never succeed (a DEL blocked by a directory in
//! ipkeep's way) would make the runtime retry it forever.
//!
//! Private files are always written `0600` by ipkeep; directories `0755` (minus the umask). A
//! file is taken for ipkeep's when its mode is `0600` or `0400` (what a umask can leave of it).

use rustix::fs::{AtFlags, FileType};

use ipkeep_netdir::{DirFd, EntryKind, FileStat, NetDirError, SubDir};

pub use crate::released::RELEASED_NAME;
pub use crate::snapshot::SNAPSHOT_NAME;
pub use crate::wait::WAIT_DIR;

/// ipkeep's private directory inside `<net>/` (the index, the reservation snapshot, wait markers).
pub const PRIVATE_DIR: &str = ".ipkeep";
/// Mode of every private file ipkeep writes.
pub const FILE_MODE: u32 = 0o600;
/// Mode private directories are created with (and given back when found with another).
pub const DIR_MODE: u32 = 0o755;
/// How deep a damaged directory is descended into to remove it.
const MAX_DAMAGE_DEPTH: usize = 16;

/// Escapes control characters, so a name found on disk cannot split or forge a log line.
pub fn escape_control(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// What sits at a private file's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Nothing.
    Absent,
    /// A regular file ipkeep could have written (mode 0600, one link, within the size limit).
    File,
    /// Something else, described for the log (`a directory`, `a file of 5000000 bytes`, …).
    Damaged(String),
}

fn kind_text(file_type: FileType) -> &'static str {
    match file_type {
        FileType::RegularFile => "a regular file",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symbolic link",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        _ => "an entry of unknown type",
    }
}

/// Whether a private file's mode is one ipkeep's `0600` can become under a umask: nothing for
/// group or others, nothing special, and readable by its owner.
fn file_mode_ok(mode: u32) -> bool {
    mode & !FILE_MODE == 0 && mode & 0o400 != 0
}

/// Looks at `name` in `dir` without opening it (a device node is never opened).
pub fn inspect_file(dir: &DirFd, name: &str, max_len: usize) -> Result<Found, NetDirError> {
    let Some(st) = dir.stat(name)? else {
        return Ok(Found::Absent);
    };
    if st.kind != EntryKind::File
        || st.size > max_len as u64
        || !file_mode_ok(st.mode)
        || st.nlink != 1
    {
        return Ok(Found::Damaged(describe(dir, name, &st, max_len)));
    }
    Ok(Found::File)
}

/// What is wrong with `name` (off the hot path: only damage gets here).
#[cold]
#[inline(never)]
fn describe(dir: &DirFd, name: &str, st: &FileStat, max_len: usize) -> String {
    if st.kind != EntryKind::File {
        return match rustix::fs::statat(dir.fd(), name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(raw) => kind_text(FileType::from_raw_mode(raw.st_mode as _)).to_owned(),
            Err(_) => "an entry of unknown type".to_owned(),
        };
    }
    if st.size > max_len as u64 {
        format!(
            "a file of {} bytes (ipkeep writes at most {max_len})",
            st.size
        )
    } else if !file_mode_ok(st.mode) {
        format!(
            "a file with mode {:04o} (ipkeep writes {FILE_MODE:04o})",
            st.mode
        )
    } else {
        format!("a file with {} hard links", st.nlink)
    }
}

/// Removes whatever is at `name` (a directory with its content) and logs what was found.
#[cold]
#[inline(never)]
pub fn discard(dir: &DirFd, name: &str, what: &str, log: &mut Vec<String>) {
    let path = escape_control(&dir.child_path(name).to_string_lossy());
    match dir.remove_tree(name, MAX_DAMAGE_DEPTH) {
        Ok(_) => log.push(format!(
            "found {what} at {path}, which ipkeep did not write: removed it, to be rebuilt"
        )),
        Err(e) => log.push(format!(
            "found {what} at {path}, which ipkeep did not write, and failed to remove it: {}",
            escape_control(&e.to_string())
        )),
    }
}

/// Reads the private file `name`: `None` if it is absent, or was not what ipkeep writes there
/// (then it is removed and `log` says what it was). Never follows a link or opens a device.
pub fn read_file(
    dir: &DirFd,
    name: &str,
    max_len: usize,
    log: &mut Vec<String>,
) -> Result<Option<Vec<u8>>, NetDirError> {
    match inspect_file(dir, name, max_len)? {
        Found::Absent => Ok(None),
        Found::Damaged(what) => {
            discard(dir, name, &what, log);
            Ok(None)
        }
        Found::File => match dir.read_file(name, max_len) {
            Ok(bytes) => Ok(bytes),
            // Replaced meanwhile, or unreadable (EIO, no permission): as good as absent.
            Err(e) => {
                unreadable(dir, name, &e, log);
                Ok(None)
            }
        },
    }
}

#[cold]
#[inline(never)]
fn unreadable(dir: &DirFd, name: &str, e: &NetDirError, log: &mut Vec<String>) {
    let what = format!("an unreadable file ({})", escape_control(&e.to_string()));
    discard(dir, name, &what, log);
}

/// Opens (creating it if asked) the private directory `name` in `parent`: anything else at that
/// name (a file, a symlink — never followed —, a FIFO, a device) is removed and a directory
/// created; a directory others may write into, or its owner cannot use, gets mode 0755 back.
/// `None` only when absent and `create` is false.
pub fn open_dir(
    parent: &DirFd,
    name: &str,
    create: bool,
    log: &mut Vec<String>,
) -> Result<Option<SubDir>, NetDirError> {
    let dir = match parent.subdir(&[name], create) {
        Ok(dir) => dir,
        Err(NetDirError::Symlink { .. } | NetDirError::NotDirectory { .. }) => {
            return replace_with_dir(parent, name, create, log);
        }
        Err(e) => return Err(e),
    };
    let Some(dir) = dir else {
        return Ok(None);
    };
    let mode = dir.own_stat()?.mode;
    if mode & 0o7022 != 0 || mode & 0o700 != 0o700 {
        fix_dir_mode(&dir, mode, log)?;
    }
    Ok(Some(dir))
}

#[cold]
#[inline(never)]
fn replace_with_dir(
    parent: &DirFd,
    name: &str,
    create: bool,
    log: &mut Vec<String>,
) -> Result<Option<SubDir>, NetDirError> {
    let what = match rustix::fs::statat(parent.fd(), name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => kind_text(FileType::from_raw_mode(st.st_mode as _)),
        Err(_) => "something other than a directory",
    };
    discard(parent, name, what, log);
    if !create {
        return Ok(None);
    }
    parent.subdir(&[name], true)
}

#[cold]
#[inline(never)]
fn fix_dir_mode(dir: &SubDir, mode: u32, log: &mut Vec<String>) -> Result<(), NetDirError> {
    dir.set_mode(DIR_MODE)?;
    // Group write alone is what a umask of 0002 gives ipkeep's own directories: fixed silently.
    if mode & 0o7002 != 0 || mode & 0o700 != 0o700 {
        log.push(format!(
            "found mode {mode:04o} on ipkeep's directory {}: set it to {DIR_MODE:04o}",
            escape_control(&dir.path().to_string_lossy())
        ));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use ipkeep_netdir::NetworkDir;
    use std::os::unix::fs::PermissionsExt;
    use tempfile::TempDir;

    #[test]
    fn every_kind_of_damage_is_named_and_removed() {
        let s = TempDir::new().unwrap();
        let net = NetworkDir::open(s.path(), "net1").unwrap();
        let at = |name: &str| s.path().join("net1").join(name);
        std::fs::create_dir_all(at("dir/sub")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", at("link")).unwrap();
        std::fs::write(at("big"), vec![b'x'; 300]).unwrap();
        std::fs::write(at("open"), b"x").unwrap();
        std::fs::set_permissions(at("open"), std::fs::Permissions::from_mode(0o666)).unwrap();
        std::fs::write(at("good"), b"ok").unwrap();
        std::fs::set_permissions(at("good"), std::fs::Permissions::from_mode(0o600)).unwrap();
        let status = std::process::Command::new("mkfifo")
            .arg(at("fifo"))
            .status()
            .unwrap();
        assert!(status.success());
        let mut log = Vec::new();
        for (name, what) in [
            ("dir", "a directory"),
            ("link", "a symbolic link"),
            ("fifo", "a FIFO"),
            ("big", "a file of 300 bytes (ipkeep writes at most 256)"),
            ("open", "a file with mode 0666 (ipkeep writes 0600)"),
        ] {
            assert_eq!(
                inspect_file(&net, name, 256).unwrap(),
                Found::Damaged(what.to_owned()),
                "{name}"
            );
            assert_eq!(read_file(&net, name, 256, &mut log).unwrap(), None);
            assert!(
                std::fs::symlink_metadata(at(name)).is_err(),
                "{name} removed"
            );
        }
        assert_eq!(log.len(), 5, "one line per damaged path: {log:?}");
        assert!(log[0].starts_with("found a directory at "), "{}", log[0]);
        assert!(
            std::fs::metadata("/etc/passwd").is_ok(),
            "a link's target is kept"
        );
        assert_eq!(
            read_file(&net, "good", 256, &mut log).unwrap().as_deref(),
            Some(&b"ok"[..])
        );
        assert_eq!(read_file(&net, "missing", 256, &mut log).unwrap(), None);
        assert_eq!(log.len(), 5, "nothing said about a good or absent file");
    }

    #[test]
    fn file_modes_a_umask_can_make_are_fine() {
        for (mode, ok) in [
            (0o600, true),
            (0o400, true),
            (0o644, false),
            (0o000, false),
            (0o200, false),
            (0o4600, false),
            (0o700, false),
        ] {
            assert_eq!(file_mode_ok(mode), ok, "{mode:o}");
        }
    }

    #[test]
    fn private_directories_are_healed() {
        let s = TempDir::new().unwrap();
        let net = NetworkDir::open(s.path(), "net1").unwrap();
        let at = |name: &str| s.path().join("net1").join(name);
        std::fs::write(at("a"), b"file").unwrap();
        std::os::unix::fs::symlink(s.path().join("outside"), at("b")).unwrap();
        std::fs::create_dir(at("c")).unwrap();
        std::fs::set_permissions(at("c"), std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::create_dir(at("e")).unwrap();
        std::fs::set_permissions(at("e"), std::fs::Permissions::from_mode(0o775)).unwrap();
        let mut log = Vec::new();
        for name in ["a", "b", "c", "d", "e"] {
            let dir = open_dir(&net, name, true, &mut log).unwrap().unwrap();
            assert_eq!(dir.own_stat().unwrap().kind, EntryKind::Dir);
            assert_eq!(dir.own_stat().unwrap().mode & 0o022, 0, "{name}");
        }
        assert!(!s.path().join("outside").exists());
        assert_eq!(log.len(), 3, "{log:?}");
        assert!(log[0].starts_with("found a regular file at "), "{}", log[0]);
        assert!(
            log[1].starts_with("found a symbolic link at "),
            "{}",
            log[1]
        );
        assert!(log[2].starts_with("found mode 0777 on "), "{}", log[2]);
    }
}
