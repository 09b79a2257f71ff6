//! A prefill cohort: requests whose prompts are processed together, chunk by
//! chunk, as one batch on a shared timeline (`Timeline`: row `r`'s prompt
//! starts at slot `pad[r]`). Rows admitted together are right-aligned on a
//! common last position; later arrivals, fresh or starting from a cached
//! prefix, join between forwards with their first unprocessed position at
//! the cohort's current one, so every row keeps its own end. Every forward
//! feeds all rows the same slots and stops before the first row's last
//! position; that position is forwarded on its own (mlx-lm's tail split),
//! the rows that reach their end draw their first token and leave for the
//! decode batch, and the others go on.

use super::batch::{sample_rows, Drawn};
use super::prompt_cache::Capture;
use super::row::Row;
use super::row_set::{keep_rows, RowSet};
use super::trace::{SpanKind, Tracer};
use super::FinishReason;
use crate::cache::paged::{PagedKv, PagedPools};
use crate::cache::scheme::{KvFloat, KvQuant};
use crate::cache::{KvCache, LayerCache};
use crate::error::Result;
use crate::mlx::{self, Array, Dtype};
use crate::model::{LanguageModel, MediaInput, Output};
use std::time::Instant;

/// A row entering a cohort, with the prompt length at which the prompt
/// cache wants a snapshot of it (if any).
pub(crate) type Entrant = (Row, Option<usize>);

pub(crate) struct Cohort {
    /// The rows and their caches; the caches' timeline says where each
    /// row's prompt starts (its padding) and how far the cohort is.
    set: RowSet,
    /// Per row: the prompt length to snapshot for the prompt cache.
    marks: Vec<Option<usize>>,
    /// A media prompt's cohort (one row): its image rows, spliced in the one
    /// forward that prefills the whole prompt (the seed's atomic final chunk).
    media: Option<MediaInput>,
}

/// What one `Cohort::advance` did.
pub(crate) struct Progress {
    /// The rows whose prefill is over (they left the cohort) and their
    /// first tokens.
    pub ready: Option<(RowSet, Drawn)>,
    /// Snapshots for the prompt cache taken on the way (or why one could
    /// not be: only a lost cache entry).
    pub captures: Vec<Result<Capture>>,
}

/// One forward of a cohort (`Cohort::next_step`).
pub(crate) struct CohortStep {
    /// `[rows, len]` token ids.
    pub tokens: Array,
    pub out: Output,
    /// The snapshots due at `to`: (position, row).
    stops: Vec<(i32, usize)>,
    /// The rows whose last prompt position this step forwards.
    finals: Vec<usize>,
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

/// The most positions a row's generation can write.
fn new_tokens(row: &Row) -> i32 {
    i32::try_from(row.reach.saturating_sub(row.prompt.len())).unwrap_or(i32::MAX)
}

impl Cohort {
    /// A cohort of new rows whose full-attention layers store KV as
    /// `kv` says (each row from its own `quantized_kv_start`), with room
    /// reserved for the prompt and every token the rows may generate.
    /// With `pools` (`kv_paging`) the full-attention layers are paged.
    pub fn new(model: &dyn LanguageModel, kv: KvQuant, pools: Option<&PagedPools>, entrants: Vec<Entrant>) -> Result<Cohort> {
        let (rows, marks): (Vec<Row>, Vec<_>) = entrants.into_iter().unzip();
        let total = rows.iter().map(|r| r.prompt.len() as i32).max().unwrap_or(0);
        // Rows are right-aligned on the prompt's end, so none goes past this.
        let end = total.saturating_add(rows.iter().map(new_tokens).max().unwrap_or(0));
        let pads: Vec<i32> = rows.iter().map(|r| total - r.prompt.len() as i32).collect();
        let starts: Vec<i32> = rows.iter().map(|r| r.kv_start).collect();
        let mut cache = new_cache(model, kv, rows.len())?;
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
            c.reserve(total + 1, end);
        }
        Ok(Cohort { set: RowSet::new(rows, cache), marks, media: None })
    }

    /// A cohort of rows whose first prompt positions are already in their
    /// caches (`row.cached` of them: prompt-cache hits, or a concurrent
    /// row's blocks). The caches are right-aligned, so every row's first
    /// unprocessed position is at the cohort's current one.
    pub fn with_prefixes(rows: Vec<(Entrant, Vec<LayerCache>)>) -> Result<Cohort> {
        let mut c = Cohort { set: RowSet::default(), marks: vec![], media: None };
        for (entrant, cache) in rows {
            c.join_cached(entrant, cache)?;
        }
        Ok(c)
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

    /// Slots processed (the timeline's length): every row's positions
    /// before it are in the cache.
    pub fn done(&self) -> i32 {
        self.set.cache().first().map_or(0, LayerCache::len)
    }

    /// The slot of row `r`'s first prompt position (past `done` while its
    /// prompt has not started).
    fn start(&self, r: usize) -> i32 {
        self.set.cache().first().map_or(0, |c| c.timeline().pads()[r])
    }

    /// The slot after row `r`'s last prompt position.
    fn end(&self, r: usize) -> i32 {
        self.start(r) + self.set.rows[r].prompt.len() as i32
    }

    /// The prompt positions its rows came to process (cached ones not
    /// counted), kept until they leave: the seed's token weight, which
    /// bounds what may still join.
    pub fn weight(&self) -> usize {
        self.rows().iter().map(|r| r.prompt.len() - r.cached).sum()
    }

    pub fn kv_bytes(&self) -> usize {
        self.set.kv_bytes()
    }

    /// Adds a row without a cached prefix: its prompt starts at the
    /// cohort's current slot. On error the cohort (with the row) is unusable.
    pub fn join(&mut self, entrant: Entrant) -> Result<()> {
        let fresh = self
            .set
            .cache()
            .iter()
            .map(|c| {
                let mut f = c.empty_like(1);
                f.set_starts(&[entrant.0.kv_start]);
                f
            })
            .collect();
        self.join_cached(entrant, fresh)
    }

    /// Adds a row whose caches hold its first `row.cached` positions
    /// (right-aligned with the cohort's: if they hold more than the cohort
    /// has processed, the cohort's rows are padded in front). On error the
    /// cohort (with the row) is unusable.
    pub fn join_cached(&mut self, (row, mark): Entrant, mut cache: Vec<LayerCache>) -> Result<()> {
        if cache.first().map_or(0, LayerCache::len) != row.cached as i32 {
            return Err(crate::Error::internal("a cached prefix of another length than the row's"));
        }
        let rest = (row.prompt.len() - row.cached) as i32;
        let done = self.done().max(row.cached as i32);
        cache.iter_mut().for_each(|c| c.reserve(done + rest + 1, (done + rest).saturating_add(new_tokens(&row))));
        self.set.extend(RowSet::new(vec![row], cache))?;
        self.marks.push(mark);
        Ok(())
    }

    /// Token ids of slots `from..to` for every row (`[B, to - from]`);
    /// padding slots get id 0, which attention never looks at.
    fn tokens(&self, from: i32, to: i32) -> Result<Array> {
        let rows = self.rows();
        let mut ids = Vec::with_capacity(rows.len() * (to - from) as usize);
        for (i, r) in rows.iter().enumerate() {
            let start = self.start(i);
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

    /// Processes up to `chunk` more slots, or, when some rows have only
    /// their last position left, that one slot: those rows draw their first
    /// tokens (lazy) and leave (`Progress::ready`).
    /// The model may lower `chunk` (`LanguageModel::prefill_chunk`) unless
    /// a row asked for its own (then it is used exactly). For caches that
    /// cannot be cut back, chunks also end at every row's snapshot mark,
    /// where its snapshot is taken; other caches are snapshotted when their
    /// row's prefill is over.
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
    /// `chunk` slots short of the first row's last position
    /// (`Output::CacheOnly`), or that position alone (`Output::LastLogits`),
    /// for `finish_step`.
    pub fn next_step(&self, model: &dyn LanguageModel, chunk: i32) -> Result<CohortStep> {
        let done = self.done();
        let last = (0..self.len()).map(|r| self.end(r) - 1).min().unwrap_or(done);
        if done >= last {
            let finals = (0..self.len()).filter(|&r| self.end(r) - 1 == done).collect();
            let tokens = self.tokens(done, done + 1)?;
            let stops = self.stops().into_iter().filter(|&(at, _)| at == done + 1).collect();
            return Ok(CohortStep { tokens, out: Output::LastLogits, stops, finals });
        }
        let exact = self.rows().iter().any(|r| r.prefill_chunk.is_some());
        let chunk = if exact { chunk } else { model.prefill_chunk(self.len(), done as usize, chunk.max(1) as usize) as i32 };
        let mut to = (done + chunk.max(1)).min(last);
        let stops = self.stops();
        if let Some(&(at, _)) = stops.iter().filter(|(at, _)| *at > done).min() {
            to = to.min(at);
        }
        if let Some(at) = self.conversions().filter(|&at| at > done).min() {
            to = to.min(at);
        }
        let stops = stops.into_iter().filter(|&(at, _)| at == to).collect();
        Ok(CohortStep { tokens: self.tokens(done, to)?, out: Output::CacheOnly, stops, finals: vec![] })
    }

    /// The rows' caches (for a mixed forward's prefill group).
    pub fn cache_mut(&mut self) -> &mut [LayerCache] {
        self.set.cache_mut()
    }

    /// After `step`'s forward: its logits (`[rows, vocab]`, the last
    /// position's) give the first tokens of the rows that reach their end,
    /// which leave the cohort; or its KV is evaluated (now with `wait`; else
    /// started, for a mixed forward whose decode rows' draw the caller reads
    /// later). The snapshots due at its end are taken.
    pub fn finish_step(&mut self, step: CohortStep, logits: Option<Array>, wait: bool, tracer: &Tracer) -> Result<Progress> {
        let rows = self.len();
        let captures = step.stops.iter().map(|&(_, i)| self.capture(i, tracer)).collect();
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
            return Ok(Progress { ready: None, captures });
        }
        let logits = logits.ok_or_else(|| crate::Error::internal("the cohort's last step gave no logits"))?;
        let mut progress = Progress { ready: None, captures };
        if self.trimmable() {
            for &i in step.finals.iter().filter(|&&i| self.marks[i].is_some()) {
                progress.captures.push(self.capture(i, tracer));
            }
        }
        let (mut ready, logits) = if step.finals.len() == rows {
            (std::mem::take(&mut self.set), logits)
        } else {
            let t = Instant::now();
            let idx: Vec<i32> = step.finals.iter().map(|&i| i as i32).collect();
            let logits = logits.take(&Array::from_i32(&idx, &[idx.len() as i32])?, 0)?;
            let ready = self.set.split_off(&step.finals)?;
            keep_rows(&mut self.marks, &(0..rows).filter(|i| !step.finals.contains(i)).collect::<Vec<_>>());
            tracer.record(SpanKind::KvMaintenance, ready.len(), 0, t);
            (ready, logits)
        };
        let t = Instant::now();
        let first = sample_rows(&mut ready.rows, &logits, None)?;
        tracer.record(SpanKind::Sample, ready.len(), ready.len(), t);
        progress.ready = Some((ready, first));
        Ok(progress)
    }

    /// A media prompt's rest in one step (the seed's atomic final chunk):
    /// the body in one forward, its snapshot for the prompt cache if wanted
    /// (all of the prompt but its last token), then the last position. The
    /// cohort has one row without padding: slots are prompt positions.
    fn advance_media(&mut self, model: &dyn LanguageModel, tracer: &Tracer) -> Result<Progress> {
        let media = self.media.as_ref().expect("a media cohort");
        let (done, total, mut captures) = (self.done(), self.end(0), vec![]);
        let body_end = total - 1;
        if done < body_end {
            let (t, n) = (Instant::now(), (body_end - done) as usize);
            let x = self.tokens(done, body_end)?;
            let m = media.window(done as usize, body_end as usize)?;
            tracer.model_call();
            model.forward_media(&x, &m, self.set.cache_mut(), Output::CacheOnly)?;
            let state: Vec<&Array> = self.set.cache().iter().flat_map(LayerCache::state).collect();
            mlx::eval(&state)?;
            tracer.record(SpanKind::Forward, 1, n, t);
            if self.marks[0] == Some(body_end as usize) {
                captures.push(self.capture(0, tracer));
            }
        }
        let t = Instant::now();
        let x = self.tokens(body_end, total)?;
        let m = self.media.as_ref().expect("a media cohort").window(body_end as usize, total as usize)?;
        tracer.model_call();
        let logits = model.forward_media(&x, &m, self.set.cache_mut(), Output::LastLogits)?.expect("logits requested");
        let logits = logits.reshape(&[1, -1])?;
        tracer.record(SpanKind::Forward, 1, 1, t);
        let t = Instant::now();
        let mut ready = std::mem::take(&mut self.set);
        let first = sample_rows(&mut ready.rows, &logits, None)?;
        tracer.record(SpanKind::Sample, 1, 1, t);
        Ok(Progress { ready: Some((ready, first)), captures })
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
        rows.iter().enumerate().map(move |(i, r)| self.start(i) + r.kv_start)
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
                out.push((self.start(i) + b as i32, i));
            }
        }
        out
    }

    /// KV bytes held dense and quantized.
    pub fn kv_bytes_by_kind(&self) -> (usize, usize) {
        self.set.kv_bytes_by_kind()
    }
}

/// Empty caches for `rows` rows: the model's, with the full-attention
/// layers storing KV as `kv` says (sliding-window layers stay dense, in the
/// activations' dtype).
fn new_cache(model: &dyn LanguageModel, kv: KvQuant, rows: usize) -> Result<Vec<LayerCache>> {
    let mut cache = model.new_cache(rows);
    for (c, l) in cache.iter_mut().zip(model.kv_layers()) {
        if !l.is_some_and(|l| l.window.is_none()) {
            continue;
        }
        if kv.scheme.is_quantized() {
            *c = LayerCache::Kv(KvCache::with_scheme(rows, kv.scheme)?);
        } else if let (KvFloat::F16, LayerCache::Kv(c)) = (kv.float, &mut *c) {
            c.set_dense_dtype(Dtype::F16);
        }
    }
    Ok(cache)
}
