//! A prefill cohort: requests whose prompts are processed together, chunk by
//! chunk, as one left-padded batch right-aligned on a common last position.
//! Later arrivals whose prompts fit in the part not processed yet join
//! between forwards. The last position is forwarded on its own to produce
//! every row's first token (mlx-lm's tail split); the cohort then joins the
//! decode batch.

use super::batch::{sample_rows, Drawn};
use super::prompt_cache::Snapshot;
use super::row::Row;
use super::FinishReason;
use crate::cache::LayerCache;
use crate::error::Result;
use crate::mlx::{self, Array};
use crate::model::{LanguageModel, Output};

pub(crate) struct Cohort {
    pub rows: Vec<Row>,
    cache: Vec<LayerCache>,
    /// Aligned length: every prompt ends at position `total - 1`.
    total: i32,
    /// Positions already in the cache.
    done: i32,
    /// Boundary snapshots taken while prefilling (models whose caches cannot
    /// be cut back: their state is only valid at the boundary itself).
    held: Vec<(String, Vec<u32>, Snapshot)>,
}

impl Cohort {
    pub fn new(model: &dyn LanguageModel, rows: Vec<Row>) -> Cohort {
        let total = rows.iter().map(|r| r.prompt.len() as i32).max().unwrap_or(0);
        let pads: Vec<i32> = rows.iter().map(|r| total - r.prompt.len() as i32).collect();
        let mut cache = model.new_cache(rows.len());
        for c in &mut cache {
            c.set_padding(&pads);
        }
        Cohort { rows, cache, total, done: 0, held: vec![] }
    }

    /// A cohort for one row whose first `done` prompt positions are already in
    /// `cache` (from the prompt cache).
    pub fn with_prefix(row: Row, cache: Vec<LayerCache>, done: usize) -> Cohort {
        let total = row.prompt.len() as i32;
        Cohort { rows: vec![row], cache, total, done: done as i32, held: vec![] }
    }

    /// Snapshots of each row's prompt up to its cache boundary, for rows that
    /// want one (call once prefill is over).
    pub fn boundary_snapshots(&mut self, min_tokens: usize) -> Result<Vec<(String, Vec<u32>, Snapshot)>> {
        if !self.trimmable() {
            return Ok(std::mem::take(&mut self.held));
        }
        let mut out = vec![];
        for (i, r) in self.rows.iter().enumerate() {
            if let Some(b) = r.boundary.filter(|&b| r.use_cache && b >= min_tokens && b > r.cached) {
                out.push((r.namespace.clone(), r.prompt[..b].to_vec(), Snapshot::of_row(&self.cache, i, b as i32)?));
            }
        }
        Ok(out)
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Prompt positions not processed yet (a joining prompt must fit in them).
    pub fn remaining(&self) -> i32 {
        self.total - self.done
    }

    pub fn kv_bytes(&self) -> usize {
        self.cache.iter().map(LayerCache::nbytes).sum()
    }

    /// Adds a row whose prompt fits in `remaining()`. On error the cohort
    /// (with the row) is unusable.
    pub fn join(&mut self, row: Row) -> Result<()> {
        let pad = self.total - row.prompt.len() as i32;
        if pad < self.done {
            return Err(crate::Error::internal("a prompt joined a cohort it does not fit in"));
        }
        self.rows.push(row);
        for c in &mut self.cache {
            let mut fresh = c.empty_like(1);
            fresh.set_padding(&[pad - self.done]);
            c.extend(fresh)?;
        }
        Ok(())
    }

    /// Token ids of positions `from..to` for every row (`[B, to - from]`);
    /// padding positions get id 0, which attention never looks at.
    fn tokens(&self, from: i32, to: i32) -> Result<Array> {
        let mut ids = Vec::with_capacity(self.rows.len() * (to - from) as usize);
        for r in &self.rows {
            let start = self.total - r.prompt.len() as i32;
            ids.extend((from..to).map(|p| if p < start { 0 } else { r.prompt[(p - start) as usize] as i32 }));
        }
        Ok(Array::from_i32(&ids, &[self.rows.len() as i32, to - from])?)
    }

    /// Drops cancelled rows (ending them); returns their KV reservations.
    pub fn drop_cancelled(&mut self) -> Result<usize> {
        if !self.rows.iter().any(Row::is_cancelled) {
            return Ok(0);
        }
        let keep: Vec<usize> = (0..self.rows.len()).filter(|&i| !self.rows[i].is_cancelled()).collect();
        let mut freed = 0;
        for r in self.rows.iter_mut().filter(|r| r.is_cancelled()) {
            r.finish(FinishReason::Cancelled, None);
            freed += r.kv_reserved;
        }
        let mut rows: Vec<Option<Row>> = std::mem::take(&mut self.rows).into_iter().map(Some).collect();
        self.rows = keep.iter().map(|&i| rows[i].take().expect("each index once")).collect();
        if !self.rows.is_empty() {
            for c in &mut self.cache {
                c.filter(&keep)?;
            }
        }
        Ok(freed)
    }

    /// Processes up to `chunk` more positions, or, when only the last one is
    /// left, draws the first tokens (lazy): then prefill is over.
    /// The model may lower `chunk` (`LanguageModel::prefill_chunk`). For
    /// caches that cannot be cut back, chunks also end at every row's
    /// prompt-cache boundary (rows snapshotting at least `snapshot_min`
    /// tokens), where the snapshot is taken.
    pub fn advance(&mut self, model: &dyn LanguageModel, chunk: i32, snapshot_min: Option<usize>) -> Result<Option<Drawn>> {
        let body_end = self.total - 1;
        if self.done < body_end {
            let chunk = model.prefill_chunk(self.rows.len(), self.done as usize, chunk.max(1) as usize) as i32;
            let mut to = (self.done + chunk.max(1)).min(body_end);
            let stops = self.boundary_stops(snapshot_min);
            if let Some(&(at, _)) = stops.iter().filter(|(at, _)| *at > self.done).min() {
                to = to.min(at);
            }
            let x = self.tokens(self.done, to)?;
            model.forward(&x, &mut self.cache, Output::CacheOnly)?;
            let state: Vec<&Array> = self.cache.iter().flat_map(LayerCache::state).collect();
            mlx::eval(&state)?;
            self.done = to;
            for (_, i) in stops.into_iter().filter(|&(at, _)| at == to) {
                let r = &self.rows[i];
                let b = r.boundary.expect("a stop is a boundary");
                let snap = Snapshot::of_row(&self.cache, i, b as i32)?;
                self.held.push((r.namespace.clone(), r.prompt[..b].to_vec(), snap));
            }
            return Ok(None);
        }
        let x = self.tokens(body_end, self.total)?;
        let logits = model.forward(&x, &mut self.cache, Output::LastLogits)?.expect("logits requested");
        let logits = logits.reshape(&[self.rows.len() as i32, -1])?;
        let first = sample_rows(&mut self.rows, &logits, None)?;
        self.done = self.total;
        Ok(Some(first))
    }

    fn trimmable(&self) -> bool {
        self.cache.iter().all(LayerCache::trimmable)
    }

    /// (timeline position, row) of the boundaries where a model with
    /// non-trimmable caches must stop to snapshot; none for other models.
    fn boundary_stops(&self, snapshot_min: Option<usize>) -> Vec<(i32, usize)> {
        let Some(min) = snapshot_min.filter(|_| !self.trimmable()) else { return vec![] };
        let mut out = vec![];
        for (i, r) in self.rows.iter().enumerate() {
            if let Some(b) = r.boundary.filter(|&b| r.use_cache && b >= min.max(1) && b > r.cached && b < r.prompt.len()) {
                out.push((self.total - r.prompt.len() as i32 + b as i32, i));
            }
        }
        out
    }

    pub fn into_parts(self) -> (Vec<Row>, Vec<LayerCache>) {
        (self.rows, self.cache)
    }
}
