//! Compiles tests/c/test_abi.c with the system C compiler against the built
//! cdylib and runs it: plainly, under AddressSanitizer (with LeakSanitizer),
//! and, for the parts that generate nothing, under valgrind.

mod common;

use common::*;
use std::path::PathBuf;
use std::process::Command;

fn run(cmd: &mut Command, what: &str) {
    let scratch = tempdir(what);
    let out = this_library(cmd).arg(model_path()).arg(&scratch).output().expect("run test_abi");
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    assert!(out.status.success(), "{what}: test_abi failed ({})", out.status);
    assert!(stderr.contains("all C ABI checks passed"), "{what}: no success line");
}

fn tempdir(what: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mlxrt-c-abi-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn c_abi_plain() {
    let bin = compile_c("test_abi", "test_abi", &[]);
    run(&mut Command::new(bin), "plain");
}

#[test]
fn c_abi_under_address_sanitizer() {
    let bin = compile_c("test_abi", "test_abi_asan", &["-fsanitize=address", "-fno-omit-frame-pointer"]);
    // Leak checking is on by default with ASan on Linux; make it explicit.
    run(Command::new(bin).env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0"), "asan");
}

#[test]
fn c_abi_under_valgrind() {
    let bin = compile_c("test_abi", "test_abi_vg", &[]);
    let mut cmd = Command::new("valgrind");
    cmd.args([
        "--error-exitcode=99",
        "--leak-check=full",
        "--errors-for-leak-kinds=definite",
        "--show-leak-kinds=definite",
        "--track-origins=no",
    ])
    .arg(bin);
    // `quick` is appended after the model and scratch paths by `run`.
    let scratch = tempdir("valgrind");
    let out = this_library(&mut cmd).arg(model_path()).arg(&scratch).arg("quick").output().expect("run valgrind");
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    assert!(out.status.success(), "valgrind: test_abi failed ({})", out.status);
    assert!(stderr.contains("all C ABI checks passed"), "valgrind: no success line");
    assert!(stderr.contains("ERROR SUMMARY: 0 errors"), "valgrind reported errors");
}
