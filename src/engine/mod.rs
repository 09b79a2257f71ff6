//! The engine: a handle host threads share, a scheduler thread that owns the
//! model and all MLX state, and a delivery thread that runs callbacks.
//!
//! Host calls never block on model work: `prepare` validates, renders the chat
//! template and tokenizes on the calling thread, building the request's one
//! `RequestSpec`; `enqueue` hands it to the scheduler as a `Job`. Cancel is a
//! flag plus a wake-up message.

mod batch;
mod cache_io;
mod cohort;
mod delivery;
mod encoder_cache;
pub mod log;
pub mod logprobs;
mod pacing;
mod planner;
mod prefix_share;
mod prompt_cache;
pub mod request;
mod row;
mod row_set;
mod scheduler;
pub mod spec;
mod trace;

pub use crate::model::Kernels;
pub use log::{LogLevel, Logger};
pub use logprobs::TokenLogprob;
pub use request::{Channel, Event, EventSink, FinishReason, Input, RequestOptions, Usage};
pub use spec::Speculation;
pub use trace::{Span, SpanKind, SpanStats, TraceFn, SPAN_KINDS};

use crate::cache::scheme::KvQuant;
use crate::error::{Error, ErrorKind, Result};
use crate::model::load::TextAssets;
use crate::model::ModelInfo;
use crate::text::OutputFormat;
use crossbeam_channel::{Receiver, Sender};
use delivery::{DeliveryTx, Msg, Outlet};
use request::{Job, RequestSpec};
use scheduler::Command;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// Which MLX device runs the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// MLX's default (the GPU where there is one).
    Auto,
    Cpu,
    Gpu,
}

#[derive(Clone)]
pub struct EngineConfig {
    /// A `.gguf` file or a Hugging Face MLX-format folder.
    pub model_path: PathBuf,
    pub device: Device,
    /// Requests accepted but not finished (queued + running); more is `Busy`.
    pub max_in_flight: usize,
    /// Requests generating (or prefilling) at once; the rest wait in FIFO order.
    pub max_rows: usize,
    /// Bytes of KV cache all running requests may reserve (prompt + max_tokens
    /// each). A request that can never fit is rejected; one that does not fit
    /// now waits.
    pub kv_budget: usize,
    /// Prompt positions per prefill forward pass when nothing is decoding.
    /// The activations of a pass scale with it: a 4,096-token prefill peaks
    /// at 399 MB RSS with 512, 436 with 1024 (SmolLM2-135M Q4_1, same
    /// prefill speed); 256 saves nothing more.
    pub prefill_chunk: usize,
    /// Prompt tokens one scheduler iteration may prefill while rows are
    /// decoding (bounds their inter-token latency).
    pub step_token_budget: usize,
    /// A running prefill cohort takes a new request (fresh, or from a cached
    /// prefix, at the cohort's current position) only while the prompt
    /// positions its rows process, cached ones not counted, stay within
    /// this (default 2048; 0 = nothing joins a running cohort).
    pub prefill_join_tokens: usize,
    /// Base seed for requests that do not give one.
    pub seed: u64,
    /// Quantized-matmul kernels: mlxrt's on the CPU (default) or MLX's stock.
    pub kernels: Kernels,
    pub logger: Logger,
    /// Bytes of prompt-cache snapshots kept in memory (0 = no prompt cache).
    pub prompt_cache_bytes: usize,
    /// Where the prompt cache persists entries (None = memory only).
    pub prompt_cache_dir: Option<PathBuf>,
    /// Size cap of the prompt-cache directory.
    pub prompt_cache_dir_bytes: u64,
    /// Shortest sequence worth a snapshot.
    pub prompt_cache_min_tokens: usize,
    /// Bytes of vision-tower outputs kept for repeated images (0 = none).
    pub encoder_cache_bytes: usize,
    /// Model-load progress (may abort the load).
    pub progress: Option<crate::model::Progress>,
    /// How full-attention layers store KV (dense in the activations' dtype by
    /// default; `KvFloat::F16` for an f16 cache) and the default
    /// `quantized_kv_start` (0: quantized from the first token). Checked
    /// against the model at creation.
    pub kv: KvQuant,
    /// Receives the scheduler's spans (see `Span`) on the scheduler thread;
    /// it must be quick and must not call into the engine. None = spans are
    /// only summarised in the stats.
    pub trace: Option<TraceFn>,
    /// Speculative decoding for requests that do not choose (off by default;
    /// see `spec`). With a draft model and `Off` here, requests default to
    /// `Speculation::Draft` with 3 tokens.
    pub speculation: Speculation,
    /// A smaller model with the same tokenizer (a `.gguf` file or an MLX
    /// folder, loaded like `model_path`) that drafts tokens for
    /// `Speculation::Draft`. It must share the target's vocabulary and have
    /// only full-attention layers; else creation fails with
    /// `InvalidArgument`. None (default) = no draft model.
    pub draft_model_path: Option<PathBuf>,
    /// Paged KV (`cache::paged`): attention layers keep their keys and
    /// values (dense or as `kv` stores them; sliding windows release the
    /// blocks behind them) in blocks of a pool shared by all rows, so rows
    /// of different lengths pad nothing and prompt-cache hits share blocks;
    /// recurrent-state layers keep their per-row state. Off by default
    /// while it is being built.
    pub kv_paging: bool,
    /// Positions per KV block with paging: a multiple of 32 from 32 to 1024.
    pub kv_block_size: usize,
}

impl EngineConfig {
    pub fn new(model_path: impl Into<PathBuf>) -> EngineConfig {
        EngineConfig {
            model_path: model_path.into(),
            device: Device::Auto,
            max_in_flight: 256,
            max_rows: 32,
            kv_budget: 4 << 30,
            prefill_chunk: 512,
            step_token_budget: 256,
            prefill_join_tokens: 2048,
            seed: 0,
            kernels: Kernels::Auto,
            logger: Logger::default(),
            prompt_cache_bytes: 1 << 30,
            prompt_cache_dir: None,
            prompt_cache_dir_bytes: 16 << 30,
            prompt_cache_min_tokens: 256,
            encoder_cache_bytes: 256 << 20,
            progress: None,
            kv: KvQuant::default(),
            trace: None,
            speculation: Speculation::Off,
            draft_model_path: None,
            kv_paging: false,
            kv_block_size: 256,
        }
    }

    fn validate(&self) -> Result<()> {
        if self.model_path.as_os_str().is_empty() {
            return Err(Error::invalid("model_path is empty"));
        }
        for (name, v) in [
            ("max_in_flight", self.max_in_flight),
            ("max_rows", self.max_rows),
            ("kv_budget", self.kv_budget),
            ("prefill_chunk", self.prefill_chunk),
            ("step_token_budget", self.step_token_budget),
        ] {
            if v == 0 {
                return Err(Error::invalid(format!("{name} must be at least 1")));
            }
        }
        if self.kv_paging && !crate::cache::paged::valid_block_size(self.kv_block_size.min(i32::MAX as usize) as i32) {
            return Err(Error::invalid(format!(
                "kv_block_size {} is not a multiple of 32 from 32 to 1024",
                self.kv_block_size
            )));
        }
        if self.kv_paging && self.kv.float == crate::cache::scheme::KvFloat::F16 {
            return Err(Error::unsupported("kv_paging keeps its blocks in f32: an f16 KV cache needs kv_paging off"));
        }
        if matches!(self.speculation, Speculation::Draft { .. }) && self.draft_model_path.is_none() {
            return Err(Error::invalid("speculation Draft needs a draft_model_path"));
        }
        Ok(())
    }
}

/// Counters the scheduler publishes after every unit of work.
#[derive(Debug, Default)]
pub(crate) struct StatsCell {
    pub queued: AtomicUsize,
    pub active: AtomicUsize,
    pub kv_bytes: AtomicUsize,
    pub kv_reserved: AtomicUsize,
    pub kv_bytes_dense: AtomicUsize,
    pub kv_bytes_quantized: AtomicUsize,
    pub active_memory: AtomicUsize,
    pub peak_memory: AtomicUsize,
    pub cache_memory: AtomicUsize,
    pub kv_blocks_used: AtomicU64,
    pub kv_blocks_free: AtomicU64,
    pub kv_blocks_shared: AtomicU64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineStats {
    /// Requests waiting for admission.
    pub queued: usize,
    /// Requests prefilling or generating.
    pub active: usize,
    pub in_flight: usize,
    pub completed: u64,
    /// Bytes allocated by KV caches now (for each request its prompt +
    /// max_tokens, up to the context length, from its start; on CPU the
    /// pages become resident as positions are written), and reserved by
    /// running requests.
    pub kv_bytes: usize,
    pub kv_reserved: usize,
    /// `kv_bytes` split: stored dense (including the float copy quantized
    /// layers keep for rows before their start) and stored quantized.
    pub kv_bytes_dense: usize,
    pub kv_bytes_quantized: usize,
    /// Prompt cache: admissions that reused cached tokens, that did not,
    /// how many prompt tokens came from it, and bytes held.
    pub prompt_cache_hits: u64,
    pub prompt_cache_misses: u64,
    pub prompt_cache_hit_tokens: u64,
    pub prompt_cache_memory_bytes: usize,
    pub prompt_cache_disk_bytes: u64,
    /// MLX allocator figures in bytes.
    pub active_memory: usize,
    pub peak_memory: usize,
    pub cache_memory: usize,
    /// Scheduler iterations run (rounds of admission, decode and prefill),
    /// and model forward calls made (prefill chunks and decode steps).
    pub iterations: u64,
    pub model_calls: u64,
    /// Model calls that ran decoding rows and a prefill chunk in one forward
    /// (a mixed iteration; counted in `model_calls` too).
    pub mixed_steps: u64,
    /// The scheduler's spans so far, per kind (indexed by `SpanKind as usize`).
    pub spans: [SpanStats; SPAN_KINDS],
    /// Speculative decoding: drafted tokens, accepted ones, verify steps.
    pub spec_proposed: u64,
    pub spec_accepted: u64,
    pub spec_verify_steps: u64,
    /// Rows the draft model holds a cache for (0 once no request runs).
    pub spec_draft_rows: usize,
    /// Images encoded by the vision tower, and images whose tower output
    /// came from the encoder cache instead.
    pub tower_runs: u64,
    pub encoder_cache_hits: u64,
    /// What the encoder cache holds now: bytes of tower output, entries.
    pub encoder_cache_bytes: u64,
    pub encoder_cache_entries: u64,
    /// With `kv_paging`: KV blocks in use (held by rows or prompt-cache
    /// entries; a shared block once) and free, summed over the paged
    /// layers' pools. 0 without paging.
    pub kv_blocks_used: u64,
    pub kv_blocks_free: u64,
    /// Blocks in use held more than once (a prefix mapped by rows or by a
    /// prompt-cache entry and rows), summed over the pools.
    pub kv_blocks_shared: u64,
}

/// State shared between the handle and the scheduler.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub poisoned: AtomicBool,
    pub in_flight: AtomicUsize,
    pub completed: AtomicU64,
    pub stats: StatsCell,
    pub cache: prompt_cache::CacheStats,
    pub trace: Arc<trace::TraceStats>,
    pub spec: spec::SpecStats,
    pub tower_runs: AtomicU64,
    pub encoder_cache_hits: AtomicU64,
    pub encoder_cache_bytes: AtomicU64,
    pub encoder_cache_entries: AtomicU64,
}

pub struct Engine {
    tx: Sender<Command>,
    /// The delivery thread's channel: callback sinks are opened there.
    dtx: DeliveryTx,
    shared: Arc<Shared>,
    text: Arc<TextAssets>,
    info: ModelInfo,
    parameter_bytes: usize,
    max_in_flight: usize,
    kv_budget: usize,
    kv: KvQuant,
    speculation: Speculation,
    /// Whether a draft model is loaded.
    has_draft: bool,
    next_id: AtomicU64,
    /// Structured output's view of the tokenizer, built by the first request
    /// that asks for a `response_format`.
    grammar: std::sync::OnceLock<Result<crate::grammar::GrammarEnv>>,
    threads: Mutex<Option<(JoinHandle<()>, JoinHandle<()>)>>,
}

/// A request that passed validation and holds a place in the engine;
/// dropping it without `enqueue` gives the place back.
pub struct Prepared {
    spec: RequestSpec,
    place: Place,
    constraint: Option<crate::grammar::Constraint>,
}

impl Prepared {
    pub fn prompt_tokens(&self) -> &[u32] {
        &self.spec.prompt
    }
}

/// A place in the engine's in-flight count, given back when dropped unless
/// `keep` handed it to the request (its terminal event gives it back).
struct Place(Option<Arc<Shared>>);

impl Place {
    fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Some(shared) = &self.0 {
            shared.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The host's handle to a submitted request. Dropping it does not cancel.
#[derive(Clone)]
pub struct RequestHandle {
    spec: Arc<RequestSpec>,
    tx: Sender<Command>,
}

impl RequestHandle {
    pub fn id(&self) -> u64 {
        self.spec.id
    }

    /// Asks the engine to stop the request. Idempotent; a request that already
    /// ended is not affected. The request still gets exactly one terminal
    /// event (`Done` with `Cancelled` unless it had already finished).
    pub fn cancel(&self) {
        self.spec.cancelled.store(true, Ordering::Release);
        let _ = self.tx.send(Command::Cancel(self.spec.id));
    }
}

impl Engine {
    /// Starts the threads and loads the model; returns when the model is ready
    /// (or with the load error).
    pub fn new(config: EngineConfig) -> Result<Engine> {
        config.validate()?;
        let (tx, rx) = crossbeam_channel::unbounded();
        let (ready_tx, ready_rx) = crossbeam_channel::bounded(1);
        let shared = Arc::new(Shared::default());
        let (max_in_flight, kv_budget, kv) = (config.max_in_flight, config.kv_budget, config.kv);
        let has_draft = config.draft_model_path.is_some();
        let speculation = match config.speculation {
            Speculation::Off if has_draft => Speculation::Draft { num_tokens: spec::DEFAULT_DRAFT_TOKENS },
            s => s,
        };
        let (sched, delivery, dtx) = scheduler::spawn(config, shared.clone(), rx, tx.clone(), ready_tx)
            .map_err(|e| Error::internal(format!("cannot start engine threads: {e}")))?;
        let threads = (sched, delivery);
        let ready = ready_rx.recv().unwrap_or_else(|_| Err(Error::internal("the scheduler thread exited during load")));
        match ready {
            Ok((text, info, parameter_bytes)) => Ok(Engine {
                tx,
                dtx,
                shared,
                text,
                info,
                parameter_bytes,
                max_in_flight,
                kv_budget,
                kv,
                speculation,
                has_draft,
                next_id: AtomicU64::new(1),
                grammar: std::sync::OnceLock::new(),
                threads: Mutex::new(Some(threads)),
            }),
            Err(e) => {
                let _ = tx.send(Command::Shutdown);
                let _ = threads.0.join();
                let _ = threads.1.join();
                Err(e)
            }
        }
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    pub fn parameter_bytes(&self) -> usize {
        self.parameter_bytes
    }

    pub fn text(&self) -> &TextAssets {
        &self.text
    }

    pub fn stats(&self) -> EngineStats {
        let s = &self.shared.stats;
        EngineStats {
            queued: s.queued.load(Ordering::Relaxed),
            active: s.active.load(Ordering::Relaxed),
            kv_bytes: s.kv_bytes.load(Ordering::Relaxed),
            kv_reserved: s.kv_reserved.load(Ordering::Relaxed),
            kv_bytes_dense: s.kv_bytes_dense.load(Ordering::Relaxed),
            kv_bytes_quantized: s.kv_bytes_quantized.load(Ordering::Relaxed),
            in_flight: self.shared.in_flight.load(Ordering::Relaxed),
            completed: self.shared.completed.load(Ordering::Relaxed),
            prompt_cache_hits: self.shared.cache.hits.load(Ordering::Relaxed),
            prompt_cache_misses: self.shared.cache.misses.load(Ordering::Relaxed),
            prompt_cache_hit_tokens: self.shared.cache.hit_tokens.load(Ordering::Relaxed),
            prompt_cache_memory_bytes: self.shared.cache.memory_bytes.load(Ordering::Relaxed),
            prompt_cache_disk_bytes: self.shared.cache.disk_bytes.load(Ordering::Relaxed),
            active_memory: s.active_memory.load(Ordering::Relaxed),
            peak_memory: s.peak_memory.load(Ordering::Relaxed),
            cache_memory: s.cache_memory.load(Ordering::Relaxed),
            iterations: self.shared.trace.iterations.load(Ordering::Relaxed),
            model_calls: self.shared.trace.model_calls.load(Ordering::Relaxed),
            mixed_steps: self.shared.trace.mixed_steps.load(Ordering::Relaxed),
            spans: self.shared.trace.spans(),
            spec_proposed: self.shared.spec.proposed.load(Ordering::Relaxed),
            spec_accepted: self.shared.spec.accepted.load(Ordering::Relaxed),
            spec_verify_steps: self.shared.spec.verify_steps.load(Ordering::Relaxed),
            spec_draft_rows: self.shared.spec.draft_rows.load(Ordering::Relaxed),
            tower_runs: self.shared.tower_runs.load(Ordering::Relaxed),
            encoder_cache_hits: self.shared.encoder_cache_hits.load(Ordering::Relaxed),
            encoder_cache_bytes: self.shared.encoder_cache_bytes.load(Ordering::Relaxed),
            encoder_cache_entries: self.shared.encoder_cache_entries.load(Ordering::Relaxed),
            kv_blocks_used: s.kv_blocks_used.load(Ordering::Relaxed),
            kv_blocks_free: s.kv_blocks_free.load(Ordering::Relaxed),
            kv_blocks_shared: s.kv_blocks_shared.load(Ordering::Relaxed),
        }
    }

    /// Validates `options`, renders and tokenizes the prompt, and reserves a
    /// place (or fails with `Busy`). Runs on the calling thread.
    pub fn prepare(&self, options: RequestOptions) -> Result<Prepared> {
        if self.shared.poisoned.load(Ordering::Acquire) {
            return Err(Error::new(ErrorKind::EnginePoisoned, "the engine failed earlier and accepts no more requests"));
        }
        let submitted = Instant::now();
        options.validate()?;
        let Rendered { prompt, format: output_format, boundary, media } = self.render_input(&options)?;
        if prompt.is_empty() {
            return Err(Error::invalid("the prompt is empty"));
        }
        let ctx = self.info.context_length;
        if ctx > 0 && prompt.len() as i64 >= ctx {
            return Err(Error::invalid(format!(
                "the prompt has {} tokens; the model's context length is {ctx}",
                prompt.len()
            )));
        }
        let vocab = self.info.vocab_size as u32;
        if let Some(bad) = prompt.iter().find(|&&t| t >= vocab) {
            return Err(Error::invalid(format!("token id {bad} is outside the vocabulary (size {vocab})")));
        }
        let kv_start = options.quantized_kv_start.unwrap_or(self.kv.start);
        let reach = self.reach(prompt.len(), options.max_tokens);
        let kv_need = self.kv_need(reach, kv_start);
        if kv_need > self.kv_budget {
            return Err(Error::invalid(format!(
                "the request needs {kv_need} bytes of KV cache ({} prompt + {} max tokens), more than the engine's \
                 kv_budget of {} bytes; lower max_tokens or raise kv_budget",
                prompt.len(),
                options.max_tokens,
                self.kv_budget
            )));
        }
        let own_start = self.kv.scheme.is_quantized() && kv_start != self.kv.start;
        let namespace = cache_scope(&options, own_start.then_some(kv_start));
        let tool_call = crate::grammar::call_format(&options.tool_choice, options.tools.as_ref(), output_format.tools)?;
        let format = match (&options.response_format, tool_call) {
            (Some(_), Some(_)) => return Err(Error::invalid("response_format and a required tool_choice exclude each other")),
            (Some(f), None) => Some(f.clone()),
            (None, call) => call,
        };
        let constraint = match &format {
            Some(f) => Some(crate::grammar::Constraint::compile(self.grammar_env()?, f)?),
            None => None,
        };
        let speculation = options.speculation.unwrap_or(self.speculation);
        if matches!(speculation, Speculation::Draft { .. }) && !self.has_draft {
            return Err(Error::invalid("speculation \"draft\" needs an engine with a draft model (draft_model_path)"));
        }
        let cache_key = media.as_ref().map(|m| m.key(&prompt));
        let spec = RequestSpec {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            cancelled: AtomicBool::new(false),
            prompt,
            sampling: options.sampling,
            max_tokens: options.max_tokens,
            stop: options.stop,
            stop_at_eos: options.stop_at_eos,
            prefill_chunk: options.prefill_chunk,
            reach,
            kv_need,
            kv_start,
            namespace,
            use_cache: options.prompt_cache,
            boundary,
            logprobs: (options.logprobs || options.top_logprobs > 0).then_some(options.top_logprobs),
            output_format,
            speculation,
            submitted,
            cache_key,
            media,
        };
        let n = self.shared.in_flight.fetch_add(1, Ordering::AcqRel);
        let prepared = Prepared { spec, place: Place(Some(self.shared.clone())), constraint };
        if n >= self.max_in_flight {
            return Err(Error::new(
                ErrorKind::Busy,
                format!("the engine already has {n} requests in flight (limit {})", self.max_in_flight),
            ));
        }
        Ok(prepared)
    }

    /// Hands a prepared request to the scheduler. Events go to `sink` on the
    /// delivery thread; it is dropped after the terminal event.
    pub fn enqueue(&self, prepared: Prepared, sink: Box<dyn EventSink>) -> RequestHandle {
        self.enqueue_with(prepared, |_| sink)
    }

    /// `enqueue` with a sink built from the request's id.
    pub fn enqueue_with(&self, prepared: Prepared, make_sink: impl FnOnce(u64) -> Box<dyn EventSink>) -> RequestHandle {
        let id = prepared.spec.id;
        // Opened before the scheduler sees the request, so before its events.
        let _ = self.dtx.send(Msg::Open(id, make_sink(id)));
        self.send_job(prepared, Outlet::delivery(id, self.dtx.clone()))
    }

    /// Hands a prepared request to the scheduler; its events are pushed into
    /// the returned queue as they are made. They bypass the delivery thread,
    /// so the queue may be read anywhere, even inside a callback.
    pub fn enqueue_stream(&self, prepared: Prepared) -> (RequestHandle, Receiver<Event>) {
        let (tx, rx) = crossbeam_channel::unbounded();
        let outlet = Outlet::queue(prepared.spec.id, tx, self.shared.clone());
        (self.send_job(prepared, outlet), rx)
    }

    fn send_job(&self, Prepared { spec, place, constraint }: Prepared, outlet: Outlet) -> RequestHandle {
        place.keep();
        let spec = Arc::new(spec);
        // The scheduler serves its channel until the engine is dropped, even
        // after a failure, so this send cannot fail while `self` exists.
        let _ = self.tx.send(Command::Submit(Job { spec: spec.clone(), outlet, constraint }));
        RequestHandle { spec, tx: self.tx.clone() }
    }

    /// `prepare` + `enqueue`.
    pub fn submit(&self, options: RequestOptions, sink: Box<dyn EventSink>) -> Result<RequestHandle> {
        Ok(self.enqueue(self.prepare(options)?, sink))
    }

    /// The tokenizer as llguidance sees it (built once).
    fn grammar_env(&self) -> Result<&crate::grammar::GrammarEnv> {
        let width = self.info.vocab_size.max(0) as usize;
        let env = self
            .grammar
            .get_or_init(|| crate::grammar::GrammarEnv::new(self.text.tokenizer.clone(), width, &self.text.eos_ids));
        env.as_ref().map_err(Clone::clone)
    }

    /// The most positions a request's cache can hold: its prompt and
    /// `max_tokens`, but not past the context length (generation stops there).
    fn reach(&self, prompt: usize, max_tokens: u32) -> usize {
        let positions = prompt + max_tokens as usize;
        match self.info.context_length {
            ctx if ctx > 0 => positions.min(ctx as usize),
            _ => positions,
        }
    }

    /// KV bytes a request of `positions` may grow to, as the engine's KV
    /// scheme stores them (with the float copy of the positions before the
    /// request's `quantized_kv_start`).
    fn kv_need(&self, positions: usize, start: i32) -> usize {
        let kv: usize = self.info.kv_layers.iter().flatten().map(|l| self.kv.bytes(l, positions, start)).sum();
        kv + self.info.state_bytes_per_sequence
    }

    /// The prompt token ids `options` stands for.
    pub fn tokenize_input(&self, options: &RequestOptions) -> Result<Vec<u32>> {
        Ok(self.render_input(options)?.prompt)
    }

    /// Renders (chats) and tokenizes the input, once.
    fn render_input(&self, options: &RequestOptions) -> Result<Rendered> {
        let tok = &self.text.tokenizer;
        let plain = |prompt| Rendered { prompt, format: OutputFormat::PLAIN, boundary: None, media: None };
        if !options.media.is_empty() && !matches!(options.input, Input::Messages(_)) {
            return Err(Error::invalid("media buffers need chat messages that reference them"));
        }
        match &options.input {
            Input::Tokens(ids) => Ok(plain(ids.clone())),
            Input::Prompt(p) => Ok(plain(tok.encode(p, true)?)),
            Input::Messages(m) => {
                let media = crate::media::parts::extract(m, self.text.media.as_deref(), &options.media, &crate::media::Limits::default())?;
                let template = self
                    .text
                    .template
                    .as_ref()
                    .ok_or_else(|| Error::invalid("the model has no chat template; send a raw prompt instead"))?;
                let kwargs = template_kwargs(options);
                if let Some(x) = media {
                    let spec = self.text.media.as_deref().expect("extract found a tower");
                    let rendered = template.render(&x.messages, options.tools.as_ref(), true, Some(&kwargs))?;
                    let format = OutputFormat::detect(template.source(), options.tools.is_some(), &rendered);
                    let prompt = tok.encode(&spec.expand(&rendered, &x.items)?, true)?;
                    let media = Some(Arc::new(spec.place(&prompt, x.items)?));
                    return Ok(Rendered { prompt, format, boundary: None, media });
                }
                let rendered = template.render(m, options.tools.as_ref(), true, Some(&kwargs))?;
                let format = OutputFormat::detect(template.source(), options.tools.is_some(), &rendered);
                // The conversation before its last message is a prefix the
                // next turns repeat: where a prompt-cache snapshot pays off.
                let head = match m {
                    serde_json::Value::Array(m) if m.len() >= 2 && options.prompt_cache => {
                        let head = serde_json::Value::Array(m[..m.len() - 1].to_vec());
                        template.render(&head, options.tools.as_ref(), false, Some(&kwargs)).ok()
                    }
                    _ => None,
                };
                match head.filter(|h| !h.is_empty() && rendered.starts_with(h.as_str())) {
                    Some(h) => {
                        let (prompt, within) = tok.encode_split(&rendered, h.len())?;
                        let boundary = (within > 0 && within < prompt.len()).then_some(within);
                        Ok(Rendered { prompt, format, boundary, media: None })
                    }
                    None => Ok(Rendered { prompt: tok.encode(&rendered, true)?, format, boundary: None, media: None }),
                }
            }
        }
    }

    /// Writes the prompt cache's memory entries to its directory (they stay
    /// in memory); returns once they are on disk. A no-op without a cache
    /// directory.
    pub fn flush_prompt_cache(&self) -> Result<()> {
        self.cache_command(Command::FlushCache)
    }

    /// Drops the prompt cache's memory entries, and its files when `disk`.
    pub fn clear_prompt_cache(&self, disk: bool) -> Result<()> {
        self.cache_command(|reply| Command::ClearCache(disk, reply))
    }

    fn cache_command(&self, make: impl FnOnce(Sender<Result<()>>) -> Command) -> Result<()> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.tx.send(make(tx)).map_err(|_| Error::new(ErrorKind::EnginePoisoned, "the engine has stopped"))?;
        rx.recv().map_err(|_| Error::new(ErrorKind::EnginePoisoned, "the engine stopped before answering"))?
    }
}

/// The prompt-cache scope of a request: its namespace, then its session
/// (requests of other sessions, or without one, never see its entries),
/// then its own `quantized_kv_start` if it has one (prompt-cache entries
/// hold KV quantized from their row's start; the engine's start is in the
/// cache's compatibility key, and a request with another start keeps its
/// entries apart).
fn cache_scope(options: &RequestOptions, own_start: Option<i32>) -> String {
    let mut scope = options.cache_namespace.clone();
    if let Some(session) = &options.cache_session_id {
        scope += &format!("\0session={session}");
    }
    if let Some(start) = own_start {
        scope += &format!("\0qs={start}");
    }
    scope
}

/// A request's input as the model sees it.
struct Rendered {
    prompt: Vec<u32>,
    /// How to read the output (for chats: the template's reasoning and
    /// tool-call formats).
    format: OutputFormat,
    /// For a chat, the prompt length of the conversation before its last
    /// message, when that is a proper prefix of the prompt.
    boundary: Option<usize>,
    /// The prompt's media, if any.
    media: Option<Arc<crate::media::MediaPrompt>>,
}

/// Extra chat-template variables: the caller's, plus `enable_thinking` when
/// the request says whether to think.
fn template_kwargs(options: &RequestOptions) -> serde_json::Map<String, serde_json::Value> {
    let mut kwargs = options.template_kwargs.clone().unwrap_or_default();
    if let Some(t) = options.thinking {
        kwargs.entry("enable_thinking").or_insert(serde_json::Value::Bool(t));
    }
    kwargs
}

impl Drop for Engine {
    /// Cancels everything in flight, lets the terminal events be delivered and
    /// joins the threads. Called from one of this engine's callbacks (on its
    /// own delivery thread), it cannot wait for that thread: the remaining
    /// events are then delivered after the callback returns. The thread is
    /// recognised by identity: another engine's callback must still join it.
    fn drop(&mut self) {
        let _ = self.tx.send(Command::Shutdown);
        let threads = self.threads.lock().map(|mut t| t.take()).unwrap_or(None);
        if let Some((sched, delivery)) = threads {
            let _ = sched.join();
            if delivery.thread().id() != std::thread::current().id() {
                let _ = delivery.join();
            }
        }
    }
}
