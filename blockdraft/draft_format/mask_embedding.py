"""`mask_embedding.pt`: the trained embedding of the MASK slots, where vLLM 0.32 reads it.

vLLM (`qwen3_dflash.py`, `_read_mask_embedding`) loads this file from the draft directory
when it exists, a tensor or `{"mask_token_id": id, "embedding": tensor}` (a mismatching id
is refused), and embeds every slot holding `mask_token_id` with it instead of the target's
row. It must not ride in the safetensors: vLLM drops a `mask_embedding` weight there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from blockdraft.errors import ConfigError

MASK_EMBEDDING_FILE = "mask_embedding.pt"
STATE_NAME = "mask_embedding"  # the draft's parameter, and its name in a checkpoint


def write_mask_embedding(directory: Path, embedding: torch.Tensor, mask_token_id: int) -> None:
    torch.save({"mask_token_id": int(mask_token_id), "embedding": embedding.detach().cpu().contiguous()},
               directory / MASK_EMBEDDING_FILE)


def read_mask_embedding(directory: Path) -> Optional[tuple]:
    """(mask_token_id or None, embedding [H]) from the directory's file, None when it has none."""
    path = Path(directory) / MASK_EMBEDDING_FILE
    if not path.is_file():
        return None
    state = torch.load(path, weights_only=True)
    mask_id = None
    if isinstance(state, dict):
        if "embedding" not in state:
            raise ConfigError(f"{path} is a dict without an `embedding` entry; write {{'mask_token_id': id, 'embedding': tensor}}.")
        mask_id, state = state.get("mask_token_id"), state["embedding"]
    if not isinstance(state, torch.Tensor):
        raise ConfigError(f"{path} holds a {type(state).__name__}, not a tensor; re-export the draft.")
    return mask_id, state.reshape(-1)


def check_mask_token(directory: Path, file_mask_id: Optional[int], config_mask_id: int) -> None:
    if file_mask_id is not None and int(file_mask_id) != int(config_mask_id):
        raise ConfigError(
            f"{Path(directory) / MASK_EMBEDDING_FILE} is for mask_token_id {file_mask_id}, but config.json's "
            f"dflash_config.mask_token_id is {config_mask_id}; vLLM refuses the pair. Re-export the draft."
        )
