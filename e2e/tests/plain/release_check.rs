//! The release rules, as tables: `scripts/release.sh --check` (the one rule: the workspace version
//! is CHANGELOG.md's newest release or, while `## [Unreleased]` heads it, above it; the chart
//! agrees; tags agree with the commits the changelog lists, and no unreleased version is tagged),
//! `scripts/release.sh` writing nothing while the check fails, and which release
//! `scripts/build-previous-release.sh` builds (the newest other than the workspace version).
//! Each case runs the repository's scripts in a scratch git repository of its own.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::testkit;
use std::{path::Path, process::Command};

use testkit::{Scratch, repo_root};

/// A scratch repository with the scripts, `Cargo.toml` at `version`, the chart at `chart` and
/// `changelog`'s text, committed.
fn repository(name: &str, version: &str, chart: &str, changelog: &str) -> Scratch {
    let s = Scratch::new(name);
    std::fs::create_dir_all(s.join("scripts")).unwrap();
    std::fs::create_dir_all(s.join("charts/ipkeep")).unwrap();
    for script in ["release.sh", "build-previous-release.sh"] {
        std::fs::copy(
            repo_root().join("scripts").join(script),
            s.join("scripts").join(script),
        )
        .unwrap();
    }
    std::fs::write(
        s.join("Cargo.toml"),
        format!("[workspace.package]\nversion = \"{version}\"\n"),
    )
    .unwrap();
    std::fs::write(
        s.join("charts/ipkeep/Chart.yaml"),
        format!("version: {chart}\nappVersion: \"{chart}\"\n"),
    )
    .unwrap();
    std::fs::write(
        s.join("CHANGELOG.md"),
        format!("# Changelog\n\n{changelog}"),
    )
    .unwrap();
    git(s.path(), &["init", "-q", "."]);
    git(s.path(), &["add", "."]);
    git(s.path(), &["commit", "-q", "-m", "the release's files"]);
    s
}

fn git(dir: &Path, args: &[&str]) -> String {
    let mut git = Command::new("git");
    git.current_dir(dir).args([
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@t",
        "-c",
        "init.defaultBranch=main",
    ]);
    testkit::run_ok(git, args, None)
}

/// Runs `scripts/<script> <args>` in `dir`: (success, stdout, stderr).
fn script(dir: &Path, script: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(dir.join("scripts").join(script))
        .args(args)
        .env("IPKEEP_CACHE_DIR", dir.join("cache"))
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

const HASH: &str = "0123456789abcdef0123456789abcdef01234567";

#[test]
fn the_workspace_version_is_the_newest_release_or_the_next_one_while_unreleased() {
    let released = |v: &str| format!("## [{v}] — 2026-11-26\n\nCommit: `{HASH}` (tag `v{v}`).\n\n");
    let unreleased = "## [Unreleased]\n\n";
    // (case, workspace, chart, changelog, passes, what the output says)
    let cases: [(&str, &str, &str, String, bool, &str); 9] = [
        (
            "the release itself",
            "0.1.0",
            "0.1.0",
            unreleased.to_owned() + &released("0.1.0"),
            true,
            "version 0.1.0 in Cargo.toml",
        ),
        (
            "the next release, unreleased",
            "0.2.0",
            "0.2.0",
            unreleased.to_owned() + &released("0.1.0"),
            true,
            "unreleased ([Unreleased] in CHANGELOG.md), above the newest release 0.1.0",
        ),
        (
            "versions in version order, not text",
            "0.10.0",
            "0.10.0",
            unreleased.to_owned() + &released("0.9.0"),
            true,
            "above the newest release 0.9.0",
        ),
        (
            "ahead without [Unreleased]",
            "0.2.0",
            "0.2.0",
            released("0.1.0"),
            false,
            "no '## [Unreleased]' section heads CHANGELOG.md",
        ),
        (
            "[Unreleased] below the newest release",
            "0.2.0",
            "0.2.0",
            released("0.1.0") + unreleased,
            false,
            "no '## [Unreleased]' section heads CHANGELOG.md",
        ),
        (
            "behind the newest release",
            "0.0.9",
            "0.0.9",
            unreleased.to_owned() + &released("0.1.0"),
            false,
            "is neither CHANGELOG.md's newest release, 0.1.0, nor above it",
        ),
        (
            "the chart disagrees",
            "0.2.0",
            "0.1.0",
            unreleased.to_owned() + &released("0.1.0"),
            false,
            "Chart.yaml's version is '0.1.0', the workspace version (Cargo.toml) is 0.2.0",
        ),
        (
            "no release at all",
            "0.1.0",
            "0.1.0",
            unreleased.to_owned(),
            false,
            "CHANGELOG.md lists no release",
        ),
        (
            "two versions ahead is still one rule",
            "0.3.0",
            "0.3.0",
            unreleased.to_owned() + &released("0.1.0"),
            true,
            "above the newest release 0.1.0",
        ),
    ];
    for (case, version, chart, changelog, passes, says) in cases {
        let repo = repository("release-check", version, chart, &changelog);
        let (ok, _, stderr) = script(repo.path(), "release.sh", &["--check"]);
        assert_eq!(ok, passes, "{case}: {stderr}");
        assert!(stderr.contains(says), "{case}: {says:?} not in: {stderr}");
    }
}

#[test]
fn tags_agree_with_the_changelog_and_unreleased_versions_are_never_tagged() {
    let changelog = |commit: &str| {
        format!(
            "## [Unreleased]\n\n## [0.1.0] — 2026-11-26\n\nCommit: `{commit}` (tag `v0.1.0`).\n"
        )
    };
    // 0.1.0 released: its commit, then one that lists it.
    let repo = repository("release-tags", "0.1.0", "0.1.0", &changelog(HASH));
    let first = git(repo.path(), &["rev-parse", "HEAD"]).trim().to_owned();
    std::fs::write(
        repo.join("CHANGELOG.md"),
        format!("# Changelog\n\n{}", changelog(&first)),
    )
    .unwrap();
    git(
        repo.path(),
        &["commit", "-q", "-am", "lists the release's commit"],
    );
    let second = git(repo.path(), &["rev-parse", "HEAD"]).trim().to_owned();

    git(repo.path(), &["tag", "v0.1.0", &first]);
    let (ok, _, stderr) = script(repo.path(), "release.sh", &["--check"]);
    assert!(ok, "the tag on the listed commit: {stderr}");
    assert!(stderr.contains("(tag v0.1.0)"), "{stderr}");

    git(repo.path(), &["tag", "-f", "v0.1.0", &second]);
    let (ok, _, stderr) = script(repo.path(), "release.sh", &["--check"]);
    assert!(!ok, "a tag on another commit than the listed one");
    assert!(
        stderr.contains(&format!(
            "tag v0.1.0 is commit {second}, but CHANGELOG.md lists {first}"
        )),
        "{stderr}"
    );

    // An unreleased version tagged is refused by the check and by make release, which writes
    // nothing before the check passes (an unreleased version's artifacts say they are unreleased).
    let repo = repository("release-unreleased-tag", "0.2.0", "0.2.0", &changelog(HASH));
    git(repo.path(), &["tag", "v0.2.0"]);
    for args in [&["--check"][..], &[]] {
        let (ok, _, stderr) = script(repo.path(), "release.sh", args);
        assert!(!ok, "an unreleased version tagged, release.sh {args:?}");
        assert!(
            stderr.contains("tag v0.2.0 exists, but CHANGELOG.md has no '## [0.2.0]' section"),
            "{stderr}"
        );
    }
    assert!(!repo.join("target/release-artifacts").exists());
}

#[test]
fn the_previous_release_is_the_newest_other_than_the_workspace_version() {
    let section = |v: &str, hash: char| {
        format!(
            "## [{v}] — 2026-11-26\n\nCommit: `{}` (tag `v{v}`).\n\n",
            hash.to_string().repeat(40)
        )
    };
    let two = section("0.2.0", 'b') + &section("0.1.0", 'a');
    // (case, workspace, changelog, the directory's name or the error)
    let cases: [(&str, &str, String, Result<&str, &str>); 4] = [
        (
            "main ahead of the newest release",
            "0.3.0",
            "## [Unreleased]\n\n".to_owned() + &two,
            Ok("release-0.2.0-bbbbbbbbbbbb"),
        ),
        (
            "on a release's own commit: the one before",
            "0.2.0",
            two.clone(),
            Ok("release-0.1.0-aaaaaaaaaaaa"),
        ),
        (
            "the first release: nothing to upgrade from",
            "0.1.0",
            section("0.1.0", 'a'),
            Err("lists no release other than 0.1.0"),
        ),
        (
            "a release without its commit",
            "0.2.0",
            "## [Unreleased]\n\n## [0.1.0] — 2026-11-26\n\n".to_owned(),
            Err("section of 0.1.0 lists no 'Commit:"),
        ),
    ];
    for (case, version, changelog, want) in cases {
        let repo = repository("previous-release", version, version, &changelog);
        let (ok, stdout, stderr) =
            script(repo.path(), "build-previous-release.sh", &["--print-dir"]);
        match want {
            Ok(dir) => {
                assert!(ok, "{case}: {stderr}");
                assert_eq!(
                    stdout.trim(),
                    repo.join("cache").join(dir).to_str().unwrap(),
                    "{case}"
                );
            }
            Err(says) => {
                assert!(!ok, "{case}: {stdout}");
                assert!(stderr.contains(says), "{case}: {says:?} not in {stderr}");
            }
        }
    }
}
