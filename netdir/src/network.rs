//! The network directory `<dataDir>/<network>/`, created and opened the way host-local does, and
//! the exclusive lock on its `lock` file that host-local and ipkeep both take.

use std::ffi::{OsStr, OsString};
use std::ops::Deref;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, FlockOperation, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::entry::kind_of;
use crate::go_text::go_mkdir_all;
use crate::{DirFd, EntryKind, NetDirError, check_name, go_clean, go_join};

/// Name of the lock file host-local and ipkeep both `flock`.
const LOCK_NAME: &str = "lock";

/// How many symbolic links the data directory's path may pass through (the kernel's limit).
const MAX_LINKS: usize = 40;

/// Refuses a data directory reached through a symbolic link owned by anyone but root or the
/// plugin's own user: such a link may have been planted by an unprivileged user to point the
/// plugin (root) at a directory of theirs, or at one of the node's. Every link on the way, and
/// in the links' targets, is read with `lstat` and resolved by hand; a component that does not
/// exist ends the walk (the plugin creates the rest itself, as host-local does).
fn check_links(data_dir: &Path) -> Result<(), NetDirError> {
    let euid = rustix::process::geteuid().as_raw();
    let start = if data_dir.is_absolute() {
        data_dir.to_owned()
    } else {
        let cwd = std::env::current_dir().map_err(|e| NetDirError::Io {
            op: "resolve",
            path: data_dir.to_owned(),
            errno: Errno::from_io_error(&e).unwrap_or(Errno::INVAL),
        })?;
        cwd.join(data_dir)
    };
    // The components still to walk, the next one last; `current` holds no symlink.
    let mut pending: Vec<OsString> = Vec::new();
    push_components(&mut pending, &start);
    let mut current = PathBuf::from("/");
    let mut links = 0;
    while let Some(name) = pending.pop() {
        if name == ".." {
            current.pop();
            continue;
        }
        let next = current.join(&name);
        let Ok(st) = rustix::fs::lstat(&next) else {
            return Ok(());
        };
        if kind_of(FileType::from_raw_mode(st.st_mode as _)) != EntryKind::Symlink {
            current = next;
            continue;
        }
        if st.st_uid != 0 && st.st_uid != euid {
            return Err(NetDirError::UntrustedSymlink {
                data_dir: data_dir.to_owned(),
                link: next,
                uid: st.st_uid,
            });
        }
        links += 1;
        let target = match rustix::fs::readlink(&next, Vec::new()) {
            Ok(target) if links <= MAX_LINKS => target,
            Ok(_) => {
                return Err(NetDirError::Open {
                    path: data_dir.to_owned(),
                    errno: Errno::LOOP,
                });
            }
            Err(errno) => return Err(NetDirError::Open { path: next, errno }),
        };
        let target = Path::new(OsStr::from_bytes(target.as_bytes()));
        if target.is_absolute() {
            current = PathBuf::from("/");
        }
        push_components(&mut pending, target);
    }
    Ok(())
}

/// Pushes `path`'s components (without the root and `.`) so that the first is popped first.
fn push_components(pending: &mut Vec<OsString>, path: &Path) {
    use std::path::Component;
    let names: Vec<OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name.to_owned()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect();
    pending.extend(names.into_iter().rev());
}

/// An open handle on `<dataDir>/<network>/`, all access relative to its fd, never following symlinks.
#[derive(Debug)]
pub struct NetworkDir {
    dir: DirFd,
}

impl Deref for NetworkDir {
    type Target = DirFd;
    fn deref(&self) -> &DirFd {
        &self.dir
    }
}

impl NetworkDir {
    /// mkdir -p `data_dir` (0755, following symlinks like host-local) and `<network>` (0755);
    /// opens `<network>` with `O_DIRECTORY|O_NOFOLLOW` (a symlink there is an error).
    pub fn open(data_dir: &Path, network: &str) -> Result<Self, NetDirError> {
        check_name(network)?;
        let data_clean = PathBuf::from(go_clean(&data_dir.to_string_lossy()));
        let net_path = go_join(&data_clean, network);
        // Fast path (every call after the first): the network directory already exists and no
        // symlink leads to it. A path with a symlink on the way is walked first, refusing a link
        // another user planted.
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let no_links = rustix::fs::openat2(
            rustix::fs::CWD,
            &data_clean,
            flags,
            Mode::empty(),
            ResolveFlags::NO_SYMLINKS,
        );
        let opened = match no_links {
            Ok(fd) => Ok(fd),
            Err(_) => {
                check_links(&data_clean)?;
                rustix::fs::open(&data_clean, flags, Mode::empty())
            }
        };
        let data_fd = match opened {
            Ok(fd) => fd,
            Err(Errno::NOENT) => {
                go_mkdir_all(&data_clean)?;
                rustix::fs::open(&data_clean, flags, Mode::empty()).map_err(|errno| {
                    NetDirError::Open {
                        path: data_clean.clone(),
                        errno,
                    }
                })?
            }
            // Go's MkdirAll reports an existing non-directory as ENOTDIR on the full path.
            Err(Errno::NOTDIR) => {
                go_mkdir_all(&data_clean)?;
                return Err(NetDirError::Mkdir {
                    path: net_path,
                    errno: Errno::NOTDIR,
                });
            }
            Err(errno) => {
                return Err(NetDirError::Open {
                    path: data_clean,
                    errno,
                });
            }
        };
        let data = DirFd {
            fd: data_fd,
            path: data_clean,
        };
        match data.open_child_dir(network, true) {
            Ok(Some(dir)) => Ok(Self { dir }),
            Ok(None) => Err(NetDirError::Mkdir {
                path: net_path,
                errno: Errno::NOENT,
            }),
            // host-local's MkdirAll says "mkdir <net>: not a directory" for a file at `<net>`.
            Err(NetDirError::NotDirectory { path }) => Err(NetDirError::Mkdir {
                path,
                errno: Errno::NOTDIR,
            }),
            Err(e) => Err(e),
        }
    }

    /// Takes `flock(LOCK_EX)` on `<network>/lock` (created `O_RDONLY|O_CREAT|O_NOFOLLOW`, 0750);
    /// released when the returned guard is dropped.
    pub fn lock(&self) -> Result<NetworkLock<'_>, NetDirError> {
        let path = self.child_path(LOCK_NAME);
        let flags =
            OFlags::RDONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd =
            match rustix::fs::openat(&self.fd, LOCK_NAME, flags, Mode::from_bits_truncate(0o750)) {
                Ok(fd) => fd,
                Err(Errno::LOOP) => return Err(NetDirError::Symlink { path }),
                Err(errno) => return Err(NetDirError::Open { path, errno }),
            };
        let st = rustix::fs::fstat(&fd).map_err(|errno| self.io("stat", &path, errno))?;
        if kind_of(FileType::from_raw_mode(st.st_mode as _)) != EntryKind::File {
            return Err(NetDirError::NotRegular { path });
        }
        loop {
            match rustix::fs::flock(&fd, FlockOperation::LockExclusive) {
                Ok(()) => break,
                Err(Errno::INTR) => continue,
                Err(errno) => return Err(self.io("lock", &path, errno)),
            }
        }
        Ok(NetworkLock { fd, _dir: self })
    }

    /// The network directory's path (for messages).
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// The exclusive `flock` on `<network>/lock`; dropping it closes the descriptor, which unlocks.
#[derive(Debug)]
pub struct NetworkLock<'a> {
    fd: OwnedFd,
    _dir: &'a NetworkDir,
}

impl NetworkLock<'_> {
    /// Releases the lock now (dropping does the same).
    pub fn unlock(self) {
        let _ = rustix::fs::flock(&self.fd, FlockOperation::Unlock);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};

    use tempfile::TempDir;

    #[test]
    fn open_creates_dirs_and_lock() {
        let s = TempDir::new().unwrap();
        let data = s.path().join("a/b");
        let dir = NetworkDir::open(&data, "net1").unwrap();
        assert_eq!(dir.path(), data.join("net1"));
        let lock = dir.lock().unwrap();
        let meta = std::fs::metadata(data.join("net1/lock")).unwrap();
        assert!(meta.is_file());
        assert_eq!(
            meta.permissions().mode() & 0o777 & !0o750,
            0,
            "lock is created 0750 (minus umask)"
        );
        drop(lock);
        // Re-opening an existing directory works and the lock can be taken again.
        let again = NetworkDir::open(&data, "net1").unwrap();
        again.lock().unwrap().unlock();
    }

    #[test]
    fn symlinked_network_dir_is_refused() {
        let s = TempDir::new().unwrap();
        let elsewhere = s.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::create_dir(s.path().join("data")).unwrap();
        symlink(&elsewhere, s.path().join("data/net1")).unwrap();
        let err = NetworkDir::open(&s.path().join("data"), "net1").unwrap_err();
        assert!(matches!(err, NetDirError::Symlink { .. }), "{err}");
        assert!(std::fs::read_dir(&elsewhere).unwrap().next().is_none());
    }

    #[test]
    fn file_at_network_dir_gives_go_mkdir_text() {
        let s = TempDir::new().unwrap();
        std::fs::write(s.path().join("net1"), b"x").unwrap();
        let err = NetworkDir::open(s.path(), "net1").unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("mkdir {}/net1: not a directory", s.path().display())
        );
        std::fs::write(s.path().join("datafile"), b"x").unwrap();
        let err = NetworkDir::open(&s.path().join("datafile/sub"), "net1").unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("mkdir {}/datafile: not a directory", s.path().display())
        );
    }

    #[test]
    fn symlinked_lock_is_refused() {
        let s = TempDir::new().unwrap();
        let dir = NetworkDir::open(s.path(), "net1").unwrap();
        symlink(s.path().join("target"), s.path().join("net1/lock")).unwrap();
        let err = dir.lock().unwrap_err();
        assert!(matches!(err, NetDirError::Symlink { .. }), "{err}");
        assert!(!s.path().join("target").exists());
    }
}
