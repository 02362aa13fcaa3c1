//! Server-made identity and time values: uids, generated name suffixes, RFC 3339 timestamps.

use std::{
    collections::hash_map::RandomState,
    hash::{BuildHasher, Hasher},
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

/// A random 64-bit value (std's randomly keyed hasher over a counter: no extra dependency).
fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

/// A version-4-shaped UUID for `metadata.uid`.
pub fn new_uid() -> String {
    let (a, b) = (random_u64(), random_u64());
    let hex = format!("{a:016x}{b:016x}");
    format!(
        "{}-{}-4{}-a{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}

/// The 5-character suffix kube-apiserver appends to `generateName` (its alphabet has no vowels).
pub fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut r = random_u64();
    (0..5)
        .map(|_| {
            let c = ALPHABET[(r % ALPHABET.len() as u64) as usize] as char;
            r /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

/// The current time as kube-apiserver writes `metav1.Time` (`2025-01-02T03:04:05Z`).
pub fn now() -> String {
    format_time(jiff::Timestamp::now())
}

/// The time `d` from now, in the same format.
pub fn now_plus(d: Duration) -> String {
    let t = jiff::Timestamp::now();
    let later = jiff::SignedDuration::try_from(d)
        .ok()
        .and_then(|sd| t.checked_add(sd).ok())
        .unwrap_or(t);
    format_time(later)
}

fn format_time(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_are_uuid_shaped_and_distinct() {
        let (a, b) = (new_uid(), new_uid());
        assert_ne!(a, b);
        let parts: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(parts, vec![8, 4, 4, 4, 12], "{a}");
    }

    #[test]
    fn suffixes_use_the_alphabet() {
        let s = name_suffix();
        assert_eq!(s.len(), 5);
        assert!(
            s.chars().all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c)),
            "{s}"
        );
    }

    #[test]
    fn timestamps_are_rfc3339_seconds() {
        let t = now();
        assert_eq!(t.len(), 20, "{t}");
        assert!(t.ends_with('Z') && t.as_bytes()[10] == b'T', "{t}");
        assert!(now_plus(Duration::from_secs(3600)) > t);
    }
}
