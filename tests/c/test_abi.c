/* C ABI tests against the real default model. Built and run by
 * tests/c_abi.rs (plain, under AddressSanitizer and under valgrind).
 *
 *   test_abi MODEL_PATH SCRATCH_DIR
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "mlxrt.h"

/* ---- a recording callback ---- */

struct rec {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int deltas;
  int logprob_mismatch; /* deltas whose logprobs do not line up with tokens */
  int terminals;
  int tool_calls; /* TOOL_CALL events (not terminal) */
  int events_after_terminal;
  int freed; /* user_data_free calls */
  int last_kind;
  int finish_reason;
  int error_status;
  uint32_t completion_tokens;
  uint32_t cached_tokens;
  uint32_t n_tokens; /* token ids seen in deltas */
  char text[16384];
  size_t text_len;
  char error_message[512];
  mlxrt_request *cancel_after_first; /* cancel from inside the callback */
};

static void rec_init(struct rec *r) {
  memset(r, 0, sizeof *r);
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
}

static void on_event(void *ud, const mlxrt_event *ev) {
  struct rec *r = ud;
  pthread_mutex_lock(&r->mu);
  if (r->terminals > 0) r->events_after_terminal++;
  r->last_kind = ev->kind;
  if (ev->kind == MLXRT_EVENT_KIND_DELTA) {
    r->deltas++;
    r->n_tokens += (uint32_t)ev->n_tokens;
    if (ev->n_logprobs != 0 && (ev->n_logprobs != ev->n_tokens || ev->logprobs[0].token != ev->tokens[0] ||
                                ev->logprobs[0].logprob > 0 || ev->logprobs[0].n_top != 3 ||
                                ev->logprobs[0].top[0].logprob < ev->logprobs[0].top[2].logprob))
      r->logprob_mismatch++;
    if (strlen(ev->text) != ev->text_len) r->events_after_terminal += 1000; /* NUL/len mismatch */
    if (r->text_len + ev->text_len < sizeof r->text) {
      memcpy(r->text + r->text_len, ev->text, ev->text_len);
      r->text_len += ev->text_len;
      r->text[r->text_len] = 0;
    }
    if (r->cancel_after_first) {
      mlxrt_request_cancel(r->cancel_after_first, NULL);
      r->cancel_after_first = NULL;
    }
  } else if (ev->kind == MLXRT_EVENT_KIND_TOOL_CALL) {
    r->tool_calls++;
  } else {
    r->terminals++;
    r->finish_reason = ev->finish_reason;
    r->completion_tokens = ev->usage.completion_tokens;
    r->cached_tokens = ev->usage.cached_tokens;
    r->error_status = ev->error_status;
    snprintf(r->error_message, sizeof r->error_message, "%s", ev->error_message);
  }
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

static void on_free(void *ud) {
  struct rec *r = ud;
  pthread_mutex_lock(&r->mu);
  r->freed++;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

/* Waits until `freed` (the very last thing for a request). A request that
 * never ends is a failure; the program stops, since the engine still points
 * at `r`. */
static void rec_wait(struct rec *r) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  t.tv_sec += 1800;
  int rc = 0;
  pthread_mutex_lock(&r->mu);
  while (r->freed == 0 && rc == 0) rc = pthread_cond_timedwait(&r->cv, &r->mu, &t);
  pthread_mutex_unlock(&r->mu);
  if (r->freed == 0) {
    fprintf(stderr, "FAIL a request did not end within 30 minutes\n");
    exit(1);
  }
}

static void rec_wait_deltas(struct rec *r, int n) {
  pthread_mutex_lock(&r->mu);
  while (r->deltas < n && r->terminals == 0) pthread_cond_wait(&r->cv, &r->mu);
  pthread_mutex_unlock(&r->mu);
}

static const char *CHAT = "[{\"role\": \"user\", \"content\": \"What is the capital of France?\"}]";

static mlxrt_status submit(mlxrt_engine *e, mlxrt_request_params *p, struct rec *r, mlxrt_request **out,
                           mlxrt_error **err) {
  return mlxrt_request_submit(e, p, on_event, r, on_free, out, err);
}

/* Expects `st` with an error object in `*errp` of the same status and a
 * message; frees it and resets `*errp`. */
static void expect_error(mlxrt_status st, mlxrt_error **errp, mlxrt_status want, const char *what) {
  mlxrt_error *err = *errp;
  *errp = NULL;
  CHECK(st == want, "%s: status %d (%s), want %d", what, st, mlxrt_status_name(st), want);
  CHECK(err != NULL, "%s: no error object", what);
  if (err) {
    CHECK(mlxrt_error_status(err) == want, "%s: error object status %d", what, mlxrt_error_status(err));
    CHECK(strlen(mlxrt_error_message(err)) > 5, "%s: empty message", what);
    fprintf(stderr, "  ok %s -> %s: %s\n", what, mlxrt_status_name(st), mlxrt_error_message(err));
  }
  mlxrt_error_free(err);
}

/* expect_error, and the message must contain `needle`. */
static void expect_error_naming(mlxrt_status st, mlxrt_error **errp, mlxrt_status want, const char *what,
                                const char *needle) {
  const char *msg = *errp ? mlxrt_error_message(*errp) : "";
  CHECK(strstr(msg, needle) != NULL, "%s: message \"%s\" lacks \"%s\"", what, msg, needle);
  expect_error(st, errp, want, what);
}

/* ---- tests ---- */
/* Under valgrind only the tests that generate nothing run ("quick" mode):
 * generation there is ~100x slower. AddressSanitizer runs them all. */

static void test_versions(void) {
  CHECK(mlxrt_abi_version() == MLXRT_ABI_VERSION, "abi %u", mlxrt_abi_version());
  CHECK(strcmp(mlxrt_version_string(), MLXRT_VERSION) == 0, "version %s", mlxrt_version_string());
  CHECK(strcmp(mlxrt_status_name(MLXRT_STATUS_BUSY), "busy") == 0, "status name");
  CHECK(strcmp(mlxrt_status_name(12345), "unknown status") == 0, "unknown status name");
  /* NULL-tolerant getters and frees */
  CHECK(mlxrt_error_status(NULL) == MLXRT_STATUS_INVALID_ARGUMENT, "error_status(NULL)");
  CHECK(strcmp(mlxrt_error_message(NULL), "") == 0, "error_message(NULL)");
  mlxrt_error_free(NULL);
  mlxrt_engine_destroy(NULL);
  mlxrt_request_free(NULL);
  mlxrt_engine_config_init(NULL);
  mlxrt_request_params_init(NULL);
  CHECK(mlxrt_request_id(NULL) == 0, "request_id(NULL)");
}

static void test_create_errors(const char *scratch) {
  mlxrt_engine_config c;
  mlxrt_engine *e = (mlxrt_engine *)0x1;
  mlxrt_error *err = NULL;

  expect_error(mlxrt_engine_create(NULL, &e, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "NULL config");
  CHECK(e == NULL, "out_engine not cleared");
  mlxrt_engine_config_init(&c);
  CHECK(mlxrt_engine_create(&c, NULL, NULL) == MLXRT_STATUS_INVALID_ARGUMENT, "NULL out_engine");
  expect_error(mlxrt_engine_create(&c, &e, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "NULL model_path");

  c.model_path = "/nonexistent/model.gguf";
  expect_error(mlxrt_engine_create(&c, &e, &err), &err, MLXRT_STATUS_MODEL_LOAD, "missing model path");
  CHECK(mlxrt_engine_create(&c, &e, NULL) == MLXRT_STATUS_MODEL_LOAD, "NULL error pointer is allowed");

  char bad_utf8[] = {'/', 't', 'm', 'p', '/', (char)0xff, (char)0xfe, 0};
  c.model_path = bad_utf8;
  expect_error(mlxrt_engine_create(&c, &e, &err), &err, MLXRT_STATUS_INVALID_UTF8, "invalid UTF-8 path");

  /* a model folder with a broken config.json */
  char dir[1024], file[1100];
  snprintf(dir, sizeof dir, "%s/broken_model", scratch);
  snprintf(file, sizeof file, "%s/config.json", dir);
  mkdir(dir, 0755);
  FILE *f = fopen(file, "w");
  CHECK(f != NULL, "cannot write %s", file);
  if (f) {
    fputs("{\"model_type\": \"llama\", \"hidden_size\": ", f);
    fclose(f);
  }
  c.model_path = dir;
  expect_error(mlxrt_engine_create(&c, &e, &err), &err, MLXRT_STATUS_MODEL_LOAD, "broken config.json");

  /* an unknown architecture */
  f = fopen(file, "w");
  if (f) {
    fputs("{\"model_type\": \"not_a_model\"}", f);
    fclose(f);
  }
  expect_error(mlxrt_engine_create(&c, &e, &err), &err, MLXRT_STATUS_UNSUPPORTED, "unknown model_type");

  /* A 64-byte GGUF whose first metadata key claims 2^63 bytes: MLX's own
   * reader follows that length and crashed the process; now MODEL_LOAD. */
  snprintf(file, sizeof file, "%s/hostile.gguf", scratch);
  f = fopen(file, "wb");
  CHECK(f != NULL, "cannot write %s", file);
  if (f) {
    unsigned char g[64] = {'G', 'G', 'U', 'F', 3};    /* magic, version 3 (LE) */
    g[16] = 1;                                          /* 0 tensors (u64 at 8), 1 metadata entry (u64 at 16) */
    g[31] = 0x80;                                       /* key length 2^63 (LE u64 at 24) */
    fwrite(g, 1, sizeof g, f);
    fclose(f);
  }
  c.model_path = file;
  expect_error_naming(mlxrt_engine_create(&c, &e, &err), &err, MLXRT_STATUS_MODEL_LOAD, "hostile GGUF",
                      "key 0");
  CHECK(e == NULL, "out_engine set after a failed create");

  mlxrt_engine_config_init(&c);
  c.model_path = "x";
  c.struct_size = 8;
  expect_error(mlxrt_engine_create(&c, &e, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "struct_size too small");
  mlxrt_engine_config_init(&c);
  c.model_path = "x";
  c.device = 42;
  expect_error(mlxrt_engine_create(&c, &e, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "bad device");
}

/* A caller built against a newer header passes a larger struct: fine when the
 * fields this library does not know are zero, an error when they are set. */
static void test_struct_size_growth(mlxrt_engine *e) {
  struct {
    mlxrt_request_params p;
    uint64_t future_field;
  } big;
  memset(&big, 0, sizeof big);
  mlxrt_request_params_init(&big.p);
  big.p.struct_size = sizeof big;
  big.p.messages_json = CHAT;
  big.p.max_tokens = 2;
  struct rec r;
  rec_init(&r);
  mlxrt_error *err = NULL;
  mlxrt_status st = submit(e, &big.p, &r, NULL, &err);
  CHECK(st == MLXRT_STATUS_OK, "larger struct with zero tail: %s", mlxrt_error_message(err));
  if (st == MLXRT_STATUS_OK) rec_wait(&r);
  mlxrt_error_free(err);
  err = NULL;
  big.future_field = 7;
  expect_error(submit(e, &big.p, &r, NULL, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT,
               "larger struct with unknown field set");
}

/* A struct_size far beyond the struct (uninitialized memory, a bad cast) is
 * refused before anything past the known fields is read. Each struct ends
 * right before an unreadable page, so a read past it crashes at once in every
 * build, not only under the sanitizers. */
static void test_absurd_struct_sizes(mlxrt_engine *e, const char *model) {
  const size_t sizes[] = {(size_t)1 << 20, (size_t)1 << 40, SIZE_MAX, MLXRT_STRUCT_SIZE_MAX + 1};
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  char *mem = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(mem != MAP_FAILED, "mmap");
  if (mem == MAP_FAILED) return;
  CHECK(mprotect(mem + page, page, PROT_NONE) == 0, "mprotect");
  char *end = mem + page;
  mlxrt_request_params *p = (mlxrt_request_params *)(end - sizeof *p);
  mlxrt_engine_config *c = (mlxrt_engine_config *)(end - sizeof *c);
  mlxrt_engine_stats *stats = (mlxrt_engine_stats *)(end - sizeof *stats);
  mlxrt_engine_info *info = (mlxrt_engine_info *)(end - sizeof *info);
  struct rec r;
  rec_init(&r);
  mlxrt_error *err = NULL;
  char what[128];
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t size = sizes[i];
    mlxrt_request_params_init(p);
    p->messages_json = CHAT;
    p->struct_size = size;
    mlxrt_request *req = (mlxrt_request *)0x1;
    snprintf(what, sizeof what, "submit with params.struct_size %zu", size);
    expect_error_naming(submit(e, p, &r, &req, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, what,
                        "MLXRT_STRUCT_SIZE_MAX");
    CHECK(req == NULL, "%s: out_request not cleared", what);
    mlxrt_stream *s = (mlxrt_stream *)0x1;
    snprintf(what, sizeof what, "submit_stream with params.struct_size %zu", size);
    expect_error_naming(mlxrt_request_submit_stream(e, p, &s, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, what,
                        "params.struct_size");
    CHECK(s == NULL, "%s: out_stream not cleared", what);

    mlxrt_engine_config_init(c);
    c->model_path = model;
    c->struct_size = size;
    mlxrt_engine *created = (mlxrt_engine *)0x1;
    snprintf(what, sizeof what, "engine_create with config.struct_size %zu", size);
    expect_error_naming(mlxrt_engine_create(c, &created, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, what,
                        "config.struct_size");
    CHECK(created == NULL, "%s: out_engine not cleared", what);

    memset(stats, 0, sizeof *stats);
    stats->struct_size = size;
    snprintf(what, sizeof what, "get_stats with struct_size %zu", size);
    expect_error_naming(mlxrt_engine_get_stats(e, stats, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, what,
                        "struct_size");
    memset(info, 0, sizeof *info);
    info->struct_size = size;
    snprintf(what, sizeof what, "get_info with struct_size %zu", size);
    expect_error_naming(mlxrt_engine_get_info(e, info, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, what,
                        "struct_size");
  }
  munmap(mem, 2 * page);
  CHECK(r.freed == 0 && r.terminals == 0, "a refused submit called back");

  /* MLXRT_STRUCT_SIZE_MAX itself is a (future) size: accepted. */
  static union {
    mlxrt_engine_stats s;
    char bytes[MLXRT_STRUCT_SIZE_MAX];
  } big;
  memset(&big, 0, sizeof big);
  big.s.struct_size = MLXRT_STRUCT_SIZE_MAX;
  CHECK(mlxrt_engine_get_stats(e, &big.s, NULL) == MLXRT_STATUS_OK && big.s.struct_size == MLXRT_STRUCT_SIZE_MAX,
        "stats with struct_size MLXRT_STRUCT_SIZE_MAX");
}

static void test_submit_errors(mlxrt_engine *e) {
  mlxrt_request_params p;
  struct rec r;
  rec_init(&r);
  mlxrt_request *req = (mlxrt_request *)0x1;
  mlxrt_error *err = NULL;

  mlxrt_request_params_init(&p);
  p.messages_json = CHAT;
  expect_error(mlxrt_request_submit(NULL, &p, on_event, &r, on_free, &req, &err), &err,
               MLXRT_STATUS_INVALID_ARGUMENT, "NULL engine");
  CHECK(req == NULL, "out_request not cleared");
  expect_error(submit(e, NULL, &r, &req, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "NULL params");
  expect_error(mlxrt_request_submit(e, &p, NULL, &r, on_free, &req, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT,
               "NULL callback");

  mlxrt_request_params_init(&p);
  expect_error(submit(e, &p, &r, &req, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "no input");
  p.messages_json = CHAT;
  p.prompt = "hello";
  expect_error(submit(e, &p, &r, &req, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "two inputs");

  mlxrt_request_params_init(&p);
  char bad[] = {'h', 'i', ' ', (char)0xc3, (char)0x28, 0};
  p.prompt = bad;
  expect_error(submit(e, &p, &r, &req, &err), &err, MLXRT_STATUS_INVALID_UTF8, "invalid UTF-8 prompt");

  mlxrt_request_params_init(&p);
  p.messages_json = "[{\"role\": \"user\", \"content\": \"hi\"";
  expect_error(submit(e, &p, &r, &req, &err), &err, MLXRT_STATUS_INVALID_JSON, "malformed messages JSON");
  p.messages_json = "{\"role\": \"user\"}";
  expect_error(submit(e, &p, &r, &req, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "messages not an array");
  /* well-formed JSON of the wrong shape is INVALID_ARGUMENT, naming what is wrong */
  p.messages_json = "[1, 2, 3]";
  expect_error_naming(submit(e, &p, &r, &req, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "messages of numbers",
                      "messages[0]");
  p.messages_json = "[]";
  expect_error_naming(submit(e, &p, &r, &req, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "no messages", "empty");
  p.messages_json = "[{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"wizard\", \"content\": \"hi\"}]";
  expect_error_naming(submit(e, &p, &r, &req, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "unknown role",
                      "messages[1].role \"wizard\"");
  mlxrt_stream *s = (mlxrt_stream *)0x1;
  expect_error_naming(mlxrt_request_submit_stream(e, &p, &s, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT,
                      "stream with an unknown role", "wizard");
  CHECK(s == NULL, "out_stream not cleared");

  mlxrt_request_params_init(&p);
  p.messages_json = CHAT;
  p.options_json = "{\"temprature\": 0.5}";
  expect_error(submit(e, &p, &r, &req, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "unknown option");
  p.options_json = "{\"temperature\": ";
  expect_error(submit(e, &p, &r, &req, &err), &err, MLXRT_STATUS_INVALID_JSON, "malformed options JSON");
  p.options_json = "[\"temperature\"]";
  expect_error_naming(submit(e, &p, &r, &req, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "options not an object",
                      "params.options_json");
  p.options_json = NULL;
  p.temperature = -1.0f;
  expect_error(submit(e, &p, &r, &req, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "negative temperature");

  mlxrt_request_params_init(&p);
  uint32_t bad_ids[] = {1, 999999};
  p.prompt_tokens = bad_ids;
  p.n_prompt_tokens = 2;
  expect_error(submit(e, &p, &r, &req, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "token id out of vocabulary");

  mlxrt_request_params_init(&p);
  p.messages_json = CHAT;
  const char *stops[] = {"ok", NULL};
  p.stop = stops;
  p.n_stop = 2;
  expect_error(submit(e, &p, &r, &req, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "NULL stop string");
  p.n_stop = 1;
  p.stop = NULL;
  expect_error(submit(e, &p, &r, &req, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "NULL stop array");

  mlxrt_request_params_init(&p);
  p.messages_json = CHAT;
  p.thinking = 5;
  expect_error(submit(e, &p, &r, &req, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "thinking not -1/0/1");
  p.thinking = -1;
  p.options_json = "{\"tools\": {\"name\": \"f\"}}";
  expect_error(submit(e, &p, &r, &req, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "tools not an array");

  mlxrt_request_params_init(&p);
  p.messages_json = CHAT;
  p.struct_size = 4;
  expect_error(submit(e, &p, &r, &req, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "params struct_size");

  /* oversized input: longer than the context, or never fitting in KV memory */
  static uint32_t many[9000];
  for (size_t i = 0; i < 9000; i++) many[i] = 100 + (uint32_t)(i % 1000);
  mlxrt_request_params_init(&p);
  p.prompt_tokens = many;
  p.n_prompt_tokens = 9000;
  expect_error(submit(e, &p, &r, &req, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "prompt longer than the context");

  CHECK(mlxrt_request_cancel(NULL, NULL) == MLXRT_STATUS_INVALID_ARGUMENT, "cancel(NULL)");
  mlxrt_engine_stats st = {0};
  expect_error(mlxrt_engine_get_stats(NULL, &st, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "stats of NULL engine");
  expect_error(mlxrt_engine_get_stats(e, NULL, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "stats into NULL");
  expect_error(mlxrt_engine_get_stats(e, &st, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "stats struct_size 0");
  CHECK(r.freed == 0 && r.deltas == 0 && r.terminals == 0, "failed submits must not call back (%d %d %d)",
        r.freed, r.deltas, r.terminals);
}

/* The chat, answered in 32 tokens at most. */
static void chat_params(mlxrt_request_params *p) {
  mlxrt_request_params_init(p);
  p->messages_json = CHAT;
  p->max_tokens = 32;
}

/* Streams the chat's answer into `r` and waits for its end; returns the
 * request (NULL when the submit failed). */
static mlxrt_request *chat_to_end(mlxrt_engine *e, struct rec *r, const char *what) {
  mlxrt_request_params p;
  chat_params(&p);
  rec_init(r);
  mlxrt_request *req = NULL;
  mlxrt_error *err = NULL;
  CHECK(submit(e, &p, r, &req, &err) == MLXRT_STATUS_OK, "submit (%s): %s", what, mlxrt_error_message(err));
  mlxrt_error_free(err);
  if (req) rec_wait(r);
  return req;
}

static void test_streaming(mlxrt_engine *e) {
  struct rec r;
  mlxrt_request *req = chat_to_end(e, &r, "streaming");
  CHECK(req != NULL && mlxrt_request_id(req) != 0, "request handle");
  CHECK(r.deltas >= 2, "deltas %d", r.deltas);
  CHECK(strstr(r.text, "Paris") != NULL, "answer %s", r.text);
  CHECK(r.terminals == 1 && r.freed == 1 && r.events_after_terminal == 0, "terminal %d free %d after %d",
        r.terminals, r.freed, r.events_after_terminal);
  CHECK(r.last_kind == MLXRT_EVENT_KIND_DONE && r.finish_reason == MLXRT_FINISH_REASON_STOP, "finish %d",
        r.finish_reason);
  CHECK(r.n_tokens >= 1 && r.n_tokens <= r.completion_tokens, "tokens %u / %u", r.n_tokens,
        r.completion_tokens);
  /* stats: the request ended, so it no longer counts as in flight */
  mlxrt_engine_stats st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  CHECK(mlxrt_engine_get_stats(e, &st, NULL) == MLXRT_STATUS_OK, "get_stats");
  CHECK(st.in_flight == 0 && st.completed >= 1 && st.active_memory > 0, "stats in_flight %llu completed %llu",
        (unsigned long long)st.in_flight, (unsigned long long)st.completed);
  /* an older caller's smaller struct gets only the fields it knows */
  struct {
    size_t struct_size;
    uint64_t queued;
    uint64_t canary;
  } old = {sizeof(size_t) + sizeof(uint64_t), 99, 12345};
  CHECK(mlxrt_engine_get_stats(e, (mlxrt_engine_stats *)&old, NULL) == MLXRT_STATUS_OK && old.canary == 12345,
        "short stats struct overwritten");
  /* a handle freed while its request runs: the request goes on to its end */
  mlxrt_request_params p;
  chat_params(&p);
  struct rec early;
  rec_init(&early);
  mlxrt_request *h = NULL;
  CHECK(submit(e, &p, &early, &h, NULL) == MLXRT_STATUS_OK, "submit (early free)");
  mlxrt_request_free(h);
  rec_wait(&early);
  CHECK(early.terminals == 1 && early.last_kind == MLXRT_EVENT_KIND_DONE && early.deltas > 0, "early free: %d %d",
        early.terminals, early.deltas);
  /* cancel after the end is harmless */
  CHECK(mlxrt_request_cancel(req, NULL) == MLXRT_STATUS_OK, "late cancel");
  mlxrt_request_free(req);
  fprintf(stderr, "  ok streaming: %s\n", r.text);
}

/* Tools and thinking are accepted (SmolLM2's template ignores them). */
static void test_tools_option(mlxrt_engine *e) {
  mlxrt_request_params p;
  mlxrt_request_params_init(&p);
  p.messages_json = CHAT;
  p.max_tokens = 4;
  p.thinking = 0;
  p.options_json =
      "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
      "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}]}";
  struct rec r;
  rec_init(&r);
  CHECK(submit(e, &p, &r, NULL, NULL) == MLXRT_STATUS_OK, "submit with tools");
  rec_wait(&r);
  CHECK(r.terminals == 1 && r.last_kind == MLXRT_EVENT_KIND_DONE, "tools request ended with %d", r.last_kind);
}

static void test_logprobs(mlxrt_engine *e) {
  mlxrt_request_params p;
  mlxrt_request_params_init(&p);
  p.messages_json = CHAT;
  p.max_tokens = 8;
  p.logprobs = 1;
  p.top_logprobs = 3;
  struct rec r;
  rec_init(&r);
  CHECK(submit(e, &p, &r, NULL, NULL) == MLXRT_STATUS_OK, "submit logprobs");
  rec_wait(&r);
  CHECK(r.deltas > 0 && r.logprob_mismatch == 0, "logprobs: %d deltas, %d mismatched", r.deltas,
        r.logprob_mismatch);
  mlxrt_error *err = NULL;
  p.top_logprobs = 21;
  expect_error(submit(e, &p, &r, NULL, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "top_logprobs > 20");
}

static void test_stop_and_length(mlxrt_engine *e) {
  mlxrt_request_params p;
  mlxrt_request_params_init(&p);
  p.messages_json = CHAT;
  const char *stops[] = {"zzz", "Paris"};
  p.stop = stops;
  p.n_stop = 2;
  struct rec r;
  rec_init(&r);
  CHECK(submit(e, &p, &r, NULL, NULL) == MLXRT_STATUS_OK, "submit stop");
  rec_wait(&r);
  CHECK(r.finish_reason == MLXRT_FINISH_REASON_STOP && strstr(r.text, "Paris") == NULL, "stop string: %s",
        r.text);

  mlxrt_request_params_init(&p);
  p.messages_json = CHAT;
  p.options_json = "{\"max_tokens\": 3, \"ignore_eos\": true}";
  rec_init(&r);
  CHECK(submit(e, &p, &r, NULL, NULL) == MLXRT_STATUS_OK, "submit length");
  rec_wait(&r);
  CHECK(r.finish_reason == MLXRT_FINISH_REASON_LENGTH && r.completion_tokens == 3, "length: %d %u",
        r.finish_reason, r.completion_tokens);
}

static void test_cancel(mlxrt_engine *e) {
  mlxrt_request_params p;
  mlxrt_request_params_init(&p);
  p.messages_json = CHAT;
  p.options_json = "{\"max_tokens\": 200, \"ignore_eos\": true}";

  /* cancel from the host thread after the first delta */
  struct rec r;
  rec_init(&r);
  mlxrt_request *req = NULL;
  CHECK(submit(e, &p, &r, &req, NULL) == MLXRT_STATUS_OK, "submit");
  rec_wait_deltas(&r, 1);
  CHECK(mlxrt_request_cancel(req, NULL) == MLXRT_STATUS_OK, "cancel");
  CHECK(mlxrt_request_cancel(req, NULL) == MLXRT_STATUS_OK, "second cancel");
  rec_wait(&r);
  CHECK(r.finish_reason == MLXRT_FINISH_REASON_CANCELLED, "finish %d", r.finish_reason);
  CHECK(r.completion_tokens < 200, "generated %u", r.completion_tokens);
  CHECK(r.terminals == 1 && r.freed == 1 && r.events_after_terminal == 0, "terminal guarantees");
  mlxrt_request_free(req);

  /* cancel from inside the callback */
  rec_init(&r);
  CHECK(submit(e, &p, &r, &req, NULL) == MLXRT_STATUS_OK, "submit");
  pthread_mutex_lock(&r.mu);
  if (r.deltas == 0) r.cancel_after_first = req;
  pthread_mutex_unlock(&r.mu);
  rec_wait(&r);
  CHECK(r.finish_reason == MLXRT_FINISH_REASON_CANCELLED, "finish from callback %d", r.finish_reason);
  CHECK(r.terminals == 1 && r.freed == 1 && r.events_after_terminal == 0, "terminal guarantees (callback)");
  mlxrt_request_free(req);

  /* cancel while queued: a second request behind a long one */
  struct rec a, b;
  rec_init(&a);
  rec_init(&b);
  mlxrt_request *ra = NULL, *rb = NULL;
  CHECK(submit(e, &p, &a, &ra, NULL) == MLXRT_STATUS_OK, "submit a");
  CHECK(submit(e, &p, &b, &rb, NULL) == MLXRT_STATUS_OK, "submit b");
  mlxrt_request_cancel(rb, NULL);
  rec_wait(&b);
  CHECK(b.finish_reason == MLXRT_FINISH_REASON_CANCELLED && b.deltas == 0, "queued cancel: %d deltas %d",
        b.finish_reason, b.deltas);
  mlxrt_request_cancel(ra, NULL);
  rec_wait(&a);
  CHECK(a.terminals == 1 && a.freed == 1, "a ended");
  mlxrt_request_free(ra);
  mlxrt_request_free(rb);
}

/* `wait_first`: destroy after the first delta (else right after submitting). */
static void test_destroy_in_flight(const char *model, int wait_first) {
  mlxrt_engine_config c;
  mlxrt_engine_config_init(&c);
  c.model_path = model;
  mlxrt_engine *e = NULL;
  CHECK(mlxrt_engine_create(&c, &e, NULL) == MLXRT_STATUS_OK, "create");
  if (!e) return;
  mlxrt_request_params p;
  mlxrt_request_params_init(&p);
  p.messages_json = CHAT;
  p.options_json = "{\"max_tokens\": 500, \"ignore_eos\": true}";
  struct rec a, b;
  rec_init(&a);
  rec_init(&b);
  mlxrt_request *ra = NULL;
  CHECK(submit(e, &p, &a, &ra, NULL) == MLXRT_STATUS_OK, "submit a");
  CHECK(submit(e, &p, &b, NULL, NULL) == MLXRT_STATUS_OK, "submit b (queued)");
  if (wait_first) rec_wait_deltas(&a, 1);
  mlxrt_engine_destroy(e);
  /* destroy returns after every terminal event was delivered */
  CHECK(a.terminals == 1 && a.freed == 1 && a.finish_reason == MLXRT_FINISH_REASON_CANCELLED,
        "in-flight request: terminal %d freed %d finish %d", a.terminals, a.freed, a.finish_reason);
  CHECK(b.terminals == 1 && b.freed == 1 && b.finish_reason == MLXRT_FINISH_REASON_CANCELLED,
        "queued request: terminal %d freed %d finish %d", b.terminals, b.freed, b.finish_reason);
  /* the handle outlives the engine */
  CHECK(mlxrt_request_cancel(ra, NULL) == MLXRT_STATUS_OK, "cancel after destroy");
  mlxrt_request_free(ra);
}

/* A chat whose system prompt is long enough for a prompt-cache snapshot. */
static void long_chat(char *out, size_t cap, const char *question) {
  snprintf(out, cap, "[{\"role\": \"system\", \"content\": \"");
  for (int i = 0; i < 40; i++)
    strncat(out, "The shop ships orders above fifty euros for free and accepts returns for a month. ",
            cap - strlen(out) - 1);
  strncat(out, "\"}, {\"role\": \"user\", \"content\": \"", cap - strlen(out) - 1);
  strncat(out, question, cap - strlen(out) - 1);
  strncat(out, "\"}]", cap - strlen(out) - 1);
}

static size_t count_files(const char *dir) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "ls -A '%s' 2>/dev/null | wc -l", dir);
  FILE *p = popen(cmd, "r");
  size_t n = 0;
  if (p) {
    if (fscanf(p, "%zu", &n) != 1) n = 0;
    pclose(p);
  }
  return n;
}

static void test_prompt_cache(const char *model, const char *scratch) {
  char dir[1100];
  snprintf(dir, sizeof dir, "%s/prompt_cache", scratch);
  mlxrt_engine_config c;
  mlxrt_engine_config_init(&c);
  c.model_path = model;
  c.prompt_cache_dir = dir;
  mlxrt_engine *e = NULL;
  mlxrt_error *err = NULL;
  CHECK(mlxrt_engine_create(&c, &e, &err) == MLXRT_STATUS_OK, "create with a cache dir: %s", mlxrt_error_message(err));
  if (!e) return;
  static char q1[8192], q2[8192];
  long_chat(q1, sizeof q1, "Do you ship for free?");
  long_chat(q2, sizeof q2, "Can I return things?");
  mlxrt_request_params p;
  mlxrt_request_params_init(&p);
  p.max_tokens = 4;
  p.messages_json = q1;
  struct rec r;
  rec_init(&r);
  CHECK(submit(e, &p, &r, NULL, NULL) == MLXRT_STATUS_OK, "first");
  rec_wait(&r);
  CHECK(r.cached_tokens == 0, "first request cached %u", r.cached_tokens);
  /* same system prompt: a hit; another namespace or an opt-out: a miss */
  p.messages_json = q2;
  rec_init(&r);
  submit(e, &p, &r, NULL, NULL);
  rec_wait(&r);
  CHECK(r.cached_tokens >= 256, "second request cached %u", r.cached_tokens);
  p.cache_namespace = "other-user";
  rec_init(&r);
  submit(e, &p, &r, NULL, NULL);
  rec_wait(&r);
  CHECK(r.cached_tokens == 0, "other namespace cached %u", r.cached_tokens);
  p.cache_namespace = NULL;
  /* a session sees only its own entries (none yet), then its own */
  p.cache_session_id = "conversation-1";
  for (int i = 0; i < 2; i++) {
    rec_init(&r);
    submit(e, &p, &r, NULL, NULL);
    rec_wait(&r);
    CHECK(i ? r.cached_tokens >= 256 : r.cached_tokens == 0, "session request %d cached %u", i, r.cached_tokens);
  }
  char bad_session[] = {'s', (char)0xfe, 0};
  p.cache_session_id = bad_session;
  expect_error(submit(e, &p, &r, NULL, &err), &err, MLXRT_STATUS_INVALID_UTF8, "invalid UTF-8 session id");
  p.cache_session_id = NULL;
  p.no_prompt_cache = 1;
  rec_init(&r);
  submit(e, &p, &r, NULL, NULL);
  rec_wait(&r);
  CHECK(r.cached_tokens == 0, "opted out but cached %u", r.cached_tokens);
  char bad[] = {'n', (char)0xff, 0};
  p.no_prompt_cache = 0;
  p.cache_namespace = bad;
  expect_error(submit(e, &p, &r, NULL, &err), &err, MLXRT_STATUS_INVALID_UTF8, "invalid UTF-8 namespace");

  mlxrt_engine_stats st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  mlxrt_engine_get_stats(e, &st, NULL);
  /* every model call is a FORWARD span; lookups and snapshots are spans too */
  const mlxrt_span_stats *fw = &st.spans[MLXRT_SPAN_FORWARD];
  CHECK(st.iterations > 0 && st.model_calls > 0 && fw->count == st.model_calls && fw->total_ms > 0 &&
            st.mixed_steps <= st.model_calls &&
            fw->p95_ms > 0 && st.spans[MLXRT_SPAN_LOOKUP_RESTORE].count >= 5 &&
            st.spans[MLXRT_SPAN_SNAPSHOT].count >= 1,
        "iterations %llu model calls %llu forward spans %llu (%.3f ms, p95 %.3f ms)",
        (unsigned long long)st.iterations, (unsigned long long)st.model_calls, (unsigned long long)fw->count,
        fw->total_ms, fw->p95_ms);
  CHECK(st.prompt_cache_hits >= 1 && st.prompt_cache_hit_tokens >= 256 && st.prompt_cache_memory_bytes > 0,
        "cache stats hits %llu tokens %llu bytes %llu", (unsigned long long)st.prompt_cache_hits,
        (unsigned long long)st.prompt_cache_hit_tokens, (unsigned long long)st.prompt_cache_memory_bytes);

  CHECK(mlxrt_engine_flush_prompt_cache(e, &err) == MLXRT_STATUS_OK, "flush: %s", mlxrt_error_message(err));
  CHECK(count_files(dir) >= 1, "flush wrote no file to %s", dir);
  expect_error(mlxrt_engine_clear_prompt_cache(e, 0x10, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "clear flags");
  CHECK(mlxrt_engine_clear_prompt_cache(e, MLXRT_CLEAR_DISK, NULL) == MLXRT_STATUS_OK, "clear");
  CHECK(count_files(dir) == 0, "clear left %zu files", count_files(dir));
  p.cache_namespace = NULL;
  rec_init(&r);
  submit(e, &p, &r, NULL, NULL);
  rec_wait(&r);
  CHECK(r.cached_tokens == 0, "cleared cache still hit %u", r.cached_tokens);
  mlxrt_engine_destroy(e);
  expect_error(mlxrt_engine_flush_prompt_cache(NULL, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "flush(NULL)");
  expect_error(mlxrt_engine_clear_prompt_cache(NULL, 0, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "clear(NULL)");
}

/* ---- pull streams ---- */

static void test_stream(mlxrt_engine *e) {
  mlxrt_request_params p;
  mlxrt_request_params_init(&p);
  p.messages_json = CHAT;
  p.max_tokens = 16;
  mlxrt_stream *s = NULL;
  mlxrt_error *err = NULL;
  CHECK(mlxrt_request_submit_stream(e, &p, &s, &err) == MLXRT_STATUS_OK, "submit_stream: %s",
        mlxrt_error_message(err));
  CHECK(mlxrt_stream_request_id(s) != 0, "stream request id");
  char text[4096] = "";
  int deltas = 0, terminal = 0;
  for (;;) {
    const mlxrt_event *ev = NULL;
    mlxrt_status st = mlxrt_stream_next(s, 60000, &ev, NULL);
    if (st == MLXRT_STATUS_END_OF_STREAM) break;
    CHECK(st == MLXRT_STATUS_OK && ev != NULL, "stream_next status %d", st);
    if (st != MLXRT_STATUS_OK) break;
    if (ev->kind == MLXRT_EVENT_KIND_DELTA) {
      deltas++;
      strncat(text, ev->text, sizeof text - strlen(text) - 1);
    } else {
      terminal++;
      CHECK(ev->kind == MLXRT_EVENT_KIND_DONE, "stream ended with %d", ev->kind);
    }
  }
  CHECK(deltas > 0 && terminal == 1 && strstr(text, "Paris") != NULL, "stream: %d deltas, %d terminal, %s", deltas,
        terminal, text);
  const mlxrt_event *ev = (const mlxrt_event *)0x1;
  CHECK(mlxrt_stream_next(s, 0, &ev, NULL) == MLXRT_STATUS_END_OF_STREAM && ev == NULL, "after the end");
  mlxrt_stream_free(s);

  /* timeout, cancel, and free of an unfinished stream */
  p.options_json = "{\"max_tokens\": 400, \"ignore_eos\": true}";
  CHECK(mlxrt_request_submit_stream(e, &p, &s, NULL) == MLXRT_STATUS_OK, "submit_stream 2");
  mlxrt_status st = mlxrt_stream_next(s, 0, &ev, NULL);
  CHECK(st == MLXRT_STATUS_TIMEOUT || st == MLXRT_STATUS_OK, "poll: %d", st);
  CHECK(mlxrt_stream_cancel(s, NULL) == MLXRT_STATUS_OK, "stream_cancel");
  int finish = -1;
  while (mlxrt_stream_next(s, 60000, &ev, NULL) == MLXRT_STATUS_OK)
    if (ev->kind != MLXRT_EVENT_KIND_DELTA) finish = ev->finish_reason;
  CHECK(finish == MLXRT_FINISH_REASON_CANCELLED, "cancelled stream finish %d", finish);
  mlxrt_stream_free(s);
  CHECK(mlxrt_request_submit_stream(e, &p, &s, NULL) == MLXRT_STATUS_OK, "submit_stream 3");
  mlxrt_stream_free(s); /* cancels the running request */
  mlxrt_stream_free(NULL);

  expect_error(mlxrt_request_submit_stream(e, &p, NULL, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "NULL out_stream");
  p.messages_json = "[";
  expect_error(mlxrt_request_submit_stream(e, &p, &s, &err), &err, MLXRT_STATUS_INVALID_JSON, "stream bad JSON");
  CHECK(s == NULL, "out_stream not cleared");
  expect_error(mlxrt_stream_next(NULL, 0, &ev, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "next(NULL)");
  expect_error(mlxrt_stream_cancel(NULL, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "stream_cancel(NULL)");
  CHECK(mlxrt_stream_request_id(NULL) == 0, "stream_request_id(NULL)");
}

/* ---- engine info and tokenizer access ---- */

static void test_info_and_tokenizer(mlxrt_engine *e) {
  mlxrt_engine_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  mlxrt_error *err = NULL;
  CHECK(mlxrt_engine_get_info(e, &info, &err) == MLXRT_STATUS_OK, "get_info");
  CHECK(strcmp(info.architecture, "llama") == 0 && strcmp(info.model_format, "gguf") == 0, "info %s %s",
        info.architecture, info.model_format);
  CHECK(strcmp(info.device, "cpu") == 0 && strlen(info.mlx_version) > 0, "device %s", info.device);
  CHECK(info.vocab_size == 49152 && info.num_layers == 30 && info.context_length == 8192, "dims %u %u %llu",
        info.vocab_size, info.num_layers, (unsigned long long)info.context_length);
  CHECK(info.n_eos_token_ids >= 1 && info.eos_token_ids[0] == 2 && info.has_chat_template, "eos/template");
  CHECK(info.n_special_token_ids >= 3 && info.modalities == MLXRT_MODALITY_TEXT, "special/modalities");
  expect_error(mlxrt_engine_get_info(NULL, &info, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "info(NULL)");
  expect_error(mlxrt_engine_get_info(e, NULL, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "info into NULL");
  info.struct_size = 0;
  expect_error(mlxrt_engine_get_info(e, &info, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "info struct_size 0");

  mlxrt_tokens *t = NULL;
  CHECK(mlxrt_tokenize(e, "<|im_start|>user\nHello", 1, &t, &err) == MLXRT_STATUS_OK, "tokenize");
  CHECK(mlxrt_tokens_len(t) >= 3 && mlxrt_tokens_data(t)[0] == 1, "tokenize ids");
  char *text = NULL;
  CHECK(mlxrt_detokenize(e, mlxrt_tokens_data(t), mlxrt_tokens_len(t), 0, &text, &err) == MLXRT_STATUS_OK,
        "detokenize");
  CHECK(text && strcmp(text, "<|im_start|>user\nHello") == 0, "round trip: %s", text);
  mlxrt_string_free(text);
  mlxrt_tokens_free(t);
  CHECK(mlxrt_tokenize(e, "<|im_start|>", 0, &t, NULL) == MLXRT_STATUS_OK && mlxrt_tokens_data(t)[0] != 1,
        "special text not parsed");
  mlxrt_tokens_free(t);
  mlxrt_tokens_free(NULL);
  mlxrt_string_free(NULL);
  CHECK(mlxrt_tokens_len(NULL) == 0 && mlxrt_tokens_data(NULL) == NULL, "tokens(NULL)");
  uint32_t bad_ids[] = {1, 4000000};
  expect_error(mlxrt_detokenize(e, bad_ids, 2, 0, &text, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "unknown id");
  CHECK(text == NULL, "out_text not cleared");
  char bad[] = {'a', (char)0xc0, 0};
  expect_error(mlxrt_tokenize(e, bad, 0, &t, &err), &err, MLXRT_STATUS_INVALID_UTF8, "tokenize invalid UTF-8");
  expect_error(mlxrt_tokenize(e, NULL, 0, &t, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "tokenize(NULL)");
  expect_error(mlxrt_detokenize(e, NULL, 3, 0, &text, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "detokenize(NULL)");

  CHECK(mlxrt_render_chat(e, CHAT, NULL, &text, &t, &err) == MLXRT_STATUS_OK, "render_chat");
  CHECK(text && strstr(text, "<|im_start|>assistant\n") != NULL && mlxrt_tokens_len(t) > 20, "render: %s", text);
  mlxrt_string_free(text);
  mlxrt_tokens_free(t);
  CHECK(mlxrt_render_chat(e, CHAT, "{\"add_generation_prompt\": false}", &text, NULL, NULL) == MLXRT_STATUS_OK &&
            strstr(text, "<|im_start|>assistant") == NULL,
        "no generation prompt: %s", text);
  mlxrt_string_free(text);
  expect_error(mlxrt_render_chat(e, "[{\"content\": \"x\"}]", NULL, &text, NULL, &err), &err,
               MLXRT_STATUS_INVALID_ARGUMENT, "message without role");
  expect_error(mlxrt_render_chat(e, CHAT, "{\"nope\": 1}", &text, NULL, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT,
               "render unknown option");
  expect_error_naming(mlxrt_render_chat(e, "[]", NULL, &text, NULL, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT,
                      "render no messages", "empty");
  expect_error_naming(mlxrt_render_chat(e, "[{\"role\": \"wizard\", \"content\": \"x\"}]", NULL, &text, NULL, &err),
                      &err, MLXRT_STATUS_INVALID_ARGUMENT, "render unknown role", "messages[0].role \"wizard\"");
  expect_error(mlxrt_render_chat(e, CHAT, "[1]", &text, NULL, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT,
               "render options not an object");
  expect_error(mlxrt_render_chat(e, "[{\"role\": ", NULL, &text, NULL, &err), &err, MLXRT_STATUS_INVALID_JSON,
               "render malformed messages");
  CHECK(text == NULL, "render: out_text not cleared");
}

/* ---- log and progress callbacks ---- */

struct counts {
  int logs, max_level, progress_calls, abort_at;
  float last_fraction;
};

static void on_log(void *ud, int32_t level, const char *msg) {
  struct counts *c = ud;
  c->logs++;
  if (level > c->max_level) c->max_level = level;
  (void)msg;
}

static bool on_progress(void *ud, float fraction, const char *phase) {
  struct counts *c = ud;
  c->progress_calls++;
  c->last_fraction = fraction;
  (void)phase;
  return !(c->abort_at && c->progress_calls >= c->abort_at);
}

struct trace_counts {
  uint64_t spans, bad, per_kind[MLXRT_SPAN_KINDS], last_iteration;
  double total_ms[MLXRT_SPAN_KINDS];
};

/* Runs on the engine's scheduler thread: only copies what it needs. */
static void on_span(void *ud, const mlxrt_trace_span *s) {
  struct trace_counts *t = ud;
  t->spans++;
  if (s->struct_size < sizeof *s || s->kind < 0 || s->kind >= (int32_t)MLXRT_SPAN_KINDS || s->duration_ms < 0 ||
      s->start_ms < 0 || s->iteration < t->last_iteration) {
    t->bad++;
    return;
  }
  t->last_iteration = s->iteration;
  t->per_kind[s->kind]++;
  t->total_ms[s->kind] += s->duration_ms;
}

static void test_callbacks(const char *model) {
  struct counts c = {0};
  mlxrt_engine_config cfg;
  mlxrt_engine_config_init(&cfg);
  cfg.model_path = model;
  cfg.log_callback = on_log;
  cfg.log_user_data = &c;
  cfg.log_level = MLXRT_LOG_INFO;
  cfg.progress_callback = on_progress;
  cfg.progress_user_data = &c;
  mlxrt_engine *e = NULL;
  CHECK(mlxrt_engine_create(&cfg, &e, NULL) == MLXRT_STATUS_OK, "create with callbacks");
  CHECK(c.logs >= 1 && c.max_level <= MLXRT_LOG_INFO, "logs %d max level %d", c.logs, c.max_level);
  CHECK(c.progress_calls >= 5 && c.last_fraction > 0.999f, "progress %d calls, last %f", c.progress_calls,
        c.last_fraction);
  mlxrt_engine_destroy(e);

  /* trace spans: to the callback and summarised in the stats */
  struct trace_counts t;
  memset(&t, 0, sizeof t);
  mlxrt_engine_config tc;
  mlxrt_engine_config_init(&tc);
  CHECK(tc.trace_callback == NULL && tc.trace_user_data == NULL, "no trace callback by default");
  tc.model_path = model;
  tc.trace_callback = on_span;
  tc.trace_user_data = &t;
  e = NULL;
  CHECK(mlxrt_engine_create(&tc, &e, NULL) == MLXRT_STATUS_OK, "create with a trace callback");
  if (e) {
    mlxrt_request_params tp;
    mlxrt_request_params_init(&tp);
    tp.messages_json = CHAT;
    tp.max_tokens = 5;
    struct rec tr;
    rec_init(&tr);
    CHECK(submit(e, &tp, &tr, NULL, NULL) == MLXRT_STATUS_OK, "traced request");
    rec_wait(&tr);
    mlxrt_engine_destroy(e); /* after destroy no span can still come */
    CHECK(t.spans > 0 && t.bad == 0, "%llu spans, %llu malformed", (unsigned long long)t.spans,
          (unsigned long long)t.bad);
    CHECK(t.per_kind[MLXRT_SPAN_FORWARD] >= tr.completion_tokens && t.per_kind[MLXRT_SPAN_SAMPLE] >= 1 &&
              t.per_kind[MLXRT_SPAN_EVALUATE] >= 1 && t.per_kind[MLXRT_SPAN_DELIVER] >= 1 &&
              t.per_kind[MLXRT_SPAN_BATCH_SETUP] >= 1,
          "forward %llu spans for %u tokens", (unsigned long long)t.per_kind[MLXRT_SPAN_FORWARD],
          tr.completion_tokens);
  }

  struct counts quiet = {0};
  cfg.log_user_data = &quiet;
  cfg.log_level = MLXRT_LOG_ERROR;
  cfg.progress_user_data = &quiet;
  quiet.abort_at = 2;
  mlxrt_error *err = NULL;
  e = NULL;
  expect_error(mlxrt_engine_create(&cfg, &e, &err), &err, MLXRT_STATUS_ABORTED, "abort the load");
  CHECK(e == NULL && quiet.logs == 0, "aborted: engine %p, %d logs below ERROR", (void *)e, quiet.logs);
  cfg.log_level = 9;
  expect_error(mlxrt_engine_create(&cfg, &e, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "bad log level");

  /* a request that can never fit the KV budget is refused at submit */
  mlxrt_engine_config_init(&cfg);
  cfg.model_path = model;
  cfg.kv_budget = 1 << 20;
  CHECK(mlxrt_engine_create(&cfg, &e, NULL) == MLXRT_STATUS_OK, "create with a small KV budget");
  mlxrt_request_params p;
  mlxrt_request_params_init(&p);
  p.messages_json = CHAT;
  p.max_tokens = 100;
  struct rec r;
  rec_init(&r);
  expect_error(submit(e, &p, &r, NULL, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "beyond the KV budget");
  mlxrt_engine_destroy(e);
}

/* MLXRT_KV_SCHEME_F16: an f16 KV cache streams the same chat and says so in
 * its info; it cannot be paged, and kv_scheme values past the last are
 * refused. */
static void test_f16_kv(const char *model) {
  mlxrt_engine_config c;
  mlxrt_engine_config_init(&c);
  c.model_path = model;
  c.kv_scheme = MLXRT_KV_SCHEME_F16;
  c.kv_paging = 1;
  mlxrt_engine *e = NULL;
  mlxrt_error *err = NULL;
  expect_error(mlxrt_engine_create(&c, &e, &err), &err, MLXRT_STATUS_UNSUPPORTED, "f16 KV with kv_paging");
  c.kv_paging = 0;
  c.kv_scheme = MLXRT_KV_SCHEME_F16 + 1;
  expect_error(mlxrt_engine_create(&c, &e, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "kv_scheme past F16");
  c.kv_scheme = MLXRT_KV_SCHEME_F16;
  CHECK(mlxrt_engine_create(&c, &e, &err) == MLXRT_STATUS_OK, "create (f16 KV): %s", mlxrt_error_message(err));
  if (!e) return;
  mlxrt_engine_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  CHECK(mlxrt_engine_get_info(e, &info, NULL) == MLXRT_STATUS_OK && strcmp(info.kv_scheme, "f16") == 0,
        "kv_scheme %s", info.kv_scheme);
  struct rec r;
  mlxrt_request *req = chat_to_end(e, &r, "f16 KV");
  CHECK(r.last_kind == MLXRT_EVENT_KIND_DONE && strstr(r.text, "Paris") != NULL, "f16 KV answer %s", r.text);
  mlxrt_request_free(req);
  mlxrt_engine_destroy(e);
  fprintf(stderr, "  ok f16 KV: %s\n", r.text);
}

/* MLXRT_KERNELS_INT8 with an f16 KV cache (llama.cpp's arithmetic) streams
 * a chat to its end (not the same answer: int8 activations move this small
 * model's logits by up to ~1, see docs/cpu-kernels.md); kernels values past
 * the last are refused. */
static void test_int8_kernels(const char *model) {
  mlxrt_engine_config c;
  mlxrt_engine_config_init(&c);
  c.model_path = model;
  c.kernels = MLXRT_KERNELS_INT8 + 1;
  mlxrt_engine *e = NULL;
  mlxrt_error *err = NULL;
  expect_error(mlxrt_engine_create(&c, &e, &err), &err, MLXRT_STATUS_INVALID_ARGUMENT, "kernels past INT8");
  c.kernels = MLXRT_KERNELS_INT8;
  c.kv_scheme = MLXRT_KV_SCHEME_F16;
  CHECK(mlxrt_engine_create(&c, &e, &err) == MLXRT_STATUS_OK, "create (int8): %s", mlxrt_error_message(err));
  if (!e) return;
  struct rec r;
  mlxrt_request *req = chat_to_end(e, &r, "int8 kernels");
  CHECK(r.last_kind == MLXRT_EVENT_KIND_DONE && r.text[0] != '\0', "int8 answer %s", r.text);
  mlxrt_request_free(req);
  mlxrt_engine_destroy(e);
  fprintf(stderr, "  ok int8 kernels: %s\n", r.text);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s MODEL_PATH SCRATCH_DIR [quick]\n", argv[0]);
    return 2;
  }
  const char *model = argv[1];
  int quick = argc > 3 && strcmp(argv[3], "quick") == 0;
  test_versions();
  test_create_errors(argv[2]);

  mlxrt_engine_config c;
  mlxrt_engine_config_init(&c);
  c.model_path = model;
  mlxrt_engine *e = NULL;
  mlxrt_error *err = NULL;
  if (mlxrt_engine_create(&c, &e, &err) != MLXRT_STATUS_OK) {
    fprintf(stderr, "FAIL cannot create engine: %s\n", mlxrt_error_message(err));
    mlxrt_error_free(err);
    return 1;
  }
  test_submit_errors(e);
  test_absurd_struct_sizes(e, model);
  test_info_and_tokenizer(e);
  if (!quick) {
    test_stream(e);
    test_logprobs(e);
    test_tools_option(e);
    test_struct_size_growth(e);
    test_streaming(e);
    test_stop_and_length(e);
    test_cancel(e);
  }
  mlxrt_engine_destroy(e);
  test_destroy_in_flight(model, !quick);
  if (!quick) test_prompt_cache(model, argv[2]);
  test_callbacks(model);
  test_f16_kv(model);
  test_int8_kernels(model);

  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  fprintf(stderr, "all C ABI checks passed\n");
  return 0;
}
