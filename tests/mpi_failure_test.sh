#!/bin/sh
# A rank that dies or stalls mid-run: mpi_failure_test.sh HAVE_MPI PROGRAM
# --kill|--stall. The job must end non-zero within 60 s (--kill), and with
# --stall rank 0's step must fail on the allreduce timeout (2 s here) with
# its message. Exits 77 (skipped) only when remat was built without MPI.
have_mpi=$1
prog=$2
mode=$3
if [ "$have_mpi" != 1 ]; then
  echo "remat was built without MPI: skipped"
  exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export REMAT_DP_TIMEOUT=2
log=$(mktemp)
start=$(date +%s)
timeout 120 mpirun --oversubscribe --bind-to none -x REMAT_DP_TIMEOUT -np 2 \
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
rm -f "$log"
[ $ok = 1 ]
