#!/usr/bin/env bash
# Checks that remat embeds cleanly in another C program: every global symbol
# that the installed static library and the shared library define starts
# with remat_, the shared library has a versioned SONAME, and a program that
# defines its own mem_alloc, op_exec, graph_fail and chain_plan (names that
# remat uses inside) links against each library (the static one with the
# flags of `pkg-config --static --libs remat`), runs a training step, and
# finds that the library never called the program's functions. Each
# public header compiles on its own.
#
# Usage: check_symbols.sh LIBREMAT_A LIBREMAT_SO INCLUDE_DIR PC_DIR
# PC_DIR holds the remat.pc that gets installed. Environment: CC, the
# compiler command; CHECK_FLAGS, flags for compiling and linking the
# program (the build's sanitizers). Exits 0 when every check passes.
set -uo pipefail

if [ $# -ne 4 ]; then
  echo "usage: $0 LIBREMAT_A LIBREMAT_SO INCLUDE_DIR PC_DIR" >&2
  exit 2
fi
static_lib=$1
shared_lib=$2
include_dir=$3
pc_dir=$4
read -r -a cc <<<"${CC:-cc}"
read -r -a check_flags <<<"${CHECK_FLAGS:-}"
failed=0

# check_names LABEL NM_ARGS...: fails on each defined global symbol that
# nm lists without the remat_ prefix, and on a list without the API.
check_names() {
  local label=$1 listing names bad
  shift
  if ! listing=$(nm "$@" 2>&1); then
    echo "FAIL: $label: nm $* failed: $listing"
    failed=1
    return
  fi
  names=$(awk 'NF == 3 { print $3 }' <<<"$listing" | sort -u)
  bad=$(grep -v '^remat_' <<<"$names")
  if [ -n "$bad" ]; then
    echo "FAIL: $label: $(wc -l <<<"$bad") global symbols lack the remat_ prefix:"
    sed 's/^/  /' <<<"$bad"
    failed=1
  elif ! grep -qx remat_status_string <<<"$names"; then
    echo "FAIL: $label: remat_status_string is not among its global symbols"
    failed=1
  else
    echo "ok: $label: $(wc -l <<<"$names") global symbols, all remat_"
  fi
}

check_names "$static_lib (nm -g --defined-only)" -g --defined-only "$static_lib"
check_names "$shared_lib (nm -g --defined-only)" -g --defined-only "$shared_lib"
check_names "$shared_lib (nm -D --defined-only)" -D --defined-only "$shared_lib"

soname=$(objdump -p "$shared_lib" | awk '$1 == "SONAME" { print $2 }')
if [[ "$soname" =~ ^libremat\.so\.[0-9]+$ ]]; then
  echo "ok: $shared_lib: SONAME $soname"
else
  echo "FAIL: $shared_lib: SONAME is '$soname', expected libremat.so.N"
  failed=1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/embed.c" <<'EOF'
/* A program with functions of its own named like remat's internal ones. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "remat.h"
#include "remat_gpt.h"

static int own_calls;

int mem_alloc(int x);
int op_exec(int x);
int graph_fail(int x);
int chain_plan(int x);
int mem_alloc(int x) { own_calls++; return x + 1; }
int op_exec(int x) { own_calls++; return x + 2; }
int graph_fail(int x) { own_calls++; return x + 3; }
int chain_plan(int x) { own_calls++; return x + 4; }

static int failed(const char *call, remat_status s) {
  fprintf(stderr, "embed: %s: %s: %s\n", call, remat_status_string(s),
          remat_last_error());
  return 1;
}

/* One SGD step of a tiny GPT under the auto policy with a budget: the
 * library's own mem_alloc, op_exec and chain_plan all run. */
static int train_step(remat_runtime *rt, float *loss) {
  const remat_gpt_config cfg = {
      .layers = 1, .d_model = 8, .heads = 2, .seq = 4, .batch = 2, .vocab = 5};
  const remat_optimizer opt = {.kind = REMAT_OPT_SGD, .lr = 0.1f};
  int32_t tokens[8], targets[8];
  for (int i = 0; i < 8; i++) {
    tokens[i] = i % 5;
    targets[i] = (i + 1) % 5;
  }
  remat_graph *g = NULL;
  remat_gpt m;
  remat_step_stats st = {.size = sizeof st};
  remat_status s = remat_graph_create(rt, &g);
  if (s != REMAT_OK)
    return failed("remat_graph_create", s);
  if ((s = remat_gpt_build(g, &cfg, &m)) != REMAT_OK ||
      (s = remat_compile(g, m.loss, &opt)) != REMAT_OK ||
      (s = remat_feed(g, m.tokens, tokens, sizeof tokens)) != REMAT_OK ||
      (s = remat_feed(g, m.targets, targets, sizeof targets)) != REMAT_OK ||
      (s = remat_step(g, &st)) != REMAT_OK) {
    remat_graph_destroy(g);
    return failed("training step", s);
  }
  remat_graph_destroy(g);
  *loss = st.loss;
  return 0;
}

int main(void) {
  if (mem_alloc(1) + op_exec(1) + graph_fail(1) + chain_plan(1) != 14) {
    fprintf(stderr, "embed: the program's own functions gave wrong values\n");
    return 1;
  }
  if (strcmp(remat_status_string(REMAT_ERR_SHAPE), "REMAT_ERR_SHAPE") != 0) {
    fprintf(stderr, "embed: remat_status_string(REMAT_ERR_SHAPE) is '%s'\n",
            remat_status_string(REMAT_ERR_SHAPE));
    return 1;
  }
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_BIND |
                            REMAT_SET_POLICY | REMAT_SET_MEMORY_BUDGET,
                     .num_threads = 1, .bind = REMAT_BIND_NONE,
                     .policy = "auto", .memory_budget = 1 << 30};
  remat_runtime *rt = NULL;
  remat_graph *g = NULL;
  remat_status s = remat_runtime_create(&rc, &rt);
  if (s != REMAT_OK)
    return failed("remat_runtime_create", s);
  if ((s = remat_graph_create(rt, &g)) != REMAT_OK)
    return failed("remat_graph_create", s);
  /* The library's own graph_fail records this message. */
  const char *want = "relu: tensor argument is NULL";
  if (remat_relu(g, NULL) != NULL ||
      remat_graph_status(g) != REMAT_ERR_INVALID_ARG ||
      strcmp(remat_graph_error(g), want) != 0) {
    fprintf(stderr, "embed: remat_relu(g, NULL) left '%s', expected '%s'\n",
            remat_graph_error(g), want);
    return 1;
  }
  remat_graph_destroy(g);
  float loss = 0.0f;
  int rc_step = train_step(rt, &loss);
  remat_runtime_destroy(rt);
  if (rc_step != 0)
    return 1;
  if (!isfinite(loss) || loss <= 0.0f) {
    fprintf(stderr, "embed: the step's loss is %g\n", loss);
    return 1;
  }
  if (own_calls != 4) {
    fprintf(stderr, "embed: the library called the program's functions "
            "(%d calls, expected the program's own 4)\n", own_calls);
    return 1;
  }
  printf("embed: ok, loss %.4f\n", loss);
  return 0;
}
EOF

# link_and_run LABEL LD_LIBRARY_PATH LINK_ARGS...: builds embed.c with the
# link arguments and runs it.
link_and_run() {
  local label=$1 lib_path=$2 out
  shift 2
  if ! out=$("${cc[@]}" "${check_flags[@]}" -std=c11 -Wall -Wextra -Werror \
               -I"$include_dir" "$work/embed.c" "$@" -o "$work/embed" 2>&1); then
    echo "FAIL: $label: linking a program with its own mem_alloc, op_exec," \
         "graph_fail and chain_plan failed:"
    sed 's/^/  /' <<<"$out"
    failed=1
    return
  fi
  if ! out=$(LD_LIBRARY_PATH="$lib_path" "$work/embed" 2>&1); then
    echo "FAIL: $label: the program failed:"
    sed 's/^/  /' <<<"$out"
    failed=1
    return
  fi
  echo "ok: $label: $out"
}

if ! static_libs=$(PKG_CONFIG_PATH="$pc_dir" pkg-config --static --libs remat 2>&1); then
  echo "FAIL: pkg-config --static --libs remat (PKG_CONFIG_PATH=$pc_dir): $static_libs"
  failed=1
else
  read -r -a private <<<"$static_libs"
  private_libs=()
  for flag in "${private[@]}"; do
    [ "$flag" = -lremat ] || private_libs+=("$flag")
  done
  link_and_run "static link with $static_lib" "" "$static_lib" "${private_libs[@]}"
fi
link_and_run "link with $shared_lib" "$(dirname "$shared_lib")" "$shared_lib"

# Each public header compiles on its own, first in a file (remat_gpt.h
# and remat_llama.h bring remat.h), and remat.h alone has no GPT builder.
for header in remat.h remat_gpt.h remat_llama.h remat_lora.h; do
  printf '#include "%s"\nint remat_check_header(void);\nint remat_check_header(void) { return REMAT_OK; }\n' \
    "$header" >"$work/header.c"
  if ! out=$("${cc[@]}" -std=c11 -Wall -Wextra -Werror -I"$include_dir" \
               -c "$work/header.c" -o "$work/header.o" 2>&1); then
    echo "FAIL: $header does not compile on its own:"
    sed 's/^/  /' <<<"$out"
    failed=1
  else
    echo "ok: $header compiles on its own"
  fi
done
if grep -q 'remat_gpt_build' "$include_dir/remat.h"; then
  echo "FAIL: remat.h declares the GPT builder (it belongs in remat_gpt.h)"
  failed=1
fi

exit "$failed"
