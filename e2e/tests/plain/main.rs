//! The suites that need no cluster, only processes of their own: `helm lint`/`template` and the
//! rendered manifests validated (`chart_helm`), the chart's values table (`chart_values_doc`), the
//! alerting rules and the Grafana dashboard through promtool (`monitoring`), the docs' flags, values,
//! metrics, Event reasons, annotations, printer columns and anchors against the code (`docs_check`), the
//! image built with buildah and unpacked (`image_build`, root), `scripts/release.sh --check`
//! in scratch git repositories (`release_check`), the image's SBOM against cargo's resolution and
//! Cargo.lock (`sbom`), the release published to the harness's registry and pulled back
//! (`release_publish`, root), and the controller bench's plot drawn from its committed CSV
//! (`plot_script`). One test binary, each suite a module; they touch
//! disjoint files, so they run side by side.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod chart_helm;
mod chart_values_doc;
mod docs_check;
mod image_build;
mod monitoring;
mod plot_script;
mod release_check;
mod release_publish;
mod sbom;
mod torture_mutants;
