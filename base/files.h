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

/* A file being replaced: remat__replace_begin opens a new file beside
 * PATH (or beside the file a symbolic link at PATH points to: the link
 * stays), the caller writes it, and remat__replace_end renames it over the
 * target when every write succeeded, else removes it. Readers of the
 * target, and other writers replacing it at the same time, only ever see
 * a whole file. Nothing is allocated through remat__malloc. */
typedef struct remat__replacing {
  char resolved[PATH_MAX];
  const char *target;
  char tmp[PATH_MAX + REMAT__TEMP_EXTRA];
} remat__replacing;

/* NULL with errno set when the new file cannot be created. */
FILE *remat__replace_begin(const char *path, remat__replacing *r);
/* Closes f; 0 when the target now holds what was written, else an errno
 * value (the target is as it was). */
int remat__replace_end(FILE *f, remat__replacing *r);

/* Writes s as the body of a JSON string: '"' and '\\' escaped, control
 * bytes (and 0x7F) as \u00NN, well-formed UTF-8 as it is, and any other
 * byte as the four characters \xNN (as messages show bytes), so that the
 * file is valid UTF-8 JSON whatever the bytes of a name. */
void remat__write_json_text(FILE *f, const char *s);

#endif
