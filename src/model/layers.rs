//! Building blocks shared by the architectures: linear layers (dense or
//! affine-quantized), embeddings, RMSNorm and rotary position embeddings.

use crate::cache::Positions;
use crate::error::{Error, Result};
use crate::mlx::{dequantize, fast, quantized_matmul, Array};
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantSpec {
    pub group_size: i32,
    pub bits: i32,
}

pub enum Linear {
    Dense { w: Array, b: Option<Array> },
    Quantized { w: Array, scales: Array, biases: Array, b: Option<Array>, spec: QuantSpec },
}

impl Linear {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let (y, b) = match self {
            Linear::Dense { w, b } => (x.matmul(&w.transpose(&[1, 0])?)?, b),
            Linear::Quantized { w, scales, biases, b, spec } => {
                (quantized_matmul(x, w, scales, biases, true, spec.group_size, spec.bits)?, b)
            }
        };
        match b {
            Some(b) => Ok(y.add(b)?),
            None => Ok(y),
        }
    }

    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            Linear::Dense { w, b } => std::iter::once(w).chain(b.iter()).collect(),
            Linear::Quantized { w, scales, biases, b, .. } => [w, scales, biases].into_iter().chain(b.iter()).collect(),
        }
    }
}

pub enum Embedding {
    Dense { w: Array },
    Quantized { w: Array, scales: Array, biases: Array, spec: QuantSpec },
}

impl Embedding {
    /// Rows for token ids of any shape → `[..., dim]`.
    pub fn forward(&self, ids: &Array) -> Result<Array> {
        match self {
            Embedding::Dense { w } => Ok(w.take(ids, 0)?),
            Embedding::Quantized { w, scales, biases, spec } => Ok(dequantize(
                &w.take(ids, 0)?,
                &scales.take(ids, 0)?,
                &biases.take(ids, 0)?,
                spec.group_size,
                spec.bits,
            )?),
        }
    }

    /// The tied LM head: `x @ table.T`.
    pub fn as_linear(&self, x: &Array) -> Result<Array> {
        match self {
            Embedding::Dense { w } => Ok(x.matmul(&w.transpose(&[1, 0])?)?),
            Embedding::Quantized { w, scales, biases, spec } => {
                Ok(quantized_matmul(x, w, scales, biases, true, spec.group_size, spec.bits)?)
            }
        }
    }

    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            Embedding::Dense { w } => vec![w],
            Embedding::Quantized { w, scales, biases, .. } => vec![w, scales, biases],
        }
    }
}

pub struct RmsNorm {
    pub w: Array,
    pub eps: f32,
}

impl RmsNorm {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        Ok(fast::rms_norm(x, &self.w, self.eps)?)
    }
}

/// Rotary position embedding over the first `dims` features of each head.
pub struct Rope {
    dims: i32,
    traditional: bool,
    base: f32,
    scale: f32,
    freqs: Option<Array>,
}

impl Rope {
    /// Builds RoPE from a HF `rope_scaling` object (None = plain RoPE).
    /// Supported types: default, linear, llama3.
    pub fn new(dims: i32, base: f32, traditional: bool, scaling: Option<&Value>, max_pos: Option<i64>) -> Result<Rope> {
        let plain = Rope { dims, traditional, base, scale: 1.0, freqs: None };
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
                Ok(Rope { freqs: Some(Array::from_f32(&freqs, &[freqs.len() as i32])?), ..plain })
            }
            other => Err(Error::unsupported(format!("rope_scaling type `{other}` is not supported"))),
        }
    }

    /// Rotates `x` `[B, heads, L, head_dim]` for positions starting at `pos`.
    pub fn forward(&self, x: &Array, pos: &Positions) -> Result<Array> {
        let (d, t, s) = (self.dims, self.traditional, self.scale);
        Ok(match (&self.freqs, pos) {
            (Some(f), Positions::Same(o)) => fast::rope_with_freqs(x, d, t, s, *o, f)?,
            (None, Positions::Same(o)) => fast::rope(x, d, t, self.base, s, *o)?,
            (Some(f), Positions::PerRow(o)) => fast::rope_with_freqs_at(x, d, t, s, o, f)?,
            (None, Positions::PerRow(o)) => fast::rope_at(x, d, t, self.base, s, o)?,
        })
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
