#!/usr/bin/env bash
# Runs each libFuzzer target for a bounded time: ./tools/fuzz.sh [SECONDS]
# (default 30 per target). Builds build-fuzz/ with clang, ASan and UBSan,
# starts each target from its seed corpus (tests/fuzz/corpus/TARGET; new
# inputs go to a scratch copy, the committed seeds are left alone) and prints
# one line per target with its executions. A crash leaves its input in
# build-fuzz/fuzz-crashes/TARGET/: copy it to tests/fuzz/regressions/TARGET/
# so that every build's fuzz suite replays it. Ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-30}
targets=(fuzz_policy fuzz_env fuzz_graph fuzz_safetensors fuzz_data fuzz_serve)
dir=build-fuzz
log_dir=$dir/fuzz-logs

if [ ! -f "$dir/build.ninja" ]; then
  mkdir -p "$(dirname "$dir")"
  CC=clang meson setup "$dir" -Dfuzz=true --buildtype=debugoptimized \
    -Db_sanitize=address,undefined -Db_lundef=false \
    -Dc_args=-fsanitize=fuzzer-no-link -Dc_link_args=-fsanitize=fuzzer-no-link \
    >"$dir-setup.log" 2>&1 || {
      echo "fuzz: meson setup failed (see $dir-setup.log)"; tail -20 "$dir-setup.log"
      echo "0 passed, ${#targets[@]} failed"; exit 1; }
fi
mkdir -p "$log_dir"
if ! ninja -C "$dir" "${targets[@]/#/tests/fuzz/}" >"$log_dir/build.log" 2>&1; then
  echo "fuzz: build failed (see $log_dir/build.log)"; tail -30 "$log_dir/build.log"
  echo "0 passed, ${#targets[@]} failed"; exit 1
fi

passed=0
failed=0
for t in "${targets[@]}"; do
  work=$dir/fuzz-corpus/$t
  crashes=$dir/fuzz-crashes/$t
  mkdir -p "$work" "$crashes"
  # UBSan reports abort (so libFuzzer keeps the input); leaks are errors.
  UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1 \
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
    "$dir/tests/fuzz/$t" -max_total_time="$seconds" -print_final_stats=1 \
      -timeout=20 -rss_limit_mb=4096 -artifact_prefix="$crashes/" \
      "$work" "tests/fuzz/corpus/$t" >"$log_dir/$t.log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log_dir/$t.log" | tail -1)
  if [ "$rc" -eq 0 ]; then
    passed=$((passed + 1))
    echo "$t: ok, ${execs:-?} executions in ${seconds} s"
  else
    failed=$((failed + 1))
    echo "$t: FAILED (exit $rc, ${execs:-?} executions; input in $crashes, log $log_dir/$t.log)"
    grep -m1 -A12 -E "ERROR: |runtime error|check failed" "$log_dir/$t.log"
  fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
