//! Paged KV attention: keys and values live in a block pool, one array per
//! plane `[num_blocks, Hkv, block, X]`, and each batch row reads its own
//! blocks through a block table, with its own length (rows of different
//! lengths need no padding). On the CPU this is mlxrt's fused float, affine
//! or TurboQuant attention driven block by block (paged.cc); everywhere else
//! (and under `Kernels::Stock`) MLX ops gather each row's blocks and mask
//! past its length ([`PagedGather`]). A sliding-window layer's table may
//! hold -1 for blocks it released: those wholly behind the window of every
//! query of the forward.

use super::array::{Array, Dtype, MlxError, Result};
use super::fattn::sdpa_stock;
use super::ops::fast::Mask;
use super::paged_sys::ffi;
use super::qmm::QmmIsa;

/// The block tables and lengths of a batch for one forward, on the host (the
/// fallback's gather and mask) and as arrays (the kernel's inputs).
pub struct BlockTables {
    table: Array,
    lens: Array,
    host_table: Vec<i32>,
    host_lens: Vec<i32>,
    max_blocks: i32,
    block: i32,
}

impl BlockTables {
    /// `tables[b]`: row b's pool blocks in logical order (at least
    /// `ceil(lens[b] / block)` of them; -1 for a released one, see the
    /// module doc); `lens[b]`: the keys it holds, the forward's new ones
    /// included (0 for a row that is all padding so far: its output is not
    /// meaningful).
    pub fn new(tables: &[Vec<i32>], lens: &[i32], block: i32) -> Result<BlockTables> {
        if tables.len() != lens.len() || tables.is_empty() || block < 1 {
            return Err(MlxError("BlockTables: one table and length per row, block >= 1".into()));
        }
        for (t, &n) in tables.iter().zip(lens) {
            if n < 0 || (t.len() as i64) * (block as i64) < n as i64 {
                return Err(MlxError(format!("BlockTables: {} blocks cannot hold {n} keys", t.len())));
            }
        }
        let max_blocks = tables.iter().map(Vec::len).max().unwrap_or(1).max(1) as i32;
        let mut host_table = vec![-1; tables.len() * max_blocks as usize];
        for (b, t) in tables.iter().enumerate() {
            host_table[b * max_blocks as usize..][..t.len()].copy_from_slice(t);
        }
        let rows = tables.len() as i32;
        Ok(BlockTables {
            table: Array::from_i32(&host_table, &[rows, max_blocks])?,
            lens: Array::from_i32(lens, &[rows])?,
            host_table,
            host_lens: lens.to_vec(),
            max_blocks,
            block,
        })
    }

    pub fn lens(&self) -> &[i32] {
        &self.host_lens
    }
}

/// `softmax(scale * q @ k.T) @ v` for each row `b` of `q` `[B, Hq, L, D]`
/// over its `t.lens()[b]` keys in pools `k_pool` `[N, Hkv, block, D]` and
/// `v_pool` `[N, Hkv, block, Dv]`; returns `[B, Hq, L, Dv]`. The `L`
/// queries are the row's last positions: `causal` lets query `l` see keys
/// up to `len - L + l`, and `window` only the last `window` of those.
/// On the CPU for f32 and head sizes a whole number of vectors, mlxrt's
/// kernel; else [`paged_sdpa_stock`].
pub fn paged_sdpa(
    q: &Array,
    k_pool: &Array,
    v_pool: &Array,
    t: &BlockTables,
    scale: f32,
    causal: bool,
    window: Option<i32>,
) -> Result<Array> {
    paged_sdpa_isa(q, k_pool, v_pool, t, scale, causal, window, QmmIsa::Auto)
}

/// [`paged_sdpa`] with an explicit kernel variant (tests and benchmarks).
#[allow(clippy::too_many_arguments)]
pub fn paged_sdpa_isa(
    q: &Array,
    k_pool: &Array,
    v_pool: &Array,
    t: &BlockTables,
    scale: f32,
    causal: bool,
    window: Option<i32>,
    isa: QmmIsa,
) -> Result<Array> {
    check(k_pool, t, q.dim(2), causal, window)?;
    let w = window.unwrap_or(0);
    let out = ffi::paged_float_sdpa(q.raw(), k_pool.raw(), v_pool.raw(), t.table.raw(), t.lens.raw(), scale, causal, w, isa as u8)?;
    if out.is_null() {
        return paged_sdpa_stock(q, k_pool, v_pool, t, scale, causal, window);
    }
    Ok(Array(out))
}

/// Every block a row reads lies in a pool of `k_pool.dim(0)` blocks (-1
/// only wholly behind the window of the row's `l` queries).
fn check(k_pool: &Array, t: &BlockTables, l: i32, causal: bool, window: Option<i32>) -> Result<()> {
    let n = k_pool.dim(0);
    if k_pool.ndim() != 4 || k_pool.dim(2) != t.block {
        return Err(MlxError(format!("paged attention: pool blocks of {} keys, tables of {}", k_pool.dim(2), t.block)));
    }
    for (b, &len) in t.host_lens.iter().enumerate() {
        let used = (len + t.block - 1) / t.block;
        let from = match window.filter(|&w| w > 0 && causal) {
            Some(w) => (len - l - w + 1).max(0),
            None => 0,
        };
        let row = &t.host_table[b * t.max_blocks as usize..][..used as usize];
        for (j, &id) in row.iter().enumerate() {
            let released = id == -1 && (j as i32 + 1) * t.block <= from;
            if !released && (id < 0 || id >= n) {
                return Err(MlxError(format!("paged attention: block {id} outside a pool of {n}")));
            }
        }
    }
    Ok(())
}

/// The MLX-op form of [`paged_sdpa`]: each row's blocks gathered into
/// `[B, Hkv, T, ·]` (`T` the longest row), a bool mask for lengths, causal
/// bounds and window, then MLX's attention.
pub fn paged_sdpa_stock(
    q: &Array,
    k_pool: &Array,
    v_pool: &Array,
    t: &BlockTables,
    scale: f32,
    causal: bool,
    window: Option<i32>,
) -> Result<Array> {
    check(k_pool, t, q.dim(2), causal, window)?;
    let g = PagedGather::new(q, t, causal, window)?;
    sdpa_stock(q, &g.plane(k_pool)?, &g.plane(v_pool)?, scale, Mask::Array(g.mask()), None)
}

/// [`paged_sdpa`] over affine-quantized pools (MLX's layout, as
/// [`super::quantized_sdpa`]: per plane `[N, Hkv, block, ·]` packed words,
/// f32 scales and biases, of keys then values). On the CPU mlxrt's
/// quantized attention kernel; else [`paged_quantized_sdpa_stock`].
#[allow(clippy::too_many_arguments)]
pub fn paged_quantized_sdpa_isa(
    q: &Array,
    k: [&Array; 3],
    v: [&Array; 3],
    t: &BlockTables,
    scale: f32,
    causal: bool,
    window: Option<i32>,
    group_size: i32,
    bits: i32,
    isa: QmmIsa,
) -> Result<Array> {
    check(k[0], t, q.dim(2), causal, window)?;
    let w = window.unwrap_or(0);
    let out = ffi::paged_quantized_sdpa(
        q.raw(),
        k[0].raw(),
        k[1].raw(),
        k[2].raw(),
        v[0].raw(),
        v[1].raw(),
        v[2].raw(),
        t.table.raw(),
        t.lens.raw(),
        scale,
        causal,
        w,
        group_size,
        bits,
        isa as u8,
    )?;
    if out.is_null() {
        return paged_quantized_sdpa_stock(q, k, v, t, scale, causal, window, group_size, bits);
    }
    Ok(Array(out))
}

/// The MLX-op form of [`paged_quantized_sdpa_isa`]: each plane's blocks
/// gathered per row, the length/causal/window mask, then
/// [`super::quantized_sdpa_ops`].
#[allow(clippy::too_many_arguments)]
pub fn paged_quantized_sdpa_stock(
    q: &Array,
    k: [&Array; 3],
    v: [&Array; 3],
    t: &BlockTables,
    scale: f32,
    causal: bool,
    window: Option<i32>,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    check(k[0], t, q.dim(2), causal, window)?;
    let g = PagedGather::new(q, t, causal, window)?;
    let k = [g.plane(k[0])?, g.plane(k[1])?, g.plane(k[2])?];
    let v = [g.plane(v[0])?, g.plane(v[1])?, g.plane(v[2])?];
    let (k, v) = ([&k[0], &k[1], &k[2]], [&v[0], &v[1], &v[2]]);
    super::quantized_sdpa_ops(q, k, v, scale, Mask::Array(g.mask()), group_size, bits)
}

/// The kernel variant that computes `a`, or `None` when `a` is not the
/// output of mlxrt's paged quantized attention kernel.
pub fn paged_quantized_isa_of(a: &Array) -> Option<QmmIsa> {
    QmmIsa::from_code(ffi::paged_q_node_isa(a.raw())).filter(|i| *i != QmmIsa::Auto)
}

/// [`paged_sdpa`] over TurboQuant pools (src/cache/turbo.rs's five planes,
/// as [`super::turbo_sdpa_rotated`] takes them: key indices, scales, zeros,
/// value indices, scales, each `[N, Hkv, block, ·]`), in the rotated value
/// domain. `None` where mlxrt's kernel does not apply (another device,
/// widths, dtypes): the caller then gathers the planes ([`PagedGather`])
/// and runs the codec's MLX ops.
#[allow(clippy::too_many_arguments)]
pub fn paged_turbo_sdpa_isa(
    q: &Array,
    k: [&Array; 3],
    v: [&Array; 2],
    t: &BlockTables,
    book: &[f32],
    key_bits: i32,
    value_bits: i32,
    scale: f32,
    causal: bool,
    window: Option<i32>,
    isa: QmmIsa,
) -> Result<Option<Array>> {
    check(k[0], t, q.dim(2), causal, window)?;
    let w = window.unwrap_or(0);
    let out = ffi::paged_turbo_sdpa(
        q.raw(),
        k[0].raw(),
        k[1].raw(),
        k[2].raw(),
        v[0].raw(),
        v[1].raw(),
        t.table.raw(),
        t.lens.raw(),
        book,
        key_bits,
        value_bits,
        scale,
        causal,
        w,
        isa as u8,
    )?;
    Ok((!out.is_null()).then_some(Array(out)))
}

/// The kernel variant that computes `a`, or `None` when `a` is not the
/// output of mlxrt's paged TurboQuant attention kernel.
pub fn paged_turbo_isa_of(a: &Array) -> Option<QmmIsa> {
    QmmIsa::from_code(ffi::paged_t_node_isa(a.raw())).filter(|i| *i != QmmIsa::Auto)
}

/// The MLX-op fallback's view of a batch: each row's blocks of a plane
/// gathered into `[B, Hkv, T, ·]` (`T` the longest row) and a bool mask
/// `[B, 1, L, T]` for each row's length, causal bounds and window. Slots
/// past a row's length or behind its window (released blocks read as block
/// 0) are masked, and pools hold finite values only, so they add exact
/// zeros.
pub struct PagedGather {
    ids: Array,
    mask: Array,
    rows: i32,
    max_blocks: i32,
    block: i32,
    tmax: i32,
}

impl PagedGather {
    /// For `q` `[B, Hq, L, ·]` (the rows' last `L` positions).
    pub fn new(q: &Array, t: &BlockTables, causal: bool, window: Option<i32>) -> Result<PagedGather> {
        if window.is_some_and(|w| w > 0) && !causal {
            return Err(MlxError("paged attention: a window needs the causal mask".into()));
        }
        let (b, l) = (q.dim(0), q.dim(2));
        let tmax = t.host_lens.iter().copied().max().unwrap_or(1).max(1);
        let ids: Vec<i32> = t.host_table.iter().map(|&id| id.max(0)).collect();
        let w = window.filter(|&w| w > 0);
        let mut keep = Vec::with_capacity((b * l * tmax) as usize);
        for &len in &t.host_lens {
            for li in 0..l {
                let last = if causal { len - l + li } else { len - 1 };
                let first = w.map_or(0, |w| last - w + 1);
                keep.extend((0..tmax).map(|ti| (ti <= last && ti >= first && ti < len) as u8));
            }
        }
        Ok(PagedGather {
            ids: Array::from_i32(&ids, &[b * t.max_blocks])?,
            mask: Array::from_bytes(&keep, &[b, 1, l, tmax], Dtype::Bool)?,
            rows: b,
            max_blocks: t.max_blocks,
            block: t.block,
            tmax,
        })
    }

    pub fn mask(&self) -> &Array {
        &self.mask
    }

    /// One plane's blocks (`pool` `[N, Hkv, block, X]`) as `[B, Hkv, T, X]`.
    pub fn plane(&self, pool: &Array) -> Result<Array> {
        let (h, x) = (pool.dim(1), pool.dim(3));
        pool.take(&self.ids, 0)?
            .reshape(&[self.rows, self.max_blocks, h, self.block, x])?
            .transpose(&[0, 2, 1, 3, 4])?
            .reshape(&[self.rows, h, self.max_blocks * self.block, x])?
            .slice_axis(2, 0, self.tmax)
    }
}

/// `pool` `[N, H, block, X]` with `rows[i]` (`[n, X]`) written at row
/// `dest[i]` of the pool viewed as `[N·H·block, X]`. On the CPU the write
/// happens in the pool's own buffer when nothing else holds it (drop every
/// other handle to the pool first), else in a copy; elsewhere MLX's scatter.
pub fn paged_write(pool: &Array, rows: &Array, dest: &[i32]) -> Result<Array> {
    write(pool, rows, dest, false)
}

/// [`paged_write`] as MLX's scatter (the path off the CPU).
pub fn paged_write_stock(pool: &Array, rows: &Array, dest: &[i32]) -> Result<Array> {
    write(pool, rows, dest, true)
}

fn write(pool: &Array, rows: &Array, dest: &[i32], stock: bool) -> Result<Array> {
    let s = pool.shape();
    let count = s.iter().take(3).map(|&d| d as i64).product::<i64>();
    if let Some(d) = dest.iter().find(|&&d| d < 0 || d as i64 >= count) {
        return Err(MlxError(format!("paged_write: row {d} outside a pool of {count}")));
    }
    let dest = Array::from_i32(dest, &[dest.len() as i32])?;
    Ok(Array(ffi::paged_write(pool.raw(), rows.raw(), dest.raw(), stock)?))
}

/// The address of `a`'s data, evaluating it (an in-place write keeps it:
/// how the tests see that [`paged_write`] did not copy the pool).
pub fn data_address(a: &Array) -> Result<u64> {
    Ok(ffi::paged_data_address(a.raw())?)
}

/// The kernel variant that computes `a`, or `None` when `a` is not the
/// output of mlxrt's paged attention kernel.
pub fn paged_isa_of(a: &Array) -> Option<QmmIsa> {
    QmmIsa::from_code(ffi::paged_node_isa(a.raw())).filter(|i| *i != QmmIsa::Auto)
}
