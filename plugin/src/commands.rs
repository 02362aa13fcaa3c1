//! The CNI commands ADD, DEL, CHECK, GC and STATUS, with host-local's semantics and messages.
//!
//! Every command takes the network lock once and holds it to the end, so a whole ADD or DEL is
//! atomic (host-local locks each range set separately).

use std::collections::HashSet;
use std::net::IpAddr;
use std::path::Path;
use std::time::SystemTime;

use crate::neighbour::NeighbourTable;
use ipkeep_hostlocal::Candidates;
use ipkeep_hostlocal::DiskStore;
use ipkeep_hostlocal::allocator::{self, Request};
use ipkeep_hostlocal::config::{self, IpamConfig};
use ipkeep_hostlocal::gojson::Value;
use ipkeep_hostlocal::result::{CniResult, result_json};
use ipkeep_hostlocal::store::{LegacyRelease, Owner, Store};
use ipkeep_netdir::NetworkDir;
use ipkeep_reservation::add::DEFAULT_GRACE;
use ipkeep_reservation::{PodKey, Timestamp};

mod adopt;
mod reservations;

use reservations::{AddFacts, ReservationLog};

/// The `CNI_*` values a command uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CmdArgs {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_ARGS`.
    pub args: String,
}

/// A CNI error: code, message, details.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{msg}")]
pub struct CniError {
    /// The CNI error code.
    pub code: u32,
    /// The message.
    pub msg: String,
    /// Details (omitted from the JSON when empty).
    pub details: String,
}

impl CniError {
    /// An error with no details.
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        Self {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    /// Code 999: how the CNI library reports every plain error a plugin returns.
    pub fn internal(msg: impl std::fmt::Display) -> Self {
        Self::new(999, msg.to_string())
    }
}

/// What a successful command prints, plus lines for stderr.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Output {
    /// stdout (empty for DEL, CHECK, GC, STATUS).
    pub stdout: String,
    /// stderr lines.
    pub log: Vec<String>,
}

/// A failed command: the error and the stderr lines gathered before it.
pub type Failure = (CniError, Vec<String>);

fn load(doc: &Value, args: &CmdArgs) -> Result<IpamConfig, Failure> {
    config::load(doc, &args.args).map_err(|e| (CniError::internal(e), Vec::new()))
}

fn open_dir(conf: &IpamConfig) -> Result<NetworkDir, Failure> {
    NetworkDir::open(Path::new(&conf.data_dir), &conf.name)
        .map_err(|e| (CniError::internal(e), Vec::new()))
}

/// The network's store, locked; a directory without ipkeep's index first takes back the
/// addresses the runtime's result cache names ([`adopt`]).
fn open_store<'a>(
    dir: &'a NetworkDir,
    now: SystemTime,
    doc: &Value,
    conf: &IpamConfig,
) -> Result<DiskStore<'a>, Failure> {
    let cache_dir = config::cni_cache_dir(doc).map_err(|e| (CniError::internal(e), Vec::new()))?;
    let mut store = DiskStore::open(dir, now).map_err(|e| (CniError::internal(e), Vec::new()))?;
    match adopt::adopt_cached(&mut store, &conf.name, &conf.range_sets, &cache_dir) {
        Ok(()) => Ok(store),
        Err(e) => Err((e, store.finish())),
    }
}

/// The pod `CNI_ARGS` names, recorded with the allocations. A name Kubernetes would not accept
/// gets no key: such a pod cannot have a reservation anyway, which is all the record is for.
fn pod_of(conf: &IpamConfig) -> Option<PodKey> {
    match (&conf.args.pod_namespace, &conf.args.pod_name) {
        (Some(namespace), Some(name)) => PodKey::new(namespace, name).ok(),
        _ => None,
    }
}

/// ADD: one address per range set (requested ones where asked), printed for the config's version.
/// A pod with an active reservation gets its reserved addresses; nobody else ever gets them
/// (see [`ipkeep_reservation`]). The host's neighbour entries for the addresses handed out are
/// removed ([`clear_neighbours`]).
pub fn add(
    doc: &Value,
    args: &CmdArgs,
    now: SystemTime,
    neighbours: &dyn NeighbourTable,
) -> Result<Output, Failure> {
    let conf = load(doc, args)?;
    let grace = config::reservation_grace(doc)
        .map_err(|e| (CniError::internal(e), Vec::new()))?
        .unwrap_or(DEFAULT_GRACE);
    let mut result = CniResult::default();
    if !conf.resolv_conf.is_empty() {
        result.dns = ipkeep_hostlocal::read_resolv_conf(&conf.resolv_conf)
            .map_err(|e| (CniError::internal(e), Vec::new()))?;
    }
    let dir = open_dir(&conf)?;
    let mut store = open_store(&dir, now, doc, &conf)?;
    let pod = pod_of(&conf);
    // Requested addresses, de-duplicated, in the order given (host-local uses Go's random map
    // order when two compete for one range set; ipkeep deterministically takes the first).
    let mut requested: Vec<IpAddr> = Vec::new();
    for ip in &conf.requested {
        if !requested.contains(ip) {
            requested.push(*ip);
        }
    }
    let mut rlog = ReservationLog::new(&conf.name);
    let facts = AddFacts {
        conf: &conf,
        container_id: &args.container_id,
        requested: &requested,
        now: Timestamp::from_system_time(now),
        grace,
    };
    let plan = match reservations::plan_add(&dir, &mut store, &facts, &mut rlog) {
        Ok(plan) => plan,
        Err(e) => return Err((e, with_store_log(store, rlog))),
    };
    let is_blocked = |ip: IpAddr| plan.is_blocked(ip);
    let mut reserved: Vec<IpAddr> = Vec::new();
    for (idx, set) in conf.range_sets.iter().enumerate() {
        let wanted = requested
            .iter()
            .position(|ip| set.contains(*ip))
            .map(|i| requested.remove(i));
        let preferred = plan.preferred.get(idx).copied().flatten();
        let req = Request {
            container_id: &args.container_id,
            ifname: &args.ifname,
            range_id: idx,
            set,
            requested: wanted,
            preferred,
            is_blocked: &is_blocked,
            pod: pod.as_ref(),
        };
        match allocator::allocate(&mut store, &req) {
            Ok(ip) => {
                if let Some(want) = preferred {
                    let who = plan
                        .me
                        .as_ref()
                        .map_or_else(String::new, |me| format!("pod {me}: "));
                    if ip.address == want {
                        rlog.line(format_args!("{who}handing out its reserved address {want}"));
                    } else {
                        rlog.line(format_args!(
                            "{who}reserved address {want} could not be taken; allocated {} instead",
                            ip.address
                        ));
                    }
                }
                reserved.push(ip.address);
                result.ips.push(ip);
            }
            Err(e) => {
                release_all(&mut store, &reserved, args);
                return Err((
                    CniError::internal(format!("failed to allocate for range {idx}: {e}")),
                    with_store_log(store, rlog),
                ));
            }
        }
    }
    if !requested.is_empty() {
        release_all(&mut store, &reserved, args);
        let list: String = requested.iter().map(|ip| format!(" {ip}")).collect();
        return Err((
            CniError::internal(format!("failed to allocate all requested IPs:{list}")),
            with_store_log(store, rlog),
        ));
    }
    result.routes = conf.routes.clone();
    // After the lock is released: the flush concerns no other ADD.
    let mut log = store.finish();
    clear_neighbours(neighbours, &reserved, &mut rlog);
    log.extend(rlog.into_lines());
    Ok(Output {
        stdout: result_json(&result, &conf.cni_version),
        log,
    })
}

/// Removes the host's neighbour entries for `ips`, which change hands: an address ADD hands out
/// is free, so an entry for it names a previous holder's MAC (the reason is in
/// [`crate::neighbour`]), and one DEL frees names a MAC that is going away. Best effort: every
/// entry removed and every failure is one log line, never the command's error.
fn clear_neighbours(table: &dyn NeighbourTable, ips: &[IpAddr], log: &mut ReservationLog) {
    use crate::neighbour::{lladdr_text, state_name};
    let removals = match table.flush(ips) {
        Ok(removals) => removals,
        Err(e) => {
            let list: Vec<String> = ips.iter().map(ToString::to_string).collect();
            log.line(format_args!(
                "failed to remove the host's neighbour entries for {}: {}; until they expire the host may send their traffic to their previous holders",
                list.join(", "),
                ipkeep_reservation::error_chain(&e)
            ));
            return;
        }
    };
    for r in removals {
        let entry = &r.entry;
        let interface = r
            .interface
            .unwrap_or_else(|| format!("interface index {}", entry.ifindex));
        let what = format!(
            "the neighbour entry {} lladdr {} {} on {interface}",
            entry.dst,
            lladdr_text(&entry.lladdr),
            state_name(entry.state)
        );
        match r.outcome {
            Ok(()) => log.line(format_args!("removed {what}")),
            Err(e) => log.line(format_args!(
                "failed to remove {what}: {e}; until it expires the host may send {}'s traffic there",
                entry.dst
            )),
        }
    }
}

/// Ends the store (sealing its index) and appends the reservation lines to its log.
fn with_store_log(store: DiskStore<'_>, rlog: ReservationLog) -> Vec<String> {
    let mut log = store.finish();
    log.extend(rlog.into_lines());
    log
}

/// Frees exactly what this ADD reserved (host-local frees every address of the container,
/// including an earlier ADD's: ipkeep does not).
fn release_all(store: &mut DiskStore<'_>, reserved: &[IpAddr], args: &CmdArgs) {
    for ip in reserved {
        let _ = store.release(*ip, &args.container_id, &args.ifname);
    }
}

/// DEL: frees the container's addresses with host-local's rule for legacy files, and removes the
/// host's neighbour entries for them ([`clear_neighbours`]).
pub fn del(
    doc: &Value,
    args: &CmdArgs,
    now: SystemTime,
    neighbours: &dyn NeighbourTable,
) -> Result<Output, Failure> {
    let conf = load(doc, args)?;
    let dir = open_dir(&conf)?;
    let mut store = open_store(&dir, now, doc, &conf)?;
    let legacy = if conf.range_sets.len() >= 2 {
        LegacyRelease::Always
    } else {
        LegacyRelease::IfNoneMatched
    };
    let released = store.release_by_id(&args.container_id, &args.ifname, legacy);
    let mut log = store.finish();
    match released {
        Ok(freed) => {
            let mut nlog = ReservationLog::new(&conf.name);
            clear_neighbours(neighbours, &freed, &mut nlog);
            log.extend(nlog.into_lines());
            Ok(Output {
                stdout: String::new(),
                log,
            })
        }
        Err(e) => Err((CniError::internal(e), log)),
    }
}

/// CHECK: succeeds iff the container holds any address in this network (as host-local).
pub fn check(doc: &Value, args: &CmdArgs, now: SystemTime) -> Result<Output, Failure> {
    let conf = load(doc, args)?;
    let dir = open_dir(&conf)?;
    let mut store = open_store(&dir, now, doc, &conf)?;
    let found = store.find_by_id(&args.container_id, &args.ifname);
    let log = store.finish();
    match found {
        Ok(true) => Ok(Output {
            stdout: String::new(),
            log,
        }),
        Ok(false) => Err((
            CniError::internal(format!(
                "host-local: Failed to find address added by container {}",
                args.container_id
            )),
            log,
        )),
        Err(e) => Err((CniError::internal(e), log)),
    }
}

/// GC (CNI 1.1): frees every allocation whose attachment is not in `cni.dev/valid-attachments`;
/// a request without that list frees nothing (an empty list frees everything), and a list that
/// is not one of attachments, or names a container ID no runtime writes, is a CNI error that
/// frees nothing.
///
/// Reservations are not allocations: a stale container's file is freed even when its address is
/// reserved. The reservation goes on holding the address (ADD never hands it to another pod), so
/// GC never frees a reserved address for another pod, while the pod it is reserved for gets it
/// back at once instead of waiting for a container that no longer exists. GC also removes the
/// wait markers of pods that no longer have an active reservation.
pub fn gc(doc: &Value, args: &CmdArgs, now: SystemTime) -> Result<Output, Failure> {
    let conf = load(doc, args)?;
    let valid = config::valid_attachments(doc).map_err(|e| (CniError::internal(e), Vec::new()))?;
    // An entry no runtime writes (a container ID outside CNI's grammar) makes the whole list
    // suspect: freeing by it could free what is in use. Refused before anything is touched.
    if let Some(bad) = valid
        .iter()
        .flatten()
        .find(|a| !ipkeep_hostlocal::store::is_valid_container_id(&a.container_id))
    {
        return Err((
            CniError {
                code: 7,
                msg: format!(
                    "invalid containerID in {}: GC freed nothing",
                    config::VALID_ATTACHMENTS_KEY
                ),
                details: bad.container_id.clone(),
            },
            Vec::new(),
        ));
    }
    let dir = open_dir(&conf)?;
    // The spec has the runtime send the list; a request without it is no reason to wipe the node.
    let Some(valid) = valid else {
        return Ok(Output {
            stdout: String::new(),
            log: vec![format!(
                "ipkeep: {}: GC freed nothing: the request has no \"{}\" list (an empty list would free every allocation)",
                conf.name,
                config::VALID_ATTACHMENTS_KEY
            )],
        });
    };
    let mut store = open_store(&dir, now, doc, &conf)?;
    // Sets, not a scan per allocation: a 1 MiB request against a full /16 would otherwise be
    // billions of comparisons.
    let attachments: HashSet<(&str, &str)> = valid
        .iter()
        .map(|a| (a.container_id.as_str(), a.ifname.as_str()))
        .collect();
    let containers: HashSet<&str> = valid.iter().map(|a| a.container_id.as_str()).collect();
    let is_valid = |owner: &Owner| match owner {
        Owner::Attachment {
            container_id,
            ifname,
        } => attachments.contains(&(container_id.as_str(), ifname.as_str())),
        Owner::Legacy { container_id } => containers.contains(container_id.as_str()),
    };
    let freed = store.collect_garbage(&is_valid, &|_| false);
    let mut rlog = ReservationLog::new(&conf.name);
    reservations::prune_waits(&dir, Timestamp::from_system_time(now), &mut rlog);
    let mut log = store.finish();
    match freed {
        Ok(freed) => {
            log.extend(freed.iter().map(|ip| format!("ipkeep: GC freed {ip}")));
            log.extend(rlog.into_lines());
            Ok(Output {
                stdout: String::new(),
                log,
            })
        }
        Err(e) => Err((CniError::internal(e), log)),
    }
}

/// STATUS (CNI 1.1): ready when the data directory is usable and every range set still has a
/// free address (an exhausted set makes every ADD fail, so ipkeep is then not ready: code 50).
///
/// A free address that an active reservation holds still counts as free: the pod it is reserved
/// for can be added, so not *every* ADD fails, and reporting "not ready" would keep the returning
/// pods away too. When every free address of a set is reserved, STATUS succeeds and says so on
/// stderr (a pod without a reservation then gets the normal range-full error).
pub fn status(doc: &Value, args: &CmdArgs, now: SystemTime) -> Result<Output, Failure> {
    let conf = load(doc, args)?;
    let dir = open_dir(&conf).map_err(|(e, l)| (CniError { code: 50, ..e }, l))?;
    let mut store =
        open_store(&dir, now, doc, &conf).map_err(|(e, l)| (CniError { code: 50, ..e }, l))?;
    let mut rlog = ReservationLog::new(&conf.name);
    let reservations =
        reservations::Reservations::load(&dir, &store, Timestamp::from_system_time(now), &mut rlog);
    for (idx, set) in conf.range_sets.iter().enumerate() {
        let (mut free, mut unreserved) = (false, false);
        for (ip, _) in Candidates::new(set, None) {
            if store.is_free(ip).unwrap_or(false) {
                free = true;
                if !reservations.is_blocked(ip, None) {
                    unreserved = true;
                    break;
                }
            }
        }
        if !free {
            return Err((
                CniError::new(
                    50,
                    format!(
                        "range set {idx} is exhausted: no IP addresses available in range set: {set}"
                    ),
                ),
                with_store_log(store, rlog),
            ));
        }
        if !unreserved {
            rlog.line(format_args!(
                "range set {idx} ({set}) has free addresses, but every one is reserved: only pods with a reservation can be added"
            ));
        }
    }
    Ok(Output {
        stdout: String::new(),
        log: with_store_log(store, rlog),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::neighbour::{FlushError, Neighbour, Recorder, Removal};
    use rustix::io::Errno;
    use tempfile::TempDir;

    fn doc(data_dir: &Path) -> Value {
        let json = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "neighnet",
            "type": "bridge",
            "ipam": {
                "type": "ipkeep",
                "ranges": [[{ "subnet": "198.18.7.0/24" }], [{ "subnet": "2001:db8:7::/64" }]],
                "dataDir": data_dir,
            },
        });
        ipkeep_hostlocal::gojson::parse(json.to_string().as_bytes()).unwrap()
    }

    fn args(container: &str) -> CmdArgs {
        CmdArgs {
            container_id: container.to_owned(),
            ifname: "eth0".to_owned(),
            args: String::new(),
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn entry(dst: &str) -> Neighbour {
        Neighbour {
            ifindex: 7,
            state: 0x02,
            flags: 0,
            dst: ip(dst),
            lladdr: vec![0xaa, 0x5d, 0x8b, 0x7d, 0x61, 0x18],
        }
    }

    #[test]
    fn add_and_del_flush_exactly_the_addresses_they_hand_out_and_free() {
        let scratch = TempDir::new().unwrap();
        let (doc, now) = (doc(scratch.path()), SystemTime::UNIX_EPOCH);
        let table = Recorder::empty();
        let added = add(&doc, &args("c1"), now, &table).unwrap();
        let both = vec![ip("198.18.7.2"), ip("2001:db8:7::2")];
        assert_eq!(*table.asked.borrow(), vec![both.clone()]);
        assert!(
            added.log.is_empty(),
            "no entry, nothing to say: {:?}",
            added.log
        );
        del(&doc, &args("c1"), now, &table).unwrap();
        assert_eq!(*table.asked.borrow(), vec![both.clone(), both]);
        // A DEL that frees nothing asks for nothing to be flushed.
        del(&doc, &args("c1"), now, &table).unwrap();
        assert_eq!(table.asked.borrow().last(), Some(&Vec::new()));
    }

    #[test]
    fn a_failed_add_flushes_nothing() {
        let scratch = TempDir::new().unwrap();
        let json = serde_json::json!({
            "cniVersion": "1.0.0", "name": "neighnet", "type": "bridge",
            "ipam": { "type": "ipkeep", "dataDir": scratch.path(),
                "ranges": [[{ "subnet": "198.18.7.0/30" }]] },
        });
        let table = Recorder::empty();
        let d = |j: &serde_json::Value| {
            ipkeep_hostlocal::gojson::parse(j.to_string().as_bytes()).unwrap()
        };
        // A /30 has one address to hand out (.1 is the gateway).
        add(&d(&json), &args("c1"), SystemTime::UNIX_EPOCH, &table).unwrap();
        let (e, _) = add(&d(&json), &args("c2"), SystemTime::UNIX_EPOCH, &table).unwrap_err();
        assert!(e.msg.contains("no IP addresses available"), "{}", e.msg);
        assert_eq!(
            table.asked.borrow().len(),
            1,
            "only the successful ADD flushes"
        );
    }

    #[test]
    fn what_the_flush_removed_or_failed_to_remove_is_logged_and_never_fails_the_command() {
        type Answer = fn(&[IpAddr]) -> Result<Vec<Removal>, FlushError>;
        let cases: [(Answer, Vec<String>); 3] = [
            (
                |ips| {
                    Ok(vec![Removal {
                        entry: entry(&ips[0].to_string()),
                        interface: Some("cbr0".to_owned()),
                        outcome: Ok(()),
                    }])
                },
                vec!["ipkeep: neighnet: removed the neighbour entry 198.18.7.2 lladdr aa:5d:8b:7d:61:18 REACHABLE on cbr0".to_owned()],
            ),
            (
                |ips| {
                    Ok(vec![Removal {
                        entry: entry(&ips[1].to_string()),
                        interface: None,
                        outcome: Err(Errno::PERM),
                    }])
                },
                vec![format!(
                    "ipkeep: neighnet: failed to remove the neighbour entry 2001:db8:7::2 lladdr aa:5d:8b:7d:61:18 REACHABLE on interface index 7: {}; until it expires the host may send 2001:db8:7::2's traffic there",
                    Errno::PERM
                )],
            ),
            (
                |_| Err(FlushError::Open(Errno::ACCESS)),
                vec![format!(
                    "ipkeep: neighnet: failed to remove the host's neighbour entries for 198.18.7.2, 2001:db8:7::2: failed to open a netlink socket: {}; until they expire the host may send their traffic to their previous holders",
                    Errno::ACCESS
                )],
            ),
        ];
        let reference = {
            let scratch = TempDir::new().unwrap();
            add(
                &doc(scratch.path()),
                &args("c1"),
                SystemTime::UNIX_EPOCH,
                &Recorder::empty(),
            )
            .unwrap()
            .stdout
        };
        for (answer, lines) in cases {
            let scratch = TempDir::new().unwrap();
            let (d, table) = (doc(scratch.path()), Recorder::answering(answer));
            let added = add(&d, &args("c1"), SystemTime::UNIX_EPOCH, &table).unwrap();
            assert_eq!(
                added.stdout, reference,
                "the result does not depend on the flush"
            );
            assert_eq!(added.log, lines);
            let deleted = del(&d, &args("c1"), SystemTime::UNIX_EPOCH, &table).unwrap();
            assert_eq!(deleted.log, lines);
        }
    }
}
