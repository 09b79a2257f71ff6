//! The block pool of one layer: keys `[capacity, H, block, D]` and values
//! `[capacity, H, block, Dv]` (one MLX array each, written in place by
//! `mlx::paged_write`), and the free list of block ids.

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

/// The pools of a model's layers (None for layers that do not page: sliding
/// windows, recurrent states), shared by all row sets of an engine.
#[derive(Clone, Default)]
pub struct PagedPools {
    pub block: i32,
    pub layers: Vec<Option<Rc<RefCell<LayerPool>>>>,
}

/// Block counts of the pools (every paged layer allocates the same blocks;
/// these are summed over layers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub used: u64,
    pub free: u64,
    /// Blocks in use by more than one holder (rows, prompt-cache entries).
    pub shared: u64,
    pub bytes_used: u64,
}

impl PagedPools {
    /// A pool of `block`-position blocks for each layer `paged[i]` says.
    pub fn new(block: i32, paged: &[bool]) -> PagedPools {
        let layers = paged.iter().map(|&p| p.then(|| Rc::new(RefCell::new(LayerPool::new(block))))).collect();
        PagedPools { block, layers }
    }

    pub fn stats(&self) -> PoolStats {
        let mut s = PoolStats::default();
        for p in self.layers.iter().flatten() {
            let p = p.borrow();
            s.used += p.used() as u64;
            s.free += p.free_count() as u64;
            s.shared += p.shared_count() as u64;
            s.bytes_used += (p.used() * p.bytes_per_block()) as u64;
        }
        s
    }
}

pub struct LayerPool {
    block: i32,
    /// Keys and values; None until the first write gives their shapes.
    planes: Option<[Array; 2]>,
    capacity: u32,
    free: FreeList,
    /// By id: the block handed out last (to count the shared ones).
    handed: Vec<Weak<Block>>,
}

/// Blocks a pool starts with (about 1k positions), then it doubles.
const FIRST_POSITIONS: i32 = 1024;

impl LayerPool {
    pub fn new(block: i32) -> LayerPool {
        LayerPool { block, planes: None, capacity: 0, free: Rc::new(RefCell::new(vec![])), handed: vec![] }
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

    /// Bytes of one block (keys and values).
    pub fn bytes_per_block(&self) -> usize {
        match &self.planes {
            Some([k, v]) => (k.nbytes() + v.nbytes()) / self.capacity.max(1) as usize,
            None => 0,
        }
    }

    /// The keys and values arrays (None before the first write).
    pub fn planes(&self) -> Option<&[Array; 2]> {
        self.planes.as_ref()
    }

    /// A free block for keys of `heads` x `k_dim` and values of `v_dim`
    /// (`dtype`), growing the pool (by concatenation: the old blocks keep
    /// their ids) when none is free.
    pub fn alloc(&mut self, heads: i32, k_dim: i32, v_dim: i32, dtype: Dtype) -> Result<BlockRef> {
        if let Some([k, v]) = &self.planes {
            if k.dim(1) != heads || k.dim(3) != k_dim || v.dim(3) != v_dim || k.dtype() != dtype {
                return Err(Error::internal("a paged KV write of another shape than its pool"));
            }
        }
        if self.free.borrow().is_empty() {
            self.grow(heads, k_dim, v_dim, dtype)?;
        }
        let id = self.free.borrow_mut().pop().expect("grown above");
        let block = Rc::new(Block { id, free: self.free.clone() });
        self.handed[id as usize] = Rc::downgrade(&block);
        Ok(block)
    }

    fn grow(&mut self, heads: i32, k_dim: i32, v_dim: i32, dtype: Dtype) -> Result<()> {
        let add = if self.capacity == 0 { (FIRST_POSITIONS / self.block).max(1) as u32 } else { self.capacity };
        let fresh = |dim: i32| Array::zeros(&[add as i32, heads, self.block, dim], dtype);
        let (k, v) = (fresh(k_dim)?, fresh(v_dim)?);
        self.planes = Some(match self.planes.take() {
            None => [k.contiguous()?, v.contiguous()?],
            Some([ok, ov]) => [Array::concatenate(&[&ok, &k], 0)?, Array::concatenate(&[&ov, &v], 0)?],
        });
        let mut free = self.free.borrow_mut();
        // Lowest ids first out.
        free.extend((self.capacity..self.capacity + add).rev());
        self.capacity += add;
        self.handed.resize(self.capacity as usize, Weak::new());
        Ok(())
    }

    /// Writes `rows` (`[n, X]` per plane) at `dest` (rows of the pool viewed
    /// as `[capacity * H * block, X]`), in place when nothing else holds
    /// the pool arrays.
    pub fn write(&mut self, keys: &Array, values: &Array, dest: &[i32]) -> Result<()> {
        let [k, v] = self.planes.as_ref().ok_or_else(|| Error::internal("a paged write before any block"))?;
        let (k, v) = (paged_write(k, keys, dest)?, paged_write(v, values, dest)?);
        // The old handles go here, before evaluation: then only the write
        // nodes hold them and they can take their buffers.
        self.planes = Some([k, v]);
        Ok(())
    }
}
