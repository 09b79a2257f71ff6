//! Continuous batching on the real model: a request's greedy output is the
//! same alone and batched with others of different lengths.

mod common;

use common::*;
use mlxrt::engine::{Event, Input, RequestOptions};
use std::sync::mpsc;

const PROMPTS: [&str; 8] = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers and explain why each is prime, in detail please.",
    "Hi!",
    "Translate 'good morning' into Spanish, French and German.",
    "Why is the sky blue? Give a short answer.",
    "Describe a cat in one sentence.",
    "What is 12 times 7? Show your reasoning step by step and then give the final answer.",
];
const TOKENS: u32 = 32;

fn opts(user: &str) -> RequestOptions {
    let mut o = RequestOptions::new(Input::Messages(serde_json::json!([{"role": "user", "content": user}])));
    o.max_tokens = TOKENS;
    o.stop_at_eos = false;
    o
}

#[test]
fn batched_greedy_equals_alone() {
    let e = engine();
    let alone: Vec<Vec<u32>> = PROMPTS.iter().map(|p| tokens_of(&run(&e, opts(p)))).collect();
    let receivers: Vec<_> = PROMPTS
        .iter()
        .map(|p| {
            let (tx, rx) = mpsc::channel();
            e.submit(opts(p), Box::new(move |ev: &Event| {
                let _ = tx.send(ev.clone());
            }))
            .unwrap();
            rx
        })
        .collect();
    for (i, rx) in receivers.iter().enumerate() {
        let ev = collect(rx);
        assert_eq!(tokens_of(&ev), alone[i], "prompt {i} differs when batched");
        assert_eq!(alone[i].len(), TOKENS as usize);
    }
    assert_eq!(e.stats().in_flight, 0, "released before the terminal events");
    let s = wait_idle(&e);
    assert_eq!((s.active, s.queued, s.kv_reserved, s.kv_bytes), (0, 0, 0, 0), "{s:?}");
}

#[test]
fn a_request_kv_cache_is_allocated_once_for_its_reach() {
    // The cache is allocated for prompt + max_tokens when the request starts
    // and never grows: a 300-token answer runs past mlx-lm's 256-position
    // growth step, and every sample of kv_bytes while it runs is the whole
    // reach (f32 keys and values of every layer), a partly grown cache none.
    let e = engine();
    let prompt: Vec<u32> = (0..40u32).map(|i| 100 + i * 7).collect();
    let mut o = RequestOptions::new(Input::Tokens(prompt.clone()));
    o.max_tokens = 300;
    o.stop_at_eos = false;
    let want = (prompt.len() + 300) * e.info().kv_bytes_per_token;
    let rx = submit(&e, o);
    let mut seen = std::collections::BTreeSet::new();
    let events = collect_polling(&rx, std::time::Duration::from_millis(2), || {
        seen.insert(e.stats().kv_bytes);
    });
    assert_eq!(tokens_of(&events).len(), 300);
    seen.remove(&0);
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![want], "kv_bytes while running");
}
