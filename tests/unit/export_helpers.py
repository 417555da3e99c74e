"""Checkpoints and targets for the export tests: tiny, random, made in a tmp dir."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from blockdraft.models import build_draft
from blockdraft.models.io import save_draft
from blockdraft.models.resolve import DraftConfig, resolve_draft_config
from blockdraft.models.tiny_target import tiny_config

MASK_ID = 262  # <|reserved_2|> of the tiny tokenizer: never pad, eos or bos
TINY_VOCAB = 268  # what save_tiny_target writes (the tiny tokenizer's size)


def draft_config(kind: str = "dflash", target_kwargs: dict | None = None, **overrides):
    settings = dict(kind=kind, num_layers=2, block_size=4, mask_token_id=MASK_ID, target_layer_ids=[1, 3], conv_group_size=8)
    settings.update(overrides)
    target = tiny_config("qwen3", **{"vocab_size": TINY_VOCAB, **(target_kwargs or {})})
    return resolve_draft_config(DraftConfig(**settings), target)


def make_draft(kind: str = "dflash", seed: int = 1, **overrides):
    """A draft whose DFlash2 parts, Domino head and DSpark Markov head are moved off their fresh
    identity, so a round trip that dropped them would change the output."""
    torch.manual_seed(seed)
    draft = build_draft(draft_config(kind, **overrides))
    with torch.no_grad():
        for name, param in draft.named_parameters():
            if "_conv." in name or "candidate_selector." in name or name.startswith(("correction.", "markov_head.")):
                param.normal_(0.0, 0.1)
    return draft


def make_run(root: Path, kind: str = "dflash", step: int = 10, target_path: str | None = None, **overrides):
    """A run dir as training leaves it: config.yaml, metrics.jsonl, checkpoints/step_<N>/."""
    draft = make_draft(kind, **overrides)
    step_dir = root / "checkpoints" / f"step_{step}"
    save_draft(step_dir, draft)
    config_yaml = f"target:\n  path: {target_path or '/nonexistent/target'}\ndata:\n  train: data/train.jsonl\n"
    (step_dir / "config.yaml").write_text(config_yaml)
    (step_dir / "trainer_state.pt").write_bytes(b"")
    (root / "config.yaml").write_text(config_yaml)
    metrics = [
        {"step": step - 5, "loss": 2.0, "accept_len": 1.25},
        {"step": step, "split": "val", "val/accept_len": 1.75},
        {"step": step, "loss": 1.5, "accept_len": 1.5},
        {"step": step + 5, "loss": 1.0, "accept_len": 3.0},  # after the checkpoint: not its metric
    ]
    (root / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return step_dir, draft
