//! Affine-quantized KV (issue 11) against Python mlx-lm's `kv_bits`, and
//! batch invariance of the delayed start (`quantized_kv_start`).
//!
//! mlx-lm converts a layer's cache to `QuantizedKVCache` after the forward
//! pass that brings it to `quantized_kv_start` positions; mlxrt switches a
//! row to quantized KV for a forward starting at or past its start. With a
//! start that is a multiple of the prefill chunk (the same chunk on both
//! sides) the two agree exactly: with MLX's stock kernels mlxrt runs mlx-lm's
//! ops in mlx-lm's order (dense projections unstacked), and mlx-lm runs on
//! mlxrt's BLAS (`common::py`), so greedy tokens and logits are
//! bit-identical (Gemma 3: tokens only, see `tiny_gemma3_matches_mlx_lm`).
//! On the wheel's reference BLAS instead, mlx-lm's float attention rounds
//! ~1e-7 differently, 4-bit quantization turns that into whole levels of
//! some K/V elements, and 5 of 8 SmolLM2 (prompt, start) pairs diverged
//! after 2 to 26 tokens.
//!
//! Needs the venv (.venv, scripts/setup.sh) and the default model
//! (scripts/fetch-model.sh); references are cached under target/oracle/kv.

mod common;

use common::*;
use mlxrt::cache::scheme::{KvFloat, KvQuant, KvScheme};
use mlxrt::cache::{KvCache, LayerCache};
use mlxrt::engine::{Engine, EngineConfig, Event, RequestOptions};
use mlxrt::model::{load, Kernels, LoadOptions, LoadedModel};
use std::path::{Path, PathBuf};

const STEPS: usize = 32;
const LOGIT_STEPS: &str = "0,1,8,31";
/// Prefill chunk on both sides; every start below is a multiple of it.
const CHUNK: usize = 16;

/// Max |Δ logits| for the tiny Gemma 3 (see `tiny_gemma3_matches_mlx_lm`).
const GEMMA3_TOL: f32 = 3e-2;

/// Tests run in parallel: one builds a model folder or reference file while
/// no other reads or writes it.
static ORACLE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The MLX folder of `model` ("smollm2": the default GGUF converted; else a
/// tiny preset of tests/oracle/make_tiny.py), built once.
fn folder(model: &str) -> PathBuf {
    let _one_writer = ORACLE.lock().unwrap_or_else(|e| e.into_inner());
    let scripts = repo_root().join("tests/oracle");
    let dir = repo_root().join("target/oracle/kv");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(model);
    let script = if model == "smollm2" { "gguf_to_mlx.py" } else { "make_tiny.py" };
    if !newer_than(&out.join("config.json"), &[scripts.join(script)]) {
        let _ = std::fs::remove_dir_all(&out);
        if model == "smollm2" {
            py(&[scripts.join(script).to_str().unwrap(), model_path().to_str().unwrap(), out.to_str().unwrap()]);
        } else {
            make_tiny(model, &out, &[]);
        }
    }
    out
}

/// mlx-lm's greedy tokens and logits for tests/oracle/family_prompts.json
/// with `kv_bits = bits`, `kv_group_size = 64`, `quantized_kv_start =
/// start` and prefill step `CHUNK`; cached per setting.
fn reference(model: &str, bits: i32, start: i32) -> Vec<Case> {
    let folder = folder(model);
    let _one_writer = ORACLE.lock().unwrap_or_else(|e| e.into_inner());
    let scripts = repo_root().join("tests/oracle");
    // Gemma's sliding-window layers stay float on both sides (mlx-lm cannot
    // quantize its rotating cache).
    let sliding = model.starts_with("gemma");
    let norot = if sliding { "-norot" } else { "" };
    let out = repo_root().join(format!("target/oracle/kv/{model}-kvb{bits}-g64-s{start}-p{CHUNK}{norot}.safetensors"));
    let prompts = scripts.join("family_prompts.json");
    if !reference_fresh(&out, &[scripts.join("mlxlm_reference.py"), prompts.clone(), folder.join("config.json")]) {
        let (chunk, bits, start) = (CHUNK.to_string(), bits.to_string(), start.to_string());
        let mut args = vec!["--prefill-step-size", &chunk, "--kv-bits", &bits, "--kv-group-size", "64", "--quantized-kv-start", &start];
        if sliding {
            args.push("--no-rotating-quant");
        }
        mlxlm_reference(&folder, &prompts, STEPS, LOGIT_STEPS, &out, &args);
    }
    reference_cases(&out)
}

fn affine(bits: i32) -> KvScheme {
    KvScheme::Affine { bits, group_size: 64 }
}

/// A one-row cache with the full-attention layers quantized from `start`.
fn quantized_cache(m: &LoadedModel, bits: i32, start: i32) -> Vec<LayerCache> {
    let mut cache = m.model.new_cache(1);
    for (c, l) in cache.iter_mut().zip(m.model.kv_layers()) {
        if l.is_some_and(|l| l.window.is_none()) {
            let mut kv = KvCache::with_scheme(1, affine(bits)).unwrap();
            kv.set_starts(&[start]);
            *c = LayerCache::Kv(kv);
        }
    }
    cache
}

fn request(prompt: &[u32], start: Option<i32>, chunk: Option<usize>) -> RequestOptions {
    let mut o = token_request(prompt, STEPS, chunk);
    o.quantized_kv_start = start;
    o
}

fn quant_engine(model: &Path, bits: i32, start: i32, max_rows: usize) -> Engine {
    let mut cfg = EngineConfig::new(model);
    cfg.max_rows = max_rows;
    cfg.prefill_chunk = CHUNK;
    cfg.prompt_cache_bytes = 0;
    cfg.kv = KvQuant { scheme: affine(bits), start, ..KvQuant::default() };
    cfg.kernels = Kernels::Stock;
    Engine::new(cfg).unwrap()
}

/// Model API and engine (stock kernels) against mlx-lm for each (bits,
/// start): returns,
/// per setting and prompt, the first step whose token differs from mlx-lm's
/// (None: all identical) and the max |Δ logits| at the logit steps before it.
fn parity(model: &str, folder: &Path, settings: &[(i32, i32)]) -> Vec<(String, Option<usize>, f32)> {
    let m = load(folder, &LoadOptions { kernels: Kernels::Stock, ..LoadOptions::default() }).unwrap();
    let mut out = vec![];
    for &(bits, start) in settings {
        let cases = reference(model, bits, start);
        let e = quant_engine(folder, bits, start, 1);
        for c in &cases {
            let label = format!("{model} kv_bits {bits} start {start}/{}", c.name);
            let cache = quantized_cache(&m, bits, start);
            let (tokens, logits) = greedy(&m, cache, &c.prompt, CHUNK, STEPS, &c.logit_steps);
            let diverge = tokens.iter().zip(&c.tokens).position(|(a, b)| a != b);
            let before = |s: usize| diverge.is_none_or(|d| s <= d);
            let worst = c
                .logit_steps
                .iter()
                .enumerate()
                .filter(|(_, &s)| before(s))
                .map(|(i, _)| max_abs_diff(&logits[i], &c.logits[i]))
                .fold(0f32, f32::max);
            match diverge {
                None => eprintln!("{label}: all {STEPS} tokens identical to mlx-lm; max |Δ logits| {worst:.2e}"),
                Some(d) => eprintln!("{label}: first token differing from mlx-lm at step {d}; max |Δ logits| before {worst:.2e}"),
            }
            // The engine (its batching, prefill and decode loop) gives the
            // model API's tokens.
            let got = tokens_of(&run(&e, request(&c.prompt, None, None)));
            assert_eq!(got, tokens, "{label}: engine tokens differ from the model API's");
            out.push((label, diverge, worst));
        }
    }
    out
}

/// [`parity`], asserting that every (setting, prompt) pair gives mlx-lm's
/// greedy tokens and logits within `tol` (0: bit-identical).
fn matches(model: &str, settings: &[(i32, i32)], tol: f32) {
    let results = parity(model, &folder(model), settings);
    let exact = results.iter().filter(|r| r.1.is_none() && r.2 == 0.0).count();
    eprintln!("{model}: {exact} of {} (setting, prompt) pairs give mlx-lm's {STEPS} tokens and logits exactly", results.len());
    for (label, diverge, worst) in &results {
        assert_eq!(*diverge, None, "{label}: greedy tokens differ from mlx-lm");
        assert!(*worst <= tol, "{label}: max |Δ logits| {worst} > {tol}");
    }
}

#[test]
fn smollm2_matches_mlx_lm() {
    // The default model (its MLX conversion), 30 layers: start 16 converts
    // during prefill, 48 during decode for the short prompts.
    matches("smollm2", &[(4, 16), (8, 16), (4, 48)], 0.0);
}

#[test]
fn tiny_llama_matches_mlx_lm() {
    matches("llama_kv", &[(4, 16), (8, 32)], 0.0);
}

#[test]
fn tiny_qwen3_matches_mlx_lm() {
    matches("qwen3_kv", &[(4, 32), (8, 16)], 0.0);
}

#[test]
fn tiny_gemma3_matches_mlx_lm() {
    // Full-attention layers quantized, sliding-window layers (window 16)
    // float, on both sides; prompts up to 90 tokens: several windows.
    // Tokens identical; logits not bit-identical: Gemma 3's float forward
    // already differs from mlx-lm's before any quantized KV or ring wrap
    // (ids_short, step 0: 1.0e-5); the op is not isolated yet (not its GELU,
    // which matches mlx-lm's compiled one exactly). On an AVX-512 EPYC the
    // first decode step after ids_long's prefill (90 tokens, past the
    // window) differs by 1.9e-2 at 8 bits for every start up to 48 (not at
    // 80, nor at 4 bits: ≤ 1.5e-4), the later steps by ≤ 1.9e-5; also at
    // commits before the paged and mixed work; cause not found yet.
    matches("gemma3_kv", &[(4, 16), (8, 32)], GEMMA3_TOL);
}

/// Submits the first (prompt, start), waits until it runs (prefills), then
/// the others, so that they join its prefill cohort or the decode batch;
/// returns each one's tokens.
fn batched(e: &Engine, rows: &[(Vec<u32>, i32)], chunk: Option<usize>) -> Vec<Vec<u32>> {
    let submit = |(p, s): &(Vec<u32>, i32)| submit(e, request(p, Some(*s), chunk));
    let mut rxs = vec![submit(&rows[0])];
    while e.stats().active == 0 {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    rxs.extend(rows[1..].iter().map(submit));
    rxs.iter().map(|rx| tokens_of(&collect(rx))).collect()
}

#[test]
fn batched_rows_convert_as_alone() {
    // Rows of lengths 3..90 with different starts (0, during prefill, past
    // the prompt: converting during decode), batched with chunks that do not
    // divide the starts, the others arriving once the longest row runs (with
    // chunk 5 they join its prefill cohort midway): each row's tokens are
    // those it gets alone.
    let f = folder("llama_kv");
    let cases = reference("llama_kv", 4, 16);
    let mut prompts: Vec<Vec<u32>> = cases.iter().map(|c| c.prompt.clone()).collect();
    prompts.sort_by_key(|p| std::cmp::Reverse(p.len()));
    prompts.push(prompts[0][..37].to_vec());
    let starts = [24, 0, 33, 16, 7];
    let rows: Vec<(Vec<u32>, i32)> = prompts.iter().cloned().zip(starts.iter().cycle().copied()).collect();
    let alone_engine = quant_engine(&f, 4, 0, 1);
    let alone: Vec<Vec<u32>> =
        rows.iter().map(|(p, s)| tokens_of(&run(&alone_engine, request(p, Some(*s), None)))).collect();
    drop(alone_engine);
    let e = quant_engine(&f, 4, 0, 8);
    for chunk in [None, Some(5), Some(16)] {
        for (i, got) in batched(&e, &rows, chunk).iter().enumerate() {
            let (p, s) = (&rows[i].0, rows[i].1);
            assert_eq!(got, &alone[i], "row {i} ({} tokens, start {s}), chunk {chunk:?}: batched differs from alone", p.len());
        }
    }
    let stats = wait_idle(&e);
    assert_eq!(stats.kv_bytes, 0, "no KV held once idle");
    eprintln!("{} rows, starts {starts:?}, chunks None/5/16: batched tokens identical to alone", rows.len());
}

#[test]
fn quantized_kv_admits_more_rows() {
    // Admission counts the scheme's bytes: at 4 bits (g64, f32 scales) a
    // position costs 0.15625 of f32, so a kv_budget that holds 1.5 dense
    // rows runs several quantized rows at once.
    let f = folder("llama_kv");
    let prompt: Vec<u32> = (0..100).map(|i| 100 + i).collect();
    let engine = |scheme: KvScheme, budget: usize| {
        let mut cfg = EngineConfig::new(&f);
        cfg.kv = KvQuant { scheme, start: 0, ..KvQuant::default() };
        cfg.kv_budget = budget;
        cfg.max_rows = 8;
        cfg.prompt_cache_bytes = 0;
        Engine::new(cfg).unwrap()
    };
    let layers = engine(KvScheme::Dense, 1 << 40).info().kv_layers.clone();
    let need = |scheme: KvScheme| layers.iter().flatten().map(|l| scheme.bytes(l, prompt.len() + STEPS, 0)).sum::<usize>();
    let dense = need(KvScheme::Dense);
    assert_eq!(need(affine(4)) * 64, dense * 10);
    assert_eq!(need(affine(8)) * 64, dense * 18);
    let too_small = engine(KvScheme::Dense, dense - 1);
    let err = too_small.prepare(request(&prompt, None, None)).err().expect("a dense row does not fit");
    assert!(err.to_string().contains("kv_budget"), "{err}");
    let e = engine(affine(4), dense * 3 / 2);
    let rxs: Vec<_> = (0..6).map(|_| submit(&e, request(&prompt, None, None))).collect();
    let mut peak = 0;
    while e.stats().completed < 6 {
        peak = peak.max(e.stats().active);
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    for rx in &rxs {
        assert!(matches!(collect(rx).last(), Some(Event::Done { .. })));
    }
    assert!(peak >= 6, "a budget of 1.5 dense rows ran only {peak} 4-bit rows at once (of 6; 9 fit)");
    eprintln!("kv_budget of 1.5 dense rows: {peak} rows of 4-bit KV at once");
}

#[test]
fn engine_reports_the_scheme_and_refuses_bad_settings() {
    let f = folder("llama_kv");
    let e = quant_engine(&f, 4, 0, 1);
    assert_eq!(e.info().kv_scheme, "affine:b4:g64");
    let ev = run(&e, request(&[100, 200, 300, 400], None, None));
    assert!(matches!(ev.last(), Some(Event::Done { .. })));
    let s = wait_idle(&e);
    assert_eq!(s.kv_bytes, s.kv_bytes_dense + s.kv_bytes_quantized);
    drop(e);
    for (scheme, what) in [
        (KvScheme::Affine { bits: 4, group_size: 256 }, "kv_group_size"),
        (KvScheme::Affine { bits: 7, group_size: 64 }, "kv_bits"),
        (KvScheme::TurboQuant { key_bits: 8, value_bits: 5 }, "turboquant value bits"),
    ] {
        let mut cfg = EngineConfig::new(&f);
        cfg.kv = KvQuant { scheme, start: 0, ..KvQuant::default() };
        let err = Engine::new(cfg).err().expect("refused");
        assert!(err.to_string().contains(what), "{err}");
    }
}

#[test]
fn f16_kv_halves_the_cache_and_keeps_smollm2_greedy_tokens() {
    // `KvFloat::F16` (MLXRT_KV_SCHEME_F16): attention widens each stored key
    // and value exactly, so only their rounding to f16 differs from the
    // default f32 cache. On the default model the greedy tokens stay the
    // same (mlxrt's fused kernels and MLX's stock path alike), and the cache
    // holds half the bytes.
    let engine = |float: KvFloat, kernels: Kernels| {
        let mut cfg = EngineConfig::new(model_path());
        cfg.kv = KvQuant { float, ..KvQuant::default() };
        cfg.kernels = kernels;
        cfg.prompt_cache_bytes = 0;
        Engine::new(cfg).unwrap()
    };
    let long = "Write a short story about a lighthouse keeper who finds a message in a bottle. ".repeat(12);
    let prompts = ["What is the capital of France?", "Name three colors of the rainbow.", long.as_str()];
    // Greedy tokens and the most KV bytes seen while each request ran.
    let go = |e: &Engine| -> Vec<(Vec<u32>, usize)> {
        let one = |p: &&str| {
            let mut o = chat(p);
            o.max_tokens = 48;
            o.stop_at_eos = false;
            let rx = submit(e, o);
            let mut most = 0;
            let events = collect_polling(&rx, std::time::Duration::from_millis(1), || most = most.max(e.stats().kv_bytes_dense));
            assert!(matches!(events.last(), Some(Event::Done { .. })), "{events:?}");
            (tokens_of(&events), most)
        };
        prompts.iter().map(one).collect()
    };
    let f16 = engine(KvFloat::F16, Kernels::Auto);
    assert_eq!(f16.info().kv_scheme, "f16");
    let (a, b) = (go(&f16), go(&engine(KvFloat::Compute, Kernels::Auto)));
    for (i, ((ta, ka), (tb, kb))) in a.iter().zip(&b).enumerate() {
        assert_eq!(ta, tb, "prompt {i}: f16 KV changed the greedy tokens");
        assert!(*ka > 0 && *kb > 0, "prompt {i}: no KV bytes seen ({ka}, {kb})");
        let ratio = *ka as f64 / *kb as f64;
        assert!((0.45..=0.55).contains(&ratio), "prompt {i}: f16 KV holds {ka} bytes against {kb} of f32");
    }
    let stock = go(&engine(KvFloat::F16, Kernels::Stock));
    assert_eq!(stock.iter().map(|s| &s.0).collect::<Vec<_>>(), a.iter().map(|s| &s.0).collect::<Vec<_>>());

    // The prompt cache keeps f16 planes and restores them as such.
    let mut cfg = EngineConfig::new(model_path());
    cfg.kv = KvQuant { float: KvFloat::F16, ..KvQuant::default() };
    let cached = Engine::new(cfg).unwrap();
    let again = || {
        let mut o = chat(&long);
        o.max_tokens = 48;
        o.stop_at_eos = false;
        tokens_and_cached(&cached, o)
    };
    let ((first, cold), (second, warm)) = (again(), again());
    assert_eq!((&first, cold), (&a[2].0, 0));
    assert!(warm > 0 && second == first, "restored f16 KV: {warm} cached tokens, same tokens: {}", second == first);

    // Dense only, and not paged.
    let mut cfg = EngineConfig::new(model_path());
    cfg.kv = KvQuant { scheme: affine(8), float: KvFloat::F16, start: 0 };
    let err = Engine::new(cfg).err().expect("f16 with a quantized scheme is refused");
    assert!(err.to_string().contains("f16"), "{err}");
    let mut cfg = EngineConfig::new(model_path());
    cfg.kv = KvQuant { float: KvFloat::F16, ..KvQuant::default() };
    cfg.kv_paging = true;
    let err = Engine::new(cfg).err().expect("f16 with kv_paging is refused");
    assert!(err.to_string().contains("kv_paging"), "{err}");
}
