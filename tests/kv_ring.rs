//! Rotating KV caches for sliding-window layers (`RingCache`) against Python
//! mlx-lm, whose Gemma 3 and Gemma 4 keep `RotatingKVCache(max_size=window)`
//! for those layers. Tiny random-weight models (tests/oracle/make_tiny.py:
//! `gemma3_kv`, window 16; `gemma4_text`, window 8, KV-shared layers) get
//! prompts several windows long; mlx-lm's greedy tokens and last-position
//! logits (f32, max |Δ| ≤ 1e-3, the families' tolerance) must come out
//! whatever the prefill chunk (shorter than the window, longer than two
//! windows, whole), through the model API and through the engine with rows
//! of different lengths batched; a sliding layer's memory must stay flat
//! past the window; prompt-cache hits (memory and disk) must give the cold
//! result.

mod common;

use common::*;
use mlxrt::cache::LayerCache;
use mlxrt::engine::{Engine, EngineConfig, RequestOptions};
use mlxrt::mlx::Array;
use mlxrt::model::{load, LoadOptions, LoadedModel, Output};
use std::path::Path;
use std::time::Duration;

/// `gemma3_kv`'s sliding window.
const W: usize = RING_WINDOW;
const STEPS: usize = RING_STEPS;
const LOGIT_TOL: f32 = 1e-3;

/// Every prompt through the model API with each prefill chunk: mlx-lm's
/// tokens and logits.
fn check_model(label: &str, folder: &Path, cases: &[Case], window: usize) {
    let m = load(folder, &LoadOptions::default()).unwrap();
    let rings = m.model.new_cache(1).iter().filter(|c| c.ring().is_some_and(|r| r.window() == window as i32)).count();
    assert!(rings > 0, "{label}: no sliding layer keeps a ring of {window}");
    let mut worst = 0f32;
    for chunk in [5, 2 * window + 3, 4096] {
        for c in cases {
            let (tokens, logits) = greedy(&m, m.model.new_cache(1), &c.prompt, chunk, STEPS, &c.logit_steps);
            worst = worst.max(assert_matches(&format!("{label} chunk {chunk}"), c, &tokens, &logits, LOGIT_TOL));
        }
    }
    eprintln!("{label}: {} prompts × chunks 5, 2W+3, whole: tokens identical to mlx-lm; max |Δ logits| = {worst:.2e}", cases.len());
}

#[test]
fn gemma3_rotating_kv_matches_mlx_lm() {
    let (folder, reference) = ring_oracle("gemma3_kv");
    let cases = reference_cases(&reference);
    assert!(cases.iter().filter(|c| c.prompt.len() >= 3 * W).count() >= 3);
    check_model("gemma3_kv", &folder, &cases, W);
}

#[test]
fn gemma4_rotating_kv_with_shared_layers_matches_mlx_lm() {
    let (folder, reference) = ring_oracle("gemma4_text");
    check_model("gemma4_text", &folder, &reference_cases(&reference), 8);
}

/// KV bytes of the sliding layers, and of the others, after `n` tokens fed
/// `chunk` at a time.
fn kv_bytes(m: &LoadedModel, n: usize, chunk: usize) -> (usize, usize) {
    let mut cache = m.model.new_cache(1);
    let ids: Vec<i32> = (0..n as i32).map(|i| 100 + i * 37 % 30000).collect();
    for part in ids.chunks(chunk) {
        let x = Array::from_i32(part, &[1, part.len() as i32]).unwrap();
        m.model.forward(&x, &mut cache, Output::CacheOnly).unwrap();
        eval_cache(&cache);
    }
    let (rings, others): (Vec<&LayerCache>, Vec<&LayerCache>) = cache.iter().partition(|c| c.ring().is_some());
    (rings.iter().map(|c| c.nbytes()).sum(), others.iter().map(|c| c.nbytes()).sum())
}

#[test]
fn sliding_layer_memory_is_flat_past_the_window() {
    let (folder, _) = ring_oracle("gemma3_kv");
    let m = load(&folder, &LoadOptions::default()).unwrap();
    // 2 sliding layers × K and V × 2 heads × W positions × 64 dims × f32.
    let window_bytes = 2 * 2 * 2 * W * 64 * 4;
    for chunk in [1, 5, 2 * W + 3, 4096] {
        let (at_2w, _) = kv_bytes(&m, 2 * W, chunk);
        let (at_5w, _) = kv_bytes(&m, 5 * W, chunk);
        let (at_20w, full) = kv_bytes(&m, 20 * W, chunk);
        assert_eq!((at_2w, at_5w, at_20w), (window_bytes, window_bytes, window_bytes), "chunk {chunk}");
        assert!(full > window_bytes, "the global layers keep everything ({full} bytes)");
    }
}

/// Submits every case, the later ones while the first decode (they join a
/// running batch), and returns each one's tokens.
fn batched(e: &Engine, cases: &[Case], chunk: Option<usize>) -> Vec<Vec<u32>> {
    let rxs: Vec<_> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| {
            if i == 2 {
                std::thread::sleep(Duration::from_millis(30));
            }
            submit(e, token_request(&c.prompt, STEPS, chunk))
        })
        .collect();
    rxs.iter().map(|rx| tokens_of(&collect(rx))).collect()
}

#[test]
fn batched_rows_equal_each_row_alone() {
    let (folder, reference) = ring_oracle("gemma3_kv");
    let cases = reference_cases(&reference);
    let mut cfg = EngineConfig::new(&folder);
    cfg.max_rows = 8;
    let e = Engine::new(cfg).unwrap();
    let mut cfg = EngineConfig::new(&folder);
    cfg.max_rows = 1;
    let alone = Engine::new(cfg).unwrap();
    for chunk in [None, Some(5), Some(2 * W + 3)] {
        let got = batched(&e, &cases, chunk);
        for (c, got) in cases.iter().zip(got) {
            let one = tokens_of(&run(&alone, token_request(&c.prompt, STEPS, chunk)));
            assert_eq!(got, one, "{} chunk {chunk:?}: batched differs from alone", c.name);
            assert_eq!(got, c.tokens, "{} chunk {chunk:?}: differs from mlx-lm", c.name);
        }
    }
}

fn chat(messages: serde_json::Value, cache: bool) -> RequestOptions {
    chat_request(messages, STEPS, cache, 2 * W + 3)
}

#[test]
fn prompt_cache_hits_give_the_cold_result() {
    let (folder, _) = ring_oracle("gemma3_kv");
    let system = "You are the assistant of a small bakery in the old town. It opens at seven in the morning, \
                  closes at six in the evening, and sells bread, pastries, tarts and birthday cakes; orders \
                  above twenty euros are delivered for free within the city, and cakes need two days notice.";
    let ask = |user: &str| serde_json::json!([{"role": "system", "content": system}, {"role": "user", "content": user}]);
    let dir = std::env::temp_dir().join(format!("mlxrt-kv-ring-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let warm_engine = || {
        let mut cfg = EngineConfig::new(&folder);
        cfg.prompt_cache_bytes = 64 << 20;
        cfg.prompt_cache_min_tokens = 8;
        cfg.prompt_cache_dir = Some(dir.clone());
        Engine::new(cfg).unwrap()
    };
    let cold = Engine::new(EngineConfig::new(&folder)).unwrap();
    let warm = warm_engine();

    // The first request snapshots its prompt at the boundary (the system
    // message, several windows long: the rings have wrapped).
    let first = ask("When do you open?");
    let (t1, c1) = tokens_and_cached(&warm, chat(first.clone(), true));
    assert_eq!(c1, 0);
    assert_eq!(t1, tokens_and_cached(&cold, chat(first.clone(), false)).0, "prefill stopping at the boundary changed the result");
    // Another question after the same system message: a memory hit.
    let second = ask("Do you deliver cakes?");
    let (t2, c2) = tokens_and_cached(&warm, chat(second.clone(), true));
    assert!(c2 as usize > 3 * W, "the boundary snapshot was not used ({c2} cached tokens)");
    let cold2 = tokens_and_cached(&cold, chat(second.clone(), false)).0;
    assert_eq!(t2, cold2, "a memory hit changed the result");
    // Disk: a new engine over the same directory.
    warm.flush_prompt_cache().unwrap();
    drop(warm);
    let again = warm_engine();
    let (t4, c4) = tokens_and_cached(&again, chat(second, true));
    assert_eq!(c4, c2, "the entry was not loaded from disk");
    assert_eq!(t4, cold2, "a disk hit changed the result");
    let s = wait_idle(&again);
    assert!(s.prompt_cache_hits >= 1, "{s:?}");
    drop(again);
    let _ = std::fs::remove_dir_all(&dir);
}
