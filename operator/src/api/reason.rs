//! Every Event reason ipkeep posts, said once with its type and the component that posts it: the
//! controller's decisions and the agent take their reasons from here, and the docs' reference
//! table is checked against [`ALL`] (the e2e docs check), so neither can name a reason the other
//! lacks.

/// The component that posts an Event (`reportingController`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Poster {
    /// `ipkeep-operator controller`.
    Controller,
    /// `ipkeep-operator agent`.
    Agent,
}

/// An Event reason: its name, Warning or Normal, and who posts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventReason {
    /// The machine-readable reason (`Reserved`, `InvalidReservation`, …).
    pub name: &'static str,
    /// A Warning (something a person should look at), else a Normal Event.
    pub warning: bool,
    /// The component that posts it.
    pub poster: Poster,
}

const fn controller(name: &'static str, warning: bool) -> EventReason {
    EventReason {
        name,
        warning,
        poster: Poster::Controller,
    }
}

const fn agent(name: &'static str, warning: bool) -> EventReason {
    EventReason {
        name,
        warning,
        poster: Poster::Agent,
    }
}

/// A reservation was created for a pod.
pub const RESERVED: EventReason = controller("Reserved", false);
/// A pod came back with its reserved addresses.
pub const REBOUND: EventReason = controller("Rebound", false);
/// The pod is gone; the addresses are held until the release time.
pub const RELEASED: EventReason = controller("Released", false);
/// The release time came; the reservation is deleted.
pub const EXPIRED: EventReason = controller("Expired", false);
/// A reservation made by hand for a pod that does not exist yet is honoured.
pub const HONOURED: EventReason = controller("Honoured", false);
/// The pod no longer asks for a reservation; it is deleted.
pub const ENDED: EventReason = controller("ReservationEnded", false);
/// A pod asked for a reservation it cannot get.
pub const NOT_RESERVED: EventReason = controller("NotReserved", true);
/// A returning pod got other addresses; the reservation follows it.
pub const ADDRESSES_CHANGED: EventReason = controller("AddressesChanged", true);
/// An annotation's value is malformed.
pub const INVALID_ANNOTATION: EventReason = controller("InvalidAnnotation", true);
/// An older reservation on the node claims the same address.
pub const CONFLICT: EventReason = controller("Conflict", true);
/// The reservation's node was deleted; the reservation is deleted with it.
pub const NODE_GONE: EventReason = controller("NodeGone", true);
/// A returning pod asked for placement but the webhook never saw it (unreachable, not registered).
pub const PLACEMENT_MISSED: EventReason = controller("PlacementMissed", true);
/// A returning pod asked for placement but its own constraints rule the reservation's node out.
pub const PLACEMENT_SKIPPED: EventReason = controller("PlacementSkipped", true);
/// A retention longer than `--max-retain-for` was asked for; the maximum applies.
pub const RETENTION_CAPPED: EventReason = controller("RetentionCapped", true);
/// The node's budget for addresses held for gone pods was exceeded: this one goes early.
pub const YIELDED: EventReason = controller("Yielded", true);
/// The agent refuses a reservation (once per version): no file is written for it.
pub const INVALID_RESERVATION: EventReason = agent("InvalidReservation", true);
/// `host-local` was written over ipkeep on the node, and ipkeep was installed again.
pub const HOST_LOCAL_REPLACED: EventReason = agent("HostLocalReplaced", true);
/// ipkeep is not the IPAM of a network on the node: why, and the fix.
pub const NOT_IN_CHARGE: EventReason = agent("NotInCharge", true);
/// A network the agent had found not in charge is in charge again.
pub const IN_CHARGE: EventReason = agent("InCharge", false);
/// A reservation's object vanished before its release time by nobody's decision (the CRD
/// deleted, an etcd restore): the agent keeps its file (see `rules::loss`).
pub const RESERVATION_LOST: EventReason = agent("ReservationLost", true);
/// The API holds an older version of a reservation than its file on the node (an etcd restore
/// from an older backup): the node's newer file stays (see `rules::loss`).
pub const RESTORED_OLDER: EventReason = agent("RestoredOlder", true);
/// The API holds a reservation the node released (an etcd restore brought it back): no file is
/// written for it (see `rules::loss`).
pub const RESTORED_RELEASED: EventReason = agent("RestoredReleased", true);

/// Every reason, controller's first.
pub const ALL: [EventReason; 22] = [
    RESERVED,
    REBOUND,
    RELEASED,
    EXPIRED,
    HONOURED,
    ENDED,
    NOT_RESERVED,
    ADDRESSES_CHANGED,
    INVALID_ANNOTATION,
    CONFLICT,
    NODE_GONE,
    PLACEMENT_MISSED,
    PLACEMENT_SKIPPED,
    RETENTION_CAPPED,
    YIELDED,
    INVALID_RESERVATION,
    HOST_LOCAL_REPLACED,
    NOT_IN_CHARGE,
    IN_CHARGE,
    RESERVATION_LOST,
    RESTORED_OLDER,
    RESTORED_RELEASED,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reason_is_listed_once() {
        let mut names: Vec<&str> = ALL.iter().map(|r| r.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ALL.len());
    }
}
