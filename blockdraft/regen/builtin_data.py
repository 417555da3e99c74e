"""Data a recipe makes for itself: its built-in prompts answered by the target into data.train / data.val, when
those files are missing (recipes like tiny_cpu). Both the capture and training start from it, so it sits in the
regen stage below them; rank 0 answers with the whole target while the other ranks wait."""

from __future__ import annotations

import json
from pathlib import Path

from blockdraft.data.builtin_prompts import builtin_prompt_set
from blockdraft.errors import ConfigError
from blockdraft.ranks.distributed import DistInfo, patient_barrier


def ensure_builtin_data(cfg, target_model, tokenizer, dist: DistInfo) -> None:
    """Recipes like tiny_cpu answer built-in prompts with the target when the files are missing."""
    from blockdraft.regen.hf_backend import regenerate_with_transformers

    prep = cfg.prepare
    if prep.regenerate_builtin is None:
        return
    if dist.is_main:
        splits = [(cfg.data.train, 0, prep.num_train), (cfg.data.val, prep.num_train, prep.num_val)]
        for path, skip, n in splits:
            if path and not _complete(Path(path), n):
                prompts = builtin_prompt_set(prep.regenerate_builtin, n, skip=skip)
                regenerate_with_transformers(target_model, tokenizer, prompts, path, prep.max_new_tokens,
                                             chat_template_kwargs=dict(cfg.data.chat_template_kwargs), progress=cfg.train.progress)
    patient_barrier("rank 0 answering the recipe's built-in prompts")


def refuse_builtin_data_by_shard(cfg) -> None:
    """A recipe's built-in prompts are answered by rank 0 with the whole target, which a target loaded by shard
    never is on any rank: said before anything loads."""
    prep = cfg.prepare
    if prep.regenerate_builtin is None:
        return
    splits = [(cfg.data.train, prep.num_train), (cfg.data.val, prep.num_val)]
    missing = [str(path) for path, n in splits if path and not _complete(Path(path), n)]
    if missing:
        raise ConfigError(
            f"{', '.join(missing)} not answered yet: a recipe's built-in prompts are answered by rank 0 with the whole "
            "target, which distributed.target_sharding=fsdp never loads. Run once with distributed.target_sharding=none "
            "(a built-in recipe's target is small), or give data.train / data.val answered by `python -m blockdraft.regen`."
        )


def _complete(path: Path, n: int) -> bool:
    if not path.exists():
        return False
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    try:
        json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return False
    return len(lines) >= n
