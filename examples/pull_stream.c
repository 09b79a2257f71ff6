/* Reads a request's events by pulling them from a stream instead of
 * receiving callbacks: no threads or locks in the host program.
 *
 *   pull_stream MODEL_PATH ["question"] [CANCEL_AFTER_N_DELTAS]
 *
 * Events queue in the stream until read (bounded by max_tokens), so a slow
 * reader never blocks the engine. Each event stays valid until the next call
 * on the stream.
 *
 * Build:
 *   cc -std=c11 -Iinclude examples/pull_stream.c -Ltarget/release -lmlxrt \
 *      -Wl,-rpath,$PWD/target/release -o build/pull_stream
 */
#include <stdio.h>
#include <stdlib.h>

#include "mlxrt.h"

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL_PATH [\"question\"] [CANCEL_AFTER_N_DELTAS]\n", argv[0]);
    return 2;
  }
  const char *question = argc > 2 ? argv[2] : "Name three rivers.";
  int cancel_after = argc > 3 ? atoi(argv[3]) : -1;

  mlxrt_engine_config config;
  mlxrt_engine_config_init(&config);
  config.model_path = argv[1];
  mlxrt_engine *engine = NULL;
  mlxrt_error *error = NULL;
  if (mlxrt_engine_create(&config, &engine, &error) != MLXRT_STATUS_OK) {
    fprintf(stderr, "cannot load %s: %s\n", argv[1], mlxrt_error_message(error));
    mlxrt_error_free(error);
    return 1;
  }

  /* The question goes into the JSON as is: keep it free of quotes here
   * (examples/chat.c shows escaping). */
  char messages[1024];
  snprintf(messages, sizeof messages, "[{\"role\": \"user\", \"content\": \"%s\"}]", question);
  mlxrt_request_params params;
  mlxrt_request_params_init(&params);
  params.messages_json = messages;
  params.max_tokens = 64;

  mlxrt_stream *stream = NULL;
  if (mlxrt_request_submit_stream(engine, &params, &stream, &error) != MLXRT_STATUS_OK) {
    fprintf(stderr, "submit failed: %s\n", mlxrt_error_message(error));
    mlxrt_error_free(error);
    mlxrt_engine_destroy(engine);
    return 1;
  }

  int deltas = 0, failed = 0;
  for (;;) {
    const mlxrt_event *ev = NULL;
    /* Wait up to 100 ms; a UI loop would do other work between polls. */
    mlxrt_status st = mlxrt_stream_next(stream, 100, &ev, NULL);
    if (st == MLXRT_STATUS_TIMEOUT) continue;
    if (st == MLXRT_STATUS_END_OF_STREAM) break; /* the terminal event was read */
    if (st != MLXRT_STATUS_OK) {
      fprintf(stderr, "stream error: %s\n", mlxrt_status_name(st));
      failed = 1;
      break;
    }
    if (ev->kind == MLXRT_EVENT_KIND_DELTA) {
      fwrite(ev->text, 1, ev->text_len, stdout);
      fflush(stdout);
      /* Cancel is a request; the terminal event still comes through next. */
      if (++deltas == cancel_after) mlxrt_stream_cancel(stream, NULL);
    } else if (ev->kind == MLXRT_EVENT_KIND_DONE) {
      printf("\n[%s: %u tokens, %.1f tok/s]\n",
             ev->finish_reason == MLXRT_FINISH_REASON_CANCELLED ? "cancelled" : "done",
             ev->usage.completion_tokens, ev->usage.decode_tokens_per_s);
    } else {
      fprintf(stderr, "\nerror: %s\n", ev->error_message);
      failed = 1;
    }
  }

  mlxrt_stream_free(stream); /* would cancel a request still running */
  mlxrt_engine_destroy(engine);
  return failed;
}
