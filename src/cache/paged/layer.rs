//! The paged KV cache of one full-attention layer for a batch of rows.
//!
//! The rows keep the `Timeline` every layer cache keeps (so RoPE positions,
//! joins and row lengths work as for `KvCache`), but its left padding is
//! virtual: padding positions are never stored, row `b`'s own positions
//! `0..row_len(b)` live in its blocks. So joining rows of different lengths
//! pads nothing in memory, and the attention kernel reads each row's own
//! length (`mlx::paged_sdpa`).

use super::pool::{BlockRef, LayerPool};
use crate::cache::{KvView, Positions, Timeline};
use crate::error::{Error, Result};
use crate::mlx::{paged_sdpa, paged_sdpa_stock, Array, BlockTables};
use crate::model::Kernels;
use std::cell::RefCell;
use std::rc::Rc;

pub struct PagedKv {
    t: Timeline,
    pool: Rc<RefCell<LayerPool>>,
    /// Per row: its blocks in logical order, covering its positions.
    blocks: Vec<Vec<BlockRef>>,
}

/// One row's first `len` positions of a paged layer: references to its
/// blocks (no copy), the partial last one included.
pub struct PagedSnapshot {
    pub pool: Rc<RefCell<LayerPool>>,
    pub blocks: Vec<BlockRef>,
    pub len: i32,
}

/// What a paged layer attends to after its write: the pool arrays and the
/// batch's block tables.
pub struct PagedView {
    keys: Array,
    values: Array,
    tables: Rc<BlockTables>,
}

impl PagedView {
    pub fn share(&self) -> PagedView {
        PagedView { keys: self.keys.share(), values: self.values.share(), tables: self.tables.clone() }
    }

    /// Causal attention of `queries` (`[B, heads, L, D]`, each row's last
    /// `L` positions) over each row's keys.
    pub fn attend(&self, queries: &Array, scale: f32, kernels: Kernels) -> Result<Array> {
        let run = if kernels == Kernels::Auto { paged_sdpa } else { paged_sdpa_stock };
        Ok(run(queries, &self.keys, &self.values, &self.tables, scale, true, None)?)
    }
}

impl PagedKv {
    /// An empty cache for `rows` rows writing into `pool`.
    pub fn new(rows: usize, pool: Rc<RefCell<LayerPool>>) -> PagedKv {
        PagedKv { t: Timeline::new(rows), pool, blocks: vec![vec![]; rows] }
    }

    pub fn empty_like(&self, rows: usize) -> PagedKv {
        PagedKv::new(rows, self.pool.clone())
    }

    /// A one-row cache holding a snapshot's first `n` positions: it shares
    /// the snapshot's blocks (no copy).
    pub fn from_snapshot(s: &PagedSnapshot, n: i32) -> Result<PagedKv> {
        let bs = s.pool.borrow().block();
        if n > s.len || n < 0 {
            return Err(Error::internal(format!("a paged snapshot of {} positions cannot stand for {n}", s.len)));
        }
        let used = ((n + bs - 1) / bs) as usize;
        Ok(PagedKv { t: Timeline::single(n), pool: s.pool.clone(), blocks: vec![s.blocks[..used].to_vec()] })
    }

    pub fn timeline(&self) -> &Timeline {
        &self.t
    }

    pub fn set_padding(&mut self, pads: &[i32]) {
        self.t.set_padding(pads);
    }

    pub fn positions(&self) -> Result<Positions> {
        self.t.positions()
    }

    /// Row `row`'s first `len` positions, sharing its blocks.
    pub fn snapshot_row(&self, row: usize, len: i32) -> Result<PagedSnapshot> {
        if len > self.t.row_len(row) || len < 0 {
            return Err(Error::internal(format!("row {row} has {} positions, asked {len}", self.t.row_len(row))));
        }
        let bs = self.pool.borrow().block();
        let used = ((len + bs - 1) / bs) as usize;
        Ok(PagedSnapshot { pool: self.pool.clone(), blocks: self.blocks[row][..used].to_vec(), len })
    }

    /// Writes `k`, `v` (`[B, H, L, D]`; positions of a row's padding are
    /// skipped) into the rows' blocks and returns what the layer attends to.
    pub fn update(&mut self, k: &Array, v: &Array) -> Result<KvView> {
        let s = k.shape();
        let (b, h, l, dk, dv) = (s[0], s[1], s[2], s[3], v.dim(3));
        if b as usize != self.blocks.len() {
            return Err(Error::internal(format!("cache has {} rows, update has {b}", self.blocks.len())));
        }
        let prev = self.t.len();
        let mut pool = self.pool.borrow_mut();
        let bs = pool.block();
        let (mut src, mut dest) = (Vec::new(), Vec::new());
        for (r, &pad) in self.t.pads().iter().enumerate() {
            let (from, to) = ((prev - pad).max(0), (prev + l - pad).max(0));
            if from == to {
                continue;
            }
            let blocks = &mut self.blocks[r];
            // Copy-on-write: the partial block the row writes into next is
            // shared (a snapshot, or rows restored from one).
            if from % bs != 0 {
                let j = (from / bs) as usize;
                if Rc::strong_count(&blocks[j]) > 1 {
                    let fresh = pool.alloc(h, dk, dv, k.dtype())?;
                    copy_block(&mut pool, blocks[j].id(), fresh.id(), h)?;
                    blocks[j] = fresh;
                }
            }
            while (blocks.len() as i32) * bs < to {
                blocks.push(pool.alloc(h, dk, dv, k.dtype())?);
            }
            for hi in 0..h {
                for p in from..to {
                    let id = blocks[(p / bs) as usize].id() as i32;
                    dest.push((id * h + hi) * bs + p % bs);
                    // Row (r, hi, l) of `k` flattened, l = p + pad - prev.
                    src.push((r as i32 * h + hi) * l + p + pad - prev);
                }
            }
        }
        if !dest.is_empty() {
            let flat = |x: &Array, d: i32| -> Result<Array> {
                let x = x.reshape(&[b * h * l, d])?;
                Ok(if src.len() as i32 == b * h * l { x } else { x.take(&Array::from_i32(&src, &[src.len() as i32])?, 0)? })
            };
            pool.write(&flat(k, dk)?, &flat(v, dv)?, &dest)?;
        }
        self.t.advance(l);
        let lens: Vec<i32> = (0..self.blocks.len()).map(|r| self.t.row_len(r)).collect();
        let tables: Vec<Vec<i32>> = self.blocks.iter().map(|bl| bl.iter().map(|x| x.id() as i32).collect()).collect();
        let [keys, values] = pool.planes().ok_or_else(|| Error::internal("a paged read before any block"))?;
        Ok(KvView::Paged(PagedView {
            keys: keys.share(),
            values: values.share(),
            tables: Rc::new(BlockTables::new(&tables, &lens, bs)?),
        }))
    }

    /// Adds `other`'s rows after these; the timelines are right-aligned
    /// (virtual padding: nothing moves).
    pub fn extend(&mut self, mut other: PagedKv) -> Result<()> {
        if !Rc::ptr_eq(&self.pool, &other.pool) {
            return Err(Error::internal("extending a paged KV cache with one of another pool"));
        }
        let end = self.t.len().max(other.t.len());
        let (a, b) = (end - self.t.len(), end - other.t.len());
        self.t.pad_front(a);
        other.t.pad_front(b);
        self.t.extend(&other.t);
        self.blocks.append(&mut other.blocks);
        Ok(())
    }

    /// Keeps the rows `keep` (in that order); the others' blocks go back
    /// to the pool unless something else holds them.
    pub fn filter(&mut self, keep: &[usize]) -> Result<()> {
        self.t.filter(keep);
        let mut old: Vec<Option<Vec<BlockRef>>> = std::mem::take(&mut self.blocks).into_iter().map(Some).collect();
        self.blocks = keep.iter().map(|&r| old[r].take().expect("each row once")).collect();
        Ok(())
    }

    /// The pool arrays (to evaluate so that the writes are done).
    pub fn state(&self) -> Vec<Array> {
        self.pool.borrow().planes().map(|p| p.iter().map(Array::share).collect()).unwrap_or_default()
    }

    /// Bytes of the blocks these rows hold (shared ones once per holder).
    pub fn nbytes(&self) -> usize {
        let per = self.pool.borrow().bytes_per_block();
        self.blocks.iter().map(Vec::len).sum::<usize>() * per
    }

    /// Blocks these rows hold.
    pub fn blocks_held(&self) -> usize {
        self.blocks.iter().map(Vec::len).sum()
    }
}

/// Copies block `from` into block `to` (every head, keys and values).
fn copy_block(pool: &mut LayerPool, from: u32, to: u32, h: i32) -> Result<()> {
    let bs = pool.block();
    let [k, v] = pool.planes().ok_or_else(|| Error::internal("copying a block of an empty pool"))?;
    let rows = |x: &Array| -> Result<Array> {
        let d = x.dim(3);
        Ok(x.slice_axis(0, from as i32, from as i32 + 1)?.reshape(&[h * bs, d])?)
    };
    let (kr, vr) = (rows(k)?, rows(v)?);
    let dest: Vec<i32> = (0..h * bs).map(|i| to as i32 * h * bs + i).collect();
    pool.write(&kr, &vr, &dest)
}

impl PagedSnapshot {
    /// Bytes of its blocks (shared ones counted for each holder).
    pub fn nbytes(&self) -> usize {
        self.blocks.len() * self.pool.borrow().bytes_per_block()
    }
}
