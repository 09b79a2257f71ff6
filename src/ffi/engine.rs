//! Engine handle: configuration, creation and destruction.

use super::args::{opt_str, req_str, versioned};
use super::error::{c_string, guard, guard_value, mlxrt_error, mlxrt_status};
use super::out::{free_box, put, put_box, required, write_versioned};
use crate::cache::scheme::{KvFloat, KvQuant, KvScheme};
use crate::engine::spec::{DEFAULT_NGRAM_TOKENS, NGRAM_MIN_MATCH};
use crate::engine::{Device, Engine, EngineConfig, Kernels, LogLevel, Logger, Span, SpanStats, Speculation};
use crate::error::Error;
use std::ffi::{c_char, c_void};
use std::sync::{Arc, Mutex};
use std::mem::size_of;

/// An engine: one loaded model, its scheduler thread and delivery thread.
/// All functions taking an engine may be called from any thread at the same
/// time, except `mlxrt_engine_destroy`, which must be the last call on it.
pub struct mlxrt_engine {
    pub(crate) engine: Engine,
    pub(crate) info: super::info::InfoStore,
}

/// `mlxrt_engine_config.device`: MLX's default device (the GPU where present).
pub const MLXRT_DEVICE_AUTO: i32 = 0;
/// `mlxrt_engine_config.device`: the CPU.
pub const MLXRT_DEVICE_CPU: i32 = 1;
/// `mlxrt_engine_config.device`: the GPU (Metal or CUDA).
pub const MLXRT_DEVICE_GPU: i32 = 2;

/// `mlxrt_engine_config.kernels`: mlxrt's quantized-matmul kernels on the
/// CPU, MLX's own on other devices.
pub const MLXRT_KERNELS_AUTO: i32 = 0;
/// `mlxrt_engine_config.kernels`: MLX's stock kernels everywhere (exact
/// comparisons with Python mlx-lm).
pub const MLXRT_KERNELS_STOCK: i32 = 1;
/// `mlxrt_engine_config.kernels`: AUTO with int8 activations in the
/// quantized matmuls on the CPU (as llama.cpp computes them; much faster
/// prefill and batches on AVX-512 VNNI). Opt-in: the rounding of the
/// activations moves logits (by up to ~1 on SmolLM2-135M) and changes
/// greedy tokens against mlx-lm.
pub const MLXRT_KERNELS_INT8: i32 = 2;

/// `mlxrt_engine_config.kv_scheme`: keys and values kept dense (f32 on the CPU).
pub const MLXRT_KV_SCHEME_NONE: i32 = 0;
/// `mlxrt_engine_config.kv_scheme`: MLX affine quantization (`kv_bits`,
/// `kv_group_size`), attention on the packed form (as mlx-lm's `kv_bits`).
pub const MLXRT_KV_SCHEME_AFFINE: i32 = 1;
/// `mlxrt_engine_config.kv_scheme`: TurboQuant (`kv_key_bits`,
/// `kv_value_bits`): keys affine per 32 coordinates, values rotated and
/// Lloyd–Max quantized (see README).
pub const MLXRT_KV_SCHEME_TURBOQUANT: i32 = 2;
/// `mlxrt_engine_config.kv_scheme`: full-attention layers keep keys and
/// values dense as f16 (half the bytes of f32; llama.cpp's default KV type),
/// widened exactly to f32 for attention on the CPU. Sliding-window layers
/// keep the activations' dtype. Not with `kv_paging` (UNSUPPORTED).
pub const MLXRT_KV_SCHEME_F16: i32 = 3;

/// Log levels (`mlxrt_engine_config.log_level` and the log callback's level).
pub const MLXRT_LOG_OFF: i32 = 0;
pub const MLXRT_LOG_ERROR: i32 = 1;
pub const MLXRT_LOG_WARN: i32 = 2;
pub const MLXRT_LOG_INFO: i32 = 3;
pub const MLXRT_LOG_DEBUG: i32 = 4;

/// Receives the engine's log messages (NUL-terminated UTF-8, valid during the
/// call) at or below the configured level. Called from the engine's threads,
/// one call at a time, until `mlxrt_engine_destroy` returns.
pub type mlxrt_log_fn = Option<unsafe extern "C" fn(user_data: *mut c_void, level: i32, message: *const c_char)>;

/// Reports model-load progress during `mlxrt_engine_create`: `fraction` in
/// 0..1 and a phase ("reading", "building", "evaluating"; valid during the
/// call). Called on the engine's thread while create waits. Return false to
/// abort the load: create then returns `MLXRT_STATUS_ABORTED`.
pub type mlxrt_progress_fn = Option<unsafe extern "C" fn(user_data: *mut c_void, fraction: f32, phase: *const c_char) -> bool>;

/// `mlxrt_trace_span.kind` and the index into `mlxrt_engine_stats.spans`:
/// looking a prompt up in the prompt cache, or restoring a hit's state.
pub const MLXRT_SPAN_LOOKUP_RESTORE: i32 = 0;
/// Setting up a prefill cohort's caches, a request joining it, or a finished
/// cohort joining the decoding batch.
pub const MLXRT_SPAN_BATCH_SETUP: i32 = 1;
/// One model call (a prefill chunk or a decode step). MLX is lazy: this
/// times building the computation; computing it lands in SAMPLE (which
/// starts a decode step, and on the CPU may run most of it) and EVALUATE.
pub const MLXRT_SPAN_FORWARD: i32 = 2;
/// Waiting for a forward's results (prefill cache state, decoded tokens).
pub const MLXRT_SPAN_EVALUATE: i32 = 3;
/// Dropping ended or cancelled requests from the batch's caches.
pub const MLXRT_SPAN_KV_MAINTENANCE: i32 = 4;
/// Taking a prompt-cache snapshot of one request's state.
pub const MLXRT_SPAN_SNAPSHOT: i32 = 5;
/// Drawing tokens from the logits, and starting the step's computation.
pub const MLXRT_SPAN_SAMPLE: i32 = 6;
/// Handing tokens to their requests (detokenizing, stop strings, events).
pub const MLXRT_SPAN_DELIVER: i32 = 7;
/// How many span kinds there are (the length of `mlxrt_engine_stats.spans`).
/// Kinds added later get new fields, so this never changes.
pub const MLXRT_SPAN_KINDS: usize = 8;

/// One timed piece of the engine's work, passed to the trace callback.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mlxrt_trace_span {
    /// `sizeof(mlxrt_trace_span)` of the library that made it.
    pub struct_size: usize,
    /// One of `MLXRT_SPAN_*`.
    pub kind: i32,
    /// Requests the work was for.
    pub rows: u32,
    /// Tokens it processed: positions forwarded (rows × chunk, padding
    /// included), tokens drawn or delivered, prompt tokens looked up,
    /// restored or snapshotted.
    pub tokens: u64,
    /// The scheduler iteration it belongs to, counting from 1; lookups of
    /// arriving requests, between iterations, carry the last one's (0
    /// before the first).
    pub iteration: u64,
    /// When it began, in milliseconds since the engine was created, and how
    /// long it took.
    pub start_ms: f64,
    pub duration_ms: f64,
}

/// Receives the engine's trace spans as they end, on the engine's scheduler
/// thread, one call at a time, until `mlxrt_engine_destroy` returns. The
/// model waits while it runs: it must be quick (copy the span and return),
/// and must not call any mlxrt function on this engine.
pub type mlxrt_trace_fn = Option<unsafe extern "C" fn(user_data: *mut c_void, span: *const mlxrt_trace_span)>;

/// Engine settings. Fill with `mlxrt_engine_config_init`, then set fields.
/// Fields are only ever appended; `struct_size` tells the library which ones
/// the caller knows.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct mlxrt_engine_config {
    /// `sizeof(mlxrt_engine_config)`, set by `mlxrt_engine_config_init`.
    pub struct_size: usize,
    /// A `.gguf` file or a Hugging Face MLX-format folder (UTF-8, copied).
    pub model_path: *const c_char,
    /// One of `MLXRT_DEVICE_*` (default AUTO).
    pub device: i32,
    /// Requests accepted but not yet finished before submit returns BUSY
    /// (default 256).
    pub max_in_flight: u32,
    /// Prompt positions per prefill forward pass when nothing else is
    /// generating (default 512).
    pub prefill_chunk: u32,
    /// Base seed for requests without their own seed (default 0).
    pub seed: u64,
    /// Requests prefilling or generating at once, batched together; the rest
    /// wait in FIFO order (default 32).
    pub max_rows: u32,
    /// Bytes of KV cache the running requests may reserve, each for its
    /// prompt + max_tokens (default 4 GiB). A request that can never fit is
    /// rejected at submit; one that does not fit now waits.
    pub kv_budget: u64,
    /// Prompt tokens one scheduler step may prefill while other requests are
    /// generating; bounds their inter-token latency (default 256).
    pub step_token_budget: u32,
    /// One of `MLXRT_KERNELS_*` (default AUTO).
    pub kernels: i32,
    /// Bytes of prompt-cache snapshots kept in memory; 0 turns the prompt
    /// cache off (default 1 GiB).
    pub prompt_cache_bytes: u64,
    /// A directory where the prompt cache persists entries across restarts
    /// (UTF-8, created if missing); NULL = memory only (default).
    pub prompt_cache_dir: *const c_char,
    /// Size cap of that directory; the least recently used files go first
    /// (default 16 GiB).
    pub prompt_cache_dir_bytes: u64,
    /// Shortest token sequence worth a snapshot (default 256).
    pub prompt_cache_min_tokens: u32,
    /// Where log messages go; NULL = standard error.
    pub log_callback: mlxrt_log_fn,
    pub log_user_data: *mut c_void,
    /// Most verbose level logged, one of `MLXRT_LOG_*` (default WARN).
    pub log_level: i32,
    /// Model-load progress (may abort the load); NULL = none.
    pub progress_callback: mlxrt_progress_fn,
    pub progress_user_data: *mut c_void,
    /// How full-attention layers store keys and values, one of
    /// `MLXRT_KV_SCHEME_*` (default NONE: dense). Sliding-window layers stay
    /// dense. All requests of the engine share the scheme.
    pub kv_scheme: i32,
    /// AFFINE: bits per element, 4 or 8 (2, 3, 5, 6 also valid; default 4).
    pub kv_bits: i32,
    /// AFFINE: elements per scale and bias along the head dimension: 32, 64
    /// or 128, dividing the model's head dimension (default 64).
    pub kv_group_size: i32,
    /// TURBOQUANT: bits per key and per value element (default 8 and 3).
    pub kv_key_bits: i32,
    pub kv_value_bits: i32,
    /// Position from which a request's KV cache is quantized (mlx-lm's
    /// `quantized_kv_start`): a forward over a row's positions `[a, a + L)`
    /// uses float KV iff `a < start`. Default 0: quantized from the first
    /// token. A request may set its own (`quantized_kv_start` in
    /// `options_json`).
    pub quantized_kv_start: i32,
    /// Receives the scheduler's trace spans (see `mlxrt_trace_fn`); NULL =
    /// none (the spans are still summarised in `mlxrt_engine_stats`).
    pub trace_callback: mlxrt_trace_fn,
    pub trace_user_data: *mut c_void,
    /// Speculative decoding for requests whose `options_json` does not set
    /// `speculation`: `MLXRT_SPECULATION_OFF` (default) or
    /// `MLXRT_SPECULATION_NGRAM` (prompt lookup: drafts from the prompt and
    /// output, checked in one forward pass; greedy output unchanged). Rows
    /// speculate inside the decode batch (see README, "Speculative decoding").
    /// OFF with a `draft_model_path`: requests draft with the draft model.
    pub speculation: i32,
    /// Drafted tokens per verify step for prompt lookup (0 = 10).
    pub speculation_tokens: u32,
    /// 1: paged KV (attention layers keep KV, dense or as `kv_scheme`
    /// stores it, in blocks of a pool shared by all rows: no padding between
    /// rows of different lengths, prompt prefixes shared; sliding-window
    /// layers give back the blocks behind their window, recurrent layers
    /// keep their per-row state). 0 (default): off.
    pub kv_paging: u32,
    /// Positions per KV block with `kv_paging`: a multiple of 32 from 32 to
    /// 1024 (default 256). Ignored without paging.
    pub kv_block_size: u32,
    /// A smaller model with the same tokenizer that drafts tokens for
    /// speculative decoding (UTF-8 path of a `.gguf` file or an MLX folder,
    /// loaded at creation like `model_path`); NULL = none (default). It must
    /// have the target's vocabulary (size, tokens, special and end ids) and
    /// only full-attention layers, else `mlxrt_engine_create` fails with
    /// `MLXRT_STATUS_INVALID_ARGUMENT`. With a draft model and `speculation`
    /// OFF, requests that do not set `speculation` in `options_json` draft
    /// with it (3 tokens per verify step; `"speculation": "off"` turns it
    /// off for a request). Example:
    /// `cfg.model_path = "SmolLM2-360M-Instruct-Q4_1.gguf";
    /// cfg.draft_model_path = "SmolLM2-135M-Instruct-Q4_1.gguf";`
    pub draft_model_path: *const c_char,
    /// A request joins a prefill already running (fresh, or from a
    /// prompt-cache hit, starting at the position the others have reached)
    /// only while the prompt tokens its requests process, cached ones not
    /// counted, stay within this (default 2048; 0 = requests never join a
    /// running prefill: each waits for the next).
    pub prefill_join_tokens: u32,
}

/// `mlxrt_engine_config.speculation`: decode one token per step.
pub const MLXRT_SPECULATION_OFF: i32 = 0;
/// `mlxrt_engine_config.speculation`: prompt-lookup (n-gram) drafting.
pub const MLXRT_SPECULATION_NGRAM: i32 = 1;

/// The first published layout: every field up to `progress_user_data`.
const CONFIG_V1_SIZE: usize = std::mem::offset_of!(mlxrt_engine_config, kv_scheme);

fn default_config() -> mlxrt_engine_config {
    let d = EngineConfig::new("");
    mlxrt_engine_config {
        struct_size: size_of::<mlxrt_engine_config>(),
        model_path: std::ptr::null(),
        device: MLXRT_DEVICE_AUTO,
        max_in_flight: d.max_in_flight as u32,
        prefill_chunk: d.prefill_chunk as u32,
        seed: d.seed,
        max_rows: d.max_rows as u32,
        kv_budget: d.kv_budget as u64,
        step_token_budget: d.step_token_budget as u32,
        kernels: MLXRT_KERNELS_AUTO,
        prompt_cache_bytes: d.prompt_cache_bytes as u64,
        prompt_cache_dir: std::ptr::null(),
        prompt_cache_dir_bytes: d.prompt_cache_dir_bytes,
        prompt_cache_min_tokens: d.prompt_cache_min_tokens as u32,
        log_callback: None,
        log_user_data: std::ptr::null_mut(),
        log_level: MLXRT_LOG_WARN,
        progress_callback: None,
        progress_user_data: std::ptr::null_mut(),
        kv_scheme: MLXRT_KV_SCHEME_NONE,
        kv_bits: 4,
        kv_group_size: 64,
        kv_key_bits: 8,
        kv_value_bits: 3,
        quantized_kv_start: d.kv.start,
        trace_callback: None,
        speculation: MLXRT_SPECULATION_OFF,
        speculation_tokens: 0,
        trace_user_data: std::ptr::null_mut(),
        kv_paging: d.kv_paging as u32,
        kv_block_size: d.kv_block_size as u32,
        draft_model_path: std::ptr::null(),
        prefill_join_tokens: d.prefill_join_tokens as u32,
    }
}

/// Fills `config` with defaults (and its `struct_size`). NULL is a no-op.
#[no_mangle]
pub extern "C" fn mlxrt_engine_config_init(config: *mut mlxrt_engine_config) {
    guard_value((), || put(config, default_config()))
}

/// A host pointer passed back to host callbacks from engine threads, which
/// the C contract allows.
#[derive(Clone, Copy)]
struct UserData(*mut c_void);
// SAFETY: only handed back to the host's own callbacks (see their docs).
unsafe impl Send for UserData {}
unsafe impl Sync for UserData {}
impl UserData {
    fn get(self) -> *mut c_void {
        self.0
    }
}

fn logger(c: &mlxrt_engine_config) -> crate::Result<Logger> {
    let min = match c.log_level {
        MLXRT_LOG_OFF => None,
        MLXRT_LOG_ERROR => Some(LogLevel::Error),
        MLXRT_LOG_WARN => Some(LogLevel::Warn),
        MLXRT_LOG_INFO => Some(LogLevel::Info),
        MLXRT_LOG_DEBUG => Some(LogLevel::Debug),
        other => return Err(Error::invalid(format!("config.log_level {other} is not a MLXRT_LOG_* value"))),
    };
    let Some(f) = c.log_callback else {
        return Ok(Logger::new(min, Arc::new(|l, m| eprintln!("[mlxrt {l}] {m}"))));
    };
    let ud = UserData(c.log_user_data);
    let one_at_a_time = Mutex::new(());
    Ok(Logger::new(
        min,
        Arc::new(move |level: LogLevel, msg: &str| {
            let msg = c_string(msg);
            let _g = one_at_a_time.lock();
            // SAFETY: the caller's callback, with its user data.
            unsafe { f(ud.get(), level as i32, msg.as_ptr()) }
        }),
    ))
}

/// Loads the model and starts the engine; blocks until the model is ready.
/// On success `*out_engine` receives the engine (free it with
/// `mlxrt_engine_destroy`); on failure it is set to NULL and `*error` (when
/// `error` is not NULL) receives an error to free with `mlxrt_error_free`.
#[no_mangle]
pub extern "C" fn mlxrt_engine_create(
    config: *const mlxrt_engine_config,
    out_engine: *mut *mut mlxrt_engine,
    error: *mut *mut mlxrt_error,
) -> mlxrt_status {
    guard(error, || {
        required(out_engine, "out_engine")?;
        let c = versioned(config, default_config(), CONFIG_V1_SIZE, "config")?;
        let path = req_str(c.model_path, "config.model_path")?;
        let device = match c.device {
            MLXRT_DEVICE_AUTO => Device::Auto,
            MLXRT_DEVICE_CPU => Device::Cpu,
            MLXRT_DEVICE_GPU => Device::Gpu,
            other => return Err(Error::invalid(format!("config.device {other} is not a MLXRT_DEVICE_* value"))),
        };
        let kernels = match c.kernels {
            MLXRT_KERNELS_AUTO => Kernels::Auto,
            MLXRT_KERNELS_STOCK => Kernels::Stock,
            MLXRT_KERNELS_INT8 => Kernels::Int8,
            other => return Err(Error::invalid(format!("config.kernels {other} is not a MLXRT_KERNELS_* value"))),
        };
        let mut cfg = EngineConfig::new(path);
        cfg.kernels = kernels;
        cfg.prompt_cache_bytes = usize::try_from(c.prompt_cache_bytes).unwrap_or(usize::MAX);
        cfg.prompt_cache_dir = opt_str(c.prompt_cache_dir, "config.prompt_cache_dir")?.map(Into::into);
        cfg.prompt_cache_dir_bytes = c.prompt_cache_dir_bytes;
        cfg.prompt_cache_min_tokens = c.prompt_cache_min_tokens as usize;
        cfg.logger = logger(&c)?;
        if let Some(f) = c.progress_callback {
            let ud = UserData(c.progress_user_data);
            cfg.progress = Some(Arc::new(move |fraction: f32, phase: &str| {
                let phase = c_string(phase);
                // SAFETY: the caller's callback, with its user data, during create.
                unsafe { f(ud.get(), fraction, phase.as_ptr()) }
            }));
        }
        cfg.device = device;
        cfg.max_in_flight = c.max_in_flight as usize;
        cfg.prefill_chunk = c.prefill_chunk as usize;
        cfg.seed = c.seed;
        cfg.max_rows = c.max_rows as usize;
        cfg.kv_budget = usize::try_from(c.kv_budget).unwrap_or(usize::MAX);
        cfg.step_token_budget = c.step_token_budget as usize;
        let (scheme, float) = match c.kv_scheme {
            MLXRT_KV_SCHEME_NONE => (KvScheme::Dense, KvFloat::Compute),
            MLXRT_KV_SCHEME_AFFINE => (KvScheme::Affine { bits: c.kv_bits, group_size: c.kv_group_size }, KvFloat::Compute),
            MLXRT_KV_SCHEME_TURBOQUANT => {
                (KvScheme::TurboQuant { key_bits: c.kv_key_bits, value_bits: c.kv_value_bits }, KvFloat::Compute)
            }
            MLXRT_KV_SCHEME_F16 => (KvScheme::Dense, KvFloat::F16),
            other => return Err(Error::invalid(format!("config.kv_scheme {other} is not a MLXRT_KV_SCHEME_* value"))),
        };
        cfg.kv = KvQuant { scheme, start: c.quantized_kv_start, float };
        let n = match c.speculation_tokens {
            0 => DEFAULT_NGRAM_TOKENS,
            n @ 1..=64 => n as usize,
            n => return Err(Error::invalid(format!("config.speculation_tokens {n} is more than 64"))),
        };
        cfg.speculation = match c.speculation {
            MLXRT_SPECULATION_OFF => Speculation::Off,
            MLXRT_SPECULATION_NGRAM => Speculation::Ngram { num_tokens: n, min_match: NGRAM_MIN_MATCH },
            other => return Err(Error::invalid(format!("config.speculation {other} is not a MLXRT_SPECULATION_* value"))),
        };
        cfg.kv_paging = match c.kv_paging {
            0 => false,
            1 => true,
            other => return Err(Error::invalid(format!("config.kv_paging {other} is not 0 or 1"))),
        };
        cfg.kv_block_size = c.kv_block_size as usize;
        cfg.draft_model_path = opt_str(c.draft_model_path, "config.draft_model_path")?.map(Into::into);
        cfg.prefill_join_tokens = c.prefill_join_tokens as usize;
        if let Some(f) = c.trace_callback {
            let ud = UserData(c.trace_user_data);
            cfg.trace = Some(Arc::new(move |s: &Span| {
                let span = mlxrt_trace_span {
                    struct_size: size_of::<mlxrt_trace_span>(),
                    kind: s.kind as i32,
                    rows: s.rows as u32,
                    tokens: s.tokens as u64,
                    iteration: s.iteration,
                    start_ms: s.start.as_secs_f64() * 1e3,
                    duration_ms: s.duration.as_secs_f64() * 1e3,
                };
                // SAFETY: the caller's callback, with its user data, on the
                // scheduler thread (one call at a time).
                unsafe { f(ud.get(), &span) }
            }));
        }
        let engine = Engine::new(cfg)?;
        let info = super::info::InfoStore::new(&engine);
        put_box(out_engine, mlxrt_engine { engine, info });
        Ok(())
    })
}

/// Cancels every request in flight, delivers their terminal events, stops the
/// threads and frees the engine. Request handles stay valid (and must still
/// be freed) but do nothing. May be called from an event callback: the
/// remaining events are then delivered after that callback returns. NULL is a
/// no-op.
#[no_mangle]
pub extern "C" fn mlxrt_engine_destroy(engine: *mut mlxrt_engine) {
    guard_value((), || free_box(engine))
}

/// Engine counters, filled by `mlxrt_engine_get_stats`. Set `struct_size`
/// to `sizeof(mlxrt_engine_stats)` first; fields are only ever appended.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct mlxrt_engine_stats {
    pub struct_size: usize,
    /// Requests waiting for admission.
    pub queued: u64,
    /// Requests prefilling or generating.
    pub active: u64,
    /// Requests submitted and not yet ended (queued + active + those whose
    /// terminal event is being delivered).
    pub in_flight: u64,
    /// Requests ended since the engine started.
    pub completed: u64,
    /// Bytes allocated by KV caches now. Without `kv_paging` a request's
    /// full-attention caches are allocated for its prompt + max_tokens (up
    /// to the context length) when it starts, sliding-window caches grow up
    /// to their window; on CPU the pages become resident only as positions
    /// are written. With paging, the blocks in use (see `kv_blocks_used`).
    pub kv_bytes: u64,
    /// Bytes of KV cache reserved by running requests (prompt + max_tokens).
    pub kv_reserved: u64,
    /// MLX allocator: bytes in use, peak, and held in its cache.
    pub active_memory: u64,
    pub peak_memory: u64,
    pub cache_memory: u64,
    /// Prompt cache: admitted requests that reused cached tokens, that did
    /// not, prompt tokens it supplied, bytes in memory and on disk.
    pub prompt_cache_hits: u64,
    pub prompt_cache_misses: u64,
    pub prompt_cache_hit_tokens: u64,
    pub prompt_cache_memory_bytes: u64,
    pub prompt_cache_disk_bytes: u64,
    /// Bytes held by KV caches now, stored dense (including the float copy
    /// quantized layers keep for rows before `quantized_kv_start`) and
    /// stored quantized; they add up to `kv_bytes`.
    pub kv_bytes_dense: u64,
    pub kv_bytes_quantized: u64,
    /// Scheduler iterations run (rounds of admission, decode and prefill).
    pub iterations: u64,
    /// Model forward calls made (prefill chunks and decode steps).
    pub model_calls: u64,
    /// The scheduler's trace spans since the engine started, per kind
    /// (indexed by `MLXRT_SPAN_*`), whether or not a trace callback is set.
    pub spans: [mlxrt_span_stats; MLXRT_SPAN_KINDS],
    /// Speculative decoding since the engine started: drafted tokens, how
    /// many the model accepted (never more), and verify steps run.
    pub spec_proposed: u64,
    pub spec_accepted: u64,
    pub spec_verify_steps: u64,
    /// With `kv_paging`: KV blocks in use (by rows or prompt-cache entries;
    /// a shared block once) and free, summed over the paged layers' pools
    /// (a quantized layer's float blocks included; 0 without paging). Then
    /// `kv_bytes` counts the blocks in use.
    pub kv_blocks_used: u64,
    pub kv_blocks_free: u64,
    /// Encoder cache (vision tower outputs kept by image content, budget
    /// `encoder_cache_bytes`): bytes and entries it holds now, images whose
    /// tower output it supplied, and images the vision tower encoded. A
    /// repeated image adds to `encoder_cache_hits`, not to `tower_runs`:
    /// the same photo sent twice leaves `tower_runs` 1 and
    /// `encoder_cache_hits` 1 (unless the prompt cache served the whole
    /// prompt, when neither is needed).
    pub encoder_cache_bytes: u64,
    pub encoder_cache_entries: u64,
    pub encoder_cache_hits: u64,
    pub tower_runs: u64,
    /// Model calls that ran decoding rows and a prefill chunk in one forward
    /// (mixed iterations; counted in `model_calls` too). Models whose
    /// architecture has no mixed forward (Gemma 3 and 4, Qwen3.5) make two
    /// calls instead, as do iterations with a speculative verify step or an
    /// image prompt.
    pub mixed_steps: u64,
    /// With `kv_paging`: blocks in use held more than once (a prefix mapped
    /// by several rows, or by a prompt-cache entry and rows), summed over
    /// the paged layers' pools.
    pub kv_blocks_shared: u64,
}

/// The summary of one kind of trace span in `mlxrt_engine_stats.spans`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct mlxrt_span_stats {
    pub count: u64,
    /// Their total duration, in milliseconds.
    pub total_ms: f64,
    /// The 95th percentile of their durations, in milliseconds (within 5%).
    pub p95_ms: f64,
}

impl From<SpanStats> for mlxrt_span_stats {
    fn from(s: SpanStats) -> Self {
        mlxrt_span_stats { count: s.count, total_ms: s.total_ms, p95_ms: s.p95_ms }
    }
}

/// Writes the engine's current counters to `*out` (the first
/// `out->struct_size` bytes). They are published by the engine's thread
/// after every step, so they lag a request's events by a moment.
#[no_mangle]
pub extern "C" fn mlxrt_engine_get_stats(
    engine: *const mlxrt_engine,
    out: *mut mlxrt_engine_stats,
    error: *mut *mut mlxrt_error,
) -> mlxrt_status {
    guard(error, || {
        let engine = &super::args::reference(engine, "engine")?.engine;
        let s = engine.stats();
        let stats = mlxrt_engine_stats {
            struct_size: size_of::<mlxrt_engine_stats>(),
            queued: s.queued as u64,
            active: s.active as u64,
            in_flight: s.in_flight as u64,
            completed: s.completed,
            kv_bytes: s.kv_bytes as u64,
            kv_reserved: s.kv_reserved as u64,
            active_memory: s.active_memory as u64,
            peak_memory: s.peak_memory as u64,
            cache_memory: s.cache_memory as u64,
            prompt_cache_hits: s.prompt_cache_hits,
            prompt_cache_misses: s.prompt_cache_misses,
            prompt_cache_hit_tokens: s.prompt_cache_hit_tokens,
            prompt_cache_memory_bytes: s.prompt_cache_memory_bytes as u64,
            prompt_cache_disk_bytes: s.prompt_cache_disk_bytes,
            kv_bytes_dense: s.kv_bytes_dense as u64,
            kv_bytes_quantized: s.kv_bytes_quantized as u64,
            iterations: s.iterations,
            model_calls: s.model_calls,
            spans: s.spans.map(Into::into),
            spec_proposed: s.spec_proposed,
            spec_accepted: s.spec_accepted,
            spec_verify_steps: s.spec_verify_steps,
            kv_blocks_used: s.kv_blocks_used,
            kv_blocks_free: s.kv_blocks_free,
            encoder_cache_bytes: s.encoder_cache_bytes,
            encoder_cache_entries: s.encoder_cache_entries,
            encoder_cache_hits: s.encoder_cache_hits,
            tower_runs: s.tower_runs,
            mixed_steps: s.mixed_steps,
            kv_blocks_shared: s.kv_blocks_shared,
        };
        write_versioned(out, stats, "out")
    })
}

/// Writes the prompt cache's in-memory entries to its directory (they also
/// stay in memory) and returns once they are on disk. Entries are also
/// written when evicted, when the engine has been idle for two seconds, and
/// when it is destroyed. OK without a directory (nothing to do).
#[no_mangle]
pub extern "C" fn mlxrt_engine_flush_prompt_cache(engine: *const mlxrt_engine, error: *mut *mut mlxrt_error) -> mlxrt_status {
    guard(error, || super::args::reference(engine, "engine")?.engine.flush_prompt_cache())
}

/// `mlxrt_engine_clear_prompt_cache` flag: also delete the directory's files.
pub const MLXRT_CLEAR_DISK: u32 = 1;

/// Drops the prompt cache's in-memory entries, and with `MLXRT_CLEAR_DISK`
/// in `flags` its files too. Requests running now are not affected.
#[no_mangle]
pub extern "C" fn mlxrt_engine_clear_prompt_cache(
    engine: *const mlxrt_engine,
    flags: u32,
    error: *mut *mut mlxrt_error,
) -> mlxrt_status {
    guard(error, || {
        let engine = &super::args::reference(engine, "engine")?.engine;
        if flags & !MLXRT_CLEAR_DISK != 0 {
            return Err(Error::invalid(format!("unknown flags {flags:#x}")));
        }
        engine.clear_prompt_cache(flags & MLXRT_CLEAR_DISK != 0)
    })
}
