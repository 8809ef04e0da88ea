/* Tests of policy strings and constructors at their edges: the nesting and
 * length limits (the limit passes, one more fails, a 1 MB string fails
 * fast), the exact message of every parse error, names with control bytes,
 * JAX's aliases and offload policies, remat_policy_format at every buffer
 * size, the round trip of every policy kind, and parsing and combining
 * when the N-th allocation fails, for every N. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/alloc.h"
#include "remat.h"

#define ACCEPTED                                                               \
  "expected one of everything_saveable, nothing_saveable, dots_saveable, "     \
  "checkpoint_dots, dots_with_no_batch_dims_saveable, "                        \
  "checkpoint_dots_with_no_batch_dims, "                                       \
  "save_only_these_names:NAME[,NAME...], "                                     \
  "save_any_names_but_these:NAME[,NAME...], "                                  \
  "save_anything_except_these_names:NAME[,NAME...], "                          \
  "save_from_both_policies:P+Q, auto"

#define NAME_RULE                                                              \
  "a name is 1 to 63 bytes, none of them a space, ',', '+', ':' or a "         \
  "control byte (0x01-0x1F, 0x7F)"

#define BOTH "save_from_both_policies:"

static void expect_parse_error(const char *text, const char *message) {
  remat_policy *p = (remat_policy *)&p;
  assert_int_equal(remat_policy_parse(text, &p), REMAT_ERR_POLICY);
  assert_null(p);
  assert_string_equal(remat_last_error(), message);
}

static void expect_no_policy(remat_policy *p, const char *message) {
  assert_null(p);
  assert_string_equal(remat_last_error(), message);
}

/* Parses text, formats it as `canonical`, and parses that back to the same
 * string form. */
static void expect_round_trip(const char *text, const char *canonical) {
  remat_policy *p = NULL, *q = NULL;
  assert_int_equal(remat_policy_parse(text, &p), REMAT_OK);
  size_t cap = strlen(text) + 1;
  char *buf = malloc(cap), *again = malloc(cap);
  assert_non_null(buf);
  assert_non_null(again);
  assert_int_equal(remat_policy_format(p, buf, cap), REMAT_OK);
  assert_string_equal(buf, canonical);
  assert_int_equal(remat_policy_parse(buf, &q), REMAT_OK);
  assert_int_equal(remat_policy_format(q, again, cap), REMAT_OK);
  assert_string_equal(again, canonical);
  remat_policy_destroy(q);
  remat_policy_destroy(p);
  free(again);
  free(buf);
}

static void expect_format(const remat_policy *p, const char *expected) {
  char buf[256];
  assert_non_null(p);
  assert_int_equal(remat_policy_format(p, buf, sizeof buf), REMAT_OK);
  assert_string_equal(buf, expected);
}

/* `levels` save_from_both_policies, each holding the next as its second
 * policy (right) or as its first (left). */
static char *nested(int levels, bool left) {
  char *s = malloc((size_t)levels * 64 + 64);
  assert_non_null(s);
  size_t n = 0;
  for (int i = 0; i < levels; i++)
    n += (size_t)sprintf(s + n, "%s", left ? BOTH : BOTH "dots_saveable+");
  n += (size_t)sprintf(s + n, "%s",
                       left ? "dots_saveable" : "nothing_saveable");
  for (int i = 0; left && i < levels; i++)
    n += (size_t)sprintf(s + n, "%s", "+nothing_saveable");
  return s;
}

/* ---- limits ---- */

static void test_depth_limit(void **state) {
  (void)state;
  for (int left = 0; left < 2; left++) {
    char *at_limit = nested(REMAT_MAX_POLICY_DEPTH, left);
    expect_round_trip(at_limit, at_limit);
    free(at_limit);
  }
  char *right = nested(REMAT_MAX_POLICY_DEPTH + 1, false);
  expect_parse_error(right, "save_from_both_policies at offset 1216 nests 33 "
                            "deep, more than the limit of 32 "
                            "(REMAT_MAX_POLICY_DEPTH)");
  free(right);
  char *left = nested(REMAT_MAX_POLICY_DEPTH + 1, true);
  expect_parse_error(left, "save_from_both_policies at offset 768 nests 33 "
                           "deep, more than the limit of 32 "
                           "(REMAT_MAX_POLICY_DEPTH)");
  free(left);

  /* The constructor keeps the same limit. */
  remat_policy *deep = remat_policy_nothing_saveable();
  remat_policy *dots = remat_policy_dots_saveable();
  for (int i = 0; i < REMAT_MAX_POLICY_DEPTH; i++) {
    remat_policy *next = remat_policy_save_from_both_policies(dots, deep);
    assert_non_null(next);
    remat_policy_destroy(deep);
    deep = next;
  }
  expect_no_policy(remat_policy_save_from_both_policies(deep, dots),
                   "save_from_both_policies: the result would nest 33 deep, "
                   "more than the limit of 32 (REMAT_MAX_POLICY_DEPTH)");
  remat_policy_destroy(deep);
  remat_policy_destroy(dots);
}

/* save_only_these_names with 63-byte names and a last name of `last`
 * bytes: 22 + 1023 * 64 + last bytes. */
static char *long_names(size_t last) {
  size_t len = 22 + 1023 * 64 + last;
  char *s = malloc(len + 1);
  assert_non_null(s);
  memcpy(s, "save_only_these_names:", 22);
  memset(s + 22, 'n', len - 22);
  for (size_t i = 22 + 63; i < len; i += 64)
    s[i] = ',';
  s[len] = '\0';
  return s;
}

static void test_length_limit(void **state) {
  (void)state;
  char *at_limit = long_names(42);
  assert_int_equal(strlen(at_limit), REMAT_MAX_POLICY_LENGTH);
  expect_round_trip(at_limit, at_limit);
  char *over = long_names(43);
  expect_parse_error(over, "the policy string is 65537 bytes, more than the "
                           "limit of 65536 (REMAT_MAX_POLICY_LENGTH)");
  free(over);

  /* The constructors keep the same limit. */
  static const char *names[1041];
  char name63[64];
  memset(name63, 'n', 63);
  name63[63] = '\0';
  for (int i = 0; i < 1041; i++)
    names[i] = name63;
  names[1023] = at_limit + strlen(at_limit) - 42; /* the 42-byte last name */
  remat_policy *p = remat_policy_save_only_these_names(names, 1024);
  char *buf = malloc(REMAT_MAX_POLICY_LENGTH + 1);
  assert_non_null(buf);
  assert_int_equal(remat_policy_format(p, buf, REMAT_MAX_POLICY_LENGTH + 1),
                   REMAT_OK);
  assert_string_equal(buf, at_limit);
  names[1023] = name63;
  expect_no_policy(remat_policy_save_only_these_names(names, 1041),
                   "save_only_these_names: 1041 names make a string form of "
                   "66645 bytes, more than the limit of 65536 "
                   "(REMAT_MAX_POLICY_LENGTH)");
  remat_policy *dots = remat_policy_dots_saveable();
  expect_no_policy(remat_policy_save_from_both_policies(dots, p),
                   "save_from_both_policies: the result's string form would "
                   "be 65574 bytes, more than the limit of 65536 "
                   "(REMAT_MAX_POLICY_LENGTH)");
  remat_policy_destroy(dots);
  remat_policy_destroy(p);
  free(buf);
  free(at_limit);
}

/* 1 MB of nesting used to overflow the parser's stack; it fails on its
 * length, and 64 KiB of it on its depth. */
static void test_huge_nesting_fails(void **state) {
  (void)state;
  char *huge = nested((1 << 20) / 38, false);
  expect_parse_error(huge, "the policy string is 1048588 bytes, more than "
                           "the limit of 65536 (REMAT_MAX_POLICY_LENGTH)");
  huge[REMAT_MAX_POLICY_LENGTH] = '\0';
  expect_parse_error(huge, "save_from_both_policies at offset 1216 nests 33 "
                           "deep, more than the limit of 32 "
                           "(REMAT_MAX_POLICY_DEPTH)");
  free(huge);
}

/* ---- messages ---- */

static void test_name_list_errors(void **state) {
  (void)state;
  expect_parse_error("save_only_these_names:",
                     "save_only_these_names: empty name at offset 22 "
                     "(nothing after ':'): expected "
                     "save_only_these_names:NAME[,NAME...], e.g. "
                     "save_only_these_names:attn_out,ffn_in");
  expect_parse_error("save_only_these_names:,a",
                     "save_only_these_names: empty name at offset 22 (',' "
                     "right after ':'): expected "
                     "save_only_these_names:NAME[,NAME...], e.g. "
                     "save_only_these_names:attn_out,ffn_in");
  expect_parse_error("save_anything_except_these_names:a,,b",
                     "save_anything_except_these_names: empty name at offset "
                     "35 (two ',' in a row): expected "
                     "save_anything_except_these_names:NAME[,NAME...], e.g. "
                     "save_anything_except_these_names:attn_out,ffn_in");
  expect_parse_error("save_any_names_but_these:a,",
                     "save_any_names_but_these: empty name at offset 27 (',' "
                     "at the end of the list): expected "
                     "save_any_names_but_these:NAME[,NAME...], e.g. "
                     "save_any_names_but_these:attn_out,ffn_in");
  expect_parse_error(BOTH "save_only_these_names:a,+dots_saveable",
                     "save_only_these_names: empty name at offset 48 (',' at "
                     "the end of the list): expected "
                     "save_only_these_names:NAME[,NAME...], e.g. "
                     "save_only_these_names:attn_out,ffn_in");
  expect_parse_error("save_only_these_names+dots_saveable",
                     "save_only_these_names needs names: found '+' at offset "
                     "21; expected save_only_these_names:NAME[,NAME...], e.g. "
                     "save_only_these_names:attn_out,ffn_in");
  expect_parse_error("save_only_these_names:a b",
                     "save_only_these_names: name 0 ('a b') at offset 22 is "
                     "not valid: a space at offset 23; " NAME_RULE);
  expect_parse_error("save_only_these_names:a,b:c",
                     "save_only_these_names: name 1 ('b:c') at offset 24 is "
                     "not valid: ':' at offset 25; " NAME_RULE);
  /* 110 bytes: the message shows the first 100 (base/error.h's quoter) */
  expect_parse_error("save_only_these_names:"
                     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
                     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn",
                     "save_only_these_names: name 0 ('"
                     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
                     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn...') "
                     "at offset 22 is not valid: it is 110 bytes long; "
                     NAME_RULE);
}

static void test_policy_word_errors(void **state) {
  (void)state;
  expect_parse_error("", "the policy string is empty: " ACCEPTED);
  expect_parse_error("dots", "unknown remat policy 'dots': " ACCEPTED);
  expect_parse_error("dots_saveable\n",
                     "unknown remat policy 'dots_saveable\\x0A' (control "
                     "byte \\x0A at offset 13): " ACCEPTED);
  expect_parse_error(BOTH "dots_saveable+dots",
                     "unknown remat policy 'dots' at offset 38: " ACCEPTED);
  expect_parse_error(BOTH "+dots_saveable",
                     "no policy at offset 24 (found '+'): " ACCEPTED);
  expect_parse_error(BOTH "dots_saveable+",
                     "no policy at offset 38 (found the end of the string): "
                     ACCEPTED);
  expect_parse_error("dots_saveable:attn",
                     "dots_saveable takes no argument: found ':' at offset "
                     "13; write dots_saveable alone");
  expect_parse_error(BOTH "auto:x+dots_saveable",
                     "auto at offset 24 takes no argument: found ':' at "
                     "offset 28; write auto alone");
  expect_parse_error("dots_saveable+nothing_saveable",
                     "unexpected '+' at offset 13 after a whole policy: a "
                     "string holds one policy; to save what two policies "
                     "save, write save_from_both_policies:P+Q");
  expect_parse_error(BOTH "dots_saveable+nothing_saveable+",
                     "unexpected '+' at offset 54 after a whole policy: a "
                     "string holds one policy; to save what two policies "
                     "save, write save_from_both_policies:P+Q");
  expect_parse_error("dots_saveable,nothing_saveable",
                     "unexpected ',' at offset 13 after a whole policy: a "
                     "string holds one policy; to save what two policies "
                     "save, write save_from_both_policies:P+Q");
}

static void test_both_errors(void **state) {
  (void)state;
  expect_parse_error("save_from_both_policies",
                     "save_from_both_policies needs two policies: found the "
                     "end of the string at offset 23; expected "
                     "save_from_both_policies:P+Q, e.g. "
                     "save_from_both_policies:dots_saveable+"
                     "save_only_these_names:attn_probs");
  expect_parse_error(BOTH "dots_saveable",
                     "save_from_both_policies: expected '+' and a second "
                     "policy at offset 37, found the end of the string; e.g. "
                     "save_from_both_policies:dots_saveable+"
                     "save_only_these_names:attn_probs");
  expect_parse_error(BOTH BOTH "dots_saveable,x+y",
                     "save_from_both_policies at offset 24: expected '+' and "
                     "a second policy at offset 61, found ','; e.g. "
                     "save_from_both_policies:dots_saveable+"
                     "save_only_these_names:attn_probs");
  expect_parse_error(BOTH "auto+dots_saveable",
                     "save_from_both_policies cannot combine 'auto' (at "
                     "offset 24): auto chooses a region's whole policy");
  expect_parse_error(BOTH "dots_saveable+auto",
                     "save_from_both_policies cannot combine 'auto' (at "
                     "offset 38): auto chooses a region's whole policy");
}

/* Every control byte in a name, in a string and in each constructor. */
static void test_control_bytes_in_names(void **state) {
  (void)state;
  expect_parse_error("save_only_these_names:ok,a\nb",
                     "save_only_these_names: name 1 ('a\\x0Ab') at offset 25 "
                     "is not valid: control byte \\x0A at offset 26; "
                     NAME_RULE);
  expect_parse_error("save_any_names_but_these:\tx",
                     "save_any_names_but_these: name 0 ('\\x09x') at offset "
                     "25 is not valid: control byte \\x09 at offset 25; "
                     NAME_RULE);
  const char *del[] = {"ok", "x\x7f"};
  expect_no_policy(remat_policy_save_anything_except_these_names(del, 2),
                   "save_anything_except_these_names: name 1 ('x\\x7F') is "
                   "not valid: control byte \\x7F at offset 1; " NAME_RULE);
  for (int c = 1; c < 0x80; c++) {
    if (c >= 0x20 && c != 0x7f)
      continue;
    char text[64], name[8], message[512];
    snprintf(text, sizeof text, "save_only_these_names:ab%c", c);
    snprintf(message, sizeof message,
             "save_only_these_names: name 0 ('ab\\x%02X') at offset 22 is "
             "not valid: control byte \\x%02X at offset 24; " NAME_RULE,
             c, c);
    expect_parse_error(text, message);
    snprintf(name, sizeof name, "ab%c", c);
    const char *names[] = {name};
    snprintf(message, sizeof message,
             "save_only_these_names: name 0 ('ab\\x%02X') is not valid: "
             "control byte \\x%02X at offset 2; " NAME_RULE,
             c, c);
    expect_no_policy(remat_policy_save_only_these_names(names, 1), message);
  }
  /* Bytes above 0x7F (UTF-8) are names' own. */
  const char *utf8[] = {"caf\xc3\xa9"};
  remat_policy *p = remat_policy_save_only_these_names(utf8, 1);
  expect_format(p, "save_only_these_names:caf\xc3\xa9");
  remat_policy_destroy(p);
}

static void test_checkpoint_name_control_bytes(void **state) {
  (void)state;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS, .num_threads = 1};
  remat_runtime *rt = NULL;
  remat_graph *g = NULL;
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  int64_t dims[2] = {2, 4};
  const char *bad[] = {"attn\n", "\x1b[0m", "a\x7f", NULL, ""};
  const char *message[] = {
      "remat_checkpoint_name: name 'attn\\x0A' is not valid: control byte "
      "\\x0A at offset 4; " NAME_RULE,
      "remat_checkpoint_name: name '\\x1B[0m' is not valid: control byte "
      "\\x1B at offset 0; " NAME_RULE,
      "remat_checkpoint_name: name 'a\\x7F' is not valid: control byte "
      "\\x7F at offset 1; " NAME_RULE,
      "remat_checkpoint_name: name is NULL; " NAME_RULE,
      "remat_checkpoint_name: name '' is not valid: it is empty; " NAME_RULE};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
    remat_tensor *x = remat_input(g, "x", REMAT_F32, 2, dims);
    assert_int_equal(remat_checkpoint_name(g, x, bad[i]),
                     REMAT_ERR_INVALID_ARG);
    assert_string_equal(remat_last_error(), message[i]);
    remat_graph_destroy(g);
  }
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  remat_tensor *x = remat_input(g, "x", REMAT_F32, 2, dims);
  assert_int_equal(remat_checkpoint_name(g, x, "caf\xc3\xa9"), REMAT_OK);
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

/* ---- JAX's aliases and offload policies ---- */

static void test_aliases(void **state) {
  (void)state;
  expect_round_trip("checkpoint_dots_with_no_batch_dims",
                    "dots_with_no_batch_dims_saveable");
  expect_round_trip("save_anything_except_these_names:attn,ffn",
                    "save_any_names_but_these:attn,ffn");
  expect_round_trip(BOTH "checkpoint_dots+"
                         "save_anything_except_these_names:q",
                    BOTH "dots_saveable+save_any_names_but_these:q");
  remat_policy *p = remat_policy_checkpoint_dots_with_no_batch_dims();
  expect_format(p, "dots_with_no_batch_dims_saveable");
  remat_policy_destroy(p);
  const char *names[] = {"attn", "ffn"};
  p = remat_policy_save_anything_except_these_names(names, 2);
  expect_format(p, "save_any_names_but_these:attn,ffn");
  remat_policy_destroy(p);
  expect_no_policy(remat_policy_save_anything_except_these_names(names, 0),
                   "save_anything_except_these_names needs at least one "
                   "name, e.g. save_anything_except_these_names:attn_out,"
                   "ffn_in");
}

static void test_offload_policies(void **state) {
  (void)state;
  expect_parse_error("save_and_offload_only_these_names:attn",
                     "save_and_offload_only_these_names offloads to host "
                     "memory, which remat does not support: the nearest "
                     "remat policy is save_only_these_names:NAME[,NAME...]");
  expect_parse_error("offload_dot_with_no_batch_dims",
                     "offload_dot_with_no_batch_dims offloads to host memory, "
                     "which remat does not support: the nearest remat policy "
                     "is dots_with_no_batch_dims_saveable");
  expect_parse_error(BOTH "dots_saveable+offload_dot_with_no_batch_dims",
                     "offload_dot_with_no_batch_dims at offset 38 offloads to "
                     "host memory, which remat does not support: the nearest "
                     "remat policy is dots_with_no_batch_dims_saveable");
}

/* ---- format and round trip ---- */

/* Every buffer size from 0 to the string's length + 2: too short fails
 * and leaves an empty string; long enough writes the string and no more. */
static void test_format_every_size(void **state) {
  (void)state;
  const char *text = BOTH "dots_saveable+save_only_these_names:attn,ffn";
  size_t needed = strlen(text) + 1;
  remat_policy *p = NULL;
  assert_int_equal(remat_policy_parse(text, &p), REMAT_OK);
  for (size_t len = 0; len <= needed + 1; len++) {
    char buf[128], message[128];
    memset(buf, 'x', sizeof buf);
    remat_status s = remat_policy_format(p, buf, len);
    if (len < needed) {
      assert_int_equal(s, REMAT_ERR_LIMIT);
      snprintf(message, sizeof message,
               "remat_policy_format: the string form needs 69 bytes with its "
               "NUL, the buffer has %zu",
               len);
      assert_string_equal(remat_last_error(), message);
      assert_int_equal(buf[0], len > 0 ? '\0' : 'x');
      for (size_t i = 1; i < sizeof buf; i++)
        assert_int_equal(buf[i], 'x');
    } else {
      assert_int_equal(s, REMAT_OK);
      assert_string_equal(buf, text);
      for (size_t i = needed; i < sizeof buf; i++)
        assert_int_equal(buf[i], 'x');
    }
  }
  remat_policy_destroy(p);
}

static void test_round_trip_every_kind(void **state) {
  (void)state;
  static const char *const forms[][2] = {
      {"everything_saveable", "everything_saveable"},
      {"nothing_saveable", "nothing_saveable"},
      {"dots_saveable", "dots_saveable"},
      {"checkpoint_dots", "dots_saveable"},
      {"dots_with_no_batch_dims_saveable", "dots_with_no_batch_dims_saveable"},
      {"checkpoint_dots_with_no_batch_dims",
       "dots_with_no_batch_dims_saveable"},
      {"save_only_these_names:a", "save_only_these_names:a"},
      {"save_any_names_but_these:a,b,c", "save_any_names_but_these:a,b,c"},
      {"save_anything_except_these_names:q", "save_any_names_but_these:q"},
      {"auto", "auto"},
      {BOTH "save_only_these_names:a,b+dots_saveable",
       BOTH "save_only_these_names:a,b+dots_saveable"},
      {BOTH BOTH "nothing_saveable+save_only_these_names:x+" BOTH
           "dots_saveable+checkpoint_dots",
       BOTH BOTH "nothing_saveable+save_only_these_names:x+" BOTH
           "dots_saveable+dots_saveable"},
  };
  for (size_t i = 0; i < sizeof forms / sizeof *forms; i++)
    expect_round_trip(forms[i][0], forms[i][1]);

  /* The constructors make the same string forms. */
  const char *names[] = {"a", "b"};
  remat_policy *made[] = {
      remat_policy_everything_saveable(),
      remat_policy_nothing_saveable(),
      remat_policy_dots_saveable(),
      remat_policy_checkpoint_dots(),
      remat_policy_dots_with_no_batch_dims_saveable(),
      remat_policy_save_only_these_names(names, 2),
      remat_policy_save_any_names_but_these(names, 1),
  };
  const char *expected[] = {
      "everything_saveable",   "nothing_saveable",
      "dots_saveable",         "dots_saveable",
      "dots_with_no_batch_dims_saveable", "save_only_these_names:a,b",
      "save_any_names_but_these:a"};
  for (size_t i = 0; i < sizeof made / sizeof *made; i++)
    expect_format(made[i], expected[i]);
  remat_policy *both = remat_policy_save_from_both_policies(made[5], made[2]);
  expect_format(both, BOTH "save_only_these_names:a,b+dots_saveable");
  remat_policy_destroy(both);
  for (size_t i = 0; i < sizeof made / sizeof *made; i++)
    remat_policy_destroy(made[i]);
}

/* ---- out of memory ---- */

/* Parses texts[call], or for the last call combines two policies. */
static remat_status injected_call(int call, const char *const *texts,
                                  const remat_policy *whole,
                                  remat_policy **out) {
  if (texts[call] != NULL)
    return remat_policy_parse(texts[call], out);
  *out = remat_policy_save_from_both_policies(whole, whole);
  return *out ? REMAT_OK : REMAT_ERR_OUT_OF_MEMORY;
}

/* The N-th allocation fails, for every N until the call needs fewer:
 * REMAT_ERR_OUT_OF_MEMORY and its message, nothing built, nothing leaked
 * (ASan). */
static void test_out_of_memory(void **state) {
  (void)state;
  const char *const texts[] = {
      BOTH "save_only_these_names:a,b,c+" BOTH
           "dots_saveable+save_any_names_but_these:q",
      "save_only_these_names:a,b,c", NULL};
  /* One allocation per node, name list and name. */
  const int64_t allocations[] = {11, 5, 23};
  remat_policy *whole = NULL;
  assert_int_equal(remat_policy_parse(texts[0], &whole), REMAT_OK);
  for (int call = 0; call < 3; call++) {
    int64_t n = 1;
    for (;; n++) {
      remat_policy *p = (remat_policy *)&p;
      remat__alloc_fail_after(n);
      remat_status s = injected_call(call, texts, whole, &p);
      int64_t count = remat__alloc_count();
      remat__alloc_fail_after(0);
      if (count < n) {
        assert_int_equal(s, REMAT_OK);
        remat_policy_destroy(p);
        break;
      }
      assert_int_equal(s, REMAT_ERR_OUT_OF_MEMORY);
      assert_null(p);
      assert_string_equal(remat_last_error(),
                          "out of memory creating a policy");
    }
    assert_int_equal(n - 1, allocations[call]);
  }
  remat_policy_destroy(whole);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_depth_limit),
      cmocka_unit_test(test_length_limit),
      cmocka_unit_test(test_huge_nesting_fails),
      cmocka_unit_test(test_name_list_errors),
      cmocka_unit_test(test_policy_word_errors),
      cmocka_unit_test(test_both_errors),
      cmocka_unit_test(test_control_bytes_in_names),
      cmocka_unit_test(test_checkpoint_name_control_bytes),
      cmocka_unit_test(test_aliases),
      cmocka_unit_test(test_offload_policies),
      cmocka_unit_test(test_format_every_size),
      cmocka_unit_test(test_round_trip_every_kind),
      cmocka_unit_test(test_out_of_memory),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
