#!/usr/bin/env bash
# What the `mpi` feature (nuvec::distributed, `generate --pipeline`) and its tests need: Open MPI
# (mpirun and its development files, found through mpicc) and libclang, which rsmpi's bindings
# are generated with. Debian's packages, only those missing.
set -euo pipefail
need=()
command -v mpirun >/dev/null || need+=(openmpi-bin)
command -v mpicc >/dev/null || need+=(libopenmpi-dev)
# libclang itself (libclang.so*, libclang-NN.so*), not libclang-cpp, which other packages bring and
# bindgen cannot use.
compgen -G "/usr/lib/llvm-*/lib/libclang.so*" >/dev/null || compgen -G "/usr/lib/x86_64-linux-gnu/libclang-[0-9]*.so*" >/dev/null \
    || need+=(libclang-dev)
if ((${#need[@]})); then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        echo "[setup-mpi] installing ${need[*]}" >&2
        apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    else
        echo "error: the mpi feature needs ${need[*]}; install them (apt-get install --no-install-recommends ${need[*]})" >&2
        exit 1
    fi
fi
