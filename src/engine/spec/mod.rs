//! Speculative decoding: a row drafts up to γ tokens, by prompt lookup from
//! its own prompt and output (`ngram`) or with a smaller draft model that
//! shares the tokenizer (`draft`), the model checks them all in one
//! forward pass over `[pending, d1..dk]`, and the row keeps the longest
//! prefix the model agrees with plus the model's own next token (`accept`).
//! The KV cache is cut back past the rejected drafts (`LayerCache::trim`).
//!
//! Where it runs: the decode batch's rows share one contiguous timeline, which
//! cannot hold rows that accepted different numbers of tokens, so a verify
//! step runs only when the batch has one row; with more, every row decodes
//! plainly (one token per step) until it is alone again. A row does not
//! speculate while it asks for log-probabilities, when a layer cannot be cut
//! back after the step (a recurrent-state layer: hybrid models never
//! speculate; a sliding-window ring that would wrap; quantized KV crossing
//! the row's `quantized_kv_start`), or when lookup finds nothing (then that
//! step is a plain one).
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

use super::batch::Drawn;
use super::row_set::RowSet;
use super::trace::{SpanKind, Tracer};
use crate::error::{Error, Result};
use crate::mlx::{self, Array};
use crate::model::load::TextAssets;
use crate::model::{LanguageModel, Output};
use serde_json::Value;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

/// Drafted tokens per verify step when not given.
pub(crate) const DEFAULT_NGRAM_TOKENS: usize = 10;
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
                let (n, m) = (get("num_tokens", 64)?, get("min_match", ngram::MAX_MATCH as u64)?);
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
    /// costs a fifth of a decode step or so (a width-11 verify ~3 steps).
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

/// A verify step's outcome for the batch's one row: the tokens to hand over
/// in order (the pending token it fed, then the accepted drafts), and the
/// token the next step feeds (the model's own, after the accepted run).
pub(crate) struct Round {
    pub run: Vec<u32>,
    pub next: u32,
}

/// Runs a verify step instead of a plain decode step when the batch has one
/// speculating row and lookup drafts something for it; None = decode
/// plainly. Reads the pending token (the row's next input) first: a
/// speculating row gives up the one-step lookahead.
pub(crate) fn try_round(
    set: &mut RowSet,
    pending: &Drawn,
    model: &dyn LanguageModel,
    text: &TextAssets,
    ctx_len: usize,
    tracer: &Tracer,
    stats: &SpecStats,
    drafter: Option<&draft::Drafter>,
) -> Result<Option<Round>> {
    if set.len() != 1 || pending.logprobs.is_some() {
        return Ok(None);
    }
    let row = &set.rows[0];
    let Some((gamma, min_match, by_model, seed)) = row.speculation.as_ref().map(|s| (s.gamma, s.min_match, s.model, s.seed)) else {
        return Ok(None);
    };
    // A constrained row (structured output) needs a mask per position:
    // it decodes plainly.
    if row.logprobs.is_some() || row.constraint.is_some() || row.is_ended() || row.is_cancelled() {
        return Ok(None);
    }
    let t0 = pending.tokens.to_vec_i32()?[0];
    if row.stop_at_eos && text.eos_ids.contains(&(t0 as u32)) {
        return Ok(None); // the row ends with t0
    }
    // Drafts never run past max_tokens or the context: the row would end
    // inside the run anyway.
    let mut history = row.history_ids().to_vec();
    history.push(t0);
    let mut room = (row.max_tokens as usize).saturating_sub(row.generated() as usize + 1);
    if ctx_len > 0 {
        room = room.min(ctx_len.saturating_sub(history.len()));
    }
    let drafts = match drafter.filter(|_| by_model) {
        // Drafting costs forwards: not when the verify step could not be
        // cut back (a hybrid target, a ring about to wrap).
        Some(_) if !set.cache().iter().all(|c| c.can_trim_after(1 + gamma.min(room) as i32)) => return Ok(None),
        Some(d) => {
            let t = Instant::now();
            let drafts = d.propose(row.id, &history, gamma.min(room))?;
            // The draft model's forwards (and their wait) as one span.
            tracer.record(SpanKind::Forward, 1, drafts.len(), t);
            drafts
        }
        None => ngram::propose(&history, gamma.min(room), min_match),
    };
    let k = drafts.len();
    let width = 1 + k as i32;
    if k == 0 || !set.cache().iter().all(|c| c.can_trim_after(width)) {
        return Ok(None);
    }

    let t = Instant::now();
    let mut fed = vec![t0];
    fed.extend(&drafts);
    let x = Array::from_i32(&fed, &[1, width])?;
    tracer.model_call();
    let logits = model.forward(&x, set.cache_mut(), Output::AllLogits)?.expect("logits requested");
    tracer.record(SpanKind::Forward, 1, width as usize, t);
    let t = Instant::now();
    let row = &mut set.rows[0];
    let (a, next) = if row.sampler.is_greedy() && !row.sampler.needs_history() {
        // As the plain step: argmax of the log-probabilities.
        let lp = logits.subtract(&logits.logsumexp(-1, true)?)?;
        let target = lp.argmax(-1, false)?.to_vec_i32()?;
        accept::greedy(&drafts, &target)
    } else {
        // Each position with the row's own pipeline (penalty window ending
        // with the drafts it follows).
        let mut outs = Vec::with_capacity(fed.len());
        for j in 0..fed.len() {
            let at = logits.slice_axis(1, j as i32, j as i32 + 1)?.reshape(&[1, -1])?;
            let window = row.window_after(&fed[..=j])?;
            outs.push(if row.sampler.is_greedy() {
                row.sampler.draw(&at, window.as_ref())?.token
            } else {
                row.sampler.probs(&at, window.as_ref())?
            });
        }
        mlx::eval(&outs.iter().collect::<Vec<_>>())?;
        if row.sampler.is_greedy() {
            let target = outs.iter().map(|o| Ok(o.to_vec_i32()?[0])).collect::<Result<Vec<_>>>()?;
            accept::greedy(&drafts, &target)
        } else {
            let probs = outs.iter().map(|o| Ok(o.to_vec_f32()?)).collect::<Result<Vec<_>>>()?;
            let refs: Vec<&[f32]> = probs.iter().map(Vec::as_slice).collect();
            accept::sampled(&drafts, &refs, seed, row.generated() as u64 + 1)
        }
    };
    tracer.record(SpanKind::Sample, 1, width as usize, t);
    let rejected = (k - a) as i32;
    if rejected > 0 {
        for c in set.cache_mut().iter_mut() {
            c.trim(rejected)?;
        }
    }
    let spec = set.rows[0].speculation.as_mut().expect("checked above");
    // (Its `accepted` grows as `DecodeBatch::collect` hands the drafts over.)
    spec.proposed += k as u32;
    spec.verify_steps += 1;
    spec.gamma = if a == k { (spec.gamma + 2).min(spec.gamma_max) } else { (a + 1).clamp(2, spec.gamma.max(2)).min(spec.gamma_max) };
    stats.proposed.fetch_add(k as u64, Ordering::Relaxed);
    stats.accepted.fetch_add(a as u64, Ordering::Relaxed);
    stats.verify_steps.fetch_add(1, Ordering::Relaxed);
    let run = fed[..=a].iter().map(|&t| t as u32).collect();
    Ok(Some(Round { run, next: next as u32 }))
}
