//! The mlxrt side of bench/kv_memory.py (see its CONTRACT). One scenario per
//! process, one JSON line on stdout:
//!
//!   mlxrt_kv_memory decode MODEL IDS_JSON GEN SCHEME
//!   mlxrt_kv_memory capacity MODEL SCHEME POSITIONS BUDGET_ROWS
//!   mlxrt_kv_memory sliding MODEL IDS_JSON LEN
//!
//! SCHEME: f32 (the dense default), affine8, affine4, turboquant (k8v3); all
//! with quantized_kv_start 0. KV bytes are the engine's own `stats().kv_bytes`,
//! sampled every millisecond while the request runs (the peak is kept).

use mlxrt::engine::{Engine, EngineConfig, Event, Input, RequestOptions};
use mlxrt::cache::scheme::{KvFloat, KvQuant, KvScheme};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

#[path = "provenance.rs"]
mod provenance;

fn scheme(name: &str) -> KvQuant {
    let scheme = match name {
        "f32" => KvScheme::Dense,
        "affine8" => KvScheme::Affine { bits: 8, group_size: 64 },
        "affine4" => KvScheme::Affine { bits: 4, group_size: 64 },
        "turboquant" => KvScheme::TurboQuant { key_bits: 8, value_bits: 3 },
        "f16" => return KvQuant { float: KvFloat::F16, ..KvQuant::default() },
        other => {
            eprintln!("unknown scheme {other:?} (f32, f16, affine8, affine4, turboquant)");
            std::process::exit(2);
        }
    };
    KvQuant { scheme, start: 0, ..KvQuant::default() }
}

fn engine(model: &str, kv: &str, f: impl FnOnce(&mut EngineConfig)) -> Engine {
    let mut config = EngineConfig::new(model);
    config.kernels = provenance::kernels();
    config.kv = scheme(kv);
    f(&mut config);
    Engine::new(config).expect("load")
}

fn read_ids(path: &str) -> Vec<u32> {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).expect("ids file")).unwrap();
    v["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn options(ids: &[u32], gen: u32) -> RequestOptions {
    let mut o = RequestOptions::new(Input::Tokens(ids.to_vec()));
    o.max_tokens = gen;
    o.stop_at_eos = false;
    o
}

/// Runs one greedy request while sampling the engine's KV bytes; returns
/// (usage, generated ids, peak KV bytes).
fn generate(engine: &Arc<Engine>, ids: &[u32], gen: u32) -> (mlxrt::engine::Usage, Vec<u32>, usize) {
    let (peak, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
    let sampler = {
        let (engine, peak, stop) = (engine.clone(), peak.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(engine.stats().kv_bytes, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let (tx, rx) = mpsc::channel();
    engine.submit(options(ids, gen), Box::new(move |e: &Event| {
        let _ = tx.send(e.clone());
    })).expect("submit");
    let mut tokens = vec![];
    let usage = loop {
        match rx.recv().expect("no terminal event") {
            Event::Delta { tokens: t, .. } => tokens.extend(t),
            Event::Done { usage, .. } => break usage,
            Event::Error(e) => panic!("request failed: {e}"),
            Event::ToolCall { .. } => {}
        }
    };
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    (usage, tokens, peak.load(Ordering::Relaxed))
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let usage = "usage: mlxrt_kv_memory decode MODEL IDS GEN SCHEME | capacity MODEL SCHEME POSITIONS BUDGET_ROWS | sliding MODEL IDS LEN";
    let out = match (a.get(1).map(String::as_str), a.len()) {
        (Some("decode"), 6) => {
            let (ids, gen) = (read_ids(&a[3]), a[4].parse().unwrap());
            let e = Arc::new(engine(&a[2], &a[5], |_| {}));
            generate(&e, &ids[..32], 4); // warm-up
            let (u, tokens, peak) = generate(&e, &ids, gen);
            assert_eq!(u.completion_tokens, gen, "generated a different number of tokens");
            serde_json::json!({
                "scheme": a[5],
                "decode_tps": u.decode_tokens_per_s,
                "ttft_ms": u.ttft_ms,
                "kv_bytes_peak": peak,
                "kv_positions": ids.len() as u32 + gen - 1,
                "kv_bytes_per_token_dense_f32": e.info().kv_bytes_per_token,
                "generated_head": &tokens[..tokens.len().min(16)],
            })
        }
        (Some("capacity"), 6) => {
            let (positions, rows): (u32, usize) = (a[4].parse().unwrap(), a[5].parse().unwrap());
            // The budget: `rows` dense f32 requests of `positions` positions.
            let probe = engine(&a[2], "f32", |_| {});
            let budget = rows * positions as usize * probe.info().kv_bytes_per_token;
            drop(probe);
            let submitted = rows * 16;
            let e = engine(&a[2], &a[3], |c| {
                c.kv_budget = budget;
                c.max_rows = submitted;
                c.max_in_flight = submitted;
            });
            let prompt: Vec<u32> = (0..16).map(|i| 1000 + i).collect();
            let handles: Vec<_> = (0..submitted)
                .map(|_| e.submit(options(&prompt, positions - prompt.len() as u32), Box::new(|_: &Event| {})).unwrap())
                .collect();
            // Admission happens in the scheduler's next iterations; the count
            // settles once every admissible request holds its reservation.
            let mut admitted = 0;
            for _ in 0..200 {
                std::thread::sleep(Duration::from_millis(20));
                admitted = admitted.max(e.stats().active);
            }
            for h in &handles {
                h.cancel();
            }
            serde_json::json!({ "scheme": a[3], "admitted": admitted, "submitted": submitted, "kv_budget": budget })
        }
        (Some("sliding"), 5) => {
            let n: usize = a[4].parse().unwrap();
            let ids = read_ids(&a[3]);
            let e = Arc::new(engine(&a[2], "f32", |_| {}));
            let (_, _, peak) = generate(&e, &ids[..n], 8);
            // The one global (full-attention) layer's share: a dense f32
            // cache whose capacity is the prompt rounded up to the 256-position
            // growth step (prefill chunks of 2048; the 8 decoded tokens fit).
            let cfg: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(format!("{}/config.json", a[2])).unwrap()).unwrap();
            let per_layer = 2 * 4 * (cfg["num_key_value_heads"].as_u64().unwrap() * cfg["head_dim"].as_u64().unwrap()) as usize;
            let cap = (n + 255) / 256 * 256;
            serde_json::json!({ "len": n, "kv_bytes_peak": peak, "global_kv_bytes": cap * per_layer })
        }
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    let mut out = out;
    out["provenance"] = provenance::json(provenance::kernels());
    println!("{out}");
}
