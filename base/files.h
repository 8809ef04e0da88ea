/* Words for files, shared by every message that names a file's kind. */
#ifndef REMAT_BASE_FILES_H
#define REMAT_BASE_FILES_H

#include <sys/types.h>

/* "a directory", "a character device", ... for a file that is not a
 * regular file (its st_mode). */
const char *remat__file_kind(mode_t mode);

#endif
