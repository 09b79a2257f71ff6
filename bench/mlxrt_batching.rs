//! The mlxrt side of bench/batching.py: runs one scenario (a JSON file) on
//! the engine and prints one JSON line with raw timings.
//!
//!   MLXRT_BENCH_KERNELS=auto|stock mlxrt_batching MODEL SCENARIO_JSON
//!
//! Scenarios:
//! - `{"mode": "throughput", "prompts": [[ids], ...], "max_tokens": N}`: all
//!   prompts submitted at once (greedy, EOS ignored). Prints `wall_s`,
//!   `output_tokens`, `throughput_tps` (output tokens / wall time), per-request
//!   `ttft_ms`, and every inter-token gap `itl_ms`.
//! - `{"mode": "itl", "background": [[ids], ...], "background_max_tokens": N,
//!   "long_prompt": [ids], "arrive_after_tokens": K}`: the background
//!   requests decode; once each has K tokens the long prompt is submitted.
//!   Prints the background rows' inter-token gaps before it arrived
//!   (`itl_unloaded_ms`) and while it was prefilling (`itl_during_long_ms`),
//!   and the long prompt's `long_ttft_ms`.
//!
//! A warm-up request runs first (untimed). Every output also holds
//! `provenance` (bench/provenance.rs).

use mlxrt::engine::{Engine, EngineConfig, Event, Input, RequestOptions};
use serde_json::{json, Value};
use std::sync::mpsc;

#[path = "provenance.rs"]
mod provenance;
use std::time::Instant;

/// (request index, event, arrival time)
type Msg = (usize, Event, Instant);

fn submit(e: &Engine, i: usize, ids: Vec<u32>, max_tokens: u32, tx: &mpsc::Sender<Msg>) {
    let mut o = RequestOptions::new(Input::Tokens(ids));
    o.max_tokens = max_tokens;
    o.stop_at_eos = false;
    let tx = tx.clone();
    e.submit(o, Box::new(move |ev: &Event| {
        let _ = tx.send((i, ev.clone(), Instant::now()));
    }))
    .expect("submit");
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("id list").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

fn ms(a: Instant, b: Instant) -> f64 {
    b.duration_since(a).as_secs_f64() * 1e3
}

/// Per request: token arrival times (one per token of each delta).
struct Trace {
    start: Instant,
    tokens: Vec<Vec<Instant>>,
    done: Vec<bool>,
}

impl Trace {
    fn new(n: usize) -> Trace {
        Trace { start: Instant::now(), tokens: vec![vec![]; n], done: vec![false; n] }
    }
    fn take(&mut self, (i, ev, t): Msg) {
        match ev {
            Event::Delta { tokens, .. } => self.tokens[i].extend(std::iter::repeat(t).take(tokens.len())),
            Event::Done { .. } => self.done[i] = true,
            Event::Error(e) => panic!("request {i} failed: {e}"),
            Event::ToolCall { .. } => {}
        }
    }
    fn finished(&self) -> bool {
        self.done.iter().all(|&d| d)
    }
    /// Gaps between consecutive distinct arrival times of request `i` that end
    /// in (`from`, `to`].
    fn gaps(&self, i: usize, from: Instant, to: Option<Instant>) -> Vec<f64> {
        self.tokens[i]
            .windows(2)
            .filter(|w| w[1] > w[0] && w[1] > from && to.is_none_or(|t| w[1] <= t))
            .map(|w| ms(w[0], w[1]))
            .collect()
    }
}

fn throughput(e: &Engine, s: &Value) -> Value {
    let prompts: Vec<Vec<u32>> = s["prompts"].as_array().unwrap().iter().map(ids).collect();
    let max_tokens = s["max_tokens"].as_u64().unwrap() as u32;
    let (tx, rx) = mpsc::channel();
    let mut tr = Trace::new(prompts.len());
    for (i, p) in prompts.into_iter().enumerate() {
        submit(e, i, p, max_tokens, &tx);
    }
    while !tr.finished() {
        tr.take(rx.recv().unwrap());
    }
    let end = tr.tokens.iter().filter_map(|t| t.last()).max().copied().unwrap_or(tr.start);
    let wall = end.duration_since(tr.start).as_secs_f64();
    let total: usize = tr.tokens.iter().map(Vec::len).sum();
    let ttft: Vec<f64> = tr.tokens.iter().map(|t| ms(tr.start, t[0])).collect();
    let itl: Vec<f64> = (0..tr.tokens.len()).flat_map(|i| tr.gaps(i, tr.start, None)).collect();
    json!({"wall_s": wall, "output_tokens": total, "throughput_tps": total as f64 / wall, "ttft_ms": ttft, "itl_ms": itl})
}

fn itl(e: &Engine, s: &Value) -> Value {
    let bg: Vec<Vec<u32>> = s["background"].as_array().unwrap().iter().map(ids).collect();
    let bg_max = s["background_max_tokens"].as_u64().unwrap() as u32;
    let long = ids(&s["long_prompt"]);
    let after = s["arrive_after_tokens"].as_u64().unwrap() as usize;
    let n = bg.len();
    let (tx, rx) = mpsc::channel();
    let mut tr = Trace::new(n + 1);
    for (i, p) in bg.into_iter().enumerate() {
        submit(e, i, p, bg_max, &tx);
    }
    tr.done[n] = true; // the long prompt is not in flight yet
    let mut arrived = None;
    while !tr.finished() {
        tr.take(rx.recv().unwrap());
        if arrived.is_none() && (0..n).all(|i| tr.tokens[i].len() >= after) {
            arrived = Some(Instant::now());
            tr.done[n] = false;
            submit(e, n, long.clone(), 1, &tx);
        }
    }
    let arrived = arrived.expect("background requests reached arrive_after_tokens");
    let first = tr.tokens[n][0];
    let before: Vec<f64> = (0..n).flat_map(|i| tr.gaps(i, tr.start, Some(arrived))).collect();
    let during: Vec<f64> = (0..n).flat_map(|i| tr.gaps(i, arrived, Some(first))).collect();
    json!({"itl_unloaded_ms": before, "itl_during_long_ms": during, "long_ttft_ms": ms(arrived, first)})
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: {} MODEL SCENARIO_JSON", args[0]);
        std::process::exit(2);
    }
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&args[2]).unwrap()).unwrap();
    let mut cfg = EngineConfig::new(&args[1]);
    cfg.kernels = provenance::kernels();
    cfg.kv = provenance::kv();
    if let Some(r) = s.get("max_rows").and_then(Value::as_u64) {
        cfg.max_rows = r as usize;
    }
    if let Some(b) = s.get("step_token_budget").and_then(Value::as_u64) {
        cfg.step_token_budget = b as usize;
    }
    let e = Engine::new(cfg).expect("load");
    let (tx, rx) = mpsc::channel();
    submit(&e, 0, (100..132).collect(), 8, &tx);
    let mut warm = Trace::new(1);
    while !warm.finished() {
        warm.take(rx.recv().unwrap());
    }
    let mut out = match s["mode"].as_str() {
        Some("throughput") => throughput(&e, &s),
        Some("itl") => itl(&e, &s),
        other => panic!("unknown mode {other:?}"),
    };
    out["mlx_peak_memory_bytes"] = json!(e.stats().peak_memory);
    out["provenance"] = provenance::json(provenance::kernels());
    println!("{out}");
}
