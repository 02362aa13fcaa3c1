//! Reading and writing reservations in real temporary directories, garbage included.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use super::add::*;
use super::*;
use ipkeep_netdir::NetworkDir;

use tempfile::TempDir;

/// The paths these tests use inside a scratch directory.
trait NetworkUnder {
    fn net(&self) -> NetworkDir;
    fn reserved(&self) -> PathBuf;
}

impl NetworkUnder for TempDir {
    fn net(&self) -> NetworkDir {
        NetworkDir::open(&self.path().join("data"), "net1").unwrap()
    }

    fn reserved(&self) -> PathBuf {
        self.path().join("data/net1/reserved")
    }
}

fn file(ns: &str, pod: &str, ips: &[&str], release: Option<i64>) -> ReservationFile {
    ReservationFile {
        version: FORMAT_VERSION,
        namespace: ns.into(),
        pod: pod.into(),
        ips: ips.iter().map(|s| s.parse::<IpAddr>().unwrap()).collect(),
        release_time: release.map(Timestamp::from_unix_secs),
        uid: format!("uid-{ns}-{pod}"),
        node_name: Some("node-a".into()),
        generation: None,
        retain_for_seconds: None,
    }
}

/// `file`, validated: what the writer takes.
fn valid(file: &ReservationFile) -> ValidReservation {
    file.clone().validate().unwrap()
}

/// Each of `files`, validated.
fn all_valid(files: &[ReservationFile]) -> Vec<ValidReservation> {
    files.iter().map(valid).collect()
}

/// [`write_reservation`] of `file`, validated.
fn write(dir: &NetworkDir, file: &ReservationFile) -> Result<(), ReservedDirError> {
    write_reservation(dir, &valid(file))
}

/// Every path below `root` (symlinks listed, never followed) with a digest of its content.
fn tree(root: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.file_type().is_symlink() {
                out.insert(format!(
                    "{rel} -> {}",
                    std::fs::read_link(&path).unwrap().display()
                ));
            } else if meta.is_dir() {
                out.insert(format!("{rel}/"));
                stack.push(path);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                out.insert(format!("{rel} ({} bytes)", bytes.len()));
            }
        }
    }
    out
}

/// [`tree`] of `reserved/` without the writer's generation counter (whose value varies).
fn reservation_tree(reserved: &Path) -> BTreeSet<String> {
    assert!(
        reserved.join(".generation").is_file(),
        "the writer keeps a generation counter"
    );
    let mut entries = tree(reserved);
    entries.retain(|e| !e.starts_with(".generation "));
    entries
}

#[test]
fn write_read_remove_round_trip() {
    let s = TempDir::new().unwrap();
    let dir = s.net();
    let a = file("db", "web-0", &["10.1.0.7", "fd00::7"], None);
    let b = file("db", "web-1", &["10.1.0.8"], Some(1_795_262_400));
    let c = file("cache", "redis-0", &["10.1.0.9"], None);
    for f in [&a, &b, &c] {
        write(&dir, f).unwrap();
    }
    let on_disk = std::fs::read(s.reserved().join("db/web-0")).unwrap();
    assert_eq!(on_disk, a.to_json());
    let mode = std::fs::metadata(s.reserved().join("db/web-0"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777 & !0o644, 0, "mode {mode:o}");

    let set = load_reservations(&dir);
    assert!(set.skipped.is_empty(), "{:?}", set.skipped);
    assert_eq!(set.len(), 3);
    assert_eq!(set.get("db", "web-1"), Some(&b));
    assert_eq!(
        read_reservation(&dir, "db", "web-0").unwrap(),
        Some(a.clone())
    );
    assert_eq!(read_reservation(&dir, "db", "nope").unwrap(), None);
    assert_eq!(read_reservation(&dir, "none", "web-0").unwrap(), None);
    assert!(read_reservation(&dir, "db", "../x").is_err());

    // Replacing keeps one file; no temporaries are left behind.
    let a2 = ReservationFile {
        release_time: Some(Timestamp::from_unix_secs(5)),
        ..a.clone()
    };
    write(&dir, &a2).unwrap();
    assert_eq!(read_reservation(&dir, "db", "web-0").unwrap(), Some(a2));
    let names: Vec<String> = std::fs::read_dir(s.reserved().join("db"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");

    assert!(remove_reservation(&dir, "cache", "redis-0").unwrap());
    assert!(!remove_reservation(&dir, "cache", "redis-0").unwrap());
    assert!(
        !s.reserved().join("cache").exists(),
        "empty namespace directory removed"
    );
    assert!(remove_reservation(&dir, "Bad", "x").is_err());
    assert_eq!(load_reservations(&dir).len(), 2);
}

/// The writer takes only a [`ValidReservation`]: none of these becomes one.
#[test]
fn invalid_reservations_do_not_validate() {
    let cases = [
        file("Bad", "p", &["10.0.0.1"], None),
        file("ns", "..", &["10.0.0.1"], None),
        file("ns", "a/b", &["10.0.0.1"], None),
        file("ns", "p", &[], None),
        ReservationFile {
            version: 2,
            ..file("ns", "p", &["10.0.0.1"], None)
        },
    ];
    for f in cases {
        let err = f.clone().validate().unwrap_err();
        assert!(
            matches!(
                err,
                SchemaError::InvalidNamespace { .. }
                    | SchemaError::InvalidPodName { .. }
                    | SchemaError::NoAddresses(_)
                    | SchemaError::UnsupportedVersion { found: 2 }
            ),
            "{f:?}: {err}"
        );
    }
}

/// Plants every kind of garbage next to two valid reservations; returns the outside directory
/// that symlinks point to.
fn plant_garbage(s: &TempDir) -> PathBuf {
    let outside = s.path().join("outside");
    std::fs::create_dir_all(outside.join("ns")).unwrap();
    let valid_elsewhere = file("evil", "p", &["10.1.0.66"], None).to_json();
    std::fs::write(outside.join("p"), &valid_elsewhere).unwrap();
    std::fs::write(outside.join("ns/p"), &valid_elsewhere).unwrap();

    let r = s.reserved();
    std::fs::create_dir_all(r.join("db")).unwrap();
    std::fs::write(
        r.join("db/web-0"),
        file("db", "web-0", &["10.1.0.7"], None).to_json(),
    )
    .unwrap();
    std::fs::write(
        r.join("db/web-1"),
        file("db", "web-1", &["10.1.0.8"], None).to_json(),
    )
    .unwrap();
    std::fs::write(r.join("db/bad-json"), b"{\"version\":1,").unwrap();
    std::fs::write(
        r.join("db/Bad_Name"),
        file("db", "p", &["10.1.0.9"], None).to_json(),
    )
    .unwrap();
    std::fs::write(
        r.join("db/moved"),
        file("db", "other", &["10.1.0.10"], None).to_json(),
    )
    .unwrap();
    std::fs::write(r.join("db/future"), b"{\"version\":7}").unwrap();
    std::fs::write(r.join("db/huge"), vec![b' '; 70 * 1024]).unwrap();
    std::fs::write(r.join("db/.ipkeep-tmp-1-1"), b"half").unwrap();
    std::fs::create_dir_all(r.join("db/adir/deeper")).unwrap();
    std::fs::write(r.join("db/adir/deeper/x"), b"x").unwrap();
    symlink(outside.join("p"), r.join("db/evil")).unwrap();
    symlink(outside.join("ns"), r.join("evil")).unwrap();
    std::fs::create_dir_all(r.join("Not_A_Namespace")).unwrap();
    std::fs::write(r.join("stray-file"), b"x").unwrap();
    outside
}

#[test]
fn garbage_is_skipped_and_reported_never_fatal() {
    let s = TempDir::new().unwrap();
    let dir = s.net();
    let outside = plant_garbage(&s);
    let outside_before = tree(&outside);

    let set = load_reservations(&dir);
    let keys: Vec<String> = set.files.keys().map(ToString::to_string).collect();
    assert_eq!(keys, ["db/web-0", "db/web-1"]);
    let reasons: Vec<(String, String)> = set
        .skipped
        .iter()
        .map(|sk| {
            let rel = sk
                .path
                .strip_prefix(s.reserved())
                .unwrap()
                .display()
                .to_string();
            (rel, sk.reason.clone())
        })
        .collect();
    let expect: &[(&str, &str)] = &[
        ("Not_A_Namespace", "invalid namespace"),
        ("db/.ipkeep-tmp-1-1", "leftover temporary file"),
        ("db/Bad_Name", "invalid pod name"),
        ("db/adir", "a directory where a reservation file should be"),
        ("db/bad-json", "failed to decode reservation file"),
        ("db/evil", "symbolic link"),
        ("db/future", "version 7 is not supported"),
        ("db/huge", "larger than"),
        ("db/moved", "is for pod db/other but sits at db/moved"),
        ("evil", "symbolic link"),
        ("stray-file", "not a directory"),
    ];
    assert_eq!(reasons.len(), expect.len(), "{reasons:#?}");
    for ((rel, reason), (want_rel, want_reason)) in reasons.iter().zip(expect) {
        assert_eq!(rel, want_rel);
        assert!(reason.contains(want_reason), "{rel}: {reason}");
    }
    assert_eq!(tree(&outside), outside_before, "nothing outside touched");

    // The O(1) read of a symlinked file refuses it rather than following it.
    assert!(read_reservation(&dir, "db", "evil").is_err());
    assert!(read_reservation(&dir, "evil", "p").is_err());
}

#[test]
fn symlinked_reserved_dir_is_skipped() {
    let s = TempDir::new().unwrap();
    let dir = s.net();
    let outside = s.path().join("outside");
    std::fs::create_dir_all(outside.join("db")).unwrap();
    std::fs::write(
        outside.join("db/web-0"),
        file("db", "web-0", &["10.1.0.7"], None).to_json(),
    )
    .unwrap();
    symlink(&outside, s.reserved()).unwrap();
    let before = tree(&outside);

    let set = load_reservations(&dir);
    assert!(set.files.is_empty());
    assert_eq!(set.skipped.len(), 1);
    assert!(
        set.skipped[0].reason.contains("symbolic link"),
        "{:?}",
        set.skipped
    );
    assert!(read_reservation(&dir, "db", "web-0").is_err());
    {
        let lock = dir.lock().unwrap();
        let (cached, _) = load_reservations_cached(&dir, &lock);
        assert!(cached.is_empty());
        assert_eq!(cached.skipped(), set.skipped);
    }

    // The writer replaces the symlink by a real directory and never writes through it.
    write(&dir, &file("db", "web-1", &["10.1.0.8"], None)).unwrap();
    assert!(std::fs::symlink_metadata(s.reserved()).unwrap().is_dir());
    assert_eq!(tree(&outside), before);
    assert_eq!(load_reservations(&dir).len(), 1);
}

#[test]
fn sync_makes_the_tree_exactly_the_desired_set() {
    let s = TempDir::new().unwrap();
    let dir = s.net();
    let outside = plant_garbage(&s);
    let outside_before = tree(&outside);
    // A stale reservation in its own namespace, which must disappear with its directory.
    std::fs::create_dir_all(s.reserved().join("gone")).unwrap();
    std::fs::write(
        s.reserved().join("gone/old-0"),
        file("gone", "old-0", &["10.1.0.40"], None).to_json(),
    )
    .unwrap();

    let desired = vec![
        // Unchanged.
        file("db", "web-0", &["10.1.0.7"], None),
        // Changed (released).
        file("db", "web-1", &["10.1.0.8"], Some(1_795_262_400)),
        // New, in the name a directory squats on.
        file("db", "adir", &["10.1.0.11"], None),
        // New namespace.
        file("cache", "redis-0", &["10.1.0.12"], None),
    ];
    let report = sync(&dir, &desired);
    let keys = |v: &[PodKey]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
    // New (in a new namespace, and where a directory squatted), then changed (released).
    assert_eq!(
        keys(&report.written),
        ["cache/redis-0", "db/adir", "db/web-1"]
    );
    assert_eq!(report.unchanged, 1);
    assert_eq!(keys(&report.removed), ["gone/old-0"]);
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(report.cleaned.len(), 11, "{:#?}", report.cleaned);

    let expected: BTreeSet<String> = [
        "cache/".to_owned(),
        format!("cache/redis-0 ({} bytes)", desired[3].to_json().len()),
        "db/".to_owned(),
        format!("db/adir ({} bytes)", desired[2].to_json().len()),
        format!("db/web-0 ({} bytes)", desired[0].to_json().len()),
        format!("db/web-1 ({} bytes)", desired[1].to_json().len()),
    ]
    .into_iter()
    .collect();
    assert_eq!(reservation_tree(&s.reserved()), expected);
    assert_eq!(tree(&outside), outside_before, "nothing outside touched");

    let set = load_reservations(&dir);
    assert!(set.skipped.is_empty());
    let want: Vec<&ReservationFile> = desired[..4].iter().collect();
    let mut got: Vec<&ReservationFile> = set.files.values().collect();
    got.sort_by_key(|f| f.pod_key().unwrap());
    let mut want = want;
    want.sort_by_key(|f| f.pod_key().unwrap());
    assert_eq!(got, want);

    // A second sync with the same input changes nothing.
    let again = sync(&dir, &desired[..4]);
    assert!(again.changed_nothing() && again.is_complete(), "{again:?}");
    assert_eq!(again.unchanged, 4);

    // Syncing to nothing leaves an empty `reserved/`.
    let empty = sync(&dir, &[]);
    assert_eq!(empty.removed.len(), 4);
    assert!(reservation_tree(&s.reserved()).is_empty());
}

#[test]
fn sync_replaces_a_symlinked_reserved_dir() {
    let s = TempDir::new().unwrap();
    let dir = s.net();
    let outside = s.path().join("outside");
    std::fs::create_dir_all(outside.join("db")).unwrap();
    std::fs::write(outside.join("db/web-0"), b"precious").unwrap();
    symlink(&outside, s.reserved()).unwrap();
    let report = sync(&dir, &[file("db", "web-0", &["10.1.0.7"], None)]);
    assert_eq!(report.written.len(), 1);
    assert_eq!(report.cleaned.len(), 1);
    assert!(std::fs::symlink_metadata(s.reserved()).unwrap().is_dir());
    assert_eq!(
        std::fs::read(outside.join("db/web-0")).unwrap(),
        b"precious"
    );
}

/// Asserts that the snapshot answers every lookup exactly as the decoded files do, at several
/// instants and for several asking pods.
fn assert_snapshot_matches(snapshot: &ReservationSnapshot, set: &ReservationSet) {
    let mut probes: Vec<IpAddr> = set.files.values().flat_map(|f| f.ips.clone()).collect();
    probes.extend(
        ["10.1.0.250", "fd00::fff", "::ffff:10.1.0.7"].map(|a| a.parse::<IpAddr>().unwrap()),
    );
    let mut askers: Vec<Option<PodKey>> = set.files.keys().cloned().map(Some).collect();
    askers.push(None);
    askers.push(Some(PodKey::new("zz", "nobody").unwrap()));
    for now in [0, 1_795_262_399, 1_795_262_400, 4_000_000_000] {
        let now = Timestamp::from_unix_secs(now);
        let fresh = ActiveReservations::new(set.files.values(), now);
        let cached = snapshot.lookup(now);
        for ip in &probes {
            for me in &askers {
                assert_eq!(
                    cached.held_for_other(*ip, me.as_ref()),
                    fresh.held_for_other(*ip, me.as_ref()),
                    "{ip} for {me:?} at {now}"
                );
            }
        }
    }
    assert_eq!(snapshot.skipped(), set.skipped);
}

#[test]
fn snapshot_is_used_when_valid_and_rebuilt_when_stale() {
    let s = TempDir::new().unwrap();
    let dir = s.net();
    {
        let lock = dir.lock().unwrap();
        let (snapshot, source) = load_reservations_cached(&dir, &lock);
        assert_eq!((snapshot.len(), source), (0, Source::NoReservations));
    }
    write(&dir, &file("db", "web-0", &["10.1.0.7", "fd00::7"], None)).unwrap();
    write(
        &dir,
        &file("db", "web-1", &["10.1.0.8"], Some(1_795_262_400)),
    )
    .unwrap();
    // A conflicting reservation (same address, another pod) is kept as two records.
    write(&dir, &file("cache", "r-0", &["10.1.0.8"], None)).unwrap();
    let check = |want: Source| {
        let lock = dir.lock().unwrap();
        let (snapshot, source) = load_reservations_cached(&dir, &lock);
        assert_eq!(source, want);
        assert_snapshot_matches(&snapshot, &load_reservations(&dir));
        snapshot.len()
    };
    // The writer left a valid snapshot.
    assert_eq!(check(Source::Index), 4);
    assert_eq!(check(Source::Index), 4);

    // A new namespace directory made by hand changes `reserved/`'s stamp.
    std::fs::create_dir(s.reserved().join("extra")).unwrap();
    std::fs::write(
        s.reserved().join("extra/r-0"),
        file("extra", "r-0", &["10.1.0.10"], None).to_json(),
    )
    .unwrap();
    assert_eq!(check(Source::Rescanned), 5);
    assert_eq!(check(Source::Index), 5);

    // A file dropped by hand into an existing namespace bumps no counter, but changes its
    // directory's stamp, which the snapshot watches: seen at once.
    std::fs::write(
        s.reserved().join("db/web-2"),
        file("db", "web-2", &["10.1.0.9"], None).to_json(),
    )
    .unwrap();
    assert_eq!(check(Source::Rescanned), 6);
    assert_eq!(check(Source::Index), 6);
    remove_reservation(&dir, "extra", "r-0").unwrap();
    assert_eq!(check(Source::Index), 5);
    // Removed by hand: seen at once too.
    std::fs::remove_file(s.reserved().join("db/web-2")).unwrap();
    assert_eq!(check(Source::Rescanned), 4);

    // A changed generation counter (another writer) invalidates the snapshot.
    std::fs::write(s.reserved().join(".generation"), b"999\n").unwrap();
    check(Source::Rescanned);
    std::fs::remove_file(s.reserved().join(".generation")).unwrap();
    // A tree without a counter (built by hand) is scanned once, then its snapshot is trusted.
    check(Source::Rescanned);
    check(Source::Index);
    write(&dir, &file("db", "web-0", &["10.1.0.7"], None)).unwrap();
    check(Source::Index);

    // Garbage planted later is reported from the snapshot too.
    symlink("/etc/passwd", s.reserved().join("cache/link")).unwrap();
    write(&dir, &file("db", "web-3", &["10.1.0.11"], None)).unwrap();
    {
        let lock = dir.lock().unwrap();
        let (snapshot, source) = load_reservations_cached(&dir, &lock);
        assert_eq!(source, Source::Index);
        assert_eq!(snapshot.skipped().len(), 1);
    }

    // A torn, truncated, foreign or symlinked snapshot is rebuilt.
    let snapshot_path = s.path().join("data/net1/.ipkeep/reserved.index");
    let good = std::fs::read(&snapshot_path).unwrap();
    for bad in [
        good[..good.len() - 1].to_vec(),
        good[..100].to_vec(),
        vec![0; good.len()],
        b"{\"format\":1}".to_vec(),
        Vec::new(),
    ] {
        std::fs::write(&snapshot_path, &bad).unwrap();
        check(Source::Rescanned);
    }
    std::fs::remove_file(&snapshot_path).unwrap();
    check(Source::Rescanned);
    std::fs::remove_file(&snapshot_path).unwrap();
    symlink(s.path().join("elsewhere"), &snapshot_path).unwrap();
    check(Source::Rescanned);
    assert!(!s.path().join("elsewhere").exists());

    // Removing the whole tree.
    sync(&dir, &[]);
    std::fs::remove_dir_all(s.reserved()).unwrap();
    check(Source::NoReservations);
}

#[test]
fn snapshot_decoding_rejects_inconsistent_content() {
    let set = {
        let mut set = ReservationSet::default();
        for f in [
            file("db", "web-0", &["10.1.0.7", "fd00::7"], None),
            file("db", "web-1", &["10.1.0.8"], Some(5)),
        ] {
            set.files.insert(f.pod_key().unwrap(), f);
        }
        set
    };
    let stamp = scan::SnapshotStamp {
        reserved: None,
        generation: Some(3),
    };
    let good = snapshot::tests_support::encode(&set, &stamp);
    let decoded = snapshot::tests_support::decode(good.clone()).unwrap();
    assert_snapshot_matches(&decoded, &set);
    // Flip each byte in turn: decoding either rejects the file or yields one whose lookups
    // still work; nothing panics.
    let mut rejected = 0;
    for i in 0..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0xff;
        match snapshot::tests_support::decode(bad) {
            None => rejected += 1,
            Some(snapshot) => {
                let lookup = snapshot.lookup(Timestamp::from_unix_secs(1));
                for ip in ["10.1.0.7", "10.1.0.8", "fd00::7"] {
                    let _ = lookup.held_for_other(ip.parse().unwrap(), None);
                }
                let _ = snapshot.skipped();
            }
        }
    }
    assert!(rejected > 0);
    // Out-of-order records are rejected.
    let mut swapped = good.clone();
    let (a, b) = (96, 96 + 40);
    let first: Vec<u8> = swapped[a..a + 40].to_vec();
    let second: Vec<u8> = swapped[b..b + 40].to_vec();
    swapped[a..a + 40].copy_from_slice(&second);
    swapped[b..b + 40].copy_from_slice(&first);
    assert!(snapshot::tests_support::decode(swapped).is_none());
}

#[test]
fn wait_markers_round_trip() {
    let s = TempDir::new().unwrap();
    let dir = s.net();
    let pod = PodKey::new("db", "web-0").unwrap();
    assert_eq!(read_wait_marker(&dir, &pod, &mut Vec::new()), None);
    let marker = WaitMarker {
        holder: "0123abcd".into(),
        since: Timestamp::new(1_795_262_400, 5).unwrap(),
    };
    write_wait_marker(&dir, &pod, &marker, &mut Vec::new()).unwrap();
    assert_eq!(
        std::fs::read_to_string(s.path().join("data/net1/.ipkeep/wait/db/web-0")).unwrap(),
        "0123abcd 2026-11-21T12:00:00.000000005Z\n"
    );
    assert_eq!(read_wait_marker(&dir, &pod, &mut Vec::new()), Some(marker));
    remove_wait_marker(&dir, &pod).unwrap();
    assert_eq!(read_wait_marker(&dir, &pod, &mut Vec::new()), None);
    assert!(!s.path().join("data/net1/.ipkeep/wait/db").exists());
    remove_wait_marker(&dir, &pod).unwrap();

    // Garbage markers read as absent.
    std::fs::create_dir_all(s.path().join("data/net1/.ipkeep/wait/db")).unwrap();
    for garbage in [
        "",
        "x\n",
        "x yesterday\n",
        " 2026-11-21T12:00:00Z\n",
        "x 2026-11-21T12:00:00Z",
    ] {
        std::fs::write(s.path().join("data/net1/.ipkeep/wait/db/web-0"), garbage).unwrap();
        assert_eq!(
            read_wait_marker(&dir, &pod, &mut Vec::new()),
            None,
            "{garbage:?}"
        );
    }
}

#[test]
fn sync_writes_in_batches_and_leaves_a_valid_snapshot() {
    let s = TempDir::new().unwrap();
    let dir = s.net();
    let desired: Vec<ReservationFile> = (0..150)
        .map(|i| {
            file(
                &format!("ns-{}", i % 3),
                &format!("pod-{i}"),
                &[&format!("10.2.{}.{}", i / 256, i % 256)],
                None,
            )
        })
        .collect();
    let report = sync(&dir, &desired);
    assert_eq!(report.written.len(), 150);
    let generation = |s: &TempDir| -> u64 {
        std::fs::read_to_string(s.reserved().join(".generation"))
            .unwrap()
            .trim_end()
            .parse()
            .unwrap()
    };
    let after_sync = generation(&s);
    // One bump for the planning section (none: `reserved/` did not exist yet) and one per batch.
    assert_eq!(after_sync, 3, "150 files in batches of 64");
    {
        let lock = dir.lock().unwrap();
        let (snapshot, source) = load_reservations_cached(&dir, &lock);
        assert_eq!((snapshot.len(), source), (150, Source::Index));
        assert_snapshot_matches(&snapshot, &load_reservations(&dir));
    }
    write(&dir, &file("ns-0", "pod-0", &["10.2.9.9"], None)).unwrap();
    assert_eq!(generation(&s), after_sync + 1);
    assert!(!remove_reservation(&dir, "ns-0", "absent").unwrap());
    assert_eq!(generation(&s), after_sync + 1, "no change, no bump");
    assert!(remove_reservation(&dir, "ns-0", "pod-0").unwrap());
    assert_eq!(generation(&s), after_sync + 2);
}

#[test]
fn sync_reports_what_it_cannot_fix_and_does_the_rest() {
    use std::os::unix::ffi::OsStrExt;
    let s = TempDir::new().unwrap();
    let dir = s.net();
    // A directory squatting on a wanted name, holding an entry the writer cannot list (its name
    // is not UTF-8), so it cannot be emptied.
    let squat = s.reserved().join("db/web-0");
    std::fs::create_dir_all(&squat).unwrap();
    std::fs::write(squat.join(std::ffi::OsStr::from_bytes(b"\xff")), b"x").unwrap();
    let desired = [
        file("db", "web-0", &["10.1.0.7"], None),
        file("db", "web-1", &["10.1.0.8"], None),
    ];
    let mut writer = ReservationWriter::new();
    let report = writer.apply(&dir, &all_valid(&desired)).unwrap();
    assert!(!report.failed.is_empty(), "{report:?}");
    let written: Vec<String> = report.written.iter().map(ToString::to_string).collect();
    assert_eq!(written, ["db/web-1"]);
    let web_0 = Step::Write(PodKey::new("db", "web-0").unwrap());
    assert!(report.failed.iter().any(|f| f.step == web_0), "{report:?}");
    let set = load_reservations(&dir);
    assert_eq!(set.len(), 1);
    assert!(set.get("db", "web-1").is_some());

    // A failed step makes the writer forget what it knew: its next call reads the tree again
    // (and so finds the squatter gone, removed by hand meanwhile); after a clean call it reads
    // nothing.
    std::fs::remove_dir_all(&squat).unwrap();
    let scans = full_scans();
    let report = writer.apply(&dir, &all_valid(&desired)).unwrap();
    assert!(full_scans() > scans, "the tree was not read again");
    assert!(report.is_complete(), "{report:?}");
    assert_eq!(report.written, vec![PodKey::new("db", "web-0").unwrap()]);
    let scans = full_scans();
    let report = writer.apply(&dir, &all_valid(&desired)).unwrap();
    assert_eq!(full_scans(), scans, "a writer that knows the tree read it");
    assert!(
        report.changed_nothing() && report.unchanged == 2,
        "{report:?}"
    );
}

/// The integration recipe, end to end on real files: what an ADD will do with these pieces.
#[test]
fn add_flow_on_real_files() {
    struct Subnet24([u8; 3]);
    impl RangeSetView for Subnet24 {
        fn contains(&self, ip: IpAddr) -> bool {
            matches!(ip, IpAddr::V4(v4) if v4.octets()[..3] == self.0)
        }
    }
    let s = TempDir::new().unwrap();
    let dir = s.net();
    write(&dir, &file("db", "web-0", &["10.1.0.7"], None)).unwrap();
    write(
        &dir,
        &file("db", "web-1", &["10.1.0.2"], Some(1_795_262_460)),
    )
    .unwrap();
    // The old sandbox of db/web-0 still holds 10.1.0.7 (its DEL has not run yet).
    std::fs::write(s.path().join("data/net1/10.1.0.7"), b"old-sandbox\r\neth0").unwrap();

    let sets = [Subnet24([10, 1, 0])];
    let me = PodKey::new("db", "web-0").unwrap();
    let holder = |ip: IpAddr| match std::fs::read(s.path().join(format!("data/net1/{ip}"))) {
        Ok(bytes) if bytes.starts_with(b"old-sandbox") => CurrentHolder::Container {
            container_id: "old-sandbox".into(),
            pod: Some(me.clone()),
        },
        Ok(_) => CurrentHolder::Foreign,
        Err(_) => CurrentHolder::Free,
    };
    let add = |now: Timestamp| {
        let lock = dir.lock().unwrap();
        let own = read_reservation(&dir, me.namespace(), me.name()).unwrap();
        let (snapshot, _) = load_reservations_cached(&dir, &lock);
        let lookup = snapshot.lookup(now);
        let marker = read_wait_marker(&dir, &me, &mut Vec::new());
        let decision = decide(&DecisionInput {
            range_sets: &sets,
            requested: &[],
            container_id: "new-sandbox",
            pod: Some(&me),
            own: own.as_ref(),
            others: &lookup,
            holder: &holder,
            wait_marker: marker.as_ref(),
            now,
            grace: DEFAULT_GRACE,
        });
        match &decision.marker {
            MarkerAction::Keep => {}
            MarkerAction::Write(m) => write_wait_marker(&dir, &me, m, &mut Vec::new()).unwrap(),
            MarkerAction::Remove => remove_wait_marker(&dir, &me).unwrap(),
        }
        // Normal allocation walks candidates from .2 and skips other pods' reservations.
        let first_free = (2..=254u8)
            .map(|last| IpAddr::from([10, 1, 0, last]))
            .find(|ip| !lookup.is_blocked(*ip, Some(&me)) && holder(*ip) == CurrentHolder::Free);
        (decision, first_free)
    };

    let t0 = Timestamp::from_unix_secs(1_795_262_400);
    let (first, _) = add(t0);
    assert!(matches!(first.outcome, Outcome::RetryLater(_)), "{first:?}");
    assert!(
        read_wait_marker(&dir, &me, &mut Vec::new()).is_some(),
        "the wait is on record"
    );

    let (within, _) = add(t0.saturating_add(std::time::Duration::from_secs(60)));
    assert!(matches!(within.outcome, Outcome::RetryLater(ref r) if r.waited.as_secs() == 60));

    let (late, free) = add(t0.saturating_add(std::time::Duration::from_secs(121)));
    assert_eq!(late.outcome, Outcome::Allocate(vec![RangeSetPlan::Normal]));
    assert!(matches!(late.notes[..], [Note::GraceExpired { .. }]));
    // web-1's reservation expired at t0+60s, so .2 is free again.
    assert_eq!(free, Some(IpAddr::from([10, 1, 0, 2])));
    let (_, free_earlier) = add(t0);
    assert_eq!(
        free_earlier,
        Some(IpAddr::from([10, 1, 0, 3])),
        ".2 is web-1's until t0+60s"
    );

    // The old sandbox's DEL runs: the next ADD gets the reserved address and clears the marker.
    std::fs::remove_file(s.path().join("data/net1/10.1.0.7")).unwrap();
    let (back, _) = add(t0.saturating_add(std::time::Duration::from_secs(200)));
    assert_eq!(
        back.outcome,
        Outcome::Allocate(vec![RangeSetPlan::Reserved(IpAddr::from([10, 1, 0, 7]))])
    );
    assert_eq!(back.marker, MarkerAction::Remove);
    assert_eq!(read_wait_marker(&dir, &me, &mut Vec::new()), None);
}

/// A full sync by a writer that knows nothing (as after an agent's restart).
fn sync(dir: &NetworkDir, desired: &[ReservationFile]) -> ApplyReport {
    ReservationWriter::new()
        .apply(dir, &all_valid(desired))
        .unwrap()
}

/// Full scans this thread ran so far.
fn full_scans() -> usize {
    scan::FULL_SCANS.with(std::cell::Cell::get)
}

fn generation_of(s: &TempDir) -> u64 {
    std::fs::read_to_string(s.reserved().join(".generation"))
        .unwrap()
        .trim_end()
        .parse()
        .unwrap()
}

/// The snapshot as the plugin's next ADD finds it, and whether it matches a fresh scan.
fn snapshot_source(dir: &NetworkDir) -> Source {
    let lock = dir.lock().unwrap();
    let (snapshot, source) = load_reservations_cached(dir, &lock);
    assert_snapshot_matches(&snapshot, &load_reservations(dir));
    source
}

#[test]
fn a_writer_that_knows_the_tree_patches_the_snapshot_without_reading_it() {
    let s = TempDir::new().unwrap();
    let dir = s.net();
    let mut desired: Vec<ReservationFile> = (0..90)
        .map(|i| {
            file(
                &format!("ns-{}", i % 3),
                &format!("pod-{i}"),
                &[&format!("10.3.0.{i}"), &format!("fd00::3:{i}")],
                None,
            )
        })
        .collect();
    // A lone pod in its own namespace, to be removed (its directory goes with it).
    desired.push(file("lone", "only", &["10.3.1.1"], None));
    let mut writer = ReservationWriter::new();
    writer.apply(&dir, &all_valid(&desired)).unwrap();
    assert_eq!(snapshot_source(&dir), Source::Index);
    let generation = generation_of(&s);

    let scans = full_scans();
    let mut next: Vec<ReservationFile> = desired
        .iter()
        .filter(|f| f.pod_key().unwrap().to_string() != "ns-2/pod-2" && f.namespace != "lone")
        .cloned()
        .collect();
    next.extend([
        // Rewritten (released), new in an existing namespace, new in a new namespace.
        file("ns-0", "pod-0", &["10.3.0.0"], Some(1_795_262_400)),
        file("ns-1", "pod-new", &["10.3.2.1", "fd00::3:201"], None),
        file("fresh", "r-0", &["10.3.0.5"], None),
    ]);
    let report = writer.apply(&dir, &all_valid(&next)).unwrap();
    assert_eq!(
        full_scans(),
        scans,
        "the tree was read or the snapshot rebuilt, not patched"
    );
    assert!(report.is_complete(), "{report:?}");
    let keys = |v: &[PodKey]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
    assert_eq!(
        keys(&report.written),
        ["fresh/r-0", "ns-0/pod-0", "ns-1/pod-new"]
    );
    assert_eq!(keys(&report.removed), ["lone/only", "ns-2/pod-2"]);
    assert_eq!(report.unchanged, 88);
    assert_eq!(generation_of(&s), generation + 1, "one bump per batch");
    assert!(
        !s.reserved().join("lone").exists(),
        "emptied namespace kept"
    );
    // The patched snapshot is trusted by the plugin and says what a full scan says.
    assert_eq!(snapshot_source(&dir), Source::Index);
    let set = load_reservations(&dir);
    assert_eq!(set.len(), 91);
    assert_eq!(
        set.get("ns-0", "pod-0"),
        next.iter().rev().find(|f| f.pod == "pod-0")
    );
    assert!(set.get("ns-2", "pod-2").is_none());

    // Nothing to do: no lock section at all, no bump.
    let report = writer.apply(&dir, &all_valid(&next)).unwrap();
    assert!(
        report.changed_nothing() && report.is_complete(),
        "{report:?}"
    );
    assert_eq!(report.unchanged, 91);
    assert_eq!(generation_of(&s), generation + 1, "no change, no bump");
    assert_eq!(snapshot_source(&dir), Source::Index);

    // One more file is written alone.
    let good = file("ns-0", "pod-good", &["10.3.3.2"], None);
    next.push(good.clone());
    let report = writer.apply(&dir, &all_valid(&next)).unwrap();
    assert!(report.failed.is_empty(), "{report:?}");
    assert_eq!(report.written, vec![good.pod_key().unwrap()]);
    assert_eq!(snapshot_source(&dir), Source::Index);

    // A writer that knows nothing reads the tree, finds nothing to change, and keeps the counter
    // and the snapshot.
    let generation = generation_of(&s);
    let report = sync(&dir, &next);
    assert!(report.changed_nothing(), "{report:?}");
    assert_eq!(report.unchanged, 92);
    assert_eq!(
        generation_of(&s),
        generation,
        "a sync without change bumped"
    );
    assert_eq!(snapshot_source(&dir), Source::Index);
}

#[test]
fn patching_falls_back_to_a_scan_when_the_tree_holds_more_than_expected() {
    let s = TempDir::new().unwrap();
    let dir = s.net();
    let a = file("db", "a", &["10.4.0.1"], None);
    let b = file("db", "b", &["10.4.0.2"], None);
    sync(&dir, &[a.clone(), b]);
    // Each case: the base snapshot is taken, then the "writer's" change and a hand-made one
    // land before the patch (as if made by hand during the writer's batch).
    let hand_cases: [(&str, &str); 3] = [
        ("db/hand-0", "a file in the changed directory"),
        ("other/hand-1", "a new namespace directory"),
        ("db/.ipkeep-tmp-1-1", "a temporary in the changed directory"),
    ];
    for (i, (hand, what)) in hand_cases.into_iter().enumerate() {
        let written = file("db", &format!("w-{i}"), &[&format!("10.4.1.{i}")], None);
        // Whatever the previous case left: the snapshot is current again.
        snapshot_source(&dir);
        let lock = dir.lock().unwrap();
        let base = snapshot::valid_snapshot(&dir).expect("valid before the batch");
        std::fs::write(s.reserved().join(".generation"), format!("{}\n", 100 + i)).unwrap();
        std::fs::write(
            s.reserved().join("db").join(&written.pod),
            written.to_json(),
        )
        .unwrap();
        let (ns, pod) = hand.split_once('/').unwrap();
        std::fs::create_dir_all(s.reserved().join(ns)).unwrap();
        let hand_file = file(ns, &format!("hand-{i}"), &[&format!("10.4.2.{i}")], None);
        std::fs::write(s.reserved().join(hand), hand_file.to_json()).unwrap();
        let scans = full_scans();
        snapshot::patch(&dir, &lock, Some(base), &[&written], &[]).unwrap();
        assert!(
            full_scans() > scans,
            "{what}: patched although the tree differs"
        );
        drop(lock);
        let lock = dir.lock().unwrap();
        let (snapshot, _) = load_reservations_cached(&dir, &lock);
        let set = load_reservations(&dir);
        assert_snapshot_matches(&snapshot, &set);
        if !pod.starts_with(".ipkeep-tmp-") {
            assert!(set.get(ns, pod).is_some(), "{what}");
            let probe: IpAddr = format!("10.4.2.{i}").parse().unwrap();
            assert!(
                snapshot
                    .lookup(Timestamp::from_unix_secs(0))
                    .held_for_other(probe, None)
                    .is_some(),
                "{what}: the hand-made reservation is not in the snapshot"
            );
        }
        drop(lock);
        std::fs::remove_file(s.reserved().join(hand)).unwrap();
        if ns != "db" {
            std::fs::remove_dir(s.reserved().join(ns)).unwrap();
        }
    }

    // A hand-made change in a namespace the writer did not touch keeps that directory's old
    // stamp in the patched snapshot: the plugin's next read rescans.
    sync(&dir, std::slice::from_ref(&a));
    std::fs::create_dir(s.reserved().join("side")).unwrap();
    write(&dir, &file("side", "s-0", &["10.4.3.1"], None)).unwrap();
    assert_eq!(snapshot_source(&dir), Source::Index);
    {
        let lock = dir.lock().unwrap();
        let base = snapshot::valid_snapshot(&dir).expect("valid before the batch");
        let written = file("db", "late", &["10.4.3.2"], None);
        std::fs::write(s.reserved().join("db/late"), written.to_json()).unwrap();
        std::fs::write(
            s.reserved().join("side/s-1"),
            file("side", "s-1", &["10.4.3.3"], None).to_json(),
        )
        .unwrap();
        let scans = full_scans();
        snapshot::patch(&dir, &lock, Some(base), &[&written], &[]).unwrap();
        assert_eq!(full_scans(), scans, "the untouched directory is not listed");
    }
    assert_eq!(snapshot_source(&dir), Source::Rescanned);
    assert!(load_reservations(&dir).get("side", "s-1").is_some());

    // A writer killed after its bump and its change, before the snapshot: the old snapshot no
    // longer matches the counter.
    assert_eq!(snapshot_source(&dir), Source::Index);
    let g = generation_of(&s);
    std::fs::write(s.reserved().join(".generation"), format!("{}\n", g + 1)).unwrap();
    std::fs::write(
        s.reserved().join("db/killed"),
        file("db", "killed", &["10.4.3.4"], None).to_json(),
    )
    .unwrap();
    assert_eq!(snapshot_source(&dir), Source::Rescanned);
}
