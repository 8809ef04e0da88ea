#!/usr/bin/env bash
# Mutation testing: applies each mutation of tools/mutants.txt, one at a
# time, to a copy of the source tree, rebuilds the copy's release build
# (one build directory for all mutants, so only the mutated file compiles)
# and runs its test suite. A mutant the suite fails on, or that runs past the
# timeout, is KILLED; one it passes SURVIVED; one that does not build counts
# as killed but is named as "did not compile" so that it can be replaced.
# Ends with the line "N killed, N survived". A report, not a gate: the exit
# status is 0 unless the script itself broke (2: bad options or a mutation
# whose search text does not occur exactly once; 1: the unmutated copy does
# not build or fails its tests).
#
#   tools/mutants.sh [--list] [--only ID...] [--tests TEST...]
#                    [--timeout SECONDS] [--keep DIR] [--file MUTATIONS]
#
#   --list       list the mutations (and check that each applies), run none
#   --only ID..  run only these mutations
#   --tests T..  run only these meson tests, for the baseline and for every
#                mutant (quicker; a mutant that survives them may still die
#                in the whole suite, so SURVIVED then means "not by these")
#   --timeout S  limit of one test-suite run in seconds (default 300)
#   --keep DIR   work in DIR and leave it there (copy, build, logs/ID.log);
#                a later run with the same DIR rebuilds only what changed
#   --file F     the mutations file (default tools/mutants.txt)
#
# The copy holds the files git knows of (tracked, and untracked ones that
# are not ignored) as they are in the working tree. MUTANTS_JOBS sets
# ninja's job count (default 2).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
mutations_file=$root/tools/mutants.txt
timeout_s=300
keep_dir=
list_only=0
only=()
tests_only=()
jobs=${MUTANTS_JOBS:-2}

die() { echo "mutants.sh: $*" >&2; exit 2; }
broken() { echo "mutants.sh: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  case $1 in
    --list) list_only=1; shift ;;
    --only)
      shift
      while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do only+=("$1"); shift; done
      [ ${#only[@]} -gt 0 ] || die "--only needs at least one mutation id" ;;
    --tests)
      shift
      while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do tests_only+=("$1"); shift; done
      [ ${#tests_only[@]} -gt 0 ] || die "--tests needs at least one test name" ;;
    --timeout)
      [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || die "--timeout needs a number of seconds"
      timeout_s=$2; shift 2 ;;
    --keep) [ -n "${2:-}" ] || die "--keep needs a directory"; keep_dir=$2; shift 2 ;;
    --file) [ -n "${2:-}" ] || die "--file needs a file"; mutations_file=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
[ -f "$mutations_file" ] || die "no mutations file '$mutations_file'"

# ---- the mutations file ----
# Entries of five lines "key: value" (id, file, desc, find, repl), separated
# by blank lines; '#' starts a comment line. find and repl are taken
# verbatim after "find: " / "repl: ", and find must occur exactly once.
ids=() files=() descs=() finds=() repls=()

parse_mutations() {
  local line key value n=0 lineno=0
  local -A seen=()
  while IFS= read -r line || [ -n "$line" ]; do
    lineno=$((lineno + 1))
    case $line in ''|'#'*) continue ;; esac
    key=${line%%:*}
    value=${line#*: }
    [ "$value" != "$line" ] || value=${line#*:}
    case $key in
      id)
        [[ $value =~ ^[a-z0-9][a-z0-9-]*$ ]] ||
          die "$mutations_file:$lineno: id '$value' is not lowercase letters, digits and dashes"
        [ -z "${seen[$value]:-}" ] || die "$mutations_file:$lineno: id '$value' appears twice"
        seen[$value]=1
        n=${#ids[@]}
        ids[n]=$value files[n]='' descs[n]='' finds[n]='' repls[n]=''
        ;;
      file|desc|find|repl)
        [ ${#ids[@]} -gt 0 ] || die "$mutations_file:$lineno: '$key' before the first id"
        n=$((${#ids[@]} - 1))
        case $key in
          file) files[n]=$value ;; desc) descs[n]=$value ;;
          find) finds[n]=$value ;; repl) repls[n]=$value ;;
        esac ;;
      *) die "$mutations_file:$lineno: unknown key '$key' (id, file, desc, find, repl)" ;;
    esac
  done <"$mutations_file"
  local i
  for i in "${!ids[@]}"; do
    if [ -z "${files[i]}" ] || [ -z "${descs[i]}" ] || [ -z "${finds[i]}" ]; then
      die "mutation ${ids[i]}: needs file, desc and find"
    fi
    [ "${finds[i]}" != "${repls[i]}" ] || die "mutation ${ids[i]}: repl equals find"
  done
}

# count_occurrences FILE TEXT: how many times TEXT occurs in FILE.
count_occurrences() {
  MUT_FIND=$2 perl -0777 -ne 'BEGIN { $f = $ENV{MUT_FIND} } $n = () = /\Q$f\E/g;
    END { print $n + 0 }' "$1"
}

# check_applies DIR I: fails loudly unless mutation I's text occurs exactly
# once in its file under DIR.
check_applies() {
  local path=$1/${files[$2]} count
  [ -f "$path" ] || die "mutation ${ids[$2]}: no file ${files[$2]}"
  count=$(count_occurrences "$path" "${finds[$2]}")
  [ "$count" = 1 ] || die "mutation ${ids[$2]}: its search text occurs $count times in ${files[$2]} (must be exactly once): ${finds[$2]}"
}

apply_mutation() {
  MUT_FIND=${finds[$2]} MUT_REPL=${repls[$2]} perl -0777 -pi -e \
    'BEGIN { $f = $ENV{MUT_FIND}; $r = $ENV{MUT_REPL} } s/\Q$f\E/$r/' \
    "$1/${files[$2]}"
}

parse_mutations
selected=()
if [ ${#only[@]} -gt 0 ]; then
  for want in "${only[@]}"; do
    found=
    for i in "${!ids[@]}"; do [ "${ids[i]}" = "$want" ] && found=$i; done
    [ -n "$found" ] || die "no mutation with id '$want' (see --list)"
    selected+=("$found")
  done
else
  selected=("${!ids[@]}")
fi
for i in "${selected[@]}"; do check_applies "$root" "$i"; done

if [ "$list_only" = 1 ]; then
  for i in "${selected[@]}"; do
    printf '%-30s %-24s %s\n' "${ids[i]}" "${files[i]}" "${descs[i]}"
  done
  echo "${#selected[@]} mutations, each applies"
  exit 0
fi

# ---- the copy and its build ----
if [ -n "$keep_dir" ]; then
  mkdir -p "$keep_dir" || broken "cannot create '$keep_dir'"
  work=$(cd "$keep_dir" && pwd)
else
  work=$(mktemp -d "${TMPDIR:-/tmp}/remat-mutants.XXXXXX") || broken "mktemp failed"
fi
src=$work/src
build=$work/build
logs=$work/logs
mkdir -p "$src" "$logs" "$work/orig"

mutated=   # index of the mutation now applied to the copy, if any
suite_pid= # the test-suite run in progress, if any
restore() {
  if [ -n "$mutated" ]; then
    # cat, not cp -p: the restored file must look newer than its object.
    cat "$work/orig/current" >"$src/${files[$mutated]}"
    mutated=
  fi
}
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  if [ -n "$suite_pid" ]; then kill -TERM "$suite_pid" 2>/dev/null; wait "$suite_pid"; fi
  restore
  if [ -z "$keep_dir" ]; then rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Copies the files git knows of into the copy, only those that differ, so
# that a kept build recompiles only what changed.
sync_tree() {
  local f
  while IFS= read -r -d '' f; do
    [ -f "$root/$f" ] || continue
    if ! cmp -s "$root/$f" "$src/$f"; then
      mkdir -p "$src/$(dirname "$f")"
      cp "$root/$f" "$src/$f" || broken "cannot copy $f"
    fi
  done < <(git -C "$root" ls-files -z --cached --others --exclude-standard)
}

# run_suite LOG [TEST...]: the copy's test suite (or the named tests),
# stopping at the first failure; returns its exit status (124 or 137: timed
# out). timeout puts the run in a process group of its own and ends all of
# it; so does cleanup.
run_suite() {
  local log=$1
  shift
  timeout -k 10 "$timeout_s" meson test -C "$build" --no-rebuild --maxfail 1 \
    --print-errorlogs "$@" >>"$log" 2>&1 &
  suite_pid=$!
  wait "$suite_pid"
  local rc=$?
  suite_pid=
  return "$rc"
}

# The meson tests that failed or timed out in LOG, one per line.
failed_tests() {
  sed -nE 's/^ *[0-9]+\/[0-9]+ +[^ ]+ \/ ([^ ]+) +(FAIL|TIMEOUT|ERROR|UNEXPECTEDPASS).*/\1/p' "$1" |
    awk '!seen[$0]++'
}

# The CMocka cases that failed in LOG, comma-separated.
failed_cases() {
  sed -nE 's/^\[  FAILED  \] ([A-Za-z_][A-Za-z0-9_]*)$/\1/p' "$1" |
    awk '!seen[$0]++' | paste -sd, -
}

# run_mutant I: applies mutation I, builds, tests, restores; sets verdict
# and how. A kill is checked by running the failing tests once more: a pass
# then means a flaky test (or a mutant that only sometimes misbehaves).
run_mutant() {
  local log=$logs/${ids[$1]}.log rc tests cases
  cp "$src/${files[$1]}" "$work/orig/current"
  mutated=$1
  apply_mutation "$src" "$1"
  if ! ninja -C "$build" -j "$jobs" >"$log" 2>&1; then
    verdict=KILLED how="did not compile"
  else
    run_suite "$log" "${tests_only[@]}"
    rc=$?
    if [ "$rc" = 0 ]; then
      verdict=SURVIVED how="suite passed"
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
      verdict=KILLED how="timeout after ${timeout_s} s"
    else
      verdict=KILLED
      mapfile -t tests < <(failed_tests "$log")
      cases=$(failed_cases "$log")
      how="by $(IFS=,; echo "${tests[*]}")${cases:+: $cases}"
      [ ${#tests[@]} -gt 0 ] || how="test status $rc"
      if [ ${#tests[@]} -gt 0 ] && { echo "---- rerun ----" >>"$log"; run_suite "$log" "${tests[@]}"; }; then
        how="$how; passed when rerun"
      fi
    fi
  fi
  restore
}

start=$(date +%s)
sync_tree
for i in "${selected[@]}"; do check_applies "$src" "$i"; done
echo "mutants.sh: ${#selected[@]} mutations; copy in $work; test timeout ${timeout_s} s"
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" "$src" --buildtype=release >"$logs/setup.log" 2>&1 ||
    { tail -20 "$logs/setup.log"; broken "meson setup of the copy failed"; }
fi
ninja -C "$build" -j "$jobs" >"$logs/baseline.log" 2>&1 ||
  { tail -30 "$logs/baseline.log"; broken "the unmutated copy does not build"; }
# A test that fails once on the unmutated copy but passes when rerun is
# flaky: the run goes on, and every kill is checked by a rerun anyway.
run_suite "$logs/baseline.log" "${tests_only[@]}"
rc=$?
if [ "$rc" != 0 ]; then
  mapfile -t flaky < <(failed_tests "$logs/baseline.log")
  if [ ${#flaky[@]} -eq 0 ] || [ "$rc" = 124 ] || [ "$rc" = 137 ] ||
     ! { echo "---- rerun ----" >>"$logs/baseline.log"; run_suite "$logs/baseline.log" "${flaky[@]}"; } ||
     ! run_suite "$logs/baseline.log" "${tests_only[@]}"; then
    tail -30 "$logs/baseline.log"
    broken "the unmutated copy fails its tests (status $rc)"
  fi
  echo "baseline: flaky (failed once, then passed): ${flaky[*]}: $(failed_cases "$logs/baseline.log")"
fi
echo "baseline: builds and passes its tests ($(($(date +%s) - start)) s)"

killed=0 survived=0
no_compile=() survivors=() unsure=()
for i in "${selected[@]}"; do
  t0=$(date +%s)
  run_mutant "$i"
  case $how in
    "did not compile") no_compile+=("${ids[i]}") ;;
    *"passed when rerun") unsure+=("${ids[i]}") ;;
  esac
  if [ "$verdict" = SURVIVED ]; then
    survived=$((survived + 1)) survivors+=("${ids[i]}")
  else
    killed=$((killed + 1))
  fi
  printf '%-8s %s (%s, %d s): %s\n' "$verdict" "${ids[i]}" "$how" \
    $(($(date +%s) - t0)) "${descs[i]}"
done

total=$((killed + survived))
[ ${#no_compile[@]} -eq 0 ] ||
  echo "did not compile (replace them): ${no_compile[*]}"
[ ${#unsure[@]} -eq 0 ] ||
  echo "killed, but the failing tests passed when rerun (a flaky test, or a mutant whose effect varies from run to run): ${unsure[*]}"
[ ${#survivors[@]} -eq 0 ] || echo "survived: ${survivors[*]}"
echo "kill rate $((total ? 100 * killed / total : 0))% ($killed of $total) in $(($(date +%s) - start)) s"
echo "$killed killed, $survived survived"
exit 0
