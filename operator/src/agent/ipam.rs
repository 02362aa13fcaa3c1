//! The agent's view of its node for `ipkeep-operator check --ipam` ([`crate::check::ipam`]):
//! host-local's allocation files and the reservation files of every network it keeps, as JSON at
//! [`PATH`] on its probe port (beside `/metrics`).
//!
//! `check` runs outside the nodes, so the agent says what is on disk. It is served, not written
//! anywhere: it changes with every pod start and stop, and written (a pod condition, as for lost
//! reservations, or a ConfigMap, which would need a new right) it would be a write to the API
//! each time, sent to every watcher, of about 50 KiB for a full /24 (some 210 bytes an
//! allocation) per network. `check` reaches it through the API server's pod
//! proxy (`pods/proxy`, an admin's right), so the agent needs no new right either. What it shows
//! (addresses, container IDs, pod names of this node) is what the node's own files say; the
//! port is the node's (the agent runs with hostNetwork), as `/metrics` is.
//!
//! Read on request, on a blocking thread, without the network's lock: a report, not a decision.
//! A file that changes while it is read is shown as it was or is left out; `check` does not
//! judge what is younger than its grace period.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use ipkeep_hostlocal::store::Owner;
use ipkeep_netdir::{EntryKind, NetworkDir};
use ipkeep_reservation::add::RESERVED_DIR;
use ipkeep_reservation::{PodKey, Timestamp, load_reservations};
use serde::{Deserialize, Serialize};

use crate::rules::capacity::allocated;
use crate::runtime::logging::error_chain;

/// Where the agent serves its [`NodeView`].
pub const PATH: &str = "/ipam";
/// Allocation files are a container ID and an interface name; anything longer is not one.
const MAX_ALLOCATION_FILE: usize = 4096;

/// What one agent has on disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    /// The node.
    pub node: String,
    /// host-local's data directory on the node (the fixes name the files by their path there).
    pub data_dir: PathBuf,
    /// Every network the agent keeps, in its order.
    pub networks: Vec<NetworkView>,
}

/// One network's directory on the node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkView {
    /// The network's name (the directory below the data directory).
    pub network: String,
    /// Why the directory could not be read; then the lists are empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// host-local's allocation files (`<network>/<ip>`), by address.
    pub allocations: Vec<Allocation>,
    /// The valid reservation files (`<network>/reserved/<namespace>/<pod>`), by pod.
    pub reservations: Vec<ReservedFile>,
}

/// One allocation file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Allocation {
    /// The address (the file's name).
    pub ip: IpAddr,
    /// The container (sandbox) ID the file names; `None` for content no container can match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// The interface it names (`None` in a legacy, ID-only file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ifname: Option<String>,
    /// The pod ipkeep's container index records for that container and address, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodKey>,
    /// The file's modification time: when the address was allocated.
    pub modified: Timestamp,
}

/// One reservation file, as the plugin reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReservedFile {
    /// The pod (and reservation) it is for.
    pub pod: PodKey,
    /// The addresses it holds.
    pub ips: Vec<IpAddr>,
    /// When it stops holding them (`None`: the pod holds them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_time: Option<Timestamp>,
    /// The IPReservation's uid it was written from.
    pub uid: String,
    /// The file's modification time, when it could be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modified: Option<Timestamp>,
}

/// Reads the node's view (blocking: a listing and a small read per file).
pub fn read(node: &str, data_dir: &Path, networks: &[String]) -> NodeView {
    NodeView {
        node: node.to_owned(),
        data_dir: data_dir.to_owned(),
        networks: networks.iter().map(|n| network_view(data_dir, n)).collect(),
    }
}

fn network_view(data_dir: &Path, network: &str) -> NetworkView {
    let dir = match NetworkDir::open(data_dir, network) {
        Ok(dir) => dir,
        Err(e) => {
            return NetworkView {
                network: network.to_owned(),
                error: Some(error_chain(&e)),
                ..NetworkView::default()
            };
        }
    };
    let entries = match dir.entries() {
        Ok(entries) => entries,
        Err(e) => {
            return NetworkView {
                network: network.to_owned(),
                error: Some(error_chain(&e)),
                ..NetworkView::default()
            };
        }
    };
    let files: Vec<&str> = entries
        .iter()
        .filter(|e| e.kind == EntryKind::File)
        .map(|e| e.name.as_str())
        .collect();
    let recorded = ipkeep_hostlocal::recorded_pods(&dir);
    let allocations = allocated(files)
        .into_iter()
        .filter_map(|ip| {
            let name = ip.to_string();
            // Gone since the listing (a DEL): not an allocation any more.
            let stat = dir.stat(&name).ok()??;
            let owner = dir
                .read_file(&name, MAX_ALLOCATION_FILE)
                .ok()
                .flatten()
                .as_deref()
                .and_then(Owner::parse);
            let container_id = owner.as_ref().map(|o| o.container_id().to_owned());
            // A record of another container at this address is stale: it names no pod here.
            let pod = recorded
                .get(&ip)
                .filter(|(id, _)| Some(id) == container_id.as_ref())
                .map(|(_, pod)| pod.clone());
            Some(Allocation {
                ip,
                ifname: owner.as_ref().and_then(|o| o.ifname().map(str::to_owned)),
                container_id,
                pod,
                modified: timestamp_of_ns(stat.mtime_ns),
            })
        })
        .collect();
    let reserved = dir.path().join(RESERVED_DIR);
    let reservations = load_reservations(&dir)
        .files
        .into_iter()
        .map(|(key, file)| ReservedFile {
            modified: modified(&reserved.join(key.namespace()).join(key.name())),
            pod: key,
            ips: file.ips,
            release_time: file.release_time,
            uid: file.uid,
        })
        .collect();
    NetworkView {
        network: network.to_owned(),
        error: None,
        allocations,
        reservations,
    }
}

fn modified(path: &Path) -> Option<Timestamp> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    Some(Timestamp::from_system_time(meta.modified().ok()?))
}

fn timestamp_of_ns(ns: i128) -> Timestamp {
    let after = u64::try_from(ns).unwrap_or(0);
    Timestamp::from_system_time(UNIX_EPOCH + Duration::from_nanos(after))
}

/// Reads the view on a blocking thread and renders it as the HTTP body (JSON).
pub async fn served(node: String, data_dir: PathBuf, networks: Vec<String>) -> Vec<u8> {
    let view = tokio::task::spawn_blocking(move || read(&node, &data_dir, &networks)).await;
    match view {
        Ok(view) => serde_json::to_vec(&view).unwrap_or_default(),
        Err(e) => {
            tracing::error!(error = %e, "node view reader task failed");
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_lists_allocations_with_their_owner_and_the_reservation_files() {
        let data = tempfile::tempdir().unwrap();
        let net = data.path().join("net");
        std::fs::create_dir_all(net.join("reserved/db")).unwrap();
        std::fs::write(net.join("10.1.0.5"), "abc123\r\neth0").unwrap();
        std::fs::write(net.join("10.1.0.6"), "").unwrap();
        // ipkeep's container index names the pod of .5's container (and a stale record of
        // another container at .6, which names nobody).
        std::fs::create_dir_all(net.join(".ipkeep/containers")).unwrap();
        std::fs::write(
            net.join(".ipkeep/containers/abc123"),
            r#"{"containerID":"abc123","attachments":[{"ip":"10.1.0.5","ifname":"eth0","pod":{"namespace":"db","name":"web-0"}}]}"#,
        )
        .unwrap();
        std::fs::write(
            net.join(".ipkeep/containers/old9"),
            r#"{"containerID":"old9","attachments":[{"ip":"10.1.0.6","ifname":"eth0","pod":{"namespace":"db","name":"old-0"}}]}"#,
        )
        .unwrap();
        // Not allocations: the cursor, the lock, a name that is not an address's canonical text.
        std::fs::write(net.join("last_reserved_ip.0"), "10.1.0.6").unwrap();
        std::fs::write(net.join("lock"), "").unwrap();
        std::fs::write(net.join("010.1.0.7"), "x").unwrap();
        std::fs::write(
            net.join("reserved/db/web-0"),
            r#"{"version":1,"namespace":"db","pod":"web-0","ips":["10.1.0.9"],"releaseTime":null,"uid":"u-1"}"#,
        )
        .unwrap();
        let view = read("node-a", data.path(), &["net".to_owned()]);
        let json = serde_json::to_string(&view).unwrap();
        assert_eq!(serde_json::from_str::<NodeView>(&json).unwrap(), view);
        let n = &view.networks[0];
        assert_eq!(n.error, None);
        let owners: Vec<(String, Option<&str>, Option<&str>)> = n
            .allocations
            .iter()
            .map(|a| {
                (
                    a.ip.to_string(),
                    a.container_id.as_deref(),
                    a.ifname.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            owners,
            [
                ("10.1.0.5".to_owned(), Some("abc123"), Some("eth0")),
                ("10.1.0.6".to_owned(), None, None)
            ]
        );
        let pods: Vec<Option<String>> = n
            .allocations
            .iter()
            .map(|a| a.pod.as_ref().map(ToString::to_string))
            .collect();
        assert_eq!(pods, [Some("db/web-0".to_owned()), None]);
        assert!(n.allocations[0].modified > Timestamp::from_unix_secs(0));
        assert_eq!(n.reservations.len(), 1, "{n:?}");
        assert_eq!(n.reservations[0].pod.to_string(), "db/web-0");
        assert_eq!(
            n.reservations[0].ips,
            ["10.1.0.9".parse::<IpAddr>().unwrap()]
        );
        assert!(n.reservations[0].modified.is_some());
    }
}
