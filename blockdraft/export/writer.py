"""Export a training checkpoint as a directory vLLM serves directly.

Everything is written to `<out>.tmp`, checked there (the contract on the names and
shapes as stored, then a reload through the importer comparing logits with the trained
module), given checksums.json over every file (the importer verifies it), and only then
renamed to `<out>`. A failed or killed export leaves nothing half-written under `<out>`,
deletes nothing that was there, and keeps what it wrote as `<out>.failed` (or `<out>.tmp`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Dict, List, Optional

import torch
from safetensors.torch import save_file

from blockdraft import faults
from blockdraft.build_info import build_info
from blockdraft.disk_full import disk_full, is_disk_full
from blockdraft.draft_format.config_reader import draft_config_from_vllm_config
from blockdraft.draft_format.contract import ContractError, check_state_dict
from blockdraft.draft_format.importer import CONFIG_NAME, INDEX_NAME, WEIGHTS_NAME, import_draft, read_config, tensor_headers
from blockdraft.draft_format.mask_embedding import STATE_NAME, write_mask_embedding
from blockdraft.durable import fsync_dir, fsync_tree
from blockdraft.errors import ConfigError
from blockdraft.export.export_info import EXPORT_INFO
from blockdraft.export.model_card import model_card
from blockdraft.export.reload_check import DTYPES, ReloadResult, reload_check
from blockdraft.export.source import CheckpointSource, resolve_checkpoint
from blockdraft.export.target_checks import check_against_target, target_text_config
from blockdraft.export.training_prompts import copy_record
from blockdraft.export.vllm_config import fields_not_written, vllm_config
from blockdraft.integrity import write_checksums
from blockdraft.models.draft_config import DraftModelConfig
from blockdraft.models.io import DRAFT_CONFIG_NAME, draft_state_dict, load_draft, load_draft_config

# In a staging directory from its creation until the export's own files mark it (EXPORT_INFO): only a directory
# holding one of the two is this exporter's to delete.
STAGING_MARKER = ".blockdraft_export_staging"
DEFAULT_SHARD_SIZE = 5 * 2**30
# Written to config.json but legitimately not read back equal (the target may raise it).
NOT_ROUND_TRIPPED = ("max_position_embeddings", "forbidden_mask_ids", "train_mask_embedding")  # the last: mask_embedding.pt


class ExportCheckError(ValueError):
    """The written export does not reproduce the checkpoint; kept as `<out>.failed`."""


def export_draft(
    checkpoint: str | Path,
    out_dir: str | Path,
    dtype: str = "bfloat16",
    target_dir: Optional[str | Path] = None,
    overwrite: bool = False,
    shard_size_bytes: int = DEFAULT_SHARD_SIZE,
) -> Path:
    """Write the checkpoint (a step dir, a run dir's latest, or another stack's draft directory) to `out_dir`;
    returns `out_dir`."""
    out = Path(out_dir).absolute()
    check_dtype(dtype)
    check_out_dir(out, overwrite)
    imported = is_other_stacks_draft(Path(checkpoint))
    if imported:  # read, and checked against the contract, by the importer
        source = CheckpointSource(path=Path(checkpoint).absolute(), step=None, run_dir=None)
        draft, cfg = import_draft(checkpoint)
    else:
        source = resolve_checkpoint(checkpoint)
        cfg = load_draft_config(source.path)
        check_state_dict(checkpoint_shapes(source.path), cfg, where=f"checkpoint {source.path}")
    target_config = None
    if target_dir is not None:
        check_against_target(cfg, target_dir)
        target_config = target_text_config(Path(target_dir))
    if not imported:  # after the checks: the weights are the heavy part
        draft = load_draft(source.path)

    staging = fresh_staging_dir(out)
    try:
        write_export(staging, draft, cfg, target_config, dtype, shard_size_bytes)
        faults.point("export.after_weights")
        (staging / "README.md").write_text(model_card(cfg, source, out, _target_label(target_dir, source), dtype))
        prompts = copy_record(source, staging)
        result = verify_export(staging, draft, cfg, dtype)
        write_export_info(staging, cfg, source, dtype, target_dir, result, prompts)
        (staging / STAGING_MARKER).unlink()  # EXPORT_INFO marks it from here on; vLLM gets no stray file
        write_checksums(staging)  # last: it covers every file above; the importer verifies them
    except Exception as err:
        if is_disk_full(err):  # nothing to inspect in a cut-short copy: its space is freed instead
            shutil.rmtree(staging, ignore_errors=True)
            raise disk_full(err, f"the export staged at {staging}", f"it was removed and nothing under {out} changed",
                            "rerun the same export") from None
        failed = _keep_failed(staging, out)
        if isinstance(err, (ExportCheckError, ContractError, ConfigError)):
            raise ExportCheckError(f"{err}\nThe export was kept for inspection at {failed}; nothing under {out} changed.") from err
        raise
    fsync_tree(staging)  # the export is on disk before its name says it is there
    faults.point("export.before_rename")
    publish(staging, out)
    return out


def is_other_stacks_draft(path: Path) -> bool:
    """A draft directory with a config.json and no training checkpoint (speculators', another stack's, or an
    export): re-exported through the importer, so that it serves as it was trained."""
    return (path / CONFIG_NAME).is_file() and not (path / DRAFT_CONFIG_NAME).is_file()


def check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise ConfigError(f"dtype={dtype!r} is not supported; use one of {sorted(DTYPES)} (bfloat16 for GPUs, float32 for vLLM on CPU).")


def check_out_dir(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out={out} is a file; give a directory path for the export.")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ConfigError(
            f"out={out} is not empty; choose a new directory, or pass overwrite=true to replace it "
            "(it is replaced only once the new export has passed its checks)."
        )
    if out.is_dir() and any(out.iterdir()) and not written_here(out):
        raise ConfigError(
            f"out={out} holds files no export wrote (it has no {EXPORT_INFO}), and overwrite=true replaces only an "
            "export; nothing was deleted. Choose a new directory for the export, or move those files away yourself."
        )
    staging = staging_dir(out)
    if staging.exists() and any(staging.iterdir()) and not written_here(staging):
        raise ConfigError(
            f"{staging} exists and holds files no export wrote (no {STAGING_MARKER} or {EXPORT_INFO}); the export "
            f"stages its files there. Move it away, or choose another out; nothing was deleted."
        )


def written_here(directory: Path) -> bool:
    """An export, or an export's staging directory: what this exporter may replace or delete."""
    return (directory / EXPORT_INFO).is_file() or (directory / STAGING_MARKER).is_file()


def staging_dir(out: Path) -> Path:
    return out.with_name(out.name + ".tmp")


def fresh_staging_dir(out: Path) -> Path:
    staging = staging_dir(out)
    # One left over is a killed export of the same out (check_out_dir refused one that is not).
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    (staging / STAGING_MARKER).touch()
    return staging


def write_export(directory: Path, draft, cfg: DraftModelConfig, target_config, dtype: str, shard_size_bytes: int) -> None:
    config = vllm_config(cfg, target_config, dtype)
    (directory / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
    state = draft_state_dict(draft, DTYPES[dtype])
    if STATE_NAME in state:  # vLLM reads it only from its own file
        write_mask_embedding(directory, state.pop(STATE_NAME), cfg.mask_token_id)
    write_weights(directory, state, shard_size_bytes)


def write_weights(directory: Path, state: Dict[str, torch.Tensor], shard_size_bytes: int) -> None:
    """One model.safetensors, or shards plus the HF index when the total exceeds the threshold."""
    metadata = {"format": "pt"}
    total = sum(t.numel() * t.element_size() for t in state.values())
    if total <= shard_size_bytes:
        save_file(state, str(directory / WEIGHTS_NAME), metadata=metadata)
        return
    shards = plan_shards(state, shard_size_bytes)
    weight_map = {}
    for i, names in enumerate(shards, start=1):
        filename = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: state[k] for k in names}, str(directory / filename), metadata=metadata)
        weight_map.update({k: filename for k in names})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")


def plan_shards(state: Dict[str, torch.Tensor], shard_size_bytes: int) -> List[List[str]]:
    """Names in order, cut greedily under the size; a tensor larger than it gets a shard alone."""
    shards: List[List[str]] = [[]]
    used = 0
    for name in sorted(state):
        size = state[name].numel() * state[name].element_size()
        if shards[-1] and used + size > shard_size_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    return shards


def verify_export(directory: Path, draft, cfg: DraftModelConfig, dtype: str) -> ReloadResult:
    """The contract on the names as stored (no renames), the config round trip, then the reload check."""
    check_state_dict(stored_shapes(directory), cfg, where=f"the written weights in {directory}")
    check_config_round_trip(directory, cfg)
    result = reload_check(directory, draft, dtype)
    if not result.ok:
        raise ExportCheckError(f"{result.summary()}\nThe export does not compute what the checkpoint computes.")
    return result


def checkpoint_shapes(directory: Path) -> Dict[str, tuple]:
    """A training checkpoint's tensor shapes: its model.safetensors, or its shards' metadata (fsdp)."""
    from blockdraft.models import sharded_io

    return sharded_io.stored_shapes(directory) if sharded_io.is_sharded(directory) else stored_shapes(directory)


def stored_shapes(directory: Path) -> Dict[str, tuple]:
    return {name: shape for name, (shape, _) in tensor_headers(directory).items()}


def check_config_round_trip(directory: Path, cfg: DraftModelConfig) -> None:
    back = draft_config_from_vllm_config(read_config(directory), where=str(directory / CONFIG_NAME)).to_dict()
    want = cfg.to_dict()
    skip = NOT_ROUND_TRIPPED + fields_not_written(cfg.kind)
    differing = [f"{k}: wrote {back[k]!r}, trained {want[k]!r}" for k in want if k not in skip and back.get(k) != want[k]]
    if differing:
        raise ExportCheckError("config.json does not read back as the trained draft config:\n  " + "\n  ".join(differing))


def write_export_info(directory: Path, cfg: DraftModelConfig, source: CheckpointSource, dtype: str, target_dir,
                      result: ReloadResult, training_prompts: Optional[dict] = None) -> None:
    info = {
        # What the draft was trained as: preflight refuses a config.json edited to attend otherwise.
        "draft_kind": cfg.kind,
        "source_checkpoint": str(source.path.absolute()),
        "step": source.step,
        "dtype": dtype,
        "target": str(target_dir) if target_dir is not None else source.target_path,
        "reload_check": {"max_abs_diff": result.max_abs_diff, "tolerance": result.tolerance},
        # The record serve and eval check their prompts against; null: the run recorded none.
        "training_prompts": training_prompts,
        **build_info(),  # which blockdraft wrote it: version and commit ("unknown" outside a checkout)
    }
    (directory / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n")


def publish(staging: Path, out: Path) -> None:
    """Rename the checked export into place; an existing out is removed only after that."""
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
    if not out.exists():
        os.replace(staging, out)
        fsync_dir(out.parent)
        return
    old = _free_name(out, ".old")
    os.replace(out, old)
    os.replace(staging, out)
    fsync_dir(out.parent)
    shutil.rmtree(old)


def _keep_failed(staging: Path, out: Path) -> Path:
    failed = _free_name(out, ".failed")
    if staging.exists():
        os.replace(staging, failed)
    return failed


def _free_name(out: Path, suffix: str) -> Path:
    """`<out><suffix>`, or `<out><suffix>.2`, ...: never a name that already holds something."""
    candidate, n = out.with_name(out.name + suffix), 1
    while candidate.exists():
        n += 1
        candidate = out.with_name(f"{out.name}{suffix}.{n}")
    return candidate


def _target_label(target_dir, source: CheckpointSource) -> Optional[str]:
    return str(target_dir) if target_dir is not None else source.target_path
