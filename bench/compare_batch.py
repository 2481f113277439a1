"""Driver of bench/compare-batch: alternates llama-batched-bench and `nuvec bench -b` per batch
size and round, each a fresh process, and prints medians, spread, then the ratios last."""

import argparse
import re
import statistics
import subprocess
import sys

from raw import Raw


def llama(args, batch):
    cmd = [args.llama, "-m", args.gguf, "-npp", str(args.prompt), "-ntg", str(args.gen), "-npl", str(batch),
           "-c", str(batch * (args.prompt + args.gen) + 16), "-t", str(args.threads), "-tb", str(args.threads)]
    if args.device == "cuda":
        cmd += ["-ngl", "99", "-fa", "on"]
    elif args.llama_fa:
        cmd += ["-fa", args.llama_fa]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    # | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 8 and cells[2] == str(batch) and cells[0] == str(args.prompt):
            return float(cells[7]), out
    sys.exit(f"no result row for B={batch} in llama-batched-bench's output:\n{out}")


def nuvec(args, batch, int8=False):
    # nuvec-int8: the same binary with int8 activations in its 4- and 8-bit products (CPU).
    cmd = ["env", f"NUVEC_CPU_INT8_DOT={1 if int8 else 0}",
           args.nuvec, "bench", "--model", args.gguf, "-p", str(args.prompt), "-g", str(args.gen), "-b", str(batch),
           "-n", "1", "--no-warmup", "--device", args.device]
    if args.device == "cpu":
        cmd += ["--threads", str(args.threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    m = re.search(r"Averages: prompt_tps=[\d.]+, generation_tps=([\d.]+)", out)
    if not m:
        sys.exit(f"no averages in nuvec bench's output:\n{out}")
    return float(m.group(1)), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--nuvec", required=True)
    ap.add_argument("--llama", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    # llama.cpp's flash attention on the CPU (on, off, or its own default, auto): which is faster
    # depends on the machine, so the peer is run as it decodes fastest there.
    ap.add_argument("--llama-fa", default="")
    ap.add_argument("--int8", action="store_true", help="also nuvec with NUVEC_CPU_INT8_DOT=1 (nuvec-int8)")
    args = ap.parse_args()
    raw = Raw(f"compare-batch-{args.device}")
    results = {}
    for batch in args.batches:
        for r in range(args.rounds):
            # Alternate which engine goes first, so drift hits both alike.
            order = [("llama.cpp", llama), ("nuvec", nuvec)]
            if args.int8:
                order.append(("nuvec-int8", lambda a, b: nuvec(a, b, int8=True)))
            if r % 2:
                order.reverse()
            for name, run in order:
                tps, out = run(args, batch)
                raw.save(f"B{batch}-round{r + 1}-{name}", out)
                results.setdefault((batch, name), []).append(tps)
                print(f"B={batch:<3} round {r + 1}: {name:<10} {tps:9.1f} generated tok/s", flush=True)
    print(f"\n{args.device}, prompt {args.prompt}, generated {args.gen} per sequence, threads {args.threads}")
    names = ["llama.cpp", "nuvec"] + (["nuvec-int8"] if args.int8 else [])
    for batch in args.batches:
        for name in names:
            v = results[(batch, name)]
            print(f"B={batch:<3} {name:<10} median {statistics.median(v):9.1f}  (min {min(v):.1f}, max {max(v):.1f})")
    for name in names[1:]:
        print(f"\nratios {name} / llama.cpp (total generated tok/s, medians):")
        for batch in args.batches:
            a = statistics.median(results[(batch, name)])
            b = statistics.median(results[(batch, "llama.cpp")])
            print(f"B={batch:<3} {a / b:.2f}x")


if __name__ == "__main__":
    main()
