//! `scripts/plot_controller.py`, what `bench_controller --plot` runs: drawn from the committed
//! docs/controller-bench.csv with the system's Python and Debian's python3-matplotlib (`make deps`)
//! into a scratch file, it writes a PNG. Fails, never skips, without them.

use ipkeep_e2e::testkit::{Scratch, repo_root};
use std::process::Command;

/// The first bytes of every PNG file.
const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

#[test]
fn the_plot_script_draws_the_committed_csv_into_a_png() {
    let s = Scratch::new("plot-script");
    let png = s.join("controller-bench.png");
    let out = Command::new("/usr/bin/python3")
        .arg(repo_root().join("scripts/plot_controller.py"))
        .arg(&png)
        .arg(repo_root().join("docs/controller-bench.csv"))
        .output()
        .unwrap_or_else(|e| {
            panic!("/usr/bin/python3 did not run ({e}): install python3-matplotlib (make deps)")
        });
    assert!(
        out.status.success(),
        "scripts/plot_controller.py failed (without matplotlib: make deps installs Debian's python3-matplotlib): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(&png).unwrap_or_else(|e| panic!("no PNG at {}: {e}", png.display()));
    assert!(
        bytes.starts_with(PNG_SIGNATURE) && bytes.len() > 10_000,
        "{} is not a drawn PNG ({} bytes)",
        png.display(),
        bytes.len()
    );
}
