/* C ABI media tests: images as content parts and as `mlxrt_media` buffers.
 * Built and run by tests/media.rs.
 *
 *   test_media VLM_FOLDER IMAGE.png IMAGE.rgb WIDTH HEIGHT TEXT_ONLY_MODEL
 *
 * IMAGE.rgb holds the PNG's decoded pixels (packed RGB8): the same picture
 * given as a file path, as encoded bytes, and as RGB8, RGBA8 and padded BGRA8
 * buffers must give the same tokens, and the engine's stats show one tower
 * run for them (the encoder cache serves the rest).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mlxrt.h"

#define STEPS 8
#include "media_chat.h"

static mlxrt_media media_of(int format, uint32_t w, uint32_t h, size_t stride, const unsigned char *bytes, size_t n) {
  mlxrt_media m;
  memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  m.kind = MLXRT_MEDIA_IMAGE;
  m.format = format;
  m.width = w;
  m.height = h;
  m.stride = stride;
  m.bytes = bytes;
  m.n_bytes = n;
  return m;
}

#define MEDIA_CHAT \
  "[{\"role\": \"user\", \"content\": [{\"type\": \"image\", \"media\": 0}, {\"type\": \"text\", \"text\": \"What is in this picture?\"}]}]"

int main(int argc, char **argv) {
  if (argc != 7) {
    fprintf(stderr, "usage: %s VLM_FOLDER IMAGE.png IMAGE.rgb WIDTH HEIGHT TEXT_ONLY_MODEL\n", argv[0]);
    return 2;
  }
  uint32_t w = (uint32_t)atoi(argv[4]), h = (uint32_t)atoi(argv[5]);
  size_t n_png = 0, n_rgb = 0;
  unsigned char *png = read_file(argv[2], &n_png), *rgb = read_file(argv[3], &n_rgb);
  CHECK(png && rgb && n_rgb == (size_t)w * h * 3, "inputs");
  if (!png || !rgb) return 1;

  mlxrt_engine_config c;
  mlxrt_engine_config_init(&c);
  c.model_path = argv[1];
  mlxrt_engine *e = NULL;
  mlxrt_error *err = NULL;
  CHECK(mlxrt_engine_create(&c, &e, &err) == MLXRT_STATUS_OK, "engine: %s", mlxrt_error_message(err));
  if (!e) return 1;

  char msg[1024], by_path[2048];
  uint32_t want[STEPS], got[STEPS];
  snprintf(by_path, sizeof by_path,
           "[{\"role\": \"user\", \"content\": [{\"type\": \"image\", \"path\": \"%s\"}, {\"type\": \"text\", \"text\": "
           "\"What is in this picture?\"}]}]",
           argv[2]);
  CHECK(run(e, by_path, NULL, 0, want, msg, sizeof msg) == MLXRT_STATUS_OK, "by path: %s", msg);

  /* Encoded bytes, then raw RGB8, RGBA8 and BGRA8 with row padding. */
  unsigned char *rgba = malloc((size_t)w * h * 4), *bgra = malloc((size_t)(w * 4 + 12) * h);
  size_t bstride = w * 4 + 12;
  for (size_t y = 0; y < h; y++)
    for (size_t x = 0; x < w; x++) {
      const unsigned char *p = rgb + (y * w + x) * 3;
      unsigned char *a = rgba + (y * w + x) * 4, *b = bgra + y * bstride + x * 4;
      a[0] = p[0], a[1] = p[1], a[2] = p[2], a[3] = 255;
      b[0] = p[2], b[1] = p[1], b[2] = p[0], b[3] = 255;
    }
  mlxrt_media forms[4] = {
      media_of(MLXRT_MEDIA_ENCODED, 0, 0, 0, png, n_png),
      media_of(MLXRT_PIXEL_RGB8, w, h, 0, rgb, n_rgb),
      media_of(MLXRT_PIXEL_RGBA8, w, h, 0, rgba, (size_t)w * h * 4),
      media_of(MLXRT_PIXEL_BGRA8, w, h, bstride, bgra, bstride * h),
  };
  const char *names[4] = {"encoded", "rgb8", "rgba8", "bgra8"};
  for (int i = 0; i < 4; i++) {
    memset(got, 0, sizeof got);
    CHECK(run(e, MEDIA_CHAT, &forms[i], 1, got, msg, sizeof msg) == MLXRT_STATUS_OK, "%s: %s", names[i], msg);
    CHECK(memcmp(got, want, sizeof want) == 0, "%s: tokens differ from the file path's", names[i]);
  }

  /* The encoder cache: the five forms are one picture (its entry is keyed by
   * the decoded pixels), so the tower ran once and the cache served four. */
  mlxrt_engine_stats st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  CHECK(mlxrt_engine_get_stats(e, &st, NULL) == MLXRT_STATUS_OK, "stats");
  CHECK(st.tower_runs == 1 && st.encoder_cache_hits == 4, "tower runs %llu, encoder cache hits %llu",
        (unsigned long long)st.tower_runs, (unsigned long long)st.encoder_cache_hits);
  CHECK(st.encoder_cache_entries == 1 && st.encoder_cache_bytes > 0, "encoder cache: %llu entries, %llu bytes",
        (unsigned long long)st.encoder_cache_entries, (unsigned long long)st.encoder_cache_bytes);

  /* Errors name the part; the engine keeps serving. */
  mlxrt_media short_buf = media_of(MLXRT_PIXEL_BGRA8, w, h, 0, bgra, 16);
  CHECK(run(e, MEDIA_CHAT, &short_buf, 1, got, msg, sizeof msg) == MLXRT_STATUS_INVALID_ARGUMENT && strstr(msg, "params.media[0]"),
        "short buffer: %s", msg);
  mlxrt_media truncated = media_of(MLXRT_MEDIA_ENCODED, 0, 0, 0, png, n_png / 2);
  CHECK(run(e, MEDIA_CHAT, &truncated, 1, got, msg, sizeof msg) == MLXRT_STATUS_INVALID_ARGUMENT, "truncated: %s", msg);
  CHECK(run(e, "[{\"role\": \"user\", \"content\": \"hi\"}]", &forms[1], 1, got, msg, sizeof msg) ==
            MLXRT_STATUS_INVALID_ARGUMENT && strstr(msg, "media[0]"),
        "unreferenced: %s", msg);
  /* Audio for a model without an audio tower: UNSUPPORTED naming the part. */
  float samples[1600] = {0};
  mlxrt_media audio = media_of(MLXRT_AUDIO_F32, 0, 0, 0, (const unsigned char *)samples, sizeof samples);
  audio.kind = MLXRT_MEDIA_AUDIO;
  audio.sample_rate = 16000;
  const char *audio_chat = "[{\"role\": \"user\", \"content\": [{\"type\": \"audio\", \"media\": 0}]}]";
  CHECK(run(e, audio_chat, &audio, 1, got, msg, sizeof msg) == MLXRT_STATUS_UNSUPPORTED && strstr(msg, "audio tower"), "audio: %s", msg);
  CHECK(run(e, MEDIA_CHAT, &forms[3], 1, got, msg, sizeof msg) == MLXRT_STATUS_OK && memcmp(got, want, sizeof want) == 0,
        "after errors: %s", msg);
  CHECK(mlxrt_engine_get_stats(e, &st, NULL) == MLXRT_STATUS_OK && st.tower_runs == 1 && st.encoder_cache_hits == 5,
        "after errors: tower runs %llu, encoder cache hits %llu", (unsigned long long)st.tower_runs,
        (unsigned long long)st.encoder_cache_hits);
  mlxrt_engine_destroy(e);

  /* A model without a vision tower: UNSUPPORTED naming the part. */
  c.model_path = argv[6];
  e = NULL;
  CHECK(mlxrt_engine_create(&c, &e, &err) == MLXRT_STATUS_OK, "text-only engine: %s", mlxrt_error_message(err));
  if (e) {
    CHECK(run(e, MEDIA_CHAT, &forms[1], 1, got, msg, sizeof msg) == MLXRT_STATUS_UNSUPPORTED &&
              strstr(msg, "messages[0].content[0]") && strstr(msg, "vision tower"),
          "text-only: %s", msg);
    CHECK(run(e, "[{\"role\": \"user\", \"content\": \"hi\"}]", NULL, 0, got, msg, sizeof msg) == MLXRT_STATUS_OK,
          "text-only still serves: %s", msg);
    mlxrt_engine_destroy(e);
  }
  free(png), free(rgb), free(rgba), free(bgra);
  if (failures) fprintf(stderr, "%d failure(s)\n", failures);
  else printf("test_media: ok\n");
  return failures ? 1 : 0;
}
