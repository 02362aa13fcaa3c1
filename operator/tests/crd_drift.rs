//! The committed CRD must be exactly what the Rust types generate.

#[test]
fn committed_crd_matches_the_rust_types() {
    let generated = ipkeep_operator::api::crd_yaml().expect("the CRD serializes");
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../crds/ipreservations.ipkeep.dev.yaml"
    );
    let committed =
        std::fs::read_to_string(path).expect("crds/ipreservations.ipkeep.dev.yaml is readable");
    assert!(
        generated == committed,
        "crds/ipreservations.ipkeep.dev.yaml drifted from the Rust types: run `make crds` and commit the result"
    );
}
