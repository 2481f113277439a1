"""The oracle of tests/perplexity.rs: mlx_lm.perplexity's own load_data and eval_ppl.

  mlx_perplexity.py perm SEED N [N ...]      numpy's legacy permutations, one list per N
  mlx_perplexity.py ppl MODEL DATA_DIR LENGTH SAMPLES BATCH SEED
                                             {"ppl", "se", "windows"} as mlx_lm.perplexity gets them

mlx_lm.perplexity reads a Hugging Face dataset (the `datasets` package, not installed here); its
load_dataset is replaced by the records of DATA_DIR/train.jsonl made into mlx-lm's dataset
classes by mlx-lm's own create_dataset, as its local loader (tuner/datasets.py) does. Everything
after (the seed, the permutation, the windows, the losses) is mlx-lm's code as it runs.
"""

import contextlib
import json
import sys
import types

import numpy as np


def main():
    if sys.argv[1] == "perm":
        seed = int(sys.argv[2])
        out = []
        for n in sys.argv[3:]:
            np.random.seed(seed)
            out.append(np.random.permutation(int(n)).tolist())
        print(json.dumps(out))
        return
    import mlx.core as mx
    import mlx_lm.perplexity as P
    from mlx_lm.tuner.datasets import create_dataset
    from mlx_lm.utils import load

    model_dir, data_dir, length, samples, batch, seed = sys.argv[2:8]
    records = [json.loads(l) for l in open(f"{data_dir}/train.jsonl") if l.strip()]
    P.load_dataset = lambda args, tok: (create_dataset(records, tok, types.SimpleNamespace()), [], [])
    np.random.seed(int(seed))
    mx.random.seed(int(seed))
    # eval_ppl prints its progress on stdout: to stderr, so that stdout is the answer alone.
    with contextlib.redirect_stdout(sys.stderr):
        model, tokenizer = load(model_dir)
        data = P.load_data(tokenizer, data_dir, int(samples), int(length))
        ppl, se = P.eval_ppl(model, data, batch_size=int(batch))
    print(json.dumps({"ppl": ppl, "se": se, "windows": data.tolist()}))


if __name__ == "__main__":
    main()
