/* The library's version string, built from the header's version macros
 * when the library is compiled (remat_version). */
#include "remat.h"

#define VERSION_STR_(x) #x
#define VERSION_STR(x) VERSION_STR_(x)

const char *remat_version(void) {
  return VERSION_STR(REMAT_VERSION_MAJOR) "." VERSION_STR(
      REMAT_VERSION_MINOR) "." VERSION_STR(REMAT_VERSION_PATCH);
}
