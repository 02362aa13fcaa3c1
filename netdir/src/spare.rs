//! Spare files: the inode of a file [`DirFd::retire`] removes, kept empty under `spare.N` for the
//! next [`DirFd::create_exclusive_in`] or [`DirFd::write_atomic_in`] through that directory to
//! rewrite instead of creating an inode (`retire` says why).

use std::os::fd::OwnedFd;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::dirfd::rewrite_in_place;
use crate::{DirFd, NetDirError, check_name};

/// The prefix of the spare files [`DirFd::retire`] keeps for the next creation (`spare.0`, …);
/// such names never parse as an IP, like [`TEMP_PREFIX`](crate::TEMP_PREFIX)'s.
pub const SPARE_PREFIX: &str = "spare.";

/// At most this many spares per directory: a dual-stack container's ADD uses three files.
pub const SPARES: usize = 4;

/// Largest file kept or taken as a spare: an allocation file or an index record.
const SPARE_MAX_LEN: i64 = 4096;

impl DirFd {
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
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};

    use tempfile::TempDir;

    use crate::NetworkDir;

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
}
