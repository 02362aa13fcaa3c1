//! The release as users take it: `scripts/release.sh` (what `make release` runs) writes the
//! working tree's artifacts, `scripts/publish.sh` (what `make publish REGISTRY=…` runs) pushes them
//! to the harness's registry (the distribution project's, HTTPS with its own CA and a login), and
//! the test reads back through the registry's HTTP API with that login, as a kubelet and helm
//! would: the index lists exactly linux/amd64 and linux/arm64, each platform's layers hold
//! `/ipkeep` and `/ipkeep-operator` as static ELF files of that architecture, `helm pull
//! oci://…/charts/ipkeep` gives the released chart byte for byte, and a wrong password is refused.
//! Then the previous release (a single-architecture image archive and a chart directory,
//! `make previous-release`) is published with the same script's explicit inputs, as the upgrade
//! tests start from it.
//!
//! Needs root (buildah's storage), `make image`, `make image-arm64`, `make sbom` (its four SBOMs,
//! copied into the release),
//! `make previous-release`, `make registry-bin`, `make cluster-bins` (helm) and `make
//! packaging-deps` (buildah, skopeo, jq): fails naming what to run, never skips.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
};

use ipkeep_e2e::{
    cluster::{Registry, registry::USERNAME},
    testkit::{self, Scratch, cluster_bin_dir, repo_root},
};
use serde_json::Value;

const INDEX: &str = "application/vnd.oci.image.index.v1+json";
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// ELF `e_machine` of x86-64 and of AArch64.
const EM_X86_64: u16 = 62;
const EM_AARCH64: u16 = 183;

/// A script of the repository with the registry's login and a private Helm home: as a user who
/// ran `buildah login` and `helm registry login`.
fn script(name: &str, registry: &Registry, scratch: &Scratch) -> Command {
    let mut command = Command::new(repo_root().join("scripts").join(name));
    command
        .env("REGISTRY_AUTH_FILE", registry.auth_file())
        .env("HELM_REGISTRY_CONFIG", registry.auth_file())
        .env("HELM_CONFIG_HOME", scratch.join("helm/config"))
        .env("HELM_CACHE_HOME", scratch.join("helm/cache"))
        .env("HELM_DATA_HOME", scratch.join("helm/data"))
        .env("IPKEEP_BUILDAH_ROOT", scratch.join("buildah"));
    command
}

/// `GET path` with the registry's login: the body, the answer asserted to be 200.
async fn get_ok(registry: &Registry, path: &str, accept: &str) -> (http::HeaderMap, Vec<u8>) {
    let login = Some((registry.username(), registry.password()));
    let response = registry
        .get(path, accept, login)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {}", ipkeep_e2e::error_chain(&e)));
    assert_eq!(
        response.status(),
        http::StatusCode::OK,
        "GET {path}: {}",
        String::from_utf8_lossy(response.body())
    );
    let (parts, body) = response.into_parts();
    (parts.headers, body.to_vec())
}

async fn get_json(registry: &Registry, path: &str, accept: &str) -> (http::HeaderMap, Value) {
    let (headers, body) = get_ok(registry, path, accept).await;
    (headers, serde_json::from_slice(&body).unwrap())
}

/// (`e_machine`, whether it asks for a program interpreter) of a 64-bit little-endian ELF file.
fn elf_machine_and_interpreter(bytes: &[u8]) -> (u16, bool) {
    assert!(
        bytes.len() > 64 && bytes.starts_with(b"\x7fELF"),
        "not an ELF file"
    );
    assert_eq!(
        (bytes[4], bytes[5]),
        (2, 1),
        "not a 64-bit little-endian ELF file"
    );
    let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]);
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
    let program_headers = usize::try_from(u64_at(32)).unwrap();
    let (entry_size, entries) = (usize::from(u16_at(54)), usize::from(u16_at(56)));
    // PT_INTERP (3): the dynamic loader a dynamically linked executable asks for.
    let interpreter = (0..entries).any(|i| u32_at(program_headers + i * entry_size) == 3);
    (u16_at(18), interpreter)
}

/// Unpacks every layer of the image manifest `digest` into `rootfs` (`tar` reads them as the
/// registry serves them, compressed or not).
async fn unpack(registry: &Registry, digest: &str, rootfs: &Path, blobs: &Path) {
    let (_, manifest) = get_json(
        registry,
        &format!("/v2/ipkeep/manifests/{digest}"),
        MANIFEST,
    )
    .await;
    assert_eq!(manifest["mediaType"], MANIFEST, "{manifest}");
    std::fs::create_dir_all(rootfs).unwrap();
    std::fs::create_dir_all(blobs).unwrap();
    let layers = manifest["layers"].as_array().unwrap();
    assert!(!layers.is_empty(), "{manifest}");
    for layer in layers {
        let layer_digest = layer["digest"].as_str().unwrap();
        let (_, bytes) = get_ok(registry, &format!("/v2/ipkeep/blobs/{layer_digest}"), "*/*").await;
        assert_eq!(bytes.len() as u64, layer["size"].as_u64().unwrap());
        let file = blobs.join(layer_digest.trim_start_matches("sha256:"));
        std::fs::write(&file, bytes).unwrap();
        let mut untar = Command::new("tar");
        untar.arg("-xf").arg(&file).arg("-C").arg(rootfs);
        testkit::checked(untar, None);
    }
}

fn helm_pull(scratch: &Scratch, registry: &Registry, version: &str, dest: &Path) -> PathBuf {
    std::fs::create_dir_all(dest).unwrap();
    let mut pull = Command::new(cluster_bin_dir().join("helm"));
    pull.args(["pull", &format!("oci://{}/charts/ipkeep", registry.addr())])
        .args(["--version", version, "--ca-file"])
        .arg(registry.ca_file())
        .arg("--destination")
        .arg(dest)
        .env("HELM_REGISTRY_CONFIG", registry.auth_file())
        .env("HELM_CONFIG_HOME", scratch.join("helm/config"))
        .env("HELM_CACHE_HOME", scratch.join("helm/cache"))
        .env("HELM_DATA_HOME", scratch.join("helm/data"));
    testkit::checked(pull, None);
    dest.join(format!("ipkeep-{version}.tgz"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_is_published_and_pulled_back_for_both_architectures() {
    assert!(
        rustix::process::geteuid().is_root(),
        "the release test needs root (buildah's storage): run it as root"
    );
    let image_root = repo_root().join("target");
    let sboms: Vec<String> = ["ipkeep", "ipkeep-operator"]
        .iter()
        .flat_map(|b| ["amd64", "arm64"].map(|arch| format!("{b}.{arch}.cdx.json")))
        .collect();
    let mut inputs = vec![
        ("image/ipkeep.oci.tar".to_owned(), "make image"),
        ("image/ipkeep-arm64.oci.tar".to_owned(), "make image-arm64"),
    ];
    inputs.extend(sboms.iter().map(|f| (format!("sbom/{f}"), "make sbom")));
    for (file, make) in inputs {
        assert!(
            image_root.join(&file).is_file(),
            "target/{file} is missing: run {make} (make test does)"
        );
    }
    let helm = cluster_bin_dir().join("helm");
    assert!(
        helm.is_file(),
        "{} is missing: run make cluster-bins",
        helm.display()
    );
    let version = env!("CARGO_PKG_VERSION");
    let registry = Registry::start()
        .await
        .unwrap_or_else(|e| panic!("{}", ipkeep_e2e::error_chain(&e)));
    let scratch = Scratch::new("release-publish");
    let artifacts = scratch.join("artifacts");

    let mut release = script("release.sh", &registry, &scratch);
    release.env("IPKEEP_RELEASE_DIR", &artifacts);
    let said = testkit::checked(release, None);
    let said = String::from_utf8_lossy(&said.stderr).into_owned();
    eprintln!("{said}");
    let mut files = vec![
        format!("ipkeep-{version}.oci.tar"),
        format!("ipkeep-{version}.tgz"),
        "RELEASE".to_owned(),
    ];
    files.extend(sboms.iter().map(|f| format!("ipkeep-{version}-{f}")));
    for file in files {
        assert!(
            artifacts.join(&file).is_file(),
            "{file} not written: {said}"
        );
        let sums = std::fs::read_to_string(artifacts.join("SHA256SUMS")).unwrap();
        assert!(
            sums.contains(&format!("  {file}\n")),
            "{file} not in SHA256SUMS: {sums}"
        );
    }
    let mut check = Command::new("sha256sum");
    check
        .args(["--check", "--strict", "SHA256SUMS"])
        .current_dir(&artifacts);
    testkit::checked(check, None);
    let note = std::fs::read_to_string(artifacts.join("RELEASE")).unwrap();
    let index_digest = note
        .lines()
        .find_map(|l| l.strip_prefix(&format!("image index ipkeep:{version} ")))
        .unwrap_or_else(|| panic!("RELEASE names no index digest: {note}"))
        .to_owned();

    let mut publish = script("publish.sh", &registry, &scratch);
    publish
        .arg(registry.addr())
        .arg("--image")
        .arg(artifacts.join(format!("ipkeep-{version}.oci.tar")))
        .arg("--chart")
        .arg(artifacts.join(format!("ipkeep-{version}.tgz")))
        .arg("--ca-file")
        .arg(registry.ca_file());
    let published = testkit::checked(publish, None);
    let published = String::from_utf8_lossy(&published.stderr).into_owned();
    eprintln!("{published}");
    // The digest the release wrote is the one the registry serves (skopeo --preserve-digests).
    assert!(
        published.contains(&format!(
            "image {}/ipkeep:{version} {index_digest}",
            registry.addr()
        )),
        "{published}"
    );

    // The index, as a kubelet asks for it.
    let (headers, index) =
        get_json(&registry, &format!("/v2/ipkeep/manifests/{version}"), INDEX).await;
    assert_eq!(
        headers["docker-content-digest"].to_str().unwrap(),
        index_digest
    );
    assert_eq!(index["mediaType"], INDEX, "{index}");
    let platforms: BTreeSet<(String, String)> = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                format!(
                    "{}/{}",
                    m["platform"]["os"].as_str().unwrap(),
                    m["platform"]["architecture"].as_str().unwrap()
                ),
                m["digest"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let names: Vec<&str> = platforms.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(names, ["linux/amd64", "linux/arm64"], "{index}");

    // Each platform's layers hold both binaries, static, of that architecture.
    for (platform, digest) in &platforms {
        let arch = platform.trim_start_matches("linux/");
        let rootfs = scratch.join(format!("rootfs-{arch}"));
        unpack(&registry, digest, &rootfs, &scratch.join("blobs")).await;
        let want = if arch == "amd64" {
            EM_X86_64
        } else {
            EM_AARCH64
        };
        for binary in ["ipkeep", "ipkeep-operator"] {
            let bytes = std::fs::read(rootfs.join(binary))
                .unwrap_or_else(|e| panic!("/{binary} is not in the {platform} image: {e}"));
            let (machine, interpreter) = elf_machine_and_interpreter(&bytes);
            assert_eq!(
                machine, want,
                "/{binary} of {platform} is for machine {machine}"
            );
            assert!(
                !interpreter,
                "/{binary} of {platform} is dynamically linked"
            );
        }
    }
    // Control: the ELF reading above does see a dynamically linked x86-64 binary.
    let dynamic = std::fs::read("/bin/true").unwrap();
    assert_eq!(elf_machine_and_interpreter(&dynamic), (EM_X86_64, true));

    // The chart, as `helm install oci://…` fetches it: the package make release wrote.
    let pulled = helm_pull(&scratch, &registry, version, &scratch.join("pulled"));
    assert!(
        std::fs::read(&pulled).unwrap()
            == std::fs::read(artifacts.join(format!("ipkeep-{version}.tgz"))).unwrap(),
        "helm pull gave another chart than the one pushed"
    );

    // The login is asked for and checked.
    let path = format!("/v2/ipkeep/manifests/{version}");
    for login in [None, Some((USERNAME, "not-the-password"))] {
        let refused = registry.get(&path, INDEX, login).await.unwrap();
        assert_eq!(
            refused.status(),
            http::StatusCode::UNAUTHORIZED,
            "GET {path} with {login:?}"
        );
    }

    // The previous release, published from its own archive (one amd64 image) and chart directory.
    let previous = PathBuf::from(
        testkit::run_ok(
            Command::new(repo_root().join("scripts/build-previous-release.sh")),
            &["--print-dir"],
            None,
        )
        .trim(),
    );
    assert!(
        previous.join("ipkeep.oci.tar").is_file(),
        "{} has no image: run make previous-release",
        previous.display()
    );
    let chart_yaml = std::fs::read_to_string(previous.join("chart/Chart.yaml")).unwrap();
    let previous_version = chart_yaml
        .lines()
        .find_map(|l| l.strip_prefix("version: "))
        .unwrap()
        .trim_matches('"')
        .to_owned();
    let mut publish = script("publish.sh", &registry, &scratch);
    publish
        .arg(registry.addr())
        .arg("--image")
        .arg(previous.join("ipkeep.oci.tar"))
        .arg("--chart")
        .arg(previous.join("chart"))
        .arg("--ca-file")
        .arg(registry.ca_file());
    let published = testkit::checked(publish, None);
    let published = String::from_utf8_lossy(&published.stderr).into_owned();
    assert!(
        published.contains("linux/amd64 (a single image, no index)"),
        "{published}"
    );
    let (_, manifest) = get_json(
        &registry,
        &format!("/v2/ipkeep/manifests/{previous_version}"),
        MANIFEST,
    )
    .await;
    assert_eq!(manifest["mediaType"], MANIFEST, "{manifest}");
    let pulled = helm_pull(
        &scratch,
        &registry,
        &previous_version,
        &scratch.join("pulled-previous"),
    );
    assert!(pulled.is_file());
}
