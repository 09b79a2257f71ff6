//! The timeline a batch's layer caches share: `len` positions written for
//! every row, of which row `r`'s first `pad[r]` are left padding it never
//! attends to (its history is shorter, or its prompt starts later). Every
//! kind of layer cache (`KvCache`, `RingCache`, `StateCache`) keeps one and moves it the
//! same way, so all layers of a batch stay aligned.
//!
//! A row may also carry a RoPE delta: its next position is its length plus
//! the delta (Qwen3-VL's multimodal RoPE packs an image's tokens into fewer
//! positions than it has tokens; the text after it continues from there).
//! Rows with other deltas (0 for text) still decode in one batch.
//!
//! A row may also have holes: positions after its padding that it never
//! attends to either. A speculative verify step writes the same number of
//! positions for every row, but rows accept different numbers of drafts;
//! the batch keeps the longest run and each shorter row's rejected slots
//! become its holes (`punch`). Only full-attention KV caches hold holes
//! (`LayerCache::can_punch`): a ring's window and a recurrent state count
//! positions, not slots.

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
    /// Each row's holes: ascending slots in `pad[r]..len`.
    holes: Vec<Vec<i32>>,
    /// Each row's RoPE delta.
    delta: Vec<i32>,
}

impl Timeline {
    /// An empty timeline for `rows` rows.
    pub fn new(rows: usize) -> Timeline {
        Timeline { len: 0, pad: vec![0; rows], holes: vec![vec![]; rows], delta: vec![0; rows] }
    }

    /// One row holding `len` positions, without padding.
    pub fn single(len: i32) -> Timeline {
        Timeline { len, pad: vec![0], holes: vec![vec![]], delta: vec![0] }
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

    /// Positions `row` holds (its length without padding and holes; 0
    /// while its padding runs past what is written).
    pub fn row_len(&self, row: usize) -> i32 {
        (self.len - self.pad[row]).max(0) - self.holes[row].len() as i32
    }

    /// Whether rows are padded differently or have holes (else one
    /// position serves all, and only causality masks).
    pub fn ragged(&self) -> bool {
        self.has_holes() || self.pad.iter().any(|&p| p != self.pad[0])
    }

    pub fn has_holes(&self) -> bool {
        self.holes.iter().any(|h| !h.is_empty())
    }

    /// Sets `row`'s RoPE delta.
    pub fn set_delta(&mut self, row: usize, delta: i32) {
        self.delta[row] = delta;
    }

    /// RoPE positions of the next tokens: one offset for all rows, or one
    /// per row when they are ragged or their deltas differ.
    pub fn positions(&self) -> Result<Positions> {
        let same_delta = self.delta.iter().all(|&d| d == self.delta[0]);
        if !self.ragged() && same_delta {
            return Ok(Positions::Same(self.len - self.pad[0] + self.delta[0]));
        }
        // Negative for a row whose padding runs past what is written: its
        // first token lands at position 0 in a later chunk.
        let off: Vec<i32> = (0..self.rows()).map(|r| self.len - self.pad[r] - self.holes[r].len() as i32 + self.delta[r]).collect();
        Ok(Positions::PerRow(Array::from_i32(&off, &[off.len() as i32])?))
    }

    /// Whether each slot of `0..total` is one of each row's positions
    /// (after its padding, not a hole), row after row: the key side of the
    /// attention mask.
    pub fn attended(&self, total: i32) -> Vec<bool> {
        let mut out = Vec::with_capacity(self.rows() * total as usize);
        for (pad, holes) in self.pad.iter().zip(&self.holes) {
            let start = out.len();
            out.extend((0..total).map(|k| k >= *pad));
            for &h in holes {
                out[start + h as usize] = false;
            }
        }
        out
    }

    /// The slots of `row`'s positions `from..to` (0 = its first token).
    pub fn slots(&self, row: usize, from: i32, to: i32) -> Vec<i32> {
        let holes = &self.holes[row];
        let mut out = Vec::with_capacity((to - from).max(0) as usize);
        let (mut slot, mut h, mut pos) = (self.pad[row], 0, 0);
        while pos < to {
            if holes.get(h) == Some(&slot) {
                h += 1;
            } else {
                if pos >= from {
                    out.push(slot);
                }
                pos += 1;
            }
            slot += 1;
        }
        out
    }

    /// Makes slots `from..to` holes of `row` (written, never attended).
    pub fn punch(&mut self, row: usize, from: i32, to: i32) {
        debug_assert!(from >= self.pad[row] && to <= self.len);
        let holes = &mut self.holes[row];
        debug_assert!(holes.last().is_none_or(|&h| h < from));
        holes.extend(from..to);
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
        let len = self.len;
        self.holes.iter_mut().for_each(|h| h.retain(|&s| s < len));
    }

    /// Prepends `n` padding positions to every row.
    pub fn pad_front(&mut self, n: i32) {
        self.len += n;
        self.pad.iter_mut().for_each(|p| *p += n);
        self.holes.iter_mut().flatten().for_each(|s| *s += n);
    }

    /// Adds `other`'s rows after these; both must have the same length
    /// (right-align them first with `pad_front`).
    pub fn extend(&mut self, other: &Timeline) {
        debug_assert_eq!(self.len, other.len);
        self.pad.extend_from_slice(&other.pad);
        self.holes.extend_from_slice(&other.holes);
        self.delta.extend_from_slice(&other.delta);
    }

    /// Keeps the rows `keep` (in that order), then drops the leading
    /// positions all of them pad; returns how many were dropped (the caller
    /// cuts them from its buffers).
    pub fn filter(&mut self, keep: &[usize]) -> i32 {
        self.pad = keep.iter().map(|&r| self.pad[r]).collect();
        self.holes = keep.iter().map(|&r| self.holes[r].clone()).collect();
        self.delta = keep.iter().map(|&r| self.delta[r]).collect();
        let shared = self.pad.iter().copied().min().unwrap_or(0).min(self.len);
        self.len -= shared;
        self.pad.iter_mut().for_each(|p| *p -= shared);
        self.holes.iter_mut().flatten().for_each(|s| *s -= shared);
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

    #[test]
    fn rope_deltas_move_with_the_rows() {
        let mut a = Timeline::single(10);
        a.set_delta(0, -6);
        assert!(matches!(a.positions().unwrap(), Positions::Same(4)), "one row: its length plus its delta");
        let b = Timeline::single(10);
        a.extend(&b);
        assert!(!a.ragged(), "a delta is no padding");
        let Positions::PerRow(p) = a.positions().unwrap() else { panic!("deltas differ") };
        assert_eq!(p.to_vec_i32().unwrap(), vec![4, 10]);
        a.advance(1);
        assert_eq!(a.filter(&[1, 0]), 0);
        let Positions::PerRow(p) = a.positions().unwrap() else { panic!("deltas differ") };
        assert_eq!(p.to_vec_i32().unwrap(), vec![11, 5], "the delta follows its row");
        a.filter(&[1]);
        assert!(matches!(a.positions().unwrap(), Positions::Same(5)));
    }

    #[test]
    fn holes_move_with_the_rows() {
        let mut a = Timeline::single(4);
        let mut b = Timeline::new(1);
        b.set_padding(&[2]);
        b.advance(4);
        a.extend(&b);
        a.advance(3); // a verify step of width 3: row 0 keeps 3, row 1 keeps 1
        a.punch(1, 5, 7);
        assert_eq!((a.row_len(0), a.row_len(1)), (7, 3));
        assert!(a.ragged() && a.has_holes());
        let Positions::PerRow(p) = a.positions().unwrap() else { panic!("holes make rows ragged") };
        assert_eq!(p.to_vec_i32().unwrap(), vec![7, 3]);
        assert_eq!(a.slots(1, 0, 3), vec![2, 3, 4]);
        a.advance(1);
        assert_eq!(a.slots(1, 1, 4), vec![3, 4, 7]);
        let keys: Vec<bool> = a.attended(9).into_iter().skip(9).collect();
        assert_eq!(keys, [false, false, true, true, true, false, false, true, true]);
        a.trim(2);
        assert_eq!((a.len(), a.row_len(1)), (6, 3), "trimming drops the holes it passes");
        a.advance(2);
        a.pad_front(1);
        assert_eq!(a.slots(1, 0, 5), vec![3, 4, 5, 7, 8]);
        assert_eq!(a.filter(&[1]), 3);
        assert_eq!((a.len(), a.row_len(0)), (6, 5));
        assert_eq!(a.slots(0, 0, 5), vec![0, 1, 2, 4, 5]);
    }
}
