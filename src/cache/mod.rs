//! Caches owned by the scheduler thread: per-layer caches for batches of rows
//! (KV of attention layers, a ring of the last positions for sliding-window
//! layers, recurrent state of linear-attention layers), and
//! the prompt (prefix) cache.

pub mod kv;
pub mod layer;
pub mod paged;
pub mod prefix;
pub mod quant_attention;
pub mod ring;
pub mod scheme;
pub mod state;
pub mod store;
pub mod timeline;
pub mod turbo;
mod radix;

pub use kv::{AffineKv, KvCache, KvView};
pub use layer::{LayerCache, LayerSnapshot};
pub use ring::RingCache;
pub use state::StateCache;
pub use timeline::Timeline;

use crate::mlx::fast::Mask;
use crate::mlx::Array;

/// Where the new tokens of a forward pass start, for RoPE: the same position
/// for every row, or one per row (`[B]` int32) when rows are left-padded or
/// carry RoPE deltas; or, for a multimodal prompt (Qwen3-VL), every token's
/// own (t, h, w) position (`[3, B, L]` int32).
pub enum Positions {
    Same(i32),
    PerRow(Array),
    Sections(Array),
}

/// The attention mask of a forward pass, computed once for all layers.
pub enum AttnMask {
    None,
    Causal,
    /// Boolean `[B, 1, L, T]`: true where a query may attend to a key.
    Array(Array),
}

impl AttnMask {
    pub fn as_mask(&self) -> Mask<'_> {
        match self {
            AttnMask::None => Mask::None,
            AttnMask::Causal => Mask::Causal,
            AttnMask::Array(a) => Mask::Array(a),
        }
    }
}
