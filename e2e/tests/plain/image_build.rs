//! The runtime image: `scripts/build-image.sh` (what `make image` runs) builds it with buildah from
//! the static release binaries; the test unpacks the OCI archive layer by layer and runs both
//! binaries from the unpacked root filesystem, chrooted and as the image's own (non-root) user:
//! `ipkeep-operator --version` and the plugin's CNI `VERSION`. It also checks the image holds
//! nothing else and that the Dockerfile's runtime stage says what the built image is.
//!
//! The binaries come from `IPKEEP_IMAGE_PLUGIN_BIN` and `IPKEEP_IMAGE_OPERATOR_BIN`, else where
//! `make image` builds them, statically linked, each with its profile: `target/<host
//! triple>/release/ipkeep` and `target/<host triple>/daemon/ipkeep-operator`. Needs root (chroot, buildah's storage) and buildah
//! (`scripts/install-packaging-deps.sh`); fails, never skips, without them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::testkit;
use std::{
    io::Write,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use serde_json::Value;
use testkit::{ok, repo_root};

/// The static binary `name` built with Cargo `profile`, or the path the variable `env` names.
fn image_bin(env: &str, profile: &str, name: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env).filter(|v| !v.is_empty()) {
        return PathBuf::from(path);
    }
    let host = testkit::run_ok(Command::new("rustc"), &["-vV"], None)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .unwrap();
    repo_root()
        .join("target")
        .join(host)
        .join(profile)
        .join(name)
}

fn blob(layout: &Path, digest: &str) -> PathBuf {
    let hex = digest.strip_prefix("sha256:").unwrap();
    layout.join("blobs/sha256").join(hex)
}

fn json_blob(layout: &Path, digest: &str) -> Value {
    serde_json::from_slice(&std::fs::read(blob(layout, digest)).unwrap()).unwrap()
}

/// Runs `/<binary>` from the unpacked image, chrooted into it, as `user` ("uid:gid") with no
/// supplementary groups, an empty environment but `env`, and `stdin`.
fn run_in_image(
    rootfs: &Path,
    user: &str,
    binary: &str,
    args: &[&str],
    env: &[(&str, &str)],
    stdin: &str,
) -> Output {
    let mut child = Command::new(chroot_binary())
        .arg(format!("--userspec={user}"))
        .arg("--groups=")
        .arg(rootfs)
        .arg(binary)
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A process may exit without reading all of stdin (an exec that fails, a reply written
    // early): a broken pipe here is not the test's business, the reply asserted below is.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    child.wait_with_output().unwrap()
}

#[test]
fn the_image_runs_both_binaries_as_its_non_root_user() {
    let plugin = image_bin("IPKEEP_IMAGE_PLUGIN_BIN", "release", "ipkeep");
    let operator = image_bin("IPKEEP_IMAGE_OPERATOR_BIN", "daemon", "ipkeep-operator");
    for b in [&plugin, &operator] {
        assert!(
            b.is_file(),
            "{} missing: run: make image (builds both static binaries) or set \
             IPKEEP_IMAGE_PLUGIN_BIN and IPKEEP_IMAGE_OPERATOR_BIN",
            b.display()
        );
    }
    assert!(
        rustix::process::geteuid().is_root(),
        "the image test needs root (buildah storage, chroot into the unpacked image): run it as root"
    );
    let work = repo_root()
        .join("target")
        .join(format!("image-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let archive = work.join("ipkeep.oci.tar");

    ok(
        "scripts/build-image.sh (run scripts/install-packaging-deps.sh if buildah is missing)",
        Command::new(repo_root().join("scripts/build-image.sh"))
            .arg(&plugin)
            .arg(&operator)
            .arg(&archive)
            .arg("ipkeep:image-test")
            .env("IPKEEP_BUILDAH_ROOT", work.join("buildah"))
            .output()
            .unwrap(),
    );

    // The OCI layout: index -> manifest -> config and layers.
    let layout = work.join("layout");
    std::fs::create_dir_all(&layout).unwrap();
    let mut untar = Command::new("tar");
    untar.arg("-xf").arg(&archive).arg("-C").arg(&layout);
    testkit::checked(untar, None);
    let index: Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 1);
    assert_eq!(
        manifests[0]["annotations"]["org.opencontainers.image.ref.name"],
        "ipkeep:image-test"
    );
    let manifest = json_blob(&layout, manifests[0]["digest"].as_str().unwrap());
    let config = json_blob(&layout, manifest["config"]["digest"].as_str().unwrap());
    let user = config["config"]["User"].as_str().unwrap().to_owned();
    let (uid, gid) = user.split_once(':').unwrap();
    assert_ne!(
        uid.parse::<u32>().unwrap(),
        0,
        "the image runs as root by default"
    );
    assert_ne!(gid.parse::<u32>().unwrap(), 0, "the image's group is root");
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!(["/ipkeep-operator"])
    );
    assert_eq!(config["os"], "linux");

    // The Dockerfile's runtime stage describes the same image.
    let dockerfile = std::fs::read_to_string(repo_root().join("Dockerfile")).unwrap();
    let runtime = dockerfile
        .split("\nFROM scratch\n")
        .nth(1)
        .unwrap_or_else(|| panic!("the Dockerfile has no `FROM scratch` runtime stage"));
    assert!(
        runtime.contains(&format!("\nUSER {user}\n")),
        "Dockerfile USER is not {user}"
    );
    assert!(runtime.contains("\nENTRYPOINT [\"/ipkeep-operator\"]\n"));
    for b in ["/ipkeep", "/ipkeep-operator"] {
        assert!(
            runtime.contains(&format!("/out{b} {b}\n")),
            "Dockerfile does not copy {b}"
        );
    }

    // Its builder stage builds what `make image` builds: both binaries, static, locked.
    let builder = dockerfile.split("\nFROM scratch\n").next().unwrap();
    for expected in [
        "RUSTFLAGS=\"-C target-feature=+crt-static\"",
        "cargo build --locked --release -p ipkeep-plugin",
        "cargo build --locked --profile daemon -p ipkeep-operator",
    ] {
        assert!(
            builder.contains(expected),
            "the Dockerfile's builder lacks {expected:?}"
        );
    }

    // FROM scratch: the layers hold the two binaries and nothing else.
    let rootfs = work.join("rootfs");
    std::fs::create_dir_all(&rootfs).unwrap();
    let layers = manifest["layers"].as_array().unwrap();
    assert!(!layers.is_empty());
    for layer in layers {
        let mut untar = Command::new("tar");
        untar
            .arg("-xf")
            .arg(blob(&layout, layer["digest"].as_str().unwrap()))
            .arg("-C")
            .arg(&rootfs);
        testkit::checked(untar, None);
    }
    let mut entries: Vec<String> = std::fs::read_dir(&rootfs)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    entries.sort();
    assert_eq!(entries, ["ipkeep", "ipkeep-operator"]);
    for (b, built) in [("ipkeep", &plugin), ("ipkeep-operator", &operator)] {
        let mode = std::fs::metadata(rootfs.join(b))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o555, "{b} mode {mode:o}");
        assert!(
            std::fs::read(rootfs.join(b)).unwrap() == std::fs::read(built).unwrap(),
            "{b} in the image is not the binary the workspace built"
        );
    }

    // Both binaries run inside the image (no C library there: only static binaries start) as
    // the image's user.
    let version = ok(
        "ipkeep-operator --version inside the image",
        run_in_image(&rootfs, &user, "/ipkeep-operator", &["--version"], &[], ""),
    );
    let cargo = std::fs::read_to_string(repo_root().join("Cargo.toml")).unwrap();
    let workspace_version = cargo
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|l| l.strip_suffix('"'))
        .unwrap();
    assert_eq!(
        version.trim(),
        format!("ipkeep-operator {workspace_version}")
    );

    let reply = ok(
        "the plugin's CNI VERSION inside the image",
        run_in_image(
            &rootfs,
            &user,
            "/ipkeep",
            &[],
            &[("CNI_COMMAND", "VERSION"), ("CNI_PATH", "/")],
            r#"{"cniVersion":"1.1.0"}"#,
        ),
    );
    let reply: Value = serde_json::from_str(&reply).unwrap();
    assert_eq!(reply["cniVersion"], "1.1.0");
    let supported: Vec<&str> = reply["supportedVersions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for v in ["0.1.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        assert!(supported.contains(&v), "{v} not in {supported:?}");
    }

    // Control: the same chroot with a binary only root may run must fail, or the runs above did
    // not prove anything about the user.
    let control = work.join("rootfs-control");
    std::fs::create_dir_all(&control).unwrap();
    // Copied by cp, not in this process: a file this process held open for writing could leak
    // into a child forked meanwhile by another test and make the exec fail with ETXTBSY.
    let mut cp = Command::new("cp");
    cp.arg(rootfs.join("ipkeep-operator"))
        .arg(control.join("ipkeep-operator"));
    testkit::checked(cp, None);
    std::fs::set_permissions(
        control.join("ipkeep-operator"),
        std::fs::Permissions::from_mode(0o500),
    )
    .unwrap();
    let denied = run_in_image(&control, &user, "/ipkeep-operator", &["--version"], &[], "");
    assert!(
        !denied.status.success()
            && String::from_utf8_lossy(&denied.stderr).contains("Permission denied"),
        "a root-only binary ran as {user}: {denied:?}"
    );
    let _ = std::fs::remove_dir_all(&work);
}

/// coreutils' `chroot`, found on this process's PATH (the child's environment is emptied).
fn chroot_binary() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("chroot"))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| panic!("chroot (coreutils) not found on PATH"))
}

#[test]
fn a_dynamically_linked_binary_is_refused() {
    // Any dynamically linked executable stands in for a binary built without crt-static.
    let dynamic = ["/bin/true", "/usr/bin/true"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .unwrap();
    let work = repo_root()
        .join("target")
        .join(format!("image-test-dynamic-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let bins = work.join("bin");
    std::fs::create_dir_all(&bins).unwrap();
    for b in ["ipkeep", "ipkeep-operator"] {
        std::fs::copy(&dynamic, bins.join(b)).unwrap();
    }
    let out = Command::new(repo_root().join("scripts/build-image.sh"))
        .arg(bins.join("ipkeep"))
        .arg(bins.join("ipkeep-operator"))
        .arg(work.join("never.oci.tar"))
        .env("IPKEEP_BUILDAH_ROOT", work.join("buildah"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a dynamic binary was put in the image"
    );
    assert!(
        stderr.contains("ipkeep is dynamically linked") && stderr.contains("crt-static"),
        "{stderr}"
    );
    assert!(!work.join("never.oci.tar").exists());
    let _ = std::fs::remove_dir_all(&work);
}
