//! The paged layer cache against the contiguous one: the same writes
//! (rows of different lengths, joins, filters, snapshots restored and
//! written on) attend to the same keys and values; blocks go back to the
//! pool when nothing holds them, and shared partial blocks are copied
//! before a write.

use super::*;
use crate::cache::{AttnMask, KvCache, KvView, LayerCache, LayerSnapshot};
use crate::mlx::test_data::{randn, worst_error};
use crate::mlx::Array;
use crate::model::Kernels;
use std::cell::RefCell;
use std::rc::Rc;

const H: i32 = 2;
const D: i32 = 64;

fn kv(b: i32, l: i32, seed: u64) -> (Array, Array) {
    (randn(&[b, H, l, D], seed), randn(&[b, H, l, D], seed + 1))
}

/// Writes the same k, v into both caches and checks that their attention
/// (causal, queries of every row) agrees.
fn step(paged: &mut LayerCache, flat: &mut LayerCache, l: i32, seed: u64) {
    let b = paged.rows() as i32;
    let (k, v) = kv(b, l, seed);
    let q = randn(&[b, 2 * H, l, D], seed + 2);
    let mask = flat.kv().unwrap().mask(l).unwrap();
    let want = flat.kv_mut().unwrap().update(&k, &v).unwrap();
    let got = paged.paged_mut().unwrap().update(&k, &v).unwrap();
    let (KvView::Dense { keys, values }, KvView::Paged(_)) = (&want, &got) else { panic!("dense and paged views") };
    for kernels in [Kernels::Auto, Kernels::Stock] {
        let g = got.attend(&q, 0.125, &AttnMask::None, kernels).unwrap();
        let w = want.attend(&q, 0.125, &mask, kernels).unwrap();
        let bound = KvView::Dense { keys: keys.share(), values: values.abs().unwrap() }.attend(&q, 0.125, &mask, kernels).unwrap();
        // Padding queries of the contiguous cache attend to nothing real:
        // compare only the rows' real positions.
        let pads = paged.timeline().pads().to_vec();
        let len = paged.len();
        for r in 0..b {
            let first = (pads[r as usize] - (len - l)).clamp(0, l);
            if first == l {
                continue;
            }
            let cut = |a: &Array| a.slice(&[r, 0, first, 0], &[r + 1, 2 * H, l, D], &[1, 1, 1, 1]).unwrap();
            let err = worst_error(&cut(&g), &cut(&w), &cut(&bound));
            assert!(err <= 1e-5, "{kernels:?} row {r}: {err:e}");
        }
    }
}

fn pair(rows: usize, pool: &Rc<RefCell<LayerPool>>) -> (LayerCache, LayerCache) {
    (LayerCache::Paged(PagedKv::new(rows, pool.clone())), LayerCache::Kv(KvCache::new(rows)))
}

#[test]
fn rows_of_different_lengths_attend_as_the_contiguous_cache() {
    let pool = Rc::new(RefCell::new(LayerPool::new(32)));
    let (mut p, mut f) = pair(3, &pool);
    for c in [&mut p, &mut f] {
        c.set_padding(&[0, 20, 45]);
    }
    step(&mut p, &mut f, 50, 1); // row 2's first 5 tokens
    step(&mut p, &mut f, 1, 2);
    // A row joins (different length), then decode steps.
    let (mut p2, mut f2) = pair(1, &pool);
    step(&mut p2, &mut f2, 70, 3);
    p.extend(p2).unwrap();
    f.extend(f2).unwrap();
    for s in 0..3 {
        step(&mut p, &mut f, 1, 10 + s);
    }
    // Rows leave; their blocks go back (nothing else holds them).
    let held = pool.borrow().used();
    p.filter(&[1, 3]).unwrap();
    f.filter(&[1, 3]).unwrap();
    assert!(pool.borrow().used() < held);
    step(&mut p, &mut f, 1, 20);
    drop(p);
    assert_eq!(pool.borrow().used(), 0, "every block back");
}

#[test]
fn snapshots_share_blocks_and_a_write_copies_the_partial_one() {
    let pool = Rc::new(RefCell::new(LayerPool::new(32)));
    let (mut p, mut f) = pair(1, &pool);
    step(&mut p, &mut f, 80, 1); // blocks 0, 1 full, 2 partial (16 of 32)
    let used = pool.borrow().used();
    let LayerSnapshot::Paged(snap) = p.snapshot_row(0, 80, false).unwrap() else { panic!("a paged snapshot") };
    assert_eq!(pool.borrow().used(), used, "a snapshot copies nothing");
    // A row restored from it shares the blocks; its first write copies
    // the partial block (one more block), the original's stays as it was.
    let mut r = LayerSnapshot::Paged(PagedSnapshot { pool: snap.pool.clone(), blocks: snap.blocks.clone(), len: 80 }).restore(80).unwrap();
    let mut rf = f.snapshot_row(0, 80, false).unwrap().restore(80).unwrap();
    step(&mut r, &mut rf, 5, 2);
    assert_eq!(pool.borrow().used(), used + 1, "copy-on-write of the partial block");
    // The original goes on with other tokens: another copy (the block is
    // still shared with the snapshot), and both rows read their own data.
    step(&mut p, &mut f, 3, 3);
    assert_eq!(pool.borrow().used(), used + 2);
    step(&mut r, &mut rf, 1, 4);
    // A shorter prefix of the snapshot (trimmable) in a third row.
    let mut s = LayerSnapshot::Paged(snap).restore(40).unwrap();
    let mut sf = f.snapshot_row(0, 40, false).unwrap().restore(40).unwrap();
    step(&mut s, &mut sf, 7, 5);
    // Cancelling the restored rows frees only their own blocks.
    let before = pool.borrow().used();
    drop((r, s));
    assert_eq!(pool.borrow().used(), before - 2, "only the unshared blocks");
    drop(p);
    assert_eq!(pool.borrow().used(), 0);
}

#[test]
fn block_sizes_are_validated() {
    for ok in [32, 64, 96, 256, 1024] {
        assert!(valid_block_size(ok));
    }
    for bad in [0, 16, 33, 100, 1056] {
        assert!(!valid_block_size(bad));
    }
}
