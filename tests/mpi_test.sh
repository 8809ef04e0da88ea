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
exec mpirun --oversubscribe --bind-to none -np 2 "$@" "$prog"
