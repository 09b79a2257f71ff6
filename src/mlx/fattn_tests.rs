//! Tests of the fused float attention against MLX's own
//! `scaled_dot_product_attention` (its CPU path: matmul, mask, precise
//! softmax, matmul).
//!
//! Error measure: |fused - mlx| / bound per output, with bound = sum_t p_t
//! |v_t| (p the softmax weights: MLX's attention over |v|), the size of the
//! terms the output sums, so one f32 rounding of the result is ~6e-8 of it.
//! TOL = 1e-5: both paths do the same f32 arithmetic in different orders
//! (chunked softmax merged with rescaling, 16/8/4-lane dot products, a
//! different exp polynomial); a wrong key, head, mask entry or window edge
//! moves an output by ~1e-2 of the bound or more.

use super::fast::Mask;
use super::test_data::{isas, randn, worst_error};
use super::*;

const TOL: f32 = 1e-5;

#[derive(Clone, Copy, Debug)]
enum MaskCase {
    None,
    Causal,
    /// Causal, each query sees its last `w` keys.
    Window(i32),
    /// Bool [B, 1, L, T]: causal, batch row 1 left-padded by `pad` keys and
    /// its query 0 fully masked.
    Padded(i32),
    /// Additive f32 [B, 1, L, T].
    Additive,
}

fn mask_array(case: MaskCase, b: i32, l: i32, t: i32) -> Option<Array> {
    let cells = || (0..b).flat_map(|bi| (0..l).flat_map(move |li| (0..t).map(move |ti| (bi, li, ti))));
    match case {
        MaskCase::Padded(pad) => {
            let keep = |(bi, li, ti): (i32, i32, i32)| ti <= t - l + li && !(bi == 1 && (ti < pad || li == 0));
            let bytes: Vec<u8> = cells().map(|c| keep(c) as u8).collect();
            Some(Array::from_bytes(&bytes, &[b, 1, l, t], Dtype::Bool).unwrap())
        }
        MaskCase::Additive => {
            let add = |(bi, li, ti): (i32, i32, i32)| {
                if bi == 1 && ti < 3 {
                    -1e9
                } else {
                    ((ti * 7 + li * 3) % 5) as f32 * 0.1
                }
            };
            Some(Array::from_f32(&cells().map(add).collect::<Vec<_>>(), &[b, 1, l, t]).unwrap())
        }
        _ => None,
    }
}

fn args(case: MaskCase, arr: &Option<Array>) -> (Mask<'_>, Option<i32>) {
    match (case, arr) {
        (MaskCase::Causal, _) => (Mask::Causal, None),
        (MaskCase::Window(w), _) => (Mask::Causal, Some(w)),
        (_, Some(a)) => (Mask::Array(a), None),
        _ => (Mask::None, None),
    }
}

struct Case {
    b: i32,
    hkv: i32,
    rep: i32,
    l: i32,
    t: i32,
    d: i32,
    dv: i32,
}

/// Fused (with `isa`) vs MLX on one case; returns the worst error.
fn compare(c: &Case, mask: MaskCase, isa: QmmIsa, seed: u64) -> f32 {
    let q = randn(&[c.b, c.hkv * c.rep, c.l, c.d], seed);
    // Keys scaled up like real keys (scores spread out).
    let k = randn(&[c.b, c.hkv, c.t, c.d], seed + 1).mul_scalar(1.5).unwrap();
    let v = randn(&[c.b, c.hkv, c.t, c.dv], seed + 2);
    let scale = 1.0 / (c.d as f32).sqrt();
    let arr = mask_array(mask, c.b, c.l, c.t);
    let (m, w) = args(mask, &arr);
    let fused = fused_sdpa_isa(&q, &k, &v, scale, m, w, isa).unwrap();
    assert_eq!(fattn_isa_of(&fused), Some(isa), "fused path not taken");
    assert_eq!(fused.shape(), vec![c.b, c.hkv * c.rep, c.l, c.dv]);
    let (m, w) = args(mask, &arr);
    let want = sdpa_stock(&q, &k, &v, scale, m, w).unwrap();
    let (m, w) = args(mask, &arr);
    let bound = sdpa_stock(&q, &k, &v.abs().unwrap(), scale, m, w).unwrap();
    worst_error(&fused, &want, &bound)
}

#[test]
fn matches_mlx_across_heads_lengths_masks_and_isas() {
    let (mut cases, mut worst) = (0, 0f32);
    for isa in isas() {
        for rep in [1, 3, 4] {
            for l in [1, 7, 63, 65] {
                for extra in [0, 37] {
                    let t = l + extra;
                    let masks =
                        [MaskCase::None, MaskCase::Causal, MaskCase::Window(5), MaskCase::Window(64), MaskCase::Padded(5)];
                    for (mi, mask) in masks.into_iter().enumerate() {
                        let c = Case { b: 2, hkv: 2, rep, l, t, d: 64, dv: 64 };
                        let seed = (rep * 1000 + l * 10 + t + mi as i32) as u64;
                        let err = compare(&c, mask, isa, seed);
                        assert!(err <= TOL, "{isa:?} rep={rep} L={l} T={t} {mask:?}: {err:e}");
                        worst = worst.max(err);
                        cases += 1;
                    }
                }
            }
        }
    }
    assert!(cases >= 3 * 4 * 2 * 5);
    eprintln!("worst |fused - mlx| / bound over {cases} cases: {worst:e}");
}

#[test]
fn long_prefill_decode_head_sizes_and_additive_masks() {
    let mut worst = 0f32;
    for isa in isas() {
        let mut check = |c: Case, mask: MaskCase, seed: u64| {
            let err = compare(&c, mask, isa, seed);
            assert!(err <= TOL, "{isa:?} L={} T={} d={} {mask:?}: {err:e}", c.l, c.t, c.d);
            worst = worst.max(err);
        };
        // A 1000-token causal prefill (many row blocks and key chunks, SmolLM2's heads).
        check(Case { b: 1, hkv: 3, rep: 3, l: 1000, t: 1000, d: 64, dv: 64 }, MaskCase::Causal, 11);
        // A sliding window over a longer chunk of keys.
        check(Case { b: 1, hkv: 1, rep: 2, l: 300, t: 700, d: 64, dv: 64 }, MaskCase::Window(256), 12);
        // Decode at 4k+ context: the key split over the pool.
        check(Case { b: 1, hkv: 3, rep: 3, l: 1, t: 4100, d: 64, dv: 64 }, MaskCase::None, 13);
        check(Case { b: 2, hkv: 2, rep: 4, l: 2, t: 1000, d: 128, dv: 128 }, MaskCase::Causal, 14);
        // Head sizes 128 and 256, values wider than keys, an additive mask.
        check(Case { b: 1, hkv: 2, rep: 2, l: 65, t: 65, d: 128, dv: 128 }, MaskCase::Causal, 15);
        check(Case { b: 1, hkv: 1, rep: 2, l: 7, t: 63, d: 256, dv: 256 }, MaskCase::Causal, 16);
        check(Case { b: 2, hkv: 1, rep: 2, l: 3, t: 77, d: 64, dv: 128 }, MaskCase::Additive, 17);
    }
    eprintln!("worst error: {worst:e}");
}

#[test]
fn reads_a_cache_sliced_from_a_larger_buffer_and_transposed_queries() {
    // A KV cache keeps capacity past its length and hands out
    // `buf[..., :T, :]`; queries arrive as [B, L, H, D] transposed.
    let (b, h, rep, l, t, cap, d) = (2, 2, 3, 5, 300, 512, 64);
    let k = randn(&[b, h, cap, d], 51).slice_axis(2, 0, t).unwrap();
    let v = randn(&[b, h, cap, d], 52).slice_axis(2, 0, t).unwrap();
    let q = randn(&[b, l, h * rep, d], 53).transpose(&[0, 2, 1, 3]).unwrap();
    for mask in [MaskCase::Causal, MaskCase::Padded(4)] {
        let arr = mask_array(mask, b, l, t);
        let (m, w) = args(mask, &arr);
        let fused = fused_sdpa(&q, &k, &v, 0.125, m, w).unwrap();
        assert!(fattn_isa_of(&fused).is_some());
        let (m, w) = args(mask, &arr);
        let want = sdpa_stock(&q, &k, &v, 0.125, m, w).unwrap();
        let (m, w) = args(mask, &arr);
        let bound = sdpa_stock(&q, &k, &v.abs().unwrap(), 0.125, m, w).unwrap();
        let err = worst_error(&fused, &want, &bound);
        assert!(err <= TOL, "{mask:?}: {err:e}");
    }
    // Keys whose rows are strided ([B, T, H, D] transposed): read from a copy.
    let kt = randn(&[b, t, h, d], 54).transpose(&[0, 2, 1, 3]).unwrap();
    let fused = fused_sdpa(&q, &kt, &v, 0.125, Mask::None, None).unwrap();
    assert!(fattn_isa_of(&fused).is_some());
    let want = sdpa_stock(&q, &kt, &v, 0.125, Mask::None, None).unwrap();
    let bound = sdpa_stock(&q, &kt, &v.abs().unwrap(), 0.125, Mask::None, None).unwrap();
    assert!(worst_error(&fused, &want, &bound) <= TOL);
}

#[test]
fn reads_keys_and_values_stored_as_f16() {
    // A cache stored as f16 (`KvFloat::F16`): f32 queries over f16 keys and
    // values, widened exactly on load, so MLX over the widened arrays is the
    // reference at the same tolerance. Decode (keys read as rows), prefill
    // (keys transposed), a window, a padded batch, a sliced buffer.
    let h = |a: &Array| a.astype(Dtype::F16).unwrap();
    let f = |a: &Array| a.astype(Dtype::F32).unwrap();
    let mut worst = 0f32;
    for isa in isas() {
        for (l, t, mask) in [
            (1, 300, MaskCase::None),
            (1, 4100, MaskCase::Causal),
            (3, 77, MaskCase::Padded(5)),
            (65, 65, MaskCase::Causal),
            (300, 700, MaskCase::Window(256)),
        ] {
            let (b, hkv, rep, d) = (2, 2, 3, 64);
            let seed = (l * 7 + t) as u64;
            let q = randn(&[b, hkv * rep, l, d], seed);
            let k = h(&randn(&[b, hkv, t + 16, d], seed + 1).mul_scalar(1.5).unwrap()).slice_axis(2, 0, t).unwrap();
            let v = h(&randn(&[b, hkv, t + 16, d], seed + 2)).slice_axis(2, 0, t).unwrap();
            let arr = mask_array(mask, b, l, t);
            let (m, w) = args(mask, &arr);
            let fused = fused_sdpa_isa(&q, &k, &v, 0.125, m, w, isa).unwrap();
            assert_eq!(fattn_isa_of(&fused), Some(isa), "fused path not taken");
            assert_eq!(fused.dtype(), Dtype::F32);
            let (m, w) = args(mask, &arr);
            let want = sdpa_stock(&q, &f(&k), &f(&v), 0.125, m, w).unwrap();
            // MLX's own path takes the f16 cache too (widened first): the same numbers.
            let (m, w) = args(mask, &arr);
            let stock = sdpa_stock(&q, &k, &v, 0.125, m, w).unwrap();
            assert_eq!(stock.to_vec_f32().unwrap(), want.to_vec_f32().unwrap());
            let (m, w) = args(mask, &arr);
            let bound = sdpa_stock(&q, &f(&k), &f(&v).abs().unwrap(), 0.125, m, w).unwrap();
            let err = worst_error(&fused, &want, &bound);
            assert!(err <= TOL, "{isa:?} L={l} T={t} {mask:?}: {err:e}");
            worst = worst.max(err);
        }
    }
    eprintln!("worst error over f16 caches: {worst:e}");
}

#[test]
fn unsupported_cases_use_mlx_and_errors_are_errors() {
    let q = randn(&[1, 2, 3, 64], 61);
    let k = randn(&[1, 1, 9, 64], 62);
    let v = randn(&[1, 1, 9, 64], 63);
    // f16: MLX's kernel, the same numbers as calling it directly.
    let h = |a: &Array| a.astype(Dtype::F16).unwrap();
    let out = fused_sdpa(&h(&q), &h(&k), &h(&v), 0.1, Mask::Causal, None).unwrap();
    assert_eq!(fattn_isa_of(&out), None);
    let want = sdpa_stock(&h(&q), &h(&k), &h(&v), 0.1, Mask::Causal, None).unwrap();
    assert_eq!(out.to_vec_f32().unwrap(), want.to_vec_f32().unwrap());
    // A head size that is not whole vectors (on the portable kernel: 4 lanes).
    let (q6, k6, v6) = (randn(&[1, 2, 3, 6], 64), randn(&[1, 1, 9, 6], 65), randn(&[1, 1, 9, 6], 66));
    let out = fused_sdpa_isa(&q6, &k6, &v6, 0.1, Mask::Causal, Some(4), QmmIsa::Portable).unwrap();
    assert_eq!(fattn_isa_of(&out), None);
    let want = sdpa_stock(&q6, &k6, &v6, 0.1, Mask::Causal, Some(4)).unwrap();
    assert_eq!(out.to_vec_f32().unwrap(), want.to_vec_f32().unwrap());
    // A mask per query head with grouped heads: MLX.
    let m = Array::from_bytes(&[1; 2 * 3 * 9], &[1, 2, 3, 9], Dtype::Bool).unwrap();
    assert_eq!(fattn_isa_of(&fused_sdpa(&q, &k, &v, 0.1, Mask::Array(&m), None).unwrap()), None);

    // Invalid input is an MLX error, never an abort.
    let q3 = randn(&[1, 3, 1, 64], 67);
    let k2 = randn(&[1, 2, 9, 64], 68);
    assert!(fused_sdpa(&q3, &k2, &k2, 0.1, Mask::None, None).is_err());
    let bad_mask = Array::from_bytes(&[1; 5], &[1, 1, 1, 5], Dtype::Bool).unwrap();
    assert!(fused_sdpa(&q, &k, &v, 0.1, Mask::Array(&bad_mask), None).is_err());
    assert!(fused_sdpa(&q, &k, &v, 0.1, Mask::None, Some(4)).is_err());
}

#[test]
fn a_fully_masked_row_is_finite_and_averages_the_values() {
    // Bool false -> finfo.min, never -inf: softmax of equal scores.
    let t = 40;
    let q = randn(&[1, 1, 1, 64], 71);
    let k = randn(&[1, 1, t, 64], 72);
    let v = randn(&[1, 1, t, 64], 73);
    let none = Array::from_bytes(&vec![0u8; t as usize], &[1, 1, 1, t], Dtype::Bool).unwrap();
    let out = fused_sdpa(&q, &k, &v, 0.125, Mask::Array(&none), None).unwrap();
    assert!(fattn_isa_of(&out).is_some());
    let mean = v.mean(2, false).unwrap();
    for (a, b) in out.to_vec_f32().unwrap().iter().zip(mean.to_vec_f32().unwrap()) {
        assert!((a - b).abs() <= 1e-5, "{a} vs {b}");
    }
}

#[test]
fn the_tolerance_catches_a_wrong_window_edge_and_a_wrong_value() {
    // A window one key too wide, and one value off by 20% of its row: the
    // check must notice both, or it checks nothing.
    let c = Case { b: 1, hkv: 1, rep: 2, l: 40, t: 40, d: 64, dv: 64 };
    let q = randn(&[c.b, c.rep, c.l, c.d], 81);
    let k = randn(&[c.b, 1, c.t, c.d], 82);
    let v = randn(&[c.b, 1, c.t, c.dv], 83);
    let bound = sdpa_stock(&q, &k, &v.abs().unwrap(), 0.125, Mask::Causal, Some(8)).unwrap();
    let want = sdpa_stock(&q, &k, &v, 0.125, Mask::Causal, Some(8)).unwrap();
    let wide = fused_sdpa(&q, &k, &v, 0.125, Mask::Causal, Some(9)).unwrap();
    assert!(worst_error(&wide, &want, &bound) > 100.0 * TOL);
    let mut vv = v.to_vec_f32().unwrap();
    vv[20 * 64 + 5] *= 1.2;
    let bad_v = Array::from_f32(&vv, &v.shape()).unwrap();
    let bad = fused_sdpa(&q, &k, &bad_v, 0.125, Mask::Causal, Some(8)).unwrap();
    assert!(worst_error(&bad, &want, &bound) > 100.0 * TOL);
}

#[test]
fn merged_output_is_the_transposed_heads_bit_for_bit() {
    // `fused_sdpa_merged` writes [B, L, Hq * Dv] straight from the kernel:
    // the same bits as the [B, Hq, L, Dv] output with its heads moved after
    // the positions (decode, prefill with transposed keys, windows, masks).
    let bits = |a: &Array| a.to_vec_f32().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for (b, hkv, rep, l, t) in [(1, 3, 3, 1, 40), (2, 3, 3, 1, 300), (2, 2, 2, 70, 70), (1, 3, 3, 9, 120)] {
        for mask in [MaskCase::None, MaskCase::Causal, MaskCase::Window(16), MaskCase::Padded(3)] {
            if matches!(mask, MaskCase::Padded(_)) && b < 2 {
                continue;
            }
            let q = randn(&[b, hkv * rep, l, 64], (b + l) as u64);
            let k = randn(&[b, hkv, t, 64], (t + 1) as u64);
            let v = randn(&[b, hkv, t, 64], (t + 2) as u64);
            let arr = mask_array(mask, b, l, t);
            let (m, w) = args(mask, &arr);
            let heads = fused_sdpa(&q, &k, &v, 0.125, m, w).unwrap();
            let (m, w) = args(mask, &arr);
            let merged = fused_sdpa_merged(&q, &k, &v, 0.125, m, w).unwrap();
            assert!(fattn_isa_of(&merged).is_some(), "fused path not taken");
            assert_eq!(merged.shape(), vec![b, l, hkv * rep * 64]);
            assert_eq!(bits(&merged), bits(&merge_heads(&heads).unwrap()), "b {b} l {l} t {t} {mask:?}");
        }
    }
}
