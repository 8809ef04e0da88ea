/* Replays fuzz inputs without libFuzzer: each argument is a file, or a
 * folder whose files are replayed in name order, passed once to the
 * target's LLVMFuzzerTestOneInput. Used by the regression tests of the
 * normal (gcc) builds; a missing folder counts as empty. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_util.h"

static int replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    fprintf(stderr, "replay: cannot open %s\n", path);
    return 1;
  }
  size_t cap = 4096, size = 0;
  uint8_t *data = malloc(cap);
  size_t n;
  while (data != NULL && (n = fread(data + size, 1, cap - size, f)) > 0) {
    size += n;
    if (size == cap) {
      uint8_t *bigger = realloc(data, cap *= 2);
      if (bigger == NULL)
        free(data);
      data = bigger;
    }
  }
  fclose(f);
  if (data == NULL) {
    fprintf(stderr, "replay: out of memory reading %s\n", path);
    return 1;
  }
  LLVMFuzzerTestOneInput(data, size);
  free(data);
  return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b) {
  return strcmp((*a)->d_name, (*b)->d_name);
}

int main(int argc, char **argv) {
  int failures = 0, replayed = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0)
      continue;
    if (!S_ISDIR(st.st_mode)) {
      failures += replay_file(argv[i]);
      replayed++;
      continue;
    }
    struct dirent **entries = NULL;
    int n = scandir(argv[i], &entries, NULL, by_name);
    for (int k = 0; k < n; k++) {
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", argv[i], entries[k]->d_name);
      if (entries[k]->d_name[0] != '.' && stat(path, &st) == 0 &&
          S_ISREG(st.st_mode)) {
        failures += replay_file(path);
        replayed++;
      }
      free(entries[k]);
    }
    free(entries);
  }
  printf("replay: %d inputs, %d unreadable\n", replayed, failures);
  return failures == 0 ? 0 : 1;
}
