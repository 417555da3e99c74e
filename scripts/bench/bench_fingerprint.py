"""What the pipeline's target fingerprint costs on a target laid out as Qwen3-8B's shards (16 GB of
bfloat16 in five safetensors files), against hashing every byte, both from a cold page cache.

    .venv/bin/python scripts/bench/bench_fingerprint.py [--dir /tmp/fingerprint-target] [--keep]

The shards hold real safetensors headers (Qwen3-8B's tensor names, shapes and offsets) over
pseudo-random bytes; each file's pages are dropped from the page cache (posix_fadvise) before
each measurement. It writes ~16 GB, and removes them afterwards unless --keep.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import struct
import sys
import time
from pathlib import Path

# publish first: where no blockdraft is installed, it puts this checkout's on the path.
from publish import command_line, provenance
from blockdraft.models.target_fingerprint import target_fingerprint

LAYERS, HIDDEN, INTER, VOCAB, KV, HEAD = 36, 4096, 12288, 151936, 8, 128
SHARDS = 5


def qwen3_8b_tensors() -> list:
    out = [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", (HIDDEN, HIDDEN)), (p + "self_attn.k_proj.weight", (KV * HEAD, HIDDEN)),
                (p + "self_attn.v_proj.weight", (KV * HEAD, HIDDEN)), (p + "self_attn.o_proj.weight", (HIDDEN, HIDDEN)),
                (p + "self_attn.q_norm.weight", (HEAD,)), (p + "self_attn.k_norm.weight", (HEAD,)),
                (p + "mlp.gate_proj.weight", (INTER, HIDDEN)), (p + "mlp.up_proj.weight", (INTER, HIDDEN)),
                (p + "mlp.down_proj.weight", (HIDDEN, INTER)), (p + "input_layernorm.weight", (HIDDEN,)),
                (p + "post_attention_layernorm.weight", (HIDDEN,))]
    return out + [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (VOCAB, HIDDEN))]


def nbytes(shape) -> int:
    n = 2
    for d in shape:
        n *= d
    return n


def write_target(root: Path) -> int:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "hidden_size": HIDDEN}))
    tensors = qwen3_8b_tensors()
    total = sum(nbytes(s) for _, s in tensors)
    block = os.urandom(64 * 2**20)
    shards, current, size = [], [], 0
    for name, shape in tensors:
        if size > total / SHARDS and len(shards) < SHARDS - 1:
            shards.append(current)
            current, size = [], 0
        current.append((name, shape))
        size += nbytes(shape)
    shards.append(current)
    for number, shard in enumerate(shards, start=1):
        header, offset = {}, 0
        for name, shape in shard:
            header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes(shape)]}
            offset += nbytes(shape)
        encoded = json.dumps(header).encode()
        encoded += b" " * (-len(encoded) % 8)
        with open(root / f"model-{number:05d}-of-{SHARDS:05d}.safetensors", "wb") as fh:
            fh.write(struct.pack("<Q", len(encoded)) + encoded)
            left = offset
            while left:
                fh.write(block[:min(left, len(block))])
                left -= min(left, len(block))
            fh.flush()
            os.fsync(fh.fileno())
    return total


def drop_cache(root: Path) -> None:
    for path in root.iterdir():
        with open(path, "rb") as fh:
            os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def full_hash(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.iterdir()):
        with open(path, "rb") as fh:
            while chunk := fh.read(16 * 2**20):
                digest.update(chunk)
    return digest.hexdigest()


def timed(fn, root: Path, repeats: int) -> list:
    seconds = []
    for _ in range(repeats):
        drop_cache(root)
        began = time.perf_counter()
        fn(root)
        seconds.append(time.perf_counter() - began)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/fingerprint-target")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    root = Path(args.dir)
    began = time.perf_counter()
    total = write_target(root)
    print(f"wrote {total / 1e9:.2f} GB in {SHARDS} shards in {time.perf_counter() - began:.0f} s", flush=True)
    try:
        sampled = timed(target_fingerprint, root, args.repeats)
        whole = timed(full_hash, root, 1)
    finally:
        if not args.keep:
            shutil.rmtree(root)
    median = sorted(sampled)[len(sampled) // 2]
    print(provenance(command_line()))
    print(f"target fingerprint (headers + sizes + 16 x 64 KiB windows per file), cold cache: median {median * 1000:.1f} ms "
          f"(runs {', '.join(f'{s * 1000:.1f}' for s in sampled)} ms)")
    print(f"sha256 of every byte, cold cache: {whole[0]:.1f} s ({total / whole[0] / 1e9:.2f} GB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
