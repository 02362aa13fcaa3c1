//! The key of a Kubernetes object: the operator's one key is the reservation contract's
//! [`PodKey`], which a pod and its reservation share (contract 1 of the design), so the
//! controller's queue, its address index, a conflict's holder and the agent's files all speak of
//! the same validated pair.

use ipkeep_reservation::{PodKey, SchemaError};
use kube::ResourceExt;

/// The key of a namespaced Kubernetes object, or why its namespace or name is not a valid one
/// (never for an object a real API server returned).
pub fn key_of<K: ResourceExt>(obj: &K) -> Result<PodKey, SchemaError> {
    PodKey::new(&obj.namespace().unwrap_or_default(), &obj.name_any())
}
