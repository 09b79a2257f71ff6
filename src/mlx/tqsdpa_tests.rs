//! Tests of the fused TurboQuant attention (rotated domain) against its
//! MLX-op composition (`TurboCodec::attend_ops`, src/cache/turbo.rs).
//!
//! Error measure: |fused - ops| / bound per output, with bound = sum_t p_t
//! |y_t| (p the softmax weights, y the decoded rotated values, computed with
//! dense MLX ops): the size of the terms the output sums, so one f32
//! rounding of the result is ~6e-8 of it. TOL = 1e-5. Both paths decode the
//! keys bit for bit alike ((q + z) * s) and differ only in f32 summation
//! order (chunked softmax merged with rescaling, 16/8/4-lane dot products),
//! the exp polynomial and rounding p * r * c as (p * r) * c instead of
//! p * (c * r); a wrong group, index, centroid, mask entry or head moves an
//! output by ~1e-2 of the bound or more.

use super::fast::Mask;
use super::test_data::{attention_bound, isas, randn, worst_error};
use super::*;
use crate::cache::turbo::{Keys, TurboCodec, Values};
use crate::model::Kernels;

const TOL: f32 = 1e-5;

/// An encoded cache `[B, H, T, ·]` with its codec and the decoded keys and
/// |rotated values| the bound needs.
struct Cache {
    codec: TurboCodec,
    keys: Keys,
    values: Values,
    dense_keys: Array,
    abs_values: Array,
}

impl Cache {
    #[allow(clippy::too_many_arguments)]
    fn new(b: i32, h: i32, t: i32, d: i32, dv: i32, kb: i32, vb: i32, seed: u64) -> Cache {
        let codec = TurboCodec::new(kb, vb, d, dv).unwrap();
        // Keys with a spread like real ones (scores far from uniform).
        let k = randn(&[b, h, t, d], seed).mul_scalar(1.5).unwrap();
        let v = randn(&[b, h, t, dv], seed + 1);
        let (keys, values) = (codec.encode_keys(&k).unwrap(), codec.encode_values(&v).unwrap());
        let dense_keys = codec.decode_keys(&keys).unwrap();
        let abs_values = codec.decode_values_rotated(&values).unwrap().abs().unwrap();
        eval(&[&keys.idx, &keys.scale, &keys.zero, &values.idx, &values.scale, &dense_keys, &abs_values]).unwrap();
        Cache { codec, keys, values, dense_keys, abs_values }
    }

    /// The same cache with `f` applied to every plane (slices, transposes).
    fn map(&self, f: impl Fn(&Array) -> Array) -> Cache {
        let (k, v, c) = (&self.keys, &self.values, &self.codec);
        let (d, dv) = (self.dense_keys.dim(-1), self.abs_values.dim(-1));
        Cache {
            codec: TurboCodec::new(c.key_bits(), c.value_bits(), d, dv).unwrap(),
            keys: Keys { idx: f(&k.idx), scale: f(&k.scale), zero: f(&k.zero) },
            values: Values { idx: f(&v.idx), scale: f(&v.scale) },
            dense_keys: f(&self.dense_keys),
            abs_values: f(&self.abs_values),
        }
    }

    fn fused(&self, q: &Array, scale: f32, mask: Mask, isa: QmmIsa) -> Option<Array> {
        let (k, v, c) = (&self.keys, &self.values, &self.codec);
        turbo_sdpa_rotated(q, [&k.idx, &k.scale, &k.zero], [&v.idx, &v.scale], c.book(), c.key_bits(), c.value_bits(), scale, mask, isa)
            .unwrap()
    }

    fn ops(&self, q: &Array, scale: f32, mask: Mask) -> Array {
        self.codec.attend_ops(q, &self.keys, &self.values, scale, mask).unwrap()
    }

    /// sum_t p_t |y_t| per output, with dense ops.
    fn bound(&self, q: &Array, scale: f32, mask: &Mask) -> Array {
        attention_bound(q, &self.dense_keys, &self.abs_values, scale, mask)
    }
}

/// Bool [B, 1, L, T]: causal, the first `pad` keys of batch row 1 masked
/// (left padding) and its query 0 fully masked.
fn padded_mask(b: i32, l: i32, t: i32, pad: i32) -> Array {
    let bytes: Vec<u8> = (0..b)
        .flat_map(|bi| (0..l).flat_map(move |li| (0..t).map(move |ti| (bi, li, ti))))
        .map(|(bi, li, ti)| (ti <= t - l + li && !(bi == 1 && (ti < pad || li == 0))) as u8)
        .collect();
    Array::from_bytes(&bytes, &[b, 1, l, t], Dtype::Bool).unwrap()
}

struct Case {
    b: i32,
    hkv: i32,
    rep: i32,
    l: i32,
    t: i32,
    d: i32,
    dv: i32,
    kb: i32,
    vb: i32,
}

#[derive(Clone, Copy, Debug)]
enum MaskCase {
    None,
    Causal,
    Padded,
}

/// Fused (with `isa`) vs ops on one case; returns the worst error.
fn compare(c: &Case, mask: MaskCase, isa: QmmIsa, seed: u64) -> f32 {
    let q = randn(&[c.b, c.hkv * c.rep, c.l, c.d], seed);
    let cache = Cache::new(c.b, c.hkv, c.t, c.d, c.dv, c.kb, c.vb, seed + 1);
    let scale = 1.0 / (c.d as f32).sqrt();
    let arr = padded_mask(c.b, c.l, c.t, 5);
    let m = || match mask {
        MaskCase::None => Mask::None,
        MaskCase::Causal => Mask::Causal,
        MaskCase::Padded => Mask::Array(&arr),
    };
    let fused = cache.fused(&q, scale, m(), isa).expect("fused path taken");
    assert_eq!(tqsdpa_isa_of(&fused), Some(isa));
    assert_eq!(fused.shape(), vec![c.b, c.hkv * c.rep, c.l, c.dv]);
    worst_error(&fused, &cache.ops(&q, scale, m()), &cache.bound(&q, scale, &m()))
}

#[test]
fn matches_ops_across_widths_heads_lengths_masks_and_isas() {
    let (mut cases, mut worst) = (0, 0f32);
    let widths = [(8, 3), (8, 4), (8, 2), (8, 1), (4, 3), (4, 4), (3, 2), (2, 3)];
    for isa in isas() {
        for (kb, vb) in widths {
            for rep in [1, 3] {
                for l in [1, 5] {
                    for t in [1, 300] {
                        for (mi, mask) in [MaskCase::None, MaskCase::Causal, MaskCase::Padded].into_iter().enumerate() {
                            let c = Case { b: 2, hkv: 2, rep, l, t, d: 64, dv: 64, kb, vb };
                            let seed = (kb * 1000 + vb * 100 + rep * 7 + l * 3 + t + mi as i32) as u64;
                            let err = compare(&c, mask, isa, seed);
                            assert!(err <= TOL, "{isa:?} k{kb}v{vb} rep={rep} L={l} T={t} {mask:?}: {err:e}");
                            worst = worst.max(err);
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(cases >= 8 * 2 * 2 * 2 * 3);
    eprintln!("worst |fused - ops| / bound over {cases} cases: {worst:e}");
}

#[test]
fn long_decode_prefill_and_other_head_dims() {
    let mut worst = 0f32;
    for isa in isas() {
        // Decode at 4k+ context (SmolLM2's heads): many chunks over the
        // pool, T not a multiple of the chunk.
        let c = Case { b: 1, hkv: 3, rep: 3, l: 1, t: 4100, d: 64, dv: 64, kb: 8, vb: 3 };
        worst = worst.max(compare(&c, MaskCase::None, isa, 41));
        // A prefill chunk: several row blocks, causal key skipping.
        let c = Case { b: 1, hkv: 2, rep: 4, l: 40, t: 600, d: 64, dv: 64, kb: 4, vb: 3 };
        worst = worst.max(compare(&c, MaskCase::Causal, isa, 42));
        // Three groups per row; values wider than keys.
        let c = Case { b: 2, hkv: 1, rep: 2, l: 3, t: 77, d: 96, dv: 96, kb: 8, vb: 4 };
        worst = worst.max(compare(&c, MaskCase::Padded, isa, 43));
        let c = Case { b: 1, hkv: 2, rep: 2, l: 2, t: 130, d: 64, dv: 128, kb: 3, vb: 2 };
        worst = worst.max(compare(&c, MaskCase::Causal, isa, 44));
        assert!(worst <= TOL, "{isa:?}: {worst:e}");
    }
    eprintln!("worst error: {worst:e}");
}

#[test]
fn reads_a_cache_sliced_from_a_larger_buffer_and_transposed_queries() {
    // The KV cache keeps capacity past its length and hands out
    // `buf[..., :T, :]`; queries arrive as [B, L, H, D] transposed.
    let (b, h, rep, l, t, cap, d) = (2, 2, 3, 2, 300, 512, 64);
    let cache = Cache::new(b, h, cap, d, d, 8, 3, 51).map(|a| a.slice_axis(2, 0, t).unwrap());
    let q = randn(&[b, l, h * rep, d], 53).transpose(&[0, 2, 1, 3]).unwrap();
    let arr = padded_mask(b, l, t, 4);
    let fused = cache.fused(&q, 0.125, Mask::Array(&arr), QmmIsa::Auto).unwrap();
    let err = worst_error(&fused, &cache.ops(&q, 0.125, Mask::Array(&arr)), &cache.bound(&q, 0.125, &Mask::Array(&arr)));
    assert!(err <= TOL, "{err:e}");
    // And planes whose rows are strided (made as [B, T, H, ·], transposed):
    // read through a dense copy.
    let cache = Cache::new(b, t, h, d, d, 4, 2, 54).map(|a| a.transpose(&[0, 2, 1, 3]).unwrap());
    let fused = cache.fused(&q, 0.125, Mask::Causal, QmmIsa::Auto).unwrap();
    let err = worst_error(&fused, &cache.ops(&q, 0.125, Mask::Causal), &cache.bound(&q, 0.125, &Mask::Causal));
    assert!(err <= TOL, "strided: {err:e}");
}

#[test]
fn attend_auto_equals_stock_after_the_rotation_and_falls_back_where_it_must() {
    let (b, h, rep, l, t, d) = (1, 2, 2, 1, 200, 64);
    let q = randn(&[b, h * rep, l, d], 61);
    for (kb, vb) in [(8, 3), (4, 2), (5, 3)] {
        let c = Cache::new(b, h, t, d, d, kb, vb, 62);
        let run = |kernels| c.codec.attend(&q, &c.keys, &c.values, 0.125, Mask::None, kernels).unwrap().to_vec_f32().unwrap();
        let (auto, stock) = (run(Kernels::Auto), run(Kernels::Stock));
        let err = auto.iter().zip(&stock).map(|(a, s)| (a - s).abs()).fold(0f32, f32::max);
        assert!(err < 1e-5, "k{kb}v{vb}: {err:e}");
        // 5-bit keys have no kernel: the ops, bit for bit.
        assert_eq!(c.fused(&q, 0.125, Mask::None, QmmIsa::Auto).is_none(), kb == 5);
        if kb == 5 {
            assert_eq!(auto, stock);
        }
    }
    // A float mask is not a bool selection: no kernel.
    let c = Cache::new(b, h, t, d, d, 8, 3, 63);
    let add = Array::zeros(&[b, 1, l, t], Dtype::F32).unwrap();
    assert!(c.fused(&q, 0.125, Mask::Array(&add), QmmIsa::Auto).is_none());
    // f16 queries: the kernel on f32 copies, the result back in f16.
    let q16 = q.astype(Dtype::F16).unwrap();
    let out = c.codec.attend(&q16, &c.keys, &c.values, 0.125, Mask::Causal, Kernels::Auto).unwrap();
    assert_eq!(out.dtype(), Dtype::F16);
}

#[test]
fn a_fully_masked_row_is_finite_and_averages_the_values() {
    let (t, d) = (40, 64);
    let c = Cache::new(1, 1, t, d, d, 8, 3, 71);
    let q = randn(&[1, 1, 1, d], 72);
    let none = Array::from_bytes(&vec![0u8; t as usize], &[1, 1, 1, t], Dtype::Bool).unwrap();
    let out = c.fused(&q, 0.125, Mask::Array(&none), QmmIsa::Auto).unwrap();
    let mean = c.codec.decode_values_rotated(&c.values).unwrap().mean(2, false).unwrap();
    for (a, b) in out.to_vec_f32().unwrap().iter().zip(mean.to_vec_f32().unwrap()) {
        assert!((a - b).abs() <= 1e-5, "{a} vs {b}");
    }
}

#[test]
fn the_tolerance_catches_a_wrong_value() {
    // One value row's scale off by 20% (weight ~1/50 in the output): the
    // check must notice, or it checks nothing.
    let (t, d) = (50, 64);
    let c = Cache::new(1, 1, t, d, d, 8, 3, 81);
    let q = randn(&[1, 3, 1, d], 82);
    let mut s = c.values.scale.to_vec_f32().unwrap();
    let hot = s.len() / 2;
    s[hot] *= 1.2;
    let bad = Array::from_f32(&s, &c.values.scale.shape()).unwrap().astype(Dtype::F16).unwrap();
    let (k, v) = (&c.keys, &c.values);
    let fused = turbo_sdpa_rotated(&q, [&k.idx, &k.scale, &k.zero], [&v.idx, &bad], c.codec.book(), 8, 3, 0.125, Mask::None, QmmIsa::Auto)
        .unwrap()
        .unwrap();
    assert!(worst_error(&fused, &c.ops(&q, 0.125, Mask::None), &c.bound(&q, 0.125, &Mask::None)) > 100.0 * TOL);
}
