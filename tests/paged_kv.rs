//! Paged KV (`kv_paging`) on the real model (SmolLM2): mlx-lm's greedy
//! tokens, and the contiguous cache's, for rows of different lengths
//! prefilling and decoding together, for a prompt-cache hit that maps its
//! blocks and for concurrent requests sharing a prefix's blocks; blocks
//! return to the pool (a cancelled sharing row frees only its own); the
//! options are validated.

mod common;

use common::*;
use mlxrt::cache::scheme::{KvQuant, KvScheme};
use mlxrt::engine::{Engine, EngineConfig, Event, RequestHandle};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

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

/// Token prompts sharing a 280-token prefix (8 full blocks of 32 and a
/// partial one), each with 10 distinct question ids: 290 tokens, so a row
/// holds 10 blocks until it has 30 positions more.
fn shared_prompts(n: usize) -> Vec<Vec<u32>> {
    let prefix: Vec<u32> = (0..280).map(|i| 200 + (i * 37) % 4000).collect();
    (0..n).map(|q| prefix.iter().copied().chain((0..10).map(|j| 5000 + 10 * q as u32 + j)).collect()).collect()
}

/// Submits a request; its handle and its events.
fn submit_handle(e: &Engine, o: mlxrt::engine::RequestOptions) -> (RequestHandle, mpsc::Receiver<Event>) {
    let (tx, rx) = mpsc::channel();
    let h = e.submit(o, Box::new(move |ev: &Event| {
        let _ = tx.send(ev.clone());
    }));
    (h.expect("submit"), rx)
}

/// `f` while a thread samples the engine's KV blocks in use; its result and
/// the peak.
fn peak_blocks<T>(e: &Engine, f: impl FnOnce() -> T) -> (T, u64) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut peak = 0;
            while !stop.load(Ordering::Relaxed) {
                peak = peak.max(e.stats().kv_blocks_used);
                std::thread::sleep(Duration::from_millis(1));
            }
            peak
        });
        let out = f();
        stop.store(true, Ordering::Relaxed);
        (out, sampler.join().expect("sampler"))
    })
}

#[test]
fn concurrent_rows_sharing_a_prefix_share_its_blocks() {
    // Six requests at once, prompt cache off: the first prefills alone, the
    // others wait for it and map its 8 full blocks (the partial 9th is
    // copied on write): 10 + 5 x 2 blocks per layer at most, against
    // 6 x 10 private ones.
    let steps = 8;
    let prompts = shared_prompts(6);
    let flat = Engine::new(config(false, 256, false)).unwrap();
    let alone: Vec<Vec<u32>> = prompts.iter().map(|p| tokens_of(&run(&flat, token_request(p, steps, None)))).collect();
    let rxs: Vec<_> = prompts.iter().map(|p| submit(&flat, token_request(p, steps, None))).collect();
    let together: Vec<Vec<u32>> = rxs.iter().map(|rx| tokens_of(&collect(rx))).collect();
    assert_eq!(together, alone, "unpaged rows together differ from alone");
    drop(flat);

    let e = Engine::new(config(true, 32, false)).unwrap();
    let layers = e.info().num_layers as u64;
    let (runs, peak) = peak_blocks(&e, || {
        let rxs: Vec<_> = prompts.iter().map(|p| submit(&e, token_request(p, steps, None))).collect();
        rxs.iter().map(|rx| collect(rx)).collect::<Vec<_>>()
    });
    for (i, ev) in runs.iter().enumerate() {
        assert_eq!(tokens_of(ev), alone[i], "request {i}: tokens with shared blocks differ");
        let Some(Event::Done { usage, .. }) = ev.last() else { panic!("{ev:?}") };
        if i > 0 {
            assert!(usage.cached_tokens >= 256, "request {i} mapped {} tokens, not the shared blocks", usage.cached_tokens);
        }
    }
    assert!(peak >= 10 * layers, "the peak sampled no rows: {peak}");
    assert!(peak <= 20 * layers, "peak {} blocks per layer, shared would be at most 20 (private: 60)", peak / layers);
    let s = wait_idle(&e);
    assert_eq!((s.kv_blocks_used, s.kv_bytes), (0, 0), "every block back: {s:?}");
}

#[test]
fn cancelling_a_sharing_row_frees_only_its_own_blocks() {
    // Four requests share 8 full blocks; each holds 2 of its own (its copy
    // of the partial 9th, and the 10th) for its first 30 positions: 16 per
    // layer. A cancelled one gives back its 2, the shared 8 stay, and the
    // others still get their tokens.
    let steps = 28;
    let prompts = shared_prompts(4);
    let flat = Engine::new(config(false, 256, false)).unwrap();
    let alone: Vec<Vec<u32>> = prompts.iter().map(|p| tokens_of(&run(&flat, token_request(p, steps, None)))).collect();
    drop(flat);

    let e = Engine::new(config(true, 32, false)).unwrap();
    let layers = e.info().num_layers as u64;
    let subs: Vec<_> = prompts.iter().map(|p| submit_handle(&e, token_request(p, steps, None))).collect();
    // Wait until every row decodes.
    let mut events: Vec<Vec<Event>> = vec![vec![]; subs.len()];
    for (i, (_, rx)) in subs.iter().enumerate() {
        while tokens_of(&events[i]).is_empty() {
            let ev = rx.recv_timeout(Duration::from_secs(300)).expect("a first token");
            assert!(!ev.is_terminal(), "request {i} ended early: {ev:?}");
            events[i].push(ev);
        }
    }
    let before = e.stats();
    assert_eq!(before.kv_blocks_used, 16 * layers, "8 shared + 4 x 2 own blocks per layer: {before:?}");
    subs[3].0.cancel();
    events[3].extend(collect(&subs[3].1));
    assert!(matches!(events[3].last(), Some(Event::Done { finish: mlxrt::engine::FinishReason::Cancelled, .. })));
    let mut after = e.stats();
    for _ in 0..100 {
        if after.active == 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
        after = e.stats();
    }
    assert_eq!(after.kv_blocks_used, 14 * layers, "the cancelled row's 2 own blocks per layer freed, no more: {after:?}");
    for (i, (_, rx)) in subs.iter().enumerate().take(3) {
        events[i].extend(collect(rx));
        assert_eq!(tokens_of(&events[i]), alone[i], "request {i}: tokens differ after a sharing row was cancelled");
    }
    let s = wait_idle(&e);
    assert_eq!(s.kv_blocks_used, 0, "every block back: {s:?}");
}
