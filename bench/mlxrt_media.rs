//! The mlxrt side of bench/media.py: time to first token of image prompts,
//! printed as one JSON line.
//!
//!   MLXRT_BENCH_KERNELS=auto|stock mlxrt_media MODEL_FOLDER IMAGE...
//!
//! For each image (each a new picture to the engine): `cold_ms`, the TTFT of
//! "<image> Describe this picture." (the tower runs), then `repeat_ms`, the
//! TTFT of "<image> What colour is it?" (same image, other text: the prompt
//! cache is off, the encoder cache supplies the tower's output). One token
//! each, greedy. Also `tower_runs`, `encoder_cache_hits` and `provenance`.

use mlxrt::engine::{Engine, EngineConfig, Event, Input, RequestOptions};
use serde_json::json;
use std::sync::mpsc;
use std::time::Instant;

#[path = "provenance.rs"]
mod provenance;

fn ttft_ms(e: &Engine, image: &str, text: &str) -> f64 {
    let messages = json!([{"role": "user", "content": [{"type": "image", "path": image}, {"type": "text", "text": text}]}]);
    let mut o = RequestOptions::new(Input::Messages(messages));
    o.max_tokens = 1;
    o.stop_at_eos = false;
    o.prompt_cache = false;
    let (tx, rx) = mpsc::channel();
    let t = Instant::now();
    e.submit(o, Box::new(move |ev: &Event| {
        let _ = tx.send((ev.clone(), Instant::now()));
    }))
    .expect("submit");
    let mut first = None;
    for (ev, at) in rx.iter() {
        match ev {
            Event::Delta { .. } => first = first.or(Some(at)),
            Event::Done { .. } => break,
            Event::Error(err) => panic!("request failed: {err}"),
            Event::ToolCall { .. } => {}
        }
    }
    (first.expect("a token") - t).as_secs_f64() * 1e3
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    assert!(args.len() >= 3, "usage: mlxrt_media MODEL_FOLDER IMAGE...");
    let kernels = provenance::kernels();
    let mut c = EngineConfig::new(&args[1]);
    c.kernels = kernels;
    c.prompt_cache_bytes = 0;
    let e = Engine::new(c).expect("load");
    let (mut cold, mut repeat) = (vec![], vec![]);
    for image in &args[2..] {
        cold.push(ttft_ms(&e, image, "Describe this picture."));
        repeat.push(ttft_ms(&e, image, "What colour is it?"));
    }
    let s = e.stats();
    println!(
        "{}",
        json!({"cold_ms": cold, "repeat_ms": repeat, "tower_runs": s.tower_runs,
               "encoder_cache_hits": s.encoder_cache_hits, "provenance": provenance::json(kernels)})
    );
}
