//! The controller's ready names: handed to whichever worker is free, one reconcile per name at a
//! time (client-go's workqueue rule). A name added while it is being reconciled runs again once
//! that reconcile is done, and a name already waiting is not queued twice.
//!
//! Why one queue and not a shard per worker (what the controller had before issue 28): with a
//! name always hashed to the same shard, the shards drain unevenly. With 1 000 names on 8 shards
//! the longest holds about a fifth more than the mean, so the last ones run with most workers
//! idle; a free worker here takes the next name whichever it is.
//!
//! Pure: no I/O and no clock. The scheduler in front of it holds the names not due yet.

use std::{
    collections::{HashSet, VecDeque},
    hash::Hash,
};

/// Names ready to reconcile and the ones being reconciled.
#[derive(Debug)]
pub struct WorkQueue<K> {
    /// Waiting for a worker, in the order they became ready.
    ready: VecDeque<K>,
    /// The names in `ready`.
    waiting: HashSet<K>,
    /// Being reconciled.
    running: HashSet<K>,
    /// Added while being reconciled: queued again when that reconcile is done.
    again: HashSet<K>,
}

impl<K> Default for WorkQueue<K> {
    fn default() -> Self {
        WorkQueue {
            ready: VecDeque::new(),
            waiting: HashSet::new(),
            running: HashSet::new(),
            again: HashSet::new(),
        }
    }
}

impl<K: Hash + Eq + Clone> WorkQueue<K> {
    /// `key` is ready. True when it was queued for a worker (not already waiting, not running).
    pub fn add(&mut self, key: K) -> bool {
        if self.running.contains(&key) {
            self.again.insert(key);
            return false;
        }
        if !self.waiting.insert(key.clone()) {
            return false;
        }
        self.ready.push_back(key);
        true
    }

    /// The next name for a worker, now counted as running until [`WorkQueue::done`].
    pub fn take(&mut self) -> Option<K> {
        let key = self.ready.pop_front()?;
        self.waiting.remove(&key);
        self.running.insert(key.clone());
        Some(key)
    }

    /// The reconcile of `key` finished. True when it was added meanwhile and is queued again.
    pub fn done(&mut self, key: &K) -> bool {
        self.running.remove(key);
        match self.again.take(key) {
            Some(key) => self.add(key),
            None => false,
        }
    }

    /// Names waiting for a worker.
    pub fn waiting(&self) -> usize {
        self.ready.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    enum Op {
        Add(&'static str),
        Take,
        Done(&'static str),
    }
    use Op::*;

    /// Runs the ops; returns each op's outcome ("queued"/"-" for add and done, the name or "none"
    /// for take) and what is left waiting.
    fn run(ops: &[Op]) -> (Vec<String>, Vec<&'static str>) {
        let mut q = WorkQueue::default();
        let out = ops
            .iter()
            .map(|op| match op {
                Add(k) => if q.add(*k) { "queued" } else { "-" }.to_string(),
                Take => q.take().unwrap_or("none").to_string(),
                Done(k) => if q.done(k) { "queued" } else { "-" }.to_string(),
            })
            .collect();
        let left = std::iter::from_fn(|| q.take()).collect();
        (out, left)
    }

    /// What a case is, the ops, each op's outcome, what is left waiting.
    type Case = (
        &'static str,
        &'static [Op],
        &'static [&'static str],
        &'static [&'static str],
    );

    #[test]
    fn one_reconcile_per_name_and_nothing_lost() {
        let cases: &[Case] = &[
            (
                "in order of readiness",
                &[Add("a"), Add("b"), Take],
                &["queued", "queued", "a"],
                &["b"],
            ),
            (
                "a waiting name is queued once",
                &[Add("a"), Add("a"), Take, Take],
                &["queued", "-", "a", "none"],
                &[],
            ),
            (
                "added while running: not handed out beside the running one",
                &[Add("a"), Take, Add("a"), Take],
                &["queued", "a", "-", "none"],
                &[],
            ),
            (
                "added while running: queued again when done",
                &[Add("a"), Take, Add("a"), Add("a"), Done("a"), Take],
                &["queued", "a", "-", "-", "queued", "a"],
                &[],
            ),
            (
                "done without an add meanwhile: gone",
                &[Add("a"), Take, Done("a")],
                &["queued", "a", "-"],
                &[],
            ),
            (
                "another name is handed out while one runs",
                &[Add("a"), Add("b"), Take, Add("a"), Take],
                &["queued", "queued", "a", "-", "b"],
                &[],
            ),
            (
                "queued again behind the names that waited",
                &[Add("a"), Take, Add("a"), Add("b"), Done("a")],
                &["queued", "a", "-", "queued", "queued"],
                &["b", "a"],
            ),
        ];
        for (what, ops, out, left) in cases {
            assert_eq!(
                run(ops),
                (out.iter().map(|s| s.to_string()).collect(), left.to_vec()),
                "{what}"
            );
        }
    }
}
