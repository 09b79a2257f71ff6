//! Helpers shared by the integration tests.
#![allow(dead_code)]

use mlxrt::engine::{Engine, EngineConfig, Event, Input, RequestOptions};
use std::path::PathBuf;
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
