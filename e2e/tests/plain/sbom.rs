//! The image's SBOM (`make sbom`, `scripts/sbom.sh`): one CycloneDX 1.5 document, written by
//! cargo-cyclonedx, per binary the image holds and per architecture the image index holds, held
//! against what does not come from the tool: `cargo tree` for that package and target (what the
//! binary's build resolves), `Cargo.lock`'s checksums, and the document's own references.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::testkit;
use std::{
    collections::{BTreeMap, BTreeSet},
    process::Command,
};

use serde_json::Value;
use testkit::{Scratch, repo_root};

/// binary, its package, the image's architecture name, the target triple.
const DOCUMENTS: &[(&str, &str, &str, &str)] = &[
    (
        "ipkeep",
        "ipkeep-plugin",
        "amd64",
        "x86_64-unknown-linux-gnu",
    ),
    (
        "ipkeep",
        "ipkeep-plugin",
        "arm64",
        "aarch64-unknown-linux-gnu",
    ),
    (
        "ipkeep-operator",
        "ipkeep-operator",
        "amd64",
        "x86_64-unknown-linux-gnu",
    ),
    (
        "ipkeep-operator",
        "ipkeep-operator",
        "arm64",
        "aarch64-unknown-linux-gnu",
    ),
];

/// (name, version) of every package `cargo tree` resolves into `package` built alone for
/// `triple`, normal dependencies, but the package itself.
fn resolved(package: &str, triple: &str) -> BTreeSet<(String, String)> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(repo_root()).args([
        "tree", "--quiet", "--locked", "-p", package, "--target", triple, "-e", "normal",
        "--prefix", "none", "--format", "{p}",
    ]);
    let out = testkit::run_ok(cmd, &[], None);
    out.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let name = words.next()?;
            let version = words.next()?.strip_prefix('v')?;
            (name != package).then(|| (name.to_owned(), version.to_owned()))
        })
        .collect()
}

/// Cargo.lock's checksum of each registry package, by (name, version).
fn lock_checksums() -> BTreeMap<(String, String), String> {
    let lock = std::fs::read_to_string(repo_root().join("Cargo.lock")).unwrap();
    let mut sums = BTreeMap::new();
    for block in lock.split("[[package]]").skip(1) {
        let field = |key: &str| {
            block.lines().find_map(|l| {
                l.strip_prefix(&format!("{key} = \""))
                    .and_then(|rest| rest.strip_suffix('"'))
                    .map(str::to_owned)
            })
        };
        if let (Some(name), Some(version), Some(sum)) =
            (field("name"), field("version"), field("checksum"))
        {
            sums.insert((name, version), sum);
        }
    }
    sums
}

fn text<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {v}"))
}

#[test]
fn each_binarys_sbom_lists_what_cargo_builds_into_it_with_cargo_locks_checksums() {
    let out = Scratch::new("sbom");
    let mut cmd = Command::new(repo_root().join("scripts/sbom.sh"));
    cmd.arg(out.path());
    testkit::checked(cmd, None);
    let sums = lock_checksums();
    assert!(
        sums.len() > 100,
        "Cargo.lock parsed: {} checksums",
        sums.len()
    );
    for (binary, package, arch, triple) in DOCUMENTS {
        let file = out.join(format!("{binary}.{arch}.cdx.json"));
        let what = file.display().to_string();
        let bom: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(bom["bomFormat"], "CycloneDX", "{what}");
        assert_eq!(bom["specVersion"], "1.5", "{what}");
        assert_eq!(
            bom["metadata"]["tools"][0]["name"], "cargo-cyclonedx",
            "{what}"
        );
        let root = &bom["metadata"]["component"];
        assert_eq!(root["name"], *binary, "{what}");
        assert_eq!(root["version"], env!("CARGO_PKG_VERSION"), "{what}");

        let components = bom["components"].as_array().unwrap();
        let listed: BTreeSet<(String, String)> = components
            .iter()
            .map(|c| {
                (
                    text(&c["name"], "name").to_owned(),
                    text(&c["version"], "version").to_owned(),
                )
            })
            .collect();
        assert_eq!(
            listed,
            resolved(package, triple),
            "{what}: against cargo tree"
        );

        for c in components {
            let (name, version) = (text(&c["name"], "name"), text(&c["version"], "version"));
            let reference = text(&c["bom-ref"], "bom-ref");
            if reference.starts_with("path+") {
                // The workspace's own libraries: no checksum, no registry.
                assert!(name.starts_with("ipkeep-"), "{what}: {reference}");
                continue;
            }
            assert_eq!(
                c["purl"],
                format!("pkg:cargo/{name}@{version}").as_str(),
                "{what}"
            );
            let sum = sums
                .get(&(name.to_owned(), version.to_owned()))
                .unwrap_or_else(|| panic!("{what}: {name} {version} is not in Cargo.lock"));
            assert_eq!(
                c["hashes"][0],
                serde_json::json!({"alg": "SHA-256", "content": sum}),
                "{what}: {name} {version}"
            );
        }

        // The dependency graph names only the root and the components.
        let refs: BTreeSet<&str> = components
            .iter()
            .map(|c| text(&c["bom-ref"], "bom-ref"))
            .chain([text(&root["bom-ref"], "bom-ref")])
            .collect();
        for d in bom["dependencies"].as_array().unwrap() {
            assert!(refs.contains(text(&d["ref"], "ref")), "{what}: {d}");
            for on in d["dependsOn"].as_array().unwrap() {
                assert!(refs.contains(text(on, "dependsOn")), "{what}: {on}");
            }
        }
    }
}
