//! ipkeep: a CNI IPAM plugin that is a drop-in replacement for `host-local` and gives pods
//! that come back under the same namespace/name the addresses they had. This library is the
//! binary's: the CNI skeleton ([`skel::run`]), the commands, and the neighbour table; the
//! allocator is `ipkeep-hostlocal`, the reservation files `ipkeep-reservation`.

mod commands;
pub mod neighbour;
pub mod skel;
