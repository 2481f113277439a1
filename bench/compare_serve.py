"""Driver of bench/compare-serve: the same open-loop HTTP workload against `nuvec serve`,
llama.cpp's `llama-server` and `mlx_lm.server`, each a fresh process per run, alternating over
rounds; prints medians, spread and the ratios last.

The workload for concurrency C: max(C * requests_per_slot, 8) requests, each its own fixed text
prompt (seeded random words, cut to `prompt` tokens by the model's tokenizer), arriving as a
Poisson process at `rate` req/s, at most C in flight (a request that arrives while C are in
flight starts when one ends). Each is POST /v1/completions, greedy, `max_tokens` = gen,
`ignore_eos` (honoured by nuvec and llama-server; mlx_lm.server has no such option, so the
mean tokens per request is printed for every server), streamed with usage.

Measured from the client: TTFT = first text chunk - request sent; ITL = gaps between text
chunks; throughput = tokens generated / (last request done - first request sent).

A fourth engine, `nuvec-batcher`, runs the same requests without HTTP: the texts tokenized by
the MLX copy's tokenizer.json, written as a workload file for `nuvec bench --workload` (the
Batcher in-process, its own timing), so that "nuvec vs nuvec-batcher" is what HTTP costs.
"""

import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from compare_serve_workload import parse as parse_workload
from raw import Raw

METRICS = ["throughput", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "tokens_per_request"]
WORDS = (
    "the of and to in is was for on that with as by at from his her an which are be this had not but they "
    "river mountain city window garden letter morning winter summer music water light stone forest story "
    "people market bridge harbor village kitchen teacher doctor engine paper table history question answer"
).split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompts(args, n, seed):
    """n fixed texts of about args.prompt tokens each (the same texts for every server)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(args.mlx_model, "tokenizer.json"))
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        text = " ".join(rng.choice(WORDS) for _ in range(args.prompt * 2))
        ids = tok.encode(text, add_special_tokens=False).ids[: args.prompt]
        out.append(tok.decode(ids))
    return out


def percentile(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class Server:
    """One server process on a free port, stopped by stop()."""

    def __init__(self, name, cmd, port, env=None):
        self.name, self.port = name, port
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def ready(self, timeout=300):
        start = time.time()
        while time.time() - start < timeout:
            if self.proc.poll() is not None:
                self.fail(f"exited with {self.proc.returncode}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/v1/models")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        self.fail("did not start in time")

    def fail(self, why):
        self.log.seek(0)
        tail = self.log.read().decode(errors="replace")[-3000:]
        self.stop()
        sys.exit(f"{self.name} {why}:\n{tail}")

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def start(args, engine, c):
    port = free_port()
    if engine == "nuvec":
        cmd = [args.nuvec, "serve", "--model", args.gguf, "--port", str(port), "--max-batch", str(max(c, 1)),
               "--threads", str(args.threads)]
        return Server(engine, cmd, port)
    if engine == "llama-server":
        ctx = c * (args.prompt + args.gen + 64)
        cmd = [args.llama_server, "-m", args.gguf, "--port", str(port), "-np", str(c), "-c", str(ctx),
               "-t", str(args.threads), "-tb", str(args.threads), "--no-webui"]
        return Server(engine, cmd, port)
    if engine == "mlx-lm":
        cmd = [args.python, "-m", "mlx_lm", "server", "--model", args.mlx_model, "--port", str(port),
               "--decode-concurrency", str(c), "--prompt-concurrency", str(min(c, 8)), "--max-tokens", str(args.gen)]
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
        return Server(engine, cmd, port, env)
    raise ValueError(engine)


def one(port, prompt, gen):
    """One streamed completion: (sent, [times of text chunks], tokens)."""
    body = json.dumps({
        "prompt": prompt, "max_tokens": gen, "temperature": 0, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
    })
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    sent = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:500]!r}")
    times, usage = [], None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if chunk.get("usage"):
            usage = chunk["usage"].get("completion_tokens")
        for choice in chunk.get("choices") or []:
            if choice.get("text"):
                times.append(time.perf_counter())
    conn.close()
    return sent, times, usage if usage is not None else len(times)


def run_batcher(args, c, texts, arrivals):
    """The requests through `nuvec bench --workload` (the Batcher in-process, no HTTP)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(args.mlx_model, "tokenizer.json"))
    requests = [{"arrival": a, "prompt": tok.encode(t).ids, "max_tokens": args.gen} for t, a in zip(texts, arrivals)]
    with tempfile.TemporaryDirectory(prefix="nuvec-serve-workload-") as tmp:
        path = os.path.join(tmp, "workload.json")
        with open(path, "w") as f:
            json.dump({"concurrency": c, "requests": requests}, f)
        cmd = [args.nuvec, "bench", "--model", args.gguf, "--workload", path, "--threads", str(args.threads)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    m = parse_workload(out, "nuvec bench --workload")
    generated = re.search(r"^Workload: .* generated=(\d+)", out, re.M)
    m["tokens_per_request"] = int(generated.group(1)) / len(requests)
    return m


def run(args, engine, c, texts, arrivals):
    if engine == "nuvec-batcher":
        return run_batcher(args, c, texts, arrivals)
    server = start(args, engine, c)
    try:
        server.ready()
        one(server.port, texts[0], 4)  # warm-up (first-request allocations, lazy loads)
        results = [None] * len(texts)
        slots = threading.Semaphore(c)
        t0 = time.perf_counter()

        def client(i):
            delay = t0 + arrivals[i] - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            with slots:
                results[i] = one(server.port, texts[i], args.gen)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(texts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if any(r is None for r in results):
            server.fail("failed a request (see the traceback above)")
    finally:
        server.stop()
    first = min(r[0] for r in results)
    last = max(r[1][-1] if r[1] else r[0] for r in results)
    tokens = sum(r[2] for r in results)
    ttft = [(r[1][0] - r[0]) * 1e3 for r in results if r[1]]
    itl = [(b - a) * 1e3 for r in results for a, b in zip(r[1], r[1][1:])]
    return {
        "throughput": tokens / (last - first), "ttft_p50": percentile(ttft, 0.5), "ttft_p99": percentile(ttft, 0.99),
        "itl_p50": percentile(itl, 0.5), "itl_p99": percentile(itl, 0.99), "tokens_per_request": tokens / len(results),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--mlx-model", required=True, help="the GGUF converted to MLX (nuvec convert)")
    ap.add_argument("--nuvec", required=True)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--python", required=True, help="a python with mlx-lm")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--rate", type=float, default=4.0, help="Poisson arrivals per second (0: all at once)")
    ap.add_argument("--requests-per-slot", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip", nargs="*", default=[],
                    help="engines to leave out: nuvec, llama-server, mlx-lm, nuvec-batcher")
    args = ap.parse_args()
    engines = [e for e in ["nuvec", "llama-server", "mlx-lm", "nuvec-batcher"] if e not in args.skip]
    raw = Raw("compare-serve")
    results = {}
    with open("/proc/loadavg") as f:
        print(f"load average before: {f.read().split()[:3]}", flush=True)
    for c in args.concurrency:
        n = max(c * args.requests_per_slot, 8)
        texts = prompts(args, n, args.seed + c)
        rng = random.Random(args.seed + 1000 + c)
        arrivals, t = [], 0.0
        for _ in range(n):
            arrivals.append(t)
            if args.rate > 0:
                t += rng.expovariate(args.rate)
        for r in range(args.rounds):
            order = engines if r % 2 == 0 else engines[::-1]
            for name in order:
                m = run(args, name, c, texts, arrivals)
                raw.save(f"C{c}-round{r + 1}-{name}", json.dumps(m, indent=1))
                results.setdefault((c, name), []).append(m)
                print(f"C={c:<3} round {r + 1}: {name:<13} " + " ".join(f"{k}={m[k]:.1f}" for k in METRICS), flush=True)
    with open("/proc/loadavg") as f:
        print(f"load average after: {f.read().split()[:3]}")
    print(f"\ncpu, prompts of {args.prompt} tokens, {args.gen} generated (ignore_eos where honoured), "
          f"{args.rate} req/s Poisson, max(C*{args.requests_per_slot}, 8) requests, threads {args.threads}, "
          f"{args.rounds} rounds")
    print("medians (min..max) per server: throughput generated tok/s; ttft, itl ms; tokens per request")
    med = {}
    for (c, name), ms in sorted(results.items()):
        med[(c, name)] = {k: statistics.median(m[k] for m in ms) for k in METRICS}
        spread = {k: (min(m[k] for m in ms), max(m[k] for m in ms)) for k in METRICS}
        print(f"C={c:<3} {name:<13} " + " ".join(
            f"{k}={med[(c, name)][k]:.1f} ({spread[k][0]:.1f}..{spread[k][1]:.1f})" for k in METRICS))
    if "nuvec" not in engines:
        return
    print("\nratios (throughput: nuvec / peer, higher is better; ttft and itl: peer / nuvec, higher is better)")
    for c in args.concurrency:
        n = med[(c, "nuvec")]
        for peer in [e for e in engines if e != "nuvec"]:
            p = med[(c, peer)]
            cells = [f"throughput {n['throughput'] / max(p['throughput'], 1e-9):.2f}x"]
            cells += [f"{k} {p[k] / max(n[k], 1e-9):.2f}x" for k in METRICS[1:5]]
            print(f"C={c:<3} nuvec vs {peer:<13} " + ", ".join(cells))


if __name__ == "__main__":
    main()
