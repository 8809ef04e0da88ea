#!/usr/bin/env bash
# Checks that data parallelism lives in its own library: libremat.so needs
# no MPI library and remat.pc requires no MPI package (a server that never
# uses MPI builds without OpenMPI's ompi-c.pc), while libremat_mpi.so
# needs libremat and MPI and remat_mpi.pc requires both.
#
# Usage: check_mpi_split.sh LIBREMAT_SO PC_DIR [LIBREMAT_MPI_SO]
# PC_DIR holds the build's remat-uninstalled.pc (and remat_mpi's, when
# LIBREMAT_MPI_SO is given: a build with MPI). Exits 0 when every check
# passes.
set -uo pipefail

if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: $0 LIBREMAT_SO PC_DIR [LIBREMAT_MPI_SO]" >&2
  exit 2
fi
shared_lib=$1
pc_dir=$2
mpi_lib=${3:-}
failed=0

# needed FILE: the libraries FILE's dynamic section names.
needed() {
  readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'
}

libs=$(needed "$shared_lib")
if [ -z "$libs" ] || grep -qi 'mpi' <<<"$libs"; then
  echo "FAIL: $shared_lib needs: $(tr '\n' ' ' <<<"$libs")(expected no MPI)"
  failed=1
else
  echo "ok: $(basename "$shared_lib") needs $(tr '\n' ' ' <<<"$libs")"
fi

if ! reqs=$(PKG_CONFIG_PATH="$pc_dir" pkg-config --print-requires \
              --print-requires-private remat-uninstalled 2>&1); then
  echo "FAIL: pkg-config remat-uninstalled: $reqs"
  failed=1
elif grep -qi 'mpi' <<<"$reqs"; then
  echo "FAIL: remat.pc requires MPI: $(tr '\n' ' ' <<<"$reqs")"
  failed=1
else
  echo "ok: remat.pc requires $(tr '\n' ' ' <<<"$reqs")"
fi

if [ -n "$mpi_lib" ]; then
  libs=$(needed "$mpi_lib")
  if ! grep -q '^libremat\.so\.' <<<"$libs" || ! grep -q 'libmpi' <<<"$libs"
  then
    echo "FAIL: $mpi_lib needs: $(tr '\n' ' ' <<<"$libs")(expected" \
         "libremat and libmpi)"
    failed=1
  else
    echo "ok: $(basename "$mpi_lib") needs $(tr '\n' ' ' <<<"$libs")"
  fi
  reqs=$(PKG_CONFIG_PATH="$pc_dir" pkg-config --print-requires \
           remat_mpi-uninstalled 2>&1)
  if ! grep -q '^remat' <<<"$reqs" || ! grep -q 'ompi\|mpi' <<<"$reqs"; then
    echo "FAIL: remat_mpi.pc requires: $(tr '\n' ' ' <<<"$reqs")"
    failed=1
  else
    echo "ok: remat_mpi.pc requires $(tr '\n' ' ' <<<"$reqs")"
  fi
fi
exit "$failed"
