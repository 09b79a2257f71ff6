//! Caches owned by the scheduler thread. Only the plain KV cache exists so far.

pub mod kv;

pub use kv::KvCache;
