/* Remat policies with JAX's names and meaning, their string forms,
 * checkpoint regions and names, and the per-activation decision: saved for
 * backward or recomputed there. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/policy/policy.h"

/* The canonical name of each kind: the one remat_policy_format writes. */
static const char *const kind_names[] = {
    [POLICY_EVERYTHING] = "everything_saveable",
    [POLICY_NOTHING] = "nothing_saveable",
    [POLICY_DOTS] = "dots_saveable",
    [POLICY_DOTS_NO_BATCH] = "dots_with_no_batch_dims_saveable",
    [POLICY_ONLY_NAMES] = "save_only_these_names",
    [POLICY_ALL_BUT_NAMES] = "save_any_names_but_these",
    [POLICY_BOTH] = "save_from_both_policies",
    [POLICY_AUTO] = "auto",
};

/* Every word a policy string may start with. Aliases parse to their
 * canonical kind; JAX's offload policies are known only to say that remat
 * does not offload, and their kind is the nearest remat policy. */
typedef enum word_form {
  WORD_SIMPLE,
  WORD_NAMES,
  WORD_BOTH,
  WORD_OFFLOAD
} word_form;
typedef struct policy_word {
  const char *word;
  policy_kind kind;
  word_form form;
} policy_word;
static const policy_word policy_words[] = {
    {"everything_saveable", POLICY_EVERYTHING, WORD_SIMPLE},
    {"nothing_saveable", POLICY_NOTHING, WORD_SIMPLE},
    {"dots_saveable", POLICY_DOTS, WORD_SIMPLE},
    {"checkpoint_dots", POLICY_DOTS, WORD_SIMPLE},
    {"dots_with_no_batch_dims_saveable", POLICY_DOTS_NO_BATCH, WORD_SIMPLE},
    {"checkpoint_dots_with_no_batch_dims", POLICY_DOTS_NO_BATCH, WORD_SIMPLE},
    {"save_only_these_names", POLICY_ONLY_NAMES, WORD_NAMES},
    {"save_any_names_but_these", POLICY_ALL_BUT_NAMES, WORD_NAMES},
    {"save_anything_except_these_names", POLICY_ALL_BUT_NAMES, WORD_NAMES},
    {"save_from_both_policies", POLICY_BOTH, WORD_BOTH},
    {"auto", POLICY_AUTO, WORD_SIMPLE},
    {"save_and_offload_only_these_names", POLICY_ONLY_NAMES, WORD_OFFLOAD},
    {"offload_dot_with_no_batch_dims", POLICY_DOTS_NO_BATCH, WORD_OFFLOAD},
};

#define ACCEPTED_POLICIES                                                      \
  "everything_saveable, nothing_saveable, dots_saveable, checkpoint_dots, "    \
  "dots_with_no_batch_dims_saveable, checkpoint_dots_with_no_batch_dims, "     \
  "save_only_these_names:NAME[,NAME...], "                                     \
  "save_any_names_but_these:NAME[,NAME...], "                                  \
  "save_anything_except_these_names:NAME[,NAME...], "                          \
  "save_from_both_policies:P+Q, auto"

/* What a name may be; the %d is REMAT__NAME_MAX - 1. */
#define NAME_RULE                                                              \
  "a name is 1 to %d bytes, none of them a space, ',', '+', ':' or a "         \
  "control byte (0x01-0x1F, 0x7F)"

#define BOTH_EXAMPLE                                                           \
  "e.g. save_from_both_policies:dots_saveable+"                                \
  "save_only_these_names:attn_probs"

/* ---- message pieces ---- */

/* " at offset N" for a word that does not start the string, else "". */
typedef struct offset_note {
  char text[48];
} offset_note;

static const char *at_offset(offset_note *o, size_t at) {
  o->text[0] = '\0';
  if (at > 0)
    snprintf(o->text, sizeof o->text, " at offset %zu", at);
  return o->text;
}

/* What makes name[0..len) no valid name, written into flaw with offsets
 * counted from `base`; false when the name is valid. */
static bool name_flaw(const char *name, size_t len, size_t base, char *flaw,
                      size_t cap) {
  if (len == 0) {
    snprintf(flaw, cap, "it is empty");
    return true;
  }
  if (len >= REMAT__NAME_MAX) {
    snprintf(flaw, cap, "it is %zu bytes long", len);
    return true;
  }
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)name[i];
    if (c < 0x20 || c == 0x7F)
      snprintf(flaw, cap, "control byte \\x%02X at offset %zu", c, base + i);
    else if (c == ' ')
      snprintf(flaw, cap, "a space at offset %zu", base + i);
    else if (c == ',' || c == '+' || c == ':')
      snprintf(flaw, cap, "'%c' at offset %zu", c, base + i);
    else
      continue;
    return true;
  }
  return false;
}

/* ---- constructors ---- */

static remat_policy *new_policy(policy_kind kind) {
  remat_policy *p = remat__calloc(1, sizeof *p);
  if (p == NULL)
    remat__fail(REMAT_ERR_OUT_OF_MEMORY, "out of memory creating a policy");
  else
    p->kind = kind;
  return p;
}

remat_policy *remat_policy_everything_saveable(void) {
  return new_policy(POLICY_EVERYTHING);
}
remat_policy *remat_policy_nothing_saveable(void) {
  return new_policy(POLICY_NOTHING);
}
remat_policy *remat_policy_dots_saveable(void) { return new_policy(POLICY_DOTS); }
remat_policy *remat_policy_checkpoint_dots(void) {
  return new_policy(POLICY_DOTS);
}
remat_policy *remat_policy_dots_with_no_batch_dims_saveable(void) {
  return new_policy(POLICY_DOTS_NO_BATCH);
}
remat_policy *remat_policy_checkpoint_dots_with_no_batch_dims(void) {
  return new_policy(POLICY_DOTS_NO_BATCH);
}

void remat_policy_destroy(remat_policy *p) {
  if (p == NULL)
    return;
  for (int i = 0; i < p->nnames; i++)
    free(p->names[i]);
  free(p->names);
  remat_policy_destroy(p->a);
  remat_policy_destroy(p->b);
  free(p);
}

/* How deep save_from_both_policies nests in p: 0 for the other kinds. */
static int policy_depth(const remat_policy *p) {
  if (p->kind != POLICY_BOTH)
    return 0;
  int a = policy_depth(p->a), b = policy_depth(p->b);
  return 1 + (a > b ? a : b);
}

/* The length of p's string form, without the NUL. */
static size_t text_length(const remat_policy *p) {
  size_t n = strlen(kind_names[p->kind]);
  for (int i = 0; i < p->nnames; i++)
    n += 1 + strlen(p->names[i]);
  if (p->kind == POLICY_BOTH)
    n += 1 + text_length(p->a) + 1 + text_length(p->b);
  return n;
}

/* Checks the names given to the constructor `what` (its name as the caller
 * wrote it) and adds up the bytes they take in the string form. */
static bool names_valid(const char *what, const char *const *names, int count,
                        size_t *text) {
  if (count < 1 || names == NULL) {
    remat__fail(REMAT_ERR_POLICY,
                "%s needs at least one name, e.g. %s:attn_out,ffn_in", what,
                what);
    return false;
  }
  *text = 0;
  for (int i = 0; i < count; i++) {
    char flaw[64];
    size_t len = names[i] ? strlen(names[i]) : 0;
    if (names[i] == NULL)
      remat__fail(REMAT_ERR_POLICY, "%s: name %d is NULL; " NAME_RULE, what,
                  i, REMAT__NAME_MAX - 1);
    else if (name_flaw(names[i], len, 0, flaw, sizeof flaw))
      remat__fail(REMAT_ERR_POLICY,
                  "%s: name %d ('%s') is not valid: %s; " NAME_RULE, what, i,
                  remat__quote_n(&(remat__quoted){0}, names[i], len), flaw,
                  REMAT__NAME_MAX - 1);
    else {
      *text += 1 + len;
      continue;
    }
    return false;
  }
  return true;
}

static remat_policy *names_policy(policy_kind kind, const char *what,
                                  const char *const *names, int count) {
  size_t text = 0;
  if (!names_valid(what, names, count, &text))
    return NULL;
  text += strlen(kind_names[kind]); /* format writes the canonical name */
  if (text > REMAT_MAX_POLICY_LENGTH) {
    remat__fail(REMAT_ERR_POLICY,
                "%s: %d names make a string form of %zu bytes, more than the "
                "limit of %d (REMAT_MAX_POLICY_LENGTH)",
                what, count, text, REMAT_MAX_POLICY_LENGTH);
    return NULL;
  }
  remat_policy *p = new_policy(kind);
  if (p == NULL)
    return NULL;
  p->names = remat__calloc((size_t)count, sizeof *p->names);
  for (int i = 0; p->names != NULL && i < count; i++) {
    p->names[i] = remat__strdup(names[i]);
    if (p->names[i] == NULL)
      break;
    p->nnames++;
  }
  if (p->nnames != count) {
    remat_policy_destroy(p);
    remat__fail(REMAT_ERR_OUT_OF_MEMORY, "out of memory creating a policy");
    return NULL;
  }
  return p;
}

remat_policy *remat_policy_save_only_these_names(const char *const *names,
                                                 int count) {
  return names_policy(POLICY_ONLY_NAMES, "save_only_these_names", names,
                      count);
}

remat_policy *remat_policy_save_any_names_but_these(const char *const *names,
                                                    int count) {
  return names_policy(POLICY_ALL_BUT_NAMES, "save_any_names_but_these", names,
                      count);
}

remat_policy *
remat_policy_save_anything_except_these_names(const char *const *names,
                                              int count) {
  return names_policy(POLICY_ALL_BUT_NAMES, "save_anything_except_these_names",
                      names, count);
}

remat_policy *policy_clone(const remat_policy *src) {
  if (src == NULL)
    return NULL;
  switch (src->kind) {
  case POLICY_ONLY_NAMES:
  case POLICY_ALL_BUT_NAMES:
    return names_policy(src->kind, kind_names[src->kind],
                        (const char *const *)src->names, src->nnames);
  case POLICY_BOTH:
    return remat_policy_save_from_both_policies(src->a, src->b);
  default:
    return new_policy(src->kind);
  }
}

/* Why a and b cannot be combined (message set), or true when they can:
 * the result must stay within the limits remat_policy_parse has, so that
 * its string form parses again. */
static bool both_fit(const remat_policy *a, const remat_policy *b) {
  if (a == NULL || b == NULL) {
    remat__fail(REMAT_ERR_POLICY,
                "save_from_both_policies needs two policies, got NULL");
    return false;
  }
  if (a->kind == POLICY_AUTO || b->kind == POLICY_AUTO) {
    remat__fail(REMAT_ERR_POLICY,
                "save_from_both_policies cannot combine 'auto'");
    return false;
  }
  int depth_a = policy_depth(a), depth_b = policy_depth(b);
  int depth = 1 + (depth_a > depth_b ? depth_a : depth_b);
  if (depth > REMAT_MAX_POLICY_DEPTH) {
    remat__fail(REMAT_ERR_POLICY,
                "save_from_both_policies: the result would nest %d deep, "
                "more than the limit of %d (REMAT_MAX_POLICY_DEPTH)",
                depth, REMAT_MAX_POLICY_DEPTH);
    return false;
  }
  size_t text = strlen("save_from_both_policies:+") + text_length(a) +
                text_length(b);
  if (text > REMAT_MAX_POLICY_LENGTH) {
    remat__fail(REMAT_ERR_POLICY,
                "save_from_both_policies: the result's string form would be "
                "%zu bytes, more than the limit of %d "
                "(REMAT_MAX_POLICY_LENGTH)",
                text, REMAT_MAX_POLICY_LENGTH);
    return false;
  }
  return true;
}

remat_policy *remat_policy_save_from_both_policies(const remat_policy *a,
                                                   const remat_policy *b) {
  if (!both_fit(a, b))
    return NULL;
  remat_policy *p = new_policy(POLICY_BOTH);
  if (p == NULL)
    return NULL;
  p->a = policy_clone(a);
  p->b = policy_clone(b);
  if (p->a == NULL || p->b == NULL) {
    remat_policy_destroy(p);
    return NULL;
  }
  return p;
}

/* ---- string forms ---- */

/* A policy string and the parser's place in it. The place only moves
 * forward and each byte is read a bounded number of times, so parsing
 * takes time linear in the length; recursion is bounded by
 * REMAT_MAX_POLICY_DEPTH. */
typedef struct policy_reader {
  const char *text;
  size_t pos;
} policy_reader;

static remat_status parse_policy(policy_reader *r, int depth,
                                 remat_policy **out);

/* A separator or the end, for a message: words and names end only at
 * these. */
static const char *describe(char c) {
  switch (c) {
  case '\0': return "the end of the string";
  case '+': return "'+'";
  case ',': return "','";
  default: return "':'";
  }
}

static const policy_word *find_word(const char *s, size_t len) {
  for (size_t i = 0; i < sizeof policy_words / sizeof *policy_words; i++)
    if (strlen(policy_words[i].word) == len &&
        memcmp(policy_words[i].word, s, len) == 0)
      return &policy_words[i];
  return NULL;
}

/* The word text[at..at+len) is no policy; a control byte in it (say a
 * newline read with the string) is named. */
static remat_status unknown_policy(const char *text, size_t at, size_t len) {
  if (len == 0)
    return remat__fail(REMAT_ERR_POLICY,
                       "no policy at offset %zu (found %s): expected one "
                       "of " ACCEPTED_POLICIES,
                       at, describe(text[at]));
  const char *word = text + at;
  size_t bad = 0;
  while (bad < len && (unsigned char)word[bad] >= 0x20 && word[bad] != 0x7F)
    bad++;
  char control[48] = "";
  if (bad < len)
    snprintf(control, sizeof control, " (control byte \\x%02X at offset %zu)",
             (unsigned char)word[bad], at + bad);
  return remat__fail(REMAT_ERR_POLICY,
                     "unknown remat policy '%s'%s%s: expected one of "
                     ACCEPTED_POLICIES,
                     remat__quote_n(&(remat__quoted){0}, word, len),
                     at_offset(&(offset_note){0}, at), control);
}

static remat_status offload_policy(const policy_word *w, size_t at) {
  return remat__fail(REMAT_ERR_POLICY,
                     "%s%s offloads to host memory, which remat does not "
                     "support: the nearest remat policy is %s%s",
                     w->word, at_offset(&(offset_note){0}, at),
                     kind_names[w->kind],
                     w->kind == POLICY_ONLY_NAMES ? ":NAME[,NAME...]" : "");
}

static remat_status parse_simple(policy_reader *r, const policy_word *w,
                                 size_t start, remat_policy **out) {
  if (r->text[r->pos] == ':')
    return remat__fail(REMAT_ERR_POLICY,
                       "%s%s takes no argument: found ':' at offset %zu; "
                       "write %s alone",
                       w->word, at_offset(&(offset_note){0}, start), r->pos,
                       w->word);
  *out = new_policy(w->kind);
  return *out ? REMAT_OK : REMAT_ERR_OUT_OF_MEMORY;
}

/* The name at `at` is empty: the list's first name starts at `first`. */
static remat_status empty_name(const char *what, const char *text,
                               size_t first, size_t at) {
  const char *why = "nothing after ':'";
  if (at == first && text[at] == ',')
    why = "',' right after ':'";
  else if (at > first)
    why = text[at] == ',' ? "two ',' in a row" : "',' at the end of the list";
  return remat__fail(REMAT_ERR_POLICY,
                     "%s: empty name at offset %zu (%s): expected "
                     "%s:NAME[,NAME...], e.g. %s:attn_out,ffn_in",
                     what, at, why, what, what);
}

/* Checks the names between `first` and `end` (a '+' or the end of the
 * string) and counts them. */
static remat_status check_names(const char *what, const char *text,
                                size_t first, size_t end, int *count) {
  int n = 0;
  for (size_t at = first;; n++) {
    size_t len = strcspn(text + at, ",+");
    char flaw[64];
    if (len == 0)
      return empty_name(what, text, first, at);
    if (name_flaw(text + at, len, at, flaw, sizeof flaw))
      return remat__fail(REMAT_ERR_POLICY,
                         "%s: name %d ('%s') at offset %zu is not valid: %s; "
                         NAME_RULE,
                         what, n, remat__quote_n(&(remat__quoted){0}, text + at, len), at,
                         flaw, REMAT__NAME_MAX - 1);
    at += len;
    if (at == end)
      break;
    at++; /* the ',' */
  }
  *count = n + 1;
  return REMAT_OK;
}

/* Copies `count` names, already checked, from `first` on into p. */
static remat_status copy_names(remat_policy *p, const char *text, size_t first,
                               int count) {
  p->names = remat__calloc((size_t)count, sizeof *p->names);
  for (size_t at = first; p->names != NULL && p->nnames < count;) {
    size_t len = strcspn(text + at, ",+");
    char *name = remat__malloc(len + 1);
    if (name == NULL)
      break;
    memcpy(name, text + at, len);
    name[len] = '\0';
    p->names[p->nnames++] = name;
    at += len + 1;
  }
  if (p->nnames != count)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                       "out of memory creating a policy");
  return REMAT_OK;
}

/* save_only_these_names and its kin: ':' and NAME[,NAME...] up to a '+' or
 * the end. */
static remat_status parse_names(policy_reader *r, const policy_word *w,
                                size_t start, remat_policy **out) {
  const char *text = r->text, *what = w->word;
  if (text[r->pos] != ':')
    return remat__fail(REMAT_ERR_POLICY,
                       "%s%s needs names: found %s at offset %zu; expected "
                       "%s:NAME[,NAME...], e.g. %s:attn_out,ffn_in",
                       what, at_offset(&(offset_note){0}, start),
                       describe(text[r->pos]), r->pos, what, what);
  size_t first = ++r->pos, end = first + strcspn(text + first, "+");
  int count = 0;
  remat_status s = check_names(what, text, first, end, &count);
  if (s != REMAT_OK)
    return s;
  remat_policy *p = new_policy(w->kind);
  if (p == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  if ((s = copy_names(p, text, first, count)) != REMAT_OK) {
    remat_policy_destroy(p);
    return s;
  }
  r->pos = end;
  *out = p;
  return REMAT_OK;
}

/* The two operands of save_from_both_policies, after its ':'. */
static remat_status parse_operands(policy_reader *r, int depth, size_t start,
                                   remat_policy **a, remat_policy **b) {
  size_t a_at = r->pos, b_at = 0;
  remat_status s = parse_policy(r, depth, a);
  if (s == REMAT_OK && r->text[r->pos] != '+')
    s = remat__fail(REMAT_ERR_POLICY,
                    "save_from_both_policies%s: expected '+' and a second "
                    "policy at offset %zu, found %s; " BOTH_EXAMPLE,
                    at_offset(&(offset_note){0}, start), r->pos,
                    describe(r->text[r->pos]));
  if (s == REMAT_OK) {
    b_at = ++r->pos;
    s = parse_policy(r, depth, b);
  }
  if (s == REMAT_OK && ((*a)->kind == POLICY_AUTO || (*b)->kind == POLICY_AUTO))
    s = remat__fail(REMAT_ERR_POLICY,
                    "save_from_both_policies%s cannot combine 'auto' (at "
                    "offset %zu): auto chooses a region's whole policy",
                    at_offset(&(offset_note){0}, start),
                    (*a)->kind == POLICY_AUTO ? a_at : b_at);
  return s;
}

/* save_from_both_policies at nesting level depth + 1: ':' P '+' Q. */
static remat_status parse_both(policy_reader *r, int depth, size_t start,
                               remat_policy **out) {
  if (depth == REMAT_MAX_POLICY_DEPTH)
    return remat__fail(REMAT_ERR_POLICY,
                       "save_from_both_policies at offset %zu nests %d deep, "
                       "more than the limit of %d (REMAT_MAX_POLICY_DEPTH)",
                       start, depth + 1, REMAT_MAX_POLICY_DEPTH);
  if (r->text[r->pos] != ':')
    return remat__fail(REMAT_ERR_POLICY,
                       "save_from_both_policies%s needs two policies: found "
                       "%s at offset %zu; expected save_from_both_policies:"
                       "P+Q, " BOTH_EXAMPLE,
                       at_offset(&(offset_note){0}, start),
                       describe(r->text[r->pos]), r->pos);
  r->pos++;
  remat_policy *a = NULL, *b = NULL;
  remat_status s = parse_operands(r, depth + 1, start, &a, &b);
  if (s == REMAT_OK && (*out = new_policy(POLICY_BOTH)) == NULL)
    s = REMAT_ERR_OUT_OF_MEMORY;
  if (s != REMAT_OK) {
    remat_policy_destroy(a);
    remat_policy_destroy(b);
    return s;
  }
  (*out)->a = a;
  (*out)->b = b;
  return REMAT_OK;
}

/* One policy from the reader's place on; depth is how many
 * save_from_both_policies hold it. */
static remat_status parse_policy(policy_reader *r, int depth,
                                 remat_policy **out) {
  size_t start = r->pos, len = strcspn(r->text + start, ":+,");
  const policy_word *w = find_word(r->text + start, len);
  if (w == NULL)
    return unknown_policy(r->text, start, len);
  r->pos += len;
  switch (w->form) {
  case WORD_SIMPLE: return parse_simple(r, w, start, out);
  case WORD_NAMES: return parse_names(r, w, start, out);
  case WORD_BOTH: return parse_both(r, depth, start, out);
  case WORD_OFFLOAD: break;
  }
  return offload_policy(w, start);
}

remat_status remat_policy_parse(const char *text, remat_policy **out) {
  if (text == NULL || out == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_policy_parse: text and out must not be NULL");
  *out = NULL;
  size_t len = strlen(text);
  if (len == 0)
    return remat__fail(REMAT_ERR_POLICY, "the policy string is empty: "
                                         "expected one of " ACCEPTED_POLICIES);
  if (len > REMAT_MAX_POLICY_LENGTH)
    return remat__fail(REMAT_ERR_POLICY,
                       "the policy string is %zu bytes, more than the limit "
                       "of %d (REMAT_MAX_POLICY_LENGTH)",
                       len, REMAT_MAX_POLICY_LENGTH);
  policy_reader r = {.text = text, .pos = 0};
  remat_policy *p = NULL;
  remat_status s = parse_policy(&r, 0, &p);
  if (s == REMAT_OK && text[r.pos] != '\0')
    s = remat__fail(REMAT_ERR_POLICY,
                    "unexpected %s at offset %zu after a whole policy: a "
                    "string holds one policy; to save what two policies "
                    "save, write save_from_both_policies:P+Q",
                    describe(text[r.pos]), r.pos);
  if (s != REMAT_OK) {
    remat_policy_destroy(p);
    return s;
  }
  *out = p;
  return REMAT_OK;
}

static char *put(char *at, const char *s) {
  size_t n = strlen(s);
  memcpy(at, s, n);
  return at + n;
}

/* Writes p's string form, text_length(p) bytes without a NUL, at `at`;
 * returns the end. */
static char *write_text(const remat_policy *p, char *at) {
  at = put(at, kind_names[p->kind]);
  for (int i = 0; i < p->nnames; i++) {
    *at++ = i ? ',' : ':';
    at = put(at, p->names[i]);
  }
  if (p->kind == POLICY_BOTH) {
    *at++ = ':';
    at = write_text(p->a, at);
    *at++ = '+';
    at = write_text(p->b, at);
  }
  return at;
}

remat_status remat_policy_format(const remat_policy *p, char *buf, size_t len) {
  if (p == NULL || buf == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_policy_format: policy and buf must not be NULL");
  size_t needed = text_length(p) + 1;
  if (len < needed) {
    if (len > 0)
      buf[0] = '\0';
    return remat__fail(REMAT_ERR_LIMIT,
                       "remat_policy_format: the string form needs %zu bytes "
                       "with its NUL, the buffer has %zu",
                       needed, len);
  }
  *write_text(p, buf) = '\0';
  return REMAT_OK;
}

/* ---- regions and names ---- */

remat_status remat_region_begin(remat_graph *g, const remat_policy *policy) {
  if (g == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG, "remat_region_begin: graph is NULL");
  if (g->status != REMAT_OK)
    return g->status;
  if (g->compiled)
    return graph_fail(g, REMAT_ERR_STATE,
                      "remat_region_begin: the graph is already compiled");
  if (g->region_depth == REMAT__MAX_REGION_DEPTH)
    return graph_fail(g, REMAT_ERR_LIMIT,
                      "remat_region_begin: regions nest at most %d deep",
                      REMAT__MAX_REGION_DEPTH);
  if (g->nregions == g->cap_regions) {
    int32_t cap = g->cap_regions ? 2 * g->cap_regions : 16;
    graph_region *r = remat__realloc(g->regions, (size_t)cap * sizeof *r);
    if (r == NULL)
      return graph_fail(g, REMAT_ERR_OUT_OF_MEMORY,
                        "remat_region_begin: out of memory");
    g->regions = r;
    g->cap_regions = cap;
  }
  graph_region *r = &g->regions[g->nregions];
  r->parent = g->region_depth ? g->region_stack[g->region_depth - 1] : -1;
  r->top = r->parent < 0 ? g->nregions : g->regions[r->parent].top;
  r->policy = NULL;
  r->name[0] = '\0';
  if (policy != NULL && (r->policy = policy_clone(policy)) == NULL)
    return graph_fail(g, REMAT_ERR_OUT_OF_MEMORY,
                      "remat_region_begin: out of memory");
  g->region_stack[g->region_depth++] = g->nregions++;
  return REMAT_OK;
}

remat_status remat_region_end(remat_graph *g) {
  if (g == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG, "remat_region_end: graph is NULL");
  if (g->status != REMAT_OK)
    return g->status;
  if (g->region_depth == 0)
    return graph_fail(g, REMAT_ERR_STATE,
                      "remat_region_end: no checkpoint region is open: each "
                      "remat_region_end must follow a remat_region_begin");
  g->region_depth--;
  return REMAT_OK;
}

remat_status remat_checkpoint_name(remat_graph *g, remat_tensor *t,
                                   const char *name) {
  if (g == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_checkpoint_name: graph is NULL");
  if (g->status != REMAT_OK)
    return g->status;
  if (g->compiled) /* not sticky: the compiled graph stays usable */
    return remat__fail(REMAT_ERR_STATE,
                       "remat_checkpoint_name: the graph is already compiled");
  if (!graph_tensor_ok(g, t, "remat_checkpoint_name"))
    return g->status;
  if (t->kind == TENSOR_PARAM)
    return graph_fail(g, REMAT_ERR_INVALID_ARG,
                      "remat_checkpoint_name: '%s' is a parameter: parameters "
                      "keep the name given to remat_param (checkpoints store "
                      "them by it); name op results",
                      t->name);
  if (name == NULL)
    return graph_fail(g, REMAT_ERR_INVALID_ARG,
                      "remat_checkpoint_name: name is NULL; " NAME_RULE,
                      REMAT__NAME_MAX - 1);
  size_t len = strlen(name);
  char flaw[64];
  if (name_flaw(name, len, 0, flaw, sizeof flaw))
    return graph_fail(g, REMAT_ERR_INVALID_ARG,
                      "remat_checkpoint_name: name '%s' is not valid: %s; "
                      NAME_RULE,
                      remat__quote_n(&(remat__quoted){0}, name, len), flaw,
                      REMAT__NAME_MAX - 1);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->named = true;
  return REMAT_OK;
}

remat_status remat_region_name(remat_graph *g, const char *name) {
  if (g == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG, "remat_region_name: graph is NULL");
  if (g->status != REMAT_OK)
    return g->status;
  if (g->region_depth == 0)
    return graph_fail(g, REMAT_ERR_STATE,
                      "remat_region_name: no checkpoint region is open");
  size_t len = name != NULL ? strlen(name) : 0;
  char flaw[64];
  if (name == NULL || name_flaw(name, len, 0, flaw, sizeof flaw))
    return graph_fail(g, REMAT_ERR_INVALID_ARG,
                      "remat_region_name: name '%s' is not valid: %s; "
                      NAME_RULE,
                      name ? remat__quote_n(&(remat__quoted){0}, name, len) : "(null)",
                      name ? flaw : "it is NULL", REMAT__NAME_MAX - 1);
  graph_region *r = &g->regions[g->region_stack[g->region_depth - 1]];
  snprintf(r->name, sizeof r->name, "%s", name);
  return REMAT_OK;
}

void policy_free_all(remat_graph *g) {
  for (int32_t r = 0; r < g->nregions; r++)
    remat_policy_destroy(g->regions[r].policy);
  free(g->regions);
  g->regions = NULL;
  g->nregions = 0;
}

/* ---- the decision ---- */

static bool has_name(const remat_policy *p, const char *name) {
  for (int i = 0; i < p->nnames; i++)
    if (strcmp(p->names[i], name) == 0)
      return true;
  return false;
}

bool policy_saves(const remat_policy *p, const op_desc *producer,
                  const remat_tensor *t) {
  unsigned tags = op_tags(producer);
  switch (p->kind) {
  case POLICY_EVERYTHING: return true;
  case POLICY_NOTHING: return false;
  case POLICY_DOTS: return (tags & OP_TAG_DOT) != 0;
  case POLICY_DOTS_NO_BATCH:
    return (tags & OP_TAG_DOT) && !(tags & OP_TAG_BATCHED);
  case POLICY_ONLY_NAMES: return t->named && has_name(p, t->name);
  case POLICY_ALL_BUT_NAMES: return t->named && !has_name(p, t->name);
  case POLICY_BOTH:
    return policy_saves(p->a, producer, t) || policy_saves(p->b, producer, t);
  case POLICY_AUTO: return true;
  }
  return true;
}

static bool has_fused_attention(const remat_graph *g) {
  for (int32_t o = 0; o < g->nops; o++)
    if (g->ops[o].desc.type == OP_ATTENTION)
      return true;
  return false;
}

/* Every name a name-based policy lists must be carried by some tensor. */
remat_status policy_check_names(remat_graph *g, const remat_policy *p) {
  if (p == NULL)
    return REMAT_OK;
  if (p->kind == POLICY_BOTH) {
    remat_status s = policy_check_names(g, p->a);
    return s ? s : policy_check_names(g, p->b);
  }
  for (int i = 0; i < p->nnames; i++) {
    bool found = false;
    for (int32_t t = 0; t < g->ntensors && !found; t++)
      found = g->tensors[t]->named && strcmp(g->tensors[t]->name, p->names[i]) == 0;
    if (found)
      continue;
    if (has_fused_attention(g) && (strcmp(p->names[i], "attn_scores") == 0 ||
                                   strcmp(p->names[i], "attn_probs") == 0))
      return graph_fail(g, REMAT_ERR_POLICY,
                        "policy %s names '%s', which fused attention does "
                        "not have (it keeps no T x T matrix): use the "
                        "materialized attention (remat_causal_self_attention, "
                        "REMAT_ATTENTION_MATERIALIZED in a builder's config) "
                        "or name other tensors",
                        kind_names[p->kind], p->names[i]);
    char list[REMAT__ERRMSG_MAX / 2] = "";
    size_t n = 0;
    for (int32_t t = 0; t < g->ntensors && n + REMAT__NAME_MAX < sizeof list; t++) {
      remat_tensor *x = g->tensors[t];
      if (!x->named || strstr(list, x->name) != NULL)
        continue;
      n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", n ? ", " : "",
                            x->name);
    }
    return graph_fail(g, REMAT_ERR_POLICY,
                      "policy %s names '%s', which no tensor carries: names "
                      "in this graph are %s",
                      kind_names[p->kind], p->names[i], n ? list : "(none)");
  }
  return REMAT_OK;
}

/* Region r climbed until it holds region c: the innermost region that
 * holds both; -1 when none does. */
static int32_t climb_to(const remat_graph *g, int32_t r, int32_t c) {
  while (r >= 0) {
    int32_t up = c;
    while (up >= 0 && up != r)
      up = g->regions[up].parent;
    if (up == r)
      return r;
    r = g->regions[r].parent;
  }
  return r;
}

static bool decided_by_policy(const remat_tensor *x) {
  return x->kind == TENSOR_ACT && !x->keep && x->producer >= 0;
}

/* One pass over the ops, so that deciding costs O(ops x region depth), not
 * O(tensors x ops): deciding[t] becomes the innermost region of t's
 * producer that holds every consumer too (-1 when none does, or when no
 * policy decides t), and consumed[t] whether any op reads t. */
static void find_deciding_regions(const remat_graph *g, int32_t *deciding,
                                  bool *consumed) {
  for (int32_t t = 0; t < g->ntensors; t++) {
    const remat_tensor *x = g->tensors[t];
    deciding[t] = decided_by_policy(x) ? x->region : -1;
    consumed[t] = false;
  }
  for (int32_t o = 0; o < g->nops; o++) {
    const graph_op *op = &g->ops[o];
    for (int i = 0; i < op->desc.nin; i++) {
      consumed[op->in[i]] = true;
      deciding[op->in[i]] = climb_to(g, deciding[op->in[i]], op->region);
    }
  }
}

remat_status policy_resolve_default(remat_graph *g, const char *text,
                                    remat_policy **out) {
  remat_status s = remat_policy_parse(text, out);
  if (s != REMAT_OK)
    return graph_fail(g, s, "REMAT_POLICY: %s", remat_last_error());
  return REMAT_OK;
}

remat_status policy_decide_with(const remat_graph *g, bool *saved,
                                int32_t *deciding,
                                const remat_policy *const *region_policy) {
  find_deciding_regions(g, deciding, saved); /* saved: consumed, for now */
  for (int32_t t = 0; t < g->ntensors; t++) {
    const remat_tensor *x = g->tensors[t];
    int32_t r = deciding[t];
    if (r < 0 || !saved[t]) { /* outside regions, or read by no op */
      saved[t] = true;
      continue;
    }
    saved[t] = policy_saves(region_policy[r], &g->ops[x->producer].desc, x);
  }
  return REMAT_OK;
}
