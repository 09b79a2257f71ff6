//! The committed C header must be exactly what cbindgen generates from src/ffi.

#[test]
fn committed_header_is_up_to_date() {
    let generated = std::fs::read_to_string(env!("MLXRT_GENERATED_HEADER")).expect("generated header");
    let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/include/mlxrt.h")).unwrap_or_default();
    assert!(
        generated == committed,
        "include/mlxrt.h is stale: run scripts/update-header.sh and commit the result"
    );
}
