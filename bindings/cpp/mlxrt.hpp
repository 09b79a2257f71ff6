// mlxrt.hpp — header-only C++17 wrapper over the mlxrt C API (mlxrt.h).
//
//   mlxrt::Engine engine(mlxrt::EngineConfig("model.gguf"));
//   auto request = engine.submit(
//       mlxrt::RequestParams().user("Hi!").max_tokens(64),
//       [](const mlxrt::Event &ev) { std::cout << ev.text(); });
//
// - Engine and Request own their C handles and are move-only.
// - Failures throw mlxrt::Error, which carries the mlxrt_status and message.
// - Event handlers are std::function objects. They run on the engine's
//   delivery thread (never inside a call into mlxrt); the wrapper owns the
//   function object and destroys it after the request's terminal event
//   (through user_data_free). A handler must not throw: the trampoline is
//   noexcept, so an escaping exception ends the program (std::terminate)
//   rather than unwinding through the engine's thread.
// - Defaults come from the library's own _init functions, so they never drift.
#ifndef MLXRT_HPP
#define MLXRT_HPP

#include <chrono>
#include <climits>
#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "mlxrt.h"

namespace mlxrt {

/// A failed call or an ERROR event: the status (mlxrt_status) and message.
class Error : public std::runtime_error {
 public:
  Error(mlxrt_status status, const std::string &message)
      : std::runtime_error(message), status_(status) {}
  mlxrt_status status() const noexcept { return status_; }
  /// "invalid argument", "invalid json", ... (static strings).
  const char *status_name() const noexcept { return mlxrt_status_name(status_); }

 private:
  mlxrt_status status_;
};

namespace detail {
/// Turns a C status + error object into an exception (freeing the object).
inline void check(mlxrt_status status, mlxrt_error *error) {
  if (status == MLXRT_STATUS_OK) return;
  std::string message = error ? mlxrt_error_message(error) : mlxrt_status_name(status);
  mlxrt_error_free(error);
  throw Error(status, message);
}
/// Runs `f(&error)` (a C call returning mlxrt_status) and throws on failure.
/// The status is taken before the error pointer is read: argument
/// evaluation order would not guarantee that in `check(f(&e), e)`.
template <class F>
void call(F &&f) {
  mlxrt_error *error = nullptr;
  mlxrt_status status = std::forward<F>(f)(&error);
  check(status, error);
}
/// Enabled for contiguous ranges of one-byte elements (not pointers).
template <class Bytes>
using if_bytes = std::enable_if_t<sizeof(*std::data(std::declval<const Bytes &>())) == 1 &&
                                  std::is_integral_v<decltype(std::size(std::declval<const Bytes &>()))>>;
template <class Bytes>
const uint8_t *byte_data(const Bytes &bytes) {
  return reinterpret_cast<const uint8_t *>(std::data(bytes));
}
}  // namespace detail

/// The library's version string and ABI version.
inline std::string version() { return mlxrt_version_string(); }
inline uint32_t abi_version() { return mlxrt_abi_version(); }

/// Engine settings; defaults from mlxrt_engine_config_init. Setters chain.
class EngineConfig {
 public:
  explicit EngineConfig(std::string model_path = {}) : model_path_(std::move(model_path)) {
    mlxrt_engine_config_init(&c_);
  }
  EngineConfig &model_path(std::string path) { model_path_ = std::move(path); return *this; }
  EngineConfig &device(int32_t d) { c_.device = d; return *this; }  // MLXRT_DEVICE_*
  EngineConfig &max_in_flight(uint32_t n) { c_.max_in_flight = n; return *this; }
  EngineConfig &max_rows(uint32_t n) { c_.max_rows = n; return *this; }
  EngineConfig &prefill_chunk(uint32_t n) { c_.prefill_chunk = n; return *this; }
  EngineConfig &kv_budget(uint64_t bytes) { c_.kv_budget = bytes; return *this; }
  EngineConfig &seed(uint64_t s) { c_.seed = s; return *this; }
  EngineConfig &prompt_cache_bytes(uint64_t bytes) { c_.prompt_cache_bytes = bytes; return *this; }
  EngineConfig &prompt_cache_dir(std::string dir) { cache_dir_ = std::move(dir); return *this; }
  /// A smaller model with the same tokenizer that drafts tokens for
  /// speculative decoding (requests then default to "speculation": "draft").
  EngineConfig &draft_model_path(std::string path) { draft_path_ = std::move(path); return *this; }
  /// The C struct, for fields without a setter (pointers set here are ignored).
  mlxrt_engine_config &raw() { return c_; }

  /// A C struct pointing into this object; valid while it lives unchanged.
  mlxrt_engine_config c_config() const {
    mlxrt_engine_config c = c_;
    c.model_path = model_path_.c_str();
    c.prompt_cache_dir = cache_dir_ ? cache_dir_->c_str() : nullptr;
    c.draft_model_path = draft_path_ ? draft_path_->c_str() : nullptr;
    return c;
  }

 private:
  mlxrt_engine_config c_{};
  std::string model_path_;
  std::optional<std::string> cache_dir_, draft_path_;
};

/// Request settings; defaults from mlxrt_request_params_init. Give one input:
/// messages (user()/message()/messages_json()), prompt() or prompt_tokens().
class RequestParams {
 public:
  RequestParams() { mlxrt_request_params_init(&c_); }
  /// Appends a chat message (role and content are JSON-escaped here).
  RequestParams &message(std::string_view role, std::string_view content) {
    messages_.emplace_back(std::string(role), std::string(content));
    return *this;
  }
  RequestParams &system(std::string_view content) { return message("system", content); }
  RequestParams &user(std::string_view content) { return message("user", content); }
  RequestParams &assistant(std::string_view content) { return message("assistant", content); }
  /// The whole conversation as a JSON array (replaces message()s).
  RequestParams &messages_json(std::string json) { messages_json_ = std::move(json); return *this; }
  RequestParams &prompt(std::string text) { prompt_ = std::move(text); return *this; }
  RequestParams &prompt_tokens(std::vector<uint32_t> ids) { tokens_ = std::move(ids); return *this; }
  RequestParams &max_tokens(uint32_t n) { c_.max_tokens = n; return *this; }
  RequestParams &temperature(float t) { c_.temperature = t; return *this; }
  RequestParams &top_p(float p) { c_.top_p = p; return *this; }
  RequestParams &top_k(int32_t k) { c_.top_k = k; return *this; }
  RequestParams &min_p(float p) { c_.min_p = p; return *this; }
  RequestParams &repetition_penalty(float p) { c_.repetition_penalty = p; return *this; }
  RequestParams &seed(uint64_t s) { c_.use_seed = 1; c_.seed = s; return *this; }
  RequestParams &stop(std::string s) { stop_.push_back(std::move(s)); return *this; }
  /// OpenAI-style fields as a JSON object, applied after the fields above.
  RequestParams &options_json(std::string json) { options_ = std::move(json); return *this; }
  /// Structured output: the shape the output must have, as the JSON of the
  /// `response_format` option, e.g. {"type":"json_schema","json_schema":
  /// {"schema":{...}}}, {"type":"json_object"}, {"type":"regex","pattern":
  /// "..."} or {"type":"grammar","lark":"..."}. Merged into options_json.
  RequestParams &response_format(std::string json) { response_format_ = std::move(json); return *this; }
  /// Speculative decoding, as the JSON of the `speculation` option: "\"off\"",
  /// "\"ngram\"", "\"draft\"" (needs the engine's draft model) or e.g.
  /// {"type":"draft","num_tokens":4}. Merged into options_json.
  RequestParams &speculation(std::string json) { speculation_ = std::move(json); return *this; }
  RequestParams &cache_namespace(std::string ns) { namespace_ = std::move(ns); return *this; }
  RequestParams &prompt_cache(bool on) { c_.no_prompt_cache = on ? 0 : 1; return *this; }
  /// Per-token log-probabilities in deltas, with `top` alternatives (0..=20).
  RequestParams &logprobs(uint32_t top = 0) { c_.logprobs = 1; c_.top_logprobs = top; return *this; }
  /// For models with a thinking mode: think or not (default: the template's).
  RequestParams &thinking(bool on) { c_.thinking = on ? 1 : 0; return *this; }
  /// Adds an image for a `{"type": "image", "media": K}` message part and
  /// returns K: an encoded file (JPEG, PNG, WebP) in `bytes`. Not copied
  /// here: the bytes must stay valid until submit returns (mlxrt copies them).
  size_t image_data(const uint8_t *bytes, size_t n) { return add_media(MLXRT_MEDIA_ENCODED, 0, 0, 0, bytes, n); }
  /// The same for raw pixels: `format` is MLXRT_PIXEL_RGB8, _RGBA8 or _BGRA8
  /// (Core Graphics' 32-bit little-endian layout), rows `stride` bytes apart
  /// (0 = packed).
  size_t image_pixels(int32_t format, uint32_t width, uint32_t height, const uint8_t *bytes, size_t n,
                      size_t stride = 0) {
    return add_media(format, width, height, stride, bytes, n);
  }
  /// Both from any contiguous range of bytes (std::span<const std::byte>,
  /// std::vector<uint8_t>, std::string, std::array, ...): its data() and
  /// size() are passed on, not copied.
  ///   std::vector<uint8_t> jpeg = read("cat.jpg");
  ///   mlxrt::RequestParams p;
  ///   size_t k = p.image_data(jpeg);  // then a part {"type": "image", "media": k}
  ///   p.image_pixels(MLXRT_PIXEL_BGRA8, w, h, std::span(bgra, rows * stride), stride);
  template <class Bytes, class = detail::if_bytes<Bytes>>
  size_t image_data(const Bytes &bytes) {
    return image_data(detail::byte_data(bytes), std::size(bytes));
  }
  template <class Bytes, class = detail::if_bytes<Bytes>>
  size_t image_pixels(int32_t format, uint32_t width, uint32_t height, const Bytes &bytes, size_t stride = 0) {
    return image_pixels(format, width, height, detail::byte_data(bytes), std::size(bytes), stride);
  }
  /// Adds an audio clip for a `{"type": "audio", "media": K}` message part
  /// and returns K: an encoded WAV file in `bytes` (not copied here, as
  /// image_data), ...
  size_t audio_data(const uint8_t *bytes, size_t n) { return add_media(MLXRT_MEDIA_ENCODED, 0, 0, 0, bytes, n, MLXRT_MEDIA_AUDIO); }
  template <class Bytes, class = detail::if_bytes<Bytes>>
  size_t audio_data(const Bytes &bytes) {
    return audio_data(detail::byte_data(bytes), std::size(bytes));
  }
  /// ... or mono float samples in -1..1 at `sample_rate` Hz (the model's
  /// rate: 16000 for Gemma 4), e.g. a std::span<const float>.
  size_t audio_samples(const float *samples, size_t n, uint32_t sample_rate) {
    size_t k = add_media(MLXRT_AUDIO_F32, 0, 0, 0, reinterpret_cast<const uint8_t *>(samples), n * sizeof(float), MLXRT_MEDIA_AUDIO);
    media_[k].sample_rate = sample_rate;
    return k;
  }
  template <class Floats>
  size_t audio_samples(const Floats &samples, uint32_t sample_rate) {
    return audio_samples(std::data(samples), std::size(samples), sample_rate);
  }
  mlxrt_request_params &raw() { return c_; }

  /// Calls f(const mlxrt_request_params &) with a C struct pointing into
  /// this object and a local array (mlxrt copies it all during submit).
  template <class F>
  decltype(auto) with_c_params(F &&f) const {
    mlxrt_request_params c = c_;
    std::string messages = messages_json_ ? *messages_json_ : render_messages();
    std::vector<const char *> stops;
    for (const auto &s : stop_) stops.push_back(s.c_str());
    if (messages_json_ || !messages_.empty()) c.messages_json = messages.c_str();
    if (prompt_) c.prompt = prompt_->c_str();
    if (tokens_) {
      c.prompt_tokens = tokens_->data();
      c.n_prompt_tokens = tokens_->size();
    }
    c.stop = stops.empty() ? nullptr : stops.data();
    c.n_stop = stops.size();
    std::string options = merged_options();
    if (options_ || response_format_ || speculation_) c.options_json = options.c_str();
    if (namespace_) c.cache_namespace = namespace_->c_str();
    c.media = media_.empty() ? nullptr : media_.data();
    c.n_media = media_.size();
    return std::forward<F>(f)(static_cast<const mlxrt_request_params &>(c));
  }

 private:
  /// options_json with "response_format" and "speculation" added (text
  /// that is not a JSON object is passed on as is: mlxrt reports it).
  std::string merged_options() const {
    std::string field;
    if (response_format_) field = "\"response_format\":" + *response_format_;
    if (speculation_) field += (field.empty() ? "" : ",") + ("\"speculation\":" + *speculation_);
    if (field.empty()) return options_ ? *options_ : std::string();
    if (!options_) return "{" + field + "}";
    std::string o = *options_;
    size_t open = o.find('{'), close = o.find_last_of('}');
    if (open == std::string::npos || close == std::string::npos || close < open) return o;
    bool empty = o.find_first_not_of(" \t\r\n", open + 1) == close;
    o.insert(close, empty ? field : "," + field);
    return o;
  }

  size_t add_media(int32_t format, uint32_t width, uint32_t height, size_t stride, const uint8_t *bytes, size_t n,
                   int32_t kind = MLXRT_MEDIA_IMAGE) {
    mlxrt_media m{};
    m.struct_size = sizeof m;
    m.kind = kind;
    m.format = format;
    m.width = width;
    m.height = height;
    m.stride = stride;
    m.bytes = bytes;
    m.n_bytes = n;
    media_.push_back(m);
    return media_.size() - 1;
  }
  static void json_string(std::string &out, std::string_view s) {
    static const char hex[] = "0123456789abcdef";
    out += '"';
    for (unsigned char ch : s) {
      if (ch == '"' || ch == '\\') {
        out += '\\';
        out += static_cast<char>(ch);
      } else if (ch < 0x20) {
        out += "\\u00";
        out += hex[ch >> 4];
        out += hex[ch & 15];
      } else {
        out += static_cast<char>(ch);  // UTF-8 passes through; mlxrt validates it
      }
    }
    out += '"';
  }
  std::string render_messages() const {
    std::string out = "[";
    for (size_t i = 0; i < messages_.size(); i++) {
      out += i ? ", {\"role\": " : "{\"role\": ";
      json_string(out, messages_[i].first);
      out += ", \"content\": ";
      json_string(out, messages_[i].second);
      out += '}';
    }
    return out + "]";
  }

  mlxrt_request_params c_{};
  std::vector<std::pair<std::string, std::string>> messages_;
  std::optional<std::string> messages_json_, prompt_, options_, namespace_, response_format_, speculation_;
  std::optional<std::vector<uint32_t>> tokens_;
  std::vector<std::string> stop_;
  std::vector<mlxrt_media> media_;
};

/// A view of an array inside an event (valid as long as the event).
template <class T>
struct Span {
  const T *ptr = nullptr;
  size_t count = 0;
  const T *begin() const { return ptr; }
  const T *end() const { return ptr + count; }
  size_t size() const { return count; }
  bool empty() const { return count == 0; }
  const T &operator[](size_t i) const { return ptr[i]; }
};
using TokenSpan = Span<uint32_t>;

/// One event, viewed during the callback (or, from a Stream, until the next
/// call on it): copy what you keep.
class Event {
 public:
  explicit Event(const mlxrt_event &e) : e_(e) {}
  mlxrt_event_kind kind() const { return e_.kind; }
  bool is_delta() const { return e_.kind == MLXRT_EVENT_KIND_DELTA; }
  bool is_done() const { return e_.kind == MLXRT_EVENT_KIND_DONE; }
  bool is_error() const { return e_.kind == MLXRT_EVENT_KIND_ERROR; }
  bool is_tool_call() const { return e_.kind == MLXRT_EVENT_KIND_TOOL_CALL; }
  /// DONE or ERROR: the request's last event.
  bool is_terminal() const { return is_done() || is_error(); }
  uint64_t request_id() const { return e_.request_id; }
  /// DELTA: complete UTF-8 text (may be empty when only ids are reported).
  std::string_view text() const { return {e_.text, e_.text_len}; }
  TokenSpan tokens() const { return {e_.tokens, e_.n_tokens}; }
  /// DELTA: MLXRT_CHANNEL_CONTENT, or MLXRT_CHANNEL_REASONING for thinking.
  int32_t channel() const { return e_.channel; }
  bool is_reasoning() const { return e_.channel == MLXRT_CHANNEL_REASONING; }
  /// TOOL_CALL: an id unique in the engine, the tool's name, its arguments
  /// as a JSON object.
  std::string_view tool_call_id() const { return e_.tool_call_id ? e_.tool_call_id : ""; }
  std::string_view tool_name() const { return e_.tool_name ? e_.tool_name : ""; }
  std::string_view tool_arguments() const { return e_.tool_arguments ? e_.tool_arguments : ""; }
  /// DELTA of a request with logprobs(): one entry per token (each with
  /// `top`/`n_top` alternatives).
  Span<mlxrt_token_logprob> logprobs() const { return {e_.logprobs, e_.n_logprobs}; }
  mlxrt_finish_reason finish_reason() const { return e_.finish_reason; }
  /// DONE by a stop string: its index in the request's stop list.
  std::optional<size_t> stop_index() const {
    return e_.stop_index >= 0 ? std::optional<size_t>(static_cast<size_t>(e_.stop_index)) : std::nullopt;
  }
  const mlxrt_usage &usage() const { return e_.usage; }
  /// ERROR: the failure as an exception object (not thrown).
  Error error() const { return Error(e_.error_status, e_.error_message); }
  const mlxrt_event &raw() const { return e_; }

 private:
  const mlxrt_event &e_;
};

using EventHandler = std::function<void(const Event &)>;

/// A submitted request's handle: cancel it, read its id. Destroying the
/// handle does not cancel the request (as in C); move-only.
class Request {
 public:
  Request() = default;
  explicit Request(mlxrt_request *r) : r_(r) {}
  Request(Request &&o) noexcept : r_(std::exchange(o.r_, nullptr)) {}
  Request &operator=(Request &&o) noexcept {
    if (this != &o) {
      mlxrt_request_free(r_);
      r_ = std::exchange(o.r_, nullptr);
    }
    return *this;
  }
  Request(const Request &) = delete;
  Request &operator=(const Request &) = delete;
  ~Request() { mlxrt_request_free(r_); }

  /// Stops the request; it ends with DONE/CANCELLED unless already over.
  /// Idempotent, and harmless after the engine is gone.
  void cancel() const {
    detail::call([&](mlxrt_error **e) { return mlxrt_request_cancel(r_, e); });
  }
  uint64_t id() const { return mlxrt_request_id(r_); }
  explicit operator bool() const { return r_ != nullptr; }
  mlxrt_request *get() const { return r_; }

 private:
  mlxrt_request *r_ = nullptr;
};

/// A request read by pulling its events (no callbacks, no threads). Use it
/// from one thread at a time; move-only. Destroying it cancels a request that
/// is still running.
class Stream {
 public:
  explicit Stream(mlxrt_stream *s) : s_(s) {}
  Stream(Stream &&o) noexcept : s_(std::exchange(o.s_, nullptr)), ended_(o.ended_) {}
  Stream &operator=(Stream &&o) noexcept {
    if (this != &o) {
      mlxrt_stream_free(s_);
      s_ = std::exchange(o.s_, nullptr);
      ended_ = o.ended_;
    }
    return *this;
  }
  Stream(const Stream &) = delete;
  Stream &operator=(const Stream &) = delete;
  ~Stream() { mlxrt_stream_free(s_); }

  /// Waits up to `timeout` (negative: no limit) for the next event. Returns
  /// nullopt when none came in time, or once the terminal event has been
  /// read (then ended() is true). The event is valid until the next call.
  std::optional<Event> next(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) {
    if (ended_) return std::nullopt;
    auto ms = timeout.count() < 0 ? -1 : static_cast<int32_t>(std::min<long long>(timeout.count(), INT32_MAX));
    const mlxrt_event *ev = nullptr;
    mlxrt_error *e = nullptr;
    mlxrt_status st = mlxrt_stream_next(s_, ms, &ev, &e);
    if (st == MLXRT_STATUS_TIMEOUT || st == MLXRT_STATUS_END_OF_STREAM) {
      mlxrt_error_free(e);
      ended_ = st == MLXRT_STATUS_END_OF_STREAM;
      return std::nullopt;
    }
    detail::check(st, e);
    if (ev->kind == MLXRT_EVENT_KIND_DONE || ev->kind == MLXRT_EVENT_KIND_ERROR) ended_ = true;
    return Event(*ev);
  }
  /// The terminal event (DONE or ERROR) has been read.
  bool ended() const { return ended_; }
  /// Stops the request; its terminal event still comes through next().
  void cancel() const {
    detail::call([&](mlxrt_error **e) { return mlxrt_stream_cancel(s_, e); });
  }
  uint64_t id() const { return mlxrt_stream_request_id(s_); }

 private:
  mlxrt_stream *s_ = nullptr;
  bool ended_ = false;
};

/// A tool call the model made (a TOOL_CALL event, copied).
struct ToolCall {
  std::string id, name, arguments_json;
};

/// What Engine::generate returns.
struct Completion {
  std::string text;       // the answer (content channel)
  std::string reasoning;  // thinking text, for models that think
  std::vector<ToolCall> tool_calls;
  std::vector<uint32_t> tokens;
  mlxrt_finish_reason finish_reason = MLXRT_FINISH_REASON_NONE;
  mlxrt_usage usage{};
};

/// A loaded model and its threads. Move-only; the destructor cancels what is
/// in flight, delivers the terminal events and joins the threads.
class Engine {
 public:
  explicit Engine(const EngineConfig &config) {
    if (mlxrt_abi_version() != MLXRT_ABI_VERSION)
      throw Error(MLXRT_STATUS_UNSUPPORTED, "mlxrt.h and the loaded libmlxrt differ in ABI version");
    mlxrt_engine_config c = config.c_config();
    detail::call([&](mlxrt_error **e) { return mlxrt_engine_create(&c, &e_, e); });
  }
  Engine(Engine &&o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  Engine &operator=(Engine &&o) noexcept {
    if (this != &o) {
      mlxrt_engine_destroy(e_);
      e_ = std::exchange(o.e_, nullptr);
    }
    return *this;
  }
  Engine(const Engine &) = delete;
  Engine &operator=(const Engine &) = delete;
  ~Engine() { mlxrt_engine_destroy(e_); }

  /// Submits a request; `on_event` receives its events (DELTA and TOOL_CALL
  /// events, then one DONE or ERROR) on the delivery thread (an empty
  /// handler ignores them).
  /// Throws on failure; then the handler is never called.
  Request submit(const RequestParams &params, EventHandler on_event) const {
    auto handler = std::make_unique<EventHandler>(std::move(on_event));
    mlxrt_request *r = nullptr;
    params.with_c_params([&](const mlxrt_request_params &c) {
      detail::call([&](mlxrt_error **e) {
        return mlxrt_request_submit(e_, &c, &trampoline, handler.get(), &free_handler, &r, e);
      });
    });
    handler.release();  // now owned by the request; free_handler deletes it
    return Request(r);
  }

  /// Submits a request whose events are pulled with Stream::next.
  Stream submit_stream(const RequestParams &params) const {
    mlxrt_stream *st = nullptr;
    params.with_c_params([&](const mlxrt_request_params &c) {
      detail::call([&](mlxrt_error **e) { return mlxrt_request_submit_stream(e_, &c, &st, e); });
    });
    return Stream(st);
  }

  /// Submits and waits for the end: the whole text, ids and usage. An ERROR
  /// event is thrown as Error.
  Completion generate(const RequestParams &params) const {
    struct Shared {
      std::mutex mu;
      std::condition_variable cv;
      bool ended = false;
      std::optional<Error> error;
      Completion out;
    };
    auto s = std::make_shared<Shared>();
    submit(params, [s](const Event &ev) {
      std::lock_guard<std::mutex> lock(s->mu);
      if (ev.is_delta()) {
        (ev.is_reasoning() ? s->out.reasoning : s->out.text) += ev.text();
        s->out.tokens.insert(s->out.tokens.end(), ev.tokens().begin(), ev.tokens().end());
        return;
      }
      if (ev.is_tool_call()) {
        s->out.tool_calls.push_back(
            {std::string(ev.tool_call_id()), std::string(ev.tool_name()), std::string(ev.tool_arguments())});
        return;
      }
      if (!ev.is_terminal()) return;  // a kind this header does not know
      if (ev.is_error()) s->error = ev.error();
      s->out.finish_reason = ev.finish_reason();
      s->out.usage = ev.usage();
      s->ended = true;
      s->cv.notify_all();
    });
    std::unique_lock<std::mutex> lock(s->mu);
    s->cv.wait(lock, [&] { return s->ended; });
    if (s->error) throw *s->error;
    return std::move(s->out);
  }

  mlxrt_engine_stats stats() const {
    mlxrt_engine_stats out{};
    out.struct_size = sizeof out;
    detail::call([&](mlxrt_error **e) { return mlxrt_engine_get_stats(e_, &out, e); });
    return out;
  }
  void flush_prompt_cache() const {
    detail::call([&](mlxrt_error **e) { return mlxrt_engine_flush_prompt_cache(e_, e); });
  }
  void clear_prompt_cache(bool also_disk = false) const {
    uint32_t flags = also_disk ? MLXRT_CLEAR_DISK : 0;
    detail::call([&](mlxrt_error **e) { return mlxrt_engine_clear_prompt_cache(e_, flags, e); });
  }
  /// The model's facts. Its strings and id arrays stay valid while the
  /// engine lives.
  mlxrt_engine_info info() const {
    mlxrt_engine_info out{};
    out.struct_size = sizeof out;
    detail::call([&](mlxrt_error **e) { return mlxrt_engine_get_info(e_, &out, e); });
    return out;
  }

  /// The token ids of UTF-8 `text` (no BOS added); with `parse_special`,
  /// special-token text such as `<|im_start|>` becomes its id.
  std::vector<uint32_t> tokenize(const std::string &text, bool parse_special = false) const {
    mlxrt_tokens *t = nullptr;
    detail::call([&](mlxrt_error **e) { return mlxrt_tokenize(e_, text.c_str(), parse_special, &t, e); });
    return take_tokens(t);
  }

  /// UTF-8 text of `ids` (invalid bytes become U+FFFD); with
  /// `skip_special`, special tokens produce no text.
  std::string detokenize(const std::vector<uint32_t> &ids, bool skip_special = false) const {
    char *text = nullptr;
    detail::call([&](mlxrt_error **e) { return mlxrt_detokenize(e_, ids.data(), ids.size(), skip_special, &text, e); });
    return take_string(text);
  }

  /// The prompt a request with these messages (and options' tools and
  /// chat_template_kwargs) would process: text and token ids.
  struct Rendered {
    std::string text;
    std::vector<uint32_t> tokens;
  };
  Rendered render_chat(const RequestParams &params) const {
    char *text = nullptr;
    mlxrt_tokens *t = nullptr;
    params.with_c_params([&](const mlxrt_request_params &c) {
      detail::call([&](mlxrt_error **e) { return mlxrt_render_chat(e_, c.messages_json, c.options_json, &text, &t, e); });
    });
    Rendered r;
    r.text = take_string(text);
    r.tokens = take_tokens(t);
    return r;
  }

  mlxrt_engine *get() const { return e_; }

 private:
  static std::vector<uint32_t> take_tokens(mlxrt_tokens *t) {
    const uint32_t *d = mlxrt_tokens_data(t);
    std::vector<uint32_t> out(d, d + mlxrt_tokens_len(t));
    mlxrt_tokens_free(t);
    return out;
  }
  static std::string take_string(char *s) {
    std::string out = s ? s : "";
    mlxrt_string_free(s);
    return out;
  }

  // Called by the engine's delivery thread; noexcept: see the file comment.
  static void trampoline(void *user_data, const mlxrt_event *event) noexcept {
    auto &handler = *static_cast<EventHandler *>(user_data);
    if (handler) handler(Event(*event));  // an empty handler ignores events
  }
  static void free_handler(void *user_data) noexcept { delete static_cast<EventHandler *>(user_data); }

  mlxrt_engine *e_ = nullptr;
};

}  // namespace mlxrt

#endif  // MLXRT_HPP
