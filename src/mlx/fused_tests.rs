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
    for (shape, scale, seed) in [(vec![1, 1, 576], 1.0, 1), (vec![2, 5, 576], 30.0, 2), (vec![3, 64], 1e-3, 3), (vec![4, 1000], 5.0, 4)]
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
    let x = randn(&[2, 3, 4, 64], 7).transpose(&[0, 2, 1, 3]).unwrap();
    let w = randn(&[64], 8);
    let got = fused_rms_norm(&x, &w, 1e-6).unwrap();
    assert!(is_fused_node(&got));
    same_bits(&got, &fast::rms_norm(&x, &w, 1e-6).unwrap(), "strided rms_norm");
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
        for (t, offset) in [(1, 0), (1, 37), (1, 4095), (17, 0), (9, 1000), (1, 100_000)] {
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
    let (dims, t) = (64, 5);
    let freqs: Vec<f32> = (0..dims / 2).map(|i| 500_000f32.powf(2.0 * i as f32 / dims as f32) * 1.5).collect();
    let freqs = Array::from_f32(&freqs, &[dims / 2]).unwrap();
    let inv_f = rope_inv_freqs_of(&freqs).unwrap();
    let inv_b = rope_inv_freqs(dims, 10_000.0).unwrap();
    let offsets = Array::from_i32(&[0, 7, 4000], &[3]).unwrap();
    for traditional in [false, true] {
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
fn rope_leaves_other_dtypes_to_mlx() {
    let x = heads(1, 2, 3, 64, 5).astype(Dtype::F16).unwrap();
    let inv = rope_inv_freqs(64, 10_000.0).unwrap();
    assert!(fused_rope(&x, 64, false, 1.0, 0, &inv).unwrap().is_none());
}
