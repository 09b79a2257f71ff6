//! Structured output: the cost of constraining (mlxrt only; mlx-lm has no
//! grammar-constrained decoding). `scripts/bench.sh structured` runs it.
//!
//!   mlxrt_structured MODEL [--rounds N] [--max-tokens N] [--out FILE] [--kernels auto|stock|int8]
//!
//! The prompts are the 30 schema cases of tests/fixtures/schemas (a chat
//! request each, greedy). A constrained run submits all 30 at once, each
//! with its `response_format`, and validates every output with the
//! `jsonschema` crate. Its free twin submits the same 30 chats without a
//! constraint, `ignore_eos`, and `max_tokens` = the tokens the constrained
//! request generated (in the warm-up), so both runs decode the same number
//! of tokens per row and the batch shrinks the same way. Throughput (`tps`)
//! = output tokens / engine time (from the last submit's return to the last
//! terminal event; prefill included); `wall_tps` also counts the submits,
//! where the constrained run compiles its schemas on the caller's thread.
//! Runs alternate ABBA after a warm-up of both (4 rounds unless told: a
//! run lasts ~4 s, and one slow round moves a 2-round median by 10%);
//! figures are medians.
//!
//! Writes `structured_overhead_ratio` (constrained tok/s ÷ free tok/s;
//! `structured_overhead_ratio_with_compile` from `wall_tps`),
//! `structured_valid_fraction` (valid and complete outputs / all, over every
//! constrained run), per-run figures, the engine's span summaries for a
//! constrained and a free run (the `sample` span holds the mask work:
//! matcher advance + mask computation + the masked draw), and `provenance`.

use mlxrt::engine::{Engine, EngineConfig, Event, FinishReason, Input, RequestOptions, SpanKind};
use serde_json::{json, Value};
use std::sync::mpsc;
use std::time::Instant;

#[path = "provenance.rs"]
mod provenance;

struct Case {
    name: String,
    prompt: String,
    schema: Value,
}

fn cases() -> Vec<Case> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schemas");
    let mut files: Vec<_> = std::fs::read_dir(&dir).expect("tests/fixtures/schemas").map(|e| e.unwrap().path()).collect();
    files.sort();
    files
        .iter()
        .map(|p| {
            let v: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
            Case {
                name: p.file_stem().unwrap().to_string_lossy().into_owned(),
                prompt: v["prompt"].as_str().unwrap().to_owned(),
                schema: v["schema"].clone(),
            }
        })
        .collect()
}

fn request(c: &Case, max_tokens: u32, constrained: bool) -> RequestOptions {
    let user = format!("{} Reply in JSON.", c.prompt);
    let mut o = RequestOptions::new(Input::Messages(json!([{"role": "user", "content": user}])));
    o.max_tokens = max_tokens;
    if constrained {
        let f = json!({"response_format": {"type": "json_schema", "json_schema": {"name": c.name, "schema": c.schema}}});
        o.apply_json(&f.to_string()).expect("response_format");
    } else {
        o.stop_at_eos = false;
    }
    o
}

struct Run {
    /// First submit to last terminal event.
    wall_s: f64,
    /// Spent in the submit calls (constrained: compiling the schemas on the
    /// caller's thread, while the engine already runs the earlier requests).
    submit_s: f64,
    tokens: Vec<u32>,
    texts: Vec<String>,
    finish: Vec<FinishReason>,
}

/// Submits every request at once and waits for all.
fn run_all(e: &Engine, reqs: Vec<RequestOptions>) -> Run {
    let n = reqs.len();
    let (tx, rx) = mpsc::channel();
    let t0 = Instant::now();
    for (i, o) in reqs.into_iter().enumerate() {
        let tx = tx.clone();
        let mut text = String::new();
        e.submit(o, Box::new(move |ev: &Event| match ev {
            Event::Delta { text: t, .. } => text.push_str(t),
            Event::Done { finish, usage, .. } => {
                let _ = tx.send((i, std::mem::take(&mut text), *finish, usage.completion_tokens));
            }
            Event::Error(err) => panic!("request {i} failed: {err}"),
            _ => {}
        }))
        .expect("submit");
    }
    let submit_s = t0.elapsed().as_secs_f64();
    let mut run = Run { wall_s: 0.0, submit_s, tokens: vec![0; n], texts: vec![String::new(); n], finish: vec![FinishReason::Stop; n] };
    for _ in 0..n {
        let (i, text, finish, tokens) = rx.recv().expect("a terminal event");
        (run.texts[i], run.finish[i], run.tokens[i]) = (text, finish, tokens);
    }
    run.wall_s = t0.elapsed().as_secs_f64();
    run
}

/// Output tokens per second of engine time: from the last submit's return
/// to the last terminal event.
fn tps(r: &Run) -> f64 {
    r.tokens.iter().sum::<u32>() as f64 / (r.wall_s - r.submit_s)
}

/// The same over the whole wall time, submits (and so compiles) included.
fn wall_tps(r: &Run) -> f64 {
    r.tokens.iter().sum::<u32>() as f64 / r.wall_s
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The engine's span summary accumulated since `before`.
fn spans_since(e: &Engine, before: &mlxrt::engine::EngineStats) -> Value {
    let now = e.stats();
    SpanKind::ALL
        .iter()
        .map(|&k| {
            let (a, b) = (now.spans[k as usize], before.spans[k as usize]);
            (k.name().to_string(), json!({"count": a.count - b.count, "total_ms": a.total_ms - b.total_ms}))
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (mut rounds, mut max_tokens, mut out) = (4usize, 96u32, "bench/results/structured.json".to_string());
    let mut it = args.iter().skip(2);
    while let Some(a) = it.next() {
        let mut val = || it.next().expect("a value").clone();
        match a.as_str() {
            "--rounds" => rounds = val().parse().expect("--rounds N"),
            "--max-tokens" => max_tokens = val().parse().expect("--max-tokens N"),
            "--out" => out = val(),
            // As the other benchmarks: the driver's choice goes through the environment.
            "--kernels" => std::env::set_var("MLXRT_BENCH_KERNELS", val()),
            _ => {
                eprintln!("usage: {} MODEL [--rounds N] [--max-tokens N] [--out FILE] [--kernels K]", args[0]);
                std::process::exit(2);
            }
        }
    }
    let Some(model) = args.get(1) else {
        eprintln!("usage: {} MODEL [--rounds N] [--max-tokens N] [--out FILE]", args[0]);
        std::process::exit(2);
    };
    let kernels = provenance::kernels();
    let mut cfg = EngineConfig::new(model);
    cfg.kernels = kernels;
    cfg.prompt_cache_bytes = 0; // both runs prefill every prompt
    let e = Engine::new(cfg).expect("engine");
    let cases = cases();
    let validators: Vec<_> = cases.iter().map(|c| jsonschema::validator_for(&c.schema).expect("schema")).collect();

    let constrained = |e: &Engine| run_all(e, cases.iter().map(|c| request(c, max_tokens, true)).collect());
    let free = |e: &Engine, counts: &[u32]| run_all(e, cases.iter().zip(counts).map(|(c, &n)| request(c, n.max(1), false)).collect());

    // Warm-up (untimed): both kinds once. Greedy decoding is batch-invariant,
    // so every constrained run generates the warm-up's token counts, which
    // the free runs then use.
    let warm = constrained(&e);
    let counts = warm.tokens.clone();
    free(&e, &counts);

    let (mut c_tps, mut f_tps, mut runs) = (vec![], vec![], vec![]);
    let (mut c_wall, mut f_wall) = (vec![], vec![]);
    let (mut valid, mut total) = (0usize, 0usize);
    let (mut c_spans, mut f_spans) = (Value::Null, Value::Null);
    for round in 0..rounds {
        // ABBA: constrained first in even rounds, free first in odd ones.
        let (c, f) = if round % 2 == 0 {
            let before = e.stats();
            let c = constrained(&e);
            c_spans = spans_since(&e, &before);
            let before = e.stats();
            let f = free(&e, &counts);
            f_spans = spans_since(&e, &before);
            (c, f)
        } else {
            let f = free(&e, &counts);
            (constrained(&e), f)
        };
        for (i, text) in c.texts.iter().enumerate() {
            total += 1;
            let ok = c.finish[i] == FinishReason::Stop
                && serde_json::from_str::<Value>(text).is_ok_and(|d| validators[i].is_valid(&d));
            valid += ok as usize;
            if !ok {
                eprintln!("[structured] {}: invalid ({:?}): {text}", cases[i].name, c.finish[i]);
            }
        }
        if c.tokens != counts {
            eprintln!("[structured] round {round}: token counts differ from the warm-up's: {:?} vs {counts:?}", c.tokens);
        }
        eprintln!("[structured] round {round}: constrained {:.1} tok/s, free {:.1} tok/s", tps(&c), tps(&f));
        c_tps.push(tps(&c));
        f_tps.push(tps(&f));
        c_wall.push(wall_tps(&c));
        f_wall.push(wall_tps(&f));
        runs.push((c, f));
    }
    let mut reference = provenance::json(kernels);
    reference["side"] = json!("mlxrt free (the same engine and process, no response_format)");
    let per_run = |r: &Run| {
        json!({"wall_s": r.wall_s, "submit_s": r.submit_s, "output_tokens": r.tokens.iter().sum::<u32>(), "tps": tps(r), "wall_tps": wall_tps(r)})
    };
    let result = json!({
        "benchmark": "structured",
        "model": model,
        "requests": cases.len(),
        "max_tokens": max_tokens,
        "rounds": rounds,
        "structured_overhead_ratio": median(c_tps.clone()) / median(f_tps.clone()),
        "structured_valid_fraction": valid as f64 / total as f64,
        "structured_overhead_ratio_with_compile": median(c_wall.clone()) / median(f_wall.clone()),
        "constrained_tps_median": median(c_tps),
        "free_tps_median": median(f_tps),
        "constrained_wall_tps_median": median(c_wall),
        "free_wall_tps_median": median(f_wall),
        "runs": runs.iter().map(|(c, f)| json!({"constrained": per_run(c), "free": per_run(f)})).collect::<Vec<_>>(),
        "constrained_tokens_per_request": counts,
        "spans_constrained_run": c_spans,
        "spans_free_run": f_spans,
        "note": "30 concurrent chat requests (tests/fixtures/schemas), greedy; free twin: ignore_eos, max_tokens = the tokens its constrained twin generated; tps = output tokens / engine time (last submit returned -> last terminal event, prefill included), wall_tps = the same over first submit -> last event (schema compiles at submit included); medians of ABBA rounds",
        // Both sides are this engine: constrained, and free as the reference.
        "provenance": {"mlxrt": provenance::json(kernels), "reference": reference},
    });
    std::fs::write(&out, serde_json::to_string_pretty(&result).unwrap() + "\n").expect("write results");
    println!("{}", serde_json::to_string_pretty(&result).unwrap());
}
