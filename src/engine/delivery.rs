//! Where a request's events go. Callback sinks run on the delivery thread, so
//! that they never run inside a C ABI call and never stall the scheduler;
//! pull streams get their events pushed straight into their queue (an
//! `Outlet`), so a stream read inside a callback never waits behind it.
//!
//! Either way each request gets exactly one terminal event: an `Outlet`
//! passes on at most one (and sends an error if dropped without one), the
//! delivery thread drops a sink right after its terminal event and gives
//! sinks still open at shutdown an error. The request's in-flight place is
//! released just before its terminal event is delivered, so a host that
//! submits again from (or right after) it is not refused as busy.

use super::request::{Event, EventSink};
use super::Shared;
use crate::error::{Error, ErrorKind};
use crossbeam_channel::{Receiver, Sender};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub(crate) enum Msg {
    /// A request's sink; sent at submit, before the request reaches the
    /// scheduler (so before any of its events).
    Open(u64, Box<dyn EventSink>),
    Event(u64, Event),
    /// The scheduler died: every open request gets an error.
    Poisoned(String),
    Shutdown,
}

pub(crate) type DeliveryTx = Sender<Msg>;

/// The producer's end of one request's events, held by its queued job and
/// then its row.
pub(crate) struct Outlet {
    id: u64,
    to: Target,
    ended: bool,
}

enum Target {
    /// A callback sink opened on the delivery thread.
    Delivery(DeliveryTx),
    /// A pull stream's queue (non-blocking, unbounded).
    Queue(Sender<Event>, Arc<Shared>),
}

impl Outlet {
    pub fn delivery(id: u64, tx: DeliveryTx) -> Outlet {
        Outlet { id, to: Target::Delivery(tx), ended: false }
    }

    pub fn queue(id: u64, tx: Sender<Event>, shared: Arc<Shared>) -> Outlet {
        Outlet { id, to: Target::Queue(tx, shared), ended: false }
    }

    /// Whether the terminal event was sent.
    pub fn is_ended(&self) -> bool {
        self.ended
    }

    /// Sends `ev`, unless the terminal event was already sent.
    pub fn send(&mut self, ev: Event) {
        if self.ended {
            return;
        }
        self.ended = ev.is_terminal();
        match &self.to {
            Target::Delivery(tx) => {
                let _ = tx.send(Msg::Event(self.id, ev));
            }
            Target::Queue(tx, shared) => {
                if self.ended {
                    release(shared);
                }
                let _ = tx.send(ev);
            }
        }
    }
}

impl Drop for Outlet {
    /// A request dropped without a terminal event (a bug, or a panic
    /// unwinding the scheduler) still ends.
    fn drop(&mut self) {
        self.send(Event::Error(Error::internal("the request was dropped by the scheduler")));
    }
}

/// Gives back a finished request's in-flight place.
fn release(shared: &Shared) {
    shared.in_flight.fetch_sub(1, Ordering::AcqRel);
    shared.completed.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn poison_error(why: &str) -> Error {
    Error::new(ErrorKind::EnginePoisoned, format!("the engine failed and cannot continue: {why}"))
}

pub(crate) fn run(rx: Receiver<Msg>, shared: Arc<Shared>) {
    let mut open: HashMap<u64, Box<dyn EventSink>> = HashMap::new();
    let mut poisoned: Option<String> = None;
    let end = |mut sink: Box<dyn EventSink>, ev: &Event| {
        release(&shared);
        deliver(&mut sink, ev);
    };
    for msg in rx.iter() {
        match msg {
            Msg::Open(id, sink) => match &poisoned {
                Some(why) => end(sink, &Event::Error(poison_error(why))),
                None => {
                    open.insert(id, sink);
                }
            },
            Msg::Event(id, ev) if ev.is_terminal() => {
                if let Some(sink) = open.remove(&id) {
                    end(sink, &ev);
                }
            }
            Msg::Event(id, ev) => {
                if let Some(sink) = open.get_mut(&id) {
                    deliver(sink, &ev);
                }
            }
            Msg::Poisoned(why) => {
                for (_, sink) in open.drain() {
                    end(sink, &Event::Error(poison_error(&why)));
                }
                poisoned = Some(why);
            }
            Msg::Shutdown => break,
        }
    }
    let ended = Event::Error(Error::new(ErrorKind::Internal, "the engine was destroyed before the request ended"));
    for (_, sink) in open.drain() {
        end(sink, &ended);
    }
}

/// A panicking sink must not take the delivery thread (and every other
/// request's events) down with it.
fn deliver(sink: &mut Box<dyn EventSink>, ev: &Event) {
    let _ = catch_unwind(AssertUnwindSafe(|| sink.deliver(ev)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::request::{FinishReason, Usage};
    use std::sync::Mutex;

    fn tool_call() -> Event {
        Event::ToolCall { id: "call_0".into(), name: "f".into(), arguments: "{}".into() }
    }

    fn done() -> Event {
        Event::Done { finish: FinishReason::ToolCalls, stop_index: None, usage: Usage::default() }
    }

    /// Tool calls are not terminal: the DONE after them reaches the
    /// callback sink and the pull stream, and the sink is dropped after it.
    #[test]
    fn tool_calls_do_not_end_a_request() {
        let shared = Arc::new(Shared::default());
        shared.in_flight.fetch_add(2, Ordering::AcqRel);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = crossbeam_channel::unbounded();
        let thread = {
            let shared = shared.clone();
            std::thread::spawn(move || run(rx, shared))
        };
        let log = seen.clone();
        tx.send(Msg::Open(1, Box::new(move |ev: &Event| log.lock().unwrap().push(ev.clone())))).unwrap();
        let mut outlet = Outlet::delivery(1, tx.clone());
        for ev in [tool_call(), tool_call(), done()] {
            outlet.send(ev);
        }
        assert!(outlet.is_ended());
        let (qtx, qrx) = crossbeam_channel::unbounded();
        let mut stream = Outlet::queue(2, qtx, shared.clone());
        stream.send(tool_call());
        assert!(!stream.is_ended());
        stream.send(done());
        tx.send(Msg::Shutdown).unwrap();
        thread.join().unwrap();
        assert_eq!(*seen.lock().unwrap(), vec![tool_call(), tool_call(), done()]);
        assert_eq!(qrx.try_iter().collect::<Vec<_>>(), vec![tool_call(), done()]);
        assert_eq!(shared.in_flight.load(Ordering::Acquire), 0, "each request released its place once");
        assert_eq!(shared.completed.load(Ordering::Relaxed), 2);
    }
}
