//! Where a reservation stands (`status.phase`), said once for the CRD, the controller's
//! lifecycle and the agent's planning.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The two phases of a reservation.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    /// A pod with the reservation's namespace and name holds the addresses.
    Bound,
    /// No such pod; the addresses are held until `releaseTime`.
    Released,
}
