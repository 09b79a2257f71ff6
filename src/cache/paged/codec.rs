//! The paged cache codec (the seed's `paged-cache-codec`): how a paged
//! layer's prompt-cache snapshot is stored in an entry file and loaded back
//! into the engine's pool.
//!
//! Stored: the snapshot's blocks gathered in table order, one tensor per
//! plane `[num_blocks, kv_heads, block_size, ·]` (dense: keys, values), so
//! the stored table is `0..num_blocks`; and the layout, as JSON:
//! `{"kind":"paged","offset","bits"?,"group_size"?,"paged":{"capacity_tokens",
//! "block_size","block_table","num_blocks","head_dim","v_head_dim","dtype"}}`.
//! `offset` is the positions held, `bits`/`group_size` appear only for
//! quantized planes. A reader takes any table that names each stored block
//! at most once.
//!
//! Loading first checks everything against the model layer's blocks
//! (`check`, host only, before any block is taken), then writes the tensors
//! into fresh blocks (`load`). A failure drops the blocks taken so far: each
//! goes back to the free list, nothing is half-loaded. A loaded entry serves
//! any prefix `n <= offset` by cutting its table (`PagedKv::from_snapshot`).

use super::layer::PagedSnapshot;
use super::pool::{BlockRef, LayerPool};
use crate::cache::scheme::KvLayer;
use crate::error::{Error, Result};
use crate::mlx::{Array, Dtype};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::Rc;

/// A stored paged layer's metadata (the JSON beside its tensors).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PagedMeta {
    pub kind: String,
    /// Positions held.
    pub offset: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bits: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_size: Option<i64>,
    pub paged: PagedLayout,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PagedLayout {
    /// Positions the table's blocks have room for.
    pub capacity_tokens: i64,
    pub block_size: i64,
    /// Logical block j -> stored block (dim 0 of the tensors).
    pub block_table: Vec<i64>,
    pub num_blocks: i64,
    pub head_dim: i64,
    pub v_head_dim: i64,
    /// The keys' and values' dtype as computed (MLX's name: `float32`).
    pub dtype: String,
}

/// One plane of a layer's blocks: `[blocks, kv_heads, block, width]` of
/// `dtype` (dense: the keys, then the values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plane {
    pub dtype: Dtype,
    pub width: i32,
}

/// What a layer's blocks hold; a stored layer loads only into blocks of the
/// same format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockFormat {
    pub block: i32,
    pub kv_heads: i32,
    pub head_dim: i32,
    pub v_head_dim: i32,
    /// The keys' and values' dtype as computed.
    pub dtype: Dtype,
    /// Quantized planes only.
    pub bits: Option<i32>,
    pub group_size: Option<i32>,
    /// In stored order.
    pub planes: Vec<Plane>,
}

impl BlockFormat {
    /// Dense keys and values of `layer`, in `dtype`.
    pub fn dense(layer: &KvLayer, block: i32, dtype: Dtype) -> BlockFormat {
        BlockFormat {
            block,
            kv_heads: layer.kv_heads,
            head_dim: layer.k_dim,
            v_head_dim: layer.v_dim,
            dtype,
            bits: None,
            group_size: None,
            planes: vec![Plane { dtype, width: layer.k_dim }, Plane { dtype, width: layer.v_dim }],
        }
    }

    /// The format `layer`'s blocks in `pool` have: the dtype of what the
    /// pool holds, or while it holds nothing the stored layer's own (a float
    /// dtype; the model's first write must then agree with it).
    pub fn of_pool(pool: &LayerPool, layer: &KvLayer, stored: &PagedMeta) -> std::result::Result<BlockFormat, String> {
        let dtype = match pool.planes() {
            Some([k, _]) => k.dtype(),
            None => stored.dtype().filter(|d| d.is_float()).ok_or(format!("dtype `{}` is not a float type", stored.paged.dtype))?,
        };
        Ok(BlockFormat::dense(layer, pool.block(), dtype))
    }
}

fn dtype_named(name: &str) -> Option<Dtype> {
    (0..=13).filter_map(Dtype::from_code).find(|d| d.name() == name)
}

impl PagedMeta {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a layout serializes")
    }

    pub fn parse(json: &str) -> std::result::Result<PagedMeta, String> {
        serde_json::from_str(json).map_err(|e| format!("bad paged layout: {e}"))
    }

    fn dtype(&self) -> Option<Dtype> {
        dtype_named(&self.paged.dtype)
    }
}

/// The pool's planes with the format of their blocks (dense keys and values).
fn pool_planes(pool: &LayerPool) -> Result<(Vec<Array>, BlockFormat)> {
    let [k, v] = pool.planes().ok_or_else(|| Error::internal("a paged snapshot of an empty pool"))?;
    let layer = KvLayer { kv_heads: k.dim(1), k_dim: k.dim(3), v_dim: v.dim(3), window: None };
    Ok((vec![k.share(), v.share()], BlockFormat::dense(&layer, pool.block(), k.dtype())))
}

/// A fresh block for `format` (growing the pool when none is free).
fn alloc(pool: &mut LayerPool, format: &BlockFormat) -> Result<BlockRef> {
    pool.alloc(format.kv_heads, format.head_dim, format.v_head_dim, format.dtype)
}

/// Writes rows of every plane (`[n, width]`) at `dest` (see `LayerPool::write`).
fn write(pool: &mut LayerPool, rows: &[Array], dest: &[i32]) -> Result<()> {
    match rows {
        [k, v] => pool.write(k, v, dest),
        _ => Err(Error::internal(format!("{} planes for a pool of keys and values", rows.len()))),
    }
}

/// A snapshot as stored: its layout, and per plane its blocks in table
/// order (`[blocks, kv_heads, block, width]`, lazy; they hold the pool's
/// planes until evaluated).
pub fn encode(s: &PagedSnapshot) -> Result<(PagedMeta, Vec<Array>)> {
    let pool = s.pool.borrow();
    let (planes, f) = pool_planes(&pool)?;
    let n = s.blocks.len() as i32;
    let ids: Vec<i32> = s.blocks.iter().map(|b| b.id() as i32).collect();
    let ids = Array::from_i32(&ids, &[n])?;
    let tensors = planes.iter().map(|p| Ok(p.take(&ids, 0)?)).collect::<Result<Vec<_>>>()?;
    let meta = PagedMeta {
        kind: "paged".into(),
        offset: s.len as i64,
        bits: f.bits.map(i64::from),
        group_size: f.group_size.map(i64::from),
        paged: PagedLayout {
            capacity_tokens: (n * f.block) as i64,
            block_size: f.block as i64,
            block_table: (0..n as i64).collect(),
            num_blocks: n as i64,
            head_dim: f.head_dim as i64,
            v_head_dim: f.v_head_dim as i64,
            dtype: f.dtype.name().into(),
        },
    };
    Ok((meta, tensors))
}

/// Checks a stored layer (its layout, and the dtype and shape of each plane
/// tensor) of an entry of `positions` tokens against blocks of `want`.
pub fn check(meta: &PagedMeta, tensors: &[(Dtype, &[i32])], want: &BlockFormat, positions: usize) -> std::result::Result<(), String> {
    let p = &meta.paged;
    if meta.kind != "paged" {
        return Err(format!("kind `{}`, not `paged`", meta.kind));
    }
    if meta.offset != positions as i64 {
        return Err(format!("offset {} in an entry of {positions} tokens", meta.offset));
    }
    if p.block_size != want.block as i64 {
        return Err(format!("blocks of {} positions, this engine's are {}", p.block_size, want.block));
    }
    let bs = want.block as i64;
    let n = p.block_table.len() as i64;
    if n != (meta.offset + bs - 1) / bs {
        return Err(format!("a table of {n} blocks for {} positions in blocks of {bs}", meta.offset));
    }
    if p.capacity_tokens != n * bs {
        return Err(format!("capacity {} for {n} blocks of {bs}", p.capacity_tokens));
    }
    let mut seen = HashSet::new();
    if let Some(id) = p.block_table.iter().find(|&&id| id < 0 || id >= p.num_blocks || !seen.insert(id)) {
        return Err(format!("block table entry {id}: outside 0..{} or repeated", p.num_blocks));
    }
    let quant = |b: Option<i64>| b.map(|x| i32::try_from(x).unwrap_or(-1));
    if (quant(meta.bits), quant(meta.group_size)) != (want.bits, want.group_size) {
        return Err(format!(
            "quantization bits {:?} group {:?}, the layer's are {:?} {:?}",
            meta.bits, meta.group_size, want.bits, want.group_size
        ));
    }
    if (p.head_dim, p.v_head_dim) != (want.head_dim as i64, want.v_head_dim as i64) {
        return Err(format!("head dims {}/{}, the layer's are {}/{}", p.head_dim, p.v_head_dim, want.head_dim, want.v_head_dim));
    }
    if meta.dtype() != Some(want.dtype) {
        return Err(format!("dtype `{}`, the layer's is {}", p.dtype, want.dtype.name()));
    }
    if tensors.len() != want.planes.len() {
        return Err(format!("{} plane tensors, the layer has {} planes", tensors.len(), want.planes.len()));
    }
    for (i, ((dtype, shape), plane)) in tensors.iter().zip(&want.planes).enumerate() {
        let shape_wanted = [p.num_blocks, want.kv_heads as i64, bs, plane.width as i64];
        if !shape.iter().map(|&d| d as i64).eq(shape_wanted) || *dtype != plane.dtype {
            return Err(format!(
                "plane {i} is {} {shape:?}, the layer's blocks want {} {shape_wanted:?}",
                dtype.name(),
                plane.dtype.name()
            ));
        }
    }
    Ok(())
}

/// Writes a stored layer that passed `check` into fresh blocks of `pool`:
/// a snapshot of `meta.offset` positions. On an error the blocks taken so
/// far go back to the pool.
pub fn load(meta: &PagedMeta, planes: &[Array], pool: &Rc<RefCell<LayerPool>>, format: &BlockFormat) -> Result<PagedSnapshot> {
    let table: Vec<i32> = meta.paged.block_table.iter().map(|&id| id as i32).collect();
    let (n, h, bs) = (table.len() as i32, format.kv_heads, format.block);
    let mut p = pool.borrow_mut();
    let mut blocks = Vec::with_capacity(table.len());
    for _ in 0..n {
        blocks.push(alloc(&mut p, format)?);
    }
    if n > 0 {
        // Stored block table[j] goes to blocks[j], head by head.
        let compact = table.iter().enumerate().all(|(j, &id)| id == j as i32) && planes.iter().all(|a| a.dim(0) == n);
        let order = Array::from_i32(&table, &[n])?;
        let rows = planes
            .iter()
            .map(|a| {
                let a = if compact { a.share() } else { a.take(&order, 0)? };
                Ok(a.reshape(&[n * h * bs, a.dim(3)])?)
            })
            .collect::<Result<Vec<_>>>()?;
        let dest: Vec<i32> =
            blocks.iter().flat_map(|b| (0..h * bs).map(move |r| b.id() as i32 * h * bs + r)).collect();
        write(&mut p, &rows, &dest)?;
    }
    drop(p);
    Ok(PagedSnapshot { pool: pool.clone(), blocks, len: meta.offset as i32 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{AttnMask, LayerCache, LayerSnapshot};
    use crate::cache::paged::PagedKv;
    use crate::mlx::test_data::randn;
    use crate::model::Kernels;

    const LAYER: KvLayer = KvLayer { kv_heads: 2, k_dim: 64, v_dim: 32, window: None };
    const BS: i32 = 32;

    fn pool() -> Rc<RefCell<LayerPool>> {
        Rc::new(RefCell::new(LayerPool::new(BS)))
    }

    /// A row of `len` random positions written into `pool`, as a snapshot.
    fn row(pool: &Rc<RefCell<LayerPool>>, len: i32, seed: u64) -> PagedSnapshot {
        let mut c = PagedKv::new(1, pool.clone());
        let (k, v) = (randn(&[1, 2, len, 64], seed), randn(&[1, 2, len, 32], seed + 1));
        c.update(&k, &v).unwrap();
        let LayerSnapshot::Paged(s) = LayerCache::Paged(c).snapshot_row(0, len, false).unwrap() else { panic!("paged") };
        s
    }

    /// What a row restored from `s` at `n` positions attends to after 3
    /// more (the same for every snapshot holding the same data).
    fn attended(s: &PagedSnapshot, n: i32) -> Vec<f32> {
        let mut c = LayerSnapshot::Paged(PagedSnapshot { pool: s.pool.clone(), blocks: s.blocks.clone(), len: s.len }).restore(n).unwrap();
        let view = c.paged_mut().unwrap().update(&randn(&[1, 2, 3, 64], 7), &randn(&[1, 2, 3, 32], 8)).unwrap();
        let q = randn(&[1, 4, 3, 64], 9);
        view.attend(&q, 0.125, &AttnMask::None, Kernels::Auto).unwrap().to_vec_f32().unwrap()
    }

    /// The stored tensors as a file gives them back (bytes), with their
    /// dtypes and shapes.
    fn stored(tensors: &[Array]) -> (Vec<Array>, Vec<(Dtype, Vec<i32>)>) {
        let arrays = tensors.iter().map(|t| Array::from_bytes(&t.to_bytes().unwrap(), &t.shape(), t.dtype()).unwrap()).collect();
        (arrays, tensors.iter().map(|t| (t.dtype(), t.shape())).collect())
    }

    fn shapes(s: &[(Dtype, Vec<i32>)]) -> Vec<(Dtype, &[i32])> {
        s.iter().map(|(d, sh)| (*d, sh.as_slice())).collect()
    }

    #[test]
    fn a_stored_snapshot_loads_into_fresh_blocks_of_another_pool() {
        let a = pool();
        // Other rows first, so that the snapshot's blocks are not 0..k.
        let _other = row(&a, 40, 100);
        let snap = row(&a, 80, 1);
        let (meta, tensors) = encode(&snap).unwrap();
        let json = meta.to_json();
        let want = concat!(
            r#"{"kind":"paged","offset":80,"paged":{"capacity_tokens":96,"block_size":32,"block_table":[0,1,2],"#,
            r#""num_blocks":3,"head_dim":64,"v_head_dim":32,"dtype":"float32"}}"#
        );
        assert_eq!(json, want);
        let meta = PagedMeta::parse(&json).unwrap();
        let (planes, dims) = stored(&tensors);
        let b = pool();
        let format = BlockFormat::of_pool(&b.borrow(), &LAYER, &meta).unwrap();
        check(&meta, &shapes(&dims), &format, 80).unwrap();
        let loaded = load(&meta, &planes, &b, &format).unwrap();
        assert_eq!((loaded.len, loaded.blocks.len(), b.borrow().used()), (80, 3, 3));
        for n in [80, 79, 64, 33, 1] {
            assert_eq!(attended(&loaded, n), attended(&snap, n), "restored at {n} of 80 positions");
        }
        drop(loaded);
        assert_eq!(b.borrow().used(), 0, "every loaded block back once the entry is dropped");
    }

    #[test]
    fn a_table_in_another_order_names_the_stored_blocks() {
        let a = pool();
        let snap = row(&a, 70, 3);
        let (mut meta, tensors) = encode(&snap).unwrap();
        // Stored blocks 2, 0, 1 hold logical blocks 0, 1, 2.
        let order = Array::from_i32(&[1, 2, 0], &[3]).unwrap();
        let shuffled: Vec<Array> = tensors.iter().map(|t| t.take(&order, 0).unwrap()).collect();
        meta.paged.block_table = vec![2, 0, 1];
        let (planes, dims) = stored(&shuffled);
        let b = pool();
        let format = BlockFormat::of_pool(&b.borrow(), &LAYER, &meta).unwrap();
        check(&meta, &shapes(&dims), &format, 70).unwrap();
        let loaded = load(&meta, &planes, &b, &format).unwrap();
        assert_eq!(attended(&loaded, 70), attended(&snap, 70));
    }

    #[test]
    fn corrupted_layouts_are_refused() {
        let a = pool();
        let snap = row(&a, 80, 5);
        let (meta, tensors) = encode(&snap).unwrap();
        let dims: Vec<(Dtype, Vec<i32>)> = tensors.iter().map(|t| (t.dtype(), t.shape())).collect();
        let format = BlockFormat::of_pool(&a.borrow(), &LAYER, &meta).unwrap();
        check(&meta, &shapes(&dims), &format, 80).unwrap();
        type Edit = Box<dyn Fn(&mut PagedMeta, &mut Vec<(Dtype, Vec<i32>)>)>;
        fn e(f: impl Fn(&mut PagedMeta, &mut Vec<(Dtype, Vec<i32>)>) + 'static) -> Edit {
            Box::new(f)
        }
        let edits: Vec<(&str, Edit)> = vec![
            ("kind", e(|m, _| m.kind = "dense".into())),
            ("offset", e(|m, _| m.offset = 81)),
            ("offset of another block count", e(|m, _| m.offset = 100)),
            ("table entry out of range", e(|m, _| m.paged.block_table[1] = 3)),
            ("negative table entry", e(|m, _| m.paged.block_table[0] = -1)),
            ("repeated table entry", e(|m, _| m.paged.block_table[2] = 0)),
            ("table too long", e(|m, _| m.paged.block_table.push(3))),
            ("table too short", e(|m, _| m.paged.block_table.truncate(2))),
            ("capacity", e(|m, _| m.paged.capacity_tokens = 80)),
            ("num_blocks", e(|m, _| m.paged.num_blocks = 4)),
            ("num_blocks and table", e(|m, _| { m.paged.num_blocks = 2; m.paged.block_table = vec![0, 1]; })),
            ("block size", Box::new(|m, _| { m.paged.block_size = 64; m.paged.capacity_tokens = 128; m.paged.block_table = vec![0, 1]; })),
            ("head dim", Box::new(|m, _| m.paged.head_dim = 32)),
            ("value head dim", Box::new(|m, _| m.paged.v_head_dim = 64)),
            ("dtype", Box::new(|m, _| m.paged.dtype = "float16".into())),
            ("unknown dtype", Box::new(|m, _| m.paged.dtype = "f32".into())),
            ("bits on dense blocks", Box::new(|m, _| { m.bits = Some(4); m.group_size = Some(64); })),
            ("a plane of other heads", Box::new(|_, t| t[0].1[1] = 3)),
            ("a plane of another width", Box::new(|_, t| t[1].1[3] = 64)),
            ("a plane of another dtype", Box::new(|_, t| t[1].0 = Dtype::F16)),
            ("a plane of fewer blocks", Box::new(|_, t| t[0].1[0] = 2)),
            ("a plane missing", Box::new(|_, t| drop(t.pop()))),
        ];
        for (what, edit) in edits {
            let (mut m, mut d) = (meta.clone(), dims.clone());
            edit(&mut m, &mut d);
            assert!(check(&m, &shapes(&d), &format, 80).is_err(), "{what} was accepted");
        }
        // Read strictly: unknown or missing fields are refused too.
        let json = meta.to_json();
        assert!(PagedMeta::parse(&json.replacen(r#""offset""#, r#""direct":true,"offset""#, 1)).is_err());
        assert!(PagedMeta::parse(&json.replacen(r#""num_blocks":3,"#, "", 1)).is_err());
        assert!(PagedMeta::parse(&json.replacen("[0,1,2]", r#"[0,"1",2]"#, 1)).is_err());
        // An empty pool takes the stored dtype only if it is a float one.
        let mut m = meta.clone();
        m.paged.dtype = "uint32".into();
        assert!(BlockFormat::of_pool(&pool().borrow(), &LAYER, &m).is_err());
    }

    #[test]
    fn a_failed_write_gives_every_block_back() {
        let b = pool();
        let _held = row(&b, 50, 11); // 2 blocks held, the pool has room for more
        let (free, used) = (b.borrow().free_count(), b.borrow().used());
        assert!(free >= 3, "{free}");
        let (meta, tensors) = encode(&row(&pool(), 80, 12)).unwrap();
        let format = BlockFormat::of_pool(&b.borrow(), &LAYER, &meta).unwrap();
        // Values of the keys' width, past `check`: MLX refuses the write.
        let bad = vec![tensors[0].share(), tensors[0].share()];
        assert!(load(&meta, &bad, &b, &format).is_err());
        assert_eq!((b.borrow().free_count(), b.borrow().used()), (free, used), "blocks taken by the failed load are back");
        let ok = load(&meta, &tensors, &b, &format).unwrap();
        assert_eq!(b.borrow().used(), used + 3);
        drop(ok);
    }
}
