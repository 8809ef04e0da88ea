#!/usr/bin/env bash
# Runs the whole test suite: every test in the release build, every test in
# an AddressSanitizer + UndefinedBehaviorSanitizer build, the scheduler
# tests, the graph-misuse tests, the multi-threaded server example and
# remat-serve's load test in a ThreadSanitizer build,
# and each libFuzzer target for FUZZ_SECONDS (default 20) in a clang build
# (tools/fuzz.sh; a target counts as one test). Ends with the plain line
# "N passed, N failed" summed over the four.
set -uo pipefail
cd "$(dirname "$0")/.."

passed=0
failed=0
log_dir=build/test-logs
mkdir -p "$log_dir"

# run_suite NAME BUILD_DIR MESON_ARGS TEST_ARGS...
run_suite() {
  local name=$1 dir=$2 setup_args=$3
  shift 3
  if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" $setup_args >"$log_dir/$name-setup.log" 2>&1 || {
      echo "$name: meson setup failed (see $log_dir/$name-setup.log)"
      tail -20 "$log_dir/$name-setup.log"
      failed=$((failed + 1)); return; }
  fi
  if ! ninja -C "$dir" >"$log_dir/$name-build.log" 2>&1; then
    echo "$name: build failed (see $log_dir/$name-build.log)"
    tail -30 "$log_dir/$name-build.log"
    failed=$((failed + 1)); return
  fi
  meson test -C "$dir" --print-errorlogs "$@" 2>&1 | tee "$log_dir/$name.log"
  local ok fail
  ok=$(sed -n 's/^Ok: *\([0-9]*\).*/\1/p' "$log_dir/$name.log" | tail -1)
  fail=$(awk '/^(Fail|Unexpected Pass|Timeout):/ {n += $2} END {print n + 0}' \
         "$log_dir/$name.log")
  if [ -z "$ok" ]; then
    echo "$name: meson test printed no summary"; failed=$((failed + 1)); return
  fi
  passed=$((passed + ok))
  failed=$((failed + fail))
}

run_suite release build "--buildtype=release"
run_suite asan build-asan "-Db_sanitize=address,undefined -Db_lundef=false --buildtype=debugoptimized"
run_suite tsan build-tsan "-Db_sanitize=thread --buildtype=debugoptimized" --suite sched --suite server --suite concurrency

# run_fuzz SECONDS: each fuzz target for SECONDS; adds its summary line.
run_fuzz() {
  tools/fuzz.sh "$1" 2>&1 | tee "$log_dir/fuzz.log"
  local summary
  summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log_dir/fuzz.log" | tail -1)
  if [ -z "$summary" ]; then
    echo "fuzz: tools/fuzz.sh printed no summary"; failed=$((failed + 1)); return
  fi
  passed=$((passed + $(echo "$summary" | cut -d' ' -f1)))
  failed=$((failed + $(echo "$summary" | cut -d' ' -f3)))
}
run_fuzz "${FUZZ_SECONDS:-20}"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
