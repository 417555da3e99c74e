"""A target directory's fingerprint: what says a rerun meets the same model, weights included.

Hashing every byte of a 16 GB target would cost a rerun minutes before its first cached stage,
so each weight file contributes its name, its size, its safetensors header (every tensor's
name, dtype, shape and offsets) and SAMPLES evenly spaced windows of its bytes. New weights of
the same architecture (a fine-tune written over the old files) change every window; a copy of
the same files elsewhere, or the same files touched, changes nothing. Measured on a 16 GB
target laid out as Qwen3-8B's five shards in docs/benchmarks-history.md (scripts/bench/bench_fingerprint.py).
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

# The small files that change what the target computes or how text becomes tokens.
TEXT_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
SAMPLES = 16
WINDOW = 64 * 1024
MAX_HEADER = 100 * 2**20  # safetensors caps its header at 100 MB


def target_fingerprint(target_dir) -> str:
    root = Path(target_dir)
    digest = hashlib.sha256()
    for name in TEXT_FILES:
        path = root / name
        if path.is_file():
            digest.update(f"{name}\0".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    weights = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    for path in weights:
        digest.update(f"{path.relative_to(root)}\0{path.stat().st_size}\0".encode())
        with open(path, "rb") as fh:
            _weights_digest(fh, path.stat().st_size, path.suffix == ".safetensors", digest)
    return digest.hexdigest()[:16]


def _weights_digest(fh, size: int, safetensors: bool, digest) -> None:
    if safetensors and size >= 8:
        (length,) = struct.unpack("<Q", fh.read(8))
        if length <= min(MAX_HEADER, size - 8):
            digest.update(fh.read(length))
    for i in range(SAMPLES):
        fh.seek(max(0, (size - WINDOW) * i // max(1, SAMPLES - 1)))
        digest.update(fh.read(WINDOW))
