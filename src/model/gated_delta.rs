//! Gated DeltaNet, the linear-attention layer of the Qwen3-Next / Qwen3.5
//! hybrids. Per token: project to q, k, v (through a causal depthwise
//! convolution whose last `kernel - 1` inputs are carried in the cache), z,
//! b, a; L2-normalize q and k; then the gated delta rule on a `[d_v, d_k]`
//! state per value head, in f32:
//!
//!   S ← g·S;  S ← S + k (β (v − S k))ᵀ;  y = S q
//!
//! with decay `g = exp(−exp(A_log) · softplus(a + dt_bias))` and rate
//! `β = sigmoid(b)`; the output is RMS-normalized, gated by `silu(z)` and
//! projected back. Padding positions (left padding of batched rows) are
//! zeroed before the convolution and leave the state unchanged, so a padded
//! row computes exactly what it computes alone.

use super::layers::{LinearGroup, FusedLinear, Linear, RmsNorm};
use super::pass::Pass;
use super::weights::Weights;
use crate::cache::StateCache;
use crate::error::{Error, Result};
use crate::mlx::{conv1d, fast, Array, Dtype};

/// Head counts and sizes of a Gated DeltaNet layer.
#[derive(Debug, Clone, Copy)]
pub struct DeltaSpec {
    pub dim: i32,
    pub k_heads: i32,
    pub v_heads: i32,
    pub k_dim: i32,
    pub v_dim: i32,
    pub kernel: i32,
    pub eps: f32,
}

impl DeltaSpec {
    fn key_dim(&self) -> i32 {
        self.k_heads * self.k_dim
    }
    fn value_dim(&self) -> i32 {
        self.v_heads * self.v_dim
    }
    /// Channels of the convolution: q, k and v.
    fn conv_dim(&self) -> i32 {
        2 * self.key_dim() + self.value_dim()
    }
}

/// Checkpoint layouts of the input projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Qwen3.5: `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`.
    Separate,
    /// Qwen3-Next: `in_proj_qkvz` and `in_proj_ba`, grouped per key head.
    /// Their rows are reordered at load into the separate layout (a pure row
    /// permutation: exact for quantized weights too).
    Grouped,
}

pub struct GatedDeltaNet {
    /// Outputs: qkv (conv input), z, b, a.
    in_proj: LinearGroup,
    conv_w: Array,
    dt_bias: Array,
    a_log: Array,
    norm: RmsNorm,
    out_proj: Linear,
    s: DeltaSpec,
}

/// Row indices taking `in_proj_qkvz` / `in_proj_ba` from the per-key-head
/// grouping to [q | k | v | z] and [b | a].
fn grouped_rows(s: &DeltaSpec) -> (Vec<i32>, Vec<i32>) {
    let (nk, dk, dv) = (s.k_heads, s.k_dim, s.v_dim);
    let r = s.v_heads / nk;
    let group = 2 * dk + 2 * r * dv;
    let mut qkvz = vec![];
    for (from, len) in [(0, dk), (dk, dk), (2 * dk, r * dv), (2 * dk + r * dv, r * dv)] {
        for g in 0..nk {
            qkvz.extend(g * group + from..g * group + from + len);
        }
    }
    let mut ba = vec![];
    for from in [0, r] {
        for g in 0..nk {
            ba.extend(g * 2 * r + from..g * 2 * r + from + r);
        }
    }
    (qkvz, ba)
}

impl GatedDeltaNet {
    pub fn load(w: &mut Weights, prefix: &str, s: DeltaSpec, layout: Layout) -> Result<GatedDeltaNet> {
        if s.k_heads <= 0 || s.v_heads % s.k_heads != 0 || s.kernel < 2 {
            return Err(Error::model(format!(
                "{prefix}: {} value heads are not a multiple of {} key heads (or conv kernel {} < 2)",
                s.v_heads, s.k_heads, s.kernel
            )));
        }
        let (d, cd, vd, hv) = (s.dim, s.conv_dim(), s.value_dim(), s.v_heads);
        let in_proj = match layout {
            Layout::Separate => FusedLinear::new(vec![
                (w.linear(&format!("{prefix}.in_proj_qkv"), d, cd, false)?, cd),
                (w.linear(&format!("{prefix}.in_proj_z"), d, vd, false)?, vd),
                (w.linear(&format!("{prefix}.in_proj_b"), d, hv, false)?, hv),
                (w.linear(&format!("{prefix}.in_proj_a"), d, hv, false)?, hv),
            ])?,
            Layout::Grouped => {
                let (qkvz_rows, ba_rows) = grouped_rows(&s);
                let qkvz = w.linear(&format!("{prefix}.in_proj_qkvz"), d, cd + vd, false)?.take_rows(&qkvz_rows)?;
                let ba = w.linear(&format!("{prefix}.in_proj_ba"), d, 2 * hv, false)?.take_rows(&ba_rows)?;
                FusedLinear::new(vec![(qkvz, cd + vd), (ba, 2 * hv)])?
            }
        };
        let conv_name = format!("{prefix}.conv1d.weight");
        if w.contains(&conv_name) && w.peek_shape(&conv_name) == Some(vec![cd, 1, s.kernel]) {
            return Err(Error::model(format!(
                "`{conv_name}` is in the Hugging Face layout [channels, 1, kernel]: convert the checkpoint with mlx-lm first"
            )));
        }
        Ok(GatedDeltaNet {
            in_proj,
            conv_w: w.take_shaped(&conv_name, &[cd, s.kernel, 1])?,
            dt_bias: w.take_shaped(&format!("{prefix}.dt_bias"), &[hv])?,
            a_log: w.take_shaped(&format!("{prefix}.A_log"), &[hv])?,
            norm: RmsNorm { w: w.take_shaped(&format!("{prefix}.norm.weight"), &[s.v_dim])?, eps: s.eps },
            out_proj: w.linear(&format!("{prefix}.out_proj"), vd, d, false)?,
            s,
        })
    }

    /// The projections' outputs as (qkv, z `[B, S, Hv, Dv]`, b, a).
    fn project(&self, x: &Array) -> Result<(Array, Array, Array, Array)> {
        let s = &self.s;
        let sh = x.shape();
        let (bsz, len) = (sh[0], sh[1]);
        let parts = self.in_proj.forward(x)?;
        let (cd, vd, hv) = (s.conv_dim(), s.value_dim(), s.v_heads);
        let (qkv, z, b, a) = match parts.len() {
            4 => {
                let mut it = parts.into_iter();
                let mut n = || it.next().expect("four parts");
                (n(), n(), n(), n())
            }
            _ => {
                // Grouped layout: [q | k | v | z] and [b | a].
                let (qkvz, ba) = (&parts[0], &parts[1]);
                (
                    qkvz.slice_axis(-1, 0, cd)?,
                    qkvz.slice_axis(-1, cd, cd + vd)?,
                    ba.slice_axis(-1, 0, hv)?,
                    ba.slice_axis(-1, hv, 2 * hv)?,
                )
            }
        };
        Ok((qkv, z.reshape(&[bsz, len, hv, s.v_dim])?, b, a))
    }

    /// Runs through layer `layer`'s `StateCache` of each of the pass's row
    /// sets (with its token mask); the projections, gates and output run on
    /// the whole input at once.
    pub fn forward(&self, x: &Array, pass: &mut Pass, layer: usize) -> Result<Array> {
        let (qkv, z, b, a) = self.project(x)?;
        let beta = b.sigmoid()?;
        let g = decay(&self.a_log, &a, &self.dt_bias)?;
        let y = pass.each(vec![qkv, beta, g], |_, x, cache, ctx| {
            let mut x = x.into_iter();
            let mut next = || x.next().expect("qkv, beta and g");
            self.recur(next(), next(), next(), cache[layer].state_mut()?, ctx.token_mask.as_ref())
        })?;
        // Gated RMSNorm: silu(z) * norm(y), in f32, back to the input dtype.
        let n = self.norm.forward(&y)?;
        let out = z.astype(Dtype::F32)?.silu()?.multiply(&n.astype(Dtype::F32)?)?.astype(y.dtype())?;
        let sh = x.shape();
        self.out_proj.forward(&out.reshape(&[sh[0], sh[1], self.s.value_dim()])?)
    }

    /// The convolution and the gated delta rule of `[B, S, …]` rows after
    /// what `cache` holds (`mask`: their real tokens); `y` is `[B, S, Hv, Dv]`.
    fn recur(&self, qkv: Array, beta: Array, g: Array, cache: &mut StateCache, mask: Option<&Array>) -> Result<Array> {
        let s = &self.s;
        let sh = qkv.shape();
        let (bsz, len) = (sh[0], sh[1]);
        let k1 = s.kernel - 1;
        let conv_state = match cache.conv() {
            Some(c) => c.share(),
            None => Array::zeros(&[bsz, k1, s.conv_dim()], qkv.dtype())?,
        };
        let qkv = match mask {
            Some(m) => Array::select(&m.expand_dims(-1)?, &qkv, &qkv.scalar_like(0.0)?)?,
            None => qkv,
        };
        let conv_in = Array::concatenate(&[&conv_state, &qkv], 1)?;
        let total = conv_in.dim(1);
        let new_conv = conv_in.slice_axis(1, total - k1, total)?.contiguous()?;
        let conv_out = conv1d(&conv_in, &self.conv_w, 1, 0, 1, s.conv_dim())?.silu()?;
        let kd = s.key_dim();
        let heads = |from: i32, to: i32, h: i32, dh: i32| -> Result<Array> {
            Ok(conv_out.slice_axis(-1, from, to)?.reshape(&[bsz, len, h, dh])?)
        };
        let q = heads(0, kd, s.k_heads, s.k_dim)?;
        let k = heads(kd, 2 * kd, s.k_heads, s.k_dim)?;
        let v = heads(2 * kd, s.conv_dim(), s.v_heads, s.v_dim)?;
        // L2 norm of q and k through rms_norm (its eps acts on the mean, so
        // the reference eps 1e-6 is scaled by 1/d); the 1/√d readout scale is
        // folded into q.
        let inv = (s.k_dim as f64).powf(-0.5);
        let eps = (1e-6 * inv * inv) as f32;
        let q = fast::rms_norm_plain(&q, eps)?;
        let q = q.multiply(&q.scalar_like((inv * inv) as f32)?)?;
        let k = fast::rms_norm_plain(&k, eps)?;
        let k = k.multiply(&k.scalar_like(inv as f32)?)?;
        let state = match cache.recurrent() {
            Some(st) => st.share(),
            None => Array::zeros(&[bsz, s.v_heads, s.v_dim, s.k_dim], Dtype::F32)?,
        };
        // The recurrence runs in f32 whatever the activations' dtype (the
        // reference promotes every step to the f32 state); MLX's op does so
        // exactly when given f32 inputs. y returns to the activations' dtype.
        let f32 = |a: &Array| a.astype(Dtype::F32);
        let (y, state) = fast::gated_delta_update(&f32(&q)?, &f32(&k)?, &f32(&v)?, &g, &f32(&beta)?, &state, mask)?;
        let y = if y.dtype() != v.dtype() { y.astype(v.dtype())? } else { y };
        cache.update(new_conv, state, len)?;
        Ok(y)
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let mut v = self.in_proj.arrays();
        v.extend([&self.conv_w, &self.dt_bias, &self.a_log, &self.norm.w]);
        v.extend(self.out_proj.arrays());
        v
    }
}

/// `exp(−exp(A_log) · softplus(a + dt_bias))`, with softplus = logaddexp(x, 0).
fn decay(a_log: &Array, a: &Array, dt_bias: &Array) -> Result<Array> {
    let x = a.add(dt_bias)?;
    let softplus = x.logaddexp(&x.scalar_like(0.0)?)?;
    let rate = a_log.astype(Dtype::F32)?.exp()?.negative()?;
    Ok(rate.multiply(&softplus)?.exp()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouped_rows_are_a_permutation_into_the_separate_layout() {
        let s = DeltaSpec { dim: 8, k_heads: 2, v_heads: 4, k_dim: 3, v_dim: 2, kernel: 4, eps: 1e-6 };
        let (qkvz, ba) = grouped_rows(&s);
        // Per key head: q 3, k 3, v 2×2, z 2×2 → 14 rows per group.
        assert_eq!(&qkvz[..6], &[0, 1, 2, 14, 15, 16], "q of both groups");
        assert_eq!(&qkvz[6..12], &[3, 4, 5, 17, 18, 19], "then k");
        assert_eq!(&qkvz[12..20], &[6, 7, 8, 9, 20, 21, 22, 23], "then v");
        assert_eq!(&qkvz[20..], &[10, 11, 12, 13, 24, 25, 26, 27], "then z");
        let mut sorted = qkvz.clone();
        sorted.sort();
        assert_eq!(sorted, (0..28).collect::<Vec<_>>());
        assert_eq!(ba, vec![0, 1, 4, 5, 2, 3, 6, 7]);
    }
}
