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
