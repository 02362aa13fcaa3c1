//! The torture run's schedule: every workload operation and every fault, at its moment, drawn
//! from one seed. Pure: the same seed and duration give the same schedule, which the run prints
//! first, so a run that found something is replayed by giving its seed again.

use std::{fmt, time::Duration};

use crate::testkit::rng::Rng;

/// The retained StatefulSets of the workload.
pub const SETS: [RetainedSet; 4] = [
    RetainedSet {
        name: "keep-a",
        replicas: 4,
        tiny: false,
        placement: "preferred",
        retain_for: "90s",
    },
    RetainedSet {
        name: "keep-b",
        replicas: 6,
        tiny: false,
        placement: "required",
        retain_for: "90s",
    },
    RetainedSet {
        name: "keep-c",
        replicas: 2,
        tiny: false,
        placement: "preferred",
        retain_for: "90s",
    },
    RetainedSet {
        name: "keep-tiny",
        replicas: 3,
        tiny: true,
        placement: "required",
        retain_for: "5m",
    },
];

/// One retained StatefulSet of the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetainedSet {
    /// Its name (and its pods' prefix).
    pub name: &'static str,
    /// Its replicas at the start, and the most it is scaled to.
    pub replicas: u32,
    /// Pinned to the tiny node.
    pub tiny: bool,
    /// Its `ipkeep.dev/placement`.
    pub placement: &'static str,
    /// Its `ipkeep.dev/retain-for`: short, so reservations expire (and are judged) within the
    /// run; `keep-tiny`'s outlasts [`super::oracle::STARVED`], so a node over its budget stays
    /// over unless the controller yields.
    pub retain_for: &'static str,
}

/// The most replicas the unannotated Deployment on the ordinary nodes is scaled to.
pub const CHURN_MAX: u32 = 10;
/// The replicas of the unannotated Deployment on the tiny node, never scaled: with `keep-tiny`'s
/// three pods it asks for one address more than the tiny range's five, so one of its pods waits
/// while they all run, and none may wait while the node holds Released reservations over its
/// budget (promise 5).
pub const TINY_CHURN: u32 = 3;
/// How many reservations made by hand the workload uses (names `hand-0`…).
pub const HAND: u32 = 3;

/// What the workload does at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Deletes one pod of a retained StatefulSet (the StatefulSet controller re-creates it).
    DeletePod {
        /// The StatefulSet.
        set: &'static str,
        /// The pod's ordinal.
        ordinal: u32,
        /// `--force --grace-period=0` instead of the default grace period.
        force: bool,
    },
    /// Scales a retained StatefulSet (to 0 and back, down, up).
    Scale {
        /// The StatefulSet.
        set: &'static str,
        /// Its new replicas.
        replicas: u32,
    },
    /// Scales the unannotated Deployment on the ordinary nodes.
    Churn {
        /// `churn`.
        deployment: &'static str,
        /// Its new replicas.
        replicas: u32,
    },
    /// Deletes one pod of the unannotated Deployment on the tiny node (its Deployment makes
    /// another, which needs an address there: what promise 5 judges while `keep-tiny` is away).
    DeleteTinyChurn {
        /// Which of its pods, in the order of their names (modulo how many there are).
        pick: u32,
    },
    /// Runs an unannotated Job of one short pod.
    Job {
        /// Its number (the Job is `job-N`).
        n: u32,
    },
    /// Deletes a pod of the annotated StatefulSet in the namespace outside the selector.
    DeleteOutside {
        /// The pod's ordinal.
        ordinal: u32,
    },
    /// Makes the reservation `hand-N` by hand (an address of the first node's range) for a pod
    /// not yet there.
    Reserve {
        /// Its number.
        n: u32,
    },
    /// Creates the annotated pod `hand-N` on the first node, or deletes it when it runs.
    HandPod {
        /// Its number.
        n: u32,
    },
}

/// Every kind of fault the nemesis makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// The node's container runtime (containerd or CRI-O) stopped and started.
    RuntimeRestart,
    /// The node's kubelet stopped and started.
    KubeletRestart,
    /// The node powered off and on.
    Reboot,
    /// The node's agent SIGKILLed.
    AgentKill,
    /// The controller holding the Lease SIGKILLed.
    LeaderKill,
    /// The placement webhook unreachable (its Service selects nothing).
    WebhookDown,
    /// Every in-cluster request delayed.
    ApiLatency,
    /// In-cluster requests answered 500/503.
    ApiErrors,
    /// Every in-cluster watch cut.
    WatchDrop,
    /// One node's agent cut off from the API (its requests hang).
    AgentPartition,
    /// kube-apiserver SIGKILLed and started again.
    ApiServerKill,
    /// etcd SIGKILLed and started again.
    EtcdKill,
    /// The node's network directory removed while it runs.
    WipeNetworkDir,
    /// ipkeep's binary in the node's CNI directory overwritten by host-local, as a package
    /// upgrade does.
    HostLocalOverwrite,
    /// `helm upgrade` of the release with changed values.
    HelmUpgrade,
    /// The node cordoned, then uncordoned.
    Cordon,
}

impl FaultKind {
    /// Every kind, in a fixed order.
    pub const ALL: [FaultKind; 16] = [
        FaultKind::RuntimeRestart,
        FaultKind::KubeletRestart,
        FaultKind::Reboot,
        FaultKind::AgentKill,
        FaultKind::LeaderKill,
        FaultKind::WebhookDown,
        FaultKind::ApiLatency,
        FaultKind::ApiErrors,
        FaultKind::WatchDrop,
        FaultKind::AgentPartition,
        FaultKind::ApiServerKill,
        FaultKind::EtcdKill,
        FaultKind::WipeNetworkDir,
        FaultKind::HostLocalOverwrite,
        FaultKind::HelmUpgrade,
        FaultKind::Cordon,
    ];

    /// Whether it strikes one node.
    pub fn on_a_node(self) -> bool {
        matches!(
            self,
            FaultKind::RuntimeRestart
                | FaultKind::KubeletRestart
                | FaultKind::Reboot
                | FaultKind::AgentKill
                | FaultKind::AgentPartition
                | FaultKind::WipeNetworkDir
                | FaultKind::HostLocalOverwrite
                | FaultKind::Cordon
        )
    }

    /// Whether it lasts a while (and is healed at the end of its hold).
    pub fn held(self) -> bool {
        matches!(
            self,
            FaultKind::WebhookDown
                | FaultKind::ApiLatency
                | FaultKind::ApiErrors
                | FaultKind::AgentPartition
                | FaultKind::Cordon
        )
    }

    /// Whether, while in force, it keeps the controller from acting on time (an expiry may then
    /// come late): the API or the leader away.
    pub fn delays_the_controller(self) -> bool {
        matches!(
            self,
            FaultKind::LeaderKill
                | FaultKind::ApiLatency
                | FaultKind::ApiErrors
                | FaultKind::WatchDrop
                | FaultKind::ApiServerKill
                | FaultKind::EtcdKill
                | FaultKind::HelmUpgrade
        )
    }
}

impl std::str::FromStr for FaultKind {
    type Err = String;

    /// A kind by its name as the report prints it (`WipeNetworkDir`).
    fn from_str(name: &str) -> Result<FaultKind, String> {
        FaultKind::ALL
            .into_iter()
            .find(|k| k.to_string() == name)
            .ok_or_else(|| {
                let all: Vec<String> = FaultKind::ALL.iter().map(ToString::to_string).collect();
                format!("no fault kind {name}: one of {}", all.join(", "))
            })
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// One fault: its kind, the node it strikes (an index into the cluster's nodes), and how long a
/// held fault lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// What.
    pub kind: FaultKind,
    /// Which node, for a fault on a node.
    pub node: Option<usize>,
    /// How long it holds, for a held fault.
    pub hold: Option<Duration>,
}

/// What happens at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The workload acts.
    Op(Op),
    /// The nemesis strikes.
    Fault(Fault),
}

/// The schedule: each step at its offset from the start, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// The seed it was drawn from.
    pub seed: u64,
    /// How long the run lasts (the quiet end not included).
    pub duration: Duration,
    /// The steps, by offset.
    pub steps: Vec<(Duration, Step)>,
}

/// The mean gap between two workload operations, and between two faults.
const OP_GAP: (u64, u64) = (400, 1_600);
const FAULT_GAP: (u64, u64) = (8_000, 20_000);
/// How long a held fault lasts.
const HOLD: (u64, u64) = (4_000, 15_000);

impl Schedule {
    /// The schedule of a run of `duration` on `nodes` nodes from `seed`. Faults are dealt from a
    /// shuffled deck of the `kinds` (every one, [`FaultKind::ALL`], unless some are left out), so
    /// each comes once in every `kinds.len()` faults.
    pub fn draw(seed: u64, duration: Duration, nodes: usize, kinds: &[FaultKind]) -> Schedule {
        let mut rng = Rng::new(seed);
        let end = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        let mut steps = Vec::new();
        let mut at = 0;
        let mut replicas: Vec<u32> = SETS.iter().map(|s| s.replicas).collect();
        let mut jobs = 0;
        loop {
            at += rng.between(OP_GAP.0, OP_GAP.1);
            if at >= end {
                break;
            }
            let op = draw_op(&mut rng, &mut replicas, &mut jobs);
            steps.push((Duration::from_millis(at), Step::Op(op)));
        }
        let mut deck: Vec<FaultKind> = Vec::new();
        // The first fault after a settling minute at most, so even a short run sees faults.
        let mut at = rng.between(FAULT_GAP.0, FAULT_GAP.1);
        while at < end {
            if kinds.is_empty() {
                break;
            }
            if deck.is_empty() {
                deck = kinds.to_vec();
                shuffle(&mut rng, &mut deck);
            }
            let kind = deck.pop().unwrap_or(FaultKind::WatchDrop);
            let node = kind
                .on_a_node()
                .then(|| rng.between(0, nodes.saturating_sub(1) as u64) as usize);
            let hold = kind
                .held()
                .then(|| Duration::from_millis(rng.between(HOLD.0, HOLD.1)));
            steps.push((
                Duration::from_millis(at),
                Step::Fault(Fault { kind, node, hold }),
            ));
            at += rng.between(FAULT_GAP.0, FAULT_GAP.1);
        }
        // Stable: an operation and a fault at the same millisecond keep their drawing order.
        steps.sort_by_key(|(at, _)| *at);
        Schedule {
            seed,
            duration,
            steps,
        }
    }

    /// How many faults of each kind it holds.
    pub fn faults(&self) -> Vec<(FaultKind, usize)> {
        FaultKind::ALL
            .iter()
            .map(|k| {
                let n = self
                    .steps
                    .iter()
                    .filter(|(_, s)| matches!(s, Step::Fault(f) if f.kind == *k))
                    .count();
                (*k, n)
            })
            .collect()
    }
}

/// Fisher–Yates, from `rng`.
fn shuffle<T>(rng: &mut Rng, items: &mut [T]) {
    for i in (1..items.len()).rev() {
        let j = rng.between(0, i as u64) as usize;
        items.swap(i, j);
    }
}

/// The next workload operation; `replicas` follows the retained sets' scale.
fn draw_op(rng: &mut Rng, replicas: &mut [u32], jobs: &mut u32) -> Op {
    let roll = rng.between(1, 100);
    match roll {
        // Most of the run: a retained pod deleted and re-created.
        1..=50 => {
            let i = rng.between(0, SETS.len() as u64 - 1) as usize;
            let set = &SETS[i];
            if replicas[i] == 0 {
                replicas[i] = set.replicas;
                return Op::Scale {
                    set: set.name,
                    replicas: set.replicas,
                };
            }
            Op::DeletePod {
                set: set.name,
                ordinal: rng.between(0, u64::from(replicas[i]) - 1) as u32,
                force: rng.chance(35),
            }
        }
        51..=55 => Op::DeleteTinyChurn {
            pick: rng.between(0, u64::from(TINY_CHURN) - 1) as u32,
        },
        56..=65 => {
            let i = rng.between(0, SETS.len() as u64 - 1) as usize;
            let set = &SETS[i];
            let to = if replicas[i] == 0 || rng.chance(30) {
                if replicas[i] == 0 { set.replicas } else { 0 }
            } else {
                rng.between(1, u64::from(set.replicas)) as u32
            };
            replicas[i] = to;
            Op::Scale {
                set: set.name,
                replicas: to,
            }
        }
        66..=80 => Op::Churn {
            deployment: "churn",
            replicas: rng.between(0, u64::from(CHURN_MAX)) as u32,
        },
        81..=87 => {
            *jobs += 1;
            Op::Job { n: *jobs }
        }
        88..=93 => Op::DeleteOutside {
            ordinal: rng.between(0, 1) as u32,
        },
        94..=96 => Op::Reserve {
            n: rng.between(0, u64::from(HAND) - 1) as u32,
        },
        _ => Op::HandPod {
            n: rng.between(0, u64::from(HAND) - 1) as u32,
        },
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Op(op) => write!(f, "op {op:?}"),
            Step::Fault(Fault { kind, node, hold }) => {
                write!(f, "fault {kind}")?;
                if let Some(n) = node {
                    write!(f, " node={n}")?;
                }
                if let Some(h) = hold {
                    write!(f, " hold={:.1}s", h.as_secs_f64())?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_draws_the_same_schedule_and_another_seed_another() {
        let a = Schedule::draw(7, Duration::from_secs(300), 3, &FaultKind::ALL);
        let b = Schedule::draw(7, Duration::from_secs(300), 3, &FaultKind::ALL);
        let c = Schedule::draw(8, Duration::from_secs(300), 3, &FaultKind::ALL);
        assert_eq!(a, b);
        assert_ne!(a.steps, c.steps);
    }

    #[test]
    fn every_fault_kind_comes_once_in_each_sixteen_faults_and_steps_stay_inside_the_run() {
        let cases = [(1, 300, 3), (42, 3_600, 3), (u64::MAX, 900, 2)];
        for (seed, secs, nodes) in cases {
            let s = Schedule::draw(seed, Duration::from_secs(secs), nodes, &FaultKind::ALL);
            let faults: Vec<Fault> = s
                .steps
                .iter()
                .filter_map(|(_, st)| match st {
                    Step::Fault(f) => Some(*f),
                    Step::Op(_) => None,
                })
                .collect();
            assert!(faults.len() >= 16, "seed {seed}: {} faults", faults.len());
            let first: std::collections::BTreeSet<FaultKind> =
                faults[..16].iter().map(|f| f.kind).collect();
            assert_eq!(first.len(), 16, "seed {seed}: {first:?}");
            for f in &faults {
                assert_eq!(f.node.is_some(), f.kind.on_a_node(), "{f:?}");
                assert_eq!(f.hold.is_some(), f.kind.held(), "{f:?}");
                assert!(f.node.is_none_or(|n| n < nodes), "{f:?}");
            }
            assert!(
                s.steps
                    .windows(2)
                    .all(|w| w[0].0 <= w[1].0 && w[1].0 < s.duration)
            );
        }
    }

    #[test]
    fn an_hour_draws_the_faults_and_re_creations_the_long_run_needs() {
        let s = Schedule::draw(3, Duration::from_secs(3_600), 3, &FaultKind::ALL);
        let faults: usize = s.faults().iter().map(|(_, n)| n).sum();
        let deletes = s
            .steps
            .iter()
            .filter(|(_, st)| matches!(st, Step::Op(Op::DeletePod { .. })))
            .count();
        assert!(faults >= 200, "{faults} faults");
        assert!(deletes >= 1_500, "{deletes} pod deletions");
        assert!(s.faults().iter().all(|(_, n)| *n >= 12), "{:?}", s.faults());
    }

    #[test]
    fn a_kind_left_out_never_comes_and_the_others_still_each_come_once_a_deck() {
        let kinds: Vec<FaultKind> = FaultKind::ALL
            .into_iter()
            .filter(|k| *k != FaultKind::WipeNetworkDir)
            .collect();
        let s = Schedule::draw(1, Duration::from_secs(600), 3, &kinds);
        let counts = s.faults();
        assert!(
            counts.contains(&(FaultKind::WipeNetworkDir, 0)),
            "{counts:?}"
        );
        assert!(
            counts
                .iter()
                .all(|(k, n)| *k == FaultKind::WipeNetworkDir || *n >= 1),
            "{counts:?}"
        );
        assert_eq!("WipeNetworkDir".parse(), Ok(FaultKind::WipeNetworkDir));
        assert!("Wipe".parse::<FaultKind>().is_err());
    }

    #[test]
    fn scaling_a_set_keeps_deletions_within_its_replicas() {
        let s = Schedule::draw(11, Duration::from_secs(1_800), 3, &FaultKind::ALL);
        let mut replicas: std::collections::HashMap<&str, u32> =
            SETS.iter().map(|s| (s.name, s.replicas)).collect();
        for (_, st) in &s.steps {
            match st {
                Step::Op(Op::Scale { set, replicas: r }) => {
                    replicas.insert(set, *r);
                }
                Step::Op(Op::DeletePod { set, ordinal, .. }) => {
                    assert!(
                        *ordinal < replicas[set],
                        "{set}-{ordinal} of {}",
                        replicas[set]
                    );
                }
                _ => {}
            }
        }
    }
}
