//! The KV cache of one sliding-window attention layer: a ring of at most
//! `window` positions per row, as mlx-lm's `RotatingKVCache(max_size=window,
//! keep=0)`, so its memory stays flat however long the context grows.
//!
//! Rows share one timeline with the model's other caches (`Timeline`: `len`
//! positions, leading padding per row). The ring holds the last
//! `min(len, window)` positions, padding included; position `p` lives in slot
//! `(p - origin) mod window`. Before the ring first fills, `origin` is 0 and
//! slots are positions (the buffer grows in steps up to `window`).
//!
//! Attention sees exactly the keys a full-history cache with a window mask
//! would: a block of `L > 1` new tokens gets the `window - 1` positions before
//! it plus itself, in temporal order (`mask` bounds each query's window); a
//! single token gets the ring in slot order, every slot it holds being inside
//! the window. Batch operations (`extend`, `filter`, padding) first put the
//! ring in temporal order, then work as on a dense cache.

use super::{AttnMask, Positions, Timeline};
use crate::error::{Error, Result};
use crate::mlx::Array;

/// Buffer growth granularity in positions (as in mlx-lm).
const STEP: i32 = 256;

pub struct RingCache {
    /// `[B, H, capacity, D]`, capacity ≤ `window`.
    keys: Option<Array>,
    values: Option<Array>,
    /// The timeline position whose slot is 0 (modulo `window`).
    origin: i32,
    window: i32,
    t: Timeline,
}

impl RingCache {
    /// An empty cache for `rows` rows and a window of `window` positions.
    pub fn new(rows: usize, window: i32) -> RingCache {
        RingCache { keys: None, values: None, origin: 0, window: window.max(1), t: Timeline::new(rows) }
    }

    /// A one-row cache at length `len` holding its last `min(len, window)`
    /// positions, `keys`, `values` (`[1, H, min(len, window), D]`, temporal
    /// order). The arrays are not written to (updates make new ones).
    pub fn from_snapshot(keys: Array, values: Array, len: i32, window: i32) -> Result<RingCache> {
        let mut c = RingCache { keys: None, values: None, origin: 0, window, t: Timeline::single(len) };
        if keys.dim(2) != c.held() || values.dim(2) != c.held() {
            return Err(Error::internal(format!("a ring of {} positions for {len} tokens, window {window}", keys.dim(2))));
        }
        c.set_temporal(keys, values);
        Ok(c)
    }

    /// Positions each query can see: itself and the `window - 1` before it.
    pub fn window(&self) -> i32 {
        self.window
    }

    /// The rows' shared timeline (length and left padding).
    pub fn timeline(&self) -> &Timeline {
        &self.t
    }

    /// Sets `row`'s RoPE delta (see `Timeline`).
    pub fn set_rope_delta(&mut self, row: usize, delta: i32) {
        self.t.set_delta(row, delta);
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

    /// Tokens `row` has seen (its length without padding; the ring holds at
    /// most `window` of them).
    pub fn row_len(&self, row: usize) -> i32 {
        self.t.row_len(row)
    }

    /// Positions held: the last `min(len, window)`.
    fn held(&self) -> i32 {
        self.t.len().min(self.window)
    }

    /// RoPE positions of the next tokens.
    pub fn positions(&self) -> Result<Positions> {
        self.t.positions()
    }

    /// The mask for `n` new tokens over the keys `update_and_fetch` will
    /// return for them (each query sees itself and the `window - 1`
    /// positions before it, never padding).
    pub fn mask(&self, n: i32) -> Result<AttnMask> {
        let (len, pad, w) = (self.t.len(), self.t.pads(), self.window);
        let b = self.rows() as i32;
        if n == 1 {
            // Keys in slot order; the new token goes to slot `at`.
            let total = (len + 1).min(w);
            let at = (len - self.origin).rem_euclid(w);
            let first = len + 1 - total;
            if pad.iter().all(|&p| p <= first) {
                return Ok(AttnMask::None);
            }
            let key_pos: Vec<i32> = (0..total).map(|s| len - (at - s).rem_euclid(w)).collect();
            let keys = Array::from_i32(&key_pos, &[1, 1, 1, total])?;
            let pad = Array::from_i32(pad, &[b, 1, 1, 1])?;
            return Ok(AttnMask::Array(keys.greater_equal(&pad)?));
        }
        // Keys in temporal order from `start`, the first position any new
        // query sees.
        let start = (len - w + 1).max(0);
        let total = len + n;
        // The window bites inside the new block when its last query cannot
        // see `start`.
        let bites = total - w > start;
        if !bites && pad.iter().all(|&p| p <= start) {
            return Ok(AttnMask::Causal);
        }
        let span = total - start;
        let keys = Array::arange(start, total)?.reshape(&[1, 1, 1, span])?;
        let queries = Array::arange(len, total)?.reshape(&[1, 1, n, 1])?;
        let causal = queries.greater_equal(&keys)?;
        let near = keys.add(&Array::scalar_i32(w)?)?.greater(&queries)?;
        let pad = Array::from_i32(pad, &[b, 1, 1, 1])?;
        let not_pad = keys.greater_equal(&pad)?;
        Ok(AttnMask::Array(causal.logical_and(&near)?.logical_and(&not_pad)?))
    }

    /// Appends `k`, `v` (`[B, kv_heads, L, head_dim]`) for every row and
    /// returns the keys and values the new tokens attend to (see `mask`):
    /// for `L > 1` the `window - 1` positions before them and themselves in
    /// temporal order, for `L == 1` the ring in slot order.
    pub fn update_and_fetch(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        let (b, l) = (k.dim(0), k.dim(2));
        if b as usize != self.rows() {
            return Err(Error::internal(format!("cache has {} rows, update has {b}", self.rows())));
        }
        if l == 1 {
            return self.write_one(k, v);
        }
        let (len, w) = (self.t.len(), self.window);
        let (tk, tv) = self.temporal_or_zeros(k, v)?;
        let before = len.min(w - 1);
        let held = self.held();
        let cat = |old: Array, new: &Array| -> Result<Array> {
            if before == 0 {
                return Ok(new.share());
            }
            Ok(Array::concatenate(&[&old.slice_axis(2, held - before, held)?, new], 2)?)
        };
        let (all_k, all_v) = (cat(tk, k)?, cat(tv, v)?);
        self.t.advance(l);
        // Keep the last `window` positions, copied so that a long block's
        // keys are not held on to.
        let (n, keep) = (all_k.dim(2), self.held());
        let tail = |a: &Array| -> Result<Array> { Ok(a.slice_axis(2, n - keep, n)?.contiguous()?) };
        let (sk, sv) = (tail(&all_k)?, tail(&all_v)?);
        self.set_temporal(sk, sv);
        Ok((all_k, all_v))
    }

    /// The `L == 1` update: one slice update in place.
    fn write_one(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        let (len, w) = (self.t.len(), self.window);
        if self.keys.is_none() {
            // No buffers yet (the cache holds padding only, or nothing).
            let (zk, zv) = (zeros_positions(k, self.held())?, zeros_positions(v, self.held())?);
            self.set_temporal(zk, zv);
        }
        let at = (len - self.origin).rem_euclid(w);
        let cap = self.keys.as_ref().map_or(0, |a| a.dim(2));
        if at >= cap {
            let grown = ((at / STEP + 1) * STEP).min(w);
            let extend = |a: Array, like: &Array| -> Result<Array> {
                let z = zeros_positions(like, grown - cap)?;
                Ok(Array::concatenate(&[&a, &z], 2)?)
            };
            self.keys = Some(extend(self.keys.take().expect("set above"), k)?);
            self.values = Some(extend(self.values.take().expect("set above"), v)?);
        }
        let (ks, vs) = (k.shape(), v.shape());
        // The old buffers are dropped on return, so at evaluation time only the
        // update node holds them and MLX can write into them in place.
        let old_k = self.keys.take().expect("allocated above");
        let old_v = self.values.take().expect("allocated above");
        let keys = old_k.slice_update(k, &[0, 0, at, 0], &[ks[0], ks[1], at + 1, ks[3]])?;
        let values = old_v.slice_update(v, &[0, 0, at, 0], &[vs[0], vs[1], at + 1, vs[3]])?;
        self.t.advance(1);
        let used = self.held();
        let out = if used < keys.dim(2) {
            (keys.slice_axis(2, 0, used)?, values.slice_axis(2, 0, used)?)
        } else {
            (keys.share(), values.share())
        };
        self.keys = Some(keys);
        self.values = Some(values);
        Ok(out)
    }

    /// Whether a forward of `width` positions can be cut back afterwards:
    /// only while the ring does not wrap (it would have dropped positions
    /// a shorter prefix needs).
    pub fn can_trim_after(&self, width: i32) -> bool {
        self.t.len() + width <= self.window
    }

    /// Forgets the last `n` positions (see `can_trim_after`): before the ring
    /// wraps, slots are positions, so the next write overwrites them.
    pub fn trim(&mut self, n: i32) {
        debug_assert!(self.t.len() <= self.window);
        self.t.trim(n);
    }

    /// Stores the held positions given in temporal order.
    fn set_temporal(&mut self, k: Array, v: Array) {
        self.origin = self.t.len() - self.held();
        self.keys = Some(k);
        self.values = Some(v);
    }

    /// The held positions in temporal order (`[B, H, min(len, window), D]`).
    fn temporal(&self) -> Result<Option<(Array, Array)>> {
        let (Some(k), Some(v)) = (&self.keys, &self.values) else { return Ok(None) };
        let (len, w, held) = (self.t.len(), self.window, self.held());
        let first = (len - held - self.origin).rem_euclid(w);
        let order = |a: &Array| -> Result<Array> {
            if first == 0 {
                return Ok(a.slice_axis(2, 0, held)?);
            }
            // Wrapped (the ring is full): oldest from slot `first` on.
            Ok(Array::concatenate(&[&a.slice_axis(2, first, w)?, &a.slice_axis(2, 0, first)?], 2)?)
        };
        Ok(Some((order(k)?, order(v)?)))
    }

    /// `temporal`, or zeros shaped like `k`, `v` when there are no buffers.
    fn temporal_or_zeros(&self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        match self.temporal()? {
            Some(kv) => Ok(kv),
            None => Ok((zeros_positions(k, self.held())?, zeros_positions(v, self.held())?)),
        }
    }

    /// Prepends `n` padding positions to every row.
    fn pad_front(&mut self, n: i32) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let old = self.held();
        let contents = self.temporal()?;
        self.t.pad_front(n);
        let more = self.held() - old;
        match contents {
            Some((k, v)) if more > 0 => {
                let (zk, zv) = (zeros_positions(&k, more)?, zeros_positions(&v, more)?);
                let (k, v) = (Array::concatenate(&[&zk, &k], 2)?, Array::concatenate(&[&zv, &v], 2)?);
                self.set_temporal(k, v);
            }
            Some((k, v)) => self.set_temporal(k, v),
            None => self.origin = self.t.len() - self.held(),
        }
        Ok(())
    }

    /// Adds `other`'s rows after this cache's rows, right-aligning both
    /// timelines (the shorter one is left-padded). Either may have positions
    /// but no buffers yet (all padding); zeros stand in for them.
    pub fn extend(&mut self, mut other: RingCache) -> Result<()> {
        if other.window != self.window {
            return Err(Error::internal(format!("joining rings of windows {} and {}", self.window, other.window)));
        }
        let end = self.len().max(other.len());
        self.pad_front(end - self.len())?;
        other.pad_front(end - other.len())?;
        let (mine, theirs) = (self.temporal()?, other.temporal()?);
        let like = mine.as_ref().or(theirs.as_ref()).map(|(k, v)| (k.shape(), v.shape(), k.dtype()));
        let rows = self.rows();
        self.t.extend(&other.t);
        let Some((ks, vs, dt)) = like else { return Ok(()) };
        let held = self.held();
        let fill = |rows: usize, s: &[i32]| Array::zeros(&[rows as i32, s[1], held, s[3]], dt);
        let (k1, v1) = match mine {
            Some(kv) => kv,
            None => (fill(rows, &ks)?, fill(rows, &vs)?),
        };
        let (k2, v2) = match theirs {
            Some(kv) => kv,
            None => (fill(other.rows(), &ks)?, fill(other.rows(), &vs)?),
        };
        self.set_temporal(Array::concatenate(&[&k1, &k2], 0)?, Array::concatenate(&[&v1, &v2], 0)?);
        Ok(())
    }

    /// Keeps the rows `keep` (in that order) and drops padding all of them share.
    pub fn filter(&mut self, keep: &[usize]) -> Result<()> {
        let idx: Vec<i32> = keep.iter().map(|&r| r as i32).collect();
        let idx = Array::from_i32(&idx, &[idx.len() as i32])?;
        let contents = self.temporal()?;
        let old = self.held();
        self.t.filter(keep);
        let held = self.held();
        match contents {
            Some((k, v)) => {
                let cut = |a: Array| -> Result<Array> { Ok(a.take(&idx, 0)?.slice_axis(2, old - held, old)?) };
                self.set_temporal(cut(k)?, cut(v)?);
            }
            None => self.origin = self.t.len() - held,
        }
        Ok(())
    }

    /// Row `row`'s last `min(to, window)` positions before its own position
    /// `to` (0 = its first real token), in temporal order, as contiguous
    /// copies: what a ring restored at length `to` holds. Only positions the
    /// ring still holds can be taken.
    pub fn row_tail(&self, row: usize, to: i32) -> Result<(Array, Array)> {
        let (k, v) = self.temporal()?.ok_or_else(|| Error::internal("slicing an empty cache"))?;
        let (len, held, pad) = (self.t.len(), self.held(), self.t.pads()[row]);
        let (end, n) = (pad + to, to.min(self.window));
        if to > self.row_len(row) || end - n < len - held {
            return Err(Error::internal(format!(
                "a ring at {} positions of row {row} (window {}) cannot give its first {to}",
                self.row_len(row),
                self.window
            )));
        }
        let (r, from) = (row as i32, end - n - (len - held));
        let cut = |a: &Array| -> Result<Array> {
            let s = a.shape();
            Ok(a.slice(&[r, 0, from, 0], &[r + 1, s[1], from + n, s[3]], &[1, 1, 1, 1])?.contiguous()?)
        };
        Ok((cut(&k)?, cut(&v)?))
    }

    /// The arrays to evaluate so that the cache content is materialized.
    pub fn state(&self) -> Vec<&Array> {
        self.keys.iter().chain(self.values.iter()).collect()
    }

    /// Bytes held by the buffers (at most `window` positions per row).
    pub fn nbytes(&self) -> usize {
        self.state().iter().map(|a| a.nbytes()).sum()
    }
}

/// Zeros shaped like `a` with `n` positions (axis 2).
fn zeros_positions(a: &Array, n: i32) -> Result<Array> {
    let mut s = a.shape();
    s[2] = n;
    Ok(Array::zeros(&s, a.dtype())?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::KvCache;
    use crate::mlx::fast;

    const H: i32 = 2;
    const D: i32 = 4;

    /// Uniform values in [-1, 1) from a fixed seed.
    struct Rng(u64);

    impl Rng {
        fn arr(&mut self, shape: &[i32]) -> Array {
            let n: i32 = shape.iter().product();
            let v: Vec<f32> = (0..n)
                .map(|_| {
                    self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (self.0 >> 40) as f32 / (1u64 << 23) as f32 - 1.0
                })
                .collect();
            Array::from_f32(&v, shape).unwrap()
        }
    }

    /// A ring and a full-history cache fed the same keys and values; the
    /// full one attends with an explicit window mask over every position.
    struct Pair {
        ring: RingCache,
        dense: KvCache,
    }

    impl Pair {
        fn new(rows: usize, w: i32) -> Pair {
            Pair { ring: RingCache::new(rows, w), dense: KvCache::new(rows) }
        }

        /// `l` new tokens for every row: the outputs of every real query
        /// agree (≤ 1e-6).
        fn step(&mut self, rng: &mut Rng, l: i32) {
            let b = self.ring.rows() as i32;
            let (q, k, v) = (rng.arr(&[b, H, l, D]), rng.arr(&[b, H, l, D]), rng.arr(&[b, H, l, D]));
            let (len, w) = (self.dense.len(), self.ring.window());
            let pads = self.dense.timeline().pads().to_vec();
            assert_eq!(&pads[..], self.ring.timeline().pads());
            let mask = self.ring.mask(l).unwrap();
            let (rk, rv) = self.ring.update_and_fetch(&k, &v).unwrap();
            assert!(rk.dim(2) <= (w - 1 + l).max(w), "{} keys for a window of {w}", rk.dim(2));
            let got = fast::scaled_dot_product_attention(&q, &rk, &rv, 0.5, mask.as_mask()).unwrap();
            let crate::cache::KvView::Dense { keys: dk, values: dv } = self.dense.update(&k, &v).unwrap() else {
                panic!("a dense cache gives dense views")
            };
            let t = len + l;
            let mut m = vec![];
            for &pad in &pads {
                for i in 0..l {
                    let qp = len + i;
                    m.extend((0..t).map(|p| (p <= qp && qp - p < w && p >= pad) as i32));
                }
            }
            let m = Array::from_i32(&m, &[b, 1, l, t]).unwrap().greater_equal(&Array::scalar_i32(1).unwrap()).unwrap();
            let want = fast::scaled_dot_product_attention(&q, &dk, &dv, 0.5, fast::Mask::Array(&m)).unwrap();
            let (got, want) = (got.to_vec_f32().unwrap(), want.to_vec_f32().unwrap());
            for r in 0..b {
                for i in (0..l).filter(|&i| len + i >= pads[r as usize]) {
                    for j in 0..H * D {
                        let at = (((r * H + j / D) * l + i) * D + j % D) as usize;
                        let (g, x) = (got[at], want[at]);
                        assert!((g - x).abs() <= 1e-6, "row {r} query {} (len {len}, L {l}): {g} vs {x}", len + i);
                    }
                }
            }
        }

        fn extend(&mut self, other: Pair) {
            self.ring.extend(other.ring).unwrap();
            self.dense.extend(other.dense).unwrap();
            assert_eq!(self.ring.timeline(), self.dense.timeline());
        }

        fn filter(&mut self, keep: &[usize]) {
            self.ring.filter(keep).unwrap();
            self.dense.filter(keep).unwrap();
            assert_eq!(self.ring.timeline(), self.dense.timeline());
        }
    }

    #[test]
    fn one_row_matches_the_dense_window() {
        let mut rng = Rng(1);
        let mut p = Pair::new(1, 5);
        // Short block, tokens one by one across the wrap, a block longer than
        // the window, more wraps, a short block on a wrapped ring.
        for l in [3, 1, 1, 1, 1, 1, 12, 1, 1, 1, 1, 1, 1, 1, 2, 1, 7, 1] {
            p.step(&mut rng, l);
        }
        assert_eq!(p.ring.len(), 38);
    }

    #[test]
    fn batches_join_leave_and_pad_as_the_dense_window() {
        let mut rng = Rng(2);
        let mut a = Pair::new(1, 6);
        for l in [9, 1, 1] {
            a.step(&mut rng, l);
        }
        // A short row joins (left-padded), then a row whose prompt starts 2
        // positions later (padding past the end).
        let mut b = Pair::new(1, 6);
        b.step(&mut rng, 2);
        a.extend(b);
        let mut c = Pair::new(1, 6);
        c.ring.set_padding(&[2]);
        c.dense.set_padding(&[2]);
        a.extend(c);
        for l in [1, 1, 4, 1, 1, 1, 1, 1, 1, 1, 15, 1, 1] {
            a.step(&mut rng, l);
        }
        // The longest row leaves: shared padding goes.
        a.filter(&[1, 2]);
        for l in [1, 1, 3] {
            a.step(&mut rng, l);
        }
        // A longer row joins a wrapped ring: the others get padding.
        let mut d = Pair::new(1, 6);
        d.step(&mut rng, 40);
        a.extend(d);
        for l in [1, 1, 1, 1, 1, 1, 1, 8, 1] {
            a.step(&mut rng, l);
        }
        a.filter(&[2]);
        for l in [1, 1, 1] {
            a.step(&mut rng, l);
        }
    }

    #[test]
    fn memory_stays_within_the_window() {
        let mut rng = Rng(3);
        let w = 8;
        let mut c = RingCache::new(1, w);
        let mut at = vec![];
        for i in 1..=5 * w {
            let (k, v) = (rng.arr(&[1, H, 1, D]), rng.arr(&[1, H, 1, D]));
            c.update_and_fetch(&k, &v).unwrap();
            if i % (2 * w) == 0 || i == 5 * w {
                at.push(c.nbytes());
            }
        }
        let full = (2 * H * w * D * 4) as usize;
        assert_eq!(at, vec![full, full, full], "bytes at 2W, 4W, 5W");
        // A block of 3W tokens keeps the last W only.
        let (k, v) = (rng.arr(&[1, H, 3 * w, D]), rng.arr(&[1, H, 3 * w, D]));
        let (keys, _) = c.update_and_fetch(&k, &v).unwrap();
        assert_eq!(keys.dim(2), w - 1 + 3 * w);
        assert_eq!(c.nbytes(), full);
    }

    #[test]
    fn a_window_longer_than_a_growth_step() {
        let mut rng = Rng(5);
        let w = 300;
        let mut p = Pair::new(1, w);
        p.step(&mut rng, 10);
        let mut caps = vec![];
        // One by one past the first growth step (256) and the wrap.
        for _ in 0..310 {
            p.step(&mut rng, 1);
            caps.push(p.ring.nbytes() / (2 * H * D * 4) as usize);
        }
        caps.dedup();
        assert_eq!(caps, vec![256, 300]);
        for l in [5, 1, 1, 400, 1] {
            p.step(&mut rng, l);
        }
        assert_eq!(p.ring.nbytes(), (2 * H * w * D * 4) as usize);
    }

    #[test]
    fn a_row_tail_restores_the_row() {
        let mut rng = Rng(4);
        let mut a = Pair::new(1, 5);
        a.step(&mut rng, 13);
        let mut b = Pair::new(1, 5);
        b.step(&mut rng, 3);
        a.extend(b);
        for _ in 0..4 {
            a.step(&mut rng, 1);
        }
        // Row 1 holds 7 tokens; a ring at 7 cannot give 5 (dropped), the
        // full cache can.
        assert!(a.ring.row_tail(1, 5).is_err());
        let (k, v) = a.ring.row_tail(1, 7).unwrap();
        assert_eq!(k.dim(2), 5);
        let (dk, dv) = a.dense.row_slice(1, 0, 7).unwrap();
        let mut r = Pair { ring: RingCache::from_snapshot(k, v, 7, 5).unwrap(), dense: KvCache::from_prefix(dk, dv) };
        for l in [1, 1, 6, 1] {
            r.step(&mut rng, l);
        }
        // Before the ring wraps any prefix can be taken.
        let mut s = Pair::new(1, 5);
        s.step(&mut rng, 4);
        assert_eq!(s.ring.row_tail(0, 2).unwrap().0.dim(2), 2);
    }
}
