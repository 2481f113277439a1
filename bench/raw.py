"""Every benchmark run keeps its raw output, so a median quoted in docs/benchmarks.md can be
traced to the rounds behind it and to the processor they ran on.

A run of bench/compare-* writes `bench/results/<UTC time>-<name>/` (or under `$BENCH_RESULTS`, or
`$OUT/results` on the GPU machine):
- `machine.txt`: the processor, the vector extensions that decide the CPU kernels (AVX2, AVX-512,
  VNNI, F16C; NEON on ARM), cores, memory, the GPUs, and the commit (with "+ changes" when the
  tree was not clean);
- one file per engine run, named by what it measured and its round, holding that process's
  output as it printed it;
- `summary.txt`: everything the driver printed, the medians and the ratios included.
"""

import datetime
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=ROOT).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine():
    """The lines of machine.txt."""
    lines = []
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    fields = {}
    for line in info.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    model = fields.get("model name") or fields.get("Hardware") or _run(["uname", "-m"])
    family = " ".join(f"{k} {fields[k]}" for k in ("cpu family", "model") if k in fields)
    lines.append(f"processor: {model}" + (f" ({family})" if family else ""))
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    wanted = ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx_vnni", "neon", "asimd"]
    lines.append("vector extensions: " + (" ".join(f for f in wanted if f in flags) or "none of " + " ".join(wanted)))
    lines.append(f"cores: {os.cpu_count()}")
    mem = [line for line in (Path("/proc/meminfo").read_text().splitlines() if Path("/proc/meminfo").exists() else [])
           if line.startswith("MemTotal")]
    if mem:
        lines.append(mem[0])
    gpus = _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    lines.append(f"gpus: {gpus or 'none'}")
    commit = _run(["git", "rev-parse", "HEAD"])
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"])
    lines.append(f"commit: {commit or 'unknown'}" + (" + changes" if dirty else ""))
    lines.append(f"command: {' '.join(sys.argv)}")
    return "\n".join(lines) + "\n"


class _Tee:
    def __init__(self, stream, path):
        self.stream, self.file = stream, open(path, "a", encoding="utf-8")

    def write(self, text):
        self.stream.write(text)
        self.file.write(text)
        return len(text)

    def flush(self):
        self.stream.flush()
        self.file.flush()


class Raw:
    """The results folder of one run; from here on, what the driver prints also goes to its
    summary.txt."""

    def __init__(self, name):
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H%M%SZ")
        # On the GPU machine only what is written under $OUT comes back.
        out = os.environ.get("OUT")
        base = Path(os.environ.get("BENCH_RESULTS") or (Path(out) / "results" if out else ROOT / "bench" / "results"))
        self.dir = base / f"{stamp}-{name}"
        self.dir.mkdir(parents=True, exist_ok=False)
        (self.dir / "machine.txt").write_text(machine())
        sys.stdout = _Tee(sys.stdout, self.dir / "summary.txt")
        print(f"raw outputs in {self.dir}", flush=True)

    def save(self, name, text):
        """Keeps one engine run's output as `<name>.txt`."""
        (self.dir / f"{name}.txt").write_text(text)
