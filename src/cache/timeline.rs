//! The timeline a batch's layer caches share: `len` positions written for
//! every row, of which row `r`'s first `pad[r]` are left padding it never
//! attends to (its history is shorter, or its prompt starts later). Every
//! kind of layer cache (`KvCache`, `RingCache`, `StateCache`) keeps one and moves it the
//! same way, so all layers of a batch stay aligned.

use super::Positions;
use crate::error::Result;
use crate::mlx::Array;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timeline {
    /// Positions written (the same for every row).
    len: i32,
    /// Left padding of each row; may run past `len` for a row whose prompt
    /// starts later.
    pad: Vec<i32>,
}

impl Timeline {
    /// An empty timeline for `rows` rows.
    pub fn new(rows: usize) -> Timeline {
        Timeline { len: 0, pad: vec![0; rows] }
    }

    /// One row holding `len` positions, without padding.
    pub fn single(len: i32) -> Timeline {
        Timeline { len, pad: vec![0] }
    }

    /// Declares left padding for the rows of an empty timeline; padding may
    /// run past what is written (those rows' prompts start later).
    pub fn set_padding(&mut self, pads: &[i32]) {
        debug_assert!(self.len == 0 && pads.len() == self.pad.len());
        self.pad = pads.to_vec();
    }

    pub fn rows(&self) -> usize {
        self.pad.len()
    }

    /// Physical length (positions written, padding included).
    pub fn len(&self) -> i32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Left padding of each row.
    pub fn pads(&self) -> &[i32] {
        &self.pad
    }

    /// Positions `row` holds (its length without padding; 0 while its
    /// padding runs past what is written).
    pub fn row_len(&self, row: usize) -> i32 {
        (self.len - self.pad[row]).max(0)
    }

    /// Whether rows are padded differently (else one position serves all).
    pub fn ragged(&self) -> bool {
        self.pad.iter().any(|&p| p != self.pad[0])
    }

    /// RoPE positions of the next tokens: one offset for all rows, or one
    /// per row when they are padded differently.
    pub fn positions(&self) -> Result<Positions> {
        if !self.ragged() {
            return Ok(Positions::Same(self.len - self.pad[0]));
        }
        let off: Vec<i32> = self.pad.iter().map(|&p| self.len - p).collect();
        Ok(Positions::PerRow(Array::from_i32(&off, &[off.len() as i32])?))
    }

    /// Records `n` more positions written for every row.
    pub fn advance(&mut self, n: i32) {
        self.len += n;
    }

    /// Forgets the last `n` positions of every row (rejected speculative
    /// tokens); the buffers keep them until the next write overwrites them.
    pub fn trim(&mut self, n: i32) {
        debug_assert!(n >= 0 && n <= self.len);
        self.len -= n;
    }

    /// Prepends `n` padding positions to every row.
    pub fn pad_front(&mut self, n: i32) {
        self.len += n;
        self.pad.iter_mut().for_each(|p| *p += n);
    }

    /// Adds `other`'s rows after these; both must have the same length
    /// (right-align them first with `pad_front`).
    pub fn extend(&mut self, other: &Timeline) {
        debug_assert_eq!(self.len, other.len);
        self.pad.extend_from_slice(&other.pad);
    }

    /// Keeps the rows `keep` (in that order), then drops the leading
    /// positions all of them pad; returns how many were dropped (the caller
    /// cuts them from its buffers).
    pub fn filter(&mut self, keep: &[usize]) -> i32 {
        self.pad = keep.iter().map(|&r| self.pad[r]).collect();
        let shared = self.pad.iter().copied().min().unwrap_or(0).min(self.len);
        self.len -= shared;
        self.pad.iter_mut().for_each(|p| *p -= shared);
        shared
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pads_extends_and_filters() {
        let mut a = Timeline::single(5);
        let mut b = Timeline::new(1);
        b.set_padding(&[7]);
        assert_eq!(b.row_len(0), 0, "padding past the end holds nothing");
        b.pad_front(5);
        a.extend(&b);
        assert_eq!((a.rows(), a.len(), a.row_len(0), a.row_len(1)), (2, 5, 5, 0));
        assert!(a.ragged());
        a.advance(10);
        assert_eq!((a.row_len(0), a.row_len(1)), (15, 3));
        let Positions::PerRow(p) = a.positions().unwrap() else { panic!("rows are padded differently") };
        assert_eq!(p.to_vec_i32().unwrap(), vec![15, 3]);
        assert_eq!(a.filter(&[1]), 12, "the padding the kept row has alone goes");
        assert_eq!((a.len(), a.pads(), a.ragged()), (3, &[0][..], false));
        assert!(matches!(a.positions().unwrap(), Positions::Same(3)));
    }
}
