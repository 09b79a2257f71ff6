//! Builds the Objective-C wrapper (bindings/objc) and its test program
//! (tests/objc/test_objc.m) with clang and GNUstep against the built cdylib
//! and runs it: plainly, and under AddressSanitizer with LeakSanitizer.
//!
//! On Linux (Debian 12) the toolchain is clang with GCC's libobjc (the GNU
//! runtime: manual reference counting, the fragile ABI), GNUstep Base and
//! libBlocksRuntime, all from apt (scripts/setup.sh). Debian has no
//! libdispatch, so tests/objc/shim provides the part of it the wrapper uses.

mod common;

use common::*;
use std::path::PathBuf;
use std::process::Command;

/// `gnustep-config ARG`, split into arguments.
fn gnustep_config(arg: &str) -> Vec<String> {
    let out = Command::new("gnustep-config")
        .arg(arg)
        .output()
        .expect("gnustep-config (gnustep-make) is missing: run scripts/setup.sh");
    assert!(out.status.success(), "gnustep-config {arg} failed");
    String::from_utf8(out.stdout).unwrap().split_whitespace().map(String::from).collect()
}

/// GCC's include directory, which holds the GNU runtime's <objc/objc.h>.
fn gcc_include() -> String {
    let out = Command::new("gcc").arg("-print-file-name=include").output().expect("run gcc");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn build(name: &str, extra: &[&str]) -> PathBuf {
    let root = repo_root();
    let lib = lib_dir();
    let bin = lib.join(name);
    // GNUstep's flags assume gcc's defaults; drop its optimisation level and
    // dependency-file output, keep its defines and include paths.
    let objc_flags: Vec<String> = gnustep_config("--objc-flags")
        .into_iter()
        .filter(|f| !matches!(f.as_str(), "-MMD" | "-MP" | "-O2" | "-g"))
        .collect();
    let mut cmd = Command::new(std::env::var("CLANG").unwrap_or_else(|_| "clang".into()));
    cmd.args(["-g", "-O1", "-fobjc-runtime=gcc", "-fblocks", "-Wall", "-Wextra", "-Werror"])
        .args(extra)
        .args(&objc_flags)
        .arg(format!("-I{}", root.join("tests/objc/shim").display()))
        .arg(format!("-I{}", root.join("bindings/objc").display()))
        .arg(format!("-I{}", root.join("include").display()))
        .args(["-idirafter", &gcc_include()])
        .arg(root.join("tests/objc/test_objc.m"))
        .arg(root.join("bindings/objc/MLXRT.m"))
        .arg(root.join("tests/objc/shim/dispatch.c"))
        // Before gnustep-base, which exports a _Block_copy of its own that
        // only works with libobjc2: the first definition loaded wins.
        .arg("-lBlocksRuntime")
        .arg(format!("-L{}", lib.display()))
        .arg("-lmlxrt")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(gnustep_config("--base-libs"))
        .args(["-lpthread", "-o"])
        .arg(&bin);
    let st = cmd.status().expect("run clang (scripts/setup.sh installs it)");
    assert!(st.success(), "compiling the Objective-C test failed: {cmd:?}");
    bin
}

fn run(mut cmd: Command, what: &str) {
    // Images: the tiny vision-language checkpoint of tests/media.rs, one of
    // its pictures, and mlx-vlm's tokens for it ("one_png").
    let vlm = tiny_vlm();
    let (png, raw, w, h) = tiny_vlm_image(&vlm);
    let tokens: Vec<String> = tiny_vlm_tokens(&vlm, "one_png").iter().map(u32::to_string).collect();
    // Audio: the tiny Gemma 4 checkpoint of tests/media_gemma4.rs, its 0.5 s
    // clip (and its samples as floats), mlx-vlm's tokens for it ("one_wav").
    let g4 = tiny_gemma4_vlm();
    let (wav, f32s) = tiny_gemma4_clip(&g4);
    let audio_tokens: Vec<String> = tiny_vlm_tokens(&g4, "one_wav").iter().map(u32::to_string).collect();
    let out = this_library(&mut cmd)
        .arg(model_path())
        .arg(vlm.join("model"))
        .args([&png, &raw])
        .args([w.to_string(), h.to_string(), tokens.join(",")])
        .arg(g4.join("model"))
        .args([&wav, &f32s])
        .arg(audio_tokens.join(","))
        .output()
        .expect("run test_objc");
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    assert!(out.status.success(), "{what}: test_objc failed ({})", out.status);
    assert!(stderr.contains("all Objective-C checks passed"), "{what}: no success line");
}

#[test]
fn objc_wrapper() {
    run(Command::new(build("test_objc", &[])), "plain");
}

#[test]
fn objc_wrapper_under_address_sanitizer() {
    let bin = build("test_objc_asan", &["-fsanitize=address", "-fno-omit-frame-pointer"]);
    let supp = repo_root().join("tests/objc/lsan.supp");
    let mut cmd = Command::new(bin);
    // The slow unwinder sees through libobjc (no frame pointers), which the
    // suppressions need to recognise the runtime's own allocations.
    cmd.env("ASAN_OPTIONS", "detect_leaks=1:fast_unwind_on_malloc=0")
        .env("LSAN_OPTIONS", format!("suppressions={}", supp.display()));
    run(cmd, "asan");
}
