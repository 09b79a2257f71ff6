//! The mlxrt side of bench/single_stream.py (see its CONTRACT): loads the
//! model, runs a short untimed warm-up, then one timed greedy request of the
//! given prompt ids with EOS disabled, and prints one JSON line.
//!
//!   MLXRT_BENCH_KERNELS=auto|stock mlxrt_single_stream MODEL PROMPT_IDS_JSON GEN_TOKENS

use mlxrt::engine::{Engine, EngineConfig, Event, Input, RequestOptions};
use std::sync::mpsc;

#[path = "provenance.rs"]
mod provenance;
use std::time::Instant;

fn generate(engine: &Engine, ids: &[u32], gen: u32) -> (mlxrt::engine::Usage, Vec<u32>) {
    let mut o = RequestOptions::new(Input::Tokens(ids.to_vec()));
    o.max_tokens = gen;
    o.stop_at_eos = false;
    let (tx, rx) = mpsc::channel();
    engine
        .submit(o, Box::new(move |e: &Event| {
            let _ = tx.send(e.clone());
        }))
        .expect("submit");
    let mut tokens = vec![];
    for e in rx.iter() {
        match e {
            Event::Delta { tokens: t, .. } => tokens.extend(t),
            Event::Done { usage, .. } => return (usage, tokens),
            Event::Error(e) => panic!("request failed: {e}"),
            Event::ToolCall { .. } => {}
        }
    }
    panic!("no terminal event");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: {} MODEL PROMPT_IDS_JSON GEN_TOKENS", args[0]);
        std::process::exit(2);
    }
    let ids: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&args[2]).unwrap()).unwrap();
    let ids: Vec<u32> = ids["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let gen: u32 = args[3].parse().unwrap();

    let t0 = Instant::now();
    let mut config = EngineConfig::new(&args[1]);
    config.kernels = provenance::kernels();
    config.kv = provenance::kv();
    let engine = Engine::new(config).expect("load");
    let load_s = t0.elapsed().as_secs_f64();
    generate(&engine, &ids[..ids.len().min(32)], 8);
    let (u, tokens) = generate(&engine, &ids, gen);
    assert_eq!(u.completion_tokens, gen, "generated a different number of tokens");
    let out = serde_json::json!({
        "prefill_tps": ids.len() as f64 / (u.ttft_ms / 1e3),
        "ttft_ms": u.ttft_ms,
        "decode_tps": u.decode_tokens_per_s,
        "load_s": load_s,
        "parameter_bytes": engine.parameter_bytes(),
        "mlx_peak_memory_bytes": engine.stats().peak_memory,
        "provenance": provenance::json(provenance::kernels()),
        "generated_head": &tokens[..tokens.len().min(16)],
    });
    println!("{out}");
}
