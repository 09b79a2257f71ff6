//! Model architectures and checkpoint loading. One file per architecture;
//! shared layers in `layers`, tensor bookkeeping in `weights`, file formats in
//! `load`.

pub mod attention;
pub mod check;
pub mod decoder;
pub mod gated_delta;
pub mod gemma3;
pub mod gemma4;
pub mod gemma4_audio;
pub mod gemma4_vision;
pub mod layers;
pub mod llama;
pub mod load;
pub mod media;
pub mod moe;
pub mod pass;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3_5;
pub mod qwen3_moe;
pub mod qwen_vision;
pub mod siglip;
pub mod weights;

use crate::cache::scheme::KvLayer;
use crate::cache::LayerCache;
use crate::error::Result;
use crate::mlx::Array;

pub use layers::Kernels;
pub use load::{load, LoadOptions, LoadedModel, Progress};
pub use media::{Encoded, MediaInput, Tower, Towers};

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

/// One group of a mixed forward (`LanguageModel::forward_mixed`): `rows`
/// sequences of `len` new tokens each after what `cache` holds.
pub struct Group<'a> {
    pub cache: &'a mut [LayerCache],
    pub rows: i32,
    pub len: i32,
    pub out: Output,
}

impl Group<'_> {
    /// Where the positions `out` asks for lie among the group's `rows * len`
    /// tokens.
    pub fn outputs(&self) -> Vec<i32> {
        match self.out {
            Output::CacheOnly => vec![],
            Output::AllLogits => (0..self.rows * self.len).collect(),
            Output::LastLogits => (0..self.rows).map(|r| r * self.len + self.len - 1).collect(),
        }
    }
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
    /// Cache bytes a sequence takes whatever its length: the recurrent state
    /// of linear-attention layers (f32).
    pub state_bytes_per_sequence: usize,
    /// Where it came from: "gguf" or "mlx-folder".
    pub format: String,
    /// The device it runs on: "cpu" or "gpu".
    pub device: String,
    /// Per layer cache (`LanguageModel::kv_layers`), filled by the engine.
    pub kv_layers: Vec<Option<KvLayer>>,
    /// The engine's KV storage (`KvScheme::name`), filled by the engine.
    pub kv_scheme: String,
}

/// A decoder-only language model. Implementations hold their weights as MLX
/// arrays and so live on the scheduler thread only.
pub trait LanguageModel {
    fn info(&self) -> &ModelInfo;
    /// Empty caches for a batch of `rows` sequences: one per layer that keeps
    /// state (a KV cache per attention layer, a recurrent state per linear
    /// attention layer; layers that reuse another layer's KV have none).
    fn new_cache(&self, rows: usize) -> Vec<LayerCache>;
    /// Per cache of `new_cache` (same order): the shape of its keys and
    /// values and its sliding window, or None for a recurrent state. Says
    /// which caches a quantized KV scheme applies to (full attention only)
    /// and what they cost.
    fn kv_layers(&self) -> Vec<Option<KvLayer>>;
    /// Runs `tokens` (`[B, L]` int32, B = the cache's rows) after what `cache`
    /// holds, appending to it. Rows may be left-padded (see `KvCache`).
    fn forward(&self, tokens: &Array, cache: &mut [LayerCache], out: Output) -> Result<Option<Array>>;
    /// `forward` for one row (`B = 1`) whose input embeddings are given at
    /// some positions (image soft tokens): models with a media tower.
    fn forward_media(&self, tokens: &Array, media: &MediaInput, cache: &mut [LayerCache], out: Output) -> Result<Option<Array>> {
        let _ = (tokens, media, cache, out);
        Err(crate::error::Error::unsupported("this model takes no media input"))
    }
    /// Whether `forward_mixed` runs (else the scheduler makes one forward
    /// per group).
    fn supports_mixed(&self) -> bool {
        false
    }
    /// One forward over several groups of sequences, each with its own
    /// caches (decoding rows and a prefill chunk: one model call instead of
    /// two). `tokens` is `[1, T]`: each group's `[rows, len]` tokens
    /// flattened, in group order. Token-wise work runs on all T at once,
    /// attention per group. Returns the logits each group's `out` asks
    /// for, as `[n, vocab]` rows in group order (None when none does).
    fn forward_mixed(&self, tokens: &Array, groups: &mut [Group]) -> Result<Option<Array>> {
        let _ = (tokens, groups);
        Err(crate::error::Error::unsupported("this model has no mixed forward"))
    }
    /// Every parameter array (for evaluation at load and memory accounting).
    fn parameters(&self) -> Vec<&Array>;
    /// The prefill chunk to use for `rows` rows with `done` positions already
    /// cached, when the scheduler would run `requested`: a model may lower it
    /// to bound the memory one forward pass needs (the result is at least 1).
    fn prefill_chunk(&self, rows: usize, done: usize, requested: usize) -> usize {
        let _ = (rows, done);
        requested
    }
}

/// The largest chunk (halving from `min(requested, 2048)` down to a floor of
/// 8) whose attention scores, `rows × heads × chunk × keys` f32 values with
/// `keys = done + chunk`, stay within 1 GiB.
pub fn bounded_chunk(rows: usize, heads: usize, done: usize, requested: usize) -> usize {
    const BUDGET: usize = 1 << 30;
    let mut c = requested.clamp(1, 2048);
    while c > 8 && rows * heads * c * (done + c) * 4 > BUDGET {
        c /= 2;
    }
    c.max(1)
}

#[cfg(test)]
mod tests {
    #[test]
    fn bounded_chunk_keeps_scores_under_a_gib() {
        use super::bounded_chunk;
        assert_eq!(bounded_chunk(1, 8, 0, 2048), 2048, "short context: as requested");
        assert_eq!(bounded_chunk(1, 8, 0, 100_000), 2048, "never above 2048");
        assert_eq!(bounded_chunk(1, 8, 0, 16), 16, "never above the request");
        // 8 heads at 100k cached positions: 256 × 100256 × 8 × 4 B = 0.77 GiB.
        assert_eq!(bounded_chunk(1, 8, 100_000, 2048), 256);
        assert_eq!(bounded_chunk(4, 8, 100_000, 2048), 64);
        assert_eq!(bounded_chunk(64, 64, 1_000_000, 2048), 8, "floor of 8");
    }
}
