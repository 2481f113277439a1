"""nuvec vs llama.cpp (llama-cpp-python) on one GGUF, CPU. Run through bench/compare-cpu.

Each measurement runs in its own process; its peak RSS comes from os.wait4 (the kernel's
ru_maxrss of that child). Engines alternate within every round.
"""

import argparse
import os
import random
import re
import statistics
import subprocess
import sys
import time

from raw import Raw, machine

PREFILLS = (512, 2048)
DECODE_PROMPT = 512


def llama_worker(args):
    import llama_cpp
    import numpy as np
    from llama_cpp import Llama

    n_prompt, gen = args.prompt, args.gen
    llm = Llama(
        model_path=args.gguf,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_batch=n_prompt,
        n_ctx=n_prompt + gen + 8,
        verbose=False,
    )
    rng = random.Random(0)
    prompt = [rng.randrange(llm.n_vocab()) for _ in range(n_prompt)]

    def last_argmax():
        ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))))

    def once():
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        prompt_s = time.perf_counter() - t0
        tok = last_argmax()
        t0 = time.perf_counter()
        for _ in range(gen - 1):
            llm.eval([tok])
            tok = last_argmax()
        gen_s = time.perf_counter() - t0
        return n_prompt / prompt_s, (gen - 1) / gen_s if gen > 1 else 0.0

    once()  # warm-up, as nuvec bench does
    p, g = once()
    print(f"RESULT prompt_tps={p:.3f} generation_tps={g:.3f}", flush=True)


def run_measured(cmd):
    """Forks, execs cmd, and reads its rusage with os.wait4 (peak RSS of exactly that child)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(w, 1)
        os.close(r)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        try:
            os.execvp(cmd[0], cmd)
        finally:
            os._exit(127)
    os.close(w)
    chunks = []
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    _, status, usage = os.wait4(pid, 0)
    out = b"".join(chunks).decode()
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"error: {' '.join(cmd)} failed (exit {os.waitstatus_to_exitcode(status)}):\n{out}")
    return out, usage.ru_maxrss * 1024


def measure(engine, args, raw, n_prompt, gen, label):
    if engine.startswith("nuvec"):
        cmd = [args.nuvec, "bench", "--model", args.gguf, "-p", str(n_prompt), "-g", str(gen), "-n", "1",
               "--threads", str(args.threads), "--prefill-step-size", str(max(n_prompt, 512))]
        # nuvec-int8: the same binary with int8 activations in its 4- and 8-bit products.
        knob = "1" if engine == "nuvec-int8" else "0"
        out, rss = run_measured(["env", f"NUVEC_CPU_INT8_DOT={knob}"] + cmd)
        m = re.search(r"Averages: prompt_tps=([\d.]+), generation_tps=([\d.]+)", out)
    else:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--gguf", args.gguf, "--threads",
               str(args.threads), "--prompt", str(n_prompt), "--gen", str(gen)]
        out, rss = run_measured(cmd)
        m = re.search(r"RESULT prompt_tps=([\d.]+) generation_tps=([\d.]+)", out)
    if not m:
        sys.exit(f"error: no result from {engine}:\n{out}")
    raw.save(f"{label}-{engine}-p{n_prompt}-g{gen}", out)
    return float(m.group(1)), float(m.group(2)), rss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--nuvec")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--bandwidth", help="bench/cpu/read_bandwidth.c built: MIB THREADS -> GB/s")
    ap.add_argument("--int8", action="store_true", help="also nuvec with NUVEC_CPU_INT8_DOT=1 (nuvec-int8)")
    args = ap.parse_args()
    if args.worker:
        return llama_worker(args)

    import llama_cpp

    raw = Raw("compare-cpu")
    engines = ["nuvec", "llama.cpp"] + (["nuvec-int8"] if args.int8 else [])
    metrics = {e: {"decode": [], "prefill512": [], "prefill2048": [], "rss": []} for e in engines}
    print(f"model {args.gguf}\nthreads {args.threads}, rounds {args.rounds}, decode {args.gen} tokens after "
          f"{DECODE_PROMPT}; llama-cpp-python {llama_cpp.__version__}", flush=True)
    for rnd in range(args.rounds):
        # Each round starts with the next engine, and odd rounds go backwards: every engine runs
        # before and after every other.
        order = engines[rnd % len(engines):] + engines[:rnd % len(engines)]
        order = order if rnd % 2 == 0 else order[::-1]
        for e in order:
            label = f"round{rnd + 1}"
            _, decode, rss1 = measure(e, args, raw, DECODE_PROMPT, args.gen, label)
            p512, _, rss2 = measure(e, args, raw, 512, 1, label)
            p2048, _, rss3 = measure(e, args, raw, 2048, 1, label)
            m = metrics[e]
            m["decode"].append(decode)
            m["prefill512"].append(p512)
            m["prefill2048"].append(p2048)
            m["rss"].append(max(rss1, rss2, rss3) / 2**20)
            print(f"round {rnd + 1} {e:10s} decode {decode:8.2f} tok/s  prefill512 {p512:8.2f} tok/s  "
                  f"prefill2048 {p2048:8.2f} tok/s  peak RSS {m['rss'][-1]:7.1f} MiB", flush=True)

    print()
    print(f"{'metric':14s} {'engine':10s} {'median':>10s} {'min':>10s} {'max':>10s}")
    for key, unit in [("decode", "tok/s"), ("prefill512", "tok/s"), ("prefill2048", "tok/s"), ("rss", "MiB")]:
        for e in engines:
            v = metrics[e][key]
            print(f"{key:14s} {e:10s} {statistics.median(v):10.2f} {min(v):10.2f} {max(v):10.2f}  {unit}")
    if args.bandwidth:
        # The decode step reads every weight once: bytes per token / read bandwidth bounds it.
        gbs = float(subprocess.run([args.bandwidth, "512", str(args.threads)], capture_output=True, text=True,
                                   check=True).stdout)
        size = os.path.getsize(args.gguf)
        ceiling = gbs * 1e9 / size
        print()
        print(f"read bandwidth at {args.threads} threads {gbs:.1f} GB/s; {size / 1e6:.1f} MB read per token: "
              f"decode ceiling {ceiling:.1f} tok/s")
        for e in engines:
            d = statistics.median(metrics[e]["decode"])
            print(f"  {e:10s} decode at {100 * d / ceiling:5.1f} % of the ceiling")
    print()
    # What ran: the processor's vector extensions, and the instruction sets each engine used.
    print("\n".join(machine().splitlines()[:2]))
    version = subprocess.run([args.nuvec, "--version"], capture_output=True, text=True, check=True).stdout
    print("nuvec:     " + next((l for l in version.splitlines() if l.startswith("cpu:")), version.strip()))
    print("llama.cpp: " + llama_cpp.llama_print_system_info().decode().strip())
    print()
    for e in [e for e in engines if e != "llama.cpp"]:
        print(f"ratios {e} / llama.cpp (medians; decode/prefill: higher is better, RSS: lower is better)")
        for key in ["decode", "prefill512", "prefill2048", "rss"]:
            a, b = statistics.median(metrics[e][key]), statistics.median(metrics["llama.cpp"][key])
            print(f"  {key:12s} {a / b:6.3f}")


if __name__ == "__main__":
    main()
