//! The plain KV cache of one attention layer: keys and values for positions
//! `0..offset`, stored in a buffer that grows in steps so that appending one
//! token is an in-place slice update rather than a concatenation.

use crate::error::Result;
use crate::mlx::Array;

/// Buffer growth granularity in positions (as in mlx-lm).
const STEP: i32 = 256;

#[derive(Default)]
pub struct KvCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: i32,
}

impl KvCache {
    pub fn new() -> KvCache {
        KvCache::default()
    }

    /// Number of cached positions.
    pub fn offset(&self) -> i32 {
        self.offset
    }

    /// Appends `k`, `v` (`[B, kv_heads, L, head_dim]`) and returns views of all
    /// cached keys and values including them.
    pub fn update_and_fetch(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        let ks = k.shape();
        let vs = v.shape();
        let (b, h, l) = (ks[0], ks[1], ks[2]);
        let prev = self.offset;
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
        self.offset += l;
        let off = self.offset;
        // The old buffers are dropped on return, so at evaluation time only the
        // update node holds them and MLX can write into them in place.
        let old_k = self.keys.take().expect("allocated above");
        let old_v = self.values.take().expect("allocated above");
        let keys = old_k.slice_update(k, &[0, 0, prev, 0], &[b, h, off, ks[3]])?;
        let values = old_v.slice_update(v, &[0, 0, prev, 0], &[b, h, off, vs[3]])?;
        let out = (keys.slice_axis(2, 0, off)?, values.slice_axis(2, 0, off)?);
        self.keys = Some(keys);
        self.values = Some(values);
        Ok(out)
    }

    /// The arrays to evaluate so that the cache content is materialized.
    pub fn state(&self) -> Vec<&Array> {
        self.keys.iter().chain(self.values.iter()).collect()
    }

    /// Bytes held by the buffers (capacity, not just `offset`).
    pub fn nbytes(&self) -> usize {
        self.state().iter().map(|a| a.nbytes()).sum()
    }
}
