//! A prefill cohort: requests whose prompts are processed together, chunk by
//! chunk, as one left-padded batch right-aligned on a common last position.
//! Later arrivals whose prompts fit in the part not processed yet join
//! between forwards. The last position is forwarded on its own to produce
//! every row's first token (mlx-lm's tail split); the cohort then joins the
//! decode batch.

use super::batch::{sample_rows, Drawn};
use super::prompt_cache::Capture;
use super::row::Row;
use super::row_set::{keep_rows, RowSet};
use super::trace::{SpanKind, Tracer};
use super::FinishReason;
use crate::cache::paged::{PagedKv, PagedPools};
use crate::cache::scheme::KvScheme;
use crate::cache::{KvCache, LayerCache};
use crate::error::Result;
use crate::mlx::{self, Array};
use crate::model::{LanguageModel, MediaInput, Output};
use std::time::Instant;

/// A row entering a cohort, with the prompt length at which the prompt
/// cache wants a snapshot of it (if any).
pub(crate) type Entrant = (Row, Option<usize>);

pub(crate) struct Cohort {
    set: RowSet,
    /// Per row: the prompt length to snapshot for the prompt cache.
    marks: Vec<Option<usize>>,
    /// Aligned length: every prompt ends at position `total - 1`.
    total: i32,
    /// Positions already in the cache.
    done: i32,
    /// A media prompt's cohort (one row): its image rows, spliced in the one
    /// forward that prefills the whole prompt (the seed's atomic final chunk).
    media: Option<MediaInput>,
}

/// What one `Cohort::advance` did.
pub(crate) struct Progress {
    /// The first tokens, once prefill is over.
    pub first: Option<Drawn>,
    /// Snapshots for the prompt cache taken on the way (or why one could
    /// not be: only a lost cache entry).
    pub captures: Vec<Result<Capture>>,
}

/// One forward of a cohort (`Cohort::next_step`).
pub(crate) struct CohortStep {
    /// `[rows, len]` token ids.
    pub tokens: Array,
    /// The timeline position the step ends at.
    to: i32,
    pub out: Output,
    /// The snapshots due at `to`: (position, row).
    stops: Vec<(i32, usize)>,
}

impl CohortStep {
    pub fn rows(&self) -> usize {
        self.tokens.dim(0) as usize
    }

    /// Tokens over all rows.
    pub fn len(&self) -> usize {
        self.tokens.size()
    }
}

impl Cohort {
    /// A cohort of new rows whose full-attention layers store KV as
    /// `scheme` says (each row from its own `quantized_kv_start`), with room
    /// reserved for the prompt and the first decoded tokens.
    /// With `pools` (`kv_paging`) the full-attention layers are paged.
    pub fn new(model: &dyn LanguageModel, scheme: KvScheme, pools: Option<&PagedPools>, entrants: Vec<Entrant>) -> Result<Cohort> {
        let (rows, marks): (Vec<Row>, Vec<_>) = entrants.into_iter().unzip();
        let total = rows.iter().map(|r| r.prompt.len() as i32).max().unwrap_or(0);
        let pads: Vec<i32> = rows.iter().map(|r| total - r.prompt.len() as i32).collect();
        let starts: Vec<i32> = rows.iter().map(|r| r.kv_start).collect();
        let mut cache = new_cache(model, scheme, rows.len())?;
        if let Some(p) = pools {
            for (c, pool) in cache.iter_mut().zip(&p.layers) {
                if let Some(pool) = pool {
                    *c = LayerCache::Paged(PagedKv::new(rows.len(), pool.clone()));
                }
            }
        }
        for c in &mut cache {
            c.set_padding(&pads);
            c.set_starts(&starts);
            c.reserve(total + 1);
        }
        Ok(Cohort { set: RowSet::new(rows, cache), marks, total, done: 0, media: None })
    }

    /// A cohort of rows whose first prompt positions are already in their
    /// caches (prompt-cache hits, or a concurrent row's blocks): aligned on
    /// the longest prompt (`total`), `done` positions processed, so row `r`
    /// holds `done - (total - prompt_r)` of its positions (see
    /// `planner::hit_group`).
    pub fn with_prefixes(rows: Vec<(Entrant, Vec<LayerCache>)>, total: usize, done: usize) -> Result<Cohort> {
        let (total, done) = (total as i32, done as i32);
        let (mut set, mut marks) = (RowSet::default(), vec![]);
        for ((row, mark), mut cache) in rows {
            let held = done - (total - row.prompt.len() as i32);
            if cache.first().map_or(0, |c| c.len()) != held {
                return Err(crate::Error::internal("a cached prefix out of line with its cohort"));
            }
            cache.iter_mut().for_each(|c| c.reserve(total + 1));
            // Right-aligned: a shorter prompt is padded in front.
            set.extend(RowSet::new(vec![row], cache))?;
            marks.push(mark);
        }
        Ok(Cohort { set, marks, total, done, media: None })
    }

    /// Makes a one-row cohort a media prompt's: nothing joins it, and the
    /// rest of its prompt is prefilled in one step with `media` (rows at
    /// prompt positions) spliced in.
    pub fn set_media(&mut self, media: MediaInput) -> Result<()> {
        if self.len() != 1 {
            return Err(crate::Error::internal("a media prompt prefills alone"));
        }
        self.media = Some(media);
        Ok(())
    }

    /// Whether this is a media prompt's cohort.
    pub fn is_atomic(&self) -> bool {
        self.media.is_some()
    }

    pub fn rows(&self) -> &[Row] {
        &self.set.rows
    }

    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// Prompt positions not processed yet (a joining prompt must fit in them).
    pub fn remaining(&self) -> i32 {
        self.total - self.done
    }

    pub fn kv_bytes(&self) -> usize {
        self.set.kv_bytes()
    }

    /// Adds a row whose prompt fits in `remaining()`. On error the cohort
    /// (with the row) is unusable.
    pub fn join(&mut self, (row, mark): Entrant) -> Result<()> {
        let pad = self.total - row.prompt.len() as i32;
        if pad < self.done {
            return Err(crate::Error::internal("a prompt joined a cohort it does not fit in"));
        }
        let fresh = self
            .set
            .cache()
            .iter()
            .map(|c| {
                let mut f = c.empty_like(1);
                f.set_padding(&[pad - self.done]);
                f.set_starts(&[row.kv_start]);
                f
            })
            .collect();
        self.set.extend(RowSet::new(vec![row], fresh))?;
        self.marks.push(mark);
        Ok(())
    }

    /// Token ids of positions `from..to` for every row (`[B, to - from]`);
    /// padding positions get id 0, which attention never looks at.
    fn tokens(&self, from: i32, to: i32) -> Result<Array> {
        let rows = self.rows();
        let mut ids = Vec::with_capacity(rows.len() * (to - from) as usize);
        for r in rows {
            let start = self.total - r.prompt.len() as i32;
            ids.extend((from..to).map(|p| if p < start { 0 } else { r.prompt[(p - start) as usize] as i32 }));
        }
        Ok(Array::from_i32(&ids, &[rows.len() as i32, to - from])?)
    }

    /// Drops cancelled rows (ending them); returns how many left and their
    /// KV reservations.
    pub fn drop_cancelled(&mut self) -> Result<(usize, usize)> {
        let keep: Vec<usize> = (0..self.len()).filter(|&i| !self.set.rows[i].is_cancelled()).collect();
        if keep.len() == self.len() {
            return Ok((0, 0));
        }
        for r in self.set.rows.iter_mut().filter(|r| r.is_cancelled()) {
            r.finish(FinishReason::Cancelled, None);
        }
        let n = self.len() - keep.len();
        keep_rows(&mut self.marks, &keep);
        Ok((n, self.set.retain(&keep)?))
    }

    /// Ends every row with `f`; returns how many there were and their KV
    /// reservations.
    pub fn end_all(mut self, f: impl FnMut(&mut Row)) -> (usize, usize) {
        let n = self.len();
        (n, self.set.end_all(f))
    }

    /// Processes up to `chunk` more positions, or, when only the last one is
    /// left, draws the first tokens (lazy): then prefill is over.
    /// The model may lower `chunk` (`LanguageModel::prefill_chunk`). For
    /// caches that cannot be cut back, chunks also end at every row's
    /// snapshot mark, where its snapshot is taken; other caches are
    /// snapshotted once prefill is over.
    pub fn advance(&mut self, model: &dyn LanguageModel, chunk: i32, tracer: &Tracer) -> Result<Progress> {
        if self.media.is_some() {
            return self.advance_media(model, tracer);
        }
        let step = self.next_step(model, chunk)?;
        let t = Instant::now();
        tracer.model_call();
        let logits = model.forward(&step.tokens, self.set.cache_mut(), step.out)?;
        tracer.record(SpanKind::Forward, step.rows(), step.len(), t);
        let logits = logits.map(|l| l.reshape(&[self.len() as i32, -1])).transpose()?;
        self.finish_step(step, logits, true, tracer)
    }

    /// The forward `advance` makes next (not for a media cohort): up to
    /// `chunk` positions (`Output::CacheOnly`), or the last position alone
    /// (`Output::LastLogits`), for `finish_step`.
    pub fn next_step(&self, model: &dyn LanguageModel, chunk: i32) -> Result<CohortStep> {
        let body_end = self.total - 1;
        if self.done >= body_end {
            let tokens = self.tokens(body_end, self.total)?;
            return Ok(CohortStep { tokens, to: self.total, out: Output::LastLogits, stops: vec![] });
        }
        let chunk = model.prefill_chunk(self.len(), self.done as usize, chunk.max(1) as usize) as i32;
        let mut to = (self.done + chunk.max(1)).min(body_end);
        let stops = self.stops();
        if let Some(&(at, _)) = stops.iter().filter(|(at, _)| *at > self.done).min() {
            to = to.min(at);
        }
        if let Some(at) = self.conversions().filter(|&at| at > self.done).min() {
            to = to.min(at);
        }
        let stops = stops.into_iter().filter(|&(at, _)| at == to).collect();
        Ok(CohortStep { tokens: self.tokens(self.done, to)?, to, out: Output::CacheOnly, stops })
    }

    /// The rows' caches (for a mixed forward's prefill group).
    pub fn cache_mut(&mut self) -> &mut [LayerCache] {
        self.set.cache_mut()
    }

    /// After `step`'s forward: its logits (`[rows, vocab]`, the last
    /// position's) give the first tokens, or its KV is evaluated (now with
    /// `wait`; else started, for a mixed forward whose decode rows' draw
    /// the caller reads later) and the snapshots due at its end are taken.
    pub fn finish_step(&mut self, step: CohortStep, logits: Option<Array>, wait: bool, tracer: &Tracer) -> Result<Progress> {
        let mut captures = vec![];
        let rows = self.len();
        if step.out == Output::CacheOnly {
            let t = Instant::now();
            let pools: Vec<Array> = self.set.cache().iter().flat_map(LayerCache::pool_state).collect();
            let state: Vec<&Array> = self.set.cache().iter().flat_map(LayerCache::state).chain(&pools).collect();
            if wait {
                mlx::eval(&state)?;
                tracer.record(SpanKind::Evaluate, rows, step.len(), t);
            } else {
                mlx::async_eval(&state)?;
            }
            self.done = step.to;
            for &(_, i) in &step.stops {
                captures.push(self.capture(i, tracer));
            }
            return Ok(Progress { first: None, captures });
        }
        let logits = logits.ok_or_else(|| crate::Error::internal("the cohort's last step gave no logits"))?;
        let t = Instant::now();
        let first = sample_rows(&mut self.set.rows, &logits, None)?;
        tracer.record(SpanKind::Sample, rows, rows, t);
        self.done = self.total;
        if self.trimmable() {
            for i in (0..self.len()).filter(|&i| self.marks[i].is_some()) {
                captures.push(self.capture(i, tracer));
            }
        }
        Ok(Progress { first: Some(first), captures })
    }

    /// A media prompt's rest in one step (the seed's atomic final chunk):
    /// the body in one forward, its snapshot for the prompt cache if wanted
    /// (all of the prompt but its last token), then the last position.
    fn advance_media(&mut self, model: &dyn LanguageModel, tracer: &Tracer) -> Result<Progress> {
        let media = self.media.as_ref().expect("a media cohort");
        let (body_end, mut captures) = (self.total - 1, vec![]);
        if self.done < body_end {
            let (t, n) = (Instant::now(), (body_end - self.done) as usize);
            let x = self.tokens(self.done, body_end)?;
            let m = media.window(self.done as usize, body_end as usize)?;
            tracer.model_call();
            model.forward_media(&x, &m, self.set.cache_mut(), Output::CacheOnly)?;
            let state: Vec<&Array> = self.set.cache().iter().flat_map(LayerCache::state).collect();
            mlx::eval(&state)?;
            tracer.record(SpanKind::Forward, 1, n, t);
            self.done = body_end;
            if self.marks[0] == Some(body_end as usize) {
                captures.push(self.capture(0, tracer));
            }
        }
        let t = Instant::now();
        let x = self.tokens(body_end, self.total)?;
        let m = self.media.as_ref().expect("a media cohort").window(body_end as usize, self.total as usize)?;
        tracer.model_call();
        let logits = model.forward_media(&x, &m, self.set.cache_mut(), Output::LastLogits)?.expect("logits requested");
        let logits = logits.reshape(&[1, -1])?;
        tracer.record(SpanKind::Forward, 1, 1, t);
        let t = Instant::now();
        let first = sample_rows(&mut self.set.rows, &logits, None)?;
        tracer.record(SpanKind::Sample, 1, 1, t);
        self.done = self.total;
        Ok(Progress { first: Some(first), captures })
    }

    /// Row `i`'s first `len` positions (its blocks, when paged).
    pub fn snapshot(&self, i: usize, len: usize) -> Result<super::prompt_cache::Snapshot> {
        self.set.snapshot(i, len, false)
    }

    /// Row `i`'s prompt up to its mark.
    fn capture(&self, i: usize, tracer: &Tracer) -> Result<Capture> {
        let r = &self.set.rows[i];
        let b = self.marks[i].expect("a capture is at a mark");
        let t = Instant::now();
        let snapshot = self.set.snapshot(i, b, false)?;
        tracer.record(SpanKind::Snapshot, 1, b, t);
        Ok(Capture { namespace: r.namespace.clone(), tokens: r.key()[..b].to_vec(), snapshot })
    }

    fn trimmable(&self) -> bool {
        self.set.cache().iter().all(LayerCache::trimmable)
    }

    /// Timeline positions where a row reaches its `quantized_kv_start` (with
    /// quantized KV): a chunk never straddles one, so every row switches
    /// from float to quantized KV exactly at its start, whatever its
    /// neighbours do.
    fn conversions(&self) -> impl Iterator<Item = i32> + '_ {
        let quantized = self.set.cache().iter().any(LayerCache::is_quantized);
        let rows = if quantized { self.rows() } else { &[] };
        rows.iter().map(move |r| self.total - r.prompt.len() as i32 + r.kv_start)
    }

    /// (timeline position, row) of the marks where a model with
    /// non-trimmable caches must stop to snapshot; none for other models.
    fn stops(&self) -> Vec<(i32, usize)> {
        if self.trimmable() {
            return vec![];
        }
        let mut out = vec![];
        for (i, r) in self.rows().iter().enumerate() {
            if let Some(b) = self.marks[i].filter(|&b| b < r.prompt.len()) {
                out.push((self.total - r.prompt.len() as i32 + b as i32, i));
            }
        }
        out
    }

    /// KV bytes held dense and quantized.
    pub fn kv_bytes_by_kind(&self) -> (usize, usize) {
        self.set.kv_bytes_by_kind()
    }

    /// The rows with their caches, once prefill is over.
    pub fn into_set(self) -> RowSet {
        self.set
    }
}

/// Empty caches for `rows` rows: the model's, with the full-attention
/// layers storing KV as `scheme` says (sliding-window layers stay dense).
fn new_cache(model: &dyn LanguageModel, scheme: KvScheme, rows: usize) -> Result<Vec<LayerCache>> {
    let mut cache = model.new_cache(rows);
    if scheme.is_quantized() {
        for (c, l) in cache.iter_mut().zip(model.kv_layers()) {
            if l.is_some_and(|l| l.window.is_none()) {
                *c = LayerCache::Kv(KvCache::with_scheme(rows, scheme)?);
            }
        }
    }
    Ok(cache)
}
