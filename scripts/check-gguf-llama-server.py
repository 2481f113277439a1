"""llama.cpp itself on a GGUF record (scripts/oracle/more/gguf_*.py): llama-server's tokenization
of the record's tokenizer_cases.json, its first-token probabilities and its 16 greedy tokens,
printed beside the mlx-lm oracle recorded with the file. It checks that the file means to
llama.cpp what the oracle computed (a record written with a wrong convention loads in nuvec and
mlx-lm alike, and only llama.cpp would tell).

    python check-gguf-llama-server.py LLAMA_SERVER CASE_DIR PORT

LLAMA_SERVER: bench/compare-serve builds one (~/.cache/nuvec/llama-server-0.3.36-cpu-noamx/bin/).
Run by hand; the test suite does not (it would build llama.cpp)."""
import json, subprocess, sys, time, urllib.request
import numpy as np
from safetensors.numpy import load_file

server, case_dir, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
p = subprocess.Popen([server, "-m", f"{case_dir}/model.gguf", "--port", str(port), "-t", "2", "-c", "512",
                      "-np", "1", "--no-warmup"], stdout=subprocess.DEVNULL, stderr=open(f"/tmp/llama-{port}.log", "w"))
def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=120))
try:
    for _ in range(240):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2); break
        except Exception:
            time.sleep(0.5)
    oracle = json.load(open(f"{case_dir}/oracle.json"))
    cases = json.load(open(f"{case_dir}/tokenizer_cases.json"))
    bad = 0
    for c in cases:
        got = post("/tokenize", {"content": c["text"], "add_special": False, "parse_special": True})["tokens"]
        if got != c["ids"]:
            bad += 1
            print("TOKENIZE DIFF", repr(c["text"]), got, c["ids"])
    print(f"tokenize: {len(cases) - bad}/{len(cases)} equal to transformers")
    prompt = oracle["prompt_ids"]
    r = post("/completion", {"prompt": prompt, "n_predict": 16, "temperature": 0, "n_probs": 8,
                             "cache_prompt": False, "ignore_eos": True, "return_tokens": True})
    tokens = r.get("tokens")
    print("llama.cpp greedy:", tokens)
    print("mlx-lm greedy:   ", oracle["greedy_tokens"][:16])
    first = load_file(f"{case_dir}/oracle.safetensors")["first_logits"].astype(np.float64)
    probs = np.exp(first - first.max()); probs /= probs.sum()
    top = np.argsort(-probs)[:8]
    print("mlx-lm first top:", [(int(i), round(float(probs[i]), 4)) for i in top])
    cp = r["completion_probabilities"][0]
    cands = cp.get("top_logprobs") or cp.get("probs")
    print("llama.cpp first top:", [(c.get("id"), round(float(np.exp(c["logprob"])) if "logprob" in c else c.get("prob"), 4)) for c in cands])
finally:
    p.terminate(); p.wait()
