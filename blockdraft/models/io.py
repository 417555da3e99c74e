"""Draft weights on disk: `model.safetensors` (vLLM's parameter names) + `draft_config.json`.

Training checkpoints hold exactly this for the draft, so export is a rename-free copy
plus vLLM's config.json. Shared tensors are not an issue: the draft owns no embedding.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from blockdraft.integrity import verify_checksums
from blockdraft.models import build_draft
from blockdraft.models.draft_config import DraftModelConfig

WEIGHTS_NAME = "model.safetensors"
DRAFT_CONFIG_NAME = "draft_config.json"


def draft_state_dict(draft, dtype: torch.dtype | None = None) -> dict:
    """The draft's tensors by vLLM name, contiguous (and cast when dtype is given)."""
    module = getattr(draft, "module", draft)  # unwrap DDP
    return {k: (v.to(dtype) if dtype and v.is_floating_point() else v).detach().contiguous().cpu()
            for k, v in module.state_dict().items()}  # integer tables (d2t) keep their dtype


def save_draft(directory: str | Path, draft, dtype: torch.dtype | None = None) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    module = getattr(draft, "module", draft)
    save_file(draft_state_dict(module, dtype), str(directory / WEIGHTS_NAME))
    save_draft_config(directory, module)


def save_draft_config(directory: str | Path, draft) -> None:
    module = getattr(draft, "module", draft)
    (Path(directory) / DRAFT_CONFIG_NAME).write_text(json.dumps(module.config.to_dict(), indent=2))


def as_fp32(state: dict) -> dict:
    """Floating tensors in fp32 (how drafts are built); integer tables (d2t) as they are."""
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}


def load_draft_config(directory: str | Path) -> DraftModelConfig:
    return DraftModelConfig.from_dict(json.loads((Path(directory) / DRAFT_CONFIG_NAME).read_text()))


def load_draft(directory: str | Path, verified: bool = False):
    """Rebuild a draft from a checkpoint directory; every tensor must match by name and shape. A sharded
    checkpoint (train.draft_sharding=fsdp) is read whole on this one process, without a process group.
    `verified`: its checksums were checked already (a resume's ranks check it once between them)."""
    directory = Path(directory)
    if not verified:
        verify_checksums(directory)
    draft = build_draft(load_draft_config(directory))
    from blockdraft.models import sharded_io as shards

    if shards.is_sharded(directory):
        if not verified:
            shards.verify_shards(directory)
        shards.read_shards(directory, draft)
        return draft
    state = load_file(str(directory / WEIGHTS_NAME))
    draft.load_state_dict(as_fp32(state), strict=True)
    return draft
