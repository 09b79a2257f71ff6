//! The scheduler thread: owns the model and every MLX array, takes commands
//! from host threads, and runs continuous batching. Each iteration:
//!   1. admit queued requests (planner: FIFO, rows, KV memory) into the
//!      prefill cohort,
//!   2. schedule the next decode step for all generating rows (async),
//!   3. read the previous step's tokens, emit them, drop rows that ended,
//!   4. run one prefill chunk of the cohort (bounded by the step budget and
//!      the pacing cap while rows decode); a finished cohort joins the
//!      decode batch.
//! Commands (submit, cancel, shutdown) are taken between iterations. The
//! work is timed in trace spans (`trace`), summarised in the stats.

use super::batch::{DecodeBatch, Drawn, StepCtx};
use super::cohort::{Cohort, CohortStep, Entrant, Progress};
use super::delivery::{self, DeliveryTx, Msg};
use super::encoder_cache::EncoderCache;
use super::cache_io::IoDone;
use super::pacing::Pacer;
use super::prefix_share::{Asker, Share, SharedPrefixes};
use super::prompt_cache::{CacheSetup, Capture, Found, PagedSetup, PromptCache};
use super::planner::{self, Admit, CohortView, Limits, Plan, Waiting};
use super::request::{Event, FinishReason, Job, Usage};
use super::row::Row;
use super::row_set::RowSet;
use super::spec::draft::Drafter;
use super::trace::{SpanKind, Tracer};
use super::{Device, EngineConfig, LogLevel, Shared};
use crate::error::{Error, Result};
use crate::cache::paged::{PagedLayer, PagedPools};
use crate::cache::scheme::{KvFloat, KvScheme};
use crate::cache::LayerCache;
use crate::mlx;
use crate::model::load::TextAssets;
use crate::mlx::{Array, Dtype};
use crate::model::{self, Group, LanguageModel, LoadOptions, MediaInput, ModelInfo, Output, Towers};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// MLX's allocator keeps at least this many bytes of freed buffers for
/// reuse (the CPU allocator's default is 32 MiB; a larger limit is left
/// alone). A batched step frees more than that (32 sequences: the logits
/// alone are 6 MB), and what did not fit went back to the C heap and
/// returned as freshly zeroed pages: batch 32 took ~500,000 page faults in
/// 6 s, with 256 MiB ~175,000, ~6% less wall time (hand-run alternations)
/// and no higher peak RSS
/// (the buffers are reused, not added). Emptied whenever the engine idles.
const CPU_BUFFER_CACHE_BYTES: usize = 256 << 20;

pub(crate) enum Command {
    Submit(Job),
    /// Wakes the scheduler after a request's cancel flag was set.
    Cancel(u64),
    /// A prompt-cache file was written or read.
    CacheIo(IoDone),
    /// Write the prompt cache's memory entries to disk; answer when done.
    FlushCache(Sender<Result<()>>),
    /// Drop the prompt cache's entries (and files if `true`); answer when done.
    ClearCache(bool, Sender<Result<()>>),
    Shutdown,
}

/// What the scheduler reports once the model is loaded (or failed to load).
pub(crate) type Ready = Result<(Arc<TextAssets>, ModelInfo, usize)>;

/// Starts the delivery and scheduler threads; returns them (scheduler first)
/// and the delivery thread's channel (callback sinks are opened there).
pub(crate) fn spawn(
    config: EngineConfig,
    shared: Arc<Shared>,
    rx: Receiver<Command>,
    commands: Sender<Command>,
    ready: Sender<Ready>,
) -> std::io::Result<(std::thread::JoinHandle<()>, std::thread::JoinHandle<()>, DeliveryTx)> {
    let (dtx, drx) = crossbeam_channel::unbounded();
    let shared2 = shared.clone();
    let delivery = std::thread::Builder::new()
        .name("mlxrt-delivery".into())
        .spawn(move || delivery::run(drx, shared2))?;
    let (dtx2, dtx3) = (dtx.clone(), dtx.clone());
    let sched = std::thread::Builder::new().name("mlxrt-scheduler".into()).spawn(move || {
        let run = catch_unwind(AssertUnwindSafe(|| main(config, &shared, &rx, commands, &ready)));
        if let Err(panic) = run {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic on the scheduler thread".into());
            shared.poisoned.store(true, Ordering::Release);
            let _ = dtx.send(Msg::Poisoned(why.clone()));
            // Keep serving the channel so that late submissions still get
            // their (error) terminal event and destroy can join us.
            drain_poisoned(&rx, &why);
        }
        let _ = dtx.send(Msg::Shutdown);
    });
    match sched {
        Ok(s) => Ok((s, delivery, dtx3)),
        Err(e) => {
            let _ = dtx2.send(Msg::Shutdown);
            let _ = delivery.join();
            Err(e)
        }
    }
}

fn drain_poisoned(rx: &Receiver<Command>, why: &str) {
    for cmd in rx.iter() {
        match cmd {
            Command::Submit(mut job) => job.outlet.send(Event::Error(delivery::poison_error(why))),
            Command::FlushCache(reply) | Command::ClearCache(_, reply) => {
                let _ = reply.send(Err(Error::new(crate::ErrorKind::EnginePoisoned, "the engine failed earlier")));
            }
            Command::Cancel(_) | Command::CacheIo(_) => {}
            Command::Shutdown => break,
        }
    }
}

/// How an admitted request starts: fresh, or with the caches of its cached
/// prefix (`row.cached` positions).
enum Start {
    Fresh(Entrant),
    Cached(Entrant, Vec<LayerCache>),
}

impl Start {
    fn row(&self) -> &Row {
        match self {
            Start::Fresh((row, _)) | Start::Cached((row, _), _) => row,
        }
    }
}

/// A job waiting for admission, with what the prompt cache holds for it
/// (probed when it arrives, and again when a file it waits for was read).
struct Queued {
    job: Job,
    found: Found,
}

struct Scheduler<'a> {
    model: Box<dyn LanguageModel>,
    /// The model's towers (vision, audio), and their recent outputs.
    towers: Towers,
    encoder: EncoderCache,
    text: Arc<TextAssets>,
    config: EngineConfig,
    shared: &'a Shared,
    queue: VecDeque<Queued>,
    cohort: Option<Cohort>,
    batch: DecodeBatch,
    kv_reserved: usize,
    ctx_len: usize,
    seed_counter: u64,
    pacer: Pacer,
    pcache: Option<PromptCache>,
    tracer: Tracer,
    /// The block pools of the paged layers (`kv_paging`).
    pools: Option<PagedPools>,
    /// Prompts of rows whose blocks queued requests will map (`kv_paging`).
    prefixes: SharedPrefixes,
    /// The draft model (`draft_model_path`) and its rows' caches.
    drafter: Option<Drafter>,
}

fn main(
    config: EngineConfig,
    shared: &Shared,
    rx: &Receiver<Command>,
    commands: Sender<Command>,
    ready: &Sender<Ready>,
) {
    let loaded = (|| -> Result<_> {
        match config.device {
            Device::Cpu => mlx::device::set_default(false)?,
            Device::Gpu => {
                if !mlx::device::gpu_available() {
                    return Err(Error::unsupported("device GPU requested but MLX has no GPU backend here"));
                }
                mlx::device::set_default(true)?
            }
            Device::Auto => {}
        }
        let t0 = std::time::Instant::now();
        let opts = LoadOptions { cpu_f32_scales: true, kernels: config.kernels, progress: config.progress.clone() };
        let m = model::load(&config.model_path, &opts)?;
        config.kv.validate(&m.model.kv_layers())?;
        let pools = paged_pools(&config, m.model.as_ref())?;
        log_startup(&config, &m, t0.elapsed());
        let drafter = match &config.draft_model_path {
            Some(path) => {
                let opts = LoadOptions { progress: None, ..opts };
                let d = model::load(path, &opts).map_err(|e| e.context(format!("draft_model_path {}", path.display())))?;
                Some(Drafter::new(d, m.model.info(), &m.text)?)
            }
            None => None,
        };
        Ok((m, pools, drafter))
    })();
    let (loaded, pools, drafter) = match loaded {
        Ok(l) => l,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let pcache = match open_prompt_cache(&config, &loaded, pools.as_ref(), commands) {
        Ok(c) => c,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    // The load's temporary buffers (GGUF conversion) would stay resident in
    // MLX's buffer cache and the C heap.
    mlx::memory::clear_cache();
    mlx::memory::trim_heap();
    let limit = mlx::memory::set_cache_limit(CPU_BUFFER_CACHE_BYTES);
    if limit > CPU_BUFFER_CACHE_BYTES {
        mlx::memory::set_cache_limit(limit); // a larger cache (a GPU's) stays
    }
    // After the load, so that MLX's stream thread, started by it, keeps the
    // normal policy: only this thread's wake-ups stop preempting kernels.
    mlx::sched::batch_policy();
    let text = Arc::new(loaded.text);
    let mut info = loaded.model.info().clone();
    info.device = if mlx::device::default_is_gpu() { "gpu" } else { "cpu" }.into();
    info.kv_layers = loaded.model.kv_layers();
    info.kv_scheme = config.kv.name();
    let _ = ready.send(Ok((text.clone(), info.clone(), loaded.parameter_bytes)));
    let mut s = Scheduler {
        model: loaded.model,
        towers: loaded.towers,
        encoder: EncoderCache::new(config.encoder_cache_bytes),
        text,
        shared,
        queue: VecDeque::new(),
        cohort: None,
        batch: DecodeBatch::default(),
        kv_reserved: 0,
        ctx_len: info.context_length.max(0) as usize,
        seed_counter: config.seed,
        pacer: Pacer::new(config.step_token_budget),
        pcache,
        tracer: Tracer::new(config.trace.clone(), shared.trace.clone()),
        config,
        pools,
        prefixes: SharedPrefixes::default(),
        drafter,
    };
    s.run(rx);
}

/// The paged layers with `kv_paging`: every attention layer (full ones
/// storing KV as `config.kv` says; sliding-window ones dense, as without
/// paging); recurrent-state layers keep their per-row state.
fn paged_pools(config: &EngineConfig, model: &dyn LanguageModel) -> Result<Option<PagedPools>> {
    if !config.kv_paging {
        return Ok(None);
    }
    let block = config.kv_block_size as i32;
    let layers = (model.new_cache(1).iter().zip(model.kv_layers()))
        .map(|(c, l)| match (c, l) {
            (LayerCache::State(_), _) => Ok(None),
            (_, Some(l)) => {
                let scheme = if l.window.is_none() { config.kv.scheme } else { KvScheme::Dense };
                Ok(Some(PagedLayer::new(block, scheme, l.window, l.k_dim, l.v_dim)?))
            }
            (_, None) => Err(Error::unsupported("kv_paging: this model has a layer cache that cannot be paged")),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(PagedPools { block, layers }))
}

/// The prompt cache, if enabled. Its files are stamped with what must match
/// for a saved state to be valid here: model files, tokenizer, MLX version,
/// device and the KV layout (with `kv_paging`, the block size too: paged
/// layers are stored as blocks and loaded into `pools`).
fn open_prompt_cache(
    config: &EngineConfig,
    m: &model::LoadedModel,
    pools: Option<&PagedPools>,
    commands: Sender<Command>,
) -> Result<Option<PromptCache>> {
    if config.prompt_cache_bytes == 0 {
        return Ok(None);
    }
    let tokenizer = m.text.tokenizer.to_json_string().unwrap_or_default();
    let info = m.model.info();
    let caches = m.model.new_cache(1);
    // Sliding-window layers are stored as rings (their last window only).
    let ring = caches.iter().find_map(|c| c.ring()).map_or(String::new(), |r| format!(";ring={}", r.window()));
    // Full-attention layers are stored as the scheme says, packed from the
    // engine's default start (requests with another start use their own
    // namespace, see `Engine::prepare`).
    let kv = match config.kv.scheme {
        s if s.is_quantized() => format!("{};start={}", s.stored_form(), config.kv.start),
        _ if config.kv.float == KvFloat::F16 => "f16".to_string(),
        _ => "f32".to_string(),
    };
    let paged = pools.map_or(String::new(), |p| format!(";paged={}", p.block));
    let compat = format!(
        "model={};tokenizer={:08x};mlx={};device={};arch={};layers={};kv={kv}{ring}{paged}",
        m.fingerprint,
        crc32fast::hash(tokenizer.as_bytes()),
        mlx::version(),
        if mlx::device::default_is_gpu() { "gpu" } else { "cpu" },
        info.architecture,
        info.num_layers,
    );
    let setup = CacheSetup {
        memory_bytes: config.prompt_cache_bytes,
        dir: config.prompt_cache_dir.clone(),
        dir_bytes: config.prompt_cache_dir_bytes,
        min_tokens: config.prompt_cache_min_tokens,
        compat,
        layers: caches.len(),
        // Quantized KV layers are not trimmable (`LayerCache::trimmable`).
        trimmable: !config.kv.scheme.is_quantized() && caches.iter().all(crate::cache::LayerCache::trimmable),
        paged: pools.map(|p| PagedSetup { pools: p.clone(), layers: m.model.kv_layers() }),
    };
    PromptCache::new(setup, config.logger.clone(), commands).map(Some)
}

/// The first `n` queued requests as prefix sharing sees them: None for one
/// that does not use the cache, or has media (kept out of sharing).
fn askers(queue: &VecDeque<Queued>, n: usize) -> Vec<Option<Asker<'_>>> {
    fn ask(q: &Queued) -> Option<Asker<'_>> {
        let j = &q.job.spec;
        let cached = if let Found::Hit(n) = q.found { n } else { 0 };
        (j.use_cache && j.media.is_none()).then_some(Asker { namespace: &j.namespace, key: j.key(), cached })
    }
    queue.iter().take(n).map(ask).collect()
}

/// What the prompt cache holds for a job's prompt.
fn probe(pcache: &mut Option<PromptCache>, tracer: &Tracer, job: &Job) -> Found {
    let Some(c) = pcache.as_mut().filter(|_| job.spec.use_cache) else { return Found::Miss };
    let t = Instant::now();
    let key = job.spec.key();
    let mut found = c.lookup(&job.spec.namespace, key);
    // A media prompt resumes only outside an image's span.
    if let Found::Hit(n) = found {
        if job.spec.cache_key.is_some() && n > 0 && n < key.len() && key[n - 1] >= 0x8000_0000 && key[n] >= 0x8000_0000 {
            found = Found::Miss;
        }
    }
    tracer.record(SpanKind::LookupRestore, 1, if let Found::Hit(n) = found { n } else { 0 }, t);
    found
}

/// Says what runs the model, and warns about a slow setup.
fn log_startup(config: &EngineConfig, m: &model::LoadedModel, took: std::time::Duration) {
    let log = &config.logger;
    let gpu = mlx::device::default_is_gpu();
    let info = m.model.info();
    log.log(
        LogLevel::Info,
        format!(
            "loaded {} ({}, {} layers, {:.1} MB of parameters) in {:.2} s on the {}; MLX {}; kernels {:?}",
            config.model_path.display(),
            info.architecture,
            info.num_layers,
            m.parameter_bytes as f64 / 1e6,
            took.as_secs_f64(),
            if gpu { "GPU" } else { "CPU" },
            mlx::version(),
            config.kernels,
        ),
    );
    if !gpu {
        let blas = mlx::blas_info();
        let level = if blas.is_openblas() { LogLevel::Info } else { LogLevel::Warn };
        log.log(level, format!("dense CPU matmuls use {blas}"));
        if !blas.is_openblas() {
            log.log(LogLevel::Warn, "install OpenBLAS (Debian: libopenblas0-pthread) and rebuild mlxrt for fast dense matmuls");
        }
    }
}

impl Scheduler<'_> {
    fn idle(&self) -> bool {
        self.queue.is_empty() && self.cohort.is_none() && self.batch.is_empty()
    }

    fn run(&mut self, rx: &Receiver<Command>) {
        // After this long without work, memory cache entries are also
        // written to disk (so a crash or kill later keeps them).
        const IDLE_PERSIST: Duration = Duration::from_secs(2);
        // Whether the last iteration could do nothing (e.g. the queue head
        // waits for its cached prefix to be read from disk): then wait for a
        // command instead of spinning.
        let mut stalled = false;
        loop {
            let first = if stalled {
                rx.recv_timeout(Duration::from_millis(50)).ok()
            } else if self.idle() {
                match rx.recv_timeout(IDLE_PERSIST) {
                    Ok(c) => Some(c),
                    Err(RecvTimeoutError::Timeout) => {
                        if let Some(c) = &mut self.pcache {
                            c.persist_all();
                        }
                        rx.recv().ok()
                    }
                    Err(RecvTimeoutError::Disconnected) => None,
                }
            } else {
                rx.try_recv().ok()
            };
            let mut shutdown = first.is_none() && self.idle();
            // Flush and clear answer after this batch of commands: the file
            // thread's results for their writes (queued before `sync`
            // returned) are read in it, so the stats the caller sees next
            // count what is on disk.
            let mut replies = vec![];
            for cmd in first.into_iter().chain(std::iter::from_fn(|| rx.try_recv().ok())) {
                match cmd {
                    Command::Submit(job) => {
                        let found = probe(&mut self.pcache, &self.tracer, &job);
                        self.queue.push_back(Queued { job, found });
                    }
                    Command::Cancel(id) => self.cancel_queued(id),
                    Command::CacheIo(done) => {
                        if let Some(c) = &mut self.pcache {
                            c.on_io(done);
                        }
                        self.reprobe_loading();
                    }
                    Command::FlushCache(reply) => {
                        if let Some(c) = &mut self.pcache {
                            c.persist_all();
                            c.sync();
                        }
                        replies.push(reply);
                    }
                    Command::ClearCache(disk, reply) => {
                        if let Some(c) = &mut self.pcache {
                            c.clear(disk);
                            c.sync();
                        }
                        replies.push(reply);
                    }
                    Command::Shutdown => shutdown = true,
                }
            }
            if !replies.is_empty() {
                self.publish_stats();
                for reply in replies {
                    let _ = reply.send(Ok(()));
                }
            }
            if shutdown {
                self.cancel_all();
                if let Some(c) = self.pcache.take() {
                    c.shutdown();
                }
                return;
            }
            stalled = !self.idle() && !self.iterate();
            self.publish_stats();
        }
    }

    fn limits(&self) -> Limits {
        Limits {
            max_rows: self.config.max_rows,
            kv_budget: self.config.kv_budget,
            prefill_chunk: self.config.prefill_chunk,
            step_budget: self.config.step_token_budget,
            pace_cap: self.pacer.cap(),
            join_tokens: self.config.prefill_join_tokens,
            paged: self.pools.is_some(),
        }
    }

    /// Probes again the queued jobs waiting for a file to be read (it was
    /// read, or failed to be).
    fn reprobe_loading(&mut self) {
        for q in self.queue.iter_mut().filter(|q| q.found == Found::Loading) {
            q.found = probe(&mut self.pcache, &self.tracer, &q.job);
        }
    }

    /// One round of admission, decode and prefill; returns whether anything
    /// ran.
    fn iterate(&mut self) -> bool {
        self.tracer.next_iteration();
        let shares = self.sharing();
        let plan = self.plan(&shares);
        if let Err(e) = self.admit(plan.admit, &shares) {
            self.fail_cohort(e);
        }
        self.prune_prefixes();
        let t0 = Instant::now();
        let decoding = !self.batch.is_empty();
        let prefilling = self.cohort.is_some();
        if decoding && prefilling && self.model.supports_mixed() {
            self.mixed(plan.chunk);
        } else {
            self.decode_and_prefill(plan.chunk);
        }
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        match (decoding, prefilling) {
            (true, false) => self.pacer.decoded(ms),
            (true, true) => self.pacer.decoded_and_prefilled(ms),
            _ => {}
        }
        decoding || prefilling || plan.admit != Admit::Nothing
    }

    /// The queued requests the planner may admit now (only those matter).
    fn askers(&self) -> Vec<Option<Asker<'_>>> {
        askers(&self.queue, self.config.max_rows)
    }

    /// Prefix sharing of the queued requests the planner may admit (paged KV
    /// only: without it nothing waits or shares).
    fn sharing(&self) -> Vec<Share> {
        let n = self.queue.len().min(self.config.max_rows);
        let Some(block) = self.pools.as_ref().and_then(PagedPools::sharing_block) else { return vec![Share::default(); n] };
        let rows = self.cohort.as_ref().map_or(&[][..], Cohort::rows);
        let prefilling: Vec<(&str, &[u32])> =
            rows.iter().filter(|r| r.use_cache && r.media.is_none()).map(|r| (r.namespace.as_str(), r.key())).collect();
        self.prefixes.plan(block, &prefilling, &self.askers())
    }

    /// Drops the shared prefixes no queued request can use any more.
    fn prune_prefixes(&mut self) {
        if let (Some(block), false) = (self.pools.as_ref().and_then(PagedPools::sharing_block), self.prefixes.is_empty()) {
            self.prefixes.prune(block, &askers(&self.queue, self.config.max_rows));
        }
    }

    fn plan(&self, shares: &[Share]) -> Plan {
        let waiting: Vec<Waiting> = (self.queue.iter().zip(shares))
            .map(|(q, share)| {
                let (cached, loading) = match q.found {
                    Found::Hit(n) => (n, false),
                    Found::Loading => (0, true),
                    Found::Miss => (0, false),
                };
                // A concurrent row's blocks, when they give more.
                let (cached, shared) = share.from.map_or((cached, false), |(_, n)| (n, true));
                let j = &q.job.spec;
                let media = j.media.is_some();
                let waits = loading || share.wait;
                Waiting { prompt_len: j.prompt.len(), kv_need: j.kv_need, chunk: j.prefill_chunk, cached, waits, shared, media }
            })
            .collect();
        let cohort = self.cohort.as_ref().map(|c| CohortView {
            rows: c.len(),
            done: c.done().max(0) as usize,
            weight: c.weight(),
            chunk: c.rows().iter().filter_map(|r| r.prefill_chunk).min(),
            atomic: c.is_atomic(),
        });
        let state = planner::State { decoding: self.batch.len(), cohort, waiting: &waiting, kv_reserved: self.kv_reserved };
        planner::plan(&state, &self.limits())
    }

    /// An MLX error leaves the cohort's arrays unusable: its requests fail.
    fn fail_cohort(&mut self, e: Error) {
        if let Some(c) = self.cohort.take() {
            let (n, freed) = c.end_all(|r| r.fail(e.clone()));
            self.rows_ended(n, freed);
        }
    }

    /// Executes the plan's admission.
    fn admit(&mut self, admit: Admit, shares: &[Share]) -> Result<()> {
        match admit {
            Admit::Nothing => Ok(()),
            Admit::Join(n) => {
                for share in &shares[..n] {
                    let tokens = self.queue.front().map_or(0, |q| q.job.spec.prompt.len());
                    // The restore is its own span (spans never nest).
                    let Some(start) = self.open_one(share) else { continue };
                    let t = Instant::now();
                    let cohort = self.cohort.as_mut().expect("the plan joins a running cohort");
                    match start {
                        Start::Fresh(e) => cohort.join(e)?,
                        Start::Cached(e, cache) => cohort.join_cached(e, cache)?,
                    }
                    self.tracer.record(SpanKind::BatchSetup, 1, tokens, t);
                }
                Ok(())
            }
            Admit::NewCohort(n) => {
                let entrants = self.open_missed(n);
                if !entrants.is_empty() {
                    let (t, rows) = (Instant::now(), entrants.len());
                    let tokens = entrants.iter().map(|e| e.0.prompt.len()).sum();
                    let media = match &entrants[..] {
                        [(row, _)] => self.media_input(row)?,
                        _ => None,
                    };
                    let mut cohort = Cohort::new(self.model.as_ref(), self.config.kv, self.pools.as_ref(), entrants)?;
                    if let Some(m) = media {
                        cohort.set_media(m)?;
                    }
                    self.cohort = Some(cohort);
                    self.tracer.record(SpanKind::BatchSetup, rows, tokens, t);
                }
                Ok(())
            }
            Admit::FromCache(n) => {
                let starts: Vec<Start> = shares[..n].iter().filter_map(|share| self.open_one(share)).collect();
                let t = Instant::now();
                let media = match &starts[..] {
                    [s] => self.media_input(s.row())?,
                    _ => None,
                };
                let (rows, tokens) = (starts.len(), starts.iter().map(|s| s.row().prompt.len()).sum());
                let mut cohort = self.start_cohort(starts)?;
                if let Some(m) = media {
                    cohort.set_media(m)?;
                }
                self.cohort = Some(cohort);
                self.tracer.record(SpanKind::BatchSetup, rows, tokens, t);
                Ok(())
            }
        }
    }

    /// A new cohort of rows that start from their cached prefixes or fresh
    /// (a hit evicted since the probe).
    fn start_cohort(&self, starts: Vec<Start>) -> Result<Cohort> {
        let (mut cached, mut fresh) = (vec![], vec![]);
        for s in starts {
            match s {
                Start::Cached(e, cache) => cached.push((e, cache)),
                Start::Fresh(e) => fresh.push(e),
            }
        }
        if cached.is_empty() {
            return Cohort::new(self.model.as_ref(), self.config.kv, self.pools.as_ref(), fresh);
        }
        let mut cohort = Cohort::with_prefixes(cached)?;
        for e in fresh {
            cohort.join(e)?;
        }
        Ok(cohort)
    }

    /// Turns the queue's head into a row: with the caches of its cached
    /// prefix (a prompt-cache hit, or with `share` a concurrent row's
    /// blocks), else fresh (a miss, also when the entry was evicted since
    /// the probe). None when it could not be set up (it has had its error
    /// event).
    fn open_one(&mut self, share: &Share) -> Option<Start> {
        let found = self.queue.front().map(|q| q.found)?;
        let mut row = self.open(1).pop()?;
        let t = Instant::now();
        let claimed = match (share.from, found) {
            (Some((i, n)), _) => self.prefixes.caches(i, n).map(|c| Some((c, n))),
            (None, Found::Hit(n)) => {
                let pc = self.pcache.as_mut().expect("a hit comes from the prompt cache");
                let claimed = pc.claim(&row.namespace, row.key(), n);
                // Paged: the hit shares the entry's blocks (an entry read
                // from disk was loaded into blocks).
                claimed.map(|c| c.map(|c| (c, n)))
            }
            (None, _) => {
                if let Some(pc) = self.pcache.as_mut().filter(|_| row.use_cache) {
                    pc.miss();
                }
                return Some(Start::Fresh(self.entrant(row)));
            }
        };
        let mapped = match &claimed {
            Ok(Some((_, n))) => *n,
            _ => 0,
        };
        self.tracer.record(SpanKind::LookupRestore, 1, mapped, t);
        match claimed {
            Ok(Some((cache, n))) => {
                row.cached = n;
                Some(Start::Cached(self.entrant(row), cache))
            }
            Ok(None) => Some(Start::Fresh(self.entrant(row))),
            Err(e) => {
                row.fail(e);
                let freed = row.kv_reserved;
                drop(row);
                self.rows_ended(1, freed);
                None
            }
        }
    }

    /// A media prompt's tower rows for its positions past `row.cached` and
    /// where they go (prompt positions): from the encoder cache, or the
    /// towers over the items it does not hold (one batch per kind). Items
    /// wholly in the cached prefix are not needed.
    fn media_input(&mut self, row: &Row) -> Result<Option<MediaInput>> {
        let Some(m) = &row.media else { return Ok(None) };
        let needed: Vec<bool> = m.spans.iter().map(|s| s.end > row.cached).collect();
        let mut rows: Vec<Option<model::Encoded>> =
            m.items.iter().zip(&needed).map(|(it, &n)| if n { self.encoder.get(&it.hash) } else { None }).collect();
        let hits = rows.iter().filter(|r| r.is_some()).count();
        self.shared.encoder_cache_hits.fetch_add(hits as u64, Ordering::Relaxed);
        for kind in [crate::media::MediaKind::Image, crate::media::MediaKind::Audio] {
            let missing: Vec<usize> = (0..rows.len()).filter(|&i| needed[i] && rows[i].is_none() && m.items[i].kind == kind).collect();
            if missing.is_empty() {
                continue;
            }
            let tower = self.towers.get(kind).ok_or_else(|| Error::internal(format!("{} input reached a model without its tower", kind.name())))?;
            let out = tower.encode(&missing.iter().map(|&i| &m.items[i]).collect::<Vec<_>>())?;
            mlx::eval(&out.iter().flat_map(model::Encoded::arrays).collect::<Vec<_>>())?;
            self.shared.tower_runs.fetch_add(missing.len() as u64, Ordering::Relaxed);
            for (e, &i) in out.into_iter().zip(&missing) {
                self.encoder.put(m.items[i].hash, e.share());
                rows[i] = Some(e);
            }
            self.shared.encoder_cache_bytes.store(self.encoder.bytes() as u64, Ordering::Relaxed);
            self.shared.encoder_cache_entries.store(self.encoder.len() as u64, Ordering::Relaxed);
        }
        let rows: Vec<model::Encoded> = rows.into_iter().flatten().collect();
        let at: Vec<usize> = m.spans.iter().zip(&needed).filter(|(_, &n)| n).flat_map(|(s, _)| s.clone()).collect();
        let stack = |part: &dyn Fn(&model::Encoded) -> &Array| -> Result<Array> {
            match &rows[..] {
                [] => Ok(Array::zeros(&[0, 1], crate::mlx::Dtype::F32)?),
                _ => Ok(Array::concatenate(&rows.iter().map(part).collect::<Vec<_>>(), 0)?),
            }
        };
        let features = stack(&|r| &r.rows)?;
        let layers = rows.iter().map(|r| r.deepstack.len()).max().unwrap_or(0);
        let deepstack = (0..layers).map(|i| stack(&|r| &r.deepstack[i])).collect::<Result<_>>()?;
        Ok(Some(MediaInput { features, at, zero: m.zero.clone(), deepstack, mrope: m.mrope.clone(), blocks: m.blocks.clone() }))
    }

    /// Turns the first `n` queued jobs into rows, reserving their KV memory
    /// (a job whose row cannot be set up has had its error event).
    fn open(&mut self, n: usize) -> Vec<Row> {
        let mut rows = Vec::with_capacity(n);
        for _ in 0..n {
            let Queued { job, .. } = self.queue.pop_front().expect("the plan admits queued jobs");
            self.seed_counter = self.seed_counter.wrapping_add(1);
            let need = job.spec.kv_need;
            match Row::open(job, &self.text, self.seed_counter, need) {
                Some(row) => {
                    self.kv_reserved += need;
                    rows.push(row);
                }
                None => self.request_ended(),
            }
        }
        rows
    }

    /// `open` for rows that start without a cached prefix: those that use
    /// the prompt cache count as misses.
    fn open_missed(&mut self, n: usize) -> Vec<Entrant> {
        let rows = self.open(n);
        if let Some(pc) = &mut self.pcache {
            rows.iter().filter(|r| r.use_cache).for_each(|_| pc.miss());
        }
        rows.into_iter().map(|r| self.entrant(r)).collect()
    }

    /// A row with the prompt length at which the prompt cache wants a
    /// snapshot of it: its boundary (a chat's conversation before its last
    /// message), else, for a model whose caches cannot be cut back (recurrent
    /// state, quantized KV), all of the prompt but its last token (what an
    /// identical prompt can reuse: the last token is always forwarded). A
    /// trimmable model needs no such copy: the end-of-request (or cancel)
    /// snapshot, cut back on a hit, serves the identical prompt. Only if the
    /// row uses the cache, that length lies past what came from the cache,
    /// and it is long enough to keep.
    fn entrant(&self, row: Row) -> Entrant {
        let pc = self.pcache.as_ref();
        let len_minus_one = pc.is_some_and(|pc| !pc.trims()).then(|| row.prompt.len().saturating_sub(1));
        let mark = row.boundary.or(len_minus_one);
        let mark = mark.filter(|&b| row.use_cache && b > row.cached && pc.is_some_and(|pc| pc.wants_len(b)));
        (row, mark)
    }

    /// A decode step and a prefill chunk, one forward each (either may have
    /// nothing to do).
    fn decode_and_prefill(&mut self, chunk: usize) {
        let decoded = self.decode();
        self.then_prefill(decoded, chunk);
    }

    /// After a decode step (`decoded`: failed, its rows end): the prefill
    /// chunk in its own forward.
    fn then_prefill(&mut self, decoded: Result<()>, chunk: usize) {
        if let Err(e) = decoded {
            self.fail_batch(e);
        }
        if let Err(e) = self.prefill(chunk) {
            self.fail_cohort(e);
        }
    }

    /// An MLX error leaves the batch's arrays unusable: its requests fail.
    fn fail_batch(&mut self, e: Error) {
        let (n, freed) = self.batch.end_all(|r| r.fail(e.clone()));
        self.rows_ended(n, freed);
    }

    /// A decode step and a prefill chunk in one forward (the seed's mixed
    /// iteration): the decoding rows' tokens and the cohort's chunk packed
    /// into one model call, attention per group. A verify step, a media
    /// prompt, or a cohort that just lost its last row runs the two apart.
    /// An error in the shared forward ends the rows of both; one in either
    /// group's own work (its step's inputs, reading its logits, its
    /// snapshots) ends only that group's rows.
    fn mixed(&mut self, chunk: usize) {
        match self.drop_cancelled() {
            Ok(true) if !self.cohort.as_ref().is_some_and(Cohort::is_atomic) => {}
            Ok(_) => return self.decode_and_prefill(chunk),
            Err(e) => {
                self.fail_cohort(e);
                return self.decode_and_prefill(chunk);
            }
        }
        let cohort = self.cohort.as_ref().expect("checked above");
        let cstep = match cohort.next_step(self.model.as_ref(), chunk as i32) {
            Ok(s) => s,
            Err(e) => {
                self.fail_cohort(e);
                return self.decode_and_prefill(chunk);
            }
        };
        let drawn = match self.with_batch(DecodeBatch::begin) {
            Ok(Some(d)) => d,
            // A verify step ran (or nothing was pending): the chunk alone.
            Ok(None) => {
                let decoded = self.finish_decode();
                return self.then_prefill(decoded, chunk);
            }
            Err(e) => return self.then_prefill(Err(e), chunk),
        };
        let (decoded, prefilled) = match self.mixed_forward(drawn, cstep) {
            Ok(both) => both,
            Err(e) => {
                self.fail_batch(e.clone());
                return self.fail_cohort(e);
            }
        };
        if let Err(e) = decoded.and_then(|()| self.finish_decode()) {
            self.fail_batch(e);
        }
        if let Err(e) = prefilled.and_then(|p| self.finish_prefill(p)) {
            self.fail_cohort(e);
        }
    }

    /// The one forward of a mixed iteration: the batch's plain step on the
    /// tokens `drawn`, and the cohort's step `cstep`. The outer error is the
    /// shared forward's; the inner ones are each group's own.
    fn mixed_forward(&mut self, drawn: Drawn, cstep: CohortStep) -> Result<(Result<()>, Result<Progress>)> {
        let cohort = self.cohort.as_mut().expect("a mixed iteration has a cohort");
        let (b, r) = (self.batch.len() as i32, cstep.rows() as i32);
        let t = Instant::now();
        let tokens = Array::concatenate(
            &[&drawn.tokens.astype(Dtype::I32)?.reshape(&[1, b])?, &cstep.tokens.reshape(&[1, -1])?],
            1,
        )?;
        let len = cstep.tokens.dim(1);
        let mut groups = [
            Group { cache: self.batch.cache_mut(), rows: b, len: 1, out: Output::LastLogits },
            Group { cache: cohort.cache_mut(), rows: r, len, out: cstep.out },
        ];
        self.tracer.model_call();
        self.tracer.mixed_step();
        let logits = self.model.forward_mixed(&tokens, &mut groups)?.expect("the decode rows' logits");
        self.tracer.record(SpanKind::Forward, (b + r) as usize, b as usize + cstep.len(), t);
        let first = (cstep.out == Output::LastLogits).then(|| logits.slice_axis(0, b, b + r)).transpose()?;
        let decoded = logits.slice_axis(0, 0, b).map_err(Error::from).and_then(|l| self.batch.finish_plain(drawn, l, &self.tracer));
        Ok((decoded, cohort.finish_step(cstep, first, false, &self.tracer)))
    }

    /// Calls `f` (a `DecodeBatch` step) with the batch, the model and what a
    /// step needs besides.
    fn with_batch<R>(&mut self, f: impl FnOnce(&mut DecodeBatch, &dyn LanguageModel, &StepCtx) -> R) -> R {
        let step = StepCtx {
            text: &self.text,
            ctx_len: self.ctx_len,
            tracer: &self.tracer,
            spec: &self.shared.spec,
            drafter: self.drafter.as_ref(),
        };
        f(&mut self.batch, self.model.as_ref(), &step)
    }

    fn decode(&mut self) -> Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        self.with_batch(DecodeBatch::schedule)?;
        self.finish_decode()
    }

    /// What follows a decode step's forward: read and deliver the current
    /// tokens, take the snapshots rows that ended offer, drop those rows.
    fn finish_decode(&mut self) -> Result<()> {
        let offers = self.batch.collect(&self.text, self.ctx_len, &self.tracer)?;
        if let Some(pc) = &mut self.pcache {
            for o in offers {
                if pc.wants(&o.namespace, &o.tokens) {
                    let (t, n) = (Instant::now(), o.tokens.len());
                    // A snapshot that cannot be taken is only a lost cache entry.
                    match self.batch.snapshot(&o) {
                        Ok(snapshot) => pc.capture(Capture { namespace: o.namespace, tokens: o.tokens, snapshot }),
                        Err(e) => self.config.logger.log(LogLevel::Warn, format!("prompt cache: snapshot skipped: {e}")),
                    }
                    self.tracer.record(SpanKind::Snapshot, 1, n, t);
                }
            }
        }
        let t = Instant::now();
        let (n, freed) = self.batch.retire()?;
        if n > 0 {
            self.tracer.record(SpanKind::KvMaintenance, n, 0, t);
        }
        self.rows_ended(n, freed);
        Ok(())
    }

    /// Ends the cohort's cancelled rows; returns whether a cohort is left.
    fn drop_cancelled(&mut self) -> Result<bool> {
        let Some(c) = self.cohort.as_mut() else { return Ok(false) };
        let t = Instant::now();
        let (n, freed) = c.drop_cancelled()?;
        if n > 0 {
            self.tracer.record(SpanKind::KvMaintenance, n, 0, t);
        }
        let empty = c.len() == 0;
        self.rows_ended(n, freed);
        if empty {
            self.cohort = None;
        }
        Ok(!empty)
    }

    fn prefill(&mut self, chunk: usize) -> Result<()> {
        if !self.drop_cancelled()? {
            return Ok(());
        }
        let c = self.cohort.as_mut().expect("checked above");
        let progress = c.advance(self.model.as_ref(), chunk as i32, &self.tracer)?;
        self.finish_prefill(progress)
    }

    /// What follows a cohort's forward: its snapshots go to the prompt
    /// cache, and once prefill is over its rows join the decode batch.
    fn finish_prefill(&mut self, progress: Progress) -> Result<()> {
        if let Some(pc) = &mut self.pcache {
            for c in progress.captures {
                match c {
                    Ok(c) => pc.capture(c),
                    Err(e) => self.config.logger.log(LogLevel::Warn, format!("prompt cache: snapshot skipped: {e}")),
                }
            }
        }
        if let Some((rows, first)) = progress.ready {
            if self.cohort.as_ref().is_some_and(|c| c.len() == 0) {
                self.cohort = None;
            }
            self.keep_shared_prefixes(&rows);
            let (t, n) = (Instant::now(), rows.len());
            self.batch.join(rows, first)?;
            self.tracer.record(SpanKind::BatchSetup, n, 0, t);
        }
        Ok(())
    }

    /// Keeps the prompts of `rows` (their prefill just ended) whose blocks
    /// queued requests can map (`prefix_share`).
    fn keep_shared_prefixes(&mut self, rows: &RowSet) {
        let Some(block) = self.pools.as_ref().and_then(PagedPools::sharing_block) else { return };
        let askers = self.askers();
        let mut keep = vec![];
        for (i, r) in rows.rows.iter().enumerate() {
            if r.use_cache && r.media.is_none() && SharedPrefixes::wanted(block, &r.namespace, r.key(), &askers) {
                match rows.snapshot(i, r.prompt.len(), false) {
                    Ok(s) => keep.push((r.namespace.clone(), r.key().to_vec(), s)),
                    // The requests waiting for it start without it.
                    Err(e) => self.config.logger.log(LogLevel::Warn, format!("prefix sharing: snapshot skipped: {e}")),
                }
            }
        }
        drop(askers);
        for (ns, key, s) in keep {
            self.prefixes.add(&ns, &key, s);
        }
    }

    fn rows_ended(&mut self, n: usize, freed: usize) {
        self.kv_reserved -= freed;
        // Only decode-batch rows draft: the others' draft caches go.
        if let Some(d) = &self.drafter {
            d.retain(|id| self.batch.has_row(id));
        }
        for _ in 0..n {
            self.request_ended();
        }
    }

    /// Bookkeeping after a request left (its terminal event is on its way;
    /// the delivery thread releases its in-flight place).
    fn request_ended(&mut self) {
        if self.idle() {
            mlx::memory::clear_cache();
            mlx::memory::trim_heap();
        }
    }

    /// A request cancelled (or shut down) before it was admitted.
    fn end_queued(&mut self, Queued { mut job, .. }: Queued) {
        let usage = Usage { prompt_tokens: job.spec.prompt.len() as u32, ..Default::default() };
        job.outlet.send(Event::Done { finish: FinishReason::Cancelled, stop_index: None, usage });
        self.request_ended();
    }

    fn cancel_queued(&mut self, id: u64) {
        if let Some(pos) = self.queue.iter().position(|q| q.job.spec.id == id) {
            let job = self.queue.remove(pos).expect("position is valid");
            self.end_queued(job);
        }
    }

    fn cancel_all(&mut self) {
        let (n, freed) = self.batch.end_all(|r| r.finish(FinishReason::Cancelled, None));
        self.rows_ended(n, freed);
        if let Some(c) = self.cohort.take() {
            let (n, freed) = c.end_all(|r| r.finish(FinishReason::Cancelled, None));
            self.rows_ended(n, freed);
        }
        while let Some(q) = self.queue.pop_front() {
            self.end_queued(q);
        }
    }

    fn publish_stats(&self) {
        let s = &self.shared.stats;
        let cohort_rows = self.cohort.as_ref().map_or(0, Cohort::len);
        let kv = self.batch.kv_bytes() + self.cohort.as_ref().map_or(0, Cohort::kv_bytes);
        s.queued.store(self.queue.len(), Ordering::Relaxed);
        s.active.store(self.batch.len() + cohort_rows, Ordering::Relaxed);
        // Paged: each block in use once, whoever holds it.
        let blocks = self.pools.as_ref().map(PagedPools::stats).unwrap_or_default();
        let kv = if self.pools.is_some() { blocks.bytes_used as usize } else { kv };
        s.kv_blocks_used.store(blocks.used, Ordering::Relaxed);
        s.kv_blocks_free.store(blocks.free, Ordering::Relaxed);
        s.kv_blocks_shared.store(blocks.shared, Ordering::Relaxed);
        s.kv_bytes.store(kv, Ordering::Relaxed);
        let (dense, quant) = self.batch.kv_bytes_by_kind();
        let (cd, cq) = self.cohort.as_ref().map_or((0, 0), Cohort::kv_bytes_by_kind);
        let (dense, quant) = match &self.pools {
            // Paged: the blocks in use of each kind (rows' caches that stay
            // per row, recurrent states, count as neither).
            Some(_) => (blocks.bytes_dense as usize, blocks.bytes_quantized as usize),
            None => (dense + cd, quant + cq),
        };
        s.kv_bytes_dense.store(dense, Ordering::Relaxed);
        s.kv_bytes_quantized.store(quant, Ordering::Relaxed);
        s.kv_reserved.store(self.kv_reserved, Ordering::Relaxed);
        s.active_memory.store(mlx::memory::active(), Ordering::Relaxed);
        s.peak_memory.store(mlx::memory::peak(), Ordering::Relaxed);
        s.cache_memory.store(mlx::memory::cache(), Ordering::Relaxed);
        let draft_rows = self.drafter.as_ref().map_or(0, Drafter::rows);
        self.shared.spec.draft_rows.store(draft_rows, Ordering::Relaxed);
        if let Some(c) = &self.pcache {
            c.publish(&self.shared.cache);
        }
    }
}
