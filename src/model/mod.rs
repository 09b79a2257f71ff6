//! Model architectures and checkpoint loading. One file per architecture;
//! shared layers in `layers`, tensor bookkeeping in `weights`, file formats in
//! `load`.

pub mod layers;
pub mod llama;
pub mod load;
pub mod weights;

use crate::cache::KvCache;
use crate::error::Result;
use crate::mlx::Array;

pub use layers::Kernels;
pub use load::{load, LoadOptions, LoadedModel, Progress};

/// What a forward pass should produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Only update the caches (prefill chunks before the last token).
    CacheOnly,
    /// Logits for the last position only: `[B, 1, vocab]`.
    LastLogits,
    /// Logits for every position: `[B, L, vocab]`.
    AllLogits,
}

/// Facts about a loaded model, reported through the engine info.
#[derive(Debug, Clone, Default)]
pub struct ModelInfo {
    pub architecture: String,
    pub vocab_size: i32,
    pub num_layers: i32,
    pub hidden_size: i32,
    pub context_length: i64,
    /// KV cache bytes one position takes over all layers (upper bound: f32).
    pub kv_bytes_per_token: usize,
    /// Where it came from: "gguf" or "mlx-folder".
    pub format: String,
    /// The device it runs on: "cpu" or "gpu".
    pub device: String,
}

/// A decoder-only language model. Implementations hold their weights as MLX
/// arrays and so live on the scheduler thread only.
pub trait LanguageModel {
    fn info(&self) -> &ModelInfo;
    /// Empty caches (one per layer) for a batch of `rows` sequences.
    fn new_cache(&self, rows: usize) -> Vec<KvCache>;
    /// Runs `tokens` (`[B, L]` int32, B = the cache's rows) after what `cache`
    /// holds, appending to it. Rows may be left-padded (see `KvCache`).
    fn forward(&self, tokens: &Array, cache: &mut [KvCache], out: Output) -> Result<Option<Array>>;
    /// Every parameter array (for evaluation at load and memory accounting).
    fn parameters(&self) -> Vec<&Array>;
}
