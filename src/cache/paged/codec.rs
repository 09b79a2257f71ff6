//! The paged cache codec (the seed's `paged-cache-codec`): how a paged
//! layer's prompt-cache snapshot is stored in an entry file and loaded back
//! into the engine's pools.
//!
//! Stored: the snapshot's held blocks gathered in logical order, one tensor
//! per plane of the layer's pool `[num_blocks, kv_heads, block_size, ·]`
//! (dense: keys, values; affine: words, scales, biases of keys then values;
//! TurboQuant: its five planes), then, for a quantized row below its
//! `quantized_kv_start`, the float keys and values of its float copy; and
//! the layout, as JSON:
//! `{"kind":"paged","offset","bits"?,"group_size"?,"value_bits"?,
//! "quantized_kv_start"?,"paged":{"capacity_tokens","block_size",
//! "block_table","num_blocks","head_dim","v_head_dim","dtype","float_table"?}}`.
//! `offset` is the positions held; `block_table` maps each logical block to
//! a stored one (`-1`: released behind a sliding window); `bits` and
//! `group_size` describe affine planes, `bits` and `value_bits` TurboQuant
//! ones (key and value bits); `dtype` is the first plane's.
//!
//! Loading first checks the layout against the model layer and the
//! engine's blocks (`check`, host only, before any block is taken), then
//! writes the tensors into fresh blocks (`load`). A failure drops the
//! blocks taken so far: each goes back to the free list, nothing is
//! half-loaded. A loaded entry serves the prefixes its layer allows
//! (`PagedKv::from_snapshot`): any `n <= offset` for dense full attention.

use super::layer::{check_table, PagedSnapshot, StoredBlocks};
use super::pool::{LayerPool, PagedLayer, PlaneShape};
use crate::cache::scheme::{KvLayer, KvScheme};
use crate::error::{Error, Result};
use crate::mlx::{Array, Dtype};
use serde::{Deserialize, Serialize};

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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_bits: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantized_kv_start: Option<i64>,
    pub paged: PagedLayout,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PagedLayout {
    /// Positions the table's blocks have room for.
    pub capacity_tokens: i64,
    pub block_size: i64,
    /// Logical block j -> stored block (dim 0 of the tensors), -1: released.
    pub block_table: Vec<i64>,
    pub num_blocks: i64,
    pub head_dim: i64,
    pub v_head_dim: i64,
    /// The first plane's dtype (MLX's name: `float32`, `uint32`).
    pub dtype: String,
    /// The float copy's table (a quantized row below its start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub float_table: Option<Vec<i64>>,
}

impl PagedMeta {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a layout serializes")
    }

    pub fn parse(json: &str) -> std::result::Result<PagedMeta, String> {
        serde_json::from_str(json).map_err(|e| format!("bad paged layout: {e}"))
    }

    /// Tensors the entry stores for this layer: the pool's planes, then the
    /// float keys and values if there is a float copy.
    pub fn tensors(&self, layer: &PagedLayer) -> usize {
        plane_count(layer) + if self.paged.float_table.is_some() { 2 } else { 0 }
    }

    /// The scheme fields: (bits, group_size, value_bits, start).
    fn scheme_fields(&self) -> (Option<i64>, Option<i64>, Option<i64>, Option<i64>) {
        (self.bits, self.group_size, self.value_bits, self.quantized_kv_start)
    }
}

/// Planes of `layer`'s pool.
fn plane_count(layer: &PagedLayer) -> usize {
    match layer.scheme {
        KvScheme::Dense => 2,
        KvScheme::Affine { .. } => 6,
        KvScheme::TurboQuant { .. } => 5,
    }
}

fn table_i64(t: &[i32]) -> Vec<i64> {
    t.iter().map(|&i| i as i64).collect()
}

fn table_i32(t: &[i64]) -> Vec<i32> {
    t.iter().map(|&i| i32::try_from(i).unwrap_or(i32::MIN)).collect()
}

/// A snapshot as stored: its layout, and its tensors (lazy; they hold the
/// pools' planes until evaluated).
pub fn encode(s: &PagedSnapshot) -> Result<(PagedMeta, Vec<Array>)> {
    let l = &s.layer;
    let stored = s.stored_blocks()?;
    let float = s.float_blocks()?;
    let dtype = stored.planes.first().ok_or_else(|| Error::internal("a paged snapshot without blocks"))?.dtype();
    let num_blocks = stored.table.iter().filter(|&&i| i >= 0).count() as i64;
    let bs = l.block() as i64;
    let (bits, group_size, value_bits) = match l.scheme {
        KvScheme::Dense => (None, None, None),
        KvScheme::Affine { bits, group_size } => (Some(bits as i64), Some(group_size as i64), None),
        KvScheme::TurboQuant { key_bits, value_bits } => (Some(key_bits as i64), None, Some(value_bits as i64)),
    };
    let meta = PagedMeta {
        kind: "paged".into(),
        offset: s.len as i64,
        bits,
        group_size,
        value_bits,
        quantized_kv_start: l.scheme.is_quantized().then_some(s.start as i64),
        paged: PagedLayout {
            capacity_tokens: stored.table.len() as i64 * bs,
            block_size: bs,
            block_table: table_i64(&stored.table),
            num_blocks,
            head_dim: l.k_dim as i64,
            v_head_dim: l.v_dim as i64,
            dtype: dtype.name().into(),
            float_table: float.as_ref().map(|f| table_i64(&f.table)),
        },
    };
    let mut tensors = stored.planes;
    tensors.extend(float.into_iter().flat_map(|f| f.planes));
    Ok((meta, tensors))
}

/// Checks a stored layer (its layout, and the dtype and shape of each
/// tensor) of an entry of `positions` tokens against `layer` (the model's
/// shapes `kv`) and what its pools hold.
pub fn check(meta: &PagedMeta, tensors: &[(Dtype, &[i32])], layer: &PagedLayer, kv: &KvLayer, positions: usize) -> std::result::Result<(), String> {
    let p = &meta.paged;
    if meta.kind != "paged" {
        return Err(format!("kind `{}`, not `paged`", meta.kind));
    }
    if meta.offset != positions as i64 {
        return Err(format!("offset {} in an entry of {positions} tokens", meta.offset));
    }
    let bs = layer.block();
    if p.block_size != bs as i64 {
        return Err(format!("blocks of {} positions, this engine's are {bs}", p.block_size));
    }
    let want = match layer.scheme {
        KvScheme::Dense => (None, None, None),
        KvScheme::Affine { bits, group_size } => (Some(bits as i64), Some(group_size as i64), None),
        KvScheme::TurboQuant { key_bits, value_bits } => (Some(key_bits as i64), None, Some(value_bits as i64)),
    };
    let (bits, group, vbits, start) = meta.scheme_fields();
    if (bits, group, vbits) != want {
        return Err(format!("quantization bits {bits:?} group {group:?} value bits {vbits:?}, the layer's are {want:?}"));
    }
    let start = match (layer.scheme.is_quantized(), start) {
        (false, None) => 0,
        (true, Some(s)) if (0..=i32::MAX as i64).contains(&s) => s as i32,
        (_, s) => return Err(format!("quantized_kv_start {s:?} for a {} layer", layer.scheme.name())),
    };
    if (p.head_dim, p.v_head_dim) != (kv.k_dim as i64, kv.v_dim as i64) {
        return Err(format!("head dims {}/{}, the layer's are {}/{}", p.head_dim, p.v_head_dim, kv.k_dim, kv.v_dim));
    }
    let len = meta.offset as i32;
    let n = p.block_table.len() as i64;
    if p.capacity_tokens != n * bs as i64 {
        return Err(format!("capacity {} for {n} blocks of {bs}", p.capacity_tokens));
    }
    let keep = layer.window.map_or(0, |w| len - w);
    let k = check_table(&table_i32(&p.block_table), len, bs, keep)?;
    if p.num_blocks != k as i64 {
        return Err(format!("num_blocks {} for a table naming {k}", p.num_blocks));
    }
    let below_start = layer.scheme.is_quantized() && len < start;
    let kf = match (&p.float_table, below_start) {
        (Some(t), true) => check_table(&table_i32(t), len, bs, 0)?,
        (None, false) => 0,
        (t, _) => return Err(format!("a float table {} for {len} positions, start {start}", if t.is_some() { "present" } else { "missing" })),
    };
    if tensors.len() != meta.tensors(layer) {
        return Err(format!("{} tensors, the layer stores {}", tensors.len(), meta.tensors(layer)));
    }
    let planes = plane_count(layer);
    let (stored, float) = tensors.split_at(planes);
    match stored.first() {
        Some((d, _)) if d.name() == p.dtype => {}
        _ => return Err(format!("dtype `{}` is not the first plane's", p.dtype)),
    }
    check_planes(stored, k, kv.kv_heads, bs, &layer.pool.borrow())?;
    if let (Some(fpool), false) = (&layer.float, float.is_empty()) {
        check_planes(float, kf, kv.kv_heads, bs, &fpool.borrow())?;
        let widths: Vec<i32> = float.iter().map(|(_, s)| s[3]).collect();
        if widths != [kv.k_dim, kv.v_dim] || float.iter().any(|(d, _)| !d.is_float()) {
            return Err(format!("float copy planes {float:?} for head dims {}/{}", kv.k_dim, kv.v_dim));
        }
    }
    Ok(())
}

/// Plane tensors of `k` blocks of `heads` x `bs` rows, of the shapes and
/// dtypes `pool`'s planes have once it holds any.
fn check_planes(planes: &[(Dtype, &[i32])], k: i32, heads: i32, bs: i32, pool: &LayerPool) -> std::result::Result<(), String> {
    for (i, (dtype, shape)) in planes.iter().enumerate() {
        if shape.len() != 4 || shape[..3] != [k, heads, bs] || shape[3] < 1 {
            return Err(format!("plane {i} is {shape:?}, the layer's blocks want [{k}, {heads}, {bs}, ·]"));
        }
        if let Some(have) = pool.planes().get(i) {
            let want = PlaneShape::of(have);
            if (want.dtype, want.cols) != (*dtype, shape[3]) {
                return Err(format!("plane {i} is {} of width {}, the pool's is {} of {}", dtype.name(), shape[3], want.dtype.name(), want.cols));
            }
        }
    }
    if !pool.planes().is_empty() && pool.planes().len() != planes.len() {
        return Err(format!("{} planes, the pool has {}", planes.len(), pool.planes().len()));
    }
    Ok(())
}

/// Writes a stored layer that passed `check` into fresh blocks of `layer`:
/// a snapshot of `meta.offset` positions. On an error the blocks taken so
/// far go back to their pools.
pub fn load(meta: &PagedMeta, tensors: Vec<Array>, layer: &PagedLayer) -> Result<PagedSnapshot> {
    let mut planes = tensors;
    let float = planes.split_off(plane_count(layer).min(planes.len()));
    let stored = StoredBlocks { planes, table: table_i32(&meta.paged.block_table) };
    let float = meta.paged.float_table.as_ref().map(|t| StoredBlocks { planes: float, table: table_i32(t) });
    let start = meta.quantized_kv_start.unwrap_or(0) as i32;
    PagedSnapshot::from_stored(layer, meta.offset as i32, start, &stored, float.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{AttnMask, LayerCache, LayerSnapshot};
    use crate::cache::paged::PagedKv;
    use crate::mlx::test_data::randn;
    use crate::model::Kernels;

    const KV: KvLayer = KvLayer { kv_heads: 2, k_dim: 64, v_dim: 32, window: None };
    const BS: i32 = 32;

    fn layer(scheme: KvScheme, window: Option<i32>) -> PagedLayer {
        PagedLayer::new(BS, scheme, window, KV.k_dim, KV.v_dim).unwrap()
    }

    /// A row of `len` random positions (quantized from `start`) written
    /// into `l`, as a snapshot.
    fn row(l: &PagedLayer, len: i32, start: i32, seed: u64) -> PagedSnapshot {
        let mut c = PagedKv::new(1, l.clone());
        c.set_starts(&[start]);
        let (k, v) = (randn(&[1, 2, len, 64], seed), randn(&[1, 2, len, 32], seed + 1));
        c.update_with(&k, &v, Kernels::Auto).unwrap();
        let LayerSnapshot::Paged(s) = LayerCache::Paged(c).snapshot_row(0, len, false).unwrap() else { panic!("paged") };
        s
    }

    /// What a row restored from `s` at `n` positions attends to after 3
    /// more (the same for every snapshot holding the same data).
    fn attended(s: &PagedSnapshot, n: i32) -> Vec<f32> {
        let mut c = PagedKv::from_snapshot(s, n).unwrap();
        let view = c.update_with(&randn(&[1, 2, 3, 64], 7), &randn(&[1, 2, 3, 32], 8), Kernels::Auto).unwrap();
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

    /// Stores `snap`, checks and loads it into a fresh layer like `l`, and
    /// compares what rows restored from both attend to.
    fn round_trip(l: &PagedLayer, snap: &PagedSnapshot, prefixes: &[i32]) -> PagedMeta {
        let (meta, tensors) = encode(snap).unwrap();
        let meta = PagedMeta::parse(&meta.to_json()).unwrap();
        let (arrays, dims) = stored(&tensors);
        let fresh = layer(l.scheme, l.window);
        let kv = KvLayer { window: l.window, ..KV };
        check(&meta, &shapes(&dims), &fresh, &kv, snap.len as usize).unwrap();
        let loaded = load(&meta, arrays, &fresh).unwrap();
        for &n in prefixes {
            assert_eq!(attended(&loaded, n), attended(snap, n), "{}: restored at {n} of {}", l.scheme.name(), snap.len);
        }
        drop(loaded);
        assert_eq!(fresh.pool.borrow().used(), 0, "every loaded block back once the entry is dropped");
        meta
    }

    #[test]
    fn a_stored_snapshot_loads_into_fresh_blocks_of_another_pool() {
        let l = layer(KvScheme::Dense, None);
        // Other rows first, so that the snapshot's blocks are not 0..k.
        let _other = row(&l, 40, 0, 100);
        let snap = row(&l, 80, 0, 1);
        let meta = round_trip(&l, &snap, &[80, 79, 64, 33, 1]);
        let want = concat!(
            r#"{"kind":"paged","offset":80,"paged":{"capacity_tokens":96,"block_size":32,"block_table":[0,1,2],"#,
            r#""num_blocks":3,"head_dim":64,"v_head_dim":32,"dtype":"float32"}}"#
        );
        assert_eq!(meta.to_json(), want);
    }

    #[test]
    fn quantized_windowed_and_delayed_layers_round_trip() {
        let affine = KvScheme::Affine { bits: 4, group_size: 32 };
        let turbo = KvScheme::TurboQuant { key_bits: 8, value_bits: 3 };
        for scheme in [affine, turbo] {
            let l = layer(scheme, None);
            let meta = round_trip(&l, &row(&l, 70, 0, 2), &[70]);
            assert_eq!(meta.paged.float_table, None);
            // Below its start: the float copy is stored too.
            let meta = round_trip(&l, &row(&l, 70, 100, 3), &[70]);
            assert_eq!(meta.paged.float_table, Some(vec![0, 1, 2]));
            assert_eq!(meta.quantized_kv_start, Some(100));
        }
        // A window of 40 over 130 positions: the first two blocks released.
        let l = layer(KvScheme::Dense, Some(40));
        let meta = round_trip(&l, &row(&l, 130, 0, 4), &[130]);
        assert_eq!(meta.paged.block_table, vec![-1, -1, 0, 1, 2]);
    }

    #[test]
    fn a_table_in_another_order_names_the_stored_blocks() {
        let l = layer(KvScheme::Dense, None);
        let snap = row(&l, 70, 0, 3);
        let (mut meta, tensors) = encode(&snap).unwrap();
        // Stored blocks 2, 0, 1 hold logical blocks 0, 1, 2.
        let order = Array::from_i32(&[1, 2, 0], &[3]).unwrap();
        let shuffled: Vec<Array> = tensors.iter().map(|t| t.take(&order, 0).unwrap()).collect();
        meta.paged.block_table = vec![2, 0, 1];
        let (planes, dims) = stored(&shuffled);
        let fresh = layer(KvScheme::Dense, None);
        check(&meta, &shapes(&dims), &fresh, &KV, 70).unwrap();
        let loaded = load(&meta, planes, &fresh).unwrap();
        assert_eq!(attended(&loaded, 70), attended(&snap, 70));
    }

    #[test]
    fn corrupted_layouts_are_refused() {
        let l = layer(KvScheme::Dense, None);
        let snap = row(&l, 80, 0, 5);
        let (meta, tensors) = encode(&snap).unwrap();
        let dims: Vec<(Dtype, Vec<i32>)> = tensors.iter().map(|t| (t.dtype(), t.shape())).collect();
        check(&meta, &shapes(&dims), &l, &KV, 80).unwrap();
        type Edit = Box<dyn Fn(&mut PagedMeta, &mut Vec<(Dtype, Vec<i32>)>)>;
        let edits: Vec<(&str, Edit)> = vec![
            ("kind", Box::new(|m, _| m.kind = "dense".into())),
            ("offset", Box::new(|m, _| m.offset = 81)),
            ("offset of another block count", Box::new(|m, _| m.offset = 100)),
            ("table entry out of range", Box::new(|m, _| m.paged.block_table[1] = 3)),
            ("released block without a window", Box::new(|m, _| m.paged.block_table[0] = -1)),
            ("repeated table entry", Box::new(|m, _| m.paged.block_table[2] = 0)),
            ("table too long", Box::new(|m, _| m.paged.block_table.push(3))),
            ("table too short", Box::new(|m, _| m.paged.block_table.truncate(2))),
            ("capacity", Box::new(|m, _| m.paged.capacity_tokens = 80)),
            ("num_blocks", Box::new(|m, _| m.paged.num_blocks = 4)),
            ("block size", Box::new(|m, _| { m.paged.block_size = 64; m.paged.capacity_tokens = 128; m.paged.block_table = vec![0, 1]; })),
            ("head dim", Box::new(|m, _| m.paged.head_dim = 32)),
            ("value head dim", Box::new(|m, _| m.paged.v_head_dim = 64)),
            ("dtype", Box::new(|m, _| m.paged.dtype = "float16".into())),
            ("bits on dense blocks", Box::new(|m, _| { m.bits = Some(4); m.group_size = Some(64); })),
            ("a start on dense blocks", Box::new(|m, _| m.quantized_kv_start = Some(0))),
            ("a float table on dense blocks", Box::new(|m, _| m.paged.float_table = Some(vec![0, 1, 2]))),
            ("a plane of other heads", Box::new(|_, t| t[0].1[1] = 3)),
            ("a plane of another width", Box::new(|_, t| t[1].1[3] = 64)),
            ("a plane of another dtype", Box::new(|_, t| t[1].0 = Dtype::F16)),
            ("a plane of fewer blocks", Box::new(|_, t| t[0].1[0] = 2)),
            ("a plane missing", Box::new(|_, t| drop(t.pop()))),
        ];
        for (what, edit) in edits {
            let (mut m, mut d) = (meta.clone(), dims.clone());
            edit(&mut m, &mut d);
            assert!(check(&m, &shapes(&d), &l, &KV, 80).is_err(), "{what} was accepted");
        }
        // A quantized layer's layout must say how it is quantized.
        let q = layer(KvScheme::Affine { bits: 8, group_size: 32 }, None);
        let (qm, qt) = encode(&row(&q, 80, 100, 6)).unwrap();
        let qd: Vec<(Dtype, Vec<i32>)> = qt.iter().map(|t| (t.dtype(), t.shape())).collect();
        check(&qm, &shapes(&qd), &q, &KV, 80).unwrap();
        for (what, edit) in [
            ("other bits", Box::new(|m: &mut PagedMeta| m.bits = Some(4)) as Box<dyn Fn(&mut PagedMeta)>),
            ("no start", Box::new(|m: &mut PagedMeta| m.quantized_kv_start = None)),
            ("a start the row is past", Box::new(|m: &mut PagedMeta| m.quantized_kv_start = Some(10))),
            ("no float table below the start", Box::new(|m: &mut PagedMeta| m.paged.float_table = None)),
        ] {
            let mut m = qm.clone();
            edit(&mut m);
            assert!(check(&m, &shapes(&qd), &q, &KV, 80).is_err(), "{what} was accepted");
        }
        // Read strictly: unknown or missing fields are refused too.
        let json = meta.to_json();
        assert!(PagedMeta::parse(&json.replacen(r#""offset""#, r#""direct":true,"offset""#, 1)).is_err());
        assert!(PagedMeta::parse(&json.replacen(r#""num_blocks":3,"#, "", 1)).is_err());
        assert!(PagedMeta::parse(&json.replacen("[0,1,2]", r#"[0,"1",2]"#, 1)).is_err());
    }

    #[test]
    fn a_failed_write_gives_every_block_back() {
        let l = layer(KvScheme::Dense, None);
        let _held = row(&l, 50, 0, 11); // 2 blocks held, the pool has room for more
        let (free, used) = (l.pool.borrow().free_count(), l.pool.borrow().used());
        assert!(free >= 3, "{free}");
        let (meta, tensors) = encode(&row(&layer(KvScheme::Dense, None), 80, 0, 12)).unwrap();
        // Values of the keys' width: the pool refuses blocks of that shape.
        let bad = vec![tensors[0].share(), tensors[0].share()];
        assert!(load(&meta, bad, &l).is_err());
        assert_eq!((l.pool.borrow().free_count(), l.pool.borrow().used()), (free, used), "blocks taken by the failed load are back");
        let ok = load(&meta, tensors, &l).unwrap();
        assert_eq!(l.pool.borrow().used(), used + 3);
        drop(ok);
    }
}
