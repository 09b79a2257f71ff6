//! Compiles tests/cpp/test_wrapper.cpp (the header-only C++ wrapper,
//! bindings/cpp/mlxrt.hpp) with the system C++ compiler against the built
//! cdylib and runs it, plainly and under AddressSanitizer: on the default
//! model, and with images on the tiny vision-language checkpoint of
//! tests/media.rs (`tiny_vlm`, which needs mlx-vlm in the venv).

mod common;

use common::*;
use std::process::Command;

fn build_and_run(name: &str, extra: &[&str], env: &[(&str, &str)]) {
    let root = repo_root();
    let lib = lib_dir();
    let bin = lib.join(name);
    let mut cmd = Command::new(std::env::var("CXX").unwrap_or_else(|_| "c++".into()));
    cmd.args(["-std=c++17", "-g", "-O1", "-Wall", "-Wextra", "-Werror"])
        .args(extra)
        .arg(format!("-I{}", root.join("include").display()))
        .arg(format!("-I{}", root.join("bindings/cpp").display()))
        .arg(root.join("tests/cpp/test_wrapper.cpp"))
        .arg(format!("-L{}", lib.display()))
        .arg("-lmlxrt")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lpthread", "-o"])
        .arg(&bin);
    assert!(cmd.status().expect("run the C++ compiler").success(), "compiling failed: {cmd:?}");
    let vlm = tiny_vlm();
    let (png, raw, w, h) = tiny_vlm_image(&vlm);
    let out = this_library(&mut Command::new(&bin))
        .arg(model_path())
        .arg(vlm.join("model"))
        .args([&png, &raw])
        .args([w.to_string(), h.to_string()])
        .envs(env.iter().copied())
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    assert!(out.status.success(), "{name} failed ({})", out.status);
    assert!(stderr.contains("all C++ wrapper checks passed"), "{name}: no success line");
}

#[test]
fn cpp_wrapper_plain() {
    build_and_run("test_wrapper", &[], &[]);
}

#[test]
fn cpp_wrapper_under_address_sanitizer() {
    build_and_run(
        "test_wrapper_asan",
        &["-fsanitize=address", "-fno-omit-frame-pointer"],
        &[("ASAN_OPTIONS", "detect_leaks=1")],
    );
}
