//! The node's whole filesystem, mounted at `--host-root` (the chart's `/host`, when `cni.binDir`
//! and `cni.confDir` are unset): reading the container runtime's configuration there and finding
//! the CNI directories it names ([`HostRoot::locate`], the rule being
//! [`crate::rules::cni_dirs::discover`]), for install-cni and the agent alike.
//!
//! Every node path is resolved under the root as a chroot would (`openat2` with
//! `RESOLVE_IN_ROOT`): an absolute symlink on the way (`/var/lib/rancher` linked to another disk, a
//! `current` release link) is followed inside the node's tree, never out of it into the
//! container's own. The directory found is then named by its real path in the container (the
//! kernel's name of the opened directory), which holds no symlink, so later path operations on
//! it (install-cni's links and renames, the agent's reads) stay in the node's tree. What is *in*
//! the directory is never followed: k3s's `data/cni` holds absolute symlinks into
//! `data/<release>/bin`, which install-cni keeps as symlinks.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};

use crate::rules::cni_dirs::{
    self, CONTAINERD_CONFIG, CRIO_CONFIG, CRIO_DROP_INS, CniDirs, DiscoveryError,
    K3S_CONTAINERD_CONFIG, RuntimeConfigs, VALUES_HINT,
};

/// Larger than any runtime configuration; a larger file is refused, not read.
const MAX_CONFIG: u64 = 1 << 20;

/// How many symbolic links a checked path may pass through (the kernel's limit).
const MAX_LINKS: usize = 40;

/// How the path walk is confined: inside the root, no `/proc/self/fd`-style magic links.
const IN_ROOT: ResolveFlags = ResolveFlags::IN_ROOT.union(ResolveFlags::NO_MAGICLINKS);

/// Errors of reading the node's root (each message ends with what to do).
#[derive(Debug, thiserror::Error)]
pub enum HostRootError {
    /// The root itself cannot be opened (the chart's `/` mount is missing).
    #[error("failed to open the node's root {}", .0.display())]
    Root(PathBuf, #[source] io::Error),
    /// The runtime's configuration does not tell the directories.
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    /// A directory on the way to a node path could be redirected or written by another user.
    #[error(
        "failed to trust {path} on the node: {component} {why}; {}",
        crate::install_cni::TRUST_HINT
    )]
    Untrusted {
        /// The node path being resolved.
        path: String,
        /// The component at fault, by its node path.
        component: String,
        /// What is wrong with it.
        why: String,
    },
    /// A file or directory on the node cannot be read.
    #[error("failed to {what} {path} on the node: {source}: {VALUES_HINT}")]
    Node {
        /// What was being done.
        what: &'static str,
        /// The node path.
        path: String,
        /// What failed (in the message: the hint follows it).
        source: io::Error,
    },
}

/// The node's CNI directories: as the node names them and as reachable here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    /// What the runtime's configuration says.
    pub dirs: CniDirs,
    /// The bin directory here (`None`: it does not exist on the node).
    pub bin_dir: Option<PathBuf>,
    /// The configuration directory here (`None`: it does not exist on the node).
    pub conf_dir: Option<PathBuf>,
}

/// The node's root, opened once.
#[derive(Debug)]
pub struct HostRoot {
    path: PathBuf,
    fd: OwnedFd,
}

impl HostRoot {
    /// Opens the node's root mounted at `path`.
    pub fn open(path: &Path) -> Result<Self, HostRootError> {
        let fd = rustix::fs::open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| HostRootError::Root(path.to_owned(), e.into()))?;
        Ok(Self {
            path: path.to_owned(),
            fd,
        })
    }

    /// Where the root is mounted here.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens `node_path` resolved inside the root: by the kernel (`openat2`), or, where the kernel
    /// has no `openat2` (before Linux 5.6; qemu-user before 9.1), by [`Self::walk_in`].
    fn open_in(&self, node_path: &str, flags: OFlags) -> io::Result<OwnedFd> {
        let relative = node_path.trim_start_matches('/');
        match rustix::fs::openat2(
            &self.fd,
            if relative.is_empty() { "." } else { relative },
            flags | OFlags::CLOEXEC,
            Mode::empty(),
            IN_ROOT,
        ) {
            Err(rustix::io::Errno::NOSYS) => self.walk_in(node_path, flags),
            done => done.map_err(io::Error::from),
        }
    }

    /// `openat2`'s `RESOLVE_IN_ROOT` done here, one component at a time: each opened without
    /// following it; a symbolic link's target is walked instead (an absolute one from the root),
    /// `..` never climbs above the root, and more than [`MAX_LINKS`] links is `ELOOP`. The last
    /// component is a link itself only when `flags` hold `O_NOFOLLOW`.
    fn walk_in(&self, node_path: &str, flags: OFlags) -> io::Result<OwnedFd> {
        let names = |path: &str| -> Vec<String> {
            path.split('/')
                .filter(|n| !n.is_empty() && *n != ".")
                .map(str::to_owned)
                .collect()
        };
        let mut pending: std::collections::VecDeque<String> = names(node_path).into();
        // The directories walked into, below the root; empty: at the root.
        let mut dirs: Vec<OwnedFd> = Vec::new();
        let mut links = 0;
        let found = loop {
            let Some(name) = pending.pop_front() else {
                break rustix::io::fcntl_dupfd_cloexec(dirs.last().unwrap_or(&self.fd), 0)?;
            };
            if name == ".." {
                dirs.pop();
                continue;
            }
            let dir = dirs.last().unwrap_or(&self.fd);
            let fd = rustix::fs::openat(
                dir,
                name.as_str(),
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            let kind = rustix::fs::FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode as _);
            if kind == rustix::fs::FileType::Symlink {
                if pending.is_empty() && flags.contains(OFlags::NOFOLLOW) {
                    break fd;
                }
                links += 1;
                if links > MAX_LINKS {
                    return Err(rustix::io::Errno::LOOP.into());
                }
                let target = rustix::fs::readlinkat(&fd, "", Vec::new())?;
                let target = target.to_string_lossy();
                if target.starts_with('/') {
                    dirs.clear();
                }
                for name in names(&target).into_iter().rev() {
                    pending.push_front(name);
                }
            } else if pending.is_empty() {
                break fd;
            } else {
                dirs.push(fd);
            }
        };
        let kind = rustix::fs::FileType::from_raw_mode(rustix::fs::fstat(&found)?.st_mode as _);
        if flags.contains(OFlags::DIRECTORY) && kind != rustix::fs::FileType::Directory {
            return Err(rustix::io::Errno::NOTDIR.into());
        }
        if flags.contains(OFlags::PATH) {
            return Ok(found);
        }
        // An O_PATH descriptor is opened for reading through its /proc name, which names the
        // very file (not a path walked again).
        rustix::fs::open(
            format!("/proc/self/fd/{}", found.as_raw_fd()),
            flags | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(io::Error::from)
    }

    /// A regular file's text (`None`: no such file).
    fn read_config(&self, node_path: &str) -> Result<Option<String>, HostRootError> {
        let err = |source| HostRootError::Node {
            what: "read",
            path: node_path.to_owned(),
            source,
        };
        // Non-blocking: a FIFO planted in its place is refused below, not waited on.
        let fd = match self.open_in(node_path, OFlags::RDONLY | OFlags::NONBLOCK) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(err(e)),
        };
        let file = File::from(fd);
        if !file.metadata().map_err(err)?.is_file() {
            return Err(err(io::Error::other("not a regular file")));
        }
        let mut text = String::new();
        file.take(MAX_CONFIG + 1)
            .read_to_string(&mut text)
            .map_err(err)?;
        if text.len() as u64 > MAX_CONFIG {
            return Err(err(io::Error::other(format!(
                "larger than {MAX_CONFIG} bytes"
            ))));
        }
        Ok(Some(text))
    }

    /// The candidate runtime configurations, as the node holds them.
    pub fn runtime_configs(&self) -> Result<RuntimeConfigs, HostRootError> {
        let mut drop_ins = Vec::new();
        if let Some(dir) = self.dir(CRIO_DROP_INS)? {
            let listing = |source| HostRootError::Node {
                what: "list",
                path: CRIO_DROP_INS.to_owned(),
                source,
            };
            for entry in std::fs::read_dir(&dir).map_err(listing)? {
                let name = entry.map_err(listing)?.file_name();
                let Some(name) = name.to_str() else { continue };
                if name.ends_with(".conf")
                    && let Some(text) = self.read_config(&format!("{CRIO_DROP_INS}/{name}"))?
                {
                    drop_ins.push((name.to_owned(), text));
                }
            }
        }
        Ok(RuntimeConfigs {
            k3s_containerd: self.read_config(K3S_CONTAINERD_CONFIG)?,
            containerd: self.read_config(CONTAINERD_CONFIG)?,
            crio: self.read_config(CRIO_CONFIG)?,
            crio_drop_ins: drop_ins,
        })
    }

    /// The directory at `node_path` here, resolved inside the root (`None`: it does not exist).
    pub fn dir(&self, node_path: &str) -> Result<Option<PathBuf>, HostRootError> {
        let err = |source| HostRootError::Node {
            what: "open the directory",
            path: node_path.to_owned(),
            source,
        };
        match self.open_in(node_path, OFlags::PATH | OFlags::DIRECTORY) {
            Ok(fd) => real_path(&fd).map(Some).map_err(err),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(err(e)),
        }
    }

    /// The directory at `node_path` here, created (mode 0755, each missing component inside the
    /// root) when it does not exist, as the chart's `DirectoryOrCreate` mount did.
    pub fn dir_or_create(&self, node_path: &str) -> Result<PathBuf, HostRootError> {
        if let Some(found) = self.dir(node_path)? {
            return Ok(found);
        }
        let (parent, name) = match node_path.trim_end_matches('/').rsplit_once('/') {
            Some((parent, name)) if !name.is_empty() => (parent, name),
            _ => {
                return Err(HostRootError::Node {
                    what: "create",
                    path: node_path.to_owned(),
                    source: io::Error::other("not a path below the root"),
                });
            }
        };
        if !parent.is_empty() {
            self.dir_or_create(parent)?;
        }
        let parent_fd = self
            .open_in(parent, OFlags::PATH | OFlags::DIRECTORY)
            .map_err(|source| HostRootError::Node {
                what: "open the directory",
                path: parent.to_owned(),
                source,
            })?;
        match rustix::fs::mkdirat(&parent_fd, name, Mode::from_raw_mode(0o755)) {
            Ok(()) => {}
            Err(rustix::io::Errno::EXIST) => {}
            Err(e) => {
                return Err(HostRootError::Node {
                    what: "create",
                    path: node_path.to_owned(),
                    source: e.into(),
                });
            }
        }
        self.dir(node_path)?.ok_or_else(|| HostRootError::Node {
            what: "create",
            path: node_path.to_owned(),
            source: io::Error::from(io::ErrorKind::NotFound),
        })
    }

    /// Refuses `node_path` when another user could redirect it or change what is in it: each
    /// component that exists, resolved inside the root, must be a symbolic link root owns whose
    /// target (checked the same way) stays inside the root, or a directory
    /// [`crate::install_cni::why_untrusted`] accepts (`node_path` itself being the directory
    /// written into). Components that do not exist end the walk: install-cni creates them, root's.
    pub fn check_trusted(&self, node_path: &str) -> Result<(), HostRootError> {
        self.check_trusted_within(node_path, node_path, true, 0)
    }

    fn check_trusted_within(
        &self,
        asked: &str,
        node_path: &str,
        final_dir: bool,
        links: usize,
    ) -> Result<(), HostRootError> {
        let untrusted = |component: &str, why: String| HostRootError::Untrusted {
            path: asked.to_owned(),
            component: component.to_owned(),
            why,
        };
        let node_err = |path: &str, source| HostRootError::Node {
            what: "inspect",
            path: path.to_owned(),
            source,
        };
        let names: Vec<&str> = node_path
            .split('/')
            .filter(|n| !n.is_empty() && *n != ".")
            .collect();
        let mut prefix = String::new();
        for (i, name) in names.iter().enumerate() {
            let parent = if prefix.is_empty() {
                "/".to_owned()
            } else {
                prefix.clone()
            };
            prefix.push('/');
            prefix.push_str(name);
            let last = final_dir && i + 1 == names.len();
            let fd = match self.open_in(&prefix, OFlags::PATH | OFlags::NOFOLLOW) {
                Ok(fd) => fd,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(node_err(&prefix, e)),
            };
            let st = rustix::fs::fstat(&fd).map_err(|e| node_err(&prefix, e.into()))?;
            let kind = rustix::fs::FileType::from_raw_mode(st.st_mode as _);
            if kind != rustix::fs::FileType::Symlink {
                if let Some(why) =
                    crate::install_cni::why_untrusted(st.st_uid, st.st_gid, st.st_mode as u32, last)
                {
                    return Err(untrusted(&prefix, why));
                }
                continue;
            }
            let euid = rustix::process::geteuid().as_raw();
            if st.st_uid != 0 && st.st_uid != euid {
                return Err(untrusted(
                    &prefix,
                    format!("is a symbolic link owned by uid {}, not root", st.st_uid),
                ));
            }
            if links >= MAX_LINKS {
                return Err(untrusted(
                    &prefix,
                    "passes through too many symbolic links".to_owned(),
                ));
            }
            let target = rustix::fs::readlinkat(&fd, "", Vec::new())
                .map_err(|e| node_err(&prefix, e.into()))?;
            let target = target.to_string_lossy().into_owned();
            // The node path the link leads to: an absolute target is the node's own path; a
            // relative one is taken from the directory the link is really in.
            let resolved = if target.starts_with('/') {
                target.clone()
            } else {
                let dir = self
                    .open_in(&parent, OFlags::PATH | OFlags::DIRECTORY)
                    .and_then(|fd| real_path(&fd))
                    .map_err(|e| node_err(&parent, e))?;
                let root = real_path(&self.fd).map_err(|e| node_err("/", e))?;
                let dir = dir
                    .strip_prefix(&root)
                    .unwrap_or(&dir)
                    .display()
                    .to_string();
                match climb(&format!("{dir}/{target}")) {
                    Some(path) => path,
                    None => {
                        return Err(untrusted(
                            &prefix,
                            format!(
                                "is a symbolic link to {target}, which leads out of the node's root"
                            ),
                        ));
                    }
                }
            };
            let rest = names[i + 1..].join("/");
            let through = if rest.is_empty() {
                resolved
            } else {
                format!("{resolved}/{rest}")
            };
            return self.check_trusted_within(asked, &through, final_dir, links + 1);
        }
        Ok(())
    }

    /// The CNI directories the node's runtime uses, as named and as reachable here.
    pub fn locate(&self) -> Result<Located, HostRootError> {
        let dirs = cni_dirs::discover(&self.runtime_configs()?)?;
        Ok(Located {
            bin_dir: self.dir(&dirs.bin_dir)?,
            conf_dir: self.dir(&dirs.conf_dir)?,
            dirs,
        })
    }
}

/// `path` with its `..` taken lexically (`None`: it climbs above `/`).
fn climb(path: &str) -> Option<String> {
    let mut names: Vec<&str> = Vec::new();
    for name in path.split('/') {
        match name {
            "" | "." => {}
            ".." => {
                names.pop()?;
            }
            name => names.push(name),
        }
    }
    Some(format!("/{}", names.join("/")))
}

/// The kernel's name of an opened directory, as this process sees it.
fn real_path(fd: &OwnedFd) -> io::Result<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A node root in a scratch directory, with k3s's layout: `data/current` a symlink to the
    /// release by its absolute node path.
    fn k3s_root() -> tempfile::TempDir {
        let tmp = tempfile::Builder::new()
            .prefix("ipkeep-hostroot-")
            .tempdir()
            .unwrap();
        let root = tmp.path();
        let data = root.join("var/lib/rancher/k3s/data");
        std::fs::create_dir_all(data.join("r1/bin")).unwrap();
        symlink("/var/lib/rancher/k3s/data/r1", data.join("current")).unwrap();
        std::fs::create_dir_all(root.join("var/lib/rancher/k3s/agent/etc/containerd")).unwrap();
        tmp
    }

    #[test]
    fn a_symlink_on_the_way_resolves_inside_the_root_never_out_of_it() {
        let tmp = k3s_root();
        let root = tmp.path().canonicalize().unwrap();
        std::fs::write(
            root.join("var/lib/rancher/k3s/agent/etc/containerd/config.toml"),
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".cni]\nbin_dir = \"/var/lib/rancher/k3s/data/current/bin\"\nconf_dir = \"/escape/net.d\"\n",
        )
        .unwrap();
        // An absolute link to /etc: resolved under the root, the node's /etc (no net.d there).
        std::fs::create_dir_all(root.join("etc")).unwrap();
        symlink("/etc", root.join("escape")).unwrap();
        let host = HostRoot::open(&root).unwrap();
        let found = host.locate().unwrap();
        assert_eq!(found.dirs.bin_dir, "/var/lib/rancher/k3s/data/current/bin");
        assert_eq!(
            found.bin_dir,
            Some(root.join("var/lib/rancher/k3s/data/r1/bin"))
        );
        assert_eq!(found.conf_dir, None);
        // Created inside the root, through the link.
        let made = host.dir_or_create("/escape/net.d").unwrap();
        assert_eq!(made, root.join("etc/net.d"));
        assert!(!Path::new("/etc/net.d").exists());
    }

    /// Where the kernel has `openat2`, the walk done here must resolve as it does.
    #[test]
    fn the_walk_here_resolves_as_the_kernels_in_root_lookup() {
        let tmp = k3s_root();
        let root = tmp.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("etc/cni/net.d")).unwrap();
        std::fs::write(root.join("etc/cni/net.d/10-a.conflist"), "{}").unwrap();
        symlink("../../etc/cni", root.join("var/lib/relative")).unwrap();
        symlink("../../../../../../etc", root.join("var/lib/rancher/climbs")).unwrap();
        symlink("/loop-b", root.join("loop-a")).unwrap();
        symlink("/loop-a", root.join("loop-b")).unwrap();
        symlink("/etc/cni/net.d/10-a.conflist", root.join("conf-link")).unwrap();
        let host = HostRoot::open(&root).unwrap();
        let named = |fd: io::Result<OwnedFd>| match fd {
            Ok(fd) => Ok(real_path(&fd).unwrap()),
            Err(e) => Err(e.raw_os_error()),
        };
        let dir = OFlags::PATH | OFlags::DIRECTORY;
        // A node path, how it is opened, and what it resolves to (or the error number).
        type Resolved = Result<PathBuf, Option<i32>>;
        let cases: &[(&str, OFlags, Resolved)] = &[
            ("/", dir, Ok(root.clone())),
            (
                "/var/lib/rancher/k3s/data/current/bin",
                dir,
                Ok(root.join("var/lib/rancher/k3s/data/r1/bin")),
            ),
            (
                "/var/lib/relative/net.d",
                dir,
                Ok(root.join("etc/cni/net.d")),
            ),
            ("/var/lib/rancher/climbs/cni", dir, Ok(root.join("etc/cni"))),
            ("/../../etc/./cni/", dir, Ok(root.join("etc/cni"))),
            (
                "/conf-link",
                OFlags::RDONLY,
                Ok(root.join("etc/cni/net.d/10-a.conflist")),
            ),
            (
                "/conf-link",
                OFlags::PATH | OFlags::NOFOLLOW,
                Ok(root.join("conf-link")),
            ),
            ("/conf-link", dir, Err(Some(libc_errno::NOTDIR))),
            ("/loop-a/x", dir, Err(Some(libc_errno::LOOP))),
            ("/etc/missing", dir, Err(Some(libc_errno::NOENT))),
        ];
        for (path, flags, want) in cases {
            assert_eq!(&named(host.walk_in(path, *flags)), want, "walked: {path}");
            assert_eq!(&named(host.open_in(path, *flags)), want, "opened: {path}");
        }
    }

    /// The errors the walk is compared on.
    mod libc_errno {
        pub const NOTDIR: i32 = rustix::io::Errno::NOTDIR.raw_os_error();
        pub const LOOP: i32 = rustix::io::Errno::LOOP.raw_os_error();
        pub const NOENT: i32 = rustix::io::Errno::NOENT.raw_os_error();
    }

    #[test]
    fn crio_drop_ins_are_read_and_nothing_found_says_what_to_set() {
        let tmp = tempfile::Builder::new()
            .prefix("ipkeep-hostroot-")
            .tempdir()
            .unwrap();
        let root = tmp.path();
        let host = HostRoot::open(root).unwrap();
        let none = host.locate().unwrap_err().to_string();
        assert!(
            none.starts_with("no containerd or CRI-O configuration found"),
            "{none}"
        );
        std::fs::create_dir_all(root.join("etc/crio/crio.conf.d")).unwrap();
        std::fs::write(
            root.join("etc/crio/crio.conf"),
            "[crio.network]\nnetwork_dir = \"/etc/cni/net.d/\"\n",
        )
        .unwrap();
        std::fs::write(
            root.join("etc/crio/crio.conf.d/10-bin.conf"),
            "[crio.network]\nplugin_dirs = [\"/usr/libexec/cni/\"]\n",
        )
        .unwrap();
        std::fs::write(root.join("etc/crio/crio.conf.d/README"), "not read").unwrap();
        let found = host.locate().unwrap();
        assert_eq!(found.dirs.bin_dir, "/usr/libexec/cni");
        assert_eq!(found.dirs.conf_dir, "/etc/cni/net.d");
        assert_eq!(found.bin_dir, None);
        // A directory where the file should be: an error naming it, and the values.
        std::fs::create_dir_all(root.join("etc/containerd/config.toml")).unwrap();
        let text = host.locate().unwrap_err().to_string();
        assert_eq!(
            text,
            "failed to read /etc/containerd/config.toml on the node: not a regular file: set the chart values cni.binDir and cni.confDir"
        );
    }
}
