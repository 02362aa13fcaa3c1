//! `make bench`: ipkeep against the reference host-local, side by side in one run, on the same
//! scratch filesystem, cycles interleaved so that neither gets a quieter machine.
//!
//! Each scenario pre-seeds `<dataDir>/<net>/` with allocations in host-local's own format, then runs
//! ADD+DEL cycles of new containers and reports median and p99 latency of ADD, DEL and the cycle
//! (process start to exit, as a runtime sees it), the peak RSS, and ipkeep/host-local ratios.
//!
//! Binaries: ipkeep from `$IPKEEP_BIN`, else next to this example's directory
//! (`target/release/ipkeep`, built by `cargo build --release -p ipkeep-plugin`); host-local from
//! `$REFERENCE_CNI_DIR/host-local` (default `/usr/lib/cni`). Peak RSS comes from `/usr/bin/time -f %M`
//! (GNU time reports the child's `ru_maxrss` from `wait4`) on separate, untimed cycles.
//! The exec floor — what a runtime pays to exec any static program twice, for an ADD and a DEL,
//! when it does nothing — is Debian's static busybox run as `true`, its cycles interleaved with
//! ipkeep's in an empty /16; the bench prints ipkeep's cycle as a multiple of it.
//! An A/B of two ipkeep builds goes through the floor comparison: `IPKEEP_CANDIDATE_BIN` names the
//! second build, whose cycles are interleaved with the floor's and ipkeep's in the same run;
//! `IPKEEP_BENCH_FLOOR_CYCLES` sets the cycles per side (default 300) and
//! `IPKEEP_BENCH_FLOOR_ONLY=1` skips the host-local scenarios, for repeated A/B runs.
//! Scratch directories go to `$IPKEEP_BENCH_DIR` if set (e.g. a tmpfs, to take fsync out of the
//! picture), else the system temp dir. The load average is printed before and after: the numbers
//! only mean something on an otherwise quiet machine.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// The network every scenario uses: a /16 from the benchmarking range, as a node's pod CIDR.
const NETWORK: &str = "benchnet";
const SUBNET_BASE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 0);
const GNU_TIME: &str = "/usr/bin/time";
/// The static no-op of the exec floor (Debian's `busybox-static`, `make deps`), run through a link
/// named `true` so that it runs that applet.
const STATIC_NO_OP: &str = "/bin/busybox";
/// Cycles of each side in the floor comparison, unless `IPKEEP_BENCH_FLOOR_CYCLES` says otherwise.
const FLOOR_CYCLES: usize = 300;
/// The goal: ipkeep's ADD+DEL within this multiple of the exec floor (issue 28).
const FLOOR_TARGET: f64 = 1.25;
/// Untimed cycles per plugin and scenario that run under `/usr/bin/time` for the peak RSS.
const RSS_CYCLES: usize = 3;

/// One measured situation. Adding a scenario is one more entry in [`scenarios`].
#[derive(Debug)]
struct Scenario {
    /// Shown in the table.
    name: &'static str,
    /// IP files (host-local's format) already on disk before the first cycle.
    allocated: usize,
    /// More state laid down after the allocations, given `<dataDir>` (e.g. reservation files).
    extra_state: fn(&Path) -> Result<(), BenchError>,
    /// Measured cycles for host-local and for ipkeep.
    cycles: [usize; 2],
}

fn no_extra_state(_data_dir: &Path) -> Result<(), BenchError> {
    Ok(())
}

/// Reservations on the node in the reservation scenario, as many as the issue's budget names.
const RESERVATIONS: usize = 1_000;

/// [`RESERVATIONS`] reservation files for other pods, written through the library's writer exactly
/// as the agent writes them (which also keeps the plugin's snapshot of them current). Their
/// addresses sit at 198.18.100.0 and up, away from the cycles' round robin; host-local ignores them.
fn reservation_files(data_dir: &Path) -> Result<(), BenchError> {
    use ipkeep_netdir::NetworkDir;
    use ipkeep_reservation::{FORMAT_VERSION, ReservationFile, ReservationWriter};
    let desired: Vec<ReservationFile> = (0..RESERVATIONS)
        .map(|i| ReservationFile {
            version: FORMAT_VERSION,
            namespace: format!("team-{}", i % 20),
            pod: format!("db-{i}"),
            ips: vec![std::net::IpAddr::V4(nth_address(100 * 256 + i))],
            release_time: None,
            uid: format!("bench-uid-{i}"),
            node_name: Some("bench-node".to_owned()),
            generation: None,
            retain_for_seconds: None,
        })
        .collect();
    let failed = |detail: String| BenchError::Reservations {
        path: data_dir.join(NETWORK),
        detail,
    };
    let desired = desired
        .into_iter()
        .map(ReservationFile::validate)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| failed(e.to_string()))?;
    let dir = NetworkDir::open(data_dir, NETWORK).map_err(|e| failed(e.to_string()))?;
    let report = ReservationWriter::new()
        .apply(&dir, &desired)
        .map_err(|e| failed(e.to_string()))?;
    if !report.is_complete() {
        return Err(failed(format!("{report:?}")));
    }
    Ok(())
}

/// The scenarios, chosen so the whole bench stays within about three minutes on 2 cores.
fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "empty /16",
            allocated: 0,
            extra_state: no_extra_state,
            cycles: [200, 200],
        },
        Scenario {
            name: "1 000 allocated",
            allocated: 1_000,
            extra_state: no_extra_state,
            cycles: [100, 200],
        },
        Scenario {
            name: "10 000 allocated",
            allocated: 10_000,
            extra_state: no_extra_state,
            cycles: [30, 200],
        },
    ]
}

/// Unmeasured cycles before the measured ones, per side.
const WARMUP_CYCLES: usize = 20;

/// Cycles of each side in the reservation-cost comparison (ipkeep against itself).
const RESERVATION_CYCLES: usize = 300;

/// What can stop the bench.
#[derive(Debug, thiserror::Error)]
enum BenchError {
    #[error("failed to find {what} at {}: {hint}", path.display())]
    Missing {
        what: &'static str,
        path: PathBuf,
        hint: &'static str,
    },
    #[error("failed to {action} {}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to run {} {command} for {container}: exit {code:?}, stdout {stdout}, stderr {stderr}", plugin.display())]
    Plugin {
        plugin: PathBuf,
        command: &'static str,
        container: String,
        code: Option<i32>,
        stdout: String,
        stderr: String,
    },
    #[error("failed to get a fresh address from {}: ADD returned {address}, which was pre-seeded", plugin.display())]
    SeededAddressReturned { plugin: PathBuf, address: String },
    #[error("failed to write the reservation files in {}: {detail}", path.display())]
    Reservations { path: PathBuf, detail: String },
    #[error("failed to read IPKEEP_BENCH_FLOOR_CYCLES {text:?}: not a positive number")]
    FloorCycles { text: String },
    #[error("failed to read the peak RSS written by {GNU_TIME}: {text:?}")]
    Rss { text: String },
}

/// A plugin under measurement.
#[derive(Debug)]
struct Plugin {
    name: &'static str,
    path: PathBuf,
}

fn find_plugins() -> Result<[Plugin; 2], BenchError> {
    let reference_dir = std::env::var_os("REFERENCE_CNI_DIR")
        .map_or_else(|| PathBuf::from("/usr/lib/cni"), PathBuf::from);
    let host_local = reference_dir.join("host-local");
    let ipkeep = match std::env::var_os("IPKEEP_BIN") {
        Some(path) => PathBuf::from(path),
        // target/<profile>/examples/bench → target/<profile>/ipkeep
        None => std::env::current_exe()
            .ok()
            .and_then(|exe| {
                exe.parent()
                    .and_then(Path::parent)
                    .map(|dir| dir.join("ipkeep"))
            })
            .unwrap_or_else(|| PathBuf::from("target/release/ipkeep")),
    };
    for (what, path, hint) in [
        (
            "ipkeep",
            &ipkeep,
            "run `cargo build --release -p ipkeep-plugin` or set IPKEEP_BIN",
        ),
        (
            "host-local",
            &host_local,
            "run `make deps` (Debian package containernetworking-plugins)",
        ),
        (
            "GNU time",
            &PathBuf::from(GNU_TIME),
            "install the Debian package `time` (`make deps`)",
        ),
        (
            "a static no-op",
            &PathBuf::from(STATIC_NO_OP),
            "install the Debian package `busybox-static` (`make deps`)",
        ),
    ] {
        if !path.is_file() {
            return Err(BenchError::Missing {
                what,
                path: path.clone(),
                hint,
            });
        }
    }
    Ok([
        Plugin {
            name: "host-local",
            path: host_local,
        },
        Plugin {
            name: "ipkeep",
            path: ipkeep,
        },
    ])
}

/// The `i`-th allocatable address of the /16 (the gateway `.0.1` excluded, as host-local does).
fn nth_address(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(SUBNET_BASE) + 2 + i as u32)
}

/// Where the scratch data directories of both plugins go.
fn scratch_root() -> PathBuf {
    std::env::var_os("IPKEEP_BENCH_DIR").map_or_else(std::env::temp_dir, PathBuf::from)
}

/// `/proc/loadavg`'s three load averages, for the record.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// Wraps an I/O error with what was being done to which path.
fn io_error(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> BenchError {
    let path = path.to_owned();
    move |source| BenchError::Io {
        action,
        path,
        source,
    }
}

/// A scratch data directory seeded for `scenario`, removed on drop.
#[derive(Debug)]
struct DataDir {
    root: tempfile::TempDir,
}

impl DataDir {
    /// `allocated` addresses in host-local's format plus `extra_state`, in a directory named `label`.
    fn seeded(
        label: &str,
        allocated: usize,
        extra_state: fn(&Path) -> Result<(), BenchError>,
    ) -> Result<Self, BenchError> {
        let base = scratch_root();
        let root = tempfile::Builder::new()
            .prefix(&format!("ipkeep-bench-{label}-"))
            .tempdir_in(&base)
            .map_err(io_error("create", &base))?;
        let net_dir = root.path().join(NETWORK);
        std::fs::create_dir_all(&net_dir).map_err(io_error("create", &net_dir))?;
        // Exactly what host-local leaves behind: one file per address and the round-robin cursor.
        for i in 0..allocated {
            let file = net_dir.join(nth_address(i).to_string());
            std::fs::write(&file, format!("seed{i}\r\neth0")).map_err(io_error("write", &file))?;
        }
        if let Some(last) = allocated.checked_sub(1) {
            let file = net_dir.join("last_reserved_ip.0");
            std::fs::write(&file, nth_address(last).to_string())
                .map_err(io_error("write", &file))?;
        }
        let dir = Self { root };
        extra_state(dir.root.path())?;
        Ok(dir)
    }

    fn config(&self) -> String {
        format!(
            r#"{{"cniVersion":"1.0.0","name":"{NETWORK}","ipam":{{"type":"ipkeep","subnet":"{SUBNET_BASE}/16","dataDir":"{}"}}}}"#,
            self.root.path().display()
        )
    }
}

/// Runs one CNI command the way a runtime does; `wrapper` (GNU time) goes in front when given.
fn invoke(
    plugin: &Plugin,
    command: &'static str,
    container: &str,
    config: &str,
    wrapper: Option<&[&str]>,
) -> Result<(Duration, Vec<u8>), BenchError> {
    let mut cmd = match wrapper {
        Some(args) => {
            let mut cmd = Command::new(GNU_TIME);
            cmd.args(args).arg(&plugin.path);
            cmd
        }
        None => Command::new(&plugin.path),
    };
    cmd.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", container)
        .env("CNI_NETNS", "/var/run/netns/ipkeep-bench")
        .env("CNI_IFNAME", "eth0")
        // What kubelet passes: the pod's identity, which ipkeep uses to look up its reservation.
        .env(
            "CNI_ARGS",
            format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME={container}"),
        )
        .env("CNI_PATH", "/usr/lib/cni")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let spawn_error = |source| BenchError::Io {
        action: "run",
        path: plugin.path.clone(),
        source,
    };
    let start = Instant::now();
    let mut child = cmd.spawn().map_err(spawn_error)?;
    if let Some(mut stdin) = child.stdin.take() {
        // The floor's no-op may exit before the configuration is written: not an error of its.
        match stdin.write_all(config.as_bytes()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            written => written.map_err(spawn_error)?,
        }
    }
    let output = child.wait_with_output().map_err(spawn_error)?;
    let took = start.elapsed();
    if !output.status.success() {
        return Err(BenchError::Plugin {
            plugin: plugin.path.clone(),
            command,
            container: container.to_owned(),
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    Ok((took, output.stdout))
}

/// Latencies of one plugin in one scenario.
#[derive(Debug, Default)]
struct Samples {
    add: Vec<Duration>,
    del: Vec<Duration>,
    cycle: Vec<Duration>,
    peak_rss_kib: u64,
}

/// A median and a p99, in that order.
fn percentiles(samples: &[Duration]) -> (Duration, Duration) {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let at = |q: f64| {
        sorted
            .get(((sorted.len() as f64 * q).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or_default()
    };
    (at(0.5), at(0.99))
}

/// One ADD+DEL cycle of a new container; returns the ADD result.
fn cycle(
    plugin: &Plugin,
    dir: &DataDir,
    container: &str,
    samples: &mut Samples,
) -> Result<Vec<u8>, BenchError> {
    let config = dir.config();
    let (add, result) = invoke(plugin, "ADD", container, &config, None)?;
    let (del, _) = invoke(plugin, "DEL", container, &config, None)?;
    samples.add.push(add);
    samples.del.push(del);
    samples.cycle.push(add + del);
    Ok(result)
}

/// The peak RSS over a few ADD+DEL cycles run under GNU time.
fn peak_rss(plugin: &Plugin, dir: &DataDir) -> Result<u64, BenchError> {
    let config = dir.config();
    let report = dir.root.path().join("rss");
    let report_str = report.to_string_lossy().into_owned();
    let mut peak = 0;
    for i in 0..RSS_CYCLES {
        for command in ["ADD", "DEL"] {
            invoke(
                plugin,
                command,
                &format!("rss{i}"),
                &config,
                Some(&["-f", "%M", "-o", &report_str]),
            )?;
            let text = std::fs::read_to_string(&report).map_err(|source| BenchError::Io {
                action: "read",
                path: report.clone(),
                source,
            })?;
            let kib = text
                .trim()
                .parse::<u64>()
                .map_err(|_| BenchError::Rss { text: text.clone() })?;
            peak = peak.max(kib);
        }
    }
    Ok(peak)
}

/// One side of an interleaved comparison: a plugin, its seeded data directory, its cycle count.
#[derive(Debug)]
struct Side<'a> {
    plugin: &'a Plugin,
    dir: DataDir,
    allocated: usize,
    cycles: usize,
    /// Whether its ADD answers with an address to check (not the floor's no-op).
    answers: bool,
}

/// Runs the sides' cycles interleaved, the order rotating every round, so that none gets a
/// quieter machine; then their peak RSS.
fn interleave<const N: usize>(sides: [Side<'_>; N]) -> Result<[Samples; N], BenchError> {
    let mut samples: [Samples; N] = std::array::from_fn(|_| Samples::default());
    // Seeding thousands of files (and removing the last scenario's) leaves the file system busy
    // writing back for seconds, which slowed every measured file creation by milliseconds and made
    // the figures depend on the scenario order: let it settle first.
    rustix::fs::sync();
    // Unmeasured first cycles for both: ipkeep rebuilds its index from the seeded files in the
    // first one (a one-time cost after host-local or a human changed the directory), and both warm
    // the page cache and the file system's metadata for a fresh directory (the first creations in
    // it were measured at twice the steady cost here).
    for side in &sides {
        for i in 0..WARMUP_CYCLES {
            let result = cycle(
                side.plugin,
                &side.dir,
                &format!("warmup{i}"),
                &mut Samples::default(),
            )?;
            if side.answers {
                check_fresh(side.plugin, side.allocated, &result)?;
            }
        }
    }
    rustix::fs::sync();
    let rounds = sides.iter().map(|side| side.cycles).max().unwrap_or(0);
    for round in 0..rounds {
        for step in 0..N {
            let k = (round + step) % N;
            if round < sides[k].cycles {
                let container = format!("bench{round}");
                cycle(sides[k].plugin, &sides[k].dir, &container, &mut samples[k])?;
            }
        }
    }
    for (side, samples) in sides.iter().zip(&mut samples) {
        samples.peak_rss_kib = peak_rss(side.plugin, &side.dir)?;
    }
    Ok(samples)
}

/// host-local and ipkeep in `scenario`.
fn measure(plugins: &[Plugin; 2], scenario: &Scenario) -> Result<[Samples; 2], BenchError> {
    let side = |k: usize| -> Result<Side<'_>, BenchError> {
        Ok(Side {
            plugin: &plugins[k],
            dir: DataDir::seeded(plugins[k].name, scenario.allocated, scenario.extra_state)?,
            allocated: scenario.allocated,
            cycles: scenario.cycles[k],
            answers: true,
        })
    };
    interleave([side(0)?, side(1)?])
}

/// ipkeep with no reservation on the node against ipkeep with [`RESERVATIONS`] of them.
fn measure_reservation_cost(ipkeep: &Plugin) -> Result<[Samples; 2], BenchError> {
    let side = |label: &str, extra_state| -> Result<Side<'_>, BenchError> {
        Ok(Side {
            plugin: ipkeep,
            dir: DataDir::seeded(label, 0, extra_state)?,
            allocated: 0,
            cycles: RESERVATION_CYCLES,
            answers: true,
        })
    };
    interleave([
        side("no-reservations", no_extra_state)?,
        side("reservations", reservation_files)?,
    ])
}

/// What the floor comparison runs: how many cycles per side, and a second ipkeep build if any.
#[derive(Debug)]
struct FloorRun {
    cycles: usize,
    candidate: Option<Plugin>,
}

impl FloorRun {
    /// From `IPKEEP_BENCH_FLOOR_CYCLES` and `IPKEEP_CANDIDATE_BIN`.
    fn from_env() -> Result<Self, BenchError> {
        let cycles = match std::env::var("IPKEEP_BENCH_FLOOR_CYCLES") {
            Ok(text) => text
                .parse()
                .ok()
                .filter(|&n| n > 0)
                .ok_or(BenchError::FloorCycles { text })?,
            Err(_) => FLOOR_CYCLES,
        };
        let candidate = std::env::var_os("IPKEEP_CANDIDATE_BIN").map(PathBuf::from);
        if let Some(path) = &candidate
            && !path.is_file()
        {
            return Err(BenchError::Missing {
                what: "the candidate ipkeep",
                path: path.clone(),
                hint: "IPKEEP_CANDIDATE_BIN names a second ipkeep build to compare",
            });
        }
        Ok(Self {
            cycles,
            candidate: candidate.map(|path| Plugin {
                name: "candidate",
                path,
            }),
        })
    }
}

/// The exec floor (two execs of a static no-op, with the same environment and stdin) against
/// ipkeep's ADD+DEL in an empty /16 (and the candidate's, if any), interleaved; the floor first.
fn measure_floor(ipkeep: &Plugin, run: &FloorRun) -> Result<Vec<Samples>, BenchError> {
    let base = scratch_root();
    let bin = tempfile::Builder::new()
        .prefix("ipkeep-bench-no-op-")
        .tempdir_in(&base)
        .map_err(io_error("create", &base))?;
    let path = bin.path().join("true");
    std::os::unix::fs::symlink(STATIC_NO_OP, &path).map_err(io_error("link", &path))?;
    let no_op = Plugin {
        name: "no-op",
        path,
    };
    let side = |plugin, label: &str, answers| -> Result<Side<'_>, BenchError> {
        Ok(Side {
            plugin,
            dir: DataDir::seeded(label, 0, no_extra_state)?,
            allocated: 0,
            cycles: run.cycles,
            answers,
        })
    };
    let floor = side(&no_op, "no-op", false)?;
    let ipkeep = side(ipkeep, "floor", true)?;
    Ok(match &run.candidate {
        Some(candidate) => Vec::from(interleave([
            floor,
            ipkeep,
            side(candidate, "candidate", true)?,
        ])?),
        None => Vec::from(interleave([floor, ipkeep])?),
    })
}

/// The floor lines: the floor's cycle, each build's and its multiple of the floor's (and the
/// candidate's as a multiple of ipkeep's).
fn floor_report(run: &FloorRun, samples: &[Samples]) -> String {
    let Some((floor, builds)) = samples.split_first() else {
        return String::new();
    };
    let (f50, f99) = percentiles(&floor.cycle);
    let mut out = format!(
        "\nexec floor: two execs of a static no-op ({STATIC_NO_OP} as `true`), interleaved with ipkeep's ADD+DEL in an empty /16 ({} cycles each):\nfloor cycle p50 {} p99 {}\n",
        run.cycles,
        ms(f50),
        ms(f99),
    );
    let names = std::iter::once("ipkeep").chain(run.candidate.as_ref().map(|c| c.name));
    for (name, build) in names.zip(builds) {
        let (b50, b99) = percentiles(&build.cycle);
        let ratio = 1.0 / speedup(f50, b50);
        let _ = writeln!(
            out,
            "{name} cycle p50 {} p99 {}; {name} / floor (p50): {ratio:.2}   target <= {FLOOR_TARGET}x: {}",
            ms(b50),
            ms(b99),
            if ratio <= FLOOR_TARGET {
                "met"
            } else {
                "MISSED"
            }
        );
    }
    if let [ipkeep, candidate] = builds {
        let (i50, _) = percentiles(&ipkeep.cycle);
        let (c50, _) = percentiles(&candidate.cycle);
        let _ = writeln!(
            out,
            "candidate / ipkeep cycle (p50): {:.3}",
            1.0 / speedup(i50, c50)
        );
    }
    out
}

/// The reservation-cost lines: ADD and cycle, with and without reservations, and the ratio.
fn reservation_report([none, reserved]: &[Samples; 2]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nipkeep with {RESERVATIONS} reservation files on the node vs none ({RESERVATION_CYCLES} cycles each, interleaved):"
    );
    let _ = writeln!(
        out,
        "{:<18} {:>9} {:>9} {:>9} {:>9}",
        "", "ADD p50", "ADD p99", "cyc p50", "cyc p99"
    );
    for (name, s) in [("none", none), ("1 000 reserved", reserved)] {
        let (add50, add99) = percentiles(&s.add);
        let (cyc50, cyc99) = percentiles(&s.cycle);
        let _ = writeln!(
            out,
            "{name:<18} {:>9} {:>9} {:>9} {:>9}",
            ms(add50),
            ms(add99),
            ms(cyc50),
            ms(cyc99)
        );
    }
    let ratio = 1.0 / speedup(percentiles(&none.add).0, percentiles(&reserved.add).0);
    let _ = writeln!(
        out,
        "ADD p50 ratio (reserved / none): {ratio:.2}   target <= 1.2x: {}",
        if ratio <= 1.2 { "met" } else { "MISSED" }
    );
    out
}

/// A plugin that handed out a pre-seeded address did not see the seeded state: its numbers would lie.
fn check_fresh(plugin: &Plugin, allocated: usize, result: &[u8]) -> Result<(), BenchError> {
    let text = String::from_utf8_lossy(result);
    let address = text
        .split('"')
        .find_map(|s| s.split_once('/').map(|(ip, _)| ip.to_owned()))
        .unwrap_or_default();
    let seeded = address.parse::<Ipv4Addr>().is_ok_and(|ip| {
        (u32::from(ip) - u32::from(SUBNET_BASE)).wrapping_sub(2) < allocated as u32
    });
    if seeded || address.is_empty() {
        return Err(BenchError::SeededAddressReturned {
            plugin: plugin.path.clone(),
            address,
        });
    }
    Ok(())
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

/// How many times faster ipkeep is (host-local / ipkeep).
fn speedup(host_local: Duration, ipkeep: Duration) -> f64 {
    host_local.as_secs_f64() / ipkeep.as_secs_f64().max(1e-9)
}

fn report(plugins: &[Plugin; 2], results: &[(&Scenario, [Samples; 2])]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<18} {:<10} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "scenario",
        "plugin",
        "cycles",
        "ADD p50",
        "ADD p99",
        "DEL p50",
        "DEL p99",
        "cyc p50",
        "cyc p99",
        "RSS KiB"
    );
    for (scenario, samples) in results {
        for (plugin, s) in plugins.iter().zip(samples) {
            let (add50, add99) = percentiles(&s.add);
            let (del50, del99) = percentiles(&s.del);
            let (cyc50, cyc99) = percentiles(&s.cycle);
            let _ = writeln!(
                out,
                "{:<18} {:<10} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
                scenario.name,
                plugin.name,
                s.cycle.len(),
                ms(add50),
                ms(add99),
                ms(del50),
                ms(del99),
                ms(cyc50),
                ms(cyc99),
                s.peak_rss_kib
            );
        }
    }
    let _ = writeln!(
        out,
        "\n(latencies in ms, process start to exit; RSS = peak ru_maxrss via {GNU_TIME} -f %M)"
    );
    let _ = writeln!(
        out,
        "\nipkeep/host-local ratios (lower is better; \"x\" = times faster / smaller):"
    );
    let _ = writeln!(
        out,
        "{:<18} {:>14} {:>14} {:>14} {:>14} {:>14}   target",
        "scenario", "ADD p50", "DEL p50", "cycle p50", "cycle p99", "peak RSS"
    );
    for (scenario, [hl, ik]) in results {
        let ratio = |a: &[Duration], b: &[Duration], pick: fn((Duration, Duration)) -> Duration| {
            let x = speedup(pick(percentiles(a)), pick(percentiles(b)));
            format!("{:.3} ({:.1}x)", 1.0 / x, x)
        };
        let median = |p: (Duration, Duration)| p.0;
        let p99 = |p: (Duration, Duration)| p.1;
        let rss = ik.peak_rss_kib as f64 / hl.peak_rss_kib.max(1) as f64;
        let cycle_x = speedup(percentiles(&hl.cycle).0, percentiles(&ik.cycle).0);
        let target = match scenario.allocated {
            0 => Some(3.0),
            10_000 => Some(50.0),
            _ => None,
        };
        let mut verdicts: Vec<String> = target
            .map(|t| {
                format!(
                    "cycle >= {t}x: {}",
                    if cycle_x >= t { "met" } else { "MISSED" }
                )
            })
            .into_iter()
            .collect();
        verdicts.push(format!(
            "RSS <= 1/3: {}",
            if rss <= 1.0 / 3.0 { "met" } else { "MISSED" }
        ));
        let verdict = verdicts.join("; ");
        let _ = writeln!(
            out,
            "{:<18} {:>14} {:>14} {:>14} {:>14} {:>14}   {verdict}",
            scenario.name,
            ratio(&hl.add, &ik.add, median),
            ratio(&hl.del, &ik.del, median),
            ratio(&hl.cycle, &ik.cycle, median),
            ratio(&hl.cycle, &ik.cycle, p99),
            format!("{rss:.3} ({:.1}x)", 1.0 / rss.max(1e-9)),
        );
    }
    out
}

/// The binaries' sizes, what a runtime maps at every exec (ipkeep's is static; Debian's host-local
/// also maps the C library), so a dependency's cost shows beside the latencies and RSS.
fn size_report(plugins: &[Plugin; 2]) -> String {
    let size = |plugin: &Plugin| std::fs::metadata(&plugin.path).map_or(0, |m| m.len());
    let (hl, ik) = (size(&plugins[0]), size(&plugins[1]));
    format!(
        "binary size: ipkeep {ik} B, host-local {hl} B, ratio {:.3}\n",
        ik as f64 / (hl as f64).max(1.0)
    )
}

fn run() -> Result<String, BenchError> {
    let plugins = find_plugins()?;
    eprintln!("ipkeep:     {}", plugins[1].path.display());
    eprintln!("host-local: {}", plugins[0].path.display());
    eprintln!(
        "scratch:    {} (both plugins, same filesystem)",
        scratch_root().display()
    );
    eprintln!("load average before: {}", load_average());
    eprintln!(
        "Each scenario seeds the allocations in host-local's format, then runs {WARMUP_CYCLES} unmeasured"
    );
    eprintln!(
        "ADD+DEL cycles per plugin (ipkeep rebuilds its index from the seeded files in the first), then"
    );
    eprintln!("the measured cycles, interleaved.");
    let floor_run = FloorRun::from_env()?;
    let floor_only = std::env::var_os("IPKEEP_BENCH_FLOOR_ONLY").is_some_and(|v| v == "1");
    let mut table = String::new();
    let mut reservation_cost = None;
    if !floor_only {
        let scenarios = scenarios();
        let mut results = Vec::new();
        for scenario in &scenarios {
            let start = Instant::now();
            let samples = measure(&plugins, scenario)?;
            eprintln!(
                "  {}: done in {:.1} s",
                scenario.name,
                start.elapsed().as_secs_f64()
            );
            results.push((scenario, samples));
        }
        table = report(&plugins, &results);
        let start = Instant::now();
        reservation_cost = Some(measure_reservation_cost(&plugins[1])?);
        eprintln!(
            "  reservation cost: done in {:.1} s",
            start.elapsed().as_secs_f64()
        );
    }
    let start = Instant::now();
    let floor = measure_floor(&plugins[1], &floor_run)?;
    eprintln!(
        "  exec floor: done in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    table.push_str(&floor_report(&floor_run, &floor));
    if let Some(cost) = &reservation_cost {
        table.push_str(&reservation_report(cost));
    }
    table.push_str(&size_report(&plugins));
    let _ = writeln!(
        table,
        "load average after: {} (2 cores; other work skews both plugins alike)",
        load_average()
    );
    Ok(table)
}

fn main() -> ExitCode {
    match run() {
        Ok(table) => {
            println!("{table}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("bench: {error}");
            ExitCode::FAILURE
        }
    }
}
