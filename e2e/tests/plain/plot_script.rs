//! `scripts/plot_controller.py`, what `bench_controller --plot` runs: drawn from the committed
//! docs/controller-bench.csv with the system's Python and Debian's python3-matplotlib (`make deps`)
//! into a scratch file, it writes a PNG; the same for `scripts/plot_monitoring.py` (`make
//! monitoring-picture`) and docs/monitoring-fill.csv. Fails, never skips, without them.

use ipkeep_e2e::testkit::{
    Scratch,
    bench::{PLOT_NEEDS, plot, plot_controller},
    repo_root,
};

/// The first bytes of every PNG file.
const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

/// `png` is a PNG with something drawn in it.
fn assert_drawn(png: &std::path::Path) {
    let bytes = std::fs::read(png).unwrap_or_else(|e| panic!("no PNG at {}: {e}", png.display()));
    assert!(
        bytes.starts_with(PNG_SIGNATURE) && bytes.len() > 10_000,
        "{} is not a drawn PNG ({} bytes)",
        png.display(),
        bytes.len()
    );
}

#[test]
fn the_plot_script_draws_the_committed_csv_into_a_png() {
    let s = Scratch::new("plot-script");
    let png = s.join("controller-bench.png");
    plot_controller(&png, &repo_root().join("docs/controller-bench.csv"))
        .unwrap_or_else(|e| panic!("{e}: the plot needs {PLOT_NEEDS}"));
    assert_drawn(&png);
}

#[test]
fn the_monitoring_plot_draws_the_committed_csv_into_a_png() {
    let s = Scratch::new("plot-monitoring");
    let png = s.join("monitoring-fill.png");
    plot(
        "plot_monitoring.py",
        &png,
        &repo_root().join("docs/monitoring-fill.csv"),
    )
    .unwrap_or_else(|e| panic!("{e}: the plot needs {PLOT_NEEDS}"));
    assert_drawn(&png);
}
