//! Calling mlxrt from inside a callback (the header allows any function
//! there): destroying another engine still joins that engine's delivery
//! thread, and a pull stream read inside a callback delivers.

mod common;

use common::*;
use mlxrt::engine::Event;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// Marks, after a pause, that it was dropped: a sink holding it is dropped by
/// its engine's delivery thread after the terminal event, so the mark shows
/// whether a destroy waited for that thread.
struct SlowDrop(Arc<AtomicBool>);

impl Drop for SlowDrop {
    fn drop(&mut self) {
        std::thread::sleep(Duration::from_millis(300));
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn destroying_another_engine_from_a_callback_joins_its_delivery_thread() {
    let a = engine();
    let b = Arc::new(Mutex::new(Some(engine())));
    let dropped = Arc::new(AtomicBool::new(false));
    let guard = SlowDrop(dropped.clone());
    let mut long = chat("Count from one to one thousand.");
    long.max_tokens = 2000;
    long.stop_at_eos = false;
    let b_engine = b.lock().unwrap();
    b_engine.as_ref().unwrap().submit(long, Box::new(move |_: &Event| {
        let _ = &guard;
    }))
    .expect("submit to B");
    drop(b_engine);

    // Destroy B from A's callback (A's delivery thread), then look whether
    // B's request had been fully delivered (its sink dropped) by then.
    let (tx, rx) = mpsc::channel();
    let (b2, dropped2) = (b.clone(), dropped.clone());
    let mut short = chat("Hi");
    short.max_tokens = 2;
    a.submit(short, Box::new(move |_: &Event| {
        if let Some(engine_b) = b2.lock().unwrap().take() {
            drop(engine_b);
            let _ = tx.send(dropped2.load(Ordering::SeqCst));
        }
    }))
    .expect("submit to A");
    let joined = rx.recv_timeout(Duration::from_secs(300)).expect("A's callback destroyed B");
    assert!(joined, "destroying engine B from engine A's callback returned before B's delivery thread finished");
}

/// Runs a compiled C test against the library this test run built.
fn run_c(cmd: &mut Command, what: &str) {
    let out = this_library(cmd).arg(model_path()).output().expect("run the C test");
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    assert!(out.status.success(), "{what} failed ({})", out.status);
    assert!(stderr.contains("all checks passed"), "{what}: no success line");
}

#[test]
fn pull_stream_read_inside_a_callback_delivers() {
    let bin = compile_c("test_stream_in_callback", "test_stream_in_callback", &[]);
    run_c(&mut Command::new(bin), "stream in callback");
}

#[test]
fn pull_stream_read_inside_a_callback_under_address_sanitizer() {
    let bin = compile_c("test_stream_in_callback", "test_stream_in_callback_asan", &["-fsanitize=address", "-fno-omit-frame-pointer"]);
    run_c(Command::new(bin).env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0"), "stream in callback (ASan)");
}
