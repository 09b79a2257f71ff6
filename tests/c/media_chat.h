/* What the C media tests share: one chat with media, read to its end.
 * Included by tests/c/test_media.c and tests/c/test_media_audio.c after
 * check.h and mlxrt.h, with STEPS defined. */
#ifndef MLXRT_TEST_MEDIA_CHAT_H
#define MLXRT_TEST_MEDIA_CHAT_H

#ifndef STEPS
#error "define STEPS (tokens per chat) before including media_chat.h"
#endif

#include <stdint.h>
#include <stdio.h>

/* Runs a chat; fills `tokens` (STEPS ids); returns the submit status and
 * copies its error message into `msg`. */
static mlxrt_status run(mlxrt_engine *e, const char *messages, const mlxrt_media *media, size_t n_media,
                        uint32_t *tokens, char *msg, size_t msg_len) {
  mlxrt_request_params p;
  mlxrt_request_params_init(&p);
  p.messages_json = messages;
  p.max_tokens = STEPS;
  p.options_json = "{\"ignore_eos\": true}";
  p.media = media;
  p.n_media = n_media;
  mlxrt_stream *s = NULL;
  mlxrt_error *err = NULL;
  mlxrt_status st = mlxrt_request_submit_stream(e, &p, &s, &err);
  msg[0] = 0;
  if (st != MLXRT_STATUS_OK) {
    snprintf(msg, msg_len, "%s", mlxrt_error_message(err));
    mlxrt_error_free(err);
    return st;
  }
  size_t n = 0;
  const mlxrt_event *ev = NULL;
  while (mlxrt_stream_next(s, 120000, &ev, NULL) == MLXRT_STATUS_OK) {
    if (ev->kind == MLXRT_EVENT_KIND_DELTA)
      for (size_t i = 0; i < ev->n_tokens && n < STEPS; i++) tokens[n++] = ev->tokens[i];
  }
  mlxrt_stream_free(s);
  CHECK(n == STEPS, "%zu tokens", n);
  return st;
}

#endif
