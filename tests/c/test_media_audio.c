/* C ABI audio tests: a WAV clip as a content part and as `mlxrt_media`
 * buffers. Built and run by tests/media_gemma4.rs.
 *
 *   test_media_audio GEMMA4_FOLDER CLIP.wav CLIP.f32
 *
 * CLIP.f32 holds the WAV's decoded mono samples (native floats): the clip as
 * a file path, as encoded WAV bytes and as MLXRT_AUDIO_F32 samples must give
 * the same tokens, with one tower run (the encoder cache serves the rest).
 */
#define _POSIX_C_SOURCE 200809L
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mlxrt.h"

#define STEPS 8
#include "media_chat.h"

static mlxrt_media audio_of(int format, const unsigned char *bytes, size_t n, uint32_t rate) {
  mlxrt_media m;
  memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  m.kind = MLXRT_MEDIA_AUDIO;
  m.format = format;
  m.bytes = bytes;
  m.n_bytes = n;
  m.sample_rate = rate;
  return m;
}

#define AUDIO_CHAT \
  "[{\"role\": \"user\", \"content\": [{\"type\": \"audio\", \"media\": 0}, {\"type\": \"text\", \"text\": \"What is this sound?\"}]}]"

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s GEMMA4_FOLDER CLIP.wav CLIP.f32\n", argv[0]);
    return 2;
  }
  size_t n_wav = 0, n_f32 = 0;
  unsigned char *wav = read_file(argv[2], &n_wav), *f32 = read_file(argv[3], &n_f32);
  CHECK(wav && f32 && n_f32 % 4 == 0, "inputs");
  if (!wav || !f32) return 1;

  mlxrt_engine_config c;
  mlxrt_engine_config_init(&c);
  c.model_path = argv[1];
  mlxrt_engine *e = NULL;
  mlxrt_error *err = NULL;
  CHECK(mlxrt_engine_create(&c, &e, &err) == MLXRT_STATUS_OK, "engine: %s", mlxrt_error_message(err));
  if (!e) return 1;
  mlxrt_engine_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  CHECK(mlxrt_engine_get_info(e, &info, NULL) == MLXRT_STATUS_OK, "info");
  CHECK((info.modalities & MLXRT_MODALITY_AUDIO) && (info.modalities & MLXRT_MODALITY_IMAGE), "modalities %u", info.modalities);

  char msg[1024], by_path[2048];
  uint32_t want[STEPS], got[STEPS];
  snprintf(by_path, sizeof by_path,
           "[{\"role\": \"user\", \"content\": [{\"type\": \"audio\", \"path\": \"%s\"}, {\"type\": \"text\", \"text\": "
           "\"What is this sound?\"}]}]",
           argv[2]);
  CHECK(run(e, by_path, NULL, 0, want, msg, sizeof msg) == MLXRT_STATUS_OK, "by path: %s", msg);
  mlxrt_media forms[2] = {audio_of(MLXRT_MEDIA_ENCODED, wav, n_wav, 0), audio_of(MLXRT_AUDIO_F32, f32, n_f32, 16000)};
  const char *names[2] = {"encoded", "f32"};
  for (int i = 0; i < 2; i++) {
    memset(got, 0, sizeof got);
    CHECK(run(e, AUDIO_CHAT, &forms[i], 1, got, msg, sizeof msg) == MLXRT_STATUS_OK, "%s: %s", names[i], msg);
    CHECK(memcmp(got, want, sizeof want) == 0, "%s: tokens differ from the file path's", names[i]);
  }
  mlxrt_engine_stats st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  CHECK(mlxrt_engine_get_stats(e, &st, NULL) == MLXRT_STATUS_OK, "stats");
  CHECK(st.tower_runs == 1 && st.encoder_cache_hits == 2, "tower runs %llu, encoder cache hits %llu",
        (unsigned long long)st.tower_runs, (unsigned long long)st.encoder_cache_hits);

  /* Errors name the entry; the engine keeps serving. */
  mlxrt_media odd = audio_of(MLXRT_AUDIO_F32, f32, n_f32 - 1, 16000);
  CHECK(run(e, AUDIO_CHAT, &odd, 1, got, msg, sizeof msg) == MLXRT_STATUS_INVALID_ARGUMENT && strstr(msg, "params.media[0]"),
        "odd byte count: %s", msg);
  mlxrt_media no_rate = audio_of(MLXRT_AUDIO_F32, f32, n_f32, 0);
  CHECK(run(e, AUDIO_CHAT, &no_rate, 1, got, msg, sizeof msg) == MLXRT_STATUS_INVALID_ARGUMENT && strstr(msg, "sample_rate"),
        "rate 0: %s", msg);
  mlxrt_media cut = audio_of(MLXRT_MEDIA_ENCODED, wav, 20, 0);
  CHECK(run(e, AUDIO_CHAT, &cut, 1, got, msg, sizeof msg) == MLXRT_STATUS_INVALID_ARGUMENT, "cut WAV: %s", msg);
  mlxrt_media old = forms[1];
  old.struct_size = offsetof(mlxrt_media, sample_rate);
  CHECK(run(e, AUDIO_CHAT, &old, 1, got, msg, sizeof msg) == MLXRT_STATUS_INVALID_ARGUMENT && strstr(msg, "struct_size"),
        "audio needs the full struct: %s", msg);
  CHECK(run(e, AUDIO_CHAT, &forms[1], 1, got, msg, sizeof msg) == MLXRT_STATUS_OK && memcmp(got, want, sizeof want) == 0,
        "after errors: %s", msg);
  mlxrt_engine_destroy(e);
  free(wav), free(f32);
  if (failures) fprintf(stderr, "%d failure(s)\n", failures);
  else printf("test_media_audio: ok\n");
  return failures ? 1 : 0;
}
