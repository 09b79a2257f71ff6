//! Builds the C (and C++) example programs with the system compilers against
//! the built library and runs each briefly, so that they cannot rot.

mod common;

use common::*;
use std::path::PathBuf;
use std::process::{Command, Output};

/// Compiles `examples/<file>` into target/<profile>/example-<stem>.
fn build(file: &str, compiler: &str, std: &str) -> PathBuf {
    let root = repo_root();
    let lib = lib_dir();
    let stem = file.split('.').next().unwrap();
    let out = lib.join(format!("example-{stem}"));
    let mut cmd = Command::new(compiler);
    cmd.arg(format!("-std={std}"))
        .args(["-g", "-O1", "-Wall", "-Wextra", "-Werror"])
        .arg(format!("-I{}", root.join("include").display()))
        .arg(format!("-I{}", root.join("bindings/cpp").display()))
        .arg(root.join("examples").join(file))
        .arg(format!("-L{}", lib.display()))
        .arg("-lmlxrt")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lpthread", "-o"])
        .arg(&out);
    let st = cmd.status().expect("run the compiler");
    assert!(st.success(), "compiling {file} failed: {cmd:?}");
    out
}

fn run(bin: PathBuf, args: &[&str]) -> (String, String) {
    let out: Output = this_library(&mut Command::new(&bin)).arg(model_path()).args(args).output().expect("run the example");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("{}:\n{stdout}\n{stderr}", bin.display());
    assert!(out.status.success(), "{} failed ({})", bin.display(), out.status);
    (stdout.into_owned(), stderr.into_owned())
}

fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

fn cxx() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "c++".into())
}

#[test]
fn chat_c() {
    let (stdout, stderr) = run(build("chat.c", &cc(), "c11"), &["What is the capital of France?"]);
    assert!(stdout.contains("Paris"), "no answer: {stdout}");
    assert!(stderr.contains("generated tokens"), "no usage line");
}

#[test]
fn concurrent_c() {
    let (stdout, _) = run(build("concurrent.c", &cc(), "c11"), &["3", "12"]);
    for i in 0..3 {
        assert!(stdout.contains(&format!("--- request {i}:")), "request {i} missing: {stdout}");
    }
    assert!(!stdout.contains("error:") && !stdout.contains("submit failed"), "{stdout}");
}

#[test]
fn cancel_c() {
    let (stdout, _) = run(build("cancel.c", &cc(), "c11"), &["3"]);
    assert!(stdout.contains("[cancelled after"), "{stdout}");
}

#[test]
fn chat_cpp() {
    let (stdout, _) = run(build("chat.cpp", &cxx(), "c++17"), &["What is the capital of France?"]);
    assert!(stdout.contains("Paris"), "no answer: {stdout}");
    assert!(stdout.contains("one word:"), "{stdout}");
    assert!(stdout.contains("bad options: invalid JSON"), "{stdout}");
}

#[test]
fn pull_stream_c() {
    let bin = build("pull_stream.c", &cc(), "c11");
    let (stdout, _) = run(bin.clone(), &["What is the capital of France?"]);
    assert!(stdout.contains("Paris") && stdout.contains("[done:"), "{stdout}");
    let (stdout, _) = run(bin, &["Tell me a long story about a dragon.", "3"]);
    assert!(stdout.contains("[cancelled:"), "{stdout}");
}

#[test]
fn json_output_c() {
    let (stdout, _) = run(build("json_output.c", &cc(), "c11"), &["Describe Paris."]);
    let doc = stdout.split("\n[").next().unwrap();
    let v: serde_json::Value = serde_json::from_str(doc).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"));
    assert!(v["city"].is_string() && v["landmarks"].is_array() && v["population_millions"].is_number(), "{v}");
    assert!(stdout.contains("[complete document:"), "{stdout}");
    assert!(stdout.contains("bad schema: invalid argument: response_format: "), "{stdout}");
}
