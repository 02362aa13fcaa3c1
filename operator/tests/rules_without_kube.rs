//! The rules (`src/rules/`) hold every decision and name no Kubernetes type: no `kube`, no
//! `k8s_openapi`. A rule that needs something from the API takes a plain view the caller built.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, recursively.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
    found
}

/// The lines of `text`, outside line comments, that name a Kubernetes crate.
fn kube_paths(text: &str) -> Vec<String> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
        .filter(|(_, line)| {
            ["kube::", "kube_", "k8s_openapi", "use kube"]
                .iter()
                .any(|p| line.contains(p))
        })
        .map(|(n, line)| format!("{}: {}", n + 1, line.trim()))
        .collect()
}

#[test]
fn no_rule_names_kube_or_k8s_openapi() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/rules");
    let files = sources(&dir);
    assert!(files.len() >= 8, "found only {files:?}");
    let offending: Vec<String> = files
        .iter()
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            kube_paths(&text)
                .into_iter()
                .map(move |l| format!("{}:{l}", f.display()))
        })
        .collect();
    assert!(offending.is_empty(), "rules name kube: {offending:#?}");
}

#[test]
fn the_check_sees_a_kube_path() {
    let cases = [
        ("use kube::Api;", 1),
        ("use k8s_openapi::api::core::v1::Pod;", 1),
        ("    let s: kube::core::Selector = x;", 1),
        ("use kube_lease_manager::LeaseManager;", 1),
        ("// kube::Api in a comment is fine", 0),
        (
            "use crate::api::PodKey; // as kube-controller-manager says",
            0,
        ),
    ];
    for (text, want) in cases {
        assert_eq!(kube_paths(text).len(), want, "{text}");
    }
}
