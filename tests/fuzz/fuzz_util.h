/* Helpers shared by the fuzz targets: NUL-terminated copies of the input,
 * a byte reader, and a check that aborts (so libFuzzer reports it). */
#ifndef REMAT_FUZZ_UTIL_H
#define REMAT_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_CHECK(cond)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                                 \
    }                                                                          \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A NUL-terminated copy of the input (NULL when out of memory). */
static inline char *fuzz_cstring(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);
  if (s != NULL) {
    memcpy(s, data, size);
    s[size] = '\0';
  }
  return s;
}

/* Reads the input a byte at a time; zeros once it is used up. */
typedef struct fuzz_reader {
  const uint8_t *data;
  size_t size, pos;
} fuzz_reader;

static inline unsigned fuzz_byte(fuzz_reader *r) {
  return r->pos < r->size ? r->data[r->pos++] : 0u;
}

static inline int fuzz_done(const fuzz_reader *r) { return r->pos >= r->size; }

#endif
