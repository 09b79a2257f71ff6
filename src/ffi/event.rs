//! Events as C sees them: the `mlxrt_event` struct and the buffers it points
//! into, shared by callback delivery and pull streams.

use super::error::{c_string, mlxrt_status};
use crate::engine::{Channel, Event, EventSink, FinishReason, Usage};
use std::ffi::{c_char, c_void, CString};
use std::mem::size_of;

/// `mlxrt_event.kind`.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum mlxrt_event_kind {
    /// New output text (complete UTF-8) and its token ids.
    Delta = 1,
    /// The request finished (terminal); see `finish_reason` and `usage`.
    Done = 2,
    /// The request failed (terminal); see `error_status`, `error_message`.
    Error = 3,
    /// The model called a tool (not terminal); see `tool_call_id`,
    /// `tool_name`, `tool_arguments`.
    ToolCall = 4,
}

/// `mlxrt_event.finish_reason` for DONE events.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum mlxrt_finish_reason {
    /// Not a DONE event.
    None = 0,
    /// An end-of-sequence token or a stop string (`stop_index` says which).
    Stop = 1,
    /// `max_tokens` or the model's context length was reached.
    Length = 2,
    /// The request was cancelled.
    Cancelled = 3,
    /// The model ended its turn after calling tools (TOOL_CALL events).
    ToolCalls = 4,
}

/// `mlxrt_event.channel` of DELTA events: the answer.
pub const MLXRT_CHANNEL_CONTENT: i32 = 0;
/// `mlxrt_event.channel` of DELTA events: the model's reasoning (think block).
pub const MLXRT_CHANNEL_REASONING: i32 = 1;

/// Token counts and timings of a finished request.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct mlxrt_usage {
    pub prompt_tokens: u32,
    /// Prompt tokens served from a cache: the prompt cache, or (paged KV) a
    /// concurrent request's shared prefix blocks.
    pub cached_tokens: u32,
    /// Generated tokens, counting the end-of-sequence token that ended the
    /// request (see `mlxrt_event.tokens`).
    pub completion_tokens: u32,
    /// Submission to first generated token, in milliseconds.
    pub ttft_ms: f64,
    /// Prompt processing time, in milliseconds.
    pub prefill_ms: f64,
    /// First to last generated token, in milliseconds.
    pub decode_ms: f64,
    pub prefill_tokens_per_s: f64,
    pub decode_tokens_per_s: f64,
}

/// One event of a request. Passed to the callback by pointer; it and every
/// pointer in it are valid only during the callback (copy what you keep).
#[repr(C)]
pub struct mlxrt_event {
    /// `sizeof(mlxrt_event)` of the library that made it.
    pub struct_size: usize,
    pub kind: mlxrt_event_kind,
    pub request_id: u64,
    /// DELTA: NUL-terminated UTF-8, never a partial character; empty when the
    /// delta only reports ids of tokens that make no text. Else "".
    pub text: *const c_char,
    /// Length of `text` in bytes (without the NUL).
    pub text_len: usize,
    /// DELTA: ids of the tokens this text came from. Tokens that make no
    /// text at the end (special tokens, and the end-of-sequence token that
    /// ended the request, with its log-probability) come in a last DELTA with
    /// empty text, so unless a stop string matched the DELTAs of a request
    /// report exactly `usage.completion_tokens` ids. Else NULL.
    pub tokens: *const u32,
    pub n_tokens: usize,
    /// DONE: why the request ended.
    pub finish_reason: mlxrt_finish_reason,
    /// DONE with a stop string: its index in the request's stop list; else -1.
    pub stop_index: i32,
    /// DONE: counts and timings.
    pub usage: mlxrt_usage,
    /// ERROR: the status; else OK.
    pub error_status: mlxrt_status,
    /// ERROR: NUL-terminated UTF-8 message; else "".
    pub error_message: *const c_char,
    /// DELTA of a request that asked for log-probabilities: one entry per
    /// token of `tokens`, in order. Else NULL.
    pub logprobs: *const mlxrt_token_logprob,
    pub n_logprobs: usize,
    /// DELTA: `MLXRT_CHANNEL_CONTENT` or `MLXRT_CHANNEL_REASONING`.
    pub channel: i32,
    /// TOOL_CALL: an id unique in the engine, the tool's name and its
    /// arguments as a JSON object (NUL-terminated UTF-8). Else "".
    pub tool_call_id: *const c_char,
    pub tool_name: *const c_char,
    pub tool_arguments: *const c_char,
    /// DONE: speculative decoding's counts (`speculation` in
    /// `options_json`): drafted tokens, how many the model accepted (never
    /// more; each is one of `usage.completion_tokens`), and verify steps
    /// run. 0 without speculation.
    pub spec_proposed: u32,
    pub spec_accepted: u32,
    pub spec_verify_steps: u32,
}

/// Receives a request's events, on the engine's delivery thread (never inside
/// a call into mlxrt, never on the caller's thread). Events of one request
/// arrive in order: DELTA and TOOL_CALL events as the model produces them,
/// then exactly one DONE or ERROR. A callback may
/// call any mlxrt function, including cancel and engine destroy.
pub type mlxrt_event_fn = Option<unsafe extern "C" fn(user_data: *mut c_void, event: *const mlxrt_event)>;

/// Frees `user_data`; called exactly once, after the terminal event.
pub type mlxrt_free_fn = Option<unsafe extern "C" fn(user_data: *mut c_void)>;


/// One alternative token and its log-probability.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mlxrt_top_logprob {
    pub token: u32,
    pub logprob: f32,
}

/// A generated token's log-probability (natural log, over the model's
/// distribution before temperature and sampling filters) and, if asked
/// for, the most likely alternatives, most likely first.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mlxrt_token_logprob {
    pub token: u32,
    pub logprob: f32,
    pub top: *const mlxrt_top_logprob,
    pub n_top: usize,
}

/// An `mlxrt_event` with the buffers it points into; moving it keeps the
/// pointers valid (they point to heap data it owns).
pub(crate) struct OwnedEvent {
    pub event: mlxrt_event,
    _text: CString,
    _message: CString,
    _tool: [CString; 3],
    _tokens: Vec<u32>,
    _logprobs: Vec<mlxrt_token_logprob>,
    _tops: Vec<Vec<mlxrt_top_logprob>>,
}

// SAFETY: the raw pointers in `event` point only into the owned buffers.
unsafe impl Send for OwnedEvent {}

impl OwnedEvent {
    pub fn new(ev: &Event, request_id: u64) -> OwnedEvent {
        let mut text = CString::default();
        let mut message = CString::default();
        let mut tool: [CString; 3] = Default::default();
        let mut tokens = vec![];
        let mut tops: Vec<Vec<mlxrt_top_logprob>> = vec![];
        let mut logprobs: Vec<mlxrt_token_logprob> = vec![];
        let mut e = mlxrt_event {
            struct_size: size_of::<mlxrt_event>(),
            kind: mlxrt_event_kind::Delta,
            request_id,
            text: std::ptr::null(),
            text_len: 0,
            tokens: std::ptr::null(),
            n_tokens: 0,
            finish_reason: mlxrt_finish_reason::None,
            stop_index: -1,
            usage: mlxrt_usage::default(),
            error_status: mlxrt_status::Ok,
            error_message: std::ptr::null(),
            logprobs: std::ptr::null(),
            n_logprobs: 0,
            channel: MLXRT_CHANNEL_CONTENT,
            tool_call_id: std::ptr::null(),
            tool_name: std::ptr::null(),
            tool_arguments: std::ptr::null(),
            spec_proposed: 0,
            spec_accepted: 0,
            spec_verify_steps: 0,
        };
        match ev {
            Event::Delta { text: t, tokens: ids, logprobs: lps, channel } => {
                text = c_string(t);
                e.channel = match channel {
                    Channel::Content => MLXRT_CHANNEL_CONTENT,
                    Channel::Reasoning => MLXRT_CHANNEL_REASONING,
                };
                tokens = ids.clone();
                tops = lps
                    .iter()
                    .map(|l| l.top.iter().map(|&(token, logprob)| mlxrt_top_logprob { token, logprob }).collect())
                    .collect();
                logprobs = lps
                    .iter()
                    .zip(&tops)
                    .map(|(l, t)| mlxrt_token_logprob {
                        token: l.token,
                        logprob: l.logprob,
                        top: if t.is_empty() { std::ptr::null() } else { t.as_ptr() },
                        n_top: t.len(),
                    })
                    .collect();
            }
            Event::ToolCall { id, name, arguments } => {
                e.kind = mlxrt_event_kind::ToolCall;
                tool = [c_string(id), c_string(name), c_string(arguments)];
            }
            Event::Done { finish, stop_index, usage } => {
                e.kind = mlxrt_event_kind::Done;
                e.finish_reason = match finish {
                    FinishReason::Stop => mlxrt_finish_reason::Stop,
                    FinishReason::ToolCalls => mlxrt_finish_reason::ToolCalls,
                    FinishReason::Length => mlxrt_finish_reason::Length,
                    FinishReason::Cancelled => mlxrt_finish_reason::Cancelled,
                };
                e.stop_index = stop_index.map_or(-1, |i| i as i32);
                e.usage = usage_c(usage);
                (e.spec_proposed, e.spec_accepted, e.spec_verify_steps) =
                    (usage.spec_proposed, usage.spec_accepted, usage.spec_verify_steps);
            }
            Event::Error(err) => {
                e.kind = mlxrt_event_kind::Error;
                e.error_status = err.kind.into();
                message = c_string(&err.message);
            }
        }
        e.text = text.as_ptr();
        e.text_len = text.as_bytes().len();
        e.error_message = message.as_ptr();
        e.tool_call_id = tool[0].as_ptr();
        e.tool_name = tool[1].as_ptr();
        e.tool_arguments = tool[2].as_ptr();
        if !tokens.is_empty() {
            e.tokens = tokens.as_ptr();
            e.n_tokens = tokens.len();
        }
        if !logprobs.is_empty() {
            e.logprobs = logprobs.as_ptr();
            e.n_logprobs = logprobs.len();
        }
        OwnedEvent { event: e, _text: text, _message: message, _tool: tool, _tokens: tokens, _logprobs: logprobs, _tops: tops }
    }
}

/// Forwards events to a C callback; frees `user_data` when dropped (right
/// after the terminal event).
pub(crate) struct CallbackSink {
    pub callback: unsafe extern "C" fn(*mut c_void, *const mlxrt_event),
    pub user_data: *mut c_void,
    pub free: mlxrt_free_fn,
    pub request_id: u64,
}

// SAFETY: the C contract makes the callback and user_data usable from the
// engine's delivery thread (documented on `mlxrt_request_submit`).
unsafe impl Send for CallbackSink {}

impl Drop for CallbackSink {
    fn drop(&mut self) {
        if let Some(free) = self.free {
            // SAFETY: called once, as the contract promises.
            unsafe { free(self.user_data) };
        }
    }
}

fn usage_c(u: &Usage) -> mlxrt_usage {
    mlxrt_usage {
        prompt_tokens: u.prompt_tokens,
        cached_tokens: u.cached_tokens,
        completion_tokens: u.completion_tokens,
        ttft_ms: u.ttft_ms,
        prefill_ms: u.prefill_ms,
        decode_ms: u.decode_ms,
        prefill_tokens_per_s: u.prefill_tokens_per_s,
        decode_tokens_per_s: u.decode_tokens_per_s,
    }
}


impl EventSink for CallbackSink {
    fn deliver(&mut self, event: &Event) {
        let owned = OwnedEvent::new(event, self.request_id);
        // SAFETY: the callback was given by the caller for exactly this use.
        unsafe { (self.callback)(self.user_data, &owned.event) };
    }
}
