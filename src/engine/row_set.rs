//! Rows and their per-layer caches, kept in step: what a prefill cohort and
//! the decode batch have in common. Row `i` of `rows` is row `i` of every
//! layer cache; adding and removing rows keeps it so.

use super::prompt_cache::Snapshot;
use super::row::Row;
use crate::cache::LayerCache;
use crate::error::Result;
use crate::mlx::{self, Array};

#[derive(Default)]
pub(crate) struct RowSet {
    pub rows: Vec<Row>,
    cache: Vec<LayerCache>,
}

/// A prompt-cache snapshot a step offers: the first `tokens.len()` positions
/// of row `row`, in `namespace`. The scheduler takes the ones the prompt
/// cache wants (`RowSet::snapshot`) before the row leaves.
pub(crate) struct Offer {
    pub row: usize,
    pub namespace: String,
    pub tokens: Vec<u32>,
}

impl RowSet {
    pub fn new(rows: Vec<Row>, cache: Vec<LayerCache>) -> RowSet {
        RowSet { rows, cache }
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn cache(&self) -> &[LayerCache] {
        &self.cache
    }

    pub fn cache_mut(&mut self) -> &mut Vec<LayerCache> {
        &mut self.cache
    }

    pub fn kv_bytes(&self) -> usize {
        self.cache.iter().map(LayerCache::nbytes).sum()
    }

    /// KV bytes held dense and quantized.
    pub fn kv_bytes_by_kind(&self) -> (usize, usize) {
        self.cache.iter().map(LayerCache::kv_bytes_by_kind).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }

    /// KV bytes reserved by all rows.
    pub fn reserved(&self) -> usize {
        self.rows.iter().map(|r| r.kv_reserved).sum()
    }

    /// Tokens the caches hold for `row`.
    pub fn row_len(&self, row: usize) -> i32 {
        self.cache.first().map_or(0, |c| c.row_len(row))
    }

    /// Adds `other`'s rows after these (caches right-aligned, see
    /// `KvCache::extend`). On error the set is unusable.
    pub fn extend(&mut self, other: RowSet) -> Result<()> {
        if self.rows.is_empty() {
            *self = other;
            return Ok(());
        }
        for (mine, theirs) in self.cache.iter_mut().zip(other.cache) {
            mine.extend(theirs)?;
        }
        self.rows.extend(other.rows);
        Ok(())
    }

    /// Keeps the rows `keep` (ascending indices) and their cache rows;
    /// returns the KV bytes reserved by the rows that left.
    pub fn retain(&mut self, keep: &[usize]) -> Result<usize> {
        if keep.len() == self.rows.len() {
            return Ok(0);
        }
        let freed = self.reserved() - keep.iter().map(|&i| self.rows[i].kv_reserved).sum::<usize>();
        if keep.is_empty() {
            *self = RowSet::default();
            return Ok(freed);
        }
        let mut rows: Vec<Option<Row>> = std::mem::take(&mut self.rows).into_iter().map(Some).collect();
        self.rows = keep.iter().map(|&i| rows[i].take().expect("each index once")).collect();
        for c in &mut self.cache {
            c.filter(keep)?;
        }
        Ok(freed)
    }

    /// Moves the rows `leave` (ascending indices) with their positions into
    /// a set of their own (each row's caches copied out of the shared
    /// buffers, or its blocks shared when paged); the others stay.
    pub fn split_off(&mut self, leave: &[usize]) -> Result<RowSet> {
        // Everything that can fail runs before a row moves: on error every
        // row is still here (and the caller ends them).
        let mut out: Option<Vec<LayerCache>> = None;
        for &i in leave {
            let len = self.row_len(i);
            let cache = self.cache.iter().map(|c| c.snapshot_row(i, len, false)?.restore(len)).collect::<Result<Vec<_>>>()?;
            match &mut out {
                None => out = Some(cache),
                Some(o) => o.iter_mut().zip(cache).try_for_each(|(a, b)| a.extend(b))?,
            }
        }
        let out = out.unwrap_or_default();
        // Evaluated now: a lazy copy would keep the shared buffers
        // referenced, and the next write into them would copy them whole.
        mlx::eval(&out.iter().flat_map(LayerCache::state).collect::<Vec<&Array>>())?;
        let keep: Vec<usize> = (0..self.rows.len()).filter(|i| !leave.contains(i)).collect();
        for c in &mut self.cache {
            c.filter(&keep)?;
        }
        let mut rows: Vec<Option<Row>> = std::mem::take(&mut self.rows).into_iter().map(Some).collect();
        let moved = leave.iter().map(|&i| rows[i].take().expect("each index once")).collect();
        self.rows = rows.into_iter().flatten().collect();
        Ok(RowSet::new(moved, out))
    }

    /// Ends every row with `f` (cancel at shutdown, or an error) and empties
    /// the set; returns the KV bytes they reserved.
    pub fn end_all(&mut self, mut f: impl FnMut(&mut Row)) -> usize {
        let freed = self.reserved();
        for r in &mut self.rows {
            f(r);
        }
        *self = RowSet::default();
        freed
    }

    /// Row `row`'s first `len` positions (see `Snapshot::of_row`).
    pub fn snapshot(&self, row: usize, len: usize, shared: bool) -> Result<Snapshot> {
        Snapshot::of_row(&self.cache, row, len as i32, shared)
    }
}

/// Keeps the entries `keep` (ascending indices) of a per-row vector.
pub(crate) fn keep_rows<T>(v: &mut Vec<T>, keep: &[usize]) {
    let mut i = 0;
    v.retain(|_| {
        let k = keep.binary_search(&i).is_ok();
        i += 1;
        k
    });
}
