//! The repository's files and built binaries, as the e2e tests find them (each fails the test
//! loudly, with what to run, when something is missing).

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ has a parent")
        .to_path_buf()
}

/// The chart (`charts/ipkeep`).
pub fn chart_dir() -> PathBuf {
    repo_root().join("charts/ipkeep")
}

/// The chart's one value without a default, for helm on the control plane alone, where no kubelet
/// pulls the image: a repository (the chart refuses to render without one).
pub const UNPULLED_IMAGE: [&str; 2] =
    ["--set", "image.repository=registry.example.internal/ipkeep"];

/// The repository's generated CRDs (`crds/`): the real IPReservation CRD with its selectable
/// `spec.nodeName`.
pub fn repo_crds() -> PathBuf {
    repo_root().join("crds")
}

/// The IPReservation CRD file, the one the chart ships.
pub fn crd_file() -> PathBuf {
    repo_crds().join("ipreservations.ipkeep.dev.yaml")
}

/// The environment the chart's controller Deployment gives `ipkeep-operator controller` beyond
/// its flags: one glibc malloc arena (docs/benchmarks.md's memory figures are measured with it).
/// Whatever starts the controller as a process starts it with these; the chart test holds the
/// Deployment to them.
pub const CONTROLLER_ENV: [(&str, &str); 1] = [("MALLOC_ARENA_MAX", "1")];

/// The `ipkeep-operator` binary: `$IPKEEP_OPERATOR_BIN`, else `cargo build` of it next to this
/// test (once per test process: call it before anything that must not wait for cargo).
pub fn operator_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| built_binary("IPKEEP_OPERATOR_BIN", "ipkeep-operator", "ipkeep-operator"))
        .clone()
}

/// The `ipkeep-docker` binary: `$IPKEEP_DOCKER_BIN`, else `cargo build` of it next to this test
/// (once per test process).
pub fn docker_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| built_binary("IPKEEP_DOCKER_BIN", "ipkeep-docker", "ipkeep-docker"))
        .clone()
}

/// `$<var>` when set, else `cargo build -p <package> --bin <bin>` (a no-op when `cargo test
/// --workspace` built it already) and the binary next to this test's own directory.
fn built_binary(var: &str, package: &str, bin: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(var).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(path);
        assert!(path.is_file(), "{var}={} does not exist", path.display());
        return path;
    }
    let status = Command::new(env!("CARGO"))
        .args(["build", "-q", "-p", package, "--bin", bin])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .unwrap_or_else(|e| panic!("failed to run cargo to build {bin}: {e}"));
    assert!(status.success(), "cargo build -p {package} failed");
    // <target>/<profile>/deps/<this test> → <target>/<profile>/<bin>
    let exe = std::env::current_exe().expect("the test's own path");
    let path = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test runs from <target>/<profile>/deps")
        .join(bin);
    assert!(path.is_file(), "{} was not built", path.display());
    path
}

/// The directory of the control plane's binaries (kubectl, helm, …): `$IPKEEP_CLUSTER_BIN_DIR`,
/// else what `e2e/cluster/build.sh --print-bin-dir` prints.
pub fn cluster_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("IPKEEP_CLUSTER_BIN_DIR").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    let build = Command::new(repo_root().join("e2e/cluster/build.sh"));
    PathBuf::from(super::run_ok(build, &["--print-bin-dir"], None).trim())
}
