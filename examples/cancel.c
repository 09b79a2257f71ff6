/* Cancels a request in the middle of its generation.
 *
 *   cancel MODEL_PATH [AFTER_N_DELTAS]
 *
 * Cancel is a flag the engine checks between prefill chunks and between
 * decode steps, so it takes effect within one step. The request then ends
 * with a DONE event whose finish reason is CANCELLED, and nothing follows.
 *
 * Build:
 *   cc -std=c11 -Iinclude examples/cancel.c -Ltarget/release -lmlxrt \
 *      -Wl,-rpath,$PWD/target/release -lpthread -o build/cancel
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "mlxrt.h"

struct state {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int deltas;
  int ended;
  int finish_reason;
  unsigned completion_tokens;
};

/* Runs on the engine's delivery thread. */
static void on_event(void *user_data, const mlxrt_event *ev) {
  struct state *s = user_data;
  if (ev->kind == MLXRT_EVENT_KIND_DELTA) {
    fwrite(ev->text, 1, ev->text_len, stdout);
    fflush(stdout);
  }
  pthread_mutex_lock(&s->mu);
  if (ev->kind == MLXRT_EVENT_KIND_DELTA) {
    s->deltas++;
  } else if (ev->kind != MLXRT_EVENT_KIND_TOOL_CALL) { /* DONE or ERROR, the last event */
    if (ev->kind == MLXRT_EVENT_KIND_ERROR) fprintf(stderr, "\nerror: %s\n", ev->error_message);
    s->ended = 1;
    s->finish_reason = ev->finish_reason;
    s->completion_tokens = ev->usage.completion_tokens;
  }
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL_PATH [AFTER_N_DELTAS]\n", argv[0]);
    return 2;
  }
  int after = argc > 2 ? atoi(argv[2]) : 5;

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

  mlxrt_request_params params;
  mlxrt_request_params_init(&params);
  params.messages_json = "[{\"role\": \"user\", \"content\": \"Tell me a very long story about a dragon.\"}]";
  params.max_tokens = 1000;
  params.options_json = "{\"ignore_eos\": true}"; /* it would run to max_tokens */

  struct state s = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0};
  mlxrt_request *request = NULL; /* the handle is what lets us cancel */
  if (mlxrt_request_submit(engine, &params, on_event, &s, NULL, &request, &error) != MLXRT_STATUS_OK) {
    fprintf(stderr, "submit failed: %s\n", mlxrt_error_message(error));
    mlxrt_error_free(error);
    mlxrt_engine_destroy(engine);
    return 1;
  }

  /* Wait for a few pieces of text, then cancel from this (host) thread.
   * Cancelling from inside the callback works too. */
  pthread_mutex_lock(&s.mu);
  while (s.deltas < after && !s.ended) pthread_cond_wait(&s.cv, &s.mu);
  pthread_mutex_unlock(&s.mu);
  mlxrt_request_cancel(request, NULL);

  pthread_mutex_lock(&s.mu);
  while (!s.ended) pthread_cond_wait(&s.cv, &s.mu);
  pthread_mutex_unlock(&s.mu);
  int cancelled = s.finish_reason == MLXRT_FINISH_REASON_CANCELLED;
  printf("\n[%s after %u of %u tokens]\n", cancelled ? "cancelled" : "not cancelled", s.completion_tokens,
         params.max_tokens);

  mlxrt_request_cancel(request, NULL); /* harmless: cancel is idempotent */
  mlxrt_request_free(request);         /* the handle; the request is over */
  mlxrt_engine_destroy(engine);
  return cancelled ? 0 : 1;
}
