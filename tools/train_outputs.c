/* The files a remat-train run writes, checked before its first step: the
 * --save target must be a regular file or a new name in a folder where a
 * new file can be made (a save writes one beside the target and renames
 * it over), so that a bad target fails at once instead of after the whole
 * run. --trace and REMAT_TRACE are checked by the library when they are
 * set (remat_trace_steps, remat_runtime_create), also before any step. */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"
#include "base/files.h"
#include "tools/train.h"

/* 0, or -1 after putting "OPT 'PATH' ..." in err. */
static int check_target(const char *opt, const char *path, char *err,
                        size_t err_len) {
  remat__quoted q;
  const char *shown = remat__quote(&q, path);
  mode_t mode = 0;
  if (remat__replace_check(path, &mode) != 0) {
    if (mode != 0)
      snprintf(err, err_len, "%s '%s' is %s: %s takes a regular file or a "
               "new name", opt, shown, remat__file_kind(mode), opt);
    else
      snprintf(err, err_len, "%s '%s' cannot be looked at: %s", opt, shown,
               strerror(errno));
    return -1;
  }
  remat__replacing r;
  FILE *f = remat__replace_begin(path, &r);
  if (f == NULL) {
    snprintf(err, err_len, "%s '%s': cannot create a new file beside it "
             "(%s): its folder must exist and be writable", opt, shown,
             strerror(errno));
    return -1;
  }
  remat__replace_abort(f, &r); /* the target is as it was */
  return 0;
}

int outputs_check(const train_options *o, int rank, char *err,
                  size_t err_len) {
  if (o->save_path != NULL && rank == 0 && o->prompt == NULL)
    return check_target("--save", o->save_path, err, err_len);
  return 0;
}
