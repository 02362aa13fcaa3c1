//! In-memory object storage: one global resourceVersion, an event history for watch resume, and the
//! open watch streams that every write is fanned out to.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::Arc,
};

use serde_json::Value;
use tokio::sync::mpsc;

use super::registry::Registry;

/// How many past changes are kept for watches resuming from an older resourceVersion.
const HISTORY_LIMIT: usize = 20_000;

/// The type of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// An object was created.
    Added,
    /// An object was changed.
    Modified,
    /// An object was removed.
    Deleted,
}

/// One write, as recorded in the history and sent to watchers.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The resourceVersion the write produced.
    pub rv: u64,
    /// Storage key of the resource type (`group/plural`).
    pub resource: String,
    /// Added, modified or deleted.
    pub kind: ChangeKind,
    /// The object after the write (for deletes: the last state, with the delete's resourceVersion).
    pub object: Value,
    /// The object before the write (None for creates), so filtered watches can see transitions.
    pub old: Option<Value>,
}

/// An open watch stream: it receives every change of its resource type.
#[derive(Debug)]
struct Watcher {
    resource: String,
    tx: mpsc::UnboundedSender<Arc<Change>>,
}

/// What a watch starting at some resourceVersion gets.
#[derive(Debug)]
pub enum WatchStart {
    /// Past changes to replay (already newer than the start), then the live channel.
    Resumed(Vec<Arc<Change>>, mpsc::UnboundedReceiver<Arc<Change>>),
    /// The start version is older than the retained history.
    Expired {
        /// The requested version.
        requested: u64,
        /// The oldest version a watch may still start from.
        oldest: u64,
    },
}

/// All objects and the machinery around them; guarded by one mutex in the server.
#[derive(Debug)]
pub struct Store {
    /// The resource types currently served.
    pub registry: Registry,
    objects: BTreeMap<String, BTreeMap<(String, String), Value>>,
    rv: u64,
    history: VecDeque<Arc<Change>>,
    oldest: u64,
    watchers: Vec<Watcher>,
}

impl Store {
    /// An empty store serving the built-in kinds.
    pub fn new() -> Self {
        Store {
            registry: Registry::with_builtins(),
            objects: BTreeMap::new(),
            rv: 1,
            history: VecDeque::new(),
            oldest: 1,
            watchers: Vec::new(),
        }
    }

    /// The current (latest) resourceVersion.
    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// The oldest resourceVersion a watch or continue token may still refer to.
    pub fn oldest(&self) -> u64 {
        self.oldest
    }

    /// One object.
    pub fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(resource)?
            .get(&(namespace.to_string(), name.to_string()))
    }

    /// All objects of a type, in (namespace, name) order, optionally in one namespace.
    pub fn list(&self, resource: &str, namespace: Option<&str>) -> Vec<&Value> {
        let Some(objects) = self.objects.get(resource) else {
            return Vec::new();
        };
        match namespace {
            Some(ns) => objects
                .range((ns.to_string(), String::new())..)
                .take_while(|((n, _), _)| n == ns)
                .map(|(_, v)| v)
                .collect(),
            None => objects.values().collect(),
        }
    }

    /// The keys (namespace, name) of every object of a type in a namespace (or everywhere).
    pub fn keys(&self, resource: &str, namespace: Option<&str>) -> Vec<(String, String)> {
        self.objects
            .get(resource)
            .map(|m| {
                m.keys()
                    .filter(|(ns, _)| namespace.is_none_or(|want| want == ns))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Store a created or changed object: stamps the next resourceVersion, records and fans out the change.
    pub fn put(&mut self, resource: &str, namespace: &str, name: &str, mut object: Value) -> Value {
        self.rv += 1;
        set_rv(&mut object, self.rv);
        let key = (namespace.to_string(), name.to_string());
        let old = self
            .objects
            .entry(resource.to_string())
            .or_default()
            .insert(key, object.clone());
        let kind = if old.is_some() {
            ChangeKind::Modified
        } else {
            ChangeKind::Added
        };
        self.record(Change {
            rv: self.rv,
            resource: resource.to_string(),
            kind,
            object: object.clone(),
            old,
        });
        object
    }

    /// Remove an object; the DELETED event carries it with a fresh resourceVersion.
    pub fn remove(&mut self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        let old = self
            .objects
            .get_mut(resource)?
            .remove(&(namespace.to_string(), name.to_string()))?;
        self.rv += 1;
        let mut object = old.clone();
        set_rv(&mut object, self.rv);
        self.record(Change {
            rv: self.rv,
            resource: resource.to_string(),
            kind: ChangeKind::Deleted,
            object: object.clone(),
            old: Some(old),
        });
        Some(object)
    }

    fn record(&mut self, change: Change) {
        let change = Arc::new(change);
        self.watchers
            .retain(|w| w.resource != change.resource || w.tx.send(change.clone()).is_ok());
        self.history.push_back(change);
        while self.history.len() > HISTORY_LIMIT {
            if let Some(dropped) = self.history.pop_front() {
                self.oldest = dropped.rv;
            }
        }
    }

    /// Open a watch on a resource type from `since` (exclusive). `None` means "from now".
    pub fn watch(&mut self, resource: &str, since: Option<u64>) -> WatchStart {
        let replay = match since {
            Some(rv) if rv < self.oldest => {
                return WatchStart::Expired {
                    requested: rv,
                    oldest: self.oldest,
                };
            }
            Some(rv) => self
                .history
                .iter()
                .filter(|c| c.rv > rv && c.resource == resource)
                .cloned()
                .collect(),
            None => Vec::new(),
        };
        let (tx, rx) = mpsc::unbounded_channel();
        self.watchers.push(Watcher {
            resource: resource.to_string(),
            tx,
        });
        WatchStart::Resumed(replay, rx)
    }

    /// End every open watch stream (their channels close; the streams finish cleanly).
    pub fn close_watches(&mut self) {
        self.watchers.clear();
    }

    /// Forget all history: a watch or continue token from any version before now gets 410 Gone.
    /// The version is bumped so that a fresh list returns a version that is not expired.
    pub fn compact(&mut self) {
        self.rv += 1;
        self.oldest = self.rv;
        self.history.clear();
    }
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

/// Write `metadata.resourceVersion`.
fn set_rv(object: &mut Value, rv: u64) {
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn obj(name: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "default"}})
    }

    #[test]
    fn writes_bump_the_version_and_reach_watchers() {
        let mut s = Store::new();
        let WatchStart::Resumed(replay, mut rx) = s.watch("/pods", None) else {
            panic!("expired")
        };
        assert!(replay.is_empty());
        let a = s.put("/pods", "default", "a", obj("a"));
        assert_eq!(a["metadata"]["resourceVersion"], "2");
        s.put("/pods", "default", "a", obj("a"));
        s.put("/nodes", "", "n", obj("n"));
        s.remove("/pods", "default", "a");
        let kinds: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|c| (c.kind, c.rv))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (ChangeKind::Added, 2),
                (ChangeKind::Modified, 3),
                (ChangeKind::Deleted, 5)
            ]
        );
    }

    #[test]
    fn resume_replays_history_and_compaction_expires_it() {
        let mut s = Store::new();
        s.put("/pods", "default", "a", obj("a"));
        s.put("/pods", "default", "b", obj("b"));
        let WatchStart::Resumed(replay, _) = s.watch("/pods", Some(2)) else {
            panic!("expired")
        };
        assert_eq!(replay.iter().map(|c| c.rv).collect::<Vec<_>>(), vec![3]);
        let current = s.rv();
        s.compact();
        assert!(matches!(
            s.watch("/pods", Some(current)),
            WatchStart::Expired { .. }
        ));
        assert!(matches!(
            s.watch("/pods", Some(s.rv())),
            WatchStart::Resumed(..)
        ));
    }

    #[test]
    fn close_watches_ends_streams() {
        let mut s = Store::new();
        let WatchStart::Resumed(_, mut rx) = s.watch("/pods", None) else {
            panic!("expired")
        };
        s.close_watches();
        assert!(rx.try_recv().is_err());
        assert!(rx.is_closed());
    }

    #[test]
    fn list_by_namespace() {
        let mut s = Store::new();
        s.put("/pods", "a", "x", obj("x"));
        s.put("/pods", "b", "y", obj("y"));
        s.put("/pods", "b", "z", obj("z"));
        assert_eq!(s.list("/pods", Some("b")).len(), 2);
        assert_eq!(s.list("/pods", None).len(), 3);
        assert_eq!(
            s.keys("/pods", Some("a")),
            vec![("a".to_string(), "x".to_string())]
        );
    }
}
