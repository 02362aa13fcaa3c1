//! ipkeep: a CNI IPAM plugin that is a drop-in replacement for `host-local` and gives pods
//! that come back under the same namespace/name the addresses they had.

pub mod addr;
pub mod allocator;
pub mod candidates;
pub mod cni_args;
pub mod commands;
pub mod config;
pub mod disk_store;
pub mod gojson;
pub mod neighbour;
pub mod netdir;
pub mod private_state;
pub mod range;
pub mod reservation;
pub mod resolv;
pub mod result;
pub mod retain_for;
#[cfg(test)]
mod scratch_dir;
pub mod skel;
pub mod store;
pub mod version;

/// An error and its sources on one line (`failed to …: because …: because …`), for log lines,
/// Events and answers; each layer's message says only its own part, so nothing is said twice.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
