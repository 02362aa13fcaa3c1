//! An open directory and everything done relative to its descriptor, never following a symlink:
//! reading, atomic and in-place writes, removal, listing, and opening sub-directories.

use std::fs::File;
use std::io::{Read, Write};
use std::ops::Deref;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::entry::kind_of;
use crate::{DirEntry, EntryKind, FileStat, NetDirError, check_name, go_join};

/// The prefix of every temporary file this crate creates; such names never parse as an IP.
pub const TEMP_PREFIX: &str = ".ipkeep-tmp-";

/// Distinguishes temporary files created by one process.
static TEMP_COUNTER: AtomicU32 = AtomicU32::new(0);

/// An open directory: the operations shared by [`NetworkDir`](crate::NetworkDir) and [`SubDir`],
/// all relative to its file descriptor and none following a symlink.
#[derive(Debug)]
pub struct DirFd {
    pub(crate) fd: OwnedFd,
    pub(crate) path: PathBuf,
}

impl DirFd {
    /// The directory's file descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The directory's path, for messages only (never used to reach files).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of `name` inside this directory, for messages.
    pub fn child_path(&self, name: &str) -> PathBuf {
        go_join(&self.path, name)
    }

    /// `fstat` of the directory itself.
    pub fn own_stat(&self) -> Result<FileStat, NetDirError> {
        rustix::fs::fstat(&self.fd)
            .map(|st| FileStat::from_stat(&st))
            .map_err(|errno| self.io("stat", &self.path, errno))
    }

    /// `lstat` of `name`; `None` if it does not exist.
    pub fn stat(&self, name: &str) -> Result<Option<FileStat>, NetDirError> {
        check_name(name)?;
        match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(FileStat::from_stat(&st))),
            Err(Errno::NOENT) => Ok(None),
            Err(errno) => Err(self.io("stat", &self.child_path(name), errno)),
        }
    }

    /// Reads the regular file `name` (at most `max_len` bytes); `None` if it does not exist.
    /// A symlink, directory or other special file at `name` is an error, never followed or read.
    pub fn read_file(&self, name: &str, max_len: usize) -> Result<Option<Vec<u8>>, NetDirError> {
        check_name(name)?;
        let path = || self.child_path(name);
        // O_NONBLOCK: opening a FIFO planted at `name` must not hang the plugin.
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(&self.fd, name, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(Errno::LOOP) => return Err(NetDirError::Symlink { path: path() }),
            // A socket (or a device without its driver) cannot be opened at all.
            Err(Errno::NXIO) => return Err(NetDirError::NotRegular { path: path() }),
            Err(errno) => {
                return Err(NetDirError::Open {
                    path: path(),
                    errno,
                });
            }
        };
        let st = rustix::fs::fstat(&fd).map_err(|errno| self.io("stat", &path(), errno))?;
        if kind_of(FileType::from_raw_mode(st.st_mode as _)) != EntryKind::File {
            return Err(NetDirError::NotRegular { path: path() });
        }
        let mut buf = Vec::new();
        let limit = u64::try_from(max_len).unwrap_or(u64::MAX).saturating_add(1);
        File::from(fd)
            .take(limit)
            .read_to_end(&mut buf)
            .map_err(|e| NetDirError::Io {
                op: "read",
                path: path(),
                errno: io_errno(&e),
            })?;
        if buf.len() > max_len {
            return Err(NetDirError::TooLarge {
                path: path(),
                max_len,
            });
        }
        Ok(Some(buf))
    }

    /// Atomically replaces `name` with `bytes`: a temporary file in this directory (created with
    /// `mode`, subject to the umask), optionally fsync'd, renamed over `name`, and the directory
    /// fsync'd when `fsync` is true. Readers see the old or the new content, never a mix.
    pub fn write_atomic(
        &self,
        name: &str,
        bytes: &[u8],
        mode: u32,
        fsync: bool,
    ) -> Result<(), NetDirError> {
        check_name(name)?;
        let temp = self.write_temp(bytes, mode, fsync)?;
        if let Err(errno) = rustix::fs::renameat(&self.fd, temp.as_str(), &self.fd, name) {
            let _ = rustix::fs::unlinkat(&self.fd, temp.as_str(), AtFlags::empty());
            return Err(self.io("rename", &self.child_path(name), errno));
        }
        if fsync {
            self.sync()?;
        }
        Ok(())
    }

    /// Like [`DirFd::write_atomic`] with the file fsync'd before the rename, but without the
    /// directory's fsync: for a writer replacing several files of this directory that fsyncs it
    /// once afterwards (until then a crash may keep the old content, never a torn one).
    pub fn write_atomic_defer_dir_sync(
        &self,
        name: &str,
        bytes: &[u8],
        mode: u32,
    ) -> Result<(), NetDirError> {
        check_name(name)?;
        let temp = self.write_temp(bytes, mode, true)?;
        if let Err(errno) = rustix::fs::renameat(&self.fd, temp.as_str(), &self.fd, name) {
            let _ = rustix::fs::unlinkat(&self.fd, temp.as_str(), AtFlags::empty());
            return Err(self.io("rename", &self.child_path(name), errno));
        }
        Ok(())
    }

    /// Overwrites the regular file `name` in place (creating it with `mode` if absent), for a small
    /// file where a process killed half-way leaving a truncated or mixed content is harmless — the
    /// round-robin cursor. Replacing a file through a rename, or truncating it to zero, makes ext4
    /// start its writeback at once (the `auto_da_alloc` heuristic), which cost every ADD about
    /// 0.3 ms here; an in-place write and a shrinking `ftruncate` do not. Anything at `name` that is
    /// not a regular file with a single link (a planted symlink, a FIFO, a hard link to a file
    /// elsewhere) is replaced atomically instead.
    pub fn overwrite(&self, name: &str, bytes: &[u8], mode: u32) -> Result<(), NetDirError> {
        check_name(name)?;
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(&self.fd, name, flags, Mode::from_bits_truncate(mode)) {
            Ok(fd) => fd,
            // A symlink (ELOOP) or a FIFO without a reader (ENXIO): not ours to write through.
            Err(Errno::LOOP | Errno::NXIO) => return self.write_atomic(name, bytes, mode, false),
            Err(errno) => return Err(self.io("open", &self.child_path(name), errno)),
        };
        let stat =
            rustix::fs::fstat(&fd).map_err(|e| self.io("stat", &self.child_path(name), e))?;
        // A hard link planted at `name` shares its inode with a file elsewhere (possibly outside
        // the data directory): writing in place would change that file. Replace the name.
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile || stat.st_nlink != 1 {
            drop(fd);
            return self.write_atomic(name, bytes, mode, false);
        }
        rewrite_in_place(&fd, &stat, bytes)
            .map_err(|(op, errno)| self.io(op, &self.child_path(name), errno))
    }

    /// Writes `bytes` to a fresh temporary file in this directory and returns its name.
    pub(crate) fn write_temp(
        &self,
        bytes: &[u8],
        mode: u32,
        fsync: bool,
    ) -> Result<String, NetDirError> {
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let mode = Mode::from_bits_truncate(mode);
        let mut attempt = 0;
        let (name, fd) = loop {
            let name = format!(
                "{TEMP_PREFIX}{}-{}",
                std::process::id(),
                TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
            );
            match rustix::fs::openat(&self.fd, name.as_str(), flags, mode) {
                Ok(fd) => break (name, fd),
                // A stale temporary from a killed process that had the same pid: replace it.
                Err(Errno::EXIST) if attempt < 2 => {
                    let _ = rustix::fs::unlinkat(&self.fd, name.as_str(), AtFlags::empty());
                    attempt += 1;
                }
                Err(errno) => return Err(self.io("create", &self.child_path(&name), errno)),
            }
        };
        let mut file = File::from(fd);
        let written = file
            .write_all(bytes)
            .and_then(|()| if fsync { file.sync_all() } else { Ok(()) });
        if let Err(e) = written {
            let _ = rustix::fs::unlinkat(&self.fd, name.as_str(), AtFlags::empty());
            return Err(NetDirError::Io {
                op: "write",
                path: self.child_path(&name),
                errno: io_errno(&e),
            });
        }
        Ok(name)
    }

    /// Renames `from` to `to` inside this directory (replacing `to`).
    pub fn rename(&self, from: &str, to: &str) -> Result<(), NetDirError> {
        check_name(from)?;
        check_name(to)?;
        rustix::fs::renameat(&self.fd, from, &self.fd, to)
            .map_err(|errno| self.io("rename", &self.child_path(from), errno))
    }

    /// Removes the file (or symlink, never its target) `name`; `false` if it did not exist.
    pub fn remove(&self, name: &str) -> Result<bool, NetDirError> {
        check_name(name)?;
        match rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()) {
            Ok(()) => Ok(true),
            Err(Errno::NOENT) => Ok(false),
            Err(errno) => Err(self.io("remove", &self.child_path(name), errno)),
        }
    }

    /// Removes `name` whatever it is — a file, symlink (never its target), FIFO, device node, or a
    /// directory with everything in it, descending at most `max_depth` levels and never through a
    /// link; `false` if it did not exist.
    pub fn remove_tree(&self, name: &str, max_depth: usize) -> Result<bool, NetDirError> {
        let Some(st) = self.stat(name)? else {
            return Ok(false);
        };
        if st.kind != EntryKind::Dir {
            return self.remove(name);
        }
        if max_depth == 0 {
            return Err(NetDirError::InvalidName {
                name: self.child_path(name).to_string_lossy().into_owned(),
                reason: "a directory nested too deep to remove",
            });
        }
        if let Some(child) = self.subdir(&[name], false)? {
            for entry in child.entries()? {
                child.remove_tree(&entry.name, max_depth - 1)?;
            }
        }
        self.remove_dir(name)
    }

    /// Sets the directory's own permission bits (`fchmod`).
    pub fn set_mode(&self, mode: u32) -> Result<(), NetDirError> {
        rustix::fs::fchmod(&self.fd, Mode::from_bits_truncate(mode))
            .map_err(|errno| self.io("chmod", &self.path, errno))
    }

    /// Removes the empty directory `name`; `false` if it did not exist.
    pub fn remove_dir(&self, name: &str) -> Result<bool, NetDirError> {
        check_name(name)?;
        match rustix::fs::unlinkat(&self.fd, name, AtFlags::REMOVEDIR) {
            Ok(()) => Ok(true),
            Err(Errno::NOENT) => Ok(false),
            Err(errno) => Err(self.io("remove", &self.child_path(name), errno)),
        }
    }

    /// The names in this directory (without `.` and `..`; non-UTF-8 names are left out).
    pub fn list(&self) -> Result<Vec<String>, NetDirError> {
        Ok(self.entries()?.into_iter().map(|e| e.name).collect())
    }

    /// The entries in this directory with their kinds (without `.`, `..` and non-UTF-8 names).
    pub fn entries(&self) -> Result<Vec<DirEntry>, NetDirError> {
        let dir = rustix::fs::Dir::read_from(&self.fd)
            .map_err(|errno| self.io("list", &self.path, errno))?;
        let mut out = Vec::new();
        for entry in dir {
            let entry = entry.map_err(|errno| self.io("list", &self.path, errno))?;
            let Ok(name) = entry.file_name().to_str() else {
                continue;
            };
            if name == "." || name == ".." {
                continue;
            }
            let name = name.to_owned();
            let kind = match entry.file_type() {
                FileType::Unknown => match self.stat(&name)? {
                    Some(st) => st.kind,
                    None => continue,
                },
                t => kind_of(t),
            };
            out.push(DirEntry { name, kind });
        }
        Ok(out)
    }

    /// Removes the temporary files a killed process may have left in this directory (and
    /// anything else carrying their prefix, a planted directory included).
    /// Call it with the network lock held so no live writer's temporary is removed.
    pub fn remove_stale_temps(&self) -> Result<usize, NetDirError> {
        let mut removed = 0;
        for entry in self.entries()? {
            if entry.name.starts_with(TEMP_PREFIX) && self.remove_tree(&entry.name, 16)? {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// fsync of the directory, making renames and links in it durable.
    pub fn sync(&self) -> Result<(), NetDirError> {
        rustix::fs::fsync(&self.fd).map_err(|errno| self.io("sync", &self.path, errno))
    }

    /// Opens (creating it if asked, mode 0755) the chain of sub-directories `rel`, each component
    /// opened with `O_NOFOLLOW`. `None` if a component is missing and `create` is false.
    pub fn subdir(&self, rel: &[&str], create: bool) -> Result<Option<SubDir>, NetDirError> {
        let mut current: Option<DirFd> = None;
        for name in rel {
            let parent = current.as_ref().unwrap_or(self);
            match parent.open_child_dir(name, create)? {
                Some(child) => current = Some(child),
                None => return Ok(None),
            }
        }
        Ok(Some(SubDir {
            dir: match current {
                Some(dir) => dir,
                None => self.try_clone()?,
            },
        }))
    }

    pub(crate) fn open_child_dir(
        &self,
        name: &str,
        create: bool,
    ) -> Result<Option<DirFd>, NetDirError> {
        check_name(name)?;
        let path = self.child_path(name);
        if create {
            match rustix::fs::mkdirat(&self.fd, name, Mode::from_bits_truncate(0o755)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(errno) => return Err(NetDirError::Mkdir { path, errno }),
            }
        }
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        match rustix::fs::openat(&self.fd, name, flags, Mode::empty()) {
            Ok(fd) => Ok(Some(DirFd { fd, path })),
            Err(Errno::NOENT) if !create => Ok(None),
            Err(Errno::LOOP | Errno::NOTDIR) => Err(self.not_a_dir(name, path)),
            Err(errno) => Err(NetDirError::Open { path, errno }),
        }
    }

    /// The error for a non-directory at `name`: a symlink is named as such.
    fn not_a_dir(&self, name: &str, path: PathBuf) -> NetDirError {
        match self.stat(name) {
            Ok(Some(st)) if st.kind == EntryKind::Symlink => NetDirError::Symlink { path },
            _ => NetDirError::NotDirectory { path },
        }
    }

    fn try_clone(&self) -> Result<DirFd, NetDirError> {
        let fd = self.fd.try_clone().map_err(|e| NetDirError::Io {
            op: "duplicate",
            path: self.path.clone(),
            errno: io_errno(&e),
        })?;
        Ok(DirFd {
            fd,
            path: self.path.clone(),
        })
    }

    pub(crate) fn io(&self, op: &'static str, path: &Path, errno: Errno) -> NetDirError {
        NetDirError::Io {
            op,
            path: path.to_owned(),
            errno,
        }
    }
}

/// Replaces the content of the open file `fd`, which `stat` describes, with `bytes` in place:
/// written over from offset 0, then shrunk only if the old content was longer, never truncated to
/// zero (see [`DirFd::overwrite`] for why). The failed step's name with its errno.
pub(crate) fn rewrite_in_place(
    fd: &OwnedFd,
    stat: &rustix::fs::Stat,
    bytes: &[u8],
) -> Result<(), (&'static str, Errno)> {
    pwrite_all(fd, bytes).map_err(|errno| ("write", errno))?;
    if u64::try_from(stat.st_size).unwrap_or(0) > bytes.len() as u64 {
        rustix::fs::ftruncate(fd, bytes.len() as u64).map_err(|errno| ("truncate", errno))?;
    }
    Ok(())
}

/// Writes all of `bytes` at offset 0.
fn pwrite_all(fd: &OwnedFd, bytes: &[u8]) -> Result<(), Errno> {
    let mut written = 0;
    while written < bytes.len() {
        let rest = bytes.get(written..).unwrap_or_default();
        match rustix::io::pwrite(fd, rest, written as u64) {
            Ok(0) => return Err(Errno::IO),
            Ok(n) => written += n,
            Err(Errno::INTR) => {}
            Err(errno) => return Err(errno),
        }
    }
    Ok(())
}

fn io_errno(e: &std::io::Error) -> Errno {
    Errno::from_io_error(e).unwrap_or(Errno::IO)
}

/// An open sub-directory of a network directory (e.g. `reserved/<namespace>` or `.ipkeep/tmp`).
#[derive(Debug)]
pub struct SubDir {
    dir: DirFd,
}

impl Deref for SubDir {
    type Target = DirFd;
    fn deref(&self) -> &DirFd {
        &self.dir
    }
}

impl SubDir {
    /// The sub-directory's file descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.dir.fd()
    }

    /// The sub-directory's path (for messages).
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};

    use tempfile::TempDir;

    use crate::NetworkDir;

    #[test]
    fn read_write_remove_list() {
        let s = TempDir::new().unwrap();
        let dir = NetworkDir::open(s.path(), "net1").unwrap();
        assert_eq!(dir.read_file("x", 10).unwrap(), None);
        dir.write_atomic("x", b"hello", 0o600, true).unwrap();
        assert_eq!(
            dir.read_file("x", 10).unwrap().as_deref(),
            Some(&b"hello"[..])
        );
        assert!(matches!(
            dir.read_file("x", 4),
            Err(NetDirError::TooLarge { .. })
        ));
        dir.write_atomic("x", b"bye", 0o600, false).unwrap();
        assert_eq!(
            dir.read_file("x", 10).unwrap().as_deref(),
            Some(&b"bye"[..])
        );
        assert_eq!(dir.list().unwrap(), vec!["x".to_owned()]);
        assert!(dir.remove("x").unwrap());
        assert!(!dir.remove("x").unwrap());
        assert!(dir.list().unwrap().is_empty());
        assert!(dir.write_atomic("../escape", b"x", 0o600, false).is_err());
        assert!(!s.path().join("escape").exists());
    }

    #[test]
    fn read_refuses_symlinks_and_dirs() {
        let s = TempDir::new().unwrap();
        let dir = NetworkDir::open(s.path(), "net1").unwrap();
        std::fs::write(s.path().join("secret"), b"secret").unwrap();
        symlink(s.path().join("secret"), s.path().join("net1/link")).unwrap();
        std::fs::create_dir(s.path().join("net1/d")).unwrap();
        assert!(matches!(
            dir.read_file("link", 100),
            Err(NetDirError::Symlink { .. })
        ));
        assert!(matches!(
            dir.read_file("d", 100),
            Err(NetDirError::NotRegular { .. })
        ));
        let mut kinds = dir.entries().unwrap();
        kinds.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(
            kinds,
            vec![
                DirEntry {
                    name: "d".into(),
                    kind: EntryKind::Dir
                },
                DirEntry {
                    name: "link".into(),
                    kind: EntryKind::Symlink
                },
            ]
        );
        // Removing a symlink removes the link, never its target.
        assert!(dir.remove("link").unwrap());
        assert!(s.path().join("secret").exists());
    }

    #[test]
    fn subdirs_are_created_and_never_followed() {
        let s = TempDir::new().unwrap();
        let dir = NetworkDir::open(s.path(), "net1").unwrap();
        assert!(dir.subdir(&["reserved", "ns"], false).unwrap().is_none());
        let sub = dir.subdir(&["reserved", "ns"], true).unwrap().unwrap();
        assert_eq!(sub.path(), s.path().join("net1/reserved/ns"));
        sub.write_atomic("pod", b"{}", 0o644, true).unwrap();
        assert!(s.path().join("net1/reserved/ns/pod").is_file());
        std::fs::create_dir(s.path().join("outside")).unwrap();
        symlink(
            s.path().join("outside"),
            s.path().join("net1/reserved/evil"),
        )
        .unwrap();
        let err = dir.subdir(&["reserved", "evil"], true).unwrap_err();
        assert!(matches!(err, NetDirError::Symlink { .. }), "{err}");
        assert!(dir.subdir(&["reserved", ".."], true).is_err());
    }

    #[test]
    fn overwrite_rewrites_in_place_and_never_writes_through_a_link() {
        let s = TempDir::new().unwrap();
        let dir = NetworkDir::open(s.path(), "net1").unwrap();
        let path = s.path().join("net1/last_reserved_ip.0");
        // Created with the mode, then grown, then shrunk: the content is always exactly the bytes.
        for content in ["10.1.0.9", "10.1.0.10", "10.1.0.8", "fd00::1234:5678"] {
            dir.overwrite("last_reserved_ip.0", content.as_bytes(), 0o600)
                .unwrap();
            assert_eq!(std::fs::read_to_string(&path).unwrap(), content);
        }
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // A planted symlink is replaced by a regular file; its target is untouched.
        std::fs::write(s.path().join("victim"), b"keep").unwrap();
        std::fs::remove_file(&path).unwrap();
        symlink(s.path().join("victim"), &path).unwrap();
        dir.overwrite("last_reserved_ip.0", b"10.1.0.2", 0o600)
            .unwrap();
        assert_eq!(std::fs::read(s.path().join("victim")).unwrap(), b"keep");
        assert!(std::fs::symlink_metadata(&path).unwrap().is_file());
        assert_eq!(std::fs::read(&path).unwrap(), b"10.1.0.2");
        // A directory at the name is an error, as for host-local.
        std::fs::create_dir(s.path().join("net1/last_reserved_ip.1")).unwrap();
        assert!(
            dir.overwrite("last_reserved_ip.1", b"10.1.0.2", 0o600)
                .is_err()
        );
        assert!(dir.overwrite("../escape", b"x", 0o600).is_err());
        assert!(!s.path().join("escape").exists());
    }

    #[test]
    fn overwrite_never_writes_through_a_hard_link() {
        let s = TempDir::new().unwrap();
        let dir = NetworkDir::open(s.path(), "net1").unwrap();
        let victim = s.path().join("victim");
        std::fs::write(&victim, b"precious content").unwrap();
        let path = s.path().join("net1/last_reserved_ip.0");
        std::fs::hard_link(&victim, &path).unwrap();
        dir.overwrite("last_reserved_ip.0", b"10.1.0.2", 0o600)
            .unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious content");
        assert_eq!(std::fs::read(&path).unwrap(), b"10.1.0.2");
    }

    #[test]
    fn stale_temps_are_removed() {
        let s = TempDir::new().unwrap();
        let dir = NetworkDir::open(s.path(), "net1").unwrap();
        std::fs::write(s.path().join(format!("net1/{TEMP_PREFIX}1-1")), b"x").unwrap();
        std::fs::write(s.path().join("net1/keep"), b"x").unwrap();
        assert_eq!(dir.remove_stale_temps().unwrap(), 1);
        assert_eq!(dir.list().unwrap(), vec!["keep".to_owned()]);
    }
}
