/* Fuzz target: remat-train's data files (tools/train_data.c). The first
 * four bytes choose the format (bit 0 of byte 0: u16 or text), --seq
 * (byte 1, 1 to 256) and --vocab (bytes 2-3, 0 to 65535: 0 is the largest
 * id + 1); the rest is the file: a token file parsed from memory, or a
 * text file read through a memfd. A refused file must leave a one-line
 * message that starts with --data or --seq; an accepted one must hold
 * only ids below its vocabulary, a training part and a held-out part of
 * at least --seq + 1 tokens each, training batches of such ids, and,
 * when it starts with llm.c's magic, its whole header and a count that
 * matches. The seeds include llm.c headers with a count of 2^31 - 1, -1
 * and one token short, a header cut at 4, 1022 and 1023 bytes, version 2,
 * and a held-out tenth of exactly one window. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "tools/train.h"

/* A one-line message about the data. */
static void check_message(const char *err) {
  FUZZ_CHECK(strncmp(err, "--data ", 7) == 0 || strncmp(err, "--seq ", 6) == 0);
  FUZZ_CHECK(strchr(err, '\n') == NULL);
}

static dataset *open_text(const uint8_t *data, size_t size, int seq,
                          char *err, size_t err_len) {
  int fd = memfd_create("fuzz.txt", 0);
  FUZZ_CHECK(fd >= 0);
  for (size_t done = 0; done < size;) {
    ssize_t n = write(fd, data + done, size - done);
    FUZZ_CHECK(n > 0);
    done += (size_t)n;
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  dataset *d = dataset_text(path, seq, err, err_len);
  close(fd);
  return d;
}

/* The invariants of an accepted file. */
static void check_dataset(dataset *d, int seq, int vocab) {
  int v = dataset_vocab(d);
  FUZZ_CHECK(v >= 1 && v <= 65536);
  FUZZ_CHECK(vocab == 0 || v == vocab);
  FUZZ_CHECK(d->train_len == d->heldout_start);
  FUZZ_CHECK(d->train_len >= seq + 1);
  FUZZ_CHECK(d->len - d->heldout_start >= seq + 1);
  for (int64_t i = 0; i < d->len; i++)
    FUZZ_CHECK(dataset_at(d, i) >= 0 && dataset_at(d, i) < v);
  char buf[8];
  for (int64_t i = 0; i < d->len && i < 64; i++)
    FUZZ_CHECK(strlen(dataset_token_text(d, dataset_at(d, i), buf)) < 8);
  enum { ROWS = 4 };
  int32_t *tokens = malloc(sizeof(int32_t) * ROWS * (size_t)seq);
  int32_t *targets = malloc(sizeof(int32_t) * ROWS * (size_t)seq);
  FUZZ_CHECK(tokens != NULL && targets != NULL);
  d->rng = 7;
  dataset_batch(d, ROWS, seq, tokens, targets);
  for (int i = 0; i < ROWS * seq; i++) {
    FUZZ_CHECK(tokens[i] >= 0 && tokens[i] < v);
    FUZZ_CHECK(targets[i] >= 0 && targets[i] < v);
  }
  free(tokens);
  free(targets);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4)
    return 0;
  int u16 = data[0] & 1, seq = data[1] + 1, vocab = data[2] | data[3] << 8;
  data += 4;
  size -= 4;
  char err[512] = "";
  dataset *d;
  if (u16) {
    unsigned char *raw = malloc(size > 0 ? size : 1);
    FUZZ_CHECK(raw != NULL);
    memcpy(raw, data, size);
    d = dataset_u16_bytes(raw, (int64_t)size, "fuzz", seq, vocab, err,
                          sizeof err);
  } else {
    d = open_text(data, size, seq, err, sizeof err);
    vocab = 256;
  }
  if (d == NULL) {
    check_message(err);
    return 0;
  }
  FUZZ_CHECK(err[0] == '\0');
  /* llm.c's magic: accepted only with its whole header and count */
  if (u16 && size >= 4 && (data[0] | data[1] << 8 | data[2] << 16 |
                           (uint32_t)data[3] << 24) == 20240520u) {
    FUZZ_CHECK(size >= 1024);
    FUZZ_CHECK(d->len == (int64_t)(size - 1024) / 2);
    FUZZ_CHECK((data[8] | data[9] << 8 | data[10] << 16 |
                (uint32_t)data[11] << 24) == (uint32_t)d->len);
  }
  check_dataset(d, seq, vocab);
  dataset_destroy(d);
  return 0;
}
