//! Sparse mixture-of-experts feed-forward (Qwen3-MoE, Qwen3-Next): a router
//! picks the top-k experts of each token; the experts' gated MLPs are
//! stacked `[experts, out, in]` and run with gather matmuls, so a token only
//! touches the weights of its own experts. Follows mlx-lm's `SwitchGLU` and
//! router step for step (softmax, argpartition order, optional
//! renormalization), since the order of the top-k sum shows in the logits.

use super::layers::{Act, Linear, Mlp, QuantSpec};
use super::weights::Weights;
use crate::error::Result;
use crate::mlx::{gather_mm, gather_qmm, Array};

/// Experts' linear layers stacked along a leading axis.
pub enum SwitchLinear {
    Dense { w: Array },
    Quantized { w: Array, scales: Array, biases: Array, spec: QuantSpec },
}

impl SwitchLinear {
    /// `x` `[..., 1, in]` through the experts `idx` `[..., k]` → `[..., k, 1, out]`.
    fn forward(&self, x: &Array, idx: &Array, sorted: bool) -> Result<Array> {
        Ok(match self {
            SwitchLinear::Dense { w } => gather_mm(x, &w.swapaxes(-1, -2)?, idx, sorted)?,
            SwitchLinear::Quantized { w, scales, biases, spec } => {
                gather_qmm(x, w, scales, biases, idx, true, spec.group_size, spec.bits, sorted)?
            }
        })
    }

    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            SwitchLinear::Dense { w } => vec![w],
            SwitchLinear::Quantized { w, scales, biases, .. } => vec![w, scales, biases],
        }
    }
}

/// The experts' gated MLPs.
pub struct SwitchGlu {
    gate: SwitchLinear,
    up: SwitchLinear,
    down: SwitchLinear,
    act: Act,
}

impl SwitchGlu {
    pub fn load(w: &mut Weights, prefix: &str, experts: i32, dim: i32, hidden: i32, act: Act) -> Result<SwitchGlu> {
        Ok(SwitchGlu {
            gate: w.switch_linear(&format!("{prefix}.gate_proj"), experts, dim, hidden)?,
            up: w.switch_linear(&format!("{prefix}.up_proj"), experts, dim, hidden)?,
            down: w.switch_linear(&format!("{prefix}.down_proj"), experts, hidden, dim)?,
            act,
        })
    }

    /// `x` `[..., dim]`, `indices` `[..., k]` → `[..., k, dim]`.
    pub fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        let shape = indices.shape();
        let k = shape[shape.len() - 1];
        let x = x.expand_dims(-2)?.expand_dims(-2)?;
        // Many tokens: group them by expert so each expert's weights are read
        // once (mlx-lm sorts from 64 (token, expert) pairs on).
        let sorted = indices.size() >= 64;
        let (x, idx, inv) = if sorted {
            let flat = indices.reshape(&[-1])?;
            let order = flat.argsort(0)?;
            let inv = order.argsort(0)?;
            let xs = x.shape();
            let rows = x.reshape(&[-1, xs[xs.len() - 2], xs[xs.len() - 1]])?;
            let x = rows.take(&order.floor_divide(&Array::scalar_i32(k)?)?, 0)?;
            (x, flat.take(&order, 0)?, Some(inv))
        } else {
            (x, indices.share(), None)
        };
        let up = self.up.forward(&x, &idx, sorted)?;
        let gate = self.gate.forward(&x, &idx, sorted)?;
        let h = self.act.apply(&gate)?.multiply(&up)?;
        let y = self.down.forward(&h, &idx, sorted)?;
        let y = match inv {
            Some(inv) => {
                let y = y.take(&inv, 0)?;
                let ys = y.shape();
                let mut s = shape.clone();
                s.extend_from_slice(&ys[1..]);
                y.reshape(&s)?
            }
            None => y,
        };
        Ok(y.squeeze(-2)?)
    }

    pub fn arrays(&self) -> Vec<&Array> {
        [&self.gate, &self.up, &self.down].into_iter().flat_map(SwitchLinear::arrays).collect()
    }
}

/// Router + experts (+ an always-on shared expert behind a sigmoid gate).
pub struct SparseMoe {
    router: Linear,
    experts: SwitchGlu,
    num_experts: i32,
    top_k: i32,
    norm_topk: bool,
    shared: Option<(Mlp, Linear)>,
}

pub struct MoeSpec {
    pub dim: i32,
    pub experts: i32,
    pub top_k: i32,
    pub hidden: i32,
    pub norm_topk: bool,
    /// Hidden size of the shared expert (Qwen3-Next), if any.
    pub shared_hidden: Option<i32>,
}

impl SparseMoe {
    /// `{prefix}.gate` (router), `{prefix}.switch_mlp.*`, and
    /// `{prefix}.shared_expert(_gate)` when there is a shared expert.
    pub fn load(w: &mut Weights, prefix: &str, s: &MoeSpec) -> Result<SparseMoe> {
        let shared = match s.shared_hidden {
            Some(h) => Some((
                Mlp::load(w, &format!("{prefix}.shared_expert"), s.dim, h, Act::Silu)?,
                w.linear(&format!("{prefix}.shared_expert_gate"), s.dim, 1, false)?,
            )),
            None => None,
        };
        Ok(SparseMoe {
            router: w.linear(&format!("{prefix}.gate"), s.dim, s.experts, false)?,
            experts: SwitchGlu::load(w, &format!("{prefix}.switch_mlp"), s.experts, s.dim, s.hidden, Act::Silu)?,
            num_experts: s.experts,
            top_k: s.top_k,
            norm_topk: s.norm_topk,
            shared,
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let gates = self.router.forward(x)?.softmax(-1, true)?;
        let k = self.top_k;
        let part = gates.argpartition(self.num_experts - k, -1)?;
        let e = part.dim(-1);
        let inds = part.slice_axis(-1, e - k, e)?;
        let mut scores = gates.take_along_axis(&inds, -1)?;
        if self.norm_topk {
            scores = scores.divide(&scores.sum(-1, true)?)?;
        }
        let y = self.experts.forward(x, &inds)?;
        let dtype = y.dtype();
        let y = y.multiply(&scores.expand_dims(-1)?)?.sum(-2, false)?;
        let y = if y.dtype() != dtype { y.astype(dtype)? } else { y };
        match &self.shared {
            Some((mlp, gate)) => Ok(y.add(&gate.forward(x)?.sigmoid()?.multiply(&mlp.forward(x)?)?)?),
            None => Ok(y),
        }
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let mut v = self.router.arrays();
        v.extend(self.experts.arrays());
        if let Some((m, g)) = &self.shared {
            v.extend(m.arrays());
            v.extend(g.arrays());
        }
        v
    }
}
