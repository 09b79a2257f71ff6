//! `LanguageModel::forward_mixed` against separate forwards, per family on
//! tiny random-weight models (tests/oracle/make_tiny.py): decoding rows of
//! different lengths (left-padded; rings of sliding layers wrapped for some)
//! packed with a prefill chunk (one row after a cached prefix, or two rows
//! whose chunk starts with one row's padding) give the same logits (within
//! 1e-5 of their magnitude, see `TOL`) and leave the same caches, so the
//! next step agrees too; the decode rows alone as one group give exactly
//! what `forward` gives.

mod common;

use common::*;
use mlxrt::cache::LayerCache;
use mlxrt::mlx::{self, Array, Dtype};
use mlxrt::model::{load, Group, LanguageModel, LoadOptions, Output};
use std::path::PathBuf;

/// Max |Δ| relative to the largest |value| compared (at least 1). Packing
/// changes the row count of each matmul, and OpenBLAS's sgemm (which build.rs
/// links where it finds it) rounds some rows differently then: ~1e-6 of
/// the magnitude here (the wheel's reference BLAS gives identical rows).
const TOL: f32 = 1e-5;

/// `max |a - b|` over `max(1, max |b|)`.
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    max_abs_diff(a, b) / b.iter().fold(1f32, |m, x| m.max(x.abs()))
}

/// The tiny model of `family` (f32), built once per change of make_tiny.py
/// under target/oracle/mixed.
fn tiny(family: &str) -> PathBuf {
    // The tests run in parallel and two share qwen3_5's model: one removing
    // and rebuilding it while the other loaded it failed on a fresh clone.
    static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let folder = repo_root().join(format!("target/oracle/mixed/tiny-{family}"));
    let script = repo_root().join("tests/oracle/make_tiny.py");
    if !newer_than(&folder.join("model.safetensors"), &[script]) {
        let _ = std::fs::remove_dir_all(&folder);
        make_tiny(family, &folder, &[]);
    }
    folder
}

fn ids(n: usize, salt: i32) -> Vec<i32> {
    (0..n as i32).map(|i| 100 + (i * 7919 + salt * 104_729) % 40_000).collect()
}

fn tokens(rows: &[Vec<i32>]) -> Array {
    let flat: Vec<i32> = rows.concat();
    Array::from_i32(&flat, &[rows.len() as i32, rows[0].len() as i32]).unwrap()
}

/// One row's cache after `prompt` (CacheOnly forwards), evaluated.
fn prefilled(m: &dyn LanguageModel, prompt: &[i32]) -> Vec<LayerCache> {
    let mut cache = m.new_cache(1);
    if !prompt.is_empty() {
        m.forward(&tokens(&[prompt.to_vec()]), &mut cache, Output::CacheOnly).unwrap();
        eval_cache(&cache);
    }
    cache
}

/// Rows with the caches of `prompts`, joined as the engine joins rows
/// (right-aligned, the shorter ones left-padded).
fn joined(m: &dyn LanguageModel, prompts: &[Vec<i32>]) -> Vec<LayerCache> {
    let mut rows = prompts.iter().map(|p| prefilled(m, p));
    let mut cache = rows.next().unwrap();
    for other in rows {
        for (c, o) in cache.iter_mut().zip(other) {
            c.extend(o).unwrap();
        }
    }
    cache
}

/// The two row sets of a mixed iteration, built afresh (the same each time).
struct Sets {
    decode: Vec<LayerCache>,
    next: Array,
    cohort: Vec<LayerCache>,
    chunk: Array,
}

/// Three decoding rows after prompts of 20, 13 and 5 tokens, and a cohort:
/// `two_rows` = false: one row with 10 positions cached; true: two new rows
/// of 7 and 4 prompt tokens (the second padded by 3), at their first chunk.
fn sets(m: &dyn LanguageModel, two_rows: bool) -> Sets {
    let decode = joined(m, &[ids(20, 1), ids(13, 2), ids(5, 3)]);
    let next = tokens(&[vec![7], vec![70], vec![700]]);
    let (cohort, chunk) = if two_rows {
        let mut c = m.new_cache(2);
        c.iter_mut().for_each(|c| c.set_padding(&[0, 3]));
        let short = [vec![0; 3], ids(4, 5)].concat();
        (c, tokens(&[ids(7, 4), short]))
    } else {
        (prefilled(m, &ids(10, 6)), tokens(&[ids(7, 7)]))
    };
    Sets { decode, next, cohort, chunk }
}

fn values(a: &Array) -> Vec<f32> {
    a.astype(Dtype::F32).unwrap().to_vec_f32().unwrap()
}

/// Every array and the timeline of each layer agree.
fn assert_same_caches(label: &str, a: &[LayerCache], b: &[LayerCache]) {
    eval_cache(a);
    eval_cache(b);
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!((x.len(), x.timeline().pads()), (y.len(), y.timeline().pads()), "{label}: layer {i}'s timeline");
        let (xs, ys) = (x.state(), y.state());
        assert_eq!(xs.len(), ys.len(), "{label}: layer {i}");
        for (p, q) in xs.iter().zip(&ys) {
            assert_eq!(p.shape(), q.shape(), "{label}: layer {i}");
            // A KV cache's buffers are allocated unwritten past its length.
            let written = |a: &Array| match x {
                LayerCache::Kv(_) => a.slice_axis(2, 0, x.len() as i32).unwrap(),
                _ => a.share(),
            };
            let d = rel_diff(&values(&written(p)), &values(&written(q)));
            assert!(d <= TOL, "{label}: layer {i}'s cache differs by {d}");
        }
    }
}

/// The logits of one forward as `[n, vocab]`.
fn rows_of(logits: Option<Array>) -> Option<Array> {
    logits.map(|l| l.reshape(&[-1, l.dim(-1)]).unwrap())
}

fn check(label: &str, m: &dyn LanguageModel, two_rows: bool, out: Output) {
    let label = format!("{label} (two-row chunk: {two_rows}, {out:?})");
    // Separate forwards.
    let mut sep = sets(m, two_rows);
    let d = rows_of(m.forward(&sep.next, &mut sep.decode, Output::LastLogits).unwrap()).unwrap();
    let p = rows_of(m.forward(&sep.chunk, &mut sep.cohort, out).unwrap());
    let want = match &p {
        Some(p) => Array::concatenate(&[&d, p], 0).unwrap(),
        None => d,
    };
    // One mixed forward.
    let mut mix = sets(m, two_rows);
    let (b, r, len) = (mix.next.dim(0), mix.chunk.dim(0), mix.chunk.dim(1));
    let packed = Array::concatenate(&[&mix.next.reshape(&[1, -1]).unwrap(), &mix.chunk.reshape(&[1, -1]).unwrap()], 1).unwrap();
    let got = {
        let mut groups = [
            Group { cache: &mut mix.decode, rows: b, len: 1, out: Output::LastLogits },
            Group { cache: &mut mix.cohort, rows: r, len, out },
        ];
        m.forward_mixed(&packed, &mut groups).unwrap().expect("the decode rows' logits")
    };
    assert_eq!(got.shape(), want.shape(), "{label}: logits");
    let dl = rel_diff(&values(&got), &values(&want));
    assert!(dl <= TOL, "{label}: mixed logits differ from separate forwards by {dl}");
    assert_same_caches(&format!("{label}, decode rows"), &sep.decode, &mix.decode);
    assert_same_caches(&format!("{label}, cohort"), &sep.cohort, &mix.cohort);
    // The caches carry on alike: one more step of each row set.
    let again = |s: &mut Sets| {
        let d = m.forward(&tokens(&[vec![8], vec![80], vec![800]]), &mut s.decode, Output::LastLogits).unwrap().unwrap();
        let c = m.forward(&s.chunk.slice_axis(1, 0, 1).unwrap(), &mut s.cohort, Output::LastLogits).unwrap().unwrap();
        (values(&d), values(&c))
    };
    let (sd, sc) = again(&mut sep);
    let (md, mc) = again(&mut mix);
    let dn = rel_diff(&md, &sd).max(rel_diff(&mc, &sc));
    assert!(dn <= TOL, "{label}: the next step after the mixed forward differs by {dn}");
    eprintln!("{label}: mixed = separate, relative |Δ logits| {dl:.1e}, next step {dn:.1e}");
}

/// A mixed forward of the decode rows alone: what `forward` computes, to
/// the bit (the same ops on the same shapes, only reshaped).
fn check_one_group(label: &str, m: &dyn LanguageModel) {
    let mut sep = sets(m, false);
    let want = values(&m.forward(&sep.next, &mut sep.decode, Output::LastLogits).unwrap().unwrap());
    let mut mix = sets(m, false);
    let mut groups = [Group { cache: &mut mix.decode, rows: 3, len: 1, out: Output::LastLogits }];
    let got = values(&m.forward_mixed(&mix.next.reshape(&[1, 3]).unwrap(), &mut groups).unwrap().unwrap());
    assert_eq!(max_abs_diff(&got, &want), 0.0, "{label}: one group");
}

fn family(name: &str) {
    let m = load(&tiny(name), &LoadOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(m.model.supports_mixed(), "{name} has no mixed forward");
    check_one_group(name, m.model.as_ref());
    for two_rows in [false, true] {
        for out in [Output::LastLogits, Output::CacheOnly, Output::AllLogits] {
            check(name, m.model.as_ref(), two_rows, out);
        }
    }
    mlx::memory::clear_cache();
}

#[test]
fn decoder_families() {
    family("llama");
    family("qwen3_moe");
}

#[test]
fn gemma3() {
    family("gemma3_text");
}

#[test]
fn gemma4() {
    family("gemma4_text");
}

#[test]
fn qwen3_5_hybrid() {
    family("qwen3_5");
}

#[test]
fn qwen3_next_hybrid() {
    family("qwen3_next");
}

/// Groups that do not match the packed tokens or the model's layers are an
/// error, not a crash.
#[test]
fn mismatched_groups_are_refused() {
    let m = load(&tiny("qwen3_5"), &LoadOptions::default()).unwrap();
    let m = m.model.as_ref();
    let mut s = sets(m, false);
    let packed = Array::from_i32(&[1, 2, 3], &[1, 3]).unwrap();
    let mut groups = [
        Group { cache: &mut s.decode, rows: 3, len: 1, out: Output::LastLogits },
        Group { cache: &mut s.cohort, rows: 1, len: 7, out: Output::LastLogits },
    ];
    let e = m.forward_mixed(&packed, &mut groups).err().expect("10 tokens of groups for 3 packed ones");
    assert!(e.to_string().contains("mixed forward"), "{e}");
    let mut short = m.new_cache(1);
    short.pop();
    let mut groups = [Group { cache: &mut short, rows: 1, len: 3, out: Output::LastLogits }];
    let e = m.forward_mixed(&packed, &mut groups).err().expect("a cache without its last layer");
    assert!(e.to_string().contains("layers"), "{e}");
}
