/* Numbers in the JSON that the tools and benchmarks print (--json): a NaN
 * or an infinite value is no JSON number, so it is written as null and its
 * field is named in a "nonfinite" member of the same object, which says
 * why the value is missing. */
#ifndef REMAT_TOOLS_JSON_OUT_H
#define REMAT_TOOLS_JSON_OUT_H

#include <stddef.h>
#include <stdio.h>

/* The fields of one JSON object written as null so far. */
typedef struct json_nulls {
  char names[256]; /* "\"loss\", \"grad_norm\"" */
  char member[300];
} json_nulls;

/* The text of one number. */
typedef struct json_text {
  char text[48];
} json_text;

/* Writes into out->text (and returns it) `v` formatted by the printf
 * format `fmt` (one double), or "null" after noting `field` in `nulls`
 * when v is NaN or infinite. Call it for the fields in their order, in
 * statements of their own (the order of a call's arguments is
 * unspecified), then print out->text. */
const char *json_num(json_nulls *nulls, json_text *out, const char *field,
                     const char *fmt, double v);

/* Prints `, "field": v` on f (json_put: on stdout), v as json_num writes
 * it. */
void json_fput(FILE *f, json_nulls *nulls, const char *field,
               const char *fmt, double v);
void json_put(json_nulls *nulls, const char *field, const char *fmt, double v);

/* ", \"nonfinite\": [fields]" when a field was null because its value was
 * NaN or infinite, else "". Call it after every json_num of the object. */
const char *json_nonfinite(json_nulls *nulls);

#endif
