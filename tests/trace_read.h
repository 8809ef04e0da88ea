/* Reads a Chrome trace file written by remat_trace_steps into a cJSON
 * document, failing the calling test when it cannot be read or parsed.
 * Include after <cmocka.h> and <cJSON.h>. */
#ifndef REMAT_TESTS_TRACE_READ_H
#define REMAT_TESTS_TRACE_READ_H

#include <stdio.h>

static cJSON *read_trace(const char *path) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  static char text[1 << 22];
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  assert_true(n > 0 && n < sizeof text - 1);
  text[n] = '\0';
  cJSON *doc = cJSON_Parse(text);
  assert_non_null(doc);
  return doc;
}

#endif
