/* Streams a chat answer from a local model, token by token.
 *
 *   chat MODEL_PATH ["question"]
 *
 * Build (see scripts/demo.sh):
 *   cc -std=c11 -Iinclude examples/chat.c -Ltarget/release -lmlxrt \
 *      -Wl,-rpath,$PWD/target/release -lpthread -o build/chat
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlxrt.h"

/* What the callback shares with main: set once, when the request ends. */
struct waiter {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int finished;
  int failed;
};

/* Runs on the engine's delivery thread. */
static void on_event(void *user_data, const mlxrt_event *ev) {
  struct waiter *w = user_data;
  if (ev->kind == MLXRT_EVENT_KIND_DELTA) {
    fwrite(ev->text, 1, ev->text_len, stdout);
    fflush(stdout);
    return;
  }
  if (ev->kind == MLXRT_EVENT_KIND_TOOL_CALL) return; /* not terminal; none without tools */
  if (ev->kind == MLXRT_EVENT_KIND_DONE) {
    const mlxrt_usage *u = &ev->usage;
    fprintf(stderr,
            "\n[%u prompt + %u generated tokens; first token after %.0f ms; "
            "prefill %.1f tok/s; decode %.1f tok/s]\n",
            u->prompt_tokens, u->completion_tokens, u->ttft_ms, u->prefill_tokens_per_s,
            u->decode_tokens_per_s);
  } else {
    fprintf(stderr, "\nerror: %s\n", ev->error_message);
  }
  pthread_mutex_lock(&w->mu);
  w->finished = 1;
  w->failed = ev->kind == MLXRT_EVENT_KIND_ERROR;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

/* Appends `s` to `out` as the body of a JSON string. */
static void json_escape(char *out, size_t cap, const char *s) {
  size_t n = strlen(out);
  for (; *s && n + 7 < cap; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      out[n++] = '\\';
      out[n++] = (char)c;
    } else if (c < 0x20) {
      n += (size_t)snprintf(out + n, cap - n, "\\u%04x", c);
    } else {
      out[n++] = (char)c;
    }
  }
  out[n] = '\0';
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL_PATH [\"question\"]\n", argv[0]);
    return 2;
  }
  const char *question = argc > 2 ? argv[2] : "Explain in three sentences why the sky is blue.";

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

  char messages[8192] = "[{\"role\": \"user\", \"content\": \"";
  json_escape(messages, sizeof messages - 4, question);
  strcat(messages, "\"}]");

  mlxrt_request_params params;
  mlxrt_request_params_init(&params);
  params.messages_json = messages;
  params.max_tokens = 200;

  struct waiter w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
  fprintf(stderr, "> %s\n", question);
  if (mlxrt_request_submit(engine, &params, on_event, &w, NULL, NULL, &error) != MLXRT_STATUS_OK) {
    fprintf(stderr, "submit failed: %s\n", mlxrt_error_message(error));
    mlxrt_error_free(error);
    mlxrt_engine_destroy(engine);
    return 1;
  }
  pthread_mutex_lock(&w.mu);
  while (!w.finished) pthread_cond_wait(&w.cv, &w.mu);
  pthread_mutex_unlock(&w.mu);
  mlxrt_engine_destroy(engine);
  return w.failed;
}
