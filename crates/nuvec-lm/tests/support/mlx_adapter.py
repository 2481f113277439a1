"""The oracle of the LoRA / DoRA adapter tests: mlx-lm's own adapter layers, loader and fuse.

  mlx_adapter.py make --model DIR --out ADAPTER_DIR --kind lora|dora [--rank 4] [--scale 2.0]
                      [--num-layers N] [--keys k1,k2] [--seed 0]
      an adapter as `mlx_lm lora --train` leaves it, but with made-up instead of trained values;
      prints {"modules": [...], "tensors": {name: [dtype, shape]}}
  mlx_adapter.py run --model DIR [--adapter-path ADAPTER_DIR] --prompt-ids 1,2,3 --max-tokens 8
      greedy generation after mlx_lm.load(DIR, adapter_path=...);
      prints {"tokens", "logits" (at the last prompt position), "margins" (top1 - top2, per step)}
  mlx_adapter.py fuse --model DIR --adapter-path ADAPTER_DIR --save-path OUT [--dequantize]
      `python -m mlx_lm fuse` as it is; prints {"save_path": OUT}
"""

import argparse
import contextlib
import json
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten


def make(args):
    import mlx_lm.lora as L
    from mlx_lm.tuner.utils import linear_to_lora_layers
    from mlx_lm.utils import load, save_config

    lora_parameters = {"rank": args.rank, "dropout": 0.0, "scale": args.scale}
    if args.keys:
        # `keys` only reaches a real run through the YAML config's lora_parameters.
        lora_parameters["keys"] = args.keys.split(",")
    # adapter_config.json is vars(args) of a real `mlx_lm lora --train` run: its parser's
    # answer for these flags with CONFIG_DEFAULTS filled in, as mlx_lm.lora.main does.
    argv = ["--model", args.model, "--train", "--fine-tune-type", args.kind,
            "--num-layers", str(args.num_layers), "--adapter-path", args.out, "--seed", str(args.seed)]
    config = vars(L.build_parser().parse_args(argv))
    config["lora_parameters"] = lora_parameters
    for k, v in L.CONFIG_DEFAULTS.items():
        if config.get(k) is None:
            config[k] = v

    # What mlx_lm.lora.train_model does before the first step: seed, freeze, convert.
    with contextlib.redirect_stdout(sys.stderr):
        model, _ = load(args.model)
    if args.num_layers > len(model.layers):
        sys.exit(f"--num-layers {args.num_layers}: the model has {len(model.layers)} layers (mlx-lm refuses too)")
    mx.random.seed(args.seed)
    model.freeze()
    linear_to_lora_layers(model, args.num_layers, lora_parameters, use_dora=args.kind == "dora")

    # Training would move lora_b off zero (else the adapter is the identity) and m off the
    # weight's row norms (else DoRA is LoRA renormalised); made-up values that do the same.
    # lora_a keeps the layer's own uniform(+-1/sqrt(in)) draw.
    new = []
    for name, p in tree_flatten(model.trainable_parameters()):
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "lora_b":
            p = (0.05 * mx.random.normal(p.shape)).astype(p.dtype)
        elif leaf == "m":
            p = (p * (1 + 0.1 * mx.random.normal(p.shape))).astype(p.dtype)
        new.append((name, p))
    model.update(tree_unflatten(new))

    # Saved as the trainer saves: every trainable parameter, nothing else.
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(model.trainable_parameters()))
    mx.save_safetensors(str(out / "adapters.safetensors"), weights)
    save_config(config, out / "adapter_config.json")

    modules = sorted({n.rsplit(".", 1)[0] for n in weights})
    kinds = dict(model.named_modules())
    for name in modules:
        print(f"adapter: {name} {type(kinds[name]).__name__}", file=sys.stderr)
    print(json.dumps({"modules": modules,
                      "tensors": {k: [str(v.dtype).split(".")[-1], list(v.shape)] for k, v in weights.items()}}))


def run(args):
    from mlx_lm import load
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler

    with contextlib.redirect_stdout(sys.stderr):
        model, _ = load(args.model, adapter_path=args.adapter_path)
    prompt = mx.array([int(t) for t in args.prompt_ids.split(",")])
    # generate_step yields log-probabilities; a logits processor sees the raw logits of each
    # step (the last position's), before the log-softmax, and passes them on unchanged.
    seen = []
    keep = lambda tokens, logits: seen.append(logits) or logits
    steps = generate_step(prompt, model, max_tokens=args.max_tokens,
                          sampler=make_sampler(0.0), logits_processors=[keep])
    tokens = [int(token) for token, _ in steps]
    margins = []
    for logits in seen[: len(tokens)]:
        top = mx.sort(logits.astype(mx.float32).reshape(-1))[-2:].tolist()
        margins.append(top[1] - top[0])
    print(json.dumps({"tokens": tokens, "logits": seen[0].astype(mx.float32).reshape(-1).tolist(),
                      "margins": margins}))


def fuse(args):
    cmd = [sys.executable, "-m", "mlx_lm", "fuse", "--model", args.model,
           "--adapter-path", args.adapter_path, "--save-path", args.save_path]
    # fuse's progress goes to stdout: to stderr, so that stdout is the answer alone.
    subprocess.run(cmd + (["--dequantize"] if args.dequantize else []), check=True, stdout=sys.stderr)
    print(json.dumps({"save_path": args.save_path}))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--model", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--kind", choices=["lora", "dora"], required=True)
    m.add_argument("--rank", type=int, default=4)
    m.add_argument("--scale", type=float, default=2.0)
    m.add_argument("--num-layers", type=int, default=-1, help="-1 (mlx-lm's 'all') by default")
    m.add_argument("--keys", help="comma-separated; default: mlx-lm's (every linear in a layer)")
    m.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("run")
    r.add_argument("--model", required=True)
    r.add_argument("--adapter-path")
    r.add_argument("--prompt-ids", required=True)
    r.add_argument("--max-tokens", type=int, default=8)
    f = sub.add_parser("fuse")
    f.add_argument("--model", required=True)
    f.add_argument("--adapter-path", required=True)
    f.add_argument("--save-path", required=True)
    f.add_argument("--dequantize", "--de-quantize", action="store_true")
    args = p.parse_args()
    {"make": make, "run": run, "fuse": fuse}[args.cmd](args)


if __name__ == "__main__":
    main()
