"""Tiny random Qwen3 / Qwen3-MoE targets built from a config, for tests and the tiny_cpu recipe.

Nothing is downloaded: the weights are random (seeded) and the tokenizer is the
project's own byte-level tokenizer, so a target directory can be made anywhere offline.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch


def tiny_config(arch: str = "qwen3", vocab_size: int = 272, num_layers: int = 6, hidden_size: int = 64):
    from transformers import Qwen3Config, Qwen3MoeConfig

    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        # head_dim 32: the smallest vLLM's CPU attention accepts, so tiny targets can be served.
        num_attention_heads=hidden_size // 32,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    )
    if arch == "qwen3":
        return Qwen3Config(architectures=["Qwen3ForCausalLM"], **common)
    if arch == "qwen3_moe":
        return Qwen3MoeConfig(
            architectures=["Qwen3MoeForCausalLM"],
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=hidden_size,
            decoder_sparse_step=1,
            **common,
        )
    raise ValueError(f"unknown tiny target arch {arch!r}; use 'qwen3' or 'qwen3_moe'")


def build_tiny_model(arch: str = "qwen3", seed: int = 0, **kwargs):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(arch, **kwargs)
    return AutoModelForCausalLM.from_config(config).eval()


def _speak_printable_ascii(model, keep: set) -> None:
    """Zero the head rows of every token but printable ASCII (and `keep`).

    A random model's argmax then always lands on a printable character (some of ~95 random
    logits is > 0 = the zeroed ones), so its greedy text decodes and re-tokenises to the very
    ids it generated: data regenerated as text stays what the target actually said.
    """
    allowed = set(range(ord(" "), ord("~") + 1)) | keep
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        for token in range(head.shape[0]):
            if token not in allowed:
                head[token].zero_()


def save_tiny_target(path: str | os.PathLike, arch: str = "qwen3", seed: int = 0, **kwargs) -> Path:
    """Write a loadable HF directory (model + tokenizer with chat template). Idempotent."""
    from blockdraft.data.tiny_tokenizer import build_tiny_tokenizer

    path = Path(path)
    if (path / "config.json").exists():
        return path
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(arch, seed, vocab_size=len(tokenizer), **kwargs)
    _speak_printable_ascii(model, keep={tokenizer.eos_token_id})
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id = tokenizer.eos_token_id
    model.config.bos_token_id = None
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    os.replace(tmp, path)
    return path
