//! ipkeep's end-to-end test infrastructure: the real control plane harness and the fault proxy
//! that injects API faults in front of it, the kubelet stand-in that runs the real CNI chain for
//! simulated nodes, and the local demo (`ipkeep-e2e demo`, `make demo`) on real nodes.
//! [`apiserver`], the former in-memory imitation of kube-apiserver, is left only for the kubelet
//! stand-in's own tests (`tests/node_standin.rs`) until they go.

pub mod apiserver;
pub mod cluster;
pub mod demo;
pub mod node;
pub mod proxy;
pub mod wait;

/// An error and its sources on one line, `: `-separated, for messages to people.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}
