// Streams a chat answer with the C++ wrapper (bindings/cpp/mlxrt.hpp), then
// shows the blocking helper and how errors arrive.
//
//   chat_cpp MODEL_PATH ["question"]
//
// Build:
//   c++ -std=c++17 -Iinclude -Ibindings/cpp examples/chat.cpp -Ltarget/release
//       -lmlxrt -Wl,-rpath,$PWD/target/release -lpthread -o build/chat_cpp
#include <future>
#include <iostream>

#include "mlxrt.hpp"

int main(int argc, char **argv) {
  if (argc < 2) {
    std::cerr << "usage: " << argv[0] << " MODEL_PATH [\"question\"]\n";
    return 2;
  }
  std::string question = argc > 2 ? argv[2] : "Explain in two sentences why the sky is blue.";
  try {
    mlxrt::Engine engine{mlxrt::EngineConfig(argv[1])};

    // 1. Streaming: the lambda runs on the engine's delivery thread; the
    //    promise hands the terminal event's outcome back to this thread.
    std::promise<mlxrt_usage> finished;
    auto result = finished.get_future();
    mlxrt::Request request = engine.submit(
        mlxrt::RequestParams().user(question).max_tokens(48),
        [&finished](const mlxrt::Event &ev) {
          if (ev.is_delta()) {
            std::cout << ev.text() << std::flush;
          } else if (ev.is_done()) {
            finished.set_value(ev.usage());
          } else {
            finished.set_exception(std::make_exception_ptr(ev.error()));
          }
        });
    mlxrt_usage usage = result.get();  // rethrows an ERROR event
    std::cout << "\n[request " << request.id() << ": " << usage.completion_tokens << " tokens, "
              << usage.decode_tokens_per_s << " tok/s]\n";

    // 2. Blocking: submit and wait for the whole answer.
    mlxrt::Completion c = engine.generate(
        mlxrt::RequestParams().system("Answer with one word.").user("What color is grass?").max_tokens(8));
    std::cout << "one word: " << c.text << " (" << c.tokens.size() << " tokens)\n";

    // 3. Errors are exceptions carrying the status and message.
    try {
      engine.submit(mlxrt::RequestParams().user("x").options_json("{\"temperature\": "), nullptr);
    } catch (const mlxrt::Error &e) {
      std::cout << "bad options: " << e.status_name() << ": " << e.what() << "\n";
    }
  } catch (const mlxrt::Error &e) {
    std::cerr << "mlxrt error (" << e.status_name() << "): " << e.what() << "\n";
    return 1;
  }
  return 0;
}
