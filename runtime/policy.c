/* Remat policies with JAX's names and meaning, their string forms,
 * checkpoint regions and names, and the per-activation decision: saved for
 * backward or recomputed there. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/policy.h"

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

#define ACCEPTED_POLICIES                                                      \
  "everything_saveable, nothing_saveable, dots_saveable, checkpoint_dots, "    \
  "dots_with_no_batch_dims_saveable, save_only_these_names:NAME[,NAME...], "   \
  "save_any_names_but_these:NAME[,NAME...], save_from_both_policies:P+Q, auto"

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

static bool name_valid(const char *n) {
  size_t len = strlen(n);
  if (len == 0 || len >= REMAT__NAME_MAX)
    return false;
  for (const char *c = n; *c; c++)
    if (*c == ',' || *c == '+' || *c == ':' || *c == ' ')
      return false;
  return true;
}

static remat_policy *names_policy(policy_kind kind, const char *const *names,
                                  int count) {
  const char *what = kind_names[kind];
  if (count < 1 || names == NULL) {
    remat__fail(REMAT_ERR_POLICY,
                "%s needs at least one name, e.g. %s:attn_out,ffn_in", what,
                what);
    return NULL;
  }
  for (int i = 0; i < count; i++)
    if (names[i] == NULL || !name_valid(names[i])) {
      remat__fail(REMAT_ERR_POLICY,
                  "%s: name %d ('%s') is not valid: expected 1 to %d "
                  "characters without ',', '+', ':' or spaces",
                  what, i, names[i] ? names[i] : "(null)", REMAT__NAME_MAX - 1);
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
  return names_policy(POLICY_ONLY_NAMES, names, count);
}

remat_policy *remat_policy_save_any_names_but_these(const char *const *names,
                                                    int count) {
  return names_policy(POLICY_ALL_BUT_NAMES, names, count);
}

remat_policy *policy_clone(const remat_policy *src) {
  if (src == NULL)
    return NULL;
  remat_policy *p = NULL;
  switch (src->kind) {
  case POLICY_ONLY_NAMES:
  case POLICY_ALL_BUT_NAMES:
    return names_policy(src->kind, (const char *const *)src->names,
                        src->nnames);
  case POLICY_BOTH:
    return remat_policy_save_from_both_policies(src->a, src->b);
  default:
    p = new_policy(src->kind);
  }
  return p;
}

remat_policy *remat_policy_save_from_both_policies(const remat_policy *a,
                                                   const remat_policy *b) {
  if (a == NULL || b == NULL) {
    remat__fail(REMAT_ERR_POLICY,
                "save_from_both_policies needs two policies, got NULL");
    return NULL;
  }
  if (a->kind == POLICY_AUTO || b->kind == POLICY_AUTO) {
    remat__fail(REMAT_ERR_POLICY,
                "save_from_both_policies cannot combine 'auto'");
    return NULL;
  }
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

static remat_status parse_names(policy_kind kind, const char *list,
                                remat_policy **out) {
  char buf[1024];
  if (strlen(list) >= sizeof buf)
    return remat__fail(REMAT_ERR_POLICY, "%s: name list is too long",
                       kind_names[kind]);
  snprintf(buf, sizeof buf, "%s", list);
  const char *names[64];
  int n = 0;
  char *save = NULL;
  if (*buf == '\0' || buf[strlen(buf) - 1] == ',' || *buf == ',' ||
      strstr(buf, ",,") != NULL)
    return remat__fail(REMAT_ERR_POLICY,
                       "'%s:%s' has an empty name: expected %s:NAME[,NAME...], "
                       "e.g. %s:attn_out,ffn_in",
                       kind_names[kind], list, kind_names[kind],
                       kind_names[kind]);
  for (char *tok = strtok_r(buf, ",", &save); tok != NULL;
       tok = strtok_r(NULL, ",", &save)) {
    if (n == 64)
      return remat__fail(REMAT_ERR_POLICY, "%s: more than 64 names",
                         kind_names[kind]);
    names[n++] = tok;
  }
  *out = names_policy(kind, names, n); /* sets the message on failure */
  return *out == NULL ? REMAT_ERR_POLICY : REMAT_OK;
}

remat_status remat_policy_parse(const char *text, remat_policy **out) {
  if (text == NULL || out == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_policy_parse: text and out must not be NULL");
  *out = NULL;
  static const struct {
    const char *name;
    policy_kind kind;
  } simple[] = {
      {"everything_saveable", POLICY_EVERYTHING},
      {"nothing_saveable", POLICY_NOTHING},
      {"dots_saveable", POLICY_DOTS},
      {"checkpoint_dots", POLICY_DOTS},
      {"dots_with_no_batch_dims_saveable", POLICY_DOTS_NO_BATCH},
      {"auto", POLICY_AUTO},
  };
  for (size_t i = 0; i < sizeof simple / sizeof *simple; i++)
    if (strcmp(text, simple[i].name) == 0) {
      *out = new_policy(simple[i].kind);
      return *out ? REMAT_OK : REMAT_ERR_OUT_OF_MEMORY;
    }
  const char *colon = strchr(text, ':');
  size_t head = colon ? (size_t)(colon - text) : strlen(text);
  if (colon && head == strlen("save_only_these_names") &&
      strncmp(text, "save_only_these_names", head) == 0)
    return parse_names(POLICY_ONLY_NAMES, colon + 1, out);
  if (colon && head == strlen("save_any_names_but_these") &&
      strncmp(text, "save_any_names_but_these", head) == 0)
    return parse_names(POLICY_ALL_BUT_NAMES, colon + 1, out);
  if (colon && head == strlen("save_from_both_policies") &&
      strncmp(text, "save_from_both_policies", head) == 0) {
    const char *plus = strchr(colon + 1, '+');
    char left[512];
    if (plus == NULL || (size_t)(plus - colon - 1) >= sizeof left)
      return remat__fail(REMAT_ERR_POLICY,
                         "'%s' is not valid: expected "
                         "save_from_both_policies:P+Q, e.g. "
                         "save_from_both_policies:dots_saveable+"
                         "save_only_these_names:attn_probs",
                         text);
    snprintf(left, sizeof left, "%.*s", (int)(plus - colon - 1), colon + 1);
    remat_policy *a = NULL, *b = NULL;
    remat_status s = remat_policy_parse(left, &a);
    if (s == REMAT_OK)
      s = remat_policy_parse(plus + 1, &b);
    if (s == REMAT_OK) {
      *out = remat_policy_save_from_both_policies(a, b);
      s = *out ? REMAT_OK : REMAT_ERR_POLICY;
    }
    remat_policy_destroy(a);
    remat_policy_destroy(b);
    return s;
  }
  return remat__fail(REMAT_ERR_POLICY,
                     "unknown remat policy '%s': expected one of " ACCEPTED_POLICIES,
                     text);
}

remat_status remat_policy_format(const remat_policy *p, char *buf, size_t len) {
  if (p == NULL || buf == NULL || len == 0)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_policy_format: policy and buf must not be NULL");
  int n = snprintf(buf, len, "%s", kind_names[p->kind]);
  if (p->kind == POLICY_ONLY_NAMES || p->kind == POLICY_ALL_BUT_NAMES)
    for (int i = 0; i < p->nnames && n >= 0 && (size_t)n < len; i++)
      n += snprintf(buf + n, len - (size_t)n, "%c%s", i ? ',' : ':',
                    p->names[i]);
  if (p->kind == POLICY_BOTH && n >= 0 && (size_t)n < len) {
    n += snprintf(buf + n, len - (size_t)n, ":");
    remat_status s = remat_policy_format(p->a, buf + n, len - (size_t)n);
    n = (int)strlen(buf);
    if (s == REMAT_OK && (size_t)n + 1 < len) {
      buf[n++] = '+';
      buf[n] = '\0';
      s = remat_policy_format(p->b, buf + n, len - (size_t)n);
    }
    n = (int)strlen(buf);
  }
  if (n < 0 || (size_t)n >= len)
    return remat__fail(REMAT_ERR_LIMIT,
                       "remat_policy_format: buffer of %zu bytes is too small",
                       len);
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
  if (!graph_tensor_ok(g, t, "remat_checkpoint_name"))
    return g->status;
  if (name == NULL || !name_valid(name))
    return graph_fail(g, REMAT_ERR_INVALID_ARG,
                      "remat_checkpoint_name: name '%s' is not valid: "
                      "expected 1 to %d characters without ',', '+', ':' or "
                      "spaces",
                      name ? name : "(null)", REMAT__NAME_MAX - 1);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->named = true;
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

/* The region where the decision on tensor t is taken: the innermost region
 * of its producer that holds every consumer too; -1 when none does. */
static int32_t deciding_region(const remat_graph *g, const remat_tensor *t) {
  int32_t r = t->region;
  for (int32_t o = 0; o < g->nops && r >= 0; o++) {
    const graph_op *op = &g->ops[o];
    for (int i = 0; i < op->desc.nin && r >= 0; i++) {
      if (op->in[i] != t->id)
        continue;
      /* climb until region r contains the consumer's region */
      for (;;) {
        int32_t c = op->region;
        while (c >= 0 && c != r)
          c = g->regions[c].parent;
        if (c == r || r < 0)
          break;
        r = g->regions[r].parent;
      }
    }
  }
  return r;
}

remat_status policy_resolve_default(remat_graph *g, remat_policy **out) {
  remat_status s = remat_policy_parse(g->rt->config.policy, out);
  if (s != REMAT_OK)
    return graph_fail(g, s, "REMAT_POLICY: %s", remat_last_error());
  return REMAT_OK;
}

remat_status policy_decide_with(const remat_graph *g, bool *saved,
                                int32_t *deciding,
                                const remat_policy *const *region_policy) {
  for (int32_t t = 0; t < g->ntensors; t++) {
    const remat_tensor *x = g->tensors[t];
    saved[t] = true;
    deciding[t] = -1;
    if (x->kind != TENSOR_ACT || x->keep || x->producer < 0)
      continue;
    int32_t r = deciding_region(g, x);
    if (r < 0)
      continue;
    deciding[t] = r;
    bool consumed = false;
    for (int32_t o = x->producer + 1; o < g->nops && !consumed; o++)
      for (int i = 0; i < g->ops[o].desc.nin; i++)
        consumed |= g->ops[o].in[i] == t;
    if (!consumed)
      continue;
    saved[t] = policy_saves(region_policy[r], &g->ops[x->producer].desc, x);
  }
  return REMAT_OK;
}
