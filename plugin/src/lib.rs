//! ipkeep: a CNI IPAM plugin that is a drop-in replacement for `host-local` and gives pods
//! that come back under the same namespace/name the addresses they had.

pub mod addr;
pub mod candidates;
pub mod cni_args;
pub mod config;
pub mod gojson;
pub mod netdir;
pub mod range;
pub mod reservation;
pub mod resolv;
pub mod version;
