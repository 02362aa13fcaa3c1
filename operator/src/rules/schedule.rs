//! When the agent writes, and how much: a pure schedule over what the watches report and how
//! each pass ended, with `now` passed in (no clock, no tokio), so every path is a table test.
//!
//! * Nothing is written before the first list completed; every relist makes the next pass a
//!   full resync.
//! * A reservation change wakes an incremental pass; a directory trigger ([`Trigger`]) or
//!   `--resync-interval` since the last full pass makes the next pass a full one.
//! * A failed pass puts its changes back and is tried again after [`Backoff::PASS`], as a full
//!   resync; nothing runs before that time.
//! * A file kept as lost goes when its release time comes, which no watch reports: the earliest
//!   such time ([`Schedule::release_at`]) makes the first tick after it a full resync.

use std::time::{Duration, Instant};

use crate::runtime::backoff::Backoff;

/// Why the write loop woke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// A watch reported something ([`Schedule::listed`], [`Schedule::changed`],
    /// [`Schedule::directory`]).
    Changed,
    /// The retry time of a failed pass came ([`Schedule::retry_at`]).
    Retry,
    /// The periodic tick (each second): a full resync may be due.
    Tick,
}

/// What the write loop does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing now.
    Wait,
    /// Run this pass, then report it with [`Schedule::succeeded`] or [`Schedule::failed`].
    Pass(Pass),
}

/// One pass: full or incremental, and what it carries to disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pass {
    /// A full resync (reads the tree, deletes stale files) rather than the changed files only.
    pub full: bool,
    /// When each change this pass writes arrived.
    pub arrivals: Vec<Instant>,
    /// The directory watch asked for this pass: since when, and its most severe cause.
    pub dir_trigger: Option<(Instant, Trigger)>,
}

/// The agent's write schedule.
#[derive(Debug, Clone)]
pub struct Schedule {
    resync_interval: Duration,
    listed: bool,
    full_needed: bool,
    arrivals: Vec<Instant>,
    dir_trigger: Option<(Instant, Trigger)>,
    /// When the next try of a failed pass is due, and how many passes failed in a row.
    retry: Option<(Instant, u32)>,
    last_full: Option<Instant>,
    /// The earliest release time of a file kept as lost.
    release_due: Option<Instant>,
}

impl Schedule {
    /// A schedule that runs a full resync at least every `resync_interval`.
    pub fn new(resync_interval: Duration) -> Schedule {
        Schedule {
            resync_interval,
            listed: false,
            full_needed: false,
            arrivals: Vec::new(),
            dir_trigger: None,
            retry: None,
            last_full: None,
            release_due: None,
        }
    }

    /// A list of the reservations completed (the first, or a relist after a watch gap).
    pub fn listed(&mut self, now: Instant) {
        self.listed = true;
        self.full_needed = true;
        self.arrivals.push(now);
    }

    /// A reservation was added, changed or deleted.
    pub fn changed(&mut self, now: Instant) {
        self.arrivals.push(now);
    }

    /// The directory watch asks for a full resync.
    pub fn directory(&mut self, trigger: Trigger, now: Instant) {
        self.full_needed = true;
        let (since, worst) = self.dir_trigger.unwrap_or((now, trigger));
        self.dir_trigger = Some((since, worst.max(trigger)));
    }

    /// The earliest release time of the files the last pass kept as lost (`None`: none has one),
    /// when a full pass releases it.
    pub fn release_at(&mut self, at: Option<Instant>) {
        self.release_due = at;
    }

    /// When a failed pass is tried again, if one failed.
    pub fn retry_at(&self) -> Option<Instant> {
        self.retry.map(|(at, _)| at)
    }

    /// How long since the last full pass ended, once one has.
    pub fn since_full(&self, now: Instant) -> Option<Duration> {
        self.last_full.map(|at| now.saturating_duration_since(at))
    }

    /// What to do on waking at `now`.
    pub fn next(&mut self, wake: Wake, now: Instant) -> Step {
        if wake == Wake::Tick {
            if self
                .since_full(now)
                .is_some_and(|since| since >= self.resync_interval)
            {
                self.full_needed = true;
            }
            if self.release_due.is_some_and(|at| now >= at) {
                self.release_due = None;
                self.full_needed = true;
            }
            if !(self.full_needed && self.listed) {
                return Step::Wait;
            }
        }
        if self.retry.is_some_and(|(at, _)| now < at) || !self.listed {
            return Step::Wait;
        }
        // A retry after a failure is always a full resync.
        let full = std::mem::take(&mut self.full_needed) || self.retry.is_some();
        Step::Pass(Pass {
            full,
            arrivals: std::mem::take(&mut self.arrivals),
            dir_trigger: self.dir_trigger.take(),
        })
    }

    /// The pass ended well at `now`.
    pub fn succeeded(&mut self, pass: &Pass, now: Instant) {
        self.retry = None;
        if pass.full {
            self.last_full = Some(now);
        }
    }

    /// The pass failed at `now`: its changes are pending again, and the next try is a full
    /// resync after a growing pause.
    pub fn failed(&mut self, pass: Pass, now: Instant) {
        let mut waiting = pass.arrivals;
        waiting.append(&mut self.arrivals);
        self.arrivals = waiting;
        self.full_needed = true;
        self.dir_trigger = match (pass.dir_trigger, self.dir_trigger) {
            (Some((at, a)), Some((_, b))) => Some((at, a.max(b))),
            (earlier, later) => earlier.or(later),
        };
        let failures = self.retry.map_or(1, |(_, n)| n.saturating_add(1));
        self.retry = Some((now + Backoff::PASS.delay(failures), failures));
    }
}

/// Why the data directory's watch (`agent::dirwatch`) asked for a resync; the order is severity (a burst reports its most severe cause).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Trigger {
    /// The kernel dropped events (its queue overflowed): anything may have happened.
    Overflow,
    /// A directory was moved in over a network directory or `reserved/`.
    Replaced,
    /// A `reserved/` was deleted or moved away.
    ReservedGone,
    /// A network directory was deleted or moved away.
    NetworkGone,
    /// The data directory itself was deleted or moved away.
    DataDirGone,
}

impl Trigger {
    /// Every trigger, for registering the metric's labels.
    pub const ALL: [Trigger; 5] = [
        Trigger::Overflow,
        Trigger::Replaced,
        Trigger::ReservedGone,
        Trigger::NetworkGone,
        Trigger::DataDirGone,
    ];

    /// The `reason` label of `ipkeep_agent_directory_resyncs_total`.
    pub fn label(self) -> &'static str {
        match self {
            Trigger::Overflow => "events_lost",
            Trigger::Replaced => "replaced",
            Trigger::ReservedGone => "reserved_removed",
            Trigger::NetworkGone => "network_dir_removed",
            Trigger::DataDirGone => "data_dir_removed",
        }
    }
}

impl std::fmt::Display for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Trigger::Overflow => "directory events were lost",
            Trigger::Replaced => "a network directory or reserved/ was replaced",
            Trigger::ReservedGone => "a reserved/ directory was removed",
            Trigger::NetworkGone => "a network directory was removed",
            Trigger::DataDirGone => "the data directory was removed",
        })
    }
}

#[cfg(test)]
mod tests;
