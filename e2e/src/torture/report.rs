//! The torture run's report: the table the closing note asks for. Pure.

use std::{collections::BTreeMap, fmt::Write as _};

use jiff::SignedDuration;

use super::{
    oracle::{Latencies, Violation},
    schedule::FaultKind,
};

/// Done and failed, per kind.
pub type Counts = BTreeMap<String, (usize, usize)>;

/// What a run did and found.
#[derive(Debug, Default)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// The run's length, in seconds (its quiet end not included).
    pub seconds: u64,
    /// Workload operations by kind.
    pub ops: Counts,
    /// Faults by kind.
    pub faults: Counts,
    /// Pods re-created under a name a pod had before.
    pub recreations: usize,
    /// Samples taken, and skipped (the API could not be read).
    pub samples: (usize, usize),
    /// Creation-to-ready times.
    pub latencies: Latencies,
    /// Every broken promise.
    pub violations: Vec<Violation>,
    /// What looked like one but is a documented limitation, with the reason.
    pub limitations: Vec<String>,
}

impl Report {
    /// Counts one fault of `kind`, done or failed.
    pub fn fault(&mut self, kind: FaultKind, done: bool) {
        count(&mut self.faults, &kind.to_string(), done);
    }

    /// Counts one operation of `kind`, done or failed.
    pub fn op(&mut self, kind: &str, done: bool) {
        count(&mut self.ops, kind, done);
    }

    /// The report as text: the seed, the tables, the times and the violations.
    pub fn text(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(t, "torture run: seed {} for {} s", self.seed, self.seconds);
        table(&mut t, "operation", &self.ops);
        table(&mut t, "fault", &self.faults);
        let _ = writeln!(
            t,
            "pods re-created under their name: {}\nsamples: {} taken, {} skipped (API unreadable)",
            self.recreations, self.samples.0, self.samples.1
        );
        for (what, list) in [
            (
                "returning pod, created → Ready with its addresses",
                &self.latencies.returning,
            ),
            (
                "unannotated pod, created → Ready",
                &self.latencies.unannotated,
            ),
        ] {
            let _ = writeln!(t, "{what}: {}", quantiles(list));
        }
        let _ = writeln!(
            t,
            "documented limitations met (not violations): {}",
            self.limitations.len()
        );
        for l in &self.limitations {
            let _ = writeln!(t, "  {l}");
        }
        let _ = writeln!(t, "violations: {}", self.violations.len());
        for v in &self.violations {
            let _ = writeln!(
                t,
                "  [{}] {} {}\n      faults in force: {}",
                v.promise.number(),
                v.at,
                v.what,
                if v.faults.is_empty() {
                    "none".to_owned()
                } else {
                    v.faults.join("; ")
                }
            );
        }
        t
    }
}

fn count(counts: &mut Counts, kind: &str, done: bool) {
    let e = counts.entry(kind.to_owned()).or_default();
    if done {
        e.0 += 1;
    } else {
        e.1 += 1;
    }
}

fn table(t: &mut String, what: &str, counts: &Counts) {
    let width = counts
        .keys()
        .map(String::len)
        .max()
        .unwrap_or(0)
        .max(what.len());
    let _ = writeln!(t, "| {what:width$} | done | failed |");
    let _ = writeln!(t, "|{:-<w$}|------|--------|", "", w = width + 2);
    let (mut done, mut failed) = (0, 0);
    for (k, (d, f)) in counts {
        let _ = writeln!(t, "| {k:width$} | {d:4} | {f:6} |");
        done += d;
        failed += f;
    }
    let _ = writeln!(t, "| {:width$} | {done:4} | {failed:6} |", "all");
}

/// `n=…, p50 …, p99 …` of `list`.
pub fn quantiles(list: &[SignedDuration]) -> String {
    if list.is_empty() {
        return "none".to_owned();
    }
    let mut sorted = list.to_vec();
    sorted.sort();
    let at = |q: f64| {
        let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
        sorted[i.min(sorted.len() - 1)].as_secs_f64()
    };
    format!(
        "n={}, p50 {:.1} s, p99 {:.1} s",
        sorted.len(),
        at(0.5),
        at(0.99)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_read_from_the_sorted_times() {
        let s = SignedDuration::from_secs;
        let cases = [
            (vec![], "none"),
            (vec![s(3)], "n=1, p50 3.0 s, p99 3.0 s"),
            (vec![s(9), s(1), s(2)], "n=3, p50 2.0 s, p99 9.0 s"),
        ];
        for (list, want) in cases {
            assert_eq!(quantiles(&list), want);
        }
    }

    #[test]
    fn the_tables_count_done_and_failed_with_a_total() {
        let mut r = Report::default();
        r.op("delete retained pod", true);
        r.op("delete retained pod", false);
        r.fault(FaultKind::Reboot, true);
        let text = r.text();
        assert!(
            text.contains("| delete retained pod |    1 |      1 |"),
            "{text}"
        );
        assert!(text.contains("| Reboot |    1 |      0 |"), "{text}");
        assert!(text.contains("violations: 0"), "{text}");
    }
}
