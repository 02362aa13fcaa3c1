//! ipkeep's end-to-end test infrastructure: the real control plane and real nodes (kubelet,
//! containerd, runc, kube-proxy) built from their Go modules ([`cluster`]), the proxy that injects
//! API faults in front of the real kube-apiserver ([`proxy`]), and the local demo
//! (`ipkeep-e2e demo`, `make demo`) on real nodes ([`demo`]), the one way it runs a program
//! ([`command`]); and what the tests, benches and demo
//! share: the scenarios on a cluster with the chart ([`scenarios`]) and the test support
//! ([`testkit`]).

pub mod cluster;
pub mod command;
pub mod demo;
pub mod proxy;
pub mod scenarios;
pub mod testkit;
pub mod torture;
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
