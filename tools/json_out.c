/* Numbers in the tools' JSON output, NaN and infinities as null with the
 * field named in "nonfinite" (json_out.h). */
#include "tools/json_out.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

const char *json_num(json_nulls *nulls, json_text *out, const char *field,
                     const char *fmt, double v) {
  if (isfinite(v)) {
    snprintf(out->text, sizeof out->text, fmt, v);
    return out->text;
  }
  size_t used = strlen(nulls->names);
  snprintf(nulls->names + used, sizeof nulls->names - used, "%s\"%s\"",
           used > 0 ? ", " : "", field);
  snprintf(out->text, sizeof out->text, "null");
  return out->text;
}

const char *json_nonfinite(json_nulls *nulls) {
  nulls->member[0] = '\0';
  if (nulls->names[0] != '\0')
    snprintf(nulls->member, sizeof nulls->member, ", \"nonfinite\": [%s]",
             nulls->names);
  return nulls->member;
}

void json_fput(FILE *f, json_nulls *nulls, const char *field,
               const char *fmt, double v) {
  json_text t;
  fprintf(f, ", \"%s\": %s", field, json_num(nulls, &t, field, fmt, v));
}

void json_put(json_nulls *nulls, const char *field, const char *fmt,
              double v) {
  json_fput(stdout, nulls, field, fmt, v);
}
