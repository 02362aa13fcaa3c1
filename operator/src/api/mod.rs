//! The operator's API, said once: the IPReservation resource and its status, the namespace/name
//! [`PodKey`] a pod and its reservation share ([`key_of`] an object), the [`Phase`] a reservation is in, retention
//! ([`retention`]) and every Event reason ([`reason`]). The controller, the agent, `check` and e2e all import it from here.

mod crd;
mod key;
pub mod lost;
mod phase;
pub mod reason;
pub mod retention;

pub use crd::{
    CONDITION_CONFLICT, CONDITION_UNPROTECTED, ConflictStatus, CrdError, GROUP, IPReservation,
    IPReservationSpec, IPReservationStatus, IpString, MANAGED_BY_LABEL, MANAGED_BY_VALUE, crd_yaml,
};
pub use ipkeep_reservation::PodKey;
pub use key::key_of;
pub use phase::Phase;
