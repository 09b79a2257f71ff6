//! Speculative decoding: a row drafts up to γ tokens, by prompt lookup from
//! its own prompt and output (`ngram`) or with a smaller draft model that
//! shares the tokenizer (`draft`), the model checks them all in one
//! forward pass over `[pending, d1..dk]`, and the row keeps the longest
//! prefix the model agrees with plus the model's own next token (`accept`).
//! The KV cache is cut back past the rejected drafts (`LayerCache::trim`).
//!
//! Where it runs: inside the decode batch, per row. A verify step feeds
//! every row the same width (its pending token, its drafts, filler); rows
//! that do not speculate, or drafted nothing this step, take the plain
//! step's token from the first position. Each row accepts on its own; the
//! batch keeps the longest run and the shorter rows' rejected slots become
//! holes they never attend to again (`Timeline::punch`). With several rows
//! that needs dense full-attention KV caches (`LayerCache::can_punch`); a
//! row alone only needs caches that can be cut back after the step
//! (`LayerCache::can_trim_after`), or a recurrent state (hybrid models),
//! which is checkpointed before the step and, after a rejection, rewound
//! and fed the accepted run once more (a second, shorter forward). No
//! verify step runs while a row asks for log-probabilities or is
//! constrained (structured output: a mask per position), when a layer
//! cannot be cut back (a sliding-window ring that would wrap; quantized KV
//! crossing the row's `quantized_kv_start`), or when no row drafts
//! anything (then the step is a plain one).
//!
//! Output: greedy rows emit exactly the tokens plain decoding would (up to
//! the float rounding of a wider forward pass). Sampled rows follow the same
//! distribution; their verify steps draw with uniforms keyed by the request
//! seed and the token's index (`accept::uniform`), so a seeded request run
//! alone is reproducible, though its tokens differ from the same seed
//! without speculation.

pub(crate) mod accept;
pub(crate) mod draft;
mod ngram;

use super::batch::{Drawn, StepCtx};
use super::row::Row;
use super::row_set::RowSet;
use super::trace::SpanKind;
use crate::cache::LayerCache;
use crate::error::{Error, Result};
use crate::mlx::{self, Array};
use crate::model::{LanguageModel, Output};
use serde_json::Value;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

/// Drafted tokens per verify step when not given.
pub(crate) const DEFAULT_NGRAM_TOKENS: usize = 10;
/// Most drafted tokens per verify step (the `num_tokens` option's bound).
const MAX_DRAFTS: usize = 64;
/// Draft-model tokens per verify step when not given.
pub(crate) const DEFAULT_DRAFT_TOKENS: usize = 3;
/// Shortest match lookup drafts from when not given.
pub(crate) const NGRAM_MIN_MATCH: usize = ngram::MIN_MATCH;

/// Whether and how a request speculates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Speculation {
    #[default]
    Off,
    /// Prompt lookup, up to `num_tokens` drafted tokens per verify step,
    /// from a match of at least `min_match` (1..=4) trailing tokens.
    Ngram { num_tokens: usize, min_match: usize },
    /// The engine's draft model (`EngineConfig::draft_model_path`) drafts
    /// `num_tokens` greedily per verify step.
    Draft { num_tokens: usize },
}

impl Speculation {
    /// The request option: `"off"`, `"ngram"`, `"draft"`, `{"type":
    /// "ngram", "num_tokens": n, "min_match": m}` (both optional) or
    /// `{"type": "draft", "num_tokens": n}` (`{"type": "off"}` too).
    pub fn from_json(v: &Value) -> Result<Speculation> {
        let bad = || {
            Error::invalid(
                "option `speculation` must be \"off\", \"ngram\", \"draft\", {\"type\": \"ngram\", \"num_tokens\": n, \"min_match\": m} \
                 or {\"type\": \"draft\", \"num_tokens\": n} (1 <= n <= 64, 1 <= m <= 4)",
            )
        };
        let (kind, n, m) = match v {
            Value::String(s) => (s.as_str(), None, None),
            Value::Object(o) => {
                if o.keys().any(|k| !["type", "num_tokens", "min_match"].contains(&k.as_str())) {
                    return Err(bad());
                }
                let get = |key: &str, max: u64| -> Result<Option<usize>> {
                    match o.get(key) {
                        None => Ok(None),
                        Some(n) => Ok(Some(n.as_u64().filter(|&n| (1..=max).contains(&n)).ok_or_else(bad)? as usize)),
                    }
                };
                let (n, m) = (get("num_tokens", MAX_DRAFTS as u64)?, get("min_match", ngram::MAX_MATCH as u64)?);
                (o.get("type").and_then(Value::as_str).ok_or_else(bad)?, n, m)
            }
            _ => return Err(bad()),
        };
        match kind {
            "off" if n.is_none() && m.is_none() => Ok(Speculation::Off),
            "ngram" => Ok(Speculation::Ngram {
                num_tokens: n.unwrap_or(DEFAULT_NGRAM_TOKENS),
                min_match: m.unwrap_or(ngram::MIN_MATCH),
            }),
            "draft" if m.is_none() => Ok(Speculation::Draft { num_tokens: n.unwrap_or(DEFAULT_DRAFT_TOKENS) }),
            _ => Err(bad()),
        }
    }
}

/// A speculating row's settings and counters.
#[derive(Debug)]
pub(crate) struct SpecState {
    /// Drafts per step now, and at most: it starts at `START_GAMMA`, a step
    /// that accepts every draft raises it by 2, one that rejects some sets it
    /// to the accepted count + 1 (not below 2), so the verify width follows
    /// the runs this row actually copies: on a CPU each drafted position
    /// costs a sixth of a decode step or so (a width-11 verify ~2.8 steps).
    gamma: usize,
    gamma_max: usize,
    min_match: usize,
    /// Drafts come from the draft model (else from prompt lookup).
    model: bool,
    /// The request's seed (its verify steps' draws are keyed by it).
    seed: u64,
    pub proposed: u32,
    pub accepted: u32,
    pub verify_steps: u32,
}

/// Drafts in a row's first verify step (at most the configured count): a
/// long first draft that fails costs more than it could win.
const START_GAMMA: usize = 4;

impl SpecState {
    pub fn new(s: Speculation, seed: u64) -> Option<SpecState> {
        match s {
            Speculation::Off => None,
            Speculation::Ngram { num_tokens, min_match } => Some(SpecState {
                gamma: num_tokens.min(START_GAMMA),
                gamma_max: num_tokens,
                min_match,
                model: false,
                seed,
                proposed: 0,
                accepted: 0,
                verify_steps: 0,
            }),
            // A draft model's γ is small: it starts there.
            Speculation::Draft { num_tokens } => Some(SpecState {
                gamma: num_tokens,
                gamma_max: num_tokens,
                min_match: 0,
                model: true,
                seed,
                proposed: 0,
                accepted: 0,
                verify_steps: 0,
            }),
        }
    }
}

/// Engine-wide counters (`EngineStats::spec_*`).
#[derive(Debug, Default)]
pub(crate) struct SpecStats {
    pub proposed: AtomicU64,
    pub accepted: AtomicU64,
    pub verify_steps: AtomicU64,
    /// Rows the draft model holds a cache for now.
    pub draft_rows: AtomicUsize,
}

/// A verify step's outcome, per row of the batch: the tokens to hand over
/// in order (the pending token it fed, then the accepted drafts), and the
/// token the next step feeds (the model's own, after the accepted run).
pub(crate) struct Round {
    pub runs: Vec<Vec<u32>>,
    pub next: Vec<u32>,
}

/// Whether `row` may draft this step (before looking at its pending token).
fn may_draft(row: &Row) -> bool {
    // A constrained row (structured output) needs a mask per position.
    row.speculation.is_some() && row.logprobs.is_none() && row.constraint.is_none() && !row.is_ended() && !row.is_cancelled()
}

/// The drafts `row` proposes after its pending token `t0`, at most
/// `max_drafts`: none when it does not speculate or would end with `t0`.
/// Drafts never run past max_tokens or the context: the row would end
/// inside the run anyway.
fn drafts_for(row: &Row, t0: i32, max_drafts: usize, step: &StepCtx) -> Result<Vec<i32>> {
    let Some(spec) = row.speculation.as_ref().filter(|_| may_draft(row)) else { return Ok(vec![]) };
    if row.stop_at_eos && step.text.eos_ids.contains(&(t0 as u32)) {
        return Ok(vec![]);
    }
    let mut history = row.history_ids().to_vec();
    history.push(t0);
    let mut room = (row.max_tokens as usize).saturating_sub(row.generated() as usize + 1).min(max_drafts);
    if step.ctx_len > 0 {
        room = room.min(step.ctx_len.saturating_sub(history.len()));
    }
    let gamma = spec.gamma.min(room);
    match step.drafter.filter(|_| spec.model) {
        Some(d) if gamma > 0 => {
            let t = Instant::now();
            let drafts = d.propose(row.id, &history, gamma)?;
            // The draft model's forwards (and their wait) as one span.
            step.tracer.record(SpanKind::Forward, 1, drafts.len(), t);
            Ok(drafts)
        }
        Some(_) => Ok(vec![]),
        None => Ok(ngram::propose(&history, gamma, spec.min_match)),
    }
}

/// Runs a verify step instead of a plain decode step when some row of the
/// batch speculates and drafts something; None = decode plainly. Every row
/// feeds its pending token and its drafts (none for the rows that do not
/// speculate), padded to one width; each row accepts on its own, the batch
/// keeps the longest run, and the shorter rows' rejected slots become holes
/// (`Timeline::punch`), so rows with and without speculation share the
/// step. Reads the pending tokens first: speculating gives up the one-step
/// lookahead.
pub(crate) fn try_round(set: &mut RowSet, pending: &Drawn, model: &dyn LanguageModel, step: &StepCtx) -> Result<Option<Round>> {
    let (tracer, stats) = (step.tracer, step.spec);
    let b = set.len();
    // Log-probabilities and grammar masks are drawn per step for the whole
    // batch; several rows need caches whose rows can keep holes.
    if pending.logprobs.is_some()
        || !set.rows.iter().any(may_draft)
        || set.rows.iter().any(|r| r.logprobs.is_some() || r.constraint.is_some())
        || (b > 1 && !set.cache().iter().all(LayerCache::can_punch))
    {
        return Ok(None);
    }
    // A recurrent state (hybrid models, a row alone) is checkpointed and
    // replayed instead of cut back. The widest step the caches allow bounds
    // the drafts (a ring about to wrap allows none): no draft is made, by a
    // draft model's forwards, only to be thrown away.
    let fits = |w: i32| set.cache().iter().all(|c| c.can_trim_after(w) || matches!(c, LayerCache::State(_)));
    let max_drafts = (1..=MAX_DRAFTS as i32 + 1).rev().find(|&w| fits(w)).map_or(0, |w| w as usize - 1);
    let t0s = pending.tokens.to_vec_i32()?;
    let mut drafts = Vec::with_capacity(b);
    for (row, &t0) in set.rows.iter_mut().zip(&t0s) {
        // A draft model that fails ends its row; the others go on.
        drafts.push(drafts_for(row, t0, max_drafts, step).unwrap_or_else(|e| {
            row.fail(e);
            vec![]
        }));
    }
    let k_max = drafts.iter().map(Vec::len).max().unwrap_or(0);
    let width = 1 + k_max as i32;
    if k_max == 0 {
        return Ok(None);
    }
    let checkpoints: Vec<_> = set.cache().iter().map(LayerCache::checkpoint).collect();

    let t = Instant::now();
    let len_before = set.cache()[0].len();
    // Row i: its pending token, its drafts, then its pending token again as
    // filler up to the width (those slots are cut back or become holes).
    let fed: Vec<Vec<i32>> = t0s.iter().zip(&drafts).map(|(&t0, d)| std::iter::once(t0).chain(d.iter().copied()).collect()).collect();
    let flat: Vec<i32> =
        fed.iter().flat_map(|f| f.iter().copied().chain(std::iter::repeat(f[0])).take(width as usize)).collect();
    let x = Array::from_i32(&flat, &[b as i32, width])?;
    tracer.model_call();
    let logits = model.forward(&x, set.cache_mut(), Output::AllLogits)?.expect("logits requested");
    tracer.record(SpanKind::Forward, b, b * width as usize, t);

    let t = Instant::now();
    let outcomes = accept_rows(&mut set.rows, &logits, &fed, &drafts)?;
    tracer.record(SpanKind::Sample, b, b * width as usize, t);
    // The batch keeps the longest run; the rows that accepted fewer have
    // holes where their rejected drafts (or filler) were written.
    let kept = outcomes.iter().map(|&(a, _)| a as i32 + 1).max().unwrap_or(1);
    if kept < width && checkpoints.iter().any(Option::is_some) {
        // A recurrent state (one row): back to before the step, then the
        // accepted run once more.
        let t = Instant::now();
        for (c, cp) in set.cache_mut().iter_mut().zip(checkpoints) {
            c.rewind(cp, width)?;
        }
        let x = Array::from_i32(&fed[0][..kept as usize], &[1, kept])?;
        tracer.model_call();
        model.forward(&x, set.cache_mut(), Output::CacheOnly)?;
        tracer.record(SpanKind::Forward, 1, kept as usize, t);
    } else {
        for c in set.cache_mut().iter_mut() {
            if width > kept {
                c.trim(width - kept)?;
            }
            for (i, &(a, _)) in outcomes.iter().enumerate() {
                if a as i32 + 1 < kept {
                    c.punch(i, len_before + a as i32 + 1, len_before + kept)?;
                }
            }
        }
    }
    let mut runs = Vec::with_capacity(b);
    for ((row, d), (f, &(a, _))) in set.rows.iter_mut().zip(&drafts).zip(fed.iter().zip(&outcomes)) {
        runs.push(f[..=a].iter().map(|&t| t as u32).collect());
        let (Some(spec), k) = (row.speculation.as_mut(), d.len()) else { continue };
        if k == 0 {
            continue;
        }
        // (Its `accepted` grows as `DecodeBatch::collect` hands the drafts over.)
        spec.proposed += k as u32;
        spec.verify_steps += 1;
        spec.gamma = if a == k { (spec.gamma + 2).min(spec.gamma_max) } else { (a + 1).clamp(2, spec.gamma.max(2)).min(spec.gamma_max) };
        stats.proposed.fetch_add(k as u64, Ordering::Relaxed);
        stats.accepted.fetch_add(a as u64, Ordering::Relaxed);
        stats.verify_steps.fetch_add(1, Ordering::Relaxed);
    }
    Ok(Some(Round { runs, next: outcomes.into_iter().map(|(_, n)| n as u32).collect() }))
}

/// Each row's accepted draft count and next token from a verify forward's
/// logits (`[B, width, vocab]`). A row without drafts draws as in a plain
/// step. A row whose draw fails ends with the error (next token 0, which
/// `collect` skips); the others go on.
fn accept_rows(rows: &mut [Row], logits: &Array, fed: &[Vec<i32>], drafts: &[Vec<i32>]) -> Result<Vec<(usize, i32)>> {
    // Greedy rows (and rows that ended: their tokens are dropped) take the
    // argmax of the logits, as the plain step (`Sampler::draw`); one for all.
    let fast = |r: &Row| (r.sampler.is_greedy() && !r.sampler.needs_history()) || r.is_ended() || r.is_cancelled();
    let argmax = if rows.iter().any(fast) {
        Some(logits.argmax(-1, false)?)
    } else {
        None
    };
    // The other rows' draws, each position with the row's own pipeline
    // (penalty window ending with the drafts it follows).
    let mut pipes: Vec<Option<Result<Vec<Array>>>> = Vec::with_capacity(rows.len());
    for (i, row) in rows.iter_mut().enumerate() {
        if fast(row) {
            pipes.push(None);
            continue;
        }
        let f = &fed[i];
        let spec_sampled = !drafts[i].is_empty() && !row.sampler.is_greedy();
        let per_row = (0..f.len())
            .map(|j| {
                let at = logits.slice(&[i as i32, j as i32, 0], &[i as i32 + 1, j as i32 + 1, logits.dim(2)], &[1, 1, 1])?;
                let at = at.reshape(&[1, -1])?;
                let window = row.window_after(&f[..=j])?;
                if spec_sampled {
                    row.sampler.probs(&at, window.as_ref())
                } else {
                    Ok(row.sampler.draw(&at, window.as_ref())?.token)
                }
            })
            .collect::<Result<Vec<_>>>();
        pipes.push(Some(per_row));
    }
    let mut lazy: Vec<&Array> = argmax.iter().collect();
    lazy.extend(pipes.iter().flatten().flat_map(|p| p.iter().flatten()));
    mlx::eval(&lazy)?;
    let width = logits.dim(1) as usize;
    let argmax = argmax.map(|a| a.to_vec_i32()).transpose()?;
    let mut out = Vec::with_capacity(rows.len());
    for (i, (row, pipe)) in rows.iter_mut().zip(pipes).enumerate() {
        let d = &drafts[i];
        let outcome = match pipe {
            None => {
                let a = argmax.as_ref().expect("computed for fast rows");
                Ok(accept::greedy(d, &a[i * width..i * width + d.len() + 1]))
            }
            Some(Err(e)) => Err(e),
            Some(Ok(outs)) if row.sampler.is_greedy() || d.is_empty() => outs
                .iter()
                .map(|o| Ok(o.to_vec_i32()?[0]))
                .collect::<Result<Vec<_>>>()
                .map(|target| accept::greedy(d, &target)),
            Some(Ok(outs)) => outs.iter().map(|o| Ok(o.to_vec_f32()?)).collect::<Result<Vec<_>>>().map(|probs| {
                let refs: Vec<&[f32]> = probs.iter().map(Vec::as_slice).collect();
                let seed = row.speculation.as_ref().map_or(0, |s| s.seed);
                accept::sampled(d, &refs, seed, row.generated() as u64 + 1)
            }),
        };
        out.push(outcome.unwrap_or_else(|e| {
            row.fail(e);
            (0, 0)
        }));
    }
    Ok(out)
}
