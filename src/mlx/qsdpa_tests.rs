//! Tests of the fused quantized-KV attention against its MLX-op composition
//! (mlx-lm's `quantized_scaled_dot_product_attention`, op for op).
//!
//! Error measure: |fused - ops| / bound per output, with bound = sum_t p_t
//! (|v_t| + |bias_t|) (p the softmax weights, v the dequantized values
//! scale * q + bias, computed with dense MLX ops): the size of the terms the
//! output sums (a dequantized value that cancels to ~0 is still rounded at
//! the scale of its bias: the fused kernel's one-FMA dequantization and
//! MLX's multiply-then-add differ there by an ulp of the bias), so one f32
//! rounding of the result is ~6e-8 of it. TOL = 1e-5. Both paths do the same f32
//! arithmetic in different orders (chunked softmax merged with rescaling,
//! 16/8/4-lane dot products, a different exp polynomial); a wrong group,
//! nibble, mask entry or head moves an output by ~1e-2 of the bound or more.

use super::fast::Mask;
use super::test_data::{attention_bound, isas, randn, worst_error};
use super::*;

const TOL: f32 = 1e-5;

/// A quantized K or V cache `[B, H, T, D]`, its dequantized values and
/// their magnitude |scale * q| + |bias| (see the error measure).
struct Planes {
    w: Array,
    s: Array,
    b: Array,
    dense: Array,
    mag: Array,
}

impl Planes {
    fn new(x: &Array, group: i32, bits: i32) -> Planes {
        let (w, s, b) = quantize(x, group, bits).unwrap();
        let dense = dequantize(&w, &s, &b, group, bits).unwrap();
        let sh = dense.shape();
        let (n, d) = (sh[..3].to_vec(), sh[3]);
        let bias = b.abs().unwrap().expand_dims(-1).unwrap();
        let bias = bias.broadcast_to(&[&n[..], &[d / group, group]].concat()).unwrap();
        let bias = bias.reshape(&sh).unwrap();
        let sq = dense.subtract(&b.expand_dims(-1).unwrap().broadcast_to(&[&n[..], &[d / group, group]].concat()).unwrap().reshape(&sh).unwrap()).unwrap();
        let mag = sq.abs().unwrap().add(&bias).unwrap();
        eval(&[&w, &s, &b, &dense, &mag]).unwrap();
        Planes { w, s, b, dense, mag }
    }
    fn refs(&self) -> [&Array; 3] {
        [&self.w, &self.s, &self.b]
    }
}

enum MaskCase {
    None,
    Causal,
    /// Bool [B, 1, L, T]: causal, the first `pad` keys of batch row 1
    /// masked (left padding), and its query 0 fully masked.
    Padded(i32),
    /// Additive f32 [B, 1, L, T] (e.g. -1e9 on padding, small values elsewhere).
    Additive,
}

fn mask_array(case: &MaskCase, b: i32, l: i32, t: i32) -> Option<Array> {
    let shape = [b, 1, l, t];
    let idx = |bi: i32, li: i32, ti: i32| -> (bool, f32) {
        let causal = ti <= t - l + li;
        match case {
            MaskCase::Padded(pad) => {
                let visible = causal && !(bi == 1 && (ti < *pad || li == 0));
                (visible, 0.0)
            }
            _ => (true, if bi == 1 && ti < 3 { -1e9 } else { ((ti * 7 + li * 3) % 5) as f32 * 0.1 }),
        }
    };
    let cells = (0..b).flat_map(|bi| (0..l).flat_map(move |li| (0..t).map(move |ti| (bi, li, ti))));
    match case {
        MaskCase::Padded(_) => {
            let bytes: Vec<u8> = cells.map(|(bi, li, ti)| idx(bi, li, ti).0 as u8).collect();
            Some(Array::from_bytes(&bytes, &shape, Dtype::Bool).unwrap())
        }
        MaskCase::Additive => {
            let v: Vec<f32> = cells.map(|(bi, li, ti)| idx(bi, li, ti).1).collect();
            Some(Array::from_f32(&v, &shape).unwrap())
        }
        _ => None,
    }
}

fn as_mask<'a>(case: &MaskCase, arr: &'a Option<Array>) -> Mask<'a> {
    match (case, arr) {
        (MaskCase::Causal, _) => Mask::Causal,
        (_, Some(a)) => Mask::Array(a),
        _ => Mask::None,
    }
}

/// sum_t p_t (|scale q| + |bias|)_t per output, with dense ops on the
/// dequantized planes.
fn bound(q: &Array, k: &Planes, v: &Planes, scale: f32, mask: &Mask) -> Array {
    attention_bound(q, &k.dense, &v.mag, scale, mask)
}

struct Case {
    b: i32,
    hkv: i32,
    rep: i32,
    l: i32,
    t: i32,
    d: i32,
    dv: i32,
    group: i32,
    bits: i32,
}

/// Fused (with `isa`) vs ops on one case; returns the worst error.
fn compare(c: &Case, mask: &MaskCase, isa: QmmIsa, seed: u64) -> f32 {
    let q = randn(&[c.b, c.hkv * c.rep, c.l, c.d], seed);
    // Keys with a per-position offset, like real keys (scores spread out).
    let k = Planes::new(&randn(&[c.b, c.hkv, c.t, c.d], seed + 1).mul_scalar(1.5).unwrap(), c.group, c.bits);
    let v = Planes::new(&randn(&[c.b, c.hkv, c.t, c.dv], seed + 2), c.group, c.bits);
    let scale = 1.0 / (c.d as f32).sqrt();
    let arr = mask_array(mask, c.b, c.l, c.t);
    let fused =
        quantized_sdpa_isa(&q, k.refs(), v.refs(), scale, as_mask(mask, &arr), c.group, c.bits, isa).unwrap();
    assert_eq!(qsdpa_isa_of(&fused), Some(isa), "fused path not taken");
    let ops = quantized_sdpa_ops(&q, k.refs(), v.refs(), scale, as_mask(mask, &arr), c.group, c.bits).unwrap();
    assert_eq!(fused.shape(), vec![c.b, c.hkv * c.rep, c.l, c.dv]);
    worst_error(&fused, &ops, &bound(&q, &k, &v, scale, &as_mask(mask, &arr)))
}

#[test]
fn matches_ops_across_heads_lengths_masks_groups_bits_and_isas() {
    let mut cases = 0;
    let mut worst = 0f32;
    for isa in isas() {
        for bits in [4, 8] {
            for group in [32, 64, 128] {
                let d = group.max(64);
                for rep in [1, 3, 4] {
                    for l in [1, 7] {
                        for t in [1, 300] {
                            for (mi, mask) in [MaskCase::None, MaskCase::Causal, MaskCase::Padded(5)].iter().enumerate() {
                                let c = Case { b: 2, hkv: 2, rep, l, t, d, dv: d, group, bits };
                                let seed = (bits * 1000 + group * 10 + rep * 7 + l * 3 + t + mi as i32) as u64;
                                let err = compare(&c, mask, isa, seed);
                                assert!(
                                    err <= TOL,
                                    "{isa:?} bits={bits} g={group} rep={rep} L={l} T={t} mask#{mi}: {err:e}"
                                );
                                worst = worst.max(err);
                                cases += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(cases >= 2 * 3 * 3 * 2 * 2 * 3);
    eprintln!("worst |fused - ops| / bound over {cases} cases: {worst:e}");
}

#[test]
fn long_decode_prefill_additive_mask_and_wider_values() {
    let mut worst = 0f32;
    for isa in isas() {
        for bits in [4, 8] {
            // Decode at 4k+ context: many chunks over the pool, T not a
            // multiple of the chunk.
            let c = Case { b: 1, hkv: 3, rep: 3, l: 1, t: 4100, d: 64, dv: 64, group: 64, bits };
            worst = worst.max(compare(&c, &MaskCase::None, isa, 41));
            // A prefill chunk: several row blocks, causal key skipping.
            let c = Case { b: 1, hkv: 2, rep: 4, l: 40, t: 600, d: 64, dv: 64, group: 32, bits };
            worst = worst.max(compare(&c, &MaskCase::Causal, isa, 42));
            // More row blocks than the pool takes tasks at once (grouped).
            let c = Case { b: 1, hkv: 1, rep: 1, l: 40000, t: 33, d: 64, dv: 64, group: 64, bits };
            worst = worst.max(compare(&c, &MaskCase::None, isa, 44));
            // Additive mask; values wider than keys.
            let c = Case { b: 2, hkv: 1, rep: 2, l: 3, t: 77, d: 64, dv: 128, group: 64, bits };
            worst = worst.max(compare(&c, &MaskCase::Additive, isa, 43));
            assert!(worst <= TOL, "{isa:?} bits={bits}: {worst:e}");
        }
    }
    eprintln!("worst error: {worst:e}");
}

#[test]
fn reads_a_cache_sliced_from_a_larger_buffer_and_transposed_queries() {
    // A KV cache keeps capacity past its length and hands out
    // `buf[..., :T, :]`; queries arrive as [B, L, H, D] transposed.
    let (b, h, rep, l, t, cap, d, group, bits) = (2, 2, 3, 2, 300, 512, 64, 64, 4);
    let kx = randn(&[b, h, cap, d], 51);
    let vx = randn(&[b, h, cap, d], 52);
    let (kf, vf) = (Planes::new(&kx, group, bits), Planes::new(&vx, group, bits));
    let cut = |p: &Planes| -> Planes {
        let s = |a: &Array| a.slice_axis(2, 0, t).unwrap();
        Planes { w: s(&p.w), s: s(&p.s), b: s(&p.b), dense: s(&p.dense), mag: s(&p.mag) }
    };
    let (k, v) = (cut(&kf), cut(&vf));
    let q = randn(&[b, l, h * rep, d], 53).transpose(&[0, 2, 1, 3]).unwrap();
    let arr = mask_array(&MaskCase::Padded(4), b, l, t);
    let mask = || Mask::Array(arr.as_ref().unwrap());
    let fused = quantized_sdpa(&q, k.refs(), v.refs(), 0.125, mask(), group, bits).unwrap();
    assert!(qsdpa_isa_of(&fused).is_some());
    let ops = quantized_sdpa_ops(&q, k.refs(), v.refs(), 0.125, mask(), group, bits).unwrap();
    let err = worst_error(&fused, &ops, &bound(&q, &k, &v, 0.125, &mask()));
    assert!(err <= TOL, "{err:e}");
}

#[test]
fn copies_planes_whose_rows_are_strided() {
    // Planes quantized as [B, T, H, D] and transposed: a (b, h) block's rows
    // are H rows apart, so the kernel reads a dense copy.
    let (b, h, rep, l, t, d, group, bits) = (1, 3, 2, 1, 70, 64, 32, 8);
    let planes = |seed| {
        let p = Planes::new(&randn(&[b, t, h, d], seed), group, bits);
        let tr = |a: &Array| a.transpose(&[0, 2, 1, 3]).unwrap();
        Planes { w: tr(&p.w), s: tr(&p.s), b: tr(&p.b), dense: tr(&p.dense), mag: tr(&p.mag) }
    };
    let (k, v) = (planes(91), planes(92));
    let q = randn(&[b, h * rep, l, d], 93);
    let fused = quantized_sdpa(&q, k.refs(), v.refs(), 0.125, Mask::None, group, bits).unwrap();
    assert!(qsdpa_isa_of(&fused).is_some());
    let ops = quantized_sdpa_ops(&q, k.refs(), v.refs(), 0.125, Mask::None, group, bits).unwrap();
    let err = worst_error(&fused, &ops, &bound(&q, &k, &v, 0.125, &Mask::None));
    assert!(err <= TOL, "{err:e}");
}

#[test]
fn unsupported_cases_use_the_ops_and_errors_are_errors() {
    let (group, bits) = (64, 4);
    let q = randn(&[1, 2, 1, 64], 61);
    let k = Planes::new(&randn(&[1, 1, 9, 64], 62), group, bits);
    let v = Planes::new(&randn(&[1, 1, 9, 64], 63), group, bits);
    // f16 scales: MLX's ops, same numbers as calling them directly.
    let half = |p: &Planes| (p.s.astype(Dtype::F16).unwrap(), p.b.astype(Dtype::F16).unwrap());
    let ((ks, kb), (vs, vb)) = (half(&k), half(&v));
    let out = quantized_sdpa(&q, [&k.w, &ks, &kb], [&v.w, &vs, &vb], 0.1, Mask::Causal, group, bits).unwrap();
    assert_eq!(qsdpa_isa_of(&out), None);
    let want = quantized_sdpa_ops(&q, [&k.w, &ks, &kb], [&v.w, &vs, &vb], 0.1, Mask::Causal, group, bits).unwrap();
    assert_eq!(out.to_vec_f32().unwrap(), want.to_vec_f32().unwrap());
    // 3 bits: ops.
    let k3 = Planes::new(&randn(&[1, 1, 9, 64], 64), group, 3);
    let v3 = Planes::new(&randn(&[1, 1, 9, 64], 65), group, 3);
    let out = quantized_sdpa(&q, k3.refs(), v3.refs(), 0.1, Mask::None, group, 3).unwrap();
    assert_eq!(qsdpa_isa_of(&out), None);
    assert_eq!(out.shape(), vec![1, 2, 1, 64]);

    // Invalid input is an MLX error, never an abort.
    assert!(quantized_sdpa(&q, k.refs(), v.refs(), 0.1, Mask::None, 32, bits).is_err());
    let q3 = randn(&[1, 3, 1, 64], 66);
    let k2 = Planes::new(&randn(&[1, 2, 9, 64], 67), group, bits);
    let v2 = Planes::new(&randn(&[1, 2, 9, 64], 68), group, bits);
    assert!(quantized_sdpa(&q3, k2.refs(), v2.refs(), 0.1, Mask::None, group, bits).is_err());
    let bad_mask = Array::from_bytes(&[1; 5], &[1, 1, 1, 5], Dtype::Bool).unwrap();
    assert!(quantized_sdpa(&q, k.refs(), v.refs(), 0.1, Mask::Array(&bad_mask), group, bits).is_err());
}

#[test]
fn a_fully_masked_row_is_finite_and_averages_the_values() {
    // Bool false -> finfo.min, never -inf: softmax of equal scores.
    let (group, bits, t) = (32, 8, 40);
    let q = randn(&[1, 1, 1, 64], 71);
    let k = Planes::new(&randn(&[1, 1, t, 64], 72), group, bits);
    let v = Planes::new(&randn(&[1, 1, t, 64], 73), group, bits);
    let none = Array::from_bytes(&vec![0u8; t as usize], &[1, 1, 1, t], Dtype::Bool).unwrap();
    let out = quantized_sdpa(&q, k.refs(), v.refs(), 0.125, Mask::Array(&none), group, bits).unwrap();
    assert!(qsdpa_isa_of(&out).is_some());
    let mean = v.dense.mean(2, false).unwrap();
    for (a, b) in out.to_vec_f32().unwrap().iter().zip(mean.to_vec_f32().unwrap()) {
        assert!((a - b).abs() <= 1e-5, "{a} vs {b}");
    }
}

#[test]
fn the_tolerance_catches_a_wrong_value() {
    // One value row's scale off by 20% (weight ~1/50 in the output): the
    // check must notice, or it checks nothing.
    let (group, bits, t) = (64, 4, 50);
    let q = randn(&[1, 3, 1, 64], 81);
    let k = Planes::new(&randn(&[1, 1, t, 64], 82), group, bits);
    let v = Planes::new(&randn(&[1, 1, t, 64], 83), group, bits);
    let mut s = v.s.to_vec_f32().unwrap();
    let hot = s.len() / 2;
    s[hot] *= 1.2;
    let bad_s = Array::from_f32(&s, &v.s.shape()).unwrap();
    let fused = quantized_sdpa(&q, k.refs(), [&v.w, &bad_s, &v.b], 0.125, Mask::None, group, bits).unwrap();
    let ops = quantized_sdpa_ops(&q, k.refs(), v.refs(), 0.125, Mask::None, group, bits).unwrap();
    assert!(worst_error(&fused, &ops, &bound(&q, &k, &v, 0.125, &Mask::None)) > 100.0 * TOL);
}
