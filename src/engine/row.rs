//! One request's state while it runs, independent of where its KV cache
//! lives (a prefill cohort or the decode batch): sampler, token history,
//! detokenizer, stop matching, counters, timings, and the events it sends.

use super::delivery::Outlet;
use super::logprobs::TokenLogprob;
use super::request::{Channel, Event, FinishReason, Job, RequestSpec, Usage};
use super::spec::SpecState;
use crate::error::Result;
use crate::grammar::Constraint;
use crate::mlx::Array;
use crate::model::load::TextAssets;
use crate::sample::Sampler;
use crate::text::{ChannelParser, IncrementalDecoder, Piece, StopMatcher};
use std::ops::Deref;
use std::sync::Arc;
use std::time::Instant;

/// A running request: its spec (which the row derefs to: `row.prompt`,
/// `row.namespace`, ...) and the state of its generation.
pub(crate) struct Row {
    spec: Arc<RequestSpec>,
    /// KV bytes reserved for this request at admission.
    pub kv_reserved: usize,
    /// Prompt tokens whose state came from the prompt cache.
    pub cached: usize,
    pub sampler: Sampler,
    /// Speculative decoding's state (None: this row decodes plainly).
    pub speculation: Option<SpecState>,
    generated: u32,
    /// Prompt and generated ids (the repetition penalty window).
    history: Vec<i32>,
    detok: IncrementalDecoder,
    stop: Option<StopMatcher>,
    channels: ChannelParser,
    tool_calls: usize,
    /// Ids (and log-probabilities) of tokens whose text is still withheld.
    held: Vec<u32>,
    held_lp: Vec<TokenLogprob>,
    started: Instant,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    out: Outlet,
    /// Structured output: the matcher that masks every draw.
    pub constraint: Option<Constraint>,
}

impl Deref for Row {
    type Target = RequestSpec;

    fn deref(&self) -> &RequestSpec {
        &self.spec
    }
}

impl Row {
    /// Sets up the state; on failure the request gets its error event and
    /// None is returned.
    pub fn open(job: Job, text: &TextAssets, seed: u64, kv_reserved: usize) -> Option<Row> {
        let Job { spec, mut outlet, constraint } = job;
        let build = || -> Result<(Sampler, IncrementalDecoder, Option<StopMatcher>)> {
            let stop = if spec.stop.is_empty() { None } else { Some(StopMatcher::new(&spec.stop)?) };
            Ok((Sampler::new(spec.sampling.clone(), seed)?, IncrementalDecoder::new(text.tokenizer.clone())?, stop))
        };
        match build() {
            Ok((sampler, detok, stop)) => Some(Row {
                history: spec.prompt.iter().map(|&t| t as i32).collect(),
                kv_reserved,
                cached: 0,
                speculation: SpecState::new(spec.speculation, spec.sampling.seed.unwrap_or(seed)),
                sampler,
                generated: 0,
                detok,
                stop,
                channels: ChannelParser::new(spec.output_format),
                tool_calls: 0,
                held: vec![],
                held_lp: vec![],
                started: Instant::now(),
                first_token: None,
                last_token: None,
                out: outlet,
                constraint,
                spec,
            }),
            Err(e) => {
                outlet.send(Event::Error(e));
                None
            }
        }
    }

    pub fn is_cancelled(&self) -> bool {
        self.spec.is_cancelled()
    }

    /// Whether its terminal event was sent (it finished or failed).
    pub fn is_ended(&self) -> bool {
        self.out.is_ended()
    }

    /// The constraint of a row still generating.
    pub fn live_constraint(&mut self) -> Option<&mut Constraint> {
        if self.out.is_ended() {
            return None;
        }
        self.constraint.as_mut()
    }

    /// Prompt and generated ids so far, as the prompt cache keys them
    /// (`RequestSpec::key` for the prompt, then the generated ids).
    pub fn cache_history(&self) -> Vec<u32> {
        let key = self.spec.key();
        key.iter().copied().chain(self.history[self.spec.prompt.len()..].iter().map(|&t| t as u32)).collect()
    }

    /// Prompt and generated ids so far, as fed to the model.
    pub fn history_ids(&self) -> &[i32] {
        &self.history
    }

    /// A verified draft is handed over (its request's `spec_accepted`
    /// counts only drafts it emitted, not the rest of a run cut short).
    pub fn count_accepted_draft(&mut self) {
        if let Some(s) = &mut self.speculation {
            s.accepted += 1;
        }
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> u32 {
        self.generated
    }

    /// The repetition-penalty window after the history and then `extra`
    /// (ids not in the history yet); None when the sampler does not need it.
    pub fn window_after(&self, extra: &[i32]) -> Result<Option<Array>> {
        if !self.sampler.needs_history() {
            return Ok(None);
        }
        let ctx = self.sampler.context_size();
        let all: Vec<i32> = self.history.iter().chain(extra).copied().collect();
        let n = ctx.min(all.len());
        Ok(Some(Array::from_i32(&all[all.len() - n..], &[n as i32])?))
    }

    fn emit(&mut self, ev: Event) {
        self.out.send(ev);
    }

    /// The repetition-penalty window: the last `context_size` ids, ending
    /// with `unread` (a lazy `[1]` token not yet in the history) if given.
    /// None when the sampler does not need it.
    pub fn history_window(&self, unread: Option<&Array>) -> Result<Option<Array>> {
        if !self.sampler.needs_history() {
            return Ok(None);
        }
        let ctx = self.sampler.context_size();
        let n = ctx.saturating_sub(unread.is_some() as usize).min(self.history.len());
        let known = Array::from_i32(&self.history[self.history.len() - n..], &[n as i32])?;
        Ok(Some(match unread {
            Some(t) if n > 0 => Array::concatenate(&[&known, &t.reshape(&[1])?], 0)?,
            Some(t) => t.reshape(&[1])?,
            None => known,
        }))
    }

    /// Takes a generated token: emits its text, and ends the request (its
    /// terminal event sent) when it is an end token, completes a stop string,
    /// or uses up the budget. Returns whether the request ended.
    pub fn accept(&mut self, tok: u32, lp: Option<TokenLogprob>, text: &TextAssets, ctx_len: usize) -> Result<bool> {
        let now = Instant::now();
        self.first_token.get_or_insert(now);
        self.last_token = Some(now);
        self.generated += 1;
        self.history.push(tok as i32);
        if let Some(c) = &mut self.constraint {
            c.consume(tok)?;
        }
        // A constrained row draws an end token only where its document is
        // complete: it ends there even with `ignore_eos`.
        if (self.stop_at_eos || self.constraint.is_some()) && text.eos_ids.contains(&tok) {
            // Counted and reported (id, log-probability) in the last, textless
            // delta, like mlx-lm; never decoded.
            self.finish_with(FinishReason::Stop, None, Some((tok, lp)));
            return Ok(true);
        }
        self.held.push(tok);
        self.held_lp.extend(lp);
        let piece = self.detok.push(tok)?;
        if let Some(stop) = &mut self.stop {
            let r = stop.push(&piece);
            self.send_text(r.emit);
            if let Some(i) = r.stopped {
                self.finish(FinishReason::Stop, Some(i));
                return Ok(true);
            }
        } else {
            self.send_text(piece);
        }
        // A finished document ends the stream even with `ignore_eos`.
        if self.constraint.as_ref().is_some_and(Constraint::is_done) {
            self.finish(FinishReason::Stop, None);
            return Ok(true);
        }
        let total = self.prompt.len() + self.generated as usize;
        if self.generated >= self.max_tokens || (ctx_len > 0 && total >= ctx_len) {
            self.finish(FinishReason::Length, None);
            return Ok(true);
        }
        Ok(false)
    }

    /// Text that passed the stop matcher, split into channels.
    fn send_text(&mut self, text: String) {
        let pieces = self.channels.push(&text);
        self.send_pieces(pieces);
    }

    fn send_pieces(&mut self, pieces: Vec<Piece>) {
        for p in pieces {
            match p {
                Piece::Content(t) => self.delta(t, Channel::Content),
                Piece::Reasoning(t) => self.delta(t, Channel::Reasoning),
                Piece::ToolCall { name, arguments } => {
                    self.tool_calls += 1;
                    let id = format!("call_{}_{}", self.spec.id, self.tool_calls);
                    self.emit(Event::ToolCall { id, name, arguments });
                }
            }
        }
    }

    /// A text delta carrying the ids of the tokens held so far.
    fn delta(&mut self, text: String, channel: Channel) {
        if !text.is_empty() {
            let tokens = std::mem::take(&mut self.held);
            let logprobs = std::mem::take(&mut self.held_lp);
            self.emit(Event::Delta { text, tokens, logprobs, channel });
        }
    }

    /// Ends the request with an error event.
    pub fn fail(&mut self, err: crate::Error) {
        self.emit(Event::Error(err));
    }

    /// Flushes withheld text (unless a stop string matched) and sends `Done`.
    pub fn finish(&mut self, finish: FinishReason, stop_index: Option<usize>) {
        self.finish_with(finish, stop_index, None);
    }

    /// `finish`; `eos` is the end-of-sequence token that ended the request,
    /// reported after every text delta.
    fn finish_with(&mut self, mut finish: FinishReason, mut stop_index: Option<usize>, eos: Option<(u32, Option<TokenLogprob>)>) {
        if self.out.is_ended() {
            return;
        }
        if finish != FinishReason::Cancelled {
            if stop_index.is_none() {
                let mut rest = self.detok.finish();
                if let Some(stop) = &mut self.stop {
                    let r = stop.push(&rest);
                    rest = r.emit;
                    match r.stopped {
                        Some(i) => (finish, stop_index) = (FinishReason::Stop, Some(i)),
                        None => rest += &stop.finish(),
                    }
                }
                self.send_text(rest);
            }
            let tail = self.channels.finish();
            self.send_pieces(tail);
            if let Some((tok, lp)) = eos {
                self.held.push(tok);
                self.held_lp.extend(lp);
            }
            if stop_index.is_none() && !self.held.is_empty() {
                // Tokens that made no text (special tokens at the end).
                let tokens = std::mem::take(&mut self.held);
                let logprobs = std::mem::take(&mut self.held_lp);
                self.emit(Event::Delta { text: String::new(), tokens, logprobs, channel: Channel::Content });
            }
            if finish == FinishReason::Stop && stop_index.is_none() && self.tool_calls > 0 {
                finish = FinishReason::ToolCalls;
            }
        }
        let usage = self.usage();
        self.emit(Event::Done { finish, stop_index, usage });
    }

    fn usage(&self) -> Usage {
        let ms = |a: Instant, b: Instant| b.duration_since(a).as_secs_f64() * 1e3;
        let mut u = Usage {
            prompt_tokens: self.prompt.len() as u32,
            cached_tokens: self.cached as u32,
            completion_tokens: self.generated,
            ..Default::default()
        };
        if let Some(s) = &self.speculation {
            (u.spec_proposed, u.spec_accepted, u.spec_verify_steps) = (s.proposed, s.accepted, s.verify_steps);
        }
        if let Some(first) = self.first_token {
            u.ttft_ms = ms(self.submitted, first);
            u.prefill_ms = ms(self.started, first);
            if u.prefill_ms > 0.0 {
                u.prefill_tokens_per_s = self.prompt.len() as f64 / (u.prefill_ms / 1e3);
            }
            if let Some(last) = self.last_token {
                u.decode_ms = ms(first, last);
                if self.generated > 1 && u.decode_ms > 0.0 {
                    u.decode_tokens_per_s = (self.generated - 1) as f64 / (u.decode_ms / 1e3);
                }
            }
        }
        u
    }
}
