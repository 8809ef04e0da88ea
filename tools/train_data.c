/* The data sources of remat-train: the built-in three-digit addition task
 * (generated here, with a held-out set of problems never trained on),
 * byte-level language modelling on a text file, and token files of
 * little-endian uint16 ids as nanoGPT and llm.c write them; a file's last
 * tenth is held out. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "tools/train.h"

/* A path as messages show it (base/error.h: escaped, at most 100 bytes). */
#define QUOTED(path) remat__quote(&(remat__quoted){0}, (path))

enum { BINARY_CHECK = 1 << 16 }; /* bytes looked at to tell a text file */
#define DATA_MAX ((size_t)1 << 30) /* the most --data reads */
#define NOT_TEXT "looks binary (NUL or control bytes): --data takes a text " \
                 "file, or token ids with --data-format u16"

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
    snprintf(err, err_len, "--data '%s': %s", QUOTED(path), strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    snprintf(err, err_len, "--data '%s' is %s: --data takes a regular file "
             "(or - for standard input)", QUOTED(path), file_kind(st.st_mode));
  } else if ((uint64_t)st.st_size > DATA_MAX) {
    snprintf(err, err_len, "--data '%s' has %lld bytes, more than the limit "
             "of 1 GiB", QUOTED(path), (long long)st.st_size);
  } else {
    return fd;
  }
  if (fd >= 0)
    close(fd);
  return -1;
}

/* Reads until the end, at most DATA_MAX bytes; for text, stops as soon as
 * the first BINARY_CHECK bytes look binary (standard input may be
 * /dev/zero). Sets `err` and returns NULL on failure. */
static unsigned char *read_data(int fd, const char *path, int text,
                                int64_t *len, char *err, size_t err_len) {
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
      snprintf(err, err_len, "--data '%s': out of memory", QUOTED(path));
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
      snprintf(err, err_len, "--data '%s': %s", QUOTED(path), strerror(errno));
    else if ((bad = text && before < BINARY_CHECK && n >= BINARY_CHECK &&
                    looks_binary(buf, (int64_t)n)))
      snprintf(err, err_len, "--data '%s' %s", QUOTED(path), NOT_TEXT);
    else if ((bad = n > DATA_MAX))
      snprintf(err, err_len, "--data '%s' has more than the limit of 1 GiB",
               QUOTED(path));
  }
  if (bad) {
    free(buf);
    return NULL;
  }
  *len = (int64_t)n;
  return buf;
}

/* The whole of --data, or NULL after a message in `err`. */
static unsigned char *load(const char *path, int text, int64_t *len,
                           char *err, size_t err_len) {
  int fd = open_data(path, err, err_len);
  if (fd < 0)
    return NULL;
  unsigned char *data = read_data(fd, path, text, len, err, err_len);
  if (fd != STDIN_FILENO)
    close(fd);
  if (data != NULL && *len == 0) {
    snprintf(err, err_len, "--data '%s' is empty", QUOTED(path));
    free(data);
    data = NULL;
  }
  return data;
}

/* Trains on all but the last tenth, which is held out; each part must hold
 * a window of seq + 1 tokens. Returns -1 after a message in `err`. */
static int split(dataset *d, const char *path, int seq, const char *unit,
                 char *err, size_t err_len) {
  int64_t window = (int64_t)seq + 1, tail = d->len / 10;
  if (d->len < window) {
    snprintf(err, err_len, "--seq %d is longer than the data: '%s' has %lld "
             "%s, at least %lld are needed", seq, QUOTED(path),
             (long long)d->len, unit, (long long)window);
    return -1;
  }
  if (tail < window) {
    snprintf(err, err_len, "--data '%s' has %lld %s, too few for a held-out "
             "split: its last tenth must hold --seq + 1 = %lld, so at least "
             "%lld are needed", QUOTED(path), (long long)d->len, unit,
             (long long)window, (long long)(10 * window));
    return -1;
  }
  d->train_len = d->heldout_start = d->len - tail;
  return 0;
}

/* A dataset of `len` tokens that owns `text` or `ids`, split for `seq`;
 * NULL (and both freed) after a message in `err`. */
static dataset *file_dataset(unsigned char *text, uint16_t *ids, int64_t len,
                             int vocab, const char *path, int seq, char *err,
                             size_t err_len) {
  dataset *d = calloc(1, sizeof *d);
  if (d == NULL) {
    snprintf(err, err_len, "out of memory");
  } else {
    *d = (dataset){.text = text, .ids = ids, .len = len, .vocab = vocab,
                   .u16 = ids != NULL};
    if (split(d, path, seq, text == NULL ? "tokens" : "bytes", err,
              err_len) == 0)
      return d;
  }
  free(d);
  free(text);
  free(ids);
  return NULL;
}

dataset *dataset_text(const char *path, int seq, char *err, size_t err_len) {
  int64_t len = 0;
  unsigned char *text = load(path, 1, &len, err, err_len);
  if (text != NULL && looks_binary(text, len)) {
    snprintf(err, err_len, "--data '%s' %s", QUOTED(path), NOT_TEXT);
    free(text);
    text = NULL;
  }
  if (text == NULL)
    return NULL;
  return file_dataset(text, NULL, len, 256, path, seq, err, err_len);
}

/* The little-endian int32 at p. */
static int64_t le32(const unsigned char *p) {
  return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 |
                   (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

/* The bytes of llm.c's header before the tokens (256 int32: magic
 * 20240520, version 1, token count), 0 for a flat file, -1 after a
 * message in `err` for a header that does not match the file. */
static int64_t llmc_header(const unsigned char *raw, int64_t bytes,
                           const char *path, char *err, size_t err_len) {
  enum { HEADER = 256 * 4, MAGIC = 20240520 };
  if (bytes < 4 || le32(raw) != MAGIC)
    return 0;
  int64_t version = bytes >= 8 ? le32(raw + 4) : 0;
  int64_t tokens = bytes >= 12 ? le32(raw + 8) : 0;
  if (bytes < HEADER)
    snprintf(err, err_len, "--data '%s' starts with llm.c's magic number "
             "20240520 but has %lld bytes, fewer than its header of 1024",
             QUOTED(path), (long long)bytes);
  else if (version != 1)
    snprintf(err, err_len, "--data '%s' has llm.c's header of version %lld: "
             "--data-format u16 reads version 1 (uint16 tokens)", QUOTED(path),
             (long long)version);
  else if (tokens < 0 || bytes - HEADER != 2 * tokens)
    snprintf(err, err_len, "--data '%s' has llm.c's header for %lld tokens, "
             "but %lld bytes follow it", QUOTED(path), (long long)tokens,
             (long long)(bytes - HEADER));
  else
    return HEADER;
  return -1;
}

dataset *dataset_u16(const char *path, int seq, int vocab, char *err,
                     size_t err_len) {
  int64_t bytes = 0;
  unsigned char *raw = load(path, 0, &bytes, err, err_len);
  if (raw == NULL)
    return NULL;
  return dataset_u16_bytes(raw, bytes, path, seq, vocab, err, err_len);
}

dataset *dataset_u16_bytes(unsigned char *raw, int64_t bytes,
                           const char *path, int seq, int vocab, char *err,
                           size_t err_len) {
  int64_t skip = llmc_header(raw, bytes, path, err, err_len);
  if (skip == 0 && bytes % 2 != 0)
    snprintf(err, err_len, "--data '%s' has %lld bytes, an odd number: "
             "--data-format u16 takes 2-byte tokens", QUOTED(path),
             (long long)bytes);
  if (skip < 0 || bytes % 2 != 0) {
    free(raw);
    return NULL;
  }
  /* in place: id i is read from bytes skip + 2i and skip + 2i + 1 before
   * it is stored in bytes 2i and 2i + 1 */
  uint16_t *ids = (uint16_t *)(void *)raw;
  const unsigned char *in = raw + skip;
  int64_t len = (bytes - skip) / 2;
  int largest = 0;
  for (int64_t i = 0; i < len; i++) {
    int id = in[2 * i] | in[2 * i + 1] << 8;
    ids[i] = (uint16_t)id;
    largest = id > largest ? id : largest;
    if (vocab > 0 && id >= vocab) {
      snprintf(err, err_len, "--data '%s': token id %d at position %lld is "
               "outside --vocab %d (ids 0 to %d)", QUOTED(path), id,
               (long long)i,
               vocab, vocab - 1);
      free(raw);
      return NULL;
    }
  }
  if (vocab == 0 && largest == 0 && len > 0) {
    snprintf(err, err_len, "--data '%s': every token id is 0, so the "
             "vocabulary (the largest id + 1) would be 1: a model needs at "
             "least 2 tokens (--vocab N sets it)", QUOTED(path));
    free(raw);
    return NULL;
  }
  return file_dataset(NULL, ids, len, vocab > 0 ? vocab : largest + 1, path,
                      seq, err, err_len);
}

dataset *dataset_u32(const char *path, int seq, int vocab, char *err,
                     size_t err_len) {
  int64_t bytes = 0;
  unsigned char *raw = load(path, 0, &bytes, err, err_len);
  if (raw == NULL)
    return NULL;
  if (bytes % 4 != 0) {
    snprintf(err, err_len, "--data '%s' has %lld bytes, not a multiple of "
             "4: --data-format u32 takes 4-byte tokens", QUOTED(path),
             (long long)bytes);
    free(raw);
    return NULL;
  }
  /* in place: id i is read from bytes 4i to 4i + 3 before it is stored
   * there */
  uint32_t *ids = (uint32_t *)(void *)raw;
  int64_t len = bytes / 4;
  uint32_t largest = 0;
  for (int64_t i = 0; i < len; i++) {
    const unsigned char *p = raw + 4 * i;
    uint32_t id = (uint32_t)p[0] | (uint32_t)p[1] << 8 |
                  (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    ids[i] = id;
    largest = id > largest ? id : largest;
    if ((vocab > 0 && id >= (uint32_t)vocab) || id > INT32_MAX - 1) {
      snprintf(err, err_len, "--data '%s': token id %lu at position %lld is "
               "outside the vocabulary of %d (ids 0 to %d)", QUOTED(path),
               (unsigned long)id, (long long)i, vocab, vocab - 1);
      free(raw);
      return NULL;
    }
  }
  dataset *d = file_dataset(NULL, NULL, len, vocab > 0 ? vocab
                                                      : (int)largest + 1,
                            path, seq, err, err_len);
  if (d == NULL) {
    free(raw);
    return NULL;
  }
  d->ids32 = ids;
  d->u16 = 1;
  return d;
}

dataset *dataset_tokens_only(int u16, int vocab) {
  dataset *d = calloc(1, sizeof *d);
  if (d != NULL)
    *d = (dataset){.u16 = u16, .vocab = vocab};
  return d;
}

dataset *dataset_open(const train_options *o, char *err, size_t err_len) {
  dataset *d;
  if (o->tokens_only)
    d = dataset_tokens_only(o->data_u16, o->data_u16 ? o->vocab : 256);
  else if (o->data_path == NULL)
    d = dataset_addition(o->seed);
  else if (o->data_u32)
    return dataset_u32(o->data_path, o->cfg.seq, o->vocab, err, err_len);
  else if (o->data_u16)
    return dataset_u16(o->data_path, o->cfg.seq, o->vocab, err, err_len);
  else
    return dataset_text(o->data_path, o->cfg.seq, err, err_len);
  if (d == NULL)
    snprintf(err, err_len, "out of memory");
  return d;
}

void dataset_destroy(dataset *d) {
  if (d != NULL) {
    free(d->text);
    free(d->ids);
    free(d->ids32);
  }
  free(d);
}

int dataset_vocab(const dataset *d) {
  return d->addition ? ADD_VOCAB : d->vocab;
}

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
      tok[t] = dataset_at(d, start + t);
      tgt[t] = dataset_at(d, start + t + 1);
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
             "the training data (%lld tokens) is too short for %d windows of "
             "%d tokens, one per rank",
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
  if (d->u16) {
    snprintf(buf, 8, "%d", (int)tok);
  } else if (d->addition) {
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
