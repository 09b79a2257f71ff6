//! The paged KV cache of one attention layer for a batch of rows, whatever
//! it stores (`PagedLayer`): dense keys and values, or the packed planes of
//! a quantized scheme (affine, TurboQuant) encoded as the contiguous cache
//! encodes them, on the new tokens only; full attention or a sliding
//! window.
//!
//! The rows keep the `Timeline` every layer cache keeps (so RoPE positions,
//! joins and row lengths work as for `KvCache`), but its left padding is
//! virtual: padding positions are never stored, row `b`'s own positions
//! `0..row_len(b)` live in its blocks. So joining rows of different lengths
//! pads nothing in memory, and the attention kernels read each row's own
//! length (`mlx::paged_sdpa` and its quantized forms).
//!
//! Delayed quantization (`quantized_kv_start`, per row, as `KvCache`): a
//! query at a row's own position `p` attends to float KV iff `p < start`.
//! While a row is below its start its forwards also write float copies
//! into the layer's float pool; the forward that brings it to its start
//! drops them. A snapshot then holds what a cold run holds: the packed
//! blocks, and the float ones iff it is below its start.
//!
//! Sliding windows: a write releases the row's blocks wholly behind the
//! window of its first new query (the table keeps their place, as -1), so
//! a row holds at most `window + 2 * block` positions; the kernels compute
//! the window.

use super::pool::{BlockRef, LayerPool, PagedLayer, PlaneShape};
use crate::cache::scheme::KvScheme;
use crate::cache::turbo::{Keys, Values};
use crate::cache::{KvView, Positions, Timeline};
use crate::error::{Error, Result};
use crate::mlx::fast::Mask;
use crate::mlx::{
    paged_quantized_sdpa_isa, paged_quantized_sdpa_stock, paged_sdpa, paged_sdpa_stock, paged_turbo_sdpa_isa, quantize,
    Array, BlockTables, Dtype, PagedGather, QmmIsa,
};
use crate::model::Kernels;
use std::cell::RefCell;
use std::rc::Rc;

/// A row's blocks of one pool in logical order (block `j` holds its
/// positions `j * block..(j + 1) * block`); None: released behind a
/// sliding window.
type Blocks = Vec<Option<BlockRef>>;

#[derive(Clone, Default)]
struct RowBlocks {
    /// The stored form (keys and values, or packed planes).
    stored: Blocks,
    /// A quantized layer's float copy of positions `0..len` while the row
    /// is below its start.
    float: Blocks,
    /// The row's `quantized_kv_start`.
    start: i32,
}

pub struct PagedKv {
    t: Timeline,
    layer: PagedLayer,
    rows: Vec<RowBlocks>,
}

/// One row's first `len` positions of a paged layer: references to its
/// blocks (no copy), the partial last one included.
pub struct PagedSnapshot {
    pub layer: PagedLayer,
    /// Blocks of `layer.pool`, `ceil(len / block)` of them (None: released
    /// behind the window).
    pub stored: Vec<Option<BlockRef>>,
    /// Blocks of `layer.float` (quantized, `len < start` only): the float
    /// copy of the same positions.
    pub float: Vec<BlockRef>,
    pub len: i32,
    pub start: i32,
}

/// One pool's part of a snapshot in storable form: per plane (the pool's
/// order) the held blocks gathered `[k, kv_heads, block, X]` in logical
/// order, and the block table: logical block -> index into them, -1 where
/// a sliding window released it.
pub struct StoredBlocks {
    pub planes: Vec<Array>,
    pub table: Vec<i32>,
}

/// One pool's planes with the batch's block tables, for one attention.
struct Part {
    planes: Vec<Array>,
    tables: Rc<BlockTables>,
}

impl Part {
    fn share(&self) -> Part {
        Part { planes: self.planes.iter().map(Array::share).collect(), tables: self.tables.clone() }
    }
}

/// What a paged layer attends to after its write: the stored form's pool
/// arrays and tables, and for rows below their start the float pool's;
/// `use_float` (`[B, 1, L, 1]` bool) picks per query when both are there.
/// Neither: every row is all padding so far (the output is zeros).
pub struct PagedView {
    stored: Option<Part>,
    float: Option<Part>,
    use_float: Option<Array>,
    layer: PagedLayer,
    v_dim: i32,
}

impl PagedView {
    pub fn share(&self) -> PagedView {
        PagedView {
            stored: self.stored.as_ref().map(Part::share),
            float: self.float.as_ref().map(Part::share),
            use_float: self.use_float.as_ref().map(Array::share),
            layer: self.layer.clone(),
            v_dim: self.v_dim,
        }
    }

    /// Causal attention of `queries` (`[B, heads, L, D]`, each row's last
    /// `L` positions) over each row's keys (its last `window` with one).
    pub fn attend(&self, queries: &Array, scale: f32, kernels: Kernels) -> Result<Array> {
        let stored = self.stored.as_ref().map(|p| self.attend_part(p, self.layer.scheme, queries, scale, kernels)).transpose()?;
        let float = self.float.as_ref().map(|p| self.attend_part(p, KvScheme::Dense, queries, scale, kernels)).transpose()?;
        match (stored, float, &self.use_float) {
            (Some(s), None, _) => Ok(s),
            (None, Some(f), _) => Ok(f),
            (Some(s), Some(f), Some(use_float)) => Ok(Array::select(use_float, &f, &s)?),
            (None, None, _) => {
                let (b, h, l) = (queries.dim(0), queries.dim(1), queries.dim(2));
                Ok(Array::zeros(&[b, h, l, self.v_dim], queries.dtype())?)
            }
            _ => Err(Error::internal("a paged view attending both ways without a choice")),
        }
    }

    fn attend_part(&self, p: &Part, scheme: KvScheme, q: &Array, scale: f32, kernels: Kernels) -> Result<Array> {
        let (t, w) = (p.tables.as_ref(), self.layer.window);
        let pl = &p.planes;
        match scheme {
            KvScheme::Dense => {
                let run = if kernels == Kernels::Auto { paged_sdpa } else { paged_sdpa_stock };
                Ok(run(q, &pl[0], &pl[1], t, scale, true, w)?)
            }
            KvScheme::Affine { bits, group_size } => {
                let (k, v) = ([&pl[0], &pl[1], &pl[2]], [&pl[3], &pl[4], &pl[5]]);
                Ok(match kernels {
                    Kernels::Auto | Kernels::Int8 => {
                        paged_quantized_sdpa_isa(q, k, v, t, scale, true, w, group_size, bits, QmmIsa::Auto)?
                    }
                    Kernels::Stock => paged_quantized_sdpa_stock(q, k, v, t, scale, true, w, group_size, bits)?,
                })
            }
            KvScheme::TurboQuant { key_bits, value_bits } => {
                let codec = self.layer.turbo.as_ref().ok_or_else(|| Error::internal("a TurboQuant layer without its codec"))?;
                let fused = match kernels {
                    Kernels::Auto => {
                        let (k, v) = ([&pl[0], &pl[1], &pl[2]], [&pl[3], &pl[4]]);
                        let q32 = q.astype(Dtype::F32)?;
                        paged_turbo_sdpa_isa(&q32, k, v, t, codec.book(), key_bits, value_bits, scale, true, w, QmmIsa::Auto)?
                    }
                    _ => None,
                };
                let rotated = match fused {
                    Some(o) => o,
                    None => {
                        let g = PagedGather::new(q, t, true, w)?;
                        let keys = Keys { idx: g.plane(&pl[0])?, scale: g.plane(&pl[1])?, zero: g.plane(&pl[2])? };
                        let values = Values { idx: g.plane(&pl[3])?, scale: g.plane(&pl[4])? };
                        codec.attend_ops(q, &keys, &values, scale, Mask::Array(g.mask()))?
                    }
                };
                Ok(codec.unrotate_with(&rotated, kernels)?.astype(q.dtype())?)
            }
        }
    }
}

/// Source slots (rows of a forward's planes flattened to `[B * H * L, X]`)
/// and destinations (rows of a pool viewed as `[capacity * H * block, X]`)
/// of one pool's writes.
#[derive(Default)]
struct Writes {
    src: Vec<i32>,
    dest: Vec<i32>,
}

impl Writes {
    /// Own positions `from..to` of a row into its `blocks`: the first at
    /// slot `slot0` of row `r` of a forward of `l` positions and `h` heads.
    fn add(&mut self, blocks: &Blocks, bs: i32, h: i32, (r, l, slot0): (i32, i32, i32), from: i32, to: i32) {
        for hi in 0..h {
            for p in from..to {
                let id = blocks[(p / bs) as usize].as_ref().expect("written blocks are held").id() as i32;
                self.dest.push((id * h + hi) * bs + p % bs);
                self.src.push((r * h + hi) * l + slot0 + p - from);
            }
        }
    }

    /// Writes `planes` (`[B, H, L, X]` each) into `pool`.
    fn flush(self, pool: &mut LayerPool, planes: &[Array]) -> Result<()> {
        if self.dest.is_empty() {
            return Ok(());
        }
        let rows = |x: &Array| -> Result<Array> {
            let s = x.shape();
            let n = s[0] * s[1] * s[2];
            let x = x.reshape(&[n, s[3]])?;
            Ok(if self.src.len() as i32 == n { x } else { x.take(&Array::from_i32(&self.src, &[self.src.len() as i32])?, 0)? })
        };
        let rows = planes.iter().map(rows).collect::<Result<Vec<_>>>()?;
        pool.write(&rows, &self.dest)
    }
}

/// Makes `blocks` cover positions up to `to` for a write from `from`: a
/// shared partial block at `from` (a snapshot's, or rows restored from
/// one) is copied first (copy-on-write), missing ones are allocated.
fn cover(pool: &mut LayerPool, blocks: &mut Blocks, from: i32, to: i32, h: i32, shapes: &[PlaneShape]) -> Result<()> {
    let bs = pool.block();
    let j = (from / bs) as usize;
    if from % bs != 0 && j < blocks.len() {
        if let Some(old) = blocks[j].as_ref().filter(|b| Rc::strong_count(b) > 1) {
            let fresh = pool.alloc(h, shapes)?;
            pool.copy_block(old.id(), fresh.id())?;
            blocks[j] = Some(fresh);
        }
    }
    while blocks.len() < j {
        blocks.push(None);
    }
    while (blocks.len() as i32) * bs < to {
        blocks.push(Some(pool.alloc(h, shapes)?));
    }
    Ok(())
}

/// Releases the blocks wholly before own position `keep` (a sliding
/// window's: nothing later reads them).
fn release(blocks: &mut Blocks, keep: i32, bs: i32) {
    for (j, b) in blocks.iter_mut().enumerate() {
        if (j as i32 + 1) * bs > keep {
            break;
        }
        *b = None;
    }
}

/// Block ids for a table (-1: released).
fn ids(blocks: &[Option<BlockRef>]) -> Vec<i32> {
    blocks.iter().map(|b| b.as_ref().map_or(-1, |b| b.id() as i32)).collect()
}


impl PagedKv {
    /// An empty cache for `rows` rows paging into `layer`.
    pub fn new(rows: usize, layer: PagedLayer) -> PagedKv {
        PagedKv { t: Timeline::new(rows), layer, rows: vec![RowBlocks::default(); rows] }
    }

    pub fn empty_like(&self, rows: usize) -> PagedKv {
        PagedKv::new(rows, self.layer.clone())
    }

    pub fn layer(&self) -> &PagedLayer {
        &self.layer
    }

    pub fn is_quantized(&self) -> bool {
        self.layer.scheme.is_quantized()
    }

    /// Whether a prompt-cache entry of this layer serves shorter prefixes
    /// (as without paging: dense full attention only).
    pub fn trimmable(&self) -> bool {
        self.layer.scheme == KvScheme::Dense && self.layer.window.is_none()
    }

    /// A one-row cache holding a snapshot's first `n` positions: it shares
    /// the snapshot's blocks (no copy). `n` below the snapshot's length
    /// needs every block its next query reads (a window's last positions)
    /// and, below the row's start, the float copy.
    pub fn from_snapshot(s: &PagedSnapshot, n: i32) -> Result<PagedKv> {
        if n > s.len || n < 0 {
            return Err(Error::internal(format!("a paged snapshot of {} positions cannot stand for {n}", s.len)));
        }
        let row = prefix(&s.layer, &s.stored, &s.float.iter().cloned().map(Some).collect::<Vec<_>>(), s.start, n)?;
        Ok(PagedKv { t: Timeline::single(n), layer: s.layer.clone(), rows: vec![row] })
    }

    pub fn timeline(&self) -> &Timeline {
        &self.t
    }

    /// Sets `row`'s RoPE delta (see `Timeline`).
    pub fn set_rope_delta(&mut self, row: usize, delta: i32) {
        self.t.set_delta(row, delta);
    }

    pub fn set_padding(&mut self, pads: &[i32]) {
        self.t.set_padding(pads);
    }

    /// Sets each row's `quantized_kv_start` (rows of an empty cache).
    pub fn set_starts(&mut self, starts: &[i32]) {
        for (r, &s) in self.rows.iter_mut().zip(starts) {
            r.start = s;
        }
    }

    pub fn positions(&self) -> Result<Positions> {
        self.t.positions()
    }

    /// Row `row`'s first `len` positions, sharing its blocks.
    pub fn snapshot_row(&self, row: usize, len: i32) -> Result<PagedSnapshot> {
        if len > self.t.row_len(row) || len < 0 {
            return Err(Error::internal(format!("row {row} has {} positions, asked {len}", self.t.row_len(row))));
        }
        let r = &self.rows[row];
        let RowBlocks { stored, float, .. } = prefix(&self.layer, &r.stored, &r.float, r.start, len)?;
        let float = float.into_iter().map(|b| b.expect("float blocks are never released")).collect();
        Ok(PagedSnapshot { layer: self.layer.clone(), stored, float, len, start: r.start })
    }

    /// The stored form of `k`, `v` (`[B, H, L, ·]`): themselves, or the
    /// scheme's packed planes (`kernels` picks TurboQuant's encoder).
    fn encode(&self, k: &Array, v: &Array, kernels: Kernels) -> Result<Vec<Array>> {
        Ok(match self.layer.scheme {
            KvScheme::Dense => vec![k.share(), v.share()],
            KvScheme::Affine { bits, group_size } => {
                let (kw, ks, kb) = quantize(k, group_size, bits)?;
                let (vw, vs, vb) = quantize(v, group_size, bits)?;
                vec![kw, ks, kb, vw, vs, vb]
            }
            KvScheme::TurboQuant { .. } => {
                let codec = self.layer.turbo.as_ref().ok_or_else(|| Error::internal("a TurboQuant layer without its codec"))?;
                codec.encode(k, v, kernels)?
            }
        })
    }

    /// `update_with` under `Kernels::Auto`.
    pub fn update(&mut self, k: &Array, v: &Array) -> Result<KvView> {
        self.update_with(k, v, Kernels::Auto)
    }

    /// Writes `k`, `v` (`[B, H, L, D]`; positions of a row's padding are
    /// skipped) into the rows' blocks, in the stored form (`kernels` picks
    /// TurboQuant's encoder), and returns what the layer attends to.
    pub fn update_with(&mut self, k: &Array, v: &Array, kernels: Kernels) -> Result<KvView> {
        let s = k.shape();
        let (b, h, l) = (s[0], s[1], s[2]);
        if b as usize != self.rows.len() {
            return Err(Error::internal(format!("cache has {} rows, update has {b}", self.rows.len())));
        }
        let (prev, bs, quantized) = (self.t.len(), self.layer.block(), self.is_quantized());
        let stored = self.encode(k, v, kernels)?;
        let shapes: Vec<PlaneShape> = stored.iter().map(PlaneShape::of).collect();
        let float_shapes = [PlaneShape::of(k), PlaneShape::of(v)];
        // Per row: own positions written, and the forward's slot of the first.
        let spans: Vec<(i32, i32, i32)> = (self.t.pads().iter())
            .map(|&pad| ((prev - pad).max(0), (prev + l - pad).max(0), (pad - prev).max(0)))
            .collect();
        let (mut main, mut float) = (Writes::default(), Writes::default());
        {
            let mut pool = self.layer.pool.borrow_mut();
            let mut fpool = self.layer.float.as_ref().map(|f| f.borrow_mut());
            for (r, (row, &(from, to, slot0))) in self.rows.iter_mut().zip(&spans).enumerate() {
                if from == to {
                    continue;
                }
                if let Some(w) = self.layer.window {
                    release(&mut row.stored, from - w, bs);
                }
                cover(&mut pool, &mut row.stored, from, to, h, &shapes)?;
                main.add(&row.stored, bs, h, (r as i32, l, slot0), from, to);
                if quantized && from < row.start {
                    let fpool = fpool.as_mut().ok_or_else(|| Error::internal("a quantized paged layer without its float pool"))?;
                    cover(fpool, &mut row.float, from, to, h, &float_shapes)?;
                    float.add(&row.float, bs, h, (r as i32, l, slot0), from, to);
                }
            }
            main.flush(&mut pool, &stored)?;
            if let Some(fpool) = fpool.as_mut() {
                float.flush(fpool, &[k.share(), v.share()])?;
            }
        }
        self.t.advance(l);

        // Per row and query slot: whether it attends to the float copy
        // (quantized, own position below the row's start; padding slots
        // read the stored form).
        let use_float: Vec<bool> = (self.rows.iter().zip(&spans))
            .flat_map(|(row, &(from, _, slot0))| {
                (0..l).map(move |i| quantized && i >= slot0 && from + i - slot0 < row.start)
            })
            .collect();
        let reads = |float: bool| -> Vec<bool> {
            (0..self.rows.len())
                .map(|r| (0..l as usize).any(|i| use_float[r * l as usize + i] == float && i as i32 >= spans[r].2) && spans[r].1 > 0)
                .collect()
        };
        let (reads_stored, reads_float) = (reads(false), reads(true));
        let part = |pool: &Rc<RefCell<LayerPool>>, reads: &[bool], blocks: &dyn Fn(&RowBlocks) -> &Blocks| -> Result<Option<Part>> {
            if !reads.iter().any(|&x| x) {
                return Ok(None);
            }
            let (mut tables, mut lens) = (vec![], vec![]);
            for ((row, &(_, to, _)), &read) in self.rows.iter().zip(&spans).zip(reads) {
                tables.push(if read { ids(blocks(row)) } else { vec![] });
                lens.push(if read { to } else { 0 });
            }
            let planes = pool.borrow().planes().iter().map(Array::share).collect();
            Ok(Some(Part { planes, tables: Rc::new(BlockTables::new(&tables, &lens, bs)?) }))
        };
        let stored_part = part(&self.layer.pool, &reads_stored, &|r| &r.stored)?;
        let float_part = match &self.layer.float {
            Some(f) => part(f, &reads_float, &|r| &r.float)?,
            None => None,
        };
        let view = match (stored_part, float_part) {
            (Some(s), Some(f)) => {
                let flags: Vec<u8> = use_float.iter().map(|&f| f as u8).collect();
                let use_float = Array::from_bytes(&flags, &[b, 1, l, 1], Dtype::Bool)?;
                PagedView { stored: Some(s), float: Some(f), use_float: Some(use_float), layer: self.layer.clone(), v_dim: v.dim(3) }
            }
            (stored, float) => PagedView { stored, float, use_float: None, layer: self.layer.clone(), v_dim: v.dim(3) },
        };
        // Rows at or past their start never read their float copy again.
        for (row, &(_, to, _)) in self.rows.iter_mut().zip(&spans) {
            if to >= row.start {
                row.float.clear();
            }
        }
        Ok(KvView::Paged(view))
    }

    /// Adds `other`'s rows after these; the timelines are right-aligned
    /// (virtual padding: nothing moves).
    pub fn extend(&mut self, mut other: PagedKv) -> Result<()> {
        if !self.layer.same(&other.layer) {
            return Err(Error::internal("extending a paged KV cache with one of another pool"));
        }
        let end = self.t.len().max(other.t.len());
        let (a, b) = (end - self.t.len(), end - other.t.len());
        self.t.pad_front(a);
        other.t.pad_front(b);
        self.t.extend(&other.t);
        self.rows.append(&mut other.rows);
        Ok(())
    }

    /// Keeps the rows `keep` (in that order); the others' blocks go back
    /// to the pool unless something else holds them.
    pub fn filter(&mut self, keep: &[usize]) -> Result<()> {
        self.t.filter(keep);
        let mut old: Vec<Option<RowBlocks>> = std::mem::take(&mut self.rows).into_iter().map(Some).collect();
        self.rows = keep.iter().map(|&r| old[r].take().expect("each row once")).collect();
        Ok(())
    }

    /// The pool arrays (to evaluate so that the writes are done).
    pub fn state(&self) -> Vec<Array> {
        let pools = std::iter::once(&self.layer.pool).chain(&self.layer.float);
        pools.flat_map(|p| p.borrow().planes().iter().map(Array::share).collect::<Vec<_>>()).collect()
    }

    /// Bytes of the blocks these rows hold (shared ones once per holder):
    /// float (dense blocks and float copies) and packed.
    pub fn nbytes_by_kind(&self) -> (usize, usize) {
        let count = |f: fn(&RowBlocks) -> &Blocks| self.rows.iter().map(|r| f(r).iter().flatten().count()).sum::<usize>();
        let stored = count(|r| &r.stored) * self.layer.pool.borrow().bytes_per_block();
        let float = self.layer.float.as_ref().map_or(0, |f| count(|r| &r.float) * f.borrow().bytes_per_block());
        if self.is_quantized() {
            (float, stored)
        } else {
            (stored + float, 0)
        }
    }

    pub fn nbytes(&self) -> usize {
        let (d, q) = self.nbytes_by_kind();
        d + q
    }

    /// Blocks these rows hold.
    pub fn blocks_held(&self) -> usize {
        self.rows.iter().map(|r| r.stored.iter().chain(&r.float).flatten().count()).sum()
    }
}

/// The blocks of a row's first `n` positions (`stored`, `float` as a row
/// holds them): a window's blocks wholly behind its next query released,
/// the float copy kept iff `n` is below the start. An error if a block
/// they need is gone (released, or the float copy dropped at the start).
fn prefix(layer: &PagedLayer, stored: &Blocks, float: &Blocks, start: i32, n: i32) -> Result<RowBlocks> {
    let bs = layer.block();
    let used = ((n + bs - 1) / bs) as usize;
    let mut s: Blocks = stored.get(..used).ok_or_else(|| Error::internal("a paged row shorter than its length"))?.to_vec();
    let needed = match layer.window {
        Some(w) => {
            release(&mut s, n - w, bs);
            ((n - w).max(0) / bs) as usize
        }
        None => 0,
    };
    if s[needed.min(used)..].iter().any(Option::is_none) {
        return Err(Error::internal(format!("a sliding window's blocks for {n} positions were released")));
    }
    let float = if layer.scheme.is_quantized() && n < start {
        match float.get(..used) {
            Some(f) if f.iter().all(Option::is_some) => f.to_vec(),
            _ => return Err(Error::internal(format!("the float KV of a row below its start ({n} < {start}) was dropped"))),
        }
    } else {
        vec![]
    };
    Ok(RowBlocks { stored: s, float, start })
}

impl PagedSnapshot {
    /// Bytes of its blocks (shared ones counted for each holder).
    pub fn nbytes(&self) -> usize {
        let stored = self.stored.iter().flatten().count() * self.layer.pool.borrow().bytes_per_block();
        let float = self.layer.float.as_ref().map_or(0, |f| self.float.len() * f.borrow().bytes_per_block());
        stored + float
    }

    /// Blocks it holds.
    pub fn blocks(&self) -> usize {
        self.stored.iter().flatten().count() + self.float.len()
    }

    /// The stored form's blocks for storage (see `StoredBlocks`).
    pub fn stored_blocks(&self) -> Result<StoredBlocks> {
        stored_blocks(&self.layer.pool.borrow(), &self.stored)
    }

    /// The float copy's blocks (a quantized row below its start), if any.
    pub fn float_blocks(&self) -> Result<Option<StoredBlocks>> {
        match (&self.layer.float, self.float.is_empty()) {
            (Some(pool), false) => Ok(Some(stored_blocks(&pool.borrow(), &self.float.iter().cloned().map(Some).collect::<Vec<_>>())?)),
            _ => Ok(None),
        }
    }

    /// The inverse of `stored_blocks` / `float_blocks`: a snapshot of `len`
    /// positions (start `start`) of `layer` whose blocks are fresh ones
    /// holding `stored` (and `float`). The tables are checked (one entry
    /// per block of `len` positions, each held block once, -1 only where
    /// the window allows), and so are the planes' shapes against each
    /// other, the table and the pool's planes; on any error every block
    /// taken goes back.
    pub fn from_stored(layer: &PagedLayer, len: i32, start: i32, stored: &StoredBlocks, float: Option<&StoredBlocks>) -> Result<PagedSnapshot> {
        let bs = layer.block();
        let keep = layer.window.map_or(0, |w| len - w);
        let blocks = load_blocks(&layer.pool, stored, len, keep)?;
        let float = match (float, &layer.float) {
            (Some(f), Some(pool)) if len < start => {
                load_blocks(pool, f, len, 0)?.into_iter().map(|b| b.expect("float tables have no released blocks")).collect()
            }
            (None, _) if !layer.scheme.is_quantized() || len >= start => vec![],
            _ => return Err(Error::internal(format!("a paged snapshot of {len} positions, start {start}: float copy mismatch"))),
        };
        let s = PagedSnapshot { layer: layer.clone(), stored: blocks, float, len, start };
        // The prefix a hit takes must be complete.
        prefix(layer, &s.stored, &s.float.iter().cloned().map(Some).collect::<Vec<_>>(), start, len)?;
        debug_assert!(s.stored.len() as i32 == (len + bs - 1) / bs);
        Ok(s)
    }
}

fn stored_blocks(pool: &LayerPool, blocks: &[Option<BlockRef>]) -> Result<StoredBlocks> {
    let held: Vec<i32> = blocks.iter().flatten().map(|b| b.id() as i32).collect();
    let mut at = 0;
    let table = blocks
        .iter()
        .map(|b| match b {
            Some(_) => {
                at += 1;
                at - 1
            }
            None => -1,
        })
        .collect();
    let planes = if held.is_empty() { vec![] } else { pool.gather(&held)? };
    Ok(StoredBlocks { planes, table })
}

/// Checks a block table of a row of `len` positions in blocks of `bs`:
/// one entry per block, each stored block (`0..k`) named once, -1 only for
/// blocks wholly before own position `keep` (released behind a window).
/// Returns `k`, the stored blocks it names.
pub fn check_table(table: &[i32], len: i32, bs: i32, keep: i32) -> std::result::Result<i32, String> {
    if table.len() as i32 != (len + bs - 1) / bs {
        return Err(format!("a block table of {} entries for {len} positions in blocks of {bs}", table.len()));
    }
    let k = table.iter().filter(|&&i| i >= 0).count() as i32;
    let mut seen = vec![false; k as usize];
    for (j, &i) in table.iter().enumerate() {
        let ok = match i {
            -1 => (j as i32 + 1) * bs <= keep,
            i if i >= 0 && i < k => !std::mem::replace(&mut seen[i as usize], true),
            _ => false,
        };
        if !ok {
            return Err(format!("block table entry {j} ({i}) is not valid"));
        }
    }
    Ok(k)
}

/// Fresh blocks of `pool` holding `s` for a row of `len` positions; -1
/// entries only for blocks wholly before own position `keep`.
fn load_blocks(pool: &Rc<RefCell<LayerPool>>, s: &StoredBlocks, len: i32, keep: i32) -> Result<Blocks> {
    let bs = pool.borrow().block();
    let k = check_table(&s.table, len, bs, keep).map_err(Error::internal)?;
    let Some(first) = s.planes.first() else {
        return if k == 0 { Ok(vec![None; s.table.len()]) } else { Err(Error::internal("stored blocks without planes")) };
    };
    let h = first.dim(1);
    if s.planes.iter().any(|p| p.ndim() != 4 || p.dim(0) != k || p.dim(1) != h || p.dim(2) != bs) {
        return Err(Error::internal("stored block planes of mismatched shapes"));
    }
    let shapes: Vec<PlaneShape> = s.planes.iter().map(PlaneShape::of).collect();
    let mut pool = pool.borrow_mut();
    // Taken in table order; dropped (back to the free list) on an error.
    let mut fresh = Vec::with_capacity(k as usize);
    for _ in 0..k {
        fresh.push(pool.alloc(h, &shapes)?);
    }
    let rows = h * bs;
    let dest: Vec<i32> = fresh.iter().flat_map(|b| (0..rows).map(move |i| b.id() as i32 * rows + i)).collect();
    let flat = s.planes.iter().map(|p| Ok(p.reshape(&[k * rows, p.dim(3)])?)).collect::<Result<Vec<_>>>()?;
    pool.write(&flat, &dest)?;
    let mut fresh = fresh.into_iter().map(Some).collect::<Vec<_>>();
    Ok(s.table.iter().map(|&i| if i < 0 { None } else { fresh[i as usize].take() }).collect())
}
