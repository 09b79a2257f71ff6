//! Requests: parameters, submission, events delivered to a callback, cancel.

use super::args::{json, json_object, opt_str, reference, req_str, slice, versioned};
use super::engine::mlxrt_engine;
use super::error::{guard, guard_value, mlxrt_error, mlxrt_status};
use super::event::{mlxrt_event_fn, mlxrt_free_fn, CallbackSink};
use super::out::{clear, free_box, put, put_box};
use crate::engine::{Input, RequestHandle, RequestOptions};
use crate::error::Error;
use crate::sample::SamplingParams;
use std::ffi::{c_char, c_void};
use std::mem::size_of;

/// A submitted request. The handle is independent of the request's progress:
/// free it with `mlxrt_request_free` whenever convenient (that does not
/// cancel). Any thread may use it.
pub struct mlxrt_request {
    handle: RequestHandle,
}

/// Request settings. Fill with `mlxrt_request_params_init`, then set exactly
/// one input (`messages_json`, `prompt` or `prompt_tokens`). Everything is
/// copied by `mlxrt_request_submit`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct mlxrt_request_params {
    /// `sizeof(mlxrt_request_params)`, set by `mlxrt_request_params_init`.
    pub struct_size: usize,
    /// Chat messages as a non-empty JSON array of `{"role": ...,
    /// "content": ...}`, rendered with the model's chat template (generation
    /// prompt appended). Roles: system, developer, user, assistant, tool,
    /// ipython; another role, an empty array or another shape is
    /// INVALID_ARGUMENT, text that does not parse INVALID_JSON.
    pub messages_json: *const c_char,
    /// Raw prompt text (special-token text such as `<|im_start|>` is parsed).
    pub prompt: *const c_char,
    /// Prompt token ids, used as they are.
    pub prompt_tokens: *const u32,
    pub n_prompt_tokens: usize,
    /// Maximum number of generated tokens (default 256).
    pub max_tokens: u32,
    /// 0 = greedy (default).
    pub temperature: f32,
    /// Nucleus sampling mass in (0, 1); 0 = off (default).
    pub top_p: f32,
    /// Sample among the k most likely tokens; 0 = off (default).
    pub top_k: i32,
    /// Minimum probability relative to the most likely token; 0 = off.
    pub min_p: f32,
    /// Penalty on recently seen tokens (mlx-lm semantics); 1 = off (default).
    pub repetition_penalty: f32,
    /// Tokens the repetition penalty looks back over (default 20).
    pub repetition_context_size: u32,
    /// Non-zero: use `seed` for sampling, making the output reproducible.
    pub use_seed: u8,
    pub seed: u64,
    /// Stop strings (UTF-8): generation ends when one appears in the output
    /// text, which then ends before it.
    pub stop: *const *const c_char,
    pub n_stop: usize,
    /// Optional JSON object of OpenAI-style fields applied after the fields
    /// above: max_tokens, temperature, top_p, top_k, min_p,
    /// repetition_penalty, repetition_context_size, seed, stop, tools,
    /// chat_template_kwargs, ignore_eos, prefill_chunk, cache_namespace,
    /// cache_session_id, prompt_cache, logprobs, top_logprobs, thinking, quantized_kv_start
    /// (see `mlxrt_engine_config.quantized_kv_start`), speculation (`"off"`,
    /// `"ngram"`, `"draft"`, `{"type": "ngram", "num_tokens": n, "min_match":
    /// m}` or `{"type": "draft", "num_tokens": n}`; see
    /// `mlxrt_engine_config.speculation` and `draft_model_path`),
    /// response_format and tool_choice
    /// (below). Unknown fields are an
    /// error. Tool definitions (`tools`, an array of JSON schemas as in
    /// OpenAI's API) are given to the chat template; tool calls the model
    /// makes come back as TOOL_CALL events.
    ///
    /// Structured output: `response_format` makes the output a JSON document
    /// valid against a schema (`{"type": "json_schema", "json_schema":
    /// {"schema": {...}}}` or `{"type": "json_schema", "schema": {...}}`;
    /// compact, without whitespace between tokens unless the schema's
    /// `x-guidance` options say otherwise), any JSON object (`{"type":
    /// "json_object"}`), text matching a regex (`{"type": "regex",
    /// "pattern": "..."}`) or text of a Lark grammar (`{"type": "grammar",
    /// "lark": "..."}`, llguidance's dialect); `{"type": "text"}` = free
    /// text. A constraint that cannot be compiled fails the submit with
    /// MLXRT_STATUS_INVALID_ARGUMENT and the compiler's message. The stream
    /// ends with a complete document (STOP, even with ignore_eos) or LENGTH;
    /// a stop string may still cut it. `tool_choice` (with `tools`):
    /// `"auto"` (default) and `"none"` leave the output free; `"required"`
    /// or `{"type": "function", "function": {"name": "..."}}` constrain it
    /// to one call, in the template's tool-call format, whose arguments are
    /// valid against that tool's `parameters` schema (finish reason
    /// TOOL_CALLS); a template without a tool-call format is
    /// MLXRT_STATUS_INVALID_ARGUMENT.
    pub options_json: *const c_char,
    /// Prompt positions per prefill forward pass; 0 = the engine's setting.
    pub prefill_chunk: u32,
    /// Prompt-cache namespace (UTF-8, NULL = the default ""): cached state is
    /// only shared between requests of the same namespace.
    pub cache_namespace: *const c_char,
    /// Non-zero: this request neither uses nor fills the prompt cache.
    pub no_prompt_cache: u8,
    /// Non-zero: DELTA events carry each token's log-probability ...
    pub logprobs: u8,
    /// ... and this many most likely alternatives (0..=20).
    pub top_logprobs: u32,
    /// For models with a thinking mode: 1 = think, 0 = do not (passed to the
    /// chat template as `enable_thinking`), -1 = the template's default.
    /// Reasoning text comes in DELTA events of `MLXRT_CHANNEL_REASONING`.
    pub thinking: i32,
    /// Prompt-cache session within `cache_namespace` (UTF-8, e.g. one
    /// conversation; NULL = none): cached state is only shared between
    /// requests of the same namespace and session.
    pub cache_session_id: *const c_char,
    /// Images and audio the messages reference by index: a content part
    /// `{"type": "image" | "audio", "media": K}` is `media[K]`. Every entry is read
    /// (decoded or converted into the engine's own buffer) before
    /// `mlxrt_request_submit` returns: the memory may be reused at once.
    /// An entry no part references is INVALID_ARGUMENT.
    pub media: *const mlxrt_media,
    pub n_media: usize,
}

/// `mlxrt_media.kind`: a picture.
pub const MLXRT_MEDIA_IMAGE: i32 = 1;
/// `mlxrt_media.kind`: a sound clip.
pub const MLXRT_MEDIA_AUDIO: i32 = 2;
/// `mlxrt_media.format`: `bytes` hold an encoded file (images: JPEG, PNG or
/// WebP; audio: WAV).
pub const MLXRT_MEDIA_ENCODED: i32 = 0;
/// `mlxrt_media.format`: 8-bit pixels, red first, 3 bytes each.
pub const MLXRT_PIXEL_RGB8: i32 = 1;
/// `mlxrt_media.format`: 8-bit pixels, red first, 4 bytes each (alpha
/// ignored).
pub const MLXRT_PIXEL_RGBA8: i32 = 2;
/// `mlxrt_media.format`: 8-bit pixels, blue first, 4 bytes each (alpha
/// ignored): Core Graphics' usual `kCGImageAlphaPremultipliedFirst |
/// kCGBitmapByteOrder32Little` layout.
pub const MLXRT_PIXEL_BGRA8: i32 = 3;
/// `mlxrt_media.format` (audio): mono `float` samples in -1..1, native
/// byte order, at `sample_rate` Hz (`n_bytes` a multiple of 4).
pub const MLXRT_AUDIO_F32: i32 = 4;

/// One image or audio clip of a request (`mlxrt_request_params.media`). Set
/// `struct_size` to `sizeof(mlxrt_media)`. Undecodable data, a buffer
/// smaller than `stride × (height - 1) + width × bytes per pixel`, more than
/// 50 million pixels or 64 MiB of data is INVALID_ARGUMENT. Audio is taken
/// at the model's rate (16 kHz for Gemma 4): another rate is UNSUPPORTED.
///
/// ```c
/// mlxrt_media m = {.struct_size = sizeof m, .kind = MLXRT_MEDIA_IMAGE,
///                  .format = MLXRT_PIXEL_BGRA8, .width = w, .height = h,
///                  .stride = bytes_per_row, .bytes = rows, .n_bytes = bytes_per_row * h};
/// p.messages_json = "[{\"role\": \"user\", \"content\": [{\"type\": \"image\", \"media\": 0},"
///                   " {\"type\": \"text\", \"text\": \"What is in this picture?\"}]}]";
/// p.media = &m;
/// p.n_media = 1;
/// ```
#[repr(C)]
#[derive(Clone, Copy)]
pub struct mlxrt_media {
    pub struct_size: usize,
    /// `MLXRT_MEDIA_IMAGE` or `MLXRT_MEDIA_AUDIO`.
    pub kind: i32,
    /// `MLXRT_MEDIA_ENCODED`, one of the `MLXRT_PIXEL_*` layouts (images) or
    /// `MLXRT_AUDIO_F32` (audio).
    pub format: i32,
    /// Pixels (raw layouts only; 0 for encoded data).
    pub width: u32,
    pub height: u32,
    /// Bytes from one row to the next; 0 = `width × bytes per pixel`.
    pub stride: usize,
    pub bytes: *const u8,
    pub n_bytes: usize,
    /// Samples per second (`MLXRT_AUDIO_F32` only).
    pub sample_rate: u32,
}

/// The first published layout of `mlxrt_media`: every field before
/// `sample_rate` (images only).
const MEDIA_V1_SIZE: usize = std::mem::offset_of!(mlxrt_media, sample_rate);

/// `params.media` as decoded images and audio.
fn media_from(p: &mlxrt_request_params) -> crate::Result<Vec<crate::media::parts::Buffer>> {
    use crate::media::{self, parts::Buffer, PixelFormat};
    let list = slice(p.media, p.n_media, "params.media")?;
    let limits = media::Limits::default();
    let mut out = Vec::with_capacity(list.len());
    for (k, m) in list.iter().enumerate() {
        let at = format!("params.media[{k}]");
        let full = m.struct_size >= size_of::<mlxrt_media>();
        if m.struct_size < MEDIA_V1_SIZE || (m.kind == MLXRT_MEDIA_AUDIO && !full) {
            return Err(Error::invalid(format!("{at}.struct_size is {}; set it to sizeof(mlxrt_media)", m.struct_size)));
        }
        let bytes = slice(m.bytes, m.n_bytes, &format!("{at}.bytes"))?;
        let buffer = match (m.kind, m.format) {
            (MLXRT_MEDIA_IMAGE, MLXRT_MEDIA_ENCODED) => media::decode(bytes, &limits).map(Buffer::Image),
            (MLXRT_MEDIA_IMAGE, f @ (MLXRT_PIXEL_RGB8 | MLXRT_PIXEL_RGBA8 | MLXRT_PIXEL_BGRA8)) => {
                let format = [PixelFormat::Rgb8, PixelFormat::Rgba8, PixelFormat::Bgra8][(f - MLXRT_PIXEL_RGB8) as usize];
                media::from_pixels(format, m.width as usize, m.height as usize, m.stride, bytes, &limits).map(Buffer::Image)
            }
            (MLXRT_MEDIA_AUDIO, MLXRT_MEDIA_ENCODED) => media::decode_wav(bytes, &limits).map(Buffer::Audio),
            (MLXRT_MEDIA_AUDIO, MLXRT_AUDIO_F32) => {
                if bytes.len() % 4 != 0 {
                    return Err(Error::invalid(format!("{at}: n_bytes {} is not a whole number of float samples", bytes.len())));
                }
                let samples: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]])).collect();
                media::from_samples(&samples, m.sample_rate, &limits).map(Buffer::Audio)
            }
            (MLXRT_MEDIA_IMAGE | MLXRT_MEDIA_AUDIO, other) => return Err(Error::invalid(format!("{at}: format {other} is not one for kind {}", m.kind))),
            (other, _) => return Err(Error::unsupported(format!("{at}: media kind {other} is not supported (MLXRT_MEDIA_IMAGE, MLXRT_MEDIA_AUDIO)"))),
        };
        out.push(buffer.map_err(|e| e.context(&at))?);
    }
    Ok(out)
}

/// The first published layout: every field up to `thinking`.
pub(crate) const PARAMS_V1_SIZE: usize = std::mem::offset_of!(mlxrt_request_params, cache_session_id);

pub(crate) fn default_params() -> mlxrt_request_params {
    let s = SamplingParams::default();
    mlxrt_request_params {
        struct_size: size_of::<mlxrt_request_params>(),
        messages_json: std::ptr::null(),
        prompt: std::ptr::null(),
        prompt_tokens: std::ptr::null(),
        n_prompt_tokens: 0,
        max_tokens: crate::engine::request::DEFAULT_MAX_TOKENS,
        temperature: s.temperature,
        top_p: s.top_p,
        top_k: s.top_k,
        min_p: s.min_p,
        repetition_penalty: s.repetition_penalty,
        repetition_context_size: s.repetition_context_size as u32,
        use_seed: 0,
        seed: 0,
        stop: std::ptr::null(),
        n_stop: 0,
        options_json: std::ptr::null(),
        prefill_chunk: 0,
        cache_namespace: std::ptr::null(),
        no_prompt_cache: 0,
        logprobs: 0,
        top_logprobs: 0,
        thinking: -1,
        cache_session_id: std::ptr::null(),
        media: std::ptr::null(),
        n_media: 0,
    }
}

/// Fills `params` with defaults (and its `struct_size`). NULL is a no-op.
#[no_mangle]
pub extern "C" fn mlxrt_request_params_init(params: *mut mlxrt_request_params) {
    guard_value((), || put(params, default_params()))
}

pub(crate) fn options_from(p: &mlxrt_request_params) -> crate::Result<RequestOptions> {
    let messages = opt_str(p.messages_json, "params.messages_json")?;
    let prompt = opt_str(p.prompt, "params.prompt")?;
    let tokens = slice(p.prompt_tokens, p.n_prompt_tokens, "params.prompt_tokens")?;
    let given = messages.is_some() as u8 + prompt.is_some() as u8 + (!tokens.is_empty()) as u8;
    if given != 1 {
        return Err(Error::invalid(
            "set exactly one of params.messages_json, params.prompt and params.prompt_tokens",
        ));
    }
    let input = if let Some(m) = messages {
        Input::Messages(json(m, "params.messages_json")?)
    } else if let Some(t) = prompt {
        Input::Prompt(t.to_owned())
    } else {
        Input::Tokens(tokens.to_vec())
    };
    let mut o = RequestOptions::new(input);
    o.max_tokens = p.max_tokens;
    o.sampling = SamplingParams {
        temperature: p.temperature,
        top_p: p.top_p,
        min_p: p.min_p,
        top_k: p.top_k,
        repetition_penalty: p.repetition_penalty,
        repetition_context_size: p.repetition_context_size as usize,
        seed: (p.use_seed != 0).then_some(p.seed),
    };
    o.prefill_chunk = (p.prefill_chunk > 0).then_some(p.prefill_chunk as usize);
    o.cache_namespace = opt_str(p.cache_namespace, "params.cache_namespace")?.unwrap_or_default().to_owned();
    o.cache_session_id = opt_str(p.cache_session_id, "params.cache_session_id")?.map(str::to_owned);
    o.prompt_cache = p.no_prompt_cache == 0;
    o.logprobs = p.logprobs != 0;
    o.top_logprobs = p.top_logprobs as usize;
    o.thinking = match p.thinking {
        -1 => None,
        0 => Some(false),
        1 => Some(true),
        other => return Err(Error::invalid(format!("params.thinking must be -1, 0 or 1, got {other}"))),
    };
    let stops = slice(p.stop, p.n_stop, "params.stop")?;
    o.stop = stops
        .iter()
        .enumerate()
        .map(|(i, &s)| req_str(s, &format!("params.stop[{i}]")).map(str::to_owned))
        .collect::<crate::Result<_>>()?;
    o.media = media_from(p)?;
    if let Some(options) = opt_str(p.options_json, "params.options_json")? {
        json_object(options, "params.options_json")?;
        o.apply_json(options)?;
    }
    Ok(o)
}

/// Submits a request. Validation, chat templating and tokenization happen
/// here, on the calling thread; generation happens on the engine's thread and
/// never blocks this call.
///
/// On success, events go to `callback(user_data, event)` on the engine's
/// delivery thread, `user_data_free(user_data)` (if not NULL) is called once
/// after the terminal event, and `*out_request` (if `out_request` is not
/// NULL) receives a handle to free with `mlxrt_request_free`. On failure
/// nothing is called, `user_data` stays the caller's, `*out_request` is NULL.
/// BUSY means too many requests are in flight; retry later.
#[no_mangle]
pub extern "C" fn mlxrt_request_submit(
    engine: *const mlxrt_engine,
    params: *const mlxrt_request_params,
    callback: mlxrt_event_fn,
    user_data: *mut c_void,
    user_data_free: mlxrt_free_fn,
    out_request: *mut *mut mlxrt_request,
    error: *mut *mut mlxrt_error,
) -> mlxrt_status {
    guard(error, || {
        clear(out_request);
        let engine = &reference(engine, "engine")?.engine;
        let callback = callback.ok_or_else(|| Error::invalid("callback is NULL"))?;
        let p = versioned(params, default_params(), PARAMS_V1_SIZE, "params")?;
        let prepared = engine.prepare(options_from(&p)?)?;
        let handle = engine.enqueue_with(prepared, |request_id| {
            Box::new(CallbackSink { callback, user_data, free: user_data_free, request_id })
        });
        put_box(out_request, mlxrt_request { handle });
        Ok(())
    })
}

/// Asks the engine to stop the request: while queued, between prefill chunks
/// or between decode steps. The request then ends with a DONE event whose
/// finish reason is CANCELLED (unless it had already finished), and no events
/// follow it. Idempotent; works after the engine is destroyed (no-op).
#[no_mangle]
pub extern "C" fn mlxrt_request_cancel(request: *const mlxrt_request, error: *mut *mut mlxrt_error) -> mlxrt_status {
    guard(error, || {
        reference(request, "request")?.handle.cancel();
        Ok(())
    })
}

/// The request's id (the `request_id` of its events); 0 for NULL.
#[no_mangle]
pub extern "C" fn mlxrt_request_id(request: *const mlxrt_request) -> u64 {
    guard_value(0, || reference(request, "request").map_or(0, |r| r.handle.id()))
}

/// Frees a request handle (does not cancel the request). NULL is a no-op.
#[no_mangle]
pub extern "C" fn mlxrt_request_free(request: *mut mlxrt_request) {
    guard_value((), || free_box(request))
}
