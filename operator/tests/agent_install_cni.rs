//! `ipkeep-operator install-cni`: atomic install, identical binary kept, leftovers cleaned,
//! safe to re-run, and a concurrent reader never sees a half-written binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ipkeep_operator::install_cni::{
    HOST_LOCAL, HOST_LOCAL_ORIG, InstallError, Outcome, Reclaim, Replacement, Restore, TEMP_PREFIX,
    install, reclaim_host_local, replace_host_local, restore_host_local,
};

/// `ipkeep-operator install-cni <args>`, which must succeed: what it said on stderr.
fn install_cni(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ipkeep-operator"))
        .arg("install-cni")
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "install-cni {args:?}: {out:?}");
    String::from_utf8(out.stderr).unwrap()
}

/// The `--to` argument for `bin`.
fn to(bin: &Path) -> String {
    format!("--to={}", bin.display())
}

/// A scratch directory (removed when dropped) with an `image/` in it, and its path.
fn scratch(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::Builder::new()
        .prefix(&format!("ipkeep-install-{name}-"))
        .tempdir()
        .unwrap();
    let dir = tmp.path().to_path_buf();
    fs::create_dir_all(dir.join("image")).unwrap();
    (tmp, dir)
}

fn write_source(dir: &Path, bytes: &[u8]) -> PathBuf {
    let src = dir.join("image/ipkeep");
    fs::write(&src, bytes).unwrap();
    src
}

#[test]
fn installs_keeps_identical_and_replaces_changed() {
    let (_tmp, dir) = scratch("basic");
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
}

#[test]
fn leftovers_cleaned_and_symlinks_replaced_not_followed() {
    let (_tmp, dir) = scratch("leftovers");
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
}

#[test]
fn refuses_bad_sources_and_names() {
    let (_tmp, dir) = scratch("refuse");
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
}

/// A reader opening the binary in a loop while two versions are installed alternately sees
/// one whole version or the other, never a mix or a short file.
#[test]
fn a_concurrent_reader_never_sees_a_half_written_binary() {
    let (_tmp, dir) = scratch("atomic");
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
}

/// The subcommand as the init container runs it, twice.
#[test]
fn the_subcommand_is_safe_to_rerun() {
    let (_tmp, dir) = scratch("cli");
    let src = write_source(&dir, b"plugin");
    let bin = dir.join("host/bin");
    let run = || install_cni(&[&format!("--from={}", src.display()), &to(&bin)]);
    assert!(run().contains("installed"));
    assert!(run().contains("up to date"));
    assert_eq!(fs::read(bin.join("ipkeep")).unwrap(), b"plugin");
}

fn host_local_dir(dir: &Path, original: &[u8]) -> PathBuf {
    let bin = dir.join("host/opt/cni/bin");
    fs::create_dir_all(&bin).unwrap();
    fs::write(bin.join(HOST_LOCAL), original).unwrap();
    fs::set_permissions(bin.join(HOST_LOCAL), fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// Replace keeps the original once (same inode), installs ipkeep as host-local; re-running
/// changes nothing and never keeps ipkeep as "the original"; restore puts the very same
/// original file back; restoring again does nothing.
#[test]
fn replace_keeps_the_original_once_and_restore_puts_it_back() {
    let (_tmp, dir) = scratch("replace");
    let bin = host_local_dir(&dir, b"the real host-local");
    let original_ino = fs::metadata(bin.join(HOST_LOCAL)).unwrap().ino();
    let src = write_source(&dir, b"ipkeep plugin");

    let done = replace_host_local(&src, &bin).unwrap();
    assert_eq!(
        done,
        Replacement {
            kept_original: true,
            installed: Outcome::Replaced
        }
    );
    assert_eq!(fs::read(bin.join(HOST_LOCAL)).unwrap(), b"ipkeep plugin");
    assert_eq!(
        fs::metadata(bin.join(HOST_LOCAL))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o755
    );
    let kept = fs::metadata(bin.join(HOST_LOCAL_ORIG)).unwrap();
    assert_eq!(kept.ino(), original_ino, "the original file itself is kept");
    assert_eq!(
        fs::read(bin.join(HOST_LOCAL_ORIG)).unwrap(),
        b"the real host-local"
    );

    // Again (a restarted init container, a new agent version): the kept original stays.
    let again = replace_host_local(&src, &bin).unwrap();
    assert_eq!(
        again,
        Replacement {
            kept_original: false,
            installed: Outcome::Unchanged
        }
    );
    write_source(&dir, b"ipkeep plugin v2");
    let upgraded = replace_host_local(&src, &bin).unwrap();
    assert_eq!(upgraded.installed, Outcome::Replaced);
    assert!(!upgraded.kept_original);
    assert_eq!(
        fs::read(bin.join(HOST_LOCAL_ORIG)).unwrap(),
        b"the real host-local"
    );
    assert_eq!(names_in(&bin), [HOST_LOCAL, HOST_LOCAL_ORIG]);

    assert_eq!(restore_host_local(&bin).unwrap(), Restore::Restored);
    assert_eq!(
        fs::read(bin.join(HOST_LOCAL)).unwrap(),
        b"the real host-local"
    );
    assert_eq!(
        fs::metadata(bin.join(HOST_LOCAL)).unwrap().ino(),
        original_ino
    );
    assert_eq!(names_in(&bin), [HOST_LOCAL]);
    assert_eq!(restore_host_local(&bin).unwrap(), Restore::NothingKept);
    assert_eq!(
        fs::read(bin.join(HOST_LOCAL)).unwrap(),
        b"the real host-local"
    );
}

/// k3s ships host-local as a symlink to its multi-call `cni` binary: the symlink itself is kept
/// and restored, the `cni` binary is never written.
#[test]
fn a_symlinked_host_local_is_kept_as_a_symlink() {
    let (_tmp, dir) = scratch("k3s");
    let bin = dir.join("bin");
    fs::create_dir_all(&bin).unwrap();
    fs::write(bin.join("cni"), b"k3s multi-call cni").unwrap();
    std::os::unix::fs::symlink("cni", bin.join(HOST_LOCAL)).unwrap();
    let src = write_source(&dir, b"ipkeep plugin");

    assert!(replace_host_local(&src, &bin).unwrap().kept_original);
    assert!(
        fs::symlink_metadata(bin.join(HOST_LOCAL))
            .unwrap()
            .is_file()
    );
    assert_eq!(fs::read(bin.join(HOST_LOCAL)).unwrap(), b"ipkeep plugin");
    assert_eq!(
        fs::read_link(bin.join(HOST_LOCAL_ORIG)).unwrap(),
        Path::new("cni")
    );
    assert_eq!(fs::read(bin.join("cni")).unwrap(), b"k3s multi-call cni");

    assert_eq!(restore_host_local(&bin).unwrap(), Restore::Restored);
    assert_eq!(
        fs::read_link(bin.join(HOST_LOCAL)).unwrap(),
        Path::new("cni")
    );
    assert_eq!(fs::read(bin.join("cni")).unwrap(), b"k3s multi-call cni");
    assert_eq!(names_in(&bin), ["cni", HOST_LOCAL]);
}

/// Refusals that would otherwise lose the original: no host-local to replace (wrong
/// directory), and host-local already ipkeep with no original kept.
#[test]
fn replace_refuses_when_the_original_cannot_be_kept() {
    let (_tmp, dir) = scratch("replace-refuse");
    let empty = dir.join("empty");
    fs::create_dir_all(&empty).unwrap();
    let src = write_source(&dir, b"ipkeep plugin");
    let err = replace_host_local(&src, &empty).unwrap_err();
    assert!(matches!(err, InstallError::NoHostLocal { .. }), "{err}");
    assert!(
        err.to_string().contains("there is no host-local there"),
        "{err}"
    );
    assert!(names_in(&empty).is_empty(), "nothing was installed");

    let bin = host_local_dir(&dir, b"ipkeep plugin");
    let err = replace_host_local(&src, &bin).unwrap_err();
    assert!(matches!(err, InstallError::OriginalLost { .. }), "{err}");
    assert_eq!(names_in(&bin), [HOST_LOCAL]);
    assert_eq!(fs::read(bin.join(HOST_LOCAL)).unwrap(), b"ipkeep plugin");
}

/// A replace killed between keeping the original (a hard link) and installing ipkeep leaves
/// two names for the original: restore (and a re-run replace) handle it.
#[test]
fn an_interrupted_replace_is_restored_or_finished() {
    let (_tmp, dir) = scratch("interrupted");
    let bin = host_local_dir(&dir, b"the real host-local");
    fs::hard_link(bin.join(HOST_LOCAL), bin.join(HOST_LOCAL_ORIG)).unwrap();
    assert_eq!(restore_host_local(&bin).unwrap(), Restore::Restored);
    assert_eq!(names_in(&bin), [HOST_LOCAL]);
    assert_eq!(
        fs::read(bin.join(HOST_LOCAL)).unwrap(),
        b"the real host-local"
    );

    fs::hard_link(bin.join(HOST_LOCAL), bin.join(HOST_LOCAL_ORIG)).unwrap();
    let src = write_source(&dir, b"ipkeep plugin");
    let done = replace_host_local(&src, &bin).unwrap();
    assert!(!done.kept_original);
    assert_eq!(fs::read(bin.join(HOST_LOCAL)).unwrap(), b"ipkeep plugin");
    assert_eq!(
        fs::read(bin.join(HOST_LOCAL_ORIG)).unwrap(),
        b"the real host-local"
    );
}

/// A runtime exec'ing host-local at any moment of replace/restore cycles always finds a whole
/// binary, the original or ipkeep.
#[test]
fn host_local_is_never_missing_during_replace_and_restore() {
    let (_tmp, dir) = scratch("never-missing");
    let original = vec![b'o'; 2 << 20];
    let ours = vec![b'i'; 3 << 20];
    let bin = host_local_dir(&dir, &original);
    let src = write_source(&dir, &ours);
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        let path = bin.join(HOST_LOCAL);
        std::thread::spawn(move || {
            let mut reads = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let bytes = fs::read(&path).expect("host-local is always there");
                let whole_original = bytes.len() == 2 << 20 && bytes.iter().all(|&b| b == b'o');
                let whole_ours = bytes.len() == 3 << 20 && bytes.iter().all(|&b| b == b'i');
                assert!(whole_original || whole_ours, "torn host-local");
                reads += 1;
            }
            reads
        })
    };
    for _ in 0..15 {
        assert!(replace_host_local(&src, &bin).unwrap().kept_original);
        assert_eq!(restore_host_local(&bin).unwrap(), Restore::Restored);
    }
    stop.store(true, Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0, "the reader never read");
    assert_eq!(fs::read(bin.join(HOST_LOCAL)).unwrap(), original);
}

/// The chart's init container (`--replace-host-local`, and without it) and `--restore-host-local`
/// command lines, each run twice (the preStop's `--if-daemonset-gone` asks an API server:
/// `e2e/tests/chart_rbac.rs` runs it).
#[test]
fn the_chart_command_lines_replace_and_restore() {
    let (_tmp, dir) = scratch("cli-replace");
    let bin = host_local_dir(&dir, b"the real host-local");
    let src = write_source(&dir, b"plugin");
    let to = to(&bin);
    let run = |args: &[&str]| install_cni(&[args, &[to.as_str()]].concat());
    let from = format!("--from={}", src.display());
    let first = run(&[&from, "--replace-host-local"]);
    assert!(first.contains("kept the original"), "{first}");
    let second = run(&[&from, "--replace-host-local"]);
    assert!(second.contains("already kept"), "{second}");
    assert_eq!(names_in(&bin), [HOST_LOCAL, HOST_LOCAL_ORIG, "ipkeep"]);
    assert_eq!(fs::read(bin.join(HOST_LOCAL)).unwrap(), b"plugin");
    assert!(run(&["--restore-host-local"]).contains("restored the original"));
    assert!(run(&["--restore-host-local"]).contains("nothing to restore"));
    assert_eq!(names_in(&bin), [HOST_LOCAL, "ipkeep"]);
    assert_eq!(
        fs::read(bin.join(HOST_LOCAL)).unwrap(),
        b"the real host-local"
    );
    // Replaced again, then installed without --replace-host-local (an upgrade setting
    // cni.replaceHostLocal=false): the init container puts the original back.
    run(&[&from, "--replace-host-local"]);
    let plain = run(&[&from]);
    assert!(plain.contains("no longer replaced"), "{plain}");
    assert_eq!(names_in(&bin), [HOST_LOCAL, "ipkeep"]);
    assert_eq!(
        fs::read(bin.join(HOST_LOCAL)).unwrap(),
        b"the real host-local"
    );
    assert!(!run(&[&from]).contains("no longer replaced"));
    for refused in [
        &["--replace-host-local", "--restore-host-local"][..],
        &["--if-daemonset-gone=ns/ds"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ipkeep-operator"))
            .arg("install-cni")
            .args(refused)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{refused:?} is refused");
    }
}

#[test]
fn a_host_local_written_over_ipkeep_is_reclaimed_and_kept_as_the_newest_original() {
    let (_tmp, dir) = scratch("reclaim");
    let bin = host_local_dir(&dir, b"host-local 1.4");
    let src = write_source(&dir, b"ipkeep");
    replace_host_local(&src, &bin).unwrap();
    assert_eq!(reclaim_host_local(&src, &bin).unwrap(), Reclaim::Intact);

    // A package upgrade writes host-local 1.5 over ipkeep (a new file renamed into place).
    let upgrade = dir.join("host-local-1.5");
    fs::write(&upgrade, b"host-local 1.5").unwrap();
    fs::set_permissions(&upgrade, fs::Permissions::from_mode(0o755)).unwrap();
    fs::rename(&upgrade, bin.join(HOST_LOCAL)).unwrap();
    assert_eq!(
        reclaim_host_local(&src, &bin).unwrap(),
        Reclaim::Overwritten
    );
    assert_eq!(fs::read(bin.join(HOST_LOCAL)).unwrap(), b"ipkeep");
    assert_eq!(
        fs::read(bin.join(HOST_LOCAL_ORIG)).unwrap(),
        b"host-local 1.5",
        "the newest original"
    );
    // An admin's `cp` writes in place: the same.
    fs::write(bin.join(HOST_LOCAL), b"host-local 1.6").unwrap();
    assert_eq!(
        reclaim_host_local(&src, &bin).unwrap(),
        Reclaim::Overwritten
    );
    assert_eq!(
        fs::read(bin.join(HOST_LOCAL_ORIG)).unwrap(),
        b"host-local 1.6"
    );
    // Removed: ipkeep again, the kept original stays.
    fs::remove_file(bin.join(HOST_LOCAL)).unwrap();
    assert_eq!(reclaim_host_local(&src, &bin).unwrap(), Reclaim::Removed);
    assert_eq!(fs::read(bin.join(HOST_LOCAL)).unwrap(), b"ipkeep");
    assert_eq!(
        fs::read(bin.join(HOST_LOCAL_ORIG)).unwrap(),
        b"host-local 1.6"
    );
    // Uninstalling puts back the newest original, and the guard, still running during the
    // agent's preStop, leaves it there: no original is kept any more.
    assert_eq!(restore_host_local(&bin).unwrap(), Restore::Restored);
    assert_eq!(fs::read(bin.join(HOST_LOCAL)).unwrap(), b"host-local 1.6");
    assert_eq!(
        reclaim_host_local(&src, &bin).unwrap(),
        Reclaim::NotReplaced
    );
    assert_eq!(fs::read(bin.join(HOST_LOCAL)).unwrap(), b"host-local 1.6");
    assert_eq!(names_in(&bin), [HOST_LOCAL], "no temporary left");
}

#[test]
fn a_relinked_host_local_is_kept_as_the_symlink_never_followed() {
    let (_tmp, dir) = scratch("relink");
    let bin = host_local_dir(&dir, b"host-local");
    let src = write_source(&dir, b"ipkeep");
    replace_host_local(&src, &bin).unwrap();
    // k3s re-links its multi-call binary: host-local becomes a symlink to `cni`.
    fs::write(bin.join("cni"), b"multi-call cni").unwrap();
    fs::remove_file(bin.join(HOST_LOCAL)).unwrap();
    std::os::unix::fs::symlink("cni", bin.join(HOST_LOCAL)).unwrap();
    assert_eq!(reclaim_host_local(&src, &bin).unwrap(), Reclaim::Relinked);
    assert_eq!(fs::read(bin.join(HOST_LOCAL)).unwrap(), b"ipkeep");
    assert!(
        !fs::symlink_metadata(bin.join(HOST_LOCAL))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        fs::read_link(bin.join(HOST_LOCAL_ORIG)).unwrap(),
        Path::new("cni")
    );
    assert_eq!(
        fs::read(bin.join("cni")).unwrap(),
        b"multi-call cni",
        "its target untouched"
    );
    // A symlink pointing out of the directory is kept as a link too, its target never written.
    let outside = dir.join("outside");
    fs::write(&outside, b"not ours").unwrap();
    fs::remove_file(bin.join(HOST_LOCAL)).unwrap();
    std::os::unix::fs::symlink(&outside, bin.join(HOST_LOCAL)).unwrap();
    assert_eq!(reclaim_host_local(&src, &bin).unwrap(), Reclaim::Relinked);
    assert_eq!(fs::read(&outside).unwrap(), b"not ours");
    assert_eq!(fs::read_link(bin.join(HOST_LOCAL_ORIG)).unwrap(), outside);
}

/// `ipkeep-operator install-cni <args>` on node `n1`, which must fail: what it said on stderr.
fn install_cni_fails(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ipkeep-operator"))
        .arg("install-cni")
        .args(args)
        .env("NODE_NAME", "n1")
        .output()
        .unwrap();
    assert!(!out.status.success(), "install-cni {args:?}: {out:?}");
    String::from_utf8(out.stderr).unwrap()
}

/// The chart's default (no `cni.binDir`): the node's root mounted whole, the bin directory the one
/// k3s's containerd configuration names, reached through the node's absolute symlinks (never the
/// container's own paths), k3s's absolute `host-local` link kept as a link; and the restore finds
/// the same directory.
#[test]
fn with_the_node_root_the_runtime_configuration_names_the_bin_dir() {
    let (_tmp, dir) = scratch("host-root");
    let root = dir.join("root");
    let k3s = root.join("var/lib/rancher/k3s");
    fs::create_dir_all(k3s.join("agent/etc/containerd")).unwrap();
    fs::create_dir_all(k3s.join("data/r1/bin")).unwrap();
    fs::create_dir_all(k3s.join("data/cni")).unwrap();
    fs::write(k3s.join("data/r1/bin/cni"), b"k3s multi-call cni").unwrap();
    std::os::unix::fs::symlink(
        "/var/lib/rancher/k3s/data/r1/bin/cni",
        k3s.join("data/cni/host-local"),
    )
    .unwrap();
    // The configuration names the bin directory through a link the node resolves in its tree.
    std::os::unix::fs::symlink("/var/lib/rancher/k3s/data", root.join("k3s-data")).unwrap();
    fs::write(
        k3s.join("agent/etc/containerd/config.toml"),
        "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.cni]\nbin_dirs = ['/k3s-data/cni']\nconf_dir = '/var/lib/rancher/k3s/agent/etc/cni/net.d'\n",
    )
    .unwrap();
    let src = write_source(&dir, b"ipkeep plugin");
    let from = format!("--from={}", src.display());
    let host_root = format!("--host-root={}", root.display());
    let said = install_cni(&[&from, &host_root, "--replace-host-local"]);
    assert!(
        said.contains(
            "the CNI bin directory is /k3s-data/cni (named by k3s's containerd configuration"
        ),
        "{said}"
    );
    let bin = k3s.join("data/cni");
    assert_eq!(fs::read(bin.join(HOST_LOCAL)).unwrap(), b"ipkeep plugin");
    assert_eq!(fs::read(bin.join("ipkeep")).unwrap(), b"ipkeep plugin");
    assert_eq!(
        fs::read_link(bin.join(HOST_LOCAL_ORIG)).unwrap(),
        Path::new("/var/lib/rancher/k3s/data/r1/bin/cni")
    );
    install_cni(&[&from, &host_root, "--restore-host-local"]);
    assert_eq!(
        fs::read_link(bin.join(HOST_LOCAL)).unwrap(),
        Path::new("/var/lib/rancher/k3s/data/r1/bin/cni")
    );
}

/// What an admin meets at install, each naming the node, the node's path and the value to set.
#[test]
fn install_errors_name_the_node_the_node_path_and_the_value() {
    let (_tmp, dir) = scratch("errors");
    let src = write_source(&dir, b"ipkeep plugin");
    let from = format!("--from={}", src.display());
    let root = dir.join("root");
    fs::create_dir_all(root.join("etc")).unwrap();
    let host_root = format!("--host-root={}", root.display());

    let nothing = install_cni_fails(&[&from, &host_root]);
    assert!(
        nothing.contains("node n1: failed to find the CNI bin directory the container runtime uses: no containerd or CRI-O configuration found (")
            && nothing.contains("): set the chart values cni.binDir and cni.confDir"),
        "{nothing}"
    );
    fs::create_dir_all(root.join("etc/containerd")).unwrap();
    fs::write(
        root.join("etc/containerd/config.toml"),
        "version = 3\n[plugins\n",
    )
    .unwrap();
    let broken = install_cni_fails(&[&from, &host_root]);
    assert!(
        broken.contains("node n1: failed to find the CNI bin directory the container runtime uses: failed to read /etc/containerd/config.toml: not valid TOML"),
        "{broken}"
    );

    // A wrong cni.binDir with cni.replaceHostLocal: named by its node path, not the mount's.
    let mounted = dir.join("mounted");
    fs::create_dir_all(&mounted).unwrap();
    let wrong = install_cni_fails(&[
        &from,
        &to(&mounted),
        "--to-on-node=/usr/lib/cni",
        "--replace-host-local",
    ]);
    assert!(
        wrong.contains("node n1: failed to replace host-local in the CNI bin directory /usr/lib/cni (the chart value cni.binDir): there is no host-local there to replace"),
        "{wrong}"
    );
    assert!(!wrong.contains(&mounted.display().to_string()), "{wrong}");
}
