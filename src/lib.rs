//! mlxrt: an embeddable LLM inference engine on MLX.
//!
//! The C ABI (`src/ffi`, header `include/mlxrt.h`) is the product; the Rust API
//! underneath is usable directly as an rlib. All MLX state lives on one
//! scheduler thread owned by an `Engine` (see `engine`).

pub mod cache;
pub mod engine;
pub mod error;
pub mod ffi;
pub mod grammar;
pub mod media;
pub mod mlx;
pub mod model;
pub mod sample;
pub mod text;

pub use error::{Error, ErrorKind, Result};
