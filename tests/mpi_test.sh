#!/bin/sh
# Runs an MPI test program on 2 ranks: mpi_test.sh HAVE_MPI PROGRAM
# [MPIRUN ARGS...]. Exits 77 (skipped) only when remat was built without
# MPI (HAVE_MPI 0); a missing mpirun with MPI built is a failure.
have_mpi=$1
shift
if [ "$have_mpi" != 1 ]; then
  echo "remat was built without MPI (-Dmpi=disabled or MPI not found): skipped"
  exit 77
fi
prog=$1
shift
if ! command -v mpirun >/dev/null 2>&1; then
  echo "mpirun not found, but remat was built with MPI" >&2
  exit 1
fi
# Root in containers; --oversubscribe: 2 ranks on machines with fewer
# cores. The ranks run one worker each, unbound (the tests set it).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Sanitizer builds: Open MPI's own leaks are suppressed (lsan_mpi.supp),
# with its components kept loaded and full unwinding so that they match.
export OMPI_MCA_mca_base_component_disable_dlclose=1
export LSAN_OPTIONS="suppressions=$(cd "$(dirname "$0")" && pwd)/lsan_mpi.supp:print_suppressions=0:fast_unwind_on_malloc=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
exec mpirun --oversubscribe --bind-to none -x LSAN_OPTIONS -np 2 "$@" "$prog"
