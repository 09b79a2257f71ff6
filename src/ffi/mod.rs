//! The C ABI. Every `extern "C"` function runs under a panic boundary
//! (`error::guard`); handles are boxed Rust objects; inputs are copied.
//! `include/mlxrt.h` is generated from this module by cbindgen.
#![allow(non_camel_case_types)]

mod args;
pub mod engine;
pub mod error;
pub mod event;
pub mod info;
mod out;
pub mod request;
pub mod stream;

use std::ffi::c_char;

/// The ABI version of this header. It changes only on an incompatible change
/// (appending struct fields or functions is compatible).
pub const MLXRT_ABI_VERSION: u32 = 1;

/// The largest `struct_size` a config, params, stats or info struct may
/// declare. Larger values are refused with `MLXRT_STATUS_INVALID_ARGUMENT`
/// before anything past the fields this library knows is read: such a size is
/// garbage (an uninitialized struct), not a newer layout.
pub const MLXRT_STRUCT_SIZE_MAX: usize = 4096;

/// The ABI version of the loaded library; compare with `MLXRT_ABI_VERSION`
/// to detect a header/library mismatch.
#[no_mangle]
pub extern "C" fn mlxrt_abi_version() -> u32 {
    MLXRT_ABI_VERSION
}

/// The library version ("0.1.0"), static storage.
#[no_mangle]
pub extern "C" fn mlxrt_version_string() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr() as *const c_char
}
