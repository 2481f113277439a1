"""NVRTC from the pinned PyPI wheel (nvidia-cuda-nvrtc) through ctypes, as scripts/check-cuda-kernels.sh
and scripts/cuda-registers.sh compile nuvec's kernels: no GPU and no CUDA install needed."""
import ctypes
import glob
import os
import re
import sys
import sysconfig


def load(tool):
    """The NVRTC library of the running venv's wheel, and its path (`tool` names the caller in errors)."""
    site = sysconfig.get_paths()["purelib"]
    libs = glob.glob(os.path.join(site, "nvidia", "*", "lib", "libnvrtc.so.*")) + glob.glob(
        os.path.join(site, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.*"))
    libs = [l for l in libs if re.search(r"libnvrtc\.so\.\d+$", l)]
    if not libs:
        sys.exit(f"{tool}: libnvrtc not found in the nvidia-cuda-nvrtc wheel")
    # NVRTC dlopens its builtins by soname: load them first from the wheel's folder.
    for builtins in glob.glob(os.path.join(os.path.dirname(libs[0]), "libnvrtc-builtins.so.*")):
        if ".alt." not in builtins:
            ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(libs[0]), libs[0]


def source(kernels, name):
    """Kernel source `name` as the backend compiles it (crates/nuvec/src/backends/cuda/mod.rs:
    common.cuh, then the source)."""
    prelude = open(os.path.join(kernels, "common.cuh")).read()
    return f'{prelude}\n#line 1 "{name}"\n' + open(os.path.join(kernels, name)).read()


def compile_src(nvrtc, name, src, opts):
    """(compiled, log, PTX) of `src` under NVRTC options `opts`."""
    prog = ctypes.c_void_p()
    err = nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None)
    if err:
        return False, f"nvrtcCreateProgram error {err}", ""
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    err = nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    ptx = ""
    if err == 0:
        nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetPTX(prog, buf)
        ptx = buf.value.decode()
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return err == 0, log.value.decode(errors="replace"), ptx
