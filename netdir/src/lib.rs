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
//!
//! # Modules
//! * `network.rs`: the network directory and its lock.
//! * `dirfd.rs`: an open directory and everything done relative to its descriptor; `entry.rs`:
//!   what `lstat` says of an entry.
//! * `spare.rs`: the spare files a creation rewrites instead of making a new inode.
//! * `name.rs`: the one rule for a path component; `go_text.rs`: host-local's Go texts and path
//!   rules; `error.rs`: the layer's error.

mod dirfd;
mod entry;
mod error;
mod go_text;
mod name;
mod network;
mod spare;

pub use dirfd::{DirFd, SubDir, TEMP_PREFIX};
pub use entry::{DirEntry, EntryKind, FileStat};
pub use error::NetDirError;
pub use go_text::{go_clean, go_errno_text, go_join};
pub use name::check_name;
pub use network::{NetworkDir, NetworkLock};
pub use spare::{SPARE_PREFIX, SPARES};
