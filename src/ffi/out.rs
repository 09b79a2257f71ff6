//! Writing results to C: out-pointers, boxed handles and their release,
//! size-versioned output structs.
//!
//! Every out-pointer is NULL or points to writable memory of its type (the C
//! contract); handles and strings given out here come back only through the
//! matching `free_*`.

use super::args::struct_size;
use crate::error::{Error, Result};
use std::ffi::c_char;
use std::mem::size_of;

/// `*mut T` or `*const T`: what an out-pointer of a pointer type receives.
pub(crate) trait RawPtr: Copy {
    const NULL: Self;
}
impl<T> RawPtr for *mut T {
    const NULL: Self = std::ptr::null_mut();
}
impl<T> RawPtr for *const T {
    const NULL: Self = std::ptr::null();
}

/// Writes `value` to `*out` unless `out` is NULL.
pub(crate) fn put<T>(out: *mut T, value: T) {
    if !out.is_null() {
        // SAFETY: the caller passes NULL or a writable `T` (nothing to drop:
        // raw pointers and plain C structs).
        unsafe { out.write(value) };
    }
}

/// Sets `*out` to NULL unless `out` is NULL (an optional out-pointer, cleared
/// on entry so that a failure leaves NULL there).
pub(crate) fn clear<P: RawPtr>(out: *mut P) {
    put(out, P::NULL);
}

/// A required out-pointer: an error when NULL, else cleared.
pub(crate) fn required<P: RawPtr>(out: *mut P, what: &str) -> Result<()> {
    if out.is_null() {
        return Err(Error::invalid(format!("{what} is NULL")));
    }
    clear(out);
    Ok(())
}

/// Hands `value` to C as a new handle in `*out` (nothing is allocated when
/// `out` is NULL). The handle is freed with `free_box`.
pub(crate) fn put_box<T>(out: *mut *mut T, value: T) {
    if !out.is_null() {
        put(out, Box::into_raw(Box::new(value)));
    }
}

/// Takes back a handle made by `put_box`; None for NULL.
pub(crate) fn take_box<T>(handle: *mut T) -> Option<Box<T>> {
    // SAFETY: NULL or a pointer from `put_box`, given back once (C contract).
    (!handle.is_null()).then(|| unsafe { Box::from_raw(handle) })
}

/// Frees a handle made by `put_box`; NULL is a no-op.
pub(crate) fn free_box<T>(handle: *mut T) {
    drop(take_box(handle));
}

/// Hands a NUL-terminated copy of `s` to C in `*out` (unless NULL), freed
/// with `free_string`.
pub(crate) fn put_string(out: *mut *mut c_char, s: &str) {
    if !out.is_null() {
        put(out, super::error::c_string(s).into_raw());
    }
}

/// Frees a string made by `put_string`; NULL is a no-op.
pub(crate) fn free_string(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: the pointer came from `CString::into_raw` in `put_string`
        // and is freed once (C contract).
        drop(unsafe { std::ffi::CString::from_raw(s) });
    }
}

/// Writes an output struct whose first field is `size_t struct_size` (set by
/// the caller): the first min(struct_size, ours) bytes, so an older caller
/// gets the fields it knows.
pub(crate) fn write_versioned<T: Copy>(p: *mut T, value: T, what: &str) -> Result<()> {
    let size = struct_size(p, what)?;
    if size < size_of::<usize>() {
        return Err(Error::invalid(format!("{what}.struct_size is {size}; set it to the struct's sizeof")));
    }
    let n = size.min(size_of::<T>());
    // SAFETY: the caller's struct has `size` bytes; we write at most that many
    // and keep its own struct_size.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (&value as *const T as *const u8).add(size_of::<usize>()),
            (p as *mut u8).add(size_of::<usize>()),
            n - size_of::<usize>(),
        )
    };
    Ok(())
}
