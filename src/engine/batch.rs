//! The decode batch: every row that is generating, one forward pass per step
//! for all of them. Pipelined: `schedule` builds and starts the next step
//! from the still-unread tokens of the current one; `collect` then reads the
//! current tokens, emits them and drops the rows that ended.

use super::logprobs::StepLogprobs;
use super::prompt_cache::Snapshot;
use super::row::Row;
use crate::cache::LayerCache;
use crate::error::Result;
use crate::mlx::{self, Array};
use crate::model::load::TextAssets;
use crate::model::{LanguageModel, Output};

/// A prompt-cache snapshot to add: namespace, token ids, KV.
pub(crate) type Capture = (String, Vec<u32>, Snapshot);

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

#[derive(Default)]
pub(crate) struct DecodeBatch {
    pub rows: Vec<Row>,
    cache: Vec<LayerCache>,
    /// Scheduled tokens, not read yet: the input of the next step.
    pending: Option<Drawn>,
    /// Tokens `collect` reads this iteration.
    current: Option<Drawn>,
}

/// Draws one token per row from `logits` (`[B, vocab]`). `unread` holds the
/// tokens just fed (`[B]`, lazy) for the repetition-penalty window; None when
/// they are already in each row's history (the first draw after a prefill).
/// The result is scheduled for evaluation.
pub(crate) fn sample_rows(rows: &mut [Row], logits: &Array, unread: Option<&Array>) -> Result<Drawn> {
    let want_lp = rows.iter().any(|r| r.logprobs.is_some());
    let (tokens, lp) = if rows.iter().all(|r| r.sampler.is_greedy() && !r.sampler.needs_history()) {
        // One argmax for the whole batch (of log-probabilities, as mlx-lm).
        let lp = logits.subtract(&logits.logsumexp(-1, true)?)?;
        (lp.argmax(-1, false)?, want_lp.then_some(lp))
    } else {
        let mut tokens = Vec::with_capacity(rows.len());
        let mut lps = Vec::with_capacity(rows.len());
        for (i, r) in rows.iter_mut().enumerate() {
            let i = i as i32;
            let row_logits = logits.slice_axis(0, i, i + 1)?;
            let last = unread.map(|u| u.slice_axis(0, i, i + 1)).transpose()?;
            let window = r.history_window(last.as_ref())?;
            let d = r.sampler.draw(&row_logits, window.as_ref())?;
            tokens.push(d.token);
            lps.push(d.logprobs);
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
        self.rows.is_empty()
    }

    pub fn kv_bytes(&self) -> usize {
        self.cache.iter().map(LayerCache::nbytes).sum()
    }

    /// Adds prefilled rows with their caches and first tokens.
    pub fn join(&mut self, rows: Vec<Row>, cache: Vec<LayerCache>, first: Drawn) -> Result<()> {
        if self.rows.is_empty() {
            self.cache = cache;
            self.pending = Some(first);
        } else {
            for (mine, theirs) in self.cache.iter_mut().zip(cache) {
                mine.extend(theirs)?;
            }
            let pending = self.pending.take().expect("a non-empty batch has pending tokens");
            self.pending = Some(pending.concat(first, self.rows.len(), rows.len())?);
        }
        self.rows.extend(rows);
        Ok(())
    }

    /// Builds and starts the step that consumes the pending tokens.
    pub fn schedule(&mut self, model: &dyn LanguageModel) -> Result<()> {
        let Some(drawn) = self.pending.take() else { return Ok(()) };
        let b = self.rows.len() as i32;
        let x = drawn.tokens.reshape(&[b, 1])?;
        let logits = model.forward(&x, &mut self.cache, Output::LastLogits)?.expect("logits requested");
        let logits = logits.reshape(&[b, -1])?;
        let next = sample_rows(&mut self.rows, &logits, Some(&drawn.tokens))?;
        self.current = Some(drawn);
        self.pending = Some(next);
        Ok(())
    }

    /// Reads the current tokens, hands them to their rows, and removes rows
    /// that ended (or were cancelled) from the batch. Returns the KV bytes
    /// reserved by the rows that left, and snapshots of the rows that
    /// completed with at least `snapshot_min` tokens (if given) for the
    /// prompt cache.
    pub fn collect(&mut self, text: &TextAssets, ctx_len: usize, snapshot_min: Option<usize>) -> Result<(usize, Vec<Capture>)> {
        let Some(current) = self.current.take() else { return Ok((0, vec![])) };
        let tokens: Vec<u32> = current.tokens.to_vec_i32()?.iter().map(|&t| t as u32).collect();
        let mut lps: Vec<Option<_>> = match &current.logprobs {
            Some(l) => {
                let top: Vec<usize> = self.rows.iter().map(|r| r.logprobs.unwrap_or(0)).collect();
                l.read(&tokens, &top)?.into_iter().zip(&self.rows).map(|(lp, r)| r.logprobs.map(|_| lp)).collect()
            }
            None => vec![None; tokens.len()],
        };
        let mut keep = Vec::with_capacity(self.rows.len());
        let mut captures = vec![];
        for (i, (row, &tok)) in self.rows.iter_mut().zip(&tokens).enumerate() {
            if row.is_cancelled() {
                row.finish(super::FinishReason::Cancelled, None);
                continue;
            }
            if !row.accept(tok, lps[i].take(), text, ctx_len)? {
                keep.push(i);
                continue;
            }
            // The step just scheduled fed this token: the row's KV covers its
            // whole history, which the next turn of a chat starts with.
            let history = row.history();
            let len = self.cache.first().map_or(0, |c| c.row_len(i)) as usize;
            if row.use_cache && snapshot_min.is_some_and(|m| history.len() >= m) && len == history.len() {
                captures.push((row.namespace.clone(), history, Snapshot::of_row(&self.cache, i, len as i32)?));
            }
        }
        Ok((self.retain(&keep)?, captures))
    }

    fn retain(&mut self, keep: &[usize]) -> Result<usize> {
        if keep.len() == self.rows.len() {
            return Ok(0);
        }
        let freed = (0..self.rows.len()).filter(|i| !keep.contains(i)).map(|i| self.rows[i].kv_reserved).sum();
        if keep.is_empty() {
            *self = DecodeBatch::default();
            return Ok(freed);
        }
        let mut rows: Vec<Option<Row>> = std::mem::take(&mut self.rows).into_iter().map(Some).collect();
        self.rows = keep.iter().map(|&i| rows[i].take().expect("each index once")).collect();
        for c in &mut self.cache {
            c.filter(keep)?;
        }
        if let Some(p) = self.pending.take() {
            let idx: Vec<i32> = keep.iter().map(|&i| i as i32).collect();
            self.pending = Some(p.take(&Array::from_i32(&idx, &[idx.len() as i32])?)?);
        }
        Ok(freed)
    }

    /// Ends every row with `f` (cancel at shutdown, or an error).
    pub fn end_all(&mut self, mut f: impl FnMut(&mut Row)) -> usize {
        let freed = self.rows.iter().map(|r| r.kv_reserved).sum();
        for r in &mut self.rows {
            f(r);
        }
        *self = DecodeBatch::default();
        freed
    }
}
