//! ipkeep for Docker: the plugin library's allocator behind Docker's remote IPAM driver API, so
//! that a container re-created under the same name gets its address back.
//!
//! `decide` holds the domain rules as plain functions; `driver` carries them out on disk with the
//! plugin library (host-local's files, flock, atomic writes); `server` speaks the engine's
//! protocol on a Unix socket (through hyper); `cli` is what `main` runs.

pub mod cli;
pub mod decide;
pub mod driver;
pub mod list;
pub mod pool;
pub mod protocol;
pub mod server;
pub mod state;
