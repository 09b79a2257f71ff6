//! The cache of one model layer, whatever its kind: keys and values of a
//! full-attention layer (`KvCache`), the ring of a sliding-window layer
//! (`RingCache`), the recurrent state of a linear-attention layer
//! (`StateCache`), or with `kv_paging` an attention layer's blocks in the
//! engine's pools (`PagedKv`: full or sliding-window, dense or quantized). The engine drives every
//! kind through the same methods; a model builds the kinds it needs
//! (`LanguageModel::new_cache`) and takes them apart again in `forward`.

use super::kv::QuantRow;
use super::paged::{PagedKv, PagedSnapshot};
use super::scheme::KvScheme;
use super::state::StateCheckpoint;
use super::{KvCache, Positions, RingCache, StateCache, Timeline};
use crate::error::{Error, Result};
use crate::mlx::{Array, Dtype};

pub enum LayerCache {
    Kv(KvCache),
    Ring(RingCache),
    State(StateCache),
    Paged(PagedKv),
}

impl LayerCache {
    /// An empty cache of the same kind for `rows` rows.
    pub fn empty_like(&self, rows: usize) -> LayerCache {
        match self {
            LayerCache::Kv(c) => LayerCache::Kv(c.empty_like(rows)),
            LayerCache::Ring(c) => LayerCache::Ring(RingCache::new(rows, c.window())),
            LayerCache::State(_) => LayerCache::State(StateCache::new(rows)),
            LayerCache::Paged(c) => LayerCache::Paged(c.empty_like(rows)),
        }
    }

    /// Whether the cache can be cut back to a prefix of what it holds (dense
    /// KV can; a recurrent state cannot, nor can a ring once it has wrapped:
    /// it is reported non-trimmable from the start, since the engine decides
    /// once per model). Quantized KV is reported non-trimmable too: a row
    /// past its `quantized_kv_start` has dropped the float copy a shorter
    /// prefix below the start would need, so its snapshots are taken at the
    /// marks themselves. A prompt-cache entry of a model with any
    /// non-trimmable layer is only usable at exactly its length. Paged
    /// layers follow the same rules as the caches they stand for.
    pub fn trimmable(&self) -> bool {
        match self {
            LayerCache::Kv(c) => !c.is_quantized(),
            LayerCache::Paged(c) => c.trimmable(),
            _ => false,
        }
    }

    /// Whether keys and values are stored quantized (contiguous or paged).
    pub fn is_quantized(&self) -> bool {
        match self {
            LayerCache::Kv(c) => c.is_quantized(),
            LayerCache::Paged(c) => c.is_quantized(),
            _ => false,
        }
    }

    /// Whether a forward of `width` more positions can be cut back afterwards
    /// (speculative decoding's rollback, `trim`). A recurrent state cannot
    /// (it is checkpointed and replayed instead: `checkpoint`, `rewind`);
    /// nor can paged caches yet.
    pub fn can_trim_after(&self, width: i32) -> bool {
        match self {
            LayerCache::Kv(c) => c.can_trim_after(width),
            LayerCache::Ring(c) => c.can_trim_after(width),
            LayerCache::State(_) | LayerCache::Paged(_) => false,
        }
    }

    /// Forgets the last `n` positions of every row (rejected speculative
    /// tokens); only after a forward `can_trim_after` allowed.
    pub fn trim(&mut self, n: i32) -> Result<()> {
        match self {
            LayerCache::Kv(c) => c.trim(n),
            LayerCache::Ring(c) => c.trim(n),
            LayerCache::State(_) => return Err(Error::internal("a recurrent state cannot be trimmed")),
            LayerCache::Paged(_) => return Err(Error::internal("a paged cache cannot be trimmed yet")),
        }
        Ok(())
    }

    /// A recurrent-state layer's checkpoint, to `rewind` to after a verify
    /// step (None for other layers: they are cut back instead).
    pub fn checkpoint(&self) -> Option<StateCheckpoint> {
        match self {
            LayerCache::State(c) => Some(c.checkpoint()),
            _ => None,
        }
    }

    /// Undoes the last `n` positions: back to `cp` for a recurrent state,
    /// else `trim`.
    pub fn rewind(&mut self, cp: Option<StateCheckpoint>, n: i32) -> Result<()> {
        match (self, cp) {
            (LayerCache::State(c), Some(cp)) => {
                c.rewind(cp);
                Ok(())
            }
            (c, _) => c.trim(n),
        }
    }

    /// Whether rows may keep holes (`Timeline::punch`): a dense
    /// full-attention KV cache, whose mask and positions follow them.
    pub fn can_punch(&self) -> bool {
        matches!(self, LayerCache::Kv(c) if !c.is_quantized())
    }

    /// Makes slots `from..to` holes of `row` (see `can_punch`).
    pub fn punch(&mut self, row: usize, from: i32, to: i32) -> Result<()> {
        match self {
            LayerCache::Kv(c) if !c.is_quantized() => {
                c.punch(row, from, to);
                Ok(())
            }
            _ => Err(Error::internal("only a dense KV cache holds holes")),
        }
    }

    /// Sets each row's `quantized_kv_start` (see `KvCache::set_starts`).
    pub fn set_starts(&mut self, starts: &[i32]) {
        match self {
            LayerCache::Kv(c) => c.set_starts(starts),
            LayerCache::Paged(c) => c.set_starts(starts),
            _ => {}
        }
    }

    /// Sizes a KV cache's next growth for `positions` (see `KvCache::reserve`).
    pub fn reserve(&mut self, positions: i32, end: i32) {
        if let LayerCache::Kv(c) = self {
            c.reserve(positions, end);
        }
    }

    pub fn set_padding(&mut self, pads: &[i32]) {
        match self {
            LayerCache::Kv(c) => c.set_padding(pads),
            LayerCache::Ring(c) => c.set_padding(pads),
            LayerCache::State(c) => c.set_padding(pads),
            LayerCache::Paged(c) => c.set_padding(pads),
        }
    }

    /// The rows' shared timeline (length and left padding).
    pub fn timeline(&self) -> &Timeline {
        match self {
            LayerCache::Kv(c) => c.timeline(),
            LayerCache::Ring(c) => c.timeline(),
            LayerCache::State(c) => c.timeline(),
            LayerCache::Paged(c) => c.timeline(),
        }
    }

    /// Sets `row`'s RoPE delta: its next position is its length plus
    /// `delta` (see `Timeline`).
    pub fn set_rope_delta(&mut self, row: usize, delta: i32) {
        match self {
            LayerCache::Kv(c) => c.set_rope_delta(row, delta),
            LayerCache::Ring(c) => c.set_rope_delta(row, delta),
            LayerCache::State(c) => c.set_rope_delta(row, delta),
            LayerCache::Paged(c) => c.set_rope_delta(row, delta),
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
        match self {
            LayerCache::Ring(c) => c.positions(),
            LayerCache::Paged(c) => c.positions(),
            c => c.kv()?.positions(),
        }
    }

    pub fn kv(&self) -> Result<&KvCache> {
        match self {
            LayerCache::Kv(c) => Ok(c),
            LayerCache::Ring(_) => Err(Error::internal("a full-attention layer got a sliding-window cache")),
            LayerCache::State(_) => Err(Error::internal("an attention layer got a recurrent-state cache")),
            LayerCache::Paged(_) => Err(Error::internal("a paged layer read as a contiguous KV cache")),
        }
    }

    /// The dtype a contiguous KV cache stores writes in (`KvCache::write_dtype`).
    pub fn kv_write_dtype(&self) -> Option<Dtype> {
        match self {
            LayerCache::Kv(c) => c.write_dtype(),
            _ => None,
        }
    }

    pub fn kv_mut(&mut self) -> Result<&mut KvCache> {
        match self {
            LayerCache::Kv(c) => Ok(c),
            LayerCache::Ring(_) => Err(Error::internal("a full-attention layer got a sliding-window cache")),
            LayerCache::State(_) => Err(Error::internal("an attention layer got a recurrent-state cache")),
            LayerCache::Paged(_) => Err(Error::internal("a paged layer read as a contiguous KV cache")),
        }
    }

    /// The ring of a sliding-window layer, if this is one.
    pub fn ring(&self) -> Option<&RingCache> {
        match self {
            LayerCache::Ring(c) => Some(c),
            _ => None,
        }
    }

    pub fn state_mut(&mut self) -> Result<&mut StateCache> {
        match self {
            LayerCache::State(c) => Ok(c),
            _ => Err(Error::internal("a recurrent layer got a KV cache")),
        }
    }

    /// Adds `other`'s rows after this cache's rows (see `KvCache::extend`).
    pub fn extend(&mut self, other: LayerCache) -> Result<()> {
        match (self, other) {
            (LayerCache::Kv(a), LayerCache::Kv(b)) => a.extend(b),
            (LayerCache::Ring(a), LayerCache::Ring(b)) => a.extend(b),
            (LayerCache::State(a), LayerCache::State(b)) => a.extend(b),
            (LayerCache::Paged(a), LayerCache::Paged(b)) => a.extend(b),
            _ => Err(Error::internal("extending a cache with one of another kind")),
        }
    }

    /// Keeps the rows `keep` (in that order) and drops padding all share.
    pub fn filter(&mut self, keep: &[usize]) -> Result<()> {
        match self {
            LayerCache::Kv(c) => c.filter(keep),
            LayerCache::Ring(c) => c.filter(keep),
            LayerCache::State(c) => c.filter(keep),
            LayerCache::Paged(c) => c.filter(keep),
        }
    }

    /// The arrays to evaluate so that the cache content is materialized
    /// (none for a paged layer: see `pool_state`).
    pub fn state(&self) -> Vec<&Array> {
        match self {
            LayerCache::Kv(c) => c.state(),
            LayerCache::Ring(c) => c.state(),
            LayerCache::State(c) => c.state(),
            LayerCache::Paged(_) => vec![],
        }
    }

    /// Handles on a paged layer's pool arrays (they live in the engine's
    /// pool, not in the cache), to evaluate so that its writes are done.
    pub fn pool_state(&self) -> Vec<Array> {
        match self {
            LayerCache::Paged(c) => c.state(),
            _ => vec![],
        }
    }

    /// The paged cache of a full-attention layer, if this is one.
    pub fn paged_mut(&mut self) -> Option<&mut PagedKv> {
        match self {
            LayerCache::Paged(c) => Some(c),
            _ => None,
        }
    }

    pub fn nbytes(&self) -> usize {
        match self {
            LayerCache::Kv(c) => c.nbytes(),
            LayerCache::Ring(c) => c.nbytes(),
            LayerCache::State(c) => c.nbytes(),
            LayerCache::Paged(c) => c.nbytes(),
        }
    }

    /// KV bytes held dense and quantized (a recurrent state counts as neither).
    pub fn kv_bytes_by_kind(&self) -> (usize, usize) {
        match self {
            LayerCache::Kv(c) => c.nbytes_by_kind(),
            LayerCache::Ring(c) => (c.nbytes(), 0),
            LayerCache::State(_) => (0, 0),
            LayerCache::Paged(c) => c.nbytes_by_kind(),
        }
    }

    /// Row `row`'s first `len` positions as a snapshot (contiguous copies;
    /// with `shared`, a dense KV cache about to be dropped gives views of
    /// its buffers instead: no second copy of the KV at the peak).
    /// A recurrent state can only be taken at the row's current length, a
    /// ring at a length whose window it still holds.
    pub fn snapshot_row(&self, row: usize, len: i32, shared: bool) -> Result<LayerSnapshot> {
        Ok(match self {
            LayerCache::Kv(c) if c.is_quantized() => {
                let QuantRow { planes, float, scheme, start } = c.row_quant(row, len)?;
                LayerSnapshot::quant(planes, float, scheme, start)?
            }
            LayerCache::Kv(c) => {
                let (keys, values) = if shared { c.row_view(row, 0, len)? } else { c.row_slice(row, 0, len)? };
                LayerSnapshot::Kv { keys, values }
            }
            LayerCache::Ring(c) => {
                let (keys, values) = c.row_tail(row, len)?;
                LayerSnapshot::Ring { keys, values, len, window: Array::from_f32(&[c.window() as f32], &[1])? }
            }
            LayerCache::State(c) => {
                let (conv, state) = c.row_state(row, len)?;
                LayerSnapshot::State { conv, state, len }
            }
            LayerCache::Paged(c) => LayerSnapshot::Paged(c.snapshot_row(row, len)?),
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
    /// A sliding-window layer after `len` tokens: its last `min(len, window)`
    /// positions in temporal order (`[1, kv_heads, min(len, window),
    /// head_dim]`), and the window (f32 `[1]`, stored with them).
    Ring { keys: Array, values: Array, len: i32, window: Array },
    /// A quantized full-attention layer after `len` tokens, as stored: the
    /// packed planes (`[1, kv_heads, len, ·]`: affine words, scales, biases
    /// of keys then values; TurboQuant's five), the float keys and values
    /// iff `len` is below the row's `quantized_kv_start`, and f32 `[4]`
    /// `[kind (1 affine, 2 TurboQuant), bits | key bits, group size | value
    /// bits, start]`.
    Quant { planes: Vec<Array>, float: Option<(Array, Array)>, meta: Array },
    /// A paged layer's blocks (shared, not copied). On disk its blocks and
    /// their layout (`paged::codec`); loaded back into fresh blocks.
    Paged(PagedSnapshot),
}

/// Tensor names of the packed planes of a `LayerSnapshot::Quant`.
const QUANT_PLANES: [&str; 6] = ["q.0", "q.1", "q.2", "q.3", "q.4", "q.5"];

/// The scheme and start a `LayerSnapshot::Quant`'s meta tensor names.
fn quant_meta(meta: &Array) -> std::result::Result<(KvScheme, i32), String> {
    let v = match meta.to_vec_f32() {
        Ok(v) if meta.shape() == [4] && v.iter().all(|x| x.fract() == 0.0 && *x >= 0.0) => v,
        _ => return Err(format!("quantized KV meta of shape {:?} is not four counts", meta.shape())),
    };
    let [kind, a, b, start] = [v[0], v[1], v[2], v[3]].map(|x| x as i32);
    let scheme = match kind {
        1 => KvScheme::Affine { bits: a, group_size: b },
        2 => KvScheme::TurboQuant { key_bits: a, value_bits: b },
        _ => return Err(format!("unknown quantized KV kind {kind}")),
    };
    Ok((scheme, start))
}

impl LayerSnapshot {
    /// A quantized layer's snapshot (`Quant`) of these planes.
    pub fn quant(planes: Vec<Array>, float: Option<(Array, Array)>, scheme: KvScheme, start: i32) -> Result<LayerSnapshot> {
        let meta = match scheme {
            KvScheme::Affine { bits, group_size } => [1, bits, group_size, start],
            KvScheme::TurboQuant { key_bits, value_bits } => [2, key_bits, value_bits, start],
            KvScheme::Dense => return Err(Error::internal("a quantized KV snapshot of the dense scheme")),
        };
        let meta = Array::from_f32(&meta.map(|x| x as f32), &[4])?;
        Ok(LayerSnapshot::Quant { planes, float, meta })
    }

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
            // A shorter prefix only while nothing was dropped (`len` within
            // the window): once wrapped, exactly `len`.
            LayerSnapshot::Ring { keys, values, len, window } => {
                let w = window.item_f32()? as i32;
                if n > *len || (n < *len && *len > w) {
                    return Err(Error::internal(format!("a ring of {len} positions (window {w}) cannot stand for {n}")));
                }
                let held = n.min(w);
                Ok(LayerCache::Ring(RingCache::from_snapshot(
                    keys.slice_axis(2, 0, held)?,
                    values.slice_axis(2, 0, held)?,
                    n,
                    w,
                )?))
            }
            // Quantized KV is non-trimmable (see `LayerCache::trimmable`):
            // exactly the row as it was.
            LayerSnapshot::Quant { planes, float, meta } => {
                let len = planes.first().map_or(0, |p| p.dim(2));
                if n != len {
                    return Err(Error::internal(format!("a quantized KV snapshot of {len} positions cannot stand for {n}")));
                }
                let (scheme, start) = quant_meta(meta).map_err(Error::internal)?;
                let planes = planes.iter().map(Array::share).collect();
                let float = float.as_ref().map(|(k, v)| (k.share(), v.share()));
                Ok(LayerCache::Kv(KvCache::from_quant(QuantRow { planes, float, scheme, start })?))
            }
            LayerSnapshot::Paged(p) => Ok(LayerCache::Paged(PagedKv::from_snapshot(p, n)?)),
        }
    }

    /// The tensors with their names in an entry file (`<layer>.<name>`);
    /// none for a paged layer (`paged::codec` stores its blocks).
    pub fn tensors(&self) -> Vec<(&'static str, &Array)> {
        match self {
            LayerSnapshot::Paged(_) => vec![],
            LayerSnapshot::Kv { keys, values } => vec![("keys", keys), ("values", values)],
            LayerSnapshot::State { conv, state, .. } => vec![("conv", conv), ("state", state)],
            LayerSnapshot::Ring { keys, values, window, .. } => {
                vec![("ring.keys", keys), ("ring.values", values), ("ring.window", window)]
            }
            LayerSnapshot::Quant { planes, float, meta } => {
                let mut t: Vec<(&'static str, &Array)> = QUANT_PLANES.iter().copied().zip(planes).collect();
                if let Some((k, v)) = float {
                    t.extend([("q.keys", k), ("q.values", v)]);
                }
                t.push(("q.meta", meta));
                t
            }
        }
    }

    /// Rebuilds a layer from an entry file's tensors (`get(name)`) for a
    /// sequence of `len` tokens; names which kind the layer is.
    pub fn from_tensors(
        len: i32,
        mut get: impl FnMut(&str) -> std::result::Result<Option<Array>, String>,
    ) -> std::result::Result<LayerSnapshot, String> {
        if let Some(keys) = get("ring.keys")? {
            let values = get("ring.values")?.ok_or("ring keys without values")?;
            let window = get("ring.window")?.ok_or("ring keys without a window")?;
            let w = match window.to_vec_f32() {
                Ok(v) if window.shape() == [1] && v[0] >= 1.0 && v[0].fract() == 0.0 => v[0] as i32,
                _ => return Err(format!("ring window of shape {:?} is not one positive integer", window.shape())),
            };
            for (n, a) in [("ring.keys", &keys), ("ring.values", &values)] {
                if a.ndim() != 4 || a.dim(0) != 1 || a.dim(2) != len.min(w) {
                    return Err(format!("{n} has shape {:?} for {len} tokens in a window of {w}", a.shape()));
                }
            }
            return Ok(LayerSnapshot::Ring { keys, values, len, window });
        }
        if let Some(meta) = get("q.meta")? {
            let (scheme, start) = quant_meta(&meta)?;
            let n = if matches!(scheme, KvScheme::Affine { .. }) { 6 } else { 5 };
            let mut planes = vec![];
            for name in &QUANT_PLANES[..n] {
                planes.push(get(name)?.ok_or(format!("quantized KV without plane {name}"))?);
            }
            let float = match (get("q.keys")?, get("q.values")?) {
                (Some(k), Some(v)) => Some((k, v)),
                (None, None) => None,
                _ => return Err("quantized KV with float keys or values alone".into()),
            };
            if float.is_some() != (len < start) {
                return Err(format!("quantized KV of {len} tokens, start {start}: float copy mismatch"));
            }
            let float_arrays = float.iter().flat_map(|(k, v)| [k, v]);
            for a in planes.iter().chain(float_arrays) {
                if a.ndim() != 4 || a.dim(0) != 1 || a.dim(2) != len {
                    return Err(format!("quantized KV plane of shape {:?} for {len} tokens", a.shape()));
                }
            }
            return Ok(LayerSnapshot::Quant { planes, float, meta });
        }
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
        match self {
            LayerSnapshot::Paged(p) => p.nbytes(),
            _ => self.tensors().iter().map(|(_, a)| a.nbytes()).sum(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[1, 2, l, 64]` pseudo-random keys or values.
    fn kv(seed: u32, l: i32) -> Array {
        let mut x = seed.wrapping_mul(2654435761).max(1);
        let v: Vec<f32> = (0..2 * l * 64)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x % 2000) as f32 / 1000.0 - 1.0
            })
            .collect();
        Array::from_f32(&v, &[1, 2, l, 64]).unwrap()
    }

    fn bytes(c: &LayerCache) -> (Vec<Vec<u8>>, bool) {
        let r = c.kv().unwrap().row_quant(0, c.row_len(0)).unwrap();
        let float = r.float.iter().flat_map(|(k, v)| [k.to_bytes().unwrap(), v.to_bytes().unwrap()]);
        (r.planes.iter().map(|p| p.to_bytes().unwrap()).chain(float).collect(), r.float.is_some())
    }

    /// The keys and values a layer attends to after `update`, as host floats.
    fn attended(c: &mut LayerCache, k: &Array, v: &Array) -> (Vec<f32>, Vec<f32>) {
        let (keys, values) = match c {
            LayerCache::Ring(r) => r.update_and_fetch(k, v).unwrap(),
            LayerCache::Kv(kv) => match kv.update(k, v).unwrap() {
                super::super::KvView::Dense { keys, values } => (keys, values),
                _ => panic!("dense cache"),
            },
            LayerCache::State(_) | LayerCache::Paged(_) => unreachable!("the test makes no such caches"),
        };
        (keys.to_vec_f32().unwrap(), values.to_vec_f32().unwrap())
    }

    /// A speculative step's rollback: writing 4 positions, trimming 3 and
    /// writing 2 more leaves the cache as writing the 1 kept and the 2 new
    /// (dense KV, a ring before it wraps, quantized KV below and past its
    /// start); a ring that would wrap or a recurrent state refuses.
    #[test]
    fn trimmed_caches_equal_caches_that_never_held_the_rejected_positions() {
        let quant = |start| {
            let mut c = LayerCache::Kv(KvCache::with_scheme(1, KvScheme::Affine { bits: 4, group_size: 64 }).unwrap());
            c.set_starts(&[start]);
            c
        };
        // The kept (first) position of the 4 written.
        let first = |seed| kv(seed, 4).slice_axis(2, 0, 1).unwrap();
        let makers: Vec<(&str, Box<dyn Fn() -> LayerCache>)> = vec![
            ("dense", Box::new(|| LayerCache::Kv(KvCache::new(1)))),
            ("ring", Box::new(|| LayerCache::Ring(RingCache::new(1, 32)))),
            ("affine past start", Box::new(move || quant(0))),
            ("affine below start", Box::new(move || quant(20))),
        ];
        for (name, make) in makers {
            let (mut a, mut b) = (make(), make());
            for c in [&mut a, &mut b] {
                match c {
                    LayerCache::Ring(r) => drop(r.update_and_fetch(&kv(1, 6), &kv(2, 6)).unwrap()),
                    c => drop(c.kv_mut().unwrap().update(&kv(1, 6), &kv(2, 6)).unwrap()),
                }
            }
            assert!(a.can_trim_after(4), "{name}");
            if a.kv().is_ok_and(|c| c.is_quantized()) {
                // Compare the stored planes: quantized views are not floats.
                a.kv_mut().unwrap().update(&kv(3, 4), &kv(4, 4)).unwrap();
                a.trim(3).unwrap();
                b.kv_mut().unwrap().update(&first(3), &first(4)).unwrap();
                for c in [&mut a, &mut b] {
                    c.kv_mut().unwrap().update(&kv(5, 2), &kv(6, 2)).unwrap();
                }
                assert_eq!(a.row_len(0), 9, "{name}");
                assert_eq!(bytes(&a), bytes(&b), "{name}");
                continue;
            }
            attended(&mut a, &kv(3, 4), &kv(4, 4));
            a.trim(3).unwrap();
            attended(&mut b, &first(3), &first(4));
            assert_eq!(a.row_len(0), 7, "{name}");
            assert_eq!(attended(&mut a, &kv(5, 1), &kv(6, 1)), attended(&mut b, &kv(5, 1), &kv(6, 1)), "{name}: one more");
            assert_eq!(attended(&mut a, &kv(7, 2), &kv(8, 2)), attended(&mut b, &kv(7, 2), &kv(8, 2)), "{name}: two more");
        }
        let mut ring = LayerCache::Ring(RingCache::new(1, 8));
        if let LayerCache::Ring(r) = &mut ring {
            r.update_and_fetch(&kv(1, 6), &kv(2, 6)).unwrap();
        }
        assert!(ring.can_trim_after(2) && !ring.can_trim_after(3), "a ring may not wrap inside a verify step");
        let mut q = quant(8);
        q.kv_mut().unwrap().update(&kv(1, 6), &kv(2, 6)).unwrap();
        assert!(q.can_trim_after(1) && !q.can_trim_after(2), "a step may not reach the start from below");
        assert!(!LayerCache::State(StateCache::new(1)).can_trim_after(1));
    }

    /// A quantized row snapshotted, stored as bytes (as on disk), restored
    /// and extended holds exactly the planes (and float copy) of the row
    /// extended in place, below and past its start.
    #[test]
    fn quantized_snapshots_restore_exactly() {
        let schemes = [KvScheme::Affine { bits: 4, group_size: 64 }, KvScheme::TurboQuant { key_bits: 8, value_bits: 3 }];
        for scheme in schemes {
            for (start, len) in [(0, 5), (8, 5), (8, 8), (8, 12)] {
                let mut c = LayerCache::Kv(KvCache::with_scheme(1, scheme).unwrap());
                c.set_starts(&[start]);
                c.kv_mut().unwrap().update(&kv(1, len), &kv(2, len)).unwrap();
                let snap = c.snapshot_row(0, len, false).unwrap();
                assert!(matches!(&snap, LayerSnapshot::Quant { float, .. } if float.is_some() == (len < start)));
                let stored: Vec<(String, Array)> = snap
                    .tensors()
                    .into_iter()
                    .map(|(n, a)| (n.to_string(), Array::from_bytes(&a.to_bytes().unwrap(), &a.shape(), a.dtype()).unwrap()))
                    .collect();
                let get = |n: &str| Ok(stored.iter().find(|(m, _)| m == n).map(|(_, a)| a.share()));
                let back = LayerSnapshot::from_tensors(len, get).unwrap();
                assert!(back.restore(len - 1).is_err(), "quantized snapshots are whole-only");
                let mut r = back.restore(len).unwrap();
                assert_eq!(bytes(&r), bytes(&c), "{scheme:?} start {start} len {len}");
                for x in [&mut c, &mut r] {
                    x.kv_mut().unwrap().update(&kv(3, 3), &kv(4, 3)).unwrap();
                }
                assert_eq!(bytes(&r), bytes(&c), "{scheme:?} start {start} len {len}, then 3 more");
            }
        }
    }
}
