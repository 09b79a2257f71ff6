//! The recurrent state of one linear-attention layer (Gated DeltaNet) for a
//! batch of left-padded rows: the last `kernel - 1` inputs of its causal
//! convolution and the `[heads, d_v, d_k]` f32 recurrence. Unlike a KV cache
//! it summarizes the whole history in a fixed size, so it cannot be cut back
//! to a shorter prefix: a snapshot is valid at exactly its length.
//!
//! Rows share one timeline with the model's KV caches (`Timeline`: `len`
//! positions, leading padding per row). Padding positions must leave a row's state
//! untouched; `token_mask` tells the layer which positions are real.

use super::Timeline;
use crate::error::{Error, Result};
use crate::mlx::Array;

/// A `StateCache` as it was (see `StateCache::checkpoint`).
pub struct StateCheckpoint {
    conv: Option<Array>,
    state: Option<Array>,
    t: Timeline,
}

pub struct StateCache {
    /// `[B, kernel - 1, channels]`: the convolution's inputs carried over.
    conv: Option<Array>,
    /// `[B, heads, d_v, d_k]` (f32): the recurrent state.
    state: Option<Array>,
    t: Timeline,
}

impl StateCache {
    pub fn new(rows: usize) -> StateCache {
        StateCache { conv: None, state: None, t: Timeline::new(rows) }
    }

    /// A one-row cache holding the state after exactly `len` tokens.
    pub fn from_snapshot(conv: Array, state: Array, len: i32) -> StateCache {
        StateCache { conv: Some(conv), state: Some(state), t: Timeline::single(len) }
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

    pub fn len(&self) -> i32 {
        self.t.len()
    }

    pub fn is_empty(&self) -> bool {
        self.t.is_empty()
    }

    pub fn row_len(&self, row: usize) -> i32 {
        self.t.row_len(row)
    }

    /// `[B, n]` bool, true where one of the next `n` positions is a real
    /// token of the row; None when all of them are.
    pub fn token_mask(&self, n: i32) -> Result<Option<Array>> {
        let (len, pad) = (self.t.len(), self.t.pads());
        if pad.iter().all(|&p| p <= len) {
            return Ok(None);
        }
        let b = self.rows() as i32;
        let pos = Array::arange(len, len + n)?.reshape(&[1, n])?;
        let pad = Array::from_i32(pad, &[b, 1])?;
        Ok(Some(pos.greater_equal(&pad)?))
    }

    pub fn conv(&self) -> Option<&Array> {
        self.conv.as_ref()
    }

    pub fn recurrent(&self) -> Option<&Array> {
        self.state.as_ref()
    }

    /// The state as it is now, to go back to with `rewind` (a speculative
    /// verify step whose drafts were rejected replays the accepted ones
    /// from it). Arrays are immutable: this keeps references, not copies.
    pub fn checkpoint(&self) -> StateCheckpoint {
        StateCheckpoint { conv: self.conv.as_ref().map(Array::share), state: self.state.as_ref().map(Array::share), t: self.t.clone() }
    }

    /// Back to the state of `checkpoint`.
    pub fn rewind(&mut self, cp: StateCheckpoint) {
        (self.conv, self.state, self.t) = (cp.conv, cp.state, cp.t);
    }

    /// Stores the state after `n` more positions.
    pub fn update(&mut self, conv: Array, state: Array, n: i32) -> Result<()> {
        if conv.dim(0) as usize != self.rows() || state.dim(0) as usize != self.rows() {
            return Err(Error::internal(format!("state cache has {} rows, update has {}", self.rows(), conv.dim(0))));
        }
        self.conv = Some(conv);
        self.state = Some(state);
        self.t.advance(n);
        Ok(())
    }

    /// Adds `other`'s rows after this cache's rows on a common timeline (the
    /// shorter one gains leading padding; the state does not depend on it).
    /// Rows without a state yet get zeros, which is a fresh state.
    pub fn extend(&mut self, mut other: StateCache) -> Result<()> {
        let end = self.len().max(other.len());
        for c in [&mut *self, &mut other] {
            let d = end - c.len();
            c.t.pad_front(d);
        }
        let (a, b) = (self.rows() as i32, other.rows() as i32);
        let cat = |x: Option<Array>, y: Option<Array>| -> Result<Option<Array>> {
            let like = match (&x, &y) {
                (Some(t), _) | (None, Some(t)) => (t.shape(), t.dtype()),
                (None, None) => return Ok(None),
            };
            let fill = |rows: i32| {
                let mut s = like.0.clone();
                s[0] = rows;
                Array::zeros(&s, like.1)
            };
            let x = match x {
                Some(x) => x,
                None => fill(a)?,
            };
            let y = match y {
                Some(y) => y,
                None => fill(b)?,
            };
            Ok(Some(Array::concatenate(&[&x, &y], 0)?))
        };
        self.conv = cat(self.conv.take(), other.conv.take())?;
        self.state = cat(self.state.take(), other.state.take())?;
        self.t.extend(&other.t);
        Ok(())
    }

    /// Keeps the rows `keep` (in that order) and drops padding all share.
    pub fn filter(&mut self, keep: &[usize]) -> Result<()> {
        let idx: Vec<i32> = keep.iter().map(|&r| r as i32).collect();
        let idx = Array::from_i32(&idx, &[keep.len() as i32])?;
        for a in [&mut self.conv, &mut self.state] {
            if let Some(x) = a.take() {
                *a = Some(x.take(&idx, 0)?);
            }
        }
        // The state does not depend on padding: nothing to cut.
        self.t.filter(keep);
        Ok(())
    }

    /// Row `row`'s convolution and recurrent state (contiguous copies); only
    /// valid at its current length, so `len` must equal it.
    pub fn row_state(&self, row: usize, len: i32) -> Result<(Array, Array)> {
        if len != self.row_len(row) {
            return Err(Error::internal(format!(
                "a recurrent state holds exactly {} positions, asked for {len}",
                self.row_len(row)
            )));
        }
        let (Some(c), Some(s)) = (&self.conv, &self.state) else {
            return Err(Error::internal("snapshot of an empty state cache"));
        };
        let r = row as i32;
        Ok((c.slice_axis(0, r, r + 1)?.contiguous()?, s.slice_axis(0, r, r + 1)?.contiguous()?))
    }

    pub fn state(&self) -> Vec<&Array> {
        self.conv.iter().chain(self.state.iter()).collect()
    }

    pub fn nbytes(&self) -> usize {
        self.state().iter().map(|a| a.nbytes()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlx::Dtype;

    fn filled(rows: i32, v: f32) -> (Array, Array) {
        let c = Array::zeros(&[rows, 2, 3], Dtype::F32).unwrap().add_scalar(v).unwrap();
        let s = Array::zeros(&[rows, 1, 2, 2], Dtype::F32).unwrap().add_scalar(v).unwrap();
        (c, s)
    }

    #[test]
    fn extend_filter_and_masks() {
        let mut a = StateCache::new(1);
        let (c, s) = filled(1, 1.0);
        a.update(c, s, 5).unwrap();
        // A row that joins with 2 positions of its prompt still ahead.
        let mut b = StateCache::new(1);
        b.set_padding(&[2]);
        a.extend(b).unwrap();
        assert_eq!((a.rows(), a.len(), a.row_len(0), a.row_len(1)), (2, 5, 5, 0));
        let m = a.token_mask(3).unwrap().expect("row 1 is padded");
        assert_eq!(m.to_vec_i32().unwrap(), vec![1, 1, 1, 0, 0, 1]);
        assert_eq!(a.recurrent().unwrap().to_vec_f32().unwrap()[4..], [0.0; 4], "fresh rows start at zero");
        assert!(a.row_state(0, 4).is_err(), "a state cannot be cut back");
        assert!(a.row_state(0, 5).is_ok());
        a.filter(&[1]).unwrap();
        assert_eq!((a.rows(), a.len(), a.row_len(0)), (1, 0, 0), "shared padding dropped");
        assert!(a.token_mask(3).unwrap().is_some());
        let (c, s) = filled(1, 2.0);
        a.update(c, s, 3).unwrap();
        assert_eq!(a.row_len(0), 1);
        assert!(a.token_mask(1).unwrap().is_none());
    }
}
