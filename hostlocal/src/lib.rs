//! ipkeep's host-local compatible core: the network configuration and the result, byte for byte
//! as host-local reads and writes them (Go's JSON, its error texts), the ranges, the allocator
//! and host-local's allocation files under `<dataDir>/<network>/` with ipkeep's container index
//! beside them. The plugin binary and the Docker driver allocate through it; the reservation
//! contract (`ipkeep-reservation`) is below it, never the other way round.

pub mod addr;
pub mod allocator;
pub mod config;
pub mod gojson;
pub mod range;
pub mod result;
pub mod result_cache;
pub mod store;
pub mod version;

mod candidates;
mod cni_args;
mod disk_store;
mod resolv;

pub use candidates::Candidates;
pub use disk_store::{DiskStore, Occupant, go_log_time, recorded_pods};
pub use resolv::read as read_resolv_conf;
