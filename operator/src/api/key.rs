//! The operator's one key: a namespace and a name. A pod and its reservation share it (contract
//! 1 of the design), so the controller's queue, its address index, a conflict's holder and the
//! agent's refusals all speak of the same thing. The plugin's `PodKey` is the same pair once
//! checked for use as a path; the agent converts at the disk boundary.

use std::{cmp::Ordering, fmt};

use kube::ResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A namespace and a name; displays as `namespace/name` and orders as that text does (the
/// tie-break between two reservations created in the same second). In a status it is an object
/// with the two fields.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub struct Key {
    /// The namespace.
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl Key {
    /// The key of `namespace`/`name`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Key {
        Key {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key of a namespaced Kubernetes object.
    pub fn of<K: ResourceExt>(obj: &K) -> Key {
        Key::new(obj.namespace().unwrap_or_default(), obj.name_any())
    }
}

impl Key {
    fn text(&self) -> impl Iterator<Item = u8> + '_ {
        self.namespace
            .bytes()
            .chain(std::iter::once(b'/'))
            .chain(self.name.bytes())
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        self.text().cmp(other.text())
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_as_its_text() {
        let cases = [
            (Key::new("a-b", "x"), Key::new("a", "x")),
            (Key::new("a", "b"), Key::new("a", "c")),
            (Key::new("a", "z"), Key::new("b", "a")),
        ];
        for (low, high) in cases {
            assert!(low < high, "{low} < {high}");
            assert!(low.to_string() < high.to_string(), "{low} < {high} as text");
        }
    }
}
