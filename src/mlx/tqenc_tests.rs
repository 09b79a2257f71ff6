//! Tests of the CPU TurboQuant encoder and inverse rotation against the MLX
//! ops of `TurboCodec` (src/cache/turbo.rs), which they replace.
//!
//! Tolerance: none. The primitives repeat MLX's CPU arithmetic operation for
//! operation (tqenc.cc), so every plane must have the same bits, for every
//! key width (2..=8) and value width (1..=4) the codec accepts. There is one
//! kernel (portable C++, no instruction-set variants).

use super::test_data::randn;
use super::*;
use crate::cache::turbo::TurboCodec;
use crate::model::Kernels;

/// Random f32 `[B, H, L, D]` with some groups of 32 replaced: all zero,
/// constant (negative, positive), huge, tiny, a single outlier.
fn awkward(shape: &[i32], seed: u64, scale: f32) -> Array {
    let mut x = randn(shape, seed).mul_scalar(scale).unwrap().to_vec_f32().unwrap();
    let groups = x.len() / 32;
    for g in 0..groups {
        let c = &mut x[g * 32..(g + 1) * 32];
        match (g as u64 * 7 + seed) % 9 {
            0 => c.fill(0.0),
            1 => c.fill(-3.25),
            2 => c.fill(0.1),
            3 => c.iter_mut().for_each(|v| *v *= 3e3),
            4 => c.iter_mut().for_each(|v| *v *= 1e-5),
            5 => {
                c.fill(0.0);
                c[g % 32] = 7.0;
            }
            _ => {}
        }
    }
    Array::from_f32(&x, shape).unwrap()
}

fn same_planes(got: &[Array], want: &[Array], what: &str) {
    assert_eq!(got.len(), 5, "{what}: plane count");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!((g.shape(), g.dtype()), (w.shape(), w.dtype()), "{what}: plane {i} shape/dtype");
        let (gb, wb) = (g.to_bytes().unwrap(), w.to_bytes().unwrap());
        if let Some(j) = gb.iter().zip(&wb).position(|(a, b)| a != b) {
            panic!("{what}: plane {i} byte {j}: {} vs MLX ops {}", gb[j], wb[j]);
        }
    }
}

#[test]
fn encode_matches_the_ops_bit_for_bit() {
    // (B, H, L, Dk, Dv): decode steps, prefill chunks, 12·2^k head dims,
    // different key and value dims.
    let shapes = [(1, 3, 1, 64, 64), (2, 3, 5, 64, 64), (1, 2, 33, 128, 128), (1, 2, 4, 96, 96), (2, 1, 3, 64, 192), (1, 1, 2, 256, 32)];
    let mut seed = 1;
    for &(b, h, l, dk, dv) in &shapes {
        for scale in [1.0, 40.0] {
            seed += 2;
            let k = awkward(&[b, h, l, dk], seed, scale);
            let v = awkward(&[b, h, l, dv], seed + 1, scale);
            for kb in 2..=8 {
                for vb in 1..=4 {
                    let c = TurboCodec::new(kb, vb, dk, dv).unwrap();
                    let got = c.encode(&k, &v, Kernels::Auto).unwrap();
                    assert!(got.iter().all(is_tqenc_node), "fused encoder not taken");
                    let what = format!("k{kb}v{vb} [{b},{h},{l},{dk}/{dv}] x{scale}");
                    same_planes(&got, &c.encode_ops(&k, &v).unwrap(), &what);
                }
            }
        }
    }
}

#[test]
fn encode_of_strided_views_matches_the_ops() {
    // Attention hands the cache [B, L, H, D] projections transposed to [B, H, L, D].
    let (b, l, h, d) = (2, 7, 3, 64);
    let k = awkward(&[b, l, h, d], 21, 2.0).transpose(&[0, 2, 1, 3]).unwrap();
    let v = awkward(&[b, l, h, d], 22, 2.0).transpose(&[0, 2, 1, 3]).unwrap();
    for (kb, vb) in [(8, 3), (4, 2), (3, 4)] {
        let c = TurboCodec::new(kb, vb, d, d).unwrap();
        let got = c.encode(&k, &v, Kernels::Auto).unwrap();
        assert!(is_tqenc_node(&got[0]));
        same_planes(&got, &c.encode_ops(&k, &v).unwrap(), &format!("strided k{kb}v{vb}"));
    }
}

#[test]
fn stock_kernels_and_other_dtypes_take_the_ops() {
    let (k, v) = (randn(&[1, 2, 3, 64], 5), randn(&[1, 2, 3, 64], 6));
    let c = TurboCodec::new(8, 3, 64, 64).unwrap();
    let stock = c.encode(&k, &v, Kernels::Stock).unwrap();
    assert!(!stock.iter().any(is_tqenc_node));
    same_planes(&stock, &c.encode_ops(&k, &v).unwrap(), "stock");
    let (kh, vh) = (k.astype(Dtype::F16).unwrap(), v.astype(Dtype::F16).unwrap());
    let half = c.encode(&kh, &vh, Kernels::Auto).unwrap();
    assert!(!half.iter().any(is_tqenc_node), "f16 inputs go to the ops");
    same_planes(&half, &c.encode_ops(&kh, &vh).unwrap(), "f16");
}

#[test]
fn unrotate_matches_the_ops_bit_for_bit() {
    for (shape, seed) in [(vec![1, 9, 1, 64], 31), (vec![2, 6, 5, 128], 32), (vec![1, 4, 3, 96], 33), (vec![3, 192], 34)] {
        let d = *shape.last().unwrap();
        let c = TurboCodec::new(8, 3, d, d).unwrap();
        let y = randn(&shape, seed).mul_scalar(3.0).unwrap();
        let got = c.unrotate_with(&y, Kernels::Auto).unwrap();
        assert!(is_tqenc_node(&got), "fused unrotate not taken for {shape:?}");
        let want = c.unrotate(&y).unwrap();
        assert_eq!(got.to_bytes().unwrap(), want.to_bytes().unwrap(), "unrotate {shape:?}");
    }
    // A strided view (the attention output before its transpose).
    let c = TurboCodec::new(8, 3, 64, 64).unwrap();
    let y = randn(&[1, 5, 3, 64], 35).transpose(&[0, 2, 1, 3]).unwrap();
    let got = c.unrotate_with(&y, Kernels::Auto).unwrap();
    assert!(is_tqenc_node(&got));
    assert_eq!(got.to_bytes().unwrap(), c.unrotate(&y).unwrap().to_bytes().unwrap(), "strided unrotate");
}
