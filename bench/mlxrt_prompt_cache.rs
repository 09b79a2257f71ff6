//! The mlxrt side of bench/prompt_cache.py: time to first token cold and
//! with the prompt cache, printed as one JSON line.
//!
//!   MLXRT_BENCH_KERNELS=auto|stock mlxrt_prompt_cache MODEL SCENARIO_JSON
//!
//! Scenarios (prompts are token ids; greedy; `gen_tokens` generated):
//! - `{"mode": "prefix", "first": [ids], "second": [ids], "gen_tokens": N}`:
//!   `second` shares a long prefix with `first`. Prints `cold_ttft_ms` (the
//!   second prompt on a fresh engine without prompt cache) and `hit_ttft_ms`
//!   (the second prompt right after the first on an engine with it), and
//!   `cached_tokens`.
//! - `{"mode": "restart", "prompt": [ids], "gen_tokens": N, "dir": path}`:
//!   `cold_ttft_ms` of the prompt on an engine using the (emptied) cache
//!   directory, then that engine is destroyed (writing its cache) and
//!   `restart_ttft_ms` is measured on a new engine on the same directory.
//!   `load_s` is the new engine's start-up time.
//!
//! Every output also holds `provenance` (bench/provenance.rs).

use mlxrt::engine::{Engine, EngineConfig, Event, Input, RequestOptions, Usage};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Instant;

#[path = "provenance.rs"]
mod provenance;

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("id list").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

fn generate(e: &Engine, prompt: Vec<u32>, gen: u32) -> Usage {
    let mut o = RequestOptions::new(Input::Tokens(prompt));
    o.max_tokens = gen;
    o.stop_at_eos = false;
    let (tx, rx) = mpsc::channel();
    e.submit(o, Box::new(move |ev: &Event| {
        let _ = tx.send(ev.clone());
    }))
    .expect("submit");
    for ev in rx.iter() {
        match ev {
            Event::Done { usage, .. } => return usage,
            Event::Error(err) => panic!("request failed: {err}"),
            Event::Delta { .. } | Event::ToolCall { .. } => {}
        }
    }
    panic!("no terminal event")
}

fn engine(model: &str, cache: bool, dir: Option<PathBuf>) -> Engine {
    let mut c = EngineConfig::new(model);
    c.kernels = provenance::kernels();
    c.prompt_cache_bytes = if cache { 4 << 30 } else { 0 };
    c.prompt_cache_dir = dir;
    let e = Engine::new(c).expect("load");
    generate(&e, (100..132).collect(), 4); // warm-up (too short to be cached)
    e
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: {} MODEL SCENARIO_JSON", args[0]);
        std::process::exit(2);
    }
    let model = &args[1];
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&args[2]).unwrap()).unwrap();
    let gen = s["gen_tokens"].as_u64().unwrap_or(8) as u32;
    let mut out = match s["mode"].as_str() {
        Some("prefix") => {
            let (first, second) = (ids(&s["first"]), ids(&s["second"]));
            let cold = generate(&engine(model, false, None), second.clone(), gen);
            let e = engine(model, true, None);
            generate(&e, first, gen);
            let hit = generate(&e, second, gen);
            json!({"cold_ttft_ms": cold.ttft_ms, "hit_ttft_ms": hit.ttft_ms, "cached_tokens": hit.cached_tokens})
        }
        Some("restart") => {
            let prompt = ids(&s["prompt"]);
            let dir = PathBuf::from(s["dir"].as_str().expect("dir"));
            let _ = std::fs::remove_dir_all(&dir);
            let cold = {
                let e = engine(model, true, Some(dir.clone()));
                generate(&e, prompt.clone(), gen)
            };
            let t0 = Instant::now();
            let e = engine(model, true, Some(dir.clone()));
            let load_s = t0.elapsed().as_secs_f64();
            let warm = generate(&e, prompt, gen);
            let _ = std::fs::remove_dir_all(&dir);
            json!({"cold_ttft_ms": cold.ttft_ms, "restart_ttft_ms": warm.ttft_ms, "cached_tokens": warm.cached_tokens, "load_s": load_s})
        }
        other => panic!("unknown mode {other:?}"),
    };
    out["provenance"] = provenance::json(provenance::kernels());
    println!("{out}");
}
