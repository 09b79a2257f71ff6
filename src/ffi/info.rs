//! What an engine can tell about its model, and its tokenizer and chat
//! template for callers that count or inspect tokens.

use super::args::{json, json_object, opt_str, reference, req_str, slice};
use super::engine::mlxrt_engine;
use super::error::{c_string, guard, guard_value, mlxrt_error, mlxrt_status};
use super::out::{clear, free_box, free_string, put_box, put_string, required, write_versioned};
use crate::engine::{Input, RequestOptions};
use crate::error::Error;
use std::ffi::{c_char, CString};
use std::mem::size_of;

/// `mlxrt_engine_info.modalities` bit: text input.
pub const MLXRT_MODALITY_TEXT: u32 = 1;

/// `mlxrt_engine_info.modalities` bit: image input (the model has a vision
/// tower; image parts and `mlxrt_media` entries work).
pub const MLXRT_MODALITY_IMAGE: u32 = 2;

/// `mlxrt_engine_info.modalities` bit: audio input (the model has an audio
/// tower; audio parts and `MLXRT_MEDIA_AUDIO` entries work).
pub const MLXRT_MODALITY_AUDIO: u32 = 4;

/// The modality bits of a model with `media` towers.
fn modalities(media: Option<&crate::media::MediaSpec>) -> u32 {
    let image = media.is_some_and(|m| m.image.is_some());
    let audio = media.is_some_and(|m| m.audio.is_some());
    MLXRT_MODALITY_TEXT | if image { MLXRT_MODALITY_IMAGE } else { 0 } | if audio { MLXRT_MODALITY_AUDIO } else { 0 }
}

/// Facts about an engine's model, filled by `mlxrt_engine_get_info`. Set
/// `struct_size` first; strings and arrays belong to the engine and stay
/// valid until it is destroyed.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct mlxrt_engine_info {
    pub struct_size: usize,
    /// Architecture name ("llama", ...).
    pub architecture: *const c_char,
    /// "gguf" or "mlx-folder".
    pub model_format: *const c_char,
    /// "cpu" or "gpu".
    pub device: *const c_char,
    /// The MLX version the library runs on.
    pub mlx_version: *const c_char,
    /// Maximum sequence length (prompt + generated); 0 if unknown.
    pub context_length: u64,
    pub vocab_size: u32,
    pub num_layers: u32,
    pub hidden_size: u32,
    pub parameter_bytes: u64,
    /// Beginning-of-sequence token id, or -1.
    pub bos_token_id: i64,
    /// Ids that end generation.
    pub eos_token_ids: *const u32,
    pub n_eos_token_ids: usize,
    /// Ids of special tokens (control tokens such as `<|im_start|>`).
    pub special_token_ids: *const u32,
    pub n_special_token_ids: usize,
    /// Non-zero when the model has a chat template (messages_json works).
    pub has_chat_template: u8,
    /// Non-zero when the chat template renders tools.
    pub supports_tools: u8,
    /// Non-zero when the chat template has a thinking/reasoning mode.
    pub supports_reasoning: u8,
    /// `MLXRT_MODALITY_*` bits of accepted inputs.
    pub modalities: u32,
    /// How full-attention layers store KV: "none" (dense), "affine:b4:g64"
    /// (bits, group size), ...
    pub kv_scheme: *const c_char,
}

/// Strings and arrays the info points into, built once per engine.
pub(crate) struct InfoStore {
    architecture: CString,
    format: CString,
    device: CString,
    mlx_version: CString,
    kv_scheme: CString,
    eos: Vec<u32>,
    special: Vec<u32>,
}

impl InfoStore {
    pub fn new(e: &crate::engine::Engine) -> InfoStore {
        let i = e.info();
        InfoStore {
            architecture: c_string(&i.architecture),
            format: c_string(&i.format),
            device: c_string(&i.device),
            mlx_version: c_string(&crate::mlx::version()),
            kv_scheme: c_string(&i.kv_scheme),
            eos: e.text().eos_ids.clone(),
            special: e.text().tokenizer.special_ids().to_vec(),
        }
    }
}

/// Writes the engine's model facts to `*out` (its first `out->struct_size`
/// bytes).
#[no_mangle]
pub extern "C" fn mlxrt_engine_get_info(
    engine: *const mlxrt_engine,
    out: *mut mlxrt_engine_info,
    error: *mut *mut mlxrt_error,
) -> mlxrt_status {
    guard(error, || {
        let h = reference(engine, "engine")?;
        let (e, s) = (&h.engine, &h.info);
        let i = e.info();
        let template = e.text().template.as_ref().map(|t| t.source()).unwrap_or("");
        let info = mlxrt_engine_info {
            struct_size: size_of::<mlxrt_engine_info>(),
            architecture: s.architecture.as_ptr(),
            model_format: s.format.as_ptr(),
            device: s.device.as_ptr(),
            mlx_version: s.mlx_version.as_ptr(),
            context_length: i.context_length.max(0) as u64,
            vocab_size: i.vocab_size as u32,
            num_layers: i.num_layers as u32,
            hidden_size: i.hidden_size as u32,
            parameter_bytes: e.parameter_bytes() as u64,
            bos_token_id: e.text().tokenizer.bos_id().map_or(-1, i64::from),
            eos_token_ids: s.eos.as_ptr(),
            n_eos_token_ids: s.eos.len(),
            special_token_ids: s.special.as_ptr(),
            n_special_token_ids: s.special.len(),
            has_chat_template: e.text().template.is_some() as u8,
            supports_tools: template.contains("tools") as u8,
            supports_reasoning: (template.contains("<think>") || template.contains("enable_thinking")) as u8,
            modalities: modalities(e.text().media.as_deref()),
            kv_scheme: s.kv_scheme.as_ptr(),
        };
        write_versioned(out, info, "out")
    })
}

/// Token ids owned by the library; read with `mlxrt_tokens_data` and
/// `mlxrt_tokens_len`, free with `mlxrt_tokens_free`.
pub struct mlxrt_tokens {
    ids: Vec<u32>,
}

/// The ids (valid until the tokens are freed); NULL for NULL or none.
#[no_mangle]
pub extern "C" fn mlxrt_tokens_data(tokens: *const mlxrt_tokens) -> *const u32 {
    guard_value(std::ptr::null(), || {
        reference(tokens, "tokens").ok().filter(|t| !t.ids.is_empty()).map_or(std::ptr::null(), |t| t.ids.as_ptr())
    })
}

/// How many ids; 0 for NULL.
#[no_mangle]
pub extern "C" fn mlxrt_tokens_len(tokens: *const mlxrt_tokens) -> usize {
    guard_value(0, || reference(tokens, "tokens").map_or(0, |t| t.ids.len()))
}

/// Frees token ids. NULL is a no-op.
#[no_mangle]
pub extern "C" fn mlxrt_tokens_free(tokens: *mut mlxrt_tokens) {
    guard_value((), || free_box(tokens))
}

/// Frees a string returned by the library (never with `free()`). NULL is a
/// no-op.
#[no_mangle]
pub extern "C" fn mlxrt_string_free(s: *mut c_char) {
    guard_value((), || free_string(s))
}

/// Tokenizes UTF-8 `text` with the model's tokenizer. With `parse_special`
/// non-zero, special-token text such as `<|im_start|>` becomes its id. No
/// BOS is added. `*out_tokens` receives ids to free with `mlxrt_tokens_free`.
#[no_mangle]
pub extern "C" fn mlxrt_tokenize(
    engine: *const mlxrt_engine,
    text: *const c_char,
    parse_special: u8,
    out_tokens: *mut *mut mlxrt_tokens,
    error: *mut *mut mlxrt_error,
) -> mlxrt_status {
    guard(error, || {
        required(out_tokens, "out_tokens")?;
        let e = &reference(engine, "engine")?.engine;
        let text = req_str(text, "text")?;
        put_box(out_tokens, mlxrt_tokens { ids: e.text().tokenizer.encode(text, parse_special != 0)? });
        Ok(())
    })
}

/// Turns token ids back into UTF-8 text (bytes that are not valid UTF-8
/// become U+FFFD). With `skip_special` non-zero, special tokens produce no
/// text. `*out_text` receives a string to free with `mlxrt_string_free`.
#[no_mangle]
pub extern "C" fn mlxrt_detokenize(
    engine: *const mlxrt_engine,
    ids: *const u32,
    n_ids: usize,
    skip_special: u8,
    out_text: *mut *mut c_char,
    error: *mut *mut mlxrt_error,
) -> mlxrt_status {
    guard(error, || {
        required(out_text, "out_text")?;
        let e = &reference(engine, "engine")?.engine;
        let ids = slice(ids, n_ids, "ids")?;
        put_string(out_text, &e.text().tokenizer.decode(ids, skip_special != 0)?);
        Ok(())
    })
}

/// Renders chat messages (a JSON array, as `messages_json` of a request)
/// with the model's chat template. `options_json` (optional) may set
/// `tools`, `chat_template_kwargs` and `add_generation_prompt` (default
/// true). `*out_text` (if not NULL) receives the prompt text (free with
/// `mlxrt_string_free`), `*out_tokens` (if not NULL) its token ids — exactly
/// what a request with these messages would process.
#[no_mangle]
pub extern "C" fn mlxrt_render_chat(
    engine: *const mlxrt_engine,
    messages_json: *const c_char,
    options_json: *const c_char,
    out_text: *mut *mut c_char,
    out_tokens: *mut *mut mlxrt_tokens,
    error: *mut *mut mlxrt_error,
) -> mlxrt_status {
    guard(error, || {
        clear(out_text);
        clear(out_tokens);
        let e = &reference(engine, "engine")?.engine;
        let messages = json(req_str(messages_json, "messages_json")?, "messages_json")?;
        let mut add_generation_prompt = true;
        let mut o = RequestOptions::new(Input::Messages(messages.clone()));
        if let Some(options) = opt_str(options_json, "options_json")? {
            let mut obj = json_object(options, "options_json")?;
            if let Some(g) = obj.remove("add_generation_prompt") {
                add_generation_prompt =
                    g.as_bool().ok_or_else(|| Error::invalid("add_generation_prompt must be a boolean"))?;
            }
            o.apply_json(&serde_json::Value::Object(obj).to_string())?;
        }
        let template = e.text().template.as_ref().ok_or_else(|| Error::invalid("the model has no chat template"))?;
        let text = template.render(&messages, o.tools.as_ref(), add_generation_prompt, o.template_kwargs.as_ref())?;
        if !out_tokens.is_null() {
            put_box(out_tokens, mlxrt_tokens { ids: e.text().tokenizer.encode(&text, true)? });
        }
        put_string(out_text, &text);
        Ok(())
    })
}
