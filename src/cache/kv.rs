//! The KV cache of one attention layer for a batch of rows. Rows share one
//! physical timeline (`Timeline`) of `len` positions; a row whose history is
//! shorter is left-padded (leading positions it never attends to). One row
//! without padding is the plain single-sequence cache, with no mask or
//! per-row positions overhead.
//!
//! Storage is a list of planes, each `[B, H, capacity, X]` with positions on
//! axis 2: keys and values for the dense scheme; for the affine scheme the
//! packed words, scales and biases of keys and of values (`mx.quantize`
//! along the head dimension, as mlx-lm's `QuantizedKVCache`); for TurboQuant
//! the key indices, scales, zeros and the rotated value indices, scales
//! (`cache/turbo.rs`). The planes grow
//! in steps, so appending a token is an in-place slice update rather than a
//! concatenation.
//!
//! Delayed quantization (`quantized_kv_start`, per row): a row's forward
//! over its positions `[a, a + L)` attends to float KV iff `a < start`
//! (chunks never straddle a row's start: see `Cohort`). New tokens are
//! quantized on write from the first position on (quantization is per
//! vector, so this equals mlx-lm's conversion of the float history), and a
//! float copy is kept beside the packed planes while any row is before its
//! start; it is dropped once all rows have reached theirs.

use super::scheme::KvScheme;
use super::turbo::{TurboCodec, TurboKv};
use super::{AttnMask, Positions, Timeline};
use crate::error::{Error, Result};
use crate::mlx::{quantize, Array, Dtype};
use crate::model::Kernels;
use std::rc::Rc;

/// Buffer growth granularity in positions (as in mlx-lm).
const STEP: i32 = 256;

/// `n` rounded up to whole steps.
fn round_up(n: i32) -> i32 {
    (n + STEP - 1) / STEP * STEP
}

/// Buffers along the timeline (`[B, H, capacity, X]` each; none allocated
/// yet when empty), the capacity the next growth allocates at least
/// (`KvCache::reserve`; a position on the timeline, so it moves with
/// padding and filtering), and the dtype the first allocation stores (None:
/// the written arrays'). A plane keeps its dtype: writes are cast to it.
/// All of the cache's bookkeeping is written once, here.
#[derive(Default)]
struct Planes(Vec<Array>, i32, Option<Dtype>);

impl Planes {
    fn capacity(&self) -> i32 {
        self.0.first().map_or(0, |a| a.dim(2))
    }

    /// The dtype the first plane stores writes in (None: as written); a
    /// dense cache's planes (keys, values) share it.
    fn dtype(&self) -> Option<Dtype> {
        self.0.first().map(|a| a.dtype()).or(self.2)
    }

    /// Writes `new` (one array per plane, `[B, H, L, X]`) at positions
    /// `prev..prev + L`, growing first if needed; returns views of
    /// positions `0..prev + L`.
    fn write(&mut self, new: &[Array], prev: i32) -> Result<Vec<Array>> {
        let cast = |(i, x): (usize, &Array)| match self.0.get(i).map(|a| a.dtype()).or(self.2) {
            Some(d) if d != x.dtype() => x.astype(d),
            _ => Ok(x.share()),
        };
        let new = &new.iter().enumerate().map(cast).collect::<std::result::Result<Vec<_>, _>>()?;
        let l = new[0].dim(2);
        let end = prev + l;
        if end > self.capacity() {
            // Growing copies the written positions into an unwritten buffer
            // and frees the old one: a reservation (the rows' whole reach)
            // makes a prompt's chunks and its answer write into one
            // allocation instead.
            let capacity = if self.1 >= end { self.1 } else { prev + round_up(l) };
            let mut grown = Vec::with_capacity(new.len());
            for (i, x) in new.iter().enumerate() {
                let mut s = x.shape();
                s[2] = capacity;
                let buf = Array::uninit(&s, x.dtype())?;
                let upto = [s[0], s[1], prev, s[3]];
                grown.push(match self.0.get(i) {
                    _ if prev == 0 => buf,
                    Some(old) => buf.slice_update(&old.slice_axis(2, 0, prev)?, &[0, 0, 0, 0], &upto)?,
                    // No buffers yet on a timeline already `prev` long
                    // (planes that joined others without any, e.g. a float
                    // copy for a row that joined a cohort whose own was
                    // dropped): those positions are padding or floats no
                    // row reads, and must read as zeros (a masked key's
                    // value still meets a zero weight).
                    None => buf.slice_update(&zeros_like_positions(x, prev)?, &[0, 0, 0, 0], &upto)?,
                });
            }
            self.0 = grown;
        }
        // The old buffers are dropped as they are replaced, so at evaluation
        // time only the update node holds them and MLX can write in place.
        let old = std::mem::take(&mut self.0);
        let mut views = Vec::with_capacity(new.len());
        for (buf, x) in old.into_iter().zip(new) {
            let s = x.shape();
            let updated = buf.slice_update(x, &[0, 0, prev, 0], &[s[0], s[1], end, s[3]])?;
            views.push(updated.slice_axis(2, 0, end)?);
            self.0.push(updated);
        }
        Ok(views)
    }

    /// The written positions `0..len` of every plane (None when unallocated).
    fn contents(&self, len: i32) -> Result<Option<Vec<Array>>> {
        if self.0.is_empty() {
            return Ok(None);
        }
        Ok(Some(self.0.iter().map(|a| a.slice_axis(2, 0, len)).collect::<std::result::Result<_, _>>()?))
    }

    fn pad_front(&mut self, n: i32, len: i32) -> Result<()> {
        if self.1 > 0 {
            self.1 = self.1.saturating_add(n);
        }
        if let Some(planes) = self.contents(len)? {
            let mut out = Vec::with_capacity(planes.len());
            for a in planes {
                out.push(Array::concatenate(&[&zeros_like_positions(&a, n)?, &a], 2)?);
            }
            self.0 = out;
        }
        Ok(())
    }

    /// Stacks `other`'s rows after these (both `len` positions); zeros stand
    /// in for a side with no buffers.
    fn extend(&mut self, other: &Planes, len: i32, rows: (usize, usize)) -> Result<()> {
        self.1 = self.1.max(other.1);
        let (mine, theirs) = (self.contents(len)?, other.contents(len)?);
        let Some(like) = mine.as_ref().or(theirs.as_ref()).map(|p| p.iter().map(|a| (a.shape(), a.dtype())).collect::<Vec<_>>())
        else {
            return Ok(());
        };
        let fill = |r: usize| -> Result<Vec<Array>> {
            like.iter().map(|(s, dt)| Ok(Array::zeros(&[r as i32, s[1], len, s[3]], *dt)?)).collect()
        };
        let a = match mine {
            Some(p) => p,
            None => fill(rows.0)?,
        };
        let b = match theirs {
            Some(p) => p,
            None => fill(rows.1)?,
        };
        self.0 = a.iter().zip(&b).map(|(x, y)| Array::concatenate(&[x, y], 0)).collect::<std::result::Result<_, _>>()?;
        Ok(())
    }

    /// Keeps rows `idx` and drops the first `shared` positions.
    fn filter(&mut self, idx: &Array, shared: i32, len: i32) -> Result<()> {
        self.1 = (self.1 - shared).max(0);
        if let Some(planes) = self.contents(len)? {
            let mut out = Vec::with_capacity(planes.len());
            for a in planes {
                let a = a.take(idx, 0)?;
                out.push(if shared > 0 { a.slice_axis(2, shared, len)? } else { a });
            }
            self.0 = out;
        }
        Ok(())
    }

    fn nbytes(&self) -> usize {
        self.0.iter().map(|a| a.nbytes()).sum()
    }
}

/// The packed planes of a quantized cache.
struct Quant {
    planes: Planes,
    scheme: KvScheme,
    /// The TurboQuant codec, made at the first write (it needs the head dims).
    turbo: Option<Rc<TurboCodec>>,
    /// Per row: the position from which it attends to quantized KV.
    starts: Vec<i32>,
}

impl Quant {
    fn new(scheme: KvScheme, rows: usize) -> Quant {
        Quant { planes: Planes::default(), scheme, turbo: None, starts: vec![0; rows] }
    }

    /// Encodes `k`, `v` into the planes at `prev..` and returns the view of
    /// all positions (`KvView::Affine` or `KvView::Turbo`). `kernels`
    /// picks TurboQuant's encoder (`TurboCodec::encode`).
    fn write(&mut self, k: &Array, v: &Array, prev: i32, kernels: Kernels) -> Result<KvView> {
        match self.scheme {
            KvScheme::Affine { bits, group_size } => {
                let (kw, ks, kb) = quantize(k, group_size, bits)?;
                let (vw, vs, vb) = quantize(v, group_size, bits)?;
                let mut p = self.planes.write(&[kw, ks, kb, vw, vs, vb], prev)?.into_iter();
                let mut next = || p.next().expect("six planes");
                Ok(KvView::Affine(AffineKv {
                    keys: [next(), next(), next()],
                    values: [next(), next(), next()],
                    group_size,
                    bits,
                }))
            }
            KvScheme::TurboQuant { key_bits, value_bits } => {
                if self.turbo.is_none() {
                    self.turbo = Some(Rc::new(TurboCodec::new(key_bits, value_bits, k.dim(3), v.dim(3))?));
                }
                let codec = self.turbo.clone().expect("made above");
                let planes = self.planes.write(&codec.encode(k, v, kernels)?, prev)?;
                Ok(KvView::Turbo(TurboKv::from_planes(planes, codec)?))
            }
            KvScheme::Dense => Err(Error::internal("a dense scheme has no quantized planes")),
        }
    }
}

/// One row of a quantized cache (`KvCache::row_quant`): planes `[1, H,
/// len, X]`, the float keys and values iff `len < start`.
pub struct QuantRow {
    pub planes: Vec<Array>,
    pub float: Option<(Array, Array)>,
    pub scheme: KvScheme,
    pub start: i32,
}

pub struct KvCache {
    t: Timeline,
    /// Keys and values as computed: the cache itself for the dense scheme;
    /// for a quantized one the float copy, kept (None once dropped) while
    /// some row has not reached its start.
    dense: Option<Planes>,
    quant: Option<Quant>,
}

/// Affine-quantized keys and values (`[B, H, T, ·]` planes: packed words,
/// scales, biases), as `quantized_attention` takes them.
pub struct AffineKv {
    pub keys: [Array; 3],
    pub values: [Array; 3],
    pub group_size: i32,
    pub bits: i32,
}

impl AffineKv {
    fn share(&self) -> AffineKv {
        let s = |p: &[Array; 3]| [p[0].share(), p[1].share(), p[2].share()];
        AffineKv { keys: s(&self.keys), values: s(&self.values), group_size: self.group_size, bits: self.bits }
    }
}

/// What a layer attends to after its cache update: every cached key and
/// value (itself included), in whichever form the rows need.
pub enum KvView {
    Dense { keys: Array, values: Array },
    Affine(AffineKv),
    Turbo(TurboKv),
    /// Some rows before their start (float), the others quantized (`quant`
    /// is `Affine` or `Turbo`): `use_float` is `[B, 1, 1, 1]` bool.
    Mixed { keys: Array, values: Array, quant: Box<KvView>, use_float: Array },
    /// A paged layer's pool and the batch's block tables (`kv_paging`):
    /// causal over each row's own length, whatever mask is passed.
    Paged(super::paged::layer::PagedView),
}

impl KvView {
    /// Another handle on the same arrays (layers sharing another's KV).
    pub fn share(&self) -> KvView {
        match self {
            KvView::Dense { keys, values } => KvView::Dense { keys: keys.share(), values: values.share() },
            KvView::Affine(q) => KvView::Affine(q.share()),
            KvView::Turbo(q) => KvView::Turbo(q.share()),
            KvView::Mixed { keys, values, quant, use_float } => KvView::Mixed {
                keys: keys.share(),
                values: values.share(),
                quant: Box::new(quant.share()),
                use_float: use_float.share(),
            },
            KvView::Paged(p) => KvView::Paged(p.share()),
        }
    }

    /// [`KvView::attend`] with the heads side by side: `[B, L, Hq * Dv]`,
    /// the output projection's input (for dense KV under `Kernels::Auto`
    /// the fused kernel writes it so; otherwise a transpose follows).
    pub fn attend_merged(&self, queries: &Array, scale: f32, mask: &AttnMask, kernels: Kernels) -> Result<Array> {
        match (self, kernels) {
            (KvView::Dense { keys, values }, Kernels::Auto) => {
                Ok(crate::mlx::fused_sdpa_merged(queries, keys, values, scale, mask.as_mask(), None)?)
            }
            _ => Ok(crate::mlx::merge_heads(&self.attend(queries, scale, mask, kernels)?)?),
        }
    }

    /// Scaled dot-product attention of `queries` (`[B, heads, L, D]`) over
    /// these keys and values: `[B, heads, L, Dv]`.
    /// `kernels` picks the implementation: mlxrt's fused CPU kernels
    /// (float: `mlx::fused_sdpa`; quantized: see `quant_attention`) or MLX's.
    pub fn attend(&self, queries: &Array, scale: f32, mask: &AttnMask, kernels: Kernels) -> Result<Array> {
        use crate::mlx::{fused_sdpa, sdpa_stock};
        let dense = |k: &Array, v: &Array| -> Result<Array> {
            let run = if kernels == Kernels::Auto { fused_sdpa } else { sdpa_stock };
            Ok(run(queries, k, v, scale, mask.as_mask(), None)?)
        };
        let quant = |q: &AffineKv| {
            super::quant_attention::quantized_attention(queries, &q.keys, &q.values, scale, mask, q.group_size, q.bits, kernels)
        };
        match self {
            KvView::Dense { keys, values } => dense(keys, values),
            KvView::Affine(q) => quant(q),
            KvView::Turbo(q) => q.attend(queries, scale, mask.as_mask(), kernels),
            KvView::Mixed { keys, values, quant: q, use_float } => {
                Ok(Array::select(use_float, &dense(keys, values)?, &q.attend(queries, scale, mask, kernels)?)?)
            }
            KvView::Paged(p) => p.attend(queries, scale, kernels),
        }
    }
}

impl KvCache {
    /// An empty dense cache for `rows` rows.
    pub fn new(rows: usize) -> KvCache {
        KvCache { t: Timeline::new(rows), dense: Some(Planes::default()), quant: None }
    }

    /// An empty cache for `rows` rows storing KV as `scheme` says, every row
    /// quantized from position 0 until `set_starts` says otherwise.
    pub fn with_scheme(rows: usize, scheme: KvScheme) -> Result<KvCache> {
        let mut c = KvCache::new(rows);
        match scheme {
            KvScheme::Dense => {}
            KvScheme::Affine { .. } | KvScheme::TurboQuant { .. } => c.quant = Some(Quant::new(scheme, rows)),
        }
        Ok(c)
    }

    /// An empty cache of the same scheme (and dense dtype) for `rows` rows.
    pub fn empty_like(&self, rows: usize) -> KvCache {
        let mut c = KvCache::new(rows);
        if let Some(q) = &self.quant {
            c.quant = Some(Quant { turbo: q.turbo.clone(), ..Quant::new(q.scheme, rows) });
        }
        if let (Some(mine), Some(theirs)) = (&self.dense, &mut c.dense) {
            theirs.2 = mine.0.first().map(|a| a.dtype()).or(mine.2);
        }
        c
    }

    /// Stores the dense keys and values of an empty cache as `dtype` (an f16
    /// cache: `KvFloat::F16`); writes are cast to it.
    pub fn set_dense_dtype(&mut self, dtype: Dtype) {
        if let Some(d) = &mut self.dense {
            d.2 = Some(dtype);
        }
    }

    /// A one-row dense cache holding `keys`, `values` (`[1, H, n, D]`) as its
    /// first `n` positions. The arrays are not written to: the first append
    /// grows into a new buffer.
    pub fn from_prefix(keys: Array, values: Array) -> KvCache {
        let t = Timeline::single(keys.dim(2));
        KvCache { t, dense: Some(Planes(vec![keys, values], 0, None)), quant: None }
    }

    /// Whether keys and values are stored quantized.
    pub fn is_quantized(&self) -> bool {
        self.quant.is_some()
    }

    /// Sets each row's `quantized_kv_start` (rows of an empty cache; no
    /// effect on a dense cache).
    pub fn set_starts(&mut self, starts: &[i32]) {
        if let Some(q) = &mut self.quant {
            debug_assert!(self.t.is_empty() && starts.len() == q.starts.len());
            q.starts = starts.to_vec();
        }
    }

    /// Makes the planes' next growth hold `end` positions (the most the rows
    /// can reach), or `positions` if more, at once: a prompt's chunks and
    /// the whole answer then write into one allocation, never copied. The
    /// room ahead is allocated unwritten, so it costs no zero-fill and, on
    /// CPU, no resident memory until positions are written.
    pub fn reserve(&mut self, positions: i32, end: i32) {
        let target = end.max(positions);
        for p in self.dense.iter_mut().chain(self.quant.as_mut().map(|q| &mut q.planes)) {
            p.1 = target;
        }
    }

    /// A contiguous copy of `row`'s keys and values at its own positions
    /// `from..to` (0 = its first real token). Dense caches only.
    pub fn row_slice(&self, row: usize, from: i32, to: i32) -> Result<(Array, Array)> {
        if self.quant.is_some() {
            return Err(Error::internal("row_slice of a quantized KV cache (use row_quant)"));
        }
        let mut p = self.cut_row(self.dense.as_ref(), row, from, to, true)?.into_iter();
        Ok((p.next().expect("keys"), p.next().expect("values")))
    }

    /// `row_slice` without the copy: views that share (and keep) the
    /// cache's buffers, for a cache about to be dropped. While the cache
    /// lives on, its next write copies its buffers instead of updating them
    /// in place.
    pub fn row_view(&self, row: usize, from: i32, to: i32) -> Result<(Array, Array)> {
        if self.quant.is_some() {
            return Err(Error::internal("row_view of a quantized KV cache (use row_quant)"));
        }
        let mut p = self.cut_row(self.dense.as_ref(), row, from, to, false)?.into_iter();
        Ok((p.next().expect("keys"), p.next().expect("values")))
    }

    /// `planes`' positions `from..to` of `row`: contiguous copies, or views.
    fn cut_row(&self, planes: Option<&Planes>, row: usize, from: i32, to: i32, copy: bool) -> Result<Vec<Array>> {
        let planes = planes.and_then(|d| d.contents(self.t.len()).transpose());
        let planes = planes.ok_or_else(|| Error::internal("slicing an empty cache"))??;
        let r = row as i32;
        if to > self.row_len(row) || from > to {
            return Err(Error::internal(format!("row {row} has {} positions, asked {from}..{to}", self.row_len(row))));
        }
        let slots = self.t.slots(row, from, to);
        let (first, last) = (slots.first().copied().unwrap_or(0), slots.last().map_or(0, |s| s + 1));
        // Holes (rejected drafts, see `Timeline`) between the positions: a
        // gathered copy.
        let gather = (last - first != to - from).then(|| Array::from_i32(&slots, &[slots.len() as i32])).transpose()?;
        let cut = |a: &Array| -> Result<Array> {
            let s = a.shape();
            if let Some(idx) = &gather {
                return Ok(a.slice_axis(0, r, r + 1)?.take(idx, 2)?);
            }
            let v = a.slice(&[r, 0, first, 0], &[r + 1, s[1], first + (to - from), s[3]], &[1, 1, 1, 1])?;
            Ok(if copy { v.contiguous()? } else { v })
        };
        planes.iter().map(cut).collect()
    }

    /// Row `row`'s first `len` positions of a quantized cache, exactly as a
    /// one-row cache of that length holds them: the packed planes, and
    /// while `len` is below the row's start the float keys and values too
    /// (an error if they were dropped already).
    pub fn row_quant(&self, row: usize, len: i32) -> Result<QuantRow> {
        let q = self.quant.as_ref().ok_or_else(|| Error::internal("row_quant of a dense KV cache"))?;
        let start = q.starts[row];
        let float = if len < start {
            if self.dense.is_none() {
                return Err(Error::internal(format!("the float KV of a row below its start ({len} < {start}) was dropped")));
            }
            let mut d = self.cut_row(self.dense.as_ref(), row, 0, len, true)?.into_iter();
            Some((d.next().expect("keys"), d.next().expect("values")))
        } else {
            None
        };
        Ok(QuantRow { planes: self.cut_row(Some(&q.planes), row, 0, len, true)?, float, scheme: q.scheme, start })
    }

    /// A one-row quantized cache holding `r` (its planes are not written
    /// to: the first append grows into new buffers).
    pub fn from_quant(r: QuantRow) -> Result<KvCache> {
        if !r.scheme.is_quantized() || r.planes.is_empty() {
            return Err(Error::internal("restoring a quantized KV row without planes"));
        }
        let len = r.planes[0].dim(2);
        // While the row is below its start a cold run keeps the float copy
        // beside the packed planes; at or after it, only the packed planes.
        let dense = match r.float {
            Some((k, v)) if len < r.start => Some(Planes(vec![k, v], 0, None)),
            None if len >= r.start => None,
            _ => return Err(Error::internal(format!("a quantized KV row of {len} positions, start {}: float copy mismatch", r.start))),
        };
        let quant = Quant { planes: Planes(r.planes, 0, None), scheme: r.scheme, turbo: None, starts: vec![r.start] };
        Ok(KvCache { t: Timeline::single(len), dense, quant: Some(quant) })
    }

    /// The rows' shared timeline (length and left padding).
    pub fn timeline(&self) -> &Timeline {
        &self.t
    }

    /// Sets `row`'s RoPE delta (see `Timeline`).
    pub fn set_rope_delta(&mut self, row: usize, delta: i32) {
        self.t.set_delta(row, delta);
    }

    /// Declares left padding for the rows of an empty cache (see `Timeline`).
    pub fn set_padding(&mut self, pads: &[i32]) {
        self.t.set_padding(pads);
    }

    pub fn rows(&self) -> usize {
        self.t.rows()
    }

    /// Physical length (positions written, padding included).
    pub fn len(&self) -> i32 {
        self.t.len()
    }

    pub fn is_empty(&self) -> bool {
        self.t.is_empty()
    }

    /// Tokens actually held for `row` (its length without padding).
    pub fn row_len(&self, row: usize) -> i32 {
        self.t.row_len(row)
    }

    /// RoPE positions of the next tokens.
    pub fn positions(&self) -> Result<Positions> {
        self.t.positions()
    }

    /// The mask for `n` new tokens attending to everything cached plus
    /// themselves (causally), without the padding and holes.
    pub fn mask(&self, n: i32) -> Result<AttnMask> {
        let (len, pad) = (self.t.len(), self.t.pads());
        if pad.iter().all(|&p| p == 0) && !self.t.has_holes() {
            return Ok(if n > 1 { AttnMask::Causal } else { AttnMask::None });
        }
        let total = len + n;
        let b = self.rows() as i32;
        let keys = Array::arange(0, total)?.reshape(&[1, 1, 1, total])?;
        let queries = Array::arange(len, total)?.reshape(&[1, 1, n, 1])?;
        let causal = queries.greater_equal(&keys)?;
        let attended = if self.t.has_holes() {
            let flags: Vec<i32> = self.t.attended(total).into_iter().map(i32::from).collect();
            Array::from_i32(&flags, &[b, 1, 1, total])?.astype(Dtype::Bool)?
        } else {
            keys.greater_equal(&Array::from_i32(pad, &[b, 1, 1, 1])?)?
        };
        Ok(AttnMask::Array(causal.logical_and(&attended)?))
    }

    /// Appends `k`, `v` (`[B, kv_heads, L, head_dim]`) for every row and
    /// returns what the layer attends to: all cached keys and values
    /// including them.
    pub fn update(&mut self, k: &Array, v: &Array) -> Result<KvView> {
        self.update_with(k, v, Kernels::Auto)
    }

    /// The dtype a dense cache stores its keys and values in, so that they
    /// can be computed in it (None: as written, or a quantized cache).
    pub fn write_dtype(&self) -> Option<Dtype> {
        match (&self.dense, &self.quant) {
            (Some(d), None) => d.dtype(),
            _ => None,
        }
    }

    /// `update`, encoding quantized KV with `kernels`' implementation
    /// (mlxrt's fused CPU encoder or MLX ops; the same bits).
    pub fn update_with(&mut self, k: &Array, v: &Array, kernels: Kernels) -> Result<KvView> {
        let b = k.dim(0);
        if b as usize != self.rows() {
            return Err(Error::internal(format!("cache has {} rows, update has {b}", self.rows())));
        }
        let prev = self.t.len();
        // Per row: whether this forward starts before the row's start.
        let use_float: Vec<bool> = match &self.quant {
            Some(q) => self.t.pads().iter().zip(&q.starts).map(|(&p, &s)| (prev - p).max(0) < s).collect(),
            None => vec![],
        };
        self.t.advance(k.dim(2));
        let dense = match &mut self.dense {
            Some(d) => Some(d.write(&[k.share(), v.share()], prev)?),
            None => None,
        };
        let Some(q) = &mut self.quant else {
            let mut d = dense.expect("a dense cache keeps its planes").into_iter();
            return Ok(KvView::Dense { keys: d.next().expect("keys"), values: d.next().expect("values") });
        };
        let quant = q.write(k, v, prev, kernels)?;
        let len = self.t.len();
        let needed = self.t.pads().iter().zip(&q.starts).any(|(&p, &s)| (len - p).max(0) < s);
        let any_float = use_float.iter().any(|&f| f);
        let view = if !any_float {
            quant
        } else {
            let mut d = dense
                .ok_or_else(|| Error::internal("a row before its quantized_kv_start has no float KV"))?
                .into_iter();
            let (keys, values) = (d.next().expect("keys"), d.next().expect("values"));
            if use_float.iter().all(|&f| f) {
                KvView::Dense { keys, values }
            } else {
                let flags: Vec<i32> = use_float.iter().map(|&f| f as i32).collect();
                let use_float = Array::from_i32(&flags, &[b, 1, 1, 1])?.astype(Dtype::Bool)?;
                KvView::Mixed { keys, values, quant: Box::new(quant), use_float }
            }
        };
        if !needed {
            // Every row reached its start: the float copy is never read again.
            self.dense = None;
        }
        Ok(view)
    }

    /// Whether a forward of `width` positions can be cut back afterwards
    /// (`trim`): always for dense KV; for quantized KV only when it does not
    /// reach a row's start from below (the float copy a shorter prefix below
    /// the start needs is dropped once every row reaches it, and plain
    /// decoding switches to quantized attention exactly at the start).
    pub fn can_trim_after(&self, width: i32) -> bool {
        let Some(q) = &self.quant else { return true };
        (0..self.rows()).all(|r| {
            let len = self.row_len(r);
            len >= q.starts[r] || len + width < q.starts[r]
        })
    }

    /// Forgets the last `n` positions of every row (see `can_trim_after`).
    pub fn trim(&mut self, n: i32) {
        self.t.trim(n);
    }

    /// Makes slots `from..to` holes of `row` (see `Timeline::punch`).
    pub fn punch(&mut self, row: usize, from: i32, to: i32) {
        self.t.punch(row, from, to);
    }

    /// Prepends `n` padding positions to every row.
    fn pad_front(&mut self, n: i32) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let len = self.t.len();
        if let Some(d) = &mut self.dense {
            d.pad_front(n, len)?;
        }
        if let Some(q) = &mut self.quant {
            q.planes.pad_front(n, len)?;
        }
        self.t.pad_front(n);
        Ok(())
    }

    /// Adds `other`'s rows after this cache's rows, right-aligning both
    /// timelines (the shorter one is left-padded). Either may have positions
    /// but no buffers yet (all padding); zeros stand in for them. Both must
    /// have the same scheme.
    pub fn extend(&mut self, mut other: KvCache) -> Result<()> {
        let end = self.len().max(other.len());
        self.pad_front(end - self.len())?;
        other.pad_front(end - other.len())?;
        let rows = (self.rows(), other.rows());
        // A float copy is needed if either side keeps one; the rows of a
        // side without one have all reached their start, so zeros do.
        match (&mut self.dense, &other.dense) {
            (Some(a), Some(b)) => a.extend(b, end, rows)?,
            (Some(a), None) => a.extend(&Planes::default(), end, rows)?,
            (None, Some(b)) => {
                let mut a = Planes::default();
                a.extend(b, end, rows)?;
                self.dense = Some(a);
            }
            (None, None) => {}
        }
        match (&mut self.quant, other.quant) {
            (Some(a), Some(b)) => {
                if a.scheme != b.scheme {
                    return Err(Error::internal("extending a KV cache with one of another scheme"));
                }
                a.planes.extend(&b.planes, end, rows)?;
                a.turbo = a.turbo.take().or(b.turbo);
                a.starts.extend(b.starts);
            }
            (None, None) => {}
            _ => return Err(Error::internal("extending a KV cache with one of another scheme")),
        }
        self.t.extend(&other.t);
        Ok(())
    }

    /// Keeps the rows `keep` (in that order) and drops padding all of them share.
    pub fn filter(&mut self, keep: &[usize]) -> Result<()> {
        let idx: Vec<i32> = keep.iter().map(|&r| r as i32).collect();
        let idx = Array::from_i32(&idx, &[idx.len() as i32])?;
        let len = self.t.len();
        let shared = self.t.filter(keep);
        if let Some(d) = &mut self.dense {
            d.filter(&idx, shared, len)?;
        }
        if let Some(q) = &mut self.quant {
            q.planes.filter(&idx, shared, len)?;
            q.starts = keep.iter().map(|&r| q.starts[r]).collect();
        }
        Ok(())
    }

    /// The arrays to evaluate so that the cache content is materialized.
    pub fn state(&self) -> Vec<&Array> {
        let dense = self.dense.iter().flat_map(|d| d.0.iter());
        dense.chain(self.quant.iter().flat_map(|q| q.planes.0.iter())).collect()
    }

    /// Bytes held by the buffers (capacity, not just `len`).
    pub fn nbytes(&self) -> usize {
        let (d, q) = self.nbytes_by_kind();
        d + q
    }

    /// Bytes held dense (the float copy of a quantized cache included) and
    /// quantized.
    pub fn nbytes_by_kind(&self) -> (usize, usize) {
        (self.dense.as_ref().map_or(0, Planes::nbytes), self.quant.as_ref().map_or(0, |q| q.planes.nbytes()))
    }
}

fn zeros_like_positions(a: &Array, n: i32) -> Result<Array> {
    let mut s = a.shape();
    s[2] = n;
    Ok(Array::zeros(&s, a.dtype())?)
}

/// Bytes one cached position takes in one layer (keys and values).
pub fn bytes_per_position(kv_heads: i32, head_dim: i32, dtype: Dtype) -> usize {
    let elem = match dtype {
        Dtype::F16 | Dtype::BF16 => 2,
        Dtype::F64 => 8,
        _ => 4,
    };
    2 * (kv_heads * head_dim) as usize * elem
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlx::fast::{self};

    impl KvCache {
        fn update_and_fetch(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
            match self.update(k, v)? {
                KvView::Dense { keys, values } => Ok((keys, values)),
                _ => panic!("a dense cache gives dense views"),
            }
        }
    }

    /// `[1, 1, l, 2]` keys whose values encode the position (+ `base`).
    fn kv(base: f32, l: i32) -> Array {
        let v: Vec<f32> = (0..l).flat_map(|i| [base + i as f32, -(base + i as f32)]).collect();
        Array::from_f32(&v, &[1, 1, l, 2]).unwrap()
    }

    #[test]
    fn appends_and_grows() {
        let mut c = KvCache::new(1);
        let (k, _) = c.update_and_fetch(&kv(0.0, 3), &kv(0.0, 3)).unwrap();
        assert_eq!(k.shape(), vec![1, 1, 3, 2]);
        for i in 0..300 {
            c.update_and_fetch(&kv(3.0 + i as f32, 1), &kv(0.0, 1)).unwrap();
        }
        let (k, _) = c.update_and_fetch(&kv(303.0, 1), &kv(0.0, 1)).unwrap();
        assert_eq!(k.shape(), vec![1, 1, 304, 2]);
        let flat = k.to_vec_f32().unwrap();
        assert!((0..304).all(|i| flat[2 * i] == i as f32));
        assert!(matches!(c.positions().unwrap(), Positions::Same(304)));
        assert!(matches!(c.mask(1).unwrap(), AttnMask::None));
        assert!(matches!(c.mask(4).unwrap(), AttnMask::Causal));
    }

    #[test]
    fn a_reserve_sizes_the_first_growth() {
        let mut c = KvCache::new(1);
        c.reserve(601, 700);
        c.update_and_fetch(&kv(0.0, 100), &kv(0.0, 100)).unwrap();
        let reserved = c.nbytes();
        assert_eq!(reserved, 2 * 700 * 2 * 4, "the rows' whole reach");
        let (k, _) = c.update_and_fetch(&kv(100.0, 500), &kv(0.0, 500)).unwrap();
        assert_eq!(c.nbytes(), reserved, "the prompt's chunks fit without growing");
        for p in 600..700 {
            c.update_and_fetch(&kv(p as f32, 1), &kv(0.0, 1)).unwrap();
        }
        assert_eq!(c.nbytes(), reserved, "nor does the answer");
        let (k2, _) = c.update_and_fetch(&kv(700.0, 3), &kv(0.0, 3)).unwrap();
        assert_eq!(c.nbytes(), 2 * (700 + 256) * 2 * 4, "past it, growth goes on in steps");
        // Every written position reads back, across the growth's copy.
        for (k, n) in [(k, 600), (k2, 703)] {
            let flat = k.to_vec_f32().unwrap();
            assert_eq!(flat.len(), 2 * n);
            assert!(flat.iter().step_by(2).enumerate().all(|(i, &x)| x == i as f32));
        }
        // An end before the positions reserves them all.
        let mut c = KvCache::new(1);
        c.reserve(600, 500);
        c.update_and_fetch(&kv(0.0, 600), &kv(0.0, 600)).unwrap();
        assert_eq!(c.nbytes(), 2 * 600 * 2 * 4);
    }

    #[test]
    fn a_float_copy_that_joins_after_the_drop_reads_zeros_before_the_join() {
        // Every row of a quantized cache reached its start, so its float copy
        // is dropped; a row joining 16 positions later, below its own start,
        // brings a float copy without buffers. The joined copy's first 16
        // positions (the new row's padding: masked, yet its values meet a
        // zero weight) must read as zeros, not as whatever the buffer held.
        let x = |rows: i32, l: i32| Array::from_f32(&vec![0.5; (rows * l * 32) as usize], &[rows, 1, l, 32]).unwrap();
        let mut a = KvCache::with_scheme(1, KvScheme::Affine { bits: 8, group_size: 32 }).unwrap();
        a.update(&x(1, 16), &x(1, 16)).unwrap();
        assert!(a.dense.is_none(), "the float copy is dropped");
        let mut b = a.empty_like(1);
        b.set_starts(&[1000]);
        a.extend(b).unwrap();
        // Freed NaN buffers of the size the copy takes (16 + 256 positions),
        // so that one left unwritten likely holds NaN.
        let junk: Vec<Array> =
            (0..4).map(|_| Array::zeros(&[2, 1, 272, 32], Dtype::F32).unwrap().add_scalar(f32::NAN).unwrap()).collect();
        crate::mlx::eval(&junk.iter().collect::<Vec<_>>()).unwrap();
        drop(junk);
        let KvView::Mixed { values, .. } = a.update(&x(2, 1), &x(2, 1)).unwrap() else { panic!("one float row, one quantized") };
        let v = values.to_vec_f32().unwrap();
        for row in 0..2 {
            let head = &v[row * 17 * 32..(row * 17 + 16) * 32];
            assert!(head.iter().all(|&e| e == 0.0), "row {row}: {:?}", &head[..4]);
            assert!(v[(row * 17 + 16) * 32..(row + 1) * 17 * 32].iter().all(|&e| e == 0.5), "row {row}'s new position");
        }
    }

    #[test]
    fn a_reservation_follows_padding_filtering_and_joins() {
        // Two one-row caches reserved to 300 and 40 positions, joined (the
        // shorter padded in front) and filtered back to one row: the joined
        // cache keeps the furthest reach, moved by the padding filtering
        // drops, so decoding up to it grows only once.
        let mut a = KvCache::new(1);
        a.reserve(21, 300);
        a.update_and_fetch(&kv(0.0, 20), &kv(0.0, 20)).unwrap();
        let mut b = KvCache::new(1);
        b.reserve(11, 40);
        b.update_and_fetch(&kv(0.0, 10), &kv(0.0, 10)).unwrap();
        b.extend(a).unwrap();
        assert_eq!((b.rows(), b.len()), (2, 20));
        let two = |x: Array| Array::concatenate(&[&x, &x], 0).unwrap();
        b.update_and_fetch(&two(kv(20.0, 1)), &two(kv(0.0, 1))).unwrap();
        assert_eq!(b.nbytes(), 2 * 2 * 300 * 2 * 4, "the joined rows' furthest reach");
        b.filter(&[0]).unwrap();
        assert_eq!(b.len(), 11, "the padding both rows no longer share is dropped");
        for p in 11..290 {
            b.update_and_fetch(&kv(p as f32, 1), &kv(0.0, 1)).unwrap();
        }
        assert_eq!(b.nbytes(), 2 * 290 * 2 * 4, "grown once, to the reach moved by the dropped padding");
    }

    #[test]
    fn extend_right_aligns_and_masks_padding() {
        let mut a = KvCache::new(1);
        a.update_and_fetch(&kv(0.0, 5), &kv(0.0, 5)).unwrap();
        let mut b = KvCache::new(1);
        b.update_and_fetch(&kv(100.0, 2), &kv(100.0, 2)).unwrap();
        a.extend(b).unwrap();
        assert_eq!((a.rows(), a.len(), a.row_len(0), a.row_len(1)), (2, 5, 5, 2));
        let Positions::PerRow(p) = a.positions().unwrap() else { panic!("rows differ") };
        assert_eq!(p.to_vec_i32().unwrap(), vec![5, 2]);
        let AttnMask::Array(m) = a.mask(1).unwrap() else { panic!("needs a mask") };
        assert_eq!(m.shape(), vec![2, 1, 1, 6]);
        let m: Vec<i32> = m.to_vec_i32().unwrap();
        assert_eq!(m, vec![1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1]);
        let (k, _) = a.update_and_fetch(&kv(9.0, 1).broadcast_to(&[2, 1, 1, 2]).unwrap(), &kv(0.0, 2).slice_axis(2, 0, 1).unwrap().broadcast_to(&[2, 1, 1, 2]).unwrap()).unwrap();
        let k = k.to_vec_f32().unwrap();
        // row 1: three zero pads, then 100, 101, then 9
        assert_eq!(&k[12..24], &[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 100.0, -100.0, 101.0, -101.0, 9.0, -9.0]);
    }

    #[test]
    fn filter_drops_rows_and_shared_padding() {
        let mut a = KvCache::new(1);
        a.update_and_fetch(&kv(0.0, 5), &kv(0.0, 5)).unwrap();
        let mut b = KvCache::new(1);
        b.update_and_fetch(&kv(100.0, 2), &kv(100.0, 2)).unwrap();
        a.extend(b).unwrap();
        a.filter(&[1]).unwrap();
        assert_eq!((a.rows(), a.len(), a.row_len(0)), (1, 2, 2));
        assert!(matches!(a.positions().unwrap(), Positions::Same(2)));
        let (k, _) = a.update_and_fetch(&kv(7.0, 1), &kv(7.0, 1)).unwrap();
        assert_eq!(k.to_vec_f32().unwrap(), vec![100.0, -100.0, 101.0, -101.0, 7.0, -7.0]);
    }

    #[test]
    fn padded_attention_equals_unpadded() {
        // Row 1 of a padded batch attends exactly like the same row alone.
        let q = kv(0.5, 1);
        let mut alone = KvCache::new(1);
        let (k1, v1) = alone.update_and_fetch(&kv(1.0, 3), &kv(2.0, 3)).unwrap();
        let _ = (k1, v1);
        let (k1, v1) = alone.update_and_fetch(&kv(4.0, 1), &kv(5.0, 1)).unwrap();
        let want = fast::scaled_dot_product_attention(&q, &k1, &v1, 0.3, fast::Mask::None).unwrap();

        let mut long = KvCache::new(1);
        long.update_and_fetch(&kv(-3.0, 6), &kv(-3.0, 6)).unwrap();
        let mut short = KvCache::new(1);
        short.update_and_fetch(&kv(1.0, 3), &kv(2.0, 3)).unwrap();
        long.extend(short).unwrap();
        let mask = long.mask(1).unwrap();
        let k_new = Array::concatenate(&[&kv(9.0, 1), &kv(4.0, 1)], 0).unwrap();
        let v_new = Array::concatenate(&[&kv(9.0, 1), &kv(5.0, 1)], 0).unwrap();
        let (k, v) = long.update_and_fetch(&k_new, &v_new).unwrap();
        let qb = Array::concatenate(&[&q, &q], 0).unwrap();
        let got = fast::scaled_dot_product_attention(&qb, &k, &v, 0.3, mask.as_mask()).unwrap();
        let got = got.slice_axis(0, 1, 2).unwrap().to_vec_f32().unwrap();
        let want = want.to_vec_f32().unwrap();
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() < 1e-6, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn holes_are_masked_and_skipped_by_row_slices() {
        // Two rows of three positions, then a verify step of width 3 of
        // which row 0 keeps all and row 1 one position.
        let mut c = KvCache::new(1);
        c.update_and_fetch(&kv(0.0, 3), &kv(0.0, 3)).unwrap();
        let mut b = KvCache::new(1);
        b.update_and_fetch(&kv(100.0, 3), &kv(100.0, 3)).unwrap();
        c.extend(b).unwrap();
        let step = Array::concatenate(&[&kv(10.0, 3), &kv(200.0, 3)], 0).unwrap();
        c.update_and_fetch(&step, &step).unwrap();
        c.punch(1, 4, 6);
        assert_eq!((c.len(), c.row_len(0), c.row_len(1)), (6, 6, 4));
        let Positions::PerRow(p) = c.positions().unwrap() else { panic!("holes make rows ragged") };
        assert_eq!(p.to_vec_i32().unwrap(), vec![6, 4]);
        let (k, _) = c.row_slice(1, 0, 4).unwrap();
        assert_eq!(k.to_vec_f32().unwrap(), vec![100.0, -100.0, 101.0, -101.0, 102.0, -102.0, 200.0, -200.0]);
        let (k, _) = c.row_view(1, 2, 4).unwrap();
        assert_eq!(k.to_vec_f32().unwrap(), vec![102.0, -102.0, 200.0, -200.0]);
        let AttnMask::Array(m) = c.mask(1).unwrap() else { panic!("needs a mask") };
        assert_eq!(m.to_vec_i32().unwrap(), vec![1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1]);

        // Row 1 attends exactly like the same positions without holes.
        let q = kv(0.5, 1);
        let mut alone = KvCache::new(1);
        alone.update_and_fetch(&kv(100.0, 3), &kv(100.0, 3)).unwrap();
        alone.update_and_fetch(&kv(200.0, 1), &kv(200.0, 1)).unwrap();
        let (k1, v1) = alone.update_and_fetch(&kv(7.0, 1), &kv(8.0, 1)).unwrap();
        let want = fast::scaled_dot_product_attention(&q, &k1, &v1, 0.3, fast::Mask::None).unwrap();
        let (k_new, v_new) = (kv(7.0, 1).broadcast_to(&[2, 1, 1, 2]).unwrap(), kv(8.0, 1).broadcast_to(&[2, 1, 1, 2]).unwrap());
        let mask = c.mask(1).unwrap();
        let (k, v) = c.update_and_fetch(&k_new, &v_new).unwrap();
        let qb = Array::concatenate(&[&q, &q], 0).unwrap();
        let got = fast::scaled_dot_product_attention(&qb, &k, &v, 0.3, mask.as_mask()).unwrap();
        let got = got.slice_axis(0, 1, 2).unwrap().to_vec_f32().unwrap();
        let want = want.to_vec_f32().unwrap();
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() < 1e-6, "{got:?} vs {want:?}");
        }
        // Dropping row 0 keeps row 1's holes.
        c.filter(&[1]).unwrap();
        assert_eq!((c.len(), c.row_len(0)), (7, 5));
        let (k, _) = c.row_slice(0, 3, 5).unwrap();
        assert_eq!(k.to_vec_f32().unwrap(), vec![200.0, -200.0, 7.0, -7.0]);
    }
}
