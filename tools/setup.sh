#!/usr/bin/env bash
# Installs what remat needs on Debian 12 (only the packages that are
# missing) and builds the project into build/.
set -euo pipefail
cd "$(dirname "$0")/.."

# libudev-dev: hwloc's pkg-config file lists -ludev for static links
# (pkg-config --static --libs remat).
packages=(build-essential meson ninja-build pkg-config libdnnl-dev
          libhwloc-dev libudev-dev libcmocka-dev libcjson-dev clang
          libclang-rt-14-dev python3-torch python3-numpy python3-matplotlib
          libopenblas0-pthread openmpi-bin libopenmpi-dev libmicrohttpd-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" \
    || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  echo "setup: installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >&2
fi
[ -f build/build.ninja ] || meson setup build --buildtype=release >&2
ninja -C build >&2
