//! How a node trusts a private registry, as the users of its runtime configure one
//! (docs/real-nodes.md, "A private registry"). Only the registry's CA: the credentials come from
//! the pod's `imagePullSecrets`, which the kubelet passes in each CRI `PullImage` call.
//!
//! - containerd 2.1 reads `<config_path>/<host:port>/hosts.toml` at each pull, `config_path`
//!   being the CRI image plugin's (`[plugins.'io.containerd.cri.v1.images'.registry]`, unset by
//!   default: without it no directory is read); the file's `ca` names the CA, relative to its
//!   directory (`core/remotes/docker/config/hosts.go`). The nodes' `config_path` is
//!   [`CONTAINERD_HOSTS_DIR`] in the harness's directory of the node's files (the
//!   `config.toml` that names it is in the node's own `/etc/containerd`, or k3s's place).
//! - CRI-O 1.34 sets no certificate directory of its own, so containers/image reads every
//!   `*.crt` of `/etc/containers/certs.d/<host:port>/` at each pull (`docker/docker_client.go`,
//!   `dockerCertDir`). A CRI-O node sees the machine's `/etc/containers` through an overlay whose
//!   upper layer is its own ([`CONTAINERS_ETC`]), so what it adds never reaches the machine's
//!   `/etc`. Its registries.conf needs no entry: a registry it does not name is TLS-verified and
//!   not blocked, and a registry outside `127.0.0.0/8` is not insecure to CRI-O.

use std::path::{Path, PathBuf};

use super::{
    RealNodeError,
    layout::{NodeLayout, NodeRuntime},
};

/// containerd's hosts directory (`config_path`), in a node's configuration directory.
pub const CONTAINERD_HOSTS_DIR: &str = "certs.d";
/// The CA's file name in a registry's hosts (containerd) or certificate (CRI-O) directory.
pub const CA_FILE: &str = "ca.crt";
/// The directory whose `*.crt` files CRI-O trusts for a registry: `<this>/<host:port>/`.
pub const CRIO_CERTS_DIR: &str = "/etc/containers/certs.d";
/// The machine's directory a CRI-O node sees through an overlay of its own (source name
/// `ipkeep-node-etc-containers`, by which the node tells it from the machine's directory).
pub const CONTAINERS_ETC: &str = "/etc/containers";

/// The `hosts.toml` of a registry at `host_port` whose certificates the CA in [`CA_FILE`]
/// beside it signs: pull, resolve and push go to it over TLS.
pub fn hosts_toml(host_port: &str) -> String {
    format!(
        "# A private registry: TLS with its own CA; the credentials come from the pull secret.\n\
         server = \"https://{host_port}\"\n\
         ca = \"{CA_FILE}\"\n"
    )
}

/// The `hosts.toml` of the private registry at `host_port` with the node's own login (`basic`:
/// base64 of `user:password`) as the `Authorization` header of every request: nodes that log in
/// themselves, so that pods need no pull secret (k3s's `registries.yaml` does the same).
pub fn login_hosts_toml(host_port: &str, basic: &str) -> String {
    format!(
        "# A private registry: TLS with its own CA, the node's own login.\n\
         [host.\"https://{host_port}\"]\n\
         \x20 capabilities = [\"pull\", \"resolve\"]\n\
         \x20 ca = \"{CA_FILE}\"\n\
         \x20 [host.\"https://{host_port}\".header]\n\
         \x20   Authorization = \"Basic {basic}\"\n"
    )
}

/// Refuses a registry address that is not one directory name: `host:port`, `host`, or
/// `[v6]:port`.
pub fn check_host_port(host_port: &str) -> Result<(), RealNodeError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || ".-:[]".contains(c);
    if host_port.is_empty() || host_port.starts_with('.') || !host_port.chars().all(allowed) {
        return Err(RealNodeError::Invalid {
            what: "registry address",
            value: host_port.to_owned(),
            why: "host:port, a host or [v6]:port, nothing that is not a single directory name",
        });
    }
    Ok(())
}

/// The upper and work directories of a CRI-O node's overlay over [`CONTAINERS_ETC`], in its
/// data directory (removed with it).
pub fn overlay_layers(node: NodeLayout) -> (PathBuf, PathBuf) {
    let base = node.data_dir().join("etc-containers");
    (base.join("upper"), base.join("work"))
}

/// The shell run in a CRI-O node before CRI-O starts: its overlay over `$1` (upper `$2`, work
/// `$3`) unless it is there already (a restart of CRI-O keeps the mount namespace; a reboot
/// makes a new one without it).
pub const OVERLAY_SCRIPT: &str = r#"findmnt -n -S ipkeep-node-etc-containers -M "$1" >/dev/null && exit 0
mount -t overlay ipkeep-node-etc-containers -o "lowerdir=$1,upperdir=$2,workdir=$3" "$1""#;

/// The shell, run in a CRI-O node with the CA on stdin, that writes it to `$1/ca.crt` (under a
/// name CRI-O does not read first: a pull meanwhile sees no half-written CA), and only when
/// `$1` is under the node's own overlay.
const WRITE_CA_SCRIPT: &str = r#"findmnt -n -S ipkeep-node-etc-containers -M /etc/containers >/dev/null || {
  echo "/etc/containers is the machine's here, not the node's overlay: refusing to write $1" >&2
  exit 1
}
mkdir -p "$1"
cat > "$1/ca.crt.new"
mv "$1/ca.crt.new" "$1/ca.crt""#;

/// Makes the node `node` (running `runtime`, configuration in `config_dir`) trust the registry
/// at `host_port` whose certificates `ca_pem` signs. containerd's files are written from here
/// (its configuration directory is the machine's); CRI-O's inside the node, through its overlay.
pub(super) fn trust(
    node: &super::RealNode,
    runtime: NodeRuntime,
    config_dir: &Path,
    host_port: &str,
    ca_pem: &str,
) -> Result<(), RealNodeError> {
    check_host_port(host_port)?;
    match runtime {
        NodeRuntime::Containerd => write_hosts(
            node,
            &config_dir.join(CONTAINERD_HOSTS_DIR).join(host_port),
            ca_pem,
            &hosts_toml(host_port),
        ),
        NodeRuntime::CriO => {
            let dir = format!("{CRIO_CERTS_DIR}/{host_port}");
            let mut command = node.command("sh");
            command.args(["-c", WRITE_CA_SCRIPT, "sh", &dir]);
            crate::command::checked(&mut command, crate::command::Stdin::Text(ca_pem))
                .map(drop)
                .map_err(|e| RealNodeError::Host {
                    node: node.name(),
                    stage: format!("write the registry's CA to {dir}/{CA_FILE}"),
                    source: e.into(),
                })
        }
    }
}

/// Writes a containerd host directory `dir`: the CA, then the `hosts.toml` that names it (a
/// pull meanwhile finds both or neither).
fn write_hosts(
    node: &super::RealNode,
    dir: &Path,
    ca_pem: &str,
    hosts: &str,
) -> Result<(), RealNodeError> {
    let io = |what: &str, path: &Path| {
        let what = format!("{what} {}", path.display());
        let name = node.name();
        move |source| RealNodeError::Io {
            node: name,
            what,
            source,
        }
    };
    std::fs::create_dir_all(dir).map_err(io("create", dir))?;
    for (file, text) in [(CA_FILE, ca_pem), ("hosts.toml", hosts)] {
        let path = dir.join(file);
        let tmp = dir.join(format!(".{file}.new"));
        std::fs::write(&tmp, text).map_err(io("write", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io("write", &path))?;
    }
    Ok(())
}

/// Makes a containerd node trust the private registry at `host_port` and log in to it itself
/// ([`login_hosts_toml`]): no pull secret needed. CRI-O nodes are refused (their logins are
/// an auth file's).
pub(super) fn trust_with_login(
    node: &super::RealNode,
    runtime: NodeRuntime,
    config_dir: &Path,
    host_port: &str,
    ca_pem: &str,
    basic: &str,
) -> Result<(), RealNodeError> {
    check_host_port(host_port)?;
    if runtime != NodeRuntime::Containerd {
        return Err(RealNodeError::Invalid {
            what: "runtime for a node's own registry login",
            value: runtime.name().to_owned(),
            why: "only containerd nodes' hosts.toml logins are written here",
        });
    }
    write_hosts(
        node,
        &config_dir.join(CONTAINERD_HOSTS_DIR).join(host_port),
        ca_pem,
        &login_hosts_toml(host_port, basic),
    )
}

/// Lays the node's own layer over [`CONTAINERS_ETC`] (once per mount namespace); the machine's
/// directory must exist (buildah's package, `make packaging-deps`, installs it).
pub(super) fn overlay_containers_etc(node: &super::RealNode) -> Result<(), RealNodeError> {
    if !Path::new(CONTAINERS_ETC).is_dir() {
        return Err(RealNodeError::Invalid {
            what: "machine for a CRI-O node",
            value: format!("{CONTAINERS_ETC} is missing"),
            why: "a CRI-O node overlays the machine's /etc/containers to trust a registry; buildah's package installs it: make packaging-deps",
        });
    }
    let (upper, work) = overlay_layers(node.layout());
    for dir in [&upper, &work] {
        std::fs::create_dir_all(dir).map_err(|source| RealNodeError::Io {
            node: node.name(),
            what: format!("create {}", dir.display()),
            source,
        })?;
    }
    let (upper, work) = (upper.to_string_lossy(), work.to_string_lossy());
    node.exec(&[
        "sh",
        "-c",
        OVERLAY_SCRIPT,
        "sh",
        CONTAINERS_ETC,
        &*upper,
        &*work,
    ])
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The overlay's source name, which both scripts spell out.
    const OVERLAY_SOURCE: &str = "ipkeep-node-etc-containers";

    #[test]
    fn both_scripts_name_the_overlay_by_its_one_source_name() {
        for script in [OVERLAY_SCRIPT, WRITE_CA_SCRIPT] {
            assert!(
                script.contains(&format!("-S {OVERLAY_SOURCE} ")),
                "{script}"
            );
        }
        assert!(OVERLAY_SCRIPT.contains(&format!("overlay {OVERLAY_SOURCE} ")));
        assert!(WRITE_CA_SCRIPT.contains(&format!("-M {CONTAINERS_ETC} ")));
        assert!(WRITE_CA_SCRIPT.contains(&format!("/{CA_FILE}\"")));
    }

    #[test]
    fn hosts_toml_names_the_registry_over_tls_and_the_ca_beside_it() {
        let text = hosts_toml("198.18.0.1:5443");
        assert!(
            text.contains("server = \"https://198.18.0.1:5443\"\n"),
            "{text}"
        );
        assert!(text.contains(&format!("ca = \"{CA_FILE}\"\n")), "{text}");
    }

    #[test]
    fn a_registry_address_is_one_directory_name() {
        // (address, accepted)
        let cases = [
            ("198.18.0.1:5443", true),
            ("registry.example.internal", true),
            ("[fd00::1]:5000", true),
            ("", false),
            ("..", false),
            ("a/b:1", false),
            ("host:1/../../etc", false),
            ("host port", false),
        ];
        for (address, accepted) in cases {
            assert_eq!(check_host_port(address).is_ok(), accepted, "{address:?}");
        }
    }
}
