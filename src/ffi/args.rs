//! Reading arguments from C: strings, arrays, JSON and size-versioned structs.

use super::MLXRT_STRUCT_SIZE_MAX;
use crate::error::{Error, ErrorKind, Result};
use std::ffi::{c_char, CStr};
use std::mem::size_of;

/// A NUL-terminated UTF-8 string argument; NULL gives `None`.
pub(crate) fn opt_str<'a>(p: *const c_char, what: &str) -> Result<Option<&'a str>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller passes NULL or a NUL-terminated string that lives for the call.
    let bytes = unsafe { CStr::from_ptr(p) }.to_bytes();
    std::str::from_utf8(bytes)
        .map(Some)
        .map_err(|e| Error::new(ErrorKind::InvalidUtf8, format!("{what} is not valid UTF-8 ({e})")))
}

/// A required string argument.
pub(crate) fn req_str<'a>(p: *const c_char, what: &str) -> Result<&'a str> {
    opt_str(p, what)?.ok_or_else(|| Error::invalid(format!("{what} is NULL")))
}

/// A JSON argument: INVALID_JSON when it does not parse. Whether it has the
/// right shape is for its reader to say (INVALID_ARGUMENT when not).
pub(crate) fn json(text: &str, what: &str) -> Result<serde_json::Value> {
    serde_json::from_str(text).map_err(|e| Error::new(ErrorKind::InvalidJson, format!("{what}: {e}")))
}

/// A JSON argument that must be an object (INVALID_ARGUMENT when it parses
/// but is not one).
pub(crate) fn json_object(text: &str, what: &str) -> Result<serde_json::Map<String, serde_json::Value>> {
    match json(text, what)? {
        serde_json::Value::Object(o) => Ok(o),
        _ => Err(Error::invalid(format!("{what} must be a JSON object"))),
    }
}

/// A (pointer, length) array argument; NULL with length 0 is empty.
pub(crate) fn slice<'a, T>(p: *const T, n: usize, what: &str) -> Result<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Error::invalid(format!("{what} is NULL but its length is {n}")));
    }
    // SAFETY: the caller passes `n` valid elements that live for the call.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// A required pointer argument.
pub(crate) fn reference<'a, T>(p: *const T, what: &str) -> Result<&'a T> {
    // SAFETY: the caller passes NULL or a valid pointer that lives for the call.
    unsafe { p.as_ref() }.ok_or_else(|| Error::invalid(format!("{what} is NULL")))
}

/// The `struct_size` of a size-versioned struct (its first field), refused
/// when larger than `MLXRT_STRUCT_SIZE_MAX`, before anything else is read.
pub(crate) fn struct_size<T>(p: *const T, what: &str) -> Result<usize> {
    if p.is_null() {
        return Err(Error::invalid(format!("{what} is NULL")));
    }
    // SAFETY: every versioned struct starts with a `size_t struct_size`.
    let size = unsafe { *(p as *const usize) };
    if size > MLXRT_STRUCT_SIZE_MAX {
        return Err(Error::invalid(format!(
            "{what}.struct_size is {size}, more than MLXRT_STRUCT_SIZE_MAX ({MLXRT_STRUCT_SIZE_MAX}); \
             set it with the struct's _init function or sizeof"
        )));
    }
    Ok(size)
}

/// Reads a config struct whose first field is `size_t struct_size`.
///
/// `defaults` fills fields the caller's (older) layout lacks. A caller built
/// against a newer header may pass a larger struct (up to
/// `MLXRT_STRUCT_SIZE_MAX`): accepted only when every byte this library does
/// not know is zero (the kernel's rule for extensible structs), so a setting
/// is never silently ignored. `min_size` is the size of the first published
/// layout and never changes.
pub(crate) fn versioned<T: Copy>(p: *const T, defaults: T, min_size: usize, what: &str) -> Result<T> {
    let size = struct_size(p, what)?;
    let ours = size_of::<T>();
    if size < min_size {
        return Err(Error::invalid(format!(
            "{what}.struct_size is {size}, smaller than any known layout ({min_size}); call its _init function first"
        )));
    }
    let base = p as *const u8;
    if size > ours {
        // SAFETY: the caller says the struct has `size` bytes.
        let extra = unsafe { std::slice::from_raw_parts(base.add(ours), size - ours) };
        if extra.iter().any(|&b| b != 0) {
            return Err(Error::invalid(format!(
                "{what}.struct_size is {size} and sets fields this mlxrt ({} bytes) does not know; upgrade the library",
                ours
            )));
        }
    }
    let mut out = defaults;
    // SAFETY: copies the caller's min(size, ours) bytes over a valid `T`; all
    // fields are plain integers, floats and pointers, valid for any bytes.
    unsafe { std::ptr::copy_nonoverlapping(base, &mut out as *mut T as *mut u8, size.min(ours)) };
    // SAFETY: as above; restore our own size so callers see a consistent value.
    unsafe { *(&mut out as *mut T as *mut usize) = ours };
    Ok(out)
}
