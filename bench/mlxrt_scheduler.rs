//! The mlxrt side of bench/scheduler.py: one scenario (a JSON file) on the
//! engine, one JSON line of raw figures out. Greedy, EOS ignored; prompts are
//! token ids.
//!
//!   MLXRT_BENCH_KERNELS=auto|stock mlxrt_scheduler MODEL SCENARIO_JSON
//!
//! Scenarios:
//! - `{"mode": "shared_prefix", "prompts": [[ids], ...], "max_tokens": N}`
//!   (the prompts share a long prefix; prompt cache off, so that nothing but
//!   the KV layout can share it: with `kv_paging` the requests that arrive
//!   with the first map its prefix blocks): the first prompt alone, then all
//!   at once.
//!   Prints `private_kv_bytes` (the peak KV bytes of the first prompt alone:
//!   one request's private copy), `kv_peak_bytes` (the peak while all run),
//!   `wall_s`, `output_tokens`, `throughput_tps` and per-request `ttft_ms`
//!   of the concurrent run. KV bytes are sampled from the engine's stats
//!   every millisecond.
//! - `{"mode": "cohort_hit", "prefix": [ids], "warm": [ids], "questions":
//!   [[ids], ...], "max_tokens": N}` (an even number of questions, prompt
//!   cache on): `prefix + warm` runs first (its snapshots hold the prefix),
//!   then the first half of the questions one at a time after the prefix
//!   (`sequential_ttft_ms`), then the second half submitted at once
//!   (`concurrent_ttft_ms`, and `concurrent_total_ms`: first submit to the
//!   last first token); `cached_tokens` of each.
//!
//! Any scenario may set `"kv_paging": true` (and `"kv_block_size": N`).
//!
//! A warm-up request runs first (untimed). Every output also holds
//! `provenance` (bench/provenance.rs), and the engine's `spans` summary
//! (count, total and p95 ms per span kind) and `model_calls`.

use mlxrt::engine::{Engine, EngineConfig, Event, Input, RequestOptions, SpanKind, Usage};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[path = "provenance.rs"]
mod provenance;

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("id list").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

/// Submits a request; its usage arrives on `tx` tagged with `i`.
fn submit(e: &Engine, i: usize, prompt: Vec<u32>, max_tokens: u32, tx: &mpsc::Sender<(usize, Usage)>) {
    let mut o = RequestOptions::new(Input::Tokens(prompt));
    o.max_tokens = max_tokens;
    o.stop_at_eos = false;
    let tx = tx.clone();
    e.submit(o, Box::new(move |ev: &Event| match ev {
        Event::Done { usage, .. } => {
            let _ = tx.send((i, usage.clone()));
        }
        Event::Error(err) => panic!("request {i} failed: {err}"),
        _ => {}
    }))
    .expect("submit");
}

/// Runs `prompts` at once; their usages in order.
fn run_all(e: &Engine, prompts: &[Vec<u32>], max_tokens: u32) -> Vec<Usage> {
    let (tx, rx) = mpsc::channel();
    for (i, p) in prompts.iter().enumerate() {
        submit(e, i, p.clone(), max_tokens, &tx);
    }
    let mut out = vec![Usage::default(); prompts.len()];
    for _ in prompts {
        let (i, u) = rx.recv().expect("a terminal event");
        out[i] = u;
    }
    out
}

/// `f` while a thread samples the engine's KV bytes; returns its result and
/// the peak.
fn peak_kv<T>(e: &Engine, f: impl FnOnce() -> T) -> (T, usize) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut peak = 0;
            while !stop.load(Ordering::Relaxed) {
                peak = peak.max(e.stats().kv_bytes);
                std::thread::sleep(Duration::from_millis(1));
            }
            peak.max(e.stats().kv_bytes)
        });
        let out = f();
        stop.store(true, Ordering::Relaxed);
        (out, sampler.join().expect("sampler"))
    })
}

fn shared_prefix(e: &Engine, s: &Value) -> Value {
    let prompts: Vec<Vec<u32>> = s["prompts"].as_array().unwrap().iter().map(ids).collect();
    let max_tokens = s["max_tokens"].as_u64().unwrap() as u32;
    let (_, private) = peak_kv(e, || run_all(e, &prompts[..1], max_tokens));
    let t0 = Instant::now();
    let (usages, peak) = peak_kv(e, || run_all(e, &prompts, max_tokens));
    let wall = t0.elapsed().as_secs_f64();
    let total: u32 = usages.iter().map(|u| u.completion_tokens).sum();
    json!({
        "private_kv_bytes": private, "kv_peak_bytes": peak, "requests": prompts.len(),
        "wall_s": wall, "output_tokens": total, "throughput_tps": total as f64 / wall,
        "ttft_ms": usages.iter().map(|u| u.ttft_ms).collect::<Vec<_>>(),
    })
}

fn cohort_hit(e: &Engine, s: &Value) -> Value {
    let prefix = ids(&s["prefix"]);
    let with = |q: Vec<u32>| prefix.iter().copied().chain(q).collect::<Vec<u32>>();
    let questions: Vec<Vec<u32>> = s["questions"].as_array().unwrap().iter().map(|q| with(ids(q))).collect();
    let max_tokens = s["max_tokens"].as_u64().unwrap() as u32;
    run_all(e, &[with(ids(&s["warm"]))], max_tokens);
    let (seq, conc) = questions.split_at(questions.len() / 2);
    let sequential: Vec<Usage> = seq.iter().map(|q| run_all(e, std::slice::from_ref(q), max_tokens).remove(0)).collect();
    let concurrent = run_all(e, conc, max_tokens);
    let ttft = |u: &[Usage]| u.iter().map(|u| u.ttft_ms).collect::<Vec<_>>();
    let cached = |u: &[Usage]| u.iter().map(|u| u.cached_tokens).collect::<Vec<_>>();
    // TTFT counts from each request's submission; they were submitted
    // together, so the last first token is the largest.
    let total = concurrent.iter().map(|u| u.ttft_ms).fold(0.0, f64::max);
    json!({
        "sequential_ttft_ms": ttft(&sequential), "sequential_total_ms": sequential.iter().map(|u| u.ttft_ms).sum::<f64>(),
        "concurrent_ttft_ms": ttft(&concurrent), "concurrent_total_ms": total,
        "sequential_cached_tokens": cached(&sequential), "concurrent_cached_tokens": cached(&concurrent),
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: {} MODEL SCENARIO_JSON", args[0]);
        std::process::exit(2);
    }
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&args[2]).unwrap()).unwrap();
    let mode = s["mode"].as_str().unwrap_or_default().to_string();
    let mut cfg = EngineConfig::new(&args[1]);
    cfg.kernels = provenance::kernels();
    if mode == "shared_prefix" {
        cfg.prompt_cache_bytes = 0;
    }
    if let Some(r) = s.get("max_rows").and_then(Value::as_u64) {
        cfg.max_rows = r as usize;
    }
    // Paged KV (off unless the scenario says so).
    cfg.kv_paging = s.get("kv_paging").and_then(Value::as_bool).unwrap_or(false);
    if let Some(b) = s.get("kv_block_size").and_then(Value::as_u64) {
        cfg.kv_block_size = b as usize;
    }
    let e = Engine::new(cfg).expect("load");
    run_all(&e, &[(100..132).collect()], 4); // warm-up (too short to be cached)
    let mut out = match mode.as_str() {
        "shared_prefix" => shared_prefix(&e, &s),
        "cohort_hit" => cohort_hit(&e, &s),
        other => panic!("unknown mode {other:?}"),
    };
    let st = e.stats();
    out["model_calls"] = st.model_calls.into();
    out["spans"] = SpanKind::ALL
        .iter()
        .map(|&k| {
            let x = st.spans[k as usize];
            (k.name().to_string(), json!({"count": x.count, "total_ms": x.total_ms, "p95_ms": x.p95_ms}))
        })
        .collect::<serde_json::Map<_, _>>()
        .into();
    out["provenance"] = provenance::json(provenance::kernels());
    println!("{out}");
}
