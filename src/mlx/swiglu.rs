//! SwiGLU (`silu(gate) * up`) as one MLX primitive on the CPU: vectorized
//! AVX-512 / AVX2 / portable kernels that reproduce MLX's own f32 CPU
//! arithmetic bit for bit (see swiglu_kernels.cc and docs/cpu-kernels.md),
//! in one graph node instead of three.

use super::array::{wrap, Array, Result};
use super::qmm::QmmIsa;
use super::swiglu_sys::ffi;

/// `gate * sigmoid(gate) * up` (mlx-lm's `nn.silu(gate) * up`). On the CPU
/// device, for f32 arrays of one shape, one mlxrt primitive computes it,
/// bit-identical to MLX's ops; otherwise (other devices, dtypes or
/// broadcasting shapes) it is MLX's `multiply(multiply(gate, sigmoid(gate)), up)`.
pub fn fast_swiglu(gate: &Array, up: &Array) -> Result<Array> {
    fast_swiglu_isa(gate, up, QmmIsa::Auto)
}

/// [`fast_swiglu`] with an explicit kernel variant (tests and benchmarks).
/// Naming one the CPU cannot run is an error.
pub fn fast_swiglu_isa(gate: &Array, up: &Array, isa: QmmIsa) -> Result<Array> {
    wrap(ffi::fast_swiglu(gate.raw(), up.raw(), isa as u8))
}

/// [`fast_swiglu`] of the two halves of the last axis of `gu`
/// (`gate = gu[..., :F]`, `up = gu[..., F:]`), e.g. the output of stacked
/// gate/up projections, with no slicing nodes on the fast path. The last
/// axis must have an even size.
pub fn fast_swiglu_packed(gu: &Array) -> Result<Array> {
    fast_swiglu_packed_isa(gu, QmmIsa::Auto)
}

/// [`fast_swiglu_packed`] with an explicit kernel variant.
pub fn fast_swiglu_packed_isa(gu: &Array, isa: QmmIsa) -> Result<Array> {
    wrap(ffi::fast_swiglu_packed(gu.raw(), isa as u8))
}

/// The kernel variant that computes `a`, or `None` when `a` is not the
/// output of mlxrt's SwiGLU primitive.
pub fn fast_swiglu_isa_of(a: &Array) -> Option<QmmIsa> {
    QmmIsa::from_code(ffi::swiglu_node_isa(a.raw())).filter(|i| *i != QmmIsa::Auto)
}
