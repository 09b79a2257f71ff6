//! Scheduler behaviours on tiny random-weight models (tests/oracle/make_tiny.py):
//! `len - 1` prompt snapshots on a hybrid (recurrent-state) model, one
//! row's failure leaving the rest of its batch untouched, and mixed
//! iterations (decoding rows and a prefill chunk in one forward).

mod common;

use common::*;
use mlxrt::engine::{Engine, EngineConfig, Event, RequestOptions};
use mlxrt::mlx::io::TensorFile;
use mlxrt::mlx::{Array, Dtype};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

/// The tiny model of `family` (f32), built once per change of make_tiny.py
/// under target/oracle/scheduler.
fn tiny(family: &str) -> PathBuf {
    let folder = repo_root().join(format!("target/oracle/scheduler/tiny-{family}"));
    let script = repo_root().join("tests/oracle/make_tiny.py");
    if !newer_than(&folder.join("model.safetensors"), &[script]) {
        let _ = std::fs::remove_dir_all(&folder);
        make_tiny(family, &folder, &[]);
    }
    folder
}

/// A token prompt of `n` ids (all inside the tokenizer's vocabulary).
fn prompt(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| 100 + (i * 7919 + salt * 104_729) % 40_000).collect()
}

#[test]
fn hybrid_identical_prompt_hits_len_minus_one() {
    let folder = tiny("qwen3_5");
    let e = Engine::new(EngineConfig::new(&folder)).unwrap();
    let p = prompt(300, 1);
    let first = tokens_and_cached(&e, token_request(&p, 16, None));
    assert_eq!(first.1, 0);
    let again = tokens_and_cached(&e, token_request(&p, 16, None));
    assert_eq!(again.1 as usize, p.len() - 1, "an identical prompt reuses the len - 1 snapshot of the recurrent state");
    let cold = tokens_and_cached(&e, RequestOptions { prompt_cache: false, ..token_request(&p, 16, None) });
    assert_eq!((&again.0, &first.0), (&cold.0, &cold.0), "snapshots and hits keep the cold tokens");
    // Shorter prompts than the cache's minimum are not snapshotted.
    let short = prompt(100, 2);
    tokens_and_cached(&e, token_request(&short, 4, None));
    assert_eq!(tokens_and_cached(&e, token_request(&short, 4, None)).1, 0);
}

/// A copy of the tiny qwen3 model whose vocabulary is padded with `pad` ids
/// the tokenizer does not know (as real checkpoints pad theirs, e.g. Qwen2.5:
/// 151,936 rows for 151,665 tokens). Their output rows are zero, so greedy
/// decoding never picks them but sampling at a high temperature soon does.
fn padded_vocab(pad: i32) -> PathBuf {
    let src = tiny("qwen3");
    let dir = repo_root().join("target/oracle/scheduler/tiny-qwen3-padded");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let vocab = config["vocab_size"].as_i64().unwrap() as i32;
    config["vocab_size"] = (vocab + pad).into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut f = TensorFile::load_safetensors(src.join("model.safetensors").to_str().unwrap()).unwrap();
    let mut out = TensorFile::new().unwrap();
    for name in f.names().unwrap() {
        let mut a = f.take(&name).unwrap();
        if name == "model.embed_tokens.weight" || name == "lm_head.weight" {
            let zeros = Array::zeros(&[pad, a.dim(1)], Dtype::F32).unwrap();
            a = Array::concatenate(&[&a, &zeros], 0).unwrap();
        }
        out.insert(&name, &a).unwrap();
    }
    out.save_safetensors(dir.join("model.safetensors").to_str().unwrap()).unwrap();
    dir
}

/// One row's failure (it samples an id the tokenizer cannot turn into text)
/// ends that row with an error while the rows batched with it go on, with
/// the tokens they get alone.
#[test]
fn one_rows_failure_leaves_its_batch_untouched() {
    let folder = padded_vocab(49_152);
    let e = Engine::new(EngineConfig::new(&folder)).unwrap();
    let greedy = |salt| token_request(&prompt(40, salt), 64, None);
    let alone: Vec<Vec<u32>> = (0..2).map(|s| tokens_and_cached(&e, greedy(s)).0).collect();
    let mut hot = token_request(&prompt(40, 9), 64, None);
    hot.sampling.temperature = 50.0;
    hot.sampling.seed = Some(1);

    // All three together; events in arrival order, tagged by request.
    let (tx, rx) = mpsc::channel::<(usize, Event)>();
    for (i, o) in [greedy(0), greedy(1), hot].into_iter().enumerate() {
        let tx = tx.clone();
        e.submit(o, Box::new(move |ev: &Event| tx.send((i, ev.clone())).unwrap())).unwrap();
    }
    drop(tx);
    let mut events: Vec<Vec<Event>> = vec![vec![]; 3];
    let mut ended = vec![];
    while ended.len() < 3 {
        let (i, ev) = rx.recv_timeout(Duration::from_secs(300)).expect("events within 300 s");
        if ev.is_terminal() {
            ended.push(i);
        }
        events[i].push(ev);
    }
    let Some(Event::Error(err)) = events[2].last() else { panic!("the sampling row did not fail: {:?}", events[2].last()) };
    assert!(err.message.contains("token"), "{err}");
    assert_eq!(ended[0], 2, "the failing row ended first, while the others were still generating");
    for i in 0..2 {
        assert!(matches!(events[i].last(), Some(Event::Done { .. })), "row {i}: {:?}", events[i].last());
        assert_eq!(tokens_of(&events[i]), alone[i], "row {i}: tokens differ from running alone");
    }
    let s = wait_idle(&e);
    assert_eq!((s.active, s.in_flight, s.kv_reserved), (0, 0, 0), "{s:?}");
    let _ = std::fs::remove_dir_all(&folder);
}

/// Rows decoding while two prompts of different lengths arrive: the
/// iterations that decode and prefill together make one model call (one
/// forward span, counted in `mixed_steps`), and every request gets the
/// tokens it gets alone; with and without paged KV.
#[test]
fn mixed_iterations_make_one_model_call_and_keep_each_rows_tokens() {
    use mlxrt::engine::{Span, SpanKind};
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    let folder = tiny("qwen3");
    for paging in [false, true] {
        let seen: Arc<Mutex<Vec<Span>>> = Arc::default();
        let mut c = EngineConfig::new(&folder);
        c.kv_paging = paging;
        c.kv_block_size = 32;
        c.prompt_cache_bytes = 0;
        let log = seen.clone();
        c.trace = Some(Arc::new(move |s: &Span| log.lock().unwrap().push(*s)));
        let e = Engine::new(c).unwrap();
        let reqs = [(40, 0, 48), (25, 1, 48), (300, 2, 8), (170, 3, 8)];
        let req = |&(len, salt, steps): &(usize, u32, usize)| token_request(&prompt(len, salt), steps, None);
        let alone: Vec<Vec<u32>> = reqs.iter().map(|r| tokens_and_cached(&e, req(r)).0).collect();
        let calls_before = e.stats().model_calls;
        seen.lock().unwrap().clear();

        // The first two decode; the others arrive once both have tokens.
        let early: Vec<_> = reqs[..2].iter().map(|r| submit(&e, req(r))).collect();
        let mut events: Vec<Vec<Event>> = vec![];
        for rx in &early {
            let mut ev = vec![];
            while !matches!(ev.last(), Some(Event::Delta { .. })) {
                ev.push(rx.recv_timeout(Duration::from_secs(300)).expect("a first token"));
            }
            events.push(ev);
        }
        let late: Vec<_> = reqs[2..].iter().map(|r| submit(&e, req(r))).collect();
        for (ev, rx) in events.iter_mut().zip(&early) {
            ev.extend(collect(rx));
        }
        events.extend(late.iter().map(collect));
        for (i, ev) in events.iter().enumerate() {
            assert_eq!(tokens_of(ev), alone[i], "paging {paging}: request {i}'s tokens differ from running alone");
        }

        let s = wait_idle(&e);
        let spans = seen.lock().unwrap().clone();
        let mut per_iteration: HashMap<u64, usize> = HashMap::new();
        for sp in spans.iter().filter(|s| s.kind == SpanKind::Forward) {
            *per_iteration.entry(sp.iteration).or_default() += 1;
        }
        assert_eq!(per_iteration.values().sum::<usize>() as u64, s.model_calls - calls_before);
        assert!(per_iteration.values().all(|&n| n == 1), "paging {paging}: an iteration made two model calls");
        // The late prompts prefill over several chunks while the early rows
        // still have ~40 tokens to go.
        assert!(s.mixed_steps >= 3, "paging {paging}: {} mixed steps", s.mixed_steps);
        assert_eq!((s.active, s.kv_reserved), (0, 0), "{s:?}");
    }
}

/// Events of requests submitted together, tagged with the request's index,
/// in the order the engine delivered them.
fn run_tagged(e: &Engine, reqs: Vec<RequestOptions>) -> Vec<(usize, Event)> {
    let (tx, rx) = mpsc::channel::<(usize, Event)>();
    let n = reqs.len();
    for (i, o) in reqs.into_iter().enumerate() {
        let tx = tx.clone();
        e.submit(o, Box::new(move |ev: &Event| tx.send((i, ev.clone())).unwrap())).unwrap();
    }
    drop(tx);
    let (mut out, mut ended) = (vec![], 0);
    while ended < n {
        let (i, ev) = rx.recv_timeout(Duration::from_secs(300)).expect("events within 300 s");
        ended += ev.is_terminal() as usize;
        out.push((i, ev));
    }
    out
}

/// A long prompt prefills in small chunks; a request whose prompt hits the
/// prompt cache and a fresh one arrive with it. Both join its cohort at the
/// position it has reached (the hit with its cached prefix: without paging
/// once the cohort has processed as many positions, with paging at once),
/// reach their own ends first and leave for the decode batch while the long
/// prompt goes on; every request gets its tokens alone. With and without
/// paged KV.
#[test]
fn cache_hit_rows_join_a_running_cohort_at_other_positions() {
    let folder = tiny("qwen3");
    for paging in [false, true] {
        let mut c = EngineConfig::new(&folder);
        c.kv_paging = paging;
        c.kv_block_size = 32;
        c.prefill_chunk = 32;
        c.prompt_cache_min_tokens = 16;
        let e = Engine::new(c).unwrap();
        let shared = prompt(200, 5);
        let with = |salt, n| [&shared[..], &prompt(n, salt)].concat();
        let (warm, hit, fresh, long) = (with(6, 20), with(7, 30), prompt(120, 9), prompt(600, 8));
        let req = |p: &[u32]| token_request(p, 12, None);
        let cold = |p: &[u32]| tokens_and_cached(&e, RequestOptions { prompt_cache: false, ..req(p) }).0;
        let alone = [cold(&long), cold(&hit), cold(&fresh)];
        // Leaves an entry holding the shared prefix.
        tokens_and_cached(&e, req(&warm));

        let events = run_tagged(&e, vec![req(&long), req(&hit), req(&fresh)]);
        let first_delta = |i| events.iter().position(|(j, ev)| *j == i && matches!(ev, Event::Delta { .. })).unwrap();
        for i in [1, 2] {
            assert!(first_delta(i) < first_delta(0), "paging {paging}: request {i} waited for the long prompt's prefill");
        }
        for (i, want) in alone.iter().enumerate() {
            let ev: Vec<Event> = events.iter().filter(|(j, _)| *j == i).map(|(_, ev)| ev.clone()).collect();
            assert_eq!(&tokens_of(&ev), want, "paging {paging}: request {i}'s tokens differ from running alone");
            let Some(Event::Done { usage, .. }) = ev.last() else { panic!("{:?}", ev.last()) };
            assert_eq!(usage.cached_tokens, if i == 1 { 200 } else { 0 }, "paging {paging}: request {i}");
        }
        let s = wait_idle(&e);
        assert_eq!((s.active, s.kv_reserved), (0, 0), "{s:?}");
    }
}

/// A request's own prefill chunk is used exactly: not lowered to the
/// engine's chunk (nor, while rows decode, to the step budget).
#[test]
fn a_requests_prefill_chunk_is_used_exactly() {
    use mlxrt::engine::{Span, SpanKind};
    use std::sync::{Arc, Mutex};
    let seen: Arc<Mutex<Vec<Span>>> = Arc::default();
    let mut c = EngineConfig::new(tiny("qwen3"));
    c.prefill_chunk = 16;
    c.prompt_cache_bytes = 0;
    let log = seen.clone();
    c.trace = Some(Arc::new(move |s: &Span| log.lock().unwrap().push(*s)));
    let e = Engine::new(c).unwrap();
    let p = prompt(100, 3);
    let own = tokens_and_cached(&e, token_request(&p, 4, Some(24))).0;
    let forwards: Vec<usize> = seen.lock().unwrap().iter().filter(|s| s.kind == SpanKind::Forward).map(|s| s.tokens).collect();
    // 99 body positions in chunks of 24, then the last one alone (then decode steps).
    assert_eq!(forwards[..6], [24, 24, 24, 24, 3, 1], "forward sizes");
    assert_eq!(own, tokens_and_cached(&e, token_request(&p, 4, None)).0, "the chunking does not change the tokens");
}
