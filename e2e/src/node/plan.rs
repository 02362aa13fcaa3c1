//! What the stand-in must do, pure: given the pods bound to the node and the sandboxes it has,
//! the sandbox actions that bring the node in line (a kubelet's pod sync, reduced to networking).

use std::collections::BTreeMap;

use jiff::Timestamp;

use super::cni::PodRef;

/// A pod bound to this node, as far as syncing its sandbox goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodState {
    /// Who it is.
    pub pod: PodRef,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// `spec.hostNetwork`: no sandbox network, the node's address.
    pub host_network: bool,
    /// Phase Succeeded or Failed: its sandbox is no longer needed.
    pub terminal: bool,
    /// Its status already says Running (only consulted for host-network pods).
    pub running: bool,
}

/// A sandbox the stand-in made (from its record on disk).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxState {
    /// Its ID (`CNI_CONTAINERID`).
    pub container_id: String,
    /// The pod it was made for.
    pub pod: PodRef,
    /// ADD succeeded and the pod's status was written; otherwise a run died half-way.
    pub established: bool,
}

/// One step of bringing the node in line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// CNI DEL, remove the namespace and the record.
    Teardown {
        /// The sandbox.
        container_id: String,
        /// The pod it was made for.
        pod: PodRef,
    },
    /// Delete the pod with grace period 0: its sandbox is gone (the kubelet's confirmation).
    ConfirmDeletion(PodRef),
    /// Make a namespace, CNI ADD, write the pod's status.
    CreateSandbox(PodRef),
    /// Write Running status with the node's address (no sandbox network).
    HostNetworkRunning(PodRef),
}

/// The actions, in order: teardowns first (they free addresses a new sandbox may need), then
/// deletion confirmations, then new sandboxes. A pod whose retry time (`not_before`, by UID) has
/// not come yet gets no new sandbox.
pub fn plan(
    pods: &[PodState],
    sandboxes: &[SandboxState],
    not_before: &BTreeMap<String, Timestamp>,
    now: Timestamp,
) -> Vec<Action> {
    let live = |pod: &PodRef| {
        pods.iter()
            .find(|p| p.pod == *pod)
            .filter(|p| !p.deleting && !p.terminal && !p.host_network)
    };
    let mut teardowns = Vec::new();
    let mut kept: Vec<&PodRef> = Vec::new();
    for sandbox in sandboxes {
        if sandbox.established && live(&sandbox.pod).is_some() {
            kept.push(&sandbox.pod);
        } else {
            teardowns.push(Action::Teardown {
                container_id: sandbox.container_id.clone(),
                pod: sandbox.pod.clone(),
            });
        }
    }
    let mut confirmations = Vec::new();
    let mut creations = Vec::new();
    for p in pods {
        if p.deleting {
            confirmations.push(Action::ConfirmDeletion(p.pod.clone()));
            continue;
        }
        if p.terminal || kept.contains(&&p.pod) {
            continue;
        }
        if p.host_network {
            if !p.running {
                creations.push(Action::HostNetworkRunning(p.pod.clone()));
            }
            continue;
        }
        if not_before.get(&p.pod.uid).is_some_and(|t| *t > now) {
            continue;
        }
        creations.push(Action::CreateSandbox(p.pod.clone()));
    }
    teardowns.extend(confirmations);
    teardowns.extend(creations);
    teardowns
}

/// Holds each teardown back until `delay` after it was first planned, and a pod's deletion
/// confirmation until its sandbox is torn down: a slow runtime. With a force-deleted pod that is
/// re-created at once, the new sandbox's ADD then comes before the old sandbox's DEL, the order in
/// which ipkeep answers "try again later". `first_planned` (by sandbox ID) carries over between
/// passes; a zero `delay` holds nothing.
pub fn hold_teardowns(
    actions: Vec<Action>,
    first_planned: &mut BTreeMap<String, Timestamp>,
    delay: jiff::SignedDuration,
    now: Timestamp,
) -> Vec<Action> {
    if delay.is_zero() {
        first_planned.clear();
        return actions;
    }
    let mut planned = Vec::new();
    let mut held_pods = Vec::new();
    for action in &actions {
        if let Action::Teardown { container_id, pod } = action {
            planned.push(container_id.clone());
            let since = *first_planned.entry(container_id.clone()).or_insert(now);
            if now < since + delay {
                held_pods.push(pod.clone());
            }
        }
    }
    first_planned.retain(|id, _| planned.contains(id));
    actions
        .into_iter()
        .filter(|a| match a {
            Action::Teardown { pod, .. } | Action::ConfirmDeletion(pod) => !held_pods.contains(pod),
            _ => true,
        })
        .collect()
}

/// When to retry a failed sandbox: soon after "try again later" (code 11, as a runtime's next
/// sync would), else with the kubelet's doubling back-off from 1 s up to 30 s.
pub fn retry_delay(try_again_later: bool, failures: u32) -> std::time::Duration {
    if try_again_later {
        return std::time::Duration::from_millis(500);
    }
    let secs = 1u64 << failures.saturating_sub(1).min(5);
    std::time::Duration::from_secs(secs.min(30))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str) -> PodRef {
        PodRef {
            namespace: "db".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        }
    }

    fn state(name: &str) -> PodState {
        PodState {
            pod: pod(name),
            deleting: false,
            host_network: false,
            terminal: false,
            running: false,
        }
    }

    fn sandbox(id: &str, name: &str, established: bool) -> SandboxState {
        SandboxState {
            container_id: id.into(),
            pod: pod(name),
            established,
        }
    }

    fn teardown(id: &str, name: &str) -> Action {
        Action::Teardown {
            container_id: id.into(),
            pod: pod(name),
        }
    }

    const NOW: Timestamp = Timestamp::UNIX_EPOCH;

    /// What the case says, the pods, the sandboxes, the expected actions.
    type Case = (&'static str, Vec<PodState>, Vec<SandboxState>, Vec<Action>);

    #[test]
    fn table() {
        let deleting = PodState {
            deleting: true,
            ..state("b")
        };
        let terminal = PodState {
            terminal: true,
            ..state("c")
        };
        let host = PodState {
            host_network: true,
            ..state("h")
        };
        let host_running = PodState {
            running: true,
            ..host.clone()
        };
        let other_uid = PodState {
            pod: PodRef {
                uid: "new".into(),
                ..pod("a")
            },
            ..state("a")
        };
        let none = BTreeMap::new();
        let cases: Vec<Case> = vec![
            (
                "a new pod gets a sandbox",
                vec![state("a")],
                vec![],
                vec![Action::CreateSandbox(pod("a"))],
            ),
            (
                "an established sandbox is kept",
                vec![state("a")],
                vec![sandbox("1", "a", true)],
                vec![],
            ),
            (
                "a half-made sandbox is torn down and made again",
                vec![state("a")],
                vec![sandbox("1", "a", false)],
                vec![teardown("1", "a"), Action::CreateSandbox(pod("a"))],
            ),
            (
                "a gone pod's sandbox is torn down",
                vec![],
                vec![sandbox("1", "a", true)],
                vec![teardown("1", "a")],
            ),
            (
                "a re-created pod (new UID) gets a new sandbox after the old one's DEL",
                vec![other_uid.clone()],
                vec![sandbox("1", "a", true)],
                vec![
                    teardown("1", "a"),
                    Action::CreateSandbox(other_uid.pod.clone()),
                ],
            ),
            (
                "a deleting pod: DEL, then delete with grace 0",
                vec![deleting.clone()],
                vec![sandbox("2", "b", true)],
                vec![teardown("2", "b"), Action::ConfirmDeletion(pod("b"))],
            ),
            (
                "a deleting pod without sandbox is confirmed",
                vec![deleting],
                vec![],
                vec![Action::ConfirmDeletion(pod("b"))],
            ),
            (
                "a finished pod's sandbox goes, none is made",
                vec![terminal],
                vec![sandbox("3", "c", true)],
                vec![teardown("3", "c")],
            ),
            (
                "a host-network pod is just marked running",
                vec![host],
                vec![],
                vec![Action::HostNetworkRunning(pod("h"))],
            ),
            ("once", vec![host_running], vec![], vec![]),
        ];
        for (what, pods, sandboxes, want) in cases {
            assert_eq!(plan(&pods, &sandboxes, &none, NOW), want, "{what}");
        }
    }

    #[test]
    fn a_pod_waits_for_its_retry_time() {
        let later = NOW + jiff::SignedDuration::from_secs(1);
        let wait = BTreeMap::from([("uid-a".to_owned(), later)]);
        assert_eq!(plan(&[state("a")], &[], &wait, NOW), vec![]);
        assert_eq!(
            plan(&[state("a")], &[], &wait, later),
            vec![Action::CreateSandbox(pod("a"))]
        );
    }

    #[test]
    fn teardowns_and_their_confirmations_are_held_for_the_delay() {
        let delay = jiff::SignedDuration::from_secs(2);
        let at = |secs: i64| NOW + jiff::SignedDuration::from_secs(secs);
        let actions = || {
            vec![
                teardown("1", "a"),
                teardown("2", "b"),
                Action::ConfirmDeletion(pod("b")),
                Action::ConfirmDeletion(pod("c")),
                Action::CreateSandbox(pod("d")),
            ]
        };
        let mut first = BTreeMap::new();
        assert_eq!(
            hold_teardowns(actions(), &mut first, delay, at(0)),
            vec![
                Action::ConfirmDeletion(pod("c")),
                Action::CreateSandbox(pod("d"))
            ],
            "nothing torn down yet; b is not confirmed before its DEL"
        );
        assert_eq!(
            hold_teardowns(actions(), &mut first, delay, at(1)),
            vec![
                Action::ConfirmDeletion(pod("c")),
                Action::CreateSandbox(pod("d"))
            ]
        );
        assert_eq!(
            hold_teardowns(actions(), &mut first, delay, at(2)),
            actions(),
            "the delay is over"
        );
        // A sandbox no longer planned is forgotten; planned again, it waits again.
        assert_eq!(hold_teardowns(vec![], &mut first, delay, at(3)), vec![]);
        assert!(first.is_empty());
        assert_eq!(
            hold_teardowns(vec![teardown("1", "a")], &mut first, delay, at(4)),
            vec![]
        );
        assert_eq!(
            hold_teardowns(
                actions(),
                &mut BTreeMap::new(),
                jiff::SignedDuration::ZERO,
                at(0)
            ),
            actions(),
            "no delay holds nothing"
        );
    }

    #[test]
    fn retry_delays() {
        use std::time::Duration;
        assert_eq!(retry_delay(true, 9), Duration::from_millis(500));
        assert_eq!(retry_delay(false, 1), Duration::from_secs(1));
        assert_eq!(retry_delay(false, 2), Duration::from_secs(2));
        assert_eq!(retry_delay(false, 5), Duration::from_secs(16));
        assert_eq!(retry_delay(false, 50), Duration::from_secs(30));
    }
}
