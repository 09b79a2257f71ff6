//! One request's generation on the scheduler thread: chunked prefill, then
//! pipelined decode (the next step's graph is built and scheduled before the
//! current token is read, as mlx-lm does), detokenization, stop handling and
//! the events that report it.

use super::delivery::{DeliveryTx, Msg};
use super::request::{Event, FinishReason, Job, RequestState, Usage};
use crate::cache::KvCache;
use crate::error::Result;
use crate::mlx::{self, Array};
use crate::model::{LanguageModel, Output};
use crate::model::load::TextAssets;
use crate::sample::{Draw, Sampler};
use crate::text::{IncrementalDecoder, StopMatcher};
use std::sync::Arc;
use std::time::Instant;

pub(crate) struct Generation {
    pub state: Arc<RequestState>,
    prompt: Vec<u32>,
    max_tokens: u32,
    stop_at_eos: bool,
    submitted: Instant,
    cache: Vec<KvCache>,
    sampler: Sampler,
    /// Prompt tokens already in the cache.
    prefilled: usize,
    /// The scheduled, not yet read, next token.
    pending: Option<Draw>,
    generated: u32,
    /// Prompt and generated token ids (for the repetition penalty window).
    history: Vec<i32>,
    detok: IncrementalDecoder,
    stop: Option<StopMatcher>,
    /// Ids of tokens whose text is still withheld.
    held: Vec<u32>,
    started: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    tx: DeliveryTx,
}

/// Whether the request is still running after a step.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Progress {
    Running,
    Finished,
}

impl Generation {
    /// Takes the job's sink to the delivery thread and sets up the state.
    pub fn start(job: Job, model: &dyn LanguageModel, text: &Arc<TextAssets>, seed: u64, tx: DeliveryTx) -> Result<Generation> {
        let id = job.state.id;
        let _ = tx.send(Msg::Open(id, job.sink));
        let stop = if job.stop.is_empty() {
            None
        } else {
            Some(StopMatcher::new(&job.stop)?)
        };
        Ok(Generation {
            state: job.state,
            history: job.prompt.iter().map(|&t| t as i32).collect(),
            prompt: job.prompt,
            max_tokens: job.max_tokens,
            stop_at_eos: job.stop_at_eos,
            submitted: job.submitted,
            cache: model.new_cache(1),
            sampler: Sampler::new(job.sampling, seed)?,
            prefilled: 0,
            pending: None,
            generated: 0,
            detok: IncrementalDecoder::new(text.tokenizer.clone())?,
            stop,
            held: vec![],
            started: None,
            first_token: None,
            last_token: None,
            tx,
        })
    }

    fn emit(&self, ev: Event) {
        let _ = self.tx.send(Msg::Event(self.state.id, ev));
    }

    /// Ends the request with an error event.
    pub fn fail(self, err: crate::Error) {
        self.emit(Event::Error(err));
    }

    /// Ends the request as cancelled.
    pub fn cancel(mut self) {
        self.finish(FinishReason::Cancelled, None);
    }

    /// Runs one unit of work: a prefill chunk of at most `chunk` tokens, or
    /// one decode step.
    pub fn step(&mut self, model: &dyn LanguageModel, text: &TextAssets, chunk: usize, ctx_len: usize) -> Result<Progress> {
        if self.pending.is_none() {
            self.prefill(model, chunk)?;
            return Ok(Progress::Running);
        }
        let cur = self.pending.take().expect("checked above");
        let total = self.prompt.len() + self.generated as usize + 1;
        let more = self.generated + 1 < self.max_tokens && (ctx_len == 0 || total < ctx_len);
        if more {
            let next = self.forward_one(model, &cur.token)?;
            mlx::async_eval(&[&next.token])?;
            self.pending = Some(next);
        }
        let tok = cur.token.item_i32()? as u32;
        let now = Instant::now();
        self.first_token.get_or_insert(now);
        self.last_token = Some(now);
        self.generated += 1;
        self.history.push(tok as i32);

        if self.stop_at_eos && text.eos_ids.contains(&tok) {
            self.pending = None;
            self.finish(FinishReason::Stop, None);
            return Ok(Progress::Finished);
        }
        self.held.push(tok);
        let piece = self.detok.push(tok)?;
        if let Some(stop) = &mut self.stop {
            let r = stop.push(&piece);
            self.send_text(r.emit);
            if let Some(i) = r.stopped {
                self.pending = None;
                self.finish(FinishReason::Stop, Some(i));
                return Ok(Progress::Finished);
            }
        } else {
            self.send_text(piece);
        }
        if !more {
            self.pending = None;
            self.finish(FinishReason::Length, None);
            return Ok(Progress::Finished);
        }
        Ok(Progress::Running)
    }

    /// Prefills one chunk; the prompt's last token is forwarded on its own to
    /// produce the first logits (mlx-lm's tail split), and the first token is
    /// scheduled.
    fn prefill(&mut self, model: &dyn LanguageModel, chunk: usize) -> Result<()> {
        self.started.get_or_insert_with(Instant::now);
        let rest = self.prompt.len() - 1 - self.prefilled;
        if rest > 0 {
            let n = rest.min(chunk.max(1));
            let ids: Vec<i32> = self.prompt[self.prefilled..self.prefilled + n].iter().map(|&t| t as i32).collect();
            let x = Array::from_i32(&ids, &[1, n as i32])?;
            model.forward(&x, &mut self.cache, Output::CacheOnly)?;
            let state: Vec<&Array> = self.cache.iter().flat_map(|c| c.state()).collect();
            mlx::eval(&state)?;
            self.prefilled += n;
            return Ok(());
        }
        let last = Array::from_i32(&[*self.prompt.last().expect("prompt is never empty") as i32], &[1])?;
        let first = self.forward_one(model, &last)?;
        mlx::async_eval(&[&first.token])?;
        self.prefilled += 1;
        self.pending = Some(first);
        Ok(())
    }

    /// Builds the graph for the token after `token` (`[1]` int32, may be lazy).
    fn forward_one(&mut self, model: &dyn LanguageModel, token: &Array) -> Result<Draw> {
        let x = token.reshape(&[1, 1])?;
        let logits = model.forward(&x, &mut self.cache, Output::LastLogits)?.expect("LastLogits returns logits");
        let logits = logits.squeeze(1)?;
        let history = if self.sampler.needs_history() {
            // The window ends with `token`, which may not be evaluated yet.
            let n = self.sampler.context_size().saturating_sub(1).min(self.history.len());
            let known = &self.history[self.history.len() - n..];
            let tail = token.reshape(&[1])?;
            Some(if known.is_empty() {
                tail
            } else {
                Array::concatenate(&[&Array::from_i32(known, &[n as i32])?, &tail], 0)?
            })
        } else {
            None
        };
        self.sampler.draw(&logits, history.as_ref())
    }

    fn send_text(&mut self, text: String) {
        if !text.is_empty() {
            let tokens = std::mem::take(&mut self.held);
            self.emit(Event::Delta { text, tokens });
        }
    }

    /// Reports tokens that produced no text (special tokens at the end).
    fn send_held_tokens(&mut self) {
        if !self.held.is_empty() {
            let tokens = std::mem::take(&mut self.held);
            self.emit(Event::Delta { text: String::new(), tokens });
        }
    }

    /// Flushes withheld text (unless a stop string matched) and sends `Done`.
    fn finish(&mut self, mut finish: FinishReason, mut stop_index: Option<usize>) {
        if finish != FinishReason::Cancelled && stop_index.is_none() {
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
            if stop_index.is_none() {
                self.send_held_tokens();
            }
        }
        let usage = self.usage();
        self.emit(Event::Done { finish, stop_index, usage });
    }

    fn usage(&self) -> Usage {
        let ms = |a: Instant, b: Instant| b.duration_since(a).as_secs_f64() * 1e3;
        let mut u = Usage {
            prompt_tokens: self.prompt.len() as u32,
            cached_tokens: 0,
            completion_tokens: self.generated,
            ..Default::default()
        };
        if let (Some(start), Some(first)) = (self.started, self.first_token) {
            u.ttft_ms = ms(self.submitted, first);
            u.prefill_ms = ms(start, first);
            if u.prefill_ms > 0.0 {
                u.prefill_tokens_per_s = self.prompt.len() as f64 / (u.prefill_ms / 1e3);
            }
        }
        if let (Some(first), Some(last)) = (self.first_token, self.last_token) {
            u.decode_ms = ms(first, last);
            if self.generated > 1 && u.decode_ms > 0.0 {
                u.decode_tokens_per_s = (self.generated - 1) as f64 / (u.decode_ms / 1e3);
            }
        }
        u
    }
}
