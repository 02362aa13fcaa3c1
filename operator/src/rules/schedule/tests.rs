use std::time::{Duration, Instant};

use super::*;

/// One thing that happens to the schedule, `at` seconds after the start.
#[derive(Debug, Clone, Copy)]
enum Do {
    Listed(u64),
    Changed(u64),
    Directory(Trigger, u64),
    /// A pass kept a lost file whose release time is this many seconds after the start.
    ReleaseAt(u64),
    /// Wakes; a pass it starts is reported at once with the outcome (`true`: it succeeded).
    Wake(Wake, u64, bool),
}

/// What a wake should give: nothing, or a pass (full?, how many arrivals, the trigger).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Wait,
    Pass(bool, usize, Option<Trigger>),
}

/// What happens, each with what a wake should give (`None` for a report).
type Script = Vec<(Do, Option<Want>)>;

const RESYNC: Duration = Duration::from_secs(600);

fn run(what: &str, steps: &[(Do, Option<Want>)]) {
    let start = Instant::now();
    let at = |s: u64| start + Duration::from_secs(s);
    let mut schedule = Schedule::new(RESYNC);
    for (i, (step, want)) in steps.iter().enumerate() {
        match *step {
            Do::Listed(s) => schedule.listed(at(s)),
            Do::Changed(s) => schedule.changed(at(s)),
            Do::Directory(trigger, s) => schedule.directory(trigger, at(s)),
            Do::ReleaseAt(s) => schedule.release_at(Some(at(s))),
            Do::Wake(wake, s, ok) => {
                let got = match schedule.next(wake, at(s)) {
                    Step::Wait => Want::Wait,
                    Step::Pass(pass) => {
                        let seen = Want::Pass(
                            pass.full,
                            pass.arrivals.len(),
                            pass.dir_trigger.map(|(_, t)| t),
                        );
                        if ok {
                            schedule.succeeded(&pass, at(s));
                        } else {
                            schedule.failed(pass, at(s));
                        }
                        seen
                    }
                };
                assert_eq!(Some(got), *want, "{what}, step {i}: {step:?}");
            }
        }
    }
}

#[test]
fn the_schedule() {
    use super::Wake::{Changed as W, Retry, Tick};
    use Do::*;
    let cases: Vec<(&str, Script)> = vec![
        (
            "nothing is written before the first list",
            vec![
                (Changed(0), None),
                (Wake(W, 0, true), Some(Want::Wait)),
                (Wake(Tick, 1, true), Some(Want::Wait)),
                (Directory(Trigger::Replaced, 1), None),
                (Wake(Tick, 2, true), Some(Want::Wait)),
            ],
        ),
        (
            "a kept file's release time makes the first tick after it a full pass, once",
            vec![
                (Listed(0), None),
                (Wake(W, 0, true), Some(Want::Pass(true, 1, None))),
                (ReleaseAt(30), None),
                (Wake(Tick, 29, true), Some(Want::Wait)),
                (Wake(Tick, 30, true), Some(Want::Pass(true, 0, None))),
                (Wake(Tick, 31, true), Some(Want::Wait)),
            ],
        ),
        (
            "the first list makes a full pass carrying what arrived before",
            vec![
                (Changed(0), None),
                (Listed(1), None),
                (Wake(W, 1, true), Some(Want::Pass(true, 2, None))),
            ],
        ),
        (
            "a change after that is an incremental pass; a tick with nothing due is no pass",
            vec![
                (Listed(0), None),
                (Wake(W, 0, true), Some(Want::Pass(true, 1, None))),
                (Changed(5), None),
                (Wake(W, 5, true), Some(Want::Pass(false, 1, None))),
                (Wake(Tick, 6, true), Some(Want::Wait)),
            ],
        ),
        (
            "a relist makes the next pass full",
            vec![
                (Listed(0), None),
                (Wake(W, 0, true), Some(Want::Pass(true, 1, None))),
                (Listed(30), None),
                (Wake(W, 30, true), Some(Want::Pass(true, 1, None))),
            ],
        ),
        (
            "the resync interval since the last full pass makes a tick run a full pass",
            vec![
                (Listed(0), None),
                (Wake(W, 0, true), Some(Want::Pass(true, 1, None))),
                (Wake(Tick, 599, true), Some(Want::Wait)),
                (Wake(Tick, 600, true), Some(Want::Pass(true, 0, None))),
                (Wake(Tick, 601, true), Some(Want::Wait)),
                (Wake(Tick, 1_200, true), Some(Want::Pass(true, 0, None))),
            ],
        ),
        (
            "a directory trigger makes the next pass full, naming the most severe cause",
            vec![
                (Listed(0), None),
                (Wake(W, 0, true), Some(Want::Pass(true, 1, None))),
                (Directory(Trigger::NetworkGone, 10), None),
                (Directory(Trigger::Overflow, 10), None),
                (
                    Wake(W, 10, true),
                    Some(Want::Pass(true, 0, Some(Trigger::NetworkGone))),
                ),
                (Directory(Trigger::Replaced, 20), None),
                (
                    Wake(Tick, 21, true),
                    Some(Want::Pass(true, 0, Some(Trigger::Replaced))),
                ),
            ],
        ),
        (
            "a failed pass is tried again after the backoff, as a full pass with its changes",
            vec![
                (Listed(0), None),
                (Wake(W, 0, true), Some(Want::Pass(true, 1, None))),
                (Changed(10), None),
                (Directory(Trigger::ReservedGone, 10), None),
                (
                    Wake(W, 10, false),
                    Some(Want::Pass(true, 1, Some(Trigger::ReservedGone))),
                ),
                (Changed(10), None),
                // Backoff::PASS: 500 ms after the first failure; nothing runs before.
                (Wake(W, 10, true), Some(Want::Wait)),
                (Wake(Tick, 10, true), Some(Want::Wait)),
                (
                    Wake(Retry, 11, false),
                    Some(Want::Pass(true, 2, Some(Trigger::ReservedGone))),
                ),
                // Second failure: 1 s.
                (
                    Wake(Retry, 12, true),
                    Some(Want::Pass(true, 2, Some(Trigger::ReservedGone))),
                ),
                (Changed(13), None),
                (Wake(W, 13, true), Some(Want::Pass(false, 1, None))),
            ],
        ),
    ];
    for (what, steps) in cases {
        run(what, &steps);
    }
}

#[test]
fn retries_back_off_and_a_success_clears_them() {
    let start = Instant::now();
    let mut s = Schedule::new(RESYNC);
    s.listed(start);
    let mut at = start;
    for (failures, delay_ms) in [500, 1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000]
        .into_iter()
        .enumerate()
    {
        let Step::Pass(pass) = s.next(Wake::Retry, at) else {
            panic!("after {failures} failures: a due retry runs");
        };
        assert!(pass.full || failures == 0, "a retry is a full pass");
        s.failed(pass, at);
        let due = at + Duration::from_millis(delay_ms);
        assert_eq!(s.retry_at(), Some(due), "after failure {}", failures + 1);
        assert_eq!(
            s.next(Wake::Retry, due - Duration::from_millis(1)),
            Step::Wait
        );
        at = due;
    }
    let Step::Pass(pass) = s.next(Wake::Retry, at) else {
        panic!("a due retry runs");
    };
    s.succeeded(&pass, at);
    assert_eq!(s.retry_at(), None);
    assert_eq!(
        s.since_full(at + Duration::from_secs(3)),
        Some(Duration::from_secs(3))
    );
}
