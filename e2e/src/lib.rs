//! ipkeep's end-to-end test infrastructure: the Kubernetes API test server (more to come: the node
//! simulator, the scenarios and the benchmarks).

pub mod apiserver;
pub mod node;
