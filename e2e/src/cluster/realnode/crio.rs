//! What a CRI-O node needs besides the layout's files: CRI-O's binaries (`build.sh --crio`), the
//! machine's conmon and runc, and images imported into its storage without a registry.
//!
//! How CRI-O met this machine (docs/real-nodes.md): Debian's CNI plugins refuse `cniVersion`
//! 1.1.0 (so its nodes run the upstream ones), `/proc/cgroups` lists hugetlb where no hierarchy
//! mounts it (so the node hides the hugepage sizes from the kubelet, which then asks for no
//! hugetlb limit runc could not set), and there is no `CAP_SYS_RESOURCE` (a node-critical or
//! Guaranteed pod's `oom_score_adj` of -997 fails: CRI-O has no `restrict_oom_score_adj` as
//! containerd has, so its runc is [`runc_clamped`], which does what that option does).

use std::path::{Path, PathBuf};

use super::{
    RealNodeError,
    host::{self, HostError},
    layout::{CrioPrograms, NodeLayout},
};

/// What `build.sh --crio` builds: CRI-O, pinns, the CNI plugins a CRI-O node runs, and cnitool
/// (libcni's command line: an attachment no runtime knows, as a leak leaves one).
pub const BINARIES: [&str; 7] = [
    "crio",
    "pinns",
    "bridge",
    "host-local",
    "portmap",
    "loopback",
    "cnitool",
];
/// The CNI plugins among them, copied into each CRI-O node's CNI bin directory.
pub const CNI_PLUGINS: [&str; 4] = ["bridge", "host-local", "portmap", "loopback"];
/// Debian's conmon (make deps).
pub const CONMON: &str = "/usr/bin/conmon";
/// Where a node's image and container storage is (CRI-O's `root`), and its run root.
const STORAGE: [&str; 4] = [
    "--root",
    "/var/lib/containers/storage",
    "--runroot",
    "/run/containers/storage",
];
/// The signature policy CRI-O and buildah read: the images are imported from archives we built.
pub const SIGNATURE_POLICY: &str = r#"{"default":[{"type":"insecureAcceptAnything"}]}"#;

/// The registries configuration CRI-O reads (`--registries-conf`, never the machine's
/// /etc/containers/registries.conf): a short name (`ipkeep:1`) means `docker.io/library/ipkeep:1`,
/// as the kubelet and containerd take it (the import tags that name too); without a search
/// registry CRI-O refuses every short name ("did not resolve to an alias").
pub const REGISTRIES_CONF: &str =
    "unqualified-search-registries = [\"docker.io\"]\nshort-name-mode = \"permissive\"\n";

/// The directory of CRI-O's binaries: `IPKEEP_CRIO_BIN_DIR`, else what
/// `e2e/cluster/build.sh --print-crio-bin-dir` names; checked to hold every one, and conmon to
/// be installed.
pub fn bin_dir() -> Result<PathBuf, RealNodeError> {
    let dir = super::built_dir("IPKEEP_CRIO_BIN_DIR", "--print-crio-bin-dir")?;
    if let Some(b) = BINARIES.iter().find(|b| !dir.join(b).is_file()) {
        return Err(RealNodeError::CrioMissing {
            dir,
            missing: (*b).to_owned(),
        });
    }
    if !Path::new(CONMON).is_file() {
        return Err(RealNodeError::CrioMissing {
            dir: PathBuf::from("/usr/bin"),
            missing: "conmon (Debian's package conmon: make deps installs it)".into(),
        });
    }
    Ok(dir)
}

/// The programs CRI-O runs, with the signature policy, [`REGISTRIES_CONF`] and the runc it
/// runs (`runc`: `ipkeep-e2e cluster runc`, see [`runc_clamped`]) written to `config_dir`.
pub fn programs(
    bin_dir: &Path,
    config_dir: &Path,
    e2e_exe: &Path,
) -> Result<CrioPrograms, std::io::Error> {
    use std::os::unix::fs::PermissionsExt as _;
    let signature_policy = config_dir.join("policy.json");
    std::fs::write(&signature_policy, SIGNATURE_POLICY)?;
    std::fs::write(config_dir.join("registries.conf"), REGISTRIES_CONF)?;
    let runc = config_dir.join("runc");
    let script = format!(
        "#!/bin/sh\nexec '{}' cluster runc -- \"$@\"\n",
        e2e_exe.display().to_string().replace('\'', "'\\''")
    );
    std::fs::write(&runc, script)?;
    std::fs::set_permissions(&runc, std::fs::Permissions::from_mode(0o755))?;
    Ok(CrioPrograms {
        pinns: bin_dir.join("pinns"),
        runc,
        conmon: PathBuf::from(CONMON),
        signature_policy,
    })
}

/// Imports an OCI archive into a CRI-O node's image storage with buildah (what CRI-O reads,
/// with or without CRI-O running: the storage locks itself), under the names it carries
/// (`org.opencontainers.image.ref.name`) and each `also` name.
pub fn import_image(
    node: NodeLayout,
    bin_dir: &Path,
    policy: &Path,
    archive: &Path,
    also: &[(String, String)],
) -> Result<(), RealNodeError> {
    let run = |args: &[&str], what: &str| {
        let mut command = host::node_command(node, bin_dir, "buildah");
        command.args(STORAGE).args(["--storage-driver", "overlay"]);
        command.args(args);
        crate::command::checked(&mut command, crate::command::Stdin::Empty)
            .map(drop)
            .map_err(HostError::from)
            .map_err(|source: HostError| RealNodeError::Host {
                node: node.name(),
                stage: what.to_owned(),
                source,
            })
    };
    // buildah runs inside the node, whose working directory is not ours.
    let archive = std::path::absolute(archive).map_err(|source| RealNodeError::Io {
        node: node.name(),
        what: format!("resolve {}", archive.display()),
        source,
    })?;
    let source = format!("oci-archive:{}", archive.display());
    let policy = policy.to_string_lossy();
    run(
        &["pull", "--quiet", "--signature-policy", &policy, &source],
        "import an image into CRI-O's storage",
    )?;
    for (from, to) in also {
        run(&["tag", from, to], "tag an image in CRI-O's storage")?;
    }
    Ok(())
}

/// The names of the images in a CRI-O node's storage (`buildah images`, which reads it whether
/// CRI-O runs or not), each as `REPOSITORY:TAG`.
pub fn image_names(node: NodeLayout, bin_dir: &Path) -> Result<Vec<String>, RealNodeError> {
    let mut command = host::node_command(node, bin_dir, "buildah");
    command.args(STORAGE).args(["--storage-driver", "overlay"]);
    command.args(["images", "--json"]);
    let out =
        crate::command::stdout_of(&mut command, crate::command::Stdin::Empty).map_err(|e| {
            RealNodeError::Host {
                node: node.name(),
                stage: "list the images in CRI-O's storage".to_owned(),
                source: e.into(),
            }
        })?;
    let images: Vec<serde_json::Value> =
        serde_json::from_str(&out).map_err(|_| RealNodeError::Invalid {
            what: "output of `buildah images --json`",
            value: out.clone(),
            why: "not the JSON list of images buildah prints",
        })?;
    Ok(images
        .iter()
        .filter_map(|i| i["names"].as_array())
        .flatten()
        .filter_map(|n| n.as_str().map(str::to_owned))
        .collect())
}

/// What containerd's `restrict_oom_score_adj` does, for CRI-O (which has no such option): a
/// container may not ask for an `oom_score_adj` below `floor` (its runtime's own; without
/// CAP_SYS_RESOURCE runc cannot lower it, and a Guaranteed or node-critical pod's -997 would
/// fail the container). Whether `config` (a bundle's config.json) changed.
pub fn clamp_oom_score_adj(config: &mut serde_json::Value, floor: i64) -> bool {
    let Some(process) = config.get_mut("process").and_then(|p| p.as_object_mut()) else {
        return false;
    };
    match process
        .get("oomScoreAdj")
        .and_then(serde_json::Value::as_i64)
    {
        Some(adj) if adj < floor => {
            process.insert("oomScoreAdj".into(), floor.into());
            true
        }
        _ => false,
    }
}

/// The bundle directory runc's arguments name (`--bundle DIR`, `-b DIR`, `--bundle=DIR`).
fn bundle_arg(args: &[std::ffi::OsString]) -> Option<PathBuf> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        if s == "--bundle" || s == "-b" {
            return it.next().map(PathBuf::from);
        }
        if let Some(dir) = s.strip_prefix("--bundle=") {
            return Some(PathBuf::from(dir));
        }
    }
    None
}

/// Runs Debian's runc with `args` (exec: returns only the error), a bundle's `oom_score_adj`
/// first raised to this process's own ([`clamp_oom_score_adj`]).
pub fn runc_clamped(args: &[std::ffi::OsString]) -> std::io::Error {
    use std::os::unix::process::CommandExt as _;
    if let Some(bundle) = bundle_arg(args) {
        let path = bundle.join("config.json");
        let own = std::fs::read_to_string("/proc/self/oom_score_adj")
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok());
        if let (Some(own), Ok(text)) = (own, std::fs::read_to_string(&path))
            && let Ok(mut config) = serde_json::from_str::<serde_json::Value>(&text)
            && clamp_oom_score_adj(&mut config, own)
        {
            let tmp = bundle.join(".config.json.ipkeep-e2e");
            let written = std::fs::write(&tmp, config.to_string())
                .and_then(|()| std::fs::rename(&tmp, &path));
            if let Err(e) = written {
                return e;
            }
        }
    }
    std::process::Command::new(host::RUNC).args(args).exec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oom_score_adj_below_the_floor_is_raised_and_nothing_else_changes() {
        // (config.json, floor, changed, oomScoreAdj after)
        let cases = [
            (r#"{"process":{"oomScoreAdj":-997}}"#, 0, true, Some(0)),
            (
                r#"{"process":{"oomScoreAdj":-997}}"#,
                -999,
                false,
                Some(-997),
            ),
            (r#"{"process":{"oomScoreAdj":1000}}"#, 0, false, Some(1000)),
            (r#"{"process":{}}"#, 0, false, None),
            (r#"{}"#, 0, false, None),
        ];
        for (text, floor, changed, after) in cases {
            let mut config: serde_json::Value = serde_json::from_str(text).unwrap();
            assert_eq!(clamp_oom_score_adj(&mut config, floor), changed, "{text}");
            assert_eq!(config["process"]["oomScoreAdj"].as_i64(), after, "{text}");
        }
    }

    #[test]
    fn the_bundle_is_found_in_each_spelling() {
        let args = |v: &[&str]| v.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        let cases: [(&[&str], Option<&str>); 4] = [
            (
                &["--root", "/run/runc", "create", "--bundle", "/b", "id"],
                Some("/b"),
            ),
            (&["create", "-b", "/c", "id"], Some("/c")),
            (&["run", "--bundle=/d", "id"], Some("/d")),
            (&["--root", "/run/runc", "state", "id"], None),
        ];
        for (argv, bundle) in cases {
            assert_eq!(
                bundle_arg(&args(argv)),
                bundle.map(PathBuf::from),
                "{argv:?}"
            );
        }
    }
}
