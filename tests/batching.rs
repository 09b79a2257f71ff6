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
