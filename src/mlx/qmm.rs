//! A fast affine-quantized matmul for MLX's CPU device (a custom MLX
//! primitive with AVX-512 / AVX2 / portable SIMD kernels, see qmm.cc and
//! docs/cpu-kernels.md), and what BLAS MLX's dense CPU matmul uses.

use super::array::{wrap, Array, MlxError, Result};
use super::qmm_sys::ffi;

/// Instruction set of the quantized-matmul kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum QmmIsa {
    /// The best the CPU runs (capped by `MLXRT_QMM_ISA` if set).
    Auto = 0,
    /// Compiler vector extensions: SSE2 on x86-64, NEON on aarch64.
    Portable = 1,
    /// AVX2 + FMA + F16C.
    Avx2 = 2,
    /// AVX-512 F/BW/VL/DQ.
    Avx512 = 3,
}

impl QmmIsa {
    pub(crate) fn from_code(c: u8) -> Option<QmmIsa> {
        Some(match c {
            0 => QmmIsa::Auto,
            1 => QmmIsa::Portable,
            2 => QmmIsa::Avx2,
            3 => QmmIsa::Avx512,
            _ => return None,
        })
    }

    /// The best instruction set this CPU runs (never `Auto`).
    pub fn best() -> QmmIsa {
        QmmIsa::from_code(ffi::best_isa()).unwrap_or(QmmIsa::Portable)
    }

    /// Whether this build and CPU can run the kernel variant.
    pub fn available(self) -> bool {
        ffi::isa_available(self as u8)
    }
}

/// `x @ dequantize(w, scales, biases).T` (MLX's `quantized_matmul` with
/// `transpose = true`, affine mode). On the CPU device, for 4- and 8-bit
/// weights with group size 32, 64 or 128, 2-D `w` and f32/f16/bf16 `x`,
/// scales and biases, this runs mlxrt's own kernel; otherwise (other devices,
/// other cases) it is MLX's op. Invalid shapes or dtypes give `Err`.
///
/// `biases` None: a symmetric format (GGUF's Q4_0 and Q8_0), whose every
/// bias is `-2^(bits-1)` times its scale; the kernel computes them as it
/// widens the scales (the same values, so the same bits as passing them),
/// and MLX's op gets them as a lazy product of the scales.
pub fn fast_quantized_matmul(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    fast_quantized_matmul_isa(x, w, scales, biases, group_size, bits, QmmIsa::Auto)
}

/// [`fast_quantized_matmul`] with an explicit kernel variant (tests and
/// benchmarks). Naming one the CPU cannot run is an error.
pub fn fast_quantized_matmul_isa(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    group_size: i32,
    bits: i32,
    isa: QmmIsa,
) -> Result<Array> {
    fast_quantized_matmul_with(x, w, scales, biases, group_size, bits, isa, false)
}

/// [`fast_quantized_matmul`] with int8 activations where they are faster:
/// on the CPU, `x` is quantized per block of 32 values (`d = max|x| / 127`,
/// `xq = round(x / d)`) and each weight group contributes
/// `s * sum_blocks(d * sum(q * xq)) + b * sum_blocks(d * sum(xq))`, the
/// integer sums exact (VNNI `vpdpbusd` on AVX-512, `vpmaddubsw` on AVX2).
/// Results differ from the f32 kernel by the rounding of x (~1e-3 of
/// `sum |x| |w|`); see docs/cpu-kernels.md. Where the f32 kernel measured
/// faster it runs instead: 4-bit weights with more than
/// [`INT8_MAX_ROWS_4BIT`] rows of x (its GEMM path) on a CPU without the
/// int8 GEMM ([`int8_gemm_available`]: AVX-512 VNNI).
pub fn fast_quantized_matmul_int8(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    let k = x.shape().last().copied().unwrap_or(0).max(1) as usize;
    let m = x.size() / k;
    let int8 = bits != 4 || m <= INT8_MAX_ROWS_4BIT || int8_gemm_available();
    fast_quantized_matmul_with(x, w, scales, biases, group_size, bits, QmmIsa::Auto, int8)
}

/// Whether int8 activations have a GEMM on this CPU (AVX-512 VNNI): weights
/// unpacked per call into a column-interleaved panel, 2.5-2.8x the f32 GEMM
/// at 512 rows (Zen 5, one thread, bench/cpu_kernels.rs). It runs from 24
/// rows of x; fewer run the int8 dot-product tiles. (Layers packed at load,
/// [`pack_panels`], skip the per-call unpacking and run it at every M.)
pub fn int8_gemm_available() -> bool {
    ffi::int8_gemm_available()
}

/// Rows of x up to which [`fast_quantized_matmul_int8`] uses int8
/// activations with 4-bit weights where there is no int8 GEMM (measured on
/// Zen 4, bench/cpu_kernels.rs).
pub const INT8_MAX_ROWS_4BIT: usize = 32;

/// The general form: kernel variant and activation type (`int8_x`). With
/// int8 activations, `Avx512` on a CPU without VNNI runs the AVX2 kernel.
#[allow(clippy::too_many_arguments)]
pub fn fast_quantized_matmul_with(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    group_size: i32,
    bits: i32,
    isa: QmmIsa,
    int8_x: bool,
) -> Result<Array> {
    let (isa, x, w, s) = (isa as u8, x.raw(), w.raw(), scales.raw());
    wrap(match biases {
        Some(b) => ffi::fast_quantized_matmul(x, w, s, b.raw(), group_size, bits, isa, int8_x),
        None => ffi::fast_quantized_matmul_symmetric(x, w, s, group_size, bits, isa, int8_x),
    })
}

/// Output columns per panel of [`pack_panels`]'s layout.
pub(crate) const PACKED_COLS: i32 = 32;

/// Whether [`pack_panels`] pays for a layer of `n` outputs and `k` inputs:
/// the default device is the CPU, its int8 kernels run packed panels
/// (AVX-512 VNNI), and the layer is 4-bit with `n` a multiple of the panel
/// and `k` of the group. (8-bit panels work, but an 8-bit LM head read them
/// ~1.5x slower at one row of x than its direct tiles; see
/// docs/cpu-kernels.md.)
pub fn packable(n: i32, k: i32, group_size: i32, bits: i32) -> bool {
    bits == 4
        && matches!(group_size, 32 | 64 | 128)
        && n > 0
        && n % PACKED_COLS == 0
        && k > 0
        && k % group_size == 0
        && ffi::packed_weights_usable(bits)
}

/// A 4- or 8-bit layer's weights `w` `[N, K * bits / 32]` (MLX's packed
/// words) and its scales and biases `[N, K/group]` rearranged for
/// [`fast_quantized_matmul_packed`]: `w` as `[N/32, K/32, bits, 32]` (for
/// each panel of 32 output columns and block of 32 inputs, each of the
/// block's `bits` words for the 32 columns in turn), scales and biases as
/// `[N/32, K/group, 32]`. The same bytes, reordered once (at load) so the
/// int8 kernel reads each panel as one stream instead of transposing it on
/// every call. Lazy, like any MLX op: evaluate the result to drop `w`.
pub fn pack_panels(w: &Array, scales: &Array, biases: Option<&Array>, bits: i32) -> Result<(Array, Array, Option<Array>)> {
    let (ws, ss) = (w.shape(), scales.shape());
    let (&[n, words], &[sn, groups]) = (&ws[..], &ss[..]) else {
        return Err(MlxError(format!("pack_panels: w {ws:?} and scales {ss:?} must be 2-D")));
    };
    if !matches!(bits, 4 | 8) || n % PACKED_COLS != 0 || words % bits != 0 || sn != n {
        return Err(MlxError(format!("pack_panels: w {ws:?} and scales {ss:?} are not a {bits}-bit layer of whole panels")));
    }
    let p = n / PACKED_COLS;
    let wp = w.reshape(&[p, PACKED_COLS, words / bits, bits])?.transpose(&[0, 2, 3, 1])?.contiguous()?;
    let by_group = |a: &Array| -> Result<Array> { a.reshape(&[p, PACKED_COLS, groups])?.transpose(&[0, 2, 1])?.contiguous() };
    Ok((wp, by_group(scales)?, biases.map(by_group).transpose()?))
}

/// [`pack_panels`] undone: `(w, scales, biases)` in MLX's layout.
pub fn unpack_panels(w: &Array, scales: &Array, biases: Option<&Array>) -> Result<(Array, Array, Option<Array>)> {
    let n = w.dim(0) * PACKED_COLS;
    let rows = |a: &Array| -> Result<Array> { a.transpose(&[0, 2, 1])?.reshape(&[n, -1])?.contiguous() };
    let wr = w.transpose(&[0, 3, 1, 2])?.reshape(&[n, -1])?.contiguous()?;
    Ok((wr, rows(scales)?, biases.map(rows).transpose()?))
}

/// `x @ dequantize(w, scales, biases).T` for a 4- or 8-bit layer in
/// [`pack_panels`]'s layout, with int8 activations (as
/// [`fast_quantized_matmul_int8`], the arithmetic of its GEMM path at every
/// M; half-precision x on an f32 copy). Where the packed kernel does not
/// run (another device, a CPU without AVX-512 VNNI) it is the same product
/// on the unpacked layer. `biases` None: a symmetric format.
pub fn fast_quantized_matmul_packed(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    group_size: i32,
) -> Result<Array> {
    wrap(match biases {
        Some(b) => ffi::fast_quantized_matmul_packed(x.raw(), w.raw(), scales.raw(), b.raw(), group_size),
        None => ffi::fast_quantized_matmul_packed_symmetric(x.raw(), w.raw(), scales.raw(), group_size),
    })
}

/// Flag in `fast_node_isa`'s answer for int8 activations (qmm.h).
const INT8_FLAG: u8 = 0x80;

/// The kernel variant that computes `a`, or `None` when `a` is not the
/// output of mlxrt's quantized matmul (e.g. the stock op was used).
pub fn fast_qmm_isa_of(a: &Array) -> Option<QmmIsa> {
    match ffi::fast_node_isa(a.raw()) {
        0 => None,
        c => QmmIsa::from_code(c & !INT8_FLAG),
    }
}

/// Whether `a` is the output of mlxrt's quantized matmul with int8
/// activations.
pub fn fast_qmm_is_int8(a: &Array) -> bool {
    ffi::fast_node_isa(a.raw()) & INT8_FLAG != 0
}

/// Threads the quantized-matmul kernel uses (the calling MLX stream thread
/// included); `MLXRT_QMM_THREADS` overrides the CPU count.
pub fn qmm_threads() -> usize {
    ffi::pool_threads()
}

/// Which BLAS MLX's dense CPU matmul (`cblas_sgemm`) resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlasInfo {
    /// Path of the library providing `cblas_sgemm` (empty if not found).
    pub library: String,
    /// OpenBLAS's thread count, if the BLAS is OpenBLAS.
    pub openblas_threads: Option<i32>,
}

impl BlasInfo {
    pub fn is_openblas(&self) -> bool {
        self.openblas_threads.is_some()
    }
}

/// See [`BlasInfo`]. Without OpenBLAS, MLX's wheel uses the reference BLAS
/// it bundles: correct, ~50x slower dense matmuls (docs/cpu-kernels.md).
pub fn blas_info() -> BlasInfo {
    let t = ffi::blas_threads();
    BlasInfo { library: ffi::blas_library(), openblas_threads: (t >= 0).then_some(t) }
}

impl std::fmt::Display for BlasInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.openblas_threads {
            Some(t) => write!(f, "OpenBLAS ({}, {t} threads)", self.library),
            None => write!(f, "reference BLAS ({}), slow dense matmuls", self.library),
        }
    }
}
