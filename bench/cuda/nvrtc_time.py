# NVRTC over nuvec's kernel sources on this host's CPU, as the backend compiles them when its kernel
# cache misses (crates/nuvec/src/backends/cuda/mod.rs: common.cuh prepended, compute_90, C++17): each
# source alone, then all of them at once on threads. Takes the CUDA 13 install's libnvrtc (the GPU
# machine's), else the PyPI wheel scripts/check-cuda-kernels.sh installs; the sources and the compile
# call are scripts/nvrtc_wheel.py's. Usage: python3 bench/cuda/nvrtc_time.py crates/nuvec/src/backends/cuda/kernels
import ctypes, glob, os, sys, time, threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from nvrtc_wheel import compile_src, source

cands = glob.glob("/usr/local/cuda*/lib64/libnvrtc.so.13*") + glob.glob("/usr/local/cuda*/targets/*/lib/libnvrtc.so.13*")
cands += glob.glob("/usr/lib/x86_64-linux-gnu/libnvrtc.so.13*")
cands += glob.glob(os.path.expanduser("~/.cache/nuvec/nvrtc-*/lib/python*/site-packages/nvidia/cu13/lib/libnvrtc.so.13"))
cands = [c for c in cands if "builtins" not in c and "alt" not in c]
if not cands:
    sys.exit("nvrtc_time: no CUDA 13 libnvrtc found")
for b in glob.glob(os.path.join(os.path.dirname(cands[0]), "libnvrtc-builtins.so.13*")):
    if ".alt." not in b:
        ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)  # NVRTC opens its builtins by soname
print("libnvrtc", cands[0])
lib = ctypes.CDLL(cands[0])
kernels = sys.argv[1]
opts = ["--gpu-architecture=compute_90", "--std=c++17"]


def compile_one(name):
    t = time.time()
    ok, log, _ = compile_src(lib, name, source(kernels, name), opts)
    return ok, time.time() - t


names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(kernels, "*.cu")))
total = 0.0
for n in names:
    ok, d = compile_one(n)
    total += d
    print(f"{n:22s} {d:6.2f} s ok={ok}")
print("sequential total", round(total, 2))
t = time.time()
results = {}
threads = [threading.Thread(target=lambda n=n: results.__setitem__(n, compile_one(n))) for n in names]
for x in threads:
    x.start()
for x in threads:
    x.join()
failed = [n for n in names if not results.get(n, (False, 0))[0]]
print("all at once on threads", round(time.time() - t, 2), "failed: " + ", ".join(failed) if failed else "all ok")
print("cpus", os.cpu_count())
