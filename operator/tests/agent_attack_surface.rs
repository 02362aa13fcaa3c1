//! install-cni and the agent's in-charge reader as attack surface: both run as root on every
//! node and follow paths an unprivileged user may have planted things in. One table per
//! component, a row per attack: each is refused with an error naming the path and what is
//! wrong, nothing is followed, and the scratch tree is the same, byte for byte (modes, owners,
//! link targets), before and after.
//!
//! Needs root (mknod, chown to another uid): run as root, as `make test` and CI do.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, chown, lchown, symlink};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Command;

use ipkeep_operator::agent::incharge::evidence::{self, Dirs, MAX_CONF, Sources};
use ipkeep_operator::install_cni::{TRUST_HINT, reclaim_host_local};
use ipkeep_operator::rules::incharge::ConfFile;
use rustix::fs::{FileType, Mode};

/// The uid (and gid) of the unprivileged user planting things.
const OTHER: u32 = 1000;

/// What one entry of a tree is: kind, mode, owner, and its bytes, link target or device number.
type Snapshot = BTreeMap<PathBuf, String>;

/// Every entry below `root` (never following a symlink, never opening a special file).
fn snapshot(root: &Path) -> Snapshot {
    let mut out = Snapshot::new();
    let mut todo = vec![root.to_owned()];
    while let Some(path) = todo.pop() {
        let meta = fs::symlink_metadata(&path).unwrap();
        let kind = meta.file_type();
        let what = if kind.is_symlink() {
            format!("-> {}", fs::read_link(&path).unwrap().display())
        } else if kind.is_file() {
            format!("{:?}", fs::read(&path).unwrap())
        } else if kind.is_dir() {
            for entry in fs::read_dir(&path).unwrap() {
                todo.push(entry.unwrap().path());
            }
            "dir".to_owned()
        } else {
            format!("special rdev {}", meta.rdev())
        };
        let rel = path.strip_prefix(root).unwrap().to_owned();
        out.insert(
            rel,
            format!(
                "mode {:o} uid {} gid {} {what}",
                meta.mode(),
                meta.uid(),
                meta.gid()
            ),
        );
    }
    out
}

fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test plants device nodes and other users' files: run it as root (sudo cargo test -p ipkeep-operator --test agent_attack_surface)"
    );
}

/// A scratch directory (removed when dropped) and its real path.
fn scratch() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::Builder::new()
        .prefix("ipkeep-attack-")
        .tempdir()
        .unwrap();
    let root = tmp.path().canonicalize().unwrap();
    (tmp, root)
}

/// A symlink owned by the unprivileged user.
fn users_symlink(target: impl AsRef<Path>, link: &Path) {
    symlink(target, link).unwrap();
    lchown(link, Some(OTHER), Some(OTHER)).unwrap();
}

fn mkdir_mode(path: &Path, mode: u32) {
    fs::create_dir_all(path).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// A node root below `root/node` whose containerd names `/opt/cni/bin`.
fn node(root: &Path) {
    let conf = root.join("node/etc/containerd");
    fs::create_dir_all(&conf).unwrap();
    fs::write(
        conf.join("config.toml"),
        "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.cni]\nbin_dirs = ['/opt/cni/bin']\nconf_dir = '/etc/cni/net.d'\n",
    )
    .unwrap();
}

#[test]
fn install_cni_refuses_a_bin_dir_another_user_can_redirect_or_write() {
    require_root();
    let by_value = |dir: &str, why: &str| {
        format!(
            "ipkeep-operator: node n1: failed to install ipkeep in the CNI bin directory {{root}}/{dir} (the chart value cni.binDir): failed to trust {{root}}/{dir}: {why}; {TRUST_HINT}\n"
        )
    };
    let by_runtime = |component: &str, why: &str| {
        format!(
            "ipkeep-operator: node n1: failed to find the CNI bin directory the container runtime uses: failed to trust /opt/cni/bin on the node: {component} {why}; {TRUST_HINT}\n"
        )
    };
    // What a row plants below the scratch root, and install-cni's arguments after `--from`.
    type Plant = fn(&Path);
    let to = |dir: &'static str| vec![format!("--to={{root}}/{dir}")];
    let host_root = || vec!["--host-root={root}/node".to_owned()];
    let rows: Vec<(&str, Plant, Vec<String>, String)> = vec![
        (
            "--to: another user's symlink to a directory of theirs",
            |root| {
                mkdir_mode(&root.join("home"), 0o755);
                chown(root.join("home"), Some(OTHER), Some(OTHER)).unwrap();
                users_symlink(root.join("home"), &root.join("bin"));
            },
            to("bin"),
            by_value(
                "bin",
                "it is a symbolic link to {root}/home (a hostPath mount never is; not followed)",
            ),
        ),
        (
            "--to: a symlink to /etc",
            |root| users_symlink("/etc", &root.join("bin")),
            to("bin"),
            by_value(
                "bin",
                "it is a symbolic link to /etc (a hostPath mount never is; not followed)",
            ),
        ),
        (
            "--to: world-writable",
            |root| mkdir_mode(&root.join("bin"), 0o777),
            to("bin"),
            by_value("bin", "it is writable by every user (mode 777)"),
        ),
        (
            "--to: owned by another user",
            |root| {
                mkdir_mode(&root.join("bin"), 0o755);
                chown(root.join("bin"), Some(OTHER), None).unwrap();
            },
            to("bin"),
            by_value("bin", "it is owned by uid 1000, not root"),
        ),
        (
            "--to: writable by another user's group",
            |root| {
                mkdir_mode(&root.join("bin"), 0o775);
                chown(root.join("bin"), None, Some(OTHER)).unwrap();
            },
            to("bin"),
            by_value("bin", "it is writable by group 1000 (mode 775)"),
        ),
        (
            "--to with --restore-host-local: world-writable, the kept original stays",
            |root| {
                mkdir_mode(&root.join("bin"), 0o777);
                fs::write(root.join("bin/host-local.ipkeep-orig"), b"original").unwrap();
            },
            vec![
                "--to={root}/bin".to_owned(),
                "--restore-host-local".to_owned(),
            ],
            by_value("bin", "it is writable by every user (mode 777)")
                .replace("failed to install ipkeep", "failed to restore host-local"),
        ),
        (
            "--host-root: the bin dir the runtime names is another user's symlink",
            |root| {
                node(root);
                mkdir_mode(&root.join("node/opt/cni"), 0o755);
                mkdir_mode(&root.join("node/home"), 0o755);
                users_symlink("/home", &root.join("node/opt/cni/bin"));
            },
            host_root(),
            by_runtime(
                "/opt/cni/bin",
                "is a symbolic link owned by uid 1000, not root",
            ),
        ),
        (
            "--host-root: a component on the way is another user's symlink to /etc (nothing created)",
            |root| {
                node(root);
                users_symlink("/etc", &root.join("node/opt"));
            },
            host_root(),
            by_runtime("/opt", "is a symbolic link owned by uid 1000, not root"),
        ),
        (
            "--host-root: root's relative symlink climbing out of the node's root",
            |root| {
                node(root);
                mkdir_mode(&root.join("node/opt/cni"), 0o755);
                symlink("../../../../../../etc", root.join("node/opt/cni/bin")).unwrap();
            },
            host_root(),
            by_runtime(
                "/opt/cni/bin",
                "is a symbolic link to ../../../../../../etc, which leads out of the node's root",
            ),
        ),
        (
            "--host-root: a directory on the way owned by another user",
            |root| {
                node(root);
                mkdir_mode(&root.join("node/opt/cni/bin"), 0o755);
                chown(root.join("node/opt"), Some(OTHER), None).unwrap();
            },
            host_root(),
            by_runtime("/opt", "is owned by uid 1000, not root"),
        ),
        (
            "--host-root: the bin dir is world-writable",
            |root| {
                node(root);
                mkdir_mode(&root.join("node/opt/cni/bin"), 0o777);
            },
            host_root(),
            by_runtime("/opt/cni/bin", "is writable by every user (mode 777)"),
        ),
        (
            "--host-root: root's symlink into a directory another user owns",
            |root| {
                node(root);
                mkdir_mode(&root.join("node/opt/cni"), 0o755);
                mkdir_mode(&root.join("node/home/user/bin"), 0o755);
                chown(root.join("node/home/user"), Some(OTHER), None).unwrap();
                symlink("/home/user/bin", root.join("node/opt/cni/bin")).unwrap();
            },
            host_root(),
            by_runtime("/home/user", "is owned by uid 1000, not root"),
        ),
    ];
    for (what, plant, args, expected) in rows {
        let (_tmp, root) = scratch();
        fs::create_dir(root.join("image")).unwrap();
        fs::write(root.join("image/ipkeep"), b"ipkeep plugin").unwrap();
        plant(&root);
        let before = snapshot(&root);
        let etc_before = fs::read_dir("/etc").unwrap().count();
        let root_text = root.display().to_string();
        let args: Vec<String> = args
            .iter()
            .map(|a| a.replace("{root}", &root_text))
            .collect();
        let out = Command::new(env!("CARGO_BIN_EXE_ipkeep-operator"))
            .arg("install-cni")
            .arg(format!("--from={root_text}/image/ipkeep"))
            .args(&args)
            .env("NODE_NAME", "n1")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{what}: {out:?}");
        let said = String::from_utf8(out.stderr).unwrap();
        assert_eq!(said, expected.replace("{root}", &root_text), "{what}");
        assert_eq!(snapshot(&root), before, "{what}: the tree changed");
        assert_eq!(
            fs::read_dir("/etc").unwrap().count(),
            etc_before,
            "{what}: /etc changed"
        );
    }
}

/// The agent's host-local guard checks the directory again at every pass: one made writable by
/// everyone after install-cni trusted it is left alone, the other host-local kept out of ipkeep's
/// hands until the directory is fixed.
#[test]
fn the_host_local_guard_leaves_a_bin_dir_others_can_write_alone() {
    require_root();
    let (_tmp, root) = scratch();
    fs::create_dir(root.join("image")).unwrap();
    fs::write(root.join("image/ipkeep"), b"ipkeep plugin").unwrap();
    mkdir_mode(&root.join("bin"), 0o777);
    fs::write(root.join("bin/host-local"), b"a new host-local").unwrap();
    fs::write(root.join("bin/host-local.ipkeep-orig"), b"original").unwrap();
    let before = snapshot(&root);
    let err = reclaim_host_local(&root.join("image/ipkeep"), &root.join("bin")).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "failed to trust {}/bin: it is writable by every user (mode 777); {TRUST_HINT}",
            root.display()
        )
    );
    assert_eq!(snapshot(&root), before);
}

/// A configuration file larger than the reader's cap (sparse: no disk used).
fn huge(path: &Path) {
    fs::File::create(path)
        .unwrap()
        .set_len(MAX_CONF + 1)
        .unwrap();
}

#[test]
fn the_in_charge_reader_skips_proc_links_fifos_devices_sockets_and_huge_confs() {
    require_root();
    type Plant = fn(&Path);
    let rows: Vec<(&str, Plant, &str)> = vec![
        (
            "a symlink to /proc/self/environ",
            |p| users_symlink("/proc/self/environ", p),
            "a symbolic link (not followed)",
        ),
        (
            "a symlink to /proc/kcore",
            |p| symlink("/proc/kcore", p).unwrap(),
            "a symbolic link (not followed)",
        ),
        (
            "a FIFO",
            |p| {
                rustix::fs::mknodat(
                    rustix::fs::CWD,
                    p,
                    FileType::Fifo,
                    Mode::from_raw_mode(0o644),
                    0,
                )
                .unwrap()
            },
            "not a regular file",
        ),
        (
            "a character device (/dev/zero's numbers)",
            |p| {
                rustix::fs::mknodat(
                    rustix::fs::CWD,
                    p,
                    FileType::CharacterDevice,
                    Mode::from_raw_mode(0o644),
                    rustix::fs::makedev(1, 5),
                )
                .unwrap()
            },
            "not a regular file",
        ),
        (
            "a socket",
            |p| drop(UnixListener::bind(p).unwrap()),
            "not a regular file",
        ),
        ("a huge file", huge, "larger than 1048576 bytes"),
    ];
    for (what, plant, why) in rows {
        let (_tmp, root) = scratch();
        fs::create_dir_all(root.join("conf")).unwrap();
        fs::create_dir_all(root.join("bin")).unwrap();
        plant(&root.join("conf/10-planted.conflist"));
        let before = snapshot(&root);
        let s = Sources {
            dirs: Dirs::Fixed {
                conf_dir: root.join("conf"),
                conf_dir_on_node: "/etc/cni/net.d".into(),
                bin_dir: root.join("bin"),
                bin_dir_on_node: "/opt/cni/bin".into(),
            },
            plugin: b"ipkeep plugin".to_vec(),
        };
        let e = evidence::read(&s).unwrap();
        assert_eq!(
            e.confs,
            vec![ConfFile::Skipped {
                file: "10-planted.conflist".into(),
                why: why.into()
            }],
            "{what}"
        );
        assert_eq!(snapshot(&root), before, "{what}: the tree changed");
    }
}
