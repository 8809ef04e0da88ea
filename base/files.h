/* Files: words for a file's kind, shared by every message that names one,
 * and the temporary file beside a target that saves write whole before
 * renaming it over the target (so the target never holds a part). */
#ifndef REMAT_BASE_FILES_H
#define REMAT_BASE_FILES_H

#include <limits.h>
#include <stdio.h>
#include <sys/types.h>

/* "a directory", "a character device", ... for a file that is not a
 * regular file (its st_mode). */
const char *remat__file_kind(mode_t mode);

/* The bytes remat__temp_create needs for the name of PATH's temporary
 * file, its NUL included. */
#define REMAT__TEMP_EXTRA sizeof(".0123456789abcdef.tmp")

/* Creates PATH.<16 hex digits>.tmp beside PATH with O_EXCL and
 * O_NOFOLLOW, so that nothing already there (a file, a symbolic link) is
 * reused or followed; its mode is 0644 less the umask. Writes its name to
 * tmp (len bytes, at least strlen(path) + REMAT__TEMP_EXTRA, else
 * ENAMETOOLONG) and returns its file descriptor, or -1 with errno set.
 * It allocates nothing. */
int remat__temp_create(const char *path, char *tmp, size_t len);

/* The one atomic replacement of a file (safetensors, checkpoints, traces):
 * remat__replace_begin opens a new file beside PATH, the caller writes it
 * (through the FILE or its descriptor), and remat__replace_end flushes and
 * fsyncs it, renames it over PATH and fsyncs the directory, or removes it
 * when anything before the rename failed. Readers of the target, and other
 * writers replacing it at the same time, only ever see a whole file, and a
 * failure leaves no part of a file behind. PATH must be a regular file or
 * a new name: a symbolic link is refused (the rename would replace the
 * link itself, and following it would write where the link points).
 * Nothing is allocated through remat__malloc. */
typedef enum remat__replace_step {
  REMAT__REPLACE_WRITE,   /* writing, flushing, fsync or close failed */
  REMAT__REPLACE_RENAME,  /* the rename failed */
  REMAT__REPLACE_SYNC_DIR /* renamed, but the directory could not be synced */
} remat__replace_step;

typedef struct remat__replacing {
  const char *target;
  char tmp[PATH_MAX + REMAT__TEMP_EXTRA];
  remat__replace_step failed; /* after remat__replace_end fails */
} remat__replacing;

/* 0 when PATH is a regular file or nothing; else -1 with *mode the kind of
 * what is there (remat__file_kind), or *mode 0 and errno set when PATH
 * cannot be looked at. */
int remat__replace_check(const char *path, mode_t *mode);
/* NULL with errno set when PATH is refused (ELOOP for a symbolic link,
 * EISDIR for a directory, EINVAL for another kind) or the new file cannot
 * be created. */
FILE *remat__replace_begin(const char *path, remat__replacing *r);
/* Closes f; 0 when the target now holds what was written (durably), else
 * an errno value and r->failed says where: before the rename the target
 * is as it was and the new file is gone; at REMAT__REPLACE_SYNC_DIR the
 * target is whole and new, but the rename may not outlive a crash. */
int remat__replace_end(FILE *f, remat__replacing *r);
/* Closes f and removes the new file; the target is as it was. */
void remat__replace_abort(FILE *f, remat__replacing *r);

/* The offset of the first byte of s[0..len) that does not start a
 * well-formed UTF-8 sequence (overlong forms and surrogates are not), or
 * len when all of it is UTF-8. */
size_t remat__utf8_invalid_at(const char *s, size_t len);

/* Writes s as the body of a JSON string: '"' and '\\' escaped, control
 * bytes (and 0x7F) as \u00NN, well-formed UTF-8 as it is, and any other
 * byte as the four characters \xNN (as messages show bytes), so that the
 * file is valid UTF-8 JSON whatever the bytes of a name. */
void remat__write_json_text(FILE *f, const char *s);

#endif
