//! The paged layer cache against the contiguous ones: the same writes
//! (rows of different lengths, joins, filters, snapshots restored and
//! written on) attend to the same keys and values, for dense KV, affine
//! 4/8-bit and TurboQuant KV (delayed starts per row), and sliding windows
//! (against `RingCache`); blocks go back to the pools when nothing holds
//! them, shared partial blocks are copied before a write, and a window row
//! keeps only the blocks its window reads.

use super::*;
use crate::cache::scheme::KvScheme;
use crate::cache::{AttnMask, KvCache, KvView, LayerCache, LayerSnapshot, RingCache};
use crate::mlx::test_data::{randn, worst_error};
use crate::mlx::{Array, Dtype};
use crate::model::Kernels;

const H: i32 = 2;
const D: i32 = 64;
/// |paged - contiguous| / (attention of |v| over the dense keys): both
/// attend to the same stored keys in another order of f32 sums; a wrong
/// block, length, start or window moves an output by ~1e-2 or more.
const TOL: f32 = 1e-5;

fn kv(b: i32, l: i32, seed: u64) -> (Array, Array) {
    (randn(&[b, H, l, D], seed), randn(&[b, H, l, D], seed + 1))
}

/// A paged layer cache, its contiguous twin (`KvCache` of the scheme, or a
/// ring) and a dense full-attention cache of the same writes (the bound).
struct Twin {
    paged: LayerCache,
    flat: LayerCache,
    dense: KvCache,
}

impl Twin {
    fn new(rows: usize, layer: &PagedLayer) -> Twin {
        let flat = match layer.window {
            Some(w) => LayerCache::Ring(RingCache::new(rows, w)),
            None => LayerCache::Kv(KvCache::with_scheme(rows, layer.scheme).unwrap()),
        };
        Twin { paged: LayerCache::Paged(PagedKv::new(rows, layer.clone())), flat, dense: KvCache::new(rows) }
    }

    fn pad(mut self, pads: &[i32], starts: &[i32]) -> Twin {
        for c in [&mut self.paged, &mut self.flat] {
            c.set_padding(pads);
            c.set_starts(starts);
        }
        self.dense.set_padding(pads);
        self
    }

    /// Writes the same k, v into the caches and checks that their attention
    /// (causal, every row's real queries) agrees.
    fn step(&mut self, l: i32, seed: u64) {
        let b = self.paged.rows() as i32;
        let (k, v) = kv(b, l, seed);
        let q = randn(&[b, 2 * H, l, D], seed + 2);
        let dense_mask = self.dense.mask(l).unwrap();
        let KvView::Dense { keys, values } = self.dense.update(&k, &v).unwrap() else { panic!("dense") };
        let (want, mask) = match &mut self.flat {
            LayerCache::Kv(c) => {
                let m = c.mask(l).unwrap();
                (c.update(&k, &v).unwrap(), m)
            }
            LayerCache::Ring(r) => {
                let m = r.mask(l).unwrap();
                let (keys, values) = r.update_and_fetch(&k, &v).unwrap();
                (KvView::Dense { keys, values }, m)
            }
            _ => unreachable!("contiguous twins only"),
        };
        let got = self.paged.paged_mut().unwrap().update(&k, &v).unwrap();
        assert!(matches!(got, KvView::Paged(_)));
        let bound = KvView::Dense { keys, values: values.abs().unwrap() };
        let pads = self.paged.timeline().pads().to_vec();
        let len = self.paged.len();
        for kernels in [Kernels::Auto, Kernels::Stock] {
            let g = got.attend(&q, 0.125, &AttnMask::None, kernels).unwrap();
            let w = want.attend(&q, 0.125, &mask, kernels).unwrap();
            let bd = bound.attend(&q, 0.125, &dense_mask, kernels).unwrap();
            // Padding queries of the contiguous caches attend to nothing
            // real: compare only the rows' real positions.
            for r in 0..b {
                let first = (pads[r as usize] - (len - l)).clamp(0, l);
                if first == l {
                    continue;
                }
                let cut = |a: &Array| a.slice(&[r, 0, first, 0], &[r + 1, 2 * H, l, D], &[1, 1, 1, 1]).unwrap();
                let err = worst_error(&cut(&g), &cut(&w), &cut(&bd));
                assert!(err <= TOL, "{kernels:?} row {r} (L = {l}, len {len}): {err:e}");
            }
        }
    }

    /// Writes positions `from..to` in forwards that end at the start (the
    /// contiguous cache attends float or packed per forward, as the
    /// cohort's chunks do).
    fn steps(&mut self, from: i32, to: i32, start: i32, seed: u64) {
        if from < start && start < to {
            self.step(start - from, seed);
            self.step(to - start, seed + 7);
        } else {
            self.step(to - from, seed);
        }
    }

    fn extend(&mut self, other: Twin) {
        self.paged.extend(other.paged).unwrap();
        self.flat.extend(other.flat).unwrap();
        self.dense.extend(other.dense).unwrap();
    }

    fn filter(&mut self, keep: &[usize]) {
        self.paged.filter(keep).unwrap();
        self.flat.filter(keep).unwrap();
        self.dense.filter(keep).unwrap();
    }
}

/// Blocks in use in a layer's pools (stored form, float copies).
fn used(layer: &PagedLayer) -> (usize, usize) {
    (layer.pool.borrow().used(), layer.float.as_ref().map_or(0, |f| f.borrow().used()))
}

fn layer(scheme: KvScheme, window: Option<i32>, block: i32) -> PagedLayer {
    PagedLayer::new(block, scheme, window, D, D).unwrap()
}

const SCHEMES: [KvScheme; 4] = [
    KvScheme::Dense,
    KvScheme::Affine { bits: 4, group_size: 64 },
    KvScheme::Affine { bits: 8, group_size: 32 },
    KvScheme::TurboQuant { key_bits: 8, value_bits: 3 },
];

#[test]
fn rows_of_different_lengths_attend_as_the_contiguous_cache() {
    for scheme in SCHEMES {
        let l = layer(scheme, None, 32);
        // Row starts 0 (quantized from the first token), 70 (float for all
        // of the prefill, switching during decode) and 3 (inside the first
        // prefill forward of row 2, which starts at timeline position 45:
        // chunks end there as the cohort's do).
        let mut t = Twin::new(3, &l).pad(&[0, 20, 45], &[0, 70, 3]);
        t.step(48, 1); // row 2's first 3 tokens
        t.step(2, 2);
        t.step(1, 3);
        // A row joins (different length, below its start), then decode
        // steps bring rows 1 and 3 past their starts.
        let mut t2 = Twin::new(1, &l).pad(&[0], &[72]);
        t2.step(70, 4);
        t.extend(t2);
        for s in 0..4 {
            t.step(1, 10 + s);
        }
        // Rows leave; their blocks go back (nothing else holds them).
        let held = used(&l);
        t.filter(&[1, 3]);
        assert!(used(&l).0 < held.0, "{scheme:?}");
        t.step(1, 20);
        drop(t);
        assert_eq!(used(&l), (0, 0), "{scheme:?}: every block back");
    }
}

#[test]
fn float_copies_are_kept_exactly_below_the_start() {
    for scheme in &SCHEMES[1..] {
        let l = layer(*scheme, None, 32);
        let mut t = Twin::new(1, &l).pad(&[0], &[40]);
        t.step(33, 1);
        assert_eq!(used(&l), (2, 2), "{scheme:?}: packed and float blocks of 33 positions");
        let LayerCache::Paged(p) = &t.paged else { panic!() };
        let (dense, quant) = p.nbytes_by_kind();
        assert!(dense > 0 && quant > 0 && quant < dense, "{scheme:?}: {dense} float, {quant} packed bytes");
        t.step(7, 2); // to 40 = the start: the float copy is dropped
        assert_eq!(used(&l), (2, 0), "{scheme:?}: float blocks freed at the start");
        t.step(1, 3);
        let LayerCache::Paged(p) = &t.paged else { panic!() };
        assert_eq!(p.nbytes_by_kind().0, 0);
    }
}

#[test]
fn a_forward_across_the_start_attends_as_two_split_at_it() {
    // Queries below the start read the float copy, the others the packed
    // planes, inside one forward.
    for scheme in &SCHEMES[1..] {
        let l = layer(*scheme, None, 32);
        let (mut one, mut two) = (PagedKv::new(1, l.clone()), PagedKv::new(1, l.clone()));
        one.set_starts(&[12]);
        two.set_starts(&[12]);
        let (k, v) = kv(1, 20, 5);
        let q = randn(&[1, 2 * H, 20, D], 6);
        let whole = one.update(&k, &v).unwrap().attend(&q, 0.125, &AttnMask::None, Kernels::Auto).unwrap();
        let part = |a: &Array, from: i32, to: i32| a.slice_axis(2, from, to).unwrap();
        let first = two.update(&part(&k, 0, 12), &part(&v, 0, 12)).unwrap();
        let first = first.attend(&part(&q, 0, 12), 0.125, &AttnMask::None, Kernels::Auto).unwrap();
        let second = two.update(&part(&k, 12, 20), &part(&v, 12, 20)).unwrap();
        let second = second.attend(&part(&q, 12, 20), 0.125, &AttnMask::None, Kernels::Auto).unwrap();
        let split = Array::concatenate(&[&first, &second], 2).unwrap();
        let bound = Array::zeros(&split.shape(), Dtype::F32).unwrap().add_scalar(1.0).unwrap();
        assert!(worst_error(&whole, &split, &bound) <= TOL, "{scheme:?}");
        assert_eq!(used(&l), (2, 0), "{scheme:?}: both rows past the start hold no float copy");
    }
}

#[test]
fn snapshots_share_blocks_and_a_write_copies_the_partial_one() {
    let l = PagedLayer::dense(32);
    let mut t = Twin::new(1, &l);
    t.step(80, 1); // blocks 0, 1 full, 2 partial (16 of 32)
    let used0 = used(&l).0;
    let LayerSnapshot::Paged(snap) = t.paged.snapshot_row(0, 80, false).unwrap() else { panic!("a paged snapshot") };
    assert_eq!(used(&l).0, used0, "a snapshot copies nothing");
    // A row restored from it shares the blocks; its first write copies
    // the partial block (one more block), the original's stays as it was.
    let restored = |n: i32| Twin {
        paged: LayerSnapshot::Paged(share(&snap)).restore(n).unwrap(),
        flat: t.flat.snapshot_row(0, n, false).unwrap().restore(n).unwrap(),
        dense: match t.dense.row_slice(0, 0, n) {
            Ok((k, v)) => KvCache::from_prefix(k, v),
            Err(e) => panic!("{e}"),
        },
    };
    let mut r = restored(80);
    r.step(5, 2);
    assert_eq!(used(&l).0, used0 + 1, "copy-on-write of the partial block");
    // The original goes on with other tokens: another copy (the block is
    // still shared with the snapshot), and both rows read their own data.
    t.step(3, 3);
    assert_eq!(used(&l).0, used0 + 2);
    r.step(1, 4);
    // A shorter prefix of the snapshot (trimmable) in a third row.
    let mut s = Twin {
        paged: LayerSnapshot::Paged(snap).restore(40).unwrap(),
        flat: LayerCache::Kv(KvCache::new(1)),
        dense: KvCache::new(1),
    };
    let (k, v) = t.dense.row_slice(0, 0, 40).unwrap();
    s.flat = LayerCache::Kv(KvCache::from_prefix(k.share(), v.share()));
    s.dense = KvCache::from_prefix(k, v);
    s.step(7, 5);
    // Cancelling the restored rows frees only their own blocks.
    let before = used(&l).0;
    drop((r, s));
    assert_eq!(used(&l).0, before - 2, "only the unshared blocks");
    drop(t);
    assert_eq!(used(&l).0, 0);
}

fn share(s: &PagedSnapshot) -> PagedSnapshot {
    PagedSnapshot { layer: s.layer.clone(), stored: s.stored.clone(), float: s.float.clone(), len: s.len, start: s.start }
}

#[test]
fn quantized_snapshots_hold_what_a_cold_row_holds() {
    for scheme in &SCHEMES[1..] {
        for (start, len) in [(0, 50), (64, 50), (40, 50)] {
            let l = layer(*scheme, None, 32);
            let mut t = Twin::new(1, &l).pad(&[0], &[start]);
            t.steps(0, len, start, 1);
            let LayerSnapshot::Paged(snap) = t.paged.snapshot_row(0, len, false).unwrap() else { panic!() };
            assert_eq!(snap.float.is_empty(), len >= start, "{scheme:?} start {start}: float blocks iff below it");
            // Entries are whole-only, as without paging.
            assert!(!t.paged.trimmable());
            // A row restored from the snapshot, and one from its stored
            // blocks loaded into fresh ones (a disk hit), go on as the original.
            let (stored, float) = (snap.stored_blocks().unwrap(), snap.float_blocks().unwrap());
            let back = PagedSnapshot::from_stored(&l, len, start, &stored, float.as_ref()).unwrap();
            let back = LayerSnapshot::Paged(back).restore(len).unwrap();
            for paged in [LayerSnapshot::Paged(share(&snap)).restore(len).unwrap(), back] {
                let mut r = Twin {
                    paged,
                    flat: t.flat.snapshot_row(0, len, false).unwrap().restore(len).unwrap(),
                    dense: { let (k, v) = t.dense.row_slice(0, 0, len).unwrap(); KvCache::from_prefix(k, v) },
                };
                r.steps(len, len + 20, start, 2);
                r.step(1, 3);
            }
            drop((t, snap));
            assert_eq!(used(&l), (0, 0), "{scheme:?} start {start}");
        }
    }
}

#[test]
fn a_window_row_attends_as_a_ring_and_keeps_only_its_window() {
    // Window 40, blocks of 32: a row holds at most 40 + 2·32 positions.
    let (w, bs) = (40, 32);
    for chunk in [1, 7, 50] {
        let l = layer(KvScheme::Dense, Some(w), bs);
        let mut t = Twin::new(2, &l).pad(&[0, 30], &[0, 0]);
        let mut done = 0;
        while done < 200 {
            t.step(chunk, 100 + done as u64);
            done += chunk;
            let LayerCache::Paged(p) = &t.paged else { panic!() };
            // The window and the forward's new positions, and the partial
            // blocks at both ends.
            let most = 2 * ((w + chunk + bs - 1) / bs + 1);
            assert!(p.blocks_held() as i32 <= most, "chunk {chunk}: {} blocks held", p.blocks_held());
        }
        // A joining row, then decode together.
        let mut t2 = Twin::new(1, &l);
        t2.step(90, 7);
        t.extend(t2);
        for s in 0..5 {
            t.step(1, 300 + s);
        }
        // Snapshot at the row's length: the last window's blocks; as a
        // ring (disk) and back into blocks it goes on the same.
        let n = t.paged.row_len(2);
        let LayerSnapshot::Paged(snap) = t.paged.snapshot_row(2, n, false).unwrap() else { panic!() };
        assert!(snap.stored.iter().take(((n - w) / bs) as usize).all(Option::is_none), "released blocks stay released");
        assert!(t.paged.snapshot_row(2, n - 40, false).is_err(), "a prefix whose window was released");
        // Stored (its blocks) and loaded into fresh ones, it goes on the same.
        let back = PagedSnapshot::from_stored(&l, n, 0, &snap.stored_blocks().unwrap(), None).unwrap();
        assert_eq!(back.stored.iter().flatten().count(), snap.stored.iter().flatten().count());
        for paged in [LayerSnapshot::Paged(share(&snap)).restore(n).unwrap(), LayerSnapshot::Paged(back).restore(n).unwrap()] {
            let mut r = Twin {
                paged,
                flat: t.flat.snapshot_row(2, n, false).unwrap().restore(n).unwrap(),
                dense: { let (k, v) = t.dense.row_slice(2, 0, n).unwrap(); KvCache::from_prefix(k, v) },
            };
            r.step(3, 9);
            r.step(1, 10);
        }
        drop((t, snap));
        assert_eq!(used(&l).0, 0, "chunk {chunk}: every block back");
    }
}

#[test]
fn stored_blocks_round_trip_and_bad_tables_are_refused() {
    for (scheme, window) in [(KvScheme::Dense, None), (KvScheme::Affine { bits: 4, group_size: 64 }, None), (KvScheme::Dense, Some(40))] {
        let l = layer(scheme, window, 32);
        let start = 200;
        let mut t = Twin::new(1, &l).pad(&[0], &[start]);
        t.step(130, 1);
        let LayerSnapshot::Paged(snap) = t.paged.snapshot_row(0, 130, false).unwrap() else { panic!() };
        let (stored, float) = (snap.stored_blocks().unwrap(), snap.float_blocks().unwrap());
        assert_eq!(stored.table.len(), 5);
        assert_eq!(float.is_some(), scheme.is_quantized(), "{scheme:?}: a float copy below the start");
        let back = PagedSnapshot::from_stored(&l, 130, start, &stored, float.as_ref()).unwrap();
        assert_eq!(back.blocks(), snap.blocks(), "{scheme:?}");
        let mut r = Twin {
            paged: LayerSnapshot::Paged(back).restore(130).unwrap(),
            flat: t.flat.snapshot_row(0, 130, false).unwrap().restore(130).unwrap(),
            dense: { let (k, v) = t.dense.row_slice(0, 0, 130).unwrap(); KvCache::from_prefix(k, v) },
        };
        r.step(2, 2);
        drop(r);
        // Corrupt tables: a duplicate, an id out of range, a -1 the window
        // needs, a wrong length. Nothing is taken from the pool.
        let before = used(&l);
        let bad = |f: &dyn Fn(&mut Vec<i32>)| {
            let mut table = stored.table.clone();
            f(&mut table);
            let s = StoredBlocks { planes: stored.planes.iter().map(Array::share).collect(), table };
            PagedSnapshot::from_stored(&l, 130, start, &s, float.as_ref()).is_err()
        };
        assert!(bad(&|t| t[4] = t[3].max(0)), "{scheme:?}: duplicate");
        assert!(bad(&|t| t[4] = 9), "{scheme:?}: out of range");
        assert!(bad(&|t| t[4] = -1), "{scheme:?}: released where read");
        assert!(bad(&|t| t.truncate(t.len() - 1)), "{scheme:?}: short table");
        assert_eq!(used(&l), before, "{scheme:?}: a refused load leaves the pools as they were");
    }
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
