//! host-local's Go texts and path rules, byte for byte: a system error's text, `filepath.Join`
//! and `filepath.Clean`, `os.MkdirAll` and its errors.

use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode};
use rustix::io::Errno;

use crate::entry::kind_of;
use crate::{EntryKind, NetDirError};

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

/// Go's `os.MkdirAll(path, 0755)` with its exact error texts.
pub(crate) fn go_mkdir_all(path: &Path) -> Result<(), NetDirError> {
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

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
}
