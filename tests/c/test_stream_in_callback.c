/* A pull stream submitted and read inside an event callback must deliver
 * (the header lets a callback call any mlxrt function). Built and run by
 * tests/reentry.rs (plain and under AddressSanitizer).
 *
 *   test_stream_in_callback MODEL_PATH
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "mlxrt.h"

#define CHAT "[{\"role\": \"user\", \"content\": \"What is the capital of France?\"}]"
/* Consecutive empty waits before the stream counts as stuck. */
#define TIMEOUT_MS 5000
#define MAX_TIMEOUTS 4

struct ctx {
  mlxrt_engine *engine;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int ran, freed;
  /* what the stream read inside the callback gave */
  int submitted, deltas, terminals, finish, timeouts, end_of_stream, bad_status;
  char text[4096];
};

static void read_stream(struct ctx *c) {
  mlxrt_request_params p;
  mlxrt_request_params_init(&p);
  p.messages_json = CHAT;
  p.max_tokens = 8;
  p.options_json = "{\"ignore_eos\": true}";
  mlxrt_stream *s = NULL;
  if (mlxrt_request_submit_stream(c->engine, &p, &s, NULL) != MLXRT_STATUS_OK) return;
  c->submitted = 1;
  int waits = 0;
  while (waits < MAX_TIMEOUTS) {
    const mlxrt_event *ev = NULL;
    mlxrt_status st = mlxrt_stream_next(s, TIMEOUT_MS, &ev, NULL);
    if (st == MLXRT_STATUS_END_OF_STREAM) {
      c->end_of_stream = 1;
      break;
    }
    if (st == MLXRT_STATUS_TIMEOUT) {
      waits++;
      c->timeouts++;
      continue;
    }
    if (st != MLXRT_STATUS_OK || ev == NULL) {
      c->bad_status = (int)st;
      break;
    }
    waits = 0;
    if (ev->kind == MLXRT_EVENT_KIND_DELTA) {
      c->deltas++;
      strncat(c->text, ev->text, sizeof c->text - strlen(c->text) - 1);
    } else if (ev->kind == MLXRT_EVENT_KIND_DONE || ev->kind == MLXRT_EVENT_KIND_ERROR) {
      c->terminals++;
      c->finish = ev->kind == MLXRT_EVENT_KIND_DONE ? (int)ev->finish_reason : -1;
    }
  }
  mlxrt_stream_free(s);
}

static void on_event(void *ud, const mlxrt_event *ev) {
  (void)ev;
  struct ctx *c = ud;
  if (c->ran) return;
  c->ran = 1;
  read_stream(c);
}

static void on_free(void *ud) {
  struct ctx *c = ud;
  pthread_mutex_lock(&c->mu);
  c->freed = 1;
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL_PATH\n", argv[0]);
    return 2;
  }
  mlxrt_engine_config cfg;
  mlxrt_engine_config_init(&cfg);
  cfg.model_path = argv[1];
  mlxrt_error *err = NULL;
  struct ctx c;
  memset(&c, 0, sizeof c);
  pthread_mutex_init(&c.mu, NULL);
  pthread_cond_init(&c.cv, NULL);
  if (mlxrt_engine_create(&cfg, &c.engine, &err) != MLXRT_STATUS_OK) {
    fprintf(stderr, "FAIL cannot create engine: %s\n", mlxrt_error_message(err));
    mlxrt_error_free(err);
    return 1;
  }

  mlxrt_request_params p;
  mlxrt_request_params_init(&p);
  p.messages_json = CHAT;
  p.max_tokens = 2;
  if (mlxrt_request_submit(c.engine, &p, on_event, &c, on_free, NULL, &err) != MLXRT_STATUS_OK) {
    fprintf(stderr, "FAIL submit: %s\n", mlxrt_error_message(err));
    mlxrt_error_free(err);
    return 1;
  }
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 300;
  pthread_mutex_lock(&c.mu);
  while (!c.freed && pthread_cond_timedwait(&c.cv, &c.mu, &until) == 0) {
  }
  int freed = c.freed;
  pthread_mutex_unlock(&c.mu);
  mlxrt_engine_destroy(c.engine);

  int ok = freed && c.submitted && c.deltas > 0 && c.terminals == 1 && c.finish == MLXRT_FINISH_REASON_LENGTH &&
           c.end_of_stream && c.timeouts == 0 && c.bad_status == 0;
  fprintf(stderr,
          "outer request ended: %d; stream in callback: submitted %d, %d deltas (\"%s\"), %d terminal (finish %d), "
          "end of stream %d, %d timeouts of %d ms, bad status %d\n",
          freed, c.submitted, c.deltas, c.text, c.terminals, c.finish, c.end_of_stream, c.timeouts, TIMEOUT_MS,
          c.bad_status);
  if (!ok) {
    fprintf(stderr, "FAIL a pull stream read inside a callback did not deliver\n");
    return 1;
  }
  fprintf(stderr, "stream in callback: all checks passed\n");
  return 0;
}
