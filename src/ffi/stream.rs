//! Pull streams: a request whose events the caller takes one at a time with
//! `mlxrt_stream_next` instead of receiving callbacks (what Swift's
//! AsyncSequence or a simple loop wants).

use super::args::{reference, versioned};
use super::engine::mlxrt_engine;
use super::error::{guard, guard_value, mlxrt_error, mlxrt_status};
use super::event::{mlxrt_event, OwnedEvent};
use super::out::{put, put_box, required, take_box};
use super::request::{default_params, options_from, mlxrt_request_params, PARAMS_V1_SIZE};
use crate::engine::{Event, RequestHandle};
use crate::error::{Error, ErrorKind};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use std::sync::Mutex;
use std::time::Duration;

/// A request read as a stream of events. Use it from one thread at a time
/// (calls are serialized); free it with `mlxrt_stream_free`.
pub struct mlxrt_stream {
    inner: Mutex<StreamState>,
    handle: RequestHandle,
}

struct StreamState {
    rx: Receiver<Event>,
    /// The event last returned (its buffers live until the next call).
    current: Option<OwnedEvent>,
    ended: bool,
}

/// Submits a request like `mlxrt_request_submit`, but its events are read
/// with `mlxrt_stream_next`. They queue in the stream until read (at most one
/// per generated token plus the terminal event, so the queue is bounded by
/// the request's `max_tokens`); reading slowly never blocks the engine or
/// other requests. They do not pass through the delivery thread, so a stream
/// may also be read inside an event callback. On failure `*out_stream` is
/// NULL.
#[no_mangle]
pub extern "C" fn mlxrt_request_submit_stream(
    engine: *const mlxrt_engine,
    params: *const mlxrt_request_params,
    out_stream: *mut *mut mlxrt_stream,
    error: *mut *mut mlxrt_error,
) -> mlxrt_status {
    guard(error, || {
        required(out_stream, "out_stream")?;
        let engine = &reference(engine, "engine")?.engine;
        let p = versioned(params, default_params(), PARAMS_V1_SIZE, "params")?;
        let prepared = engine.prepare(options_from(&p)?)?;
        let (handle, rx) = engine.enqueue_stream(prepared);
        let stream = mlxrt_stream { inner: Mutex::new(StreamState { rx, current: None, ended: false }), handle };
        put_box(out_stream, stream);
        Ok(())
    })
}

/// Waits up to `timeout_ms` (negative = no limit, 0 = just look) for the
/// stream's next event and points `*out_event` at it; the event and its
/// buffers stay valid until the next call on this stream or its free.
/// Returns OK with an event, TIMEOUT when none came in time (`*out_event`
/// NULL), and END_OF_STREAM once the terminal event (DONE or ERROR) has been
/// returned.
#[no_mangle]
pub extern "C" fn mlxrt_stream_next(
    stream: *mut mlxrt_stream,
    timeout_ms: i32,
    out_event: *mut *const mlxrt_event,
    error: *mut *mut mlxrt_error,
) -> mlxrt_status {
    let mut status = mlxrt_status::Ok;
    let s = guard(error, || {
        required(out_event, "out_event")?;
        let stream = reference(stream as *const mlxrt_stream, "stream")?;
        let mut st = stream.inner.lock().map_err(|_| Error::internal("stream lock poisoned"))?;
        st.current = None;
        if st.ended {
            status = mlxrt_status::EndOfStream;
            return Ok(());
        }
        let got = if timeout_ms < 0 {
            st.rx.recv().map_err(|_| RecvTimeoutError::Disconnected)
        } else {
            st.rx.recv_timeout(Duration::from_millis(timeout_ms as u64))
        };
        match got {
            Ok(ev) => {
                st.ended = ev.is_terminal();
                st.current = Some(OwnedEvent::new(&ev, stream.handle.id()));
                // The event lives in the stream until the next call or the free.
                put(out_event, &st.current.as_ref().expect("just set").event as *const mlxrt_event);
            }
            Err(RecvTimeoutError::Timeout) => status = mlxrt_status::Timeout,
            Err(RecvTimeoutError::Disconnected) => {
                return Err(Error::new(ErrorKind::Internal, "the stream's request ended without a terminal event"))
            }
        }
        Ok(())
    });
    if s == mlxrt_status::Ok {
        status
    } else {
        s
    }
}

/// Cancels the stream's request (see `mlxrt_request_cancel`); its terminal
/// event still comes through `mlxrt_stream_next`.
#[no_mangle]
pub extern "C" fn mlxrt_stream_cancel(stream: *const mlxrt_stream, error: *mut *mut mlxrt_error) -> mlxrt_status {
    guard(error, || {
        reference(stream, "stream")?.handle.cancel();
        Ok(())
    })
}

/// The id of the stream's request; 0 for NULL.
#[no_mangle]
pub extern "C" fn mlxrt_stream_request_id(stream: *const mlxrt_stream) -> u64 {
    guard_value(0, || reference(stream, "stream").map_or(0, |s| s.handle.id()))
}

/// Frees a stream. A request still running is cancelled (nobody would read
/// its events). NULL is a no-op.
#[no_mangle]
pub extern "C" fn mlxrt_stream_free(stream: *mut mlxrt_stream) {
    guard_value((), || {
        if let Some(s) = take_box(stream) {
            let ended = s.inner.lock().map(|st| st.ended).unwrap_or(true);
            if !ended {
                s.handle.cancel();
            }
        }
    })
}
