//! Attention over a TurboQuant KV cache (src/cache/turbo.rs) as one fused
//! mlxrt primitive on the CPU (AVX-512 / AVX2 / portable kernels, see
//! tqsdpa.cc): scores on the int8 / packed keys, the value sum in the
//! rotated domain. The MLX-op composition it replaces (and falls back to)
//! is `TurboCodec::attend`'s, in src/cache/turbo.rs, which owns the codec.
//!
//! Semantics (both paths): `q` is multiplied by `scale` first; query head
//! `i` reads KV head `i / (Hq / Hkv)`; a bool mask replaces masked scores by
//! `f32::MIN` (so a fully masked row stays finite); causal means query `i`
//! of `L` sees keys `0..=T - L + i`; the softmax is f32.

use super::array::{Array, Result};
use super::ops::fast::Mask;
use super::qmm::QmmIsa;
use super::tqsdpa_sys::ffi;

/// `softmax(scale * q @ K.T masked) @ Y` with `q` `[B, Hq, L, D]` f32,
/// `K` decoded from `keys` = (indices int8 `[B, Hkv, T, D]` at 8 bits, else
/// uint8 `[.., D * key_bits / 8]`; f16 scales and zeros `[.., D / 32]`:
/// `k = (q + z) * s`) and `Y` the rotated values decoded from `values` =
/// (uint8 `[.., Dv * value_bits / 8]` packed indices, f16 RMS scales
/// `[.., Dv / 32]`: `y = book[q] * r`), `book` the `2^value_bits` centroids.
/// Returns `[B, Hq, L, Dv]` f32 in the rotated domain, or `None` where the
/// kernel does not apply (another device, widths other than keys 2/3/4/8
/// and values 1..4, an array mask that is not bool, other dtypes or
/// shapes): the caller then uses the MLX ops. Naming an instruction set the
/// CPU lacks is an error.
#[allow(clippy::too_many_arguments)]
pub fn turbo_sdpa_rotated(
    q: &Array,
    keys: [&Array; 3],
    values: [&Array; 2],
    book: &[f32],
    key_bits: i32,
    value_bits: i32,
    scale: f32,
    mask: Mask,
    isa: QmmIsa,
) -> Result<Option<Array>> {
    let (kind, m) = match &mask {
        Mask::None => (0, q),
        Mask::Causal => (1, q),
        Mask::Array(m) => (2, *m),
    };
    let out = ffi::turbo_sdpa(
        q.raw(),
        keys[0].raw(),
        keys[1].raw(),
        keys[2].raw(),
        values[0].raw(),
        values[1].raw(),
        book,
        key_bits,
        value_bits,
        scale,
        kind,
        m.raw(),
        isa as u8,
    )?;
    Ok((!out.is_null()).then_some(Array(out)))
}

/// The kernel variant that computes `a`, or `None` when `a` is not the
/// output of mlxrt's fused TurboQuant attention.
pub fn tqsdpa_isa_of(a: &Array) -> Option<QmmIsa> {
    QmmIsa::from_code(ffi::tqsdpa_node_isa(a.raw())).filter(|i| *i != QmmIsa::Auto)
}
