//! `ipkeep-operator install-cni`: atomic install, identical binary kept, leftovers cleaned,
//! safe to re-run, and a concurrent reader never sees a half-written binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ipkeep_operator::install_cni::{Outcome, TEMP_PREFIX, install};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ipkeep-install-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("image")).unwrap();
    dir
}

fn write_source(dir: &Path, bytes: &[u8]) -> PathBuf {
    let src = dir.join("image/ipkeep");
    fs::write(&src, bytes).unwrap();
    src
}

#[test]
fn installs_keeps_identical_and_replaces_changed() {
    let dir = scratch("basic");
    let bin = dir.join("host/opt/cni/bin");
    let src = write_source(&dir, b"\x7fELF version 1");

    assert_eq!(install(&src, &bin, None).unwrap(), Outcome::Installed);
    let dest = bin.join("ipkeep");
    let meta = fs::metadata(&dest).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o755);
    assert_eq!(fs::read(&dest).unwrap(), b"\x7fELF version 1");

    // Identical: same inode, not rewritten.
    assert_eq!(install(&src, &bin, None).unwrap(), Outcome::Unchanged);
    assert_eq!(fs::metadata(&dest).unwrap().ino(), meta.ino());

    // Changed: a new inode with the new content.
    write_source(&dir, b"\x7fELF version 2, longer");
    assert_eq!(install(&src, &bin, None).unwrap(), Outcome::Replaced);
    assert_ne!(fs::metadata(&dest).unwrap().ino(), meta.ino());
    assert_eq!(fs::read(&dest).unwrap(), b"\x7fELF version 2, longer");

    // Same bytes but a wrong mode is fixed.
    fs::set_permissions(&dest, fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(install(&src, &bin, None).unwrap(), Outcome::Replaced);
    assert_eq!(
        fs::metadata(&dest).unwrap().permissions().mode() & 0o777,
        0o755
    );

    let names: Vec<_> = fs::read_dir(&bin)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["ipkeep"], "nothing but the binary is left");
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn leftovers_cleaned_and_symlinks_replaced_not_followed() {
    let dir = scratch("leftovers");
    let bin = dir.join("bin");
    fs::create_dir_all(&bin).unwrap();
    let src = write_source(&dir, b"new binary");
    fs::write(bin.join(format!("{TEMP_PREFIX}4242-ipkeep")), b"half a bin").unwrap();
    fs::write(dir.join("victim"), b"do not touch").unwrap();
    std::os::unix::fs::symlink(dir.join("victim"), bin.join("ipkeep")).unwrap();
    fs::write(bin.join("bridge"), b"another plugin").unwrap();

    assert_eq!(install(&src, &bin, None).unwrap(), Outcome::Replaced);
    assert_eq!(fs::read(dir.join("victim")).unwrap(), b"do not touch");
    assert!(fs::symlink_metadata(bin.join("ipkeep")).unwrap().is_file());
    assert_eq!(fs::read(bin.join("ipkeep")).unwrap(), b"new binary");
    let mut names: Vec<_> = fs::read_dir(&bin)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["bridge", "ipkeep"]);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn refuses_bad_sources_and_names() {
    let dir = scratch("refuse");
    let bin = dir.join("bin");
    let err = install(&dir.join("image/missing"), &bin, None).unwrap_err();
    assert!(
        err.to_string().contains("failed to read the plugin binary"),
        "{err}"
    );
    let err = install(&dir.join("image"), &bin, None).unwrap_err();
    assert!(
        err.to_string().contains("failed to read the plugin binary"),
        "{err}"
    );
    let src = write_source(&dir, b"x");
    for bad in ["..", "a/b", "", &format!("{TEMP_PREFIX}x")] {
        let err = install(&src, &bin, Some(bad)).unwrap_err();
        assert!(
            err.to_string().contains("single path component"),
            "{bad:?}: {err}"
        );
    }
    fs::create_dir_all(bin.join("ipkeep")).unwrap();
    let err = install(&src, &bin, None).unwrap_err();
    let source = std::error::Error::source(&err).map(ToString::to_string);
    assert!(err.to_string().contains("failed to replace"), "{err}");
    assert_eq!(source.as_deref(), Some("a directory is in the way"));
    fs::remove_dir_all(&dir).unwrap();
}

/// A reader opening the binary in a loop while two versions are installed alternately sees
/// one whole version or the other, never a mix or a short file.
#[test]
fn a_concurrent_reader_never_sees_a_half_written_binary() {
    let dir = scratch("atomic");
    let bin = dir.join("bin");
    let v1 = vec![b'1'; 4 << 20];
    let v2 = vec![b'2'; 3 << 20];
    let src = write_source(&dir, &v1);
    install(&src, &bin, None).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        let dest = bin.join("ipkeep");
        std::thread::spawn(move || {
            let mut reads = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let bytes = fs::read(&dest).expect("the binary is always there");
                let whole_v1 = bytes.len() == 4 << 20 && bytes.iter().all(|&b| b == b'1');
                let whole_v2 = bytes.len() == 3 << 20 && bytes.iter().all(|&b| b == b'2');
                assert!(whole_v1 || whole_v2, "torn binary of {} bytes", bytes.len());
                reads += 1;
            }
            reads
        })
    };
    for i in 0..20 {
        write_source(&dir, if i % 2 == 0 { &v2 } else { &v1 });
        assert_eq!(install(&src, &bin, None).unwrap(), Outcome::Replaced);
    }
    stop.store(true, Ordering::Relaxed);
    let reads = reader.join().unwrap();
    assert!(reads > 0, "the reader never read");
    fs::remove_dir_all(&dir).unwrap();
}

/// The subcommand as the init container runs it, twice.
#[test]
fn the_subcommand_is_safe_to_rerun() {
    let dir = scratch("cli");
    let src = write_source(&dir, b"plugin");
    let bin = dir.join("host/bin");
    let run = || {
        let out = Command::new(env!("CARGO_BIN_EXE_ipkeep-operator"))
            .args(["install-cni", "--from"])
            .arg(&src)
            .arg("--to")
            .arg(&bin)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stderr).unwrap()
    };
    assert!(run().contains("installed"));
    assert!(run().contains("up to date"));
    assert_eq!(fs::read(bin.join("ipkeep")).unwrap(), b"plugin");
    fs::remove_dir_all(&dir).unwrap();
}
