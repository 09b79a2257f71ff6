//! Paged KV (`kv_paging`) on the real model (SmolLM2): mlx-lm's greedy
//! tokens, and the contiguous cache's, for rows of different lengths
//! prefilling and decoding together, for a prompt-cache hit that maps its
//! blocks (alone, and into a running batch) and for concurrent requests
//! sharing a prefix's blocks; paged entries on disk (stored as blocks,
//! loaded back whole or trimmed, damaged files refused); blocks return to
//! the pool (a cancelled sharing row frees only its own); the options are
//! validated. Every KV layout pages: affine 8/4-bit and TurboQuant KV (with
//! delayed starts) give the tokens they give without paging; the sliding
//! windows of tiny Gemma 3 / Gemma 4 models and the attention layers of a
//! tiny Qwen3.5 hybrid give mlx-lm's.

mod common;

use common::*;
use mlxrt::cache::scheme::{KvQuant, KvScheme};
use mlxrt::cache::store;
use mlxrt::engine::{Engine, EngineConfig, Event, Input, LogLevel, Logger, RequestHandle, RequestOptions, SpanKind};
use mlxrt::model::Kernels;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
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

const FRIDGE: &str = "Explain how a refrigerator keeps food cold, step by step. ";

/// The ~300-token disk-tier prompt, for exactly `n` tokens.
fn fridge(n: u32) -> mlxrt::engine::RequestOptions {
    let mut o = chat(&FRIDGE.repeat(25));
    o.max_tokens = n;
    o.stop_at_eos = false;
    o
}

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mlxrt-paged-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A paged engine (blocks of `block`) on the cache directory `dir`, its
/// warnings collected in `log`.
fn on_disk(dir: &Path, block: usize, log: &Arc<Mutex<Vec<String>>>) -> Engine {
    let mut c = config(true, block, true);
    c.prompt_cache_dir = Some(dir.to_path_buf());
    let log = log.clone();
    c.logger = Logger::new(Some(LogLevel::Warn), Arc::new(move |_, m| log.lock().unwrap().push(m.to_string())));
    Engine::new(c).unwrap()
}

fn entry_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "safetensors")).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// The JSON header of an entry file.
fn header(path: &Path) -> Value {
    let b = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    serde_json::from_slice(&b[8..8 + n]).unwrap()
}

/// Rewrites an entry file through the store's own codec (so that its
/// checksum is right again) after `edit` changed it.
fn reseal(path: &Path, edit: impl FnOnce(&mut store::EntryFile)) {
    let compat = header(path)["__metadata__"]["compat"].as_str().unwrap().to_string();
    let mut e = store::decode(&std::fs::read(path).unwrap(), &compat).unwrap();
    edit(&mut e);
    std::fs::write(path, store::encode(&e, &compat).unwrap()).unwrap();
}

/// Edits layer 0's paged layout in an entry file, resealed.
fn edit_layout(path: &Path, edit: impl FnOnce(&mut Value)) {
    reseal(path, |e| {
        let mut v: Value = serde_json::from_str(&e.meta["paged.0"]).unwrap();
        edit(&mut v);
        e.meta.insert("paged.0".into(), v.to_string());
    });
}

#[test]
fn a_paged_entry_saved_to_disk_comes_back_into_blocks() {
    // Stored as blocks with their layout; a new engine reads the file and
    // writes it into fresh blocks: the same tokens as a cold run, for the
    // whole entry and for a shorter prefix of it.
    let dir = scratch("disk");
    let log = Arc::new(Mutex::new(vec![]));
    let e = on_disk(&dir, 64, &log);
    let (cold, _) = tokens_and_cached(&e, fridge(10));
    e.flush_prompt_cache().unwrap();
    drop(e);
    let files = entry_files(&dir);
    assert_eq!(files.len(), 1, "{files:?}");
    let h = header(&files[0]);
    let tokens: Vec<u32> = serde_json::from_str(h["__metadata__"]["tokens"].as_str().unwrap()).unwrap();
    let layout: Value = serde_json::from_str(h["__metadata__"]["paged.0"].as_str().expect("layer 0 stored paged")).unwrap();
    let blocks = tokens.len().div_ceil(64);
    assert_eq!(layout["kind"], "paged");
    assert_eq!(layout["offset"], tokens.len());
    assert_eq!(layout["paged"]["block_size"], 64);
    assert_eq!(layout["paged"]["block_table"], Value::from((0..blocks).collect::<Vec<_>>()));
    assert_eq!(layout["paged"]["num_blocks"], blocks);
    assert_eq!(layout["paged"]["capacity_tokens"], blocks * 64);
    // SmolLM2: 3 KV heads of 64, keys and values.
    assert_eq!(h["0.p.0"]["shape"], serde_json::json!([blocks, 3, 64, 64]));
    assert_eq!(h["0.p.1"]["shape"], serde_json::json!([blocks, 3, 64, 64]));
    assert!(h.get("0.keys").is_none(), "no dense copy");

    let e = on_disk(&dir, 64, &log);
    // Four tokens more: its whole history is a new entry, of its own caches.
    let (warm, cached) = tokens_and_cached(&e, fridge(14));
    assert!(cached > 256, "the entry was read from disk ({cached} tokens)");
    assert_eq!(warm[..10], cold[..], "tokens from a disk entry loaded into blocks differ");
    assert!(wait_idle(&e).kv_blocks_used > 0, "the disk entry was not loaded into blocks");
    drop(e);

    // A prompt sharing only a prefix of the entry (not a whole number of
    // blocks): the loaded entry's table is cut.
    let mut shorter = chat(&(FRIDGE.repeat(25) + "Keep it short."));
    shorter.max_tokens = 10;
    shorter.stop_at_eos = false;
    let cold_short = tokens_of(&run(&Engine::new(config(false, 256, false)).unwrap(), shorter.clone()));
    let e = on_disk(&dir, 64, &log);
    let (t, cached) = tokens_and_cached(&e, shorter);
    assert!(cached > 256 && (cached as usize) < tokens.len() && cached % 64 != 0, "a partial hit of {cached} tokens");
    assert_eq!(t, cold_short, "tokens from a trimmed disk entry differ from a cold run");
    drop(e);
    let logged = log.lock().unwrap().clone();
    assert!(!logged.iter().any(|m| m.contains("prompt cache")), "{logged:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn corrupted_paged_entries_are_refused() {
    // One entry file, damaged in each way on its own: never loaded (a miss,
    // the cold tokens), logged, deleted; the pools hold exactly what an
    // engine that never saw the file holds.
    let pristine = scratch("pristine");
    let log = Arc::new(Mutex::new(vec![]));
    {
        let e = on_disk(&pristine, 64, &log);
        tokens_and_cached(&e, fridge(10));
        e.flush_prompt_cache().unwrap();
    }
    let files = entry_files(&pristine);
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_owned();
    // Another length than the saved entry's: the run's own entry is another file.
    let cold = tokens_of(&run(&Engine::new(config(false, 256, false)).unwrap(), fridge(12)));
    let clean = {
        let dir = scratch("clean");
        let e = on_disk(&dir, 64, &log);
        assert_eq!(tokens_and_cached(&e, fridge(12)), (cold.clone(), 0));
        let s = wait_idle(&e);
        drop(e);
        let _ = std::fs::remove_dir_all(&dir);
        s
    };
    type Damage = Box<dyn Fn(&Path)>;
    fn damage(f: impl Fn(&Path) + 'static) -> Damage {
        Box::new(f)
    }
    // The same bytes but `from` (in the header) replaced by `to`.
    let flip = |from: &'static str, to: &'static str| -> Damage {
        assert_eq!(from.len(), to.len());
        damage(move |p: &Path| {
            let mut b = std::fs::read(p).unwrap();
            let at = b.windows(from.len()).position(|w| w == from.as_bytes()).expect(from);
            b[at..at + to.len()].copy_from_slice(to.as_bytes());
            std::fs::write(p, b).unwrap()
        })
    };
    let cases: Vec<(&str, usize, Damage, &str)> = vec![
        // Still a valid table (a permutation), but not what was written.
        ("swapped table entries", 64, flip(r#"\"block_table\":[0,1,"#, r#"\"block_table\":[1,0,"#), "checksum"),
        ("repeated table entry", 64, damage(|p| edit_layout(p, |v| v["paged"]["block_table"][1] = 0.into())), "block table entry 1 (0)"),
        ("table entry out of range", 64, damage(|p| edit_layout(p, |v| v["paged"]["block_table"][0] = 99.into())), "block table entry 0 (99)"),
        ("offset", 64, damage(|p| edit_layout(p, |v| v["offset"] = (v["offset"].as_i64().unwrap() + 1).into())), "offset"),
        ("num_blocks", 64, damage(|p| edit_layout(p, |v| v["paged"]["num_blocks"] = 99.into())), "num_blocks 99"),
        ("block size field", 64, damage(|p| edit_layout(p, |v| v["paged"]["block_size"] = 32.into())), "blocks of 32 positions"),
        ("missing plane", 64, damage(|p| reseal(p, |e| e.tensors.retain(|t| t.name != "3.p.1"))), "no tensor 3.p.1"),
        // An engine of another block size never opens the file.
        ("engine block size", 32, damage(|_| {}), "another model/tokenizer/MLX/device/format"),
    ];
    for (what, block, damage, why) in cases {
        let dir = scratch("damaged");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(&name);
        std::fs::copy(&files[0], &path).unwrap();
        damage(&path);
        log.lock().unwrap().clear();
        let e = on_disk(&dir, block, &log);
        let (t, cached) = tokens_and_cached(&e, fridge(12));
        assert_eq!(cached, 0, "{what}: a damaged entry was used");
        assert_eq!(t, cold, "{what}: the engine keeps serving, with the cold tokens");
        e.flush_prompt_cache().unwrap();
        assert!(!path.exists(), "{what}: the damaged file was not deleted");
        let logged = log.lock().unwrap().clone();
        assert!(logged.iter().any(|m| m.contains(&*name.to_string_lossy()) && m.contains(why)), "{what}: {logged:?}");
        if block == 64 {
            let s = wait_idle(&e);
            assert_eq!((s.kv_blocks_used, s.kv_blocks_free), (clean.kv_blocks_used, clean.kv_blocks_free), "{what}: blocks differ from a clean engine's");
        }
        drop(e);
        let _ = std::fs::remove_dir_all(&dir);
    }
    let _ = std::fs::remove_dir_all(&pristine);
}

#[test]
fn a_prompt_cache_hit_maps_into_a_running_batch() {
    // Two rows decode (outside the prompt cache); a request whose prompt an
    // entry holds maps its blocks (shared while it runs), joins them and
    // gives the cold tokens; so do they.
    let long = "Describe the water cycle in detail, from evaporation to rain. ".repeat(30);
    let hit = || {
        let mut o = RequestOptions::new(Input::Prompt(long.clone()));
        o.max_tokens = 12;
        o.stop_at_eos = false;
        o
    };
    let busy = |p: &str| {
        let mut o = chat(p);
        o.max_tokens = 60;
        o.stop_at_eos = false;
        o.prompt_cache = false;
        o
    };
    let flat = Engine::new(config(false, 256, false)).unwrap();
    let cold_hit = tokens_of(&run(&flat, hit()));
    let cold_busy: Vec<Vec<u32>> = PROMPTS[..2].iter().map(|p| tokens_of(&run(&flat, busy(p)))).collect();
    drop(flat);

    let e = Engine::new(config(true, 32, true)).unwrap();
    assert_eq!(tokens_and_cached(&e, hit()), (cold_hit.clone(), 0));
    let before = wait_idle(&e);
    assert!(before.kv_blocks_used > 0, "the entry holds blocks: {before:?}");
    assert_eq!(before.kv_blocks_shared, 0, "one entry, no rows: {before:?}");
    let subs: Vec<_> = PROMPTS[..2].iter().map(|p| submit_handle(&e, busy(p))).collect();
    let mut events: Vec<Vec<Event>> = vec![vec![]; subs.len()];
    for (i, (_, rx)) in subs.iter().enumerate() {
        while tokens_of(&events[i]).is_empty() {
            events[i].push(rx.recv_timeout(Duration::from_secs(300)).expect("a first token"));
        }
    }
    let stop = AtomicBool::new(false);
    let (hit_events, shared) = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut peak = 0;
            while !stop.load(Ordering::Relaxed) {
                peak = peak.max(e.stats().kv_blocks_shared);
                std::thread::sleep(Duration::from_millis(1));
            }
            peak
        });
        let ev = run(&e, hit());
        stop.store(true, Ordering::Relaxed);
        (ev, sampler.join().unwrap())
    });
    // The busy rows were still decoding when the hit finished.
    for (i, (_, rx)) in subs.iter().enumerate() {
        events[i].extend(rx.try_iter());
        assert!(!events[i].last().unwrap().is_terminal(), "busy row {i} ended before the hit did");
    }
    let Some(Event::Done { usage, .. }) = hit_events.last() else { panic!("{hit_events:?}") };
    assert!(usage.cached_tokens > 256, "the hit mapped {} tokens", usage.cached_tokens);
    assert!(shared > 0, "the hit row did not share the entry's blocks");
    assert_eq!(tokens_of(&hit_events), cold_hit, "tokens of the mapped hit differ from a cold run");
    for (i, (_, rx)) in subs.iter().enumerate() {
        events[i].extend(collect(rx));
        assert_eq!(tokens_of(&events[i]), cold_busy[i], "busy row {i}: tokens differ");
    }
    e.clear_prompt_cache(false).unwrap();
    assert_eq!(engine_stats_settled(&e).kv_blocks_used, 0);
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
    c.kv = KvQuant { scheme: KvScheme::Affine { bits: 4, group_size: 64 }, start: 0, ..KvQuant::default() };
    let e = Engine::new(c).expect("paging with quantized KV");
    assert_eq!(e.info().kv_scheme, "affine:b4:g64");
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

// ---- quantized KV ----

const QUANT_SCHEMES: [KvScheme; 3] = [
    KvScheme::Affine { bits: 8, group_size: 64 },
    KvScheme::Affine { bits: 4, group_size: 64 },
    KvScheme::TurboQuant { key_bits: 8, value_bits: 3 },
];

fn quant_config(paging: bool, scheme: KvScheme, start: i32, kernels: Kernels, max_rows: usize) -> EngineConfig {
    let mut c = config(paging, 256, false);
    c.kv = KvQuant { scheme, start, ..KvQuant::default() };
    c.kernels = kernels;
    c.max_rows = max_rows;
    c.prefill_chunk = 16;
    c
}

/// Holds the scheduler thread in its first span (the first request's
/// cohort set-up) until the test has queued the other requests, so that
/// every engine admits them at the same iterations. A row's arithmetic
/// depends on the batch it runs in (the matmul kernels' tiles and MLX's
/// stock kernels round differently for other shapes), so two engines'
/// batched tokens compare only for the same admissions, which otherwise
/// depend on when each submission reaches the scheduler.
#[derive(Clone, Default)]
struct Gate(Arc<(Mutex<GateState>, Condvar)>);

#[derive(Default)]
struct GateState {
    closed: bool,
    parked: bool,
}

impl Gate {
    /// An engine whose trace callback waits at this gate while it is closed,
    /// at a cohort's set-up: not at the spans a request that already ended
    /// may still emit (dropping its row from the caches), which would park
    /// the scheduler before it has seen the first request, and let it admit
    /// all of them at once.
    fn install(&self, c: &mut EngineConfig) {
        let gate = self.clone();
        c.trace = Some(Arc::new(move |span: &mlxrt::engine::Span| {
            let (lock, cv) = &*gate.0;
            let mut s = lock.lock().unwrap();
            if s.closed && span.kind == SpanKind::BatchSetup {
                s.parked = true;
                cv.notify_all();
                while s.closed {
                    s = cv.wait(s).unwrap();
                }
            }
        }));
    }

    /// Submits every request, the scheduler held from the first one's first
    /// span until the rest are queued.
    fn submit_together(&self, e: &Engine, requests: Vec<RequestOptions>) -> Vec<mpsc::Receiver<Event>> {
        let (lock, cv) = &*self.0;
        *lock.lock().unwrap() = GateState { closed: true, parked: false };
        let mut requests = requests.into_iter();
        let mut rxs = vec![submit(e, requests.next().expect("a request"))];
        let s = lock.lock().unwrap();
        let (s, waited) = cv.wait_timeout_while(s, Duration::from_secs(300), |s| !s.parked).unwrap();
        assert!(!waited.timed_out(), "the scheduler never reached the gate");
        drop(s);
        rxs.extend(requests.map(|o| submit(e, o)));
        lock.lock().unwrap().closed = false;
        cv.notify_all();
        rxs
    }
}

/// The prompts with per-request starts: the engine's, one inside the
/// prefill, one reached while decoding, one never reached. Each request
/// names its prefill chunk: then a chunk beside decoding rows is that, not
/// what the pacer measured it could take (which varies run to run).
fn quant_requests(steps: usize) -> Vec<RequestOptions> {
    PROMPTS
        .iter()
        .zip([None, Some(20), Some(60), Some(1000), Some(5)])
        .map(|(p, start)| {
            let mut o = chat(p);
            o.max_tokens = steps as u32;
            o.stop_at_eos = false;
            o.prefill_chunk = Some(16);
            o.quantized_kv_start = start;
            o
        })
        .collect()
}

#[test]
fn quantized_kv_pages_as_without_paging() {
    // Affine 8/4-bit and TurboQuant, quantized from the first token or from
    // each request's start: each row alone and all of them batched (rows
    // of different lengths, below and past their starts together) give the
    // tokens the contiguous cache gives; blocks of 256 keep the kernels'
    // chunks where the contiguous ones are.
    let steps = 16;
    let cases = QUANT_SCHEMES.iter().map(|&s| (s, Kernels::Auto)).chain([(QUANT_SCHEMES[1], Kernels::Stock)]);
    for (scheme, kernels) in cases {
        let label = format!("{scheme:?} {kernels:?}");
        let gate = Gate::default();
        let engine = |paging: bool| {
            let mut c = quant_config(paging, scheme, 0, kernels, 8);
            gate.install(&mut c);
            Engine::new(c).unwrap()
        };
        let flat = engine(false);
        let alone: Vec<Vec<u32>> = quant_requests(steps).into_iter().map(|o| tokens_of(&run(&flat, o))).collect();
        let rxs = gate.submit_together(&flat, quant_requests(steps));
        let flat_together: Vec<Vec<u32>> = rxs.iter().map(|rx| tokens_of(&collect(rx))).collect();
        drop(flat);
        let e = engine(true);
        for (i, o) in quant_requests(steps).into_iter().enumerate() {
            assert_eq!(tokens_of(&run(&e, o)), alone[i], "{label}: request {i} alone, paged");
        }
        let rxs = gate.submit_together(&e, quant_requests(steps));
        for (i, rx) in rxs.iter().enumerate() {
            assert_eq!(tokens_of(&collect(rx)), flat_together[i], "{label}: request {i} batched, paged");
        }
        let s = wait_idle(&e);
        assert_eq!((s.kv_blocks_used, s.kv_bytes, s.kv_bytes_dense, s.kv_bytes_quantized), (0, 0, 0, 0), "{label}: every block back: {s:?}");
        assert!(s.kv_blocks_free > 0);
    }
}

#[test]
fn quantized_prompt_cache_hits_map_blocks_and_give_the_cold_tokens() {
    // A prompt of ~300 tokens: its len - 1 snapshot shares the packed blocks
    // (and, below the start, the float ones); the identical re-prompt maps
    // them. Starts: from the first token, inside the prompt, past it.
    let long = "Tell me about the history of the bicycle. ".repeat(30);
    let req = || {
        let mut o = chat(&long);
        o.max_tokens = 12;
        o.stop_at_eos = false;
        o
    };
    for (scheme, start) in QUANT_SCHEMES.iter().copied().zip([0, 400, 100]) {
        let label = format!("{scheme:?} start {start}");
        let mut c = quant_config(false, scheme, start, Kernels::Auto, 8);
        c.prefill_chunk = 1024;
        let cold = tokens_and_cached(&Engine::new(c).unwrap(), req()).0;
        let mut c = quant_config(true, scheme, start, Kernels::Auto, 8);
        c.prefill_chunk = 1024;
        c.prompt_cache_bytes = 1 << 30;
        let e = Engine::new(c).unwrap();
        let (first, cached0) = tokens_and_cached(&e, req());
        assert_eq!((first.as_slice(), cached0), (cold.as_slice(), 0), "{label}");
        let held = wait_idle(&e);
        assert!(held.kv_blocks_used > 0 && held.kv_bytes_quantized > 0, "{label}: the prompt cache holds packed blocks: {held:?}");
        assert_eq!(held.kv_bytes_dense > 0, start > 300, "{label}: float blocks iff the entry is below its start: {held:?}");
        let (second, cached) = tokens_and_cached(&e, req());
        assert!(cached > 256, "{label}: the re-prompt hits the cache ({cached} tokens)");
        assert_eq!(second, cold, "{label}: tokens from mapped blocks differ from a cold run");
        e.clear_prompt_cache(false).unwrap();
        let s = engine_stats_settled(&e);
        assert_eq!((s.kv_blocks_used, s.kv_bytes), (0, 0), "{label}: blocks held after the cache was cleared: {s:?}");
    }
}

// ---- sliding windows (Gemma 3, Gemma 4) and a recurrent hybrid ----

fn tiny_config(folder: &std::path::Path, paging: bool, max_rows: usize) -> EngineConfig {
    let mut c = EngineConfig::new(folder);
    c.kv_paging = paging;
    c.kv_block_size = 32;
    c.max_rows = max_rows;
    c
}

/// Submits every case, the later ones while the first decode (they join a
/// running batch); each one's tokens.
fn batched(e: &Engine, cases: &[Case], steps: usize, chunk: Option<usize>) -> Vec<Vec<u32>> {
    let rxs: Vec<_> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| {
            if i == 2 {
                std::thread::sleep(Duration::from_millis(30));
            }
            submit(e, token_request(&c.prompt, steps, chunk))
        })
        .collect();
    rxs.iter().map(|rx| tokens_of(&collect(rx))).collect()
}

/// Paged engines (rows alone, rows batched) give mlx-lm's tokens for every
/// case and chunk; every block is back afterwards.
fn pages_as_mlx_lm(label: &str, folder: &std::path::Path, cases: &[Case], steps: usize, chunks: &[Option<usize>]) {
    let alone = Engine::new(tiny_config(folder, true, 1)).unwrap();
    let together = Engine::new(tiny_config(folder, true, 8)).unwrap();
    for &chunk in chunks {
        for (c, got) in cases.iter().zip(batched(&together, cases, steps, chunk)) {
            assert_eq!(got, c.tokens, "{label}/{} chunk {chunk:?}: paged, batched, differs from mlx-lm", c.name);
            let one = tokens_of(&run(&alone, token_request(&c.prompt, steps, chunk)));
            assert_eq!(one, c.tokens, "{label}/{} chunk {chunk:?}: paged, alone, differs from mlx-lm", c.name);
        }
    }
    for e in [alone, together] {
        let s = wait_idle(&e);
        assert_eq!((s.kv_blocks_used, s.kv_bytes), (0, 0), "{label}: every block back: {s:?}");
    }
}

#[test]
fn sliding_windows_page_as_mlx_lm_rotates() {
    // Prompts of up to 7 windows: a window row releases the blocks behind
    // its window, and attends with the kernel's window.
    let w = RING_WINDOW;
    let (folder, reference) = ring_oracle("gemma3_kv");
    let cases = reference_cases(&reference);
    assert!(cases.iter().filter(|c| c.prompt.len() > 3 * w).count() >= 3);
    pages_as_mlx_lm("gemma3_kv", &folder, &cases, RING_STEPS, &[None, Some(5), Some(2 * w + 3)]);
    // Gemma 4: window 8, KV-shared layers reading their donor's blocks.
    let (folder, reference) = ring_oracle("gemma4_text");
    pages_as_mlx_lm("gemma4_text", &folder, &reference_cases(&reference), RING_STEPS, &[None, Some(5)]);
}

#[test]
fn sliding_window_prompt_cache_hits_give_the_cold_tokens() {
    // Memory and disk hits of a system prompt several windows long, on a
    // paged Gemma 3: the cold tokens (a disk entry, stored as a ring, comes
    // back into blocks).
    let (folder, _) = ring_oracle("gemma3_kv");
    let system = "You are the assistant of a small bakery in the old town. It opens at seven in the morning, \
                  closes at six in the evening, and sells bread, pastries, tarts and birthday cakes; orders \
                  above twenty euros are delivered for free within the city, and cakes need two days notice.";
    let ask = |user: &str| serde_json::json!([{"role": "system", "content": system}, {"role": "user", "content": user}]);
    let chat = |m: serde_json::Value, cache: bool| chat_request(m, RING_STEPS, cache, 2 * RING_WINDOW + 3);
    let dir = std::env::temp_dir().join(format!("mlxrt-paged-ring-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let warm_engine = || {
        let mut c = tiny_config(&folder, true, 8);
        c.prompt_cache_bytes = 64 << 20;
        c.prompt_cache_min_tokens = 8;
        c.prompt_cache_dir = Some(dir.clone());
        Engine::new(c).unwrap()
    };
    let cold = Engine::new(tiny_config(&folder, false, 8)).unwrap();
    let warm = warm_engine();
    let first = ask("When do you open?");
    let (t1, c1) = tokens_and_cached(&warm, chat(first.clone(), true));
    assert_eq!((t1, c1), (tokens_and_cached(&cold, chat(first, false)).0, 0));
    let second = ask("Do you deliver cakes?");
    let cold2 = tokens_and_cached(&cold, chat(second.clone(), false)).0;
    let (t2, c2) = tokens_and_cached(&warm, chat(second.clone(), true));
    assert!(c2 as usize > 3 * RING_WINDOW, "the boundary snapshot was not used ({c2} cached tokens)");
    assert_eq!(t2, cold2, "a memory hit changed the result");
    warm.flush_prompt_cache().unwrap();
    drop(warm);
    let again = warm_engine();
    let (t3, c3) = tokens_and_cached(&again, chat(second, true));
    assert_eq!((t3, c3), (cold2, c2), "a disk hit changed the result");
    again.clear_prompt_cache(false).unwrap();
    assert_eq!(engine_stats_settled(&again).kv_blocks_used, 0);
    drop(again);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_hybrid_pages_its_attention_layers_as_mlx_lm() {
    // Qwen3.5: the attention layers page, the recurrent ones keep their
    // per-row state; batched with rows of different lengths, and from a
    // prompt-cache hit.
    let (folder, reference) = family_oracle("qwen3_5", "f32");
    pages_as_mlx_lm("qwen3_5", &folder, &reference_cases(&reference), FAMILY_STEPS, &[Some(16), None]);
    let system = "You are the assistant of a small bakery. It opens at seven, closes at six, and sells bread, \
                  pastries and cakes; orders above twenty euros are delivered for free.";
    let ask = |user: &str| serde_json::json!([{"role": "system", "content": system}, {"role": "user", "content": user}]);
    let chat = |m: serde_json::Value, cache: bool| chat_request(m, FAMILY_STEPS, cache, 16);
    let cold = Engine::new(tiny_config(&folder, false, 8)).unwrap();
    let mut c = tiny_config(&folder, true, 8);
    c.prompt_cache_bytes = 64 << 20;
    c.prompt_cache_min_tokens = 8;
    let warm = Engine::new(c).unwrap();
    let (t1, c1) = tokens_and_cached(&warm, chat(ask("When do you open?"), true));
    assert_eq!((t1, c1), (tokens_and_cached(&cold, chat(ask("When do you open?"), false)).0, 0));
    let (t2, c2) = tokens_and_cached(&warm, chat(ask("Do you deliver cakes?"), true));
    assert!(c2 > 0, "the boundary snapshot was not used");
    assert_eq!(t2, tokens_and_cached(&cold, chat(ask("Do you deliver cakes?"), false)).0, "a prompt-cache hit changed the result");
    warm.clear_prompt_cache(false).unwrap();
    assert_eq!(engine_stats_settled(&warm).kv_blocks_used, 0);
}
