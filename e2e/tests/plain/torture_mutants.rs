//! The torture run's mutants (`e2e/torture-mutants/*.patch`, run by `make torture-mutants`):
//! each still applies to this tree and names the promise it breaks (and a seed of its own, if
//! it gives one, is a number), so the proof that the oracle catches a broken build does not rot
//! while the code moves on.

use std::process::Command;

use ipkeep_e2e::testkit::repo_root;

#[test]
fn every_mutant_applies_to_this_tree_and_names_the_promise_it_breaks() {
    let dir = repo_root().join("e2e/torture-mutants");
    let mut patches: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "patch"))
        .collect();
    patches.sort();
    assert!(!patches.is_empty(), "no mutant in {}", dir.display());
    let mut promises = std::collections::BTreeSet::new();
    for p in &patches {
        let text = std::fs::read_to_string(p).unwrap();
        let promise = text
            .lines()
            .find_map(|l| l.strip_prefix("# breaks: "))
            .and_then(|n| n.parse::<u8>().ok())
            .unwrap_or_else(|| panic!("{} names no promise (`# breaks: N`)", p.display()));
        assert!(
            (1..=5).contains(&promise),
            "{}: promise {promise}",
            p.display()
        );
        if let Some(seed) = text.lines().find_map(|l| l.strip_prefix("# seed: ")) {
            assert!(
                seed.parse::<u64>().is_ok(),
                "{}: `# seed: {seed}` is no seed",
                p.display()
            );
        }
        promises.insert(promise);
        let out = Command::new("git")
            .args(["apply", "--check"])
            .arg(p)
            .current_dir(repo_root())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{} no longer applies: {}",
            p.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    eprintln!("{} mutants, breaking promises {promises:?}", patches.len());
}
