/* The data sources of remat-train: the built-in three-digit addition task
 * (generated here, with a held-out set of problems never trained on) and
 * byte-level language modelling on a text file. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tools/train.h"

enum { BINARY_CHECK = 1 << 16 }; /* bytes looked at to tell a text file */
#define DATA_MAX ((size_t)1 << 30) /* the most --data reads */

/* splitmix64: the data's random numbers, reproducible from --seed. */
uint64_t dataset_next(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* One pair in 20 belongs to the held-out class, whatever the seed. */
static int is_heldout(int a, int b) {
  uint64_t h = (uint64_t)(a * 1000 + b) + 12345;
  return dataset_next(&h) % 20 == 0;
}

void addition_tokens(int a, int b, int32_t out[ADD_LEN]) {
  int s = a + b, k = 0;
  for (int p = 100; p >= 1; p /= 10)
    out[k++] = a / p % 10;
  out[k++] = TOK_PLUS;
  for (int p = 100; p >= 1; p /= 10)
    out[k++] = b / p % 10;
  out[k++] = TOK_EQUALS;
  for (int p = 1000; p >= 1; p /= 10)
    out[k++] = s / p % 10;
  out[k++] = TOK_END;
}

dataset *dataset_addition(uint64_t seed) {
  dataset *d = calloc(1, sizeof *d);
  if (d == NULL)
    return NULL;
  d->addition = 1;
  d->rng = seed;
  uint64_t fixed = 2024; /* the held-out set does not depend on --seed */
  for (int i = 0; i < ADD_HELDOUT;) {
    int a = (int)(dataset_next(&fixed) % 1000), b = (int)(dataset_next(&fixed) % 1000);
    if (is_heldout(a, b)) {
      d->heldout_a[i] = a;
      d->heldout_b[i++] = b;
    }
  }
  return d;
}

static int looks_binary(const unsigned char *p, int64_t n) {
  int64_t check = n < BINARY_CHECK ? n : BINARY_CHECK, control = 0;
  for (int64_t i = 0; i < check; i++) {
    if (p[i] == 0)
      return 1;
    control += p[i] < 9 || (p[i] > 13 && p[i] < 32);
  }
  return control * 10 > check;
}

static const char *file_kind(mode_t mode) {
  if (S_ISDIR(mode))
    return "a directory";
  if (S_ISCHR(mode))
    return "a character device";
  if (S_ISBLK(mode))
    return "a block device";
  if (S_ISFIFO(mode))
    return "a FIFO";
  if (S_ISSOCK(mode))
    return "a socket";
  return "a special file";
}

/* Opens --data: a regular file of at most DATA_MAX bytes, or "-" for
 * standard input. Returns -1 after putting a message in `err`. */
static int open_data(const char *path, char *err, size_t err_len) {
  if (strcmp(path, "-") == 0)
    return STDIN_FILENO;
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* no FIFO wait */
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    snprintf(err, err_len, "--data '%s': %s", path, strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    snprintf(err, err_len, "--data '%s' is %s: --data takes a regular file "
             "(or - for standard input)", path, file_kind(st.st_mode));
  } else if ((uint64_t)st.st_size > DATA_MAX) {
    snprintf(err, err_len, "--data '%s' has %lld bytes, more than the limit "
             "of 1 GiB", path, (long long)st.st_size);
  } else {
    return fd;
  }
  if (fd >= 0)
    close(fd);
  return -1;
}

/* Reads until the end, at most DATA_MAX bytes; stops as soon as the first
 * BINARY_CHECK bytes look binary (standard input may be /dev/zero). Sets
 * `err` and returns NULL on failure. */
static unsigned char *read_data(int fd, const char *path, int64_t *len,
                                char *err, size_t err_len) {
  size_t cap = BINARY_CHECK, n = 0;
  unsigned char *buf = malloc(cap);
  int bad = 0;
  while (!bad) {
    if (buf != NULL && n == cap) {
      cap = cap * 2 > DATA_MAX + 1 ? DATA_MAX + 1 : cap * 2;
      unsigned char *grown = realloc(buf, cap);
      if (grown == NULL)
        free(buf);
      buf = grown;
    }
    if (buf == NULL) {
      snprintf(err, err_len, "--data '%s': out of memory", path);
      return NULL;
    }
    ssize_t got = read(fd, buf + n, cap - n);
    if (got < 0 && errno == EINTR)
      continue;
    if (got == 0)
      break;
    size_t before = n;
    n += got > 0 ? (size_t)got : 0;
    if ((bad = got < 0))
      snprintf(err, err_len, "--data '%s': %s", path, strerror(errno));
    else if ((bad = before < BINARY_CHECK && n >= BINARY_CHECK &&
                    looks_binary(buf, (int64_t)n)))
      snprintf(err, err_len, "--data '%s' looks binary (NUL or control "
               "bytes): --data takes a text file", path);
    else if ((bad = n > DATA_MAX))
      snprintf(err, err_len, "--data '%s' has more than the limit of 1 GiB",
               path);
  }
  if (bad) {
    free(buf);
    return NULL;
  }
  *len = (int64_t)n;
  return buf;
}

dataset *dataset_text(const char *path, int seq, char *err, size_t err_len) {
  int64_t len = 0;
  int fd = open_data(path, err, err_len);
  if (fd < 0)
    return NULL;
  unsigned char *text = read_data(fd, path, &len, err, err_len);
  if (fd != STDIN_FILENO)
    close(fd);
  if (text == NULL)
    return NULL;
  const char *why = NULL;
  if (len == 0)
    why = "is empty";
  else if (looks_binary(text, len))
    why = "looks binary (NUL or control bytes): --data takes a text file";
  if (why != NULL || len < (int64_t)seq + 1) {
    if (why != NULL)
      snprintf(err, err_len, "--data '%s' %s", path, why);
    else
      snprintf(err, err_len,
               "--seq %d is longer than the data: '%s' has %lld bytes, at "
               "least %d are needed",
               seq, path, (long long)len, seq + 1);
    free(text);
    return NULL;
  }
  dataset *d = calloc(1, sizeof *d);
  if (d == NULL) {
    free(text);
    snprintf(err, err_len, "out of memory");
    return NULL;
  }
  d->text = text;
  d->len = len;
  /* Hold out the last tenth when it fits a window, else evaluate on all. */
  int64_t tail = len / 10;
  d->train_len = tail >= seq + 1 && len - tail >= seq + 1 ? len - tail : len;
  d->heldout_start = d->train_len < len ? d->train_len : 0;
  return d;
}

void dataset_destroy(dataset *d) {
  if (d != NULL)
    free(d->text);
  free(d);
}

int dataset_vocab(const dataset *d) { return d->addition ? ADD_VOCAB : 256; }

static void addition_row(dataset *d, int seq, int32_t *tokens,
                         int32_t *targets) {
  int a, b;
  do {
    a = (int)(dataset_next(&d->rng) % 1000);
    b = (int)(dataset_next(&d->rng) % 1000);
  } while (is_heldout(a, b));
  int32_t problem[ADD_LEN];
  addition_tokens(a, b, problem);
  for (int t = 0; t < seq; t++) {
    tokens[t] = t < ADD_LEN ? problem[t] : TOK_PAD;
    targets[t] = t + 1 < ADD_LEN ? problem[t + 1] : TOK_PAD;
  }
}

void dataset_batch(dataset *d, int batch, int seq, int32_t *tokens,
                   int32_t *targets) {
  for (int b = 0; b < batch; b++) {
    int32_t *tok = tokens + (size_t)b * seq, *tgt = targets + (size_t)b * seq;
    if (d->addition) {
      addition_row(d, seq, tok, tgt);
      continue;
    }
    int64_t start = d->train_lo + (int64_t)(dataset_next(&d->rng) %
                              (uint64_t)(d->train_len - d->train_lo - seq));
    for (int t = 0; t < seq; t++) {
      tok[t] = d->text[start + t];
      tgt[t] = d->text[start + t + 1];
    }
  }
}

int dataset_shard(dataset *d, int seq, int rank, int ranks, char *err,
                  size_t err_len) {
  if (ranks <= 1)
    return 0;
  uint64_t s = d->rng ^ (0xD1B54A32D192ED03ull * (uint64_t)rank);
  d->rng = dataset_next(&s);
  if (d->addition)
    return 0;
  int64_t slice = d->train_len / ranks;
  if (slice < seq + 1) {
    snprintf(err, err_len,
             "the training text (%lld bytes) is too short for %d windows of "
             "%d bytes, one per rank",
             (long long)d->train_len, ranks, seq + 1);
    return -1;
  }
  int64_t lo = (int64_t)rank * slice;
  int64_t hi = rank == ranks - 1 ? d->train_len : lo + slice + seq;
  d->train_lo = lo;
  d->train_len = hi < d->train_len ? hi : d->train_len;
  return 0;
}

const char *dataset_token_text(const dataset *d, int32_t tok, char buf[8]) {
  static const char *const add_symbols[] = {"+", "=", "", "_"};
  if (d->addition) {
    if (tok >= 0 && tok < 10)
      snprintf(buf, 8, "%c", (char)('0' + tok));
    else
      snprintf(buf, 8, "%s", add_symbols[tok - 10]);
  } else if (tok == '\n') {
    snprintf(buf, 8, "\\n");
  } else if (tok >= 32 && tok < 127) {
    snprintf(buf, 8, "%c", (char)tok);
  } else {
    snprintf(buf, 8, "\\x%02x", (unsigned)tok);
  }
  return buf;
}
