"""Driver of bench/compare-serve-workload: writes one open-loop workload per concurrency (the
same file for every engine), runs nuvec's Batcher (prefix cache on and off) and mlx-lm's
BatchGenerator on it alternately, each a fresh process, ROUNDS times, and prints medians,
spread and the ratios last."""

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile

from raw import Raw

METRICS = ["throughput", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99"]


def workload(args, concurrency, path):
    rng = random.Random(args.seed + concurrency)
    vocab = args.vocab
    prefix = [rng.randrange(3, vocab) for _ in range(args.prefix)]
    requests, t = [], 0.0
    for i in range(args.requests_per_slot * concurrency):
        own = [rng.randrange(3, vocab) for _ in range(args.prompt)]
        # Half the requests share the system prefix.
        prompt = prefix + own if i % 2 == 0 else own
        requests.append({"arrival": round(t, 6), "prompt": prompt, "max_tokens": args.gen})
        if args.rate > 0:
            t += rng.expovariate(args.rate)
    json.dump({"concurrency": concurrency, "requests": requests}, open(path, "w"))


def parse(out, what):
    m = re.search(r"Workload results: " + " ".join(f"{k}=([\\d.]+)" for k in METRICS), out)
    if not m:
        sys.exit(f"no results in {what}'s output:\n{out}")
    return dict(zip(METRICS, map(float, m.groups())))


def nuvec(args, path, prefix_cache=True):
    cmd = [args.nuvec, "bench", "--model", args.model, "--workload", path, "--device", args.device]
    if args.device == "cpu":
        cmd += ["--threads", str(args.threads)]
    if not prefix_cache:
        cmd.append("--no-prefix-cache")
    if args.kv_dtype:
        cmd += ["--kv-dtype", args.kv_dtype]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return parse(out, "nuvec"), out


def mlx(args, path):
    cmd = [args.python, os.path.join(os.path.dirname(__file__), "mlx_workload.py"), args.model, path, args.device]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    return parse(out, "mlx-lm"), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="an MLX checkpoint directory both engines load")
    ap.add_argument("--nuvec", required=True)
    ap.add_argument("--python", required=True, help="a python with mlx-lm")
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--prefix", type=int, default=4096)
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--rate", type=float, default=4.0, help="Poisson arrivals per second (0: all at once)")
    ap.add_argument("--requests-per-slot", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-mlx", action="store_true")
    ap.add_argument("--kv-dtype", help="nuvec's cache type (f32, f16, bf16; default: the model's)")
    args = ap.parse_args()
    engines = [("nuvec", lambda p: nuvec(args, p)), ("nuvec-no-prefix", lambda p: nuvec(args, p, False))]
    if not args.skip_mlx:
        engines.append(("mlx-lm", lambda p: mlx(args, p)))
    raw = Raw(f"compare-serve-workload-{args.device}")
    results = {}
    tmp = tempfile.mkdtemp(prefix="nuvec-workload-")
    for c in args.concurrency:
        path = os.path.join(tmp, f"workload-{c}.json")
        workload(args, c, path)
        for r in range(args.rounds):
            order = engines if r % 2 == 0 else engines[::-1]
            for name, run in order:
                m, out = run(path)
                raw.save(f"C{c}-round{r + 1}-{name}", out)
                results.setdefault((c, name), []).append(m)
                print(f"C={c:<3} round {r + 1}: {name:<15} " + " ".join(f"{k}={m[k]:.1f}" for k in METRICS), flush=True)
    print(f"\n{args.device}, prompts {args.prompt} (+{args.prefix} shared by half), {args.gen} generated, "
          f"{args.rate} req/s, {args.requests_per_slot} requests per slot, threads {args.threads}")
    print("medians (min..max) per engine: throughput tok/s; ttft, itl ms")
    med = {}
    for (c, name), ms in sorted(results.items()):
        med[(c, name)] = {k: statistics.median(m[k] for m in ms) for k in METRICS}
        spread = {k: (min(m[k] for m in ms), max(m[k] for m in ms)) for k in METRICS}
        print(f"C={c:<3} {name:<15} " + " ".join(
            f"{k}={med[(c, name)][k]:.1f} ({spread[k][0]:.1f}..{spread[k][1]:.1f})" for k in METRICS))
    print("\nratios (throughput: nuvec / peer, higher is better; ttft and itl: peer / nuvec, higher is better)")
    for c in args.concurrency:
        n = med[(c, "nuvec")]
        for peer in [e for e, _ in engines if e != "nuvec"]:
            p = med[(c, peer)]
            cells = [f"throughput {n['throughput'] / max(p['throughput'], 1e-9):.2f}x"]
            cells += [f"{k} {p[k] / max(n[k], 1e-9):.2f}x" for k in METRICS[1:]]
            print(f"C={c:<3} nuvec vs {peer:<15} " + ", ".join(cells))


if __name__ == "__main__":
    main()
