#!/bin/sh
# A rank that dies or stalls mid-run, or is late for its first step:
# mpi_failure_test.sh HAVE_MPI PROGRAM --kill|--stall|--late. The job must
# end non-zero within 60 s; with --stall rank 0's step must fail on the
# allreduce timeout (5 s here) with its message, and with --late rank 0's
# first step on the first step's check timing out. Exits 77 (skipped) only
# when remat was built without MPI.
have_mpi=$1
prog=$2
mode=$3
if [ "$have_mpi" != 1 ]; then
  echo "remat was built without MPI: skipped"
  exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export REMAT_DP_TIMEOUT=5
# Sanitizer builds: Open MPI's own leaks are suppressed (lsan_mpi.supp),
# with its components kept loaded and full unwinding so that they match.
export OMPI_MCA_mca_base_component_disable_dlclose=1
export LSAN_OPTIONS="suppressions=$(cd "$(dirname "$0")" && pwd)/lsan_mpi.supp:print_suppressions=0:fast_unwind_on_malloc=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
log=$(mktemp)
start=$(date +%s)
timeout 120 mpirun --oversubscribe --bind-to none -x REMAT_DP_TIMEOUT -x LSAN_OPTIONS -np 2 \
  "$prog" "$mode" >"$log" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
cat "$log"
echo "mpirun exit status $rc after ${elapsed} s"
ok=1
[ "$rc" -ne 0 ] || { echo "FAIL: the job exited 0"; ok=0; }
[ "$rc" -ne 124 ] && [ "$elapsed" -lt 60 ] || { echo "FAIL: not ended within 60 s"; ok=0; }
if [ "$mode" = --stall ] && ! grep -q "OK: stall detected" "$log"; then
  echo "FAIL: rank 0 did not report the allreduce timeout"
  ok=0
fi
if [ "$mode" = --late ] && ! grep -q "OK: late rank detected" "$log"; then
  echo "FAIL: rank 0's first step did not fail on the timeout, or not in time"
  ok=0
fi
rm -f "$log"
[ $ok = 1 ]
