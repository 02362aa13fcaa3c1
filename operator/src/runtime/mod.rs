//! The machinery the controller and the agent share, apart from what they decide ([`crate::rules`]):
//! the work queue and its workers ([`queue`]), leadership ([`leader`]), the agent's inotify watcher
//! ([`filewatch`]), probes and metrics
//! ([`probes`]), Events ([`events`]), shutdown ([`shutdown`]), logging ([`logging`]), retry
//! delays ([`backoff`]) and the watch's read-your-writes bookkeeping ([`expectations`]).

pub mod backoff;
pub mod events;
pub mod expectations;
pub mod filewatch;
pub mod leader;
pub mod logging;
pub mod probes;
pub mod queue;
pub mod shutdown;
pub mod workqueue;
