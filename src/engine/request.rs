//! What a request is, before and after preparation, and the events it yields.

use crate::error::{Error, Result};
use super::delivery::Outlet;
use super::logprobs::{TokenLogprob, MAX_TOP};
use crate::grammar::{Constraint, ResponseFormat, ToolChoice};
use super::spec::Speculation;
use crate::sample::SamplingParams;
use crate::text::OutputFormat;
use serde_json::{Map, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The input of a request.
#[derive(Debug, Clone)]
pub enum Input {
    /// Chat messages (`[{"role": ..., "content": ...}, ...]`), rendered with
    /// the model's chat template with the generation prompt appended.
    Messages(Value),
    /// Raw prompt text, tokenized as is (special-token text is parsed).
    Prompt(String),
    /// Prompt token ids, used as is.
    Tokens(Vec<u32>),
}

/// Everything a caller can ask of one request.
#[derive(Debug, Clone)]
pub struct RequestOptions {
    pub input: Input,
    pub sampling: SamplingParams,
    /// Maximum number of generated tokens.
    pub max_tokens: u32,
    /// Strings that end generation when they appear in the decoded text; the
    /// matched string and anything after it are not emitted.
    pub stop: Vec<String>,
    /// Tool definitions passed to the chat template as `tools`.
    pub tools: Option<Value>,
    /// Extra variables for the chat template (e.g. `enable_thinking`).
    pub template_kwargs: Option<Map<String, Value>>,
    /// Stop at the model's end-of-sequence tokens (default true).
    pub stop_at_eos: bool,
    /// Prompt positions per prefill forward pass (None = the engine's).
    pub prefill_chunk: Option<usize>,
    /// Prompt-cache namespace: requests only share cached state with
    /// requests of the same namespace (e.g. one per user or tenant).
    pub cache_namespace: String,
    /// Prompt-cache session within the namespace (e.g. one conversation):
    /// a request with a session shares cached state only with requests of
    /// the same namespace and session; None = the namespace's shared state.
    pub cache_session_id: Option<String>,
    /// Whether this request may use and fill the prompt cache (default true).
    pub prompt_cache: bool,
    /// Report each generated token's log-probability ...
    pub logprobs: bool,
    /// ... and this many most likely alternatives (at most 20).
    pub top_logprobs: usize,
    /// For models with a thinking mode: whether to think (passed to the
    /// chat template as `enable_thinking`; None = the template's default).
    pub thinking: Option<bool>,
    /// Position from which this request's KV cache is quantized, when the
    /// engine quantizes KV (None = the engine's `quantized_kv_start`).
    pub quantized_kv_start: Option<i32>,
    /// Structured output: the shape the output must have (None = free text).
    pub response_format: Option<ResponseFormat>,
    /// Speculative decoding (None = the engine's `speculation`).
    pub speculation: Option<Speculation>,
    /// Decoded images and audio the messages reference as `{"type":
    /// "image" | "audio", "media": K}` (the C ABI's `mlxrt_media` array,
    /// copied at submit).
    pub media: Vec<crate::media::parts::Buffer>,
    /// Whether the model must call a tool (`Required`, `Named`: the output
    /// is then one call with arguments valid against the tool's schema).
    pub tool_choice: ToolChoice,
}

pub(crate) const DEFAULT_MAX_TOKENS: u32 = 256;

impl RequestOptions {
    pub fn new(input: Input) -> RequestOptions {
        RequestOptions {
            input,
            sampling: SamplingParams::default(),
            max_tokens: DEFAULT_MAX_TOKENS,
            stop: vec![],
            tools: None,
            template_kwargs: None,
            stop_at_eos: true,
            prefill_chunk: None,
            cache_namespace: String::new(),
            cache_session_id: None,
            prompt_cache: true,
            logprobs: false,
            top_logprobs: 0,
            thinking: None,
            quantized_kv_start: None,
            response_format: None,
            speculation: None,
            media: vec![],
            tool_choice: ToolChoice::Auto,
        }
    }

    /// Applies OpenAI-style fields from a JSON object (`max_tokens`,
    /// `temperature`, `top_p`, `top_k`, `min_p`, `repetition_penalty`,
    /// `repetition_context_size`, `seed`, `stop`, `tools`,
    /// `chat_template_kwargs`, `ignore_eos`, `prefill_chunk`, `cache_namespace`,
    /// `cache_session_id`, `prompt_cache`, `logprobs`, `top_logprobs`, `thinking`,
    /// `quantized_kv_start`, `response_format`, `speculation`, `tool_choice`). Unknown fields are an error so a
    /// typo never silently does nothing.
    pub fn apply_json(&mut self, json: &str) -> Result<()> {
        let v: Value = serde_json::from_str(json).map_err(|e| Error::new(crate::ErrorKind::InvalidJson, format!("options: {e}")))?;
        let Value::Object(obj) = v else {
            return Err(Error::new(crate::ErrorKind::InvalidJson, "options must be a JSON object"));
        };
        for (k, v) in obj {
            let num = || v.as_f64().ok_or_else(|| Error::invalid(format!("option `{k}` must be a number")));
            let int = || {
                v.as_u64()
                    .ok_or_else(|| Error::invalid(format!("option `{k}` must be a non-negative integer")))
            };
            match k.as_str() {
                "max_tokens" | "max_completion_tokens" => {
                    self.max_tokens = u32::try_from(int()?).map_err(|_| Error::invalid("max_tokens is too large"))?
                }
                "temperature" => self.sampling.temperature = num()? as f32,
                "top_p" => self.sampling.top_p = num()? as f32,
                "top_k" => self.sampling.top_k = i32::try_from(int()?).map_err(|_| Error::invalid("top_k is too large"))?,
                "min_p" => self.sampling.min_p = num()? as f32,
                "repetition_penalty" => self.sampling.repetition_penalty = num()? as f32,
                "repetition_context_size" => self.sampling.repetition_context_size = int()? as usize,
                "seed" => self.sampling.seed = if v.is_null() { None } else { Some(int()?) },
                "stop" => {
                    self.stop = match &v {
                        Value::Null => vec![],
                        Value::String(s) => vec![s.clone()],
                        Value::Array(a) => a
                            .iter()
                            .map(|s| s.as_str().map(str::to_owned))
                            .collect::<Option<Vec<_>>>()
                            .ok_or_else(|| Error::invalid("option `stop` must be a string or an array of strings"))?,
                        _ => return Err(Error::invalid("option `stop` must be a string or an array of strings")),
                    }
                }
                "tools" => self.tools = (!v.is_null()).then_some(v),
                "chat_template_kwargs" => match v {
                    Value::Object(m) => self.template_kwargs = Some(m),
                    Value::Null => self.template_kwargs = None,
                    _ => return Err(Error::invalid("option `chat_template_kwargs` must be an object")),
                },
                "prefill_chunk" => {
                    let n = int()? as usize;
                    self.prefill_chunk = (n > 0).then_some(n);
                }
                "cache_namespace" => {
                    self.cache_namespace =
                        v.as_str().ok_or_else(|| Error::invalid("option `cache_namespace` must be a string"))?.to_owned()
                }
                "cache_session_id" => {
                    self.cache_session_id = match &v {
                        Value::Null => None,
                        Value::String(s) => Some(s.clone()),
                        _ => return Err(Error::invalid("option `cache_session_id` must be a string or null")),
                    }
                }
                "prompt_cache" => {
                    self.prompt_cache = v.as_bool().ok_or_else(|| Error::invalid("option `prompt_cache` must be a boolean"))?
                }
                "logprobs" => self.logprobs = v.as_bool().ok_or_else(|| Error::invalid("option `logprobs` must be a boolean"))?,
                "top_logprobs" => self.top_logprobs = int()? as usize,
                "thinking" => {
                    self.thinking = if v.is_null() {
                        None
                    } else {
                        Some(v.as_bool().ok_or_else(|| Error::invalid("option `thinking` must be a boolean"))?)
                    }
                }
                "quantized_kv_start" => {
                    self.quantized_kv_start = if v.is_null() {
                        None
                    } else {
                        Some(i32::try_from(int()?).map_err(|_| Error::invalid("quantized_kv_start is too large"))?)
                    }
                }
                "response_format" => self.response_format = ResponseFormat::from_json(&v)?,
                "speculation" => self.speculation = if v.is_null() { None } else { Some(Speculation::from_json(&v)?) },
                "tool_choice" => self.tool_choice = ToolChoice::from_json(&v)?,
                "ignore_eos" => {
                    self.stop_at_eos = !v.as_bool().ok_or_else(|| Error::invalid("option `ignore_eos` must be a boolean"))?
                }
                other => {
                    return Err(Error::invalid(format!(
                        "unknown option `{other}` (known: max_tokens, temperature, top_p, top_k, min_p, \
                         repetition_penalty, repetition_context_size, seed, stop, tools, chat_template_kwargs, ignore_eos, \
                         prefill_chunk, cache_namespace, cache_session_id, prompt_cache, logprobs, top_logprobs, thinking, \
                         quantized_kv_start, response_format, speculation, tool_choice)"
                    )))
                }
            }
        }
        Ok(())
    }

    pub fn validate(&self) -> Result<()> {
        self.sampling.validate()?;
        if self.max_tokens == 0 {
            return Err(Error::invalid("max_tokens must be at least 1"));
        }
        if self.stop.iter().any(String::is_empty) {
            return Err(Error::invalid("stop strings must not be empty"));
        }
        if self.top_logprobs > MAX_TOP {
            return Err(Error::invalid(format!("top_logprobs must be at most {MAX_TOP}, got {}", self.top_logprobs)));
        }
        Ok(())
    }
}

/// Why a request ended normally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// The model ended its turn after calling tools.
    ToolCalls,
    /// `max_tokens` or the context length was reached.
    Length,
    /// The request was cancelled.
    Cancelled,
}

/// Which part of the output a text delta belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// The answer.
    Content,
    /// The model's reasoning (a think block).
    Reasoning,
}

/// Token counts and timings of a finished request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    pub prompt_tokens: u32,
    /// Prompt tokens whose KV state came from a cache (the prompt cache, or,
    /// with paged KV, a concurrent request's shared prefix blocks).
    pub cached_tokens: u32,
    /// Generated tokens, counting the end-of-sequence token that ended the
    /// request (reported in the last delta).
    pub completion_tokens: u32,
    /// Submission to first generated token.
    pub ttft_ms: f64,
    /// Start of prompt processing to first generated token.
    pub prefill_ms: f64,
    /// First to last generated token.
    pub decode_ms: f64,
    pub prefill_tokens_per_s: f64,
    pub decode_tokens_per_s: f64,
    /// Speculative decoding: drafted tokens, how many of them the model
    /// accepted and the request emitted (never more: drafts after an end
    /// inside a run are not counted), and verify steps run (0 without
    /// speculation).
    pub spec_proposed: u32,
    pub spec_accepted: u32,
    pub spec_verify_steps: u32,
}

/// What a request yields, in order: any number of `Delta`s, then exactly one
/// terminal event (`Done` or `Error`).
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// New output: complete UTF-8 text and the token ids it came from. Ids of
    /// tokens whose text is withheld (a partial character, a possible stop
    /// string) come with a later delta; tokens that make no text at the end
    /// (special tokens, and the end-of-sequence token that ended the request)
    /// come in a last delta with empty text. So, unless a stop string matched,
    /// the deltas report exactly `usage.completion_tokens` ids. `logprobs` has
    /// one entry per token when the request asked for them, else none.
    Delta { text: String, tokens: Vec<u32>, logprobs: Vec<TokenLogprob>, channel: Channel },
    /// The model called a tool: an id unique in the engine, the tool's name
    /// and its arguments (a JSON object as text). Not terminal.
    ToolCall { id: String, name: String, arguments: String },
    Done { finish: FinishReason, stop_index: Option<usize>, usage: Usage },
    Error(Error),
}

impl Event {
    /// `Done` and `Error` end a request; deltas and tool calls do not.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Event::Done { .. } | Event::Error(_))
    }
}

/// Receives a request's events on the engine's delivery thread. Dropped right
/// after the terminal event.
pub trait EventSink: Send {
    fn deliver(&mut self, event: &Event);
}

impl<F: FnMut(&Event) + Send> EventSink for F {
    fn deliver(&mut self, event: &Event) {
        self(event)
    }
}

/// One request as the engine runs it, built once by `Engine::prepare` from
/// its `RequestOptions` (the prompt rendered and tokenized there) and shared
/// by `Arc` between the host's handle, the queued job and the row that
/// generates it. Nothing in it changes but the cancel flag.
#[derive(Debug)]
pub(crate) struct RequestSpec {
    pub id: u64,
    /// Set by the host's cancel; read by the scheduler.
    pub cancelled: AtomicBool,
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    pub max_tokens: u32,
    pub stop: Vec<String>,
    pub stop_at_eos: bool,
    /// Prompt positions per prefill forward pass (None = the engine's).
    pub prefill_chunk: Option<usize>,
    /// The most positions its cache can hold (prompt + max_tokens, capped at
    /// the context length): its KV cache is allocated for them up front.
    pub reach: usize,
    /// KV bytes reserved while it runs.
    pub kv_need: usize,
    /// Position from which its KV cache is quantized (quantized schemes).
    pub kv_start: i32,
    /// Prompt cache: namespace, whether to use it, and the prompt length at
    /// the stable boundary worth a snapshot (the conversation before its
    /// last message).
    pub namespace: String,
    pub use_cache: bool,
    pub boundary: Option<usize>,
    /// Log-probabilities wanted: None, or Some(number of alternatives).
    pub logprobs: Option<usize>,
    /// How to split the output into content, reasoning and tool calls.
    pub output_format: OutputFormat,
    /// Speculative decoding (the engine's default resolved).
    pub speculation: Speculation,
    /// When `prepare` began (time to first token counts from here).
    pub submitted: Instant,
    /// The prompt's images (their soft tokens are in `prompt`): the row
    /// prefills alone, in one forward (`Cohort::advance`).
    pub media: Option<Arc<crate::media::MediaPrompt>>,
    /// For a media prompt, its prompt-cache key (`MediaPrompt::key`): the
    /// prompt with each image soft token replaced by an id derived from the
    /// image's content hash and the token's place in the image.
    pub cache_key: Option<Vec<u32>>,
}

impl RequestSpec {
    /// What the prompt cache keys this prompt by.
    pub fn key(&self) -> &[u32] {
        self.cache_key.as_deref().unwrap_or(&self.prompt)
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }
}

/// A request on its way to the scheduler: what it is and where its events go.
pub(crate) struct Job {
    pub spec: Arc<RequestSpec>,
    pub outlet: Outlet,
    /// The compiled `response_format` (its matcher changes as the row
    /// generates, so it lives beside the immutable spec).
    pub constraint: Option<Constraint>,
}
