//! Model files checked in safe Rust before MLX (or our metadata readers) sees
//! them. MLX's readers trust lengths, counts and offsets from the file: a
//! hostile or truncated file would read out of bounds inside libmlx and take
//! the host process down. Every failure here is a `MODEL_LOAD` error naming
//! the offending field; nothing is allocated by a count from the file before
//! that count is checked against the file's size.

pub mod config;
pub mod gguf;
pub mod safetensors;
