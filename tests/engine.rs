//! The engine end to end on the real default model.

mod common;

use common::*;
use mlxrt::engine::{Event, FinishReason};

#[test]
fn answers_a_chat_question_and_reports_usage() {
    let e = engine();
    let mut o = chat("What is the capital of France?");
    o.max_tokens = 24;
    let ev = run(&e, o);
    let text = text_of(&ev);
    assert!(text.contains("Paris"), "{text:?}");
    let Some(Event::Done { finish, usage, .. }) = ev.last() else { panic!("{ev:?}") };
    assert_eq!(*finish, FinishReason::Stop, "SmolLM ends this answer with <|im_end|>");
    assert!(usage.prompt_tokens > 20 && usage.completion_tokens > 3, "{usage:?}");
    assert!(usage.ttft_ms > 0.0 && usage.decode_tokens_per_s > 0.0, "{usage:?}");
    assert_eq!(ev.iter().filter(|e| e.is_terminal()).count(), 1);
}

/// A prompt of about 600 tokens (the prompt cache snapshots prompts of 256
/// or more).
fn long_prompt(topic: &str) -> String {
    let mut s = format!("Notes about {topic}.\n");
    for i in 0..60 {
        s += &format!("Note {i}: the {topic} report for week {i} was filed on time.\n");
    }
    s + "Summarise the notes."
}

/// Every span reaches the trace callback and the stats summary: kinds,
/// counts, totals, p95 and the model-call counter agree; a callback that
/// panics does not stop the engine.
#[test]
fn trace_spans_reach_the_callback_and_the_stats() {
    use mlxrt::engine::{EngineConfig, Input, RequestOptions, Span, SpanKind, SPAN_KINDS};
    use std::sync::{Arc, Mutex};
    let seen: Arc<Mutex<Vec<Span>>> = Arc::default();
    let mut c = EngineConfig::new(model_path());
    let log = seen.clone();
    c.trace = Some(Arc::new(move |s: &Span| log.lock().unwrap().push(*s)));
    let e = mlxrt::engine::Engine::new(c).unwrap();
    let req = |topic: &str, n| {
        let mut o = RequestOptions::new(Input::Prompt(long_prompt(topic)));
        o.max_tokens = n;
        o.stop_at_eos = false;
        o
    };
    // `a` decodes long enough that `b` (whose prefill may start after `a`'s)
    // is certain to join its decode batch.
    let (a, b) = (submit(&e, req("shipping", 160)), submit(&e, req("billing", 6)));
    collect(&a);
    collect(&b);
    // The same prompt again: a prompt-cache hit restored.
    let again = run(&e, req("shipping", 4));
    let Some(Event::Done { usage, .. }) = again.last() else { panic!("{again:?}") };
    assert!(usage.cached_tokens > 0, "{usage:?}");
    let stats = wait_idle(&e);
    let spans = seen.lock().unwrap().clone();

    let of = |k: SpanKind| spans.iter().filter(|s| s.kind == k).collect::<Vec<_>>();
    for k in SpanKind::ALL {
        assert!(!of(k).is_empty(), "no {} span: {:?}", k.name(), stats.spans);
        let st = stats.spans[k as usize];
        assert_eq!(st.count as usize, of(k).len(), "{}: stats and callback disagree", k.name());
        let total: f64 = of(k).iter().map(|s| s.duration.as_secs_f64() * 1e3).sum();
        assert!((st.total_ms - total).abs() <= 1e-6 * total.max(1.0), "{}: total {} vs {total}", k.name(), st.total_ms);
        let max = of(k).iter().map(|s| s.duration.as_secs_f64() * 1e3).fold(0.0, f64::max);
        assert!(st.p95_ms > 0.0 && st.p95_ms <= max * 1.05 + 1e-3, "{}: p95 {} max {max}", k.name(), st.p95_ms);
    }
    assert_eq!(SPAN_KINDS, SpanKind::ALL.len());
    assert_eq!(stats.model_calls as usize, of(SpanKind::Forward).len(), "one forward span per model call");
    // At least one decode step per token after each request's first.
    assert!(stats.model_calls >= 159 + 3 + 2, "{}", stats.model_calls);
    assert!(spans.iter().all(|s| s.iteration <= stats.iterations), "iterations {}", stats.iterations);
    assert!(spans.iter().all(|s| s.iteration >= 1 || s.kind == SpanKind::LookupRestore), "only lookups come before the first iteration");
    let forward_rows = of(SpanKind::Forward).iter().map(|s| s.rows).max().unwrap();
    assert_eq!(forward_rows, 2, "the two requests share forwards");
    assert_eq!(of(SpanKind::Deliver).iter().map(|s| s.tokens).sum::<usize>(), 160 + 6 + 4, "each token delivered once");
    assert!(of(SpanKind::Snapshot).iter().all(|s| s.rows == 1 && s.tokens >= 256));
    if let Some(w) = spans.windows(2).find(|w| w[0].start + w[0].duration > w[1].start) {
        panic!("spans come in order, one at a time: {:?} overlaps {:?}", w[0], w[1]);
    }
    drop(e);

    // A callback that panics is contained: the requests still complete.
    let mut c = EngineConfig::new(model_path());
    c.trace = Some(Arc::new(|_: &Span| panic!("a broken trace callback")));
    let e = mlxrt::engine::Engine::new(c).unwrap();
    let ev = run(&e, req("panics", 4));
    assert!(matches!(ev.last(), Some(Event::Done { .. })), "{ev:?}");
    assert!(wait_idle(&e).spans[SpanKind::Forward as usize].count >= 4);
}
