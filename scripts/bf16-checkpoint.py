#!/usr/bin/env python3
"""Writes a bfloat16 copy of a float32 safetensors checkpoint, for the GPU parity test's fixtures.

The GPU machine receives at most 64 MiB per call, and the f32 fixtures of the Qwen3.5-MoE and
gpt-oss cases (151936- and 201088-token vocabularies) are larger: their bf16 copies fit.
crates/nuvec-lm/tests/gpu_parity.rs compares the GPU with the CPU on the same checkpoint, so a
cast copy tests the same code paths (with bf16 weights).

Usage: scripts/bf16-checkpoint.py SRC_DIR DST_DIR
Copies config.json, and writes every model*.safetensors tensor of SRC_DIR into DST_DIR/
model.safetensors: F32 tensors rounded to BF16 (round to nearest, ties to even), the others as
they are. Standard library only.
"""

import array
import json
import os
import shutil
import struct
import sys


def tensors(path):
    """(header, data start, file bytes) of one safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    return header, 8 + n, raw


def to_bf16(buf):
    words = array.array("I")
    words.frombytes(buf)
    if sys.byteorder != "little":
        words.byteswap()
    out = array.array("H", [((w + 0x7FFF + ((w >> 16) & 1)) >> 16) & 0xFFFF for w in words])
    if sys.byteorder != "little":
        out.byteswap()
    return out.tobytes()


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    files = sorted(f for f in os.listdir(src) if f.startswith("model") and f.endswith(".safetensors"))
    if not files or not os.path.exists(os.path.join(src, "config.json")):
        sys.exit(f"{src}: no config.json and model*.safetensors here")
    os.makedirs(dst, exist_ok=True)
    shutil.copy(os.path.join(src, "config.json"), dst)
    meta, blobs, offset = {}, [], 0
    for name in files:
        header, start, raw = tensors(os.path.join(src, name))
        for key, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0] if kv[0] != "__metadata__" else -1):
            if key == "__metadata__":
                meta.setdefault("__metadata__", t)
                continue
            a, b = t["data_offsets"]
            data = raw[start + a : start + b]
            dtype = t["dtype"]
            if dtype == "F32":
                data, dtype = to_bf16(data), "BF16"
            meta[key] = {"dtype": dtype, "shape": t["shape"], "data_offsets": [offset, offset + len(data)]}
            blobs.append(data)
            offset += len(data)
    head = json.dumps(meta, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(os.path.join(dst, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for blob in blobs:
            f.write(blob)
    print(f"{dst}/model.safetensors: {offset / 1e6:.1f} MB of tensors")


if __name__ == "__main__":
    main()
