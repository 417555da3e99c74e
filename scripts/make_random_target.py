"""A random-weight copy of a target from its config and tokenizer files alone.

Step times depend on shapes, not on weights: the GPU check trains the demo's recipe on a
SmolLM2-135M of random weights, since the real weights (98 MB even as Q4_1 GGUF) would not travel
with it.

    python scripts/make_random_target.py <dir with config.json + tokenizer files> <out dir>
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch

# Everything of a model directory but its weights.
COPIED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
          "special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt")


def make_random_target(source: Path, out: Path, seed: int = 0) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    if not (source / "config.json").exists():
        raise SystemExit(f"{source} has no config.json: give a model directory (weights are not needed)")
    config = AutoConfig.from_pretrained(source)
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
    args = parser.parse_args(argv)
    print(f"[target] random weights of {args.source} in {make_random_target(args.source, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
