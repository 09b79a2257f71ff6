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

/// Every function the header declares is exercised by the C ABI test
/// (tests/c/test_abi.c), so a new function cannot ship untested.
#[test]
fn every_header_function_is_called_from_the_c_test() {
    let root = env!("CARGO_MANIFEST_DIR");
    let header = std::fs::read_to_string(format!("{root}/include/mlxrt.h")).unwrap();
    let test = std::fs::read_to_string(format!("{root}/tests/c/test_abi.c")).unwrap();
    // Declarations start unindented: `RET mlxrt_name(` (or `RET *mlxrt_name(`).
    let declared: Vec<&str> = header
        .lines()
        .filter(|l| !l.starts_with(' ') && !l.starts_with('#') && !l.starts_with("typedef"))
        .filter_map(|l| {
            let end = l.find('(')?;
            let start = l[..end].rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
            let name = &l[start..end];
            name.starts_with("mlxrt_").then_some(name)
        })
        .collect();
    assert!(declared.len() >= 25, "found only {} declarations: {declared:?}", declared.len());
    let untested: Vec<&&str> = declared.iter().filter(|f| !test.contains(&format!("{f}("))).collect();
    assert!(untested.is_empty(), "header functions not called in tests/c/test_abi.c: {untested:?}");
}
