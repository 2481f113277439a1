#!/usr/bin/env bash
# Registers, spills and static shared memory of CUDA kernels, without a GPU: compiles one kernel
# source of nuvec's CUDA backend for sm_90 with NVRTC (the pinned PyPI wheel that
# scripts/check-cuda-kernels.sh installs) and ptxas's verbose report, and prints its lines for
# the kernels whose names match a pattern. Extra arguments go to NVRTC (definitions such as
# -DQI_STAGES=2, as NUVEC_NVRTC_DEFINES passes them at run time).
# Usage: scripts/cuda-registers.sh qimma.cu [PATTERN] [-DNAME=VALUE ...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${NUVEC_CACHE:-$HOME/.cache/nuvec}/nvrtc-13.0.88"
if [ ! -x "$venv/bin/python" ]; then
    "$root/scripts/check-cuda-kernels.sh" >/dev/null  # installs the wheel
fi
source="${1:?usage: scripts/cuda-registers.sh SOURCE.cu [PATTERN] [-DNAME=VALUE ...]}"
pattern="${2:-.}"
shift $(($# < 2 ? $# : 2))
exec "$venv/bin/python" - "$root/crates/nuvec/src/backends/cuda/kernels" "$source" "$pattern" "$@" <<'PY'
import ctypes, glob, os, re, sys, sysconfig

kernels, name, pattern, extra = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
site = sysconfig.get_paths()["purelib"]
libs = [l for l in glob.glob(os.path.join(site, "nvidia", "*", "lib", "libnvrtc.so.*")) if re.search(r"libnvrtc\.so\.\d+$", l)]
if not libs:
    sys.exit("cuda-registers: libnvrtc not found in the nvidia-cuda-nvrtc wheel")
for builtins in glob.glob(os.path.join(os.path.dirname(libs[0]), "libnvrtc-builtins.so.*")):
    if ".alt." not in builtins:
        ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
nvrtc = ctypes.CDLL(libs[0])
path = os.path.join(kernels, name)
if not os.path.exists(path):
    sys.exit(f"cuda-registers: no kernel source {path}")
# As the backend compiles it (crates/nuvec/src/backends/cuda/mod.rs): common.cuh, then the source.
src = open(os.path.join(kernels, "common.cuh")).read() + f'\n#line 1 "{name}"\n' + open(path).read()
prog = ctypes.c_void_p()
nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None)
opts = ["--gpu-architecture=sm_90", "--std=c++17", "--ptxas-options=-v"] + extra
arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
err = nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
size = ctypes.c_size_t()
nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
log = ctypes.create_string_buffer(size.value)
nvrtc.nvrtcGetProgramLog(prog, log)
text = log.value.decode(errors="replace")
if err:
    sys.exit(f"cuda-registers: NVRTC could not compile {name}:\n{text}")
kernel = None
for line in text.splitlines():
    m = re.search(r"Compiling entry function '(\w+)'", line)
    if m:
        kernel = m.group(1)
    elif kernel and re.search(pattern, kernel) and ("registers" in line or "spill" in line):
        detail = re.sub(r"^ptxas( info)?\s*[:.]?\s*", "", line.strip())
        print(f"{kernel:28} {detail}")
PY
