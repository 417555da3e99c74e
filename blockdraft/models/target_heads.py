"""The two pieces of the target a draft borrows (input embeddings and LM head), read
straight from the target's safetensors: training from a feature store never builds the
target's decoder layers, so it needs neither their memory nor their load time.

Stands in for `TargetModel` wherever only `embed_tokens` / `lm_head_weight` are used.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict

import torch
from safetensors import safe_open
from torch import nn

from blockdraft.errors import ConfigError
from blockdraft.models.target_families import family_of


def tensor_files(directory: Path) -> Dict[str, Path]:
    """Tensor name -> the safetensors file holding it (single file or HF sharded index)."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: directory / file for name, file in weight_map.items()}
    single = directory / "model.safetensors"
    if not single.is_file():
        raise ConfigError(
            f"target.path={directory} has no model.safetensors (or sharded index); training from a "
            "feature store reads the target's embeddings and head from safetensors. Save the target with "
            "`save_pretrained(..., safe_serialization=True)`."
        )
    with safe_open(str(single), framework="pt") as f:
        return {name: single for name in f.keys()}


def _read(files: Dict[str, Path], keys, what: str, directory: Path) -> torch.Tensor:
    for key in keys:
        if key in files:
            with safe_open(str(files[key]), framework="pt") as f:
                return f.get_tensor(key)
    raise ConfigError(f"target.path={directory}: no {what} tensor (looked for {list(keys)}); is it a causal LM directory?")


def read_tensors(files: Dict[str, Path], names) -> Dict[str, torch.Tensor]:
    """Only the named tensors, each file opened once (a sharded target keeps the rest on disk)."""
    by_file: Dict[Path, list] = {}
    for name in names:
        by_file.setdefault(files[name], []).append(name)
    out = {}
    for path, wanted in by_file.items():
        with safe_open(str(path), framework="pt") as f:
            out.update({name: f.get_tensor(name) for name in wanted})
    return out


class TargetHeads:
    """`embed_tokens` (frozen nn.Embedding) and `lm_head_weight` of a target directory."""

    def __init__(self, embed_weight: torch.Tensor, head_weight: torch.Tensor):
        self.embed_tokens = nn.Embedding.from_pretrained(embed_weight, freeze=True)
        # A tied head is the embedding table itself, as in the loaded model.
        self.lm_head_weight = self.embed_tokens.weight if head_weight is embed_weight else head_weight.requires_grad_(False)

    @classmethod
    def load(cls, path, device="cpu", dtype=torch.float32) -> "TargetHeads":
        directory = Path(path)
        config = json.loads((directory / "config.json").read_text())
        family = family_of(config.get("architectures"))
        files = tensor_files(directory)
        embed = _read(files, family.embed_keys, "input embedding", directory).to(device=device, dtype=dtype)
        text = config.get("text_config") or {}  # a multimodal config may keep the tie inside
        tied = config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
        tied = tied or not any(k in files for k in family.head_keys)
        head = embed if tied else _read(files, family.head_keys, "LM head", directory).to(device=device, dtype=dtype)
        return cls(embed, head)

    @property
    def vocab_size(self) -> int:
        return self.embed_tokens.weight.shape[0]
