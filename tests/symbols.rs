//! The shared library exports the C API and nothing else: a host must never
//! bind to (or clash with) cxx's runtime, the C++ shim or Rust's std.
//! build.rs (`limit_exports`) arranges it; this checks the built library.

mod common;

use common::lib_dir;
use std::process::Command;

#[test]
#[cfg(target_os = "linux")]
fn only_mlxrt_symbols_are_exported() {
    let lib = lib_dir().join("libmlxrt.so");
    assert!(lib.exists(), "{} was not built", lib.display());
    let out = Command::new("nm").args(["-D", "--defined-only"]).arg(&lib).output().expect("run nm");
    assert!(out.status.success(), "nm failed: {}", String::from_utf8_lossy(&out.stderr));
    let listing = String::from_utf8(out.stdout).unwrap();
    // Lines are "ADDRESS TYPE NAME"; the name is the last field.
    let names: Vec<&str> = listing.lines().filter_map(|l| l.split_whitespace().last()).collect();
    let foreign: Vec<&str> = names.iter().copied().filter(|n| !n.starts_with("mlxrt_")).collect();
    assert!(foreign.is_empty(), "exported symbols outside the C API: {foreign:?}");
    // Every function the header declares is exported.
    let header = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/include/mlxrt.h")).unwrap();
    // A declaration is a line such as `mlxrt_status mlxrt_engine_create(...`.
    let declared = header
        .lines()
        .filter(|l| !l.starts_with([' ', '#', '/', '}', 't']) && l.contains('('))
        .filter_map(|l| l.split('(').next()?.split_whitespace().last())
        .map(|n| n.trim_start_matches('*'))
        .filter(|n| n.starts_with("mlxrt_"))
        .collect::<Vec<_>>();
    assert!(declared.len() >= 10, "could not read the declarations: {declared:?}");
    for &name in &declared {
        assert!(names.contains(&name), "{name} is declared in mlxrt.h but not exported");
    }
    assert!(names.len() >= 10, "suspiciously few exports: {names:?}");
}
