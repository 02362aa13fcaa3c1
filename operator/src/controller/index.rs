//! Which reservations claim each address of each node: conflict detection without scanning every
//! reservation on every reconcile.
//!
//! Kept small, as it holds an entry per reservation (issue 28): a key is one allocation shared by
//! the three maps, a node name one per node, and an address's claimants its one key (a list only
//! when several claim it; a B-tree set of one costs a whole node, about 550 bytes).

use std::{
    collections::{BTreeSet, HashMap, hash_map::Entry as Slot},
    net::IpAddr,
    sync::{Arc, Mutex},
};

use jiff::Timestamp;

use crate::api::PodKey;
use crate::rules::lifecycle::{Claim, ReservationView};

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    node: Arc<str>,
    ips: Box<[IpAddr]>,
    created: Timestamp,
    /// `Bound`, and already yielding (`Conflict`): what [`crate::rules::lifecycle::holder`]
    /// ranks by besides the age.
    bound: bool,
    yielded: bool,
}

/// An address's claimants, sorted: almost always one, kept without a list of its own.
#[derive(Debug, Clone)]
enum Claimants {
    One(Arc<PodKey>),
    Many(Vec<Arc<PodKey>>),
}

impl Claimants {
    fn as_slice(&self) -> &[Arc<PodKey>] {
        match self {
            Claimants::One(k) => std::slice::from_ref(k),
            Claimants::Many(keys) => keys,
        }
    }

    /// Adds `key` in order, unless present.
    fn insert(&mut self, key: Arc<PodKey>) {
        let mut keys = self.as_slice().to_vec();
        if let Err(at) = keys.binary_search(&key) {
            keys.insert(at, key);
            *self = Claimants::Many(keys);
        }
    }

    /// Drops `key`; `None` when no claimant is left.
    fn without(&self, key: &PodKey) -> Option<Claimants> {
        let mut keys: Vec<Arc<PodKey>> = self
            .as_slice()
            .iter()
            .filter(|k| ***k != *key)
            .cloned()
            .collect();
        match keys.len() {
            0 => None,
            1 => keys.pop().map(Claimants::One),
            _ => Some(Claimants::Many(keys)),
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    by_key: HashMap<Arc<PodKey>, Entry>,
    /// Each address's claimants, sorted.
    by_address: HashMap<(Arc<str>, IpAddr), Claimants>,
    by_node: HashMap<Arc<str>, BTreeSet<Arc<PodKey>>>,
}

/// The address index of the reservations the controller sees.
#[derive(Debug, Default)]
pub struct AddressIndex {
    inner: Mutex<Inner>,
}

fn entry(inner: &Inner, r: &ReservationView) -> Entry {
    // One allocation per node name, shared by every entry on it.
    let node = inner
        .by_node
        .get_key_value(r.node_name.as_str())
        .map_or_else(|| Arc::from(r.node_name.as_str()), |(n, _)| n.clone());
    Entry {
        node,
        ips: r.ips.iter().filter_map(|ip| ip.parse().ok()).collect(),
        created: r.created,
        bound: r.status.phase == Some(crate::api::Phase::Bound),
        yielded: r.status.conflict.is_some(),
    }
}

impl AddressIndex {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a reservation; returns the other reservations whose claims it touches (added or
    /// dropped), which must be reconciled again.
    pub fn upsert(&self, key: PodKey, r: &ReservationView) -> Vec<PodKey> {
        let mut inner = self.lock();
        let new = entry(&inner, r);
        if inner.by_key.get(&key) == Some(&new) {
            return Vec::new();
        }
        let mut touched = remove(&mut inner, &key);
        touched.extend(insert(&mut inner, key.clone(), new));
        touched.retain(|k| *k != key);
        touched.sort();
        touched.dedup();
        touched
    }

    /// The reservations on `node`.
    pub fn on_node(&self, node: &str) -> Vec<PodKey> {
        self.lock()
            .by_node
            .get(node)
            .map(|keys| keys.iter().map(|k| PodKey::clone(k)).collect())
            .unwrap_or_default()
    }

    /// Forgets a reservation; returns the others that shared an address with it.
    pub fn remove(&self, key: &PodKey) -> Vec<PodKey> {
        remove(&mut self.lock(), key)
    }

    /// Replaces the whole index (after a full list).
    pub fn rebuild<'a>(&self, all: impl IntoIterator<Item = (PodKey, &'a ReservationView)>) {
        let mut fresh = Inner::default();
        for (key, r) in all {
            let e = entry(&fresh, r);
            insert(&mut fresh, key, e);
        }
        *self.lock() = fresh;
    }

    /// The reservation holding one of `key`'s addresses against it ([`crate::rules::lifecycle::holder`]), if any: `(address, holder)`.
    pub fn conflict(&self, key: &PodKey) -> Option<(IpAddr, PodKey)> {
        let inner = self.lock();
        let me = inner.by_key.get(key)?;
        let my_claim = Claim {
            key: key.clone(),
            created: me.created,
            bound: me.bound,
            yielded: me.yielded,
        };
        for ip in &me.ips {
            let Some(set) = inner.by_address.get(&(me.node.clone(), *ip)) else {
                continue;
            };
            let claims: Vec<Claim> = set
                .as_slice()
                .iter()
                .filter_map(|k| {
                    inner.by_key.get(k).map(|e| Claim {
                        key: PodKey::clone(k),
                        created: e.created,
                        bound: e.bound,
                        yielded: e.yielded,
                    })
                })
                .collect();
            if let Some(holder) = crate::rules::lifecycle::holder(&my_claim, &claims) {
                return Some((*ip, holder.key.clone()));
            }
        }
        None
    }
}

/// Records `key`'s entry; returns the reservations already claiming one of its addresses.
fn insert(inner: &mut Inner, key: PodKey, e: Entry) -> Vec<PodKey> {
    let key = Arc::new(key);
    let mut touched = Vec::new();
    for ip in &e.ips {
        match inner.by_address.entry((e.node.clone(), *ip)) {
            Slot::Vacant(slot) => {
                slot.insert(Claimants::One(key.clone()));
            }
            Slot::Occupied(mut slot) => {
                let claimants = slot.get_mut();
                touched.extend(claimants.as_slice().iter().map(|k| PodKey::clone(k)));
                claimants.insert(key.clone());
            }
        }
    }
    inner
        .by_node
        .entry(e.node.clone())
        .or_default()
        .insert(key.clone());
    inner.by_key.insert(key, e);
    touched
}

fn remove(inner: &mut Inner, key: &PodKey) -> Vec<PodKey> {
    let mut touched = Vec::new();
    if let Some(old) = inner.by_key.remove(key) {
        if let Some(set) = inner.by_node.get_mut(&old.node) {
            set.remove(key);
            if set.is_empty() {
                inner.by_node.remove(&old.node);
            }
        }
        for ip in &old.ips {
            let slot = (old.node.clone(), *ip);
            if let Some(claimants) = inner.by_address.get(&slot) {
                match claimants.without(key) {
                    Some(left) => {
                        touched.extend(left.as_slice().iter().map(|k| PodKey::clone(k)));
                        inner.by_address.insert(slot, left);
                    }
                    None => {
                        inner.by_address.remove(&slot);
                    }
                }
            }
        }
    }
    touched
}
