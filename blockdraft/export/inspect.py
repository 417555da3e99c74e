"""`describe(dir)`: what a draft directory holds and how to serve it, read from headers only."""

from __future__ import annotations

from pathlib import Path
from typing import Tuple

from blockdraft import kinds
from blockdraft.draft_format.config_reader import draft_config_from_vllm_config
from blockdraft.draft_format.contract import contract_problems
from blockdraft.draft_format.importer import CONFIG_NAME, read_config, tensor_headers, weight_files, with_mask_embedding
from blockdraft.draft_format.speculators import draft_tensors as speculators_draft_tensors
from blockdraft.draft_format.speculators import READ_TYPES, is_speculators_config, speculators_kind
from blockdraft.errors import ConfigError
from blockdraft.export.deploy_line import deploy_line, export_deploy_line
from blockdraft.export.model_card import shape_line
from blockdraft.export.reference_only import SERVING_NOTE_KEY, vllm_servable
from blockdraft.export.source import resolve_checkpoint
from blockdraft.export.speculators_serving import vllm_reading_notes
from blockdraft.models.draft_config import DraftModelConfig
from blockdraft.models.io import load_draft_config


SPECULATORS_HOLDS = "a speculators {kind} checkpoint (config.json + safetensors, read as {architecture})"
SPECULATORS_NAMES = {"dflash": "DFlash", "dflash2": "DFlash2", "dspark": "DSpark"}


def describe(directory: str | Path) -> str:
    directory = Path(directory)
    cfg, holds, architecture, weights_dir = _read(directory)
    headers = tensor_headers(weights_dir)
    speculators = _speculators_config(directory)
    if speculators is not None:
        headers = speculators_draft_tensors(headers, cfg)  # the verifier's embedding and head, t2d: not the draft's
    problems = contract_problems({k: shape for k, (shape, _) in headers.items()}, cfg)
    dtypes = sorted({dtype for _, dtype in headers.values()})
    lines = [
        f"{directory}",
        f"  holds: {holds}",
        f"  kind: {cfg.kind} (architecture {architecture})",
        f"  shape: {shape_line(cfg)}",
        f"  target_layer_ids: {cfg.target_layer_ids}   mask_token_id: {cfg.mask_token_id}   block_size: {cfg.block_size}",
        f"  attention: {attention_line(cfg)}",
        "  vocabulary: " + (f"reduced, {cfg.draft_vocab_size} of {cfg.vocab_size} target tokens (own lm_head.weight + d2t)"
                            if cfg.draft_vocab_size else f"the target's full head ({cfg.vocab_size} tokens)"),
        "  mask embedding: " + ("trained (mask_embedding.pt in an export)" if cfg.train_mask_embedding
                                else f"the target's row for token {cfg.mask_token_id}"),
        f"  dtype: {', '.join(dtypes)}   tensors: {len(headers)} in {len(weight_files(weights_dir))} file(s)   "
        f"size on disk: {_human(_disk_size(directory))}",
        "  weights vs the vLLM contract: " + ("ok" if not problems else f"{len(problems)} problem(s): " + "; ".join(problems[:5])),
        *_speculators_lines(speculators),
        *_deploy_lines(directory, cfg, speculators),
    ]
    return "\n".join(lines)


def attention_line(cfg: DraftModelConfig) -> str:
    """Each layer's attention as trained (and as the export makes vLLM serve it)."""
    def one(window, causal):
        span = f"sliding window {window}" if window is not None else "full"
        return f"{span}, {'causal' if causal else 'bidirectional'} inside the block"
    per_layer = cfg.layer_attention()
    if len(set(per_layer)) == 1:
        return f"every layer {one(*per_layer[0])}"
    return "; ".join(f"layer {i} {one(*pair)}" for i, pair in enumerate(per_layer))


def _speculators_config(directory: Path):
    if not (directory / CONFIG_NAME).is_file():
        return None
    config = read_config(directory)
    return config if is_speculators_config(config) else None


def _speculators_lines(config) -> list:
    if config is None:
        return []
    notes = vllm_reading_notes(config)
    if not notes:
        return ["  vLLM on this speculators config.json as is: serves the draft as trained"]
    return ["  vLLM on this speculators config.json as is (serve an export from here instead):",
            *(f"    - {note}" for note in notes)]


def _deploy_lines(directory: Path, cfg: DraftModelConfig, speculators) -> list:
    """The export's deploy line; a checkpoint's, or a speculators checkpoint's, as it will read once exported."""
    if speculators is not None:
        return [f"  deploy, once exported (python -m blockdraft.export checkpoint={directory} out=<export dir>):",
                *deploy_line(cfg, "<export dir>", None, False).lines("    ")]
    if (directory / CONFIG_NAME).is_file():
        return ["  deploy:", *export_deploy_line(directory).lines("    ")]
    return ["  deploy, once exported:", *deploy_line(cfg, "<export dir>", None, cfg.train_mask_embedding).lines("    ")]


def _read(directory: Path) -> Tuple[DraftModelConfig, str, str, Path]:
    """(config, what the directory is, architecture, where its weights are)."""
    if (directory / CONFIG_NAME).is_file():
        config = read_config(directory)
        cfg = draft_config_from_vllm_config(config, where=str(directory / CONFIG_NAME))
        cfg.train_mask_embedding = with_mask_embedding(directory, cfg)
        holds = "a vLLM draft export (config.json + safetensors)"
        if is_speculators_config(config):
            holds = SPECULATORS_HOLDS.format(kind=SPECULATORS_NAMES[speculators_kind(config)],
                                             architecture=READ_TYPES[speculators_kind(config)])
        if not vllm_servable(config, cfg.kind):
            holds = f"a draft export (config.json + safetensors) that vLLM cannot serve: {config.get(SERVING_NOTE_KEY, cfg.kind)}"
        return cfg, holds, ", ".join(config["architectures"]), directory
    if not directory.is_dir():
        raise ConfigError(f"inspect={directory} does not exist; give an export, a checkpoint or a run directory.")
    source = resolve_checkpoint(directory, key="inspect")
    cfg = load_draft_config(source.path)
    holds = (
        f"a training checkpoint ({source.path.name}); vLLM cannot read it as is: "
        f"python -m blockdraft.export checkpoint={directory} out=<dir>"
    )
    return cfg, holds, f"{kinds.get(cfg.kind).architecture} once exported", source.path


def _disk_size(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def _human(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{size} B"
        size /= 1024
    return f"{size} B"
