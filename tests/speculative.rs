//! Speculative decoding by prompt lookup and with a draft model
//! (`speculation` in the request options): greedy output token for token
//! identical to plain decoding, for SmolLM2 and every family's tiny random
//! model, alone and with other rows running; seeded sampled output
//! reproducible; acceptance counts consistent; stop strings and max_tokens
//! inside an accepted run end the request exactly where plain decoding
//! does. Draft models: SmolLM2 drafted by its MLX-folder conversion, a
//! tiny model by its 4-bit copy; unfit draft models refused at creation; the
//! drafter frees its rows.

mod common;

use common::*;
use mlxrt::engine::{Engine, EngineConfig, Event, FinishReason, Input, RequestOptions, Speculation, Usage};
use mlxrt::ErrorKind;
use std::path::{Path, PathBuf};

/// A ~300-token Python function to copy with one rename: lookup drafts long
/// runs of it.
const CODE: &str = r#"def merge_intervals(intervals):
    if not intervals:
        return []
    intervals = sorted(intervals, key=lambda pair: pair[0])
    merged = [list(intervals[0])]
    for start, end in intervals[1:]:
        last = merged[-1]
        if start <= last[1]:
            last[1] = max(last[1], end)
        else:
            merged.append([start, end])
    total = 0
    for start, end in merged:
        total += end - start
    return merged, total


def main():
    data = [(1, 3), (2, 6), (8, 10), (15, 18), (17, 20)]
    merged, total = merge_intervals(data)
    for start, end in merged:
        print(f"{start} -> {end}")
    print("covered:", total)
"#;

fn rewrite_request(max_tokens: u32) -> RequestOptions {
    let user = format!("Rewrite this code, renaming the variable `total` to `covered`. Output the whole code.\n\n```python\n{CODE}```");
    let mut o = RequestOptions::new(Input::Messages(serde_json::json!([{"role": "user", "content": user}])));
    o.max_tokens = max_tokens;
    o.prompt_cache = false;
    o
}

fn ngram(mut o: RequestOptions) -> RequestOptions {
    o.apply_json(r#"{"speculation": "ngram"}"#).unwrap();
    o
}

fn done(ev: &[Event]) -> (FinishReason, Option<usize>, Usage) {
    match ev.last() {
        Some(Event::Done { finish, stop_index, usage }) => (*finish, *stop_index, usage.clone()),
        other => panic!("no DONE event: {other:?}"),
    }
}

fn check_counts(label: &str, u: &Usage) {
    assert!(u.spec_accepted <= u.spec_proposed, "{label}: accepted {} > proposed {}", u.spec_accepted, u.spec_proposed);
    assert!(u.spec_accepted < u.completion_tokens.max(1), "{label}: every accepted draft is an emitted token: {u:?}");
}

#[test]
fn smollm2_greedy_output_is_unchanged_alone_and_batched() {
    let e = engine();
    let plain = run(&e, rewrite_request(160));
    let spec = run(&e, ngram(rewrite_request(160)));
    let (pu, su) = (done(&plain).2, done(&spec).2);
    assert_eq!(tokens_of(&spec), tokens_of(&plain), "speculative greedy tokens differ from plain decoding");
    assert_eq!(text_of(&spec), text_of(&plain));
    assert_eq!((pu.spec_proposed, pu.spec_verify_steps), (0, 0), "speculation is off by default");
    check_counts("smollm2", &su);
    assert!(su.spec_verify_steps > 0 && su.spec_accepted > 0, "a code copy must accept drafts: {su:?}");
    let per_verify = su.spec_accepted as f64 / su.spec_verify_steps as f64;
    eprintln!(
        "smollm2: {} tokens, {} verify steps, {}/{} drafts accepted ({per_verify:.2} per verify)",
        su.completion_tokens, su.spec_verify_steps, su.spec_accepted, su.spec_proposed
    );
    let stats = wait_idle(&e);
    assert!(stats.spec_proposed >= su.spec_proposed as u64 && stats.spec_accepted >= su.spec_accepted as u64);
    assert!(stats.spec_accepted <= stats.spec_proposed && stats.spec_verify_steps >= su.spec_verify_steps as u64);

    // With a plain row beside it (a shorter one, so the speculating row is
    // first batched, then alone): both give their tokens alone.
    let other = || {
        let mut o = chat("Name three colours.");
        o.max_tokens = 24;
        o.stop_at_eos = false;
        o.prompt_cache = false;
        o
    };
    let other_alone = tokens_of(&run(&e, other()));
    let rx_spec = submit(&e, ngram(rewrite_request(160)));
    let rx_other = submit(&e, other());
    let (spec_b, other_b) = (collect(&rx_spec), collect(&rx_other));
    assert_eq!(tokens_of(&spec_b), tokens_of(&plain), "speculating row batched with a plain one");
    assert_eq!(tokens_of(&other_b), other_alone, "plain row batched with a speculating one");
    check_counts("smollm2 batched", &done(&spec_b).2);
}

/// A request to copy `CODE` renaming `from` to `to`.
fn rename_request(from: &str, to: &str, max_tokens: u32) -> RequestOptions {
    let user = format!("Rewrite this code, renaming `{from}` to `{to}`. Output the whole code.\n\n```python\n{CODE}```");
    let mut o = chat(&user);
    o.max_tokens = max_tokens;
    o.prompt_cache = false;
    o
}

/// Two speculating rows and a plain one in one batch (the plain row
/// outlasts them, so every verify step is a batched one): each row gives
/// its tokens alone, both speculating rows accept drafts, and they accept
/// different runs, so the shorter ones leave holes in the KV. A prompt-cache
/// entry left by one of them (gathered across its holes) serves a follow-up
/// turn with the same tokens as without the cache.
#[test]
fn smollm2_rows_speculate_together_in_a_batch() {
    let e = engine();
    let a = || rename_request("total", "covered", 400);
    let b = || rename_request("merged", "joined", 160);
    let long = || {
        let mut o = chat("Write a long story about a lighthouse keeper and a storm.");
        o.max_tokens = 480;
        o.stop_at_eos = false;
        o.prompt_cache = false;
        o
    };
    let alone: Vec<Vec<u32>> = [a(), b(), long()].into_iter().map(|o| tokens_of(&run(&e, o))).collect();
    // Row a alone misses the prompt cache: the three prefill together.
    let mut a_cached = ngram(a());
    a_cached.prompt_cache = true;
    let rx = [submit(&e, a_cached), submit(&e, ngram(b())), submit(&e, long())];
    let got: Vec<Vec<Event>> = rx.iter().map(collect).collect();
    for (i, label) in ["speculating a", "speculating b", "plain"].iter().enumerate() {
        assert_eq!(tokens_of(&got[i]), alone[i], "{label} row batched");
    }
    let (ua, ub) = (done(&got[0]).2, done(&got[1]).2);
    for (label, u) in [("a", &ua), ("b", &ub)] {
        check_counts(label, u);
        assert!(u.spec_verify_steps > 0 && u.spec_accepted > 0, "row {label} must accept drafts while batched: {u:?}");
        eprintln!("batched {label}: {}/{} drafts accepted in {} verify steps", u.spec_accepted, u.spec_proposed, u.spec_verify_steps);
    }
    assert_eq!(done(&got[0]).0, FinishReason::Stop, "row a ends at end of sequence, so it leaves a cache entry");

    let follow = |cache: bool| {
        let user = a().input;
        let Input::Messages(serde_json::Value::Array(mut m)) = user else { panic!("a chat") };
        m.push(serde_json::json!({"role": "assistant", "content": text_of(&got[0])}));
        m.push(serde_json::json!({"role": "user", "content": "Now add a docstring."}));
        chat_request(serde_json::Value::Array(m), 24, cache, 512)
    };
    let (hit, cached) = tokens_and_cached(&e, follow(true));
    let (cold, _) = tokens_and_cached(&e, follow(false));
    assert_eq!(hit, cold, "a follow-up from the batched row's cache entry");
    assert!(cached > ua.prompt_tokens, "the follow-up hits the entry the batched row left: {cached} cached, prompt {}", ua.prompt_tokens);
}

#[test]
fn smollm2_max_tokens_and_stop_strings_end_inside_an_accepted_run() {
    let e = engine();
    let plain = tokens_of(&run(&e, rewrite_request(120)));
    let mut inside_run = 0;
    for m in [7u32, 23, 41, 58, 77, 95] {
        let ev = run(&e, ngram(rewrite_request(m)));
        let (finish, _, u) = done(&ev);
        let n = (m as usize).min(plain.len());
        assert_eq!(tokens_of(&ev), plain[..n], "max_tokens {m}");
        assert_eq!(u.completion_tokens as usize, n, "max_tokens {m}");
        if n == m as usize {
            assert_eq!(finish, FinishReason::Length, "max_tokens {m}");
        }
        check_counts("max_tokens", &u);
        // Drafts are clipped to the budget, so the last verify step of a
        // budget-ended row accepted up to the last token.
        inside_run += (u.spec_accepted > 0) as usize;
    }
    assert!(inside_run > 0, "no run was accepted: the check above did not test anything");

    // A stop string from the middle of the output.
    let text = text_of(&run(&e, rewrite_request(120)));
    let stop = ["covered:", "merged.append", "print("].into_iter().find(|s| text.contains(s)).expect("a stop string in the output");
    let with_stop = |o: RequestOptions| {
        let mut o = o;
        o.stop = vec![stop.to_string()];
        run(&e, o)
    };
    let (p, s) = (with_stop(rewrite_request(120)), with_stop(ngram(rewrite_request(120))));
    assert_eq!(text_of(&s), text_of(&p), "stop {stop:?}");
    assert_eq!(done(&s).0, FinishReason::Stop);
    assert_eq!(done(&s).1, Some(0));
    assert_eq!(done(&s).2.completion_tokens, done(&p).2.completion_tokens, "stop {stop:?}: tokens counted");
}

/// A cancel while a row speculates ends it between steps: its tokens are a
/// prefix of the plain ones, and the request ends `Cancelled`. And an
/// end-of-sequence token inside an accepted run ends the request there.
#[test]
fn smollm2_cancel_and_eos_while_speculating() {
    let e = engine();
    let plain = run(&e, rewrite_request(400));
    assert_eq!(done(&plain).0, FinishReason::Stop, "the rewrite ends with EOS before 400 tokens");
    let spec = run(&e, ngram(rewrite_request(400)));
    assert_eq!(tokens_of(&spec), tokens_of(&plain), "up to and including EOS");
    assert_eq!(done(&spec).0, FinishReason::Stop);
    assert_eq!(done(&spec).2.completion_tokens, done(&plain).2.completion_tokens);

    let (tx, rx) = std::sync::mpsc::channel();
    let handle = e
        .submit(ngram(rewrite_request(400)), Box::new(move |ev: &Event| {
            let _ = tx.send(ev.clone());
        }))
        .unwrap();
    let mut events = vec![];
    loop {
        let ev = rx.recv_timeout(std::time::Duration::from_secs(300)).expect("event");
        if tokens_of(std::slice::from_ref(&ev)).len() + tokens_of(&events).len() >= 40 {
            handle.cancel();
        }
        let end = ev.is_terminal();
        events.push(ev);
        if end {
            break;
        }
    }
    let (finish, _, u) = done(&events);
    let got = tokens_of(&events);
    assert_eq!(finish, FinishReason::Cancelled, "{u:?}");
    assert!(got.len() >= 40 && got.len() < tokens_of(&plain).len(), "{} tokens", got.len());
    assert_eq!(got, tokens_of(&plain)[..got.len()], "a cancelled run's tokens are the plain prefix");
    check_counts("cancelled", &u);
}

#[test]
fn smollm2_seeded_sampling_is_reproducible() {
    let e = engine();
    let sampled = || {
        let mut o = ngram(rewrite_request(64));
        o.apply_json(r#"{"temperature": 0.7, "top_p": 0.95, "seed": 1234}"#).unwrap();
        run(&e, o)
    };
    let (a, b) = (sampled(), sampled());
    assert_eq!(tokens_of(&a), tokens_of(&b), "the same seed gives the same tokens");
    let u = done(&a).2;
    check_counts("sampled", &u);
    assert!(u.spec_verify_steps > 0, "sampled rows speculate: {u:?}");
    eprintln!("sampled: {}/{} drafts accepted in {} verify steps", u.spec_accepted, u.spec_proposed, u.spec_verify_steps);
}

#[test]
fn engine_default_and_bad_options() {
    let mut o = RequestOptions::new(Input::Tokens(vec![1, 2, 3]));
    for bad in [
        r#""fast""#,
        r#"{"type": "ngram", "num_tokens": 0}"#,
        r#"{"type": "draft", "min_match": 2}"#,
        r#"{"type": "draft", "num_tokens": 65}"#,
        "3",
        r#"{"num_tokens": 4}"#,
    ] {
        let err = o.apply_json(&format!(r#"{{"speculation": {bad}}}"#)).unwrap_err();
        assert!(err.message.contains("speculation"), "{bad}: {err}");
    }
    o.apply_json(r#"{"speculation": {"type": "ngram", "num_tokens": 4}}"#).unwrap();
    assert_eq!(o.speculation, Some(Speculation::Ngram { num_tokens: 4, min_match: 2 }));
    o.apply_json(r#"{"speculation": {"type": "ngram", "min_match": 1}}"#).unwrap();
    assert_eq!(o.speculation, Some(Speculation::Ngram { num_tokens: 10, min_match: 1 }));
    assert!(o.apply_json(r#"{"speculation": {"type": "ngram", "min_match": 5}}"#).is_err());
    o.apply_json(r#"{"speculation": "off"}"#).unwrap();
    assert_eq!(o.speculation, Some(Speculation::Off));
    o.apply_json(r#"{"speculation": "draft"}"#).unwrap();
    assert_eq!(o.speculation, Some(Speculation::Draft { num_tokens: 3 }));
    o.apply_json(r#"{"speculation": {"type": "draft", "num_tokens": 5}}"#).unwrap();
    assert_eq!(o.speculation, Some(Speculation::Draft { num_tokens: 5 }));

    // The engine's default applies to requests that do not choose, and a
    // request can turn it off.
    let mut cfg = EngineConfig::new(model_path());
    cfg.speculation = Speculation::Ngram { num_tokens: 6, min_match: 2 };
    let e = Engine::new(cfg).unwrap();
    let u = done(&run(&e, rewrite_request(40))).2;
    assert!(u.spec_verify_steps > 0 && u.spec_proposed <= 6 * u.spec_verify_steps, "{u:?}");
    let mut off = rewrite_request(40);
    off.apply_json(r#"{"speculation": "off"}"#).unwrap();
    assert_eq!(done(&run(&e, off)).2.spec_verify_steps, 0);

    // "draft" needs a draft model: refused at submit.
    let err = e.prepare(draft(rewrite_request(8))).err().expect("draft without a draft model");
    assert_eq!(err.kind, ErrorKind::InvalidArgument, "{err}");
    assert!(err.message.contains("draft_model_path"), "{err}");
    let mut cfg = EngineConfig::new(model_path());
    cfg.speculation = Speculation::Draft { num_tokens: 3 };
    assert_eq!(Engine::new(cfg).err().expect("Draft without a draft model").kind, ErrorKind::InvalidArgument);
}

/// A tiny random model of `family` ("f32" or "q4"): the family tests' copy
/// when it is there, else built here.
fn tiny(family: &str, variant: &str) -> PathBuf {
    let name = format!("tiny-{family}-{variant}");
    let script = repo_root().join("tests/oracle/make_tiny.py");
    let shared = repo_root().join("target/oracle/families").join(&name);
    if newer_than(&shared.join("config.json"), std::slice::from_ref(&script)) {
        return shared;
    }
    let own = repo_root().join("target/oracle/speculative").join(&name);
    if !newer_than(&own.join("config.json"), &[script]) {
        let _ = std::fs::remove_dir_all(&own);
        make_tiny(family, &own, if variant == "q4" { &["--quantize", "4"] } else { &[] });
    }
    own
}

fn lookup1(mut o: RequestOptions) -> RequestOptions {
    o.apply_json(r#"{"speculation": {"type": "ngram", "min_match": 1}}"#).unwrap();
    o
}

/// Prompt ids with repeats (lookup finds matches) and a random tail.
fn repeating_prompt(len: usize, seed: u32) -> Vec<u32> {
    let mut x = seed.wrapping_mul(2654435761) | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        100 + x % 4000
    };
    let motif: Vec<u32> = (0..7).map(|_| next()).collect();
    (0..len).map(|i| if i % 19 < 12 { motif[i % 7] } else { next() }).collect()
}

/// Greedy, EOS ignored: plain and speculative runs of every family give the
/// same tokens, one request at a time and three at once. Two prompts per
/// model: `P + O + P`, where `O` is the model's own output after `P`, and
/// `P`; lookup matches single tokens (random weights rarely repeat 2-grams).
/// Random models seldom agree with a draft, so these runs mostly test the
/// verify forward's first position and the rollback of rejected drafts;
/// SmolLM2 above tests long accepted runs. Hybrid models (recurrent
/// layers) speculate while a row is alone, replaying the accepted run from a
/// checkpoint of the state after a rejection; sliding-window layers only
/// before their ring wraps (the tiny Gemmas' 8-token windows: never here).
#[test]
fn every_family_tiny_model_gives_plain_greedy_tokens() {
    let families = [
        ("llama", "f32"),
        ("llama", "q4"),
        ("qwen2", "f32"),
        ("qwen3", "f32"),
        ("qwen3", "q4"),
        ("qwen3_moe", "f32"),
        ("gemma3_text", "f32"),
        ("gemma4_text", "f32"),
        ("qwen3_5", "f32"),
        ("qwen3_next", "f32"),
    ];
    let steps = 96;
    for (family, variant) in families {
        let label = format!("{family}-{variant}");
        let mut cfg = EngineConfig::new(tiny(family, variant));
        cfg.max_rows = 4;
        let e = Engine::new(cfg).unwrap_or_else(|err| panic!("{label}: {err}"));
        let p = repeating_prompt(24, 1);
        let o = tokens_of(&run(&e, token_request(&p, steps, None)));
        let echo: Vec<u32> = p.iter().chain(&o).chain(&p).copied().collect();
        let (mut verified, mut accepted) = (0, 0);
        for prompt in [&echo, &p] {
            let plain = tokens_of(&run(&e, token_request(prompt, steps, None)));
            let ev = run(&e, lookup1(token_request(prompt, steps, None)));
            assert_eq!(tokens_of(&ev), plain, "{label}: prompt of {}", prompt.len());
            let u = done(&ev).2;
            check_counts(&label, &u);
            (verified, accepted) = (verified + u.spec_verify_steps, accepted + u.spec_accepted);
        }
        // Three at once, two of them speculating (all the way through: they
        // run as long), one plain: each as alone.
        let alone = tokens_of(&run(&e, token_request(&echo, steps, None)));
        let rx = [
            submit(&e, lookup1(token_request(&echo, steps, None))),
            submit(&e, lookup1(token_request(&p, steps, None))),
            submit(&e, token_request(&p, steps / 2, None)),
        ];
        let got: Vec<Vec<Event>> = rx.iter().map(collect).collect();
        assert_eq!(tokens_of(&got[0]), alone, "{label}: speculating row batched");
        assert_eq!(tokens_of(&got[1]), o, "{label}: second speculating row batched");
        assert_eq!(tokens_of(&got[2]), o[..steps / 2], "{label}: plain row batched");
        let batched = done(&got[0]).2.spec_verify_steps + done(&got[1]).2.spec_verify_steps;
        eprintln!("{label}: identical; {verified} verify steps alone ({accepted} drafts accepted), {batched} batched");
        // Hybrids (recurrent state: checkpoint and replay) verify alone;
        // several rows verify together only on dense full-attention caches.
        if !family.starts_with("gemma") {
            assert!(verified > 0, "{label}: nothing was verified, the comparison tested nothing");
        }
        if !family.starts_with("qwen3_5") && !family.starts_with("qwen3_next") && !family.starts_with("gemma") {
            assert!(batched > 0, "{label}: no verify step ran batched");
        }
    }
}

/// The draft model of these tests: SmolLM2 as an MLX folder (the parity
/// oracle's conversion of the GGUF: the same 4-bit weights through the
/// other loader), so drafts mostly agree. No smaller model with the same
/// tokenizer is installable here; the benchmark drafts with a Q4_0
/// requantization (`scripts/bench.sh speculative`), and the tiny models
/// below give the rejections.
fn draft_model() -> PathBuf {
    parity_oracle().folder.clone()
}

fn draft_engine(target: &Path, draft: &Path) -> Engine {
    let mut cfg = EngineConfig::new(target);
    cfg.draft_model_path = Some(draft.to_path_buf());
    cfg.max_rows = 4;
    Engine::new(cfg).unwrap_or_else(|e| panic!("engine with draft {}: {e}", draft.display()))
}

fn draft(mut o: RequestOptions) -> RequestOptions {
    o.apply_json(r#"{"speculation": "draft"}"#).unwrap();
    o
}

fn off(mut o: RequestOptions) -> RequestOptions {
    o.apply_json(r#"{"speculation": "off"}"#).unwrap();
    o
}

/// Greedy output with a draft model (the engine's default once it has one)
/// is token for token the plain output: chat prompts, the code rewrite and
/// a raw token prompt; alone and two rows at once (both draft inside the
/// batch). Afterwards the drafter holds no rows.
#[test]
fn smollm2_draft_model_greedy_output_is_unchanged() {
    let e = draft_engine(&model_path(), &draft_model());
    let chat_req = |user: &str, n: u32| {
        let mut o = chat(user);
        o.max_tokens = n;
        o.prompt_cache = false;
        o
    };
    let prompts = [
        chat_req("Write a short poem about the sea.", 96),
        chat_req("Explain in two sentences what a hash map is.", 96),
        rewrite_request(128),
        token_request(&[1, 504, 3458, 282, 2767, 314, 253, 1345, 28, 1312, 253], 64, None),
    ];
    let (mut proposed, mut accepted, mut verified) = (0, 0, 0);
    for (i, o) in prompts.iter().enumerate() {
        let plain = run(&e, off(o.clone()));
        let spec = run(&e, o.clone());
        assert_eq!(tokens_of(&spec), tokens_of(&plain), "prompt {i}: draft-speculative greedy tokens differ from plain");
        assert_eq!(done(&spec).0, done(&plain).0, "prompt {i}");
        assert_eq!(done(&plain).2.spec_verify_steps, 0, "prompt {i}: \"off\" turns the default off");
        let u = done(&spec).2;
        check_counts(&format!("draft prompt {i}"), &u);
        assert!(u.spec_verify_steps > 0, "prompt {i}: a draft model is the default speculation: {u:?}");
        assert!(u.spec_proposed <= 3 * u.spec_verify_steps, "prompt {i}: γ 3: {u:?}");
        (proposed, accepted, verified) = (proposed + u.spec_proposed, accepted + u.spec_accepted, verified + u.spec_verify_steps);
    }
    eprintln!("draft MLX folder -> GGUF: {accepted}/{proposed} drafts accepted in {verified} verify steps");
    assert!(accepted * 2 > proposed, "a draft of the same weights agrees mostly: {accepted}/{proposed}");

    // Two at once; the shorter one ends first.
    let (long, short) = (prompts[2].clone(), prompts[0].clone());
    let (long_alone, short_alone) = (tokens_of(&run(&e, off(long.clone()))), tokens_of(&run(&e, off(short.clone()))));
    let rx = [submit(&e, long), submit(&e, short)];
    let got: Vec<Vec<Event>> = rx.iter().map(collect).collect();
    assert_eq!(tokens_of(&got[0]), long_alone, "drafting row batched");
    assert_eq!(tokens_of(&got[1]), short_alone, "other drafting row batched");
    for (i, g) in got.iter().enumerate() {
        let u = done(g).2;
        check_counts("draft batched", &u);
        assert!(u.spec_verify_steps > 0, "batched row {i} drafts: {u:?}");
    }

    // A cancelled drafting row is freed too.
    let mut o = rewrite_request(400);
    o.stop_at_eos = false;
    let (tx, rx) = std::sync::mpsc::channel();
    let h = e.submit(o, Box::new(move |ev: &Event| {
        let _ = tx.send(ev.clone());
    }))
    .unwrap();
    let mut n = 0;
    loop {
        let ev = rx.recv_timeout(std::time::Duration::from_secs(300)).expect("event");
        n += tokens_of(std::slice::from_ref(&ev)).len();
        if n >= 20 {
            h.cancel();
        }
        if ev.is_terminal() {
            assert_eq!(done(&[ev]).0, FinishReason::Cancelled);
            break;
        }
    }
    let stats = wait_idle(&e);
    assert_eq!(stats.spec_draft_rows, 0, "the drafter keeps no rows once requests ended: {stats:?}");
    assert!(stats.spec_accepted <= stats.spec_proposed && stats.spec_proposed >= proposed as u64);
}

#[test]
fn smollm2_draft_model_seeded_sampling_is_reproducible() {
    let e = draft_engine(&model_path(), &draft_model());
    let sampled = || {
        let mut o = chat("Tell me a fact about owls.");
        o.max_tokens = 64;
        o.prompt_cache = false;
        o.apply_json(r#"{"temperature": 0.7, "top_p": 0.95, "seed": 99}"#).unwrap();
        run(&e, o)
    };
    let (a, b) = (sampled(), sampled());
    assert_eq!(tokens_of(&a), tokens_of(&b), "the same seed gives the same tokens");
    let u = done(&a).2;
    check_counts("draft sampled", &u);
    assert!(u.spec_verify_steps > 0 && u.spec_accepted > 0, "sampled rows draft: {u:?}");
    eprintln!("draft sampled: {}/{} drafts accepted in {} verify steps", u.spec_accepted, u.spec_proposed, u.spec_verify_steps);
    assert_eq!(wait_idle(&e).spec_draft_rows, 0);
}

/// A tiny random model drafted by its own 4-bit copy: greedy tokens equal
/// plain ones, with long prompts (chunked catch-up) and γ 5.
#[test]
fn tiny_model_draft_gives_plain_greedy_tokens() {
    let e = draft_engine(&tiny("llama", "f32"), &tiny("llama", "q4"));
    let mut accepted = 0;
    for (len, seed) in [(24, 1), (700, 2)] {
        let p = repeating_prompt(len, seed);
        let plain = tokens_of(&run(&e, off(token_request(&p, 80, None))));
        let mut o = token_request(&p, 80, None);
        o.apply_json(r#"{"speculation": {"type": "draft", "num_tokens": 5}}"#).unwrap();
        let ev = run(&e, o);
        assert_eq!(tokens_of(&ev), plain, "prompt of {len}");
        let u = done(&ev).2;
        check_counts("tiny draft", &u);
        assert!(u.spec_proposed <= 5 * u.spec_verify_steps && u.spec_verify_steps > 0, "{u:?}");
        accepted += u.spec_accepted;
    }
    assert!(accepted > 0, "the 4-bit copy never agreed: the comparison tested nothing");
    assert_eq!(wait_idle(&e).spec_draft_rows, 0);
}

/// Unfit draft models fail engine creation with INVALID_ARGUMENT: another
/// vocabulary (the tiny model's tokenizer with two tokens swapped), and
/// caches that cannot be cut back (a hybrid model's recurrent state, a
/// sliding-window ring).
#[test]
fn unfit_draft_models_are_refused() {
    let src = tiny("llama", "f32");
    let other = repo_root().join("target/oracle/speculative/tiny-llama-othervocab");
    std::fs::create_dir_all(&other).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), other.join(f)).unwrap();
    }
    let mut tok: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(src.join("tokenizer.json")).unwrap()).unwrap();
    let vocab = tok["model"]["vocab"].as_object_mut().expect("a BPE vocab");
    let key = |id: u64, v: &serde_json::Map<String, serde_json::Value>| v.iter().find(|(_, x)| x.as_u64() == Some(id)).unwrap().0.clone();
    let (a, b) = (key(1000, vocab), key(1001, vocab));
    vocab.insert(a, 1001.into());
    vocab.insert(b, 1000.into());
    std::fs::write(other.join("tokenizer.json"), tok.to_string()).unwrap();

    let target = tiny("llama", "f32");
    for (draft, says) in [
        (other, "token 1000 differs"),
        (tiny("qwen3_5", "f32"), "recurrent-state or sliding-window"),
        (tiny("gemma3_text", "f32"), "recurrent-state or sliding-window"),
    ] {
        let mut cfg = EngineConfig::new(&target);
        cfg.draft_model_path = Some(draft.clone());
        let err = Engine::new(cfg).err().unwrap_or_else(|| panic!("{} was accepted as a draft", draft.display()));
        assert_eq!(err.kind, ErrorKind::InvalidArgument, "{}: {err}", draft.display());
        assert!(err.message.contains("draft_model_path") && err.message.contains(says), "{}: {err}", draft.display());
    }
}
