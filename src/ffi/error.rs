//! Status codes, error objects and the panic boundary every entry point uses.

use super::out::{clear, free_box, put_box};
use crate::error::{Error, ErrorKind};
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Result of every fallible call. Values are never renumbered.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum mlxrt_status {
    /// Success.
    Ok = 0,
    /// A required pointer was NULL, a value out of range, a struct_size
    /// wrong, or a JSON argument well-formed but of the wrong shape.
    InvalidArgument = 1,
    /// A string was not valid UTF-8.
    InvalidUtf8 = 2,
    /// A JSON argument did not parse (a wrong shape is INVALID_ARGUMENT).
    InvalidJson = 3,
    /// The model could not be loaded (missing file, bad config, bad tensor).
    ModelLoad = 4,
    /// The model or a requested feature is not supported.
    Unsupported = 5,
    /// MLX raised an error.
    Mlx = 6,
    /// The engine has too many requests in flight; retry later.
    Busy = 7,
    /// The engine failed earlier (a panic on its thread) and accepts no work.
    EnginePoisoned = 8,
    /// A file system error.
    Io = 9,
    /// A bug in mlxrt (including a caught panic).
    Internal = 10,
    /// Nothing arrived within the timeout (`mlxrt_stream_next`).
    Timeout = 11,
    /// A callback asked to stop (the load-progress callback returned false).
    Aborted = 12,
    /// The stream already returned its terminal event (`mlxrt_stream_next`).
    EndOfStream = 13,
}

impl From<ErrorKind> for mlxrt_status {
    fn from(k: ErrorKind) -> mlxrt_status {
        match k {
            ErrorKind::InvalidArgument => mlxrt_status::InvalidArgument,
            ErrorKind::InvalidUtf8 => mlxrt_status::InvalidUtf8,
            ErrorKind::InvalidJson => mlxrt_status::InvalidJson,
            ErrorKind::ModelLoad => mlxrt_status::ModelLoad,
            ErrorKind::Unsupported => mlxrt_status::Unsupported,
            ErrorKind::Mlx => mlxrt_status::Mlx,
            ErrorKind::Busy => mlxrt_status::Busy,
            ErrorKind::EnginePoisoned => mlxrt_status::EnginePoisoned,
            ErrorKind::Io => mlxrt_status::Io,
            ErrorKind::Internal => mlxrt_status::Internal,
            ErrorKind::Aborted => mlxrt_status::Aborted,
        }
    }
}

/// An error: a status and a UTF-8 message. Owned by the caller, freed with
/// `mlxrt_error_free`.
pub struct mlxrt_error {
    status: mlxrt_status,
    message: CString,
}

/// NUL-terminated copy of `s` (interior NULs become U+FFFD).
pub(crate) fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', "\u{FFFD}")).expect("no interior NUL left")
}

/// Stores `e` in `*out` when `out` is not NULL; returns its status.
pub(crate) fn fail(out: *mut *mut mlxrt_error, e: &Error) -> mlxrt_status {
    put_box(out, mlxrt_error { status: e.kind.into(), message: c_string(&e.message) });
    e.kind.into()
}

/// Runs an entry point body: clears `*err`, turns `Err` into a status plus
/// error object, and turns a panic into `Internal` instead of unwinding
/// into C.
pub(crate) fn guard(err: *mut *mut mlxrt_error, f: impl FnOnce() -> crate::Result<()>) -> mlxrt_status {
    clear(err);
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => mlxrt_status::Ok,
        Ok(Err(e)) => fail(err, &e),
        Err(p) => {
            let why = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            fail(err, &Error::internal(format!("internal error (panic): {why}")))
        }
    }
}

/// Runs a body that cannot report errors (getters, destructors) under the
/// panic boundary, with `fallback` on panic.
pub(crate) fn guard_value<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// The status of an error (`MLXRT_STATUS_INVALID_ARGUMENT` for NULL).
#[no_mangle]
pub extern "C" fn mlxrt_error_status(error: *const mlxrt_error) -> mlxrt_status {
    guard_value(mlxrt_status::InvalidArgument, || {
        // SAFETY: NULL or a pointer from this library, not yet freed.
        unsafe { error.as_ref() }.map_or(mlxrt_status::InvalidArgument, |e| e.status)
    })
}

/// The error's message: NUL-terminated UTF-8, valid until the error is freed.
/// Returns "" for NULL.
#[no_mangle]
pub extern "C" fn mlxrt_error_message(error: *const mlxrt_error) -> *const c_char {
    guard_value(c"".as_ptr(), || {
        // SAFETY: NULL or a pointer from this library, not yet freed.
        unsafe { error.as_ref() }.map_or(c"".as_ptr(), |e| e.message.as_ptr())
    })
}

/// Frees an error. NULL is a no-op.
#[no_mangle]
pub extern "C" fn mlxrt_error_free(error: *mut mlxrt_error) {
    guard_value((), || free_box(error))
}

/// A static, human-readable name for a status ("ok", "invalid argument", ...).
#[no_mangle]
pub extern "C" fn mlxrt_status_name(status: i32) -> *const c_char {
    match status {
        0 => c"ok",
        1 => c"invalid argument",
        2 => c"invalid UTF-8",
        3 => c"invalid JSON",
        4 => c"model load failed",
        5 => c"unsupported",
        6 => c"MLX error",
        7 => c"busy",
        8 => c"engine poisoned",
        9 => c"I/O error",
        10 => c"internal error",
        11 => c"timeout",
        12 => c"aborted",
        13 => c"end of stream",
        _ => c"unknown status",
    }
    .as_ptr()
}
