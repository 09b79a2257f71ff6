//! The block pools of a paged layer: one MLX array per plane, `[capacity,
//! H, block, X]` (dense: keys and values; affine: words, scales, biases of
//! keys then values; TurboQuant: its five planes), written in place by
//! `mlx::paged_write`, and the free list of block ids. `PagedLayer` is what
//! a layer pages: its pool, the float pool of a quantized layer's rows below
//! their `quantized_kv_start`, the scheme and the sliding window.

use crate::cache::scheme::KvScheme;
use crate::cache::turbo::TurboCodec;
use crate::error::{Error, Result};
use crate::mlx::{paged_write, Array, Dtype};
use std::cell::RefCell;
use std::rc::{Rc, Weak};

/// Ids free for reuse, most recently freed last.
type FreeList = Rc<RefCell<Vec<u32>>>;

/// One block of a pool; its id goes back to the free list when the last
/// `BlockRef` to it is dropped (a retired or cancelled row, an evicted
/// prompt-cache entry): no release can be forgotten.
pub struct Block {
    id: u32,
    free: FreeList,
}

impl Block {
    pub fn id(&self) -> u32 {
        self.id
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        self.free.borrow_mut().push(self.id);
    }
}

/// A shared block: shared by several rows or entries iff its strong count
/// is above 1.
pub type BlockRef = Rc<Block>;

/// What one layer pages, shared by all row sets of an engine (handles:
/// cloning shares the pools).
#[derive(Clone)]
pub struct PagedLayer {
    /// The stored form of every position: keys and values, or the packed
    /// planes of a quantized scheme.
    pub pool: Rc<RefCell<LayerPool>>,
    /// A quantized layer's float keys and values of rows below their
    /// `quantized_kv_start` (what they attend to until then).
    pub float: Option<Rc<RefCell<LayerPool>>>,
    pub scheme: KvScheme,
    /// A sliding-window layer's window: blocks behind it are released.
    pub window: Option<i32>,
    /// TurboQuant's codec (its head dims are the layer's).
    pub turbo: Option<Rc<TurboCodec>>,
    /// Per head: the keys' and the values' dimensions.
    pub k_dim: i32,
    pub v_dim: i32,
}

impl PagedLayer {
    /// A layer of `block`-position blocks storing KV as `scheme` says, for
    /// keys of `k_dim` and values of `v_dim` per head.
    pub fn new(block: i32, scheme: KvScheme, window: Option<i32>, k_dim: i32, v_dim: i32) -> Result<PagedLayer> {
        let pool = || Rc::new(RefCell::new(LayerPool::new(block)));
        let turbo = match scheme {
            KvScheme::TurboQuant { key_bits, value_bits } => Some(Rc::new(TurboCodec::new(key_bits, value_bits, k_dim, v_dim)?)),
            _ => None,
        };
        Ok(PagedLayer { pool: pool(), float: scheme.is_quantized().then(pool), scheme, window, turbo, k_dim, v_dim })
    }

    /// A dense full-attention layer (tests).
    pub fn dense(block: i32) -> PagedLayer {
        PagedLayer::new(block, KvScheme::Dense, None, 0, 0).expect("a dense layer needs no codec")
    }

    pub fn block(&self) -> i32 {
        self.pool.borrow().block()
    }

    /// Whether this layer and `other` page into the same pools.
    pub fn same(&self, other: &PagedLayer) -> bool {
        Rc::ptr_eq(&self.pool, &other.pool)
    }

    fn pools(&self) -> impl Iterator<Item = &Rc<RefCell<LayerPool>>> {
        std::iter::once(&self.pool).chain(&self.float)
    }
}

/// The paged layers of a model (None for layers that keep a per-row
/// cache: recurrent states), shared by all row sets of an engine.
#[derive(Clone, Default)]
pub struct PagedPools {
    pub block: i32,
    pub layers: Vec<Option<PagedLayer>>,
}

/// Block counts and bytes of the pools, summed over layers and over each
/// layer's pools (the float copies of quantized layers included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub used: u64,
    pub free: u64,
    /// Blocks in use by more than one holder (rows, prompt-cache entries).
    pub shared: u64,
    pub bytes_used: u64,
    /// Of `bytes_used`: blocks of float keys and values, and of packed planes.
    pub bytes_dense: u64,
    pub bytes_quantized: u64,
}

impl PagedPools {
    pub fn stats(&self) -> PoolStats {
        let mut s = PoolStats::default();
        for l in self.layers.iter().flatten() {
            for (i, p) in l.pools().enumerate() {
                let p = p.borrow();
                let bytes = (p.used() * p.bytes_per_block()) as u64;
                s.used += p.used() as u64;
                s.free += p.free_count() as u64;
                s.shared += p.shared_count() as u64;
                s.bytes_used += bytes;
                if i == 0 && l.scheme.is_quantized() {
                    s.bytes_quantized += bytes;
                } else {
                    s.bytes_dense += bytes;
                }
            }
        }
        s
    }

    /// Blocks of `block` positions a queued request may map from a
    /// concurrent row's prompt (`prefix_share`): only when every layer is a
    /// dense full-attention paged layer, whose prefixes serve any shorter
    /// length (None: quantized, sliding-window or recurrent layers, whose
    /// entries are whole-only).
    pub fn sharing_block(&self) -> Option<usize> {
        let dense = |l: &Option<PagedLayer>| l.as_ref().is_some_and(|l| l.scheme == KvScheme::Dense && l.window.is_none());
        self.layers.iter().all(dense).then_some(self.block as usize)
    }
}

/// Columns and dtype of one plane's rows (every plane of a pool has its
/// heads and block positions).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlaneShape {
    pub cols: i32,
    pub dtype: Dtype,
}

impl PlaneShape {
    /// The shape of `a`'s rows (`[.., X]`).
    pub fn of(a: &Array) -> PlaneShape {
        PlaneShape { cols: a.dim(-1), dtype: a.dtype() }
    }
}

pub struct LayerPool {
    block: i32,
    /// One array per plane; empty until the first block gives their shapes.
    planes: Vec<Array>,
    capacity: u32,
    free: FreeList,
    /// By id: the block handed out last (to count the shared ones).
    handed: Vec<Weak<Block>>,
}

/// Blocks a pool starts with (about 1k positions), then it doubles.
const FIRST_POSITIONS: i32 = 1024;

impl LayerPool {
    pub fn new(block: i32) -> LayerPool {
        LayerPool { block, planes: vec![], capacity: 0, free: Rc::new(RefCell::new(vec![])), handed: vec![] }
    }

    pub fn block(&self) -> i32 {
        self.block
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    pub fn free_count(&self) -> usize {
        self.free.borrow().len()
    }

    pub fn used(&self) -> usize {
        self.capacity as usize - self.free_count()
    }

    /// Blocks in use with more than one holder.
    pub fn shared_count(&self) -> usize {
        self.handed.iter().filter(|b| b.strong_count() > 1).count()
    }

    /// Bytes of one block (all planes).
    pub fn bytes_per_block(&self) -> usize {
        self.planes.iter().map(Array::nbytes).sum::<usize>() / self.capacity.max(1) as usize
    }

    /// The plane arrays (none before the first block).
    pub fn planes(&self) -> &[Array] {
        &self.planes
    }

    /// A free block for planes of `heads` heads and `shapes` rows, growing
    /// the pool (by concatenation: the old blocks keep their ids) when none
    /// is free.
    pub fn alloc(&mut self, heads: i32, shapes: &[PlaneShape]) -> Result<BlockRef> {
        if !self.planes.is_empty() {
            let fits = self.planes.len() == shapes.len()
                && self.planes.iter().zip(shapes).all(|(p, s)| p.dim(1) == heads && PlaneShape::of(p) == *s);
            if !fits {
                return Err(Error::internal("a paged KV write of another shape than its pool"));
            }
        }
        if self.free.borrow().is_empty() {
            self.grow(heads, shapes)?;
        }
        let id = self.free.borrow_mut().pop().expect("grown above");
        let block = Rc::new(Block { id, free: self.free.clone() });
        self.handed[id as usize] = Rc::downgrade(&block);
        Ok(block)
    }

    fn grow(&mut self, heads: i32, shapes: &[PlaneShape]) -> Result<()> {
        let add = if self.capacity == 0 { (FIRST_POSITIONS / self.block).max(1) as u32 } else { self.capacity };
        let mut grown = Vec::with_capacity(shapes.len());
        for (i, s) in shapes.iter().enumerate() {
            let fresh = Array::zeros(&[add as i32, heads, self.block, s.cols], s.dtype)?;
            grown.push(match self.planes.get(i) {
                None => fresh.contiguous()?,
                Some(old) => Array::concatenate(&[old, &fresh], 0)?,
            });
        }
        self.planes = grown;
        let mut free = self.free.borrow_mut();
        // Lowest ids first out.
        free.extend((self.capacity..self.capacity + add).rev());
        self.capacity += add;
        self.handed.resize(self.capacity as usize, Weak::new());
        Ok(())
    }

    /// Writes `rows` (one `[n, X]` per plane) at `dest` (rows of the pool
    /// viewed as `[capacity * H * block, X]`), in place when nothing else
    /// holds the pool arrays.
    pub fn write(&mut self, rows: &[Array], dest: &[i32]) -> Result<()> {
        if self.planes.len() != rows.len() {
            return Err(Error::internal(format!("a paged write of {} planes into a pool of {}", rows.len(), self.planes.len())));
        }
        // The old handles go here, before evaluation: then only the write
        // nodes hold them and they can take their buffers.
        let old = std::mem::take(&mut self.planes);
        for (p, r) in old.into_iter().zip(rows) {
            self.planes.push(paged_write(&p, r, dest)?);
        }
        Ok(())
    }

    /// Copies block `from` into block `to` (every head and plane).
    pub fn copy_block(&mut self, from: u32, to: u32) -> Result<()> {
        let Some(first) = self.planes.first() else { return Err(Error::internal("copying a block of an empty pool")) };
        let rows = first.dim(1) * self.block;
        let cut = |x: &Array| -> Result<Array> { Ok(x.slice_axis(0, from as i32, from as i32 + 1)?.reshape(&[rows, x.dim(3)])?) };
        let src = self.planes.iter().map(cut).collect::<Result<Vec<_>>>()?;
        let dest: Vec<i32> = (0..rows).map(|i| to as i32 * rows + i).collect();
        self.write(&src, &dest)
    }

    /// Per plane, `blocks` (`[k, H, block, X]`, in that order).
    pub fn gather(&self, blocks: &[i32]) -> Result<Vec<Array>> {
        let ids = Array::from_i32(blocks, &[blocks.len() as i32])?;
        Ok(self.planes.iter().map(|p| p.take(&ids, 0)).collect::<std::result::Result<_, _>>()?)
    }
}
