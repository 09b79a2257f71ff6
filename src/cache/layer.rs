//! The cache of one model layer, whatever its kind: keys and values of an
//! attention layer (`KvCache`, full or sliding-window), or the recurrent
//! state of a linear-attention layer (`StateCache`). The engine drives every
//! kind through the same methods; a model builds the kinds it needs
//! (`LanguageModel::new_cache`) and takes them apart again in `forward`.

use super::{KvCache, Positions, StateCache, Timeline};
use crate::error::{Error, Result};
use crate::mlx::Array;

pub enum LayerCache {
    Kv(KvCache),
    State(StateCache),
}

impl LayerCache {
    /// An empty cache of the same kind for `rows` rows.
    pub fn empty_like(&self, rows: usize) -> LayerCache {
        match self {
            LayerCache::Kv(c) => LayerCache::Kv(c.empty_like(rows)),
            LayerCache::State(_) => LayerCache::State(StateCache::new(rows)),
        }
    }

    /// Whether the cache can be cut back to a prefix of what it holds (KV can;
    /// a recurrent state cannot). A prompt-cache entry of a model with any
    /// non-trimmable layer is only usable at exactly its length.
    pub fn trimmable(&self) -> bool {
        matches!(self, LayerCache::Kv(_))
    }

    /// Sets each row's `quantized_kv_start` (see `KvCache::set_starts`).
    pub fn set_starts(&mut self, starts: &[i32]) {
        if let LayerCache::Kv(c) = self {
            c.set_starts(starts);
        }
    }

    pub fn set_padding(&mut self, pads: &[i32]) {
        match self {
            LayerCache::Kv(c) => c.set_padding(pads),
            LayerCache::State(c) => c.set_padding(pads),
        }
    }

    /// The rows' shared timeline (length and left padding).
    pub fn timeline(&self) -> &Timeline {
        match self {
            LayerCache::Kv(c) => c.timeline(),
            LayerCache::State(c) => c.timeline(),
        }
    }

    pub fn rows(&self) -> usize {
        self.timeline().rows()
    }

    /// Physical length of the shared timeline (padding included).
    pub fn len(&self) -> i32 {
        self.timeline().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens held for `row` (its length without padding).
    pub fn row_len(&self, row: usize) -> i32 {
        self.timeline().row_len(row)
    }

    /// RoPE positions of the next tokens (attention layers only).
    pub fn positions(&self) -> Result<Positions> {
        self.kv()?.positions()
    }

    pub fn kv(&self) -> Result<&KvCache> {
        match self {
            LayerCache::Kv(c) => Ok(c),
            LayerCache::State(_) => Err(Error::internal("an attention layer got a recurrent-state cache")),
        }
    }

    pub fn kv_mut(&mut self) -> Result<&mut KvCache> {
        match self {
            LayerCache::Kv(c) => Ok(c),
            LayerCache::State(_) => Err(Error::internal("an attention layer got a recurrent-state cache")),
        }
    }

    pub fn state_mut(&mut self) -> Result<&mut StateCache> {
        match self {
            LayerCache::State(c) => Ok(c),
            LayerCache::Kv(_) => Err(Error::internal("a recurrent layer got a KV cache")),
        }
    }

    /// Adds `other`'s rows after this cache's rows (see `KvCache::extend`).
    pub fn extend(&mut self, other: LayerCache) -> Result<()> {
        match (self, other) {
            (LayerCache::Kv(a), LayerCache::Kv(b)) => a.extend(b),
            (LayerCache::State(a), LayerCache::State(b)) => a.extend(b),
            _ => Err(Error::internal("extending a cache with one of another kind")),
        }
    }

    /// Keeps the rows `keep` (in that order) and drops padding all share.
    pub fn filter(&mut self, keep: &[usize]) -> Result<()> {
        match self {
            LayerCache::Kv(c) => c.filter(keep),
            LayerCache::State(c) => c.filter(keep),
        }
    }

    /// The arrays to evaluate so that the cache content is materialized.
    pub fn state(&self) -> Vec<&Array> {
        match self {
            LayerCache::Kv(c) => c.state(),
            LayerCache::State(c) => c.state(),
        }
    }

    pub fn nbytes(&self) -> usize {
        match self {
            LayerCache::Kv(c) => c.nbytes(),
            LayerCache::State(c) => c.nbytes(),
        }
    }

    /// KV bytes held dense and quantized (a recurrent state counts as neither).
    pub fn kv_bytes_by_kind(&self) -> (usize, usize) {
        match self {
            LayerCache::Kv(c) => c.nbytes_by_kind(),
            LayerCache::State(_) => (0, 0),
        }
    }

    /// Row `row`'s first `len` positions as a snapshot (contiguous copies).
    /// A recurrent state can only be taken at the row's current length.
    pub fn snapshot_row(&self, row: usize, len: i32) -> Result<LayerSnapshot> {
        Ok(match self {
            LayerCache::Kv(c) => {
                let (keys, values) = c.row_slice(row, 0, len)?;
                LayerSnapshot::Kv { keys, values }
            }
            LayerCache::State(c) => {
                let (conv, state) = c.row_state(row, len)?;
                LayerSnapshot::State { conv, state, len }
            }
        })
    }
}

/// One layer's part of a prompt-cache entry: one sequence's first `len`
/// positions.
pub enum LayerSnapshot {
    /// `[1, kv_heads, len, head_dim]` each.
    Kv { keys: Array, values: Array },
    /// The state after exactly `len` tokens.
    State { conv: Array, state: Array, len: i32 },
}

impl LayerSnapshot {
    /// A one-row cache holding the first `n` positions.
    pub fn restore(&self, n: i32) -> Result<LayerCache> {
        match self {
            LayerSnapshot::Kv { keys, values } => Ok(LayerCache::Kv(KvCache::from_prefix(
                keys.slice_axis(2, 0, n)?,
                values.slice_axis(2, 0, n)?,
            ))),
            LayerSnapshot::State { conv, state, len } if *len == n => {
                Ok(LayerCache::State(StateCache::from_snapshot(conv.share(), state.share(), n)))
            }
            LayerSnapshot::State { len, .. } => {
                Err(Error::internal(format!("a recurrent state of {len} positions cannot stand for {n}")))
            }
        }
    }

    /// The tensors with their names in an entry file (`<layer>.<name>`).
    pub fn tensors(&self) -> [(&'static str, &Array); 2] {
        match self {
            LayerSnapshot::Kv { keys, values } => [("keys", keys), ("values", values)],
            LayerSnapshot::State { conv, state, .. } => [("conv", conv), ("state", state)],
        }
    }

    /// Rebuilds a layer from an entry file's tensors (`get(name)`) for a
    /// sequence of `len` tokens; names which kind the layer is.
    pub fn from_tensors(
        len: i32,
        mut get: impl FnMut(&str) -> std::result::Result<Option<Array>, String>,
    ) -> std::result::Result<LayerSnapshot, String> {
        if let Some(keys) = get("keys")? {
            let values = get("values")?.ok_or("keys without values")?;
            for (n, a) in [("keys", &keys), ("values", &values)] {
                if a.ndim() != 4 || a.dim(0) != 1 || a.dim(2) != len {
                    return Err(format!("{n} has shape {:?} for {len} tokens", a.shape()));
                }
            }
            return Ok(LayerSnapshot::Kv { keys, values });
        }
        let conv = get("conv")?.ok_or("neither keys nor a recurrent state")?;
        let state = get("state")?.ok_or("conv without state")?;
        if conv.ndim() != 3 || conv.dim(0) != 1 || state.ndim() != 4 || state.dim(0) != 1 {
            return Err(format!("recurrent state of shapes {:?}, {:?}", conv.shape(), state.shape()));
        }
        Ok(LayerSnapshot::State { conv, state, len })
    }

    pub fn nbytes(&self) -> usize {
        self.tensors().iter().map(|(_, a)| a.nbytes()).sum()
    }
}
