//! Whether ipkeep is in charge on this node, at the node's edges: [`evidence`] reads what the
//! node shows (its CNI configurations and bin directory), the rule
//! ([`crate::rules::incharge::decide`]) gives one verdict per network, and [`report`] says it on
//! the agent's pod, its node's reservations, Events and metrics.

pub mod evidence;
pub mod report;
