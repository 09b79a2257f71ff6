//! Paged KV (`kv_paging`) on the real model (SmolLM2): mlx-lm's greedy
//! tokens, and the contiguous cache's, for rows of different lengths
//! prefilling and decoding together and for a prompt-cache hit that maps
//! its blocks; blocks return to the pool; the options are validated.

mod common;

use common::*;
use mlxrt::cache::scheme::{KvQuant, KvScheme};
use mlxrt::engine::{Engine, EngineConfig, Event};
use std::sync::mpsc;

const PROMPTS: [&str; 5] = [
    "What is the capital of France?",
    "List three prime numbers and explain why each is prime, in detail please.",
    "Hi!",
    "Why is the sky blue? Give a short answer.",
    "What is 12 times 7? Show your reasoning step by step and then give the final answer.",
];

fn config(paging: bool, block: usize, prompt_cache: bool) -> EngineConfig {
    let mut c = EngineConfig::new(model_path());
    c.kv_paging = paging;
    c.kv_block_size = block;
    if !prompt_cache {
        c.prompt_cache_bytes = 0;
    }
    c
}

/// Every prompt submitted at once (they prefill and decode together).
fn together(e: &Engine, steps: usize) -> Vec<Vec<u32>> {
    let rxs: Vec<mpsc::Receiver<Event>> = PROMPTS
        .iter()
        .map(|p| {
            let mut o = chat(p);
            o.max_tokens = steps as u32;
            o.stop_at_eos = false;
            submit(e, o)
        })
        .collect();
    rxs.iter().map(|rx| tokens_of(&collect(rx))).collect()
}

#[test]
fn rows_of_different_lengths_decode_as_without_paging() {
    let steps = 24;
    let flat = together(&Engine::new(config(false, 256, false)).unwrap(), steps);
    // Blocks of 32: prompts and generations cross several blocks.
    let e = Engine::new(config(true, 32, false)).unwrap();
    let paged = together(&e, steps);
    for (i, (p, f)) in paged.iter().zip(&flat).enumerate() {
        assert_eq!(f.len(), steps);
        assert_eq!(p, f, "prompt {i}: paged tokens differ");
    }
    let s = wait_idle(&e);
    assert_eq!((s.kv_blocks_used, s.kv_bytes, s.kv_reserved), (0, 0, 0), "every block back: {s:?}");
    assert!(s.kv_blocks_free > 0, "{s:?}");
}

#[test]
fn a_prompt_cache_hit_maps_blocks_and_gives_the_cold_tokens() {
    // A prompt of ~300 tokens: its len - 1 boundary is snapshotted (blocks
    // shared, no copy); the identical re-prompt maps them and writes its
    // last token into a copy of the shared partial block.
    let long = "Tell me about the history of the bicycle. ".repeat(30);
    let req = || {
        let mut o = chat(&long);
        o.max_tokens = 12;
        o.stop_at_eos = false;
        o
    };
    let cold = tokens_and_cached(&Engine::new(config(false, 256, false)).unwrap(), req()).0;
    let e = Engine::new(config(true, 64, true)).unwrap();
    let (first, cached0) = tokens_and_cached(&e, req());
    assert_eq!((first.as_slice(), cached0), (cold.as_slice(), 0));
    let held = wait_idle(&e);
    assert!(held.kv_blocks_used > 0, "the prompt cache holds blocks: {held:?}");
    let (second, cached) = tokens_and_cached(&e, req());
    assert!(cached > 256, "the re-prompt hits the cache ({cached} tokens)");
    assert_eq!(second, cold, "tokens from mapped blocks differ from a cold run");
    e.clear_prompt_cache(false).unwrap();
    let s = engine_stats_settled(&e);
    assert_eq!(s.kv_blocks_used, 0, "blocks held after the cache was cleared: {s:?}");
}

#[test]
fn a_paged_entry_saved_to_disk_comes_back_into_blocks() {
    // Saved gathered as dense keys/values; a new engine reads the file and
    // writes it into fresh blocks: the same tokens as a cold run.
    let dir = std::env::temp_dir().join(format!("mlxrt-paged-disk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let long = "Explain how a refrigerator keeps food cold, step by step. ".repeat(25);
    let req = |n: u32| {
        let mut o = chat(&long);
        o.max_tokens = n;
        o.stop_at_eos = false;
        o
    };
    let on_disk = || {
        let mut c = config(true, 64, true);
        c.prompt_cache_dir = Some(dir.clone());
        Engine::new(c).unwrap()
    };
    let e = on_disk();
    let (cold, _) = tokens_and_cached(&e, req(10));
    e.flush_prompt_cache().unwrap();
    drop(e);
    let e = on_disk();
    // Four tokens more: its whole history is a new entry, of its own caches.
    let (warm, cached) = tokens_and_cached(&e, req(14));
    assert!(cached > 256, "the entry was read from disk ({cached} tokens)");
    assert_eq!(warm[..10], cold[..], "tokens from a disk entry written into blocks differ");
    // The restored row was paged: its snapshot holds blocks.
    assert!(wait_idle(&e).kv_blocks_used > 0, "the disk hit was not moved into blocks");
    drop(e);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Stats once nothing holds blocks any more (published after each unit of work).
fn engine_stats_settled(e: &Engine) -> mlxrt::engine::EngineStats {
    for _ in 0..100 {
        let s = e.stats();
        if s.kv_blocks_used == 0 {
            return s;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    e.stats()
}

#[test]
fn paging_options_are_validated() {
    for bad in [0, 16, 100, 2048] {
        let err = Engine::new(config(true, bad, false)).err().expect("a bad block size is refused");
        assert!(err.to_string().contains("kv_block_size"), "{err}");
    }
    assert!(Engine::new(config(false, 0, false)).is_ok(), "the block size is ignored without paging");
    let mut c = config(true, 256, false);
    c.kv = KvQuant { scheme: KvScheme::Affine { bits: 4, group_size: 64 }, start: 0 };
    assert!(Engine::new(c).is_err(), "paging with quantized KV is not implemented yet");
}

#[test]
fn rows_decoding_together_give_mlx_lm_tokens() {
    // mlx-lm's greedy tokens for the parity prompts (the parity oracle),
    // all submitted at once to a paged engine.
    let cases = reference_cases(&parity_oracle().reference);
    assert!(cases.len() >= 5, "need at least 5 parity prompts, got {}", cases.len());
    let e = Engine::new(config(true, 64, false)).unwrap();
    let rxs: Vec<_> = cases.iter().map(|c| submit(&e, token_request(&c.prompt, c.tokens.len(), None))).collect();
    let lens: Vec<usize> = cases.iter().map(|c| c.prompt.len()).collect();
    assert!(lens.iter().any(|&l| l != lens[0]), "prompts of different lengths: {lens:?}");
    for (c, rx) in cases.iter().zip(&rxs) {
        assert_eq!(tokens_of(&collect(rx)), c.tokens, "{}: paged engine tokens differ from mlx-lm", c.name);
    }
    assert_eq!(wait_idle(&e).kv_blocks_used, 0);
}
