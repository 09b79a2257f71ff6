//! Helpers shared by the integration tests.
#![allow(dead_code)]

use mlxrt::engine::{Engine, EngineConfig, Event, Input, RequestOptions};
use mlxrt::mlx::io::TensorFile;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

/// The default model (scripts/setup.sh puts it there). Tests fail, not skip,
/// when it is missing: the test command always runs the setup first.
pub fn model_path() -> PathBuf {
    let p = std::env::var_os("MLXRT_MODEL").map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME").expect("HOME is set");
        PathBuf::from(home).join(".cache/mlxrt/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    });
    assert!(p.exists(), "model {} is missing: run scripts/setup.sh", p.display());
    p
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where cargo put libmlxrt.so for this test run: target/<profile>/deps,
/// next to the test binary. (`cargo test` builds the cdylib there but copies
/// it up to target/<profile> only on `cargo build`.)
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().to_path_buf();
    assert!(dir.join(if cfg!(target_os = "macos") { "libmlxrt.dylib" } else { "libmlxrt.so" }).exists(), "no libmlxrt in {}", dir.display());
    dir
}

/// Compiles tests/c/`source`.c with the system C compiler (C11, warnings as
/// errors, plus `extra` flags) against the built cdylib into `out`, next to
/// the library.
pub fn compile_c(source: &str, out: &str, extra: &[&str]) -> PathBuf {
    let (root, lib) = (repo_root(), lib_dir());
    let bin = lib.join(out);
    let mut cmd = std::process::Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cmd.args(["-std=c11", "-g", "-O1", "-Wall", "-Wextra", "-Werror"])
        .args(extra)
        .arg(format!("-I{}", root.join("include").display()))
        .arg(root.join(format!("tests/c/{source}.c")))
        .arg(format!("-L{}", lib.display()))
        .arg("-lmlxrt")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lpthread", "-o"])
        .arg(&bin);
    let st = cmd.status().expect("run the C compiler");
    assert!(st.success(), "compiling {source}.c failed: {cmd:?}");
    bin
}

/// Makes a compiled C/C++/Objective-C program load the library this test run
/// built. cargo's LD_LIBRARY_PATH lists target/<profile> (where only `cargo
/// build` copies the library, so it may be stale) before deps/, and it
/// overrides the program's RUNPATH.
pub fn this_library(cmd: &mut std::process::Command) -> &mut std::process::Command {
    let mut path = std::ffi::OsString::from(lib_dir());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        path.push(":");
        path.push(old);
    }
    cmd.env("LD_LIBRARY_PATH", path)
}

pub fn python() -> PathBuf {
    let p = repo_root().join(".venv/bin/python");
    assert!(p.exists(), "{} is missing: run scripts/setup.sh", p.display());
    p
}

pub fn engine() -> Engine {
    Engine::new(EngineConfig::new(model_path())).expect("engine loads the default model")
}

pub fn chat(user: &str) -> RequestOptions {
    RequestOptions::new(Input::Messages(serde_json::json!([{"role": "user", "content": user}])))
}

/// Submits and collects every event until the terminal one.
pub fn run(engine: &Engine, opts: RequestOptions) -> Vec<Event> {
    let (tx, rx) = mpsc::channel();
    engine
        .submit(opts, Box::new(move |ev: &Event| {
            let _ = tx.send(ev.clone());
        }))
        .expect("submit");
    collect(&rx)
}

pub fn collect(rx: &mpsc::Receiver<Event>) -> Vec<Event> {
    let mut out = vec![];
    loop {
        let ev = rx.recv_timeout(Duration::from_secs(300)).expect("event within 300 s");
        let end = ev.is_terminal();
        out.push(ev);
        if end {
            return out;
        }
    }
}

/// Stats once the scheduler has published an idle state (it does so after
/// each unit of work, a moment after the last terminal event).
pub fn wait_idle(engine: &Engine) -> mlxrt::engine::EngineStats {
    for _ in 0..200 {
        let s = engine.stats();
        if s.in_flight == 0 && s.active == 0 && s.queued == 0 {
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    engine.stats()
}

pub fn text_of(events: &[Event]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Delta { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

pub fn tokens_of(events: &[Event]) -> Vec<u32> {
    events
        .iter()
        .flat_map(|e| match e {
            Event::Delta { tokens, .. } => tokens.clone(),
            _ => vec![],
        })
        .collect()
}

/// One prompt of an mlx-lm reference file (tests/oracle/*reference*.py):
/// its ids, mlx-lm's greedy tokens and last-position logits at `logit_steps`.
pub struct Case {
    pub name: String,
    pub prompt: Vec<u32>,
    pub tokens: Vec<u32>,
    pub logit_steps: Vec<usize>,
    /// `[n_logit_steps][vocab]`
    pub logits: Vec<Vec<f32>>,
}

/// Every case of a reference file, sorted by name.
pub fn reference_cases(reference: &Path) -> Vec<Case> {
    let mut f = TensorFile::load_safetensors(reference.to_str().unwrap()).unwrap();
    let mut names: Vec<String> =
        f.names().unwrap().iter().filter_map(|n| n.strip_suffix(".prompt_ids").map(str::to_owned)).collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let ids = |f: &mut TensorFile, k: &str| -> Vec<u32> {
                f.take(&format!("{name}.{k}")).unwrap().to_vec_i32().unwrap().iter().map(|&x| x as u32).collect()
            };
            let prompt = ids(&mut f, "prompt_ids");
            let tokens = ids(&mut f, "tokens");
            let logit_steps = ids(&mut f, "logit_steps").iter().map(|&s| s as usize).collect();
            let l = f.take(&format!("{name}.logits")).unwrap();
            let vocab = l.dim(-1) as usize;
            let logits = l.to_vec_f32().unwrap().chunks(vocab).map(<[f32]>::to_vec).collect();
            Case { name, prompt, tokens, logit_steps, logits }
        })
        .collect()
}
