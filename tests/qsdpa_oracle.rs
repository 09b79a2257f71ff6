//! Attention over a quantized KV cache against Python mlx-lm's
//! `quantized_scaled_dot_product_attention` (tests/oracle/qsdpa_reference.py):
//! mlxrt's MLX-op composition must give mlx-lm's output bit for bit, and the
//! fused CPU kernel within 1e-5 * (1 + max |output|) (measured: 1.1e-6).
//! Cases: 4/8 bits, groups 32/64/128, GQA 1..4, L 1/3/7, T 1..300, no,
//! causal, padded bool (a fully masked query row) and additive masks.

mod common;

use common::*;
use mlxrt::mlx::fast::Mask;
use mlxrt::mlx::io::{Meta, TensorFile};
use mlxrt::mlx::{qsdpa_isa_of, quantized_sdpa, quantized_sdpa_ops, Array};
use std::process::Command;

const SCALE: f32 = 0.125;
const TOL: f32 = 1e-5;

#[test]
fn quantized_sdpa_matches_mlx_lm() {
    let dir = repo_root().join("target/oracle");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("qsdpa_reference.safetensors");
    let script = repo_root().join("tests/oracle/qsdpa_reference.py");
    let run = Command::new(python()).arg(&script).arg(&path).output().expect("run python");
    assert!(run.status.success(), "{} failed:\n{}", script.display(), String::from_utf8_lossy(&run.stderr));

    let mut f = TensorFile::load_safetensors(path.to_str().unwrap()).unwrap();
    let Some(Meta::Str(cases)) = f.meta("cases").unwrap() else { panic!("no case list") };
    let mut worst = 0f32;
    let mut n = 0;
    for name in cases.split(',') {
        let mut take = |t: &str| f.take(&format!("{name}.{t}")).unwrap();
        let [q, kw, ks, kb, vw, vs, vb, want] = ["q", "kw", "ks", "kb", "vw", "vs", "vb", "out"].map(&mut take);
        let mask_arr = (name.ends_with("bool") || name.ends_with("additive")).then(|| take("mask"));
        let mask = || match &mask_arr {
            Some(m) => Mask::Array(m),
            None if name.ends_with("causal") => Mask::Causal,
            None => Mask::None,
        };
        let bits = if name.starts_with("b4") { 4 } else { 8 };
        let group = [32, 64, 128].into_iter().find(|g| name.contains(&format!("g{g}r"))).unwrap();
        let (k, v) = ([&kw, &ks, &kb], [&vw, &vs, &vb]);

        let ops = quantized_sdpa_ops(&q, k, v, SCALE, mask(), group, bits).unwrap();
        let want_v = want.to_vec_f32().unwrap();
        assert_eq!(ops.to_vec_f32().unwrap(), want_v, "{name}: the op composition differs from mlx-lm");

        let fused = quantized_sdpa(&q, k, v, SCALE, mask(), group, bits).unwrap();
        assert!(qsdpa_isa_of(&fused).is_some(), "{name}: fused kernel not used");
        let top = want_v.iter().fold(0f32, |m, x| m.max(x.abs()));
        let err = max_abs_diff(&fused, &want_v) / (1.0 + top);
        assert!(err <= TOL, "{name}: fused vs mlx-lm {err:e}");
        worst = worst.max(err);
        n += 1;
    }
    assert_eq!(n, 36);
    eprintln!("fused vs mlx-lm over {n} cases: worst |d| / (1 + max|out|) = {worst:e}; ops bit-identical");
}

fn max_abs_diff(a: &Array, b: &[f32]) -> f32 {
    let a = a.to_vec_f32().unwrap();
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| if x.is_finite() { (x - y).abs() } else { f32::INFINITY }).fold(0.0, f32::max)
}
