//! One glibc malloc arena for the controller (issue 28).
//!
//! glibc's malloc gives each thread that allocates an arena of its own (up to 8 per core): the
//! runtime's threads take turns deserializing the initial LIST's pages and building the caches,
//! and memory a page freed in one thread's arena is not reused by the next page on another thread.
//! The peak RSS was that start-up transient, not the caches: measured with
//! `bench_controller --sizes 1000,10000 --expiries 10` (release operator, the same loaded machine,
//! peak RSS as `VmHWM`), 32.2 → 50.4 MiB at 1 000 → 10 000 pods (2.02 MiB per 1 000 pods) with
//! glibc's default arenas, 22.5 → 33.3 MiB (1.20 MiB per 1 000) with `MALLOC_ARENA_MAX=1`; its
//! 50.4 MiB was reached within 3 s of the start, before any reservation existed. The controller as
//! built here (it sets the variable itself), on a quieter machine (load 1–3): 24.9 → 34.4 MiB,
//! 1.05 MiB per 1 000 pods above 23.8 MiB, and again 25.3 → 34.5 MiB, 1.02 per 1 000; glibc's
//! default arenas between the two: 31.8 → 48.6 MiB, 1.86 per 1 000. All Bound at 10 000 pods at
//! 84 % of the ceiling with one arena, 85 % with the default (one arena's lock costs nothing
//! measurable at the controller's few percent of a core). Tried and not kept: mimalloc as the
//! global allocator, 59.3 MiB at 1 000 pods. At 30 000 pods (one arena) the peak was 85.4 MiB,
//! 2.1 MiB per 1 000, with one step of 11 MiB near 28 700 reservations (7/8 of 32 768, where a
//! hash table with an entry per reservation doubles): what is left is the caches' tables.
//!
//! The setting is glibc's environment variable, read when the process starts (setting it from
//! code needs `mallopt`, an `unsafe` call): the controller starts itself again in place (`exec`,
//! same pid and arguments) with it set, unless it is set already, so an operator can still choose
//! another value. Other C libraries ignore it.

use std::{ffi::OsString, io, os::unix::process::CommandExt, process::Command};

/// glibc's variable and the value the controller runs with.
pub const ARENA_MAX: (&str, &str) = ("MALLOC_ARENA_MAX", "1");

/// Whether to start again with [`ARENA_MAX`], given the variable's current value.
fn needs_restart(current: Option<&OsString>) -> bool {
    current.is_none()
}

/// Replaces the process with itself run with [`ARENA_MAX`] set, unless it is set already.
/// Returns only when it did not: `Ok` when nothing was needed, the error when the `exec` failed
/// (the controller then runs with glibc's default arenas).
pub fn one_arena() -> io::Result<()> {
    let (name, value) = ARENA_MAX;
    if !needs_restart(std::env::var_os(name).as_ref()) {
        return Ok(());
    }
    let exe = std::env::current_exe()?;
    Err(Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(name, value)
        .exec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_controller_starts_again_only_when_the_variable_is_unset() {
        let cases = [
            (None, true),
            (Some("1"), false),
            (Some("4"), false),
            (Some(""), false),
        ];
        for (current, restart) in cases {
            let current = current.map(OsString::from);
            assert_eq!(needs_restart(current.as_ref()), restart, "{current:?}");
        }
    }
}
