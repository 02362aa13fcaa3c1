//! ipkeep: a CNI IPAM plugin that is a drop-in replacement for `host-local` and gives pods
//! that come back under the same namespace/name the addresses they had.

pub mod netdir;
pub mod reservation;
