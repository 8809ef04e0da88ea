#!/usr/bin/env bash
# Checks that the README's "Using the library" example is a complete
# program: extracts its C block, compiles it against the built shared
# library with the flags of `pkg-config --cflags --libs remat` (the
# uninstalled remat.pc of the build), runs it in a scratch directory, and
# checks what it prints (the loss at steps 10, 20 and 30, falling) and the
# checkpoint it writes.
#
# Usage: check_readme.sh README INCLUDE_DIR LIBREMAT_SO PC_DIR
# LIBREMAT_SO is the shared library (named so that it is built first);
# PC_DIR holds remat-uninstalled.pc, whose -L directories the program runs
# with. Environment: CC, the compiler
# command; CHECK_FLAGS, flags for compiling and linking (the build's
# sanitizers). Exits 0 when every check passes.
set -uo pipefail

if [ $# -ne 4 ]; then
  echo "usage: $0 README INCLUDE_DIR LIBREMAT_SO PC_DIR" >&2
  exit 2
fi
readme=$1
include_dir=$2
pc_dir=$4
read -r -a cc <<<"${CC:-cc}"
read -r -a check_flags <<<"${CHECK_FLAGS:-}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The first ```c block after the "## Using the library" heading.
awk '/^## Using the library$/ { section = 1; next }
     section && /^## / { exit }
     section && !inside && /^```c$/ { inside = 1; next }
     inside && /^```$/ { exit }
     inside { print }' "$readme" >"$work/train.c"
if ! grep -q 'int main' "$work/train.c"; then
  echo "FAIL: no C block with a main under '## Using the library' in $readme"
  exit 1
fi
echo "ok: extracted $(wc -l <"$work/train.c") lines from $readme"

if ! flags=$(PKG_CONFIG_PATH="$pc_dir" pkg-config --cflags --libs \
               remat-uninstalled 2>&1); then
  echo "FAIL: pkg-config --cflags --libs remat-uninstalled: $flags"
  exit 1
fi
read -r -a pc_flags <<<"$flags"
lib_path=
for flag in "${pc_flags[@]}"; do
  [[ $flag == -L* ]] && lib_path+="${lib_path:+:}${flag#-L}"
done
# The uninstalled remat.pc points at the source root, not include/.
if ! out=$("${cc[@]}" "${check_flags[@]}" -std=c11 -Wall -Wextra -Werror \
             -I"$include_dir" "$work/train.c" "${pc_flags[@]}" \
             -o "$work/train" 2>&1); then
  echo "FAIL: the README's example does not compile with $flags:"
  sed 's/^/  /' <<<"$out"
  exit 1
fi
echo "ok: compiled with $flags"

if ! out=$(cd "$work" && LD_LIBRARY_PATH="$lib_path" \
             REMAT_NUM_THREADS=2 ./train 2>&1); then
  echo "FAIL: the README's example failed:"
  sed 's/^/  /' <<<"$out"
  exit 1
fi
losses=$(awk '/^step (10|20|30): loss [0-9.]+, peak [0-9]+ bytes$/ {
                sub(",", "", $4); print $4 }' <<<"$out")
if [ "$(wc -l <<<"$losses")" -ne 3 ] ||
   ! awk 'NR == 1 { first = $1 } END { exit !($1 < first) }' <<<"$losses"; then
  echo "FAIL: expected the loss at steps 10, 20 and 30, falling; got:"
  sed 's/^/  /' <<<"$out"
  exit 1
fi
if ! head -c 300 "$work/model.ckpt" | grep -q '"remat.checkpoint":"1"'; then
  echo "FAIL: the example wrote no checkpoint model.ckpt"
  exit 1
fi
echo "ok: it ran: $(tr '\n' ';' <<<"$out")"
