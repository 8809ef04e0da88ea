/* Configuration: the REMAT_* environment, read once at runtime creation
 * (unless the program sets REMAT_SET_NO_ENV), merged with the fields a
 * program sets in a remat_config. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/internal.h"

_Static_assert(REMAT_MAX_THREADS == SCHED_MAX_THREADS,
               "the public limit is the scheduler's");

#define MAX_LOOKAHEAD 64

static bool parse_int(const char *text, long min, long max, long *out) {
  if (text == NULL || *text == '\0' || isspace((unsigned char)*text))
    return false;
  char *end = NULL;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (errno != 0 || *end != '\0' || v < min || v > max)
    return false;
  *out = v;
  return true;
}

typedef struct byte_unit {
  const char *suffix;
  double scale;
} byte_unit;

static const byte_unit byte_units[] = {
    {"", 1.0},          {"B", 1.0},          {"KB", 1e3},
    {"MB", 1e6},        {"GB", 1e9},         {"TB", 1e12},
    {"KiB", 1024.0},    {"MiB", 1048576.0},  {"GiB", 1073741824.0},
    {"TiB", 1099511627776.0},
};

remat_status remat_parse_bytes(const char *text, int64_t *bytes) {
  static const char accepted[] =
      "a positive number with an optional unit and no space, such as "
      "1.5GiB, 800MB or 4096 (units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)";
  if (text == NULL || bytes == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_parse_bytes: text and bytes must not be NULL");
  const char *p = text;
  while (isdigit((unsigned char)*p) || *p == '.')
    p++;
  double value = 0.0;
  bool number_ok = p != text && p - text < 32;
  if (number_ok) {
    char num[32];
    memcpy(num, text, (size_t)(p - text));
    num[p - text] = '\0';
    char *end = NULL;
    value = strtod(num, &end);
    number_ok = *end == '\0' && isfinite(value) && value > 0.0;
  }
  for (size_t i = 0; number_ok && i < sizeof byte_units / sizeof *byte_units;
       i++) {
    if (strcmp(p, byte_units[i].suffix) == 0) {
      double b = value * byte_units[i].scale;
      if (b >= 1.0 && b < 9.0e18) {
        *bytes = (int64_t)b;
        return REMAT_OK;
      }
    }
  }
  return remat__fail(REMAT_ERR_CONFIG, "'%s' is not a byte size: expected %s",
                     remat__quote(&(remat__quoted){0}, text), accepted);
}

static remat_status env_threads(const char *v, int *out) {
  long n;
  if (!parse_int(v, 1, SCHED_MAX_THREADS, &n))
    return remat__fail(REMAT_ERR_CONFIG,
                       "REMAT_NUM_THREADS='%s' is not valid: expected a whole "
                       "number of worker threads from 1 to %d",
                       remat__quote(&(remat__quoted){0}, v), SCHED_MAX_THREADS);
  *out = (int)n;
  return REMAT_OK;
}

static remat_status env_bind(const char *v, remat_bind *out) {
  static const char *const names[] = {"core", "numa", "none"};
  for (int i = 0; i < 3; i++)
    if (strcmp(v, names[i]) == 0) {
      *out = (remat_bind)i;
      return REMAT_OK;
    }
  return remat__fail(REMAT_ERR_CONFIG,
                     "REMAT_BIND='%s' is not valid: expected one of core, "
                     "numa, none",
                     remat__quote(&(remat__quoted){0}, v));
}

static remat_status env_budget(const char *v, int64_t *out) {
  if (remat_parse_bytes(v, out) == REMAT_OK)
    return REMAT_OK;
  return remat__fail(REMAT_ERR_CONFIG,
                     "REMAT_MEMORY_BUDGET='%s' is not valid: expected a "
                     "positive byte size with an optional unit and no space, "
                     "such as 1.5GiB, 800MB or 4096 (units B, KB, MB, GB, TB, "
                     "KiB, MiB, GiB, TiB)",
                     remat__quote(&(remat__quoted){0}, v));
}

static remat_status env_lookahead(const char *v, int *out) {
  long n;
  if (!parse_int(v, 1, MAX_LOOKAHEAD, &n))
    return remat__fail(REMAT_ERR_CONFIG,
                       "REMAT_LOOKAHEAD='%s' is not valid: expected a whole "
                       "number of regions from 1 to %d",
                       remat__quote(&(remat__quoted){0}, v), MAX_LOOKAHEAD);
  *out = (int)n;
  return REMAT_OK;
}

static remat_status env_verbose(const char *v, int *out) {
  long n;
  if (!parse_int(v, 0, 2, &n))
    return remat__fail(REMAT_ERR_CONFIG,
                       "REMAT_VERBOSE='%s' is not valid: expected 0 (quiet), 1 "
                       "(plan summary) or 2 (per task)",
                       remat__quote(&(remat__quoted){0}, v));
  *out = (int)n;
  return REMAT_OK;
}

static remat_status env_precision(const char *v, remat_precision *out) {
  if (strcmp(v, "f32") == 0) {
    *out = REMAT_PRECISION_F32;
    return REMAT_OK;
  }
  if (strcmp(v, "bf16") == 0) {
    *out = REMAT_PRECISION_BF16;
    return REMAT_OK;
  }
  return remat__fail(REMAT_ERR_CONFIG,
                     "REMAT_PRECISION='%s' is not valid: expected f32 or bf16",
                     remat__quote(&(remat__quoted){0}, v));
}

static remat_status copy_string(const char *what, const char *v, char *buf,
                                size_t len) {
  if (strlen(v) >= len)
    return remat__fail(REMAT_ERR_CONFIG,
                       "%s is too long (%zu characters): at most %zu accepted",
                       what, strlen(v), len - 1);
  memcpy(buf, v, strlen(v) + 1);
  return REMAT_OK;
}

/* Copies a string value into `buf` and points `*field` at it; an empty
 * value means none (NULL). */
static remat_status set_string(const char *what, const char *v, char *buf,
                               size_t len, const char **field) {
  *field = NULL;
  if (v == NULL || *v == '\0')
    return REMAT_OK;
  remat_status s = copy_string(what, v, buf, len);
  if (s == REMAT_OK)
    *field = buf;
  return s;
}

/* Reads every set variable; the first bad one fails. */
static remat_status load_env(remat_config *c, config_strings *str) {
  remat_status s = REMAT_OK;
  const char *v;
  if ((v = getenv("REMAT_NUM_THREADS")) && (s = env_threads(v, &c->num_threads)))
    return s;
  if ((v = getenv("REMAT_BIND")) && (s = env_bind(v, &c->bind)))
    return s;
  if ((v = getenv("REMAT_POLICY"))) {
    if (*v == '\0')
      return remat__fail(REMAT_ERR_CONFIG,
                         "REMAT_POLICY is empty: expected a policy such as "
                         "nothing_saveable or dots_saveable");
    if ((s = copy_string("REMAT_POLICY", v, str->policy, sizeof str->policy)))
      return s;
    c->policy = str->policy;
  }
  if ((v = getenv("REMAT_MEMORY_BUDGET")) && (s = env_budget(v, &c->memory_budget)))
    return s;
  if ((v = getenv("REMAT_LOOKAHEAD")) && (s = env_lookahead(v, &c->lookahead)))
    return s;
  if ((v = getenv("REMAT_TRACE")) &&
      (s = set_string("REMAT_TRACE", v, str->trace, sizeof str->trace,
                      &c->trace_path)))
    return s;
  if ((v = getenv("REMAT_VERBOSE")) && (s = env_verbose(v, &c->verbose)))
    return s;
  if ((v = getenv("REMAT_PRECISION")) &&
      (s = env_precision(v, &c->precision)))
    return s;
  if ((v = getenv("REMAT_TOPOLOGY")) &&
      (s = set_string("REMAT_TOPOLOGY", v, str->topology,
                      sizeof str->topology, &c->topology)))
    return s;
  return REMAT_OK;
}

/* Overlays the numeric fields the program sets, checking each. */
static remat_status overlay_numbers(const remat_config *code,
                                    remat_config *c) {
  unsigned set = code->set;
  if (set & REMAT_SET_NUM_THREADS) {
    if (code->num_threads < 1 || code->num_threads > SCHED_MAX_THREADS)
      return remat__fail(REMAT_ERR_CONFIG,
                         "remat_config.num_threads=%d is not valid: expected "
                         "1 to %d",
                         code->num_threads, SCHED_MAX_THREADS);
    c->num_threads = code->num_threads;
  }
  if (set & REMAT_SET_BIND) {
    if ((unsigned)code->bind > REMAT_BIND_NONE)
      return remat__fail(REMAT_ERR_CONFIG,
                         "remat_config.bind=%d is not valid: expected "
                         "REMAT_BIND_CORE, REMAT_BIND_NUMA or REMAT_BIND_NONE",
                         (int)code->bind);
    c->bind = code->bind;
  }
  if (set & REMAT_SET_MEMORY_BUDGET) {
    if (code->memory_budget < 0)
      return remat__fail(REMAT_ERR_CONFIG,
                         "remat_config.memory_budget=%lld is negative: "
                         "expected bytes, or 0 for none",
                         (long long)code->memory_budget);
    c->memory_budget = code->memory_budget;
  }
  if (set & REMAT_SET_LOOKAHEAD) {
    if (code->lookahead < 1 || code->lookahead > MAX_LOOKAHEAD)
      return remat__fail(REMAT_ERR_CONFIG,
                         "remat_config.lookahead=%d is not valid: expected 1 "
                         "to %d",
                         code->lookahead, MAX_LOOKAHEAD);
    c->lookahead = code->lookahead;
  }
  if (set & REMAT_SET_VERBOSE) {
    if (code->verbose < 0 || code->verbose > 2)
      return remat__fail(REMAT_ERR_CONFIG,
                         "remat_config.verbose=%d is not valid: expected 0, 1 "
                         "or 2",
                         code->verbose);
    c->verbose = code->verbose;
  }
  if (set & REMAT_SET_PRECISION) {
    if ((unsigned)code->precision > REMAT_PRECISION_BF16)
      return remat__fail(REMAT_ERR_CONFIG,
                         "remat_config.precision=%d is not valid: expected "
                         "REMAT_PRECISION_F32 or REMAT_PRECISION_BF16",
                         (int)code->precision);
    c->precision = code->precision;
  }
  return REMAT_OK;
}

/* Overlays the string fields the program sets, copying each. */
static remat_status overlay_strings(const remat_config *code, remat_config *c,
                                    config_strings *str) {
  unsigned set = code->set;
  remat_status s = REMAT_OK;
  if (set & REMAT_SET_POLICY) {
    if (code->policy == NULL || *code->policy == '\0')
      return remat__fail(REMAT_ERR_CONFIG,
                         "remat_config.policy is empty: expected a policy "
                         "such as nothing_saveable or dots_saveable");
    if ((s = copy_string("remat_config.policy", code->policy, str->policy,
                         sizeof str->policy)))
      return s;
    c->policy = str->policy;
  }
  if ((set & REMAT_SET_TRACE) &&
      (s = set_string("remat_config.trace_path", code->trace_path, str->trace,
                      sizeof str->trace, &c->trace_path)))
    return s;
  if ((set & REMAT_SET_TOPOLOGY) &&
      (s = set_string("remat_config.topology", code->topology, str->topology,
                      sizeof str->topology, &c->topology)))
    return s;
  return REMAT_OK;
}

remat_status remat__config_load(const remat_config *code, int default_threads,
                                remat_config *out, config_strings *strings) {
  remat_config c = {
      .set = 0,
      .num_threads = default_threads,
      .bind = REMAT_BIND_CORE,
      .policy = "nothing_saveable",
      .memory_budget = 0,
      .lookahead = 1,
      .trace_path = NULL,
      .verbose = 0,
      .topology = NULL,
      .precision = REMAT_PRECISION_F32,
  };
  remat_status s = REMAT_OK;
  if (code != NULL && (code->set & REMAT_SET_NO_ENV))
    c.set = REMAT_SET_NO_ENV; /* kept: data parallel reads no REMAT_DP_* */
  else
    s = load_env(&c, strings);
  if (s == REMAT_OK && code != NULL)
    s = overlay_numbers(code, &c);
  if (s == REMAT_OK && code != NULL)
    s = overlay_strings(code, &c, strings);
  if (s == REMAT_OK)
    *out = c;
  return s;
}
