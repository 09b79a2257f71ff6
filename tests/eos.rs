//! The end-of-sequence token that ends a request is counted in
//! `usage.completion_tokens` and reported, with its log-probability, in the
//! last delta (empty text), as mlx-lm does.

mod common;

use common::*;
use mlxrt::engine::{Event, FinishReason};

#[test]
fn the_eos_token_is_counted_and_reported_with_its_logprob() {
    let e = engine();
    let mut o = chat("What is the capital of France? Answer in one short sentence.");
    o.max_tokens = 64;
    o.logprobs = true;
    o.top_logprobs = 2;
    let ev = run(&e, o);
    let Some(Event::Done { finish: FinishReason::Stop, stop_index: None, usage }) = ev.last() else {
        panic!("expected the request to end at its end-of-sequence token: {ev:?}")
    };
    let tokens = tokens_of(&ev);
    let logprobs: Vec<_> = ev
        .iter()
        .flat_map(|e| match e {
            Event::Delta { logprobs, .. } => logprobs.clone(),
            _ => vec![],
        })
        .collect();
    assert_eq!(tokens.len(), usage.completion_tokens as usize, "every counted token is reported: {ev:?}");
    assert_eq!(logprobs.len(), tokens.len(), "one log-probability per reported token");
    let eos = *tokens.last().unwrap();
    assert!(e.text().eos_ids.contains(&eos), "the last reported token {eos} is not an end-of-sequence id");
    let last = logprobs.last().unwrap();
    assert_eq!(last.token, eos);
    assert!(last.logprob <= 0.0 && last.logprob.is_finite() && last.top.len() == 2, "{last:?}");
    // The end token makes no text: it comes alone in a last, empty delta.
    let Some(Event::Delta { text, tokens: last_ids, .. }) = ev.iter().rev().nth(1) else { panic!("{ev:?}") };
    assert!(text.is_empty() && last_ids.ends_with(&[eos]), "{ev:?}");
    assert!(text_of(&ev).contains("Paris"), "{}", text_of(&ev));
}
