//! The delivery thread: runs host callbacks so that they never run inside a C
//! ABI call and never stall the scheduler. It guarantees exactly one terminal
//! event per request: a sink is dropped right after its terminal event, later
//! events for it are ignored, and sinks still open at shutdown get an error.
//! It also releases the request's in-flight place just before delivering the
//! terminal event, so a host that submits again from (or right after) it is
//! not refused as busy.

use super::request::{Event, EventSink};
use super::Shared;
use crate::error::{Error, ErrorKind};
use crossbeam_channel::{Receiver, Sender};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub(crate) enum Msg {
    /// A request's sink; sent by the scheduler before any of its events.
    Open(u64, Box<dyn EventSink>),
    Event(u64, Event),
    /// The scheduler died: every open request gets an error.
    Poisoned(String),
    Shutdown,
}

pub(crate) type DeliveryTx = Sender<Msg>;

pub(crate) fn run(rx: Receiver<Msg>, shared: Arc<Shared>) {
    let mut open: HashMap<u64, Box<dyn EventSink>> = HashMap::new();
    let mut poisoned: Option<String> = None;
    let poison_event = |why: &str| {
        Event::Error(Error::new(ErrorKind::EnginePoisoned, format!("the engine failed and cannot continue: {why}")))
    };
    let end = |mut sink: Box<dyn EventSink>, ev: &Event| {
        shared.in_flight.fetch_sub(1, Ordering::AcqRel);
        shared.completed.fetch_add(1, Ordering::Relaxed);
        deliver(&mut sink, ev);
    };
    for msg in rx.iter() {
        match msg {
            Msg::Open(id, sink) => match &poisoned {
                Some(why) => end(sink, &poison_event(why)),
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
                    end(sink, &poison_event(&why));
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
