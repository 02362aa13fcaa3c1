//! The driver's operations on disk: each `RequestPool`, `ReleasePool`, `RequestAddress` and
//! `ReleaseAddress` locks what it changes, reads the pool, asks [`crate::decide`] and carries the
//! plan out with the plugin library's allocator and store.
//!
//! Layout under the data directory:
//! * `pools/<pool-id>/` — host-local's network directory, byte for byte (`<ip>` files holding
//!   `<owner>\r\n<kind>`, `last_reserved_ip.0`, `lock`, ipkeep's index in `.ipkeep/`);
//! * `state/<pool-id>.json` — the pool's state ([`PoolState`]), written under the pool's lock;
//! * `state/lock` — taken by `RequestPool` and `ReleasePool`, so two networks created at once
//!   are never given the same candidate pool.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ipkeep_hostlocal::addr;
use ipkeep_hostlocal::allocator::{self, AllocError};
use ipkeep_hostlocal::range::{RangeError, RangeSet};
use ipkeep_hostlocal::store::{Store, StoreError};
use ipkeep_hostlocal::{DiskStore, Occupant};
use ipkeep_netdir::{EntryKind, NetDirError, NetworkDir};
use ipkeep_reservation::{RetainFor, RetainForError};

use crate::decide::{
    self, AllocateFor, GATEWAY_KIND, Holder, InputError, Plan, Purpose, Refusal, ReleasePlan,
    Retention, StickyKey, View,
};
use crate::pool::{AutoPools, PoolError, PoolSpec, choose_candidate, space_is_global};
use crate::protocol::{
    RETAIN_FOR_OPTION, ReleaseAddressRequest, ReleasePoolRequest, RequestAddressRequest,
    RequestPoolRequest,
};
use crate::state::{Durability, PoolState, StateError};

const POOLS_DIR: &str = "pools";
/// The round-robin cursor of containers' addresses (`last_reserved_ip.0`, host-local's).
const CONTAINER_CURSOR: usize = 0;
/// The cursor the gateway and aux addresses move instead (`last_reserved_ip.1`).
const OTHER_CURSOR: usize = 1;
const STATE_DIR: &str = "state";

/// Errors of the driver's operations; each message is what the engine shows the user.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The request's input is invalid.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The pool named or asked for is invalid.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// The retention option is invalid.
    #[error("failed to use option {RETAIN_FOR_OPTION}")]
    RetainFor(#[source] RetainForError),
    /// The pool was never requested.
    #[error("failed to find pool {0}: it was never requested (or its state is gone)")]
    UnknownPool(String),
    /// An IPv6 pool of the driver's choosing was asked for.
    #[error("failed to choose an IPv6 pool: give the network an IPv6 --subnet")]
    NoV6Candidates,
    /// Every candidate pool is in use.
    #[error(
        "failed to choose a pool: every candidate in {0} is in use; give the network a --subnet"
    )]
    NoCandidate(AutoPools),
    /// A named container asked for an address outside the container range.
    #[error("failed to give {ip}: it is outside the container range {range} of pool {pool}")]
    OutsideRange {
        /// The address.
        ip: IpAddr,
        /// The range.
        range: String,
        /// The pool.
        pool: String,
    },
    /// Another name holds or retains the address asked for.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The allocation file of the address was not written by this driver.
    #[error(
        "failed to release {ip} in pool {pool}: its allocation file was not written by ipkeep-docker"
    )]
    Foreign {
        /// The address.
        ip: IpAddr,
        /// The pool.
        pool: String,
    },
    /// The allocator refused (texts are host-local's).
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The disk failed.
    #[error(transparent)]
    Disk(#[from] NetDirError),
    /// A state file failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// A pool's range could not be built.
    #[error("failed to build the range of pool {pool}")]
    Range {
        /// The pool.
        pool: String,
        /// Why.
        #[source]
        source: RangeError,
    },
}

/// How the driver is configured.
#[derive(Clone, Debug)]
pub struct DriverConfig {
    /// The data directory.
    pub data_dir: PathBuf,
    /// How long a released named address is held when the network does not say.
    pub default_retain_for: Duration,
    /// Where pools of the driver's choosing come from.
    pub auto_pools: AutoPools,
    /// Whether a request without a name is kept for its MAC address (the engine then sends one
    /// with every request, a random one unless `--mac-address` pinned it).
    pub key_by_mac: bool,
}

/// One address as `ipkeep-docker list` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedAddress {
    /// The pool.
    pub pool_id: String,
    /// The address.
    pub ip: IpAddr,
    /// Who holds it.
    pub holder: Holder,
    /// Until when it is retained (`None`: in use).
    pub retained_until: Option<u64>,
}

/// The driver: stateless in memory, everything is on disk.
#[derive(Debug)]
pub struct Driver {
    config: DriverConfig,
}

/// Seconds since the epoch (0 for a clock before 1970).
fn unix_secs(now: SystemTime) -> u64 {
    now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A token for an allocation without a name, unique in this process and across restarts.
fn unnamed_token(now: SystemTime) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("u{nanos:x}-{:x}-{count:x}", std::process::id())
}

/// The address with the pool's prefix length, as the engine reads it.
fn with_prefix(ip: IpAddr, spec: &PoolSpec) -> String {
    format!("{ip}/{}", spec.subnet.prefix)
}

impl Driver {
    /// A driver over `config.data_dir` (created on first use).
    pub fn new(config: DriverConfig) -> Self {
        Self { config }
    }

    fn state_dir(&self) -> Result<NetworkDir, NetDirError> {
        NetworkDir::open(&self.config.data_dir, STATE_DIR)
    }

    fn pool_dir(&self, pool_id: &str) -> Result<NetworkDir, NetDirError> {
        NetworkDir::open(&self.config.data_dir.join(POOLS_DIR), pool_id)
    }

    fn range_set(spec: &PoolSpec) -> Result<RangeSet, DriverError> {
        spec.range_set().map_err(|source| DriverError::Range {
            pool: spec.id(),
            source,
        })
    }

    /// The state of a pool that must exist.
    fn existing_state(state_dir: &NetworkDir, pool_id: &str) -> Result<PoolState, DriverError> {
        PoolState::load(state_dir, pool_id)?
            .ok_or_else(|| DriverError::UnknownPool(pool_id.to_owned()))
    }

    /// `RequestPool`: the subnet asked for, or the first candidate no network holds.
    pub fn request_pool(&self, req: &RequestPoolRequest) -> Result<(String, String), DriverError> {
        let retain_for = match req.options.as_ref().and_then(|o| o.get(RETAIN_FOR_OPTION)) {
            Some(text) => RetainFor::parse(text)
                .map_err(DriverError::RetainFor)?
                .duration(),
            None => self.config.default_retain_for,
        };
        let state_dir = self.state_dir()?;
        let _pools_lock = state_dir.lock()?;
        let spec = if req.pool.is_empty() && req.sub_pool.is_empty() {
            let global = space_is_global(&req.address_space)?;
            if req.v6 {
                return Err(DriverError::NoV6Candidates);
            }
            let mut failure = None;
            let chosen =
                choose_candidate(
                    &self.config.auto_pools,
                    global,
                    |spec| match PoolState::load(&state_dir, &spec.id()) {
                        Ok(state) => state.is_some_and(|s| s.active),
                        Err(e) => {
                            failure.get_or_insert(e);
                            true
                        }
                    },
                );
            if let Some(e) = failure {
                return Err(e.into());
            }
            chosen.ok_or(DriverError::NoCandidate(self.config.auto_pools))?
        } else {
            PoolSpec::from_request(&req.address_space, &req.pool, &req.sub_pool)?
        };
        let id = spec.id();
        let net = self.pool_dir(&id)?;
        let _pool_lock = net.lock()?;
        let mut state = PoolState::load(&state_dir, &id)?.unwrap_or_default();
        state.active = true;
        state.retain_for_secs = retain_for.as_secs();
        state.save(&state_dir, &id, Durability::Fsync)?;
        Ok((id, spec.cidr()))
    }

    /// `ReleasePool`: the pool is free for another network; its retentions stay.
    pub fn release_pool(&self, req: &ReleasePoolRequest) -> Result<(), DriverError> {
        let spec = PoolSpec::parse_id(&req.pool_id)?;
        let id = spec.id();
        let state_dir = self.state_dir()?;
        let _pools_lock = state_dir.lock()?;
        let mut state = Self::existing_state(&state_dir, &id)?;
        let net = self.pool_dir(&id)?;
        let _pool_lock = net.lock()?;
        state.active = false;
        state.save(&state_dir, &id, Durability::Fsync)?;
        Ok(())
    }

    /// `RequestAddress`: returns the address in CIDR form.
    pub fn request_address(
        &self,
        req: &RequestAddressRequest,
        now: SystemTime,
    ) -> Result<String, DriverError> {
        let spec = PoolSpec::parse_id(&req.pool_id)?;
        let id = spec.id();
        let request = decide::classify(&req.options, &req.address, self.config.key_by_mac)?;
        let set = Self::range_set(&spec)?;
        if let Some(ip) = request.requested {
            if !spec.subnet_contains(ip) {
                return Err(InputError::OutsidePool {
                    ip,
                    pool: spec.cidr(),
                }
                .into());
            }
            if !set.contains(ip) {
                // The gateway and aux addresses may lie outside the container range: nothing
                // is ever allocated there, so there is nothing to record.
                return match request.purpose {
                    Purpose::Named(_) => Err(DriverError::OutsideRange {
                        ip,
                        range: set.to_string(),
                        pool: spec.cidr(),
                    }),
                    Purpose::Gateway | Purpose::Unnamed => Ok(with_prefix(ip, &spec)),
                };
            }
        }
        let first = addr::next_ip(spec.subnet.network());
        if request.purpose == Purpose::Gateway
            && request.requested.is_none()
            && !set.contains(first)
        {
            // The subnet's first address, Docker's default gateway, lies before the range.
            return Ok(with_prefix(first, &spec));
        }
        let state_dir = self.state_dir()?;
        Self::existing_state(&state_dir, &id)?;
        let net = self.pool_dir(&id)?;
        let mut store = DiskStore::open(&net, now)?;
        let mut state = Self::existing_state(&state_dir, &id)?;
        let mut changed = expire(&mut store, &mut state, unix_secs(now))?;
        let view = view_for(&mut store, &request, &state, &set)?;
        let ip = match decide::decide_request(&request, &view) {
            Plan::Reuse(ip) => {
                if let Purpose::Named(key) = &request.purpose {
                    changed |= state.retained.remove(&key.record_key()).is_some();
                }
                ip
            }
            Plan::Allocate {
                holder,
                requested,
                preferred,
                then_free,
            } => {
                let holder = match holder {
                    AllocateFor::Named(name) => Holder::Named(name),
                    AllocateFor::Gateway => Holder::Gateway,
                    AllocateFor::Unnamed => Holder::Unnamed(unnamed_token(now)),
                };
                let (owner_id, kind) = holder.file_owner().unwrap_or((GATEWAY_KIND, GATEWAY_KIND));
                // The gateway and addresses asked for without a name (aux addresses) keep their
                // own cursor: reserving them must not move the containers' round robin.
                let range_id = match (&holder, requested) {
                    (Holder::Gateway, _) | (Holder::Unnamed(_), Some(_)) => OTHER_CURSOR,
                    _ => CONTAINER_CURSOR,
                };
                let nothing_blocked = |_: IpAddr| false;
                let config = allocator::allocate(
                    &mut store,
                    &allocator::Request {
                        container_id: owner_id,
                        ifname: kind,
                        range_id,
                        set: &set,
                        requested,
                        preferred,
                        is_blocked: &nothing_blocked,
                        pod: None,
                    },
                )?;
                if let (Some(old), Holder::Named(key)) = (then_free, &holder) {
                    store.release(old, key.id(), key.kind())?;
                    changed |= state.retained.remove(&key.record_key()).is_some();
                }
                config.address
            }
            Plan::Refuse(refusal) => return Err(refusal.into()),
        };
        if changed {
            state.save(&state_dir, &id, Durability::PageCache)?;
        }
        log_lines(store.finish());
        Ok(with_prefix(ip, &spec))
    }

    /// `ReleaseAddress`: a named address is retained for its name, anything else is freed.
    pub fn release_address(
        &self,
        req: &ReleaseAddressRequest,
        now: SystemTime,
    ) -> Result<(), DriverError> {
        let spec = PoolSpec::parse_id(&req.pool_id)?;
        let id = spec.id();
        let ip =
            addr::parse_ip(&req.address).ok_or_else(|| InputError::Address(req.address.clone()))?;
        if !spec.subnet_contains(ip) {
            return Err(InputError::OutsidePool {
                ip,
                pool: spec.cidr(),
            }
            .into());
        }
        let state_dir = self.state_dir()?;
        Self::existing_state(&state_dir, &id)?;
        if !Self::range_set(&spec)?.contains(ip) {
            return Ok(());
        }
        let net = self.pool_dir(&id)?;
        let mut store = DiskStore::open(&net, now)?;
        let mut state = Self::existing_state(&state_dir, &id)?;
        let now_s = unix_secs(now);
        let mut changed = expire(&mut store, &mut state, now_s)?;
        let holder = holder_of(&mut store, ip)?;
        let retain_for = Duration::from_secs(state.retain_for_secs);
        match decide::decide_release(ip, holder, retain_for, now_s) {
            ReleasePlan::AlreadyFree => {}
            ReleasePlan::Retain(retention) => {
                state.retained.insert(retention.name.clone(), retention);
                changed = true;
            }
            ReleasePlan::Free(holder) => {
                if let Some((owner_id, kind)) = holder.file_owner() {
                    store.release(ip, owner_id, kind)?;
                }
            }
            ReleasePlan::Foreign => return Err(DriverError::Foreign { ip, pool: id }),
        }
        if changed {
            // Only the record is fsync'd: the address's file was written when the container
            // started. Were it lost to a power loss, the name would get a fresh address and the
            // record expire harmlessly (expiry removes only a file the name still owns).
            state.save(&state_dir, &id, Durability::Fsync)?;
        }
        log_lines(store.finish());
        Ok(())
    }

    /// Every pool's addresses, for the metrics.
    pub fn list(&self) -> Result<Vec<ListedAddress>, DriverError> {
        list(&self.config.data_dir)
    }

    /// Whether the engine must send MAC addresses (`GetCapabilities`).
    pub fn requires_mac(&self) -> bool {
        self.config.key_by_mac
    }
}

/// Every pool's addresses under `data_dir`, for `ipkeep-docker list` and the metrics.
pub fn list(data_dir: &Path) -> Result<Vec<ListedAddress>, DriverError> {
    // Listing creates nothing: no state directory, no pools.
    if std::fs::symlink_metadata(data_dir.join(STATE_DIR)).is_err() {
        return Ok(Vec::new());
    }
    let state_dir = NetworkDir::open(data_dir, STATE_DIR)?;
    let mut out = Vec::new();
    for pool_id in PoolState::pool_ids(&state_dir)? {
        if PoolSpec::parse_id(&pool_id).is_err() {
            continue;
        }
        let net = NetworkDir::open(&data_dir.join(POOLS_DIR), &pool_id)?;
        let mut store = DiskStore::open(&net, SystemTime::now())?;
        let state = PoolState::load(&state_dir, &pool_id)?.unwrap_or_default();
        let mut ips: Vec<IpAddr> = net
            .entries()?
            .into_iter()
            .filter(|e| e.kind == EntryKind::File)
            .filter_map(|e| addr::parse_ip(&e.name).filter(|ip| ip.to_string() == e.name))
            .collect();
        ips.sort_by_key(|ip| addr::to_u128(*ip));
        for ip in ips {
            let Some(holder) = holder_of(&mut store, ip)? else {
                continue;
            };
            let retained_until = match &holder {
                Holder::Named(name) => state
                    .retained
                    .get(&name.record_key())
                    .filter(|r| r.ip == ip)
                    .map(|r| r.until),
                _ => None,
            };
            out.push(ListedAddress {
                pool_id: pool_id.clone(),
                ip,
                holder,
                retained_until,
            });
        }
        log_lines(store.finish());
    }
    Ok(out)
}

/// Who holds `ip` in the pool (`None`: free).
fn holder_of(store: &mut DiskStore<'_>, ip: IpAddr) -> Result<Option<Holder>, DriverError> {
    Ok(match store.occupant(ip)? {
        Occupant::Free => None,
        Occupant::Allocation { owner, .. } => Some(Holder::from_owner(&owner)),
        Occupant::Other => Some(Holder::Foreign),
    })
}

/// Ends the retentions due at `now`: their files are removed (if still theirs) and their records
/// dropped. Returns whether the state changed.
fn expire(store: &mut DiskStore<'_>, state: &mut PoolState, now: u64) -> Result<bool, DriverError> {
    let due: Vec<Retention> = state
        .retained
        .values()
        .filter(|r| decide::is_expired(r, now))
        .cloned()
        .collect();
    for retention in &due {
        if let Some(key) = StickyKey::from_record_key(&retention.name) {
            store.release(retention.ip, key.id(), key.kind())?;
        }
        state.retained.remove(&retention.name);
    }
    Ok(!due.is_empty())
}

/// Gathers what [`decide::decide_request`] needs, under the pool's lock.
fn view_for(
    store: &mut DiskStore<'_>,
    request: &decide::AddressRequest,
    state: &PoolState,
    set: &RangeSet,
) -> Result<View, DriverError> {
    let held_in_set =
        |store: &mut DiskStore<'_>, id: &str, kind: &str| -> Result<Option<IpAddr>, DriverError> {
            Ok(store
                .get_by_id(id, kind)?
                .into_iter()
                .find(|ip| set.contains(*ip)))
        };
    let name_holds = match &request.purpose {
        Purpose::Named(key) => held_in_set(store, key.id(), key.kind())?,
        _ => None,
    };
    let gateway_holds = match &request.purpose {
        Purpose::Gateway => held_in_set(store, GATEWAY_KIND, GATEWAY_KIND)?,
        _ => None,
    };
    let requested_holder = match request.requested {
        Some(ip) => holder_of(store, ip)?,
        None => None,
    };
    Ok(View {
        name_holds,
        requested_holder,
        retained: state.retained.clone(),
        gateway_holds,
        first: set.ranges.first().map(|r| r.start),
    })
}

/// The store's log lines go to stderr.
fn log_lines(lines: Vec<String>) {
    for line in lines {
        eprintln!("{line}");
    }
}
