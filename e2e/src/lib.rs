//! ipkeep's end-to-end test infrastructure: the Kubernetes API test server and the real control
//! plane harness with the fault proxy that injects API faults in front of it, the kubelet stand-in
//! that runs the real CNI chain for simulated nodes, and the local demo (`ipkeep-e2e demo`,
//! `make demo`) that puts them together with ipkeep.

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
