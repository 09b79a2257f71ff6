// Tests of bindings/cpp/mlxrt.hpp against the real default model. Built and
// run by tests/cpp_wrapper.rs, plainly and under AddressSanitizer.
//
//   test_wrapper MODEL_PATH VLM_FOLDER IMAGE.png IMAGE.rgb WIDTH HEIGHT
//
// The last five are the tiny vision-language checkpoint of tests/media.rs,
// one of its images and that image's decoded pixels (packed RGB8).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "mlxrt.hpp"

static int failures = 0;
#define CHECK(cond)                                                  \
  do {                                                               \
    if (!(cond)) {                                                   \
      failures++;                                                    \
      std::fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                \
  } while (0)

// Counts live handler copies: the wrapper must destroy its function object
// exactly once, after the terminal event (or at once when submit fails).
static std::atomic<int> live{0};
struct Probe {
  Probe() { live++; }
  Probe(const Probe &) { live++; }
  ~Probe() { live--; }
};

// Events of one request, gathered under a lock.
struct Log {
  std::mutex mu;
  std::condition_variable cv;
  std::string text;
  int deltas = 0, terminals = 0, after_terminal = 0;
  mlxrt_event_kind last = MLXRT_EVENT_KIND_DELTA;
  mlxrt_finish_reason finish = MLXRT_FINISH_REASON_NONE;
  mlxrt_status error = MLXRT_STATUS_OK;

  mlxrt::EventHandler handler() {
    Probe probe;
    return [this, probe](const mlxrt::Event &ev) {
      std::lock_guard<std::mutex> lock(mu);
      if (terminals) after_terminal++;
      last = ev.kind();
      if (ev.is_delta()) {
        deltas++;
        text += ev.text();
      } else {
        terminals++;
        finish = ev.finish_reason();
        if (ev.is_error()) error = ev.error().status();
      }
      cv.notify_all();
    };
  }
  void wait_end() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::minutes(10), [&] { return terminals > 0; });
  }
  void wait_deltas(int n) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::minutes(10), [&] { return deltas >= n || terminals > 0; });
  }
};

// user_data_free runs right after the terminal event; give it a moment.
static bool handlers_released() {
  for (int i = 0; i < 200 && live.load() != 0; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return live.load() == 0;
}

template <class F>
static mlxrt_status status_of(F &&f) {
  try {
    f();
  } catch (const mlxrt::Error &e) {
    CHECK(std::string(e.what()).size() > 0);
    return e.status();
  }
  return MLXRT_STATUS_OK;
}

static std::string read_file(const char *path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Images from byte ranges: the same picture as a file path, as encoded bytes
// (std::string) and as padded BGRA pixels (std::vector) gives the same
// tokens, and the engine's stats count one tower run.
static void test_images(const char *folder, const char *png_path, const char *rgb_path, uint32_t w, uint32_t h) {
  mlxrt::Engine vlm{mlxrt::EngineConfig(folder)};
  auto generate = [&](mlxrt::RequestParams p, const std::string &part) {
    p.messages_json("[{\"role\": \"user\", \"content\": [" + part +
                    ", {\"type\": \"text\", \"text\": \"What is in this picture?\"}]}]");
    return vlm.generate(p.max_tokens(8).options_json("{\"ignore_eos\": true}")).tokens;
  };
  std::vector<uint32_t> by_path = generate(mlxrt::RequestParams(), std::string("{\"type\": \"image\", \"path\": \"") + png_path + "\"}");
  CHECK(by_path.size() == 8);

  std::string png = read_file(png_path), rgb = read_file(rgb_path);
  CHECK(!png.empty() && rgb.size() == size_t(w) * h * 3);
  mlxrt::RequestParams encoded;
  size_t k = encoded.image_data(png);
  CHECK(k == 0);
  CHECK(generate(std::move(encoded), "{\"type\": \"image\", \"media\": 0}") == by_path);

  size_t stride = size_t(w) * 4 + 8;
  std::vector<uint8_t> bgra(stride * h);
  for (size_t y = 0; y < h; y++)
    for (size_t x = 0; x < w; x++)
      for (size_t c = 0; c < 3; c++) bgra[y * stride + x * 4 + c] = uint8_t(rgb[(y * w + x) * 3 + 2 - c]);
  mlxrt::RequestParams pixels;
  pixels.image_data(png);  // entry 0, unused: INVALID_ARGUMENT
  CHECK(pixels.image_pixels(MLXRT_PIXEL_BGRA8, w, h, bgra, stride) == 1);
  CHECK(status_of([&] { generate(pixels, "{\"type\": \"image\", \"media\": 1}"); }) == MLXRT_STATUS_INVALID_ARGUMENT);
  CHECK(generate(pixels, "{\"type\": \"image\", \"media\": 0}, {\"type\": \"image\", \"media\": 1}").size() == 8);
  mlxrt::RequestParams only_pixels;
  only_pixels.image_pixels(MLXRT_PIXEL_BGRA8, w, h, bgra, stride);
  CHECK(generate(std::move(only_pixels), "{\"type\": \"image\", \"media\": 0}") == by_path);

  mlxrt_engine_stats s = vlm.stats();
  CHECK(s.tower_runs == 1 && s.encoder_cache_hits == 4 && s.encoder_cache_entries == 1 && s.encoder_cache_bytes > 0);

  // Audio entries reach the library as audio: this model has no audio tower,
  // so a WAV or f32 clip in an audio part is refused as UNSUPPORTED (and a
  // sample buffer with rate 0 as INVALID_ARGUMENT, before that).
  const char *audio_chat = "[{\"role\": \"user\", \"content\": [{\"type\": \"audio\", \"media\": 0}]}]";
  std::vector<float> silence(1600);
  mlxrt::RequestParams samples;
  CHECK(samples.audio_samples(silence, 16000) == 0);
  samples.messages_json(audio_chat);
  CHECK(status_of([&] { vlm.generate(samples); }) == MLXRT_STATUS_UNSUPPORTED);
  mlxrt::RequestParams no_rate;
  no_rate.audio_samples(silence.data(), silence.size(), 0);
  no_rate.messages_json(audio_chat);
  CHECK(status_of([&] { vlm.generate(no_rate); }) == MLXRT_STATUS_INVALID_ARGUMENT);
  mlxrt::RequestParams wav;
  const std::string not_wav = "RIFF";  // read during submit: it must outlive it
  CHECK(wav.audio_data(not_wav) == 0);
  wav.messages_json(audio_chat);
  CHECK(status_of([&] { vlm.generate(wav); }) == MLXRT_STATUS_INVALID_ARGUMENT);
}

int main(int argc, char **argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s MODEL_PATH VLM_FOLDER IMAGE.png IMAGE.rgb WIDTH HEIGHT\n", argv[0]);
    return 2;
  }
  test_images(argv[2], argv[3], argv[4], uint32_t(std::stoul(argv[5])), uint32_t(std::stoul(argv[6])));
  CHECK(mlxrt::abi_version() == MLXRT_ABI_VERSION);
  CHECK(mlxrt::version() == MLXRT_VERSION);

  // A missing model is an exception with the MODEL_LOAD status and a message.
  CHECK(status_of([] { mlxrt::Engine e{mlxrt::EngineConfig("/nonexistent/model.gguf")}; }) ==
        MLXRT_STATUS_MODEL_LOAD);

  mlxrt::Engine engine{mlxrt::EngineConfig(argv[1]).max_rows(4)};

  {  // images: the buffer reaches the library (a short one is named), and the
     // default model, which has no vision tower, refuses the image part
    const uint8_t px[4] = {1, 2, 3, 4};
    const char *chat = "[{\"role\": \"user\", \"content\": [{\"type\": \"image\", \"media\": 0}]}]";
    mlxrt::RequestParams short_buf;
    CHECK(short_buf.image_pixels(MLXRT_PIXEL_BGRA8, 2, 2, px, sizeof px) == 0);
    short_buf.messages_json(chat);
    CHECK(status_of([&] { engine.generate(short_buf); }) == MLXRT_STATUS_INVALID_ARGUMENT);
    mlxrt::RequestParams one;
    one.image_pixels(MLXRT_PIXEL_RGBA8, 1, 1, px, sizeof px);
    one.messages_json(chat);
    CHECK(status_of([&] { engine.generate(one); }) == MLXRT_STATUS_UNSUPPORTED);
  }

  {  // streaming; the handler is released once
    Log log;
    mlxrt::Request r = engine.submit(mlxrt::RequestParams().user("What is the capital of France?").max_tokens(16),
                                     log.handler());
    CHECK(r.id() != 0);
    log.wait_end();
    CHECK(log.deltas > 0 && log.terminals == 1 && log.after_terminal == 0);
    CHECK(log.last == MLXRT_EVENT_KIND_DONE);
    CHECK(log.text.find("Paris") != std::string::npos);
    CHECK(handlers_released());
  }

  {  // blocking helper, JSON escaping of message text, stop strings
    mlxrt::Completion c = engine.generate(mlxrt::RequestParams()
                                              .system("Quote: \"\\\n\t\" é 😀")
                                              .user("Count from 1 to 20, separated by commas.")
                                              .max_tokens(40)
                                              .stop("5"));
    CHECK(c.finish_reason == MLXRT_FINISH_REASON_STOP);
    CHECK(c.text.find('5') == std::string::npos);
    CHECK(!c.tokens.empty() && c.usage.completion_tokens >= 1);
  }

  {  // structured output, merged with options_json; a bad regex fails at submit
    mlxrt::Completion c = engine.generate(mlxrt::RequestParams()
                                              .user("Give a phone number.")
                                              .max_tokens(16)
                                              .options_json("{\"ignore_eos\": true}")
                                              .response_format("{\"type\":\"regex\",\"pattern\":\"[0-9]{3}-[0-9]{4}\"}"));
    CHECK(c.finish_reason == MLXRT_FINISH_REASON_STOP);
    CHECK(c.text.size() == 8 && c.text[3] == '-');
    CHECK(status_of([&] {
            engine.generate(mlxrt::RequestParams().user("x").response_format("{\"type\":\"regex\",\"pattern\":\"(\"}"));
          }) == MLXRT_STATUS_INVALID_ARGUMENT);
  }

  {  // speculation, merged with options_json: greedy text unchanged; "draft"
     // needs a draft model, which an engine drafting with the model itself has
    auto chat = [] { return mlxrt::RequestParams().user("Name three colours.").max_tokens(24); };
    mlxrt::Completion plain = engine.generate(chat());
    CHECK(engine.generate(chat().options_json("{\"ignore_eos\": false}").speculation("\"ngram\"")).text == plain.text);
    CHECK(status_of([&] { engine.generate(chat().speculation("\"draft\"")); }) == MLXRT_STATUS_INVALID_ARGUMENT);
    mlxrt::Engine drafting{mlxrt::EngineConfig(argv[1]).draft_model_path(argv[1])};
    CHECK(drafting.generate(chat()).text == plain.text);
    CHECK(drafting.generate(chat().speculation("{\"type\":\"draft\",\"num_tokens\":2}")).text == plain.text);
  }

  {  // cancel mid-generation; cancel is idempotent
    Log log;
    mlxrt::Request r = engine.submit(
        mlxrt::RequestParams().user("Tell a long story.").max_tokens(500).options_json("{\"ignore_eos\": true}"),
        log.handler());
    log.wait_deltas(2);
    r.cancel();
    r.cancel();
    log.wait_end();
    CHECK(log.finish == MLXRT_FINISH_REASON_CANCELLED);
    CHECK(handlers_released());
    mlxrt::Request moved = std::move(r);  // move leaves the source empty
    CHECK(!r && moved && moved.id() != 0);
    moved.cancel();
  }

  {  // pull stream: events in order, cancel, log-probabilities
    mlxrt::Stream st = engine.submit_stream(
        mlxrt::RequestParams().user("Tell a long story.").max_tokens(200).logprobs(2).options_json(
            "{\"ignore_eos\": true}"));
    CHECK(st.id() != 0);
    int deltas = 0, terminals = 0, timeouts = 0;
    bool logprobs_ok = true;
    while (!st.ended()) {
      std::optional<mlxrt::Event> ev = st.next(std::chrono::milliseconds(50));
      if (!ev) {
        timeouts++;
        continue;
      }
      if (ev->is_delta()) {
        logprobs_ok &= ev->logprobs().size() == ev->tokens().size();
        for (const mlxrt_token_logprob &lp : ev->logprobs()) logprobs_ok &= lp.logprob <= 0 && lp.n_top == 2;
        if (++deltas == 3) st.cancel();
      } else {
        terminals++;
        CHECK(ev->finish_reason() == MLXRT_FINISH_REASON_CANCELLED);
      }
    }
    CHECK(deltas >= 3 && deltas < 100 && terminals == 1 && logprobs_ok);
    CHECK(!st.next(std::chrono::milliseconds(0)));  // ended: nothing more
    mlxrt::Stream moved = std::move(st);
    CHECK(moved.ended());
    (void)timeouts;  // how many depends on the machine
  }
  {  // a stream freed while its request runs cancels it
    mlxrt::Stream st = engine.submit_stream(mlxrt::RequestParams().user("x").max_tokens(300));
    (void)st.next();
  }

  // Failed submits throw, and the handler is destroyed at once.
  CHECK(status_of([&] { engine.submit(mlxrt::RequestParams().user("x").options_json("{"), Log().handler()); }) ==
        MLXRT_STATUS_INVALID_JSON);
  CHECK(status_of([&] { engine.submit(mlxrt::RequestParams().messages_json("[{\"role\": "), nullptr); }) ==
        MLXRT_STATUS_INVALID_JSON);
  // Well-formed JSON of the wrong shape is refused too (the status is the
  // library's choice; see the C tests).
  CHECK(status_of([&] { engine.submit(mlxrt::RequestParams().messages_json("{\"role\": 1}"), nullptr); }) !=
        MLXRT_STATUS_OK);
  CHECK(status_of([&] { engine.submit(mlxrt::RequestParams().user("x").temperature(-1), nullptr); }) ==
        MLXRT_STATUS_INVALID_ARGUMENT);
  CHECK(status_of([&] { engine.submit(mlxrt::RequestParams().prompt("\xff\xfe"), nullptr); }) ==
        MLXRT_STATUS_INVALID_UTF8);
  CHECK(status_of([&] { engine.submit(mlxrt::RequestParams(), nullptr); }) == MLXRT_STATUS_INVALID_ARGUMENT);
  CHECK(live.load() == 0);
  CHECK(status_of([&] { engine.submit_stream(mlxrt::RequestParams().user("x").options_json("[")); }) ==
        MLXRT_STATUS_INVALID_JSON);

  // Token input, an empty handler, stats, prompt cache calls.
  engine.submit(mlxrt::RequestParams().prompt_tokens({1, 9690, 198}).max_tokens(2), nullptr);
  mlxrt_engine_stats s = engine.stats();
  CHECK(s.struct_size == sizeof s);
  engine.flush_prompt_cache();
  engine.clear_prompt_cache(true);

  {  // model facts, tokenizer and chat template
    mlxrt_engine_info info = engine.info();
    CHECK(std::string(info.architecture) == "llama" && info.vocab_size > 1000 && info.n_eos_token_ids >= 1);
    std::vector<uint32_t> ids = engine.tokenize("Hello world");
    CHECK(ids.size() >= 2 && engine.detokenize(ids) == "Hello world");
    CHECK(engine.tokenize("<|im_start|>", true).size() == 1);
    CHECK(engine.tokenize("<|im_start|>").size() > 1);
    CHECK(engine.detokenize({}).empty());
    mlxrt::Engine::Rendered r = engine.render_chat(mlxrt::RequestParams().user("Hi!"));
    CHECK(r.text.find("Hi!") != std::string::npos && r.tokens.size() > 3);
    CHECK(engine.detokenize(r.tokens) == r.text);
    CHECK(status_of([&] { engine.render_chat(mlxrt::RequestParams().messages_json("[")); }) ==
          MLXRT_STATUS_INVALID_JSON);
    CHECK(status_of([&] { engine.tokenize("\xff"); }) == MLXRT_STATUS_INVALID_UTF8);
  }

  {  // the engine moves; destroying it with a request in flight ends it
    Log log;
    mlxrt::Engine other{mlxrt::EngineConfig(argv[1])};
    mlxrt::Engine moved = std::move(other);
    CHECK(other.get() == nullptr);
    mlxrt::Request r = moved.submit(
        mlxrt::RequestParams().user("Tell a long story.").max_tokens(500).options_json("{\"ignore_eos\": true}"),
        log.handler());
    log.wait_deltas(1);
    moved = mlxrt::Engine{mlxrt::EngineConfig(argv[1])};  // destroys the first engine
    CHECK(log.terminals == 1 && log.finish == MLXRT_FINISH_REASON_CANCELLED);
    r.cancel();  // harmless after the engine is gone
  }
  CHECK(handlers_released());

  if (failures) {
    std::fprintf(stderr, "%d C++ wrapper checks failed\n", failures);
    return 1;
  }
  std::fprintf(stderr, "all C++ wrapper checks passed\n");
  return 0;
}
