//! The decode batch: every row that is generating, one forward pass per step
//! for all of them. Pipelined: `schedule` builds and starts the next step
//! from the still-unread tokens of the current one; `collect` then reads the
//! current tokens and emits them, and `retire` drops the rows that ended
//! (after the scheduler took the prompt-cache snapshots they offered).
//! With a constrained row (structured output) the draw waits: `schedule`
//! starts only the forward, and `collect` builds the draw once the rows'
//! matchers have taken the current tokens and computed the next masks.

use super::logprobs::StepLogprobs;
use super::row::Row;
use super::row_set::{Offer, RowSet};
use super::spec::{self, SpecStats};
use super::trace::{SpanKind, Tracer};
use crate::cache::LayerCache;
use crate::error::Result;
use crate::mlx::{self, Array};
use crate::model::load::TextAssets;
use crate::model::{LanguageModel, Output};
use std::time::Instant;

/// The tokens drawn for every row in one step (`[B]`, lazy) and, when some
/// row asked for them, their log-probabilities.
pub(crate) struct Drawn {
    pub tokens: Array,
    pub logprobs: Option<StepLogprobs>,
}

impl Drawn {
    fn arrays(&self) -> Vec<&Array> {
        std::iter::once(&self.tokens).chain(self.logprobs.iter().flat_map(StepLogprobs::arrays)).collect()
    }

    /// Rows of `self` then of `other` (`n_self`, `n_other` rows).
    fn concat(self, other: Drawn, n_self: usize, n_other: usize) -> Result<Drawn> {
        let tokens = Array::concatenate(&[&self.tokens, &other.tokens], 0)?;
        let logprobs = match (self.logprobs, other.logprobs) {
            (None, None) => None,
            (a, b) => {
                let a = a.map_or_else(|| StepLogprobs::zeros(n_self), Ok)?;
                let b = b.map_or_else(|| StepLogprobs::zeros(n_other), Ok)?;
                Some(a.concat(&b)?)
            }
        };
        Ok(Drawn { tokens, logprobs })
    }

    fn take(self, idx: &Array) -> Result<Drawn> {
        Ok(Drawn { tokens: self.tokens.take(idx, 0)?, logprobs: self.logprobs.map(|l| l.take(idx)).transpose()? })
    }
}

/// What a decode step needs besides the model.
pub(crate) struct StepCtx<'a> {
    pub text: &'a TextAssets,
    pub ctx_len: usize,
    pub tracer: &'a Tracer,
    pub spec: &'a SpecStats,
    /// The engine's draft model, when it has one.
    pub drafter: Option<&'a spec::draft::Drafter>,
}

#[derive(Default)]
pub(crate) struct DecodeBatch {
    set: RowSet,
    /// Scheduled tokens, not read yet: the input of the next step.
    pending: Option<Drawn>,
    /// Tokens `collect` reads this iteration.
    current: Option<Drawn>,
    /// Rows still generating after the last `collect` (all until then).
    keep: Option<Vec<usize>>,
    /// Logits of the scheduled step whose draw waits for `collect`: with a
    /// constrained row, the masks need the tokens `collect` reads.
    undrawn: Option<Array>,
    /// Instead of `current`: the tokens a verify step (`spec`) hands to
    /// each row.
    runs: Option<Vec<Vec<u32>>>,
}

/// Draws one token per row from `logits` (`[B, vocab]`). `unread` holds the
/// tokens just fed (`[B]`, lazy) for the repetition-penalty window; None when
/// they are already in each row's history (the first draw after a prefill).
/// The result is scheduled for evaluation. A row whose draw fails ends
/// with the error (its slot gets token 0, which `collect` skips); the other
/// rows go on.
pub(crate) fn sample_rows(rows: &mut [Row], logits: &Array, unread: Option<&Array>) -> Result<Drawn> {
    // Structured output: each constrained row's mask (see `grammar`).
    let (masked, failed) = crate::grammar::mask_logits(rows.iter_mut().map(Row::live_constraint).collect(), logits)?;
    for (i, e) in failed {
        rows[i].fail(e);
    }
    let logits = masked.as_ref().unwrap_or(logits);
    let want_lp = rows.iter().any(|r| r.logprobs.is_some());
    let (tokens, lp) = if rows.iter().all(|r| r.sampler.is_greedy() && !r.sampler.needs_history()) {
        // One argmax for the whole batch, of the logits: the same token as
        // mlx-lm's argmax of the log-probabilities without waiting for their
        // normalizer (see `Sampler::draw`), which is computed only when a
        // row asks for log-probabilities.
        let lp = want_lp.then(|| crate::sample::log_softmax(logits)).transpose()?;
        (logits.argmax(-1, false)?, lp)
    } else {
        let mut tokens = Vec::with_capacity(rows.len());
        let mut lps = Vec::with_capacity(rows.len());
        for (i, r) in rows.iter_mut().enumerate() {
            let i = i as i32;
            let row_logits = logits.slice_axis(0, i, i + 1)?;
            let last = unread.map(|u| u.slice_axis(0, i, i + 1)).transpose()?;
            let drawn = r.history_window(last.as_ref()).and_then(|w| r.sampler.draw(&row_logits, w.as_ref()));
            match drawn {
                Ok(d) => {
                    tokens.push(d.token);
                    lps.push(d.logprobs);
                }
                Err(e) => {
                    r.fail(e);
                    // Draws are uint32 (argmax, categorical).
                    tokens.push(Array::from_i32(&[0], &[1])?.astype(crate::mlx::Dtype::U32)?);
                    lps.push(row_logits.astype(crate::mlx::Dtype::F32)?);
                }
            }
        }
        let cat = |v: &[Array]| Array::concatenate(&v.iter().collect::<Vec<_>>(), 0);
        (cat(&tokens)?, want_lp.then(|| cat(&lps)).transpose()?)
    };
    let logprobs = lp.map(|lp| StepLogprobs::new(&lp, &tokens)).transpose()?;
    let drawn = Drawn { tokens, logprobs };
    mlx::async_eval(&drawn.arrays())?;
    Ok(drawn)
}

impl DecodeBatch {
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// Whether request `id` has a row here.
    pub fn has_row(&self, id: u64) -> bool {
        self.set.rows.iter().any(|r| r.id == id)
    }

    pub fn kv_bytes(&self) -> usize {
        self.set.kv_bytes()
    }

    pub fn kv_bytes_by_kind(&self) -> (usize, usize) {
        self.set.kv_bytes_by_kind()
    }

    /// Row `row`'s first `len` positions, for an offer `collect` made.
    /// When every row ended in that `collect`, the caches are dropped next
    /// (`retire`): the snapshot takes views of their buffers, not copies.
    pub fn snapshot(&self, offer: &Offer) -> Result<super::prompt_cache::Snapshot> {
        let all_end = self.keep.as_ref().is_some_and(Vec::is_empty);
        self.set.snapshot(offer.row, offer.tokens.len(), all_end)
    }

    /// Adds prefilled rows with their caches and first tokens.
    pub fn join(&mut self, rows: RowSet, first: Drawn) -> Result<()> {
        let pending = match self.pending.take() {
            None => first,
            Some(p) => p.concat(first, self.set.len(), rows.len())?,
        };
        self.set.extend(rows)?;
        self.pending = Some(pending);
        Ok(())
    }

    /// Builds and starts the step that consumes the pending tokens: a
    /// speculative verify step when `spec` runs one, else a plain step.
    pub fn schedule(&mut self, model: &dyn LanguageModel, step: &StepCtx) -> Result<()> {
        let Some(drawn) = self.begin(model, step)? else { return Ok(()) };
        let b = self.set.len() as i32;
        let t = Instant::now();
        let x = drawn.tokens.reshape(&[b, 1])?;
        step.tracer.model_call();
        let logits = model.forward(&x, self.set.cache_mut(), Output::LastLogits)?.expect("logits requested");
        step.tracer.record(SpanKind::Forward, b as usize, b as usize, t);
        self.finish_plain(drawn, logits.reshape(&[b, -1])?, step.tracer)
    }

    /// The first half of `schedule`: runs a speculative verify step when
    /// `spec` takes one (None), or hands back the tokens a plain step feeds
    /// (`[B]`, lazy), for a forward the caller makes (alone, or in a mixed
    /// forward beside a prefill chunk) and passes to `finish_plain`.
    pub fn begin(&mut self, model: &dyn LanguageModel, step: &StepCtx) -> Result<Option<Drawn>> {
        let Some(drawn) = self.pending.take() else { return Ok(None) };
        if let Some(round) = spec::try_round(&mut self.set, &drawn, model, step)? {
            let next: Vec<i32> = round.next.iter().map(|&t| t as i32).collect();
            let next = Array::from_i32(&next, &[next.len() as i32])?.astype(crate::mlx::Dtype::U32)?;
            self.runs = Some(round.runs);
            self.pending = Some(Drawn { tokens: next, logprobs: None });
            return Ok(None);
        }
        Ok(Some(drawn))
    }

    /// The rows' caches (for a mixed forward's decode group).
    pub fn cache_mut(&mut self) -> &mut [LayerCache] {
        self.set.cache_mut()
    }

    /// The second half of `schedule`: the draw from the plain step's logits
    /// (`[B, vocab]`, lazy) of the tokens `drawn` fed.
    pub fn finish_plain(&mut self, drawn: Drawn, logits: Array, tracer: &Tracer) -> Result<()> {
        let b = self.set.len();
        if self.set.rows.iter().any(|r| r.constraint.is_some()) {
            // Structured output: the forward runs while `collect` feeds the
            // current tokens to the matchers and computes the next masks;
            // the (small) draw is built after that.
            mlx::async_eval(&[&logits])?;
            self.undrawn = Some(logits);
            self.current = Some(drawn);
            return Ok(());
        }
        let t = Instant::now();
        let next = sample_rows(&mut self.set.rows, &logits, Some(&drawn.tokens))?;
        tracer.record(SpanKind::Sample, b, b, t);
        self.current = Some(drawn);
        self.pending = Some(next);
        Ok(())
    }

    /// Reads the current tokens and hands them to their rows. Rows that
    /// ended (or were cancelled, or failed on their own) stay until
    /// `retire`; the rows that completed or were cancelled offer their history
    /// (what their KV holds of it) to the prompt cache.
    pub fn collect(&mut self, text: &TextAssets, ctx_len: usize, tracer: &Tracer) -> Result<Vec<Offer>> {
        // Each row's tokens in order: one per row, or a verify step's run.
        let verified = self.runs.is_some();
        let (runs, mut lps): (Vec<Vec<u32>>, Vec<Option<_>>) = if let Some(runs) = self.runs.take() {
            let n = runs.len();
            (runs, vec![None; n])
        } else {
            let Some(current) = self.current.take() else { return Ok(vec![]) };
            let t = Instant::now();
            let tokens: Vec<u32> = current.tokens.to_vec_i32()?.iter().map(|&t| t as u32).collect();
            tracer.record(SpanKind::Evaluate, tokens.len(), tokens.len(), t);
            let rows = &self.set.rows;
            let lps = match &current.logprobs {
                Some(l) => {
                    let top: Vec<usize> = rows.iter().map(|r| r.logprobs.unwrap_or(0)).collect();
                    l.read(&tokens, &top)?.into_iter().zip(rows.iter()).map(|(lp, r)| r.logprobs.map(|_| lp)).collect()
                }
                None => vec![None; tokens.len()],
            };
            (tokens.into_iter().map(|t| vec![t]).collect(), lps)
        };
        let n_tokens = runs.iter().map(Vec::len).sum();
        let t = Instant::now();
        let held: Vec<usize> = (0..self.set.len()).map(|i| self.set.row_len(i) as usize).collect();
        let rows = &mut self.set.rows;
        let mut keep = Vec::with_capacity(rows.len());
        let mut offers = vec![];
        'rows: for (i, (row, run)) in rows.iter_mut().zip(&runs).enumerate() {
            if row.is_cancelled() {
                row.finish(super::FinishReason::Cancelled, None);
                // Its KV is as good as a finished row's: offer what it holds
                // of its history (the token just fed was never accepted).
                if row.use_cache {
                    let mut history = row.cache_history();
                    history.truncate(held[i]);
                    offers.push(Offer { row: i, namespace: row.namespace.clone(), tokens: history });
                }
                continue;
            }
            if row.is_ended() {
                continue; // failed on its own (see `sample_rows`)
            }
            // A row that ends inside a run ends exactly there.
            let mut ended = false;
            for (j, &tok) in run.iter().enumerate() {
                if verified && j > 0 {
                    row.count_accepted_draft(); // before `accept` may send DONE
                }
                match row.accept(tok, lps[i].take(), text, ctx_len) {
                    Ok(false) => {}
                    Ok(true) => {
                        ended = true;
                        break;
                    }
                    // This row's token cannot be handed over (e.g. an id the
                    // tokenizer does not know): it ends, the others go on.
                    Err(e) => {
                        row.fail(e);
                        continue 'rows;
                    }
                }
            }
            if !ended {
                keep.push(i);
                continue;
            }
            // The step just scheduled fed this token: the row's KV covers its
            // whole history, which the next turn of a chat starts with (and
            // more when it ended inside a verify step's accepted run).
            if row.use_cache {
                let history = row.cache_history();
                if held[i] >= history.len() {
                    offers.push(Offer { row: i, namespace: row.namespace.clone(), tokens: history });
                }
            }
        }
        tracer.record(SpanKind::Deliver, runs.len(), n_tokens, t);
        if let Some(logits) = self.undrawn.take() {
            // The accepted tokens are in each row's history now.
            let t = Instant::now();
            self.pending = Some(sample_rows(rows, &logits, None)?);
            tracer.record(SpanKind::Sample, runs.len(), runs.len(), t);
        }
        self.keep = Some(keep);
        Ok(offers)
    }

    /// Removes the rows that ended in the last `collect`; returns how many
    /// and the KV bytes they reserved.
    pub fn retire(&mut self) -> Result<(usize, usize)> {
        let Some(keep) = self.keep.take() else { return Ok((0, 0)) };
        let n = self.set.len() - keep.len();
        if n == 0 {
            return Ok((0, 0));
        }
        let freed = self.set.retain(&keep)?;
        if keep.is_empty() {
            *self = DecodeBatch::default();
        } else if let Some(p) = self.pending.take() {
            let idx: Vec<i32> = keep.iter().map(|&i| i as i32).collect();
            self.pending = Some(p.take(&Array::from_i32(&idx, &[idx.len() as i32])?)?);
        }
        Ok((n, freed))
    }

    /// Ends every row with `f` (cancel at shutdown, or an error); returns
    /// how many there were and the KV bytes they reserved.
    pub fn end_all(&mut self, f: impl FnMut(&mut Row)) -> (usize, usize) {
        let n = self.set.len();
        let freed = self.set.end_all(f);
        *self = DecodeBatch::default();
        (n, freed)
    }
}
