//! Tests of the CPU RMSNorm and RoPE primitives against MLX's `fast::rms_norm`
//! and `fast::rope`, which MLX's CPU backend composes from generic ops.
//!
//! Tolerance: none. The primitives repeat MLX's CPU arithmetic operation for
//! operation (fused.cc), so every output must have the same bits. There is
//! one kernel (portable C++, no instruction-set variants).

use super::test_data::randn;
use super::*;

fn same_bits(got: &Array, want: &Array, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let (g, w) = (got.to_vec_f32().unwrap(), want.to_vec_f32().unwrap());
    if let Some((i, (a, b))) = g.iter().zip(&w).enumerate().find(|(_, (a, b))| a.to_bits() != b.to_bits()) {
        panic!("{what}: element {i}: {a:e} vs MLX {b:e}");
    }
}

fn scaled(a: Array, s: f32) -> Array {
    a.multiply(&Array::scalar_f32(s).unwrap()).unwrap()
}

#[test]
fn rms_norm_matches_mlx_bit_for_bit() {
    // [4, 50, 576]: prefill-sized, its rows split over the thread pool.
    for (shape, scale, seed) in
        [(vec![1, 1, 576], 1.0, 1), (vec![2, 5, 576], 30.0, 2), (vec![3, 64], 1e-3, 3), (vec![4, 1000], 5.0, 4), (vec![4, 50, 576], 3.0, 5)]
    {
        let d = *shape.last().unwrap();
        let x = scaled(randn(&shape, seed), scale);
        let w = randn(&[d], seed + 100);
        for eps in [1e-5, 1e-6] {
            let got = fused_rms_norm(&x, &w, eps).unwrap();
            assert!(is_fused_node(&got), "fast path not taken for {shape:?}");
            same_bits(&got, &fast::rms_norm(&x, &w, eps).unwrap(), &format!("rms_norm {shape:?} eps {eps}"));
        }
    }
}

#[test]
fn rms_norm_of_a_strided_view_matches_mlx() {
    // Per-head norms see [B, L, H, D] views of a projection's output.
    // [2, 3, 4, 64] on one thread, [2, 300, 4, 64] split over the pool.
    for (l, seed) in [(3, 7), (300, 9)] {
        let x = randn(&[2, l, 4, 64], seed).transpose(&[0, 2, 1, 3]).unwrap();
        let w = randn(&[64], 8);
        let got = fused_rms_norm(&x, &w, 1e-6).unwrap();
        assert!(is_fused_node(&got));
        same_bits(&got, &fast::rms_norm(&x, &w, 1e-6).unwrap(), &format!("strided rms_norm, L = {l}"));
    }
}

#[test]
fn rms_norm_falls_back_to_mlx_for_other_dtypes() {
    let x = randn(&[2, 64], 9).astype(Dtype::F16).unwrap();
    let w = randn(&[64], 10).astype(Dtype::F16).unwrap();
    let got = fused_rms_norm(&x, &w, 1e-5).unwrap();
    assert!(!is_fused_node(&got));
    assert_eq!(got.dtype(), Dtype::F16);
}

/// [B, H, T, D] queries as attention makes them: a transposed view.
fn heads(b: i32, h: i32, t: i32, d: i32, seed: u64) -> Array {
    randn(&[b, t, h, d], seed).transpose(&[0, 2, 1, 3]).unwrap()
}

#[test]
fn rope_matches_mlx_bit_for_bit() {
    for (traditional, dims, d) in [(false, 64, 64), (true, 64, 64), (false, 32, 64), (false, 128, 128)] {
        // t = 300: prefill-sized, the table and rows split over the pool.
        for (t, offset) in [(1, 0), (1, 37), (1, 4095), (17, 0), (9, 1000), (1, 100_000), (300, 5)] {
            for (base, scale) in [(10_000.0, 1.0), (100_000.0, 0.25)] {
                let x = heads(2, 3, t, d, (t + offset) as u64);
                let inv = rope_inv_freqs(dims, base).unwrap();
                let got = fused_rope(&x, dims, traditional, scale, offset, &inv).unwrap().expect("fast path");
                assert!(is_fused_node(&got));
                let want = fast::rope(&x, dims, traditional, base, scale, offset).unwrap();
                same_bits(&got, &want, &format!("rope trad {traditional} dims {dims}/{d} t {t} offset {offset} base {base}"));
            }
        }
    }
}

#[test]
fn rope_with_freqs_and_per_row_offsets_matches_mlx() {
    let dims = 64;
    let freqs: Vec<f32> = (0..dims / 2).map(|i| 500_000f32.powf(2.0 * i as f32 / dims as f32) * 1.5).collect();
    let freqs = Array::from_f32(&freqs, &[dims / 2]).unwrap();
    let inv_f = rope_inv_freqs_of(&freqs).unwrap();
    let inv_b = rope_inv_freqs(dims, 10_000.0).unwrap();
    let offsets = Array::from_i32(&[0, 7, 4000], &[3]).unwrap();
    for (traditional, t) in [(false, 5), (true, 5), (false, 200)] {
        let x = heads(3, 4, t, dims, traditional as u64);
        let got = fused_rope(&x, dims, traditional, 1.0, 12, &inv_f).unwrap().unwrap();
        same_bits(&got, &fast::rope_with_freqs(&x, dims, traditional, 1.0, 12, &freqs).unwrap(), "freqs");
        let got = fused_rope_at(&x, dims, traditional, 1.0, &offsets, &inv_b).unwrap().unwrap();
        same_bits(&got, &fast::rope_at(&x, dims, traditional, 10_000.0, 1.0, &offsets).unwrap(), "per-row");
        let got = fused_rope_at(&x, dims, traditional, 0.5, &offsets, &inv_f).unwrap().unwrap();
        same_bits(&got, &fast::rope_with_freqs_at(&x, dims, traditional, 0.5, &offsets, &freqs).unwrap(), "freqs per-row");
    }
}

#[test]
fn rope_table_is_recomputed_when_only_an_offset_changes() {
    // The sin/cos table is kept between nodes (every layer asks for the same
    // one): calls that differ in one per-row offset, or nothing, must each
    // get their own positions.
    let dims = 64;
    let inv = rope_inv_freqs(dims, 10_000.0).unwrap();
    let x = heads(3, 2, 4, dims, 11);
    for offs in [[0, 7, 4000], [0, 7, 4000], [0, 8, 4000], [0, 7, 4000], [5, 7, 4000]] {
        let offsets = Array::from_i32(&offs, &[3]).unwrap();
        let got = fused_rope_at(&x, dims, false, 1.0, &offsets, &inv).unwrap().unwrap();
        same_bits(&got, &fast::rope_at(&x, dims, false, 10_000.0, 1.0, &offsets).unwrap(), &format!("offsets {offs:?}"));
    }
}

#[test]
fn rope_leaves_other_dtypes_to_mlx() {
    let x = heads(1, 2, 3, 64, 5).astype(Dtype::F16).unwrap();
    let inv = rope_inv_freqs(64, 10_000.0).unwrap();
    assert!(fused_rope(&x, 64, false, 1.0, 0, &inv).unwrap().is_none());
}

/// What `fused_heads` replaces, by MLX's ops: per part a slice of the packed
/// `x` `[B, L, C]`, heads, the per-head norm, the heads to axis 1, RoPE.
fn heads_by_ops(x: &Array, parts: &[HeadPart], d: i32, norms: [Option<&Array>; 2], rope: impl Fn(&Array) -> Array) -> Vec<Array> {
    let (b, l) = (x.dim(0), x.dim(1));
    parts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let y = x.slice_axis(-1, p.col, p.col + p.heads * d).unwrap().reshape(&[b, l, p.heads, d]).unwrap();
            let y = match norms.get(i).copied().flatten() {
                Some(w) => fast::rms_norm(&y, w, 1e-6).unwrap(),
                None => y,
            };
            let y = y.transpose(&[0, 2, 1, 3]).unwrap();
            if p.rotate {
                rope(&y)
            } else {
                y
            }
        })
        .collect()
}

#[test]
fn heads_of_a_packed_projection_match_the_ops_bit_for_bit() {
    // q/k/v of a grouped-query layer (4 query heads, 2 KV heads), decode and
    // prefill shapes, one start or one per row, half-split or traditional,
    // partial rotation, per-head norms, and a strided x (a slice of a wider
    // projection, as a mixed pass hands its groups); L = 100 splits its rows
    // over the thread pool. Keys and values also in a cache's f16 / bf16:
    // the same bits as `astype` of the f32 result.
    let d = 64;
    let parts = |kv| {
        [
            HeadPart { col: 0, heads: 4, rotate: true, dtype: Dtype::F32 },
            HeadPart { col: 4 * d, heads: 2, rotate: true, dtype: kv },
            HeadPart { col: 6 * d, heads: 2, rotate: false, dtype: kv },
        ]
    };
    let offsets = Array::from_i32(&[3, 0, 900], &[3]).unwrap();
    let (qn, kn) = (randn(&[d], 41), randn(&[d], 42));
    let mut cases = 0;
    for (b, l) in [(1, 1), (3, 1), (3, 7), (3, 100)] {
        for strided in [false, true] {
            let x = if strided {
                randn(&[b, l, 10 * d], (b * l) as u64).slice_axis(-1, d, 9 * d).unwrap()
            } else {
                randn(&[b, l, 8 * d], (b * l + 1) as u64)
            };
            for (traditional, dims) in [(false, d), (true, d), (false, 32)] {
                let inv = rope_inv_freqs(dims, 10_000.0).unwrap();
                for per_row in [false, true] {
                    if per_row && b != 3 {
                        continue;
                    }
                    for (norms, kv) in [([None, None], Dtype::F32), ([Some(&qn), Some(&kn)], Dtype::F32), ([None, None], Dtype::F16), ([Some(&qn), Some(&kn)], Dtype::BF16)] {
                        let start = if per_row { Err(&offsets) } else { Ok(57) };
                        let rope = HeadRope { dims, traditional, scale: 1.0, start, inv_freqs: &inv };
                        let parts = parts(kv);
                        let got = fused_heads(&x, &parts, d, &rope, norms, 1e-6).unwrap().expect("fast path");
                        assert!(got.iter().all(is_fused_node));
                        let want = heads_by_ops(&x, &parts, d, norms, |y| match per_row {
                            true => fast::rope_at(y, dims, traditional, 10_000.0, 1.0, &offsets).unwrap(),
                            false => fast::rope(y, dims, traditional, 10_000.0, 1.0, 57).unwrap(),
                        });
                        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                            let what = format!("part {i} b {b} l {l} strided {strided} trad {traditional} dims {dims} per_row {per_row} norms {} {kv:?}", norms[0].is_some());
                            assert_eq!(g.dtype(), parts[i].dtype, "{what}");
                            same_bits(g, &w.astype(parts[i].dtype).unwrap(), &what);
                        }
                        cases += 1;
                    }
                }
            }
        }
    }
    assert_eq!(cases, 168);
}

#[test]
fn heads_leave_what_they_do_not_take_to_the_ops() {
    let inv = rope_inv_freqs(64, 10_000.0).unwrap();
    let rope = HeadRope { dims: 64, traditional: false, scale: 1.0, start: Ok(0), inv_freqs: &inv };
    let part = [HeadPart { col: 0, heads: 2, rotate: true, dtype: Dtype::F32 }];
    let x16 = randn(&[1, 1, 128], 1).astype(Dtype::F16).unwrap();
    assert!(fused_heads(&x16, &part, 64, &rope, [None, None], 1e-6).unwrap().is_none());
    // A part past the end of the projection.
    let x = randn(&[1, 1, 96], 2);
    assert!(fused_heads(&x, &part, 64, &rope, [None, None], 1e-6).unwrap().is_none());
    // An output dtype other than f32, f16 or bf16.
    let part = [HeadPart { dtype: Dtype::I32, ..part[0] }];
    assert!(fused_heads(&randn(&[1, 1, 128], 3), &part, 64, &rope, [None, None], 1e-6).unwrap().is_none());
}

#[test]
fn add_and_norm_match_the_two_ops_bit_for_bit() {
    for (shape, seed) in [(vec![1, 1, 576], 1), (vec![3, 7, 576], 2), (vec![2, 64], 3), (vec![5, 40, 576], 4)] {
        let d = *shape.last().unwrap();
        let x = scaled(randn(&shape, seed), 20.0);
        let w = randn(&[d], seed + 10);
        // y: contiguous, and a transposed view of the same shape.
        let mut t = shape.clone();
        t.swap(0, 1);
        let ys = [randn(&shape, seed + 20), randn(&t, seed + 30).swapaxes(0, 1).unwrap()];
        for y in &ys {
            let (sum, normed) = fused_add_rms_norm(&x, y, &w, 1e-5).unwrap();
            assert!(is_fused_node(&sum) && is_fused_node(&normed), "fast path not taken for {shape:?}");
            let want = x.add(y).unwrap();
            same_bits(&sum, &want, &format!("sum {shape:?}"));
            same_bits(&normed, &fast::rms_norm(&want, &w, 1e-5).unwrap(), &format!("norm {shape:?}"));
        }
    }
    // A broadcasting y: MLX's ops, same numbers.
    let (x, y, w) = (randn(&[2, 3, 64], 5), randn(&[64], 6), randn(&[64], 7));
    let (sum, normed) = fused_add_rms_norm(&x, &y, &w, 1e-5).unwrap();
    assert!(!is_fused_node(&sum));
    same_bits(&sum, &x.add(&y).unwrap(), "broadcast sum");
    same_bits(&normed, &fast::rms_norm(&x.add(&y).unwrap(), &w, 1e-5).unwrap(), "broadcast norm");
}
