//! The CNI commands ADD, DEL, CHECK, GC and STATUS, with host-local's semantics and messages.
//!
//! Every command takes the network lock once and holds it to the end, so a whole ADD or DEL is
//! atomic (host-local locks each range set separately).

use std::net::IpAddr;
use std::path::Path;
use std::time::SystemTime;

use crate::allocator::{self, Request};
use crate::candidates::Candidates;
use crate::config::{self, IpamConfig};
use crate::disk_store::DiskStore;
use crate::gojson::Value;
use crate::netdir::NetworkDir;
use crate::result::{CniResult, result_json};
use crate::store::{LegacyRelease, Owner, PodRef, Store};

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

fn open_store<'a>(dir: &'a NetworkDir, now: SystemTime) -> Result<DiskStore<'a>, Failure> {
    DiskStore::open(dir, now).map_err(|e| (CniError::internal(e), Vec::new()))
}

fn pod_of(conf: &IpamConfig) -> Option<PodRef> {
    match (&conf.args.pod_namespace, &conf.args.pod_name) {
        (Some(namespace), Some(name)) => Some(PodRef {
            namespace: namespace.clone(),
            name: name.clone(),
        }),
        _ => None,
    }
}

/// ADD: one address per range set (requested ones where asked), printed for the config's version.
pub fn add(doc: &Value, args: &CmdArgs, now: SystemTime) -> Result<Output, Failure> {
    let conf = load(doc, args)?;
    let mut result = CniResult::default();
    if !conf.resolv_conf.is_empty() {
        result.dns = crate::resolv::read(&conf.resolv_conf)
            .map_err(|e| (CniError::internal(e), Vec::new()))?;
    }
    let dir = open_dir(&conf)?;
    let mut store = open_store(&dir, now)?;
    let pod = pod_of(&conf);
    // Requested addresses, de-duplicated, in the order given (host-local uses Go's random map
    // order when two compete for one range set; ipkeep deterministically takes the first).
    let mut requested: Vec<IpAddr> = Vec::new();
    for ip in &conf.requested {
        if !requested.contains(ip) {
            requested.push(*ip);
        }
    }
    let mut reserved: Vec<IpAddr> = Vec::new();
    let nothing_blocked = |_: IpAddr| false;
    for (idx, set) in conf.range_sets.iter().enumerate() {
        let wanted = requested
            .iter()
            .position(|ip| set.contains(*ip))
            .map(|i| requested.remove(i));
        let req = Request {
            container_id: &args.container_id,
            ifname: &args.ifname,
            range_id: idx,
            set,
            requested: wanted,
            preferred: None,
            is_blocked: &nothing_blocked,
            pod: pod.as_ref(),
        };
        match allocator::allocate(&mut store, &req) {
            Ok(ip) => {
                reserved.push(ip.address);
                result.ips.push(ip);
            }
            Err(e) => {
                release_all(&mut store, &reserved, args);
                let log = store.finish();
                return Err((
                    CniError::internal(format!("failed to allocate for range {idx}: {e}")),
                    log,
                ));
            }
        }
    }
    if !requested.is_empty() {
        release_all(&mut store, &reserved, args);
        let log = store.finish();
        let list: String = requested.iter().map(|ip| format!(" {ip}")).collect();
        return Err((
            CniError::internal(format!("failed to allocate all requested IPs:{list}")),
            log,
        ));
    }
    result.routes = conf.routes.clone();
    let log = store.finish();
    Ok(Output {
        stdout: result_json(&result, &conf.cni_version),
        log,
    })
}

/// Frees exactly what this ADD reserved (host-local frees every address of the container,
/// including an earlier ADD's: ipkeep does not).
fn release_all(store: &mut DiskStore<'_>, reserved: &[IpAddr], args: &CmdArgs) {
    for ip in reserved {
        let _ = store.release(*ip, &args.container_id, &args.ifname);
    }
}

/// DEL: frees the container's addresses with host-local's rule for legacy files.
pub fn del(doc: &Value, args: &CmdArgs, now: SystemTime) -> Result<Output, Failure> {
    let conf = load(doc, args)?;
    let dir = open_dir(&conf)?;
    let mut store = open_store(&dir, now)?;
    let legacy = if conf.range_sets.len() >= 2 {
        LegacyRelease::Always
    } else {
        LegacyRelease::IfNoneMatched
    };
    let released = store.release_by_id(&args.container_id, &args.ifname, legacy);
    let log = store.finish();
    match released {
        Ok(_) => Ok(Output {
            stdout: String::new(),
            log,
        }),
        Err(e) => Err((CniError::internal(e), log)),
    }
}

/// CHECK: succeeds iff the container holds any address in this network (as host-local).
pub fn check(doc: &Value, args: &CmdArgs, now: SystemTime) -> Result<Output, Failure> {
    let conf = load(doc, args)?;
    let dir = open_dir(&conf)?;
    let mut store = open_store(&dir, now)?;
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

/// GC (CNI 1.1): frees every allocation whose attachment is not in `cni.dev/valid-attachments`.
pub fn gc(doc: &Value, args: &CmdArgs, now: SystemTime) -> Result<Output, Failure> {
    let conf = load(doc, args)?;
    let valid = config::valid_attachments(doc).map_err(|e| (CniError::internal(e), Vec::new()))?;
    let dir = open_dir(&conf)?;
    let mut store = open_store(&dir, now)?;
    let is_valid = |owner: &Owner| match owner {
        Owner::Attachment {
            container_id,
            ifname,
        } => valid
            .iter()
            .any(|a| &a.container_id == container_id && &a.ifname == ifname),
        Owner::Legacy { container_id } => valid.iter().any(|a| &a.container_id == container_id),
    };
    let freed = store.collect_garbage(&is_valid, &|_| false);
    let mut log = store.finish();
    match freed {
        Ok(freed) => {
            log.extend(freed.iter().map(|ip| format!("ipkeep: GC freed {ip}")));
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
pub fn status(doc: &Value, args: &CmdArgs, now: SystemTime) -> Result<Output, Failure> {
    let conf = load(doc, args)?;
    let dir = open_dir(&conf).map_err(|(e, l)| (CniError { code: 50, ..e }, l))?;
    let mut store = open_store(&dir, now).map_err(|(e, l)| (CniError { code: 50, ..e }, l))?;
    for (idx, set) in conf.range_sets.iter().enumerate() {
        let mut free = false;
        for (ip, _) in Candidates::new(set, None) {
            if store.is_free(ip).unwrap_or(false) {
                free = true;
                break;
            }
        }
        if !free {
            let log = store.finish();
            return Err((
                CniError::new(
                    50,
                    format!(
                        "range set {idx} is exhausted: no IP addresses available in range set: {set}"
                    ),
                ),
                log,
            ));
        }
    }
    Ok(Output {
        stdout: String::new(),
        log: store.finish(),
    })
}
