//! Calling mlxrt from inside a callback (the header allows any function
//! there): destroying another engine still joins that engine's delivery
//! thread, and a pull stream read inside a callback delivers.

mod common;

use common::*;
use mlxrt::engine::Event;
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
