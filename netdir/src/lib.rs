//! Safe access to one network's state directory, `<dataDir>/<network>/`.
//!
//! Everything below the network directory is reached relative to an open directory file
//! descriptor and never through a symbolic link (`O_NOFOLLOW`, `AT_SYMLINK_NOFOLLOW`), so a
//! symlink planted in the state directory cannot make the plugin (which runs as root) read or
//! write anywhere else. Every name handed to this crate must be a single path component; it is
//! checked here again even though callers validate their own names, because this is the last line
//! before the file system.
//!
//! The data directory itself (`dataDir`) is chosen by the administrator and may legitimately be
//! (or sit below) a symlink, so it is created and opened the way host-local does, following links.
//!
//! Error texts for the steps host-local also performs (creating the directories, opening `lock`)
//! are Go's `*os.PathError` texts (`mkdir <path>: not a directory`), because host-local prints them
//! as its CNI error message and ipkeep must print the same bytes.

use std::fs::File;
use std::io::{Read, Write};
use std::ops::Deref;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use rustix::fs::{AtFlags, FileType, FlockOperation, Mode, OFlags};
use rustix::io::Errno;

/// The prefix of every temporary file this crate creates; such names never parse as an IP.
pub const TEMP_PREFIX: &str = ".ipkeep-tmp-";

/// The prefix of the spare files [`DirFd::retire`] keeps for the next creation (`spare.0`, …);
/// such names never parse as an IP either.
pub const SPARE_PREFIX: &str = "spare.";

/// At most this many spares per directory: a dual-stack container's ADD uses three files.
pub const SPARES: usize = 4;

/// Largest file kept or taken as a spare: an allocation file or an index record.
const SPARE_MAX_LEN: i64 = 4096;

/// Name of the lock file host-local and ipkeep both `flock`.
const LOCK_NAME: &str = "lock";

/// Distinguishes temporary files created by one process.
static TEMP_COUNTER: AtomicU32 = AtomicU32::new(0);

/// Errors of the network directory layer.
#[derive(Debug, thiserror::Error)]
pub enum NetDirError {
    /// Creating a directory failed; Go's `os.MkdirAll` text, printed by host-local verbatim.
    #[error("mkdir {}: {}", path.display(), go_errno_text(*errno))]
    Mkdir {
        /// The directory that could not be created.
        path: PathBuf,
        /// The system error.
        errno: Errno,
    },
    /// Opening a file or directory failed; Go's `os.OpenFile` text, printed by host-local verbatim.
    #[error("open {}: {}", path.display(), go_errno_text(*errno))]
    Open {
        /// The file that could not be opened.
        path: PathBuf,
        /// The system error.
        errno: Errno,
    },
    /// A symbolic link sits where ipkeep expects a file or directory of its own.
    #[error("failed to open {}: it is a symbolic link, which ipkeep never follows", path.display())]
    Symlink {
        /// The symlink.
        path: PathBuf,
    },
    /// Something other than a regular file sits where a file is expected.
    #[error("failed to read {}: not a regular file", path.display())]
    NotRegular {
        /// The entry.
        path: PathBuf,
    },
    /// Something other than a directory sits where a directory is expected.
    #[error("failed to open {}: not a directory", path.display())]
    NotDirectory {
        /// The entry.
        path: PathBuf,
    },
    /// A file is larger than its caller allows.
    #[error("failed to read {}: larger than {max_len} bytes", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The limit.
        max_len: usize,
    },
    /// A name is not a single, plain path component.
    #[error("failed to use {name:?} as a file name: {reason}")]
    InvalidName {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// Any other system call failed.
    #[error("failed to {op} {}: {}", path.display(), go_errno_text(*errno))]
    Io {
        /// What was being done (`read`, `write`, `rename`, `lock`, …).
        op: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The system error.
        errno: Errno,
    },
}

/// Go's text for a system error: the C library's message with a lower-case first letter
/// (Go's `syscall.Errno` table is the lower-cased glibc table: `no such file or directory`).
pub fn go_errno_text(errno: Errno) -> String {
    let text = std::io::Error::from_raw_os_error(errno.raw_os_error()).to_string();
    let text = match text.rfind(" (os error ") {
        Some(end) => &text[..end],
        None => text.as_str(),
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// Checks that `name` is one plain path component (no `/`, no NUL, not `.`/`..`, not empty).
pub fn check_name(name: &str) -> Result<(), NetDirError> {
    let reason = if name.is_empty() {
        "empty"
    } else if name == "." || name == ".." {
        "is . or .."
    } else if name.contains('/') {
        "contains /"
    } else if name.contains('\0') {
        "contains NUL"
    } else if name.len() > 255 {
        "longer than 255 bytes"
    } else {
        return Ok(());
    };
    Err(NetDirError::InvalidName {
        name: name.to_owned(),
        reason,
    })
}

/// Go's `filepath.Join(dir, name)`: the cleaned path host-local prints in its messages.
pub fn go_join(dir: &Path, name: &str) -> PathBuf {
    let joined = format!("{}/{}", dir.to_string_lossy(), name);
    PathBuf::from(go_clean(&joined))
}

/// Go's `filepath.Clean` (lexical: collapses `//`, removes `.`, resolves `..` against the prefix).
pub fn go_clean(path: &str) -> String {
    if path.is_empty() {
        return ".".to_owned();
    }
    let rooted = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|p| *p != "..") {
                    parts.pop();
                } else if !rooted {
                    parts.push("..");
                }
            }
            other => parts.push(other),
        }
    }
    let body = parts.join("/");
    match (rooted, body.is_empty()) {
        (true, _) => format!("/{body}"),
        (false, true) => ".".to_owned(),
        (false, false) => body,
    }
}

/// What kind of entry a directory listing found (never following symlinks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A FIFO, socket, device or an entry whose type could not be determined.
    Other,
}

/// One entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// The entry's name (entries whose name is not UTF-8 are left out of listings).
    pub name: String,
    /// Its kind, as `lstat` sees it.
    pub kind: EntryKind,
}

/// The identity and change times of a file system object (from `lstat`/`fstat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStat {
    /// Device number.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i128,
    /// Status change time, nanoseconds since the epoch.
    pub ctime_ns: i128,
    /// Its kind.
    pub kind: EntryKind,
    /// Permission bits.
    pub mode: u32,
    /// Size in bytes.
    pub size: u64,
    /// Number of hard links.
    pub nlink: u64,
}

impl FileStat {
    /// The stamp of an `lstat`/`fstat` result.
    pub fn from_stat(st: &rustix::fs::Stat) -> Self {
        let kind = kind_of(FileType::from_raw_mode(st.st_mode as _));
        #[allow(clippy::unnecessary_cast)]
        Self {
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
            mtime_ns: i128::from(st.st_mtime as i64) * 1_000_000_000
                + i128::from(st.st_mtime_nsec as i64),
            ctime_ns: i128::from(st.st_ctime as i64) * 1_000_000_000
                + i128::from(st.st_ctime_nsec as i64),
            kind,
            mode: (st.st_mode as u32) & 0o7777,
            size: st.st_size as u64,
            nlink: st.st_nlink as u64,
        }
    }
}

fn kind_of(t: FileType) -> EntryKind {
    match t {
        FileType::RegularFile => EntryKind::File,
        FileType::Directory => EntryKind::Dir,
        FileType::Symlink => EntryKind::Symlink,
        _ => EntryKind::Other,
    }
}

/// An open directory: the operations shared by [`NetworkDir`] and [`SubDir`], all relative to
/// its file descriptor and none following a symlink.
#[derive(Debug)]
pub struct DirFd {
    fd: OwnedFd,
    path: PathBuf,
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

    /// Creates `name` in `target` with `bytes` as content, exclusively (like `O_EXCL`) and without
    /// the file ever being visible half-written: a temporary file is written in this directory,
    /// then hard-linked to `target/name` (a spare [`DirFd::retire`] left here is rewritten instead
    /// when there is one). Returns `false` if `name` already exists (whatever its type). The
    /// temporary file is removed in every case.
    ///
    /// Not fsync'd: a process killed at any instant leaves either no file or the whole file, which
    /// is what the allocation files need (see `disk_store`'s module docs for why a power loss
    /// does not make their durability matter).
    pub fn create_exclusive_in(
        &self,
        target: &DirFd,
        name: &str,
        bytes: &[u8],
        mode: u32,
    ) -> Result<bool, NetDirError> {
        check_name(name)?;
        // A spare whose link failed is removed too: host-local would read its content as this
        // container's allocation.
        let temp = self.spare_or_temp(bytes, mode)?;
        let linked =
            rustix::fs::linkat(&self.fd, temp.as_str(), &target.fd, name, AtFlags::empty());
        let _ = rustix::fs::unlinkat(&self.fd, temp.as_str(), AtFlags::empty());
        match linked {
            Ok(()) => Ok(true),
            Err(Errno::EXIST) => Ok(false),
            Err(errno) => Err(target.io("create", &target.child_path(name), errno)),
        }
    }

    /// Replaces `target/name` with `bytes` through a rename from this directory (a spare, else a
    /// fresh temporary file, removed if the rename fails), without fsync: for a cache record that
    /// is rebuilt whenever in doubt. Readers see the old or the new content, never a mix.
    pub fn write_atomic_in(
        &self,
        target: &DirFd,
        name: &str,
        bytes: &[u8],
        mode: u32,
    ) -> Result<(), NetDirError> {
        check_name(name)?;
        let temp = self.spare_or_temp(bytes, mode)?;
        if let Err(errno) = rustix::fs::renameat(&self.fd, temp.as_str(), &target.fd, name) {
            let _ = rustix::fs::unlinkat(&self.fd, temp.as_str(), AtFlags::empty());
            return Err(target.io("rename", &target.child_path(name), errno));
        }
        Ok(())
    }

    /// Removes the file `name`, keeping its inode as an empty spare in `spares` (moved there under
    /// a free `spare.N` name, never replacing one, then truncated) for the next
    /// [`DirFd::create_exclusive_in`] or [`DirFd::write_atomic_in`] from `spares`: creating an inode
    /// costs tens of µs on ext4, renaming and rewriting one a few. Removed outright when every
    /// spare name is taken or the file system cannot rename without replacing. `false` if `name`
    /// did not exist.
    ///
    /// Emptied because host-local reads every file below the network directory, `.ipkeep/`
    /// included, and takes one holding `<containerID>\r\n<ifname>` for that container's
    /// allocation. A process killed between the rename and the truncation leaves a spare with the
    /// old content, under ipkeep's dirty stamp: the next ipkeep command's rebuild removes it.
    pub fn retire(&self, name: &str, spares: &DirFd) -> Result<bool, NetDirError> {
        check_name(name)?;
        for slot in 0..SPARES {
            let spare = format!("{SPARE_PREFIX}{slot}");
            match rustix::fs::renameat_with(
                &self.fd,
                name,
                &spares.fd,
                spare.as_str(),
                rustix::fs::RenameFlags::NOREPLACE,
            ) {
                Ok(()) => {
                    if !spares.empty_in_place(&spare) {
                        spares.remove_tree(&spare, 16)?;
                    }
                    return Ok(true);
                }
                Err(Errno::EXIST) => {}
                Err(_) => break,
            }
        }
        self.remove(name)
    }

    /// Truncates `name` to zero if it is a regular file with one link; whether it did. Never opens
    /// anything else.
    fn empty_in_place(&self, name: &str) -> bool {
        rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)
            .ok()
            .and_then(|st| self.open_single_file(name, &st))
            .is_some_and(|fd| rustix::fs::ftruncate(&fd, 0).is_ok())
    }

    /// `name`, which `lstat` found as `st`, opened for writing if it is a regular file of at most
    /// [`SPARE_MAX_LEN`] bytes with one link, and the open file is still that one: never opened
    /// when `lstat` says it is anything else, never followed.
    fn open_single_file(&self, name: &str, st: &rustix::fs::Stat) -> Option<OwnedFd> {
        let single = |st: &rustix::fs::Stat| {
            FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
                && st.st_nlink == 1
                && st.st_size <= SPARE_MAX_LEN
        };
        if !single(st) {
            return None;
        }
        let flags = OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&self.fd, name, flags, Mode::empty()).ok()?;
        let now = rustix::fs::fstat(&fd).ok()?;
        (now.st_dev == st.st_dev && now.st_ino == st.st_ino && single(&now)).then_some(fd)
    }

    /// `bytes` in a file of this directory that nothing else names: a spare rewritten in place if
    /// one is usable, else a fresh temporary file.
    fn spare_or_temp(&self, bytes: &[u8], mode: u32) -> Result<String, NetDirError> {
        match self.rewrite_spare(bytes, mode) {
            Some(name) => Ok(name),
            None => self.write_temp(bytes, mode, false),
        }
    }

    /// Rewrites the first usable spare with `bytes` and returns its name. Usable: a regular file
    /// with one link, at most [`SPARE_MAX_LEN`] bytes, no permission beyond `mode` and readable and
    /// writable by its owner; anything else at a spare's name is removed (never opened unless
    /// `lstat` called it a regular file, never followed). Written in place, truncated only to a
    /// non-zero length (see [`DirFd::overwrite`] for why not to zero); one that cannot be written
    /// is removed.
    fn rewrite_spare(&self, bytes: &[u8], mode: u32) -> Option<String> {
        let wanted = mode & 0o7777;
        for slot in 0..SPARES {
            let name = format!("{SPARE_PREFIX}{slot}");
            let Ok(st) = rustix::fs::statat(&self.fd, name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
            else {
                continue;
            };
            let perm = st.st_mode & 0o7777;
            if perm & !wanted == 0
                && perm & 0o600 == 0o600
                && let Some(fd) = self.open_single_file(&name, &st)
                && rewrite_in_place(&fd, &st, bytes).is_ok()
            {
                return Some(name);
            }
            let _ = self.remove_tree(&name, 16);
        }
        None
    }

    /// Writes `bytes` to a fresh temporary file in this directory and returns its name.
    fn write_temp(&self, bytes: &[u8], mode: u32, fsync: bool) -> Result<String, NetDirError> {
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

    fn open_child_dir(&self, name: &str, create: bool) -> Result<Option<DirFd>, NetDirError> {
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

    fn io(&self, op: &'static str, path: &Path, errno: Errno) -> NetDirError {
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
fn rewrite_in_place(
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
        // Fast path (every call after the first): the network directory already exists.
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let data_fd = match rustix::fs::open(&data_clean, flags, Mode::empty()) {
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

/// Go's `os.MkdirAll(path, 0755)` with its exact error texts.
fn go_mkdir_all(path: &Path) -> Result<(), NetDirError> {
    match rustix::fs::stat(path) {
        Ok(st) if kind_of(FileType::from_raw_mode(st.st_mode as _)) == EntryKind::Dir => {
            return Ok(());
        }
        Ok(_) => {
            return Err(NetDirError::Mkdir {
                path: path.to_owned(),
                errno: Errno::NOTDIR,
            });
        }
        Err(_) => {}
    }
    if let Some(parent) = path.parent()
        && !parent.as_os_str().is_empty()
        && parent != Path::new("/")
    {
        go_mkdir_all(parent)?;
    }
    match rustix::fs::mkdir(path, Mode::from_bits_truncate(0o755)) {
        Ok(()) => Ok(()),
        Err(errno) => match rustix::fs::lstat(path) {
            Ok(st) if kind_of(FileType::from_raw_mode(st.st_mode as _)) == EntryKind::Dir => Ok(()),
            _ => Err(NetDirError::Mkdir {
                path: path.to_owned(),
                errno,
            }),
        },
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

    #[test]
    fn go_clean_matches_go() {
        for (input, want) in [
            ("/a/b/", "/a/b"),
            ("/a//b/./c/..", "/a/b"),
            ("a/../..", ".."),
            ("", "."),
            ("/../x", "/x"),
            ("./d", "d"),
        ] {
            assert_eq!(go_clean(input), want, "{input}");
        }
    }

    #[test]
    fn errno_text_is_go_style() {
        assert_eq!(go_errno_text(Errno::NOENT), "no such file or directory");
        assert_eq!(go_errno_text(Errno::NOTDIR), "not a directory");
        assert_eq!(go_errno_text(Errno::ISDIR), "is a directory");
    }

    #[test]
    fn names_are_single_components() {
        for bad in ["", ".", "..", "a/b", "/x", "a\0b"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        for good in ["10.1.0.2", "fd00::2", "lock", ".ipkeep", "..."] {
            assert!(check_name(good).is_ok(), "{good:?}");
        }
    }

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
    fn exclusive_create_links_complete_files_only_once() {
        let s = TempDir::new().unwrap();
        let dir = NetworkDir::open(s.path(), "net1").unwrap();
        let tmp = dir.subdir(&[".ipkeep", "tmp"], true).unwrap().unwrap();
        assert!(
            tmp.create_exclusive_in(&dir, "10.1.0.2", b"c1\r\neth0", 0o600)
                .unwrap()
        );
        assert!(
            !tmp.create_exclusive_in(&dir, "10.1.0.2", b"c2\r\neth0", 0o600)
                .unwrap()
        );
        assert_eq!(
            std::fs::read(s.path().join("net1/10.1.0.2")).unwrap(),
            b"c1\r\neth0"
        );
        assert!(tmp.list().unwrap().is_empty(), "temporaries are cleaned up");
        // A symlink at the target name blocks it and is not followed.
        symlink(s.path().join("victim"), s.path().join("net1/10.1.0.3")).unwrap();
        assert!(
            !tmp.create_exclusive_in(&dir, "10.1.0.3", b"c3\r\neth0", 0o600)
                .unwrap()
        );
        assert!(!s.path().join("victim").exists());
    }

    #[test]
    fn retired_files_are_reused_as_empty_spares_and_bounded() {
        use std::os::unix::fs::MetadataExt;
        let s = TempDir::new().unwrap();
        let dir = NetworkDir::open(s.path(), "net1").unwrap();
        let tmp = dir.subdir(&[".ipkeep", "tmp"], true).unwrap().unwrap();
        let inode = |rel: &str| std::fs::metadata(s.path().join(rel)).unwrap().ino();
        assert!(
            tmp.create_exclusive_in(&dir, "10.1.0.2", b"c1\r\neth0", 0o600)
                .unwrap()
        );
        let first = inode("net1/10.1.0.2");
        assert!(dir.retire("10.1.0.2", &tmp).unwrap());
        assert!(!dir.retire("10.1.0.2", &tmp).unwrap(), "already gone");
        // The spare is empty: host-local reads every file below the network directory.
        assert_eq!(tmp.list().unwrap(), vec![format!("{SPARE_PREFIX}0")]);
        assert!(std::fs::read(tmp.child_path("spare.0")).unwrap().is_empty());
        // The next creation rewrites the spare: the same inode, the new content, no spare left.
        assert!(
            tmp.create_exclusive_in(&dir, "10.1.0.3", b"c2\r\neth1", 0o600)
                .unwrap()
        );
        assert_eq!(inode("net1/10.1.0.3"), first);
        assert_eq!(
            std::fs::read(s.path().join("net1/10.1.0.3")).unwrap(),
            b"c2\r\neth1"
        );
        assert!(tmp.list().unwrap().is_empty());
        // A failed creation removes the spare it used: its content names a container.
        assert!(dir.retire("10.1.0.3", &tmp).unwrap());
        std::fs::write(s.path().join("net1/10.1.0.4"), b"x").unwrap();
        assert!(
            !tmp.create_exclusive_in(&dir, "10.1.0.4", b"c3\r\neth0", 0o600)
                .unwrap()
        );
        assert!(tmp.list().unwrap().is_empty());
        // At most SPARES: further files are removed.
        for i in 0..SPARES + 2 {
            let name = format!("10.1.1.{i}");
            std::fs::write(dir.child_path(&name), b"c\r\neth0").unwrap();
            std::fs::set_permissions(
                dir.child_path(&name),
                std::fs::Permissions::from_mode(0o600),
            )
            .unwrap();
            assert!(dir.retire(&name, &tmp).unwrap());
            assert!(!dir.child_path(&name).exists());
        }
        assert_eq!(tmp.list().unwrap().len(), SPARES);
        // Replacing a record through a spare of another directory.
        let records = dir
            .subdir(&[".ipkeep", "containers"], true)
            .unwrap()
            .unwrap();
        tmp.write_atomic_in(&records, "c1", b"{}", 0o600).unwrap();
        assert_eq!(std::fs::read(records.child_path("c1")).unwrap(), b"{}");
        assert_eq!(tmp.list().unwrap().len(), SPARES - 1);
    }

    #[test]
    fn spares_that_ipkeep_did_not_leave_are_removed_never_followed_or_written_through() {
        let s = TempDir::new().unwrap();
        let dir = NetworkDir::open(s.path(), "net1").unwrap();
        let tmp = dir.subdir(&[".ipkeep", "tmp"], true).unwrap().unwrap();
        let victim = s.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        // A symlink, a hard link to a file elsewhere, a file others may read, a directory.
        symlink(&victim, tmp.child_path("spare.0")).unwrap();
        std::fs::hard_link(&victim, tmp.child_path("spare.1")).unwrap();
        std::fs::write(tmp.child_path("spare.2"), b"").unwrap();
        std::fs::set_permissions(
            tmp.child_path("spare.2"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        std::fs::create_dir(tmp.child_path("spare.3")).unwrap();
        assert!(
            tmp.create_exclusive_in(&dir, "10.1.0.2", b"c1\r\neth0", 0o600)
                .unwrap()
        );
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert!(tmp.list().unwrap().is_empty(), "{:?}", tmp.list());
        // Retiring a hard-linked file moves the name, never truncating the other link's file.
        std::fs::hard_link(&victim, dir.child_path("10.1.0.3")).unwrap();
        assert!(dir.retire("10.1.0.3", &tmp).unwrap());
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert!(tmp.list().unwrap().is_empty());
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
