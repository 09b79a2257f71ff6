//! Building blocks shared by the architectures: linear layers (dense or
//! affine-quantized), embeddings, RMSNorm, rotary position embeddings, the
//! gated MLP and the output head.

use crate::cache::Positions;
use crate::error::{Error, Result};
use crate::mlx::{
    dequantize, fast, fast_quantized_matmul, fast_quantized_matmul_int8, fast_quantized_matmul_packed, fast_swiglu, fast_swiglu_packed, fused_add_rms_norm, fused_heads, fused_rms_norm, fused_rope,
    fused_rope_at, pack_panels, quantized_matmul, rope_inv_freqs, rope_inv_freqs_of, unpack_panels, Array, Dtype, HeadPart, HeadRope,
    PACKED_COLS,
};
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantSpec {
    pub group_size: i32,
    pub bits: i32,
}

/// Which quantized-matmul kernels the model uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kernels {
    /// mlxrt's CPU kernel on the CPU device (see docs/cpu-kernels.md), MLX's
    /// own elsewhere.
    #[default]
    Auto,
    /// MLX's stock kernels everywhere, and dense projections unstacked: what
    /// mlx-lm computes, bit for bit (for exact comparisons with it). RMSNorm
    /// and RoPE keep mlxrt's one-node primitives, which give MLX's bits.
    Stock,
    /// `Auto` with int8 activations in the quantized matmuls on the CPU
    /// (x quantized per block of 32, integer dot products; see
    /// docs/cpu-kernels.md). Opt-in: x's rounding moves logits (by up to
    /// ~0.9 on SmolLM2-135M's parity prompts) and changes greedy tokens
    /// against mlx-lm.
    Int8,
}

impl Kernels {
    /// The setting for everything but the quantized matmuls (`Int8` is
    /// `Auto` there).
    pub fn except_qmm(self) -> Kernels {
        match self {
            Kernels::Int8 => Kernels::Auto,
            k => k,
        }
    }
}

/// The biases of a symmetric format (GGUF's Q4_0 and Q8_0): `-2^(bits-1)`
/// times each scale, exact in the scales' dtype.
pub fn implied_biases(scales: &Array, bits: i32) -> Result<Array> {
    Ok(scales.multiply(&scales.scalar_like(-((1i32 << (bits - 1)) as f32))?)?)
}

/// A quantized layer's biases: stored, or implied by its scales (None).
fn biases_of(biases: Option<&Array>, scales: &Array, bits: i32) -> Result<Array> {
    match biases {
        Some(b) => Ok(b.share()),
        None => implied_biases(scales, bits),
    }
}

/// `x @ dequantize(w).T` with the chosen kernels (`biases` None: implied
/// by the scales, see `implied_biases`).
fn qmm(x: &Array, w: &Array, scales: &Array, biases: Option<&Array>, spec: QuantSpec, kernels: Kernels) -> Result<Array> {
    Ok(match kernels {
        Kernels::Auto => fast_quantized_matmul(x, w, scales, biases, spec.group_size, spec.bits)?,
        Kernels::Int8 => fast_quantized_matmul_int8(x, w, scales, biases, spec.group_size, spec.bits)?,
        Kernels::Stock => {
            quantized_matmul(x, w, scales, &biases_of(biases, scales, spec.bits)?, true, spec.group_size, spec.bits)?
        }
    })
}

/// `silu(gate) * up` with the chosen kernels: mlxrt's one-node SwiGLU on the
/// CPU (bit-identical to MLX's ops there), MLX's three ops otherwise.
pub fn swiglu(gate: &Array, up: &Array, kernels: Kernels) -> Result<Array> {
    Ok(match kernels.except_qmm() {
        Kernels::Stock => gate.silu()?.multiply(up)?,
        _ => fast_swiglu(gate, up)?,
    })
}

/// [`swiglu`] of gate/up projections that share an input: one SwiGLU node on
/// the stacked output when they are fused, with no slicing nodes.
pub fn gated_mlp_hidden(gate_up: &LinearGroup, x: &Array, kernels: Kernels) -> Result<Array> {
    if let (LinearGroup::Fused(f), Kernels::Auto) = (gate_up, kernels.except_qmm()) {
        if let [g, u] = f.sizes[..] {
            if g == u {
                return Ok(fast_swiglu_packed(&f.lin.forward(x)?)?);
            }
        }
    }
    let gu = gate_up.forward(x)?;
    match &gu[..] {
        [gate, up] => swiglu(gate, up, kernels),
        _ => Err(Error::internal("a gated MLP needs exactly two projections")),
    }
}

pub enum Linear {
    /// `kernels` only decides stacking (see `FusedLinear::new`).
    Dense { w: Array, b: Option<Array>, kernels: Kernels },
    /// `biases` None: a symmetric format's, implied by the scales. `packed`:
    /// `w`, `scales` and `biases` in `mlx::pack_panels`'s layout (4-bit layers
    /// under `Kernels::Int8` where the CPU runs packed panels; see
    /// `Weights::linear`).
    Quantized { w: Array, scales: Array, biases: Option<Array>, b: Option<Array>, spec: QuantSpec, kernels: Kernels, packed: bool },
}

impl Linear {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let (y, b) = match self {
            // With a bias, mlx's nn.Linear uses addmm (one rounding).
            Linear::Dense { w, b: Some(b), .. } => return Ok(x.addmm(&w.transpose(&[1, 0])?, b)?),
            Linear::Dense { w, b, .. } => (x.matmul(&w.transpose(&[1, 0])?)?, b),
            Linear::Quantized { w, scales, biases, b, spec, packed: true, .. } => {
                (fast_quantized_matmul_packed(x, w, scales, biases.as_ref(), spec.group_size)?, b)
            }
            Linear::Quantized { w, scales, biases, b, spec, kernels, .. } => (qmm(x, w, scales, biases.as_ref(), *spec, *kernels)?, b),
        };
        match b {
            Some(b) => Ok(y.add(b)?),
            None => Ok(y),
        }
    }

    /// The layer restricted to (and reordered by) output rows `rows`.
    pub fn take_rows(self, rows: &[i32]) -> Result<Linear> {
        let idx = Array::from_i32(rows, &[rows.len() as i32])?;
        let t = |a: Array| -> Result<Array> { Ok(a.take(&idx, 0)?) };
        Ok(match self {
            Linear::Dense { w, b, kernels } => Linear::Dense { w: t(w)?, b: b.map(t).transpose()?, kernels },
            Linear::Quantized { w, scales, biases, b, spec, kernels, packed } => {
                // A packed layer's rows are taken in MLX's layout, then packed
                // again if they still make whole panels (load time only).
                let (w, scales, biases) = if packed { unpack_panels(&w, &scales, biases.as_ref())? } else { (w, scales, biases) };
                let (w, scales, biases) = (t(w)?, t(scales)?, biases.map(t).transpose()?);
                let repack = packed && rows.len() as i32 % PACKED_COLS == 0;
                let (w, scales, biases) = if repack { pack_panels(&w, &scales, biases.as_ref(), spec.bits)? } else { (w, scales, biases) };
                Linear::Quantized { w, scales, biases, b: b.map(t).transpose()?, spec, kernels, packed: repack }
            }
        })
    }

    fn weight(&self) -> &Array {
        match self {
            Linear::Dense { w, .. } | Linear::Quantized { w, .. } => w,
        }
    }

    /// Packed weight, scales and (stored) biases of a quantized layer.
    fn quantized(&self) -> Option<(&Array, &Array, Option<&Array>)> {
        match self {
            Linear::Quantized { w, scales, biases, .. } => Some((w, scales, biases.as_ref())),
            Linear::Dense { .. } => None,
        }
    }

    fn bias(&self) -> Option<&Array> {
        match self {
            Linear::Dense { b, .. } | Linear::Quantized { b, .. } => b.as_ref(),
        }
    }

    fn stackable_with(&self, other: &Linear) -> bool {
        let same_bias = self.bias().is_some() == other.bias().is_some();
        let same_dtype = self.weight().dtype() == other.weight().dtype();
        match (self, other) {
            // MLX's quantized matmul computes each output row on its own, so
            // a stack gives the parts' exact results; a BLAS `sgemm` (OpenBLAS)
            // may round a stacked product differently for some shapes, so
            // stock kernels keep dense parts apart, as mlx-lm runs them.
            (Linear::Dense { kernels: ka, .. }, Linear::Dense { kernels: kb, .. }) => {
                ka.except_qmm() == Kernels::Auto && kb.except_qmm() == Kernels::Auto && same_bias && same_dtype
            }
            (
                Linear::Quantized { spec: a, kernels: ka, scales: sa, biases: ba, packed: pa, .. },
                Linear::Quantized { spec: b, kernels: kb, scales: sb, biases: bb, packed: pb, .. },
            ) => same_bias && a == b && ka == kb && sa.dtype() == sb.dtype() && ba.is_some() == bb.is_some() && pa == pb,
            _ => false,
        }
    }

    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            Linear::Dense { w, b, .. } => std::iter::once(w).chain(b.iter()).collect(),
            Linear::Quantized { w, scales, biases, b, .. } => [w, scales].into_iter().chain(biases.iter()).chain(b.iter()).collect(),
        }
    }
}

/// Several linear layers with the same input, run as one matrix product
/// (their output rows stacked at load) and split after: one kernel call
/// instead of several, with the same result (see `Linear::stackable_with`).
pub struct FusedLinear {
    lin: Linear,
    /// Output size of each part.
    sizes: Vec<i32>,
}

impl FusedLinear {
    /// Stacks `parts` when they are alike (all dense under `Kernels::Auto`,
    /// or all quantized the same way, biases on all or none, quantization
    /// biases stored on all or none); otherwise
    /// keeps them apart.
    pub fn new(parts: Vec<(Linear, i32)>) -> Result<LinearGroup> {
        let same = parts.windows(2).all(|w| w[0].0.stackable_with(&w[1].0));
        if !same {
            return Ok(LinearGroup::Separate(parts.into_iter().map(|(l, _)| l).collect()));
        }
        let sizes = parts.iter().map(|(_, n)| *n).collect();
        let lins: Vec<Linear> = parts.into_iter().map(|(l, _)| l).collect();
        let cat = |f: &dyn Fn(&Linear) -> Option<&Array>| -> Result<Option<Array>> {
            let v: Option<Vec<&Array>> = lins.iter().map(f).collect();
            v.map(|v| Array::concatenate(&v, 0)).transpose().map_err(Into::into)
        };
        let b = cat(&|l| l.bias())?;
        let lin = match &lins[0] {
            Linear::Dense { kernels, .. } => {
                Linear::Dense { w: cat(&|l| Some(l.weight()))?.expect("all parts have weights"), b, kernels: *kernels }
            }
            // Packed parts stack the same way: whole panels along axis 0.
            Linear::Quantized { spec, kernels, packed, .. } => Linear::Quantized {
                packed: *packed,
                w: cat(&|l| l.quantized().map(|q| q.0))?.expect("stackable parts are quantized"),
                scales: cat(&|l| l.quantized().map(|q| q.1))?.expect("stackable parts are quantized"),
                biases: cat(&|l| l.quantized().and_then(|q| q.2))?,
                b,
                spec: *spec,
                kernels: *kernels,
            },
        };
        Ok(LinearGroup::Fused(FusedLinear { lin, sizes }))
    }

    pub fn forward(&self, x: &Array) -> Result<Vec<Array>> {
        let y = self.lin.forward(x)?;
        let mut out = Vec::with_capacity(self.sizes.len());
        let mut at = 0;
        for n in &self.sizes {
            out.push(y.slice_axis(-1, at, at + n)?);
            at += n;
        }
        Ok(out)
    }

    pub fn arrays(&self) -> Vec<&Array> {
        self.lin.arrays()
    }
}

/// Linear layers applied to the same input (q/k/v, gate/up, ...): one
/// stacked matmul split after when they are alike, else each on its own.
pub enum LinearGroup {
    Fused(FusedLinear),
    Separate(Vec<Linear>),
}

impl LinearGroup {
    /// The stacked output, unsplit (None when the layers run separately).
    pub fn forward_packed(&self, x: &Array) -> Result<Option<Array>> {
        match self {
            LinearGroup::Fused(f) => Ok(Some(f.lin.forward(x)?)),
            LinearGroup::Separate(_) => Ok(None),
        }
    }

    pub fn forward(&self, x: &Array) -> Result<Vec<Array>> {
        match self {
            LinearGroup::Fused(f) => f.forward(x),
            LinearGroup::Separate(v) => v.iter().map(|l| l.forward(x)).collect(),
        }
    }

    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            LinearGroup::Fused(f) => f.arrays(),
            LinearGroup::Separate(v) => v.iter().flat_map(Linear::arrays).collect(),
        }
    }
}

pub enum Embedding {
    Dense { w: Array },
    /// `rows`: the dtype looked-up rows' scales and biases are cast to
    /// before dequantizing (f32 on the CPU when the table keeps f16 scales
    /// for mlxrt's matmul), None = as stored. `biases` None: implied by the
    /// scales (a symmetric format).
    Quantized { w: Array, scales: Array, biases: Option<Array>, spec: QuantSpec, kernels: Kernels, rows: Option<Dtype> },
}

impl Embedding {
    /// Rows for token ids of any shape → `[..., dim]`.
    pub fn forward(&self, ids: &Array) -> Result<Array> {
        match self {
            Embedding::Dense { w } => Ok(w.take(ids, 0)?),
            Embedding::Quantized { w, scales, biases, spec, rows, .. } => {
                let part = |a: &Array| -> Result<Array> {
                    let a = a.take(ids, 0)?;
                    Ok(match rows {
                        Some(d) => a.astype(*d)?,
                        None => a,
                    })
                };
                let s = part(scales)?;
                let b = match biases {
                    Some(b) => part(b)?,
                    None => implied_biases(&s, spec.bits)?,
                };
                Ok(dequantize(&w.take(ids, 0)?, &s, &b, spec.group_size, spec.bits)?)
            }
        }
    }

    /// The tied LM head: `x @ table.T`.
    pub fn as_linear(&self, x: &Array) -> Result<Array> {
        match self {
            Embedding::Dense { w } => Ok(x.matmul(&w.transpose(&[1, 0])?)?),
            Embedding::Quantized { w, scales, biases, spec, kernels, .. } => qmm(x, w, scales, biases.as_ref(), *spec, *kernels),
        }
    }

    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            Embedding::Dense { w } => vec![w],
            Embedding::Quantized { w, scales, biases, .. } => [w, scales].into_iter().chain(biases.iter()).collect(),
        }
    }
}

pub struct RmsNorm {
    pub w: Array,
    pub eps: f32,
}

impl RmsNorm {
    /// One mlxrt node on the CPU for f32 (bit-identical to MLX's ops, so
    /// under either `Kernels` setting), `fast::rms_norm` elsewhere.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        Ok(fused_rms_norm(x, &self.w, self.eps)?)
    }

    /// The residual sum `x + y` and its norm (one node on the CPU).
    pub fn add_forward(&self, x: &Array, y: &Array) -> Result<(Array, Array)> {
        Ok(fused_add_rms_norm(x, y, &self.w, self.eps)?)
    }

    /// Gemma's `(1 + w)` scaling: the offset is added once at load, in the
    /// weight's dtype, as mlx-lm adds it at every call.
    pub fn offset(w: Array, eps: f32) -> Result<RmsNorm> {
        let w = w.add(&w.scalar_like(1.0)?)?;
        Ok(RmsNorm { w, eps })
    }
}

/// LayerNorm with a weight and a bias.
pub struct LayerNorm {
    pub w: Array,
    pub b: Array,
    eps: f32,
}

impl LayerNorm {
    pub fn new(w: Array, b: Array, eps: f32) -> LayerNorm {
        LayerNorm { w, b, eps }
    }

    pub fn load(w: &mut super::weights::Weights, prefix: &str, n: i32, eps: f32) -> Result<LayerNorm> {
        Ok(LayerNorm {
            w: w.take_shaped(&format!("{prefix}.weight"), &[n])?,
            b: w.take_shaped(&format!("{prefix}.bias"), &[n])?,
            eps,
        })
    }

    /// `(x - mean) / sqrt(var + eps) * w + b` over the last axis.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let mean = x.mean(-1, true)?;
        let d = x.subtract(&mean)?;
        let var = d.square()?.mean(-1, true)?;
        let y = d.multiply(&var.add_scalar(self.eps)?.rsqrt()?)?;
        Ok(y.multiply(&self.w)?.add(&self.b)?)
    }
}

/// The activation of a gated MLP's gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// `x * sigmoid(x)` (SwiGLU).
    Silu,
    /// GELU, tanh approximation (GeGLU): `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
    GeluTanh,
}

impl Act {
    pub fn apply(self, x: &Array) -> Result<Array> {
        match self {
            Act::Silu => Ok(x.silu()?),
            Act::GeluTanh => gelu_tanh(x),
        }
    }
}

/// mlx's `nn.gelu_approx`, op for op.
pub fn gelu_tanh(x: &Array) -> Result<Array> {
    let c = |v: f32| x.scalar_like(v);
    let cube = x.power(&c(3.0)?)?;
    let inner = x.add(&cube.multiply(&c(0.044715)?)?)?.multiply(&c((2.0 / std::f32::consts::PI).sqrt())?)?;
    let t = inner.tanh()?.add(&c(1.0)?)?;
    Ok(c(0.5)?.multiply(x)?.multiply(&t)?)
}

/// mlx's `nn.gelu` (the exact GELU), op for op: `x (1 + erf(x / √2)) / 2`.
pub fn gelu(x: &Array) -> Result<Array> {
    let c = |v: f32| x.scalar_like(v);
    let e = x.divide(&c(std::f32::consts::SQRT_2)?)?.erf()?;
    Ok(x.multiply(&e.add(&c(1.0)?)?)?.divide(&c(2.0)?)?)
}

/// `down(act(gate(x)) * up(x))`, gate and up fused when alike.
pub struct Mlp {
    pub gate_up: LinearGroup,
    pub down: Linear,
    pub act: Act,
    /// Auto: SiLU gates use mlxrt's one-node SwiGLU on the CPU.
    pub kernels: Kernels,
}

impl Mlp {
    pub fn load(w: &mut super::weights::Weights, prefix: &str, dim: i32, hidden: i32, act: Act) -> Result<Mlp> {
        Ok(Mlp {
            gate_up: FusedLinear::new(vec![
                (w.linear(&format!("{prefix}.gate_proj"), dim, hidden, false)?, hidden),
                (w.linear(&format!("{prefix}.up_proj"), dim, hidden, false)?, hidden),
            ])?,
            down: w.linear(&format!("{prefix}.down_proj"), hidden, dim, false)?,
            act,
            kernels: w.kernels(),
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let h = match self.act {
            Act::Silu => gated_mlp_hidden(&self.gate_up, x, self.kernels)?,
            act => {
                let gu = self.gate_up.forward(x)?;
                act.apply(&gu[0])?.multiply(&gu[1])?
            }
        };
        self.down.forward(&h)
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let mut v = self.gate_up.arrays();
        v.extend(self.down.arrays());
        v
    }
}

/// The output projection: its own matrix, or the embedding table (tied).
pub enum Head {
    Tied,
    Linear(Linear),
}

impl Head {
    /// `lm_head` when the checkpoint has it (or the config unties it), else
    /// tied; a tied model drops an `lm_head` the checkpoint carries anyway
    /// (as mlx-lm does).
    pub fn load(w: &mut super::weights::Weights, name: &str, tie: Option<bool>, dim: i32, vocab: i32) -> Result<Head> {
        let tie = tie.unwrap_or(!w.contains(&format!("{name}.weight")));
        if tie {
            w.discard(name);
            return Ok(Head::Tied);
        }
        Ok(Head::Linear(w.linear(name, dim, vocab, false)?))
    }

    pub fn forward(&self, h: &Array, embed: &Embedding) -> Result<Array> {
        match self {
            Head::Tied => embed.as_linear(h),
            Head::Linear(l) => l.forward(h),
        }
    }

    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            Head::Tied => vec![],
            Head::Linear(l) => l.arrays(),
        }
    }
}

/// The hidden states the output needs: all positions, only the last one, or
/// none (prefill chunks that only fill the cache).
pub fn output_positions(h: Array, out: super::Output) -> Result<Option<Array>> {
    Ok(match out {
        super::Output::CacheOnly => None,
        super::Output::AllLogits => Some(h),
        super::Output::LastLogits => {
            let l = h.dim(1);
            Some(h.slice_axis(1, l - 1, l)?)
        }
    })
}

/// Rotary position embedding over the first `dims` features of each head.
pub struct Rope {
    dims: i32,
    traditional: bool,
    base: f32,
    scale: f32,
    freqs: Option<Array>,
    /// The inverse frequencies MLX derives from `base` or `freqs` at every
    /// call, computed once (by MLX's ops) for mlxrt's one-node RoPE.
    inv_freqs: Array,
    /// Multimodal RoPE: which of the (t, h, w) positions each frequency
    /// takes (`[dims / 2]` int32), for `Positions::Sections`.
    sections: Option<Array>,
}

impl Rope {
    /// Builds RoPE from a HF `rope_scaling` object (None = plain RoPE).
    /// Supported types: default, linear, llama3.
    pub fn new(dims: i32, base: f32, traditional: bool, scaling: Option<&Value>, max_pos: Option<i64>) -> Result<Rope> {
        let plain = Rope::with(dims, traditional, base, 1.0, None)?;
        let Some(cfg) = scaling.filter(|v| !v.is_null()) else { return Ok(plain) };
        let kind = cfg
            .get("type")
            .or_else(|| cfg.get("rope_type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        let num = |k: &str| cfg.get(k).and_then(Value::as_f64);
        match kind {
            "default" => Ok(plain),
            "linear" => {
                let f = num("factor").ok_or_else(|| Error::model("rope_scaling linear needs `factor`"))?;
                Ok(Rope { scale: (1.0 / f) as f32, ..plain })
            }
            "llama3" => {
                let factor = num("factor").ok_or_else(|| Error::model("rope_scaling llama3 needs `factor`"))?;
                let low = num("low_freq_factor").unwrap_or(1.0);
                let high = num("high_freq_factor").unwrap_or(4.0);
                let old_ctx = num("original_max_position_embeddings").unwrap_or(8192.0);
                let _ = max_pos;
                let freqs = llama3_freqs(dims, base as f64, factor, low, high, old_ctx);
                Rope::with(dims, traditional, base, 1.0, Some(Array::from_f32(&freqs, &[freqs.len() as i32])?))
            }
            other => Err(Error::unsupported(format!("rope_scaling type `{other}` is not supported"))),
        }
    }

    /// Gemma 4's "proportional" RoPE: all `dims` features take part, the
    /// first `rotated` with frequencies `factor * base^(i / dims)`, the rest
    /// with an infinite period (left as they are).
    pub fn proportional(dims: i32, rotated: i32, base: f32, factor: f32, traditional: bool) -> Result<Rope> {
        let mut f: Vec<f32> = (0..rotated).step_by(2).map(|i| factor * base.powf(i as f32 / dims as f32)).collect();
        f.resize((dims / 2) as usize, f32::INFINITY);
        Rope::with(dims, traditional, base, 1.0, Some(Array::from_f32(&f, &[f.len() as i32])?))
    }

    fn with(dims: i32, traditional: bool, base: f32, scale: f32, freqs: Option<Array>) -> Result<Rope> {
        let inv_freqs = match &freqs {
            Some(f) => rope_inv_freqs_of(f)?,
            None => rope_inv_freqs(dims, base)?,
        };
        inv_freqs.eval()?;
        Ok(Rope { dims, traditional, base, scale, freqs, inv_freqs, sections: None })
    }

    /// Qwen3-VL's interleaved multimodal RoPE over `section` = (t, h, w)
    /// frequency counts: frequency `i` takes the h position when `i % 3 == 1`
    /// and `i < 3 h`, the w position when `i % 3 == 2` and `i < 3 w`, else
    /// the t position (mlx-vlm's interleaved selector). With equal positions
    /// it is this RoPE.
    pub fn with_sections(mut self, section: [i32; 3]) -> Result<Rope> {
        let n = (self.dims / 2) as usize;
        if self.traditional || section.iter().sum::<i32>() as usize != n {
            return Err(Error::model(format!("mrope_section {section:?} does not fit a half-split RoPE of {} dims", self.dims)));
        }
        let mut sel = vec![0i32; n];
        for (axis, offset) in [(1usize, 1usize), (2, 2)] {
            for i in (offset..(section[axis] as usize * 3).min(n)).step_by(3) {
                sel[i] = axis as i32;
            }
        }
        self.sections = Some(Array::from_i32(&sel, &[n as i32])?);
        Ok(self)
    }

    /// Rotates `x` `[B, heads, L, head_dim]` for positions starting at `pos`.
    pub fn forward(&self, x: &Array, pos: &Positions) -> Result<Array> {
        let (d, t, s) = (self.dims, self.traditional, self.scale);
        if let Positions::Sections(p) = pos {
            return self.forward_sections(x, p);
        }
        // One mlxrt node on the CPU for f32 (bit-identical to MLX's ops).
        let fused = match pos {
            Positions::Same(o) => fused_rope(x, d, t, s, *o, &self.inv_freqs)?,
            Positions::PerRow(o) => fused_rope_at(x, d, t, s, o, &self.inv_freqs)?,
            Positions::Sections(_) => unreachable!("handled above"),
        };
        if let Some(y) = fused {
            return Ok(y);
        }
        Ok(match (&self.freqs, pos) {
            (Some(f), Positions::Same(o)) => fast::rope_with_freqs(x, d, t, s, *o, f)?,
            (None, Positions::Same(o)) => fast::rope(x, d, t, self.base, s, *o)?,
            (Some(f), Positions::PerRow(o)) => fast::rope_with_freqs_at(x, d, t, s, o, f)?,
            (None, Positions::PerRow(o)) => fast::rope_at(x, d, t, self.base, s, o)?,
            (_, Positions::Sections(_)) => unreachable!("handled above"),
        })
    }

    /// The parts of a packed projection `x` (`[B, L, C]`) as `[B, heads, L,
    /// head_dim]`, normed per head by `norms` (of the first and second part)
    /// and rotated where a part says so, for positions `pos`: one mlxrt node
    /// (bit-identical to the ops), None where it does not apply.
    pub fn heads(&self, x: &Array, parts: &[HeadPart], head_dim: i32, pos: &Positions, norms: [Option<&RmsNorm>; 2]) -> Result<Option<Vec<Array>>> {
        let start = match pos {
            Positions::Same(o) => Ok(*o),
            Positions::PerRow(o) => Err(o),
            Positions::Sections(_) => return Ok(None),
        };
        let eps = match norms {
            [Some(a), Some(b)] if a.eps != b.eps => return Ok(None),
            [Some(n), _] | [_, Some(n)] => n.eps,
            [None, None] => 0.0,
        };
        let rope = HeadRope { dims: self.dims, traditional: self.traditional, scale: self.scale, start, inv_freqs: &self.inv_freqs };
        Ok(fused_heads(x, parts, head_dim, &rope, norms.map(|n| n.map(|n| &n.w)), eps)?)
    }

    /// Multimodal RoPE at `[3, B, L]` positions, as mlx-vlm computes it:
    /// angles `pos[section(i)] * inv_freq[i]` in f32, `cos`/`sin` of them
    /// doubled over the head (half-split), `x cos + rotate_half(x) sin`.
    fn forward_sections(&self, x: &Array, pos: &Array) -> Result<Array> {
        let sel = self.sections.as_ref().ok_or_else(|| Error::internal("multimodal positions for a RoPE without sections"))?;
        // [F, B, L] -> [B, L, F]
        let p = pos.take(sel, 0)?.transpose(&[1, 2, 0])?.astype(Dtype::F32)?;
        let f = p.multiply(&self.inv_freqs)?;
        let emb = Array::concatenate(&[&f, &f], -1)?.expand_dims(1)?;
        let (cos, sin) = (emb.cos()?.astype(x.dtype())?, emb.sin()?.astype(x.dtype())?);
        let (hd, d) = (x.dim(-1), self.dims);
        let rot = if d < hd { x.slice_axis(-1, 0, d)? } else { x.share() };
        let (a, b) = (rot.slice_axis(-1, 0, d / 2)?, rot.slice_axis(-1, d / 2, d)?);
        let half = Array::concatenate(&[&b.negative()?, &a], -1)?;
        let y = rot.multiply(&cos)?.add(&half.multiply(&sin)?)?;
        if d < hd {
            return Ok(Array::concatenate(&[&y, &x.slice_axis(-1, d, hd)?], -1)?);
        }
        Ok(y)
    }
}

/// Llama 3.1 frequency smoothing: long wavelengths are stretched by `factor`,
/// short ones kept, the band between interpolated.
fn llama3_freqs(dims: i32, base: f64, factor: f64, low: f64, high: f64, old_ctx: f64) -> Vec<f32> {
    let low_wavelen = old_ctx / low;
    let high_wavelen = old_ctx / high;
    (0..dims)
        .step_by(2)
        .map(|i| {
            let f = base.powf(i as f64 / dims as f64);
            let wavelen = 2.0 * std::f64::consts::PI * f;
            let f = if wavelen > low_wavelen { f * factor } else { f };
            if wavelen > high_wavelen && wavelen < low_wavelen {
                let smooth = (old_ctx / wavelen - low) / (high - low);
                (f / ((1.0 - smooth) / factor + smooth)) as f32
            } else {
                f as f32
            }
        })
        .collect()
}
