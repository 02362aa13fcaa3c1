//! The one rule for a name that becomes a path component below the network directory.

use crate::NetDirError;

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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn names_are_single_components() {
        for bad in ["", ".", "..", "a/b", "/x", "a\0b"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        for good in ["10.1.0.2", "fd00::2", "lock", ".ipkeep", "..."] {
            assert!(check_name(good).is_ok(), "{good:?}");
        }
    }
}
