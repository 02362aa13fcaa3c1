//! The torture run's short form (issue 47): faults of every kind and churn on three real nodes
//! (CRI-O, containerd, a tiny one) for a few minutes from a fixed seed, the oracle checking every
//! promise every second and at the quiet end. The long run is `make torture` (docs/testing.md).
//!
//! `IPKEEP_TORTURE_SEED` and `IPKEEP_TORTURE_DURATION` (`retainFor`'s grammar: `3m`) change
//! the seed and the length. Needs root, `make cluster-bins`, `make node-bins`, `make crio-bins`
//! and `make image`.

use std::time::Duration;

use ipkeep_e2e::{
    cluster::realnode::NodeCni,
    testkit::realnode,
    torture::{Options, schedule::FaultKind},
};

/// The seed CI runs: fixed, so a failure replays (`make torture SEED=1 DURATION=3m`).
const SEED: u64 = 1;
/// Long enough for every fault kind once (sixteen faults, one every 14 s on average).
const DURATION: Duration = Duration::from_secs(240);

/// Every fault kind: the short run draws each at least once.
fn faults() -> Vec<FaultKind> {
    FaultKind::ALL.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_torture_run_breaks_no_promise() {
    // Its own cluster (a fault proxy in front of the in-cluster clients): nothing else runs.
    let _alone = realnode::use_machine_alone().await;
    let seed = std::env::var("IPKEEP_TORTURE_SEED")
        .ok()
        .map(|s| s.parse().expect("IPKEEP_TORTURE_SEED is a number"))
        .unwrap_or(SEED);
    let duration = std::env::var("IPKEEP_TORTURE_DURATION")
        .ok()
        .map(|d| {
            ipkeep_reservation::RetainFor::parse(&d)
                .expect("IPKEEP_TORTURE_DURATION is a duration like 3m")
                .duration()
        })
        .unwrap_or(DURATION);
    let report = ipkeep_e2e::torture::run(Options {
        seed,
        duration,
        cni: NodeCni::Bridge,
        faults: faults(),
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "the torture run could not run: {}",
            ipkeep_e2e::error_chain(&e)
        )
    });
    let text = report.text();
    eprintln!("{text}");
    assert!(report.violations.is_empty(), "promises broken:\n{text}");
    assert!(
        report.faults.len() == faults().len() && report.faults.values().all(|(done, _)| *done > 0),
        "every fault kind drawn made at least once:\n{text}"
    );
    assert!(report.recreations > 0, "pods were re-created:\n{text}");
}
