//! RMSNorm and RoPE as one MLX primitive each on the CPU, where MLX composes
//! them from generic ops (some 7 and 20 graph nodes). The primitives repeat
//! MLX's CPU arithmetic operation for operation, so their outputs have the
//! same bits (see fused.cc; tested in fused_tests.rs); other devices and
//! dtypes get MLX's `fast::rms_norm` / `fast::rope`.

use super::array::{wrap, ArrVec, Array, Dtype, Result};
use super::fused_sys::ffi;
use super::ops::fast;

fn optional(r: std::result::Result<cxx::UniquePtr<ffi::array>, cxx::Exception>) -> Result<Option<Array>> {
    let p = r?;
    Ok((!p.is_null()).then(|| Array(p)))
}

/// `fast::rms_norm(x, w, eps)`: mlxrt's primitive for f32 on the CPU.
pub fn fused_rms_norm(x: &Array, w: &Array, eps: f32) -> Result<Array> {
    match optional(ffi::fused_rms_norm(x.raw(), w.raw(), eps))? {
        Some(y) => Ok(y),
        None => fast::rms_norm(x, w, eps),
    }
}

/// `(x + y, fast::rms_norm(x + y, w, eps))`: a residual add and the norm
/// after it, as one mlxrt node for f32 on the CPU (same bits as the two
/// ops); MLX's ops elsewhere and for shapes that broadcast.
pub fn fused_add_rms_norm(x: &Array, y: &Array, w: &Array, eps: f32) -> Result<(Array, Array)> {
    let out = ffi::fused_add_rms_norm(x.raw(), y.raw(), w.raw(), eps)?;
    if out.is_null() {
        let sum = x.add(y)?;
        let normed = fused_rms_norm(&sum, w, eps)?;
        return Ok((sum, normed));
    }
    let mut v = ArrVec(out).into_arrays()?.into_iter();
    Ok((v.next().expect("the sum"), v.next().expect("the norm")))
}

/// The inverse frequencies MLX's RoPE uses for `dims` rotated features and
/// `base`, computed by MLX's own ops (lazy; evaluate once and keep).
pub fn rope_inv_freqs(dims: i32, base: f32) -> Result<Array> {
    wrap(ffi::rope_inv_freqs(dims, base))
}

/// The inverse of explicit RoPE frequencies `freqs` (`[dims / 2]`).
pub fn rope_inv_freqs_of(freqs: &Array) -> Result<Array> {
    wrap(ffi::rope_inv_freqs_of(freqs.raw()))
}

/// RoPE of `x` (`[B, ..., T, D]`) for positions `offset + t` (times
/// `scale`), given [`rope_inv_freqs`]: mlxrt's primitive for f32 on the CPU,
/// None where it does not apply (use `fast::rope` there).
pub fn fused_rope(x: &Array, dims: i32, traditional: bool, scale: f32, offset: i32, inv_freqs: &Array) -> Result<Option<Array>> {
    optional(ffi::fused_rope(x.raw(), dims, traditional, scale, offset, inv_freqs.raw()))
}

/// [`fused_rope`] with one start position per batch row (`offsets`: `[B]`).
pub fn fused_rope_at(
    x: &Array,
    dims: i32,
    traditional: bool,
    scale: f32,
    offsets: &Array,
    inv_freqs: &Array,
) -> Result<Option<Array>> {
    optional(ffi::fused_rope_at(x.raw(), dims, traditional, scale, offsets.raw(), inv_freqs.raw()))
}

/// One part of a packed projection for [`fused_heads`]: `heads` heads from
/// column `col`, rotated by RoPE or not, in `dtype` (f32, or the f16 / bf16
/// of a KV cache: rounded as `astype` rounds, so a cache's cast is no node).
#[derive(Debug, Clone, Copy)]
pub struct HeadPart {
    pub col: i32,
    pub heads: i32,
    pub rotate: bool,
    pub dtype: Dtype,
}

/// The RoPE of [`fused_heads`]: over the first `dims` features, positions
/// `start + t` times `scale`, given [`rope_inv_freqs`].
pub struct HeadRope<'a> {
    pub dims: i32,
    pub traditional: bool,
    pub scale: f32,
    /// One start for every row (`Ok`), or one per batch row (`[B]`, `Err`).
    pub start: std::result::Result<i32, &'a Array>,
    pub inv_freqs: &'a Array,
}

/// The parts of a packed projection `x` (`[B, L, C]`, the stacked q/k/v
/// matmul's output) as `[B, heads, L, head_dim]` arrays: what slicing each
/// column range, reshaping it to heads, applying `norms` (per-head RMSNorm
/// weights of the first and second part, with `eps`), moving the heads to
/// axis 1 and rotating the parts marked so would give, bit for bit, as one
/// node. `None` where mlxrt's primitive does not apply (not the CPU, not
/// f32, a shape it does not take): compose the ops then.
pub fn fused_heads(
    x: &Array,
    parts: &[HeadPart],
    head_dim: i32,
    rope: &HeadRope,
    norms: [Option<&Array>; 2],
    eps: f32,
) -> Result<Option<Vec<Array>>> {
    let cols: Vec<i32> = parts.iter().map(|p| p.col).collect();
    let heads: Vec<i32> = parts.iter().map(|p| p.heads).collect();
    let rotate: Vec<u8> = parts.iter().map(|p| p.rotate as u8).collect();
    let dtypes: Vec<u8> = parts.iter().map(|p| p.dtype as u8).collect();
    let ptr = |a: Option<&Array>| a.map_or(std::ptr::null(), |a| a.raw() as *const _);
    let (offset, offsets) = match rope.start {
        Ok(o) => (o, std::ptr::null()),
        Err(a) => (0, a.raw() as *const _),
    };
    // SAFETY: every pointer is null or borrows an array alive for the call.
    let out = unsafe {
        ffi::fused_heads(
            x.raw(),
            &cols,
            &heads,
            &rotate,
            &dtypes,
            head_dim,
            rope.dims,
            rope.traditional,
            rope.scale,
            offset,
            offsets,
            rope.inv_freqs.raw(),
            ptr(norms[0]),
            ptr(norms[1]),
            eps,
        )
    }?;
    if out.is_null() {
        return Ok(None);
    }
    Ok(Some(ArrVec(out).into_arrays()?))
}

/// Whether `a` is the output of one of mlxrt's RMSNorm, RoPE, heads or
/// add-and-norm primitives.
pub fn is_fused_node(a: &Array) -> bool {
    ffi::is_fused_node(a.raw())
}
