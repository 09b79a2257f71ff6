//! The prompt cache on the real model: hits, partial prefixes, next-turn
//! reuse, eviction, namespaces, restarts from the cache directory, and files
//! that must never be loaded. A hit must give the cold run's greedy tokens.

mod common;

use common::*;
use mlxrt::engine::{Engine, EngineConfig, Event, Input, RequestOptions};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const TOKENS: u32 = 24;

/// A system prompt of several hundred tokens (snapshots need >= 256).
fn system() -> String {
    let facts = [
        "The warehouse opens at seven and closes at nineteen.",
        "Orders above fifty euros ship for free within the country.",
        "Returns are accepted for thirty days with the original receipt.",
        "The support line answers in English, French and German.",
        "Fragile items are packed in double boxes with foam corners.",
    ];
    let mut s = String::from("You are the assistant of a small online shop. Facts you know:\n");
    for i in 0..30 {
        s += &format!("{}. {}\n", i + 1, facts[i % facts.len()]);
    }
    s
}

fn chat(messages: Value, namespace: &str, cache: bool) -> RequestOptions {
    let mut o = RequestOptions::new(Input::Messages(messages));
    o.max_tokens = TOKENS;
    o.stop_at_eos = false;
    o.cache_namespace = namespace.into();
    o.prompt_cache = cache;
    o
}

fn ask(user: &str) -> Value {
    json!([{"role": "system", "content": system()}, {"role": "user", "content": user}])
}

/// (tokens, text, cached prompt tokens)
fn go(e: &Engine, o: RequestOptions) -> (Vec<u32>, String, u32) {
    let ev = run(e, o);
    let Some(Event::Done { usage, .. }) = ev.last() else { panic!("{ev:?}") };
    (tokens_of(&ev), text_of(&ev), usage.cached_tokens)
}

fn engine_with(dir: Option<&Path>, budget: usize) -> Engine {
    let mut c = EngineConfig::new(model_path());
    c.prompt_cache_bytes = budget;
    c.prompt_cache_dir = dir.map(Path::to_path_buf);
    Engine::new(c).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mlxrt-pc-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn hits_partial_prefixes_and_next_turn_match_cold_runs() {
    let e = engine_with(None, 1 << 30);
    let q1 = ask("When does the warehouse open?");
    let q2 = ask("Do you ship for free?");
    let cold2 = go(&e, chat(q2.clone(), "", false));
    assert_eq!(e.stats().prompt_cache_memory_bytes, 0, "opted-out requests store nothing");

    let first = go(&e, chat(q1.clone(), "", true));
    assert_eq!(first.2, 0, "nothing cached yet");
    let s = wait_idle(&e);
    assert!(s.prompt_cache_memory_bytes > 0 && s.prompt_cache_misses == 1, "{s:?}");

    // Same system prompt, another question: the boundary snapshot is reused.
    let hit2 = go(&e, chat(q2.clone(), "", true));
    assert!(hit2.2 >= 256, "system prompt reused: {}", hit2.2);
    assert_eq!(hit2.0, cold2.0, "a hit gives the cold tokens");

    // The next turn of conversation 1 reuses prompt + reply.
    let prompt1 = e.tokenize_input(&chat(q1.clone(), "", true)).unwrap();
    let mut turn2 = q1.as_array().unwrap().clone();
    turn2.push(json!({"role": "assistant", "content": first.1}));
    turn2.push(json!({"role": "user", "content": "And when does it close?"}));
    let turn2 = Value::Array(turn2);
    let cold = go(&e, chat(turn2.clone(), "", false));
    let warm = go(&e, chat(turn2, "", true));
    assert!(warm.2 as usize > prompt1.len(), "reply reused: {} cached, prompt was {}", warm.2, prompt1.len());
    assert_eq!(warm.0, cold.0);

    let s = wait_idle(&e);
    assert!(s.prompt_cache_hits >= 2 && s.prompt_cache_hit_tokens >= 512, "{s:?}");
}

#[test]
fn namespaces_do_not_share_and_small_budgets_evict() {
    let e = engine_with(None, 1 << 30);
    go(&e, chat(ask("Hello?"), "alice", true));
    assert_eq!(go(&e, chat(ask("Hi?"), "bob", true)).2, 0, "bob must not see alice's state");
    assert!(go(&e, chat(ask("Hi?"), "alice", true)).2 > 0);

    // A budget that holds one snapshot at most: memory stays under it.
    let budget = 30 << 20;
    let e = engine_with(None, budget);
    for q in ["One?", "Two?", "Three?"] {
        go(&e, chat(ask(q), &format!("ns-{q}"), true));
        let s = wait_idle(&e);
        assert!(s.prompt_cache_memory_bytes <= budget, "{s:?}");
    }
}

#[test]
fn survives_restarts_and_never_loads_bad_files() {
    let dir = scratch("restart");
    let q = ask("What about returns?");
    let cold = {
        let e = engine_with(Some(&dir), 1 << 30);
        let cold = go(&e, chat(q.clone(), "", true));
        e.flush_prompt_cache().unwrap();
        cold
    };
    let files = |d: &Path| -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().path()).collect();
        v.sort();
        v
    };
    assert!(!files(&dir).is_empty(), "entries written to {}", dir.display());

    // A new engine on the same directory hits, with the cold tokens.
    let warm = go(&engine_with(Some(&dir), 1 << 30), chat(q.clone(), "", true));
    assert!(warm.2 > 0, "restart hit");
    assert_eq!(warm.0, cold.0);

    let _ = std::fs::remove_dir_all(&dir);

    // Damaged files (each kind on its own): never loaded, removed, and the
    // engine keeps working.
    for kind in ["truncated", "flipped bytes", "other model"] {
        let dir = scratch(&kind.replace(' ', "-"));
        {
            let e = engine_with(Some(&dir), 1 << 30);
            go(&e, chat(q.clone(), "", true));
        } // destroying the engine writes its entries
        let saved = files(&dir);
        assert!(!saved.is_empty(), "{kind}: entries written on destroy");
        for f in &saved {
            let mut b = std::fs::read(f).unwrap();
            match kind {
                "truncated" => b.truncate(b.len() / 2),
                "flipped bytes" => {
                    let n = b.len();
                    b[n - 100] ^= 0xff;
                }
                _ => b = String::from_utf8_lossy(&b).replacen("model=", "model=X", 1).into_bytes(),
            }
            std::fs::write(f, b).unwrap();
        }
        let e = engine_with(Some(&dir), 1 << 30);
        if kind != "flipped bytes" {
            // Header problems are found when the directory is opened; a bad
            // checksum when the file is about to be loaded.
            assert!(files(&dir).is_empty(), "{kind}: damaged files are removed when the engine opens the directory");
        }
        let after = go(&e, chat(q.clone(), "", true));
        assert_eq!(after.2, 0, "{kind}: a damaged file was used");
        assert_eq!(after.0, cold.0, "{kind}: the engine keeps working");
        drop(e);
        // The engine replaced the bad files with good entries.
        let again = go(&engine_with(Some(&dir), 1 << 30), chat(q.clone(), "", true));
        assert!(again.2 > 0 && again.0 == cold.0, "{kind}: good entries after the damaged ones");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

fn in_session(o: RequestOptions, session: Option<&str>) -> RequestOptions {
    RequestOptions { cache_session_id: session.map(str::to_owned), ..o }
}

#[test]
fn sessions_scope_entries_within_a_namespace() {
    let e = engine_with(None, 1 << 30);
    let q = || chat(ask("Can I pay by card?"), "shop", true);
    let cold = go(&e, in_session(q(), Some("a")));
    assert_eq!(cold.2, 0);
    assert_eq!(go(&e, in_session(q(), Some("b"))).2, 0, "session b must not see session a's state");
    assert_eq!(go(&e, in_session(q(), None)).2, 0, "requests without a session must not see session a's state");
    let warm = go(&e, in_session(q(), Some("a")));
    assert!(warm.2 >= 256, "session a reuses its own state: {}", warm.2);
    assert_eq!(warm.0, cold.0);
    let other_ns = RequestOptions { cache_namespace: "other".into(), ..in_session(q(), Some("a")) };
    assert_eq!(go(&e, other_ns).2, 0, "a session id does not cross namespaces");
}

/// A plain prompt (no chat boundary) of 256 tokens or more: an identical
/// prompt hits all but its last token even when the first request was
/// cancelled at its first token (SmolLM2's KV is trimmable: the cancelled
/// row's snapshot is cut back; tests/scheduler.rs covers the `len - 1`
/// snapshot of a recurrent model).
#[test]
fn identical_prompts_hit_len_minus_one() {
    let e = engine_with(None, 1 << 30);
    let text = system() + "Summarise the facts.";
    let plain = || {
        let mut o = RequestOptions::new(Input::Prompt(text.clone()));
        o.max_tokens = 64;
        o.stop_at_eos = false;
        o
    };
    let len = e.tokenize_input(&plain()).unwrap().len();
    assert!(len > 256, "{len}");
    // The first request is cancelled at its first token.
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = e.submit(plain(), Box::new(move |ev: &Event| tx.send(ev.clone()).unwrap())).unwrap();
    let mut first = vec![];
    loop {
        let ev = rx.recv_timeout(std::time::Duration::from_secs(300)).unwrap();
        if matches!(ev, Event::Delta { .. }) {
            handle.cancel();
        }
        let end = ev.is_terminal();
        first.push(ev);
        if end {
            break;
        }
    }
    assert!(matches!(first.last(), Some(Event::Done { finish: mlxrt::engine::FinishReason::Cancelled, .. })), "{first:?}");
    let again = go(&e, RequestOptions { max_tokens: TOKENS, ..plain() });
    assert_eq!(again.2 as usize, len - 1, "an identical prompt reuses all but its last token");
    let cold = go(&e, RequestOptions { max_tokens: TOKENS, prompt_cache: false, ..plain() });
    assert_eq!(again.0, cold.0, "a len - 1 hit gives the cold tokens");
}
