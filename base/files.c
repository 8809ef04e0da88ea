/* Files (files.h): words for a file's kind, and the one atomic
 * replacement of a file: a temporary file beside the target, written,
 * fsynced, renamed over it, and its directory fsynced. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/files.h"

#define TEMP_TRIES 100 /* names tried for a temporary file */

const char *remat__file_kind(mode_t mode) {
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
  if (S_ISLNK(mode))
    return "a symbolic link";
  return "a special file";
}

/* Random bits for a temporary name; unique within the process even when
 * the system has none to give. */
static uint64_t temp_suffix(void) {
  static _Atomic uint64_t counter;
  uint64_t r = 0;
  if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    r = ((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_nsec ^
        ((uint64_t)ts.tv_sec << 20);
  }
  return r + atomic_fetch_add(&counter, 1) * 0x9e3779b97f4a7c15ull;
}

int remat__temp_create(const char *path, char *tmp, size_t len) {
  if (len < strlen(path) + REMAT__TEMP_EXTRA) {
    errno = ENAMETOOLONG;
    return -1;
  }
  for (int i = 0; i < TEMP_TRIES; i++) {
    snprintf(tmp, len, "%s.%016llx.tmp", path,
             (unsigned long long)temp_suffix());
    int fd =
        open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0)
      return fd;
    if (errno != EEXIST)
      return -1;
  }
  return -1;
}

int remat__replace_check(const char *path, mode_t *mode) {
  struct stat st;
  *mode = 0;
  if (lstat(path, &st) != 0)
    return errno == ENOENT ? 0 : -1;
  if (S_ISREG(st.st_mode))
    return 0;
  *mode = st.st_mode;
  return -1;
}

FILE *remat__replace_begin(const char *path, remat__replacing *r) {
  mode_t mode;
  r->target = path;
  r->tmp[0] = '\0';
  if (remat__replace_check(path, &mode) != 0) {
    if (mode != 0)
      errno = S_ISLNK(mode) ? ELOOP : S_ISDIR(mode) ? EISDIR : EINVAL;
    return NULL;
  }
  int fd = remat__temp_create(path, r->tmp, sizeof r->tmp);
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (f == NULL && fd >= 0) {
    int err = errno;
    close(fd);
    unlink(r->tmp);
    errno = err;
  }
  return f;
}

/* Syncs the directory that holds `path`, so that a rename in it outlives
 * a crash (file systems that cannot sync a directory say EINVAL); 0 or an
 * errno value. */
static int sync_dir(const char *path) {
  char dir[PATH_MAX];
  const char *slash = strrchr(path, '/');
  size_t len = slash == NULL ? 1 : slash == path ? 1 : (size_t)(slash - path);
  if (len >= sizeof dir)
    return ENAMETOOLONG;
  memcpy(dir, slash == NULL ? "." : path, len);
  dir[len] = '\0';
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return errno;
  int err = fsync(fd) != 0 && errno != EINVAL ? errno : 0;
  close(fd);
  return err;
}

int remat__replace_end(FILE *f, remat__replacing *r) {
  int err = ferror(f) ? (errno ? errno : EIO) : 0;
  if (err == 0 && fflush(f) != 0)
    err = errno ? errno : EIO;
  if (err == 0 && fsync(fileno(f)) != 0)
    err = errno;
  if (fclose(f) != 0 && err == 0)
    err = errno ? errno : EIO;
  r->failed = REMAT__REPLACE_WRITE;
  if (err == 0 && rename(r->tmp, r->target) != 0) {
    err = errno;
    r->failed = REMAT__REPLACE_RENAME;
  }
  if (err != 0) {
    unlink(r->tmp);
    return err;
  }
  r->failed = REMAT__REPLACE_SYNC_DIR;
  return sync_dir(r->target);
}

void remat__replace_abort(FILE *f, remat__replacing *r) {
  fclose(f);
  unlink(r->tmp);
}

/* The length of the well-formed UTF-8 sequence at s (1 to 4), or 0 when
 * the bytes there are not one (overlong forms and surrogates included). */
static int utf8_length(const unsigned char *s) {
  unsigned char c = s[0];
  int n = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
  if (c >= 0xf5 || n == 0)
    return 0;
  for (int i = 1; i < n; i++)
    if ((s[i] & 0xc0) != 0x80)
      return 0;
  if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0) ||
      (c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] >= 0x90))
    return 0;
  return n;
}

size_t remat__utf8_invalid_at(const char *s, size_t len) {
  const unsigned char *c = (const unsigned char *)s;
  for (size_t i = 0; i < len;) {
    int n = c[i] >= 0x80 ? utf8_length(c + i) : 1;
    if (n == 0 || i + (size_t)n > len)
      return i;
    i += (size_t)n;
  }
  return len;
}

void remat__write_json_text(FILE *f, const char *s) {
  for (const unsigned char *c = (const unsigned char *)s; *c != '\0';) {
    int n = *c >= 0x80 ? utf8_length(c) : 1;
    if (*c == '"' || *c == '\\')
      fprintf(f, "\\%c", *c);
    else if (*c < 0x20 || *c == 0x7f)
      fprintf(f, "\\u%04x", *c);
    else if (n == 0)
      fprintf(f, "\\\\x%02X", *c);
    else
      fwrite(c, 1, (size_t)n, f);
    c += n > 0 ? n : 1;
  }
}
