/* What the C and Objective-C test programs share: a failure counter and a
 * CHECK that reports and counts a failed condition without stopping, and a
 * whole-file reader. Included by tests/c/ *.c and tests/objc/test_objc.m. */
#ifndef MLXRT_TEST_CHECK_H
#define MLXRT_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>

static int failures = 0;
#define CHECK(cond, ...)                                             \
  do {                                                               \
    if (!(cond)) {                                                   \
      failures++;                                                    \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                  \
      fprintf(stderr, "\n");                                         \
    }                                                                \
  } while (0)

/* The bytes of `path` (malloc'ed, `*n` of them), or NULL. */
static inline unsigned char *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *buf = malloc(len > 0 ? (size_t)len : 1);
  *n = buf ? fread(buf, 1, (size_t)len, f) : 0;
  fclose(f);
  return buf;
}

#endif
