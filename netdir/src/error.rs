//! The directory layer's one error type; the variants for the steps host-local also performs
//! print Go's text (see the crate's docs).

use std::path::PathBuf;

use rustix::io::Errno;

use crate::go_errno_text;

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
    /// A symbolic link on the way to the data directory belongs to a user other than root (or
    /// the plugin's own user): an unprivileged user could have planted it to move ipkeep's state.
    #[error(
        "failed to use the data directory {}: {} is a symbolic link owned by uid {uid}, not root; ipkeep follows only root's links there (replace it with root's own or set dataDir to the real directory)",
        data_dir.display(),
        link.display()
    )]
    UntrustedSymlink {
        /// The data directory as configured.
        data_dir: PathBuf,
        /// The symlink.
        link: PathBuf,
        /// Its owner.
        uid: u32,
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
