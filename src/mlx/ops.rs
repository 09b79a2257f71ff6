//! Operations on `Array`, one method per MLX op. All are lazy: they build graph
//! nodes; nothing runs until `eval`/`async_eval` or a read.

use super::array::{wrap, ArrVec, Array, Dtype, Result};
use super::sys::ffi;

macro_rules! binary {
    ($($name:ident),*) => {$(
        pub fn $name(&self, other: &Array) -> Result<Array> {
            wrap(ffi::$name(self.raw(), other.raw()))
        }
    )*};
}

macro_rules! unary {
    ($($name:ident),*) => {$(
        pub fn $name(&self) -> Result<Array> {
            wrap(ffi::unary(self.raw(), stringify!($name)))
        }
    )*};
}

impl Array {
    binary!(add, subtract, multiply, divide, maximum, minimum, power, greater, greater_equal,
            less, equal, logical_and, logical_or, matmul, logaddexp, floor_divide);
    unary!(exp, log, sigmoid, tanh, erf, sqrt, rsqrt, square, negative, abs, logical_not, silu);

    /// `where(cond, self, other)` elementwise.
    pub fn select(cond: &Array, a: &Array, b: &Array) -> Result<Array> {
        wrap(ffi::where_(cond.raw(), a.raw(), b.raw()))
    }

    pub fn add_scalar(&self, v: f32) -> Result<Array> {
        self.add(&Array::scalar_f32(v)?)
    }
    pub fn mul_scalar(&self, v: f32) -> Result<Array> {
        self.multiply(&Array::scalar_f32(v)?)
    }
    /// `c + self @ b` in one op (one rounding), as `mx.addmm` / `nn.Linear`.
    pub fn addmm(&self, b: &Array, c: &Array) -> Result<Array> {
        wrap(ffi::addmm(c.raw(), self.raw(), b.raw()))
    }
    /// Whether every element is nonzero (evaluates; true when empty).
    pub fn all(&self) -> Result<bool> {
        if self.size() == 0 {
            return Ok(true);
        }
        Ok(self.reshape(&[-1])?.astype(Dtype::I32)?.min(0, false)?.item_i32()? != 0)
    }
    /// A scalar of this array's dtype (like a Python number in MLX, which
    /// never promotes the array it meets).
    pub fn scalar_like(&self, v: f32) -> Result<Array> {
        let s = Array::scalar_f32(v)?;
        if self.dtype() == s.dtype() || !self.dtype().is_float() {
            Ok(s)
        } else {
            s.astype(self.dtype())
        }
    }

    pub fn reshape(&self, shape: &[i32]) -> Result<Array> {
        wrap(ffi::reshape(self.raw(), shape))
    }
    pub fn transpose(&self, axes: &[i32]) -> Result<Array> {
        wrap(ffi::transpose(self.raw(), axes))
    }
    pub fn swapaxes(&self, a: i32, b: i32) -> Result<Array> {
        wrap(ffi::swapaxes(self.raw(), a, b))
    }
    pub fn expand_dims(&self, axis: i32) -> Result<Array> {
        wrap(ffi::expand_dims(self.raw(), axis))
    }
    pub fn squeeze(&self, axis: i32) -> Result<Array> {
        wrap(ffi::squeeze(self.raw(), axis))
    }
    pub fn broadcast_to(&self, shape: &[i32]) -> Result<Array> {
        wrap(ffi::broadcast_to(self.raw(), shape))
    }
    pub fn astype(&self, dtype: Dtype) -> Result<Array> {
        wrap(ffi::astype(self.raw(), dtype as u8))
    }
    pub fn contiguous(&self) -> Result<Array> {
        wrap(ffi::contiguous(self.raw()))
    }
    /// `self[start:stop:strides]` over every axis.
    pub fn slice(&self, start: &[i32], stop: &[i32], strides: &[i32]) -> Result<Array> {
        wrap(ffi::slice(self.raw(), start, stop, strides))
    }
    /// `self[start..stop]` on one axis, other axes whole.
    pub fn slice_axis(&self, axis: i32, start: i32, stop: i32) -> Result<Array> {
        let shape = self.shape();
        let n = shape.len();
        let ax = if axis < 0 { n as i32 + axis } else { axis } as usize;
        let mut lo = vec![0; n];
        let mut hi = shape.clone();
        lo[ax] = start;
        hi[ax] = stop;
        self.slice(&lo, &hi, &vec![1; n])
    }
    /// A copy of `self` with `self[start..stop] = update`.
    pub fn slice_update(&self, update: &Array, start: &[i32], stop: &[i32]) -> Result<Array> {
        wrap(ffi::slice_update(self.raw(), update.raw(), start, stop))
    }
    pub fn concatenate(arrays: &[&Array], axis: i32) -> Result<Array> {
        wrap(ffi::concatenate(&ArrVec::from_refs(arrays)?.0, axis))
    }
    pub fn take(&self, indices: &Array, axis: i32) -> Result<Array> {
        wrap(ffi::take(self.raw(), indices.raw(), axis))
    }
    pub fn take_along_axis(&self, indices: &Array, axis: i32) -> Result<Array> {
        wrap(ffi::take_along_axis(self.raw(), indices.raw(), axis))
    }
    pub fn put_along_axis(&self, indices: &Array, values: &Array, axis: i32) -> Result<Array> {
        wrap(ffi::put_along_axis(self.raw(), indices.raw(), values.raw(), axis))
    }

    pub fn sum(&self, axis: i32, keepdims: bool) -> Result<Array> {
        wrap(ffi::reduce(self.raw(), "sum", axis, keepdims))
    }
    pub fn max(&self, axis: i32, keepdims: bool) -> Result<Array> {
        wrap(ffi::reduce(self.raw(), "max", axis, keepdims))
    }
    pub fn min(&self, axis: i32, keepdims: bool) -> Result<Array> {
        wrap(ffi::reduce(self.raw(), "min", axis, keepdims))
    }
    pub fn mean(&self, axis: i32, keepdims: bool) -> Result<Array> {
        wrap(ffi::reduce(self.raw(), "mean", axis, keepdims))
    }
    pub fn logsumexp(&self, axis: i32, keepdims: bool) -> Result<Array> {
        wrap(ffi::reduce(self.raw(), "logsumexp", axis, keepdims))
    }
    pub fn argmax(&self, axis: i32, keepdims: bool) -> Result<Array> {
        wrap(ffi::argmax(self.raw(), axis, keepdims))
    }
    pub fn argpartition(&self, kth: i32, axis: i32) -> Result<Array> {
        wrap(ffi::argpartition(self.raw(), kth, axis))
    }
    pub fn argsort(&self, axis: i32) -> Result<Array> {
        wrap(ffi::argsort(self.raw(), axis))
    }
    pub fn sort(&self, axis: i32) -> Result<Array> {
        wrap(ffi::sort(self.raw(), axis))
    }
    pub fn cumsum(&self, axis: i32, reverse: bool, inclusive: bool) -> Result<Array> {
        wrap(ffi::cumsum(self.raw(), axis, reverse, inclusive))
    }
    pub fn softmax(&self, axis: i32, precise: bool) -> Result<Array> {
        wrap(ffi::softmax(self.raw(), axis, precise))
    }
}

/// Integer bit operations, rounding and the Hadamard transform (used by the
/// TurboQuant KV codec, src/cache/turbo.rs).
impl Array {
    binary!(bitwise_and, bitwise_or, left_shift, right_shift);
    unary!(round, floor, cos, sin);

    /// `self @ H * scale` along the last axis, `H` the Hadamard matrix of its
    /// size (a power of two times 1, 12, 20 or 28); `scale = 1/sqrt(n)` makes
    /// it orthogonal and its own inverse.
    pub fn hadamard_transform(&self, scale: f32) -> Result<Array> {
        wrap(ffi::hadamard_transform(self.raw(), scale))
    }
}

/// `quantized_matmul` of `x` with the experts `w[rhs_indices]` (stacked
/// `[experts, out, in]`, MLX's packing), as `mx.gather_qmm`.
#[allow(clippy::too_many_arguments)]
pub fn gather_qmm(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: &Array,
    rhs_indices: &Array,
    transpose: bool,
    group_size: i32,
    bits: i32,
    sorted_indices: bool,
) -> Result<Array> {
    wrap(ffi::gather_qmm(
        x.raw(),
        w.raw(),
        scales.raw(),
        biases.raw(),
        rhs_indices.raw(),
        transpose,
        group_size,
        bits,
        sorted_indices,
    ))
}

/// `a @ b[rhs_indices]`, as `mx.gather_mm`.
pub fn gather_mm(a: &Array, b: &Array, rhs_indices: &Array, sorted_indices: bool) -> Result<Array> {
    wrap(ffi::gather_mm(a.raw(), b.raw(), rhs_indices.raw(), sorted_indices))
}

/// 1-D convolution, `x` `[B, L, C_in]`, `w` `[C_out, K, C_in / groups]`.
pub fn conv1d(x: &Array, w: &Array, stride: i32, padding: i32, dilation: i32, groups: i32) -> Result<Array> {
    wrap(ffi::conv1d(x.raw(), w.raw(), stride, padding, dilation, groups))
}

/// 2-D convolution, `x` `[B, H, W, C_in]`, `w` `[C_out, kH, kW, C_in]`,
/// strides and zero padding per spatial axis.
pub fn conv2d(x: &Array, w: &Array, stride: (i32, i32), padding: (i32, i32)) -> Result<Array> {
    wrap(ffi::conv2d(x.raw(), w.raw(), stride.0, stride.1, padding.0, padding.1))
}

/// Affine-quantized matrix product `x @ w.T` (MLX's packing).
pub fn quantized_matmul(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: &Array,
    transpose: bool,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    wrap(ffi::quantized_matmul(
        x.raw(),
        w.raw(),
        scales.raw(),
        biases.raw(),
        transpose,
        group_size,
        bits,
    ))
}

pub fn dequantize(w: &Array, scales: &Array, biases: &Array, group_size: i32, bits: i32) -> Result<Array> {
    wrap(ffi::dequantize(w.raw(), scales.raw(), biases.raw(), group_size, bits))
}

/// Affine quantization along the last axis: returns (packed weight, scales, biases).
pub fn quantize(w: &Array, group_size: i32, bits: i32) -> Result<(Array, Array, Array)> {
    let mut v = ArrVec(ffi::quantize(w.raw(), group_size, bits)?).into_arrays()?;
    if v.len() != 3 {
        return Err(super::MlxError(format!("quantize returned {} arrays", v.len())));
    }
    let b = v.pop().unwrap();
    let s = v.pop().unwrap();
    Ok((v.pop().unwrap(), s, b))
}

/// MLX's fused kernels (`mlx::core::fast`).
pub mod fast {
    use super::*;

    pub fn rms_norm(x: &Array, weight: &Array, eps: f32) -> Result<Array> {
        wrap(ffi::rms_norm(x.raw(), weight.raw(), eps))
    }

    /// RMS normalization without a learned scale.
    pub fn rms_norm_plain(x: &Array, eps: f32) -> Result<Array> {
        wrap(ffi::rms_norm_plain(x.raw(), eps))
    }

    /// The gated delta rule over a sequence (`mx.fast.gated_delta_update`):
    /// q, k `[B, T, Hk, Dk]`, v `[B, T, Hv, Dv]`, decay `g` and rate `beta`
    /// `[B, T, Hv]`, state `[B, Hv, Dv, Dk]`; positions where `mask` `[B, T]`
    /// is false leave the state unchanged. Returns (y `[B, T, Hv, Dv]`, state).
    pub fn gated_delta_update(
        q: &Array,
        k: &Array,
        v: &Array,
        g: &Array,
        beta: &Array,
        state: &Array,
        mask: Option<&Array>,
    ) -> Result<(Array, Array)> {
        let out = match mask {
            None => ffi::gated_delta_update(q.raw(), k.raw(), v.raw(), g.raw(), beta.raw(), state.raw())?,
            Some(m) => ffi::gated_delta_update_masked(q.raw(), k.raw(), v.raw(), g.raw(), beta.raw(), state.raw(), m.raw())?,
        };
        let mut v = ArrVec(out).into_arrays()?;
        if v.len() != 2 {
            return Err(super::super::MlxError(format!("gated_delta_update returned {} arrays", v.len())));
        }
        let s = v.pop().expect("two outputs");
        Ok((v.pop().expect("two outputs"), s))
    }

    pub fn rope(x: &Array, dims: i32, traditional: bool, base: f32, scale: f32, offset: i32) -> Result<Array> {
        wrap(ffi::rope(x.raw(), dims, traditional, base, scale, offset))
    }

    /// RoPE with explicit per-dimension frequencies (Llama 3 style scaling).
    pub fn rope_with_freqs(
        x: &Array,
        dims: i32,
        traditional: bool,
        scale: f32,
        offset: i32,
        freqs: &Array,
    ) -> Result<Array> {
        wrap(ffi::rope_freqs(x.raw(), dims, traditional, scale, offset, freqs.raw()))
    }

    /// RoPE where each batch row starts at its own position (`offsets`: `[B]`).
    pub fn rope_at(x: &Array, dims: i32, traditional: bool, base: f32, scale: f32, offsets: &Array) -> Result<Array> {
        wrap(ffi::rope_positions(x.raw(), dims, traditional, base, scale, offsets.raw()))
    }

    /// `rope_with_freqs` with per-row start positions.
    pub fn rope_with_freqs_at(
        x: &Array,
        dims: i32,
        traditional: bool,
        scale: f32,
        offsets: &Array,
        freqs: &Array,
    ) -> Result<Array> {
        wrap(ffi::rope_freqs_positions(x.raw(), dims, traditional, scale, offsets.raw(), freqs.raw()))
    }

    /// Attention mask choice for `scaled_dot_product_attention`.
    pub enum Mask<'a> {
        None,
        Causal,
        Array(&'a Array),
    }

    pub fn scaled_dot_product_attention(q: &Array, k: &Array, v: &Array, scale: f32, mask: Mask) -> Result<Array> {
        match mask {
            Mask::None => wrap(ffi::sdpa(q.raw(), k.raw(), v.raw(), scale, "")),
            Mask::Causal => wrap(ffi::sdpa(q.raw(), k.raw(), v.raw(), scale, "causal")),
            Mask::Array(m) => wrap(ffi::sdpa_masked(q.raw(), k.raw(), v.raw(), scale, m.raw())),
        }
    }
}

/// Counter-based random numbers: every draw takes an explicit key.
pub mod random {
    use super::*;

    pub fn key(seed: u64) -> Result<Array> {
        wrap(ffi::random_key(seed))
    }

    /// Splits a key into two independent keys.
    pub fn split(key: &Array) -> Result<(Array, Array)> {
        let mut v = ArrVec(ffi::random_split(key.raw())?).into_arrays()?;
        let b = v.pop().ok_or_else(|| super::super::MlxError("split returned nothing".into()))?;
        let a = v.pop().ok_or_else(|| super::super::MlxError("split returned one key".into()))?;
        Ok((a, b))
    }

    /// Samples indices from unnormalized log-probabilities along the last axis.
    pub fn categorical(logits: &Array, key: &Array) -> Result<Array> {
        wrap(ffi::categorical(logits.raw(), key.raw()))
    }
}
