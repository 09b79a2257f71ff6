//! Paged KV (`kv_paging`): each attention layer keeps its keys and values
//! in a block pool shared by every row of the engine (`LayerPool`, blocks
//! of `kv_block_size` positions), and each row of a batch holds a list of
//! reference-counted blocks (`PagedKv`). Rows of different lengths need no
//! padding in memory, joining and leaving a batch moves no KV, and a
//! prompt-cache snapshot is a list of block references: a row restored from
//! it shares those blocks until it writes into a partial one (copied first,
//! copy-on-write). A block returns to its pool's free list when its last
//! reference is dropped.
//!
//! Every KV layout pages (`PagedLayer`): dense keys and values, the packed
//! planes of affine and TurboQuant KV (with a float pool for rows below
//! their `quantized_kv_start`), full attention and sliding windows (whose
//! rows release the blocks behind the window). Recurrent-state layers keep
//! their per-row `StateCache`.

pub mod codec;
pub mod layer;
mod pool;

pub use layer::{PagedKv, PagedSnapshot, PagedView, StoredBlocks};
pub use pool::{Block, BlockRef, LayerPool, PagedLayer, PagedPools, PlaneShape, PoolStats};

/// The block sizes `kv_block_size` may take: a multiple of 32 (the
/// attention kernels' smallest chunk of keys divides it) from 32 to 1024.
pub fn valid_block_size(bs: i32) -> bool {
    (32..=1024).contains(&bs) && bs % 32 == 0
}

#[cfg(test)]
mod tests;
