//! What a directory holds, as `lstat` sees it: an entry's kind, a listing's entry, a file's stamp.

use rustix::fs::FileType;

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

pub(crate) fn kind_of(t: FileType) -> EntryKind {
    match t {
        FileType::RegularFile => EntryKind::File,
        FileType::Directory => EntryKind::Dir,
        FileType::Symlink => EntryKind::Symlink,
        _ => EntryKind::Other,
    }
}
