//! Stress: 200 requests from several host threads at once with random prompt
//! lengths and random cancels (right after submit, so usually while queued,
//! and after random delays, so during prefill or decode). Every request must
//! get exactly one terminal event and nothing after it, its sink must be
//! dropped exactly once, and the engine must return to its memory baseline.
//! Runs on a tiny random-weight Llama (tests/oracle/make_tiny.py) so that
//! the scheduler, not the model, is what is exercised. Run twice: with
//! contiguous KV, and with paged KV (`kv_paging`), where every block must be
//! free again at the end.

mod common;

use common::*;
use mlxrt::engine::{Engine, EngineConfig, EngineStats, Event, FinishReason, Input, RequestOptions};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

fn tiny_model() -> PathBuf {
    let dir = repo_root().join("target/oracle/tiny-llama-q4");
    if !dir.join("model.safetensors").exists() {
        let st = Command::new(python())
            .arg(repo_root().join("tests/oracle/make_tiny.py"))
            .args(["--family", "llama", "--quantize", "4", "--out"])
            .arg(&dir)
            .arg("--gguf")
            .arg(model_path())
            .status()
            .unwrap();
        assert!(st.success(), "make_tiny.py failed");
    }
    dir
}

/// A small deterministic generator (no external crates in tests).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Counts drops of a request's sink.
struct DropCount(Arc<AtomicUsize>);
impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn two_hundred_requests_with_random_cancels() {
    stress(false);
}

#[test]
fn two_hundred_requests_with_random_cancels_paged() {
    stress(true);
}

fn stress(paging: bool) {
    let mut cfg = EngineConfig::new(tiny_model());
    cfg.kv_paging = paging;
    cfg.kv_block_size = 32;
    cfg.max_rows = 8;
    cfg.prefill_chunk = 16;
    cfg.step_token_budget = 32;
    let engine = Arc::new(Engine::new(cfg).unwrap());
    // Warm up, then take the memory baseline (without prompt-cache entries:
    // a snapshot may be a view of a larger KV buffer, so its counted bytes
    // understate what it holds).
    run(&engine, RequestOptions::new(Input::Tokens((100..140).collect())));
    wait_idle(&engine);
    let baseline = without_prompt_cache(&engine);

    let drops = Arc::new(AtomicUsize::new(0));
    // Every event of every request, as (request, event).
    let (tx, rx) = mpsc::channel::<(usize, Event)>();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (engine, tx, drops) = (engine.clone(), tx.clone(), drops.clone());
            std::thread::spawn(move || {
                let mut rng = Lcg(t as u64 + 1);
                for k in 0..50 {
                    let id = t * 50 + k;
                    let len = 1 + rng.next(300) as usize;
                    let ids: Vec<u32> = (0..len).map(|_| 20 + rng.next(49000) as u32).collect();
                    let mut o = RequestOptions::new(Input::Tokens(ids));
                    o.max_tokens = 1 + rng.next(32) as u32;
                    o.stop_at_eos = rng.next(2) == 0;
                    let (tx, guard) = (tx.clone(), DropCount(drops.clone()));
                    let sink = move |ev: &Event| {
                        let _ = &guard;
                        let _ = tx.send((id, ev.clone()));
                    };
                    let h = engine.submit(o, Box::new(sink)).expect("submit");
                    match rng.next(4) {
                        0 => h.cancel(),
                        1 => {
                            std::thread::sleep(Duration::from_millis(rng.next(40)));
                            h.cancel();
                        }
                        _ => {}
                    }
                }
            })
        })
        .collect();
    drop(tx);
    for t in threads {
        t.join().unwrap();
    }
    // Collect until every request has a terminal event, then a little more
    // to catch anything sent after one.
    let mut terminal: Vec<Option<Event>> = vec![None; 200];
    let mut late = vec![];
    while terminal.iter().any(Option::is_none) {
        let (id, ev) = rx.recv_timeout(Duration::from_secs(300)).expect("a terminal event for every request");
        match &terminal[id] {
            Some(_) => late.push((id, ev)),
            None if ev.is_terminal() => terminal[id] = Some(ev),
            None => {}
        }
    }
    while let Ok(x) = rx.recv_timeout(Duration::from_millis(500)) {
        late.push(x);
    }
    assert!(late.is_empty(), "events after a terminal one: {late:?}");
    let mut cancelled = 0;
    for (id, ev) in terminal.iter().enumerate() {
        match ev {
            Some(Event::Done { finish, .. }) => cancelled += (*finish == FinishReason::Cancelled) as usize,
            other => panic!("request {id} ended with {other:?}"),
        }
    }
    assert!(cancelled >= 20, "expected many cancellations, got {cancelled}");
    let after = wait_idle(&engine);
    assert_eq!(drops.load(Ordering::SeqCst), 200, "every sink dropped exactly once");
    assert_eq!((after.in_flight, after.kv_reserved), (0, 0), "{after:?}");
    if paging {
        // Prompt-cache entries hold blocks (and with paging `kv_bytes` counts
        // them); once they are gone, every block is free. (The pools keep
        // their capacity: no memory baseline.)
        assert!(after.kv_blocks_used > 0 || after.prompt_cache_memory_bytes == 0, "{after:?}");
        engine.clear_prompt_cache(false).unwrap();
        let mut s = engine.stats();
        for _ in 0..100 {
            if s.kv_blocks_used == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
            s = engine.stats();
        }
        assert_eq!((s.kv_blocks_used, s.kv_bytes), (0, 0), "blocks still in use after every request ended: {s:?}");
        assert!(s.kv_blocks_free > 0, "{s:?}");
        eprintln!("stress (paged): {cancelled} of 200 cancelled; {} blocks free", s.kv_blocks_free);
        return;
    }
    assert_eq!(after.kv_bytes, 0, "{after:?}");
    let s = without_prompt_cache(&engine);
    let grown = s.active_memory as i64 - baseline.active_memory as i64;
    // A leaked KV buffer is at least 256 positions of every layer (~12 MB
    // for SmolLM2); allocator and graph-cache noise stays below 8 MB (a
    // loaded machine showed 5.7 MB).
    assert!(grown < (8 << 20), "MLX memory grew over the baseline: {baseline:?} -> {s:?}");
    eprintln!("stress: {cancelled} of 200 cancelled; memory {} -> {}", baseline.active_memory, s.active_memory);
}

/// The stats once the prompt cache's entries are dropped.
fn without_prompt_cache(engine: &Engine) -> EngineStats {
    engine.clear_prompt_cache(false).unwrap();
    let mut s = engine.stats();
    for _ in 0..100 {
        if s.prompt_cache_memory_bytes == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        s = engine.stats();
    }
    assert_eq!(s.prompt_cache_memory_bytes, 0, "{s:?}");
    s
}
