/* Several requests at once, submitted from several threads to one engine.
 * The engine batches them (continuous batching): they prefill and decode
 * together, and each gets its own events, in order, on the delivery thread.
 *
 *   concurrent MODEL_PATH [N_REQUESTS] [MAX_TOKENS]
 *
 * Build:
 *   cc -std=c11 -Iinclude examples/concurrent.c -Ltarget/release -lmlxrt \
 *      -Wl,-rpath,$PWD/target/release -lpthread -o build/concurrent
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlxrt.h"

#define MAX_REQUESTS 16

static const char *QUESTIONS[] = {
    "What is the capital of France?",
    "Name three primary colors.",
    "What is 12 times 12?",
    "Write a haiku about the sea.",
};

/* One request's state. The callback writes it on the delivery thread, main
 * reads it after `finished`: the mutex orders the two. */
struct job {
  int index;
  mlxrt_engine *engine;
  unsigned max_tokens;
  char text[4096];
  size_t len;
  int finished;
  int failed;
  mlxrt_usage usage;
};

/* Shared by all jobs: main waits here until every request has ended. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int pending = 0;

/* Runs on the engine's delivery thread, one event at a time. */
static void on_event(void *user_data, const mlxrt_event *ev) {
  struct job *job = user_data;
  pthread_mutex_lock(&mu);
  if (ev->kind == MLXRT_EVENT_KIND_DELTA) {
    size_t n = ev->text_len;
    if (job->len + n >= sizeof job->text) n = sizeof job->text - 1 - job->len; /* truncate */
    memcpy(job->text + job->len, ev->text, n);
    job->len += n;
    job->text[job->len] = '\0';
  } else if (ev->kind == MLXRT_EVENT_KIND_DONE || ev->kind == MLXRT_EVENT_KIND_ERROR) {
    /* the last event of this request (TOOL_CALL events, not asked for here, come before it) */
    job->finished = 1;
    job->failed = ev->kind == MLXRT_EVENT_KIND_ERROR;
    if (job->failed) snprintf(job->text, sizeof job->text, "error: %s", ev->error_message);
    job->usage = ev->usage;
    pending--;
    pthread_cond_signal(&cv);
  }
  pthread_mutex_unlock(&mu);
}

/* A host thread: submits one request and returns; it does not wait for the
 * answer (submit never blocks on generation). */
static void *submit_one(void *arg) {
  struct job *job = arg;
  char messages[512];
  snprintf(messages, sizeof messages, "[{\"role\": \"user\", \"content\": \"%s\"}]",
           QUESTIONS[job->index % (int)(sizeof QUESTIONS / sizeof *QUESTIONS)]);
  mlxrt_request_params params;
  mlxrt_request_params_init(&params);
  params.messages_json = messages;
  params.max_tokens = job->max_tokens;
  mlxrt_error *error = NULL;
  /* No request handle needed (out_request = NULL): we never cancel. */
  if (mlxrt_request_submit(job->engine, &params, on_event, job, NULL, NULL, &error) != MLXRT_STATUS_OK) {
    pthread_mutex_lock(&mu);
    snprintf(job->text, sizeof job->text, "submit failed: %s", mlxrt_error_message(error));
    job->finished = job->failed = 1;
    pending--; /* no events will come for it */
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
    mlxrt_error_free(error);
  }
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL_PATH [N_REQUESTS] [MAX_TOKENS]\n", argv[0]);
    return 2;
  }
  int n = argc > 2 ? atoi(argv[2]) : 4;
  unsigned max_tokens = argc > 3 ? (unsigned)atoi(argv[3]) : 64;
  if (n < 1 || n > MAX_REQUESTS) n = 4;

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

  static struct job jobs[MAX_REQUESTS];
  pthread_t threads[MAX_REQUESTS];
  pending = n;
  for (int i = 0; i < n; i++) {
    jobs[i] = (struct job){.index = i, .engine = engine, .max_tokens = max_tokens};
    pthread_create(&threads[i], NULL, submit_one, &jobs[i]);
  }
  for (int i = 0; i < n; i++) pthread_join(threads[i], NULL);

  pthread_mutex_lock(&mu);
  while (pending > 0) pthread_cond_wait(&cv, &mu);
  pthread_mutex_unlock(&mu);

  int failed = 0;
  for (int i = 0; i < n; i++) {
    const struct job *j = &jobs[i];
    printf("--- request %d: %s\n%s\n[%u tokens, %.1f tok/s]\n", i,
           QUESTIONS[i % (int)(sizeof QUESTIONS / sizeof *QUESTIONS)], j->text, j->usage.completion_tokens,
           j->usage.decode_tokens_per_s);
    failed |= j->failed;
  }
  /* Every request has ended, so nothing refers to `jobs` any more. */
  mlxrt_engine_destroy(engine);
  return failed;
}
