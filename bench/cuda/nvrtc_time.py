# NVRTC over nuvec's kernel sources on this host's CPU, as the backend compiles them when its kernel
# cache misses (crates/nuvec/src/backends/cuda/mod.rs: common.cuh prepended, compute_90, C++17): each
# source alone, then all of them at once on threads. Needs the CUDA 13 libnvrtc (the GPU machine's
# CUDA install). Usage: python3 bench/cuda/nvrtc_time.py crates/nuvec/src/backends/cuda/kernels
import ctypes, glob, os, sys, time, threading
cands = glob.glob("/usr/local/cuda*/lib64/libnvrtc.so.13*") + glob.glob("/usr/local/cuda*/targets/*/lib/libnvrtc.so.13*") + glob.glob("/usr/lib/x86_64-linux-gnu/libnvrtc.so.13*")
# Else the PyPI wheel scripts/check-cuda-kernels.sh installs (a machine without CUDA).
cands += glob.glob(os.path.expanduser("~/.cache/nuvec/nvrtc-*/lib/python*/site-packages/nvidia/cu13/lib/libnvrtc.so.13"))
cands = [c for c in cands if "builtins" not in c and "alt" not in c]
if not cands:
    sys.exit("nvrtc_time: no CUDA 13 libnvrtc found")
for b in glob.glob(os.path.join(os.path.dirname(cands[0]), "libnvrtc-builtins.so.13*")):
    if ".alt." not in b:
        ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)  # NVRTC opens its builtins by soname
print("libnvrtc", cands[0]); lib = ctypes.CDLL(cands[0])
k = sys.argv[1]; pre = open(os.path.join(k, "common.cuh")).read()
def comp(name):
    src = f'{pre}\n#line 1 "{name}"\n' + open(os.path.join(k, name)).read()
    prog = ctypes.c_void_p(); lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None)
    opts = [b"--gpu-architecture=compute_90", b"--std=c++17"]; arr = (ctypes.c_char_p * 2)(*opts)
    t = time.time(); err = lib.nvrtcCompileProgram(prog, 2, arr); d = time.time() - t
    lib.nvrtcDestroyProgram(ctypes.byref(prog)); return err, d
names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(k, "*.cu")))
tot = 0
for n in names:
    e, d = comp(n); tot += d; print(f"{n:22s} {d:6.2f} s err={e}")
print("sequential total", round(tot, 2))
t = time.time(); ts = [threading.Thread(target=comp, args=(n,)) for n in names]; [x.start() for x in ts]; [x.join() for x in ts]
print("all at once on threads", round(time.time() - t, 2)); print("cpus", os.cpu_count())
