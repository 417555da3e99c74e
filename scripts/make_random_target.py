"""A random-weight copy of a target from its config and tokenizer files alone.

Step times depend on shapes, not on weights: the GPU check trains the demo's recipe on a
SmolLM2-135M of random weights, since the real weights (98 MB even as Q4_1 GGUF) would not travel
with it.

    python scripts/make_random_target.py <dir with config.json + tokenizer files> <out dir>
    python scripts/make_random_target.py <tokenizer dir> <out dir> --qwen3 WIDTH,HEADS,KV_HEADS,HEAD_DIM,INTERMEDIATE,LAYERS

With --qwen3 the target is a Qwen3 of that shape with the source's tokenizer, vocabulary and special
tokens (the GPU pipeline run's 0.5B target: the Qwen3-0.6B shape with SmolLM2's tokenizer).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Optional

import torch

# Everything of a model directory but its weights.
COPIED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
          "special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt")


def qwen3_config(source: Path, shape: str):
    """A Qwen3 config of `shape` (width,heads,kv_heads,head_dim,intermediate,layers) with the source's vocabulary."""
    from transformers import AutoConfig, Qwen3Config

    width, heads, kv_heads, head_dim, intermediate, layers = (int(x) for x in shape.split(","))
    own = AutoConfig.from_pretrained(source)
    return Qwen3Config(vocab_size=own.vocab_size, hidden_size=width, intermediate_size=intermediate,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                       head_dim=head_dim, max_position_embeddings=8192, rope_theta=1_000_000.0, tie_word_embeddings=True,
                       bos_token_id=own.bos_token_id, eos_token_id=own.eos_token_id, pad_token_id=own.pad_token_id,
                       architectures=["Qwen3ForCausalLM"])


def make_random_target(source: Path, out: Path, seed: int = 0, qwen3: Optional[str] = None) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    if not (source / "config.json").exists():
        raise SystemExit(f"{source} has no config.json: give a model directory (weights are not needed)")
    config = qwen3_config(source, qwen3) if qwen3 else AutoConfig.from_pretrained(source)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in COPIED:
        if (source / name).exists() and name != "config.json":
            shutil.copy2(source / name, out / name)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--qwen3", help="WIDTH,HEADS,KV_HEADS,HEAD_DIM,INTERMEDIATE,LAYERS: a Qwen3 of this shape instead")
    args = parser.parse_args(argv)
    out = make_random_target(args.source, args.out, qwen3=args.qwen3)
    print(f"[target] random weights of {args.qwen3 and f'a Qwen3 {args.qwen3} with the vocabulary of ' or ''}{args.source} in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
