//! The KV cache of one attention layer for a batch of rows. Rows share one
//! physical timeline (`Timeline`) of `len` positions; a row whose history is
//! shorter is left-padded (leading positions it never attends to). One row
//! without padding is the plain single-sequence cache, with no mask or
//! per-row positions overhead.
//!
//! The buffer grows in steps, so appending a token is an in-place slice
//! update rather than a concatenation.

use super::{AttnMask, Positions, Timeline};
use crate::error::{Error, Result};
use crate::mlx::{Array, Dtype};

/// Buffer growth granularity in positions (as in mlx-lm).
const STEP: i32 = 256;

pub struct KvCache {
    keys: Option<Array>,
    values: Option<Array>,
    t: Timeline,
}

impl KvCache {
    /// An empty cache for `rows` rows.
    pub fn new(rows: usize) -> KvCache {
        KvCache { keys: None, values: None, t: Timeline::new(rows) }
    }

    /// A one-row cache holding `keys`, `values` (`[1, H, n, D]`) as its first
    /// `n` positions. The arrays are not written to: the first append grows
    /// into a new buffer.
    pub fn from_prefix(keys: Array, values: Array) -> KvCache {
        let t = Timeline::single(keys.dim(2));
        KvCache { keys: Some(keys), values: Some(values), t }
    }

    /// A contiguous copy of `row`'s keys and values at its own positions
    /// `from..to` (0 = its first real token).
    pub fn row_slice(&self, row: usize, from: i32, to: i32) -> Result<(Array, Array)> {
        let (k, v) = self.contents()?.ok_or_else(|| Error::internal("slicing an empty cache"))?;
        let (p, r) = (self.t.pads()[row], row as i32);
        if to > self.row_len(row) || from > to {
            return Err(Error::internal(format!("row {row} has {} positions, asked {from}..{to}", self.row_len(row))));
        }
        let cut = |a: &Array| -> Result<Array> {
            let s = a.shape();
            Ok(a.slice(&[r, 0, p + from, 0], &[r + 1, s[1], p + to, s[3]], &[1, 1, 1, 1])?.contiguous()?)
        };
        Ok((cut(&k)?, cut(&v)?))
    }

    /// The rows' shared timeline (length and left padding).
    pub fn timeline(&self) -> &Timeline {
        &self.t
    }

    /// Declares left padding for the rows of an empty cache (see `Timeline`).
    pub fn set_padding(&mut self, pads: &[i32]) {
        self.t.set_padding(pads);
    }

    pub fn rows(&self) -> usize {
        self.t.rows()
    }

    /// Physical length (positions written, padding included).
    pub fn len(&self) -> i32 {
        self.t.len()
    }

    pub fn is_empty(&self) -> bool {
        self.t.is_empty()
    }

    /// Tokens actually held for `row` (its length without padding).
    pub fn row_len(&self, row: usize) -> i32 {
        self.t.row_len(row)
    }

    /// RoPE positions of the next tokens.
    pub fn positions(&self) -> Result<Positions> {
        let (len, pad) = (self.t.len(), self.t.pads());
        if !self.t.ragged() {
            return Ok(Positions::Same(len - pad[0]));
        }
        let off: Vec<i32> = pad.iter().map(|&p| len - p).collect();
        Ok(Positions::PerRow(Array::from_i32(&off, &[off.len() as i32])?))
    }

    /// The mask for `n` new tokens attending to everything cached plus
    /// themselves (causally), without the padding.
    pub fn mask(&self, n: i32) -> Result<AttnMask> {
        let (len, pad) = (self.t.len(), self.t.pads());
        if pad.iter().all(|&p| p == 0) {
            return Ok(if n > 1 { AttnMask::Causal } else { AttnMask::None });
        }
        let total = len + n;
        let b = self.rows() as i32;
        let keys = Array::arange(0, total)?.reshape(&[1, 1, 1, total])?;
        let queries = Array::arange(len, total)?.reshape(&[1, 1, n, 1])?;
        let pad = Array::from_i32(pad, &[b, 1, 1, 1])?;
        let causal = queries.greater_equal(&keys)?;
        let not_pad = keys.greater_equal(&pad)?;
        Ok(AttnMask::Array(causal.logical_and(&not_pad)?))
    }

    /// Appends `k`, `v` (`[B, kv_heads, L, head_dim]`) for every row and
    /// returns views of all cached keys and values including them.
    pub fn update_and_fetch(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        let ks = k.shape();
        let vs = v.shape();
        let (b, h, l) = (ks[0], ks[1], ks[2]);
        if b as usize != self.rows() {
            return Err(Error::internal(format!("cache has {} rows, update has {b}", self.rows())));
        }
        let prev = self.t.len();
        let cap = self.keys.as_ref().map_or(0, |a| a.dim(2));
        if prev + l > cap {
            let n = (STEP + l - 1) / STEP * STEP;
            let new_k = Array::zeros(&[b, h, n, ks[3]], k.dtype())?;
            let new_v = Array::zeros(&[b, h, n, vs[3]], v.dtype())?;
            match (self.keys.take(), self.values.take()) {
                (Some(ok), Some(ov)) => {
                    let ok = ok.slice_axis(2, 0, prev)?;
                    let ov = ov.slice_axis(2, 0, prev)?;
                    self.keys = Some(Array::concatenate(&[&ok, &new_k], 2)?);
                    self.values = Some(Array::concatenate(&[&ov, &new_v], 2)?);
                }
                _ => {
                    self.keys = Some(new_k);
                    self.values = Some(new_v);
                }
            }
        }
        self.t.advance(l);
        let end = self.t.len();
        // The old buffers are dropped on return, so at evaluation time only the
        // update node holds them and MLX can write into them in place.
        let old_k = self.keys.take().expect("allocated above");
        let old_v = self.values.take().expect("allocated above");
        let keys = old_k.slice_update(k, &[0, 0, prev, 0], &[b, h, end, ks[3]])?;
        let values = old_v.slice_update(v, &[0, 0, prev, 0], &[b, h, end, vs[3]])?;
        let out = (keys.slice_axis(2, 0, end)?, values.slice_axis(2, 0, end)?);
        self.keys = Some(keys);
        self.values = Some(values);
        Ok(out)
    }

    /// Keys and values of the written positions (`[B, H, len, D]`).
    fn contents(&self) -> Result<Option<(Array, Array)>> {
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) => {
                let len = self.t.len();
                Ok(Some((k.slice_axis(2, 0, len)?, v.slice_axis(2, 0, len)?)))
            }
            _ => Ok(None),
        }
    }

    /// Prepends `n` padding positions to every row.
    fn pad_front(&mut self, n: i32) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        if let Some((k, v)) = self.contents()? {
            let zk = zeros_like_positions(&k, n)?;
            let zv = zeros_like_positions(&v, n)?;
            self.keys = Some(Array::concatenate(&[&zk, &k], 2)?);
            self.values = Some(Array::concatenate(&[&zv, &v], 2)?);
        }
        self.t.pad_front(n);
        Ok(())
    }

    /// Adds `other`'s rows after this cache's rows, right-aligning both
    /// timelines (the shorter one is left-padded). Either may have positions
    /// but no buffers yet (all padding); zeros stand in for them.
    pub fn extend(&mut self, mut other: KvCache) -> Result<()> {
        let end = self.len().max(other.len());
        self.pad_front(end - self.len())?;
        other.pad_front(end - other.len())?;
        let (mine, theirs) = (self.contents()?, other.contents()?);
        let like = mine.as_ref().or(theirs.as_ref()).map(|(k, v)| (k.shape(), v.shape(), k.dtype()));
        if let Some((ks, vs, dt)) = like {
            let fill = |rows: usize, s: &[i32]| Array::zeros(&[rows as i32, s[1], end, s[3]], dt);
            let (k1, v1) = match mine {
                Some(kv) => kv,
                None => (fill(self.rows(), &ks)?, fill(self.rows(), &vs)?),
            };
            let (k2, v2) = match theirs {
                Some(kv) => kv,
                None => (fill(other.rows(), &ks)?, fill(other.rows(), &vs)?),
            };
            self.keys = Some(Array::concatenate(&[&k1, &k2], 0)?);
            self.values = Some(Array::concatenate(&[&v1, &v2], 0)?);
        }
        self.t.extend(&other.t);
        Ok(())
    }

    /// Keeps the rows `keep` (in that order) and drops padding all of them share.
    pub fn filter(&mut self, keep: &[usize]) -> Result<()> {
        let idx: Vec<i32> = keep.iter().map(|&r| r as i32).collect();
        let idx_arr = Array::from_i32(&idx, &[idx.len() as i32])?;
        let contents = self.contents()?;
        let len = self.t.len();
        let shared = self.t.filter(keep);
        if let Some((k, v)) = contents {
            let (k, v) = (k.take(&idx_arr, 0)?, v.take(&idx_arr, 0)?);
            let cut = |a: Array| if shared > 0 { a.slice_axis(2, shared, len) } else { Ok(a) };
            self.keys = Some(cut(k)?);
            self.values = Some(cut(v)?);
        }
        Ok(())
    }

    /// The arrays to evaluate so that the cache content is materialized.
    pub fn state(&self) -> Vec<&Array> {
        self.keys.iter().chain(self.values.iter()).collect()
    }

    /// Bytes held by the buffers (capacity, not just `len`).
    pub fn nbytes(&self) -> usize {
        self.state().iter().map(|a| a.nbytes()).sum()
    }
}

fn zeros_like_positions(a: &Array, n: i32) -> Result<Array> {
    let mut s = a.shape();
    s[2] = n;
    Ok(Array::zeros(&s, a.dtype())?)
}

/// Bytes one cached position takes in one layer (keys and values).
pub fn bytes_per_position(kv_heads: i32, head_dim: i32, dtype: Dtype) -> usize {
    let elem = match dtype {
        Dtype::F16 | Dtype::BF16 => 2,
        Dtype::F64 => 8,
        _ => 4,
    };
    2 * (kv_heads * head_dim) as usize * elem
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlx::fast::{self};

    /// `[1, 1, l, 2]` keys whose values encode the position (+ `base`).
    fn kv(base: f32, l: i32) -> Array {
        let v: Vec<f32> = (0..l).flat_map(|i| [base + i as f32, -(base + i as f32)]).collect();
        Array::from_f32(&v, &[1, 1, l, 2]).unwrap()
    }

    #[test]
    fn appends_and_grows() {
        let mut c = KvCache::new(1);
        let (k, _) = c.update_and_fetch(&kv(0.0, 3), &kv(0.0, 3)).unwrap();
        assert_eq!(k.shape(), vec![1, 1, 3, 2]);
        for i in 0..300 {
            c.update_and_fetch(&kv(3.0 + i as f32, 1), &kv(0.0, 1)).unwrap();
        }
        let (k, _) = c.update_and_fetch(&kv(303.0, 1), &kv(0.0, 1)).unwrap();
        assert_eq!(k.shape(), vec![1, 1, 304, 2]);
        let flat = k.to_vec_f32().unwrap();
        assert!((0..304).all(|i| flat[2 * i] == i as f32));
        assert!(matches!(c.positions().unwrap(), Positions::Same(304)));
        assert!(matches!(c.mask(1).unwrap(), AttnMask::None));
        assert!(matches!(c.mask(4).unwrap(), AttnMask::Causal));
    }

    #[test]
    fn extend_right_aligns_and_masks_padding() {
        let mut a = KvCache::new(1);
        a.update_and_fetch(&kv(0.0, 5), &kv(0.0, 5)).unwrap();
        let mut b = KvCache::new(1);
        b.update_and_fetch(&kv(100.0, 2), &kv(100.0, 2)).unwrap();
        a.extend(b).unwrap();
        assert_eq!((a.rows(), a.len(), a.row_len(0), a.row_len(1)), (2, 5, 5, 2));
        let Positions::PerRow(p) = a.positions().unwrap() else { panic!("rows differ") };
        assert_eq!(p.to_vec_i32().unwrap(), vec![5, 2]);
        let AttnMask::Array(m) = a.mask(1).unwrap() else { panic!("needs a mask") };
        assert_eq!(m.shape(), vec![2, 1, 1, 6]);
        let m: Vec<i32> = m.to_vec_i32().unwrap();
        assert_eq!(m, vec![1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1]);
        let (k, _) = a.update_and_fetch(&kv(9.0, 1).broadcast_to(&[2, 1, 1, 2]).unwrap(), &kv(0.0, 2).slice_axis(2, 0, 1).unwrap().broadcast_to(&[2, 1, 1, 2]).unwrap()).unwrap();
        let k = k.to_vec_f32().unwrap();
        // row 1: three zero pads, then 100, 101, then 9
        assert_eq!(&k[12..24], &[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 100.0, -100.0, 101.0, -101.0, 9.0, -9.0]);
    }

    #[test]
    fn filter_drops_rows_and_shared_padding() {
        let mut a = KvCache::new(1);
        a.update_and_fetch(&kv(0.0, 5), &kv(0.0, 5)).unwrap();
        let mut b = KvCache::new(1);
        b.update_and_fetch(&kv(100.0, 2), &kv(100.0, 2)).unwrap();
        a.extend(b).unwrap();
        a.filter(&[1]).unwrap();
        assert_eq!((a.rows(), a.len(), a.row_len(0)), (1, 2, 2));
        assert!(matches!(a.positions().unwrap(), Positions::Same(2)));
        let (k, _) = a.update_and_fetch(&kv(7.0, 1), &kv(7.0, 1)).unwrap();
        assert_eq!(k.to_vec_f32().unwrap(), vec![100.0, -100.0, 101.0, -101.0, 7.0, -7.0]);
    }

    #[test]
    fn padded_attention_equals_unpadded() {
        // Row 1 of a padded batch attends exactly like the same row alone.
        let q = kv(0.5, 1);
        let mut alone = KvCache::new(1);
        let (k1, v1) = alone.update_and_fetch(&kv(1.0, 3), &kv(2.0, 3)).unwrap();
        let _ = (k1, v1);
        let (k1, v1) = alone.update_and_fetch(&kv(4.0, 1), &kv(5.0, 1)).unwrap();
        let want = fast::scaled_dot_product_attention(&q, &k1, &v1, 0.3, fast::Mask::None).unwrap();

        let mut long = KvCache::new(1);
        long.update_and_fetch(&kv(-3.0, 6), &kv(-3.0, 6)).unwrap();
        let mut short = KvCache::new(1);
        short.update_and_fetch(&kv(1.0, 3), &kv(2.0, 3)).unwrap();
        long.extend(short).unwrap();
        let mask = long.mask(1).unwrap();
        let k_new = Array::concatenate(&[&kv(9.0, 1), &kv(4.0, 1)], 0).unwrap();
        let v_new = Array::concatenate(&[&kv(9.0, 1), &kv(5.0, 1)], 0).unwrap();
        let (k, v) = long.update_and_fetch(&k_new, &v_new).unwrap();
        let qb = Array::concatenate(&[&q, &q], 0).unwrap();
        let got = fast::scaled_dot_product_attention(&qb, &k, &v, 0.3, mask.as_mask()).unwrap();
        let got = got.slice_axis(0, 1, 2).unwrap().to_vec_f32().unwrap();
        let want = want.to_vec_f32().unwrap();
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() < 1e-6, "{got:?} vs {want:?}");
        }
    }
}
